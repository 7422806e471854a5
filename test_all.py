"""
test_all.py: the whole test suite.  `python -m pytest -q test_all.py`  or  `python test_all.py`.

CPU, float64 where a tolerance matters, fixed seeds. Kinds of test (STYLE.md S17):
(a) two computational forms agree, (b) reductions to known cases, (c) padding never leaks,
(d) every parameter gets a gradient, (e) each mechanism file runs alone from an empty folder,
(f) smoke runs of the train scripts and bench.py, (g) the README's code blocks run.
"""

import math
import pathlib
import sys
import time

import pytest
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from model import (  # noqa: E402
    Classifier,
    ModelConfig,
    SoftmaxAttention,
    layer_kinds,
    layerwise_cosine_similarity,
)

KINDS = ["softmax", "agf", "primal", "primal+trans", "gfsa"]


def _tiny(style: str, attention="softmax", **over) -> ModelConfig:
    """A small config of either style; token inputs for "lra", 5 features for "uea"."""
    base = dict(
        n_classes=3,
        max_len=24,
        style=style,
        attention=attention,
        d_model=16,
        n_heads=2,
        d_ff=32,
        n_layers=2,
        head_hidden=16,
    )
    base.update(vocab_size=11) if style == "lra" else base.update(n_features=5)
    base.update(over)
    return ModelConfig(**base)


def _inputs(cfg: ModelConfig, B: int = 3, N: int = 20, dtype=torch.float64):
    """Random inputs of the config's kind and a mask with padding in two of the sequences."""
    g = torch.Generator().manual_seed(1)
    if cfg.vocab_size:
        x = torch.randint(1, cfg.vocab_size, (B, N), generator=g)
    else:
        x = torch.randn(B, N, cfg.n_features, generator=g, dtype=dtype)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 13:] = False
    mask[2, 4:] = False
    return x, mask


def _with_junk(x, mask):
    """Same input, but with junk at every padded position."""
    junk = x.clone()
    if x.dtype.is_floating_point:
        junk[~mask] = 1e3 * torch.randn_like(junk[~mask])
    else:
        junk[~mask] = torch.randint(0, 11, junk[~mask].shape)
    return junk


# ----------------------------------------------------------------------------------------------
# model.py
# ----------------------------------------------------------------------------------------------


