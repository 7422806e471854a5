"""
test_all.py: the whole test suite.  `python -m pytest -q test_all.py`  or  `python test_all.py`.

CPU, float64 where a tolerance matters, fixed seeds. Kinds of test (STYLE.md S17):
(a) two computational forms agree, (b) reductions to known cases, (c) padding never leaks,
(d) every parameter gets a gradient, (e) each mechanism file runs alone from an empty folder,
(f) smoke runs of the train scripts and bench.py, (g) the README's code blocks run.
"""

import contextlib
import copy
import csv
import importlib.util
import io
import json
import math
import os
import pathlib
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
import zlib
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import diagnose  # noqa: E402
import lra_data  # noqa: E402
import train_lra as lra  # noqa: E402
import train_uea  # noqa: E402
import uea_data  # noqa: E402
from agf import AGFAttention, agf_apply, agf_dense_reference, orthogonality_penalty  # noqa: E402
from gfsa import (  # noqa: E402
    GFSAttention,
    attention_matrix,
    filter_coefficients,
    gfsa_apply,
    gfsa_dense_reference,
    taylor_error,
)
from ksvd_attention import (  # noqa: E402
    PrimalAttention,
    kkt_base_weights,
    ksvd_dual_reference,
    ksvd_kernel,
    ksvd_objective,
    primal_scores,
    sample_real_tokens,
)
from model import (  # noqa: E402
    Classifier,
    ModelConfig,
    SoftmaxAttention,
    layer_kinds,
    layerwise_cosine_similarity,
)
from polynomials import (  # noqa: E402
    PolynomialFilter,
    chebyshev_t,
    frequency_response,
    jacobi,
    monomial,
    polynomial_basis,
)
from train_uea import parse_config  # noqa: E402
from uea_data import DatasetNotFoundError, TsFormatError, load_uea, read_ts  # noqa: E402

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


def _largest_saved(forward, x: torch.Tensor) -> int:
    """Elements of the largest tensor autograd keeps for backward in forward(x) -> (y, aux)."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, aux = forward(x)
        (y.sum() + aux).backward()
    return max(sizes)


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


def test_attention_mask_false_is_the_official_uea_model():
    """attention_mask=False (the official UEA code): the attention sees padded steps, so junk
    there changes the logits; the padded steps are still zeroed before the flatten head."""
    for kind in KINDS:
        torch.manual_seed(0)
        cfg = _tiny("uea", kind, attention_mask=False)
        model = Classifier(cfg).double().eval()
        x, mask = _inputs(cfg)
        with torch.no_grad():
            logits = model(x, mask)[0]
            assert not torch.allclose(logits, model(_with_junk(x, mask), mask)[0]), kind
            # the same weights, the encoder run as if every step were real, the mask in the head
            h = model.encode(x, torch.ones_like(mask))[0]
            ref = model.head(model.pool(h, mask))
        assert torch.allclose(logits, ref, atol=1e-12), kind


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
# agf
# ----------------------------------------------------------------------------------------------


# (α, β) pairs: classical ones and the tuned AGF values outside the classical range (β <= -1).
JACOBI_PAIRS = [
    (0.0, 0.0),
    (-0.5, -0.5),
    (1.0, 0.2),
    (1.5, 2.0),
    (2.0, 0.5),
    (2.0, -1.0),
    (2.0, -2.0),
    (2.0, -1.5),
    (1.5, -1.0),
    (1.0, 0.0),
    (0.3, -0.7),
]


def _agf_binom(z: float, k: int) -> float:
    """Generalised binomial C(z, k) = z (z-1) ... (z-k+1) / k!, any real z, integer k >= 0."""
    return math.prod((z - i) / (i + 1) for i in range(k)) if k >= 0 else 0.0


def _agf_jacobi_closed_form(n: int, a: float, b: float, x: np.ndarray) -> np.ndarray:
    """P_n^(a,b)(x) = Σ_s C(n+a, n-s) C(n+b, s) ((x-1)/2)^s ((x+1)/2)^(n-s)   (DLMF 18.5.8)."""
    return sum(
        _agf_binom(n + a, n - s)
        * _agf_binom(n + b, s)
        * ((x - 1) / 2) ** s
        * ((x + 1) / 2) ** (n - s)
        for s in range(n + 1)
    )


def test_agf_jacobi_equals_closed_form_sum():
    """The recurrence equals the explicit sum, including β = -1, -1.5, -2 (AGF's LRA presets)."""
    x = np.linspace(-1.2, 1.2, 49)  # includes (0, 1), where AGF evaluates it
    for a, b in JACOBI_PAIRS:
        got = jacobi(torch.from_numpy(x), 7, a, b).numpy()
        for n in range(8):
            want = _agf_jacobi_closed_form(n, a, b, x)
            assert np.allclose(got[n], want, rtol=1e-12, atol=1e-12), f"(a, b, n) = {(a, b, n)}"


def test_agf_jacobi_matches_scipy():
    special = pytest.importorskip("scipy.special")
    x = np.linspace(0.0, 1.0, 33)
    for a, b in JACOBI_PAIRS:
        got = jacobi(torch.from_numpy(x), 10, a, b).numpy()
        for n in range(11):
            want = special.eval_jacobi(n, a, b, x)
            assert np.allclose(got[n], want, rtol=1e-11, atol=1e-11), f"(a, b, n) = {(a, b, n)}"


def test_agf_legendre_and_chebyshev_match_numpy():
    """Jacobi(0,0) = Legendre; Jacobi(-½,-½) = (2k)!/(4^k (k!)²) T_k; chebyshev_t = T_k."""
    x = np.linspace(-1.0, 1.0, 41)
    xt = torch.from_numpy(x)
    K = 8
    legendre = polynomial_basis(xt, K, "legendre").numpy()
    cheb_jacobi = polynomial_basis(xt, K, "chebyshev").numpy()
    cheb_t = polynomial_basis(xt, K, "chebyshev_t").numpy()
    powers = polynomial_basis(xt, K, "monomial").numpy()
    for k in range(K + 1):
        e_k = np.eye(K + 1)[k]  # coefficient vector selecting the k-th basis polynomial
        t_k = np.polynomial.chebyshev.chebval(x, e_k)
        scale = math.factorial(2 * k) / (4**k * math.factorial(k) ** 2)
        assert np.allclose(legendre[k], np.polynomial.legendre.legval(x, e_k), atol=1e-13)
        assert np.allclose(cheb_t[k], t_k, atol=1e-13)
        assert np.allclose(cheb_jacobi[k], scale * t_k, atol=1e-13)
        assert np.allclose(powers[k], x**k, atol=1e-13)


def _agf_check_orthogonal(a: float, b: float, nodes: np.ndarray, weights: np.ndarray) -> None:
    """Gram matrix ∫ P_m P_n (1-x)^a (1+x)^b dx by quadrature: diagonal with the DLMF norms."""
    K = 6
    p = jacobi(torch.from_numpy(nodes), K, a, b).numpy()  # (K+1, n_nodes)
    gram = (p * weights) @ p.T

    # h_n = 2^(a+b+1) Γ(n+a+1) Γ(n+b+1) / ((2n+a+b+1) Γ(n+a+b+1) n!)   (DLMF 18.3),
    # with (2n+a+b+1) Γ(n+a+b+1) written as Γ(a+b+2) at n = 0 (finite even when a + b = -1).
    def norm(n: int) -> float:
        den = math.gamma(a + b + 2) if n == 0 else (2 * n + a + b + 1) * math.gamma(n + a + b + 1)
        return (
            2 ** (a + b + 1)
            * math.gamma(n + a + 1)
            * math.gamma(n + b + 1)
            / (den * math.factorial(n))
        )

    norms = [norm(n) for n in range(K + 1)]
    assert np.allclose(gram, np.diag(norms), atol=1e-10), f"(a, b) = {(a, b)}"


def test_agf_jacobi_orthogonal_integer_weights():
    """For integer a, b >= 0 the weight is a polynomial: Gauss-Legendre (numpy) is exact."""
    nodes, weights = np.polynomial.legendre.leggauss(30)
    for a, b in [(0, 0), (1, 0), (2, 1), (1, 3)]:
        _agf_check_orthogonal(a, b, nodes, weights * (1 - nodes) ** a * (1 + nodes) ** b)


def test_agf_jacobi_orthogonal_gauss_jacobi():
    """Non-integer a, b > -1 (incl. Chebyshev's -½): Gauss-Jacobi nodes from scipy."""
    special = pytest.importorskip("scipy.special")
    for a, b in [(-0.5, -0.5), (1.5, 0.5), (1.0, 0.2), (0.5, -0.7), (-0.3, 2.0)]:
        nodes, weights = special.roots_jacobi(20, a, b)
        _agf_check_orthogonal(a, b, nodes, weights)


def test_agf_polynomial_gradcheck():
    """Autograd through the recurrence (x) and the filter (x and θ), float64."""
    torch.manual_seed(0)
    x = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    for a, b in [(2.0, -1.0), (-0.5, -0.5), (1.5, 2.0)]:
        assert torch.autograd.gradcheck(lambda t, a=a, b=b: jacobi(t, 6, a, b), (x,))
    assert torch.autograd.gradcheck(lambda t: chebyshev_t(t, 5), (x,))
    assert torch.autograd.gradcheck(lambda t: monomial(t, 5), (x,))
    poly = PolynomialFilter(5, "jacobi", 2.0, -2.0, fix_theta0=False).double()
    with torch.no_grad():
        poly.theta.normal_()
    theta = poly.theta.detach().clone().requires_grad_()
    theta0 = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    call = torch.func.functional_call  # poly(s) with its parameters swapped for these tensors
    assert torch.autograd.gradcheck(
        lambda s, th, th0: call(poly, {"theta": th, "theta0": th0}, (s,)), (x, theta, theta0)
    )


def test_agf_filter_is_official_tanh_sum():
    """g(s) = Σ θ̃_k P_k(s), θ̃_k = tanh(θ_k), θ̃_0 = 1 (frozen) or tanh(θ_0); frequency grid."""
    torch.manual_seed(0)
    s = torch.rand(2, 5, 7, dtype=torch.float64)
    for fix in (True, False):
        poly = PolynomialFilter(4, "jacobi", 1.5, -1.0, fix_theta0=fix).double()
        assert torch.equal(poly(s), torch.full_like(s, 1.0 if fix else 0.0))  # value at init
        with torch.no_grad():
            for p in poly.parameters():
                p.normal_()
        theta = torch.tanh(poly.theta)
        theta0 = 1.0 if fix else torch.tanh(poly.theta0)
        P = _agf_jacobi_closed_form  # independent of the recurrence
        want = theta0 + sum(theta[k - 1] * P(k, 1.5, -1.0, s) for k in range(1, 5))
        assert torch.allclose(poly(s), want, atol=1e-12)
        assert len(list(poly.parameters())) == (1 if fix else 2)  # frozen θ_0 is no parameter
        grid, g = frequency_response(poly, n_points=50)
        assert grid.min() > 0 and grid.max() < 1 and torch.allclose(g, poly(grid).detach())


def _agf_layer(seed: int = 0, **kwargs) -> AGFAttention:
    """A float64 AGF layer with a non-trivial filter (at init g ≡ 1 hides Σ entirely)."""
    torch.manual_seed(seed)
    layer = AGFAttention(32, 4, **kwargs).double()
    with torch.no_grad():
        layer.poly_filter.theta.normal_()
    return layer


def _agf_padded_input(B: int = 3, N: int = 20, D: int = 32):
    torch.manual_seed(1)
    x = torch.randn(B, N, D, dtype=torch.float64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 13:] = False
    mask[2, 4:] = False
    return x, mask


def test_agf_fast_path_equals_dense_reference():
    """(U ⊙ g)(Vᵀ Val) == H Val with H = U diag(g) Vᵀ built as an N x N matrix."""
    layer = _agf_layer()
    x, mask = _agf_padded_input()
    for basis in ("jacobi", "monomial"):
        layer.poly_filter.basis = basis
        for m in (None, mask):
            y, _ = layer(x, m)
            y_dense, graph_filter = agf_dense_reference(layer, x, m)
            assert graph_filter.shape == (3, 4, 20, 20)
            assert torch.allclose(y, y_dense, rtol=1e-12, atol=1e-12), f"{basis}, mask={m}"
    # H of a padded sample has zero rows and columns at the padding
    assert graph_filter[1, :, 13:].abs().max() == 0 and graph_filter[1, :, :, 13:].abs().max() == 0


def test_agf_at_init_is_softmax_linear_attention():
    """θ̃_0 = 1, θ_k = 0 => g ≡ 1 => y = W_o(softmax_d(Q) (softmax_N(K)ᵀ V)), per head."""
    torch.manual_seed(0)
    layer = AGFAttention(32, 4).double()
    x, mask = _agf_padded_input()
    y, _ = layer(x, mask)
    want = torch.zeros_like(y)
    for b in range(3):
        n = int(mask[b].sum())
        xb = x[b, :n]
        heads = []
        for h in range(4):
            cols = slice(8 * h, 8 * h + 8)
            q = torch.softmax(layer.W_u(xb)[:, cols], dim=1)  # (n, d), rows sum to 1
            k = torch.softmax(layer.W_v(xb)[:, cols], dim=0)  # (n, d), columns sum to 1
            heads.append(q @ (k.T @ layer.W_val(xb)[:, cols]))
        want[b, :n] = layer.W_o(torch.cat(heads, dim=1))
    assert torch.allclose(y, want, atol=1e-12)


def test_agf_padding_does_not_leak():
    """Junk at padded tokens changes neither y nor aux; y is 0 there; extra padding is a no-op."""
    layer = _agf_layer(fix_theta0=False)
    x, mask = _agf_padded_input()
    junk = x.clone()
    junk[~mask] = 1e3 * torch.randn_like(junk[~mask])
    junk[2, -1] = float("nan")  # even NaN at a padded token
    y1, aux1 = layer(x, mask)
    y2, aux2 = layer(junk, mask)
    assert torch.allclose(y1, y2, atol=1e-12) and torch.allclose(aux1, aux2, atol=1e-14)
    assert y1[~mask].abs().max() == 0
    # Sample 1 alone (13 real tokens, no padding) == sample 1 inside the padded batch.
    y_alone, aux_alone = layer(x[1:2, :13], None)
    assert torch.allclose(y_alone, y1[1:2, :13], atol=1e-12)
    per_sample = torch.stack([layer(x[b : b + 1, : int(mask[b].sum())])[1] for b in range(3)])
    assert torch.allclose(aux1, per_sample.mean(), atol=1e-14)  # per sample, then batch mean
    assert torch.allclose(aux_alone, per_sample[1], atol=1e-14)


def test_agf_orthogonality_penalty_zero_for_orthonormal_and_official_form():
    """One-hot disjoint columns give UᵀU = VᵀV = I and a zero penalty; else the official mean."""
    B, H, N, d = 2, 3, 10, 4
    perm = torch.randperm(N)[:d]
    onehot = torch.zeros(B, H, N, d, dtype=torch.float64)
    onehot[:, :, perm, torch.arange(d)] = 1.0  # column c is the unit vector e_perm[c]
    assert torch.equal(orthogonality_penalty(onehot, onehot.flip(-1)), torch.zeros(B))
    zeros = torch.zeros_like(onehot)
    assert torch.allclose(
        orthogonality_penalty(zeros, onehot), torch.full((B,), 1 / d, dtype=torch.float64)
    )
    # a random U, V against the official formula, written with explicit loops
    torch.manual_seed(0)
    u, v = torch.rand(B, H, N, d, dtype=torch.float64), torch.rand(B, H, N, d, dtype=torch.float64)
    want = torch.zeros(B, dtype=torch.float64)
    for b in range(B):
        for m in (u[b], v[b]):
            want[b] += sum((m[h].T @ m[h] - torch.eye(d)).abs().sum() for h in range(H)) / (
                H * d * d
            )
    assert torch.allclose(orthogonality_penalty(u, v), want, atol=1e-14)
    layer = _agf_layer(ortho_weight=0.5)  # aux is γ times the batch mean
    x, _ = _agf_padded_input()
    u, _, v, _ = layer.factors(x)
    assert torch.allclose(layer(x)[1], 0.5 * orthogonality_penalty(u, v).mean(), atol=1e-14)


def test_agf_saves_no_n_by_n_tensor():
    """Nothing with N*N elements or more is kept for backward (N = 512); the dense one does."""
    N = 512
    torch.manual_seed(0)
    layer = AGFAttention(32, 2)
    mask = torch.ones(1, N, dtype=torch.bool)
    x = torch.randn(1, N, 32, requires_grad=True)
    assert _largest_saved(lambda x: layer(x, mask), x) < N * N
    dense = _largest_saved(lambda x: (agf_dense_reference(layer, x, mask)[0], x.sum() * 0), x)
    assert dense >= N * N  # the hook does see an N x N tensor when there is one


def test_agf_autocast_bf16_is_finite():
    """bf16 autocast: projections in bf16, filter and softmaxes in float32, y in x's dtype."""
    torch.manual_seed(0)
    layer = AGFAttention(32, 4, order=6, alpha=2.0, beta=-2.0)
    with torch.no_grad():
        layer.poly_filter.theta.normal_()
    x = 5 * torch.randn(2, 64, 32)
    mask = torch.ones(2, 64, dtype=torch.bool)
    mask[1, 40:] = False
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y, aux = layer(x, mask)
        (y.float().sum() + aux).backward()
    assert y.dtype == torch.float32 and torch.isfinite(y).all() and torch.isfinite(aux)
    assert aux.dtype == torch.float32  # the penalty's Gram matrices were not computed in bf16
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        u, g, v, values = layer.factors(x, mask)
    assert all(t.dtype == torch.float32 for t in (u, g, v, values))
    # Steps 5 and 6 must run in float32 too: redo them here, outside autocast, and compare.
    aux_want = layer.ortho_weight * orthogonality_penalty(u, v).mean()
    core = agf_apply(u, g, v, values).transpose(1, 2).reshape(2, 64, 32)  # float32
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        y_want = layer.W_o(core).float().masked_fill(~mask[..., None], 0.0)
    assert torch.allclose(aux, aux_want, rtol=1e-6) and torch.allclose(y, y_want, atol=1e-6)
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    y32, _ = layer(x, mask)
    assert (y - y32).abs().max() < 0.1 * y32.abs().max()  # bf16 projections: close, not equal


def test_agf_every_parameter_gets_a_gradient():
    """All weights, θ_k, and θ_0 when learned (W_sigma gets 0 at init, so θ is perturbed)."""
    x, mask = _agf_padded_input()
    for fix in (True, False):
        layer = _agf_layer(fix_theta0=fix)
        y, aux = layer(x, mask)
        (y.square().sum() + aux).backward()
        names = {name for name, _ in layer.named_parameters()}
        assert ("poly_filter.theta0" in names) == (not fix)
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient for {name}"
    fresh = AGFAttention(32, 4).double()  # at init ∂g/∂s = 0, as in the official code
    fresh(x, mask)[0].square().sum().backward()
    assert fresh.W_sigma.weight.grad.abs().max() == 0


# ----------------------------------------------------------------------------------------------
# primal
# ----------------------------------------------------------------------------------------------


DT = torch.float64


def _primal_layer(
    causal=False, reduction="batch", D=16, H=2, rank=3, rank_multi=4, max_len=64, eta=0.1
):
    torch.manual_seed(0)
    layer = PrimalAttention(
        D,
        H,
        rank=rank,
        rank_multi=rank_multi,
        max_len=max_len,
        ksvd_weight=eta,
        causal=causal,
        ksvd_reduction=reduction,
    )
    return layer.to(DT)


def _primal_masks(B, N):
    """Right padding, left padding and scattered padding, one pattern per sequence."""
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, N - 7 :] = False
    mask[1, :5] = False
    mask[2, 3::4] = False
    return mask


