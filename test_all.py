"""
test_all.py: the whole test suite.  `python -m pytest -q test_all.py`  or  `python test_all.py`.

CPU, float64 where a tolerance matters, fixed seeds. Kinds of test (STYLE.md S17):
(a) two computational forms agree, (b) reductions to known cases, (c) padding never leaks,
(d) every parameter gets a gradient, (e) each mechanism file runs alone from an empty folder,
(f) smoke runs of the train scripts and bench.py, (g) the README's code blocks run.
"""

import copy
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

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

    def largest_saved(fn) -> int:
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        x = torch.randn(1, N, 32, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, aux = fn(x)
            (y.sum() + aux).backward()
        return max(sizes)

    torch.manual_seed(0)
    layer = AGFAttention(32, 2)
    mask = torch.ones(1, N, dtype=torch.bool)
    assert largest_saved(lambda x: layer(x, mask)) < N * N
    dense = largest_saved(lambda x: (agf_dense_reference(layer, x, mask)[0], x.sum() * 0))
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
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    x = torch.randn(1, N, 32, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, aux = layer(x, torch.ones(1, N, dtype=torch.bool))
        (y.sum() + aux).backward()
    assert sizes and max(sizes) < N * N, max(sizes)


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
        sizes = []

        def pack(t, sizes=sizes):
            sizes.append(t.numel())
            return t

        layer = GFSAttention(32, 4, kernel=kernel).train()
        assert layer.linear_cost == (kernel == "linear")
        x = torch.randn(1, N, 32, requires_grad=True)
        mask = torch.ones(1, N, dtype=torch.bool)
        mask[0, 400:] = False
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, aux = layer(x, mask)
            (y.sum() + aux).backward()
        assert max(sizes) < N * N, f"{kernel}: saved a tensor of {max(sizes)} elements"
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