def test_softmax_attention_equals_explicit_softmax():
    """SDPA baseline == softmax(QKᵀ/√d) V written out, with padding and with a causal mask."""
    torch.manual_seed(0)
    layer = SoftmaxAttention(16, 4).double().eval()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    for causal in (False, True):
        layer.causal = causal
        y, aux = layer(x, mask)
        q, k, v = layer.W_qkv(x).view(2, 9, 3, 4, 4).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(4)  # (B, H, N, N)
        allowed = mask[:, None, None, :].expand(2, 1, 9, 9)
        if causal:
            allowed = allowed & torch.ones(9, 9, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
        ref = layer.W_o((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 16))
        ref = ref * mask[..., None]
        assert torch.allclose(y, ref, atol=1e-12), f"causal={causal}"
        assert aux.dim() == 0 and aux.item() == 0.0


def test_output_shapes_tokens_features_and_two_towers():
    """Token ids (LRA style), features (UEA style) and the two-tower head all give (B, C)."""
    torch.manual_seed(0)
    for style in ("lra", "uea"):
        cfg = _tiny(style)
        x, mask = _inputs(cfg, dtype=torch.float32)
        logits, aux, hidden = Classifier(cfg)(x, mask, return_hidden=True)
        assert logits.shape == (3, 3) and aux.dim() == 0
        assert len(hidden) == cfg.n_layers + 1 and hidden[-1].shape == (3, 20, 16)
    cfg = _tiny("lra", two_tower=True)
    x, mask = _inputs(cfg)
    logits, aux = Classifier(cfg)(x, mask, x.flip(0), mask.flip(0))
    assert logits.shape == (3, 3)


def test_padding_does_not_leak_into_logits():
    """Junk at padded positions leaves the logits unchanged, for every attention and style."""
    for kind in KINDS:
        for style in ("lra", "uea"):
            torch.manual_seed(0)
            cfg = _tiny(style, kind)
            model = Classifier(cfg).double().eval()
            x, mask = _inputs(cfg)
            with torch.no_grad():
                logits, aux = model(x, mask)
                logits2, aux2 = model(_with_junk(x, mask), mask)
            assert torch.allclose(logits, logits2, atol=1e-9), f"{kind}/{style}: logits leak"
            assert torch.allclose(aux, aux2, atol=1e-9), f"{kind}/{style}: aux loss leaks"


def test_padding_does_not_leak_two_towers():
    """Retrieval: junk in either document's padding changes nothing."""
    torch.manual_seed(0)
    cfg = _tiny("lra", "agf", two_tower=True)
    model = Classifier(cfg).double().eval()
    x, mask = _inputs(cfg)
    x2, mask2 = x.flip(0), mask.flip(0)
    with torch.no_grad():
        ref = model(x, mask, x2, mask2)[0]
        out = model(_with_junk(x, mask), mask, _with_junk(x2, mask2), mask2)[0]
    assert torch.allclose(ref, out, atol=1e-9)


def test_every_parameter_gets_a_gradient():
    """One backward pass reaches every trainable parameter, for every attention kind."""
    for kind in KINDS:
        torch.manual_seed(0)
        cfg = _tiny("lra", kind)
        model = Classifier(cfg).double()
        with torch.no_grad():  # move off the init, where some filters have exactly zero slope
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        x, mask = _inputs(cfg)
        logits, aux = model(x, mask)
        (F.cross_entropy(logits, torch.tensor([0, 1, 2])) + aux).backward()
        missing = [
            n
            for n, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)
        ]
        assert not missing, f"{kind}: no gradient for {missing}"


def test_hybrid_layer_list_and_aux_averaging():
    """A per-layer list builds those mechanisms, and aux = mean over the AGF/Primal layers only."""
    torch.manual_seed(0)
    assert layer_kinds("primal+trans", 3) == ["softmax", "softmax", "primal"]
    assert layer_kinds(["softmax", "agf"], 2) == ["softmax", "agf"]
    cfg = _tiny("lra", ["agf", "softmax", "primal"], n_layers=3)
    model = Classifier(cfg).double()
    names = [type(b.attn).__name__ for b in model.blocks]
    assert names == ["AGFAttention", "SoftmaxAttention", "PrimalAttention"]
    seen = []
    for block in model.blocks:
        block.attn.register_forward_hook(lambda mod, inp, out: seen.append(out[1]))
    x, mask = _inputs(cfg)
    _, aux = model(x, mask)
    assert seen[0] != 0 and seen[2] != 0, "AGF and Primal should have non-zero aux losses"
    assert torch.allclose(aux, (seen[0] + seen[2]) / 2)
    with pytest.raises(ValueError, match="entries for 2 layers"):
        layer_kinds(["softmax"], 2)
    with pytest.raises(ValueError, match="unknown attention"):
        layer_kinds("performer", 2)


def test_short_training_run_drives_loss_down():
    """30 Adam steps on a tiny task (label = the first token) cut the loss by more than half."""
    torch.manual_seed(0)
    cfg = _tiny("lra", n_classes=4, vocab_size=5, dropout=0.0, attn_dropout=0.0)
    model = Classifier(cfg)
    x = torch.randint(1, 5, (64, 12))
    y = x[:, 0] - 1  # classes 0..3
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits, aux = model(x)
        loss = F.cross_entropy(logits, y) + aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], f"loss went {losses[0]:.3f} -> {losses[-1]:.3f}"