@pytest.mark.parametrize("causal", [False, True])
def test_primal_scores_equal_dual_reference(causal):
    """Remark 3.3: with W_e, W_r given by dual variables through the KKT conditions, the O(N)
    primal scores equal the dual scores E = K_X H_r, R = K_Xᵀ H_e of the N x N kernel."""
    B, N, H, r = 3, 20, 2, 3
    layer = _primal_layer(causal)
    torch.manual_seed(1)
    x, mask = torch.randn(B, N, 16, dtype=DT), _primal_masks(B, N)
    with torch.no_grad():
        phi_q, phi_k = layer.feature_maps(x, mask)
        f_x = layer.sampled_tokens(x, mask)
        h_e, h_r = torch.randn(2, B, H, N, r, dtype=DT)
        W_e, W_r = kkt_base_weights(phi_q, phi_k, f_x, h_e, h_r, mask)
        e, r_s = primal_scores(phi_q, phi_k, f_x, W_e, W_r)
        e_dual, r_dual = ksvd_dual_reference(phi_q, phi_k, f_x, h_e, h_r, mask)
    real = mask[:, None, :, None]
    assert e_dual.abs().max() > 0.1 and r_dual.abs().max() > 0.1
    assert torch.allclose(e.masked_fill(~real, 0.0), e_dual, atol=1e-12)
    assert torch.allclose(r_s.masked_fill(~real, 0.0), r_dual, atol=1e-12)

    # the module's own path (weights shared over the batch) gives the same for one sequence
    # (sequence 1, left padded), compared at its real tokens
    with torch.no_grad():
        layer.We.copy_(W_e[1])
        layer.Wr.copy_(W_r[1])
        e1, r1 = layer.scores(x[1:2], mask[1:2])
    assert torch.allclose(e1[0][:, mask[1]], e_dual[1][:, mask[1]], atol=1e-12)
    assert torch.allclose(r1[0][:, mask[1]], r_dual[1][:, mask[1]], atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_primal_ksvd_objective_is_zero_at_kkt_point(causal):
    """J = 0 at a stationary point of the primal problem, and clearly not at a random point.

    Construction (one sequence, left padding): take the kernel K_X = Φq Fᵀ F Φkᵀ over the real
    tokens (F = I for the causal variant) and its SVD K_X = U S Vᵀ. The KKT conditions are the
    shifted eigenvalue problem K_X H_r = H_e Σ, K_Xᵀ H_e = H_r Σ with Σ = Λ⁻¹ (paper's Σ_i
    sums), solved by H_e = U[:, :r], H_r = V[:, :r], Σ = S[:r]. The base weights follow from
    W_e = F Φkᵀ H_r, W_r = F Φqᵀ H_e. The code averages over n real tokens instead of summing,
    which rescales Λ by n: λ² = n / σ. Then ½ mean λ²e² = ½ mean λ²r² = Σσ/2 per head and
    Tr(W_eᵀ W_r) = Σσ, so J = 0 up to rounding.
    """
    N, H, r = 24, 2, 3
    layer = _primal_layer(causal, D=16, H=H, rank=r, rank_multi=4)  # m = 12 < 19 real tokens
    torch.manual_seed(2)
    x = torch.randn(1, N, 16, dtype=DT)
    mask = torch.ones(1, N, dtype=torch.bool)
    mask[0, :5] = False
    n = int(mask.sum())
    with torch.no_grad():
        e, r_s = layer.scores(x, mask)
        J_random = ksvd_objective(e, r_s, layer.Lambda, layer.We, layer.Wr, mask, False)
        phi_q, phi_k = layer.feature_maps(x.masked_fill(~mask[..., None], 0.0), mask)
        f_x = layer.sampled_tokens(x.masked_fill(~mask[..., None], 0.0), mask)
        U, S, Vh = torch.linalg.svd(ksvd_kernel(phi_q, phi_k, f_x, mask))
        assert S[..., r - 1].min() > 1e-3  # r non-degenerate components exist
        W_e, W_r = kkt_base_weights(phi_q, phi_k, f_x, U[..., :r], Vh.mT[..., :r], mask)
        layer.We.copy_(W_e[0])
        layer.Wr.copy_(W_r[0])
        layer.Lambda.copy_((n / S[0, :, :r]).sqrt())
        e, r_s = layer.scores(x, mask)
        J_kkt = ksvd_objective(e, r_s, layer.Lambda, layer.We, layer.Wr, mask, False)
        J_kkt_b = ksvd_objective(e, r_s, layer.Lambda, layer.We, layer.Wr, mask, True)
        _, aux = layer(x, mask)
    assert abs(J_random.item()) > 1e-2, J_random
    assert abs(J_kkt.item()) < 1e-10, J_kkt
    assert J_kkt_b.abs().max().item() < 1e-10
    assert aux.item() < 1e-20
    # the KKT relation h_e = Λ e holds row by row at the real tokens (Λ in code scale: λ² / n)
    h_e = (layer.Lambda**2 / n)[None, :, None, :] * e
    assert torch.allclose(h_e[0][:, mask[0]], U[0][:, mask[0], :r], atol=1e-10)


def test_primal_loss_matches_official_formulas_without_padding():
    """No padding: aux / η equals the official LRA formula (square of the batch-mean J) for
    "batch" and the official UEA formula (mean of per-sample J²) for "sample"."""
    B, N = 3, 16
    torch.manual_seed(3)
    x = torch.randn(B, N, 16, dtype=DT)
    for reduction in ("batch", "sample"):
        layer = _primal_layer(False, reduction)
        with torch.no_grad():
            _, aux = layer(x)
            e, r = layer.scores(x, torch.ones(B, N, dtype=torch.bool))
        lam = torch.diag_embed(layer.Lambda)  # as model_wrapper.py / loss.py: e @ diag(λ)
        dims = (1, 2) if reduction == "sample" else (0, 1, 2)
        e_term = torch.mean(torch.einsum("bhnd,hds->bhns", e, lam).norm(dim=-1) ** 2, dim=dims) / 2
        r_term = torch.mean(torch.einsum("bhnd,hds->bhns", r, lam).norm(dim=-1) ** 2, dim=dims) / 2
        trace = torch.einsum("hps,hpd->hsd", layer.We, layer.Wr).mean(dim=0).trace()
        official = ((e_term + r_term - trace) ** 2).mean()
        assert torch.allclose(aux / layer.ksvd_weight, official, rtol=1e-12), reduction
    assert aux > 0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("reduction", ["batch", "sample"])
def test_primal_padding_does_not_leak(causal, reduction):
    """Junk (large values, then NaN) at padded positions changes neither y at real positions
    nor the aux loss; padded rows of y are 0 and the gradient stays finite."""
    B, N = 3, 40
    layer = _primal_layer(causal, reduction, max_len=N)  # m = 12
    torch.manual_seed(4)
    x, mask = torch.randn(B, N, 16, dtype=DT), _primal_masks(B, N)
    y, aux = layer(x, mask)
    for junk in (1e3 * torch.randn(B, N, 16, dtype=DT), torch.full((B, N, 16), math.nan)):
        x_junk = torch.where(mask[..., None], x, junk.to(DT)).requires_grad_(True)
        y2, aux2 = layer(x_junk, mask)
        assert torch.allclose(y[mask], y2[mask], atol=1e-12)
        assert torch.allclose(aux, aux2, atol=1e-14)
        assert (y2[~mask] == 0).all()
        (y2.sum() + aux2).backward()
        assert torch.isfinite(x_junk.grad).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_real", [7, 30])  # fewer and more real tokens than m = 12
def test_primal_padded_sequence_equals_unpadded_sequence(causal, n_real):
    """A sequence with left and right padding gives the same outputs and loss as the same real
    tokens alone, for N < m (samples repeat) and N > m. Fails if f(X) samples padded positions
    or the means of J count them."""
    layer = _primal_layer(causal, "sample", max_len=64)
    torch.manual_seed(5)
    x_short = torch.randn(1, n_real, 16, dtype=DT)
    x_long = torch.randn(1, n_real + 9, 16, dtype=DT)
    x_long[:, 4 : 4 + n_real] = x_short
    mask = torch.zeros(1, n_real + 9, dtype=torch.bool)
    mask[:, 4 : 4 + n_real] = True
    y_short, aux_short = layer(x_short)
    y_long, aux_long = layer(x_long, mask)
    assert torch.allclose(y_long[:, 4 : 4 + n_real], y_short, atol=1e-12)
    assert torch.allclose(aux_long, aux_short, atol=1e-14)


def test_primal_sampling_takes_evenly_spaced_real_tokens():
    """f(X) = tokens at floor(linspace(0, n_real - 1, m)) of the real positions; without padding
    these are the official positions torch.linspace(0, N - 1, m, dtype=int)."""
    B, N, m = 3, 23, 6
    x = torch.arange(N, dtype=DT)[None, :, None].expand(B, N, 2)  # token value = its position
    mask = _primal_masks(B, N)
    f_x = sample_real_tokens(x, mask, m)[..., 0]  # (B, m) positions sampled
    for b in range(B):
        real = torch.nonzero(mask[b]).flatten()
        idx = [math.floor(i * (len(real) - 1) / (m - 1) + 1e-9) for i in range(m)]
        assert f_x[b].tolist() == real[idx].to(DT).tolist()
    full = sample_real_tokens(x, torch.ones(B, N, dtype=torch.bool), m)[0, :, 0]
    assert full.tolist() == torch.linspace(0, N - 1, m, dtype=torch.long).to(DT).tolist()
    # fewer real tokens than samples: repeats, first and last real token included
    few = sample_real_tokens(x, torch.arange(N)[None].expand(B, N) < 4, 6)[0, :, 0]
    assert few.tolist() == [0, 0, 1, 1, 2, 3]


def test_primal_causal_output_ignores_future_tokens():
    """Causal variant: changing tokens after t leaves outputs at positions <= t unchanged,
    while changing a token at or before t does change them."""
    B, N, t = 2, 20, 11
    layer = _primal_layer(True)
    torch.manual_seed(6)
    x = torch.randn(B, N, 16, dtype=DT)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, :3] = False  # left padding in sequence 1
    y, _ = layer(x, mask)
    x_future = x.clone()
    x_future[:, t + 1 :] = torch.randn(B, N - t - 1, 16, dtype=DT)
    y_future, _ = layer(x_future, mask)
    assert torch.allclose(y[:, : t + 1], y_future[:, : t + 1], atol=1e-12)
    assert not torch.allclose(y[:, t + 1 :], y_future[:, t + 1 :])
    x_past = x.clone()
    x_past[:, t] += 1.0
    y_past, _ = layer(x_past, mask)
    assert not torch.allclose(y[:, t], y_past[:, t])


@pytest.mark.parametrize("causal", [False, True])
def test_primal_every_parameter_gets_a_gradient(causal):
    """With η > 0 every parameter, λ included (it appears only in the loss), gets a gradient."""
    layer = _primal_layer(causal)
    torch.manual_seed(7)
    x, mask = torch.randn(3, 20, 16, dtype=DT), _primal_masks(3, 20)
    y, aux = layer(x, mask)
    (y.pow(2).sum() + aux).backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("causal", [False, True])
def test_primal_no_n_by_n_tensor_saved_for_backward(causal):
    """Linear memory: no tensor with N*N or more elements is kept for backward at N = 512."""
    N = 512
    layer = PrimalAttention(32, 4, rank=8, rank_multi=10, causal=causal)
    x = torch.randn(1, N, 32, requires_grad=True)
    largest = _largest_saved(lambda x: layer(x, torch.ones(1, N, dtype=torch.bool)), x)
    assert largest < N * N, largest


def test_primal_defaults_and_shapes():
    """Defaults = LRA ListOps Primal. preset: r = 20, m = 200; causal W is (H, d, r)."""
    layer = PrimalAttention(64, 2)
    assert tuple(layer.We.shape) == (2, 200, 20) and tuple(layer.Lambda.shape) == (2, 20)
    assert layer.ksvd_weight == 0.1 and layer.ksvd_reduction == "batch"
    assert tuple(PrimalAttention(64, 2, max_len=29).We.shape) == (2, 29, 20)
    assert tuple(PrimalAttention(64, 2, causal=True).Wr.shape) == (2, 32, 20)
    y, aux = layer(torch.randn(2, 300, 64))  # N > m: no error, m stays 200
    assert y.shape == (2, 300, 64) and aux.dim() == 0


# ----------------------------------------------------------------------------------------------
# gfsa
# ----------------------------------------------------------------------------------------------


F64 = torch.float64


def _gfsa_qkv(B=2, H=3, N=10, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, d, dtype=F64, generator=g) for _ in range(3)]


def _gfsa_masks(B=2, N=10):
    """Right padding in sequence 0, left padding in sequence 1 (matters for causal)."""
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[0, 7:] = False
    mask[1, :3] = False
    return [None, mask]


def _gfsa_random_gfsa(seed=0, **kwargs) -> GFSAttention:
    """A float64 GFSA layer with all three coefficients random and non-trivial."""
    torch.manual_seed(seed)
    layer = GFSAttention(12, 3, learn_w0=True, learn_w1=True, **kwargs).double().eval()
    with torch.no_grad():
        layer.w0.copy_(torch.tensor([0.3, -0.2, 0.1]))
        layer.w1.copy_(torch.tensor([0.8, 1.2, -0.5]))
        layer.wK.copy_(torch.tensor([0.7, -0.4, 1.1]))
    return layer


def test_gfsa_fast_path_equals_dense_polynomial():
    """Ā(ĀV) evaluation == dense Eq. 5 filter H @ V, for K in {2,3,5}, masks and causal."""
    q, k, v = _gfsa_qkv()
    w0, w1, wK = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    for K in (2, 3, 5):
        for mask in _gfsa_masks():
            for causal in (False, True):
                fast = gfsa_apply(
                    q, k, v, filter_coefficients(w0, w1, wK, K), mask, causal, "softmax", 0.0
                )
                attn = attention_matrix(q, k, mask, causal, "softmax")
                dense, _ = gfsa_dense_reference(attn, v, w0, w1, wK, K)
                err = (fast - dense).abs().max().item()
                assert err < 1e-12, f"K={K} mask={mask is not None} causal={causal}: {err:.1e}"


def test_gfsa_init_equals_softmax_attention():
    """At (w0, w1, wK) = (0, 1, 0) GFSA is softmax attention, written out independently here."""
    torch.manual_seed(0)
    B, N, D, H = 2, 10, 12, 3
    x = torch.randn(B, N, D, dtype=F64)
    for causal in (False, True):
        layer = GFSAttention(D, H, order=4, causal=causal).double().eval()
        for mask in _gfsa_masks(B, N):
            y, aux = layer(x, mask)
            q, k, v = layer.W_qkv(x).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)
            allowed = torch.ones(B, 1, N, N, dtype=torch.bool)
            if mask is not None:
                allowed = allowed & mask[:, None, None, :]
            if causal:
                allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
            weights = torch.exp(scores - scores.amax(-1, keepdim=True)) * allowed
            weights = weights / weights.sum(-1, keepdim=True)
            ref = layer.W_o((weights @ v).transpose(1, 2).reshape(B, N, D))
            real = torch.ones(B, N, dtype=torch.bool) if mask is None else mask
            assert torch.allclose(y[real], ref[real], atol=1e-12), f"causal={causal}"
            assert aux.dim() == 0 and aux.item() == 0.0


def test_gfsa_k2_is_exactly_attn_squared():
    """For K = 2 the Taylor estimate is Ā² itself: H(0, 0, 1) == Ā @ Ā and E_2 == 0."""
    attn = torch.randn(2, 3, 7, 7, dtype=F64, generator=torch.Generator().manual_seed(2))
    attn = attn.softmax(-1)
    zeros, ones = torch.zeros(3, dtype=F64), torch.ones(3, dtype=F64)
    _, graph_filter = gfsa_dense_reference(attn, attn[..., :1], zeros, zeros, ones, order=2)
    assert torch.allclose(graph_filter, attn @ attn, atol=1e-15)
    a0, a1, a2 = filter_coefficients(zeros, zeros, ones, order=2)
    assert a0.abs().max() == 0 and a1.abs().max() == 0 and (a2 == 1).all()
    assert taylor_error(attn, 2)[0].max() < 1e-14


def test_gfsa_filter_rows_sum_to_coefficient_sum():
    """Ā and Ā² are row-stochastic, so every row of H sums to w0 + w1 + wK (any K)."""
    attn = torch.randn(1, 3, 6, 6, dtype=F64, generator=torch.Generator().manual_seed(3))
    w0, w1, wK = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(4))
    _, graph_filter = gfsa_dense_reference(attn.softmax(-1), attn[..., :1], w0, w1, wK, 5)
    expected = (w0 + w1 + wK).view(1, 3, 1).expand(1, 3, 6)
    assert torch.allclose(graph_filter.sum(-1), expected, atol=1e-13)


def test_gfsa_taylor_error_bounds():
    """E_K <= 2(K-1) <= 2K on random softmax matrices; a cyclic shift attains 2(K-1)."""
    g = torch.Generator().manual_seed(5)
    N = 11
    shift = torch.roll(torch.eye(N, dtype=F64), 1, dims=1)  # permutation, the limit of softmax
    for K in range(2, 11):
        for temperature in (0.1, 1.0, 10.0):
            attn = (torch.randn(4, N, N, dtype=F64, generator=g) / temperature).softmax(-1)
            err, paper, tight = taylor_error(attn, K)
            assert paper == 2 * K and tight == 2 * (K - 1)
            assert (err <= tight + 1e-12).all(), f"K={K}: {err.max():.3f} > {tight}"
        err, _, tight = taylor_error(shift, K)
        # N > K: Ā^K, Ā and Ā² are permutations with disjoint supports, so the row sum is
        # 1 + (K-2) + (K-1) = 2(K-1) for K >= 3 (K = 2: the estimate is exact)
        assert abs(err.item() - (tight if K >= 3 else 0)) < 1e-12, f"K={K}: {err.item()}"
        # softmax with sharp logits approaches the shift, and its error approaches 2(K-1)
        err_soft, _, _ = taylor_error((60.0 * shift).softmax(-1), K)
        assert abs(err_soft.item() - err.item()) < 1e-6


def test_gfsa_padding_does_not_leak():
    """Junk at padded positions changes no real output; padded outputs are exactly zero."""
    x = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(6))
    mask = _gfsa_masks()[1]
    junk = x.clone()
    junk[~mask] = 1e3 * torch.randn_like(junk[~mask])
    for kwargs in (
        {},
        {"causal": True},
        {"kernel": "linear"},
        {"evaluation": "official"},
        {"kernel": "linear", "evaluation": "official"},
    ):
        layer = _gfsa_random_gfsa(order=3, **kwargs)
        (y1, a1), (y2, a2) = layer(x, mask), layer(junk, mask)
        assert (y1 - y2)[mask].abs().max() < 1e-10, kwargs
        assert (y1[~mask] == 0).all() and (y2[~mask] == 0).all() and a1 == a2 == 0, kwargs


def test_gfsa_all_padding_sequence_gives_zeros_not_nan():
    """A sequence with no real token at all must not produce NaN (in outputs or gradients)."""
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1] = False
    for kwargs in ({}, {"causal": True}, {"kernel": "linear"}):
        layer = _gfsa_random_gfsa(**kwargs)
        x = torch.randn(2, 10, 12, dtype=F64, requires_grad=True)
        y, _ = layer(x, mask)
        y.sum().backward()
        assert (y[1] == 0).all() and torch.isfinite(y).all(), kwargs
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters()), kwargs


def test_gfsa_causal_outputs_ignore_the_future():
    """Causal mode: changing tokens > t leaves every output at positions <= t unchanged."""
    x = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(7))
    for evaluation in ("fast", "official"):
        layer = _gfsa_random_gfsa(order=4, causal=True, evaluation=evaluation)
        for mask in _gfsa_masks():
            for t in (0, 4, 8):
                future = x.clone()
                future[:, t + 1 :] = torch.randn_like(future[:, t + 1 :])
                y1, _ = layer(x, mask)
                y2, _ = layer(future, mask)
                assert (y1 - y2)[:, : t + 1].abs().max() < 1e-12, f"{evaluation} t={t}"
                assert (y1 - y2)[:, t + 1 :].abs().max() > 1e-6  # and the future does matter


def test_gfsa_linear_variant_equals_its_dense_reference():
    """kernel="linear": ρ_q(Q)[ρ_k(K)ᵀ(...)] == the dense filter on Ā = ρ_q(Q)ρ_k(K)ᵀ."""
    q, k, v = _gfsa_qkv(N=12, seed=8)
    w0, w1, wK = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(9))
    for mask in _gfsa_masks(N=12):
        attn = attention_matrix(q, k, mask, False, "linear")
        # the Efficient Attention Ā is row-stochastic and gives padded keys exactly zero weight
        assert torch.allclose(attn.sum(-1), torch.ones_like(attn[..., 0]), atol=1e-14)
        if mask is not None:
            assert (attn.transpose(-2, -1)[~mask[:, None].expand(-1, 3, -1)] == 0).all()
        for K in (2, 3, 5):
            fast = gfsa_apply(q, k, v, filter_coefficients(w0, w1, wK, K), mask, False, "linear", 0)
            dense, _ = gfsa_dense_reference(attn, v, w0, w1, wK, K)
            assert (fast - dense).abs().max() < 1e-12, f"K={K} mask={mask is not None}"


def test_gfsa_official_order_module_equals_fast_module():
    """evaluation="official" (dense Ā@Ā, H, H@V) == evaluation="fast", same weights, eval mode."""
    x = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(10))
    for kwargs in ({}, {"causal": True}, {"kernel": "linear"}):
        fast = _gfsa_random_gfsa(order=5, dropout=0.3, **kwargs)
        official = copy.deepcopy(fast)
        official.evaluation = "official"
        for mask in _gfsa_masks():
            y_fast, _ = fast(x, mask)
            y_official, _ = official(x, mask)
            assert (y_fast - y_official).abs().max() < 1e-12, kwargs


def test_gfsa_dropout_only_in_training_mode():
    """dropout > 0 changes training outputs; eval mode is exact (== the dropout-free layer)."""
    x = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(11))
    for kwargs in ({}, {"kernel": "linear"}, {"evaluation": "official"}):
        plain = _gfsa_random_gfsa(**kwargs)
        dropped = copy.deepcopy(plain)
        dropped.dropout = 0.5
        assert (plain(x)[0] - dropped(x)[0]).abs().max() == 0, kwargs  # both in eval mode
        dropped.train()
        assert (plain(x)[0] - dropped(x)[0]).abs().max() > 1e-3, kwargs


def test_gfsa_every_parameter_gets_a_gradient():
    """w0, w1, wK and both projections receive a non-zero gradient (fast and linear paths)."""
    x = torch.randn(2, 10, 12, dtype=F64, generator=torch.Generator().manual_seed(12))
    for kwargs in ({}, {"kernel": "linear"}):
        layer = _gfsa_random_gfsa(**kwargs)
        y, aux = layer(x, _gfsa_masks()[1])
        (y.square().sum() + aux).backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.abs().max() > 0, f"{kwargs} {name}"
    default = GFSAttention(12, 3)  # the official parametrisation: wK learned, w0 and w1 fixed
    assert sorted(n for n, _ in default.named_parameters() if n.startswith("w")) == ["wK"]


def test_gfsa_bad_arguments_raise():
    """Invalid settings give a clear error instead of a silently wrong layer."""
    for kwargs in (
        {"causal": True, "kernel": "linear"},
        {"order": 1},
        {"kernel": "elu"},
        {"evaluation": "slow"},
    ):
        try:
            GFSAttention(12, 3, **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"{kwargs} was accepted")


def test_gfsa_linear_variant_saves_no_n_by_n_tensor():
    """kernel="linear" keeps nothing of N×N size for backward at N = 512 (softmax: also none)."""
    N = 512
    for kernel in ("linear", "softmax"):
        layer = GFSAttention(32, 4, kernel=kernel).train()
        assert layer.linear_cost == (kernel == "linear")
        x = torch.randn(1, N, 32, requires_grad=True)
        mask = torch.ones(1, N, dtype=torch.bool)
        mask[0, 400:] = False
        largest = _largest_saved(lambda x, layer=layer, mask=mask: layer(x, mask), x)
        assert largest < N * N, f"{kernel}: saved a tensor of {largest} elements"
    assert GFSAttention.linear_cost is False  # the class default (kernel="softmax") is O(N²)


# ----------------------------------------------------------------------------------------------
# the copy contract (STYLE.md S2)
# ----------------------------------------------------------------------------------------------

# What each file may need besides torch; must match the "Depends on:" line in its header.
STANDALONE = {
    "gfsa.py": [],
    "ksvd_attention.py": [],
    "polynomials.py": [],
    "agf.py": ["polynomials.py"],
}