def test_bad_inputs_raise_clear_errors():
    """Each malformed input gets a ValueError that says what is wrong."""
    torch.manual_seed(0)
    lra, uea = Classifier(_tiny("lra")), Classifier(_tiny("uea"))
    tokens, feats = torch.randint(1, 11, (2, 10)), torch.randn(2, 10, 5)
    ok = torch.ones(2, 10, dtype=torch.bool)
    cases = [
        (lra, tokens, ok[:, :9], "mask must be bool of shape"),
        (lra, tokens, ok.long(), "mask must be bool of shape"),
        (lra, tokens.clone().fill_(11), ok, r"token ids must lie in \[0, 11\)"),
        (lra, tokens - 5, ok, "token ids must lie"),
        (lra, feats, ok, "expected integer token ids"),
        (uea, torch.randn(2, 10, 4), ok, r"expected float features of shape \(B, N, 5\)"),
        (uea, torch.randint(0, 3, (2, 10, 5)), ok, "expected float features"),
        (lra, torch.randint(1, 11, (2, 25)), None, "exceeds the position table"),
        (lra, tokens, torch.zeros(2, 10, dtype=torch.bool), "at least one real token"),
    ]
    for model, x, mask, message in cases:
        with pytest.raises(ValueError, match=message):
            model(x, mask)
    with pytest.raises(ValueError, match="needs the second document"):
        Classifier(_tiny("lra", two_tower=True))(tokens, ok)
    with pytest.raises(ValueError, match="exactly one of vocab_size"):
        Classifier(ModelConfig(vocab_size=5, n_features=3))


def test_uea_style_accepts_shorter_sequences():
    """The flatten head pads a batch shorter than max_len, which equals padding it by hand."""
    torch.manual_seed(0)
    cfg = _tiny("uea")
    model = Classifier(cfg).double().eval()
    x, mask = _inputs(cfg, N=20)
    padded = torch.cat([x, torch.zeros(3, 4, 5, dtype=torch.float64)], 1)
    pmask = torch.cat([mask, torch.zeros(3, 4, dtype=torch.bool)], 1)
    with torch.no_grad():
        assert torch.allclose(model(x, mask)[0], model(padded, pmask)[0], atol=1e-10)


def test_layerwise_cosine_similarity():
    """Identical tokens give 1, orthogonal tokens give 0, and random ones match the N x N sum."""
    same = torch.randn(1, 1, 8).expand(2, 5, 8)
    ortho = torch.eye(6, dtype=torch.float64)[None]  # 6 orthonormal tokens
    assert torch.allclose(layerwise_cosine_similarity([same]), torch.tensor([1.0]), atol=1e-6)
    assert layerwise_cosine_similarity([ortho]).abs().item() < 1e-12
    torch.manual_seed(0)
    h = torch.randn(2, 7, 4, dtype=torch.float64)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3], dtype=torch.bool)
    brute = []
    for b in range(2):
        u = F.normalize(h[b, mask[b]], dim=-1)
        n = len(u)
        brute.append(((u @ u.T).sum() - n) / (n * (n - 1)))
    got = layerwise_cosine_similarity([h, h], mask)
    assert torch.allclose(got, torch.stack(brute).mean().repeat(2), atol=1e-12)


# ----------------------------------------------------------------------------------------------
# runner: `python test_all.py` works without the pytest command; `pytest test_all.py` works too
# ----------------------------------------------------------------------------------------------

if __name__ == "__main__":
    tests = [(n, f) for n, f in list(globals().items()) if n.startswith("test_") and callable(f)]
    passed = failed = skipped = 0
    for name, fn in tests:
        t0 = time.perf_counter()
        try:
            fn()
        except pytest.skip.Exception as e:
            skipped += 1
            print(f"skip {name:55s} {e}")
            continue
        except Exception as e:  # report every failure, then exit non-zero
            failed += 1
            print(f"FAIL {name:55s} {type(e).__name__}: {e}")
            continue
        passed += 1
        print(f"ok   {name:55s} {time.perf_counter() - t0:6.2f}s")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)