def test_each_mechanism_file_runs_alone():
    """Copy a file (plus only what its header says it needs) into an empty folder and run it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the demos are small; one thread is plenty
    for name, needs in STANDALONE.items():
        header = (HERE / name).read_text().split('"""')[1]
        for dependency in needs:
            assert dependency in header, f"{name}: header does not mention {dependency}"
        with tempfile.TemporaryDirectory() as tmp:
            for f in (name, *needs):
                shutil.copy(HERE / f, tmp)
            run = subprocess.run(
                [sys.executable, name],
                cwd=tmp,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert run.returncode == 0, f"{name} does not run alone:\n{run.stderr[-2000:]}"
            assert "False" not in run.stdout, f"{name}: a check in its demo failed:\n{run.stdout}"


# ----------------------------------------------------------------------------------------------
# uea
# ----------------------------------------------------------------------------------------------


UEA_DIR = HERE.parent / "shared" / "data" / "uea"  # real archive files, only in the shared checkout


TINY = ["--preset", "quick", "--d-model", "16", "--n-heads", "2", "--d-ff", "32", "--threads", "1"]


def _uea_need_real(name: str) -> pathlib.Path:
    """The real UEA folder `name`, or skip with the reason."""
    folder = UEA_DIR / name
    if not (folder / f"{name}_TRAIN.ts").exists():
        pytest.skip(f"real UEA data not found at {folder} (it ships only with ../shared)")
    return folder


def _uea_toy_ts(cases: list, *, dims="2", equal="false", length=None, labels="up down", extra=()):
    """A small .ts file in the archive's format; data rows start at line len(header) + 1."""
    header = ["# toy file written by _tests_uea.py", "@problemName Toy", "@timeStamps false"]
    header += ["@missing true", "@univariate false", *extra]
    header += [f"@dimensions {dims}"] if dims else []
    header += [f"@equalLength {equal}"] + ([f"@seriesLength {length}"] if length else [])
    header += [f"@classLabel true {labels}", "@data"]
    return "\n".join(header + cases) + "\n", len(header)


def _uea_write(folder, name: str, text: str) -> pathlib.Path:
    path = pathlib.Path(folder) / name
    path.write_text(text)
    return path


def _uea_run(argv: list) -> tuple[dict, str]:
    """main(parse_config(argv)) in this process -> (result, stdout); restores torch's threads."""
    threads, out = torch.get_num_threads(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            result = train_uea.main(parse_config(argv))
    finally:
        torch.set_num_threads(threads)
    return result, out.getvalue()


def _uea_toy_dataset(root, name="Toy", n=12, length=6):
    """<root>/<name>/<name>_{TRAIN,TEST}.ts: two classes, told apart by the sign of channel 1."""
    rng = np.random.default_rng(0)
    folder = pathlib.Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("TRAIN", "TEST"):
        rows = []
        for i in range(n):
            sign, label = (1, "up") if i % 2 else (-1, "down")
            a, b = sign + 0.1 * rng.standard_normal((2, length))
            rows.append(",".join(map(str, a)) + ":" + ",".join(map(str, b)) + ":" + label)
        text, _ = _uea_toy_ts(rows)
        _uea_write(folder, f"{name}_{split}.ts", text.replace("Toy", name))
    return folder


def test_uea_reader_equal_length_labels_in_header_order():
    """Values, shapes and labels of a small equal-length file; tags are case-insensitive."""
    text, _ = _uea_toy_ts(["1,2,3:4,5,6:down", "7,8,9:1.5,-2,3e-1:up"], equal="true", length=3)
    text = text.replace("@problemName", "@PROBLEMNAME")
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "Toy_TRAIN.ts"
        # a non-UTF-8 comment byte (latin-1 é), as in some archive files
        path.write_bytes(text.encode().replace(b"# toy", b"# caf\xe9 toy"))
        ts = read_ts(path)
    assert ts.header["problemname"] == "Toy" and ts.class_names == ["up", "down"]
    assert ts.labels.tolist() == [1, 0]  # @classLabel order (up = 0), not sorted (down = 0)
    assert [s.shape for s in ts.series] == [(3, 2), (3, 2)]
    np.testing.assert_array_equal(ts.series[0], [[1, 4], [2, 5], [3, 6]])
    np.testing.assert_array_equal(ts.series[1], [[7, 1.5], [8, -2], [9, 0.3]])


def test_uea_reader_unequal_lengths_and_missing_values():
    """Each case keeps its length; '?' is filled linearly per channel, ends by the nearest."""
    text, _ = _uea_toy_ts(["?,2,?,4,?:1,1,1,1,1:up", "5,?,?,8:?,?,0,?:down"])
    with tempfile.TemporaryDirectory() as tmp:
        ts = read_ts(_uea_write(tmp, "Toy_TRAIN.ts", text))
    assert [len(s) for s in ts.series] == [5, 4]
    np.testing.assert_allclose(ts.series[0][:, 0], [2, 2, 3, 4, 4])  # pandas linear, both ends
    np.testing.assert_allclose(ts.series[1][:, 0], [5, 6, 7, 8])
    np.testing.assert_allclose(ts.series[1][:, 1], [0, 0, 0, 0])
    assert not any(np.isnan(s).any() for s in ts.series)


def test_uea_reader_errors_name_file_line_and_problem():
    """Every malformed input raises TsFormatError 'path:line: what'."""
    ok = "1,2:3,4:up"
    cases = [  # (rows, keyword arguments of _uea_toy_ts, 0-based data row or header marker, text)
        ([ok, "1,2:3,4:5,6:up"], {}, 1, "found 3 dimensions, expected 2"),
        ([ok, "1,2:3,4:left"], {}, 1, "unknown class label 'left'"),
        (["1,x:3,4:up"], {}, 0, "non-numeric value 'x' (dimension 1, step 2)"),
        ([ok, "1,2,3:3,4:up"], {}, 1, "channels of different lengths [2, 3]"),
        (["?,?:3,4:up"], {}, 0, "dimension 1 has no values"),
        ([ok, "1:3:up"], dict(equal="true", length=2), 1, "length 1, but @seriesLength 2"),
        ([ok, "1,2:up"], dict(dims=None), 1, "found 1 dimensions, expected 2"),
        ([ok, "up"], {}, 1, "a case needs values before its label"),
        ([ok, "1,inf:3,4:up"], {}, 1, "infinite value in dimension 1"),
        ([ok], dict(extra=["@timeStamps true"]), "@timeStamps true", "timestamps not supported"),
        ([ok], dict(extra=["@colour blue"]), "@colour", "unknown header tag @colour"),
        ([ok], dict(labels=""), "@classLabel", "@classLabel true lists no labels"),
        ([ok], dict(extra=["@dimensions two"]), "@dimensions two", "positive integer"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for rows, kwargs, where, what in cases:
            text, n_header = _uea_toy_ts(rows, **kwargs)
            lines = text.splitlines()
            line = (
                n_header + 1 + where
                if isinstance(where, int)
                else 1 + next(i for i, ln in enumerate(lines) if ln.startswith(where))
            )
            path = _uea_write(tmp, "Bad_TRAIN.ts", text)
            with pytest.raises(TsFormatError) as err:
                read_ts(path)
            message = str(err.value)
            assert message.startswith(f"{path}:{line}: ") and what in message, (line, message)
        # no @data at all: the message names the file
        path = _uea_write(tmp, "NoData_TRAIN.ts", "@problemName X\n@classLabel true a b\n")
        with pytest.raises(TsFormatError, match="no @data line") as err:
            read_ts(path)
        assert str(path) in str(err.value)


def test_uea_japanese_vowels_shapes_lengths_and_masks():
    """270 / 370 cases, 12 dims, lengths 7-26 / 7-29, 9 classes; masks follow the lengths."""
    folder = _uea_need_real("JapaneseVowels")
    train, test = (
        read_ts(folder / "JapaneseVowels_TRAIN.ts"),
        read_ts(folder / "JapaneseVowels_TEST.ts"),
    )
    assert (len(train.series), len(test.series)) == (270, 370)
    assert {s.shape[1] for s in train.series + test.series} == {12}
    lengths = [len(s) for s in train.series], [len(s) for s in test.series]
    assert (min(lengths[0]), max(lengths[0]), min(lengths[1]), max(lengths[1])) == (7, 26, 7, 29)
    assert train.class_names == [str(k) for k in range(1, 10)]
    assert np.bincount(train.labels).tolist() == [30] * 9
    data = load_uea(str(UEA_DIR), "JapaneseVowels")
    assert tuple(data.x_train.shape) == (270, 26, 12) and tuple(data.x_test.shape) == (370, 26, 12)
    assert data.mask_train.sum(1).tolist() == lengths[0]
    assert data.mask_test.sum(1).tolist() == [min(n, 26) for n in lengths[1]]  # clipped, as mvts
    assert data.n_clipped == sum(n > 26 for n in lengths[1]) > 0
    assert (data.x_train[~data.mask_train] == 0).all() and (data.x_test[~data.mask_test] == 0).all()
    assert data.y_test.tolist() == test.labels.tolist()


def test_uea_normalisation_uses_training_statistics_only():
    """Changing the TEST file leaves TRAIN arrays and statistics as they were; TEST uses them."""
    folder = _uea_need_real("JapaneseVowels")
    with tempfile.TemporaryDirectory() as tmp:
        copy = pathlib.Path(tmp) / "JapaneseVowels"
        copy.mkdir()
        for split in ("TRAIN", "TEST"):
            name = f"JapaneseVowels_{split}.ts"
            (copy / name).write_bytes((folder / name).read_bytes())
        before = load_uea(tmp, "JapaneseVowels")
        # scale every value of the TEST file by 10
        test_path = copy / "JapaneseVowels_TEST.ts"
        lines = test_path.read_text(errors="replace").splitlines()
        start = next(i for i, ln in enumerate(lines) if ln.lower().startswith("@data")) + 1
        for i in range(start, len(lines)):
            *dims, label = lines[i].split(":")
            dims = [",".join(repr(10 * float(v)) for v in d.split(",")) for d in dims]
            lines[i] = ":".join(dims + [label])
        test_path.write_text("\n".join(lines) + "\n")
        after = load_uea(tmp, "JapaneseVowels")
        raw_test = read_ts(test_path).series
    assert torch.equal(before.x_train, after.x_train)
    np.testing.assert_array_equal(before.mean, after.mean)
    np.testing.assert_array_equal(before.std, after.std)
    # independent check of the statistics: running sums over the TRAIN cases, ddof = 1
    train = read_ts(folder / "JapaneseVowels_TRAIN.ts").series
    n = sum(len(s) for s in train)
    mean = sum(s.sum(0) for s in train) / n
    std = np.sqrt(sum(((s - mean) ** 2).sum(0) for s in train) / (n - 1))
    np.testing.assert_allclose(after.mean, mean, rtol=1e-12)
    np.testing.assert_allclose(after.std, std, rtol=1e-12)
    expected = (raw_test[0] - mean) / std  # TEST case 0 with TRAIN statistics
    np.testing.assert_allclose(after.x_test[0, : len(raw_test[0])].numpy(), expected, rtol=1e-5)
    assert not torch.allclose(before.x_test, after.x_test)


def test_uea_word_labels_follow_the_header_order_basic_motions():
    """BasicMotions: word labels map to @classLabel order (Standing = 0), equal length 100."""
    folder = _uea_need_real("BasicMotions")
    path = folder / "BasicMotions_TRAIN.ts"
    ts = read_ts(path)
    assert ts.class_names == ["Standing", "Running", "Walking", "Badminton"]
    rows = path.read_text(errors="replace").splitlines()
    rows = rows[[r.lower().startswith("@data") for r in rows].index(True) + 1 :]
    words = [r.rsplit(":", 1)[1].strip() for r in rows if r.strip()]
    assert [ts.class_names[k] for k in ts.labels] == words
    assert {s.shape for s in ts.series} == {(100, 6)} and len(ts.series) == 40


def test_uea_presets_follow_the_official_scripts_and_flags_win():
    cfg = parse_config(["--dataset", "Heartbeat", "--attention", "agf"])
    assert (cfg.agf_basis, cfg.agf_order, cfg.agf_gamma, cfg.agf_fix_theta0) == (
        "chebyshev", 6, 0.01, False,
    )  # fmt: skip
    cfg = parse_config(["--dataset", "EthanolConcentration"])
    assert (cfg.agf_basis, cfg.agf_order, cfg.agf_alpha, cfg.agf_beta, cfg.agf_fix_theta0) == (
        "jacobi", 6, 1.5, -1.5, True,
    )  # fmt: skip
    jv = [parse_config(["--attention", a]) for a in ("primal", "primal+trans")]
    assert [(c.primal_rank, c.primal_eta, c.primal_rank_multi) for c in jv] == [
        (40, 0.5, 5), (30, 0.2, 5),
    ]  # fmt: skip
    pems = parse_config(["--dataset", "PEMS-SF", "--attention", "primal+trans"])
    assert (pems.epochs, pems.primal_eta, pems.optimizer) == (400, 0.0, "radam")
    assert parse_config(["--dataset", "SpokenArabicDigits"]).optimizer == "adam"
    paper = parse_config([])
    assert (paper.d_model, paper.n_heads, paper.d_ff, paper.batch_size, paper.seed) == (
        512, 8, 2048, 16, 666,
    )  # fmt: skip
    quick = parse_config(["--preset", "quick", "--dataset", "PEMS-SF", "--epochs", "3"])
    assert (quick.d_model, quick.epochs, quick.agf_order) == (64, 3, 5)  # the flag wins
    assert parse_config(["--agf-order", "7", "--amp", "false"]).agf_order == 7
    assert parse_config(["--amp=false"]).amp is False
    assert (
        set(train_uea.AGF_PRESETS) == set(train_uea.PRIMAL_PRESETS) == set(train_uea.UEA_DATASETS)
    )


def _uea_dummy_data() -> uea_data.UEAData:
    """Two cases of 5 steps and 3 features per split, 2 classes: enough to build a model."""
    return uea_data.UEAData(
        torch.zeros(2, 5, 3), torch.ones(2, 5, dtype=torch.bool), torch.zeros(2, dtype=torch.long),
        torch.zeros(2, 5, 3), torch.ones(2, 5, dtype=torch.bool), torch.zeros(2, dtype=torch.long),
        ["a", "b"], np.zeros(3), np.ones(3), 0,
    )  # fmt: skip


def test_torch_radam_is_the_official_rectified_adam():
    """The official UEA code ships its own RAdam (Liu et al. 2020, Algorithm 2, SGD-with-momentum
    steps while the variance is untractable). torch.optim.RAdam, which we use, takes the same
    steps: checked against the rule written out here, over the switch at step 6."""
    torch.manual_seed(0)
    p_torch = torch.randn(7, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.RAdam([p_torch], lr=1e-2)
    p, m, v = p_torch.detach().clone(), torch.zeros(7, dtype=torch.float64), torch.zeros(7)
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 1e-2
    rho_inf = 2 / (1 - b2) - 1
    for t in range(1, 21):
        grad = torch.randn(7, dtype=torch.float64)
        p_torch.grad = grad.clone()
        opt.step()
        m, v = b1 * m + (1 - b1) * grad, b2 * v + (1 - b2) * grad**2
        rho = rho_inf - 2 * t * b2**t / (1 - b2**t)
        if rho >= 5:  # rectified adaptive step; v is not bias-corrected in the denominator
            r = math.sqrt((rho - 4) * (rho - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho))
            p = p - lr * r * math.sqrt(1 - b2**t) / (1 - b1**t) * m / (v.sqrt() + eps)
        else:  # the first steps: momentum SGD with bias-corrected m
            p = p - lr / (1 - b1**t) * m
        assert torch.allclose(p_torch.detach(), p, rtol=0, atol=1e-12), t


def test_uea_attention_mask_flag_reaches_the_model():
    data = _uea_dummy_data()
    for flag, expected in (([], True), (["--attention-mask", "false"], False)):
        cfg = parse_config([*TINY, *flag])
        assert cfg.attention_mask is expected
        assert train_uea.build_model(cfg, data).cfg.attention_mask is expected


def test_uea_every_preset_builds_a_model():
    """The preset keyword arguments fit the real constructors, for every dataset and kind."""
    data = _uea_dummy_data()
    for name in train_uea.UEA_DATASETS:
        for kind in KINDS:
            cfg = parse_config(["--dataset", name, "--attention", kind, *TINY])
            model = train_uea.build_model(cfg, data)
            logits, aux = model(data.x_train, data.mask_train)
            assert logits.shape == (2, 2) and torch.isfinite(aux), (name, kind)


def test_uea_two_epoch_run_per_attention_kind_writes_its_files():
    folder = _uea_need_real("JapaneseVowels")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in KINDS:
            out = pathlib.Path(tmp) / kind
            argv = [*TINY, "--attention", kind, "--epochs", "2", "--data-dir", str(folder.parent)]
            result, stdout = _uea_run([*argv, "--out", str(out)])
            assert {p.name for p in out.iterdir()} >= {
                "config.json",
                "metrics.jsonl",
                "result.json",
            }
            assert json.loads((out / "config.json").read_text())["attention"] == kind
            records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
            assert [r["epoch"] for r in records] == [1, 2]
            accs = [r["test_acc"] for r in records]  # evaluated after the first and last epoch
            assert result["best_test_acc"] == max(accs) and result["final_test_acc"] == accs[-1]
            assert json.loads((out / "result.json").read_text()) == result
            last = stdout.strip().splitlines()[-1]
            assert last.startswith("RESULT ") and json.loads(last[7:]) == result
            assert result["n_params"] > 0 and result["dataset"] == "JapaneseVowels", kind
            assert all(np.isfinite(r["train_loss"]) for r in records), kind


def test_uea_resume_continues_exactly():
    """4 epochs straight == 2 epochs, then --resume to 4: same metrics and same weights."""
    folder = _uea_need_real("JapaneseVowels")
    argv = [*TINY, "--attention", "primal+trans", "--data-dir", str(folder.parent)]
    with tempfile.TemporaryDirectory() as tmp:
        straight, parts = pathlib.Path(tmp) / "straight", pathlib.Path(tmp) / "parts"
        full, _ = _uea_run([*argv, "--epochs", "4", "--out", str(straight)])
        _uea_run([*argv, "--epochs", "2", "--out", str(parts)])
        resumed, _ = _uea_run([*argv, "--epochs", "4", "--out", str(parts), "--resume", "true"])
        for key in ("best_test_acc", "best_test_epoch", "final_test_acc"):
            assert full[key] == resumed[key], key
        logs = [(d / "metrics.jsonl").read_text() for d in (straight, parts)]
        assert logs[0] == logs[1] and len(logs[0].splitlines()) == 4
        weights = [
            torch.load(d / "checkpoint.pt", weights_only=False)["model"] for d in (straight, parts)
        ]
        assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
        with pytest.raises(SystemExit, match="other settings"):  # resuming with other settings
            _uea_run(
                [*argv, "--epochs", "5", "--out", str(parts), "--resume", "true", "--lr", "0.1"]
            )


def test_uea_two_process_gloo_run():
    """torchrun with 2 CPU processes (Gloo): one RESULT line; its sharded TEST accuracy equals a
    single-process evaluation of the saved weights."""
    folder = _uea_need_real("JapaneseVowels")
    with tempfile.TemporaryDirectory() as tmp:
        argv = [*TINY, "--epochs", "1", "--data-dir", str(folder.parent), "--out", tmp]
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        run = subprocess.run(
            [*cmd, "train_uea.py", *argv],
            cwd=HERE,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[:2000] + "\n...\n" + run.stderr[-2000:]
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
        assert len(lines) == 1, run.stdout
        result = json.loads(lines[0][7:])
        assert result["device"].endswith("x 2 processes")
        cfg = parse_config(argv)
        data = load_uea(cfg.data_dir, cfg.dataset)
        model = train_uea.build_model(cfg, data)
        model.load_state_dict(
            torch.load(pathlib.Path(tmp) / "checkpoint.pt", weights_only=False)["model"]
        )
        acc, _ = train_uea.evaluate(model, data, cfg, torch.device("cpu"), rank=0, world=1)
        assert acc == result["final_test_acc"]


def test_uea_missing_dataset_says_where_and_how():
    with tempfile.TemporaryDirectory() as tmp:
        with pytest.raises(DatasetNotFoundError) as err:
            _uea_run([*TINY, "--dataset", "Heartbeat", "--data-dir", tmp, "--out", tmp])
    text = str(err.value)
    assert str(pathlib.Path(tmp) / "Heartbeat" / "Heartbeat_TRAIN.ts") in text
    assert "https://www.timeseriesclassification.com/dataset.php" in text
    assert "https://timeseriesclassification.com/aeon-toolkit/Heartbeat.zip" in text
    assert "--download" in text


def test_uea_download_unpacks_a_local_zip():
    """--download fetches <url>/<Name>.zip (here a file:// URL) and unpacks the two .ts files."""
    with tempfile.TemporaryDirectory() as tmp:
        source = _uea_toy_dataset(pathlib.Path(tmp) / "made")
        server = pathlib.Path(tmp) / "server"
        server.mkdir()
        with zipfile.ZipFile(server / "Toy.zip", "w") as z:  # files in a sub-folder, plus junk
            for p in source.iterdir():
                z.write(p, f"Toy/{p.name}")
            z.writestr("../evil.txt", "must not be extracted")
        data_dir = pathlib.Path(tmp) / "data"
        url = server.as_uri()
        argv = [*TINY, "--dataset", "Toy", "--epochs", "1", "--data-dir", str(data_dir)]
        result, _ = _uea_run(
            [*argv, "--download", "true", "--download-url", url, "--out", tmp + "/r"]
        )
        for p in source.iterdir():
            assert (data_dir / "Toy" / p.name).read_bytes() == p.read_bytes()
        assert sorted(q.name for q in (data_dir / "Toy").iterdir()) == sorted(
            q.name for q in source.iterdir()
        )
        assert not (pathlib.Path(tmp) / "evil.txt").exists()
        assert result["final_test_acc"] is not None
        with pytest.raises(DatasetNotFoundError, match="could not download"):
            uea_data.download_dataset("Nope", str(data_dir), url)
        (server / "Html.zip").write_text("<html>not found</html>")
        with pytest.raises(DatasetNotFoundError, match="is not a zip file"):
            uea_data.download_dataset("Html", str(data_dir), url)


# ----------------------------------------------------------------------------------------------
# lra
# ----------------------------------------------------------------------------------------------


MODULE = {"softmax": "model", "agf": "agf", "primal": "ksvd_attention", "gfsa": "gfsa"}


MODULE["primal+trans"] = "ksvd_attention"


@contextlib.contextmanager
def _lra_workdir():
    """A temporary folder, and one torch thread meanwhile: tiny models on a shared CPU run
    10-50x faster without thread oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            yield pathlib.Path(tmp)
    finally:
        torch.set_num_threads(threads)


def _lra_tiny_args(data_dir, out, *more) -> list:
    """Flags of a tiny ListOps run: a few dozen short expressions, a 16-wide model."""
    return [
        "--preset", "quick", "--data-dir", str(data_dir), "--out", str(out),
        "--listops-size", "48", "--listops-eval-size", "12", "--steps", "4",
        "--eval-every", "2", "--batch-size", "8", "--d-model", "16", "--d-ff", "32",
        *more,
    ]  # fmt: skip


def _lra_stack_evaluate(expression: str) -> int:
    """An independent ListOps evaluator: a stack machine over the tokens, parentheses ignored."""
    apply = {
        "[MIN": min,
        "[MAX": max,
        "[MED": lambda xs: (sorted(xs)[(len(xs) - 1) // 2] + sorted(xs)[len(xs) // 2]) // 2,
        "[SM": lambda xs: sum(xs) % 10,
    }
    stack = [[]]  # each entry: [operator, arguments...]; the bottom one collects the result
    for token in expression.split():
        if token in "()":
            continue
        if token.startswith("["):
            stack.append([token])
        elif token == "]":
            op, *args = stack.pop()
            stack[-1].append(apply[op](args))
        else:
            stack[-1].append(int(token))
    assert len(stack) == 1 and len(stack[0]) == 1, expression
    return stack[0][0]


def test_lra_listops_labels_equal_an_independent_evaluation():
    """Each generated label == a stack-machine evaluation of the written expression."""
    pairs = lra_data.generate_listops(
        300, seed=3, min_len=5, max_len=200, max_depth=5, progress=False
    )
    ops = {op for text, _ in pairs for op in lra_data.OPERATORS if op in text}
    assert ops == set(lra_data.OPERATORS)  # every operator was exercised
    for text, label in pairs:
        assert label == _lra_stack_evaluate(text), text
    # MED of an even count truncates the mean of the two middle values (official np.median)
    tree = ((((("[MED", 1), 4), 2), 9), "]")  # [MED 1 4 2 9 ] -> median 3.0 -> 3
    assert lra_data.to_value(tree) == 3 == _lra_stack_evaluate(lra_data.to_string(tree))
    assert lra_data.to_value(((("[MED", 1), 2), "]")) == 1  # (1 + 2) / 2 = 1.5 -> 1


def test_lra_listops_lengths_dedup_and_seeds():
    """Lengths strictly inside the bounds, no duplicates; same seed same data, else different."""
    a = lra_data.generate_listops(40, seed=0, min_len=500, max_len=2000, progress=False)
    lengths = [len(lra_data.tokenize_listops(text)) for text, _ in a]
    assert all(500 < n < 2000 for n in lengths), (min(lengths), max(lengths))
    assert len({text for text, _ in a}) == len(a)
    assert a == lra_data.generate_listops(40, seed=0, min_len=500, max_len=2000, progress=False)
    assert a != lra_data.generate_listops(40, seed=1, min_len=500, max_len=2000, progress=False)
    # depth 2: one operator over 2..10 leaves, lengths 4..12, so both bounds are hit often
    b = lra_data.generate_listops(60, seed=0, min_len=4, max_len=8, max_depth=2, progress=False)
    assert {len(lra_data.tokenize_listops(t)) for t, _ in b} == {5, 6, 7}
    with pytest.raises(lra_data.DataError, match="no new expression"):  # depth 2: at most 12 tokens
        lra_data.generate_listops(5, seed=0, min_len=20, max_len=40, max_depth=2, progress=False)


def test_lra_listops_tokeniser():
    """']' -> X, parentheses dropped, the fixed 15-token order, 0 pad, 16 OOV."""
    assert lra_data.LISTOPS_TOKENS == (
        *"0123456789", "[MIN", "[MAX", "[MED", "[SM", "X"
    )  # fmt: skip
    ids = lra_data.tokenize_listops("( ( ( [MAX 2 ) 9 ) ] )")
    assert ids == [12, 3, 10, 15]
    assert lra_data.tokenize_listops("[FIRST 7 ]") == [16, 8, 15]  # unknown token -> OOV
    assert lra_data.VOCAB["listops"] == 17


def test_lra_listops_files_release_format_cache_and_mismatch():
    """Generated tsv = header Source/Target via csv, marker json, reused, mismatch is an error."""
    with _lra_workdir() as tmp_path:
        cfg = lra.parse(_lra_tiny_args(tmp_path, tmp_path / "run"))
        folder = lra_data.prepare_listops(cfg)
        train = folder / "basic_train.tsv"
        assert train.read_bytes().startswith(b"Source\tTarget\r\n")
        with open(train, newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))
        assert len(rows) == 1 + 48 and all(_lra_stack_evaluate(e) == int(y) for e, y in rows[1:])
        assert json.loads((folder / "generator.json").read_text())["train"] == 48
        stamp = train.stat().st_mtime_ns
        assert (
            lra_data.prepare_listops(cfg) == folder and train.stat().st_mtime_ns == stamp
        )  # cached
        split = lra_data.read_listops_tsv(train, max_len=30)
        assert split.x.shape == (48, 30) and split.x.dtype == np.int16
        assert split.lengths.max() <= 30 and (split.x[0, split.lengths[0] :] == 0).all()
        with pytest.raises(lra_data.DataError, match="generated with"):
            lra_data.prepare_listops(
                lra.parse(_lra_tiny_args(tmp_path, tmp_path / "r", "--listops-size", "60"))
            )


def test_lra_listops_reader_errors_name_file_and_line():
    with _lra_workdir() as tmp_path:
        bad_header = tmp_path / "h.tsv"
        bad_header.write_text("expr\tlabel\n[MAX 1 2 ]\t2\n")
        with pytest.raises(lra_data.DataError, match=r"h\.tsv:1: expected the header"):
            lra_data.read_listops_tsv(bad_header, 10)
        bad_row = tmp_path / "r.tsv"
        bad_row.write_text("Source\tTarget\n[MAX 1 2 ]\t2\n[MIN 1 2 ]\tten\n")
        with pytest.raises(lra_data.DataError, match=r"r\.tsv:3: expected 'expression<TAB>label"):
            lra_data.read_listops_tsv(bad_row, 10)


def test_lra_imdb_reader():
    """aclImdb/{train,test}/{neg,pos}/*.txt -> UTF-8 bytes + 1 of the stripped text; val = test."""
    with _lra_workdir() as tmp_path:
        texts = {"neg": ["  bad<br />film \n", "meh"], "pos": ["très bien\n"]}
        for split in ("train", "test"):
            for polarity, docs in texts.items():
                (tmp_path / "aclImdb" / split / polarity).mkdir(parents=True)
                for i, doc in enumerate(docs):
                    (tmp_path / "aclImdb" / split / polarity / f"{i}_7.txt").write_text(
                        doc, "utf-8"
                    )
        splits = lra_data.read_imdb(tmp_path / "aclImdb", max_len=12)
        assert splits["val"] is splits["test"]
        train = splits["train"]
        assert train.y.tolist() == [0, 0, 1]
        expected = [list(t.strip().encode("utf-8")[:12]) for t in texts["neg"] + texts["pos"]]
        for row, length, want in zip(train.x, train.lengths, expected, strict=True):
            assert length == len(want) and (row[:length] - 1).tolist() == want
            assert (row[length:] == 0).all()
        assert len("très bien".encode()) == 10 == train.lengths[2]  # bytes, not characters
        cfg = lra.parse(["--task", "text", "--data-dir", str(tmp_path / "nothing")])
        with pytest.raises(
            lra_data.DataError, match=r"aclImdb.*ai\.stanford\.edu.*text\.\{train,dev"
        ):
            lra_data.load_task(cfg)


def test_lra_aan_reader():
    """new_aan_pairs tsv: no header, label id1 id2 text1 text2; bytes + 1; two documents."""
    with _lra_workdir() as tmp_path:
        path = tmp_path / "new_aan_pairs.train.tsv"
        path.write_bytes(b"1.0\tA1\tB1\tabc\tdefgh\n0\tA2\tB2\t" + b"x" * 20 + b"\tz\n")
        split = lra_data.read_aan_tsv(path, max_len=8)
        assert split.y.tolist() == [1, 0]
        assert split.lengths.tolist() == [3, 8] and split.lengths2.tolist() == [5, 1]
        assert (split.x[0, :3] - 1).tolist() == list(b"abc") and (split.x2[1, :1] - 1).tolist() == [
            ord("z")
        ]
        bad = tmp_path / "bad.tsv"
        bad.write_bytes(b"1\ta\tb\tt1\tt2\n1\ta\tb\tonly four\n")
        with pytest.raises(
            lra_data.DataError, match=r"bad\.tsv:2: expected 5 tab-separated columns"
        ):
            lra_data.read_aan_tsv(bad, 8)


def test_lra_cifar_reader():
    """CIFAR python batches -> TF grayscale, train[:90%] / train[90%:] / test, no padding."""
    with _lra_workdir() as tmp_path:
        rng = np.random.default_rng(0)
        folder = tmp_path / "cifar-10-batches-py"
        folder.mkdir()
        batches = {}
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, (4, 3072), dtype=np.uint8)
            data[0, :1024] = data[0, 1024:2048] = data[0, 2048:] = 0  # a black pixel row: value 0
            batches[name] = data
            with open(folder / name, "wb") as f:  # the real files: bytes keys, encoding 'bytes'
                pickle.dump({b"data": data, b"labels": list(range(4)), b"batch_label": b"x"}, f)
        splits = lra_data.read_cifar(folder)
        assert [len(splits[s].y) for s in ("train", "val", "test")] == [18, 2, 4]
        test = splits["test"]
        data = batches["test_batch"]
        for i in range(4):  # the formula of DATA.md §1.5, one pixel at a time
            for p in range(1024):
                r, g, b = (int(data[i, k * 1024 + p]) for k in range(3))
                assert test.x[i, p] == int(((0.2989 * r + 0.5870 * g + 0.1140 * b) / 255) * 255.5)
        assert (test.x[0] == 0).all() and (test.lengths == 1024).all()  # value 0 is a real token
        assert (
            splits["val"].x[1].tolist()
            == lra_data.cifar_gray(batches["data_batch_5"][3:4])[0].tolist()
        )
        (folder / "data_batch_3").write_bytes(b"not a pickle")
        with pytest.raises(lra_data.DataError, match="data_batch_3: not a CIFAR-10 python batch"):
            lra_data.read_cifar(folder)


def _lra_write_png(path: pathlib.Path, image: np.ndarray, color_type=0, filters=(0, 1, 2, 3, 4)):
    """An independent PNG encoder; row r uses filters[r % len(filters)] (PNG spec §9:
    0 None, 1 Sub, 2 Up, 3 Average, 4 Paeth)."""

    def paeth(a: int, b: int, c: int) -> int:
        p = a + b - c
        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
        return a if pa <= pb and pa <= pc else (b if pb <= pc else c)

    raw, above = bytearray(), [0] * image.shape[1]
    for r, row in enumerate(image.tolist()):
        kind = filters[r % len(filters)]
        raw.append(kind)
        for j, value in enumerate(row):
            a, b, c = (row[j - 1] if j else 0), above[j], (above[j - 1] if j else 0)
            predicted = [0, a, b, (a + b) // 2, paeth(a, b, c)][kind]
            raw.append((value - predicted) % 256)
        above = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", image.shape[1], image.shape[0], 8, color_type, 0, 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(raw)))
        + chunk(b"IEND", b"")
    )


def test_lra_png_reader_all_filters():
    with _lra_workdir() as tmp_path:
        rng = np.random.default_rng(1)
        image = rng.integers(0, 256, (10, 7), dtype=np.uint8)
        image[3] = 255  # large values make the modulo-256 wrap-around matter
        _lra_write_png(tmp_path / "a.png", image)
        assert np.array_equal(lra_data.read_png_gray(tmp_path / "a.png"), image)
        # Paeth ties between different neighbours (e.g. a=0, b=3, c=2 or a=0, b=3, c=1) need few
        # distinct values; the spec's tie order a, b, c then matters
        ties = rng.integers(0, 6, (16, 16), dtype=np.uint8)
        _lra_write_png(tmp_path / "ties.png", ties, filters=(4,))
        assert np.array_equal(lra_data.read_png_gray(tmp_path / "ties.png"), ties)
        _lra_write_png(tmp_path / "rgb.png", image, color_type=2)
        with pytest.raises(lra_data.DataError, match="rgb.png: only 8-bit grayscale"):
            lra_data.read_png_gray(tmp_path / "rgb.png")


def _lra_write_pathfinder(folder: pathlib.Path, n: int, side: int = 4) -> list:
    """A small Pathfinder folder in the release layout; returns the (image, label) pairs."""
    rng, pairs = np.random.default_rng(2), []
    lines = {0: [], 1: []}
    for i in range(n):
        k = i % 2
        image, label = rng.integers(0, 256, (side, side), dtype=np.uint8), int(rng.integers(2))
        _lra_write_png(folder / "imgs" / str(k) / f"sample_{i}.png", image)
        lines[k].append(f"imgs/{k} sample_{i}.png {i} {label} 1.0 14 4 2 0.5 1 1")
        pairs.append((image, label))
    (folder / "imgs" / "1" / "sample_empty.png").write_bytes(b"")  # skipped, as official
    lines[1].append("imgs/1 sample_empty.png 99 1 1.0 14 4 2 0.5 1 1")
    (folder / "metadata").mkdir(parents=True)
    for k, text in lines.items():
        (folder / "metadata" / f"{k}.npy").write_text("\n".join(text) + "\n")
    return pairs


def test_lra_pathfinder_reader():
    with _lra_workdir() as tmp_path:
        folder = tmp_path / "pathfinder32" / "curv_contour_length_14"
        pairs = _lra_write_pathfinder(folder, 20)
        splits = lra_data.read_pathfinder(folder, max_len=16, seed=0)
        assert [len(splits[s].y) for s in ("train", "val", "test")] == [16, 2, 2]
        got = {
            tuple(x.tolist()) + (y,) for s in splits.values() for x, y in zip(s.x, s.y, strict=True)
        }
        assert got == {tuple(im.reshape(-1).tolist()) + (y,) for im, y in pairs}
        assert all((s.lengths == 16).all() for s in splits.values())
        again = lra_data.read_pathfinder(folder, max_len=16, seed=0)
        other = lra_data.read_pathfinder(folder, max_len=16, seed=1)
        assert np.array_equal(again["test"].x, splits["test"].x)  # the split is seeded
        assert not np.array_equal(other["train"].x, splits["train"].x)
        with open(folder / "metadata" / "0.npy", "a") as f:
            f.write("imgs/0 sample_0.png 0\n")  # a line without its label field
        with pytest.raises(lra_data.DataError, match=r"0\.npy:11: expected"):
            lra_data.read_pathfinder(folder, max_len=16, seed=0)


def test_lra_pytorch_lra_pickles():
    """<task>.{train,dev,test}.pickle lists of dicts; token tasks: real = before trailing 0s."""
    with _lra_workdir() as tmp_path:
        rng = np.random.default_rng(3)
        for split in ("train", "dev", "test"):
            items = []
            for i in range(6):
                ids = np.zeros(12, dtype=np.int32)
                ids[: 3 + i] = rng.integers(1, 17, 3 + i)
                items.append({"input_ids_0": ids, "label": i % 10})
            with open(tmp_path / f"listops.{split}.pickle", "wb") as f:
                pickle.dump(items, f)
            pixels = [{"input_ids_0": np.r_[np.zeros(4), np.arange(12)], "label": 1}] * 4
            with open(tmp_path / f"lra-image.{split}.pickle", "wb") as f:  # Skyformer naming
                pickle.dump(pixels, f)
            pairs = [{"input_ids_0": np.r_[5, 6, np.zeros(6)], "input_ids_1": np.r_[7, np.zeros(7)],
                      "label": 1}] * 4  # fmt: skip
            with open(tmp_path / f"retrieval.{split}.pickle", "wb") as f:
                pickle.dump(pairs, f)
        data = lra_data.load_task(lra.parse(["--data-dir", str(tmp_path), "--max-len", "10"]))
        assert data["train"].lengths.tolist() == [3, 4, 5, 6, 7, 8]
        assert data["train"].x.shape == (6, 10) and data["test"].y.tolist() == list(range(6))
        image = lra_data.load_task(lra.parse(["--task", "image", "--data-dir", str(tmp_path)]))
        assert (image["val"].lengths == 1024).all() and image["val"].x[0, :5].tolist() == [0] * 5
        pair = lra_data.load_task(lra.parse(["--task", "retrieval", "--data-dir", str(tmp_path)]))
        assert pair["val"].lengths.tolist() == [2] * 4
        assert pair["val"].lengths2.tolist() == [1] * 4
        with open(tmp_path / "listops.dev.pickle", "wb") as f:
            pickle.dump([{"input_ids_0": np.ones(3)}], f)  # no label
        with pytest.raises(
            lra_data.DataError, match=r"listops\.dev\.pickle: not a PyTorch-LRA pickle"
        ):
            lra_data.load_task(lra.parse(["--data-dir", str(tmp_path)]))


def test_lra_presets_and_precedence():
    cfg = lra.parse(["--task", "image", "--attention", "agf"])
    assert (cfg.batch_size, cfg.steps, cfg.warmup, cfg.max_len) == (256, 35000, 175, 1024)
    assert (cfg.agf_order, cfg.agf_alpha, cfg.agf_beta, cfg.agf_gamma) == (6, 1.5, 2.0, 0.1)
    cfg = lra.parse(["--task", "retrieval", "--attention", "primal+trans", "--primal-eta", "0.3"])
    assert (cfg.primal_rank, cfg.primal_eta, cfg.max_len) == (20, 0.3, 4000)  # flag wins
    assert lra.parse(["--steps", "500"]).warmup == 100  # the preset's warm-up fraction kept
    assert lra.parse(["--steps", "500", "--warmup", "7"]).warmup == 7
    with pytest.raises(SystemExit):
        lra.parse(["--task", "text", "--preset", "quick"])


def test_lra_batches_are_a_function_of_seed_and_step():
    """forever() from step k == the run from 0 after k batches; each epoch is a permutation."""
    it = lra.forever(10, 3, seed=5, start_step=0)
    first = [next(it) for _ in range(7)]
    later = lra.forever(10, 3, seed=5, start_step=4)
    assert all(np.array_equal(a, next(later)) for a in first[4:])
    assert sorted(np.concatenate(first[:3]).tolist()) != list(range(10))  # drop_last: 9 of 10
    assert len(set(np.concatenate(first[:3]).tolist())) == 9


def test_lra_few_step_run_each_attention():
    """A 4-step run with each mechanism ends with a RESULT, its log and a best-val checkpoint."""
    missing = [kind for kind in KINDS if importlib.util.find_spec(MODULE[kind]) is None]
    with _lra_workdir() as tmp_path:
        for kind in [kind for kind in KINDS if kind not in missing]:
            out = tmp_path / kind
            result = lra.main(
                lra.parse(_lra_tiny_args(tmp_path / "data", out, "--attention", kind))
            )
            assert 0 <= result["test_acc"] <= 1 and result["steps"] == 4 and result["params"] > 0
            log = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            assert [r["step"] for r in log] == [2, 4], kind
            assert all(np.isfinite(r["train_loss"]) for r in log), kind
            assert (out / "best.pt").exists()
            assert json.loads((out / "result.json").read_text()) == result
    if missing:
        pytest.skip(f"mechanism files not there yet: {[MODULE[k] + '.py' for k in missing]}")


def test_lra_two_tower_and_image_runs():
    """Retrieval (two towers) and Image (no padding) train from PyTorch-LRA pickles."""
    with _lra_workdir() as tmp_path:
        rng = np.random.default_rng(4)
        for split in ("train", "dev", "test"):
            docs = [{"input_ids_0": np.r_[rng.integers(1, 257, 5), np.zeros(3)],
                     "input_ids_1": np.r_[rng.integers(1, 257, 3), np.zeros(5)],
                     "label": i % 2} for i in range(8)]  # fmt: skip
            with open(tmp_path / f"retrieval.{split}.pickle", "wb") as f:
                pickle.dump(docs, f)
            pixels = [{"input_ids_0": rng.integers(0, 256, 16), "label": i % 10} for i in range(8)]
            with open(tmp_path / f"image.{split}.pickle", "wb") as f:
                pickle.dump(pixels, f)
        for task in ("retrieval", "image"):
            flags = ["--task", task, "--attention", "softmax", "--data-dir", str(tmp_path)]
            flags += ["--out", str(tmp_path / task), "--steps", "2", "--eval-every", "1"]
            flags += ["--batch-size", "4", "--max-len", "8" if task == "retrieval" else "16"]
            result = lra.main(lra.parse(flags + ["--d-model", "16", "--d-ff", "32"]))
            assert result["task"] == task and 0 <= result["test_acc"] <= 1


def _lra_weights(out: pathlib.Path) -> dict:
    return torch.load(out / "checkpoint.pt", weights_only=False)["model"]


def _lra_accuracy(cfg, weights: dict, split) -> float:
    """Test accuracy of `weights`, computed here in eval mode, apart from train_lra.evaluate."""
    model = lra.build(cfg, torch.device("cpu"), world=1).plain
    model.load_state_dict(weights)
    model.eval()
    with torch.no_grad():
        batch = lra.to_tensors(split, np.arange(len(split.y)))
        logits, _ = model(batch["x"], batch["mask"])
    return (logits.argmax(-1) == batch["y"]).double().mean().item()


def test_lra_test_accuracy_is_that_of_the_best_val_weights():
    """RESULT test_acc = the best-val weights (best.pt) on the whole test set, in eval mode."""
    with _lra_workdir() as tmp_path:
        for seed in range(8):  # find a run whose best val is not at its last step
            flags = ["--seed", str(seed), "--steps", "6", "--lr", "0.02", "--dropout", "0.5"]
            flags += ["--listops-eval-size", "100", "--attention", "softmax"]
            cfg = lra.parse(_lra_tiny_args(tmp_path / "data", tmp_path / str(seed), *flags))
            result = lra.main(cfg)
            best = torch.load(tmp_path / str(seed) / "best.pt")
            final = _lra_weights(tmp_path / str(seed))
            test = lra_data.load_task(cfg)["test"]
            best_acc, final_acc = _lra_accuracy(cfg, best, test), _lra_accuracy(cfg, final, test)
            assert result["test_acc"] == pytest.approx(best_acc, abs=1e-5)
            log = (tmp_path / str(seed) / "metrics.jsonl").read_text().splitlines()
            val = [json.loads(line)["val_acc"] for line in log]
            assert result["best_step"] == 2 * (1 + val.index(max(val)))  # first best, every 2
            if result["best_step"] != 6 and best_acc != final_acc:
                return  # this run tells the best weights from the last ones
    raise AssertionError("no seed gave a best step before the last one")


def test_lra_resume_continues_exactly():
    """N steps straight == stop after 3, --resume, the rest: same weights, metrics, result."""
    with _lra_workdir() as tmp_path:
        data = tmp_path / "data"
        extra = ["--attention", "agf", "--steps", "6", "--eval-every", "2", "--accumulate", "2"]
        straight = lra.main(lra.parse(_lra_tiny_args(data, tmp_path / "a", *extra)))
        stopped = lra.main(
            lra.parse(_lra_tiny_args(data, tmp_path / "b", *extra, "--stop-at", "3"))
        )
        assert stopped["stopped_at"] == 3
        resumed = lra.main(
            lra.parse(_lra_tiny_args(data, tmp_path / "b", *extra, "--resume", "true"))
        )
        a, b = _lra_weights(tmp_path / "a"), _lra_weights(tmp_path / "b")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        logs = []
        for run in ("a", "b"):
            lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
            logs.append([{**json.loads(line), "time_s": 0} for line in lines])
        assert [r["step"] for r in logs[0]] == [2, 4, 6] and logs[0] == logs[1]
        for key in ("val_acc", "test_acc", "best_step"):
            assert straight[key] == resumed[key]
        with pytest.raises(SystemExit, match="other settings.*'lr'"):  # not the same run any more
            lra.main(
                lra.parse(
                    _lra_tiny_args(data, tmp_path / "b", *extra, "--resume", "1", "--lr", "1")
                )
            )


def test_lra_gradient_accumulation_equals_one_big_batch():
    """train_step with accumulate=2 makes the same SGD step as one batch (dropout off)."""
    with _lra_workdir() as tmp_path:
        cfg = lra.parse(
            _lra_tiny_args(tmp_path, tmp_path / "run", "--dropout", "0", "--attention", "agf")
        )
        split = lra_data.load_task(cfg)["train"]
        batch = lra.to_tensors(split, np.arange(8))
        weights = []
        for accumulate in (1, 2):
            t = lra.build(cfg, torch.device("cpu"), world=1)  # seeded: the same initial weights
            # plain SGD: unlike Adam, its step is proportional to the gradient, so a wrongly
            # scaled or partial accumulation shows up
            t.opt = torch.optim.SGD(t.model.parameters(), lr=0.5)
            t.sched = torch.optim.lr_scheduler.LambdaLR(t.opt, lambda step: 1.0)
            lra.train_step(
                t, batch, lra.dataclasses.replace(cfg, accumulate=accumulate), torch.device("cpu")
            )
            weights.append(t.plain.state_dict())
        for key in weights[0]:
            assert torch.allclose(weights[0][key], weights[1][key], atol=1e-6), key


def test_lra_command_line_ends_with_result_line():
    """`python train_lra.py ...` prints the config first and RESULT {json} last."""
    with tempfile.TemporaryDirectory() as tmp:
        flags = _lra_tiny_args(pathlib.Path(tmp), pathlib.Path(tmp) / "run", "--steps", "2")
        run = subprocess.run(
            [sys.executable, str(HERE / "train_lra.py"), *flags, "--attention", "softmax"],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]
        lines = run.stdout.strip().splitlines()
        assert json.loads(lines[0])["attention"] == "softmax"
        assert lines[-1].startswith("RESULT ")
        result = json.loads(lines[-1][len("RESULT ") :])
        assert result == json.loads((pathlib.Path(tmp) / "run" / "result.json").read_text())
        missing = subprocess.run(  # no data: a clear message, no traceback, no run folder
            [sys.executable, str(HERE / "train_lra.py"), "--task", "image", "--data-dir", tmp],
            cwd=tmp,  # the default run folder would be ./runs/...
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert missing.returncode != 0 and "cifar-10-batches-py" in missing.stderr
        assert "Traceback" not in missing.stderr and not (pathlib.Path(tmp) / "runs").exists()


def test_lra_torchrun_two_cpu_processes_match_one():
    """torchrun, 2 CPU processes (Gloo): the same weights as one process (dropout off)."""
    with _lra_workdir() as tmp_path:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        for name, launcher in (("one", []), ("two", torchrun)):
            flags = _lra_tiny_args(tmp_path / "data", tmp_path / name, "--dropout", "0")
            run = subprocess.run(
                [
                    sys.executable,
                    *launcher,
                    str(HERE / "train_lra.py"),
                    *flags,
                    "--attention",
                    "agf",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert run.returncode == 0, run.stderr[-2000:]
            assert run.stdout.count("RESULT ") == 1  # only rank 0 reports
        one, two = _lra_weights(tmp_path / "one"), _lra_weights(tmp_path / "two")
        assert len(torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)["rng"]) == 2
        # Adam turns a gradient of ~0 into a step of ±lr whose sign depends on rounding (the
        # all-reduce sums in another order), so a few weights may differ by ~lr; a broken DDP
        # (unsynchronised or unscaled gradients) changes nearly all of them.
        close = torch.cat([torch.isclose(one[k], two[k], atol=1e-5).flatten() for k in one])
        assert close.float().mean() > 0.99, f"only {close.float().mean():.1%} of weights agree"


# ----------------------------------------------------------------------------------------------
# diag
# ----------------------------------------------------------------------------------------------


def _diag_batch(B=3, N=10, D=16, n_real=(10, 7, 4), seed=0):
    """x (B, N, D) float64 and a right-padded mask with n_real real tokens per sequence."""
    torch.manual_seed(seed)
    x = torch.randn(B, N, D, dtype=torch.float64)
    mask = torch.arange(N)[None, :] < torch.tensor(n_real)[:, None]
    return x, mask


class _diag_HiddenStates(torch.nn.Module):
    """A stand-in for Classifier whose hidden states are given: tests cosine_curve alone."""

    def __init__(self, hidden_per_batch: list):
        super().__init__()
        self.blocks, self.cfg = torch.nn.ModuleList(), ModelConfig(n_features=1)
        self.hidden = iter(hidden_per_batch)

    def forward(self, x, mask, x2=None, mask2=None, return_hidden=False):
        return None, None, next(self.hidden)


def test_diag_cosine_similarity_is_one_for_identical_tokens_and_zero_for_orthogonal_ones():
    torch.manual_seed(0)
    D = 8
    same = torch.randn(1, 1, D, dtype=torch.float64).expand(3, 6, D).clone()  # 3 sequences
    same[:, 4:] = 1e3 * torch.randn(3, 2, D, dtype=torch.float64)  # junk in the padding
    mask_same = torch.ones(3, 6, dtype=torch.bool)
    mask_same[:, 4:] = False
    q, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))
    orth = (q.T[:5] * torch.tensor([1.0, 2, 3, 4, 5], dtype=torch.float64)[:, None])[None]
    mask_orth = torch.ones(1, 5, dtype=torch.bool)
    stub = _diag_HiddenStates([[same, same], [orth, torch.ones_like(orth)]])
    batches = [{"x": same, "mask": mask_same}, {"x": orth, "mask": mask_orth}]
    cos = diagnose.cosine_curve(stub, batches)
    # layer 0: three sequences at 1, one at 0 -> the mean over the 4 sequences is 0.75
    assert torch.allclose(cos, torch.tensor([0.75, 1.0], dtype=torch.float64), atol=1e-12)
    stub = _diag_HiddenStates([[orth]])
    assert abs(diagnose.cosine_curve(stub, [{"x": orth, "mask": mask_orth}])[0]) < 1e-12


def test_diag_cosine_similarity_equals_the_explicit_pairwise_mean():
    x, mask = _diag_batch()
    cos = diagnose.cosine_curve(_diag_HiddenStates([[x]]), [{"x": x, "mask": mask}])
    pairs = []
    for h, m in zip(x, mask, strict=True):
        unit = F.normalize(h[m], dim=-1)
        gram = unit @ unit.T  # every pair, i = j included
        n = len(unit)
        pairs.append((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))
    assert torch.allclose(cos[0], torch.stack(pairs).mean(), atol=1e-12)


@pytest.mark.parametrize("style", ["lra", "uea"])
def test_diag_hooks_capture_exactly_the_attention_input(style):
    torch.manual_seed(0)
    cfg = ModelConfig(n_classes=3, max_len=10, n_features=16, style=style, d_model=16, n_heads=2)
    model = Classifier(cfg).double().eval()
    x, mask = _diag_batch()
    hidden, inputs = diagnose.capture(model, {"x": x, "mask": mask})
    seen = model.blocks[0].norm1(hidden[0]) if style == "lra" else hidden[0]  # LN(x) or x
    assert torch.equal(inputs[0][1], mask) and torch.allclose(inputs[0][0], seen, atol=1e-12)
    assert len(hidden) == 3 and len(inputs) == 2
    assert all(not b.attn._forward_pre_hooks for b in model.blocks)  # hooks removed
    # a model whose attention gets no mask (official UEA code): every step counts as seen
    model.cfg.attention_mask = False
    _, inputs = diagnose.capture(model, {"x": x, "mask": mask})
    assert not mask.all() and inputs[0][1].all() and inputs[0][1].shape == mask.shape


def test_diag_two_tower_capture_keeps_the_first_tower():
    torch.manual_seed(0)
    cfg = ModelConfig(n_classes=2, max_len=10, vocab_size=7, two_tower=True, d_model=16, n_heads=2)
    model = Classifier(cfg).double().eval()
    x, x2 = torch.randint(1, 7, (2, 10)), torch.randint(1, 7, (2, 10))
    mask, mask2 = torch.ones(2, 10, dtype=torch.bool), torch.arange(10).expand(2, 10) < 6
    batch = {"x": x, "mask": mask, "x2": x2, "mask2": mask2}
    hidden, inputs = diagnose.capture(model, batch)
    _, _, alone = model.encode(x, mask)  # the shared encoder on the first document only
    assert all(torch.equal(a, b) for a, b in zip(hidden, alone, strict=True))
    assert torch.equal(inputs[1][0], model.blocks[1].norm1(alone[1]))


def test_diag_sequences_are_spread_over_the_split():
    n_real = np.array([5, 1, 5, 5, 5, 5, 5, 5])  # sequence 1 has one real token: never chosen
    assert diagnose._spread(n_real, 3).tolist() == [0, 4, 7]
    assert diagnose._spread(n_real, None).tolist() == [0, 2, 3, 4, 5, 6, 7]


def test_diag_agf_response_is_flat_one_at_init_and_follows_the_coefficients():
    torch.manual_seed(0)
    layer = AGFAttention(16, 2, order=4, basis="legendre", fix_theta0=True).double()
    x, mask = _diag_batch()
    r = diagnose.agf_response(layer, x, mask, n_points=50)
    assert torch.equal(r["theta"], torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.allclose(r["g"], torch.ones(50, dtype=torch.float64), atol=1e-14)
    assert 0 < r["s_seen"][0] <= r["s_seen"][1] <= r["s_seen"][2] < 1
    with torch.no_grad():
        layer.poly_filter.theta.copy_(torch.tensor([0.5, -1.0, 0.3, -0.2]))
    r = diagnose.agf_response(layer, x, mask, n_points=50)
    theta = np.concatenate([[1.0], np.tanh([0.5, -1.0, 0.3, -0.2])])
    expected = np.polynomial.legendre.legval(r["s"].numpy(), theta)  # Σ θ̃_k P_k(s), NumPy
    assert np.allclose(r["g"].numpy(), expected, atol=1e-12)
    assert r["g"].std() > 0.1  # no longer flat


def test_diag_gfsa_response_is_the_identity_at_0_1_0_and_the_eq5_polynomial_otherwise():
    torch.manual_seed(0)
    K = 3
    layer = GFSAttention(16, 2, order=K, learn_w0=True, learn_w1=True).double()  # (0, 1, 0)
    x, mask = _diag_batch()
    r = diagnose.gfsa_response(layer, x, mask, n_points=41)
    assert torch.allclose(r["grid"], r["lam"].expand(2, -1), atol=1e-14)  # p(λ) = λ
    for eig in r["eig"]:
        gain = diagnose.gfsa_polynomial(r["a"], eig)
        assert torch.allclose(gain, eig, atol=1e-14)
        ours, plain = diagnose.off_dc_gains(r["a"], eig)
        assert torch.allclose(ours, plain, atol=1e-12)
    # off-DC gain on known eigenvalues {1, 0.5, -0.25}: p(λ) = λ gives 0.375, p(λ) = λ² 0.15625
    eig = torch.tensor([[1.0, 0.5, -0.25]], dtype=torch.complex128)
    identity = torch.tensor([[0.0], [1.0], [0.0]], dtype=torch.float64)  # (a0, a1, a2), one head
    square = torch.tensor([[0.0], [0.0], [1.0]], dtype=torch.float64)
    assert np.allclose(diagnose.off_dc_gains(identity, eig)[0], 0.375)
    assert np.allclose(torch.cat(diagnose.off_dc_gains(square, eig)), [0.15625, 0.375])
    with torch.no_grad():
        layer.w0.copy_(torch.tensor([0.2, -0.1]))
        layer.w1.copy_(torch.tensor([0.7, 1.3]))
        layer.wK.copy_(torch.tensor([0.4, -0.6]))
    r = diagnose.gfsa_response(layer, x, mask, n_points=41)
    w0, w1, wK, lam = layer.w0[:, None], layer.w1[:, None], layer.wK[:, None], r["lam"]
    eq5 = w0 + w1 * lam + wK * (lam + (K - 1) * (lam**2 - lam))  # GFSA Eq. 5 with Ā -> λ
    assert torch.allclose(r["grid"], eq5.detach(), atol=1e-14)
    # H = p(Ā) has the eigenvalues p(λ): check through traces, tr(H) = Σ p(λ), tr(H²) = Σ p(λ)²
    matrix = diagnose.implied_matrix(layer, "gfsa", x, mask)
    for b, eig in enumerate(r["eig"]):
        filt = diagnose.real_block(matrix[b], mask[b])  # (H, n, n)
        p = diagnose.gfsa_polynomial(r["a"], eig)  # (H, n) complex
        trace1 = filt.diagonal(dim1=-2, dim2=-1).sum(-1)
        trace2 = (filt @ filt).diagonal(dim1=-2, dim2=-1).sum(-1)
        assert torch.allclose(p.sum(-1).real, trace1, atol=1e-10)
        assert torch.allclose((p**2).sum(-1).real, trace2, atol=1e-10)


def _diag_softmax_attention(layer, x, mask):
    """Ā = softmax(QKᵀ/√d) over the real keys, per head, for a layer with fused W_qkv."""
    B, N, D = x.shape
    q, k, _ = layer.W_qkv(x).view(B, N, 3, layer.n_heads, -1).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~mask[:, None, None, :], -math.inf).softmax(-1)


def _diag_heads(linear, x, n_heads):
    """(1, n, D) -> (H, n, d): a projection split into heads."""
    return linear(x)[0].view(x.shape[1], n_heads, -1).transpose(0, 1)


def _diag_dense_references(kind, layer, x, mask):
    """Each sequence's real-token N x N matrix (H, n, n), built here without diagnose.py."""
    out, H = [], layer.n_heads
    for b in range(len(x)):
        xb, real = x[b : b + 1, mask[b]], mask[b : b + 1, mask[b]]  # crop to the real tokens
        n = xb.shape[1]
        if kind in ("softmax", "gfsa"):
            attn = _diag_softmax_attention(layer, xb, real)[0]
            if kind == "softmax":
                out.append(attn)
                continue
            eye, K = torch.eye(n, dtype=x.dtype), layer.order
            w0, w1, wK = (w.view(-1, 1, 1) for w in (layer.w0, layer.w1, layer.wK))
            out.append(w0 * eye + w1 * attn + wK * (attn + (K - 1) * (attn @ attn - attn)))
        elif kind == "agf":  # H = U diag(g) Vᵀ, g = Σ θ̃_k P_k(s) with NumPy's Legendre P_k
            u = _diag_heads(layer.W_u, xb, H).softmax(-1)  # over d
            v = _diag_heads(layer.W_v, xb, H).softmax(-2)  # over the (real) tokens
            s = torch.sigmoid(_diag_heads(layer.W_sigma, xb, H)).numpy()
            theta = layer.poly_filter.coefficients().numpy()
            g = torch.from_numpy(np.polynomial.legendre.legval(s, theta))
            out.append((u * g) @ v.transpose(-2, -1))
        else:  # primal: K_X = Φq Fᵀ F Φkᵀ, F = m evenly spaced real tokens, head = channel slice
            m = layer.n_samples
            f_x = xb[0, [j * (n - 1) // (m - 1) for j in range(m)]].view(m, H, -1).transpose(0, 1)
            phi_q = F.normalize(_diag_heads(layer.W_q, xb, H), dim=-1)
            phi_k = F.normalize(_diag_heads(layer.W_k, xb, H), dim=-1)
            out.append(phi_q @ f_x.transpose(-2, -1) @ f_x @ phi_k.transpose(-2, -1))
    return out


@pytest.mark.parametrize("kind", ["softmax", "agf", "gfsa", "primal"])
def test_diag_singular_values_equal_svdvals_of_independent_dense_references(kind):
    torch.manual_seed(0)
    layer = (
        {
            "softmax": lambda: SoftmaxAttention(16, 2),
            "agf": lambda: AGFAttention(16, 2, order=3, basis="legendre"),
            "gfsa": lambda: GFSAttention(16, 2, order=4, w0=0.3),
            "primal": lambda: PrimalAttention(16, 2, rank=3, rank_multi=2, max_len=10),
        }[kind]()
        .double()
        .eval()
    )
    with torch.no_grad():  # non-trivial filters (at init AGF has g ≡ 1, GFSA is plain Ā)
        if kind == "agf":
            layer.poly_filter.theta.normal_()
        if kind == "gfsa":
            layer.wK.normal_()
    x, mask = _diag_batch()
    junk = x.masked_fill(~mask[..., None], 1e3)  # padding must not change any spectrum
    sigma = diagnose.singular_values(diagnose.implied_matrix(layer, kind, x, mask), mask)
    sigma_junk = diagnose.singular_values(diagnose.implied_matrix(layer, kind, junk, mask), mask)
    with torch.no_grad():
        references = _diag_dense_references(kind, layer, x, mask)
    for b, (ours, ref) in enumerate(zip(sigma, references, strict=True)):
        assert ours.shape == (2, int(mask[b].sum()))
        assert torch.allclose(ours, torch.linalg.svdvals(ref), atol=1e-10), (kind, b)
        assert torch.allclose(ours, sigma_junk[b], atol=1e-10), (kind, b)
    share = diagnose.cumulative_share(sigma[0])
    assert torch.allclose(share[:, -1], torch.ones(2, dtype=torch.float64))
    assert (share.diff(dim=-1) >= -1e-15).all()


def _diag_results():
    """diagnose() on an untrained 4-layer model with one layer of each kind."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        n_classes=3, max_len=10, n_features=16, style="uea", d_model=16, n_heads=2,
        n_layers=4, attention=["softmax", "agf", "gfsa", "primal"],
        attention_kwargs={"primal": {"rank": 3, "rank_multi": 2}},
    )  # fmt: skip
    model = Classifier(cfg).double().eval()
    x, mask = _diag_batch()
    run = diagnose.LoadedRun(model, [{"x": x, "mask": mask}], "toy", HERE)
    return diagnose.diagnose(run, dense_sequences=2, n_points=21), run


def test_diag_report_and_csv_files_from_a_mixed_model():
    results, run = _diag_results()
    assert (
        results["cosine"].shape == (5,)
        and [len(lay["sigma"]) for lay in results["layers"]] == [2] * 4
    )
    lines = diagnose.summary(run, results)
    assert any("AGF filter" in ln for ln in lines) and any("GFSA filter" in ln for ln in lines)
    kinds = {"embedding", "softmax", "agf", "gfsa", "primal"}
    with tempfile.TemporaryDirectory() as tmp:
        paths = diagnose.write_csvs(results, pathlib.Path(tmp))
        names = {p.stem for p in paths}
        assert names == {
            "cosine_similarity", "singular_values", "agf_filter", "agf_theta",
            "gfsa_coefficients", "gfsa_filter", "gfsa_eigenvalues",
        }  # fmt: skip
        for path in paths:  # every row has one value per column, all parse as numbers
            header, *body = list(csv.reader(open(path)))
            assert body and all(len(row) == len(header) for row in body), path.name
            assert all(math.isfinite(float(v)) for row in body for v in row if v not in kinds)
        rows = list(csv.DictReader(open(pathlib.Path(tmp) / "singular_values.csv")))
        assert len(rows) == 4 * 2 * (10 + 7)  # layers x heads x real tokens of 2 sequences
        assert len(list(csv.DictReader(open(pathlib.Path(tmp) / "agf_filter.csv")))) == 21


def test_diag_plots_without_matplotlib_and_with_a_stub():
    results, _ = _diag_results()
    out = io.StringIO()
    with mock.patch.dict(sys.modules, {"matplotlib": None}), contextlib.redirect_stdout(out):
        assert diagnose.plot(results, HERE) == []
    assert "matplotlib is not installed" in out.getvalue()
    # A stub matplotlib runs every plotting call; the figures must be saved under their names.
    with _diag_stub_matplotlib() as figures:
        paths = diagnose.plot(results, pathlib.Path("/nowhere"))
    expected = ["cosine_similarity", "agf_filter", "gfsa_filter", "singular_values"]
    assert [p.stem for p in paths] == expected
    assert [pathlib.Path(f.savefig.call_args[0][0]).stem for f in figures] == expected


@contextlib.contextmanager
def _diag_stub_matplotlib():
    """matplotlib replaced by mocks; yields the list of figures that plt.subplots creates."""
    figures, plt = [], mock.MagicMock()

    def subplots(*shape, **kwargs):
        figures.append(mock.MagicMock())
        axes = (mock.MagicMock(), mock.MagicMock()) if shape == (1, 2) else mock.MagicMock()
        return figures[-1], axes

    plt.subplots.side_effect = subplots
    with mock.patch.dict(sys.modules, {"matplotlib": mock.MagicMock(pyplot=plt)}):
        with mock.patch.dict(sys.modules, {"matplotlib.pyplot": plt}):
            yield figures


def _diag_trained_run(tmp, attention: str) -> pathlib.Path:
    """A 2-epoch JapaneseVowels run of train_uea.py with a tiny model, in tmp/<attention>."""
    import train_uea

    folder = UEA_DIR / "JapaneseVowels"
    if not (folder / "JapaneseVowels_TRAIN.ts").exists():
        pytest.skip(f"real UEA data not found at {folder} (it ships only with ../shared)")
    out = pathlib.Path(tmp) / attention
    argv = [*TINY, "--attention", attention, "--epochs", "2", "--data-dir", str(UEA_DIR)]
    threads = torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            train_uea.main(
                train_uea.parse_config([*argv, "--out", str(out), "--progress", "false"])
            )
    finally:
        torch.set_num_threads(threads)
    return out


def test_diag_end_to_end_on_a_japanese_vowels_checkpoint():
    with tempfile.TemporaryDirectory() as tmp:
        for attention in ("agf", "gfsa"):
            run = _diag_trained_run(tmp, attention)
            argv = [str(run), "--batches", "2", "--batch-size", "8", "--dense", "3"]
            with contextlib.redirect_stdout(io.StringIO()) as out:
                results = diagnose.main(argv)
            assert "over-smoothing" in out.getvalue()
            files = {p.name for p in (run / "diagnose").iterdir()}
            assert {"summary.txt", "cosine_similarity.csv", "singular_values.csv"} <= files
            assert f"{attention}_filter.csv" in files
            rows = list(csv.DictReader(open(run / "diagnose" / "cosine_similarity.csv")))
            assert [r["kind"] for r in rows] == ["embedding", attention, attention]
            assert np.allclose(
                [float(r["cosine"]) for r in rows], results["cosine"].numpy(), atol=1e-5
            )
            # the rebuilt model, weights and data reproduce the run's own final test accuracy
            loaded = diagnose.load_run(run, n_cases=None, batch_size=128)
            with torch.no_grad():
                pred = torch.cat(
                    [loaded.model(b["x"], b["mask"])[0].argmax(-1) for b in loaded.batches]
                )
            y = load_uea(str(UEA_DIR), "JapaneseVowels").y_test
            result = json.loads((run / "result.json").read_text())
            assert (pred == y).double().mean().item() == pytest.approx(result["final_test_acc"])
        # the command line, in a fresh process, on the last run; --out elsewhere
        cmd = [
            sys.executable,
            str(HERE / "diagnose.py"),
            str(run),
            "--out",
            f"{tmp}/cli",
            "--dense",
            "2",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert (pathlib.Path(tmp) / "cli" / "gfsa_eigenvalues.csv").exists()


def test_diag_depth_experiment_trains_then_reuses_finished_runs():
    if not (UEA_DIR / "JapaneseVowels" / "JapaneseVowels_TRAIN.ts").exists():
        pytest.skip(f"real UEA data not found at {UEA_DIR} (it ships only with ../shared)")
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["depth", "--depths", "1", "2", "--attentions", "softmax", "--epochs", "1"]
        argv += ["--data-dir", str(UEA_DIR), "--out", tmp, "--train-args=--d-model 16 --d-ff 32"]
        threads = torch.get_num_threads()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                rows = diagnose.main(argv)
                log = pathlib.Path(tmp) / "softmax-L2" / "train.log"
                stamp = log.stat().st_mtime_ns
                with _diag_stub_matplotlib() as figures:
                    again = diagnose.main(argv)  # finished runs are reused, not retrained
        finally:
            torch.set_num_threads(threads)
        assert [r["n_layers"] for r in rows] == [1, 2] and log.stat().st_mtime_ns == stamp
        assert pathlib.Path(figures[0].savefig.call_args[0][0]).name == "depth.png"
        assert [r["cos_last"] for r in again] == [r["cos_last"] for r in rows]
        assert all(len(r["cos_per_layer"].split()) == r["n_layers"] + 1 for r in rows)
        table = list(csv.DictReader(open(pathlib.Path(tmp) / "depth.csv")))
        assert [int(r["n_layers"]) for r in table] == [1, 2]


def test_diag_end_to_end_on_an_lra_best_checkpoint():
    """train_lra.py on a tiny generated ListOps, then diagnose.py on its best.pt."""
    import train_lra

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--preset", "quick", "--attention", "primal+trans", "--steps", "4", "--warmup", "2"]
        argv += ["--eval-every", "2", "--eval-batches", "1", "--listops-size", "64"]
        argv += ["--listops-eval-size", "40", "--data-dir", f"{tmp}/data", "--out", f"{tmp}/run"]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny model on shared cores: more threads only spin
        try:
            with (
                contextlib.redirect_stdout(io.StringIO()),
                contextlib.redirect_stderr(io.StringIO()),
            ):
                train_lra.main(train_lra.parse(argv))
                results = diagnose.main([f"{tmp}/run/best.pt", "--batches", "2", "--dense", "2"])
        finally:
            torch.set_num_threads(threads)
        assert results["kinds"] == ["softmax", "primal"] and results["cosine"].shape == (3,)
        assert len(results["layers"][1]["sigma"]) == 2
        assert (pathlib.Path(tmp) / "run" / "diagnose" / "singular_values.csv").exists()


# ----------------------------------------------------------------------------------------------
# runner: `python test_all.py` works without the pytest command; `pytest test_all.py` works too
# ----------------------------------------------------------------------------------------------


def test_readme_python_blocks_run():
    """Every ```python block of the README runs as it is (STYLE.md S17 g)."""
    text = (HERE / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks, "the README has no python block"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})  # noqa: S102 (our own README)


def _cases(fn):
    """(label, kwargs) for each case of a test; expands @pytest.mark.parametrize("name", [...])."""
    cases = [("", {})]
    for mark in getattr(fn, "pytestmark", []):
        if mark.name == "parametrize":
            name, values = mark.args
            cases = [(f"{label}[{v}]", {**kw, name: v}) for label, kw in cases for v in values]
    return cases


if __name__ == "__main__":
    tests = [(n, f) for n, f in list(globals().items()) if n.startswith("test_") and callable(f)]
    passed = failed = skipped = 0
    for name, fn in tests:
        for label, kwargs in _cases(fn):
            t0 = time.perf_counter()
            try:
                fn(**kwargs)
            except pytest.skip.Exception as e:
                skipped += 1
                print(f"skip {name + label:70s} {e}")
                continue
            except Exception as e:  # report every failure, then exit non-zero
                failed += 1
                print(f"FAIL {name + label:70s} {type(e).__name__}: {e}")
                continue
            passed += 1
            print(f"ok   {name + label:70s} {time.perf_counter() - t0:6.2f}s")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)
