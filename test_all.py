"""
test_all.py: the whole test suite.  `python -m pytest -q test_all.py`

One section per file, in the project's order. A test's name starts with the file it tests:
test_polynomials_, test_agf_, test_primal_ (ksvd_attention.py), test_gfsa_, test_model_,
test_lra_data_ (and download.py), test_listops_, test_train_lra_, test_uea_data_, test_train_uea_,
test_runs_, test_diagnose_, test_bench_, test_readme_, test_cuda_; a test shared by files names
each in its ids (`_id`), so `-k test_gfsa_` runs every test of one file, shared ones too.

CPU, float64 where a tolerance matters, fixed seeds. Kinds of test: two computational forms agree
(a fast path and its dense reference, a polynomial and its closed form, labels and an independent
evaluator, a schedule and its formula); contracts every attention and flag keeps (padding never
leaks, each argument and flag reaches what is built, a state_dict table); a resumed run continues
exactly; bad input gets one clear message; the README's code blocks run. Tests of the real UEA
files skip when they are not at UEA_DIR; the CUDA ones, without a GPU.
"""

import argparse
import ast
import codecs
import collections
import concurrent.futures
import contextlib
import copy
import csv
import dataclasses
import errno
import functools
import hashlib
import http.server
import inspect
import io
import itertools
import json
import math
import os
import pathlib
import pickle
import pickletools
import random
import re
import runpy
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tracemalloc
import types
import warnings
import zipfile
import zlib
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import agf  # noqa: E402
import bench  # noqa: E402
import diagnose  # noqa: E402
import download  # noqa: E402
import files  # noqa: E402
import listops  # noqa: E402
import lra_data  # noqa: E402
import lra_readers  # noqa: E402
import polynomials  # noqa: E402
import runs  # noqa: E402
import train_lra  # noqa: E402
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
    ATTENTION,
    Classifier,
    ModelConfig,
    SoftmaxAttention,
    build_attention,
    count_parameters,
    layer_kinds,
    layerwise_cosine_similarity,
)
from polynomials import (  # noqa: E402
    BASES,
    FilterSum,
    PolynomialFilter,
    evaluate_basis,
    frequency_response,
    jacobi,
    polynomial_basis,
    recurrence,
)
from uea_data import DatasetNotFoundError, TsFormatError, load_uea, pad_series, read_ts  # noqa: E402

# ----------------------------------------------------------------------------------------------
# shared constants and helpers
# ----------------------------------------------------------------------------------------------


UEA_DIR = HERE.parent / "shared" / "data" / "uea"  # the real archive files, beside the project only
TINY = ["--preset", "quick", "--d-model", "16", "--n-heads", "2", "--d-ff", "32"]
KINDS = ["softmax", "agf", "primal", "primal+trans", "gfsa"]
F64 = torch.float64  # where a tolerance matters


def _id(value):
    """An attention's or script's id names its file: -k test_gfsa_ takes test_x[test_gfsa_...]"""
    kind = isinstance(value, str) and VARIANTS.get(value, [value.split("+")[0]])[0]
    if kind in ATTENTION:
        return f"test_{'model' if kind == 'softmax' else kind}_{value}"
    return f"test_{value[:-3]}_" if value in ("train_lra.py", "train_uea.py") else None


def _real_uea(name: str = "JapaneseVowels") -> pathlib.Path:
    """The real UEA folder `name` beside the project, or skip the test saying where it looked."""
    folder = UEA_DIR / name
    if not (folder / f"{name}_TRAIN.ts").exists():
        pytest.skip(f"real UEA data not found at {folder} (it does not ship with the project)")
    return folder


def _tiny(style: str, attention="softmax", **over) -> ModelConfig:
    """A small config of either style; token inputs for "lra", 5 features for "uea"."""
    base = dict(n_classes=3, max_len=24, style=style, attention=attention, n_layers=2)
    base.update(d_model=16, n_heads=2, d_ff=32, head_hidden=16)
    if style == "lra":
        base.update(vocab_size=11)
    else:
        base.update(n_features=5)
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


def _saved_sizes(fn) -> list:
    """Elements of each tensor autograd keeps for backward while fn() runs."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sizes


def _largest_saved(forward, x: torch.Tensor) -> int:
    """Elements of the largest tensor autograd keeps for backward in forward(x) -> (y, aux)."""

    def step():
        y, aux = forward(x)
        (y.sum() + aux).backward()

    return max(_saved_sizes(step))


@contextlib.contextmanager
def _one_thread():
    """One torch thread meanwhile: tiny models on a shared CPU run many times faster."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _torch_flag(owner, name: str, value):
    """owner.name = value meanwhile (a with block, or a test's decorator), then what it was: for
    torch's global flags, never handed to pytest's monkeypatch. torch.backends.cuda.matmul keeps
    allow_tf32 outside its __dict__, and pytest 9.2 puts such an attribute back by deleting it."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def _cli(script: str, *argv, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    kwargs = dict(cwd=cwd or HERE, env=env, capture_output=True, text=True, timeout=timeout)
    return subprocess.run([sys.executable, str(HERE / script), *argv], **kwargs)


def _runs_alone(name: str, needs: list) -> list:
    """Copy a mechanism file and only the `needs` (besides torch) its header's "Depends on:" line
    names into an empty folder and run it: its demo must pass. Returns the lines it printed."""
    header = (HERE / name).read_text().split('"""')[1]
    for dependency in needs:
        assert dependency in header, f"{name}: header does not mention {dependency}"
    with tempfile.TemporaryDirectory() as tmp:
        for f in (name, *needs):
            shutil.copy(HERE / f, tmp)
        run = _cli(os.path.join(tmp, name), cwd=tmp, timeout=300)  # one thread: demos are small
        assert run.returncode == 0, f"{name} does not run alone:\n{run.stderr[-2000:]}"
        assert "False" not in run.stdout, f"{name}: a check in its demo failed:\n{run.stdout}"
    return run.stdout.splitlines()


def _printed(lines: list, patterns: list) -> list:
    """Each line a tour printed fullmatches its pattern, in order (every number of a line is in a
    named group, or literal in its pattern) -> the groups of each line, as printed (str; None for
    an optional group not printed)."""
    assert len(lines) == len(patterns), "\n".join(lines)
    found = []
    for line, pattern in zip(lines, patterns, strict=True):
        match = re.fullmatch(pattern, line)
        assert match, f"printed {line!r}, expected {pattern!r}"
        found.append(match.groupdict())
    return found


def _says(error: type, message: str, call, *args, **kwargs) -> None:
    """call(*args, **kwargs) raises `error` saying `message`, whole: each fact in it (the range
    found, the size asked for), not only its first words."""
    with pytest.raises(error) as raised:
        call(*args, **kwargs)
    assert str(raised.value) == message


def _rounded(printed: str, exact: float) -> bool:
    """Is `printed` ("20.4", "20,805") `exact` rounded to the decimals it shows?"""
    half_unit = 0.5 * 10.0 ** -len(printed.partition(".")[2])
    return abs(float(printed.replace(",", "")) - exact) <= half_unit * (1 + 1e-9) + 1e-12


def _growth_printed(rows: list, value: str, ratio: str) -> None:
    """A tour's cost rows: each "(xR)" is the row's value over the row above's, both as printed,
    to their rounding; the first row has none."""
    assert rows[0][ratio] is None, rows[0]
    for above, row in itertools.pairwise(rows):
        half_unit = 0.5 * 10.0 ** -len(row[value].partition(".")[2])
        a, b = float(above[value]), float(row[value])
        low, high = (b - half_unit) / (a + half_unit), (b + half_unit) / max(a - half_unit, 1e-9)
        assert low - 0.05 <= float(row[ratio]) <= high + 0.05, f"{value}: {above} -> {row}"


# Parameters of each attention, by formula: D·D + D per Linear(D, D); K, H, m, s: its own.
_PARAMETERS = {
    "softmax": lambda D, H: 4 * (D * D + D),  # W_qkv (3 maps), W_o
    "agf": lambda D, H, K=5: 5 * (D * D + D) + K,  # W_u, W_v, W_sigma, W_val, W_o; θ_1..θ_K
    "gfsa": lambda D, H: 4 * (D * D + D) + H,  # W_qkv, W_o; wK per head
    # W_q, W_k, W_o; W_e, W_r (H, m, s); Λ (H, s); W_er Linear(2s, d)
    "primal": lambda D, H, m, s=20: 3 * (D * D + D) + 2 * H * m * s + H * s + (2 * s + 1) * D // H,
}


# ----------------------------------------------------------------------------------------------
# polynomials.py: the bases AGF filters with
# ----------------------------------------------------------------------------------------------


# (α, β) pairs: classical ones and the tuned AGF values outside the classical range (β <= -1).
JACOBI_PAIRS = [(0.0, 0.0), (-0.5, -0.5), (1.0, 0.2), (1.5, 2.0), (2.0, 0.5), (2.0, -1.0),
                (2.0, -2.0), (2.0, -1.5), (1.5, -1.0), (1.0, 0.0), (0.3, -0.7)]  # fmt: skip


def _polynomials_jacobi_closed_form(n: int, a: float, b: float, x: np.ndarray) -> np.ndarray:
    """P_n^(a,b)(x) = Σ_s C(n+a, n-s) C(n+b, s) ((x-1)/2)^s ((x+1)/2)^(n-s)   (DLMF 18.5.8),
    with the generalised binomial C(z, k) = z (z-1) ... (z-k+1) / k! for real z."""
    binom = lambda z, k: math.prod((z - i) / (i + 1) for i in range(k))  # noqa: E731
    u, v = (x - 1) / 2, (x + 1) / 2
    return sum(binom(n + a, n - s) * binom(n + b, s) * u**s * v ** (n - s) for s in range(n + 1))


@pytest.mark.parametrize("a, b", JACOBI_PAIRS)
def test_polynomials_jacobi_equals_closed_form_and_scipy(a, b):
    """The recurrence == the explicit sum and scipy's eval_jacobi, degree <= 10, incl. β <= -1."""
    x = np.linspace(-1.2, 1.2, 49)  # includes (0, 1), where AGF evaluates it
    got = jacobi(torch.from_numpy(x), 10, a, b).numpy()
    want = np.stack([_polynomials_jacobi_closed_form(n, a, b, x) for n in range(11)])
    assert np.allclose(got, want, rtol=1e-11, atol=1e-11)
    for beta in (-1.0, -2.5):  # α + β = -2, the edge itself; past it
        said = f"Jacobi needs alpha + beta > -2, got alpha=-1.0, beta={beta}"
        _says(ValueError, said, functools.partial(jacobi, torch.zeros(1), 1, -1.0, beta))
    special = pytest.importorskip("scipy.special")
    want = np.stack([special.eval_jacobi(n, a, b, x) for n in range(11)])
    assert np.allclose(got, want, rtol=1e-11, atol=1e-11)


def test_polynomials_legendre_and_chebyshev_match_numpy():
    """Jacobi(0,0) = Legendre; Jacobi(-½,-½) = (2k)!/(4^k (k!)²) T_k; chebyshev_t = T_k."""
    x = np.linspace(-1.0, 1.0, 41)
    names = ("legendre", "chebyshev", "chebyshev_t", "monomial")
    got = {name: polynomial_basis(torch.from_numpy(x), 8, name).numpy() for name in names}
    for k, e_k in enumerate(np.eye(9)):  # e_k: the coefficients selecting the k-th polynomial
        t_k = np.polynomial.chebyshev.chebval(x, e_k)
        scale = math.factorial(2 * k) / (4**k * math.factorial(k) ** 2)
        want = (np.polynomial.legendre.legval(x, e_k), scale * t_k, t_k, x**k)
        for name, w in zip(names, want, strict=True):
            assert np.allclose(got[name][k], w, atol=1e-13), (name, k)


def _polynomials_check_orthogonal(a: float, b: float, nodes: np.ndarray, weights: np.ndarray):
    """Gram matrix ∫ P_m P_n (1-x)^a (1+x)^b dx by quadrature: diagonal with the DLMF norms."""
    K = 6
    p = jacobi(torch.from_numpy(nodes), K, a, b).numpy()  # (K+1, n_nodes)
    gram = (p * weights) @ p.T

    # h_n = 2^(a+b+1) Γ(n+a+1) Γ(n+b+1) / ((2n+a+b+1) Γ(n+a+b+1) n!)   (DLMF 18.3),
    # with (2n+a+b+1) Γ(n+a+b+1) written as Γ(a+b+2) at n = 0 (finite even when a + b = -1).
    def norm(n: int) -> float:
        den = math.gamma(a + b + 2) if n == 0 else (2 * n + a + b + 1) * math.gamma(n + a + b + 1)
        num = 2 ** (a + b + 1) * math.gamma(n + a + 1) * math.gamma(n + b + 1)
        return num / (den * math.factorial(n))

    assert np.allclose(gram, np.diag([norm(n) for n in range(K + 1)]), atol=1e-10), (a, b)


def test_polynomials_jacobi_orthogonal():
    """Exact quadrature: Gauss-Legendre for integer a, b >= 0, else scipy's Gauss-Jacobi nodes."""
    nodes, weights = np.polynomial.legendre.leggauss(30)
    for a, b in [(0, 0), (1, 0), (2, 1), (1, 3)]:
        _polynomials_check_orthogonal(a, b, nodes, weights * (1 - nodes) ** a * (1 + nodes) ** b)
    special = pytest.importorskip("scipy.special")
    for a, b in [(-0.5, -0.5), (1.5, 0.5), (1.0, 0.2), (0.5, -0.7), (-0.3, 2.0)]:
        _polynomials_check_orthogonal(a, b, *special.roots_jacobi(20, a, b))


@pytest.mark.parametrize("basis", BASES)
def test_polynomials_filter_sum_equals_its_plain_reference(basis):
    """FilterSum == the plain Σ θ̃_k P_k(s): values, gradients in s and θ̃; it saves only s, g'(s)."""
    torch.manual_seed(0)
    coefs = recurrence(basis, 6, 1.5, -1.0)
    s = torch.rand(3, 5, 7, dtype=F64, requires_grad=True)
    theta = torch.randn(7, dtype=F64, requires_grad=True)
    weight = torch.randn(3, 5, 7, dtype=F64)
    plain = torch.tensordot(theta, evaluate_basis(s, coefs), dims=1)  # Σ θ̃_k P_k(s), as written
    fast = FilterSum.apply(s, theta, coefs)
    assert torch.allclose(fast, plain, atol=1e-12)
    grads = [torch.autograd.grad((y * weight).sum(), [s, theta]) for y in (fast, plain)]
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-10)
    # create_graph=True (a gradient penalty asks it): the same first-order gradients, no error
    loss = (FilterSum.apply(s, theta, coefs) * weight).sum()
    again = torch.autograd.grad(loss, [s, theta], create_graph=True)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(again, grads[1], strict=True))
    s = torch.rand(1000, dtype=F64, requires_grad=True)
    sizes = _saved_sizes(lambda: FilterSum.apply(s, theta, coefs))
    assert sorted(n for n in sizes if n >= 1000) == [1000, 1000]  # s and g'(s): no P_k is kept
    # its buffers are contiguous whatever the strides of s (AGF passes a transposed view)
    assert polynomials._buffer(torch.rand(4, 3).mT).is_contiguous()


def test_polynomials_filter_is_official_tanh_sum():
    """g(s) = Σ θ̃_k P_k(s), θ̃_k = tanh(θ_k), θ̃_0 = 1 (frozen) or tanh(θ_0), by forward's plain
    sum and by FilterSum (the default): the same values and gradients; frequency grid."""
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
        P = _polynomials_jacobi_closed_form  # independent of the recurrence
        want = theta0 + sum(theta[k - 1] * P(k, 1.5, -1.0, s) for k in range(1, 5))
        plain = PolynomialFilter(4, "jacobi", 1.5, -1.0, fix_theta0=fix, lean=False).double()
        plain.load_state_dict(poly.state_dict())
        s_leaf, out = s.clone().requires_grad_(), {}
        for f in (plain, poly):  # forward's plain sum, then FilterSum (the default)
            out[f.lean] = f(s_leaf)
            assert torch.allclose(out[f.lean], want, atol=1e-12)
            kept = _saved_sizes(functools.partial(f, s_leaf)).count(s.numel())  # size of s
            assert (kept == 2) == f.lean, kept  # FilterSum: s and g'(s); plain: every P_k
        grads = {}
        for f in (plain, poly):
            grads[f.lean] = torch.autograd.grad(
                out[f.lean].square().sum(), [s_leaf, *f.parameters()]
            )
        pairs = zip(grads[False], grads[True], strict=True)
        assert all(torch.allclose(a, b, atol=1e-10) for a, b in pairs), "plain vs FilterSum grads"
        grid, g = frequency_response(poly, n_points=50)
        even = torch.arange(1, 51, dtype=torch.float64) / 51  # 50 points strictly inside (0, 1)
        assert torch.allclose(grid, even), "the grid: k / 51, k = 1 .. 50"
        assert torch.allclose(g, poly(grid).detach()), "the response: the filter on the grid"
        grid = frequency_response(poly)[0]  # by default k / 200, k = 1 .. 199: s = ½ on it
        assert len(grid) == 199 and grid[99] == 0.5, "the default grid: 199 points"
    for lean in (True, False):  # a float32 filter on float64 s: g in s's dtype, by either sum
        assert PolynomialFilter(4, lean=lean)(s).dtype == torch.float64, f"{lean=}: s's dtype"
    bases = "('jacobi', 'legendre', 'chebyshev', 'chebyshev_t', 'monomial')"  # what forward runs
    for build in (functools.partial(PolynomialFilter, 3), functools.partial(recurrence, order=3)):
        _says(ValueError, f"unknown basis 'laguerre'; choose one of {bases}", build, "laguerre")
    want = "PolynomialFilter(order=5, basis=jacobi, alpha=2.0, beta=-1.0, frozen θ̃_0=1)"
    assert repr(PolynomialFilter(5, "jacobi", 2.0, -1.0)) == want, "jacobi: α, β; frozen"
    want = "PolynomialFilter(order=3, basis=legendre, learned θ̃_0)"
    assert repr(PolynomialFilter(3, "legendre", fix_theta0=False)) == want, "no α, β; learned"
    want = "PolynomialFilter(order=2, basis=jacobi, alpha=0.0, beta=0.0, frozen θ̃_0=1)"
    assert repr(PolynomialFilter(2)) == want, "the defaults: Jacobi(0, 0), θ̃_0 frozen"
    # what polynomials.py and RESULTS.md say the plain sum keeps for backward at K = 5, counted
    s = torch.rand(2, 2, 64, 32, requires_grad=True)
    plain = PolynomialFilter(5, "jacobi", 2.0, -1.0, lean=False)
    saved = bench.saved_tensors(functools.partial(plain, s))
    sizes = [t[2] // (4 * s.numel()) for t in saved if t[2] >= 4 * s.numel()]  # in sizes of s
    words = "at K = 5, {} tensors of {} times the bytes of s: {} the size of s".split()
    said = r"\s+(?:#\s+)?".join(r"(\d+)" if w == "{}" else re.escape(w) for w in words)  # any lines
    for doc in ("polynomials.py", "RESULTS.md"):
        found = re.findall(said, (HERE / doc).read_text())
        assert found == [(str(len(sizes)), str(sum(sizes)), str(sizes.count(1)))], (doc, sizes)


_FILTER_PRINTED = (  # print(PolynomialFilter(...)), in agf.py's and polynomials.py's tours
    r"PolynomialFilter\(order=(?P<K>\d+), basis=(?P<basis>\w+), alpha=(?P<alpha>-?\d+\.\d+), "
    r"beta=(?P<beta>-?\d+\.\d+), frozen θ̃_0=1\)"
)


def _agf_default_filter(printed: dict) -> None:
    """The filter printed is AGFAttention's default (K, basis, α, β; θ̃_0 frozen)."""
    defaults = {k: p.default for k, p in inspect.signature(AGFAttention).parameters.items()}
    assert defaults["fix_theta0"] is True, "frozen θ̃_0=1 is printed"
    assert int(printed["K"]) == defaults["order"] and printed["basis"] == defaults["basis"]
    alpha_beta = float(printed["alpha"]), float(printed["beta"])
    assert alpha_beta == (defaults["alpha"], defaults["beta"])


def test_polynomials_tour_runs_alone_and_every_number_it_prints_is_recomputed():
    """`python polynomials.py`, copied alone: each line as expected; the filter is AGF's default;
    the grid k / 6, g(s) from the closed form of P_k and tanh(θ) (θ: seed 0), max |P_k(s)| from
    the closed form on the grid k / 200 (agf.py's "~21": its supremum on [0, 1], by `jacobi`);
    each time ratio from its printed times."""
    lines = _runs_alone("polynomials.py", [])
    numbers = r"\[(?P<values>-?\d+\.\d+(?:, -?\d+\.\d+){4})\]"  # five, 2 decimals each
    cost = r"N=\s*(?P<N>\d+) x d=64   fwd\+bwd\s+(?P<ms>\d+\.\d\d) ms(?: \(x(?P<ms_x>\d+\.\d)\))?"
    _, _, filter_line, grid, response, largest, _, *rows = _printed(lines, [
        r"Jacobi\(-1/2, -1/2\) == c_k \* T_k: True",
        r"Jacobi\(0, 0\) == Legendre \(P_3 = \(5x\^3 - 3x\)/2\): True",
        _FILTER_PRINTED,
        r"s   : " + numbers,
        r"g\(s\): " + numbers,
        r"max \|P_k\(s\)\| on \(0, 1\), k <= (?P<K>\d+): (?P<max>\d+\.\d)",
        r"FilterSum == the plain Σ_k θ̃_k P_k\(s\): True",
        *[cost] * 4,
    ])  # fmt: skip
    _agf_default_filter(filter_line)
    K, a, b = int(filter_line["K"]), float(filter_line["alpha"]), float(filter_line["beta"])
    s = np.arange(1, 6) / 6  # 5 points strictly inside (0, 1), evenly spaced
    torch.manual_seed(0)  # the tour's first draw: θ_1..θ_K ~ N(0, 1)
    theta = np.tanh(torch.zeros(K).normal_().double().numpy())
    P = _polynomials_jacobi_closed_form  # independent of the recurrence
    g = 1.0 + sum(theta[k - 1] * P(k, a, b, s) for k in range(1, K + 1))  # θ̃_0 = 1
    for name, want in (("s", s), ("g(s)", g)):
        printed = (grid if name == "s" else response)["values"].split(", ")
        assert all(map(_rounded, printed, want)), f"{name}: printed {printed}, recomputed {want}"
    assert int(largest["K"]) == K
    fine = np.arange(1, 200) / 200  # frequency_response's default grid
    assert _rounded(largest["max"], max(abs(P(k, a, b, fine)).max() for k in range(K + 1)))
    on_closed = jacobi(torch.linspace(0, 1, 2001, dtype=F64), K, a, b).abs().max().item()
    assert float(largest["max"]) <= on_closed, "a maximum inside (0, 1) is at most the supremum"
    cited = re.findall(r"\|P_k\| up to ~(\d+)", (HERE / "agf.py").read_text())
    assert cited == [str(round(on_closed))], f"agf.py cites |P_k| up to {cited}: {on_closed:.2f}"
    assert [int(row["N"]) for row in rows] == [1024, 2048, 4096, 8192]
    _growth_printed(rows, "ms", "ms_x")


# ----------------------------------------------------------------------------------------------
# agf.py: Attentive Graph Filter
# ----------------------------------------------------------------------------------------------


def _agf_layer(**kwargs) -> AGFAttention:
    """A float64 AGF layer with a non-trivial filter (at init g ≡ 1 hides Σ entirely)."""
    torch.manual_seed(0)
    layer = AGFAttention(32, 4, **kwargs).double()
    with torch.no_grad():
        layer.poly_filter.theta.normal_()
    return layer


def test_agf_orthogonality_penalty_zero_for_orthonormal_and_official_form():
    """One-hot disjoint columns give UᵀU = VᵀV = I and a zero penalty; else the official mean."""
    B, H, N, d = 2, 3, 10, 4
    perm = torch.randperm(N)[:d]
    onehot = torch.zeros(B, H, N, d, dtype=torch.float64)
    onehot[:, :, perm, torch.arange(d)] = 1.0  # column c is the unit vector e_perm[c]
    assert torch.equal(orthogonality_penalty(onehot, onehot.flip(-1)), torch.zeros(B))
    penalty = orthogonality_penalty(torch.zeros_like(onehot), onehot)  # U = 0: mean |UᵀU - I| = 1/d
    assert torch.allclose(penalty, torch.full((B,), 1 / d, dtype=F64))
    # a random U, V against the official formula, written with explicit loops
    torch.manual_seed(0)
    u, v = torch.rand(B, H, N, d, dtype=torch.float64), torch.rand(B, H, N, d, dtype=torch.float64)
    want = torch.zeros(B, dtype=torch.float64)
    for b, m in itertools.product(range(B), (u, v)):
        gram = m[b].transpose(-2, -1) @ m[b]  # (H, d, d): one Gram matrix per head
        want[b] += (gram - torch.eye(d)).abs().sum() / (H * d * d)
    assert torch.allclose(orthogonality_penalty(u, v), want, atol=1e-14)
    layer = _agf_layer(ortho_weight=0.5)  # aux is γ times the batch mean of per-sample penalties
    x, mask = _inputs(_tiny("uea", n_features=32))  # (3, 20, 32), 2 rows padded
    u, _, v, _ = layer.factors(x, mask)
    aux = layer(x, mask)[1]
    assert torch.allclose(aux, 0.5 * orthogonality_penalty(u, v).mean(), atol=1e-14)


def test_agf_autocast_bf16_is_finite():
    """bf16 autocast: projections in bf16 (x cast once), filter and softmaxes in float32, y in
    x's dtype."""
    layer = _agf_layer(order=6, alpha=2.0, beta=-2.0).float()
    x, mask = 5 * torch.randn(2, 64, 32), torch.arange(64) < torch.tensor([[64], [40]])
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
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        saved = bench.saved_tensors(lambda: layer(x, mask))
    copies = [t for t in saved if t[1:3] == (torch.bfloat16, 2 * x.numel())]  # x's size, bf16
    assert len(copies) == 2  # x cast once for the four maps (not four times), and W_o's input


@pytest.mark.parametrize("variant", ["uv", "svd", "agf"])
def test_agf_reduced_forms_equal_their_formulas_written_out(variant):
    """Ablations written out from the weights: "uv" U Vᵀ Val (softmax feature maps), "svd"
    U diag(sigmoid(X W_Σ)) Vᵀ Val, and full AGF at init (g ≡ 1) == "uv"; each == its dense form."""
    x, mask = _inputs(_tiny("uea", n_features=32))  # (3, 20, 32), 2 rows padded
    torch.manual_seed(0)
    layer = AGFAttention(32, 4, variant=variant).double()
    y, aux = layer(x, mask)
    heads = lambda t: t.view(3, 20, 4, 8).transpose(1, 2)  # noqa: E731  (B, N, D) -> (B, H, N, d)
    real = mask[:, None, :, None]
    u = heads(layer.W_u(x)).softmax(-1) * real
    v = heads(layer.W_v(x)).masked_fill(~real, -torch.inf).softmax(-2)
    g = torch.sigmoid(heads(layer.W_sigma(x))) if variant == "svd" else 1.0
    out = (u * g) @ (v.transpose(-2, -1) @ heads(layer.W_val(x)))
    expected = layer.W_o(out.transpose(1, 2).reshape(3, 20, 32)) * mask[..., None]
    assert torch.allclose(y, expected, atol=1e-12)
    if variant == "agf":  # at init ∂g/∂s = 0: W_Σ gets no gradient (as in the official code)
        y.square().sum().backward()
        assert layer.W_sigma.weight.grad.abs().max() == 0 and layer.W_u.weight.grad.abs().max() > 0


@pytest.mark.parametrize("variant", ["agf", "uv", "svd"])
def test_agf_paper_form_equals_the_layer_values_and_gradients(variant):
    """agf_dense_reference (U, V, Σ, A = U Σ Vᵀ written out, then A·X W_val) == the layer, which
    runs agf_apply (right to left): y and the gradients in x and every parameter, with junk in
    the padding; A's rows and columns of padded tokens are 0."""
    torch.manual_seed(0)
    layer = AGFAttention(32, 4, variant=variant, fix_theta0=False).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))  # θ off 0: g is not flat, θ̃_0 is not 0
    x, mask = _inputs(_tiny("uea", n_features=32))  # (3, 20, 32), 2 rows padded
    x = x.masked_fill(~mask[..., None], 1e3).requires_grad_()
    weight = torch.randn(3, 20, 32, dtype=F64)
    out = {}
    for name, form in (("layer", layer), ("paper", functools.partial(agf_dense_reference, layer))):
        y = form(x, mask)[0]
        out[name] = y, torch.autograd.grad((y * weight).sum(), [x, *layer.parameters()])
    assert torch.allclose(out["paper"][0], out["layer"][0], rtol=0, atol=1e-12), "values"
    assert (out["layer"][0][~mask] == 0).all(), "padded outputs are 0"
    names = ["x", *(name for name, _ in layer.named_parameters())]
    for name, a, b in zip(names, out["paper"][1], out["layer"][1], strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-10), f"gradient in {name}"
    graph_filter = agf_dense_reference(layer, x, mask)[1]  # (B, H, N, N)
    pad = ~mask[:, None, :]  # (B, 1, N)
    assert not graph_filter.masked_select(pad[..., None]).any(), "padded rows of A"
    assert not graph_filter.masked_select(pad[:, :, None, :]).any(), "padded columns of A"


def test_agf_tour_runs_alone_and_every_number_it_prints_is_recomputed():
    """`python agf.py`, copied alone with polynomials.py: each line as expected; aux from U and V
    written out (γ · the batch mean of mean|UᵀU - I| + mean|VᵀV - I|), the parameters by formula,
    the filter AGF's default, A (B, H, N, N); at each N the MiB (2**20 bytes) autograd saves, by
    bench.saved_tensors; each ratio from its printed values."""
    lines = _runs_alone("agf.py", ["polynomials.py"])
    B, N, D, H = 2, 64, 64, 2  # the tour's sizes
    growth = r"(?: \(x(?P<{}>\d+\.\d)\))?"
    cost = r"N=\s*(?P<N>\d+)   fwd\+bwd\s+(?P<ms>\d+\.\d) ms" + growth.format("ms_x")
    cost += r"\s+saved for backward\s+(?P<mib>\d+\.\d) MiB" + growth.format("mib_x")
    first, filter_line, _, *rows = _printed(lines, [
        rf"x \({B}, {N}, {D}\) -> y \({B}, {N}, {D}\)   aux_loss=(?P<aux>\d\.\d{{4}})   "
        r"n_params=(?P<params>\d{1,3}(?:,\d{3})*)",
        _FILTER_PRINTED,
        rf"fast path == dense A \(B, H, N, N\) = \({B}, {H}, {N}, {N}\): True",
        *[cost] * 4,
    ])  # fmt: skip
    _agf_default_filter(filter_line)
    assert _rounded(first["params"], _PARAMETERS["agf"](D, H, int(filter_line["K"])))
    torch.manual_seed(0)  # the tour's draws: the layer, θ ~ N(0, 1), x
    layer = AGFAttention(D, H).double()
    with torch.no_grad():
        layer.poly_filter.theta.normal_()
    x, mask = torch.randn(B, N, D, dtype=F64), torch.arange(N) < torch.tensor([[N], [48]])
    heads = lambda t: t.view(B, N, H, D // H).transpose(1, 2)  # noqa: E731  (B, H, N, d)
    real = mask[:, None, :, None]
    with torch.no_grad():
        u = heads(layer.W_u(x)).softmax(-1) * real  # U: rows of padded tokens 0
        v = heads(layer.W_v(x)).masked_fill(~real, -torch.inf).softmax(-2)  # V: real tokens
    eye = torch.eye(D // H, dtype=F64)
    penalty = [(m[b].mT @ m[b] - eye).abs().mean() for b in range(B) for m in (u, v)]
    assert _rounded(first["aux"], layer.ortho_weight * sum(penalty).item() / B)
    layer = AGFAttention(D, H)  # the cost curve's: float32, the sizes alone matter
    for row, n in zip(rows, (512, 1024, 2048, 4096), strict=True):
        assert int(row["N"]) == n
        x = torch.randn(1, n, D, requires_grad=True)
        saved = bench.saved_tensors(functools.partial(layer, x, torch.ones(1, n, dtype=torch.bool)))
        assert _rounded(row["mib"], sum(t[2] for t in saved) / 2**20), f"N={n}: {row['mib']} MiB"
    _growth_printed(rows, "ms", "ms_x")
    _growth_printed(rows, "mib", "mib_x")


# ----------------------------------------------------------------------------------------------
# ksvd_attention.py: Primal-Attention
# ----------------------------------------------------------------------------------------------


def _primal_layer(causal=False, reduction="batch", rank=3, rank_multi=4):
    """A float64 Primal layer: D = 16, H = 2, η = 0.1; by default s = 3, m = 12 sampled tokens."""
    torch.manual_seed(0)
    kwargs = dict(rank_multi=rank_multi, max_len=64, ksvd_weight=0.1, ksvd_reduction=reduction)
    return PrimalAttention(16, 2, rank=rank, causal=causal, **kwargs).to(F64)


def _masks(N: int = 12) -> torch.Tensor:
    """(6, N), for the attention tests: right, left, scattered padding, no real token, padding on
    both sides (the middle real), one real token."""
    mask = torch.ones(6, N, dtype=torch.bool)
    mask[0, N - 4 :], mask[1, :3], mask[2, 1::3], mask[3], mask[4, :3] = False, False, False, 0, 0
    mask[4, N - 5 :], mask[5] = False, torch.arange(N) == 5
    return mask


@pytest.mark.parametrize("causal, r, rank_multi", [(False, 3, 4), (True, 3, 4), (False, 1, 1)])
def test_primal_scores_equal_dual_reference(causal, r, rank_multi):
    """Remark 3.3: O(N) primal scores with W_e, W_r from dual variables (KKT) == the dual scores
    E = K_X H_r, R = K_Xᵀ H_e of the N x N kernel (the module's path: the KKT test); also at the
    smallest sampling, s = 1 and rank_multi 1 (m = 1), where the layer trains as well."""
    B, N, H = 3, 20, 2
    layer = _primal_layer(causal, rank=r, rank_multi=rank_multi)
    assert layer.n_samples == min(64, r * rank_multi)
    torch.manual_seed(1)
    x, mask = torch.randn(B, N, 16, dtype=F64), _masks(N)[:B]
    with torch.no_grad():
        phi_q, phi_k = layer.feature_maps(x, mask)
        f_x = layer.sampled_tokens(x, mask)
        h_e, h_r = torch.randn(2, B, H, N, r, dtype=F64)
        W_e, W_r = kkt_base_weights(phi_q, phi_k, f_x, h_e, h_r, mask)
        e, r_s = primal_scores(phi_q, phi_k, f_x, W_e, W_r)
        e_dual, r_dual = ksvd_dual_reference(phi_q, phi_k, f_x, h_e, h_r, mask)
    for W, phi in ((layer.W_q, phi_q), (layer.W_k, phi_k)):  # written out: causal, the mean of
        z = W(x).view(B, N, H, -1).transpose(1, 2).detach()  # the real z_τ, τ <= t, comes first
        for b, t in itertools.product(range(B), range(N)):  # (as its sum), then φ = z / ‖z‖
            seen = (torch.arange(N) <= t) & mask[b] if causal else torch.arange(N) == t
            assert torch.allclose(phi[b, :, t], F.normalize(z[b][:, seen].sum(1), dim=-1)), (b, t)
    real = mask[:, None, :, None]
    assert e_dual.abs().max() > 0.1 and r_dual.abs().max() > 0.1
    assert torch.allclose(e.masked_fill(~real, 0.0), e_dual, atol=1e-12)
    assert torch.allclose(r_s.masked_fill(~real, 0.0), r_dual, atol=1e-12)
    y, aux = layer(x, mask)
    (y.sum() + aux).backward()
    grads = [p.grad for p in layer.parameters()]
    assert all(g is not None and g.isfinite().all() for g in grads) and y.isfinite().all()


@pytest.mark.parametrize("causal", [False, True])
def test_primal_scores_cost_the_per_head_products(causal):
    """FlopCounterMode: 2·N·d·s flops for each of e, r and 2·m·d·s for each of W_{e|X}, W_{r|X}
    (none causal) per sequence and head: linear in H (one product over all heads' channels)."""
    B, N, d, s, m = 2, 40, 4, 3, 12
    for H in (1, 2, 8):
        torch.manual_seed(H)
        phi_q, phi_k = torch.randn(2, B, H, N, d, dtype=F64)
        f_x = None if causal else torch.randn(B, H, m, d, dtype=F64)
        We, Wr = torch.randn(2, H, d if causal else m, s, dtype=F64)
        with FlopCounterMode(display=False) as counter:
            e, r = primal_scores(phi_q, phi_k, f_x, We, Wr)
        flops = 2 * (2 * B * H * N * d * s)  # e and r
        if causal:  # W_{e|X} = W_e, W_{r|X} = W_r
            W_eX, W_rX = We.expand(B, H, d, s), Wr.expand(B, H, d, s)
        else:  # f(X)ᵀ W_e, f(X)ᵀ W_r
            W_eX, W_rX = f_x.mT @ We, f_x.mT @ Wr  # (B, H, d, s)
            flops += 2 * (2 * B * H * m * d * s)
        for b, h, i in itertools.product(range(B), range(H), range(N)):  # e_i = W_{e|X}ᵀ φ_q(x_i)
            assert torch.allclose(e[b, h, i], W_eX[b, h].T @ phi_q[b, h, i], atol=1e-12)
            assert torch.allclose(r[b, h, i], W_rX[b, h].T @ phi_k[b, h, i], atol=1e-12)
        assert counter.get_total_flops() == flops, (H, counter.get_flop_counts())


@pytest.mark.parametrize("causal", [False, True])
def test_primal_ksvd_objective_is_zero_at_kkt_point(causal):
    """J = 0 at a KKT point built from the SVD K_X = U S Vᵀ (H_e = U_r, H_r = V_r, λ² = n / σ:
    the code averages over n real tokens), and clearly not at a random point."""
    N, r = 24, 3
    layer = _primal_layer(causal)  # m = 12 < 19 real tokens
    torch.manual_seed(2)
    x, mask = torch.randn(1, N, 16, dtype=F64), (torch.arange(N) >= 5)[None]  # left padding
    n, x0 = int(mask.sum()), x.masked_fill(~mask[..., None], 0.0)
    with torch.no_grad():
        e, r_s = layer.scores(x, mask)
        J_random = ksvd_objective(e, r_s, layer.Lambda, layer.We, layer.Wr, mask, False)
        phi_q, phi_k = layer.feature_maps(x0, mask)
        f_x = layer.sampled_tokens(x0, mask)
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
    assert J_kkt_b.abs().max().item() < 1e-10 and aux.item() < 1e-20
    # the KKT relation h_e = Λ e holds row by row at the real tokens (Λ in code scale: λ² / n)
    h_e = (layer.Lambda**2 / n)[None, :, None, :] * e
    assert torch.allclose(h_e[0][:, mask[0]], U[0][:, mask[0], :r], atol=1e-10)


def test_primal_ksvd_objective_without_real_tokens_is_minus_the_trace():
    """No real token in the batch (or in a sequence): no energy, J = -mean_h Tr(W_e[h]ᵀ W_r[h]),
    not 0 / 0 = NaN."""
    torch.manual_seed(0)
    e, r = torch.randn(2, 2, 5, 3, dtype=F64), torch.randn(2, 2, 5, 3, dtype=F64)
    We, Wr, lam = torch.randn(2, 4, 3, dtype=F64), torch.randn(2, 4, 3, dtype=F64), torch.rand(2, 3)
    trace = torch.stack([torch.trace(We[h].T @ Wr[h]) for h in range(2)]).mean()
    no_token = torch.zeros(2, 5, dtype=torch.bool)
    batch = ksvd_objective(e, r, lam.double(), We, Wr, no_token, False)
    assert torch.allclose(batch, -trace), "one J for the batch"
    per_sample = ksvd_objective(e, r, lam.double(), We, Wr, no_token, True)
    assert torch.allclose(per_sample, -trace.expand(2)), "one J per sequence"


def test_primal_loss_matches_official_formulas_without_padding():
    """No padding: aux / η == the official LRA ("batch": (mean J)²) and UEA ("sample": mean J²)."""
    B, N = 3, 16
    torch.manual_seed(3)
    x = torch.randn(B, N, 16, dtype=F64)
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


def test_primal_sampling_takes_evenly_spaced_real_tokens():
    """f(X) = tokens at floor(linspace(0, n_real - 1, m)) of the real positions; without padding
    these are the official positions torch.linspace(0, N - 1, m, dtype=int)."""
    B, N, m = 3, 23, 6
    x = torch.arange(N, dtype=F64)[None, :, None].expand(B, N, 2)  # token value = its position
    mask = _masks(N)[:B]
    f_x = sample_real_tokens(x, mask, m)[..., 0]  # (B, m) positions sampled
    for b in range(B):
        real = torch.nonzero(mask[b]).flatten()
        idx = [math.floor(i * (len(real) - 1) / (m - 1) + 1e-9) for i in range(m)]
        assert f_x[b].tolist() == real[idx].to(F64).tolist()
    full = sample_real_tokens(x, torch.ones(B, N, dtype=torch.bool), m)[0, :, 0]
    assert full.tolist() == torch.linspace(0, N - 1, m, dtype=torch.long).to(F64).tolist()
    # fewer real tokens than samples: repeats, first and last real token included
    few = sample_real_tokens(x, torch.arange(N)[None].expand(B, N) < 4, 6)[0, :, 0]
    assert few.tolist() == [0, 0, 1, 1, 2, 3]


def test_primal_tour_runs_alone_and_every_number_it_prints_is_recomputed():
    """`python ksvd_attention.py`, copied alone: each line as expected; m = min(max_len, s·4),
    the parameters by formula, aux = η·J² with J written out from e and r (the official LRA
    formula, its means over the real tokens); each time ratio from its printed times."""
    lines = _runs_alone("ksvd_attention.py", [])
    B, N, D, H, s = 2, 64, 32, 4, 8  # the tour's sizes; rank_multi 4, max_len N
    m = min(N, s * 4)
    cost = r"N=\s*(?P<N>\d+)  fwd\+bwd\s+(?P<ms>\d+\.\d) ms(?: \(x(?P<ms_x>\d+\.\d)\))?"
    first, _, *rows = _printed(lines, [
        rf"x \({B}, {N}, {D}\) -> y \({B}, {N}, {D}\)  aux=(?P<aux>\d\.\d{{4}})  "
        rf"n_params=(?P<params>\d{{1,3}}(?:,\d{{3}})*)  m={m}",
        r"primal scores == dual \(N x N kernel\) scores: True",
        *[cost] * 4,
    ])  # fmt: skip
    assert _rounded(first["params"], _PARAMETERS["primal"](D, H, m, s))
    torch.manual_seed(0)  # the tour's draws: the layer, then x
    layer = PrimalAttention(D, H, rank=s, rank_multi=4, max_len=N)
    x, mask = torch.randn(B, N, D), torch.arange(N) < torch.tensor([[N], [48]])
    with torch.no_grad():
        e, r = (t.double() for t in layer.scores(x, mask))  # (B, H, N, s) each
    lam = torch.diag_embed(layer.Lambda.detach().double())  # e @ diag(λ), as model_wrapper.py
    energy = [torch.einsum("bhnd,hds->bhns", t, lam).norm(dim=-1) ** 2 for t in (e, r)]
    energy = sum(t.mean(dim=1)[mask].sum() for t in energy) / (2 * mask.sum())  # heads, tokens
    trace = torch.einsum("hps,hpd->hsd", layer.We, layer.Wr).mean(dim=0).trace().item()
    assert _rounded(first["aux"], layer.ksvd_weight * (energy.item() - trace) ** 2)
    assert [int(row["N"]) for row in rows] == [1024, 2048, 4096, 8192]
    _growth_printed(rows, "ms", "ms_x")


# ----------------------------------------------------------------------------------------------
# gfsa.py: Graph-Filter-based Self-Attention
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["softmax", "linear"])
def test_gfsa_fast_path_equals_dense_polynomial(kernel):
    """Ā(ĀV) == the dense Eq. 5 G @ V (K 2, 3, 5; padded; causal softmax); Ā row-stochastic, padded
    keys weightless; G's rows sum to w0 + w1 + wK; K = 2: G(0, 0, 1) == Ā², a (0, 0, 1), E_2 = 0."""
    q, k, v = torch.randn(3, 2, 3, 10, 4, dtype=F64, generator=torch.Generator().manual_seed(0))
    w0, w1, wK = torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    for K, mask, causal in itertools.product((2, 3, 5), (None, _masks(10)[:2]), (False, True)):
        if causal and kernel == "linear":
            continue
        fast = gfsa_apply(q, k, v, w0, w1, wK, K, mask, causal, kernel, 0.0)
        attn = attention_matrix(q, k, mask, causal, kernel)
        dense, graph_filter = gfsa_dense_reference(attn, v, w0, w1, wK, K)
        assert torch.allclose(fast, dense, rtol=0, atol=1e-12), (K, mask is not None, causal)
        assert torch.allclose(graph_filter.sum(-1), (w0 + w1 + wK)[:, None], atol=1e-13)
        one_hot = torch.tensor([0.0, 0.0, 1.0], dtype=F64)[:, None].expand(3, 3)  # w0, w1, wK
        coefficients = torch.stack([a.flatten() for a in filter_coefficients(*one_hot, 2)])
        assert torch.equal(coefficients, one_hot)
        g = gfsa_dense_reference(attn, v, *one_hot, order=2)[1]
        assert torch.allclose(g, attn @ attn, atol=1e-15) and taylor_error(attn, 2)[0].max() < 1e-14
        assert torch.allclose(attn.sum(-1), torch.ones_like(attn[..., 0]), atol=1e-14)
        if mask is not None and kernel == "linear":
            assert (attn.transpose(-2, -1)[~mask[:, None].expand(-1, 3, -1)] == 0).all()


def test_gfsa_taylor_error_bounds():
    """E_K <= 2(K-1) <= 2K on random softmax matrices; a cyclic shift attains 2(K-1)."""
    g, N = torch.Generator().manual_seed(5), 11
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


def test_gfsa_linear_kernel_drops_out_in_training_only():
    """kernel="linear" with attention dropout p: in training, each of the two passes drops
    ρ_k(K) with p (two seeds: two outputs); in eval, the output of the same layer at p = 0."""
    torch.manual_seed(0)
    layer = GFSAttention(16, 2, kernel="linear", dropout=0.5).double()
    x, seen, real = torch.randn(2, 6, 16, dtype=F64), [], F.dropout

    def dropout(t, p=0.5, *args, **kwargs):
        seen.append(p)
        return real(t, p, *args, **kwargs)

    with mock.patch.object(sys.modules["gfsa"].F, "dropout", dropout):
        torch.manual_seed(1)
        first = layer(x)[0]
        torch.manual_seed(2)
        second = layer(x)[0]
        assert seen == [0.5] * 4, "each pass of each forward drops with p"
        assert not torch.allclose(first, second), "training: another mask, another output"
        layer.eval()
        y = layer(x)[0]
    layer.dropout = 0.0
    assert torch.equal(y, layer(x)[0]), "eval: as with no dropout"


def test_gfsa_tour_runs_alone_and_every_number_it_prints_is_recomputed():
    """`python gfsa.py`, copied alone: each line as expected; aux 0, the parameters by formula;
    each E_K from Ā written out and Ā^K as K - 1 products (not matrix_power), Theorem 3.1's
    bound 2K and the tight 2(K-1) from K; each time ratio from its printed times."""
    lines = _runs_alone("gfsa.py", [])
    B, N, D, H, K = 2, 64, 32, 4, 3  # the tour's sizes and order
    kinds = ("fast", "official", "linear")
    cell = r"\s+(?P<{0}>\d+\.\d) ms(?: \(x(?P<{0}_x>\d+\.\d)\))?"
    bound = r"K=(?P<K>\d+): max E_K = (?P<error>\d+\.\d{3})   "
    bound += r"\(Theorem 3\.1 bound (?P<bound>\d+), tight (?P<tight>\d+)\)"
    first, _, *rest = _printed(lines, [
        rf"x \({B}, {N}, {D}\) -> y \({B}, {N}, {D}\)   aux_loss=(?P<aux>\S+)   "
        r"n_params=(?P<params>\d{1,3}(?:,\d{3})*)",
        rf"two passes == dense G, wK ≠ 0, K = {K}: True",
        *[bound] * 3,
        "    N" + "".join(f"{kind:>18s}" for kind in kinds),
        *[r"\s*(?P<N>\d+)" + "".join(cell.format(kind) for kind in kinds)] * 3,
    ])  # fmt: skip
    errors, rows = rest[:3], rest[4:]
    assert _rounded(first["params"], _PARAMETERS["gfsa"](D, H))
    torch.manual_seed(0)  # the tour's draws: the layer, then x
    layer = GFSAttention(D, H, order=K)
    x, mask = torch.randn(B, N, D), torch.arange(N) < torch.tensor([[N], [48]])
    assert first["aux"] == f"{layer(x, mask)[1].item():.1f}" == "0.0", "GFSA has no aux loss"
    with torch.no_grad():
        q, k, _ = layer.W_qkv(x).double().view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)
    scores = (q @ k.mT / math.sqrt(D // H)).masked_fill(~mask[:, None, None, :], -math.inf)
    attn = scores.softmax(-1)  # Ā (B, H, N, N), padded keys weightless
    assert [int(row["K"]) for row in errors] == [2, 3, 6]
    for row in errors:
        order = int(row["K"])
        assert (int(row["bound"]), int(row["tight"])) == (2 * order, 2 * (order - 1)), row
        power = functools.reduce(torch.matmul, [attn] * order)  # Ā^K
        estimate = attn + (order - 1) * (attn @ attn - attn)  # Eq. 4
        error = (power - estimate).abs().sum(-1).max().item()  # max over (B, H) of ‖·‖∞
        assert _rounded(row["error"], error), (row, error)
    assert [int(row["N"]) for row in rows] == [256, 512, 1024]
    for kind in kinds:
        _growth_printed(rows, kind, f"{kind}_x")


# ----------------------------------------------------------------------------------------------
# model.py: the Transformer classifier (and the checks every attention shares)
# ----------------------------------------------------------------------------------------------


# Every attention variant, small (D = 16, H = 2), float64, eval mode, off the init where the init
# hides a term (AGF: g ≡ 1; GFSA: wK = 0). The shared tests below run on each of them.
VARIANTS = {
    "softmax": ("softmax", {}),
    "softmax-causal": ("softmax", {"causal": True}),
    "agf": ("agf", {}),
    "agf-chebyshev-learned-theta0": ("agf", {"basis": "chebyshev_t", "fix_theta0": False}),
    "agf-uv": ("agf", {"variant": "uv"}),
    "agf-svd": ("agf", {"variant": "svd"}),
    "primal": ("primal", {"rank": 3, "rank_multi": 4}),
    "primal-sample": ("primal", {"rank": 3, "rank_multi": 4, "ksvd_reduction": "sample"}),
    "primal-causal": ("primal", {"rank": 3, "causal": True}),
    "gfsa": ("gfsa", {"order": 3, "learn_w0": True, "learn_w1": True}),
    "gfsa-causal": ("gfsa", {"order": 3, "causal": True}),
    "gfsa-linear": ("gfsa", {"order": 3, "kernel": "linear"}),
    "gfsa-official": ("gfsa", {"order": 3, "evaluation": "official"}),
    "gfsa-causal-official": ("gfsa", {"order": 3, "causal": True, "evaluation": "official"}),
    "gfsa-linear-official": ("gfsa", {"order": 3, "kernel": "linear", "evaluation": "official"}),
    "gfsa-exact": ("gfsa", {"order": 3, "high_order": "exact"}),
    "gfsa-exact-causal": ("gfsa", {"order": 3, "high_order": "exact", "causal": True}),
}


def _variant(name: str) -> torch.nn.Module:
    """VARIANTS[name] with random filter coefficients (AGF θ, GFSA w0, w1, wK)."""
    torch.manual_seed(0)
    kind, kwargs = VARIANTS[name]
    layer = build_attention(kind, 16, 2, **kwargs).double().eval()
    with torch.no_grad():
        for w in [layer.w0, layer.w1, layer.wK] if kind == "gfsa" else []:
            w.copy_(torch.randn_like(w))
        if getattr(layer, "poly_filter", None) is not None:
            layer.poly_filter.theta.normal_()
    return layer


def _dense_reference(layer: torch.nn.Module):
    """x -> y by the dense N x N form: AGF's A, GFSA's official G (softmax: at init), or Primal"""
    if isinstance(layer, (AGFAttention, PrimalAttention)):
        agf = isinstance(layer, AGFAttention)
        return lambda x: agf_dense_reference(layer, x)[0] if agf else layer(x)[0]
    gfsa = isinstance(layer, GFSAttention)
    ref = copy.deepcopy(layer) if gfsa else GFSAttention(16, 2, causal=layer.causal).double()
    ref.load_state_dict(layer.state_dict(), strict=False)  # softmax: W_qkv, W_o
    ref.evaluation = "official"
    return lambda x: ref.eval()(x)[0]


@pytest.mark.parametrize("name", list(VARIANTS), ids=_id)
def test_model_padding_is_never_read_and_every_parameter_learns(name):
    """Junk at padding changes no y (0 there) nor aux (0 without an aux loss; B = 0: 0); gradients
    finite, 0 at padding, reach every parameter; each _masks row == the dense form of its tokens."""
    layer, mask, x = _variant(name), _masks(16), torch.randn(6, 16, 16, dtype=F64)
    sdpa = F.scaled_dot_product_attention  # every query may attend to a key (else NaN somewhere)
    with mock.patch.object(F, "scaled_dot_product_attention", wraps=sdpa) as calls:
        y0, aux0 = layer(x.masked_fill(~mask[..., None], 0.0), mask)
    masks = [c.kwargs.get("attn_mask") for c in calls.call_args_list]
    assert all(m is None or m.any(-1).all() for m in masks), name
    assert torch.isfinite(y0).all() and (y0[~mask] == 0).all() and torch.isfinite(aux0)
    assert aux0.item() == 0 or isinstance(layer, (AGFAttention, PrimalAttention)), aux0
    for u_or_v in layer.factors(x, mask)[::2] if isinstance(layer, AGFAttention) else ():
        assert not u_or_v.transpose(1, 2)[~mask].any()  # as agf.py says: 0 at padding
    dense = _dense_reference(layer)
    if isinstance(layer, SoftmaxAttention):  # Ā V written out (fused = False) == SDPA
        written = SoftmaxAttention(layer.d_model, layer.n_heads, causal=layer.causal, fused=False)
        written.load_state_dict(layer.state_dict())
        y = written.double()(x.masked_fill(~mask[..., None], 0.0), mask)[0]
        assert torch.allclose(y, y0, atol=1e-12), "the written-out branch == SDPA"
    for b, real in [(b, real) for b, real in enumerate(mask) if real.any()]:
        assert torch.allclose(y0[b, real], dense(x[b : b + 1, real])[0], atol=1e-12), b
    for junk in (1e3, math.inf, -math.inf, math.nan):
        x_junk = x.masked_fill(~mask[..., None], junk).requires_grad_()
        y, aux = layer(x_junk, mask)
        assert torch.allclose(y, y0, rtol=0, atol=1e-12), junk
        assert torch.allclose(aux, aux0, rtol=0, atol=1e-14), junk
        layer.zero_grad()
        (y.square().sum() + aux).backward()
        assert torch.isfinite(x_junk.grad).all() and (x_junk.grad[~mask] == 0).all(), junk
        for n, p in layer.named_parameters():
            assert torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, f"{junk}: {n}"
    for t in (0, 5, 10) if getattr(layer, "causal", False) else ():  # the future is not read
        assert torch.allclose(y0[:, : t + 1], layer(x[:, : t + 1], mask[:, : t + 1])[0], atol=1e-12)
        assert torch.allclose(y0[:1, : t + 1], layer(x[:1, : t + 1])[0], atol=1e-12)  # no mask
    x, real = torch.randn(1, 30, 16, dtype=F64), torch.arange(30) >= 5  # aux: a sequence alone
    assert torch.allclose(layer(x, real[None])[1], layer(x[:, real])[1], atol=1e-14)
    for m in (None, mask[:0]):  # B = 0: aux exactly 0 (not NaN, nor Primal's η·Tr² alone)
        y, aux = layer(torch.randn(0, 16, 16, dtype=F64), m)
        assert y.shape == (0, 16, 16) and aux.dim() == 0 and aux.item() == 0.0
    if name in ATTENTION:  # the Classifier too
        logits, aux = Classifier(_tiny("uea", name)).double()(torch.randn(0, 12, 5, dtype=F64))
        assert logits.shape == (0, 3) and aux.item() == 0.0


@pytest.mark.parametrize("name", ["agf", "primal", "primal-causal", "gfsa", "gfsa-linear"], ids=_id)
def test_model_attentions_save_no_n_by_n_tensor_for_backward(name):
    """Nothing of N·N elements is kept for backward at N = 512 (the dense AGF reference is)."""
    N, (kind, kwargs) = 512, VARIANTS[name]
    layer = build_attention(kind, 32, 2, **kwargs).train()
    x, mask = torch.randn(1, N, 32, requires_grad=True), torch.ones(1, N, dtype=torch.bool)
    mask[0, 400:] = False
    assert _largest_saved(lambda x: layer(x, mask), x) < N * N
    if name == "agf":
        dense = _largest_saved(lambda x: (agf_dense_reference(layer, x, mask)[0], x.sum() * 0), x)
        assert dense >= N * N


@pytest.mark.parametrize("kind", ["softmax", "gfsa"])
def test_model_sdpa_saves_n_by_n_for_backward_only_with_dropout_or_a_causal_mask(kind):
    """CPU, training: nothing of N·N kept for backward at dropout 0 (GFSA causal too: is_causal);
    N·N per (B, H) at dropout 0.1 or fused=False; causal + padding: the (B, 1, N, N) mask."""
    B, H, N = 2, 2, 64
    x, mask = torch.randn(B, N, 16, requires_grad=True), torch.ones(B, N, dtype=torch.bool)
    mask[1, 40:] = False

    def largest(mask: torch.Tensor | None, **kwargs) -> int:
        layer = build_attention(kind, 16, H, **kwargs).train()
        return _largest_saved(lambda x: layer(x, mask), x)

    assert largest(mask, dropout=0.0) < N * N
    assert largest(mask, dropout=0.1) >= B * H * N * N
    assert N * N < largest(mask, dropout=0.0, causal=True) < B * H * N * N
    assert (largest(None, causal=True) < N * N) == (kind == "gfsa")  # softmax: an (N, N) mask
    if kind == "softmax":
        assert largest(mask, fused=False) >= B * H * N * N


def test_model_dense_references_refuse_an_n_by_n_matrix_too_large():
    """At N = 65536 a (1, 2, N, N) float32 matrix takes 32 GiB: every dense reference refuses at
    once, saying how large, before allocating; the cap is max_bytes (exactly at it passes)."""
    N, H = 65536, 2
    q, mask = torch.randn(1, H, N, 1), torch.ones(1, N, dtype=torch.bool)
    attn, w = torch.zeros(()).expand(1, H, N, N), torch.zeros(H)  # a view: no memory behind it
    big, over = f" (1, {H}, {N}, {N})", f": {H * N * N * 4 / 2**30:.1f} GiB > max_bytes={2**32}"
    layer, x, at_cap, s = AGFAttention(4, H), torch.randn(1, 64, 4), 2 * 64 * 64 * 4, q[:, :, :64]
    official = GFSAttention(8, H, evaluation="official")
    bf16 = x.bfloat16()  # A is still float32, in the dtype of AGF's factors
    f32 = " torch.float32"

    def small(dtype: str, cap: int) -> str:  # a (1, 2, 64, 64) float32 matrix over its cap
        return f" (1, {H}, 64, 64){dtype}: {at_cap / 2**30:.1f} GiB > max_bytes={cap}"

    cases = [
        (f"x: dense A{big}{f32}{over}", lambda: agf_dense_reference(layer, torch.randn(1, N, 4))),
        (f"phi_q: dense K_X{big}{over}", lambda: ksvd_kernel(q, q, None, mask)),
        (f"phi_q: dense K_X{big}{over}", lambda: ksvd_dual_reference(q, q, None, q, q, mask)),
        (f"q: dense Ā{big}{f32}{over}", lambda: attention_matrix(q, q, None, False, "softmax")),
        (f"q: dense Ā{big}{f32}{over}", lambda: official(torch.randn(1, N, 8))),
        (f"attn: dense Ā², G{big}, each{over}", lambda: gfsa_dense_reference(attn, q, w, w, w, 2)),
        ("x: dense A" + small(f32, at_cap - 1),
         lambda: agf_dense_reference(layer, x, max_bytes=at_cap - 1)),
        ("x: dense A" + small(f32, 9), lambda: agf_dense_reference(layer, bf16, max_bytes=9)),
        ("phi_q: dense K_X" + small("", 9),
         lambda: ksvd_dual_reference(s, s, None, s, s, mask[:, :64], max_bytes=9)),
        ("q: dense Ā" + small(f32, 9),
         lambda: attention_matrix(s, s, None, False, "linear", max_bytes=9)),
    ]  # fmt: skip
    for message, call in cases:
        _says(MemoryError, message, call)
    y, graph_filter = agf_dense_reference(layer, x, max_bytes=at_cap)
    assert graph_filter.shape == (1, H, 64, 64) and torch.allclose(y, layer(x)[0], atol=1e-6)
    # the other dense forms at their cap too: K_X, Ā and Ā², G of (1, 2, 64, 64) float32 each
    assert ksvd_kernel(s, s, None, mask[:, :64], max_bytes=at_cap).shape == (1, H, 64, 64)
    small = attention_matrix(s, s, None, False, "softmax", max_bytes=at_cap)
    assert gfsa_dense_reference(small, s, w, w, w, 2, max_bytes=at_cap)[1].shape == small.shape


def test_model_dense_references_cap_float64_matrices_at_their_8_bytes_an_entry():
    """The cap counts the bytes of the dtype the matrix is made in: float64 inputs, (1, 2, 64, 64)
    matrices of 65,536 bytes, twice float32's: made at that cap, refused a byte below it and at
    float32's; at N = 65536 each dense reference (and official GFSA) refuses 64 GiB at once."""
    N, H, n = 65536, 2, 64
    cap = 2 * n * n * 8  # (1, 2, 64, 64) float64
    s, mask = torch.randn(1, H, n, 1, dtype=F64), torch.ones(1, n, dtype=torch.bool)
    w = torch.zeros(H, dtype=F64)
    attn = torch.randn(1, H, n, n, dtype=F64).softmax(-1)
    layer, x = AGFAttention(4, H).double(), torch.randn(1, n, 4, dtype=F64)
    dense = {  # a dense reference at max_bytes -> what it returns, made from the N x N matrix
        "agf": lambda b: agf_dense_reference(layer, x, max_bytes=b)[1],
        "ksvd_kernel": lambda b: ksvd_kernel(s, s, None, mask, max_bytes=b),
        "ksvd_dual": lambda b: ksvd_dual_reference(s, s, None, s, s, mask, max_bytes=b)[0],
        "softmax Ā": lambda b: attention_matrix(s, s, None, False, "softmax", max_bytes=b),
        "linear Ā": lambda b: attention_matrix(s, s, None, False, "linear", max_bytes=b),
        "gfsa": lambda b: gfsa_dense_reference(attn, s, w, w, w, 2, max_bytes=b)[1],
    }
    for name, make in dense.items():
        assert make(cap).dtype == F64, name
        for below in (cap - 1, cap // 2):
            with pytest.raises(MemoryError, match=f"GiB > max_bytes={below}$"):
                make(below)
    big = r" \(1, 2, 65536, 65536\).*: 64\.0 GiB( each)? > max_bytes=4294967296$"
    q, long_mask = torch.randn(1, H, N, 1, dtype=F64), torch.ones(1, N, dtype=torch.bool)
    huge = torch.zeros((), dtype=F64).expand(1, H, N, N)  # a view: no memory behind it
    official = GFSAttention(8, H, evaluation="official").double()
    cases = [
        ("^x: dense A" + big, lambda: agf_dense_reference(layer, torch.randn(1, N, 4, dtype=F64))),
        ("^phi_q: dense K_X" + big, lambda: ksvd_kernel(q, q, None, long_mask)),
        ("^phi_q: dense K_X" + big, lambda: ksvd_dual_reference(q, q, None, q, q, long_mask)),
        ("^q: dense Ā" + big, lambda: attention_matrix(q, q, None, False, "softmax")),
        ("^q: dense Ā" + big, lambda: official(torch.randn(1, N, 8, dtype=F64))),
        ("^attn: dense Ā², G" + big, lambda: gfsa_dense_reference(huge, q, w, w, w, 2)),
    ]
    for message, call in cases:
        with pytest.raises(MemoryError, match=message):
            call()


# Constructor arguments each attention refuses with a ValueError (not an assert, gone under
# python -O), and what it says; every kind also refuses d_model = 16 with n_heads = 3.
BAD_ARGUMENTS = {
    "agf": [({"basis": "hermite"}, "unknown basis 'hermite'; choose one of ('jacobi', 'legendre', "
                                   "'chebyshev', 'chebyshev_t', 'monomial')"),
            ({"order": -1}, "order K=-1 must be >= 0"),
            ({"variant": "usv"}, "variant='usv': expected 'agf', 'uv' or 'svd'")],
    "primal": [({"ksvd_reduction": "mean"}, "ksvd_reduction='mean': expected 'batch' or 'sample'"),
               ({"rank": 0}, "rank=0 must be >= 1"), ({"max_len": 0}, "max_len=0 must be >= 1"),
               ({"rank_multi": 0}, "rank_multi=0 must be >= 1")],
    "gfsa": [({"order": 1}, "order K=1: the high-order term needs K >= 2"),
             ({"kernel": "elu"}, "kernel='elu': expected one of ('softmax', 'linear')"),
             ({"causal": True, "kernel": "linear"}, "causal=True needs kernel='softmax': Efficient "
              "Attention's key softmax runs over all N tokens: it has no causal form"),
             ({"evaluation": "slow"}, "evaluation='slow': expected one of ('fast', 'official')"),
             ({"high_order": "power"}, "high_order='power': expected one of ('taylor', 'exact')")],
}  # fmt: skip


@pytest.mark.parametrize("kind", list(ATTENTION), ids=_id)
def test_model_every_attention_checks_its_inputs_the_same_way(kind):
    """Bad x or mask: one message naming the argument, what it expects and what it got (TypeError
    for a dtype, ValueError for a shape or device); bad constructor arguments: BAD_ARGUMENTS."""
    bad_arguments = [({"n_heads": 3}, "d_model=16 is not divisible by n_heads=3")]
    for kwargs, message in bad_arguments + BAD_ARGUMENTS.get(kind, []):
        _says(ValueError, message, ATTENTION[kind], **{"d_model": 16, "n_heads": 2, **kwargs})
    layer = ATTENTION[kind](16, 2)
    x, ok = torch.randn(2, 8, 16), torch.ones(2, 8, dtype=torch.bool)
    x_ = r"^x: expected torch\.float32 \(the layer's dtype\) of shape \(B, N >= 1, 16\), got "
    mask_ = r"^mask: expected bool of shape \(2, 8\) on cpu, got torch\."
    cases = [
        (x, ok.float(), TypeError, mask_ + r"float32 of shape \(2, 8\) on cpu$"),
        (x, ok.long(), TypeError, mask_ + r"int64 of shape \(2, 8\) on cpu$"),
        (x, ok[:, :7], ValueError, mask_ + r"bool of shape \(2, 7\) on cpu$"),
        (x, ok.T, ValueError, mask_ + r"bool of shape \(8, 2\) on cpu$"),
        (x, ok.to("meta"), ValueError, mask_ + r"bool of shape \(2, 8\) on meta$"),
        (x[0], None, ValueError, x_ + r"torch\.float32 of shape \(8, 16\)$"),
        (x[..., :12], ok, ValueError, x_ + r"torch\.float32 of shape \(2, 8, 12\)$"),
        (x[:, :0], None, ValueError, x_ + r"torch\.float32 of shape \(2, 0, 16\)$"),
        (x[:, :0], ok[:, :0], ValueError, x_ + r"torch\.float32 of shape \(2, 0, 16\)$"),
        (x.long(), ok, TypeError, x_ + r"torch\.int64 of shape \(2, 8, 16\)$"),
        (x.double(), ok, TypeError, x_ + r"torch\.float64 of shape \(2, 8, 16\)$"),
    ]
    for bad_x, bad_mask, error, message in cases:
        with pytest.raises(error, match=message):
            layer(bad_x, bad_mask)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, aux = layer(x.bfloat16(), ok)
        with pytest.raises(TypeError, match=x_ + r"torch\.int64 of shape \(2, 8, 16\)$"):
            layer(x.long(), ok)  # autocast excuses another float dtype only
    assert y.shape == x.shape and torch.isfinite(y).all() and torch.isfinite(aux)


# What each attention's state_dict() (so every checkpoint) holds at D = 16, H = 2: name:shape
# [:init]; ~name: a constant buffer, kept out of it. Every entry is a parameter that learns.
_LIN, _O = "W_{0}.weight:16x16 W_{0}.bias:16", " W_o.weight:16x16 W_o.bias:16"
_UV, _SIGMA = " ".join(_LIN.format(w) for w in ("u", "v", "val")) + _O, _LIN.format("sigma")
_PRIMAL = "W_q.weight:16x16 W_q.bias:16 W_k.weight:16x16 W_k.bias:16 W_er.bias:8" + _O
_STATE = {
    "softmax": [({}, "W_qkv.weight:48x16 W_qkv.bias:48" + _O)],
    "agf": [({}, f"{_UV} {_SIGMA} poly_filter.theta:5:0"), ({"variant": "uv"}, _UV),
            ({"variant": "svd"}, f"{_UV} {_SIGMA}"),
            ({"order": 3, "fix_theta0": False}, f"{_UV} {_SIGMA} poly_filter.theta:3:0 "
                                                "poly_filter.theta0::0")],
    "primal": [({}, f"We:2x200x20:Q Wr:2x200x20:Q Lambda:2x20:U W_er.weight:8x40 {_PRIMAL}"),
               ({"causal": True, "rank": 3}, f"We:2x8x3:Q Wr:2x8x3:Q Lambda:2x3:U "
                                              f"W_er.weight:8x6 {_PRIMAL}")],
    "gfsa": [({}, "wK:2:0 ~w0:2:0 ~w1:2:1 W_qkv.weight:48x16 W_qkv.bias:48" + _O),
             ({"learn_w1": True}, "wK:2:0 ~w0:2:0 w1:2:1 W_qkv.weight:48x16 W_qkv.bias:48" + _O)],
}  # fmt: skip
_CLASSIFIER = {  # the classifier's own entries (_tiny), and each block's besides its attention
    "lra": "embed.weight:11x16:N pos:24x16:N "
    "head.0.weight:16x16 head.0.bias:16 head.2.weight:3x16 head.2.bias:3",
    "uea": "embed.weight:16x5 embed.bias:16 pos:24x16:u head.weight:3x384 head.bias:3",
    "block": "norm1.weight:16:1 norm1.bias:16:0 norm2.weight:16:1 norm2.bias:16:0 "
    "mlp.0.weight:32x16 mlp.0.bias:32 mlp.3.weight:16x32 mlp.3.bias:16",
}
_INIT = {  # as each docstring says ("Q": orthonormal rows)
    "0": lambda t: not t.any(),
    "1": lambda t: t.eq(1).all(),
    "U": lambda t: t.min() >= 0 and t.max() <= 1 and t.std() > 0.15,
    "u": lambda t: t.abs().max() <= 0.02 < 3 * t.std(),
    "N": lambda t: 0.015 < t.std() < 0.025,
    "Q": lambda t: torch.allclose(t.flatten(1) @ t.flatten(1).T, torch.eye(len(t)), atol=1e-6),
}


@pytest.mark.parametrize("kind", list(ATTENTION), ids=_id)
def test_model_state_dict_holds_what_the_table_says(kind):
    """state_dict() == _STATE (keys, shapes, init: _INIT), all of it learns, constants (~) are
    buffers out of it; the classifier's (_CLASSIFIER): its own, each block's and attention's."""

    def check(module, spec):
        entries = [(entry + "::").split(":")[:3] for entry in spec.split()]  # name, shape, init
        want = {k: tuple(int(n) for n in shape.split("x") if n) for k, shape, _ in entries}
        state = {k: tuple(v.shape) for k, v in module.state_dict().items()}
        assert state == {k: v for k, v in want.items() if "~" not in k}
        assert {k for k, p in module.named_parameters() if p.requires_grad} == set(state)
        values = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        buffers = {k.replace("~", ""): v for k, v in want.items() if "~" in k}
        assert {k: tuple(v.shape) for k, v in module.named_buffers()} == buffers
        assert [k for k, _, i in entries if i and not _INIT[i](values[k.replace("~", "")])] == []

    for kwargs, spec in _STATE[kind]:
        check(ATTENTION[kind](16, 2, **kwargs), spec)
    attention = " ".join("attn." + entry for entry in _STATE[kind][0][1].split())
    for style in ("lra", "uea"):  # Primal: m = 200 as alone (attention_kwargs beat the config)
        cfg = _tiny(style, kind, attention_kwargs={"primal": {"max_len": 1024}})
        block = f"{_CLASSIFIER['block']} {attention}".split()
        blocks = " ".join(f"blocks.{i}.{entry}" for i in range(2) for entry in block)
        check(Classifier(cfg), f"{_CLASSIFIER[style]} {blocks} norm.weight:16:1 norm.bias:16:0")


# Another value where "the default, else bool: not, int: + 1, float: + 0.5" cannot say (max_len:
# below m = 200). GFSA at K = 3, where high_order matters (Eq. 4 is exact at 2), on both paths;
# a path: another way to the same numbers.
_OTHER = dict(basis="legendre", variant="svd", ksvd_reduction="sample", kernel="linear")
_OTHER |= dict(evaluation="official", high_order="exact", max_len=7)
_BASES = {"gfsa": [{"order": 3}, {"order": 3, "evaluation": "official"}]}
_PATHS = ("evaluation", "fused")
_DEFAULTS = {  # each docstring's: the official code's or, said there, our choice
    "softmax": "dropout=0.0 causal=False fused=True",
    "agf": "order=5 basis='jacobi' alpha=2.0 beta=-1.0 ortho_weight=0.01 fix_theta0=True "
    "variant='agf'",
    "primal": "rank=20 rank_multi=10 max_len=1024 ksvd_weight=0.1 causal=False "
    "ksvd_reduction='batch'",
    "gfsa": "order=2 w0=0.0 learn_w0=False learn_w1=False dropout=0.0 causal=False "
    "kernel='softmax' evaluation='fast' high_order='taylor'",
}


@pytest.mark.parametrize("kind", list(ATTENTION), ids=_id)
def test_model_every_constructor_argument_reaches_the_module(kind):
    """Each keyword argument at another value changes the state, y or aux off the init (learn_*,
    fix_*: what learns; a path, _PATHS: nothing); the defaults are _DEFAULTS; eval twice: same."""
    x, mask = torch.randn(3, 10, 16, dtype=F64), _masks(10)[:3]
    close = functools.partial(torch.allclose, atol=1e-12)
    signature = list(inspect.signature(ATTENTION[kind]).parameters.values())

    def built(**kwargs) -> tuple[dict, set]:
        torch.manual_seed(0)
        layer = ATTENTION[kind](16, 2, **{**base, **kwargs}).double()
        with torch.no_grad():  # off the init, where AGF's θ and GFSA's wK = 0 hide terms
            for p in layer.parameters():
                p.add_(0.5 * torch.randn_like(p))
        (y, aux), again = layer.eval()(x, mask), layer(x, mask)
        assert torch.equal(y, again[0]) and torch.equal(aux, again[1])
        torch.manual_seed(1)
        out = dict(layer.state_dict(), y=y, aux=aux, training=layer.train()(x, mask)[0])
        out |= {"buffer " + k: v for k, v in layer.named_buffers()}
        return out, {k for k, p in layer.named_parameters() if p.requires_grad}

    assert [p.name for p in signature[:2]] == ["d_model", "n_heads"]
    assert " ".join(f"{p.name}={p.default!r}" for p in signature[2:]) == _DEFAULTS[kind]
    for base, p in itertools.product(_BASES.get(kind, [{}]), signature[2:]):
        (default, learns), value = built(), base.get(p.name, p.default)
        other = _OTHER[p.name] if _OTHER.get(p.name, value) != value else p.default
        if other == value:
            step = 1 if type(value) is int else 0.5
            other = not value if isinstance(value, bool) else value + step
        got, got_learns = built(**{p.name: other})
        equal = torch.equal if p.name not in _PATHS else close
        same = got.keys() == default.keys() and all(equal(got[k], v) for k, v in default.items())
        assert p.kind == p.KEYWORD_ONLY and same == (p.name in _PATHS), (base, p.name, other)
        assert got_learns != learns or not p.name.startswith(("learn_", "fix_")), p.name


@pytest.mark.parametrize("style", ["lra", "uea", "two-tower"])
@pytest.mark.parametrize("kind", KINDS, ids=_id)
def test_model_padding_is_never_read_by_the_classifier(kind, style):
    """Junk at padding (ids; features and, by a hook, embeddings: 1e3, ±inf, NaN), 4 more padded
    steps (N = 24 = max_len): logits, loss as without; gradients finite, reach every parameter."""
    torch.manual_seed(0)
    two = style == "two-tower"
    cfg = _tiny("lra" if two else style, kind, two_tower=two)
    model = Classifier(cfg).double().eval()
    with torch.no_grad():  # off the init, where some filters have exactly zero slope
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, mask = _inputs(cfg, N=20)  # real token ids are 1..10: id 0 marks padding below
    x_long, mask_long = torch.cat([x, x[:, :4]], 1), torch.cat([mask, mask[:, :4] & False], 1)
    labels = torch.tensor([0, 1, 2])

    def loss(x, mask):
        logits, aux = model(*(x, mask, x.flip(0), mask.flip(0)) if two else (x, mask))
        return logits, F.cross_entropy(logits, labels) + aux

    def fill(module, inputs, out):  # the embedding's output at padded positions := junk
        padded = inputs[0] == 0 if cfg.vocab_size else (inputs[0] == 0).all(-1)
        return out.masked_fill(padded[..., None], junk)

    with torch.no_grad():
        logits, ref = loss(x, mask)
    for junk in (1e3, math.inf, -math.inf, math.nan):
        pad = ~mask_long if cfg.vocab_size else ~mask_long[..., None]
        x_junk = x_long.masked_fill(pad, 0 if cfg.vocab_size else junk)
        hook = model.embed.register_forward_hook(fill)
        with torch.no_grad():
            logits_junk, loss_junk = loss(x_junk, mask_long)
        hook.remove()
        assert torch.allclose(logits_junk, logits, rtol=0, atol=1e-10), junk
        assert torch.allclose(loss_junk, ref, rtol=0, atol=1e-10), junk
    loss(x_junk, mask_long)[1].backward()  # NaN features (or id 0) at padding, no hook
    for n, p in model.named_parameters():
        assert torch.isfinite(p.grad).all() and p.grad.any(), n


def test_model_attention_mask_false_is_the_official_uea_model():
    """attention_mask=False (official UEA code): logits == the encoder run with every step real
    (padding read as 0), the mask used only by the head; != with the mask."""
    for kind in KINDS:
        torch.manual_seed(0)
        cfg = _tiny("uea", kind, attention_mask=False)
        model = Classifier(cfg).double().eval()
        x, mask = _inputs(cfg)
        with torch.no_grad():
            logits = model(x, mask)[0]
            h = model.encode(x.masked_fill(~mask[..., None], 0.0), torch.ones_like(mask))[0]
            assert torch.allclose(logits, model.head(model.pool(h, mask)), atol=1e-12), kind
            model.cfg.attention_mask = True
            assert not torch.allclose(logits, model(x, mask)[0]), kind


def test_model_layer_kinds_expands_a_name_and_checks_a_list():
    """A name expands ("primal+trans": Primal last), a list is kept, a bad one is refused."""
    assert layer_kinds("primal+trans", 3) == ["softmax", "softmax", "primal"]
    assert layer_kinds(["softmax", "agf"], 2) == ["softmax", "agf"]
    said = "attention list ['softmax'] has 1 entries for 2 layers"
    _says(ValueError, said, lambda: layer_kinds(["softmax"], 2))
    said = "unknown attention 'performer'; choose from ['softmax', 'agf', 'primal', 'gfsa']"
    _says(ValueError, said, lambda: layer_kinds("performer", 2))


def test_model_config_defaults_are_the_lra_setting():
    """ModelConfig's defaults say "the LRA setting shared by the three papers": the same widths,
    depth and dropouts as train_lra.py's settings, and a classifier builds from them alone."""
    lra, cfg = train_lra.parse_config([]), ModelConfig(vocab_size=17)
    for name in ("d_model", "n_heads", "n_layers", "d_ff", "dropout"):
        assert getattr(cfg, name) == getattr(lra, name), name
    assert cfg.attn_dropout == lra.dropout, "attention dropout: train_lra.py's --dropout"
    block = Classifier(ModelConfig(vocab_size=17, attn_dropout=0.3)).blocks[0]
    assert (block.attn.dropout, block.drop.p) == (0.3, 0.1), "attn_dropout: softmax's only"
    model = Classifier(cfg)
    assert len(model.blocks) == 2 and model.blocks[0].attn.d_model == 64, "D 64, 2 layers"
    # the official LRA head: Linear(D, transformer_hidden_dim), the feed-forward's width too
    assert model.head[0].out_features == lra.d_ff == 128, "MLP head: 128 hidden units"
    assert model.head[-1].out_features == 2, "C = 2 (Text, Retrieval, Pathfinder)"
    total = sum(p.numel() for p in model.parameters())
    model.pos.requires_grad_(False)  # (max_len, D) = (1024, 64)
    assert count_parameters(model) == total - 1024 * 64, "count_parameters: trainable ones only"


def test_model_bad_inputs_raise_clear_errors():
    """Each bad Classifier input: an error naming the argument, what it expected and what it got."""
    torch.manual_seed(0)
    lra, uea = Classifier(_tiny("lra")), Classifier(_tiny("uea"))
    two = Classifier(_tiny("lra", two_tower=True))
    tokens, feats = torch.randint(1, 11, (2, 10)), torch.randn(2, 10, 5)
    ok, V, T = torch.ones(2, 10, dtype=torch.bool), ValueError, TypeError
    high, low = tokens.clone(), tokens - 5  # one id past the table; ids below 0
    high[1, 3] = 11
    found = [f"[{min(t.flatten().tolist())}, {max(t.flatten().tolist())}]" for t in (high, low)]
    ids, mask2 = "x: token ids must lie in [0, 11), found ", "mask2: expected bool of shape"
    mask_ = "mask: expected bool of shape (2, 10) on cpu, got torch."
    feats_ = "x: expected torch.float32 (the layer's dtype) of shape (B, N >= 1, 5), got torch."
    tokens_ = "x: expected integer token ids of shape (B, N >= 1), got torch."
    cases = [
        (lra, (tokens, ok.long()), T, mask_ + "int64 of shape (2, 10) on cpu"),
        (lra, (high, ok), V, ids + found[0]),
        (lra, (low, ok), V, ids + found[1]),
        (lra, (feats, ok), T, tokens_ + "float32 of shape (2, 10, 5)"),
        (lra, (tokens[None], ok), V, tokens_ + "int64 of shape (1, 2, 10)"),
        (lra, (tokens[:, :0], None), V, tokens_ + "int64 of shape (2, 0)"),
        (uea, (torch.randn(2, 10, 4), ok), V, feats_ + "float32 of shape (2, 10, 4)"),
        (uea, (feats[..., None], ok), V, feats_ + "float32 of shape (2, 10, 5, 1)"),
        (uea, (torch.randint(0, 3, (2, 10, 5)), ok), T, feats_ + "int64 of shape (2, 10, 5)"),
        (uea, (feats.double(), ok), T, feats_ + "float64 of shape (2, 10, 5)"),
        (lra, (torch.randint(1, 11, (2, 25)), None), V,
         "x: expected N <= max_len = 24 (positions), got shape (2, 25)"),
        (lra, (tokens, ~ok), V, "mask: every sequence needs a real token"),
        (lra, (tokens, ok & torch.tensor([[True], [False]])), V,
         "mask: every sequence needs a real token"),
        (two, (tokens, ok), V, "this model (two_tower=True) needs the second document x2"),
        (two, (tokens, ok, tokens, ok.float()), T, f"{mask2} (2, 10) on cpu, got torch.float32 "
         "of shape (2, 10) on cpu"),
        (two, (tokens, ok, tokens[:, :3], ok), V, f"{mask2} (2, 3) on cpu, got torch.bool of "
         "shape (2, 10) on cpu"),
        (two, (tokens, ok, tokens, ok.to("meta")), V, f"{mask2} (2, 10) on cpu, got torch.bool of "
         "shape (2, 10) on meta"),
        (lra, (tokens, ok, tokens, ok), V, "this model (two_tower=False) takes no x2"),
    ]  # fmt: skip
    for model, args, error, message in cases:
        _says(error, message, model, *args)
    refused = [
        ({"n_features": 3}, "set exactly one of vocab_size (tokens) or n_features (features)"),
        ({"vocab_size": 0}, "set exactly one of vocab_size (tokens) or n_features (features)"),
        ({"style": "vit"}, "style must be 'lra' or 'uea', got 'vit'"),
        ({"style": "uea", "two_tower": True},
         "two_tower needs style='lra' (the UEA head flattens one sequence)"),
    ]  # fmt: skip
    for kwargs, message in refused:
        _says(ValueError, message, Classifier, ModelConfig(**{"vocab_size": 5, **kwargs}))
    one = Classifier(ModelConfig(vocab_size=1, max_len=4, d_model=8, n_heads=2, d_ff=8))
    assert isinstance(one.embed, torch.nn.Embedding), "vocab_size 1 (padding alone): token ids"


def _classifier_by_hand(model, x, mask, x2=None, mask2=None):
    """Classifier.forward written out with F, attentions as black boxes, dropouts drawn in order."""
    cfg, D = model.cfg, model.cfg.d_model
    drop = lambda t: F.dropout(t, cfg.dropout, model.training)  # noqa: E731
    layer_norm = lambda t, n: F.layer_norm(t, (D,), n.weight, n.bias, n.eps)  # noqa: E731
    linear = lambda t, lin: F.linear(t, lin.weight, lin.bias)  # noqa: E731

    def tower(x, mask):
        h = F.embedding(x, model.embed.weight) if cfg.vocab_size else linear(x, model.embed)
        if cfg.style == "uea":
            h = h * math.sqrt(D)  # mvts: the input projection times √D
        h, aux = drop(h + model.pos[: x.shape[1]]), []
        for kind, block in zip(model.kinds, model.blocks, strict=True):
            fc1, fc2 = block.mlp[0], block.mlp[3]
            if cfg.style == "lra":  # pre-LN
                y, a = block.attn(layer_norm(h, block.norm1), mask)
                h = h + drop(y)
                h = h + drop(linear(drop(F.gelu(linear(layer_norm(h, block.norm2), fc1))), fc2))
            else:  # post-LN
                y, a = block.attn(h, mask)
                h = layer_norm(h + drop(y), block.norm1)
                h = layer_norm(h + drop(linear(drop(F.gelu(linear(h, fc1))), fc2)), block.norm2)
            if kind in ("agf", "primal"):
                aux.append(a)
        h = layer_norm(h, model.norm)
        m = mask[..., None].to(h.dtype)
        if cfg.style == "lra":  # mean over the real tokens
            z = (h * m).sum(1) / mask.sum(1, keepdim=True)
        else:  # GELU, padded steps zeroed, zero rows up to max_len, flatten
            z = torch.zeros(h.shape[0], cfg.max_len, D, dtype=h.dtype)
            z[:, : h.shape[1]] = drop(F.gelu(h)) * m
            z = z.reshape(h.shape[0], cfg.max_len * D)
        return z, (sum(aux) / len(aux) if aux else torch.zeros((), dtype=h.dtype))

    z, aux = tower(x, mask)
    if x2 is not None:  # two towers, one encoder: head on [a, b, a*b, a-b]
        z2, aux2 = tower(x2, mask2)
        z, aux = torch.cat([z, z2, z * z2, z - z2], dim=1), (aux + aux2) / 2
    if cfg.style == "lra":
        return linear(F.relu(linear(z, model.head[0])), model.head[2]), aux
    return linear(z, model.head), aux


@pytest.mark.parametrize(  # no "lra" / "uea" in the ids: filtering out train scripts keeps these
    "style, kinds, two_tower",
    [
        ("lra", ["agf", "softmax", "primal"], False),
        ("uea", ["gfsa", "primal", "agf"], False),
        ("lra", ["softmax", "gfsa", "primal"], True),
    ],
    ids=["pre-LN-masked-mean", "post-LN-flatten", "two-tower-retrieval"],
)
@pytest.mark.parametrize("dropout", [False, True], ids=["eval", "dropout"])
def test_model_classifier_equals_its_forward_written_out(style, kinds, two_tower, dropout):
    """Classifier == _classifier_by_hand (LRA, UEA, two towers): catches a wrong residual, LN,
    scale, pooling, head or aux average (over AGF/Primal layers only) that padding tests miss."""
    torch.manual_seed(0)
    cfg = _tiny(style, kinds, n_layers=3, two_tower=two_tower, attn_dropout=0.3)
    model = Classifier(cfg).double().train(dropout)
    with torch.no_grad():  # off the init: AGF g ≡ 1, GFSA wK = 0 and LN = (1, 0) hide terms
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x, mask = _inputs(cfg, N=20)
    args = (x, mask, x.flip(0), mask.flip(0)) if two_tower else (x, mask)
    with torch.no_grad():
        torch.manual_seed(1)
        logits, aux, hidden = model(*args, return_hidden=True)
        torch.manual_seed(1)
        want_logits, want_aux = _classifier_by_hand(model, *args)
    assert [type(b.attn) for b in model.blocks] == [ATTENTION[k] for k in kinds]
    assert logits.shape == (3, 3) and aux > 0
    assert torch.allclose(logits, want_logits, rtol=0, atol=1e-10)
    assert torch.allclose(aux, want_aux, rtol=0, atol=1e-10)
    for tower in hidden if two_tower else [hidden]:  # [embedding, block 1, ..., block L]
        assert len(tower) == 4 and all(h.shape == (3, 20, 16) for h in tower)


def test_model_tour_every_number_it_prints_is_recomputed():
    """`python model.py`: a line per attention (KINDS, in order) and style; aux from the forward
    written out (_classifier_by_hand), the parameters by formula; padding unread; SDPA."""
    run = _cli("model.py")
    assert run.returncode == 0, run.stderr[-2000:]
    row = r"(?P<kind>\S+) +(?P<style>lra|uea)  aux (?P<aux>\d+\.\d{4})  "
    row += r"params (?P<params>\d{1,3}(?:,\d{3})*)  padding unread: True"
    last = "SoftmaxAttention: Ā V written out == SDPA: True"
    *rows, _ = _printed(run.stdout.splitlines(), [row] * 2 * len(KINDS) + [last])
    assert [(r["kind"], r["style"]) for r in rows] == list(itertools.product(KINDS, ("lra", "uea")))
    D, H, L, d_ff, hidden, C, N = 64, 2, 2, 128, 128, 5, 64  # ModelConfig's, n_classes, max_len
    attention = dict(_PARAMETERS, primal=lambda D, H: _PARAMETERS["primal"](D, H, m=min(N, 200)))
    block = 4 * D + 2 * D * d_ff + d_ff + D  # two LayerNorms, the MLP
    torch.manual_seed(0)  # the tour's draws: the inputs, then each model
    mask = torch.arange(N) < torch.tensor([[N], [40]])
    inputs = {"lra": torch.randint(1, 20, (2, N)), "uea": torch.randn(2, N, 12)}
    for row in rows:
        kind, style = row["kind"], row["style"]
        sizes = dict(vocab_size=20) if style == "lra" else dict(n_features=12)
        model = Classifier(ModelConfig(C, N, style=style, attention=kind, **sizes)).eval()
        with torch.no_grad():
            aux = _classifier_by_hand(model, inputs[style], mask)[1]
        assert _rounded(row["aux"], aux.item()), (kind, style, aux)
        layers = ["softmax"] * (L - 1) + ["primal"] if kind == "primal+trans" else [kind] * L
        embed = 20 * D if style == "lra" else 12 * D + D  # token table, or Linear(F, D)
        head = D * hidden + hidden + hidden * C + C if style == "lra" else N * D * C + C
        count = embed + N * D + sum(block + attention[k](D, H) for k in layers) + 2 * D + head
        assert _rounded(row["params"], count), (kind, style, count)


def test_model_layerwise_cosine_similarity():
    """No mask: every token is real; identical tokens give 1, orthogonal ones 0 (with a mask, the
    mean over pairs per layer: the diagnose.py cosine test)."""
    same = torch.randn(1, 1, 8).expand(2, 5, 8)
    ortho = torch.eye(6, dtype=torch.float64)[None]  # 6 orthonormal tokens
    assert torch.allclose(layerwise_cosine_similarity([same]), torch.tensor([1.0]), atol=1e-6)
    assert layerwise_cosine_similarity([ortho]).abs().item() < 1e-12


def _inductor_missing() -> str:
    """Why inductor cannot compile here ("" if it can): on the CPU it needs a C++ compiler."""
    try:
        from torch._inductor import cpp_builder

        cpp_builder.get_cpp_compiler()
    except Exception as error:  # any failure means: no usable compiler
        return f"torch.compile (inductor) needs a C++ compiler on the CPU: {error}"
    return ""


# The variants that KINDS do not build, one layer each: compiled together as "every-variant".
COMPILE_VARIANTS = [variant for name, variant in VARIANTS.items() if name not in ATTENTION]


def _compile_case(kind: str):
    """A tiny LRA classifier (AGF θ, GFSA wK off the init), two batches of other padding."""
    torch.manual_seed(0)
    variants = COMPILE_VARIANTS if kind == "every-variant" else []
    attention, n_layers = ([k for k, _ in variants], len(variants)) if variants else (kind, 2)
    cfg = _tiny("lra", attention, max_len=12, dropout=0.0, attn_dropout=0.0, n_layers=n_layers)
    model = Classifier(cfg)
    for block, (k, kwargs) in zip(model.blocks[: len(variants)], variants, strict=True):
        block.attn = build_attention(k, 16, 2, **kwargs)
    with torch.no_grad():
        for block in model.blocks:
            if getattr(block.attn, "poly_filter", None) is not None:
                block.attn.poly_filter.theta.normal_()
            if isinstance(block.attn, GFSAttention):
                block.attn.wK.normal_()
    batches = []
    for lengths in ([12, 7, 3], [5, 12, 9]):
        tokens = torch.randint(0, 11, (3, 12))
        mask = torch.arange(12) < torch.tensor(lengths)[:, None]
        batches.append((tokens, mask, torch.randint(0, 3, (3,))))
    return model, batches


# primal+trans: no kind of its own here, its layers are softmax and Primal layers
@pytest.mark.parametrize("kind", ["softmax", "agf", "primal", "gfsa", "every-variant"], ids=_id)
def test_model_compiled_equals_eager(kind):
    """torch.compile(fullgraph=True) == eager: loss and gradients over two SGD steps (float32,
    1e-5), no recompile on the second batch, bad ids refused. ~10-30 s a kind on 2 CPU cores."""
    backend = "aot_eager" if kind == "every-variant" else "inductor"  # aot_eager writes no C++
    missing = _inductor_missing() if backend == "inductor" else ""
    if missing:
        pytest.skip(missing)
    torch._dynamo.reset()
    eager, batches = _compile_case(kind)
    model = _compile_case(kind)[0]
    model.load_state_dict(eager.state_dict())
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (eager, model)]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for step, (tokens, mask, labels) in enumerate(batches):
            losses = []
            for net, opt in zip((eager, compiled), optimizers, strict=True):
                opt.zero_grad()
                logits, aux = net(tokens, mask)
                loss = F.cross_entropy(logits, labels) + aux
                loss.backward()
                losses.append(loss.detach())
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
            for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
                message = f"step {step}: gradient of {name}"
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-5, msg=message)
            for opt in optimizers:
                opt.step()
        bad = batches[0][0].clone().fill_(11)  # vocab_size = 11: one id past the table
        with pytest.raises(RuntimeError, match=r"x: token ids must lie in \[0, 11\)"):
            compiled(bad, batches[0][1])


# Each constructor and reader at its smallest legal input and at the first illegal one
_SMALLEST = dict(agf=dict(order=0), gfsa=dict(order=2), primal=dict(rank=1, rank_multi=1))


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("kind", ATTENTION)
def test_edge_smallest_legal_input_one_token_one_sample_lowest_order_and_rank(kind, heads):
    """B = N = 1 at the lowest order or rank, one head too: as the one real token of a padded
    batch; Ā = 1, so softmax gives W_o(V), GFSA W_o((w0 + w1 + wK) V); AGF its dense form;
    Primal m = 1."""
    torch.manual_seed(0)
    layer = ATTENTION[kind](8, heads, **_SMALLEST.get(kind, {})).double().eval()
    if kind == "gfsa":
        torch.nn.init.normal_(layer.wK)  # learned from 0: a value that shows
    x, mask = torch.randn(2, 3, 8, dtype=F64), torch.tensor([[1, 0, 0], [1, 1, 1]]).bool()
    y = layer(x[:1, :1])[0]  # (1, 1, 8)
    assert torch.isfinite(y).all(), "one token: finite"
    assert torch.allclose(y, layer(x, mask)[0][:1, :1], rtol=0, atol=1e-12), "one real token"
    if kind in ("softmax", "gfsa"):
        v = layer.W_qkv(x[:1, :1]).view(1, 1, 3, heads, 8 // heads)[:, :, 2]  # (B, N, H, d)
        gain = 1.0 if kind == "softmax" else (layer.w0 + layer.w1 + layer.wK)[:, None]
        want = layer.W_o((gain * v).reshape(1, 1, 8))
        assert torch.allclose(y, want, rtol=0, atol=1e-12), "N = 1: Ā = 1 in closed form"
    if kind == "agf":
        want = agf_dense_reference(layer, x[:1, :1])[0]
        assert torch.allclose(y, want, rtol=0, atol=1e-12), "N = 1: the dense form"
    if kind == "primal":  # m = 1: the first real token, with any padding before it
        tokens = sample_real_tokens(x, mask.flip(1), 1)  # real: [2] and [0, 1, 2]
        assert torch.equal(tokens, torch.stack([x[0, 2:3], x[1, 0:1]])), "m = 1: first real"


def test_edge_first_illegal_sizes_are_a_value_error_naming_the_argument():
    """One past each smallest legal size (order -1, rank 0, no heads, H not dividing D, zero
    model sizes; the attentions' orders: BAD_ARGUMENTS): a ValueError naming argument and value."""
    illegal = [
        (lambda: PolynomialFilter(-1), "order K=-1 must be >= 0"),
        (lambda: PrimalAttention(8, 2, rank=0), "rank=0 must be >= 1"),
        (lambda: PrimalAttention(8, 2, rank_multi=0), "rank_multi=0 must be >= 1"),
        (lambda: PrimalAttention(8, 2, max_len=0), "max_len=0 must be >= 1"),
    ]
    for layer in ATTENTION.values():  # n_heads = 3 at D = 16: BAD_ARGUMENTS' test
        illegal.append((functools.partial(layer, 8, 0), "d_model=8 is not divisible by n_heads=0"))
    for name in ("n_classes", "max_len", "d_model", "n_layers", "d_ff"):
        config = ModelConfig(vocab_size=5, **{name: 0})
        illegal.append((functools.partial(Classifier, config), f"{name}=0 must be >= 1"))
    for build, said in illegal:
        _says(ValueError, said, build)


@pytest.mark.parametrize("basis", BASES)
def test_edge_polynomial_filter_of_order_zero_is_its_constant(basis):
    """K = 0 in every basis: no recurrence term, one basis row; g(s) = θ̃_0, 1 when frozen,
    tanh(θ_0) when learned, by either sum; no other coefficient."""
    s = torch.rand(7)
    for K in (0, 1, 2):
        assert len(recurrence(basis, K)) == K, f"{basis}: K terms of the recurrence"
        assert polynomial_basis(s, K, basis).shape[0] == K + 1, f"{basis}: P_0 .. P_K"
    for lean in (True, False):
        frozen = PolynomialFilter(0, basis, lean=lean)
        assert torch.equal(frozen(s), torch.ones(7)), "K = 0, frozen: g = 1"
        free = PolynomialFilter(0, basis, fix_theta0=False, lean=lean)
        with torch.no_grad():
            free.theta0.fill_(0.3)
        assert torch.allclose(free(s), torch.full((7,), math.tanh(0.3))), "K = 0: g = tanh(θ_0)"
        assert free.coefficients().shape == (1,), "K = 0: one coefficient"


def test_edge_cosine_similarity_needs_two_real_tokens():
    """Two real tokens: the cosine of the pair; one real token: a ValueError, not NaN."""
    h, mask = torch.randn(1, 4, 8, dtype=F64), torch.tensor([[False, True, False, True]])
    want = F.cosine_similarity(h[0, 1], h[0, 3], dim=0)
    got = layerwise_cosine_similarity([h], mask)
    assert torch.allclose(got, want[None], rtol=0, atol=1e-12), "two real tokens: their cosine"
    said = "cosine similarity needs at least 2 real tokens per sequence"
    _says(ValueError, said, layerwise_cosine_similarity, [h], torch.tensor([[0, 1, 0, 0]]).bool())


def test_edge_agf_bf16_input_under_autocast_filters_in_float32():
    """A bf16 x under autocast: the projections in bf16, as for a float32 x (autocast casts it),
    the softmaxes, sigmoid and filter in float32: the factors and output of x.float()."""
    torch.manual_seed(0)
    layer, x = AGFAttention(8, 2), torch.randn(2, 5, 8).bfloat16()
    with torch.autocast("cpu", torch.bfloat16):
        half, full = layer.factors(x), layer.factors(x.float())
        y_half, y_full = layer(x)[0], layer(x.float())[0]
    for name, a, b in zip(("U", "g(Σ)", "V", "values"), half, full, strict=True):
        assert a.dtype == torch.float32 and torch.equal(a, b), f"bf16 x: {name} as for float32"
    assert y_half.dtype == torch.bfloat16 and torch.equal(y_half.float(), y_full), "output"


# ----------------------------------------------------------------------------------------------
# lra_data.py, lra_readers.py: the LRA data
# ----------------------------------------------------------------------------------------------


_LRA_TINY_LISTOPS = dict(folder="listops-tiny", train=48, val=12, test=12)
_LRA_TINY_LISTOPS |= dict(min_length=5, max_length=60, max_depth=5, max_args=10)


def _write(path: pathlib.Path, content) -> pathlib.Path:
    """Write text or bytes to path, creating its folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def _lra_stack_evaluate(expression: str) -> int:
    """An independent ListOps evaluator: a stack machine over the tokens, parentheses ignored."""
    apply = {"[MIN": min, "[MAX": max, "[SM": lambda xs: sum(xs) % 10}
    apply["[MED"] = lambda xs: int(np.median(xs))  # the official generator's formula
    stack = [[]]  # each entry: [operator, arguments...]; the bottom one collects the result
    for token in expression.split():
        if token.startswith("["):
            stack.append([token])
        elif token == "]":
            op, *args = stack.pop()
            stack[-1].append(apply[op](args))
        elif token not in "()":
            stack[-1].append(int(token))
    assert len(stack) == 1 and len(stack[0]) == 1, expression
    return stack[0][0]


def _lra_check_batch(split: lra_data.Split, lengths, lengths2=None) -> None:
    """split.batch of every example (in reverse order) against the lengths known by the test:
    mask (and mask2) = position < length, int64 ids equal to the split's, 0 in the padding."""
    idx = np.arange(len(split.y))[::-1]
    batch = split.batch(idx)
    for x, mask, known in (("x", "mask", lengths), ("x2", "mask2", lengths2)):
        if known is None:
            assert x not in batch and mask not in batch
            continue
        want = np.arange(split.x.shape[1]) < np.asarray(known)[idx, None]
        assert batch[mask].dtype == np.bool_ and np.array_equal(batch[mask], want), mask
        assert batch[x].dtype == np.int64 and np.array_equal(batch[x], getattr(split, x)[idx])
        assert (batch[x][~want] == 0).all() and np.array_equal(batch[mask].sum(1), want.sum(1))
    assert np.array_equal(batch["y"], split.y[idx])


def test_listops_generator_labels_bounds_seeds_and_pinned_draws():
    """Labels == an independent stack-machine evaluation; lengths strictly inside the bounds, no
    duplicates, seeded; pinned digests catch a change of the draw or of the dedup order."""
    bounds = dict(min_length=500, max_length=2000, progress=False)
    a = listops.generate(40, seed=0, **bounds)
    assert all(500 < len(listops.tokenize(text)) < 2000 for text, _ in a)
    assert len({t for t, _ in a}) == len(a) and a != listops.generate(40, 1, **bounds)
    # depth 2: one operator over 2..10 leaves, lengths 4..12, so both bounds are hit often
    b = listops.generate(60, 0, min_length=4, max_length=8, max_depth=2, progress=False)
    assert {len(listops.tokenize(t)) for t, _ in b} == {5, 6, 7}
    with pytest.raises(ValueError, match="no new tree"):  # depth 2: at most 12 tokens
        listops.generate(5, 0, min_length=20, max_length=40, max_depth=2, progress=False)
    digests = ["6b936ced0c6deb3274eebb4bdb9fca95995cc1085193a2874c2b7f85e1b1ef85"]  # seed 0
    digests += ["1cd6b73ad95d85761a7fef4ecc4e2edd550714c11a7d8ab2ad16e46d60c97afc"]  # seed 1
    for seed, digest in enumerate(digests):
        pairs = listops.generate(200, seed, 10, 300, max_depth=6, progress=False)
        text = "\n".join(f"{e}\t{y}" for e, y in pairs)
        assert hashlib.sha256(text.encode()).hexdigest() == digest, seed
        assert all(y == _lra_stack_evaluate(e) for e, y in pairs)
        ops = set(listops.OPERATORS)  # every operator was exercised
        assert {op for e, _ in pairs for op in ops if op in e} == ops
    # shards = 3: the seeded generators "5/0", "5/1", "5/2" one after the other, joined unique
    pairs = listops.generate(60, 5, 5, 60, 4, 4, progress=False, shards=3)
    shards = [listops.generate(21, f"5/{s}", 5, 60, 4, 4, progress=False) for s in "012"]
    joined = dict(itertools.chain(*shards))
    assert pairs == list(joined.items())[:60] and len({text for text, _ in pairs}) == 60
    few = r"ListOps: 3 shards gave \d+ distinct trees, not 1000"  # 400 of 4 tokens: 4 x 10 x 10
    with pytest.raises(ValueError, match=few):
        listops.generate(1000, 5, 3, 5, 2, 10, progress=False, shards=3)
    assert listops.OFFICIAL == dict(  # lra_benchmarks/data/listops.py's flag defaults
        train=96000, val=2000, test=2000, min_length=500, max_length=2000, max_depth=10, max_args=10
    )


def test_listops_trees_and_the_readers_tokens():
    """']' -> X, parentheses dropped, the fixed 15-token order, 0 pad, 16 OOV; MED as official."""
    assert listops.TOKENS == (*"0123456789", "[MIN", "[MAX", "[MED", "[SM", "X")
    assert listops.to_string(((("[MAX", 2), 9), "]")) == "( ( ( [MAX 2 ) 9 ) ] )"
    assert listops.tokenize("( ( ( [MAX 2 ) 9 ) ] )") == [12, 3, 10, 15]
    # MED of an even count truncates the mean of the two middle values (official np.median)
    tree = ((((("[MED", 1), 4), 2), 9), "]")  # [MED 1 4 2 9 ] -> median 3.0 -> 3
    assert listops.to_value(tree) == 3 == _lra_stack_evaluate(listops.to_string(tree))
    assert listops.to_value(((("[MED", 1), 2), "]")) == 1  # (1 + 2) / 2 = 1.5 -> 1
    assert listops.tokenize("[FIRST 7 ]") == [16, 8, 15]  # unknown token -> OOV
    assert lra_readers.VOCAB["listops"] == 17 and lra_readers.N_CLASSES["listops"] == 10


def test_listops_runs_alone_writes_a_small_set_and_shows_three_examples(tmp_path):
    """`python listops.py --size 100 --out D`, copied alone (and tqdm): the release's files, the
    sizes said, three train examples shown as the model reads them, each with its true value;
    Ctrl-C while it writes: one line, exit 130, no file left."""
    shutil.copy(HERE / "listops.py", tmp_path)
    run = _cli("listops.py", "--size", "100", "--out", "D", cwd=tmp_path)
    assert run.returncode == 0 and run.stderr == "", run.stderr
    first, *shown = run.stdout.splitlines()
    assert first == "wrote D/basic_{train,val,test}.tsv: 100, 2, 2 examples" and len(shown) == 3
    with open(tmp_path / "D" / "basic_train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["Source", "Target"] and len(rows) == 101
    for line, (expression, label) in zip(shown, rows[1:4], strict=True):
        words = expression.replace("(", "").replace(")", "").split()
        start, tokens, value = re.fullmatch(
            r"(.+?)(?: \.\.\.)?   \((\d+) tokens\)   -> (\d)", line
        ).groups()
        assert words[: len(start.split())] == start.split() and int(tokens) == len(words)
        assert int(value) == int(label) == _lra_stack_evaluate(expression), line  # evaluated anew
    settings = json.loads((tmp_path / "D" / "generator.json").read_text())
    assert settings == dict(
        seed=0, train=100, val=2, test=2, **dict(list(listops.OFFICIAL.items())[3:])
    )


def test_lra_data_listops_files_release_format_cache_and_mismatch(tmp_path):
    """Generated tsv = header Source/Target via csv, marker json, reused, mismatch is an error."""
    data, notes = lra_data.load_task("listops", tmp_path, 30, seed=5, listops=_LRA_TINY_LISTOPS)
    folder, train = tmp_path / "listops-tiny", tmp_path / "listops-tiny" / "basic_train.tsv"
    assert train.read_bytes().startswith(b"Source\tTarget\r\n")
    with open(train, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert json.loads((folder / "generator.json").read_text()) == dict(
        seed=5, train=48, val=12, test=12, min_length=5, max_length=60, max_depth=5, max_args=10
    )
    assert set(listops.KEYS[1:]) <= set(lra_data.LISTOPS_PAPER)  # one set of names
    names = ["basic_test.tsv", "basic_train.tsv", "basic_val.tsv", "generator.json"]
    assert sorted(p.name for p in folder.iterdir()) == names
    # the three splits are consecutive slices of one generated stream
    pairs = listops.generate(72, 5, 5, 60, 5, 10, progress=False)
    assert rows[1:] == [[e, str(y)] for e, y in pairs[:48]]
    assert data["test"].y.tolist() == [y for _, y in pairs[60:]]
    split = data["train"]
    assert split.x.shape == (48, 30) and split.x.dtype == np.int16 and notes[1:] == []
    ids = [listops.tokenize(e)[:30] for e, _ in pairs]
    cut = sum(len(listops.tokenize(e)) > 30 for e, _ in pairs)  # said in the first note
    said = f"{lra_data.DONE['listops']}; {cut} of 72 inputs cut at max_len 30: their ends dropped"
    assert notes[0].endswith(f"(seed 5), written to {folder}; {said}")
    assert all(row[: len(i)].tolist() == i for row, i in zip(split.x, ids, strict=False))
    _lra_check_batch(split, [len(i) for i in ids[:48]])
    _lra_check_batch(data["val"], [len(i) for i in ids[48:60]])
    stamp = train.stat().st_mtime_ns
    again, _ = lra_data.load_task("listops", tmp_path, 30, seed=5, listops=_LRA_TINY_LISTOPS)
    assert train.stat().st_mtime_ns == stamp and np.array_equal(again["val"].x, data["val"].x)
    with pytest.raises(lra_data.DataError, match=r"generated with .*another ListOps folder"):
        lra_data.load_task("listops", tmp_path, 30, seed=6, listops=_LRA_TINY_LISTOPS)
    (folder / "generator.json").unlink()  # tsv files without it: the release, read as it is
    release, _ = lra_data.load_task("listops", tmp_path, 30, seed=6, listops=_LRA_TINY_LISTOPS)
    assert np.array_equal(release["train"].x, data["train"].x)
    (folder / "basic_val.tsv").unlink()
    with pytest.raises(lra_data.DataError, match=r"listops-tiny holds 2 of the 3 files basic_"):
        lra_data.load_task("listops", tmp_path, 30, seed=5, listops=_LRA_TINY_LISTOPS)
    # eight runs generating into one folder at once (quick runs side by side): each ends well,
    # and the files are whole, as one writer's; no *.tmp is left
    settings, w = dict(_LRA_TINY_LISTOPS, seed=5), tmp_path / "w"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: listops.write(w, settings, False), range(8)))
    written = {p.name: p.read_bytes() for p in w.iterdir()}
    assert sorted(written) == names and written["basic_train.tsv"] == train.read_bytes()
    # splits of other sizes (val 5, test 9): still consecutive slices of one stream
    listops.write(tmp_path / "v", dict(settings, val=5, test=9), False)
    for split, start, stop in (("train", 0, 48), ("val", 48, 53), ("test", 53, 62)):
        with open(tmp_path / "v" / f"basic_{split}.tsv", newline="") as f:
            read = list(csv.reader(f, delimiter="\t"))[1:]
        assert read == [[e, str(y)] for e, y in pairs[start:stop]], split


def _lra_imdb(root: pathlib.Path, texts: dict) -> pathlib.Path:
    """<root>/aclImdb/{train,test}/{neg,pos}/<i>_7.txt from {"neg": [...], "pos": [...]}."""
    for split, (polarity, docs) in itertools.product(("train", "test"), texts.items()):
        for i, doc in enumerate(docs):
            _write(root / "aclImdb" / split / polarity / f"{i}_7.txt", doc)
    return root / "aclImdb"


def test_lra_data_imdb_and_aan_readers(tmp_path):
    """Bytes + 1. aclImdb/{train,test}/{neg,pos}/*.txt: the bytes, stripped, never decoded (tfds);
    val = test. AAN tsv: label id1 id2 text1 text2, each text cut to 10000 bytes, then max_len."""
    neg = ["  bad<br />film \n", "\r\nfine\r\nok\r\n", "\x1cmeh\x1c", b"caf\xe9 "]
    _lra_imdb(tmp_path, {"neg": neg, "pos": ["très bien\n", "\u00a0nice\u3000\n"]})
    with mock.patch.object(lra_data, "_incomplete", return_value=None):  # folders of 4 and 2
        splits, notes = lra_data.load_task("text", tmp_path, 12)
    said = "; bytes + 1; val is test; 2 of 12 inputs cut at max_len 12: their ends dropped"
    assert splits["val"] is splits["test"] and notes[1:] == [] and notes[0].endswith(said)
    train = splits["train"]
    assert train.y.tolist() == [0, 0, 0, 0, 1, 1] and train.x.dtype == np.int16
    expected = [b"bad<br />fil", b"fine\r\nok", b"\x1cmeh\x1c", b"caf\xe9", "très bien".encode()]
    expected += [b"\xc2\xa0nice\xe3\x80\x80"]  # str.strip() would drop U+00A0, U+3000, \x1c
    rows = (train.x - 1).astype(np.uint8)  # the bytes again
    assert [row[:n].tobytes() for row, n in zip(rows, train.lengths, strict=True)] == expected
    _lra_check_batch(train, [len(w) for w in expected])
    pairs = b"1.0\tA1\tB1\tabc\tdefgh\n\n0\tA2\tB2\t" + b"x" * 20 + b"\tz\n"  # blank line: skipped
    split, notes = lra_readers.read_aan_tsv(_write(tmp_path / "aan.tsv", pairs), max_len=8)
    assert split.y.tolist() == [1, 0] and notes == []
    assert (split.x[0, :3] - 1).tolist() == list(b"abc") and split.x[1, 7] == ord("x") + 1
    assert (split.x2[0, :5] - 1).tolist() == list(b"defgh") and split.x2[1, 0] == ord("z") + 1
    _lra_check_batch(split, [3, 8], [5, 1])
    long = b"1\ta\tb\t" + b"y" * 12000 + b"\tq\n1\ta\tb\tq\t" + b"y" * 12000  # either text
    long = lra_readers.read_aan_tsv(_write(tmp_path / "long.tsv", long), 20000)[0]
    assert long.lengths.tolist() == [10000, 1] and long.lengths2.tolist() == [1, 10000]
    for name, label in (("train", 1), ("eval", 0), ("test", 1)):
        _write(tmp_path / "tsv_data" / f"new_aan_pairs.{name}.tsv", f"{label}\ta\tb\t{name}\tx\n")
    data, notes = lra_data.load_task("retrieval", tmp_path, 4)  # "train" cut: 1 of 3 x 2 texts
    assert notes[0].endswith("; 1 of 6 inputs cut at max_len 4: their ends dropped"), notes[0]
    assert (data["val"].x[0, :4] - 1).tolist() == list(b"eval")
    assert data["val"].y.tolist() == [0] and data["test"].y.tolist() == [1]


def _lra_cifar(folder: pathlib.Path) -> dict:
    """cifar-10-batches-py with 5 images per batch, image 0 black -> {file name: data (5, 3072)}."""
    rng, batches = np.random.default_rng(0), {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = data = rng.integers(0, 256, (5, 3072), dtype=np.uint8)
        data[0] = 0  # a black image: value 0
        labels = [(i + len(batches)) % 10 for i in range(5)]  # the real files: bytes keys
        _write(folder / name, pickle.dumps({b"data": data, b"labels": labels, b"batch_label": b""}))
    return batches


def _lra_write_png(path: pathlib.Path, image: np.ndarray, color_type=0, filters=(0, 1, 2, 3, 4)):
    """An independent PNG encoder; row r uses filters[r % len(filters)] (PNG spec §9, 0 to 4)."""

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
            predicted = [0, a, b, (a + b) // 2, paeth(a, b, c)][kind % 5]  # 5: a bad type
            raw.append((value - predicted) % 256)
        above = row

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", image.shape[1], image.shape[0], 8, color_type, 0, 0, 0)
    compressed = zlib.compress(bytes(raw))
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"tEXt", b"Comment\x00ignored")
    # the image data split over two chunks, as allowed
    png += chunk(b"IDAT", compressed[:7]) + chunk(b"IDAT", compressed[7:]) + chunk(b"IEND", b"")
    return _write(path, png)


def _lra_pathfinder(folder: pathlib.Path, n: int, side: int = 4, images=None) -> dict:
    """A release folder: image i in imgs/<i % 11>, listed in metadata/<i % 11>.npy, an empty PNG in
    1.npy, 2.npy unended -> {TFDS key: (image or None, label)}; images: {path: image or None}."""
    rng, listed, keys, images = np.random.default_rng(2), {}, {}, {} if images is None else images
    images[str(folder / "imgs" / "1" / "sample_empty.png")] = None
    for i in range(n):
        k, label = i % 11, int(rng.integers(2))
        image = rng.integers(0, 256, (side, side), dtype=np.uint8)
        images[str(_lra_write_png(folder / "imgs" / str(k) / f"sample_{i}.png", image))] = image
        listed.setdefault(k, []).append((f"imgs/{k} sample_{i}.png {i} {label} 1.0 14 4", image))
    _write(folder / "imgs" / "1" / "sample_empty.png", b"")  # counted, then dropped
    listed[1].append(("imgs/1 sample_empty.png 99 1 1.0 14 4\n", None))
    for k, entries in listed.items():
        listing = "\n".join(e[0] for e in entries)
        if k != 2:
            listing += "\n"
        _write(folder / "metadata" / f"{k}.npy", listing)
        counted = entries[:-1] if k == 2 else entries
        for line, (text, image) in enumerate(counted, start=1):
            f0, f1, _, label = text.split(" ")[:4]
            keys[f"{f0}_{f1}_{line}"] = (image, int(label))
    return keys


def test_lra_data_image_readers_png_pathfinder_and_cifar(tmp_path):
    """Our PNG encoder's images, each filter type, decoded; Pathfinder and CIFAR: the official
    splits, TFDS's MD5 order cut at round(p n / 100) (by hand here), TF's grey levels."""
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (10, 7), dtype=np.uint8)
    image[3] = 255  # large values make the modulo-256 wrap-around matter
    for filters in [(0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)]:  # each alone, then mixed
        decoded = lra_readers.read_png_gray(_lra_write_png(tmp_path / "a.png", image, 0, filters))
        assert decoded.dtype == np.uint8 and np.array_equal(decoded, image), filters
    # Paeth ties between different neighbours (e.g. a=0, b=3, c=2 or a=0, b=3, c=1) need few
    # distinct values; the PNG specification's tie order a, b, c then matters
    ties = rng.integers(0, 6, (16, 16), dtype=np.uint8)
    path = _lra_write_png(tmp_path / "ties.png", ties, filters=(4,))
    assert np.array_equal(lra_readers.read_png_gray(path), ties)
    folder = tmp_path / "pathfinder32" / "curv_contour_length_14"
    examples = _lra_pathfinder(folder, 22)  # 22 lines count: cut at round(17.6), round(19.8)
    splits, notes = lra_data.load_task("pathfinder", tmp_path, 16)
    empty = folder / "imgs" / "1" / "sample_empty.png"  # counted in the cuts, then skipped
    skipped = f"skipped 1 empty PNG file(s) (the first: {empty}), as the official pipeline does"
    newline = f"{folder}/metadata/2.npy:2: no newline at the end: left out, as officially"
    assert notes[1:] == [newline, f"{folder}: {skipped}"] and "the hard " in notes[0]
    for split in splits.values():  # in TFDS order, cut: the readers' fuzzer reads it by hand
        assert split.x.dtype == np.int16, "Pathfinder pixels: int16"
        _lra_check_batch(split, [16] * len(split.y))
    assert len(examples) == 22 and sum(len(split.y) for split in splits.values()) == 21
    with pytest.raises(lra_data.DataError, match="a Pathfinder folder is one of"):
        lra_readers.read_pathfinder(folder.rename(folder.parent / "curv_14"), 16)  # not a split
    batches = _lra_cifar(tmp_path / "cifar-10-batches-py")
    images = np.concatenate([batches[f"data_batch_{i}"] for i in range(1, 6)])  # (25, 3072)
    labels = [(i + b) % 10 for b in range(1, 6) for i in range(5)]  # as _lra_cifar numbers them

    def tfds(split: str, n: int) -> list:  # TFDS's order of keys "0".."n-1", by hand
        return sorted(range(n), key=lambda i: hashlib.md5(f"{split}{i}".encode()).hexdigest())

    splits, notes = lra_data.load_task("image", tmp_path, 1024)
    assert [len(splits[s].y) for s in ("train", "val", "test")] == [22, 3, 5] and len(notes) == 1
    gray = lra_readers.rgb_to_gray  # checked on every colour by the next test
    for name, order in (("train", tfds("train", 25)[:22]), ("val", tfds("train", 25)[22:])):
        assert np.array_equal(splits[name].x, gray(images[order].reshape(-1, 3, 1024)))  # 22.5: 22
        assert splits[name].y.tolist() == [labels[i] for i in order]
    test, order = splits["test"], tfds("test", 5)
    assert np.array_equal(test.x, gray(batches["test_batch"][order].reshape(5, 3, 1024)))
    assert test.y.tolist() == [[6, 7, 8, 9, 0][i] for i in order]
    assert (test.x[order.index(0)] == 0).all()  # the black image
    for split in splits.values():  # black: 1024 real tokens
        _lra_check_batch(split, [1024] * len(split.y))
    parts = lra_readers.tfds_split("train", [str(i) for i in range(15)], (10, 90))  # 1.5, 13.5
    assert [len(part) for part in parts] == [2, 12, 1], "rounded, not truncated"


def test_lra_data_gray_levels_of_all_colours_as_tf():
    """rgb_to_gray on all 2^24 colours == tf.image.rgb_to_grayscale's float32 steps written out;
    RGB (0, 122, 186) is 93 as in TF, not float64's 92 (lower on 237 colours)."""
    colour = np.arange(1 << 24, dtype=np.int64)
    r, g, b = colour >> 16, (colour >> 8) & 255, colour & 255
    f32, gray = np.float32, lra_readers.rgb_to_gray(np.stack([r, g, b]).astype(np.uint8))
    red, green, blue = (c.astype(f32) * f32(1 / 255) for c in (r, g, b))  # convert_image_dtype
    step = (red * f32(0.2989) + green * f32(0.5870)) + blue * f32(0.1140)  # the weighted sum
    assert gray.dtype == np.int16 and np.array_equal(gray, np.trunc(step * f32(255.5)))
    assert gray[122 * 256 + 186] == 93
    float64 = ((0.2989 * r + 0.5870 * g + 0.1140 * b) / 255 * 255.5).astype(np.int64)
    assert np.unique(gray - float64, return_counts=True)[1].tolist() == [2**24 - 237, 237]


def _lra_pickles(root: pathlib.Path, stem: str, items: list) -> None:
    """<root>/<stem>.{train,dev,test}.pickle, each the list items."""
    for split in ("train", "dev", "test"):
        _write(root / f"{stem}.{split}.pickle", pickle.dumps(items))


def test_lra_data_pytorch_lra_pickles(tmp_path):
    """<task>.{train,dev,test}.pickle lists of dicts, rows of any length: token tasks' real
    tokens end at the last non-0 id; for images every pixel of the row is real."""
    _lra_pickles(tmp_path, "listops", _ITEMS)  # their ids as read: the readers' fuzzer
    pixels = [{"input_ids_0": np.r_[np.zeros(4), np.arange(12)], "label": 1}] * 2
    pixels.append({"input_ids_0": [0, 9, 0], "label": 0})  # a short row: its padding is no pixel
    _lra_pickles(tmp_path, "lra-image", pixels)  # Skyformer naming
    _lra_pickles(tmp_path, "pathfinder32-curv_contour_length_14", pixels[::-1])  # "/" -> "-"
    pairs = [{"input_ids_0": np.r_[5, 6, np.zeros(6)], "input_ids_1": [7, 0, 3, 0], "label": 1}]
    _lra_pickles(tmp_path, "retrieval", pairs * 2)
    data, notes = lra_data.load_task("listops", tmp_path, 10)
    assert data["train"].lengths.tolist() == [4, 4, 4] and notes[0].endswith("; as read")
    assert data["train"].x.shape == (3, 10) and data["test"].y.tolist() == [0, 1, 2]
    _lra_check_batch(data["val"], [4, 4, 4])
    image, _ = lra_data.load_task("image", tmp_path, 16)
    assert image["val"].x[0, :5].tolist() == [0] * 5 and image["val"].y.tolist() == [1, 1, 0]
    _lra_check_batch(image["val"], [16, 16, 3])
    _lra_check_batch(lra_data.load_task("pathfinder", tmp_path, 16)[0]["test"], [3, 16, 16])
    pair, _ = lra_data.load_task("retrieval", tmp_path, 8)
    assert pair["val"].x2[0, :3].tolist() == [7, 0, 3]
    square, _ = _lra_read("pickle:image", [(np.arange(16).reshape(4, 4), 1)], tmp_path)  # (h, w)
    assert square.x[0].tolist() == list(range(8)), "an (h, w) image is read row by row"
    _lra_check_batch(pair["val"], [2, 2], [3, 3])
    rows = [([5] * 9 + [0] * 3, True), ([5] * 8 + [0] * 4, False)]  # max_len 8
    tokens, _ = _lra_read("pickle:text", rows, tmp_path)
    assert tokens.cut == 1, "a row's padding beyond max_len is not cut"
    assert tokens.y.tolist() == [1, 0], "a bool label is Python's 1 or 0"


def test_lra_data_a_damaged_pickle_allocates_no_more_than_its_size(tmp_path):
    """A memo index (LONG_BINPUT) or a bytearray length (BYTEARRAY8) far beyond the file, as one
    flipped bit can make: refused within a few MB traced, never the 256 MB each names (the memo
    index: pickle.loads takes it); numpy arrays pickled with protocol 5 (bytearrays) read as 4."""
    memo = b"\x80\x02]r" + struct.pack("<I", 2**24) + b"."  # [], memo entry 2²⁴: 2²⁵ slots in C
    fine = b"\x80\x02]r" + struct.pack("<I", 8) + b"."  # an index below its 9 bytes: no harm
    assert lra_readers._unpickle(_write(tmp_path / "fine.pickle", fine)) == []
    huge = b"\x80\x05\x96" + struct.pack("<Q", 2**28) + b"abc."  # a 256 MB bytearray
    short = b"\x80\x05\x96" + struct.pack("<Q", 5) + b"abc."  # 5 bytes said, 4 there
    for content, what in [
        (memo, "ValueError: memo index 16777216 in a pickle of 9 bytes"),
        (fine.replace(b"\x08", b"\x09"), "memo index 9 in a pickle of 9 bytes"),  # n: no such
        (huge, "expected 268435456 bytes in a bytearray8, but only 4 remain"),
        (short, "expected 5 bytes in a bytearray8, but only 4 remain"),
    ]:
        path = _write(tmp_path / "listops.train.pickle", content)
        tracemalloc.start()
        try:
            with pytest.raises(lra_data.DataError, match=what):
                lra_readers.read_lra_pickle(path, "listops", 8)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 2**23, f"{what}: {peak / 2**20:.0f} MiB traced"
    items = [{"input_ids_0": np.arange(1, 6, dtype=dtype), "label": 1} for dtype in (np.int32, int)]
    read = []
    for protocol in (4, 5):
        path = _write(tmp_path / f"p{protocol}.pickle", pickle.dumps(items, protocol=protocol))
        assert (b"\x96" in path.read_bytes()) == (protocol == 5), "bytearrays in protocol 5 only"
        read.append(lra_readers.read_lra_pickle(path, "listops", 8)[0])
    assert read[0].x.tolist() == read[1].x.tolist() == [[1, 2, 3, 4, 5, 0, 0, 0]] * 2


class _Python2Pickler(pickle._Pickler):
    """Python 2's pickle at protocol 2, which wrote the CIFAR-10 python batches: a str (and here
    bytes) as Python 2's str, SHORT_BINSTRING or BINSTRING, read as bytes with encoding="bytes"."""

    def save_str(self, obj):
        data = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(data) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(data)]) + data)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(data)) + data)
        self.memoize(obj)

    dispatch = {**pickle._Pickler.dispatch, str: save_str, bytes: save_str}


def _numpy_as(data: bytes, old: str, new: str) -> bytes:
    """A pickle of numpy arrays with its numpy module names old.* written new.* (numpy 2 names
    them numpy._core.*, numpy 1.x numpy.core.*), whichever numpy wrote it: FRAMEs, an optional
    count of the bytes that follow, dropped, as a name's length changes."""
    frames = [at for opcode, _, at in pickletools.genops(data) if opcode.name == "FRAME"]
    for at in reversed(frames):
        data = data[:at] + data[at + 9 :]  # FRAME and its 8-byte count
    data = data.replace(b"c" + old.encode(), b"c" + new.encode())  # GLOBAL (protocols 2, 3)
    grown = len(new) - len(old)
    named = lambda m: b"\x8c" + bytes([m[1][0] + grown]) + new.encode()  # noqa: E731
    return re.sub(rb"\x8c(.)" + re.escape(old.encode()), named, data, flags=re.S)  # 4, 5


def _numpy_1(data: bytes) -> bytes:
    """A pickle of numpy arrays as numpy 1.x writes it: numpy.core.*."""
    return _numpy_as(data, "numpy._core.", "numpy.core.")


def _numpy_2(data: bytes) -> bytes:
    """A pickle of numpy arrays as numpy 2 writes it: numpy._core.*."""
    return _numpy_as(data, "numpy.core.", "numpy._core.")


def _as_lists(split: lra_data.Split) -> list:
    return [np.asarray(value).tolist() for value in vars(split).values()]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_lra_data_official_pickles_read_with_numpy_1_and_2_names_and_each_protocol(
    tmp_path, protocol
):
    """PyTorch-LRA pickles of every task as mlpen/Nystromformer LRA/datasets/<task>.py writes
    them (int32 arrays, a numpy scalar label) and CIFAR-10 batches (protocol 2: as Python 2 wrote
    the release), each with numpy 2's module names and numpy 1's: read as the same content in
    plain lists and ints (protocol 0: no name at all)."""
    rng = np.random.default_rng(protocol)
    for task, vocab in lra_data.VOCAB.items():
        keys = ["input_ids_0", "input_ids_1"] if task == "retrieval" else ["input_ids_0"]
        n = 16 if task in ("image", "pathfinder") else 5  # an image: every pixel; else padded
        pad = np.zeros(16 - n, np.int32)  # as np.concatenate([inputs, np.zeros(96, np.int32)])
        ids = rng.integers(1, vocab, (4, len(keys), n)).astype(np.int32)
        labels = [np.int32(i % lra_readers.N_CLASSES[task]) for i in range(4)]
        official = [
            {**{key: np.r_[ids[i, k], pad] for k, key in enumerate(keys)}, "label": label}
            for i, label in enumerate(labels)
        ]
        plain = [{k: np.asarray(v).tolist() for k, v in item.items()} for item in official]
        path = _write(tmp_path / "plain.pickle", pickle.dumps(plain, protocol=0))
        want = _as_lists(lra_readers.read_lra_pickle(path, task, 16)[0])
        for numpy in ("numpy._core.", "numpy.core."):
            data = pickle.dumps(official, protocol=protocol)
            data = _numpy_1(data) if numpy == "numpy.core." else _numpy_2(data)
            assert numpy.encode() in data and (b"_core" in data) == (numpy == "numpy._core.")
            path = _write(tmp_path / f"{task}.pickle", data)
            got = _as_lists(lra_readers.read_lra_pickle(path, task, 16)[0])
            assert got == want, (task, numpy)
    folder = tmp_path / "cifar-10-batches-py"
    _lra_cifar(folder)
    want = {name: _as_lists(split) for name, split in lra_readers.read_cifar(folder).items()}
    batches = {file: pickle.loads(file.read_bytes()) for file in folder.iterdir()}
    for numpy in ("numpy._core.", "numpy.core."):
        for file, batch in batches.items():
            names = [f"{i}.png".encode() for i in range(len(batch[b"labels"]))]
            official = {**batch, b"batch_label": file.name.encode(), b"filenames": names}
            if protocol == 2:  # the release's form: Python 2's str keys and strings
                buffer = io.BytesIO()
                _Python2Pickler(buffer, protocol=2).dump(
                    {k.decode(): v for k, v in official.items()}
                )
                data = buffer.getvalue()
                assert b"_codecs" not in data and b"U\x04data" in data, "Python 2's, not 3's"
            else:
                data = pickle.dumps(official, protocol=protocol)
            file.write_bytes(_numpy_1(data) if numpy == "numpy.core." else _numpy_2(data))
        got = {name: _as_lists(split) for name, split in lra_readers.read_cifar(folder).items()}
        assert got == want, numpy


class _Calls:
    """An object whose unpickling calls f(*args), as pickle.loads does with what a file names."""

    def __init__(self, f, *args):
        self.reduced = (f, args)

    def __reduce__(self):
        return self.reduced


@pytest.mark.parametrize("reader", ["pickle", "cifar"])
def test_lra_data_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path, reader):
    """A PyTorch-LRA pickle or a CIFAR-10 batch that names anything but what data is made of
    (lra_readers.PICKLED): one sentence naming the file and the name, and nothing runs: the file
    that pickle.loads creates is not there."""
    made = tmp_path / "made"
    plants = [  # (an object inside the data, the name the sentence gives, does it make `made`)
        (_Calls(open, str(made), "w"), "'io.open'", True),
        (_Calls(os.system, f"touch {made}"), f"'{os.name}.system'", True),
        (_Calls(eval, f"open({str(made)!r}, 'w')"), "'builtins.eval'", True),  # set is allowed
        (_Calls(codecs.encode, "text", "rot13"), "_codecs.encode(..., 'rot13')", False),
    ]
    for plant, name, makes in plants:
        if reader == "pickle":
            file = tmp_path / "listops.train.pickle"
            content = [dict(input_ids_0=np.arange(1, 4), label=np.int32(1)), plant]
            for split in ("train", "dev", "test"):
                _write(tmp_path / f"listops.{split}.pickle", pickle.dumps(content))
        else:
            _lra_cifar(tmp_path / "cifar-10-batches-py")
            file = tmp_path / "cifar-10-batches-py" / "data_batch_1"
            content = {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, plant]}
            _write(file, pickle.dumps(content))
        with pytest.raises(lra_data.DataError) as refused:
            task, max_len = ("listops", 8) if reader == "pickle" else ("image", 1024)
            lra_data.load_task(task, tmp_path, max_len)
        held = "which no data file holds (numpy arrays, numbers, strings, lists, dicts)"
        said = f"{file}: the pickle asks for {name}, {held}: refused, as it could run code"
        assert str(refused.value) == said and not made.exists()
        pickle.loads(file.read_bytes())  # as the file was read before: it runs
        assert made.exists() == makes, name
        made.unlink(missing_ok=True)


def _lra_read(kind: str, content, tmp_path: pathlib.Path):
    """Put content where reader `kind` reads it and read it (max_len 8) -> its result."""
    if kind in ("listops", "aan"):
        path = _write(tmp_path / "bad.tsv", content)
        read = lra_readers.read_listops_tsv if kind == "listops" else lra_readers.read_aan_tsv
        return read(path, 8)
    if kind.startswith("pickle"):  # pickle:<task>; content: the items (bytes: the file itself)
        keys = {2: ("input_ids_0", "label"), 3: ("input_ids_0", "input_ids_1", "label")}
        if isinstance(content, list):  # tuples: the fields of an item, in the order of keys
            content = [
                dict(zip(keys[len(t)], t, strict=True)) if isinstance(t, tuple) else t
                for t in content
            ]
        raw = content if isinstance(content, bytes) else pickle.dumps(content)
        return lra_readers.read_lra_pickle(_write(tmp_path / "bad.pickle", raw), kind[7:], 8)
    if kind == "imdb":  # content: one more negative training review (None: no positive one)
        positive = [] if content is None else ["good", "fine"]
        folder = _lra_imdb(tmp_path, {"neg": ["bad"], "pos": positive})
        if callable(content):  # content(folder of the negative training reviews)
            content(folder / "train" / "neg")
        elif content is not None:
            _write(folder / "train" / "neg" / "9_7.txt", content)
        splits, notes = lra_readers.read_imdb(folder, 8)
        return splits["train"], notes
    if kind == "png":  # content: the file, or how to break a good one: "rgb", "filter 5", "cut"
        if isinstance(content, str):
            options = {"rgb": dict(color_type=2), "filter 5": dict(filters=(5,))}.get(content, {})
            image = np.random.default_rng(1).integers(0, 256, (10, 7), dtype=np.uint8)
            data = _lra_write_png(tmp_path / "bad.png", image, **options).read_bytes()
            content = data[:60] + data[80:] if content == "cut" else data  # IDAT bytes lost
        return lra_readers.read_png_gray(_write(tmp_path / "bad.png", content))
    if kind == "cifar":  # content: data_batch_3, or max_len
        folder = tmp_path / "cifar-10-batches-py"
        _lra_cifar(folder)
        if isinstance(content, bytes):
            _write(folder / "data_batch_3", content)
        return lra_readers.read_cifar(folder, 1024 if isinstance(content, bytes) else content)
    if kind == "pathfinder":  # content: metadata/0.npy, the only one (None: none; int: max_len)
        tmp_path = tmp_path / "curv_baseline"
        _lra_pathfinder(tmp_path, 12)
        if callable(content):  # content(the Pathfinder folder)
            content(tmp_path)
        elif not isinstance(content, int):
            for meta in (tmp_path / "metadata").glob("*.npy"):
                meta.unlink()
            if content is not None:
                _write(tmp_path / "metadata" / "0.npy", content)
        return lra_readers.read_pathfinder(tmp_path, content if isinstance(content, int) else 16)
    if kind == "retrieval":  # content: new_aan_pairs.train.tsv, the only file
        _write(tmp_path / "tsv_data" / "new_aan_pairs.train.tsv", content)
        return lra_data.load_task("retrieval", tmp_path, 8)
    return lra_data.load_task(**content, data_dir=tmp_path)  # load_task: content its arguments


def _lra_npy(data, labels=None) -> bytes:  # numpy.save's bytes; labels: a CIFAR-10 batch instead
    buffer = io.BytesIO()
    np.save(buffer, data)
    return buffer.getvalue() if labels is None else pickle.dumps({b"data": data, b"labels": labels})


_HWC = _lra_npy(np.zeros((4, 32, 32, 3), np.uint8), [0] * 4)  # PIL's and torchvision's layout
_NO_IMDB = "aclImdb/train (from ai.stanford.edu/~amaas/data/sentiment) or the PyTorch-LRA pickles"
_LISTOPS_NO_DEPTH = {k: v for k, v in _LRA_TINY_LISTOPS.items() if k != "max_depth"}
_LOAD_NO_DEPTH = dict(task="listops", max_len=8, listops=_LISTOPS_NO_DEPTH)
_LRA_BAD_INPUTS = [  # (reader, content, a fragment of the message; "@" = the file)
    ("listops", "expr\tlabel\n[MAX 1 2 ]\t2\n", "@:1: expected the header 'Source<TAB>Target'"),
    ("listops", "Source\tTarget\n[MAX 1 2 ]\t2\n[MIN 1 ]\tten\n", "@:3: expected 'expression"),
    ("listops", "Source\tTarget\n[MAX 1 2 ]\t10\n", "@:2: expected 'expression<TAB>label 0..9'"),
    ("listops", "Source\tTarget\n[MAX 1 2 ]\n", "@:2: expected 'expression<TAB>label 0..9'"),
    ("listops", "Source\tTarget\n[MAX 1 ]\t1\t2\n", "@:2: expected 'expression<TAB>label"),
    ("listops", "Source\tTarget\n( )\t4\n", "@: no example has a real token (the first: @:2)"),
    ("listops", "Source\tTarget\r\n", "@: no example"),  # a split with no example
    (
        "listops",
        "Source\tTarget\n[MAX 1 2 ]\t\u00b2\n",
        "@:2: expected 'expression<TAB>label 0..9'",
    ),
    ("listops", b"Source\tTarget\n[MAX 1 \xe9 ]\t2\n", "@:2: byte 0xe9 is not UTF-8 text"),
    ("aan", b"0.5\ta\tb\tt1\tt2\n", "@:1: the label '0.5' is not 0 or 1"),
    ("aan", b"1\ta\tb\tt1\tt2\n1\ta\tb\tonly four\n", "@:2: expected 5 tab-separated columns"),
    ("aan", b"1\ta\tb\tt1\tt2\n2\ta\tb\tt1\tt2\n", "@:2: the label '2' is not 0 or 1"),
    ("aan", b"label\tid1\tid2\ttext1\ttext2\n", "@:1: the label 'label' is not 0 or 1 (a header?)"),
    ("aan", b"1\ta\tb\tt1\tt2\nyes\ta\tb\tt1\tt2\n", "@:2: the label 'yes' is not 0 or 1"),
    ("aan", b"\xef\xbb\xbf1\ta\tb\tt1\tt2\n", "@:1: starts with a byte-order mark"),
    ("aan", b"", "@: no example"),
    ("aan", b"1\ta\tb\t\tt2\n0\ta\tb\tt1\t\n", "@: no example has a real token (the first: @:1)"),
    ("imdb", None, "no *.txt files in "),
    ("imdb", lambda neg: (neg / "9_7.txt").mkdir(), "9_7.txt: not a regular file, but named like"),
    ("imdb", lambda neg: (neg / "9_7.txt").symlink_to(neg / "gone"), "9_7.txt: not a regular"),
    ("png", b"hello, not a png at all", "@: not an 8-bit grayscale non-interlaced PNG"),
    ("png", "rgb", "@: not an 8-bit grayscale"),  # color type 2
    ("png", "filter 5", "@: row 0 has the unknown filter type 5"),
    ("png", "cut", "@: corrupt image data"),
    ("cifar", b"not a pickle", "data_batch_3: not a CIFAR-10 python batch"),
    ("cifar", _HWC, "data_batch_3: data is uint8 (4, 32, 32, 3); CIFAR-10 holds uint8 (n, 3072)"),
    ("cifar", _lra_npy(np.full((4, 3072), 0.5), [0] * 4), "data is float64 (4, 3072); CIFAR"),
    ("cifar", _lra_npy(np.zeros((4, 3072), np.uint8), [0, 1, 2, 10]), "3: a label that is not a"),
    ("cifar", _lra_npy(np.zeros((0, 3072), np.uint8), []), "data_batch_3: an empty batch"),
    ("cifar", _lra_npy(np.zeros((4, 3072), np.uint8), np.zeros((4, 2), int)), "3: a label that"),
    ("cifar", _lra_npy(np.zeros((4, 3072), np.uint8), [0, 1, 2.5, 3]), "3: a label that is not"),
    ("cifar", _lra_npy(np.zeros((4, 3072), np.uint8), "0123"), "3: a label that is not a class"),
    ("cifar", _lra_npy(np.zeros((4, 3072), np.uint8), [0, 1, 2]), "0..9, or not one per image"),
    ("cifar", b"cos\nnothing\n.", "data_batch_3: the pickle asks for 'os.nothing', which no"),
    ("cifar", pickle.dumps(np.zeros((4, 3072), np.uint8)), "a pickled ndarray, not a dict"),
    ("cifar", pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}), "not a CIFAR-10 python"),
    ("cifar", pickle.dumps({b"data": [[1, 2], [3]], b"labels": [0]}), "batch (ValueError("),
    ("cifar", 1000, "cifar-10-batches-py: CIFAR-10 images have 1024 pixels, but max_len is 1000"),
    ("cifar", 2048, "cifar-10-batches-py: CIFAR-10 images have 1024 pixels, but max_len is 2048"),
    ("pathfinder", "imgs/0 sample_0.png 0 1\nimgs/1 sample_404.png 9 0\n", "0.npy:2: image "),
    ("pathfinder", "imgs/1 sample_404.png 9 0\n", "sample_404.png does not exist"),
    ("pathfinder", "imgs/0 sample_0.png 0\n", "0.npy:1: expected 'imgs/<k> sample_<i>.png i"),
    ("pathfinder", "\nimgs/0 sample_0.png 0 2\n", "0.npy:2: expected 'imgs/<k> sample_<i>.png"),
    ("pathfinder", "imgs/1 sample_empty.png 9 1\n", "the metadata names no image that is not"),
    ("pathfinder", _lra_npy(np.array(["imgs/0 sample_0.png 0 1"])), "0.npy:1: byte 0x93 is not"),
    ("pathfinder", "", "0.npy: empty; the release's metadata files each list many images"),
    ("pathfinder", "imgs/0 sample_0.png 0 1\nimgs/2 sample_2.png 2 0\n", "no image in the val"),
    ("pathfinder", None, "no metadata/*.npy in"),
    ("pathfinder", "imgs/../../0 sample_0.png 0 1\n", "0.npy:1: expected 'imgs/<k> sample_<i>.png"),
    ("pathfinder", "imgs/0/.. sample_0.png 0 1\n", "0.npy:1: expected 'imgs/<k> sample_<i>.png"),
    ("listops", "Source\tTarget\n( [SM 1 ) ]\t\u0663\n", "@:2: expected 'expression<TAB>label"),
    ("pathfinder", lambda pf: (pf / "metadata/x.npy").mkdir(), "x.npy: not a regular file"),
    (
        "pathfinder",
        lambda pf: _lra_write_png(pf / "imgs/0/sample_0.png", np.zeros((2, 8), np.uint8)),
        "8x2",
    ),
    ("pathfinder", 9, ".png: 4x4 pixels, but max_len 9 asks for square images"),
    ("pickle:listops", b"not a pickle", "@: not a PyTorch-LRA pickle (list of dicts)"),
    ("pickle:listops", [{"input_ids_0": [3]}], "@: not a PyTorch-LRA pickle"),  # no label
    ("pickle:retrieval", [{"input_ids_0": [3], "label": 1}], "@: not a PyTorch-LRA pickle"),
    ("pickle:listops", [], "@: an empty list, no example"),
    ("pickle:listops", b"cos\nnothing\n.", "@: the pickle asks for 'os.nothing', which no data"),
    ("pickle:listops", [([5], 2.5)], "@: a label that is not a class 0..9 of task listops"),
    ("pickle:listops", [([5.5], 1)], "@: input_ids_0 of item 0 holds something other than"),
    ("pickle:image", [(np.zeros((2, 2, 2)), 1)], "@: input_ids_0 of item 0 holds something"),
    ("pickle:image", [(np.int64(7), 1)], "@: input_ids_0 of item 0 holds something"),  # 0-d
    ("pickle:listops", [(np.ones((2, 2)), 1)], "@: input_ids_0 of item 0 holds something"),
    ("pickle:image", np.zeros((2, 16)), "@: not a PyTorch-LRA pickle (list of dicts): TypeError("),
    ("pickle:listops", [np.zeros(3)], "@: not a PyTorch-LRA pickle (list of dicts): IndexError("),
    ("pickle:listops", [([5], 10)], "@: a label that is not a class 0..9 of task listops"),
    ("pickle:listops", [([5], 1), ([5], -1)], "@: a label that is not a class"),
    ("pickle:text", [([5], "one")], "@: a label that is not a class 0..1 of task text"),
    ("pickle:listops", [([5], 1), ([65536 + 5], 1)], "@: input_ids_0 of item 1 holds something"),
    ("pickle:listops", [([-1], 1)], "@: input_ids_0 of item 0 holds something other than token"),
    ("pickle:image", [([256], 1)], "other than token ids in [0, 256) of task image in a row"),
    ("pickle:listops", [(["a"], 1)], "@: input_ids_0 of item 0 holds something other than token"),
    ("pickle:retrieval", [([5], [300], 1)], "@: input_ids_1 of item 0 holds something other"),
    ("pickle:retrieval", [([5], "ab", 1)], "@: input_ids_1 of item 0 holds something other than"),
    ("pickle:listops", [([0, 0], 1)], "@: no example has a real token"),
    ("load_task", dict(task="lisops", max_len=8), "unknown task 'lisops'"),
    ("load_task", dict(task="listops", max_len=0), "max_len must be a positive integer, got 0"),
    ("load_task", dict(task="listops", max_len=2.5), "max_len must be a positive integer"),
    ("load_task", dict(task="listops", max_len=True), "max_len must be a positive integer"),
    ("load_task", dict(task="image", max_len=8), "no data for task image: expected"),
    ("load_task", dict(task="text", max_len=8), _NO_IMDB),
    ("load_task", _LOAD_NO_DEPTH, "the ListOps settings lack ['max_depth']"),
    ("retrieval", "1\ta\tb\tc\td\n", "{tmp}/tsv_data holds 1 of the 3 entries the release has"),
]


@pytest.mark.parametrize("kind, content, what", _LRA_BAD_INPUTS)
def test_lra_data_bad_input_is_one_data_error_naming_file_and_line(kind, content, what, tmp_path):
    with pytest.raises(lra_data.DataError) as err:
        _lra_read(kind, content, tmp_path)
    file = {"listops": "bad.tsv", "aan": "bad.tsv", "png": "bad.png"}.get(kind, "bad.pickle")
    assert what.replace("@", str(tmp_path / file)).replace("{tmp}", str(tmp_path)) in str(err.value)
    assert "(a header?)" in what or "(a header?)" not in str(err.value), "on line 1 alone"
    assert not list(tmp_path.glob("*/generator.json")) and not (tmp_path / "lra-cache").exists()


_LRA_SKIPPED = [  # (reader, content, kept labels, kept lengths (, lengths2), the first skipped)
    ("listops", "Source\tTarget\n( ( [SM 1 ) 2 ) ]\t3\n( )\t4\n", [3], [[4]], "@:3"),
    ("aan", b"1\ta\tb\tabc\tdefg\n0\ta\tb\t\tdef\n", [1], [[3], [4]], "@:2"),  # text1 empty
    ("aan", b"0\ta\tb\tab\t\n1\ta\tb\tabc\tdefg\n", [1], [[3], [4]], "@:1"),  # text2 empty
    ("imdb", " \n ", [0, 1, 1], [[3, 4, 4]], "9_7.txt"),  # an all-whitespace review
    # pickles: (input_ids_0 (, input_ids_1), label) per item
    ("pickle:listops", [([3, 4, 0], 1), ([0, 0], 0)], [1], [[2]], "@, item 1"),
    ("pickle:retrieval", [([3], [0], 1), ([3, 4], [5], 0)], [0], [[2], [1]], "@, item 0"),
    ("pickle:retrieval", [([0, 0], [4], 1), ([3, 4], [5], 0)], [0], [[2], [1]], "@, item 0"),
]


@pytest.mark.parametrize("kind, content, labels, lengths, first", _LRA_SKIPPED)
def test_lra_data_tokenless_examples_are_skipped(kind, content, labels, lengths, first, tmp_path):
    """An example with a field of no real token is skipped; one note counts them and names one."""
    split, [note] = _lra_read(kind, content, tmp_path)
    assert split.y.tolist() == labels and split.lengths.tolist() == lengths[0]
    if len(lengths) > 1:
        assert split.lengths2.tolist() == lengths[1] and len(split.x2) == len(labels)
    _lra_check_batch(split, *lengths)
    file = tmp_path / {"listops": "bad.tsv", "aan": "bad.tsv"}.get(kind, "bad.pickle")
    assert f"skipped 1 of {len(labels) + 1} examples with no real token (the first: " in note
    assert first.replace("@", str(file)) in note and note.endswith("nothing to attend to")


def test_lra_data_readers_take_what_csv_keras_and_macos_leave(tmp_path):
    """A stray '"' and a field over csv's limit read as written; keras' (n, 1) CIFAR labels as the
    list (macOS's ._<name>.txt, no review: the readers' fuzzer)."""
    long = " ".join(["( [MAX 1 2 ]"] * 15000)  # 180,000 characters, 60,000 tokens
    path = _write(tmp_path / "a.tsv", f'Source\tTarget\n"( [MIN 3 ]\t3\n{long}\t2\n')
    split, [note] = lra_readers.read_listops_tsv(path, 60000)
    assert split.lengths.tolist() == [4, 60000] and split.x[0, :4].tolist() == [16, 11, 4, 15]
    assert note.startswith(f"{path}:2: '\"' is not a ListOps token") and split.y.tolist() == [3, 2]
    folder = tmp_path / "cifar-10-batches-py"
    _lra_cifar(folder)
    want = lra_readers.read_cifar(folder)
    for file in folder.iterdir():
        batch = pickle.loads(file.read_bytes())
        batch[b"labels"] = np.array(batch[b"labels"], np.uint8)[:, None]  # (n, 1)
        file.write_bytes(pickle.dumps(batch))
    for name, split in lra_readers.read_cifar(folder).items():
        assert np.array_equal(split.x, want[name].x) and split.y.tolist() == want[name].y.tolist()


def test_lra_data_notes_unknown_listops_token_and_padding_far_beyond_the_inputs(tmp_path):
    """A typo ([MAXX): a note names file, line and token; max_len over twice the longest: said."""
    folder = tmp_path / "listops-1000"  # the release: no generator.json
    val = ["( ( [MAXX 3 ) 4 ) ]\t4", "( ( [MIN 5 ) 6 ) ]\t5", "( [MED 7 ) [FIRST ]\t7"]  # val only
    for split in lra_data.SPLITS:
        rows = ["( ( [MAX 1 ) 2 ) ]\t2"] + (val if split == "val" else [])
        _write(folder / f"basic_{split}.tsv", "\r\n".join(["Source\tTarget", *rows]) + "\r\n")
    splits, notes = lra_data.load_task("listops", tmp_path, 8)
    assert splits["val"].x[1, 0] == listops.OOV == 16  # the official OOV id
    [said, note] = notes  # the sizes asked for (96000, ...) are not the folder's: said
    assert f"from the release folder {folder} (not generated: the sizes asked for do not " in said
    assert note.startswith(f"{folder / 'basic_val.tsv'}:3: '[MAXX' is not a ListOps token")
    assert "token (0 1 2 3 4 5 6 7 8 9 [MIN [MAX [MED [SM ]);" in note
    assert note.endswith("of 2 line(s) of this file become the OOV id 16")
    assert lra_readers.read_listops_tsv(folder / "basic_train.tsv", 8)[1] == []
    said = lra_data.load_task("listops", tmp_path, 9)[1][-1]
    twice = "max_len 9 is more than twice the longest input (4 tokens): every input is padded to 9"
    assert said == f"{twice} tokens, and attention pays for the padding"
    _lra_pickles(tmp_path, "retrieval", [{"input_ids_0": [1], "input_ids_1": [1] * 5, "label": 0}])
    assert lra_data.load_task("retrieval", tmp_path, 10)[1][1:] == []  # the longest: document 2
    assert any("max_len 11 is" in n for n in lra_data.load_task("retrieval", tmp_path, 11)[1])


@contextlib.contextmanager
def _serve(folder: pathlib.Path):
    """HTTP server of folder -> (URL, paths asked); /500; /slow/<f>: 0.3 s late; /cut/<f>: half;
    /loop/<f>: a redirect to itself"""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.way, _, name = self.path[1:].partition("/")
            time.sleep(0.3 if self.way == "slow" else 0)
            if self.way == "loop":  # a redirect to itself, for ever
                self.send_response(302)
                self.send_header("Location", self.path)
                return self.end_headers()
            self.path = f"/{name}" if self.way in ("slow", "cut") else self.path
            return self.send_error(500) if self.way == "500" else super().do_GET()

        def copyfile(self, source, out):
            data = source.read()
            out.write(data[: len(data) // 2] if self.way == "cut" else data)

        def log_message(self, *args):  # quiet: stderr holds only what the code under test says
            pass

    asked, handler = [], functools.partial(Handler, directory=str(folder))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        yield f"http://127.0.0.1:{server.server_port}", asked
        server.shutdown()


@mock.patch.object(lra_data, "IMDB_REVIEWS", 4)  # the release's count, as the small aclImdb here
def test_lra_data_download_each_task_and_train_or_say_in_one_sentence_what_failed(tmp_path, capsys):
    """--download of each task's archive from a local server: what is kept, two steps; each fault
    one sentence (URL, by hand), nothing left; two at once: one fetches; ARCHIVES as published."""
    imdb = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
    cifar = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert [(a["url"], a["md5"], a["size"]) for a in lra_data.ARCHIVES.values()] == [
        (imdb, "7c2ac02c03563afcf9b574c7e56c153a", None),
        (cifar, "c58f30108f718f92721af3b95e74349a", 170498071),
    ] + [("https://storage.googleapis.com/long-range-arena/lra_release.gz", None, None)] * 3
    src, server, data = tmp_path / "src", tmp_path / "server", tmp_path / "data"
    texts = {"neg": ["bad", "poor", "meh", "dull"], "pos": ["good", "fine", "great", "ok"]}
    _lra_imdb(src, {**texts, "unsup": ["not kept"]})
    _write(src / "aclImdb" / "train" / "labeledBow.feat", "not kept")
    _lra_cifar(src / "cifar-10-batches-py")
    stem = src / "lra_release" / "lra_release"
    listops.write(stem / "listops-1000", dict(_LRA_TINY_LISTOPS, seed=0), False)
    (stem / "listops-1000" / "generator.json").unlink()  # as the release: no generator.json
    _lra_aan(stem, "1\ta\tb\tx\ty\n0\ta\tb\tz\tw\n" * 4)  # label, id1, id2, text1, text2
    _lra_pathfinder(stem / "pathfinder32" / "curv_contour_length_14", 22)
    _lra_pathfinder(stem / "pathfinder32" / "curv_baseline", 11)  # another difficulty
    tops = {"aclImdb_v1.tar.gz": ["aclImdb", "lra_release"]}  # more after the folder
    tops |= {"lra_release.gz": ["lra_release"], "cifar-10-python.tar.gz": ["cifar-10-batches-py"]}
    for archive, folders in tops.items():
        with tarfile.open(_write(server / archive, b""), "w:gz") as tar:
            for top in folders:
                tar.add(src / top, top)
    md5 = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in server.iterdir()}
    small = "--attention softmax --steps 2 --batch-size 4 --d-model 16 --d-ff 32 --n-layers 1"
    flags = [*small.split(), "--data-dir", str(data), "--download"]
    with _serve(server) as (url, asked):
        cases = [
            ("text", f"{url}/aclImdb_v1.tar.gz", "is not the expected archive: its MD5 is"),
            ("image", f"{url}/cifar-10-python.tar.gz", "bytes, not 170,498,071"),
            ("text", f"{url}/nothing.gz", "HTTP Error 404"),
            ("text", f"{url}/500/", "500"),
            ("retrieval", "http://127.0.0.1:0/lra_release.gz", "Connection refused"),
            ("retrieval", f"{url}/cut/lra_release.gz", "cut short"),
        ]
        faults = (KeyboardInterrupt(), OSError(28, "No space left on device"))  # in a write
        cases += [("pathfinder", f"{url}/lra_release.gz", fault) for fault in faults]
        for task, where, what in cases:  # the table's size and MD5
            fails = mock.Mock(wraps=shutil, copyfileobj=mock.Mock(side_effect=what))
            with mock.patch("download.shutil", shutil if type(what) is str else fails):
                with pytest.raises((lra_data.DataError, KeyboardInterrupt)) as err:
                    lra_data.download_task(task, data, where)
            text, ctrl_c = str(err.value), err.type is lra_data.Interrupted  # one sentence each
            what = files.FAULTS.get(getattr(what, "errno", None)) or str(what)  # a full disk: the
            # folder's fault, as files.py says it
            assert what in text and where in text and "\n" not in text.strip(), text
            assert "by hand: download" in text or ctrl_c or "full" in what
            folder = data / lra_data.ARCHIVES[task]["folder"]
            kept = "nothing was unpacked; the files there before are kept"
            interrupted = f"interrupted while downloading {where} into {folder}: {kept}"
            assert not ctrl_c or text == interrupted, text
            assert "interrupted" not in capsys.readouterr().err, "the caller says it, once"
            assert not list(data.rglob("*")), (task, what)  # nor an empty pathfinder32/
        for task, archive, max_len, folder in [
            ("text", "aclImdb_v1.tar.gz", 16, src / "aclImdb"),
            ("image", "cifar-10-python.tar.gz", 1024, src / "cifar-10-batches-py"),
            ("listops", "cut/lra_release.gz", 64, stem / "listops-1000"),
            ("retrieval", "slow/lra_release.gz", 8, stem / "tsv_data"),
            ("pathfinder", "lra_release.gz", 16, stem / lra_data.PATH_HARD),
        ]:
            ours = dict(md5=md5[archive], size=None) if task in ("text", "image") else {}
            more = f"--task {task} --max-len {max_len} --download-url {url}/{archive} --out"
            with mock.patch.dict(lra_data.ARCHIVES[task], ours):  # our archive, the same checks
                result = _lra_run([*flags, *more.split(), str(tmp_path / task)])
            assert result["steps"] == 2 and asked.pop() == f"/{archive}"
            assert result["task"] == task, "the result names its task"
            kept = {p.relative_to(folder) for p in folder.rglob("*") if p.is_file()}
            kept -= {p for p in kept if "unsup" in p.parts or p.suffix == ".feat"}
            got = data / folder.relative_to(stem if "lra_release" in archive else src)
            assert {p.relative_to(got) for p in got.rglob("*") if p.is_file()} == kept, task
            assert all((got / p).read_bytes() == (folder / p).read_bytes() for p in kept)
        size = (server / "aclImdb_v1.tar.gz").stat().st_size  # no terminal: a line per tenth
        lines = [line for line in capsys.readouterr().err.splitlines() if line[:8] == "aclImdb:"]
        assert 1 <= len(lines) <= 10 and lines[-1] == f"aclImdb: {size:,} of {size:,} bytes"
        (data / "tsv_data").rename(tmp_path / "tsv_data")  # two at once: one fetches
        slow = f"{url}/slow/lra_release.gz"
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda u: lra_data.download_task("retrieval", data, u), [slow] * 2))
        (data / "tsv_data" / "new_aan_pairs.eval.tsv").unlink()  # a folder short of one file
        lra_data.load_task("retrieval", data, 8, download=f"{url}/lra_release.gz")
        again = (data / "tsv_data" / "new_aan_pairs.eval.tsv").read_bytes()
        assert again == (stem / "tsv_data" / "new_aan_pairs.eval.tsv").read_bytes(), "completed"
    assert asked.count(slow[len(url) :]) == 1 and "is downloading into" in capsys.readouterr().err
    found = sorted(os.listdir(data)) + os.listdir(data / "pathfinder32")
    names = "aclImdb cifar-10-batches-py listops-1000 lra-cache pathfinder32 tsv_data"
    assert found == [*names.split(), "curv_contour_length_14"]  # no more


def _lra_aan(root: pathlib.Path, rows="1\ta\tb\tabc\tdefgh\n0\tc\td\tx\t\n0\te\tf\ty\tz\n"):
    for name in ("train", "eval", "test"):  # (the second pair is skipped: an empty text)
        _write(root / "tsv_data" / f"new_aan_pairs.{name}.tsv", rows)


_LRA_PAIR = {"input_ids_0": [5, 6, 7, 8, 0], "input_ids_1": [7, 0, 3], "label": 1}  # a pickle item
_LRA_SOURCES = {  # a folder of each kind -> (task, max_len); listops: generated
    "listops": ("listops", 30, lambda root: None),
    "text": ("text", 6, lambda r: _lra_imdb(r, {"neg": ["bad film", " "], "pos": ["good", "ok"]})),
    "retrieval": ("retrieval", 4, _lra_aan),
    "image": ("image", 1024, lambda root: _lra_cifar(root / "cifar-10-batches-py")),
    "pathfinder": ("pathfinder", 16, lambda root: _lra_pathfinder(root / lra_data.PATH_HARD, 22)),
    "pickles": ("retrieval", 3, lambda root: _lra_pickles(root, "retrieval", [_LRA_PAIR] * 2)),
}

_LRA_SAID = {  # the first note: where from (under the data folder), what the readers did
    "listops": "the generator (seed 0), written to @/listops-tiny; words to ids 1..15, 16 for any",
    "text": "the release folder @/aclImdb; bytes + 1; val is test; 2 of 6 inputs cut at max_len 6",
    "retrieval": "the release folder @/tsv_data; bytes + 1, each text first cut to 10,000 bytes,",
    "image": "@/cifar-10-batches-py; grey as tf.image.rgb_to_grayscale; TFDS order, train cut at",
    "pathfinder": "curv_contour_length_14; the hard difficulty; TFDS order, cut at 80 % and 90 %",
    "pickles": "the PyTorch-LRA pickles @/retrieval.*.pickle; as read; 6 of 12 inputs cut at",
}


@pytest.mark.parametrize("source", _LRA_SOURCES)
def test_lra_data_cache_hit_equals_a_fresh_read(source, tmp_path, monkeypatch):
    """A hit reads no source; the same arrays and notes as a fresh read, but the source said."""
    task, max_len, write = _LRA_SOURCES[source]
    write(tmp_path)
    monkeypatch.setattr(lra_data, "IMDB_REVIEWS", 2)  # the release's count, as aclImdb/ here
    args = dict(task=task, data_dir=tmp_path, max_len=max_len, listops=_LRA_TINY_LISTOPS)
    lra_data.load_task(**args, cache=False)
    assert not (tmp_path / "lra-cache").exists(), "cache=False writes no prepared file"
    notes = lra_data.load_task(**args)[1]
    [cache] = (tmp_path / "lra-cache").iterdir()  # no temporary file left
    fail = mock.Mock(side_effect=AssertionError("a hit reads no source file"))
    with mock.patch.object(lra_data, "read_source", fail):
        hit, hit_notes = lra_data.load_task(**args)
    fresh, fresh_notes = lra_data.load_task(**args, cache=False)
    assert lra_data.prepare(**args, cache=False).file is None, "cache=False: no prepared file"
    assert hit_notes[0] == notes[0].replace(" from ", f" from the prepared cache {cache} of ", 1)
    assert _LRA_SAID[source].replace("@", str(tmp_path)) in notes[0], notes[0]
    assert fresh_notes == notes and hit_notes[1:] == notes[1:]  # the readers' notes kept too:
    assert len(notes) > 1 or source in ("listops", "image", "pickles")  # none for these
    for name, field in itertools.product(lra_data.SPLITS, dataclasses.fields(lra_data.Split)):
        a, b = (np.asarray(getattr(data[name], field.name)) for data in (hit, fresh))
        assert np.array_equal(a, b) and a.dtype == b.dtype, (name, field.name)  # None: same
    assert (hit["val"] is hit["test"]) == (task == "text") and fresh["train"].x.dtype == np.int16


def test_lra_data_prepared_on_its_own_is_what_train_lra_reads(tmp_path):
    """python lra_data.py writes the prepared file train_lra.py then reads alone; no data: one
    line, exit 1, naming --download; a --download for a generated ListOps: said unused."""
    assert lra_data.MAX_LEN == {task: train_lra.TASKS[task]["max_len"] for task in lra_data.VOCAB}
    sizes = ["--data-dir", str(tmp_path), "--listops-size", "48", "--listops-eval-size", "12"]
    run = _cli("lra_data.py", *sizes, "--max-len", "30")
    assert run.returncode == 0, run.stderr[-2000:]
    *notes, last = run.stdout.strip().splitlines()
    folder, file = tmp_path / "listops-1000", tmp_path / "lra-cache" / "listops-1000-30.npz"
    said = "listops: train 48, val 12, test 12 examples from the generator (seed 0), written to"
    assert notes[0].startswith(f"{said} {folder}; ") and last == f"prepared file: {file}"
    steps = "--steps 1 --eval-every 1 --batch-size 8 --d-model 16 --d-ff 32 --max-len 30".split()
    with mock.patch.object(lra_data, "read_source", side_effect=AssertionError("read again")):
        assert _lra_run([*sizes, *steps, "--out", str(tmp_path / "run")])["steps"] == 1
    assert json.loads((folder / "generator.json").read_text())["shards"] == 16  # as written
    run = _cli("lra_data.py", "--task", "image", "--data-dir", str(tmp_path))
    assert run.returncode == 1 and run.stderr.startswith("lra_data.py: no data for task image")
    assert "; train_lra.py's or lra_data.py's --download fetches https://" in run.stderr
    options = dict(listops=_LRA_TINY_LISTOPS, download="http://x")  # a ListOps generated
    notes = lra_data.load_task("listops", tmp_path, 30, **options)[1]
    said = f"--download-url http://x is not used: {tmp_path / 'listops-tiny'} is generated"
    assert said in notes[-1]
    notes = lra_data.load_task("listops", tmp_path, 30, **dict(options, download=""))[1]
    assert notes[-1].startswith("--download is not used: "), notes[-1]  # the table's URL
    paper = dict(lra_data.LISTOPS_PAPER, train=48, val=12, test=12)  # listops-1000, as above
    notes = lra_data.load_task("listops", tmp_path, 30, listops=paper, download="http://x")[1]
    assert not any("is not used" in note for note in notes), "where a release would be fetched"


def test_lra_data_exits_1_when_it_cannot_write_the_prepared_file(tmp_path):
    """Writing the prepared file is what lra_data.py is run for: when it cannot (a file where
    lra-cache/ goes; a read-only mount), it says why once, on stderr, and exits 1; the split sizes
    are said first. (A training run goes on without it: the cache tests.)"""
    _lra_aan(tmp_path)
    (tmp_path / "lra-cache").write_text("")  # (root writes into read-only folders: a file here)
    run = _cli("lra_data.py", "--task", "retrieval", "--max-len", "4", "--data-dir", str(tmp_path))
    file, again = tmp_path / "lra-cache" / "tsv_data-4.npz", "the next run reads the data again"
    said = f"cannot write below {tmp_path / 'lra-cache'}: a file stands where a folder of its path"
    said += f" goes: {again}"
    assert (run.returncode, run.stderr) == (1, f"lra_data.py: {said}\n"), run.stderr
    assert run.stdout.startswith("retrieval: train 2, val 2, test 2 examples from the release")
    assert said not in run.stdout and "prepared file:" not in run.stdout
    (tmp_path / "lra-cache").unlink()
    rofs = OSError(errno.EROFS, "Read-only file system")
    with _write_fault(file.name, 1, rofs), pytest.raises(SystemExit) as e:
        lra_data.main(["--task", "retrieval", "--max-len", "4", "--data-dir", str(tmp_path)])
    said = f"cannot write {file}: the file system is read-only: {again}"
    assert e.value.code == f"lra_data.py: {said}" and not list(file.parent.glob("*.tmp"))
    with pytest.raises(SystemExit) as e:  # a --data-dir that is a file: one sentence, exit 1
        lra_data.main(["--data-dir", str(tmp_path / "tsv_data/new_aan_pairs.train.tsv")])
    where = tmp_path / "tsv_data/new_aan_pairs.train.tsv"
    assert e.value.code == f"lra_data.py: cannot write below {where}: a file stands where a " + (
        "folder of its path goes"
    )


def test_lra_data_cache_rebuilt_on_a_changed_source_or_version_or_damage(tmp_path, monkeypatch):
    """Read anew, with a note giving the true reason, and cached again; an unwritable cache:
    said."""
    _lra_aan(tmp_path)
    cache = tmp_path / "lra-cache/tsv_data-4.npz"
    train = tmp_path / "tsv_data/new_aan_pairs.train.tsv"
    want = lra_data.load_task("retrieval", tmp_path, 4)[0]["test"].x2  # writes the cache
    bad, new = "it was damaged (BadZipFile)", lra_data.CACHE_VERSION + 1
    version = f"the readers changed (version {new - 1}, now {new})"
    key = "(the key holds each file's size and modification time in whole seconds)"

    def same_tick():  # another size at the same time: written twice within one clock tick
        stamp = train.stat().st_mtime_ns
        train.write_bytes(train.read_bytes() + b"\n")  # a blank line: the same examples
        os.utime(train, ns=(stamp, stamp))

    def other_max_len():  # a prepared file of max_len 5 under max_len 4's name
        lra_data.load_task("retrieval", tmp_path, 5)
        os.replace(cache.with_name("tsv_data-5.npz"), cache)

    for change, why in [
        (lambda: os.utime(train, ns=(0, 0)), f"{train} changed {key}"),  # the same bytes
        (lambda: os.utime(train, ns=(0, 10**9)), f"{train} changed {key}"),  # a second on
        (same_tick, f"{train} changed {key}"),
        (lambda: cache.write_bytes(cache.read_bytes()[:-100]), bad),
        # a letter of its key (UTF-32): the CRC does not match
        (lambda: cache.write_bytes(cache.read_bytes().replace(b"v\0\0\0e", b"V\0\0\0e", 1)), bad),
        (other_max_len, "it was made for max_len 5, not 4"),
        (lambda: monkeypatch.setattr(lra_data, "CACHE_VERSION", new), version),
    ]:
        change()
        data, notes = lra_data.load_task("retrieval", tmp_path, 4)
        assert notes[-1].startswith(f"{cache}: rebuilt, as {why}") and " cache " not in notes[0]
        assert np.array_equal(data["test"].x2, want)  # and the next load reads the new cache:
        assert " cache " in lra_data.load_task("retrieval", tmp_path, 4)[1][0]
    cache.write_bytes(b"damaged")  # and cannot be rewritten: said once, not "rebuilt" as well
    with _write_fault(cache.name, 1, OSError(errno.EROFS, "Read-only file system")):
        prepared = lra_data.prepare("retrieval", tmp_path, 4)
    again = "the next run reads the data again"
    unwritten = f"cannot write {cache}: the file system is read-only: {again}"
    assert [note for note in prepared.notes if str(cache) in note] == [unwritten]
    assert prepared.unwritten == unwritten and prepared.file is None, "not the damaged one"
    shutil.rmtree(cache.parent)
    cache.parent.write_text("")  # a file where the cache folder goes: it cannot be written
    data, notes = lra_data.load_task("retrieval", tmp_path, 4)
    in_the_way = f"cannot write below {cache.parent}: a file stands where a folder of its path"
    assert np.array_equal(data["test"].x2, want) and notes[-1].startswith(in_the_way)
    assert lra_data.prepare("retrieval", tmp_path, 4).file is None, "no prepared file written"


def test_lra_data_pathfinder_cache_is_keyed_by_its_image_folders(tmp_path):
    """An image folder's time (an image added, removed, renamed) rebuilds the Pathfinder cache;
    a hidden folder's (macOS's ._0) does not."""
    imgs = tmp_path / lra_data.PATH_HARD / "imgs"
    _lra_pathfinder(imgs.parent, 22)
    (imgs / "._0").mkdir()
    lra_data.load_task("pathfinder", tmp_path, 16)
    os.utime(imgs / "._0", ns=(0, 0))
    assert " cache " in lra_data.load_task("pathfinder", tmp_path, 16)[1][0], "a hidden folder"
    os.utime(imgs / "0", ns=(0, 0))
    notes = lra_data.load_task("pathfinder", tmp_path, 16)[1]
    assert f"rebuilt, as {imgs / '0'} changed (the key holds" in notes[-1], notes[-1]


def test_lra_data_download_is_not_tried_where_the_pickles_are(tmp_path):
    """--download fetches a missing folder only where no PyTorch-LRA pickles are there."""
    _lra_pickles(tmp_path, "retrieval", [_LRA_PAIR] * 2)
    _, [said] = lra_data.load_task("retrieval", tmp_path, 5, download="http://127.0.0.1:0")
    assert said.startswith("retrieval: train 2, val 2, test 2 examples from the PyTorch-LRA")


_LRA_CACHE_ERRORS = [  # what reading the prepared file raises -> why it is rebuilt (None: absent)
    (FileNotFoundError(2, "No such file"), None),
    (NotADirectoryError(20, "Not a directory"), None),  # lra-cache is a file
    (PermissionError(13, "Permission denied"), "it was damaged (PermissionError)"),
    (ValueError("bad"), "it was damaged (ValueError)"),
    (KeyError("meta"), "it was damaged (KeyError)"),
    (TypeError("bad"), "it was damaged (TypeError)"),
    (EOFError(), "it was damaged (EOFError)"),
    (zipfile.BadZipFile(), "it was damaged (BadZipFile)"),
]


@pytest.mark.parametrize("error, why", _LRA_CACHE_ERRORS, ids=_id)
def test_lra_data_load_prepared_reads_each_error_as_absent_or_damaged(tmp_path, error, why):
    """load_prepared: no file (or a file where lra-cache goes) is no cache; any other error of
    reading it, a damaged one to rebuild."""
    with mock.patch.object(lra_data.np, "load", side_effect=error):
        assert lra_data.load_prepared(tmp_path / "a.npz", {}, tmp_path) == (None, [], why)


def _lra_entries(root: pathlib.Path) -> dict:
    """Every file and folder under root -> its bytes (a folder: None)."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")
    }


def _lra_tar(path: pathlib.Path, src: pathlib.Path, *tops) -> str:
    """A tar.gz at path of the folders tops under src -> its file:// URL."""
    with tarfile.open(_write(path, b""), "w:gz") as tar:
        for top in tops:
            tar.add(src / top, top)
    return path.as_uri()


def _whole_seconds(src: pathlib.Path, dst: pathlib.Path) -> None:
    """A copy as scp -p or an SFTP client makes it on another host: each time in whole seconds."""
    shutil.copytree(src, dst)
    for path in sorted(dst.rglob("*"), key=lambda p: -len(p.parts)):  # a folder after its files
        os.utime(path, (path.stat().st_atime // 1, path.stat().st_mtime // 1))


_COPIES = {  # copy tool -> (what it needs on the PATH, how it copies the folder src as dst)
    "tar": ("tar", "mkdir {dst} && tar czf {dst}.tgz -C {src} . && tar xzf {dst}.tgz -C {dst}"),
    "zip": (
        "unzip",
        "mkdir {dst} && cd {src} && zip -qr {dst}.zip . && unzip -q {dst}.zip -d {dst}",
    ),
    "scp -p": ("scp", "scp -rpq {src} {dst}"),  # to the same host: scp runs cp -p
    "scp -p to another host": (None, _whole_seconds),  # the protocols carry whole seconds
    "cp -p": ("cp", "cp -rp {src} {dst}"),
    "rsync -a": ("rsync", "rsync -a {src}/ {dst}"),
}


@pytest.mark.parametrize("tool", _COPIES)
def test_lra_data_a_prepared_folder_travels_by_each_copy_tool(tool, tmp_path):
    """A data folder prepared, then copied by each tool: every prepared file is used as it is (a
    release's, Pathfinder's keyed by image folders, a generated ListOps); a changed source (the
    same size, a second later) is read again, naming it; without its sources, a prepared file is
    used as it is, said so (the offline GPU machine)."""
    needs, copy = _COPIES[tool]
    if (
        needs is not None
        and shutil.which(needs) is None
        or tool == "zip"
        and not shutil.which("zip")
    ):
        pytest.skip(f"{tool}: not on this machine")
    src, dst = tmp_path / "src", tmp_path / "dst"
    _lra_aan(src)
    _lra_pathfinder(src / lra_data.PATH_HARD, 22)
    for path in sorted(src.rglob("*"), key=lambda p: -len(p.parts)):  # times with a fraction
        os.utime(path, ns=(1_700_000_000_678_000_000, 1_700_000_000_678_000_000))
    tasks = dict(retrieval=dict(max_len=4), pathfinder=dict(max_len=16))
    tasks["listops"] = dict(max_len=30, seed=5, listops=_LRA_TINY_LISTOPS)  # generated here
    for task, args in tasks.items():
        lra_data.load_task(task, src, **args)
    if callable(copy):
        copy(src, dst)
    else:
        subprocess.run(copy.format(src=src, dst=dst), shell=True, check=True, capture_output=True)
    fail = mock.Mock(side_effect=AssertionError("a copied prepared file was read again"))
    with mock.patch.object(lra_data, "read_source", fail):
        for task, args in tasks.items():
            notes = lra_data.load_task(task, dst, **args)[1]
            assert f"from the prepared cache {dst}/lra-cache/" in notes[0], (task, notes[0])
            assert not any("rebuilt" in note for note in notes), notes
    train = dst / "tsv_data" / "new_aan_pairs.train.tsv"
    stamp = train.stat().st_mtime_ns // 10**9 * 10**9
    os.utime(train, ns=(stamp + 999_000_000, stamp + 999_000_000))  # the same second
    assert " cache " in lra_data.load_task("retrieval", dst, 4)[1][0], "the key: whole seconds"
    train.write_bytes(train.read_bytes().replace(b"1\ta", b"0\ta", 1))  # the same size
    os.utime(train, ns=(stamp + 10**9, stamp + 10**9))  # a second later
    data, notes = lra_data.load_task("retrieval", dst, 4)
    key = "(the key holds each file's size and modification time in whole seconds)"
    assert notes[-1] == f"{dst}/lra-cache/tsv_data-4.npz: rebuilt, as {train} changed {key}"
    assert data["train"].y[0] == 0, "the changed label is read"
    for folder in ("tsv_data", "pathfinder32", "listops-tiny"):  # the sources stay behind
        shutil.rmtree(dst / folder)
    with mock.patch.object(lra_data, "read_source", fail):
        for task, args in tasks.items():
            prepared = lra_data.prepare(task, dst, **args, download="")
            file = (
                dst / "lra-cache" / f"{pathlib.Path(_LRA_FOLDERS[task]).name}-{args['max_len']}.npz"
            )
            alone = f"from the prepared file {file}, used as it is: the files it was made from are"
            assert alone in prepared.notes[0] and prepared.file == file, prepared.notes[0]
            assert "--download is not used: the prepared file is here" in prepared.notes
    assert lra_data.load_task("retrieval", dst, 4)[0]["train"].y[0] == 0, "the rebuilt one"
    other = dict(tasks["listops"], seed=6)  # other settings: generated, not taken from the file
    assert "(seed 6), written to" in lra_data.load_task("listops", dst, **other)[1][0]
    with pytest.raises(lra_data.DataError, match="no data for task retrieval"):
        lra_data.load_task("retrieval", dst, 4, cache=False)  # --no-cache: no prepared file


_LRA_FOLDERS = dict(retrieval="tsv_data", pathfinder=lra_data.PATH_HARD, listops="listops-tiny")
_LRA_KEPT = "--download fetches the rest and keeps these"
_LRA_PARTS = {  # task -> (max_len, its folder, a writer of the whole folder under a root, the
    # entry removed, another content for one the user keeps)
    "image": (1024, "cifar-10-batches-py", lambda r: _lra_cifar(r / "cifar-10-batches-py"),
              "data_batch_5", ("data_batch_1", _lra_npy(np.ones((2, 3072), np.uint8), [3, 4]))),
    "retrieval": (4, "tsv_data", _lra_aan, "new_aan_pairs.eval.tsv",
                  ("new_aan_pairs.train.tsv", b"0\tq\tr\tuser\tfile\n")),
    "listops": (30, "listops-1000", lambda r: listops.write(
        r / "listops-1000", dict(_LRA_TINY_LISTOPS, seed=0), False), "basic_val.tsv",
        ("basic_train.tsv", b"Source\tTarget\r\n( [MAX 1 2 ] )\t2\r\n")),
    "pathfinder": (16, lra_data.PATH_HARD, lambda r: _lra_pathfinder(r / lra_data.PATH_HARD, 22),
                   "imgs", ("metadata/0.npy", b"imgs/0 sample_0.png 0 1 1.0 14 4\n")),
}  # fmt: skip


@pytest.mark.parametrize("task", _LRA_PARTS)
def test_lra_data_a_folder_short_of_a_release_file_is_completed_or_refused(task, tmp_path):
    """A release folder lacking an entry (an unpack cut short): refused in one sentence naming
    the count found and expected; --download fetches the rest and keeps the user's own files."""
    max_len, name, write, missing, (own, content) = _LRA_PARTS[task]
    src, data = tmp_path / "src", tmp_path / "data"
    write(src)
    if task == "listops":
        (src / name / "generator.json").unlink()  # as the release: no generator.json
    url = _lra_tar(tmp_path / "archive.tar.gz", src, name.split("/")[0])
    shutil.copytree(src / name, data / name)
    remove = shutil.rmtree if (data / name / missing).is_dir() else os.remove
    remove(data / name / missing)
    _write(data / name / own, content)  # the user's own version of a file: kept
    need = lra_data.ARCHIVES[task]["need"]
    said = f"{data / name} holds {len(need) - 1} of the {len(need)} entries the release has there"
    said += f" (no {missing}): the {task} data is incomplete (an unpack cut short?); {_LRA_KEPT}"
    with pytest.raises(lra_data.DataError) as refused:
        lra_data.load_task(task, data, max_len)
    assert str(refused.value) == said
    ours = dict(md5=hashlib.md5((tmp_path / "archive.tar.gz").read_bytes()).hexdigest(), size=None)
    with mock.patch.dict(lra_data.ARCHIVES[task], ours if task == "image" else {}):
        if task != "pathfinder":  # (the user's metadata names an image of the archive: read)
            lra_data.load_task(task, data, max_len, download=url, cache=False)
        else:
            lra_data.download_task(task, data, url)
    assert (data / name / own).read_bytes() == content, "the user's file is kept"
    whole = {p for p in _lra_entries(src / name) if p != own}
    assert whole <= set(_lra_entries(data / name)) and all(
        (data / name / p).read_bytes() == (src / name / p).read_bytes()
        for p in whole
        if (src / name / p).is_file()
    ), "the rest fetched"


@mock.patch.object(lra_data, "IMDB_REVIEWS", 4)  # the release's 12,500 as 4: see the docstring
def test_lra_data_a_text_folder_short_of_reviews_is_completed_or_refused(tmp_path, capsys):
    """Text: 12,500 reviews in each of aclImdb/{train,test}/{neg,pos}. A folder short of them is
    refused, naming the count found and expected (the release's count itself: a folder of 3);
    --download fetches the missing reviews and keeps the user's. That is shown at a count of 4
    (50,000 files of the release's count would take a minute to write and read)."""
    with mock.patch.object(lra_data, "IMDB_REVIEWS", 12_500):
        _lra_imdb(tmp_path / "a", {"neg": ["bad", "poor", "meh"], "pos": ["good", "fine", "ok"]})
        with pytest.raises(lra_data.DataError) as refused:
            lra_data.load_task("text", tmp_path / "a", 8)
    want = f"{tmp_path}/a/aclImdb/train/neg holds 3 reviews, where the release has 12,500: the "
    assert (
        str(refused.value) == f"{want}text data is incomplete (an unpack cut short?); {_LRA_KEPT}"
    )
    src, data = tmp_path / "src", tmp_path / "data"
    _lra_imdb(src, {"neg": ["bad", "poor", "meh", "dull"], "pos": ["good", "fine", "great", "ok"]})
    url = _lra_tar(tmp_path / "aclImdb_v1.tar.gz", src, "aclImdb")
    shutil.copytree(src / "aclImdb", data / "aclImdb")
    (data / "aclImdb/test/pos/3_7.txt").unlink()  # an unpack cut short: 3 test reviews there
    _write(data / "aclImdb/test/pos/0_7.txt", "the user's own")
    with pytest.raises(
        lra_data.DataError, match="test/pos holds 3 reviews, where the release has 4"
    ):
        lra_data.load_task("text", data, 8)
    md5 = hashlib.md5((tmp_path / "aclImdb_v1.tar.gz").read_bytes()).hexdigest()
    with mock.patch.dict(lra_data.ARCHIVES["text"], md5=md5):
        splits, notes = lra_data.load_task("text", data, 8, download=url)
    assert len(splits["test"].y) == 8 and notes[0].startswith("text: train 8, val 8, test 8")
    assert (data / "aclImdb/test/pos/0_7.txt").read_text() == "the user's own"
    assert (data / "aclImdb/test/pos/3_7.txt").read_text() == "ok", "fetched"
    assert "kept the 15 file(s) of" in capsys.readouterr().err, "and said which it kept"


def test_lra_data_a_generated_listops_cut_short_is_refused(tmp_path):
    """A generated folder holds the counts its generator.json names: a copy cut short is not."""
    lra_data.load_task("listops", tmp_path, 30, listops=_LRA_TINY_LISTOPS)
    train = tmp_path / "listops-tiny" / "basic_train.tsv"
    train.write_bytes(b"".join(train.read_bytes().splitlines(True)[:41]))  # 40 of 48 examples
    what = f"{train} holds 40 examples, where its generator.json says 48: a copy cut short? Delete"
    with pytest.raises(lra_data.DataError, match=re.escape(what)):
        lra_data.load_task("listops", tmp_path, 30, listops=_LRA_TINY_LISTOPS)


_CTRL_C_RUNNER = """
import importlib, io, os, runpy, sys, time
script, target, nth, *argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(script))
module, attributes = target.split(":")
owner = importlib.import_module(module)
*path, name = attributes.split(".")
for part in path:
    owner = getattr(owner, part)
real, calls = getattr(owner, name), []

def stand_in(*args, **kwargs):  # the nth call: part of its file written, said, then a wait
    calls.append(name)
    if len(calls) < int(nth):
        return real(*args, **kwargs)
    for arg in args[:2]:
        if isinstance(arg, io.IOBase) and arg.writable():
            arg.write("part" if isinstance(arg, io.TextIOBase) else b"part")
            arg.flush()
    if name == "savez":  # into the temporary file files.write gives it
        args[0].write(b"part")
    print("reached", file=sys.stderr, flush=True)
    time.sleep(120)

setattr(owner, name, stand_in)
sys.argv = [script, *argv]
runpy.run_path(script, run_name="__main__")
"""
_KEPT = "no prepared file was written; the data files are kept"
_GENERATED = "interrupted while generating ListOps into {d}/listops-1000: nothing was written there"
_PAPER_TINY = "--listops-size 48 --listops-eval-size 12 --max-len 30"
_CTRL_C = {  # stage -> (script, its flags, the stand-in's module:attribute, at which call, said)
    "reading": ("lra_data.py", "--task retrieval --max-len 4", "pathlib:Path.read_bytes", 1,
                "interrupted while reading the release folder {d}/tsv_data: " + _KEPT),
    "generating": ("lra_data.py", _PAPER_TINY, "listops:generate_tree", 1, _GENERATED),
    "writing ListOps": ("lra_data.py", _PAPER_TINY, "csv:writer", 1, _GENERATED),
    "writing the prepared file": ("lra_data.py", "--task retrieval --max-len 4", "numpy:savez",
                                  1, "interrupted while writing {d}/lra-cache/tsv_data-4.npz: "
                                  + _KEPT),
    "downloading": ("lra_data.py", "--task image --download-url {url}", "shutil:copyfileobj", 1,
                    "interrupted while downloading {url} into {d}/cifar-10-batches-py: nothing "
                    "was unpacked; the files there before are kept"),
    "unpacking": ("lra_data.py", "--task retrieval --download-url {url}", "shutil:copyfileobj",
                  2, "interrupted while downloading {url} into {d}/tsv_data: nothing was "
                  "unpacked; the files there before are kept"),
    "listops.py writing": ("listops.py", "--size 100 --out {d}/D", "csv:writer", 1,
                           "interrupted: nothing was written to {d}/D"),
}  # fmt: skip


@pytest.mark.parametrize("stage", _CTRL_C)
def test_lra_data_and_listops_ctrl_c_at_each_stage_is_one_line(stage, tmp_path):
    """SIGINT to `python lra_data.py` (or listops.py) at each stage, once a stand-in has written
    part of its file: one line saying what it was doing and what was kept, exit 130, the data
    folder as it was (no temporary file; the user's files there before kept)."""
    script, flags, target, nth, said = _CTRL_C[stage]
    d, src = tmp_path / "d", tmp_path / "src"
    d.mkdir()
    if "retrieval --max-len" in flags:
        _lra_aan(d)
    _lra_cifar(src / "cifar-10-batches-py")
    _write(d / "cifar-10-batches-py" / "data_batch_1", b"the user's own")  # kept
    _lra_aan(src / "lra_release")
    archive = "cifar-10-batches-py" if "image" in flags else "lra_release"
    url = _lra_tar(tmp_path / "archive.tar.gz", src, archive)
    flags = flags.format(d=d, url=url).split()
    before = _lra_entries(d)
    command = [sys.executable, "-c", _CTRL_C_RUNNER, str(HERE / script), target, str(nth)]
    command += [*flags, "--data-dir", str(d)] if script == "lra_data.py" else flags
    kw = dict(stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, env=env, start_new_session=True, **kw) as run:
        err = ""
        while "reached\n" not in err and run.poll() is None:
            err += run.stderr.readline()
        os.killpg(run.pid, signal.SIGINT)  # as a terminal: its process group, workers too
        err += run.communicate(timeout=60)[1]
    progress = r"downloading .*|\S+: [\d,]+ of [\d,]+ bytes"  # a download's lines, as it goes
    lines = [line for line in err.replace("reached", "").splitlines() if line]  # (workers: 2)
    lines = [line for line in lines if not re.fullmatch(progress, line)]
    assert run.returncode == 130, err
    said = f"{script}: {said.format(d=d, url=url)}"
    assert lines == [said] and err.endswith(f"\n{said}\n"), err
    after = _lra_entries(d)
    assert after == {**before, **{k: v for k, v in after.items() if k == "lra-cache"}}, "as it was"


# ----------------------------------------------------------------------------------------------
# uea_data.py: the UEA data
# ----------------------------------------------------------------------------------------------


def _toy_ts(cases: list, *, dims="2", equal="false", length=None, labels="up down", extra=()):
    """A small .ts file in the archive's format; data rows start at line len(header) + 1.
    labels: the @classLabel list; None: "@classLabel false"; False: no @classLabel line."""
    header = ["# toy file written by test_all.py", "@problemName Toy", "@timeStamps false"]
    header += ["@missing True", "@univariate false", *extra]  # booleans in any case
    header += [f"@dimensions {dims}"] if dims else []
    header += [f"@equalLength {equal}"] + ([f"@seriesLength {length}"] if length else [])
    header += [] if labels is False else [f"@classLabel {'False' if labels is None else 'TRUE'}"]
    header[-1] += f" {labels}" if labels else ""
    return "\n".join([*header, "@data", *cases]) + "\n", len(header) + 1


def _dataset(root, train_rows: list, test_rows: list, train=None, test=None) -> pathlib.Path:
    """<root>/Toy/Toy_{TRAIN,TEST}.ts from two lists of data rows (and _toy_ts options)."""
    folder = pathlib.Path(root) / "Toy"
    for split, rows, options in (("TRAIN", train_rows, train), ("TEST", test_rows, test)):
        _write(folder / f"Toy_{split}.ts", _toy_ts(rows, **(options or {}))[0])
    return folder


def _row(*channels, label) -> str:
    return ":".join(",".join(repr(float(v)) for v in c) for c in channels) + f":{label}"


def _rows(rng, words: list, length: int = 3) -> list:
    """One random 2-channel case of `length` steps per label word."""
    return [_row(*rng.normal(size=(2, length)), label=w) for w in words]


# ----------------------------------------------------------------------------------------------
# the reader


def test_uea_data_reader_values_labels_missing_steps_and_unlabelled_files(tmp_path):
    """An equal-length file: values, header-order labels, tags case-insensitive; files without
    class labels; regression targets (unequal lengths, '?' filled: the readers' fuzzer)."""
    rows = ["1,2,3:4,5,6:down", "# a comment\x0c7:7:up", "  ", "7,8,9:1.5,-2,3e-1:up"]  # 2 cases
    text = _toy_ts(rows, equal="true", length=3)[0].replace("@problemName", "@PROBLEMNAME")
    # a non-UTF-8 comment byte (latin-1 é), as in some archive files
    path = _write(tmp_path / "Toy_TRAIN.ts", text.encode().replace(b"# toy", b"# caf\xe9 toy"))
    ts = read_ts(path, require_labels=True)
    for end in ("\r\n", "\r"):  # Windows' and old Mac's line ends: read as the same file
        again = read_ts(_write(tmp_path / "E.ts", path.read_bytes().replace(b"\n", end.encode())))
        assert again.line_numbers == ts.line_numbers, repr(end)
        assert all(np.array_equal(a, b) for a, b in zip(again.series, ts.series, strict=True))
    bom = b"\xef\xbb\xbf" + path.read_bytes().split(b"\n", 1)[1]  # the first tag after a BOM
    free = path.read_bytes().replace(b"@data", b"free caf\xe9 text\n@data")  # not refused
    for name, content in (("a BOM", bom), ("free text before @data", free)):
        again = read_ts(_write(tmp_path / "F.ts", content))
        assert again.header == ts.header and again.labels.tolist() == [1, 0], name
    assert ts.header["problemname"] == "Toy" and ts.class_names == ["up", "down"]
    assert ts.labels.tolist() == [1, 0]  # @classLabel order (up = 0), not sorted (down = 0)
    assert ts.labels.dtype == np.int64 and ts.line_numbers == [11, 14]
    np.testing.assert_array_equal(ts.series[0], [[1, 4], [2, 5], [3, 6]])  # shapes (L, F)
    np.testing.assert_array_equal(ts.series[1], [[7, 1.5], [8, -2], [9, 0.3]])
    largest = float(np.finfo(np.float32).max)  # the largest float32 is a value, no overflow
    ts = read_ts(_write(tmp_path / "B.ts", _toy_ts([f"1,{largest!r}:3,-{largest!r}:up"])[0]))
    assert ts.series[0][1].tolist() == [largest, -largest]
    zeros = _toy_ts([_OK], dims="02", equal="true", length="002")[0]  # leading zeros
    assert read_ts(_write(tmp_path / "Z.ts", zeros)).series[0].shape == (2, 2)
    loose = _toy_ts(["1,2,3:4,5,6:up"], length=2)[0]  # @equalLength false: its length unchecked
    assert read_ts(_write(tmp_path / "L.ts", loose)).series[0].shape == (3, 2)
    plain = read_ts(_write(tmp_path / "U.ts", _toy_ts(["1,2:3,4"], labels=None)[0]))
    assert plain.labels is None and plain.series[0].tolist() == [[1, 3], [2, 4]]
    text = _toy_ts(["1,2:3,4:0.5", "1,2:3,4:-2"], labels=False, extra=["@targetLabel true"])[0]
    regression = read_ts(_write(tmp_path / "R.ts", text))
    assert regression.labels.tolist() == [0.5, -2.0] and regression.labels.dtype == np.float64


_OK = "1,2:3,4:up"
_NUL, _TARGETS = "NUL bytes: a binary or UTF-16 file, not .ts text", ["@targetLabel true"]
_LATIN1 = _toy_ts([_OK, "1,2:3,4:caf\xe9"], labels="up caf\xe9")[0].encode("latin-1")
_REGRESSION = "this file holds regression targets (@targetLabel true), not class labels"
_UEA_BAD_FILES = [  # (rows or the file's bytes, _toy_ts options, data row or tag or None, what)
    ([_OK, "1,2:3,4:5,6:up"], {}, 1, "3 dimension(s), not 2 (the header)"),
    ([_OK, "1,2:up"], dict(dims=None), 1, "1 dimension(s), not 2 (case 1)"),
    (["1,2:3,4:up"], dict(dims=None, extra=["@univariate true"]), 0, "2 dimension(s), not 1 (the"),
    ([_OK, "1,2:3,4:left"], {}, 1, "unknown class label 'left'; @classLabel lists ['up', 'down']"),
    ([_OK, "1,2:3,4:?"], {}, 1, "unknown class label '?'"),  # '?' marks missing values, not labels
    # a data line without its class label: the last field is read as the label
    ([_OK, "1,2:3,4"], {}, 1, "the class label is missing ('3,4' holds values)"),
    (["1,2:3,4"], dict(dims=None), 0, "the class label is missing ('3,4' holds values)"),
    ([_OK, "1:3"], {}, 1, "the class label is missing ('3' holds values)"),
    ([_OK, "1,2:3,4:"], {}, 1, "the class label is missing (the line ends in ':')"),
    # numeric labels: a lone number that is no class, on a case one dimension short, is a value
    (["1:3:1", "1:3"], dict(labels="1 2"), 1, "the class label is missing ('3' holds values)"),
    (["1:3:1", "1:+3e0"], dict(labels="1 2"), 1, "is missing ('+3e0' holds values)"),  # e, +
    (["1:3:1", "1:2"], dict(labels="1 2"), 1, "1 dimension(s), not 2 (the header)"),
    (["1:3:2:1", "1:5"], dict(dims="3", labels="1 2"), 1, "1 dimension(s), not 3 (the header)"),
    ([_OK, "up"], {}, 1, "a case needs values before its label"),
    (["1,x:3,4:up"], {}, 0, "non-numeric value 'x' (dimension 1, step 2)"),
    (["1, 2\x1f:3,4:up"], {}, 0, "non-numeric value ' 2\\x1f' (dimension 1, step 2)"),  # a control
    (["1,2:3,4:0.5", "1,2:3,4:abc"], dict(labels=False, extra=_TARGETS), 1, "non-numeric target"),
    (["1,2:3,4:0.5", "1,2:3,4"], dict(labels=False, extra=_TARGETS), 1, "the target value is"),
    ([_OK, "1,2,3:3,4:up"], {}, 1, "channels of different lengths [2, 3] in one case"),
    (["1,2:?,?:up"], {}, 0, "dimension 2 has no values (all missing)"),
    ([_OK, "1:3:up"], dict(equal="true", length=2), 1, "length 1, but @seriesLength 2"),
    ([_OK, "1,2,3:3,4,5:up"], dict(equal="true", length=2), 1, "length 3, but @seriesLength 2"),
    ([_OK, "1,inf:3,4:up"], {}, 1, "infinite value in dimension 1 (step 2): 'inf'"),
    ([_OK, "1,2:3,-inf:up"], {}, 1, "infinite value in dimension 2 (step 2): '-inf'"),
    ([_OK, "1,1e300:3,4:up"], {}, 1, "the value 1e300 in dimension 1 (step 2) overflows float32"),
    (["1,2:-1e39,4:up"], {}, 0, "the value -1e39 in dimension 2 (step 1) overflows float32"),
    ([_OK], dict(extra=["@timeStamps true"]), "@timeStamps true", "timestamps not supported"),
    ([_OK], dict(extra=["@colour blue"]), "@colour", "unknown header tag @colour"),
    ([_OK], dict(labels=""), "@classLabel", "@classLabel true lists no labels"),
    ([_OK], dict(labels="up down up"), "@classLabel", "@classLabel repeats a label"),
    ([_OK], dict(extra=["@classLabel maybe"]), "@classLabel maybe", "must be 'true <labels"),
    ([_OK], dict(extra=["@dimensions two"]), "@dimensions two", "@dimensions must be a positive"),
    ([_OK], dict(extra=["@dimensions 2x"]), "@dimensions 2x", "@dimensions must be a positive"),
    ([_OK], dict(extra=["@dimensions \u00b22"]), "@dimensions", "@dimensions must be a positive"),
    ([_OK], dict(extra=["@seriesLength 0"]), "@seriesLength", "@serieslength must be a positive"),
    *[
        ([_OK], dict(extra=[f"@{tag} maybe"]), f"@{tag} maybe", f"@{tag.lower()} must be true or")
        for tag in ("timeStamps", "missing", "univariate", "equalLength", "targetLabel")
    ],
    ([_OK], dict(extra=["@data now"]), "@data now", "@data must have no value, got 'now'"),
    (b"@problemName X\n@classLabel true a b\n", None, None, "no @data line (is this a .ts file?)"),
    ([], {}, None, "no cases after @data"),
    (b"", None, None, "empty file"),
    (b"@\n@data\n1:up\n", None, "@", "no tag right after '@' (as in @data)"),  # "@" alone
    # white space, of any kind, between "@" and the tag: no tag (the official loader reads none)
    *[
        (f"@classLabel true up\n@{space}data\n1:up\n".encode(), None, 1, "no tag right")  # line 2
        for space in (" ", "\t", "\x85", "\xa0", "\x0c")
    ],
    # a byte-order mark after the file's start, on a tag or a case (a BOM first is read: below)
    (b"@classLabel true up\n\xef\xbb\xbf@data\n1:up\n", None, 1, "a byte-order mark inside"),
    (b"@classLabel true up\n@data\n1:up\n\xef\xbb\xbf2:up\n", None, 3, "a byte-order mark in"),
    (b"  \n\n \t\n", None, None, "empty file"),
    (b"PK\x03\x04\x14\x00\x00\x00\x08\x00zip", None, None, _NUL),
    (_toy_ts([_OK])[0].encode("utf-16"), None, None, _NUL),
    # latin-1 bytes in a label (not a comment): refused at the first line that holds one
    (_LATIN1, None, "@classLabel", "bytes that are not UTF-8 text (a binary file?)"),
    (_toy_ts([_OK, "5,6:7,8\xe9:up"])[0].encode("latin-1"), None, "5,6", "bytes that are not UTF"),
    ([_OK], dict(labels=None), None, "this file has no labels (@classLabel false); a classif"),
    ([_OK], dict(labels=False), None, "this file has no labels (no @classLabel line); a class"),
    (["1,2:3,4:0.5"], dict(labels=False, extra=_TARGETS), None, _REGRESSION),
]


@pytest.mark.parametrize("rows, options, where, what", _UEA_BAD_FILES)
def test_uea_data_reader_errors_name_file_line_and_problem(rows, options, where, what, tmp_path):
    """Every malformed input raises TsFormatError 'path:line: what', naming the real fault; a
    fault of the whole file (empty, binary, no labels, no @data) names the file alone."""
    content, n_header = (rows, 0) if isinstance(rows, bytes) else _toy_ts(rows, **options)
    lines = (content.decode("latin-1") if isinstance(content, bytes) else content).splitlines()
    line = n_header + 1 + where if isinstance(where, int) else None
    if isinstance(where, str):
        line = 1 + next(i for i, ln in enumerate(lines) if ln.startswith(where))
    path = _write(tmp_path / "Bad_TRAIN.ts", content)
    with pytest.raises(TsFormatError) as err:  # the "this file ..." faults: a labelled file
        read_ts(path, require_labels="this file" in what)
    assert str(err.value).startswith(f"{path}:{line}: " if line else f"{path}: "), str(err.value)
    assert what in str(err.value) and "\n" not in str(err.value)
    assert err.value.path == str(path) and err.value.line_no == line


# ----------------------------------------------------------------------------------------------
# every reader, fuzzed: a seeded mutant of a valid input is read exactly as a plain reading of
# the same bytes here reads it, or refused in one sentence naming a path under its folder

FUZZ_MUTANTS = int(os.environ.get("FUZZ_MUTANTS", "200"))  # per reader; more for a long run
_FUZZ_BYTES = [b"\t", b"\n", b"\r", b'"', b"\xc2\xb2", b"\xe9", b"\0", b"?", b":", b",", b"#"]
_FUZZ_BYTES += [b" ", b"\x0c", b"\xc2\x85", b"\xef\xbb\xbf", b"]", b"(", b"9", b"-", b".", b"1"]
_FUZZ_BYTES += [b"\x1f", b"\xc2\xa0", b"\x0b", b"\xe2\x80\x83", b"\x1c"]  # str.strip's space
_FUZZ_FIELDS = [b"\xc2\xb2", b"", b"10", b"-1", b"0.5", b"?", b"1e0", b"nan", b"\xe9", b'"', b"X"]


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def _mutate(path: pathlib.Path, rng: np.random.Generator) -> None:
    """1 to 3 seeded changes: a bit flipped, bytes inserted, deleted or cut, re-encoded, other line
    ends, a field replaced, a byte-order mark."""
    data = path.read_bytes()
    for _ in range(int(rng.integers(1, 4))):
        i, kind = int(rng.integers(len(data) + 1)), int(rng.integers(10))
        if kind == 0 and i < len(data):
            data = data[:i] + bytes([data[i] ^ (1 << int(rng.integers(8)))]) + data[i + 1 :]
        elif kind in (1, 2):
            new = rng.bytes(int(rng.integers(1, 4))) if kind == 1 else _pick(rng, _FUZZ_BYTES)
            data = data[:i] + new + data[i:]
        elif kind in (3, 4):  # delete 1 to 4 bytes, or all from i on
            data = data[:i] + data[i + int(rng.integers(1, 5)) :] if kind == 3 else data[:i]
        elif kind == 5:
            text = data.decode("utf-8", "replace")
            data = text.encode(_pick(rng, ["latin-1", "utf-16"]), "replace")
        elif kind == 6:
            data = data.replace(*_pick(rng, [(b"\r\n", b"\n"), (b"\n", b"\r\n"), (b"\n", b"\r")]))
        elif kind in (7, 8):  # fields: between tabs, commas, colons, line ends
            tokens = re.split(rb"([\t\n,:])", data)
            tokens[2 * int(rng.integers((len(tokens) + 1) // 2))] = _pick(rng, _FUZZ_FIELDS)
            data = b"".join(tokens)
        else:
            data = b"\xef\xbb\xbf" + data
    path.write_bytes(data)


def _odd_entry(path: pathlib.Path, rng: np.random.Generator) -> None:
    """Beside or instead of the file path: an AppleDouble file, a folder named like a file, a
    link to a file or to nothing."""
    kind, folder, name = int(rng.integers(5)), path.parent, path.name
    if kind == 0:
        _write(folder / f"._{name}", b"\0\x05\x16\x07\0\x02\0\0Mac OS X" + rng.bytes(20))
    elif kind in (1, 2):  # 1: a folder beside the file; 2: the file replaced by a folder
        if kind == 2:
            path.unlink()
        (folder / (name if kind == 2 else f"9{name}")).mkdir()
    else:
        (folder / f"8{name}").symlink_to(path if kind == 3 else folder / "nothing")


def _cifar_change(file: pathlib.Path, rng: np.random.Generator) -> None:
    """A batch's labels (container, dtype, shape, a value) or data (dtype, shape, count)."""
    batch, kind = pickle.loads(file.read_bytes(), encoding="bytes"), int(rng.integers(5))
    data, labels = batch[b"data"], batch[b"labels"]
    if kind == 0:
        dtype = _pick(rng, [np.int8, np.uint8, np.int64, np.float32, np.float64, bool])
        labels = np.array(labels, dtype).reshape(_pick(rng, [(-1,), (-1, 1), (1, -1)]))
    elif kind == 1:
        labels[rng.integers(5)] = _pick(rng, [10, -1, 2.5, 3.0, "3", None, True, 2**70])
    elif kind == 2:
        data = data.astype(_pick(rng, [np.int16, np.float32, np.int64]))
    elif kind == 3:
        data = data.reshape(_pick(rng, [(5, 32, 32, 3), (5, 3, 1024), (15, 1024), (1, 15360)]))
    else:
        data = data[: rng.integers(5)]  # fewer images than labels, or none
    file.write_bytes(pickle.dumps({b"data": data, b"labels": labels}))


def _pickle_change(path: pathlib.Path, rng: np.random.Generator) -> None:
    """An item's ids or label: another value, container, dtype or shape."""
    items = pickle.loads(path.read_bytes())
    values = [10, -1, 2.5, 3.0, "1", None, [1], np.int8(1), True, 2**70, np.nan, [3, 0], [[1, 2]]]
    values += [np.arange(3).astype(_pick(rng, [np.float32, np.uint8, np.int16, str, object]))]
    _pick(rng, items)[_pick(rng, ["input_ids_0", "label"])] = _pick(rng, values)
    path.write_bytes(pickle.dumps(items))


def _split_rows(split: lra_data.Split) -> list:
    """A Split as [(ids, label)] or [(ids, ids2, label)], real tokens only."""
    docs = [(split.x, split.lengths)]
    if split.x2 is not None:
        docs.append((split.x2, split.lengths2))
    rows = [[tuple(x[i, : n[i]].tolist()) for x, n in docs] for i in range(len(split.y))]
    return [(*row, int(y)) for row, y in zip(rows, split.y, strict=True)]


def _whole(value, high: int) -> int:
    """One label or id read plainly: a number (int, bool, float, numpy's), whole, 0..high-1."""
    assert isinstance(value, (int, float, np.bool_, np.integer, np.floating))
    assert float(value).is_integer() and 0 <= value < high
    return int(value)


def _listops_by_hand(f: pathlib.Path) -> list:
    """Strict UTF-8, lines on \\n (a \\r before it dropped), the header, then expression TAB
    digit; parentheses dropped, words by the vocabulary ("]" as "X", 16 else)."""
    vocabulary = {**{str(d): d + 1 for d in range(10)}, "[MIN": 11, "[MAX": 12, "[MED": 13}
    vocabulary |= {"[SM": 14, "X": 15}
    text = (f / "basic_val.tsv").read_bytes().decode("utf-8")
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    assert lines[0] == "Source\tTarget"
    rows = []
    for line in filter(None, lines[1:]):
        expression, label = line.split("\t")
        assert re.fullmatch("[0-9]", label)
        words = expression.replace("(", "").replace(")", "").split()
        rows.append(([vocabulary.get(w.replace("]", "X"), 16) for w in words], int(label)))
    return [(tuple(ids[:60]), label) for ids, label in rows if ids]


def _aan_by_hand(f: pathlib.Path) -> list:
    """Bytes, lines on \\n (a \\r before it dropped), 5 tab-separated fields, the label a number
    0 or 1, each text cut to 10000 bytes, ids bytes + 1."""
    rows = []
    for line in (f / "tsv_data/new_aan_pairs.train.tsv").read_bytes().split(b"\n"):
        fields = line.removesuffix(b"\r").split(b"\t")
        if fields != [b""]:
            label, _, _, text1, text2 = fields
            assert float(label) in (0, 1)
            ids = [tuple(byte + 1 for byte in text[:10000][:4]) for text in (text1, text2)]
            rows.append((*ids, int(float(label))))
    return [row for row in rows if row[0] and row[1]]


def _imdb_by_hand(f: pathlib.Path) -> tuple:
    """<split>/{neg,pos}/*.txt not starting with '.', in name order, stripped of ASCII
    whitespace, ids bytes + 1 -> ({train, test: [(ids, label)]}, the files read)."""
    splits, read = {"train": [], "test": []}, []
    for split, (label, polarity) in itertools.product(splits, enumerate(("neg", "pos"))):
        names = sorted(os.listdir(f / "aclImdb" / split / polarity))
        names = [name for name in names if name.endswith(".txt") and name[0] != "."]
        paths = [f / "aclImdb" / split / polarity / name for name in names]
        texts, read = [path.read_bytes().strip() for path in paths], read + list(map(str, paths))
        splits[split] += [(tuple(byte + 1 for byte in t[:6]), label) for t in texts if t]
    return splits, read


def _cifar_by_hand(f: pathlib.Path) -> dict:
    """Each batch read plainly (a dict, data uint8 (n, 3072), n labels 0..9 in a list or an
    array (n,) or (n, 1)), written again in the plain form (a list of ints), then read."""
    for file in sorted(f.iterdir()):
        # pickle._loads, the Python unpickler: the C one's memo grows to any index a damaged
        # file names (2³¹ slots, 16 GB zeroed, for one flipped bit)
        batch = pickle._loads(file.read_bytes(), encoding="bytes")
        data, labels = batch[b"data"], batch[b"labels"]
        assert isinstance(data, np.ndarray) and data.dtype == np.uint8 and len(data)
        if isinstance(labels, np.ndarray):
            assert labels.shape in ((len(data),), (len(data), 1))
            labels = list(labels.reshape(-1))
        assert data.shape == (len(data), 3072) and len(labels) == len(data)
        plain = {b"data": data, b"labels": [_whole(label, 10) for label in labels]}
        _write(f.parent / f"{f.name}-plain" / file.name, pickle.dumps(plain))
    return _FUZZ_READ["cifar"](f.parent / f"{f.name}-plain")


_PATHFINDER_IMAGES = {}  # path -> image (None: empty), as _lra_pathfinder wrote them


def _pathfinder_by_hand(f: pathlib.Path) -> list:
    """metadata/*.npy (no '.' first), strict UTF-8 lines, blank skipped, unended left out, naming
    images written here; in TFDS order (MD5), cut at 80 % and 90 %; empty PNGs then dropped."""
    folder, lines = f / lra_data.PATH_HARD, []
    metas = sorted(p for p in (folder / "metadata").iterdir() if p.name[0] != ".")
    for meta in [p for p in metas if p.name.endswith(".npy")]:
        text = meta.read_bytes().decode("utf-8")
        for n, line in enumerate(text.split("\n")[:-1], start=1):
            if line.strip():
                f0, f1, _, label = line.split(" ")[:4]
                assert label in ("0", "1") and os.path.isfile(folder / f0 / f1)
                empty = os.path.getsize(folder / f0 / f1) == 0  # a file of 0 bytes: no image
                image = None if empty else _PATHFINDER_IMAGES[str(folder / f0 / f1)]
                lines.append((f"{f0}_{f1}_{n}", image, int(label)))
    order = sorted(lines, key=lambda line: hashlib.md5(f"hard{line[0]}".encode()).hexdigest())
    cuts = [0, round(len(order) * 80 / 100), round(len(order) * 90 / 100), len(order)]
    parts = [order[a:b] for a, b in itertools.pairwise(cuts)]
    return [[(tuple(i.reshape(-1).tolist()), y) for _, i, y in p if i is not None] for p in parts]


def _pickle_by_hand(f: pathlib.Path) -> list:
    """A ListOps pickle read plainly: input_ids_0 a row of whole numbers 0..16, cut to 4, zeros at
    its end padding; label a whole number 0..9 (or a row of one)."""
    rows = []
    for item in pickle._loads((f / "listops.train.pickle").read_bytes()):  # as _cifar_by_hand
        ids, (label,) = item["input_ids_0"], np.ravel(item["label"])
        assert np.ndim(ids) == 1
        row = [_whole(value, 17) for value in ids][:4]
        while row and row[-1] == 0:
            row.pop()
        rows.append((tuple(row), _whole(label, 10)))
    return [row for row in rows if row[0]]


def _imdb_read(f: pathlib.Path) -> tuple:
    splits = lra_readers.read_imdb(f / "aclImdb", 6)[0]
    read = list(map(str, lra_data._release_files("text", f / "aclImdb")))  # the cache's key
    return {name: _split_rows(splits[name]) for name in ("train", "test")}, read


def _ts_listed(cases: list, labels: list) -> list:
    return [(case.tolist(), label) for case, label in zip(cases, labels, strict=True)]


def _ts_read(path: pathlib.Path) -> list:
    ts = read_ts(path, require_labels=True)
    return _ts_listed(ts.series, [ts.class_names[y] for y in ts.labels])


_TS = _toy_ts(["1,2,3:4,5,6:down", "7,8:1.5,-2:up", "# note", "0.5,?,2,?:?,3,4,5:up"])[0]
_PF, _ITEMS = lra_data.PATH_HARD, [dict(input_ids_0=[5, 6, 0, 7, 0], label=i) for i in range(3)]
_PF_ODD = [f"{_PF}/metadata/0.npy", f"{_PF}/imgs/0/sample_0.png"]  # mutated, an odd entry beside
_FUZZ = {  # reader -> (files mutated, files for an odd entry, objects changed, read by hand)
    "listops": (["basic_val.tsv"], [], None, _listops_by_hand),
    "aan": (["tsv_data/new_aan_pairs.train.tsv"], [], None, _aan_by_hand),
    "imdb": (["aclImdb/train/neg/1_7.txt"], ["aclImdb/test/pos/0_7.txt"], None, _imdb_by_hand),
    "cifar": (["data_batch_2"], [], _cifar_change, _cifar_by_hand),
    "pathfinder": (_PF_ODD, _PF_ODD, None, _pathfinder_by_hand),
    "pickle": (["listops.train.pickle"], [], _pickle_change, _pickle_by_hand),
    "uea": (["Toy_TRAIN.ts"], [], None, lambda f: _ts_listed(*_ts_by_hand(f / "Toy_TRAIN.ts"))),
}
_FUZZ_WRITE = {  # a valid input, written by the helpers of the table-driven tests
    "listops": lambda f: listops.write(f, dict(_LRA_TINY_LISTOPS, seed=0), False),
    "aan": _lra_aan,
    "imdb": lambda f: _lra_imdb(f, {"neg": ["bad film", " dull\r\n"], "pos": ["good", "fine"]}),
    "cifar": _lra_cifar,
    "pathfinder": lambda f: _lra_pathfinder(f / _PF, 22, images=_PATHFINDER_IMAGES),
    "pickle": lambda f: _lra_pickles(f, "listops", _ITEMS),
    "uea": lambda f: _write(f / "Toy_TRAIN.ts", _TS),
}
_FUZZ_READ = {  # the reader's result, in the terms of the plain readings
    "listops": lambda f: _split_rows(lra_readers.read_listops_tsv(f / "basic_val.tsv", 60)[0]),
    "aan": lambda f: _split_rows(
        lra_readers.read_aan_tsv(f / "tsv_data/new_aan_pairs.train.tsv", 4)[0]
    ),
    "imdb": _imdb_read,
    "cifar": lambda f: {n: _split_rows(s) for n, s in lra_readers.read_cifar(f, 1024).items()},
    "pathfinder": lambda f: [
        _split_rows(s) for s in lra_readers.read_pathfinder(f / _PF, 16)[0].values()
    ],
    "pickle": lambda f: _split_rows(
        lra_readers.read_lra_pickle(f / "listops.train.pickle", "listops", 4)[0]
    ),
    "uea": lambda f: _ts_read(f / "Toy_TRAIN.ts"),
}


@pytest.mark.parametrize("reader", _FUZZ)
def test_readers_fuzzed_read_as_by_hand_or_refuse_in_one_sentence(reader, tmp_path):
    """FUZZ_MUTANTS seeded mutants: read as the plain reading here, or its module's error, one
    line naming a path under the mutant's folder; nothing else (pytest -s shows the counts)."""
    files, odd, change, by_hand = _FUZZ[reader]
    outcomes = collections.Counter()
    for seed in range(FUZZ_MUTANTS):
        folder, rng = tmp_path / str(seed), np.random.default_rng(seed)
        _FUZZ_WRITE[reader](folder)
        kind = int(rng.integers(3))
        if kind == 0 and odd:
            _odd_entry(folder / _pick(rng, odd), rng)
        elif kind == 1 and change is not None:
            change(folder / files[0], rng)
        else:
            _mutate(folder / _pick(rng, files), rng)
        try:
            got = _FUZZ_READ[reader](folder)
        except (lra_data.DataError, TsFormatError) as e:
            assert str(folder) in str(e) and "\n" not in str(e), (seed, str(e))
            try:  # counted apart: refused by the reader alone (stricter than by hand)
                by_hand(folder)
                outcomes["refused, read by hand"] += 1
            except Exception:
                outcomes["refused"] += 1
            continue
        except Exception as e:  # never another exception
            pytest.fail(f"{reader}, seed {seed}: {e!r}")
        try:
            want = by_hand(folder)
        except Exception as e:  # the plain reading refuses: a silent misreading
            want = f"refused by hand ({e!r})"
        assert got == want, (reader, seed)
        outcomes["read as by hand"] += 1
    print(reader, dict(outcomes))
    assert outcomes["read as by hand"] and outcomes["refused"]


# ----------------------------------------------------------------------------------------------
# load_uea: labels, statistics, padding


def test_uea_data_classes_follow_train_header_order_and_notes_say_what_is_certain(tmp_path):
    """TEST listing its classes in another order: each case gets its class's TRAIN index. A class
    TRAIN's header lacks: an error; one it lists but never uses: a note; so is a one-class TRAIN."""
    train_words = ["up", "down", "flat", "flat", "up", "down"]
    test_words = ["flat", "up", "down", "down", "flat", "up", "up"]
    rng = np.random.default_rng(0)
    train, test = dict(labels="up down flat"), dict(labels="flat down up")
    folder = _dataset(tmp_path, _rows(rng, train_words), _rows(rng, test_words), train, test)
    data = load_uea(str(tmp_path), "Toy")
    assert data.class_names == ["up", "down", "flat"] and data.notes == []
    assert data.y_test.tolist() == [["up", "down", "flat"].index(w) for w in test_words]
    assert data.y_train.tolist() == [["up", "down", "flat"].index(w) for w in train_words]
    assert read_ts(folder / "Toy_TEST.ts").labels.tolist() == [0, 2, 1, 1, 0, 2, 2]  # own order
    # a TEST class that TRAIN's header lacks: the model would have no output for it, an error
    test = dict(labels="flat sideways")
    _dataset(tmp_path, _rows(rng, train_words), _rows(rng, ["flat", "sideways"]), train, test)
    with pytest.raises(TsFormatError, match=r"Toy_TEST.ts: classes \['sideways'\] not in TRAIN"):
        load_uea(str(tmp_path), "Toy")
    # TRAIN lists 'flat' but has no such case: y_test indexes TRAIN's header, an output never taught
    _dataset(tmp_path, _rows(rng, ["up", "down"]), _rows(rng, ["flat", "up", "flat"]), train, train)
    data = load_uea(str(tmp_path), "Toy")
    assert data.y_test.tolist() == [2, 0, 2] and len(data.class_names) == 3  # an output for 2
    assert data.notes == [
        "classes ['flat'] occur only in TEST (2 of 3 TEST cases): TRAIN's @classLabel lists them, "
        "so the model has an output for them, but no TRAIN case to learn them from: whatever it "
        "gets right of those cases, it gets right by chance"
    ]
    one = "TRAIN holds one class only ('down'): the model can learn nothing but to predict it"
    _dataset(tmp_path, _rows(rng, ["down", "down"]), _rows(rng, ["up", "down"]))
    [first, only_test] = load_uea(str(tmp_path), "Toy").notes
    assert first == one and only_test.startswith("classes ['up'] occur only in TEST (1 of 2")
    _dataset(tmp_path, _rows(rng, ["down", "down"]), _rows(rng, ["down"]))  # TEST: TRAIN's class
    assert load_uea(str(tmp_path), "Toy").notes == [one]


def test_uea_data_standardisation_uses_train_statistics_and_centres_constant_channels(tmp_path):
    """TRAIN statistics (ddof 1, over all steps) standardise both files; TEST changes none. A
    channel constant in TRAIN is centred, not divided by ~0, and said; one TRAIN step: finite."""
    rng = np.random.default_rng(1)
    train_a, test_a = rng.normal(3, 2, size=(4, 5)), rng.normal(3, 2, size=(3, 5))
    train_rows = [_row(a, [0.0] * 5, label="up") for a in train_a]  # channel 2 constant 0
    test_b = np.array([[0.1, 4.0, -2.5, 0.1, 7.0], [0.0] * 5, [1e3, 0, 0, 0, 0]])
    mean, std = train_a.mean(), train_a.std(ddof=1)
    for k in (1, 10):  # TEST values x 10: the same statistics and TRAIN arrays
        test_rows = [_row(k * a, b, label="up") for a, b in zip(test_a, test_b, strict=True)]
        _dataset(tmp_path, train_rows, test_rows)
        data = load_uea(str(tmp_path), "Toy")
        np.testing.assert_allclose([data.mean, data.std], [[mean, 0], [std, 0]], rtol=1e-6)
        np.testing.assert_allclose(data.x_train[:, :, 0], (train_a - mean) / std, rtol=1e-5)
        np.testing.assert_allclose(data.x_train[:, :, 1], 0, atol=1e-6)
        x_test = data.x_test.astype(np.float64)
        np.testing.assert_allclose(x_test[:, :, 0], (k * test_a - mean) / std, rtol=1e-5)
        np.testing.assert_allclose(x_test[:, :, 1], test_b, atol=1e-5)  # constant: value - mean
    assert data.constant_channels == [1] and [n for n in data.notes if "constant" in n] == [
        "channels [1] are constant in TRAIN: centred, not scaled (0-based indices; dividing by "
        "their std of ~0 would blow TEST values up)"
    ]
    # a constant channel at a large level (rounding noise in its mean) is caught as well
    big = [_row(a, [123456.789] * 5, label="up") for a in train_a]
    _dataset(tmp_path, big, [_row(test_a[0], [123457.789] * 5, label="up")])
    data = load_uea(str(tmp_path), "Toy")
    assert data.constant_channels == [1]
    np.testing.assert_allclose(data.x_test[0, :, 1], 1.0, rtol=1e-3)
    # one TRAIN case: its steps give the statistics
    test_rows = [_row([1, 2, 3], [4, 5, 6], label="up")]
    _dataset(tmp_path, [_row([0, 2, 4, 6], [1, 1, 1, 1], label="up")], test_rows)
    data, std = load_uea(str(tmp_path), "Toy"), np.std([0, 2, 4, 6], ddof=1)
    np.testing.assert_allclose([data.mean, data.std], [[3, 1], [std, 0]])
    assert data.constant_channels == [1] and tuple(data.x_test.shape) == (1, 4, 2)
    expected = np.c_[(np.array([1, 2, 3]) - 3) / std, [3, 4, 5]]
    np.testing.assert_allclose(data.x_test[0, :3], expected, rtol=1e-6)
    _dataset(tmp_path, [_row([2], [5], label="up")], test_rows)  # one case of one time step
    with warnings.catch_warnings():  # no 'degrees of freedom <= 0' NaN on the way
        warnings.simplefilter("error")
        data = load_uea(str(tmp_path), "Toy")
    assert data.std.tolist() == [0, 0] and data.constant_channels == [0, 1]
    assert tuple(data.x_test.shape) == (1, 1, 2) and data.n_clipped_test == 1
    np.testing.assert_array_equal(data.x_test[0, 0], [-1, -1])  # clipped, centred
    # two TRAIN steps in all (two cases of one step): ddof 1 still, std = |5 - 1| / √2
    _dataset(tmp_path, [_row([1], [0], label="up"), _row([5], [0], label="up")], test_rows)
    data = load_uea(str(tmp_path), "Toy")
    np.testing.assert_allclose(data.std, [np.std([1, 5], ddof=1), 0])


def test_uea_data_a_univariate_series_has_its_missing_values_filled(tmp_path):
    """One dimension: '?' is interpolated over time, the ends take the nearest value, as in each
    channel of a multivariate file."""
    text, _ = _toy_ts(["1.0,?,3.0:up", "?,2.0:down"], dims="1")
    ts = read_ts(_write(tmp_path / "Uni.ts", text))
    assert [s[:, 0].tolist() for s in ts.series] == [[1.0, 2.0, 3.0], [2.0, 2.0]]


def test_uea_data_pad_series_and_load_with_bad_arguments_and_mismatched_files(tmp_path):
    """Bad max_len, dimension counts, label headers, values that overflow float32 once
    standardised: clear errors naming the file (and line); pad_series' values and checks."""
    rows = [_row([1, 2, 3], [4, 5, 7], label="up"), _row([3, 2, 0], [1, 5, 4], label="down")]
    _dataset(tmp_path, rows, rows)
    for bad in (-1, 2.5, "3", True):
        with pytest.raises(ValueError, match=r"max_len must be a positive integer \(or 0"):
            load_uea(str(tmp_path), "Toy", max_len=bad)
    assert load_uea(str(tmp_path), "Toy", max_len=np.int64(2)).x_train.shape == (2, 2, 2)
    _dataset(tmp_path, rows, [_row([1, 2], [3, 4], [5, 6], label="up")], test=dict(dims="3"))
    with pytest.raises(TsFormatError, match="Toy_TEST.ts: 3 dimensions, TRAIN has 2"):
        load_uea(str(tmp_path), "Toy")
    _dataset(tmp_path, rows, [_row([1, 2], label="up")], test=dict(dims="1"))  # fewer too
    with pytest.raises(TsFormatError, match="Toy_TEST.ts: 1 dimensions, TRAIN has 2"):
        load_uea(str(tmp_path), "Toy")
    _dataset(tmp_path, rows, ["1,2:3,4"], test=dict(labels=None))  # read with require_labels
    with pytest.raises(TsFormatError, match=r"Toy_TEST.ts: this file has no labels"):
        load_uea(str(tmp_path), "Toy")
    # TRAIN channel 1 varies by 1e-9 around 1 (std ~5e-10); a TEST value of 1e30 on it
    train = [_row([1, 1 + 1e-9, 1], [1, 2, 3], label="up"), _row([1, 1], [2, 2], label="down")]
    folder = _dataset(tmp_path, train, ["1,1:1,1:up", "1,1e30:1,1:down"])
    with pytest.raises(TsFormatError) as err:
        load_uea(str(tmp_path), "Toy")
    message, line = str(err.value), _toy_ts([])[1] + 2
    assert message.startswith(f"{folder / 'Toy_TEST.ts'}:{line}: dimension 1 standardised with")
    assert message.endswith("overflows float32")
    # pad_series: (x - mean) / std, zero padding, clipping, a mask of the lengths
    series = [np.array([[1.0, 10], [3, 30]]), np.array([[5.0, 50], [7, 70], [9, 90]])]
    mean, std = np.array([1.0, 10]), np.array([2.0, 20])
    x, mask = pad_series(series, mean, std, 4)
    assert x.tolist() == [[[0, 0], [1, 1], [0, 0], [0, 0]], [[2, 2], [3, 3], [4, 4], [0, 0]]]
    assert type(x) is np.ndarray and x.dtype == np.float32 and mask.dtype == np.bool_
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
    x, mask = pad_series(series, mean, std, 2)  # clipped
    assert x.shape == (2, 2, 2) and mask.all() and x[1, 1].tolist() == [3, 3]
    for args, what in [
        ((series, mean, std, 0), r"max_len must be a positive integer \(or 0 in load_uea\), got 0"),
        ((series, mean, std, 2.0), "max_len must be a positive integer"),
        ((series, mean, np.array([2.0, 0]), 3), r"need finite mean and positive std of shape \(F"),
        ((series, mean, np.array([2.0, np.nan]), 3), "positive std"),
        ((series, np.array([np.inf, 0]), std, 3), "finite mean"),
        ((series, mean, np.array([2.0, np.inf]), 3), "finite mean and positive std"),
        ((series, mean, np.array([2.0]), 3), "of shape \\(F,\\)"),
        ((series + [np.ones((2, 3))], mean, std, 3), r"cases \[2\] are not \(L, F\) arrays"),
        ((series + [np.ones(3)], mean, std, 3), r"cases \[2\] are not \(L, F\) arrays"),
    ]:
        with pytest.raises(ValueError, match=what):
            pad_series(*args)


def _ts_by_hand(path: pathlib.Path) -> tuple:
    """An independent .ts reading: text-mode lines, blank and '#' skipped; after @data, cases
    'v,v:v,v:label', '?' filled linearly in time (ends: nearest) -> ((L, F) arrays, labels)."""
    text = path.read_bytes().decode("utf-8", "replace").removeprefix("\ufeff")
    lines = [line.strip() for line in re.split("\r\n|\r|\n", text)]
    lines = [line for line in lines if line and line[0] != "#"]
    cases, labels = [], []
    for line in lines[[line.lower() for line in lines].index("@data") + 1 :]:
        *channels, label = line.split(":")
        values = [
            [np.nan if v.strip() == "?" else float(v) for v in c.split(",")] for c in channels
        ]
        cases.append(np.array(values).T)  # (L, F); a ragged case fails here
        for c, steps in enumerate(cases[-1].T):
            known = np.flatnonzero(~np.isnan(steps))
            cases[-1][:, c] = np.interp(np.arange(len(steps)), known, steps[known])
        labels.append(label.strip())
    return cases, labels


def test_uea_data_real_files_equal_an_independent_reading():
    """JapaneseVowels read by hand here, standardised with TRAIN statistics (ddof 1), padded to 26
    and clipped == load_uea's arrays; BasicMotions' word labels map to @classLabel order."""
    folder = _real_uea("JapaneseVowels")
    data = load_uea(str(UEA_DIR), "JapaneseVowels")
    train, train_labels = _ts_by_hand(folder / "JapaneseVowels_TRAIN.ts")
    test, test_labels = _ts_by_hand(folder / "JapaneseVowels_TEST.ts")
    assert (len(train), len(test)) == (270, 370) and data.class_names == list("123456789")
    lengths = [len(c) for c in train], [len(c) for c in test]
    assert (min(lengths[0]), max(lengths[0]), min(lengths[1]), max(lengths[1])) == (7, 26, 7, 29)
    mean, std = np.concatenate(train).mean(0), np.concatenate(train).std(0, ddof=1)
    pairs = ((train, data.x_train, data.mask_train), (test, data.x_test, data.mask_test))
    for cases, x, mask in pairs:
        expected = np.zeros((len(cases), 26, 12))
        for i, case in enumerate(cases):
            expected[i, : len(case)] = ((case - mean) / std)[:26]
        np.testing.assert_allclose(x, expected, rtol=1e-5, atol=1e-5)
        assert mask.sum(1).tolist() == [min(len(c), 26) for c in cases]  # clipped, as mvts
        assert np.array_equal(mask, np.arange(26) < mask.sum(1)[:, None])  # real steps first
    assert data.y_train.tolist() == [int(k) - 1 for k in train_labels]  # labels '1'..'9'
    assert data.y_test.tolist() == [int(k) - 1 for k in test_labels]
    assert np.bincount(data.y_train).tolist() == [30] * 9 and data.constant_channels == []
    assert (data.n_clipped_train, data.n_clipped_test) == (0, sum(n > 26 for n in lengths[1]))
    path = _real_uea("BasicMotions") / "BasicMotions_TRAIN.ts"
    ts, (cases, words) = read_ts(path), _ts_by_hand(path)
    assert ts.class_names == ["Standing", "Running", "Walking", "Badminton"]  # Standing = 0
    assert [ts.class_names[k] for k in ts.labels] == words
    assert {s.shape for s in ts.series} == {(100, 6)} and len(ts.series) == 40
    np.testing.assert_array_equal(ts.series[0], cases[0])


def test_uea_data_numpy_arrays_clipping_and_padding_notes_and_no_torch(tmp_path):
    """Numpy arrays, masks of the lengths; clipped TRAIN and TEST cases counted and said; max_len
    over twice the longest series (6) said, exactly twice not; uea_data does not import torch."""
    rng = np.random.default_rng(2)
    up = lambda n: _row(*rng.normal(size=(2, n)), label="up")  # noqa: E731
    _dataset(tmp_path, [up(2), up(4), up(5), _row([1, 2], [3, 4], label="down")], [up(6), up(1)])
    default = load_uea(str(tmp_path), "Toy")  # max_len 5, the longest TRAIN series
    for split, n in (("train", 4), ("test", 2)):  # numpy arrays: x float32, mask bool, y int64
        arrays = [getattr(default, f"{k}_{split}") for k in ("x", "mask", "y")]
        want = [(np.float32, (n, 5, 2)), (np.bool_, (n, 5)), (np.int64, (n,))]
        assert [(type(a), a.dtype, a.shape) for a in arrays] == [(np.ndarray, *w) for w in want]
    assert np.array_equal(default.mask_train, np.arange(5) < np.array([[2], [4], [5], [2]]))
    assert (default.x_train[0, 2:] == 0).all() and default.mask_test.sum(1).tolist() == [5, 1]
    assert (default.n_clipped_train, default.n_clipped_test) == (0, 1)
    assert any("clips 0 of 4 TRAIN cases and 1 of 2 TEST" in n for n in default.notes)
    data = load_uea(str(tmp_path), "Toy", max_len=3)
    assert (data.n_clipped_train, data.n_clipped_test) == (2, 1)
    assert [m.sum(1).tolist() for m in (data.mask_train, data.mask_test)] == [[2, 3, 3, 2], [3, 1]]
    [note] = [n for n in data.notes if "clips" in n]
    assert "clips 2 of 4 TRAIN cases and 1 of 2 TEST cases (longest 5 and 6 steps)" in note
    far = load_uea(str(tmp_path), "Toy", max_len=13)
    assert far.x_train.shape[1] == 13 and not any("clips" in n for n in far.notes)
    assert any("max_len 13 is more than twice the longest series (6 steps)" in n for n in far.notes)
    assert load_uea(str(tmp_path), "Toy", max_len=12).notes == []  # exactly twice: said nothing
    _dataset(tmp_path, [up(2), up(4)], [up(1), up(2)])  # TRAIN's cases alone clipped: said too
    notes = load_uea(str(tmp_path), "Toy", max_len=3).notes
    assert any("clips 1 of 2 TRAIN cases and 0 of 2 TEST" in n for n in notes), notes
    code = "import sys, uea_data; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr


# ----------------------------------------------------------------------------------------------
# finding and downloading a dataset


def test_uea_data_missing_dataset_or_a_name_with_a_path_says_where_and_how(tmp_path):
    """Both paths, the archive page, the dataset's zip, --download; a name with a path: refused."""
    with pytest.raises(DatasetNotFoundError) as err:
        load_uea(str(tmp_path), "Heartbeat")
    text = str(err.value)
    assert str(tmp_path / "Heartbeat" / "Heartbeat_TRAIN.ts") in text
    assert str(tmp_path / "Heartbeat" / "Heartbeat_TEST.ts") in text
    assert "https://www.timeseriesclassification.com/dataset.php" in text
    assert "https://timeseriesclassification.com/aeon-toolkit/Heartbeat.zip" in text
    assert text.endswith(", or rerun with --download to fetch and unpack that zip.")
    # a TRAIN file alone: the other named (the table below), and a trailing '/' in the base URL
    message = uea_data.missing_dataset_message(str(tmp_path), "X", "https://a.b/zips/")
    assert "https://a.b/zips/X.zip" in message
    # a name with a path ('../etc', 'a/b', '..'): one sentence before anything is read or written
    _dataset(tmp_path / "data", [_OK], [_OK])  # a dataset there must not be reached
    data_dir = str(tmp_path / "data" / "sub")
    for name in ("../etc", "..", ".", "", "a/b", "a\\b", "../Toy", "/etc"):
        for call in (load_uea, lambda d, n: uea_data.download_dataset(n, d, "file:///x")):
            with pytest.raises(DatasetNotFoundError) as err:
                call(data_dir, name)
            assert str(err.value).startswith(f"{name!r} is no UEA dataset name: a name is a plain")
    names = ["Toy", "Toy_TEST.ts", "Toy_TRAIN.ts", "data"]
    assert sorted(p.name for p in tmp_path.rglob("*")) == names


_TS = _toy_ts([_OK])[0]
_UEA_FOLDERS = [  # (what is under data/: path -> text, or a link's target; the sentence said,
    # "@": data/), each said by load_uea and, where the zip is not fetched over them, --download
    ({"Toy/Toy_train.ts": _TS, "Toy/Toy_TEST.ts": _TS}, "found @/Toy/Toy_train.ts, but the file "
     "read is @/Toy/Toy_TRAIN.ts (the UEA archive's names: case matters, and a dataset's"),
    ({"Toy/toy_TRAIN.ts": _TS, "Toy/toy_TEST.ts": _TS}, "found @/Toy/toy_TRAIN.ts and @/Toy/toy_"
     "TEST.ts, but the files read are @/Toy/Toy_TRAIN.ts and @/Toy/Toy_TEST.ts (the UEA"),
    ({"toy/Toy_TRAIN.ts": _TS, "toy/Toy_TEST.ts": _TS}, "found @/toy/Toy_TRAIN.ts and @/toy/Toy_"),
    ({"Toy_TRAIN.ts": _TS, "Toy_TEST.ts": _TS}, "found @/Toy_TRAIN.ts and @/Toy_TEST.ts, but the "
     "files read are @/Toy/Toy_TRAIN.ts and @/Toy/Toy_TEST.ts"),  # no folder of the dataset
    ({"Toy/Toy_TRAIN.ts": ("gone.ts",), "Toy/Toy_TEST.ts": _TS}, "@/Toy/Toy_TRAIN.ts is a symbolic"
     " link to gone.ts, which does not exist: restore its target or remove it"),
    ({"Toy": ("/nowhere/Toy",)}, "@/Toy is a symbolic link to /nowhere/Toy, which does not exist"),
    ({"": ("../gone",)}, "@ is a symbolic link to ../gone, which does not exist"),  # data/ itself
    ({"Toy/Toy_TEST.ts": ("Toy_TEST.ts",)}, "@/Toy/Toy_TEST.ts is a symbolic link to Toy_TEST.ts, "
     "links that loop: restore its target or remove it"),
    ({"Toy/Toy_TRAIN.ts": _TS}, "UEA dataset 'Toy' is incomplete: @/Toy/Toy_TRAIN.ts is there, but"
     " not\n  @/Toy/Toy_TEST.ts\nGet it from the UEA archive"),  # --download: fetches TEST
    ({"Toy/Toy_TRAIN.ts": _TS, "Toy/Toy_TEST.ts": None}, "@/Toy/Toy_TEST.ts: cannot be read (Is a"
     " directory)"),
    ({"Toy/Toy_TRAIN.ts": _TS, "Toy/Toy_TEST.ts": ""}, "@/Toy/Toy_TEST.ts: empty file"),  # 0 bytes
    ({}, "--data-dir '' names no folder: give one ('.' for the current folder)"),  # --data-dir ''
    ({"": _TS}, "\n(@ is a file: --data-dir names the folder that holds Toy/)\nGet it from"),
    ({"TOY.zip": b"PK"}, "\n(@/TOY.zip is not unpacked: unzip its two .ts files into @/Toy, or "
     "pass --download-url file://"),  # the dataset's zip (here named in another case)
]  # fmt: skip


_UEA_FOLDER_IDS = "train-case name-case folder-case no-folder link-file link-folder link-data-dir"
_UEA_FOLDER_IDS += " link-loop train-only test-a-folder empty-file empty-data-dir data-dir-file zip"


@pytest.mark.parametrize("made, said", _UEA_FOLDERS, ids=_UEA_FOLDER_IDS.split())
def test_uea_data_what_stands_where_a_dataset_is_looked_for_is_named(made, said, tmp_path):
    """A link that leads nowhere, the user's files named but for case (or one folder up), one file
    of the two, a folder or an empty file as one: one sentence naming it (and, for the first two,
    --download refuses to fetch over them); nothing in the folder is changed."""
    data = tmp_path / "data"
    for path, content in made.items():
        if isinstance(content, tuple):  # a symbolic link to content[0]
            (data / path).parent.mkdir(parents=True, exist_ok=True)
            (data / path).symlink_to(content[0])
        elif content is None:
            (data / path).mkdir(parents=True)
        else:
            _write(data / path, content)
    data_dir, before = str(data) if made else "", _tree(tmp_path)
    with pytest.raises((DatasetNotFoundError, TsFormatError)) as err:
        load_uea(data_dir, "Toy")
    assert said.replace("@", str(data)) in str(err.value), str(err.value)
    if "found" in said or "symbolic link" in said or not made:  # before anything is fetched
        with pytest.raises(DatasetNotFoundError) as again:
            uea_data.download_dataset("Toy", data_dir, (tmp_path / "no-server").as_uri())
        assert str(again.value) == str(err.value) and "\n" not in str(err.value)
    assert _tree(tmp_path) == before


def test_uea_data_download_unpacks_a_local_zip_or_says_what_failed(tmp_path):
    """download_dataset fetches <url>/<Name>.zip (file://), unpacks the two .ts files, then fetches
    nothing; a failed download names the URL and the manual route, never '--download' again."""
    rng = np.random.default_rng(2)
    source = _dataset(tmp_path / "made", _rows(rng, ["up", "down", "up"]), _rows(rng, ["up"]))
    server, data_dir = tmp_path / "server", tmp_path / "data"
    url = server.as_uri()
    with zipfile.ZipFile(_write(server / "Toy.zip", b""), "w") as z:  # in a sub-folder, plus junk
        for p in source.iterdir():
            z.write(p, f"Toy/{p.name.upper()}")  # names in another case
        z.writestr("Toy/README.txt", "not a .ts file")
    uea_data.download_dataset("Toy", str(data_dir), url + "/", progress=False)
    names = sorted(q.name for q in source.iterdir())
    assert sorted(q.name for q in (data_dir / "Toy").iterdir()) == names  # no README, no .part
    assert all((data_dir / "Toy" / p.name).read_bytes() == p.read_bytes() for p in source.iterdir())
    assert load_uea(str(data_dir), "Toy").y_train.tolist() == [0, 1, 0]
    for p in source.iterdir():  # one of the two files there: both fetched again
        (data_dir / "Toy" / p.name).unlink()
        uea_data.download_dataset("Toy", str(data_dir), url, progress=False)
        assert (data_dir / "Toy" / p.name).read_bytes() == p.read_bytes()
    (server / "Toy.zip").unlink()  # both files are there now: a second call fetches nothing
    uea_data.download_dataset("Toy", str(data_dir), url + "/", progress=False)
    with pytest.raises(DatasetNotFoundError) as err:  # what a zip can be: the rules table
        uea_data.download_dataset("Nope", str(data_dir), url + "/", progress=False)
    text = str(err.value)
    assert text.startswith(f"could not download {url}/Nope.zip") and "--download" not in text, text
    assert str(data_dir / "Nope" / "Nope_TRAIN.ts") in text  # where to put the files
    assert "https://www.timeseriesclassification.com/dataset.php" in text
    assert not [p.name for p in data_dir.rglob(".*")]  # no temporary file is left
    _write(tmp_path / "other" / "Toy", "a file where the folder goes")  # the folder's fault:
    with pytest.raises(DatasetNotFoundError) as err:  # no way by hand
        uea_data.download_dataset("Toy", str(tmp_path / "other"), url, progress=False)
    assert "Toy is a file, where" in str(err.value) and "dataset.php" not in str(err.value)


# ----------------------------------------------------------------------------------------------
# files.py: the one write path, against every fault a file system gives
# ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _mounted(folder: pathlib.Path, options: str):
    """A tmpfs mounted on folder with options (ro; size=64k): real faults, not mocked ones.
    Skips where this process may not mount (not root, or a sandbox without the call)."""
    folder.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)]
    done = subprocess.run(mount, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def _fill_until_full(folder: pathlib.Path) -> None:
    """Leave no byte free in the tmpfs at folder."""
    with contextlib.suppress(OSError), open(folder / "ballast", "wb") as f:
        while True:
            f.write(b"x" * 4096)
            f.flush()


# fault: where the file goes (made by the test) -> the sentence's end, and the path it names
_FILE_FAULTS = {
    "read-only": ("ro", "mnt/out.bin", "mnt/out.bin: the file system is read-only"),
    "full-mid-write": ("size=64k", "mnt/out.bin", "mnt/out.bin: the disk is full"),
    "full-at-once": ("size=64k full", "mnt/out.bin", "mnt/out.bin: the disk is full"),
    "name-too-long": (None, "n" * 256, "the name is too long (its longest part has 256 bytes"),
    "file-as-folder": (None, "plain/sub/out.bin", "below {tmp}/plain: a file stands where"),
    "folder-as-file": (None, "plain", "plain: a folder stands where the file goes"),
}


@pytest.mark.parametrize("fault", _FILE_FAULTS)
@pytest.mark.parametrize("content", ["bytes", "fill"])
def test_files_write_says_each_fault_in_one_sentence_and_leaves_nothing(tmp_path, fault, content):
    """Every fault a file system gives a write: one sentence (WriteError, an OSError) naming the
    path and the fault; the file that was there stays whole, and no temporary file remains."""
    mount, name, said = _FILE_FAULTS[fault]
    target, big = tmp_path / name, b"y" * 200_000  # more than the 64k tmpfs holds
    given = (
        big
        if content == "bytes"
        else (lambda f: [f.write(big[i : i + 1000]) for i in range(0, len(big), 1000)])
    )
    scene = _mounted(tmp_path / "mnt", mount.split()[0]) if mount else contextlib.nullcontext()
    with scene:
        if fault == "full-at-once":
            _fill_until_full(tmp_path / "mnt")
        if fault == "file-as-folder":
            _write(tmp_path / "plain", "the user's")
        if fault == "folder-as-file":
            (tmp_path / "plain" / "inside").mkdir(parents=True)
        before = _tree(tmp_path)
        with pytest.raises(files.WriteError) as caught:
            files.write(target, given)
        assert isinstance(caught.value, OSError)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("cannot write "), message
        assert said.format(tmp=tmp_path) in message, message
        assert _tree(tmp_path) == before, "nothing left behind, nothing changed"


@pytest.mark.parametrize("stop", ["ctrl-c", "error-in-fill", "network"])
def test_files_write_stopped_mid_write_keeps_the_old_file_and_no_temporary(tmp_path, stop):
    """Ctrl-C or an exception raised while the content is written, an OSError of what fill
    reads from included (a dropped connection is not the disk's fault): it goes on as it is
    (not a WriteError), the old file stays byte for byte, and the temporary file is gone."""
    target = _write(tmp_path / "out.bin", b"the old file")
    raised = dict(network=ConnectionResetError).get(stop, ZeroDivisionError)
    raised = KeyboardInterrupt if stop == "ctrl-c" else raised

    def fill(f):
        f.write(b"half of it")
        raise raised

    with pytest.raises(raised) as caught:
        files.write(target, fill)
    assert type(caught.value) is raised
    assert os.listdir(tmp_path) == ["out.bin"] and target.read_bytes() == b"the old file"
    files.write(target, "the new file")  # str: UTF-8
    assert os.listdir(tmp_path) == ["out.bin"] and target.read_text() == "the new file"


def test_files_a_killed_writers_temporary_is_removed_by_the_next_writer_alone(tmp_path):
    """SIGKILL mid-write leaves <name>.<pid>.tmp; the next process writing into that folder
    removes it, and keeps a live process's temporary file and files that only look alike."""
    script = (
        f"import files, time\nfiles.write({str(tmp_path / 'a.bin')!r}, lambda f: time.sleep(60))"
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=HERE)
    left = tmp_path / f"a.bin.{child.pid}-0.tmp"  # its first write
    for _ in range(600):
        if left.exists():
            break
        time.sleep(0.05)
    child.kill()
    child.wait()
    assert left.exists(), "SIGKILL cannot clean up: the name says whose it is"
    alive = _write(tmp_path / f"b.bin.{os.getppid()}-3.tmp", "a live writer's")
    alike = ("c.tmp", "d.x.tmp", "e.1-2.tmp.txt", f"f.{child.pid}.tmp")  # not <name>.<pid>-<k>.tmp
    alike = [_write(tmp_path / name, "the user's") for name in alike]
    files._swept.discard(tmp_path)  # a new process: it has swept nothing yet
    files.write(tmp_path / "new.bin", b"")
    assert not left.exists() and alive.exists() and all(path.exists() for path in alike)


def test_files_logs_append_whole_lines_and_a_torn_last_line_is_dropped(tmp_path):
    """append adds whole lines; read_log gives them, and names a last line cut by a kill (no
    newline), which append then drops rather than continuing onto it."""
    log = tmp_path / "metrics.jsonl"
    assert files.read_log(log) == ([], None)
    files.append(log, '{"step": 1}')
    files.append(log, '{"step": 2}')
    assert files.read_log(log) == (['{"step": 1}', '{"step": 2}'], None)
    log.write_bytes(log.read_bytes() + b'{"ste')  # a kill mid-write, by a writer of old
    assert files.read_log(log) == (['{"step": 1}', '{"step": 2}'], '{"ste')
    files.append(log, '{"step": 3}')
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def _writers(source: pathlib.Path) -> dict:
    """Every writer of the project, each a call that writes into a folder given -> what it
    returned (a note, for the prepared file). Each writes well over 64 kB (a full tmpfs fails
    mid-write), except bench's CSV header, a line."""
    big = "x" * 100_000
    split = lra_data.Split(np.ones((40, 1000), np.int16), np.full(40, 1000), np.zeros(40, np.int64))
    tiny = dict(listops.OFFICIAL, seed=1, train=48, val=12, test=12)
    return {
        "checkpoint": lambda d: runs.save(d / "checkpoint.pt", dict(w=torch.ones(40_000))),
        "config": lambda d: runs.save(d / "config.json", dict(note=big)),
        "metrics": lambda d: runs.save(d / "metrics.jsonl", dict(step=1, note=big)),
        "prepared file": lambda d: lra_data.write_prepared(d / "x.npz", {}, dict(train=split,
                                                           val=split, test=split), []),
        "listops": lambda d: listops.write(d / "listops", {k: tiny[k] for k in listops.KEYS}),
        "download": lambda d: download.download_url(source.as_uri(), d / "got.bin"),
        "diagnose csv": lambda d: diagnose.write_csv(d / "x.csv", ["a"], [[big]] * 2),
        "bench csv": lambda d: bench.Rows(d / "bench.csv"),
    }  # fmt: skip


def _wrote(writer, folder: pathlib.Path) -> str | None:
    """writer(folder) -> the one sentence it stopped with (SystemExit's, an exception's, the
    prepared file's note), or None where it wrote."""
    try:
        notes = writer(folder)
    except SystemExit as e:
        return e.code
    except Exception as e:
        return str(e)
    return notes[0] if isinstance(notes, list) and notes else None


@pytest.mark.parametrize("fault", _FILE_FAULTS)
@pytest.mark.parametrize("writer", list(_writers(pathlib.Path())), ids=_id)
def test_files_every_writer_says_each_fault_in_one_sentence_and_leaves_nothing(
    tmp_path, writer, fault
):
    """Every writer of the project against every fault of the file system: one sentence naming
    the path and the fault, nothing left behind (no temporary file, no folder it made)."""
    if writer == "bench csv" and fault == "full-mid-write":
        pytest.skip("bench's CSV begins with its header, one line: it fits in 64 kB")
    source = _write(tmp_path / "source.bin", os.urandom(100_000))
    write = _writers(source)[writer]
    mount, name, said = _FILE_FAULTS[fault]
    base = tmp_path / "base"
    where = {"name-too-long": base / name, "file-as-folder": base / "plain" / "sub"}
    where["folder-as-file"] = base / "d"
    scene = _mounted(base / "mnt", mount.split()[0]) if mount else contextlib.nullcontext()
    with scene, _one_thread(), contextlib.redirect_stdout(io.StringIO()):
        if fault == "full-at-once":
            _fill_until_full(base / "mnt")
        if fault == "file-as-folder":
            _write(base / "plain", "the user's")
        folder = where.get(fault, base / "mnt")
        if fault == "folder-as-file":  # a folder stands where each of its files goes
            assert _wrote(write, tmp_path / "once") is None
            for path in (tmp_path / "once").rglob("*"):
                if path.is_file():
                    (folder / path.relative_to(tmp_path / "once") / "in-the-way").mkdir(
                        parents=True
                    )
        before = _tree(base)
        message = _wrote(write, folder)
        assert isinstance(message, str) and "\n" not in message, message
        assert "cannot write " in message, message
        what = said.split(": ", 1)[1] if ": " in said else said
        if fault == "name-too-long":
            what = "the name is too long"
        assert what in message, message
        assert _tree(base) == before, "nothing left behind, nothing changed"


@pytest.mark.parametrize("writer", list(_writers(pathlib.Path())), ids=_id)
def test_files_every_writer_stopped_by_ctrl_c_leaves_no_temporary_file(tmp_path, writer):
    """Ctrl-C half-way through a write, in every writer: KeyboardInterrupt goes on (the scripts
    say it in one line, exit 130), the folder holds no temporary file and no half file."""
    source = _write(tmp_path / "source.bin", os.urandom(100_000))
    write, folder = _writers(source)[writer], tmp_path / "out"
    real = open

    def interrupted_open(path, mode="r", *args, **kwargs):
        f = real(path, mode, *args, **kwargs)
        if mode == "wb" and files.TEMPORARY.fullmatch(pathlib.Path(path).name):
            f.write(b"half of it")
            f.flush()
            raise KeyboardInterrupt
        return f

    with mock.patch.object(files, "open", interrupted_open, create=True):
        with (
            pytest.raises(KeyboardInterrupt),
            _one_thread(),
            contextlib.redirect_stdout(io.StringIO()),
        ):
            write(folder)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p != source], "nothing left"


def _writes_outside_files_py(text: str, name: str) -> list:
    """The calls in a file's text that write a file (open for writing, np.save, torch.save,
    write_text, write_bytes, savefig) but do not stand inside a files.write or files.append
    call -> ["name:line: call", ...]. Allowed: the run folder's lock (opened, never written)
    and torch.save into memory."""
    allowed = {"open(out / 'lock', 'a')", "torch.save(obj, buffer)"}
    writes = {"write_text", "write_bytes", "savefig", "torch.save", "np.save", "np.savez"}
    tree, inside = ast.parse(text), set()  # inside: the calls under a files.write or .append
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("files.write", "files.append"):
            inside |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or id(node) in inside:
            continue
        called = getattr(node.func, "attr", getattr(node.func, "id", ""))
        called = ast.unparse(node.func) if called in ("save", "savez") else called
        modes = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "mode")]
        mode = "".join(str(m.value) for m in modes if isinstance(m, ast.Constant))
        opened = called == "open" and set(mode) & set("wax+")
        if (opened or called in writes) and ast.unparse(node) not in allowed:
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("plant, caught", [
    ('with open(p, "w") as f:\n    f.write(x)', True),
    ('with open(p, mode="ab") as f:\n    f.write(x)', True),
    ("np.savez(p, a=a)", True),
    ("torch.save(obj, p)", True),
    ("p.write_text(x)", True),
    ("fig.savefig(p, dpi=120)", True),
    ('open(p, "rb").read()', False),
    ("files.write(p, lambda f: np.savez(f, a=a))", False),
    ("files.write(p, functools.partial(fig.savefig, dpi=120))", False),
])  # fmt: skip
def test_files_no_writer_writes_but_through_files_py(plant, caught):
    """Every call that writes a file in the project's files stands inside a files.write or
    files.append call, so no new writer slips past the write path (and the check sees one)."""
    assert bool(_writes_outside_files_py(plant, "plant.py")) == caught, plant
    found = []
    for path in sorted(HERE.glob("*.py")):
        if path.name not in ("test_all.py", "files.py"):
            found += _writes_outside_files_py(path.read_text(), path.name)
    assert not found, found


_TOO_BIG = [  # (script, flags at 10⁹, the flags the refusal names to lower)
    ("train_lra.py", "--max-len", "--max-len"),
    ("train_lra.py", "--batch-size", "--batch-size"),
    ("train_lra.py", "--d-model", "--d-model"),
    ("train_lra.py", "--listops-size", "--listops-size"),
    ("train_lra.py", "--listops-eval-size", "--listops-eval-size"),
    ("train_uea.py", "--max-len", "--max-len"),
    ("train_uea.py", "--batch-size", "--batch-size"),
    ("train_uea.py", "--d-model", "--d-model"),
    ("lra_data.py", "--max-len", "--max-len"),  # once ListOps (1,000 examples) is read
    ("lra_data.py", "--listops-size", "--listops-size"),
    ("bench.py", "--ns", "--ns or --batch"),
    ("bench.py", "--batch", "--ns or --batch"),
    ("bench.py", "--step-ns", "--step-ns or --step-batch"),
    ("bench.py", "--step-batch", "--step-ns or --step-batch"),
]


@pytest.mark.parametrize("script, flag, lower", _TOO_BIG, ids=_id)
def test_files_a_size_from_a_flag_is_checked_before_it_is_allocated(tmp_path, script, flag, lower):
    """Every flag that sizes an array, at 10⁹: one sentence giving the size and the flags to
    lower, before numpy or torch allocates (the process stays small and quick), no traceback."""
    argv = [flag, str(10**9), "--data-dir", str(tmp_path)] if script != "bench.py" else [flag]
    if script == "bench.py":
        argv += [str(10**9), "--what", "step" if "step" in flag else "layer"]
    if (script, flag) == ("lra_data.py", "--max-len"):
        argv += ["--listops-size", "1000"]
    started = time.time()
    run = _cli(script, *argv, cwd=tmp_path)
    said = (run.stdout + run.stderr).strip().splitlines()[-1]
    assert run.returncode in (1, 2) and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert time.time() - started < 60, "refused at once, not after a long allocation"
    memory = files._size(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    pattern = rf"(.*) would take ([\d.]+) (\w+), more than the {re.escape(memory)} of memory: "
    found = re.fullmatch(pattern + re.escape(f"lower {lower}"), said.split(": ", 1)[1])
    assert found, said
    size = float(found[2]) * 1024 ** ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"].index(
        found[3]
    )
    assert size > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), said
    counted = re.fullmatch(r"([\d,]+) inputs of ([\d,]+) tokens", found[1])  # int16 ids
    if counted:
        n, max_len = (int(v.replace(",", "")) for v in counted.groups())
        assert max_len == 10**9 and size == pytest.approx(2 * n * max_len, rel=0.05), said


def test_files_too_big_says_a_size_above_memory_and_none_at_it():
    """files.too_big: None at the memory's size, a sentence one byte above it; sizes in the
    largest binary unit that keeps them at least 1."""
    assert files.too_big(1024**3, "x", "--y", memory=1024**3) is None
    said = "x would take 1.0 GiB, more than the 1024.0 MiB of memory: lower --y"
    assert files.too_big(1024**3 + 1, "x", "--y", memory=1024**3 - 1) == said
    assert [files._size(n) for n in (0, 1023, 1536, 5 * 1024**4)] == [
        "0.0 bytes",
        "1023.0 bytes",
        "1.5 KiB",
        "5.0 TiB",
    ]


# ----------------------------------------------------------------------------------------------
# download.py: its rules, as a table of folder states x archive shapes, and a fuzzer of archives

_DL_FILES = {f"new_aan_pairs.{s}.tsv": s.encode() for s in ("train", "eval", "test")}  # marker 1st
_DL_UEA = {"Toy_TRAIN.ts": b"train", "Toy_TEST.ts": b"test"}
_DL_OTHER = [("lra_release/listops-1000/basic_train.tsv", b"other")]  # past the folder


def _dl_members(zipped: bool) -> list:
    """The valid archive's members: the UEA files (zip) or the release's tsv_data/, then more."""
    folder, files = ("Toy", _DL_UEA) if zipped else ("lra_release/tsv_data", _DL_FILES)
    members = [(f"{folder}/{name}", data) for name, data in files.items()]
    if zipped:  # a name that only begins as a needed one: not kept
        members.append(("Toy/Toy_TRAIN.ts.orig", b"a backup"))
    return members + _DL_OTHER


def _dl_archive(members: list, zipped: bool) -> bytes:
    """A deflated zip or a gzipped tar of [(name, bytes; or a tar type as str: a link, a device;
    in a zip, a symlink entry)], in that order."""
    out, links = io.BytesIO(), (stat.S_IFLNK | 0o777) << 16  # a zip's Unix mode, as zip -y
    if zipped:
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a name twice: zipfile's "Duplicate name"
            for name, data in members:
                info = zipfile.ZipInfo(name)
                info.external_attr = links if isinstance(data, str) else 0
                z.writestr(info, b"/etc/passwd" if isinstance(data, str) else data)
        return out.getvalue()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname, data = data.encode(), "/etc/passwd", b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@contextlib.contextmanager
def _dl_refused(folder: pathlib.Path, code: int):
    """Writes under folder fail with OSError(code), as on a read-only or full disk (as root,
    chmod stops nothing): mkdir, unlink, rmdir, replace, and download.py's open for writing."""

    def guard(call):
        def guarded(*paths, **kw):
            inside = [p for p in paths[:2] if str(p).startswith(str(folder))]
            if inside and (call is not open or "w" in str(paths[1:2])):
                exists = call is os.mkdir and os.path.exists(inside[0])  # EEXIST goes first
                raise OSError(errno.EEXIST if exists else code, os.strerror(code), str(inside[0]))
            return call(*paths, **kw)

        return guarded

    with contextlib.ExitStack() as stack:
        for name in ("mkdir", "unlink", "rmdir", "replace"):
            stack.enter_context(mock.patch.object(os, name, guard(getattr(os, name))))
        stack.enter_context(mock.patch.object(download, "open", guard(open), create=True))
        yield


def _dl_fetch(where: str, dest: pathlib.Path, zipped: bool, progress=True, **checks) -> str | None:
    """download.fetch of the UEA files (a zip) or the release's tsv_data/ -> None, or the
    refusal (Failed)."""
    files = _DL_UEA if zipped else _DL_FILES
    keep = "|".join(map(re.escape, files)) if zipped else ".*"
    folder, kind = ("", "zip") if zipped else ("tsv_data", "tar")
    try:
        archive = download.Archive(where, folder, keep, tuple(files), kind, **checks)
        download.fetch(archive, dest, progress)
    except download.Failed as e:
        return str(e)
    return None


_DL_RULES = [  # folder state, archive shape -> what is said: the user's files kept, or refused
    ("absent", "whole", ""),
    ("absent", "split", ""),  # read on past the folder: the rest of it comes later
    ("absent", "local-path", ""),  # a path without a scheme: a file:// URL
    ("absent", "hostile", "the member 'lra_release/tsv_data/../../evil' has an absolute path"),
    ("absent", "cut", "is no whole tar archive"),
    ("absent", "cut-early", "is no whole tar archive (its gzip header is cut short)"),
    ("absent", "wrong-md5", "is not the expected archive: its MD5 is"),
    ("absent", "loop", "HTTP Error 302: The HTTP server returned a redirect error that would"),
    ("absent", "no-scheme", "is no URL (no scheme) and no file: give http(s)://..., or a local"),
    ("complete", "whole", "kept all"),  # nothing asked of the server
    ("marker-missing", "whole", "kept the 2 file(s)"),  # the user's eval and test kept
    ("marker-missing", "split", "kept the 2 file(s)"),
    ("user-file", "whole", ""),  # notes.txt: not the archive's, left alone
    ("stale-part", "whole", ""),  # what a killed fetch left: never part of the result
    ("stale-part", "zip", ""),
    ("file-as-folder", "whole", "tsv_data is a file, where"),
    ("folder-as-file", "whole", "new_aan_pairs.eval.tsv is a folder, not a file: nothing was"),
    ("data-dir-file", "whole", "/data: a file stands where a folder of its path goes, unpacking"),
    ("read-only", "whole", ": the file system is read-only, unpacking"),
    ("read-only-parent", "whole", "data: the file system is read-only, unpacking"),
    ("full-disk", "whole", ": the disk is full, unpacking"),
    ("absent", "zip", ""),  # UEA: a zip's files found by name, in a folder of their own
    ("test-missing", "zip", "kept the 1 file(s)"),  # the user's TRAIN kept
    ("absent", "zip-cut", "is no whole zip archive"),  # and no uea/ left behind
    ("absent", "absolute", "the member '/lra_release/tsv_data/evil' has an absolute path"),
    ("absent", "backslash", "the member '\\\\lra_release/tsv_data/evil' has an absolute path"),
    ("absent", "link", "the member 'lra_release/tsv_data/evil' is a link or a device"),
    ("absent", "device", "the member 'lra_release/tsv_data/evil' is a link or a device"),
    ("absent", "checked-link", "the member 'lra_release/tsv_data/evil' is a link or a device"),
    ("absent", "zip-link", "the member 'Toy/Toy_TRAIN.ts' is a link or a device"),
    ("absent", "zip-half", "holds no Toy_TEST.ts"),
    ("absent", "half", "holds no tsv_data/new_aan_pairs.test.tsv"),  # the folder named too
    # a symbolic link that leads nowhere, where the archive goes: named, neither replaced nor
    # written through, before anything is fetched
    ("link-file", "whole", "tsv_data/new_aan_pairs.train.tsv is a symbolic link to gone, which"),
    ("link-file", "zip", "Toy/Toy_TRAIN.ts is a symbolic link to gone, which does not exist: "),
    ("link-folder", "whole", "tsv_data is a symbolic link to gone, which does not exist: nothing"),
    ("link-data-dir", "whole", "data is a symbolic link to gone, which does not exist"),
    ("link-loop", "whole", "new_aan_pairs.eval.tsv is a symbolic link to new_aan_pairs.eval.tsv, "
     "links that loop: nothing was unpacked from"),
]  # fmt: skip


def _tree(root: pathlib.Path) -> dict:
    """Every path under root -> its bytes (None: a folder; a symbolic link: its target, a str)."""
    content = lambda p: None if p.is_dir() else p.read_bytes()  # noqa: E731
    return {  # rglob goes through no link
        p.relative_to(root): os.readlink(p) if p.is_symlink() else content(p)
        for p in root.rglob("*")
    }


def test_download_progress_in_a_log_is_the_start_and_a_line_per_tenth(capsys):
    """Without a terminal, a download says where it goes first, then the bytes read at each
    tenth of the Content-Length: 10 lines for 100 bytes read one at a time."""

    class Response(io.BytesIO):
        headers = {"Content-Length": "100"}

    reader = download._Reader(Response(bytes(100)), "data/some.tar", "http://x/some.tar")
    while reader.read(1):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "downloading http://x/some.tar (100 bytes) into data/some.tar", lines[0]
    assert lines[1:] == [f"some.tar: {k:,} of 100 bytes" for k in range(10, 101, 10)], lines

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for label in ("data/some.tar", None):  # on a terminal: a bar, no lines; no label: nothing
        with mock.patch.object(sys, "stderr", Terminal()) as terminal:
            reader = download._Reader(Response(bytes(100)), label, "http://x/some.tar")
            while reader.read(1):
                pass
        assert reader.bar.disable == (label is None), label
        assert "some.tar: 10 of 100 bytes" not in terminal.getvalue(), "a bar, not lines"

    class Unsized(io.BytesIO):  # no Content-Length: no lines, no tenths to count
        headers = {}

    reader = download._Reader(Unsized(bytes(10)), "data/some.tar", "http://x/some.tar")
    while reader.read(1):
        pass
    said = "downloading http://x/some.tar (size unknown) into data/some.tar\n"
    assert capsys.readouterr().err == said


def test_download_without_progress_says_nothing(tmp_path, capsys):
    """fetch(progress=False), streamed (a tar) or checked first (a zip): not a line on stderr."""
    server = tmp_path / "server"
    for zipped in (False, True):
        _write(server / f"a{int(zipped)}", _dl_archive(_dl_members(zipped), zipped))
        with _serve(server) as (url, _):
            dest = tmp_path / f"dest{int(zipped)}"
            assert _dl_fetch(f"{url}/a{int(zipped)}", dest, zipped, progress=False) is None
        assert sorted(os.listdir(dest)) == sorted(_DL_UEA if zipped else _DL_FILES), zipped
        assert capsys.readouterr().err == "", zipped


def test_download_url_over_a_killed_downloads_temporary_writes_the_file_whole(tmp_path):
    """download_url alone: the temporary file a killed process left is removed, not added to."""
    source, file = _write(tmp_path / "source.bin", bytes(range(200))), tmp_path / "file.bin"
    pid = [sys.executable, "-c", "import os; print(os.getpid())"]
    gone = subprocess.run(pid, capture_output=True, text=True, check=True).stdout.strip()
    stale = [_write(tmp_path / f"file.bin.{gone}-0.tmp", "half of a download")]
    files._swept.discard(tmp_path)  # as in a new process
    download.download_url(source.as_uri(), file, size=200)
    assert file.read_bytes() == bytes(range(200)) and not any(path.exists() for path in stale)


def test_download_a_body_shorter_than_its_content_length_is_refused(tmp_path):
    """No size given (the LRA release, the UEA zips): the server's Content-Length is the check;
    a response cut short, even at a tar member's end, is refused, and nothing is left."""
    server, file = tmp_path / "server", tmp_path / "got.tar"
    _write(server / "whole", _dl_archive(_dl_members(False), False))
    with _serve(server) as (url, _):
        with pytest.raises(download.Failed, match=r"gave [\d,]+ bytes, not [\d,]+ \(cut short"):
            download.download_url(f"{url}/cut/whole", file)
    assert os.listdir(tmp_path) == ["server"], "no file, no .part"


def test_download_a_known_size_is_checked_without_an_md5(tmp_path):
    """An archive given a size and no MD5 is read whole and checked first: a body shorter or
    longer than that size refused."""
    server = tmp_path / "server"
    size = len(_write(server / "whole", _dl_archive(_dl_members(False), False)).read_bytes())
    for given in (size + 1, size - 1):
        with _serve(server) as (url, _):
            refused = _dl_fetch(f"{url}/whole", tmp_path / "data" / "tsv_data", False, size=given)
        assert f"gave {size:,} bytes, not {given:,}" in refused, refused


def test_download_place_moves_the_needed_files_last(tmp_path):
    """A placing stopped half-way (a full disk) never leaves a needed file in the folder: the
    next fetch, seeing one, would take the folder as whole."""
    part, dest = tmp_path / "part", tmp_path / "dest"
    for name in ("a.txt", "b.txt", "need.txt", "z.txt"):
        _write(part / name, name)
    _write(dest / "a.txt", "the user's")  # kept: the others are moved one by one
    real, calls = os.replace, []

    def replace(source, target):
        calls.append(pathlib.Path(target).name)
        if len(calls) == 3:  # the disk is full at the third of b, need, z
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(source, target)

    with mock.patch.object(download.os, "replace", replace), pytest.raises(OSError):
        download._place(part, dest, download.Archive("http://x/a.tar", need=("need.txt",)))
    assert "need.txt" not in os.listdir(dest), "the needed file is moved last"


def test_download_place_keeps_the_files_there_and_names_three(tmp_path, capsys):
    """Into a folder holding 4 of the archive's 8 files: those 4 stay byte for byte, the other 4
    are moved in, and one line names the first 3 kept, then "...", and counts the others."""
    part, dest = tmp_path / "part", tmp_path / "dest"
    for name in "abcdefgh":
        _write(part / f"{name}.txt", f"archive {name}")
    for name in "abcd":
        _write(dest / f"{name}.txt", f"user {name}")
    download._place(part, dest, download.Archive("http://x/a.tar", need=("e.txt",)))
    got = {path.name: path.read_text() for path in dest.iterdir()}
    want = {f"{name}.txt": f"user {name}" for name in "abcd"}
    assert got == {**want, **{f"{name}.txt": f"archive {name}" for name in "efgh"}}, got
    said = capsys.readouterr().err.strip()
    kept = "kept the 4 file(s) of http://x/a.tar already there (a.txt, b.txt, c.txt, ...)"
    assert said == f"{dest}: {kept}, unpacked the other 4", said
    (dest / "d.txt").unlink()  # three kept: all named
    download._place(part, dest, download.Archive("http://x/a.tar", need=("d.txt",)))
    assert "already there (a.txt, b.txt, c.txt), unpacked" in capsys.readouterr().err
    _write(part / "sub" / "x.txt", "archive x")  # a folder of the archive, a file in dest:
    _write(dest / "sub", "the user's")
    with pytest.raises(download.FolderError, match=f"^{re.escape(str(dest / 'sub'))} is a file,"):
        download._place(part, dest, download.Archive("http://x/a.tar"))
    for link in (dest / "sub", dest / "a.txt"):  # a link to nowhere where a folder or file goes
        link.unlink()
        link.symlink_to(tmp_path / "gone")
        with pytest.raises(download.FolderError) as err:
            download._place(part, dest, download.Archive("http://x/a.tar"))
        said = f"{link} is a symbolic link to {tmp_path / 'gone'}, which does not exist: nothing"
        assert str(err.value).startswith(said) and os.readlink(link) == str(tmp_path / "gone")
        link.unlink()
        _write(link / "x.txt" if link.name == "sub" else link, "the user's")


@pytest.mark.parametrize("state, shape, said", _DL_RULES, ids=_id)
def test_download_rules_folder_states_by_archive_shapes(tmp_path, capsys, state, shape, said):
    """fetch: the archive's files placed, the user's kept byte for byte (said), or one sentence
    naming the URL; nothing else changed (no .part, no folder made, nothing outside)."""
    root, server, zipped = tmp_path / "root", tmp_path / "server", shape.startswith("zip")
    data, files = root / "data", _DL_UEA if zipped else _DL_FILES
    dest = data / "uea" / "Toy" if zipped else data / "tsv_data"
    whole, tar = _dl_archive(_dl_members(zipped), zipped), _dl_members(False)  # whole: a zip or tar
    shapes = {"split": _dl_archive(tar[:1] + _DL_OTHER + tar[1:3], False), "cut-early": whole[:3]}
    shapes |= {"hostile": _dl_archive([("lra_release/tsv_data/../../evil", b"!"), *tar], False)}
    evil, uea = "lra_release/tsv_data/evil", _dl_members(True)  # after the folder's files
    hostile = {"absolute": (f"/{evil}", b"!"), "link": (evil, "2"), "device": (evil, "3")}
    hostile["backslash"] = (f"\\{evil}", b"!")  # absolute on Windows
    for name, member in hostile.items():  # a tar's symlink, a device
        shapes[name] = _dl_archive([*tar[:3], member], False)
    shapes |= {"zip-link": _dl_archive([(uea[0][0], "2"), *uea[1:]], True)}  # a symlink entry
    shapes |= {"zip-half": _dl_archive(uea[:1], True)}
    shapes |= {"half": _dl_archive(tar[:2] + _DL_OTHER, False)}
    for name, content in {**shapes, "whole": whole, "zip": whole, "cut": whole[:-40]}.items():
        _write(server / name, content)
    _write(server / "zip-cut", whole[:-30])
    root.mkdir()
    kept = dict(complete=files, marker_missing=list(files)[1:], test_missing=["Toy_TRAIN.ts"])
    for name in kept.get(state.replace("-", "_"), []):  # the user's own versions
        _write(dest / name, b"the user's own " + files[name])
    places = {"user-file": dest / "notes.txt", "file-as-folder": dest, "data-dir-file": data}
    if state in places:
        _write(places[state], "the user's")
    if state == "stale-part":  # a killed process's half-unpacked folder and half download
        _write(dest.parent / f".{dest.name}.part" / "stale.txt", "half")
        _write(dest.parent / f".{dest.name}.download.part", "half")
    links = {"link-file": dest / list(files)[0], "link-folder": dest, "link-data-dir": data}
    links["link-loop"] = dest / "new_aan_pairs.eval.tsv"  # a link to itself
    if state in links:
        links[state].parent.mkdir(parents=True, exist_ok=True)
        links[state].symlink_to(links[state].name if state == "link-loop" else "gone")
    if state in ("folder-as-file", "read-only"):
        (dest / "new_aan_pairs.eval.tsv" if state == "folder-as-file" else data).mkdir(parents=True)
    faults = {"read-only": (data, errno.EROFS), "read-only-parent": (root, errno.EROFS)}
    faults["full-disk"] = (data, errno.ENOSPC)
    refusals = _dl_refused(*faults[state]) if state in faults else contextlib.nullcontext()
    leftover = lambda path: any(part.endswith(".part") for part in path.parts)  # noqa: E731
    before = {path: v for path, v in _tree(root).items() if not leftover(path)}
    with refusals, _serve(server) as (url, asked):
        ways = {"loop": f"{url}/loop/whole", "no-scheme": "whole", "wrong-md5": f"{url}/whole"}
        ways |= {"local-path": str(server / "whole"), "checked-link": f"{url}/link"}
        where = ways.get(shape, f"{url}/{shape}")
        md5 = "0" * 32 if shape == "wrong-md5" else None
        size = len(shapes["link"]) if shape == "checked-link" else None  # read whole, then unpacked
        refused = _dl_fetch(where, dest, zipped, md5=md5, size=size)
    err, after = capsys.readouterr().err, _tree(root)
    assert not list(tmp_path.rglob("evil"))
    if refused is not None or said == "kept all":  # nothing changed, nothing asked (complete)
        assert refused is None or (said and said in refused and "\n" not in refused), refused
        assert refused is None or where in refused
        assert after == before and (asked == [] or said != "kept all")
        assert asked == [] or state not in links  # a link: refused before the download
        return
    assert said in err  # the user's files named, when kept ("" else)
    assert f"downloading {where if '://' in where else (server / 'whole').as_uri()} (" in err
    placed = {dest.relative_to(root) / name: content for name, content in files.items()}
    folders = {folder: None for path in placed for folder in path.parents if folder.parts}
    assert after == {**placed, **before, **folders}  # the user's files byte for byte


def _dl_mutant(rng, zipped: bool) -> tuple:
    """A seeded mutant of the valid archive (a zip, else a tar) -> (its bytes, what was done)."""
    members, done = _dl_members(zipped), []
    files, folder = list(_DL_UEA if zipped else _DL_FILES), members[0][0].rpartition("/")[0]
    ways = ["reorder", "split", "hostile", "case", "cut"]  # a tar has no checksum of its data
    for way in rng.sample([*ways, "flip"] if zipped else ways, rng.randint(1, 3)):
        done.append(way)
        at = rng.randrange(len(members))
        if way == "reorder":
            rng.shuffle(members)
        if way == "split":  # the first needed file, then the rest of the folder after another
            members = members[:1] + _DL_OTHER + [m for m in members[1:] if m not in _DL_OTHER]
        if way == "hostile":  # a file of its own, or in a needed file's place, before or after
            name, evil = rng.choice(["evil", *files]), rng.choice(["..", "/", "1", "2", "3"])
            hostile = {"..": (f"{folder}/../../{name}", b"!"), "/": (f"/{folder}/{name}", b"!")}
            hostile = hostile.get(evil, (f"{folder}/{name}", evil))  # a tar's hard link, symlink,
            members.insert(rng.randint(0, len(members)), hostile)  # device; a zip's symlink
        if way == "case":  # a file name in upper case (the folder's is kept)
            path, _, name = members[at][0].rpartition("/")
            members[at] = (f"{path}/{name.upper()}", members[at][1])
    archive = bytearray(_dl_archive(members, zipped))
    if "cut" in done:
        archive = archive[: rng.randrange(len(archive))]
    flips = min(3, len(archive)) if "flip" in done else 0  # a cut may leave fewer bytes
    for at in rng.sample(range(len(archive)), flips):
        archive[at] ^= 1 << rng.randrange(8)
    return bytes(archive), done


def test_download_fuzz_archives_are_read_as_the_valid_one_or_refused(tmp_path, capsys):
    """Seeded mutants of a streamed tar, a checked tar and a zip: the valid archive's files (the
    user's kept) or one sentence naming the URL; nothing outside, changed or half-written."""
    n, counts = int(os.environ.get("DOWNLOAD_FUZZ", "40")), {}  # mutants per kind
    with _serve(tmp_path / "server") as (url, asked):
        for kind, seed in itertools.product(["stream", "checked", "zip"], range(n)):
            rng, root, zipped = random.Random(seed), tmp_path / kind / str(seed), kind == "zip"
            archive, done = _dl_mutant(rng, zipped)
            where, files = f"{url}/{kind}{seed}", _DL_UEA if zipped else _DL_FILES
            _write(tmp_path / "server" / f"{kind}{seed}", archive)
            dest = root / "data" / ("uea/Toy" if zipped else "tsv_data")
            user = {name: b"the user's " + files[name] for name in list(files)[1:] if seed % 2}
            for name, content in user.items():
                _write(dest / name, content)
            size = len(archive) if kind == "checked" else None
            refused = _dl_fetch(where, dest, zipped, size=size)
            capsys.readouterr()
            assert refused is None or (where in refused and "\n" not in refused), refused
            got = {p.relative_to(dest): p.read_bytes() for p in root.rglob("*") if p.is_file()}
            want = user if refused else {name: user.get(name, b) for name, b in files.items()}
            assert got == {pathlib.Path(name): b for name, b in want.items()}, (kind, done)
            assert not list(tmp_path.rglob("evil")), (kind, done)
            assert user or not refused or not (root / "data").exists()  # no folder left
            outcome = "refused" if refused else "read-equal"
            counts[kind, outcome] = counts.get((kind, outcome), 0) + 1
    assert len(counts) == 6, counts  # each kind: some mutants read, some refused


_DL_FAILURES = [  # an error in fetch -> whose fault (FolderError: the folder's) and what is said
    (OSError(errno.ENOSPC, "No space left on device"), "data: the disk is full", "free some space"),
    (OSError(errno.EDQUOT, "Disk quota exceeded", "d/x"), "d/x: the disk quota is", "free some"),
    (OSError(errno.EROFS, "Read-only file system", "d/x"), "d/x: the file system is read-only", ""),
    (OSError(errno.EIO, "Input/output error", "d/x"), "d/x: Input/output error", "make it writ"),
    (OSError(errno.EEXIST, "File exists", "data"), "below data: a file stands where", "move it"),
    (OSError(errno.ENOTDIR, "Not a directory", "d/x"), "below d/x: a file stands where", "move"),
    (OSError(errno.EISDIR, "Is a directory", "d/x"), "d/x: a folder stands where the file", "mo"),
    (OSError(errno.ENOTEMPTY, "Directory not empty", "d/x"), "d/x: Directory not empty", "move"),
    (OSError(errno.EIO, "Input/output error"), None, "could not download http://x/a.tar ([Errno"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), None, "could not"),
]


@pytest.mark.parametrize("error, path, what", _DL_FAILURES, ids=_id)
def test_download_failure_names_the_folder_or_the_download(error, path, what):
    """An OSError of the folder (its errno, or a path named) is a FolderError naming the path
    (else the data folder) and what to do; any other is the download's, on one line."""
    failure = download._failure(error, "http://x/a.tar", pathlib.Path("data/tsv_data"))
    assert (type(failure) is download.FolderError) == (path is not None), failure
    unpacking = ", unpacking http://x/a.tar: "
    assert path is None or str(failure).startswith(f"cannot write {path}"), failure
    assert path is None or unpacking in str(failure), failure
    assert what in str(failure), failure


def test_download_a_url_without_a_scheme_is_a_local_file(tmp_path, monkeypatch):
    """A path (~ expanded, relative made absolute) names a file:// URL when the file is there; a
    URL is kept as given."""
    monkeypatch.setenv("HOME", str(tmp_path))
    _write(tmp_path / "a.tar", b"")
    assert download._as_url("~/a.tar") == (tmp_path / "a.tar").as_uri()
    monkeypatch.chdir(tmp_path)  # a relative path, made absolute
    assert download._as_url("a.tar") == (tmp_path / "a.tar").as_uri()
    assert download._as_url("ftp://x/~/a.tar") == "ftp://x/~/a.tar"
    with pytest.raises(download.Failed, match="is no URL"):  # a folder is no file
        download._as_url(str(tmp_path))


@pytest.mark.skipif(sys.platform == "win32", reason="no flock on Windows")
def test_download_a_second_fetch_into_a_folder_waits_for_its_lock_saying_so(tmp_path, capsys):
    """_lock: while one holds the folder's lock, another waits (saying so), then takes it."""
    first, second = download._lock(tmp_path), []

    def taking():
        second.append(download._lock(tmp_path))

    waiting = threading.Thread(target=taking, daemon=True)  # a failure leaves it blocked
    waiting.start()
    said = f"another process is downloading into {tmp_path}: waiting"
    try:
        for _ in range(200):  # said before it blocks
            if said in capsys.readouterr().err:
                break
            time.sleep(0.01)
        else:
            raise AssertionError(f"not said: {said}")
        time.sleep(0.1)
        assert waiting.is_alive() and not second, "it waits while the lock is held"
    finally:
        os.close(first)
    waiting.join(timeout=10)
    assert not waiting.is_alive() and second, "it takes the lock once released"
    os.close(second[0])


_DL_RAISED = [  # raised while unpacking -> fetch's one sentence: a damaged archive, or the download
    (tarfile.ReadError("bad"), "is no whole tar archive (bad)"),
    (zipfile.BadZipFile("bad"), "is no whole tar archive (bad)"),
    (zlib.error("Error -3"), "is no whole tar archive (Error -3)"),  # a flipped deflate stream
    (EOFError("cut"), "is no whole tar archive (cut)"),
    (NotImplementedError("method"), "is no whole tar archive (method)"),  # a zip's method flipped
    (RuntimeError("encrypted"), "is no whole tar archive (encrypted)"),  # its encryption flag
    (http.client.IncompleteRead(b"ab", 8), "could not download file:"),  # a cut stream
    (ValueError("Invalid IPv6 URL"), "could not download file:"),
    (OSError(errno.EIO, "Input/output error"), "could not download file:"),
]


@pytest.mark.parametrize("error, said", _DL_RAISED, ids=_id)
def test_download_what_unpacking_raises_is_one_sentence(tmp_path, error, said):
    """fetch turns each error of a damaged archive or of the download into Failed (the URL)."""
    _write(tmp_path / "a.tar", b"")
    with mock.patch.object(download, "stream_tar", side_effect=error):
        refused = _dl_fetch(str(tmp_path / "a.tar"), tmp_path / "data" / "tsv_data", False)
    assert refused is not None and said in refused, refused


def test_download_stream_tar_needing_nothing_reads_on_to_the_folder(tmp_path):
    """stream_tar with no need (Archive's default): a member before the folder stops nothing."""
    source = _write(tmp_path / "a.tar.gz", _dl_archive(_DL_OTHER + _dl_members(False)[:3], False))
    download.stream_tar(download.Archive(source.as_uri(), "tsv_data"), tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == sorted(_DL_FILES)


# ----------------------------------------------------------------------------------------------
# train_lra.py, train_uea.py and runs.py (what both share: flags, the run folder, checkpoints)
# ----------------------------------------------------------------------------------------------


def _lra_args(data_dir, out, *more) -> list:
    """Flags of a tiny ListOps run: a few dozen short expressions, a 16-wide model."""
    paths = ["--data-dir", str(data_dir), "--out", str(out)]
    tiny = "--listops-size 48 --listops-eval-size 12 --steps 4 --eval-every 2 --batch-size 8"
    return ["--preset", "quick", *paths, *tiny.split(), *"--d-model 16 --d-ff 32".split(), *more]


def _lra_run(argv: list) -> dict:
    with _one_thread(), contextlib.redirect_stdout(io.StringIO()):
        return train_lra.main(train_lra.parse_config(argv))


def _log(out: pathlib.Path) -> list:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _uea_run(argv: list) -> tuple[dict, str]:
    """train_uea.main(parse_config(argv)) in this process -> (result, what it printed)."""
    printed = io.StringIO()
    with _one_thread(), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        result = train_uea.main(train_uea.parse_config(argv))
    return result, printed.getvalue()


def _toy_uea(root: pathlib.Path) -> pathlib.Path:
    """<root>/Toy/Toy_{TRAIN,TEST}.ts, 12 cases of 6 steps: two classes told apart by their sign."""
    rng, signs, splits = np.random.default_rng(0), [(-1, "down"), (1, "up")] * 6, []
    for _ in ("TRAIN", "TEST"):
        splits.append([_row(*(s + 0.1 * rng.standard_normal((2, 6))), label=w) for s, w in signs])
    equal = dict(equal="true", length=6)
    return _dataset(root, *splits, train=equal, test=equal)


def _uea_dummy_data(n=5) -> uea_data.UEAData:
    """Two cases of n steps and 3 features per split, 2 classes: enough to build a model."""
    x, mask, y = np.zeros((2, n, 3), np.float32), np.ones((2, n), bool), np.zeros(2, np.int64)
    return uea_data.UEAData(x, mask, y, x, mask, y, ["a", "b"], np.zeros(3), np.ones(3), 0, 0)


SCRIPTS = {"train_lra.py": (train_lra, "step"), "train_uea.py": (train_uea, "epoch")}


def _argv(tmp: pathlib.Path, script: str, out: pathlib.Path, *more) -> list:
    """The flags of a tiny run of either script: ListOps, 4 steps; or Toy data, 2 epochs."""
    if script == "train_lra.py":
        return _lra_args(tmp / "data", out, *more)
    _toy_uea(tmp)
    paths = ["--data-dir", str(tmp), "--out", str(out)]
    return [*TINY, *"--dataset Toy --epochs 2".split(), *paths, *more]


def _train_both(tmp: pathlib.Path, script: str, out: pathlib.Path, *more, printed=None) -> tuple:
    """A tiny run of either script, as the command line runs it (runs.run) -> (result,
    printed); what it prints also goes to `printed`, if given."""
    module, unit = SCRIPTS[script]
    printed = io.StringIO() if printed is None else printed
    cfg, box = module.parse_config(_argv(tmp, script, out, *more)), []
    errors = (lra_data.DataError, uea_data.TsFormatError, uea_data.DatasetNotFoundError)
    with _one_thread(), contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        runs.run(lambda cfg: box.append(module.main(cfg)), cfg, unit, errors)
    return box[0], printed.getvalue()


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_a_failed_download_is_one_sentence_and_leaves_no_run_folder(tmp_path, script):
    """A --download-url (alone: it implies --download) into a --data-dir that is a file, or failing
    unexpectedly: one sentence (or that error), no run folder left, nor empty folders above."""
    module, unit = SCRIPTS[script]
    out, data, url = tmp_path / "runs" / "run", tmp_path / "data", f"file://{tmp_path}/no"
    flags = ["--task", "retrieval"] if script == "train_lra.py" else ["--dataset", "Toy"]
    argv = [*flags, "--download-url", url, "--data-dir", str(data), "--out", str(out)]
    errors = (lra_data.DataError, uea_data.DatasetNotFoundError)
    _write(data, "a file")
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stdout(io.StringIO()):
        runs.run(module.main, module.parse_config(argv), unit, errors)
    said = stop.value.code
    assert ": a file stands where a folder of its path goes" in said and "\n" not in said
    assert url in said
    assert not (tmp_path / "runs").exists()
    with mock.patch.object(download, "fetch", side_effect=RuntimeError("unexpected")):
        with pytest.raises(RuntimeError), contextlib.redirect_stdout(io.StringIO()):
            runs.run(module.main, module.parse_config(argv), unit, errors)
    assert not (tmp_path / "runs").exists()


def _result_of(out: pathlib.Path) -> dict:
    return json.loads((out / "result.json").read_text())


def _stops(tmp: pathlib.Path, script: str, out: pathlib.Path, *more) -> str:
    """The run stops with one sentence (SystemExit) -> that sentence."""
    with pytest.raises(SystemExit) as stop:
        _train_both(tmp, script, out, *more)
    assert isinstance(stop.value.code, str), stop.value.code
    return stop.value.code


def _files(out: pathlib.Path) -> dict:
    return {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "lock"}


_PRESETS = [  # (script, flags, settings) besides _BUILT's: the official scripts' values; flags win
    ("train_lra.py", "--preset quick", dict(listops_size=6000, out="runs/listops/agf-quick-seed0")),
    ("train_uea.py", "", dict(seed=666, out="runs/JapaneseVowels/softmax-paper-seed666")),
    ("train_uea.py", "", dict(grad_clip=4.0)),  # AGF_UEA/options.py, as Primal's TimeSeries
    # softmax (as any attention but primal+trans) shows PrimalFormer's run_primalformer.sh values
    ("train_uea.py", "--dataset Heartbeat", dict(primal_rank=30, primal_rank_multi=10)),
    ("train_uea.py", "--dataset Toy", dict(preset="default")),  # no preset: said as it is
    ("train_uea.py", "--dataset Toy --preset quick", dict(preset="quick")),
]  # fmt: skip


@pytest.mark.parametrize("script, flags, want", _PRESETS, ids=_id)
def test_train_lra_and_train_uea_presets_follow_the_official_scripts(script, flags, want):
    cfg = SCRIPTS[script][0].parse_config(flags.split())
    assert {k: getattr(cfg, k) for k in want} == want  # _BUILT: what each preset builds


_VALUES = dict(task="image", attention="gfsa", preset="quick", device="cpu")  # not the defaults
_VALUES.update(optimizer="adam", agf_basis="monomial", agf_variant="svd", gfsa_high_order="exact")
_VALUES.update(steps=7, dataset="Heartbeat", n_heads=4, gfsa_order=4, warmup=0, pathfinder="easy")


_READER = "test_train_lra_and_train_uea_data_flags_reach_the_reader"
_AFTER_BUILD = dict(  # flags that act after build(): the test that runs with each
    data_dir=_READER,
    data_seed=_READER,
    listops_size=_READER,
    listops_eval_size=_READER,
    download=_READER,
    download_url=_READER,
    cache=_READER,
    pathfinder=_READER,
    out="test_train_uea_short_runs_of_each_attention_on_real_data",
    batch_size="test_train_lra_and_train_uea_batches_follow_the_documented_order",
    eval_every="test_train_uea_evaluates_the_first_every_eval_every_and_the_last_epoch",
    epochs="test_train_uea_evaluates_the_first_every_eval_every_and_the_last_epoch",
    grad_clip="test_train_uea_gradients_are_clipped_to_grad_clip_after_unscaling",
    resume="test_runs_a_run_interrupted_and_resumed_continues_exactly",
    overwrite="test_runs_one_run_per_folder_checked_under_the_lock",
    device="test_runs_a_run_interrupted_and_resumed_continues_exactly",
    compile="test_train_lra_and_train_uea_compile_flag_and_a_diverged_run",
    attention="test_train_lra_and_train_uea_flags_alone_build_the_promised_layers",
    time_limit="test_train_lra_time_limit_stops_at_the_last_evaluation_that_ends_in_time",
    amp=None,  # autocast is on with CUDA only: no CPU run shows it
)
_ONLY = dict(attn_dropout={"softmax", "gfsa", "primal+trans"})  # the kinds it reaches if not all
_ONLY["dataset"] = {"agf", "primal", "primal+trans"}  # (agf_* etc.: their own)


def _built(script: str, *argv) -> list:
    """What build() makes of the flags: each module's settings and weights, the model's config (but
    what only its layers read), the optimiser's and schedule's; the optimiser holds all, once."""
    cfg, cpu, lra = SCRIPTS[script][0].parse_config(argv), torch.device("cpu"), "lra" in script
    built = train_lra.build(cfg, cpu) if lra else train_uea.build(cfg, _uea_dummy_data(500), cpu)
    model, opt, *schedule = built[: 3 if lra else 2]
    learns, held = [p for p in model.parameters() if p.requires_grad], opt.param_groups[0]["params"]
    assert len(opt.param_groups) == 1 and sorted(map(id, held)) == sorted(map(id, learns))
    settings = [(n, k, v) for n, m in model.named_modules() for k, v in vars(m).items()]
    settings = [(n, k, v) for n, k, v in settings if type(v) in (bool, int, float, str)]
    tensors = [*model.state_dict().items(), *model.named_buffers()]
    weights = [(k, tuple(v.shape), v.double().sum().item()) for k, v in tensors]
    layers_only = ("attention_kwargs", "attn_dropout")  # what only the layers read
    config = {k: v for k, v in vars(model.cfg).items() if k not in layers_only}
    group = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    phases = [(s.total_steps, s._schedule_phases) for s in schedule]
    return [settings, weights, len(learns), config, type(opt), group, phases]


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_every_flag_reaches_its_setting(script):
    """Each flag alone at another value (a bool: --x, --no-x) reaches its setting and what build()
    makes for each kind it is for (agf_*: AGF; _ONLY) and no other; its range at both edges."""
    module, base = SCRIPTS[script][0], ["--d-model", "16", "--n-heads", "2", "--d-ff", "32"]
    plain = {kind: _built(script, *base, "--attention", kind) for kind in KINDS}
    for f in dataclasses.fields(module.TrainConfig):
        name = "--" + f.name.replace("_", "-")
        if f.type is bool:
            assert getattr(module.parse_config([name]), f.name) is True, name
            assert getattr(module.parse_config(["--no-" + name[2:]]), f.name) is False, name
            given = ["--no-" + name[2:] if getattr(module.parse_config(base), f.name) else name]
        else:
            value = _VALUES.get(f.name, {str: "some/where", int: 8, float: 0.25}[f.type])
            assert getattr(module.parse_config([name, str(value)]), f.name) == value, name
            given = [name, str(value)]
        if f.name not in {*_AFTER_BUILD, *({"preset", "max_len"} if "uea" in script else ())}:
            prefix = f.name.split("_")[0]  # UEA: --preset's values are flags, max_len the data's
            want = {k for k in KINDS if prefix in k} if prefix in ATTENTION else set(KINDS)
            got = {k for k in KINDS if _built(script, *base, "--attention", k, *given) != plain[k]}
            assert got == _ONLY.get(f.name, want), name
        low, high, step = f.metadata["low"], f.metadata["high"], 1 if f.type is int else 1e-6
        # its range [low, high) at both edges: low and high - step accepted, the others refused
        edges = [] if low is None else [(low, True), (low - step, False)]
        for value, ok in edges + ([] if high is None else [(high - step, True), (high, False)]):
            refused = contextlib.nullcontext() if ok else pytest.raises(SystemExit)
            with contextlib.redirect_stderr(io.StringIO()) as said, refused:
                cfg = module.parse_config(["--n-heads=1", f"{name}={value}"])
            assert getattr(cfg, f.name) == value if ok else f"{name} must be " in said.getvalue()


def _help_of(parse, argv: list) -> dict:
    """parse(argv + ["--help"]), 1000 columns wide (no line wraps) -> each flag (its dashed name)
    -> its "(default: V[, given][; by preset: A a, B b, else v])" as (V, given, {A: a, B: b,
    "else": v}), or None where it says none."""
    out, wide = io.StringIO(), mock.patch.dict(os.environ, COLUMNS="1000")
    with wide, contextlib.redirect_stdout(out), pytest.raises(SystemExit) as stop:
        parse([*map(str, argv), "--help"])
    assert stop.value.code == 0, out.getvalue()
    shown = {}
    for block in re.split(r"\n  (?=-)", out.getvalue().split("\noptions:\n")[1]):
        text = " ".join(block.split())
        name = re.match(r"(?:-h, )?--([\w-]+)", text).group(1)
        said = re.search(r"\(default: (.*?)(, given)?(?:; by preset: (.*))?\)$", text)
        each = said and said[3] and dict(item.rsplit(" ", 1) for item in said[3].split(", "))
        shown[name] = said and (said[1], bool(said[2]), each or {})
    return shown


# --help of each script for each task or dataset, attention and preset; the presets by name
_HELPS = {"train_lra.py": [["--task", t, "--attention", a] for t in lra_data.VOCAB for a in KINDS]}
_HELPS["train_lra.py"] += [["--preset", "quick", "--attention", a] for a in KINDS]
_HELPS["train_uea.py"] = [
    ["--dataset", d, "--attention", a, "--preset", p]
    for d in ["Toy", *train_uea.AGF] for a in KINDS for p in ("paper", "quick")
]  # fmt: skip


def _preset_flags(script: str, preset: str, argv: list) -> list:
    """The flags that choose `preset` (as --help names it) in the command argv."""
    quick = preset == "quick"  # quick: LRA's ListOps, or the UEA dataset of argv
    if script == "train_lra.py":
        return ["--task", "listops" if quick else preset, "--preset", "quick" if quick else "paper"]
    dataset = argv[argv.index("--dataset") + 1] if quick else preset
    return ["--dataset", dataset, "--preset", "quick" if quick else "paper"]


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_help_shows_the_values_the_run_takes(tmp_path, script):
    """For every task or dataset, attention and preset, --help gives each flag the value the run
    of those flags takes (its config.json), and lists each preset's value where they differ:
    each the value of that preset's run; a flag given says so. One run's config.json is read."""
    module, names = (
        SCRIPTS[script][0],
        {f.name: f for f in dataclasses.fields(SCRIPTS[script][0].TrainConfig)},
    )
    run = functools.lru_cache(maxsize=None)(
        lambda argv: dataclasses.asdict(module.parse_config(list(argv)))
    )
    every = [*lra_data.VOCAB, "quick"] if script == "train_lra.py" else [*train_uea.AGF, "quick"]
    for argv in _HELPS[script]:
        shown, config = _help_of(module.parse_config, argv), run(tuple(argv))
        assert {k.replace("-", "_") for k, v in shown.items() if v} == set(names), argv
        for name, value in config.items():
            said, given, each = shown[name.replace("_", "-")]
            flag = "--" + name.replace("_", "-")
            assert (said, given) == (str(value), flag in argv), (argv, name)
            for preset in every if each else ():  # each preset's run: this one, its flags added
                other = run(tuple([*argv, *_preset_flags(script, preset, argv)]))
                assert str(other[name]) == each.get(preset, each.get("else")), (argv, preset)
    # the values of one run (tiny, --help first): those in its config.json
    argv = _argv(tmp_path, script, tmp_path / "run", "--attention", "agf")
    shown = _help_of(module.parse_config, argv)
    _train_both(tmp_path, script, tmp_path / "run", "--attention", "agf")
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert {k: shown[k.replace("_", "-")][0] for k in config} == {
        k: str(v) for k, v in config.items()
    }


class _Reached(Exception):
    """Raised by a stand-in where a flag's value arrives: main() stops there."""


def _parser_of(main, argv: list) -> argparse.ArgumentParser:
    """The parser main(argv) builds (caught as it parses)."""
    catch = mock.patch.object(argparse.ArgumentParser, "parse_args", autospec=True)
    with catch as parse, pytest.raises(_Reached):
        parse.side_effect = _Reached
        main(argv)
    return parse.call_args.args[0]


def _flags_of(main, argv: list) -> set:
    """The dests of the arguments of the parser main(argv) builds."""
    return {a.dest for a in _parser_of(main, argv)._actions if a.dest != "help"}


def _read_by(tmp: pathlib.Path, script: str, flags: str) -> dict:
    """main() with `flags`, stopped at its data reader -> the reader's keyword arguments (UEA:
    and fetch, download_dataset's arguments, None when it is not called)."""
    module, reader, fetch = SCRIPTS[script][0], mock.Mock(side_effect=_Reached), mock.Mock()
    cfg = module.parse_config(["--out", str(tmp / "run"), *flags.split()])
    uea = mock.patch.multiple(uea_data, load_uea=reader, download_dataset=fetch)
    with uea, mock.patch.object(train_lra, "load_task", reader), pytest.raises(_Reached):
        with contextlib.redirect_stdout(io.StringIO()):
            module.main(cfg)
    return dict(reader.call_args.kwargs, fetch=fetch.call_args.args if fetch.called else None)


def test_train_lra_and_train_uea_data_flags_reach_the_reader(tmp_path):
    """Each data flag at another value reaches the reader's arguments (--download-url alone
    implies --download); every flag that acts after build() names a test that runs with it."""
    lra, uea = "train_lra.py", "train_uea.py"
    some = "--data-dir d --data-seed 3 --listops-size 40 --listops-eval-size 9 --pathfinder easy"
    got = _read_by(tmp_path, lra, f"{some} --no-cache --max-len 77")
    url = _read_by(tmp_path, lra, "--download-url file:///m")["download"]
    plain, fetch = _read_by(tmp_path, lra, ""), _read_by(tmp_path, lra, "--download")["download"]
    listops = dict(got["listops"], train=40, val=9, test=9)
    seen = {lra: dict(data_dir=got["data_dir"] == "d", data_seed=got["seed"] == 3)}
    seen[lra].update(listops_size=got["listops"] == listops)
    seen[lra].update(listops_eval_size=got["listops"] == listops)
    seen[lra].update(pathfinder=got["pathfinder_dir"] == lra_data.PATHFINDER_DIRS["easy"])
    seen[lra].update(cache=(got["cache"], plain["cache"]) == (False, True))
    seen[lra].update(download=(fetch, plain["download"]) == ("", None))
    seen[lra].update(download_url=url == "file:///m", max_len=got["max_len"] == 77)
    note = (got["padding_note"], plain["padding_note"])  # --max-len 77, below the preset's 2000
    assert note == (True, False), "the padding note: for a --max-len other than the preset's"
    got = _read_by(tmp_path, uea, "--data-dir x --dataset Heartbeat --max-len 9")
    url = _read_by(tmp_path, uea, "--download --download-url file:///m")["fetch"]
    plain = _read_by(tmp_path, uea, "")
    seen[uea] = dict(data_dir=got["data_dir"] == "x", dataset=got["name"] == "Heartbeat")
    seen[uea].update(max_len=(got["max_len"], plain["max_len"]) == (9, 0))
    seen[uea].update(download=plain["fetch"] is None)
    seen[uea].update(download_url=url == ("JapaneseVowels", "data/uea", "file:///m"))
    for script, module in ((lra, train_lra), (uea, train_uea)):
        for name, ok in seen[script].items():
            assert ok, f"{script} --{name.replace('_', '-')}: the reader's argument"
        fields = {f.name for f in dataclasses.fields(module.TrainConfig)}
        for name in fields & set(_AFTER_BUILD) - set(seen[script]):
            flag, test = "--" + name.replace("_", "-"), _AFTER_BUILD[name]
            assert test is None or flag in inspect.getsource(globals()[test]), (name, test)


def test_diagnose_every_flag_reaches_what_it_configures(tmp_path):
    """Each flag of diagnose.py at another value reaches load_run's arguments, the dense analyses
    (--dense), the filters' grid (--points) or the output folder (--out, --split's subfolder)."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_features=3, max_len=6, style="uea", d_model=8, d_ff=8, n_layers=2)
    model = Classifier(dataclasses.replace(cfg, attention=["agf", "gfsa"])).eval()
    batch = dict(x=torch.randn(5, 6, 3), mask=torch.ones(5, 6, dtype=torch.bool))
    (tmp_path / "run").mkdir()
    loaded = diagnose.LoadedRun(model, [batch], "a run", tmp_path / "run", {}, "best.pt")
    argv = [tmp_path / "run", "--data-dir", "d", "--split", "train", "--batches", "3"]
    argv += ["--batch-size", "2", "--dense", "3", "--points", "11", "--device", "cuda"]
    argv += ["--weights", "last", "--out", tmp_path / "out"]
    load = mock.patch.object(diagnose, "load_run", return_value=loaded)
    figures = mock.patch.object(diagnose, "save_figures", return_value=[])
    cuda = mock.patch.object(torch.cuda, "is_available", return_value=True)
    with load as load_run, figures, cuda, contextlib.redirect_stdout(io.StringIO()):
        [result] = diagnose.main([str(a) for a in argv])
    path, *how = load_run.call_args.args
    agf_layer, gfsa_layer = result["layers"]
    seen = dict(runs=path == tmp_path / "run", data_dir=how[0] == "d", split=how[1] == "train")
    seen.update(batches=how[2] == 3 * 2, batch_size=how[3] == 2, device=how[4] == "cuda")
    seen.update(weights=how[5] == "last", dense=len(agf_layer["n"]) == len(gfsa_layer["n"]) == 3)
    seen.update(points=len(agf_layer["agf"]["g"]) == len(gfsa_layer["gfsa"]["lam"]) == 11)
    seen.update(out=(tmp_path / "out" / "run" / "train" / "summary.txt").is_file())
    assert set(seen) == _flags_of(diagnose.main, ["run"]), "every flag of diagnose.py has a row"
    for name, ok in seen.items():
        assert ok, f"diagnose.py {name}"


def test_diagnose_library_defaults_are_the_command_lines():
    """diagnose() and the filter responses called as a library analyse what `python diagnose.py
    RUN` does: the same number of dense sequences and the same grid."""
    flags = {a.dest: a.default for a in _parser_of(diagnose.main, ["run"])._actions}

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    assert default(diagnose.diagnose, "dense_sequences") == flags["dense"], "--dense"
    for function in (diagnose.diagnose, diagnose.agf_response, diagnose.gfsa_response):
        assert default(function, "n_points") == flags["points"], function.__name__


def test_bench_every_flag_reaches_what_it_configures(tmp_path):
    """Each flag of bench.py at another value reaches the rows, the timings, the slopes or the CSV
    (the measuring itself stubbed); --device cuda needs a GPU."""
    timed = mock.Mock(return_value=1.0)  # timed(fn, device[, repeats, warmup]) in ms
    argv = "--what layer step --kinds agf primal --dtypes bfloat16 --compile --ns 8 4 --fit-min 4"
    argv += f" --batch 3 --step-ns 16 --step-batch 2 --repeats 4 --warmup 1 --csv {tmp_path}/b.csv"
    with mock.patch.multiple(bench, timed=timed, peak_mib=lambda *a: 1.0, plot=mock.DEFAULT):
        with contextlib.redirect_stdout(io.StringIO()):
            lines = bench.main(argv.split())
    rows, calls = list(csv.DictReader(open(tmp_path / "b.csv"))), timed.call_args_list
    layer, step = ([r for r in rows if r["what"] == what] for what in ("layer", "step"))
    seen = dict(what=bool(layer and step), kinds={r["kind"] for r in rows} == {"agf", "primal"})
    seen.update(dtypes={r["dtype"] for r in rows} == {"bfloat16"}, csv=len(rows) == 12)
    seen.update(compile={r["mode"] for r in rows} == {"eager", "compiled"})
    seen.update(ns=[r["N"] for r in layer if r["mode"] == "eager"] == ["8", "8", "4", "4"])
    seen.update(fit_min=not lines[0].startswith("no log-log slopes"))
    seen.update(batch={r["B"] for r in layer} == {"3"}, step_ns={r["N"] for r in step} == {"16"})
    seen.update(step_batch={r["B"] for r in step} == {"2"}, device=True)  # cuda: a GPU's
    seen.update(repeats={c.args[2:] for c in calls if len(c.args) > 2} == {(4, 1)})
    seen.update(warmup=any(c.args[2:] == (4, 1) for c in calls))
    assert set(seen) == _flags_of(bench.main, []), "every flag of bench.py has a row"
    for name, ok in seen.items():
        assert ok, f"bench.py --{name.replace('_', '-')}"


def _help_defaults(parser: argparse.ArgumentParser) -> dict:
    """dest -> what '(default ...)' ends its --help text with (None: no default said)."""
    said = {}
    for action in parser._actions:
        text = parser._get_formatter()._expand_help(action) if action.help else ""
        found = re.search(r"\(default (.*)\)$", text)
        said[action.dest] = found and found[1]
    return said


def test_lra_data_and_listops_help_tells_the_defaults_each_task_uses(tmp_path):
    """Every value flag of lra_data.py and listops.py says its default in --help, per task where
    it differs, and that is the value then used, caught where it arrives."""
    said = _help_defaults(_parser_of(lra_data.main, []))
    assert [dest for dest, text in said.items() if text is None] == ["help", "download"]
    max_lens = {task: int(n) for task, n in re.findall(r"(\w+) (\d+)", said["max_len"])}
    urls = dict(re.findall(r"(\w+) (\S+?)(?:;|$)", said["download_url"]))
    assert set(max_lens) == set(urls) == set(lra_data.VOCAB), "each task's"
    prepare, fetch = mock.Mock(side_effect=_Reached), mock.Mock(side_effect=_Reached)
    with mock.patch.object(lra_data, "prepare", prepare), pytest.raises(_Reached):
        lra_data.main([])
    (task, data_dir, _), got = prepare.call_args
    assert [task, data_dir, str(got["seed"])] == [
        said[k] for k in ("task", "data_dir", "data_seed")
    ]
    sizes = [got["listops"][split] for split in lra_data.SPLITS]
    assert sizes == [int(said["listops_size"])] + [int(said["listops_eval_size"])] * 2
    assert got["pathfinder_dir"] == lra_data.PATHFINDER_DIRS[said["pathfinder"]]
    for task in lra_data.VOCAB:
        with mock.patch.object(lra_data, "prepare", prepare), pytest.raises(_Reached):
            lra_data.main(["--task", task])
        assert prepare.call_args.args[2] == max_lens[task], f"--max-len of {task}"
        with mock.patch.object(download, "fetch", fetch), pytest.raises(_Reached):
            lra_data.main(["--task", task, "--download", "--data-dir", str(tmp_path)])
        assert fetch.call_args.args[0].url == urls[task], f"--download-url of {task}"
    said = _help_defaults(_parser_of(listops.main, ["--out", "D"]))  # and listops.py's
    assert [dest for dest, text in said.items() if text is None] == ["help", "out"]
    divisor, least, n_eval, size = map(int, re.findall(r"\d+", said["eval_size"]))
    write = mock.Mock(side_effect=_Reached)
    for argv in ([], ["--size", "100"]):
        with mock.patch.object(listops, "write", write), pytest.raises(_Reached):
            listops.main(["--out", "D", *argv])
        settings = write.call_args.args[1]
        wanted = {key: int(said[key]) for key in ("seed", *listops.KEYS[4:])}
        wanted |= dict(train=int(argv[1]) if argv else int(said["size"]))
        wanted |= dict.fromkeys(("val", "test"), max(least, wanted["train"] // divisor))
        assert settings == wanted and "shards" not in settings and said["shards"] == "1"
    assert size // divisor == n_eval == 2000 and size == int(said["size"]), "the example said"


def test_lra_data_command_line_flags_reach_prepare():
    """python lra_data.py: each flag at another value reaches prepare's arguments; a
    --download-url alone implies --download."""
    prepare = mock.Mock(side_effect=_Reached)
    some = "--task text --data-dir d --max-len 77 --data-seed 3 --listops-size 40"
    some += " --listops-eval-size 9 --pathfinder easy --download-url x"
    for argv in (some, "--download", ""):
        with mock.patch.object(lra_data, "prepare", prepare), pytest.raises(_Reached):
            lra_data.main(argv.split())
    (args, got), (_, fetch), (_, plain) = prepare.call_args_list
    listops = dict(lra_data.LISTOPS_PAPER, train=40, val=9, test=9)
    seen = dict(task=args[0] == "text", data_dir=args[1] == "d", max_len=args[2] == 77)
    seen.update(data_seed=got["seed"] == 3, listops_size=got["listops"] == listops)
    seen.update(listops_eval_size=got["listops"] == listops, download_url=got["download"] == "x")
    seen.update(pathfinder=got["pathfinder_dir"] == lra_data.PATHFINDER_DIRS["easy"])
    seen.update(download=(fetch["download"], plain["download"]) == ("", None))
    assert set(seen) == _flags_of(lra_data.main, []), "every flag of lra_data.py has a row"
    for name, ok in seen.items():
        assert ok, f"lra_data.py --{name.replace('_', '-')}"


_BAD_FLAGS = [  # (flags, a fragment of the one sentence); each refused at parse time, exit 2
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--lr", "-0.1"], "--lr must be positive"),
    (["--lr", "0"], "--lr must be positive, got 0.0"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--dropout", "inf"], "--dropout must be a finite number"),
    (["--dropout", "1"], "--dropout must be in [0, 1), got 1.0"),  # high itself is out
    (["--seed", str(2**32)], "--seed must be in [0, 4294967296), got 4294967296"),
    (["--attention", "AGF"], "argument --attention: invalid choice: 'AGF'"),
    (["--device", "gpu"], "argument --device: invalid choice: 'gpu'"),
    (["--d-model", "10", "--n-heads", "3"], "--d-model 10 is not divisible by --n-heads 3"),
    (["--resume", "--overwrite"], "--resume continues a run and --overwrite deletes it"),
]
_BAD_LRA = _BAD_FLAGS + [  # and train_lra.py's own
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--primal-eta", "-0.5"], "--primal-eta must be at least 0, got -0.5"),
    (["--steps", "10", "--warmup", "1"], "--warmup must be 0 or 2 .. --steps - 1 = 9, got 1"),
    (["--steps", "10", "--warmup", "10"], "--warmup must be 0 or 2 .. --steps - 1 = 9, got 10"),
    (["--task", "text", "--preset", "quick"], "use it with --task listops"),
    (["--task", "video"], "argument --task: invalid choice"),
    (["--max-len", "0"], "--max-len must be at least 1"),
]
_BAD_UEA = _BAD_FLAGS + [  # and train_uea.py's own
    (["--epochs", "0"], "--epochs must be at least 1, got 0"),
    (["--dataset", "../etc"], "--dataset: '../etc' is no UEA dataset name: a name is a plain"),
    (["--optimizer", "sgd"], "argument --optimizer: invalid choice"),
]
_BAD = [("train_lra.py", *c) for c in _BAD_LRA] + [("train_uea.py", *c) for c in _BAD_UEA]


@pytest.mark.parametrize("script, flags, message", _BAD, ids=_id)
def test_train_lra_and_train_uea_bad_flags_are_one_sentence_before_anything_is_written(
    tmp_path, script, flags, message
):
    module = SCRIPTS[script][0]
    with contextlib.redirect_stderr(io.StringIO()) as said, pytest.raises(SystemExit) as stop:
        module.parse_config(["--out", str(tmp_path / "run"), *flags])
    assert stop.value.code == 2 and message in said.getvalue(), said.getvalue()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_refusals_of_processes_and_devices(script):
    """A batch the processes cannot share, --device cuda without CUDA: refused when parsed; a rank
    other than 0 says nothing and waits where rank 0 would meet it (torchrun then ends it)."""
    module = SCRIPTS[script][0]
    cases = [(["--batch-size", "3"], "--batch-size 3 is not divisible by 2 processes", 2)]
    if not torch.cuda.is_available():
        cases += [(["--device", "cuda"], "--device cuda: this machine has no CUDA device", 1)]
    for flags, message, world in cases:
        for rank, said_by in ((0, True), (1, False)):
            err, meeting = io.StringIO(), mock.patch.object(runs.dist, "init_process_group")
            with mock.patch.multiple(runs, RANK=rank, WORLD=world), meeting as meet:
                with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as stop:
                    module.parse_config(flags)
            assert stop.value.code == 2 and (message in err.getvalue()) is said_by, err.getvalue()
            assert meet.call_count == (not said_by)
            assert said_by or err.getvalue() == ""


def test_train_uea_torch_radam_is_the_official_rectified_adam():
    """torch.optim.RAdam takes the official UEA code's RAdam steps (Liu et al. 2020, Alg. 2)."""
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


# What --task/--dataset, --attention, --preset build: name C N; AGF basis K α β γ θ̃_0-frozen;
# Primal s η m = min(N, s · rank_multi); Primal+Trans s η m; batch, steps or epochs, lr, warm-up
# steps, evaluation every, optimizer. LRA, then UEA (N = 500). The official values, from:
# - LRA C, batch, steps, lr, warm-up, evaluation: mlpen/Nystromformer LRA/code/lra_config.py (as
#   yingyichen-cyy/PrimalAttention PrimalAttention_LRA/*/lra_config.py, jeongwhanchoi/agf
#   AGF_LRA/lra_config.py); N: LRA's max_length (google-research/long-range-arena, Text's in
#   lra_benchmarks/text_classification/configs/base_tc_config.py); quick: train_lra.QUICK, ours
# - AGF: jeongwhanchoi/agf AGF_LRA/best_agf.sh, AGF_UEA/run_agf_best.sh (α β not given there:
#   AGF_UEA/options.py's 1.0, 0.2; BasicMotions, no script: options.py's defaults)
# - Primal s η rank_multi: yingyichen-cyy/PrimalAttention PrimalAttention_LRA/PrimalFormer/
#   bashes/run_tasks.sh, PrimalAttention_LRA/Primal.+Trans./bashes/run_tasks.sh,
#   PrimalAttention_TimeSeries/PrimalFormer/bashes/run_primalformer.sh,
#   PrimalAttention_TimeSeries/Primal.+Trans./bashes/run_primal_trans.sh
# - UEA batch 16, lr 1e-3, epochs (PEMS-SF 400), RAdam (SpokenArabicDigits Adam), evaluation every
#   2 epochs (val_interval): jeongwhanchoi/agf AGF_UEA/options.py and run_agf_best.sh
# - GFSA: no LRA or UEA scripts published: K = 2 (LRA), 3 (UEA), ours; not in the table
_BUILT = """
listops 10 2000 jacobi 5 2.0 -1.0 0.01 1 20 0.1 200 30 0.05 300 32 5000 1e-4 1000 50 adamw
listops-quick 10 100 jacobi 5 2.0 -1.0 0.01 1 20 0.1 100 30 0.05 100 32 1000 1e-3 100 50 adamw
text 2 1000 jacobi 5 2.0 -2.0 0.01 1 20 0.05 200 30 0.1 300 32 20000 1e-4 8000 500 adamw
retrieval 2 4000 jacobi 5 2.0 -1.5 1e-4 1 30 0.0 300 20 0.05 200 32 30000 1e-4 800 300 adamw
image 10 1024 jacobi 6 1.5 2.0 0.1 1 30 0.1 300 30 0.1 300 256 35000 1e-4 175 175 adamw
pathfinder 2 1024 jacobi 4 1.5 -1.0 1e-4 1 30 0.1 300 20 0.05 200 256 62400 1e-4 312 312 adamw

EthanolConcentration 2 500 jacobi 6 1.5 -1.5 0.1 1 30 0.1 300 40 0.2 400 16 100 1e-3 0 2 radam
FaceDetection 2 500 jacobi 9 2.0 0.5 0.1 1 20 0.1 100 40 0.2 200 16 100 1e-3 0 2 radam
Handwriting 2 500 jacobi 3 1.0 0.2 0.01 0 30 0.2 150 20 0.5 100 16 100 1e-3 0 2 radam
Heartbeat 2 500 chebyshev 6 1.0 0.2 0.01 0 30 0.5 300 40 0.5 400 16 100 1e-3 0 2 radam
JapaneseVowels 2 500 legendre 4 1.0 0.2 0.01 0 40 0.5 200 30 0.2 150 16 100 1e-3 0 2 radam
PEMS-SF 2 500 jacobi 5 1.5 2.0 0.1 1 40 0.1 200 40 0.0 200 16 400 1e-3 0 2 radam
SelfRegulationSCP1 2 500 jacobi 9 1.5 1.0 0.1 1 30 0.5 300 30 0.2 300 16 100 1e-3 0 2 radam
SelfRegulationSCP2 2 500 jacobi 7 2.0 1.5 0.1 1 20 0.0 200 20 0.2 200 16 100 1e-3 0 2 radam
SpokenArabicDigits 2 500 jacobi 4 1.0 0.0 0.5 1 20 0.1 100 30 0.2 150 16 100 1e-3 0 2 adam
UWaveGestureLibrary 2 500 jacobi 10 2.0 1.5 0.1 1 20 0.0 200 40 0.1 400 16 100 1e-3 0 2 radam
BasicMotions 2 500 legendre 4 1.0 0.2 0.01 0 40 0.5 200 40 0.5 200 16 100 1e-3 0 2 radam"""


def _layer(a) -> tuple:  # what reaches a layer, read off the built module
    if type(a) is AGFAttention:
        f = a.poly_filter
        return (f.basis, f.order, f.alpha, f.beta, a.ortho_weight, f.theta0 is None, a.variant)
    if type(a) is PrimalAttention:
        return (a.We.shape[-1], a.ksvd_weight, a.n_samples, a.ksvd_reduction, a.causal)
    if type(a) is GFSAttention:  # w0 and w1: the values each holds, and whether it learns
        w0, w1 = ((w.unique().tolist(), w.requires_grad) for w in (a.w0, a.w1))
        return (a.order, a.dropout, a.high_order, w0, w1)
    return (a.dropout,)


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
@pytest.mark.parametrize("attention", KINDS)
def test_train_lra_and_train_uea_flags_alone_build_the_promised_layers(script, attention):
    """Each row of _BUILT from its flags alone, UEA's with --preset quick too (and --dropout,
    --attn-dropout); the default attention gets the same settings with no --attention."""
    lra, cpu, data = script == "train_lra.py", torch.device("cpu"), _uea_dummy_data(500)
    quick_flags = ["--preset", "quick", "--dropout", "0.2"]
    if not lra:
        quick_flags += ["--attn-dropout", "0.3"]
    tables = _BUILT.strip().split("\n\n")  # LRA's rows, then UEA's
    trans, rows = attention == "primal+trans", (tables[0] if lra else tables[1]).split("\n")
    kinds = [ATTENTION[k] for k in (["softmax", "primal"] if trans else [attention] * 2)]
    for row, quick in ((r, q) for r in rows for q in (0, 1) if not lra or q == ("-q" in r)):
        name, C, N, basis, *v, optimizer = row.split()
        K, a, b, g, frozen, s, eta, m, s2, eta2, m2, batch, length, lr, warmup, every = map(
            float, v
        )
        flags = ["--task" if lra else "--dataset", name.removesuffix("-quick"), "--attention"]
        module = SCRIPTS[script][0]
        preset = quick_flags if quick else []
        cfg = module.parse_config([*flags, attention, *preset])
        if attention == module.PAPER["attention"]:  # the default: its preset without the flag
            assert module.parse_config([*flags[:2], *preset]) == cfg, "no --attention"
        model, opt = (train_lra.build(cfg, cpu) if lra else train_uea.build(cfg, data, cpu))[:2]
        D, H, d_ff = (64, 2, 128) if lra or quick else (512, 8, 2048)
        p, pa = (0.2, 0.2 if lra else 0.3) if quick else (0.1, 0.1)  # blocks, attention weights
        primal = (s2, eta2, m2) if trans else (s, eta, m)
        want = {SoftmaxAttention: (pa,), AGFAttention: (basis, K, a, b, g, frozen, "agf")}
        want[PrimalAttention] = (*primal, "batch" if lra else "sample", False)
        gfsa_order = 2 if lra else 3
        want[GFSAttention] = (gfsa_order, pa, "taylor", ([0.0], False), ([1.0], False))
        blocks = [(blk.attn, blk.mlp[0].out_features, blk.drop.p) for blk in model.blocks]
        got = [(type(at), _layer(at), at.d_model, at.n_heads, *rest) for at, *rest in blocks]
        case = (name, attention, quick)
        assert got == [(k, want[k], D, H, d_ff, p) for k in kinds], case
        got = (len(model.pos), model.cfg.n_classes, model.cfg.two_tower, opt.defaults["lr"])
        assert got == (float(N), float(C), name == "retrieval", lr), case
        got = (type(opt).__name__.lower(), cfg.batch_size, cfg.steps if lra else cfg.epochs)
        assert got == (optimizer, batch, 10 if quick and not lra else length), case
        assert (getattr(cfg, "warmup", 0), cfg.eval_every) == (warmup, every), case


@pytest.mark.parametrize("kind", KINDS, ids=_id)
def test_train_uea_short_runs_of_each_attention_on_real_data(tmp_path, kind):
    """Real JapaneseVowels, 2 epochs that learn; the files, RESULT last (LRA's loop: the tests of
    its schedule, evaluations and logged numbers; each kind's layers: the flags' tests)."""
    out, data_dir = tmp_path / "uea", str(_real_uea().parent)
    argv = [*TINY, "--attention", kind, "--epochs", "2", "--data-dir", data_dir]
    result, printed = _uea_run([*argv, "--out", str(out)])
    files = {"config.json", "metrics.jsonl", "checkpoint.pt", "result.json", "lock"}
    assert set(os.listdir(out)) == files
    assert json.loads((out / "config.json").read_text())["attention"] == kind
    records = _log(out)
    accs = [r["test_acc"] for r in records]  # evaluated after the first and last epoch
    assert [r["epoch"] for r in records] == [1, 2] and result["final_test_acc"] == accs[-1]
    assert result["best_test_acc"] == max(accs) and _result_of(out) == result
    last = printed.strip().splitlines()[-1]
    assert last.startswith("RESULT ") and json.loads(last[7:]) == result
    # learning: the loss falls and TEST is above chance (1/9) after 2 epochs
    assert records[1]["train_loss"] < records[0]["train_loss"] and accs[-1] > 1 / 9


@pytest.mark.parametrize(
    "flags, empty, said",
    [  # CIFAR-10, 5 images a batch; test_batch empty?
        ("--task image --batch-size 2", True, "test_batch: an empty batch"),  # test_acc NaN, once
        ("--task image", False, "the training split has 22 examples, fewer than one batch"),
        ("--task pathfinder --pathfinder easy", False, "pathfinder32/curv_baseline/metadata"),
    ],
)
def test_train_lra_refuses_bad_data_before_training_no_folder_left(flags, empty, said, tmp_path):
    _lra_cifar(tmp_path / "cifar-10-batches-py")
    if empty:
        _write(tmp_path / "cifar-10-batches-py/test_batch", _lra_npy(np.zeros((0, 3072)), []))
    cfg = train_lra.parse_config(f"{flags} --data-dir {tmp_path} --out {tmp_path}/a/b".split())
    with pytest.raises(SystemExit) as stop, mock.patch.object(train_lra, "build") as build:
        runs.run(train_lra.main, cfg, "step", lra_data.DataError)
    assert said in stop.value.code and stop.value.code.startswith("error: ") and not build.called
    assert not (tmp_path / "a").exists()


def test_runs_finish_writes_no_result_with_a_number_that_is_not_finite(tmp_path):
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(SystemExit, match="the result's test_acc is not a finite number"):
            runs.finish(tmp_path, dict(task="image", val_acc=0.5, test_acc=bad, n=3))
    assert list(tmp_path.iterdir()) == [] and runs.finish(tmp_path, dict(a=0.5)) == dict(a=0.5)
    assert runs.finish(tmp_path, None) is None, "no result: nothing to check"


def _lra_stubbed(tmp: pathlib.Path, scores: list, *flags) -> tuple:
    """A tiny ListOps run whose validation scores are `scores` -> (result, calls): calls holds,
    per evaluation, the split's size and a fingerprint of the weights it was given."""
    real, scores, calls = train_lra.evaluate, iter(scores), []

    def stub(model, split, *args):
        weights = sum(float(p.detach().double().sum()) for p in model.parameters())
        calls.append((len(split.y), weights))
        return (next(scores), 0.0) if split is not data["test"] else real(model, split, *args)

    argv = _lra_args(tmp / "data", tmp / "run", "--attention", "softmax", *flags)
    cfg = train_lra.parse_config(argv)
    listops = dict(train_lra.LISTOPS["quick"], train=48, val=12, test=12)
    data, notes = lra_data.load_task("listops", str(tmp / "data"), cfg.max_len, listops=listops)
    with mock.patch.multiple(train_lra, load_task=lambda **kwargs: (data, notes), evaluate=stub):
        result = _lra_run(argv)
    return result, calls


def test_train_lra_evaluates_every_eval_every_and_ties_keep_the_first_best(tmp_path):
    """Evaluations after steps 2, 4, 5; a tie keeps the step-4 weights, which the test uses."""
    result, calls = _lra_stubbed(tmp_path, [0.5, 0.7, 0.7], "--steps", "5")
    assert [r["step"] for r in _log(tmp_path / "run")] == [2, 4, 5] and len(calls) == 4
    assert (result["best_step"], result["val_acc"], result["final_val_acc"]) == (4, 0.7, 0.7)
    (_, at_step_4), (_, at_step_5), (n_test, tested) = calls[1], calls[2], calls[3]
    assert n_test == 12 and tested == at_step_4 and tested != at_step_5
    result, _ = _lra_stubbed(tmp_path / "zero", [0.0, 0.0, 0.0], "--steps", "5")
    assert (result["best_step"], result["val_acc"]) == (2, 0.0), "an accuracy of 0 is a score"


@pytest.mark.parametrize("limit, reached", [(0, 8), (15, 2), (25, 4), (1000, 8)])
def test_train_lra_time_limit_stops_at_the_last_evaluation_that_ends_in_time(
    tmp_path, limit, reached
):
    """A clock of 10 s a call (5 s a step): the run stops at the evaluation after which the next
    would end past --time-limit, tests its best weights, says partial and the step reached."""
    ticks = itertools.count(0, 10)
    clock = types.SimpleNamespace(time=lambda: float(next(ticks)))
    flags = ["--steps", "8", "--time-limit", str(limit)]
    printing = mock.patch.object(train_lra, "print", create=True)  # train_lra's own print()
    with mock.patch.object(train_lra, "time", clock), printing as printed:
        result, calls = _lra_stubbed(tmp_path, [0.5, 0.7, 0.6, 0.6], *flags)
    stopped = [c.args[0] for c in printed.call_args_list if "stopped at" in c.args[0]]
    stop = f"--time-limit {limit} s: stopped at step {reached}"
    assert stopped == ([stop] if reached < 8 else []), "said only for a run stopped early"
    assert [r["step"] for r in _log(tmp_path / "run")] == list(range(2, reached + 1, 2))
    assert result["steps_reached"] == reached, "the step where the run stopped"
    assert result["partial"] == (reached < 8), "partial: stopped before --steps"
    assert result["steps"] == 8, "steps: the run's length as set"
    assert result["best_step"] == min(4, reached), "the best weights up to the stop are tested"
    cfg = train_lra.parse_config([*flags, "--eval-every", "2"])
    said = train_lra._expected_finish(cfg, 0, 2, 5.0)
    near = f"; --time-limit {limit} s stops it near step {reached}"
    plain = "5000 ms a step: step 8 in about 0.5 more min"
    assert said == plain + (near if reached < 8 else "")
    cfg.time_limit = 40.0  # 5 s a step: it would stop at step 8, which is --steps: not said
    assert train_lra._expected_finish(cfg, 0, 2, 5.0) == plain
    cfg.time_limit = 5.0  # less than the first evaluation's steps: it stops there, at step 2
    assert (
        train_lra._expected_finish(cfg, 0, 2, 5.0)
        == plain + "; --time-limit 5 s stops it near step 2"
    )
    if reached < 8:  # a partial run: --resume (no time limit now) goes on to --steps
        resumed, _ = _lra_stubbed(tmp_path, [0.6] * 4, "--steps", "8", "--resume")
        assert (resumed["steps_reached"], resumed["partial"]) == (8, False), "finished now"
        assert [r["step"] for r in _log(tmp_path / "run")] == [2, 4, 6, 8], "the log goes on"


def test_train_lra_quick_listops_is_as_results_describes_it():
    """RESULTS.md's quick ListOps (its sizes, depth at most 3, 21-36 tokens) is what --preset
    quick generates. Generating its 7000 expressions takes about 1-2 s."""
    text = " ".join((HERE / "RESULTS.md").read_text().split())
    said = r"\((\d+) training expressions of depth at most (\d+) and (\d+)-(\d+) tokens, (\d+) "
    found = re.search(said + r"validation, (\d+) test\)", text)
    train, depth, low, high, val, test = map(int, found.groups())
    cfg, quick = train_lra.parse_config(["--preset", "quick"]), train_lra.LISTOPS["quick"]
    assert (cfg.listops_size, cfg.listops_eval_size, cfg.listops_eval_size) == (train, val, test)
    bounds = [quick[k] for k in ("min_length", "max_length", "max_depth", "max_args")]
    pairs = listops.generate(train + val + test, cfg.data_seed, *bounds, progress=False)
    lengths = [len(listops.tokenize(e)) for e, _ in pairs]
    assert (min(lengths), max(lengths)) == (low, high), "the tokens of the shortest and longest"
    assert quick["max_depth"] == depth, "the generator's bound: operators above, values at it"


def test_train_lra_a_run_finished_at_any_length_is_not_partial(tmp_path):
    """300 steps, each a stub (past CPython's cache of small ints, where `is` would still pass
    for equal numbers): the finished run is not partial."""
    step = mock.Mock(return_value=(torch.tensor(0.5), torch.tensor(1.0)))
    with mock.patch.object(train_lra, "train_step", step):
        result, _ = _lra_stubbed(tmp_path, [0.5], "--steps", "300", "--eval-every", "300")
    assert (result["steps_reached"], result["partial"]) == (300, False), "finished"


@mock.patch.object(lra_data, "IMDB_REVIEWS", 3)  # the release's count, as the small aclImdb here
def test_train_lra_text_reuses_the_validation_score_and_logs_each_evaluation(tmp_path):
    """Text's test split is its val split: not evaluated again; a far --max-len and an unused data
    flag noted; stderr no terminal: a line per evaluation."""
    _lra_imdb(tmp_path, {"neg": ["bad", "awful film", "no"], "pos": ["good", "fine film", "ok"]})
    argv = ["--task", "text", "--data-dir", str(tmp_path), "--out", str(tmp_path / "run")]
    argv += "--attention softmax --steps 4 --eval-every 2 --batch-size 2 --max-len 32".split()
    argv += "--d-model 16 --d-ff 32 --pathfinder easy".split()
    printed, evaluate = io.StringIO(), mock.Mock(wraps=train_lra.evaluate)
    stdout, stderr = contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO())
    with mock.patch.object(train_lra, "evaluate", evaluate), _one_thread(), stdout, stderr:
        result = train_lra.main(train_lra.parse_config(argv))
    assert evaluate.call_count == 2 and result["test_acc"] == result["val_acc"]
    lines = printed.getvalue().splitlines()
    assert lines[2].startswith("max_len 32 is more than twice the longest input (10 tokens)")
    assert lines[3] == "--pathfinder easy: unused, as only --task pathfinder reads it", lines[3]
    assert sum("unused" in line for line in lines) == 1, "flags at their defaults: no note"
    cfg = train_lra.parse_config("--task pathfinder --pathfinder easy --data-seed 3".split())
    assert train_lra.unused_flags(cfg) == ["--data-seed 3: unused, as only --task listops reads it"]
    for flag in ("--listops-size 9", "--listops-eval-size 9"):  # each ListOps size flag alike
        cfg = train_lra.parse_config(f"--task text {flag}".split())
        assert train_lra.unused_flags(cfg) == [f"{flag}: unused, as only --task listops reads it"]
    steps = [line.split()[:2] for line in lines if line.startswith("step ")]
    assert steps == [["step", "2"], ["step", "4"]]


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_evaluate_is_one_pass_over_a_split_in_eval_mode(script):
    """evaluate() in batches of 2 (the last one short) equals one forward pass over all 5
    examples, with dropout off while it runs and back on after."""
    torch.manual_seed(0)
    rng, lengths, cpu = np.random.default_rng(0), np.array([7, 3, 5, 1, 6]), torch.device("cpu")
    if script == "train_lra.py":
        model = train_lra.build(train_lra.parse_config(["--preset", "quick"]), cpu)[0]
        tokens = rng.integers(1, 16, (5, 7)).astype(np.int16)
        split = lra_data.Split(tokens, lengths, np.zeros(5, np.int64))
        labels, inputs = split.y, train_lra.to_batch(split, np.arange(5), "cpu")
        inputs, n_classes = (inputs["x"], inputs["mask"]), 10
        evaluate = functools.partial(train_lra.evaluate, model, split)
    else:
        x, mask = rng.normal(size=(5, 7, 3)).astype(np.float32), np.arange(7) < lengths[:, None]
        y = np.zeros(5, np.int64)
        data = uea_data.UEAData(x, mask, y, x, mask, y, ["a", "b"], np.zeros(3), np.ones(3), 0, 0)
        model = train_uea.build(train_uea.parse_config(TINY), data, cpu)[0]
        labels, n_classes = data.y_test, 2
        inputs = train_uea.to_batch(data, "test", np.arange(5), "cpu")[:2]
        evaluate = functools.partial(train_uea.evaluate, model, data)
    with torch.no_grad():
        logits = model.eval()(*inputs)[0]
    # labels: the model's answer for 3 of the 5, another class for 2: accuracy 0.6
    labels[:] = (logits.argmax(-1) + torch.tensor([0, 1, 0, 1, 0])).remainder(n_classes).numpy()
    want_loss = F.cross_entropy(logits, torch.from_numpy(labels)).item()
    modes, forward = [], model.train().forward

    def recording(*args):
        modes.append(model.training)
        return forward(*args)

    with mock.patch.object(model, "forward", recording):
        acc, loss = evaluate(2, "cpu", contextlib.nullcontext())
    assert acc == pytest.approx(0.6, abs=1e-12) and loss == pytest.approx(want_loss, rel=1e-5)
    assert modes == [False, False, False] and model.training


@pytest.mark.parametrize(
    "script, size", [("train_lra.py", "8"), ("train_uea.py", "1"), ("train_uea.py", "11")], ids=_id
)
def test_train_lra_and_train_uea_logged_numbers_are_recomputed(tmp_path, script, size):
    """--lr 1e-12 keeps the first weights: logged losses (+ aux) are their cross-entropy per
    example, accuracies counted ones; batches: LRA all 8 in one, UEA 12 cases 1 x 12 or 11 + 1."""
    out, lra = tmp_path / "run", script == "train_lra.py"
    more = ["--batch-size", size, *(["--listops-size", "8"] if lra else ["--attention", "agf"])]
    printed = _train_both(tmp_path, script, out, "--lr", "1e-12", "--dropout", "0", *more)[1]
    assert "preset is the GPU setting" not in printed, "the CPU note: for --preset paper only"
    assert (out / "lock").is_file(), "a folder that holds a run keeps its lock file"
    ckpt, want = torch.load(out / "checkpoint.pt", weights_only=True), {}
    model = Classifier(ModelConfig(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    data = lra_data.load_task(**ckpt["data"])[0] if lra else uea_data.load_uea(**ckpt["data"])
    for split in ("train", "val") if lra else ("train", "test"):
        idx = np.arange(8 if lra and split == "train" else 12)
        if lra:
            x, mask, y = map(train_lra.to_batch(data[split], idx, "cpu").get, ("x", "mask", "y"))
        else:
            x, mask, y = train_uea.to_batch(data, split, idx, "cpu")
        logits, aux = model(x, mask)
        loss = F.cross_entropy(logits, y) + (aux if split == "train" else 0)
        want[f"{split}_loss"] = loss.item()
        want[f"{split}_acc"] = (logits.argmax(-1) == y).sum().item() / len(idx)
        want |= {"train_aux": aux.item()} if split == "train" and not lra else {}
    assert [{k: r[k] for k in want} for r in _log(out)] == [pytest.approx(want, abs=2e-5)] * 2


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_schedule_steps_and_clock_are_the_formulas(tmp_path, script):
    """Each step's lr, β₁, β₂, eps written out (LRA: OneCycleLR as lra_config.py), the logged lr,
    the number of steps, time_s and wall_s on a fake clock; the warm-up rescaled for --steps."""
    module, lra, clock, seen = SCRIPTS[script][0], "lra" in script, [0.0], []

    def step(*args, train_step=module.train_step):
        group, clock[0] = args[1].param_groups[0], clock[0] + 1
        seen.extend([group["lr"], *group["betas"], group["eps"], group["weight_decay"]])
        return train_step(*args)

    def evaluating(*args, evaluate=module.evaluate):
        clock[0] += 10
        return evaluate(*args)

    more = ["--steps", "7", "--warmup", "3", "--listops-size", "22"] if lra else ["--epochs", "3"]
    clocked = mock.patch.object(module.time, "time", lambda: clock[0])
    with mock.patch.multiple(module, train_step=step, evaluate=evaluating), clocked:
        result = _train_both(tmp_path, script, tmp_path / "run", "--batch-size", "5", *more)[0]
    W, S, lr = 3, 7, 1e-3  # LRA: pct of the phase at step t = 0 .. S - 1
    pct = [t / (W - 1) if t < W else (t - W + 1) / (S - W) for t in range(S)]
    want = [[lr / 25 + p * (lr - lr / 25), 0.95 - 0.1 * p] for p in pct[:W]]
    want += [[lr + p * (lr / 25e4 - lr), 0.85 + 0.1 * p] for p in pct[W:]]
    rows, eps = (want, 1e-6) if lra else ([[lr, 0.9]] * 9, 1e-8)  # lr, β₁ (+ β₂, eps, no decay)
    assert seen == pytest.approx([x for row in rows for x in [*row, 0.999, eps, 0]])
    log, evals = _log(tmp_path / "run"), [2, 4, 6, 7] if lra else [3, 6, 9]  # after these steps
    assert [(r["lr"], r["time_s"]) for r in log if lra] == [  # time_s: steps, evaluations so far
        (seen[5 * k - 5], k + 10 * i) for i, k in enumerate(evals, 1) if lra
    ]
    test_split = 10 if lra else 0  # LRA: + the test split
    assert result["wall_s"] == evals[-1] + 10 * len(evals) + test_split
    for flags in [["--task", task] for task in train_lra.TASKS] + [["--preset", "quick"]]:
        preset = train_lra.QUICK if "quick" in flags else train_lra.TASKS[flags[1]]
        for n in range(2, 15) if lra else ():
            w = round(preset["warmup"] * n / preset["steps"])
            w = 2 if w == 1 else w  # OneCycleLR needs 2 steps to warm up
            assert train_lra.parse_config([*flags, "--steps", str(n)]).warmup == (w if w < n else 0)


def _as_rank(module, rank: int) -> contextlib.ExitStack:
    """torch.distributed as torchrun's process `rank` of 2 sees it, with nothing to talk to."""
    calls = dict(get_rank=lambda: rank, get_world_size=lambda: 2, is_initialized=lambda: False)
    names = ("init_process_group", "barrier", "all_reduce", "broadcast", "destroy_process_group")
    fake = types.SimpleNamespace(**calls, **{k: lambda *a, **kw: None for k in names})
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.dict(os.environ, {"RANK": str(rank), "WORLD_SIZE": "2"}))
    stack.enter_context(mock.patch.multiple(runs, dist=fake, RANK=rank, WORLD=2))
    stack.enter_context(mock.patch.object(module, "dist", fake))
    stack.enter_context(mock.patch("torch.nn.parallel.DistributedDataParallel", lambda m: m))
    return stack


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_batches_follow_the_documented_order(tmp_path, script):
    """Epoch e: default_rng([seed, e]).permutation(n) in batches, the last one short (UEA) or left
    out (LRA: 44 = 5 x 8 + 4, 12 steps = 5 + 5 + 2); rank r of 2 takes [r::2] of each batch."""
    module, lra = SCRIPTS[script][0], script == "train_lra.py"
    n, size, seed = (44, 8, 0) if lra else (12, 5, 3)  # one process: batches of `size`
    more = ["--steps", "12", "--listops-size", "44"] if lra else ["--seed", "3"]
    seen, real = {}, module.to_batch
    two = 8 if lra else 10  # the batch of two processes together
    for rank, batch in ((None, size), (0, two), (1, two)):
        taken = seen.setdefault(rank, [])

        def recording(*args, taken=taken):
            split, idx = (args[0], args[1]) if lra else (args[1], args[2])
            if (len(split.y) == n) if lra else split == "train":
                taken.append(np.asarray(idx).tolist())
            return real(*args)

        ranked = _as_rank(module, rank) if rank is not None else contextlib.nullcontext()
        with ranked, mock.patch.object(module, "to_batch", recording):
            _train_both(tmp_path, script, tmp_path / f"r{rank}", *more, "--batch-size", str(batch))
        assert torch.initial_seed() == seed + (rank or 0)  # dropout's: a seed of each process
    epochs = (0, 1, 2) if lra else (1, 2)
    orders = [np.random.default_rng([seed, e]).permutation(n).tolist() for e in epochs]
    per_epoch = range(0, n - size + 1 if lra else n, size)
    assert seen[None] == [o[k : k + size] for o in orders for k in per_epoch][: 12 if lra else 6]
    assert orders[0] != orders[1]
    # UEA: 10 cases, then the last 2, one for each process; LRA: whole batches only
    starts = range(0, n - two + 1 if lra else n, two)
    wholes = [o[k : k + two] for o in orders for k in starts][:12]
    for whole, a, b in zip(wholes, seen[0], seen[1], strict=True):
        assert not set(a) & set(b) and sorted(a + b) == sorted(whole) and a == whole[0::2]


class _RecordingScaler:
    """A GradScaler stand-in that records the order in which train_step calls it."""

    def __init__(self, calls):
        self.calls = calls

    def scale(self, loss):
        self.calls.append("scale")
        return loss

    def unscale_(self, opt):
        self.calls.append("unscale_")

    def step(self, opt):
        self.calls.append("step")
        opt.step()

    def update(self):
        self.calls.append("update")


def test_train_lra_train_step_order_zero_grad_scale_step_update():
    """One step: gradients zeroed first, then scale, step, update (the official LRA code does
    not clip), then the schedule moves on."""
    cfg = train_lra.parse_config(["--preset", "quick", "--d-model", "16"])
    model, opt, sched, _ = train_lra.build(cfg, torch.device("cpu"))
    calls, zero_grad = [], opt.zero_grad
    opt.zero_grad = lambda **kw: (calls.append("zero_grad"), zero_grad(**kw))[1]
    sched.step = lambda: calls.append("schedule")
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e6)  # stale gradients must not reach the step
    x = torch.randint(1, 17, (4, 9))
    batch = dict(x=x, mask=torch.ones(4, 9, dtype=torch.bool), y=torch.zeros(4, dtype=torch.long))
    scaler, autocast = _RecordingScaler(calls), contextlib.nullcontext()
    train_lra.train_step(model, opt, sched, scaler, batch, autocast)
    assert calls == ["zero_grad", "scale", "step", "update", "schedule"]
    assert max(p.grad.abs().max() for p in model.parameters() if p.grad is not None) < 1e3


def test_train_uea_gradients_are_clipped_to_grad_clip_after_unscaling():
    """A loss forced large: after train_step the global gradient norm is --grad-clip (it was
    far above), for two values of it; the scaler sees scale, unscale_, clip, step, update."""
    data = _uea_dummy_data()
    data.x_train[:] = np.random.default_rng(0).standard_normal(data.x_train.shape)
    x, mask, y = train_uea.to_batch(data, "train", np.arange(2), "cpu")
    calls, real_clip = [], torch.nn.utils.clip_grad_norm_

    def clipping(*args, **kwargs):
        calls.append("clip")
        return real_clip(*args, **kwargs)

    for clip in (0.5, 2.0):
        flags = ["--grad-clip", str(clip), "--dropout", "0", "--attn-dropout", "0"]
        cfg = train_uea.parse_config([*TINY, *flags])
        model, opt, _ = train_uea.build(cfg, data, torch.device("cpu"))
        with torch.no_grad():
            model.head.weight.mul_(1e3)  # a large loss, and large gradients behind the head
        torch.nn.functional.cross_entropy(model(x, mask)[0], y).backward()
        raw = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        calls.clear()
        with mock.patch.object(torch.nn.utils, "clip_grad_norm_", clipping):
            train_uea.train_step(
                model, opt, _RecordingScaler(calls), x, mask, y, cfg, contextlib.nullcontext()
            )
        norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
        assert raw > 10 * clip and norm == pytest.approx(clip, rel=1e-4)
        assert calls == ["scale", "unscale_", "clip", "step", "update"]


def test_train_uea_evaluates_the_first_every_eval_every_and_the_last_epoch(tmp_path):
    """6 epochs, --eval-every 2: TEST after epochs 1, 2, 4 and 6; with an evaluation that rises,
    then falls, best_test_acc is the peak (a tie keeps the first) and final the last."""
    _toy_uea(tmp_path)
    scores = iter([(0.5, 1.0), (0.9, 0.2), (0.9, 0.3), (0.6, 0.5)])  # a tie at epochs 2 and 4
    argv = [*TINY, "--dataset", "Toy", "--data-dir", str(tmp_path), "--epochs", "6"]
    with mock.patch.object(train_uea, "evaluate", lambda *args: next(scores)):
        result, printed = _uea_run([*argv, "--out", str(tmp_path / "r")])
    records = _log(tmp_path / "r")
    assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["epoch"] for r in records if "test_acc" in r] == [1, 2, 4, 6]
    assert [r["best_test_acc"] for r in records if "test_acc" in r] == [0.5, 0.9, 0.9, 0.9]
    best = (result["best_test_acc"], result["best_test_epoch"], result["final_test_acc"])
    assert best == (0.9, 2, 0.6)
    assert "\r" not in printed, "no progress bar in a log: a line per evaluation instead"
    bars = []

    class Bar(train_uea.tqdm):  # the progress bar's total: the steps left of the run
        def __init__(self, *args, **kwargs):
            bars.append(kwargs["total"])
            super().__init__(*args, **kwargs)

    scores = iter([(0.0, 1.0)] * 3)  # epoch 8; then every evaluation at 0 %: the first is best
    evaluate = mock.patch.object(train_uea, "evaluate", lambda *args: next(scores))
    with evaluate, mock.patch.object(train_uea, "tqdm", Bar):
        _uea_run([*argv, "--out", str(tmp_path / "r"), "--resume", "--epochs", "8"])
        zero, _ = _uea_run([*argv[:-2], "--epochs", "2", "--out", str(tmp_path / "z")])
    steps = -(-12 // train_uea.parse_config(argv).batch_size)  # a step per batch of 12 cases
    assert bars == [2 * steps, 2 * steps], "epochs 7 and 8; epochs 1 and 2"
    assert (zero["best_test_acc"], zero["best_test_epoch"]) == (0.0, 1), "0 % is a score too"


def test_train_uea_a_max_len_below_the_longest_series_clips_and_says_so(tmp_path):
    """--max-len 4 on Toy (every case 6 steps): each batch trained and tested on holds 4 steps,
    the model is built for 4, and the run says how many cases it clipped."""
    _toy_uea(tmp_path)
    argv = [*TINY, "--dataset", "Toy", "--data-dir", str(tmp_path), "--epochs", "1"]
    steps, real_step, real_evaluate = [], train_uea.train_step, train_uea.evaluate

    def train_step(model, opt, scaler, x, *rest):
        steps.append(x.shape[1])
        return real_step(model, opt, scaler, x, *rest)

    def evaluate(model, data, *rest):
        steps.append(data.x_test.shape[1])
        return real_evaluate(model, data, *rest)

    with mock.patch.object(train_uea, "train_step", train_step):
        with mock.patch.object(train_uea, "evaluate", evaluate):
            _, printed = _uea_run([*argv, "--max-len", "4", "--out", str(tmp_path / "r")])
    clips = "max_len 4 clips 12 of 12 TRAIN cases and 12 of 12 TEST cases (longest 6 and 6 steps)"
    assert clips in printed and steps and set(steps) == {4}
    ckpt = torch.load(tmp_path / "r" / "checkpoint.pt", weights_only=True)
    assert ckpt["model_config"]["max_len"] == ckpt["data"]["max_len"] == 4
    _, printed = _uea_run([*argv, "--max-len", "6", "--out", str(tmp_path / "six")])
    assert "clips" not in printed, "the longest series' length: nothing clipped"


def test_train_uea_a_constant_training_channel_is_said_and_does_not_blow_test_up(tmp_path):
    """A channel constant in TRAIN is said and centred, not scaled; no preset is said too."""
    folder = _toy_uea(tmp_path)
    train = folder / "Toy_TRAIN.ts"
    rows = train.read_text().split("@data\n")
    cases = [c.split(":") for c in rows[1].splitlines()]
    flat = [f"{a}:{','.join(['3.0'] * 6)}:{label}" for a, _, label in cases]
    train.write_text(rows[0] + "@data\n" + "\n".join(flat) + "\n")
    argv = ["--dataset", "Toy", "--data-dir", str(tmp_path), "--epochs", "1", "--d-model", "16"]
    result, printed = _uea_run([*argv, "--d-ff", "32", "--out", str(tmp_path / "r")])
    data = uea_data.load_uea(str(tmp_path), "Toy")
    assert "channels [1] are constant in TRAIN: centred, not scaled" in printed
    assert data.constant_channels == [1] and np.abs(data.x_test[..., 1]).max() < 10
    assert math.isfinite(result["final_test_acc"])
    assert result["preset"] == "default" and "Toy has no preset from the papers" in printed


def test_train_lra_and_test_train_uea_from_the_command_line(tmp_path):
    """The command line: settings first, RESULT last; missing data one line."""
    argv = _lra_args(tmp_path, tmp_path / "run", "--steps", "2", "--attention", "softmax")
    run = _cli("train_lra.py", *argv)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert json.loads(lines[0])["attention"] == "softmax" and lines[-1].startswith("RESULT ")
    assert "step 2  lr" in run.stdout  # stdout a pipe, no bar: a line per evaluation instead
    assert "twice the longest input" not in run.stdout  # no note for the preset's own max_len
    assert json.loads(lines[-1][len("RESULT ") :]) == _result_of(tmp_path / "run")
    run = _cli("train_uea.py", "--dataset", "Heartbeat", "--data-dir", str(tmp_path), cwd=tmp_path)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert str(tmp_path / "Heartbeat" / "Heartbeat_TRAIN.ts") in run.stderr
    assert "--download" in run.stderr and not (tmp_path / "runs").exists()


def _torchrun(script: str, *argv, ok=True) -> subprocess.CompletedProcess:
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [sys.executable, *torchrun, str(HERE / script), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=HERE, env=env, capture_output=True, text=True, timeout=120)
    assert (run.returncode == 0) is ok, run.stderr[-3000:]
    return run


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_torchrun_two_cpu_processes_match_one(tmp_path, script):
    """torchrun, 2 CPU processes (UEA: stopped after epoch 1, resumed): one process's weights; a
    refusal (LRA: the folder in use, UEA: a bad flag) said once, by rank 0."""
    # UEA: its attention dropout off too, and Adam (RAdam's first steps, lr x gradient, are too
    # small to tell two runs apart); 3 epochs of 1 step, so 2 follow the resume
    uea = ["--optimizer", "adam", "--attn-dropout", "0", "--epochs", "3"]
    more = ["--dropout", "0", *(uea if script == "train_uea.py" else [])]
    assert _train_both(tmp_path, script, tmp_path / "one", *more)[0]["device"] == "cpu x 1"
    argv = _argv(tmp_path, script, tmp_path / "two", *more)
    if script == "train_uea.py":  # the processes other than rank 0 resume too
        _torchrun(script, *argv, "--epochs", "1")
        argv.append("--resume")
    run = _torchrun(script, *argv)
    assert run.stdout.count("RESULT ") == 1 and "cpu x 2" in run.stdout, run.stderr[-3000:]
    paths = [tmp_path / r / "checkpoint.pt" for r in ("one", "two")]
    one, two = (torch.load(path, weights_only=True)["model"] for path in paths)
    # Adam turns a gradient of ~0 into a step of ±lr whose sign depends on rounding (the
    # all-reduce sums in another order), so a few weights may differ by ~lr; a broken DDP
    # (unsynchronised or unscaled gradients) changes nearly all of them.
    close = torch.cat([torch.isclose(one[k], two[k], atol=1e-5).flatten() for k in one])
    assert close.float().mean() > 0.97, f"only {close.float().mean():.1%} of weights agree"
    said = "is in use by another run" if script == "train_lra.py" else "not divisible by 2"
    with open(tmp_path / "two" / "lock", "a") as held:
        runs.fcntl.flock(held, runs.fcntl.LOCK_EX)
        flags = ["--batch-size", "3"] if script == "train_uea.py" else []
        run = _torchrun(script, *_argv(tmp_path, script, tmp_path / "two", *flags), ok=False)
    assert run.stderr.count(said) == 1, run.stderr[-3000:]
    for ours in (script, "runs.py"):  # no frame of ours: torchrun's summary only
        assert f'{ours}", line' not in run.stderr, run.stderr[-3000:]


# The run folder (runs.py): a transaction. Nothing of a run is lost, rewritten or mixed -------


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_compile_flag_and_a_diverged_run(tmp_path, script):
    """--compile wraps the model in torch.compile, --no-compile not; a NaN loss after the first
    checkpoint stops the run in one sentence, that checkpoint kept."""
    module, unit = SCRIPTS[script]
    for flag, calls in (("--compile", 1), ("--no-compile", 0)):
        with mock.patch.object(torch, "compile", mock.Mock(side_effect=lambda m, **kw: m)) as c:
            _train_both(tmp_path, script, tmp_path / flag, flag)
        assert c.call_count == calls and all(k.kwargs == {"dynamic": False} for k in c.mock_calls)
    real, count = module.train_step, [0]
    first = 2 if script == "train_lra.py" else 1  # steps before the first checkpoint (Toy: 1)

    def nan_after_the_first_checkpoint(*args):
        count[0] += 1
        loss, *rest = real(*args)
        return (loss * float("nan") if count[0] > first else loss, *rest)

    with mock.patch.object(module, "train_step", nan_after_the_first_checkpoint):
        message = _stops(tmp_path, script, tmp_path / "nan")
    assert "the training loss is nan" in message and "diverged" in message
    state = torch.load(tmp_path / "nan" / "checkpoint.pt", weights_only=True)["state"]
    assert state[unit] == first and not (tmp_path / "nan" / "result.json").exists()


def _stopped_after_the_first_checkpoint(tmp: pathlib.Path, script: str, out, *more) -> None:
    """A tiny run of either script into out, stopped by Ctrl-C after its first checkpoint."""
    module = SCRIPTS[script][0]
    real, calls = module.train_step, [0]
    per_checkpoint = 2 if script == "train_lra.py" else 1  # steps (Toy: 1 step an epoch)

    def ctrl_c_after_the_first_checkpoint(*args):
        calls[0] += 1
        if calls[0] == per_checkpoint + 1:
            raise KeyboardInterrupt
        return real(*args)

    with mock.patch.object(module, "train_step", ctrl_c_after_the_first_checkpoint):
        with pytest.raises(SystemExit) as stop:
            _train_both(tmp, script, out, *more)
    assert stop.value.code == 130


def _straight_and_resumed(tmp: pathlib.Path, script: str, *more, changed=()) -> tuple:
    """A run straight (tmp/a); one stopped by Ctrl-C after its first checkpoint (exit 130) and
    resumed with `changed` (tmp/b) -> (straight result, resumed result, [their two logs])."""
    more = [*(["--steps", "6"] if script == "train_lra.py" else ["--epochs", "3"]), *more]
    straight, _ = _train_both(tmp, script, tmp / "a", *more)
    _stopped_after_the_first_checkpoint(tmp, script, tmp / "b", *more)
    resumed, _ = _train_both(tmp, script, tmp / "b", *more, "--resume", *changed)
    return straight, resumed, [[{**r, "time_s": 0} for r in _log(tmp / r)] for r in "ab"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_a_run_interrupted_and_resumed_continues_exactly(tmp_path, script):
    """Ctrl-C after the first checkpoint, then --resume (on another device, compiled): as a
    straight run; other settings: refused. A fresh run seeds its dropout."""
    with mock.patch.object(torch, "compile", lambda model, **kw: model):
        changed = ["--device", "cpu", "--compile"]  # what --resume may change
        straight, resumed, logs = _straight_and_resumed(tmp_path, script, changed=changed)
    a, b = (torch.load(tmp_path / r / "checkpoint.pt", weights_only=True) for r in "ab")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert logs[0] == logs[1] and len(logs[0]) == 3
    for key in set(straight) - {"wall_s", "config"}:
        assert straight[key] == resumed[key], key
    more = ["--steps", "6"] if script == "train_lra.py" else ["--epochs", "3"]
    message = _stops(tmp_path, script, tmp_path / "b", *more, "--resume", "--lr", "1")
    assert "other settings" in message and "'lr'" in message
    # a checkpoint from a version with a setting this one lacks: a message, no KeyError
    ckpt = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=True)
    ckpt["config"]["accumulate"] = 2
    torch.save(ckpt, tmp_path / "b" / "checkpoint.pt")
    message = _stops(tmp_path, script, tmp_path / "b", *more, "--resume")
    assert "'accumulate': (2, None)" in message
    runs.restore(None, {}, {}, seed=7)  # each process its own seed (the scripts: seed + rank)
    first = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(first, torch.rand(3))
    cases = ((None, True, False), (torch.zeros(3), True, True), (torch.zeros(3), False, False))
    for cuda_rng, gpu, restored in cases:  # (saved, resumed where CUDA is, its RNG restored)
        ckpt = dict(rng=torch.get_rng_state(), state={}, cuda_rng=cuda_rng)
        with mock.patch.object(torch.cuda, "is_available", return_value=gpu):
            with mock.patch.object(torch.cuda, "set_rng_state") as set_cuda:
                runs.restore(ckpt, {}, {}, seed=7)
        assert set_cuda.called == restored, (cuda_rng, gpu)


def _edit(path: pathlib.Path, edit) -> None:
    """path's lines after the header (ListOps: its first line; a .ts file: up to @data) through
    edit(lines) -> lines."""
    head, body = re.match(r"(.*?@data\n|[^\n]*\n)(.*)", path.read_text(), re.S).groups()
    then = path.stat().st_mtime
    path.write_text(head + "".join(edit(body.splitlines(True))))
    os.utime(path, (then + 2, then + 2))  # a change the LRA cache sees: size or whole seconds


_DATA_CHANGES = [  # (script, the file changed, how, what the refusal names)
    ("train_uea.py", "Toy/Toy_TRAIN.ts", lambda rows: rows[:8],  # cut to 8 of its 12 cases
     "TRAIN series (12, 6, 2) then, (8, 6, 2) now; TRAIN labels (12,) then, (8,) now; "
     "TEST series: other values; standardisation statistics: other values"),
    ("train_uea.py", "Toy/Toy_TEST.ts", lambda rows: ["9.0" + rows[0][rows[0].index(","):],
     *rows[1:]], "TEST series: other values"),  # one value
    ("train_lra.py", "listops-quick/basic_train.tsv", lambda rows: [rows[0][:-2] + str(
     (int(rows[0][-2]) + 1) % 10) + "\n", *rows[1:]], "train y: other values"),  # one label
]  # fmt: skip


@pytest.mark.parametrize("script, file, edit, said", _DATA_CHANGES, ids=_id)
def test_runs_resume_refuses_data_that_changed_naming_what(tmp_path, script, file, edit, said):
    """Data changed between two starts (the counts, the values, TRAIN's standardisation
    statistics): --resume refuses in one sentence naming what changed, and goes on once the
    data are those the run began with (continuing exactly: the test above)."""
    data = tmp_path / "mine"  # UEA: not the Toy data _argv writes anew
    more = ["--steps", "6"] if script == "train_lra.py" else ["--epochs", "3"]
    more += ["--data-dir", str(data)]
    if script == "train_uea.py":
        _toy_uea(data)
    _stopped_after_the_first_checkpoint(tmp_path, script, tmp_path / "run", *more)
    before = (data / file).read_text()
    _edit(data / file, edit)
    message = _stops(tmp_path, script, tmp_path / "run", *more, "--resume")
    how = "resume with those, or start again with --overwrite"
    assert message == f"--resume: the data differ from those the run began with ({said}): {how}"
    (data / file).write_text(before)
    os.utime(data / file, (time.time() + 4, time.time() + 4))  # (as the edit: seen by the cache)
    result, _ = _train_both(tmp_path, script, tmp_path / "run", *more, "--resume")
    assert result["steps_reached" if script == "train_lra.py" else "epochs"] == int(more[1])


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_ctrl_c_says_how_to_go_on(tmp_path, script):
    """Ctrl-C: exit 130, one sentence: before the first checkpoint, that the same command starts
    again (what it left is no run: --resume says so too); after it, --resume from it."""
    module, unit = SCRIPTS[script]
    err = io.StringIO()
    interrupt = mock.patch.object(module, "train_step", mock.Mock(side_effect=KeyboardInterrupt))
    with interrupt, pytest.raises(SystemExit) as stop:
        _train_both(tmp_path, script, tmp_path / "run", printed=err)
    assert stop.value.code == 130 and os.listdir(tmp_path / "run") != ["lock"]
    assert "before the first checkpoint: the same command starts the run again" in err.getvalue()
    message = _stops(tmp_path, script, tmp_path / "run", "--resume")
    assert message.endswith("checkpoint.pt; start the run without --resume")
    _train_both(tmp_path, script, tmp_path / "run")  # the same command: a fresh run, all of it
    assert len(_log(tmp_path / "run")) == 2
    _train_both(tmp_path, script, tmp_path / "done")
    cfg = module.parse_config(_argv(tmp_path, script, tmp_path / "done", "--resume"))
    with contextlib.redirect_stderr(io.StringIO()) as err, pytest.raises(SystemExit) as stop:
        runs.run(mock.Mock(side_effect=KeyboardInterrupt), cfg, unit, ())
    done = 4 if unit == "step" else 2
    assert stop.value.code == 130
    assert f"interrupted; continue from its {unit} {done} with --resume" in err.getvalue()


@pytest.mark.parametrize("program", ["train_uea.py", "bench.py", "diagnose.py"])
def test_runs_ctrl_c_is_one_line_saying_what_was_kept(tmp_path, program):
    """SIGINT once the program has printed a known line (a UEA epoch, a bench row, a run's files
    diagnosed): one line on stderr saying what was kept, exit 130, no temporary file left."""
    if program == "train_uea.py":
        argv = _argv(tmp_path, program, tmp_path / "run", "--epochs", "100000")
        after, said = "epoch 1 ", r"interrupted; continue from its epoch \d+ with --resume"
    elif program == "bench.py":
        sizes = [str(64 * 2**i) for i in range(9)]
        argv = ["--kinds", "softmax", "--ns", *sizes, "--repeats", "9", "--csv", tmp_path / "b.csv"]
        after = "layer softmax"
        said = rf"interrupted: the rows measured so far \(\d+\) are in {tmp_path / 'b.csv'}"
    else:  # the same run 99 times: diagnosed one after the other
        argv = [_train_both(tmp_path, "train_uea.py", tmp_path / "run")[1] and tmp_path / "run"]
        after, said = "wrote summary.txt", r"interrupted: the files of \d+ runs are written, the "
        said += f"last to {tmp_path / 'run' / 'diagnose'}"
        argv *= 99
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, HERE / program, *argv]
    with subprocess.Popen(
        command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as run:
        assert any(line.startswith(after) for line in run.stdout), run.stderr.read()
        run.send_signal(signal.SIGINT)
        err = run.communicate(timeout=60)[1]
    assert run.returncode == 130 and re.fullmatch(f"\n{said}\n", err), err
    assert not list(tmp_path.rglob("*.tmp")), "no temporary file"
    if program == "bench.py":  # the rows said: the CSV's, each whole
        rows = list(csv.DictReader(open(tmp_path / "b.csv")))
        assert err.split("(")[1].startswith(f"{len(rows)})") and rows[-1]["mem_mib"]


@pytest.mark.parametrize(
    "script, cut", [("train_lra.py", "pipe"), ("diagnose.py", "pipe"), ("train_lra.py", "ctrl-c")]
)  # (train_uea.py: runs.run)
def test_runs_a_closed_stdout_or_ctrl_c_in_listops_workers_is_one_sentence(tmp_path, script, cut):
    """`| head` gone: a run stops as after Ctrl-C, said; diagnose.py writes its files. Ctrl-C while
    the paper preset's ListOps shards generate: the run's sentence alone; first a CPU note."""
    paper_preset = ["--device", "cpu", "--data-dir", tmp_path, "--out", tmp_path / "run"]
    argv = _argv(tmp_path, script, tmp_path / "run") if cut == "pipe" else paper_preset
    if script == "diagnose.py":  # a run to diagnose
        argv = [_train_both(tmp_path, "train_uea.py", tmp_path / "run")[1] and tmp_path / "run"]
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen([sys.executable, HERE / script, *argv], env=env, **kw) as run:
        if cut == "pipe":  # long before its first line (the imports take seconds)
            run.stdout.close()
        else:  # after its settings, 1.5 s into the data: the shards' workers run
            assert run.stdout.readline() and pytest.raises(subprocess.TimeoutExpired, run.wait, 1.5)
            os.killpg(run.pid, signal.SIGINT)
            out = run.stdout.read()  # what it printed after its settings
        err = run.communicate(timeout=120)[1]
    assert cut == "pipe" or out.endswith("preset is the GPU setting: on a CPU, --preset quick\n")
    why = "its output was closed" if cut == "pipe" else "interrupted"
    said = f"\n{why} before the first checkpoint: the same command starts the run again\n"
    assert (run.returncode, err) == ((0, "") if script == "diagnose.py" else (130, said)), err
    assert script != "diagnose.py" or (tmp_path / "run/diagnose/summary.txt").is_file()


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_one_run_per_folder_checked_under_the_lock(tmp_path, script):
    """A lock held elsewhere stops a run, touching nothing; kill -9 releases it. The folder is
    checked under the lock; a fresh run never overwrites a run; --overwrite starts it again."""
    out = tmp_path / "run"
    out.mkdir()
    hold = "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
    hold += "print('held', flush=True); time.sleep(60)"
    command = [sys.executable, "-c", hold, str(out / "lock")]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert "in use by another run" in _stops(tmp_path, script, out) and os.listdir(out) == ["lock"]
    holder.kill()
    holder.wait()
    real = runs.fcntl.flock

    def meanwhile(file, how):  # another run writes its files while this one waits for the lock
        (out / "checkpoint.pt").write_text("{}")
        return real(file, how)

    with mock.patch.object(runs.fcntl, "flock", meanwhile):
        assert "holds a run already" in _stops(tmp_path, script, out)
    (out / "checkpoint.pt").unlink()
    _train_both(tmp_path, script, out)
    before = _files(out)
    message = _stops(tmp_path, script, out, "--seed", "5")
    assert "holds a run already" in message and "--resume" in message and "--overwrite" in message
    assert _files(out) == before
    result, _ = _train_both(tmp_path, script, out, "--seed", "5", "--overwrite")
    assert result["seed"] == 5 and len(_log(out)) == 2
    assert _result_of(out)["config"]["out"] == str(out), "result.json holds the run's settings"


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_resume_refuses_what_it_cannot_continue(tmp_path, script):
    """--resume: a finished run is never rewritten (UEA: more epochs, config.json following);
    another script's checkpoint is named; a damaged one is said."""
    module, unit = SCRIPTS[script]
    out = tmp_path / "run"
    _train_both(tmp_path, script, out)
    before = _files(out)
    message = _stops(tmp_path, script, out, "--resume")
    assert f"finished its {4 if unit == 'step' else 2} {unit}s: nothing to resume" in message
    assert _files(out) == before
    assert ("continues it" in message) == (unit == "epoch"), "--steps may not change on --resume"
    if script == "train_uea.py":  # more epochs (and --download) continue it; config.json follows
        assert "--epochs above 2 continues it" in message
        result, _ = _train_both(tmp_path, script, out, "--resume", "--epochs", "3", "--download")
        assert result["epochs"] == 3 and len(_log(out)) == 3
        assert json.loads((out / "config.json").read_text())["epochs"] == 3
    other = "train_uea.py" if script == "train_lra.py" else "train_lra.py"
    _train_both(tmp_path, other, tmp_path / "other")
    message = _stops(tmp_path, script, tmp_path / "other", "--resume")
    what = "task listops" if other == "train_lra.py" else "dataset Toy"
    assert f"was written by {other} ({what}): resume it with {other}" in message
    for damage in (b"", b"\x80\x02garbage", (out / "checkpoint.pt").read_bytes()[:100]):
        (out / "checkpoint.pt").write_bytes(damage)
        message = _stops(tmp_path, script, out, "--resume")
        assert "checkpoint.pt is damaged" in message and "--overwrite" in message


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_a_checkpoint_that_would_run_code_is_refused_and_runs_nothing(tmp_path, script):
    """Every torch.load of the project is weights_only=True. A checkpoint as checkpoint() writes
    it, now and before (the RNG states: tensors), resumes; one holding what unpickling would call
    (open, making a file; numpy's RNG state, as other trainers save it) is refused by --resume,
    best.pt's reading and diagnose.py in one sentence (--resume: how to start again), unrun."""
    module, unit = SCRIPTS[script]
    out, made, real, calls = tmp_path / "run", tmp_path / "made", module.train_step, [0]

    def ctrl_c_after_the_first_checkpoint(*args):
        calls[0] += 1
        if calls[0] == (2 if script == "train_lra.py" else 1) + 1:
            raise KeyboardInterrupt
        return real(*args)

    with mock.patch.object(module, "train_step", ctrl_c_after_the_first_checkpoint):
        with pytest.raises(SystemExit):
            _train_both(tmp_path, script, out)
    file = out / "checkpoint.pt"
    ckpt = torch.load(file, weights_only=True)
    rngs = [ckpt["rng"], *([] if ckpt["cuda_rng"] is None else [ckpt["cuda_rng"]])]
    assert all(rng.dtype == torch.uint8 for rng in rngs), "the format before this version too"
    good = file.read_bytes()
    plants = [(_Calls(open, str(made), "w"), "io.open"), (np.random.get_state(), "numpy")]
    for plant, name in plants:
        torch.save(dict(ckpt, planted=plant), file)
        said = f"{file} asks for {name}"
        message = _stops(tmp_path, script, out, "--resume")
        which = "which no checkpoint of train_lra.py or train_uea.py holds: it is not read, as it"
        how = "could run code; start the run again with --overwrite, or choose another --out"
        assert message.startswith(said) and message.endswith(f"{which} {how}"), message
        with pytest.raises(SystemExit, match=re.escape(said)):
            runs.load(file)  # as train_lra.py reads best.pt
        with pytest.raises(SystemExit, match=re.escape(f"error: {said}")) as refused:
            diagnose.read_checkpoint(file)
        assert "it is not read, as it could run code" in str(refused.value) and not made.exists()
    torch.save(dict(ckpt, planted=_Calls(open, str(made), "w")), file)
    torch.load(file, weights_only=False)  # as it was read before: it runs
    assert made.exists()
    file.write_bytes(good)
    result, _ = _train_both(tmp_path, script, out, "--resume")
    assert result[f"{unit}s"] == (4 if unit == "step" else 2)
    sources = [
        f for f in [*HERE.glob("*.py"), *(HERE / ".ci").iterdir()] if f.name != "test_all.py"
    ]
    call = r"torch\.load\((?:[^()]|\([^()]*\))*\)"
    loads = [(f.name, line) for f in sources for line in re.findall(call, f.read_text())]
    assert len(loads) >= 3 and all("weights_only=True" in line for _, line in loads), loads


_FOLDER_STATES = [  # (state, files in the run folder, its checkpoint.pt, flag, outcome)
    # outcome: "started" (all it held removed), "resumed" (all kept), else the refusal's words
    ("no folder", None, None, "", "started"),
    ("empty", (), None, "", "started"),
    ("a start stopped before its first checkpoint", ("config.json", "metrics.jsonl"), None, "",
     "started"),
    ("temporaries and a diagnosis", ("checkpoint.pt.tmp", "diagnose/cosine.csv"), None, "",
     "started"),
    ("a run at step 2 of 4", ("config.json",), dict(step=2), "", "holds a run already"),
    ("a run at step 2 of 4", ("config.json",), dict(step=2), "--overwrite", "started"),
    ("a run at step 2 of 4", ("config.json",), dict(step=2), "--resume", "resumed"),
    ("a finished run", ("result.json",), dict(step=4), "", "holds a run already"),
    ("a finished run", ("result.json",), dict(step=4), "--resume", "finished its 4 steps"),
    ("a finished run", ("result.json",), dict(step=4), "--overwrite", "started"),
    ("a finished run, checkpoint.pt deleted", ("result.json",), None, "", "holds a run already"),
    ("a finished run, checkpoint.pt deleted", ("result.json",), None, "--resume",
     "no checkpoint at {out}/checkpoint.pt; start the run with --overwrite"),
    ("a finished run, checkpoint.pt deleted", ("result.json",), None, "--overwrite", "started"),
    ("empty", (), None, "--resume", "no checkpoint at {out}/checkpoint.pt; start the run without"),
    ("a run stopped in its final test", (), dict(step=4), "--resume", "resumed"),
    ("a run its --time-limit stopped", ("result.json",), dict(step=2), "--resume", "resumed"),
    ("a user's notes.txt beside a run", ("notes.txt",), dict(step=2), "--resume", "resumed"),
    ("a user's notes.txt beside a run", ("notes.txt",), dict(step=2), "",
     "holds files that no run wrote (notes.txt)"),
    ("a user's notes.txt beside a run", ("notes.txt",), dict(step=2), "--overwrite",
     "holds files that no run wrote (notes.txt)"),
    ("a user's notes.txt alone", ("notes.txt",), None, "", "holds files that no run wrote"),
    ("another script's run", (), dict(step=2, script="train_uea.py"), "--resume",
     "was written by train_uea.py"),
    ("a run without the script's name", (), dict(step=2, script=None), "--resume", "resumed"),
    ("an older UEA run", (), dict(step=2, script=None, config=dict(dataset="Toy")), "--resume",
     "was written by train_uea.py (dataset Toy)"),
    ("a run begun with --overwrite elsewhere", (), dict(step=2, config=dict(task="listops", lr=0.1,
     device="cpu", overwrite=True, out="elsewhere", compile=True)), "--resume", "resumed"),
    ("a run past its steps", ("result.json",), dict(step=5), "--resume", "finished its 5 steps"),
    ("a run with another --lr", (), dict(step=2, lr=0.5), "--resume",
     "ran with other settings (then, now): {{'lr': (0.5, 0.1)}}"),
    ("a run on another --device", (), dict(step=2, device="cuda"), "--resume", "resumed"),
    ("a damaged checkpoint.pt", (), "damaged", "--resume", "checkpoint.pt is damaged"),
]  # fmt: skip


@pytest.mark.parametrize(
    "state, names, ckpt, flag, outcome",
    _FOLDER_STATES,
    ids=[f"{s[0]}, {s[3] or 'a fresh start'}" for s in _FOLDER_STATES],
)
def test_runs_folder_states_start_resume_or_overwrite(tmp_path, state, names, ckpt, flag, outcome):
    """Each state of a run folder under each start: a fresh start replaces what no run is (a
    run: a checkpoint or a result), --resume goes on from an unfinished checkpoint whatever
    else is there, --overwrite removes what runs write; a refusal leaves every file as it was."""
    out = tmp_path / "run"
    if names is not None:
        out.mkdir()
    for name in names or ():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(f"the {name} of the run")
    if ckpt == "damaged":
        (out / "checkpoint.pt").write_bytes(b"\x80\x02not a checkpoint")
    elif ckpt is not None:
        config = dict(task="listops", lr=ckpt.get("lr", 0.1), device=ckpt.get("device", "cpu"))
        config = ckpt.get("config", config)
        saved = dict(config=config, script=ckpt.get("script", "train_lra.py"))
        if saved["script"] is None:  # an older checkpoint: its config's keys name the script
            del saved["script"]
        torch.save(dict(saved, state=dict(step=ckpt["step"])), out / "checkpoint.pt")
    before = _tree(out) if out.exists() else {}
    cfg = types.SimpleNamespace(task="listops", lr=0.1, device="cpu")
    cfg.resume, cfg.overwrite = flag == "--resume", flag == "--overwrite"
    try:
        if outcome in ("started", "resumed"):
            got = runs._open(cfg, out, "train_lra.py", "step", 4, runs.MAY_CHANGE)
        else:
            with pytest.raises(SystemExit) as stop:
                runs._open(cfg, out, "train_lra.py", "step", 4, runs.MAY_CHANGE)
            assert outcome.format(out=out) in str(stop.value), str(stop.value)
    finally:
        runs._lock.close()  # the lock _open took
    after = _tree(out)
    assert after.pop(pathlib.Path("lock")) == b"", "the lock file is created, empty"
    if outcome == "started":
        assert got is None, "a fresh start has no checkpoint"
        assert os.listdir(out) == ["lock"], "all the folder held is removed"
    else:
        assert after == before, "every file as it was"
    if outcome == "resumed":
        assert got["state"]["step"] == ckpt["step"], "the checkpoint to go on from"


@pytest.mark.parametrize("script, changes", [
    ("train_lra.py", {"download", "download_url", "cache", "time_limit"}),  # where data comes
    ("train_uea.py", {"download", "download_url", "epochs"}),  # from, the clock; more epochs
])  # fmt: skip
def test_runs_resume_may_change_the_data_flags_and_the_clock(script, changes):
    """What --resume lets a script's run change besides runs.MAY_CHANGE, written here by hand
    (none changes what is trained): each given anew continues the run."""
    module, start = SCRIPTS[script][0], mock.Mock(side_effect=_Reached)
    cfg = module.parse_config(["--out", "unused"])
    with mock.patch.object(runs, "start", start), pytest.raises(_Reached):
        module.main(cfg)
    assert set(start.call_args.args[4]) == changes


def test_runs_resume_sees_a_finished_run_of_any_length(tmp_path):
    """A run finished at step 5,000, past CPython's cache of small ints (where `is` would still
    pass for equal numbers): --resume says it is finished, as at 4 steps."""
    out = tmp_path / "run"
    out.mkdir()
    state = dict(step=int("5000"))  # a fresh int object, as loading a checkpoint gives
    ckpt = dict(config=dict(steps=5000), script="train_lra.py", state=state)
    torch.save(ckpt, out / "checkpoint.pt")
    (out / "result.json").write_text("{}")
    cfg = types.SimpleNamespace(resume=True, overwrite=False, steps=5000)
    try:
        with pytest.raises(SystemExit, match="finished its 5000 steps: nothing to resume"):
            runs._open(cfg, out, "train_lra.py", "step", int("5000"), set())
    finally:
        runs._lock.close()  # the lock _open took


def test_runs_an_out_that_is_a_file_and_a_system_without_fcntl(tmp_path):
    """--out naming a file: one sentence, the file untouched; no fcntl: said, and it runs."""
    (tmp_path / "file").write_text("mine")
    message = _stops(tmp_path, "train_uea.py", tmp_path / "file")
    assert "cannot write the run to" in message and "File exists" in message
    assert (tmp_path / "file").read_text() == "mine"
    with mock.patch.object(runs, "fcntl", None):
        result, printed = _train_both(tmp_path, "train_uea.py", tmp_path / "run")
    assert "is not locked; start one run per folder" in printed and result["epochs"] == 2


def test_runs_a_run_stopped_before_its_test_finishes_it_on_resume(tmp_path):
    """LRA killed during its final test (no result.json): --resume only tests, same result."""
    out = tmp_path / "run"
    straight, _ = _train_both(tmp_path, "train_lra.py", out)
    log = (out / "metrics.jsonl").read_text()
    (out / "result.json").unlink()
    with mock.patch.object(train_lra, "train_step", mock.Mock(side_effect=AssertionError)):
        resumed, _ = _train_both(tmp_path, "train_lra.py", out, "--resume")
    assert (out / "metrics.jsonl").read_text() == log
    for key in ("val_acc", "test_acc", "final_val_acc", "best_step", "steps"):
        assert resumed[key] == straight[key], key


@contextlib.contextmanager
def _write_fault(target: str, nth: int, fault: BaseException):
    """files.write fails at its nth file named target: half the bytes go into the temporary
    file, then fault is raised (a full disk, a lost permission, Ctrl-C), as the system would."""
    real, seen = open, [0]

    class Half(io.FileIO):
        def write(self, data):
            super().write(bytes(data)[: len(data) // 2])
            raise fault

    def faulty_open(path, mode="r", *args, **kwargs):
        if pathlib.Path(path).name.startswith(f"{target}.") and mode == "wb":
            seen[0] += 1
            if seen[0] == nth:
                return Half(path, mode)
        return real(path, mode, *args, **kwargs)

    with mock.patch.object(files, "open", faulty_open, create=True):
        yield


@pytest.mark.parametrize("script", SCRIPTS)
def test_runs_a_failed_write_is_one_sentence_and_leaves_no_partial_file(tmp_path, script):
    """A full disk half-way through the second checkpoint, or a lost permission: one sentence,
    the first checkpoint whole, no temporary file; --resume goes on. At the first checkpoint the
    sentence does not advise --resume. Ctrl-C: no temporary file."""
    out, full = tmp_path / "run", OSError(errno.ENOSPC, "No space left on device")
    with _write_fault("checkpoint.pt", 2, full):
        message = _stops(tmp_path, script, out)
    resume = "the run stops; --resume goes on from its last checkpoint"
    assert message == f"cannot write {out / 'checkpoint.pt'}: the disk is full: {resume}"
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]
    first = torch.load(out / "checkpoint.pt", weights_only=True)["state"]
    assert first[SCRIPTS[script][1]] == (2 if script == "train_lra.py" else 1)
    _train_both(tmp_path, script, out, "--resume")
    assert _result_of(out)
    with _write_fault("checkpoint.pt", 1, full):  # at the first: there is nothing to resume
        message = _stops(tmp_path, script, tmp_path / "first")
    again = "there is no checkpoint yet: once it is mended, the same command starts again"
    assert message == f"cannot write {tmp_path / 'first' / 'checkpoint.pt'}: the disk is full: " + (
        f"the run stops; {again}"
    )
    with _write_fault("checkpoint.pt", 1, KeyboardInterrupt()), pytest.raises(SystemExit) as stop:
        _train_both(tmp_path, script, tmp_path / "ctrl-c")
    assert stop.value.code == 130 and not list((tmp_path / "ctrl-c").glob("*.tmp"))
    resource = pytest.importorskip("resource")  # POSIX only, as SIGXFSZ
    log, limits = (out / "metrics.jsonl").read_bytes(), resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a signal ending pytest
    try:  # a disk full 20 bytes on, half way through the next log line: whole lines stay
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(log) + 20, limits[1]))
        with pytest.raises(SystemExit, match="^cannot write .*metrics.jsonl: File too large: "):
            runs.save(out / "metrics.jsonl", dict(step=99, note="a line longer than 20 bytes"))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert (out / "metrics.jsonl").read_bytes() == log
    with _write_fault("config.json", 1, PermissionError(errno.EACCES, "Permission denied")):
        message = _stops(tmp_path, script, tmp_path / "other")
    assert message.startswith(f"cannot write {tmp_path / 'other' / 'config.json'}: permission de")
    with pytest.raises(ValueError):  # JSON has no NaN: finish() says so before it saves
        runs.save(tmp_path / "nan.json", dict(a=math.nan))
    with mock.patch.object(os, "replace", side_effect=OSError("an error without strerror")):
        with pytest.raises(SystemExit, match=r"x.json: an error without strerror: the run stops"):
            runs.save(tmp_path / "x.json", {})


def test_runs_resume_drops_a_torn_last_line_of_the_log_and_says_so(tmp_path):
    """A log whose last line was cut by a kill: --resume says so, and the next line written
    starts a line of its own (no record glued onto half of one)."""
    out = tmp_path / "run"
    _train_both(tmp_path, "train_uea.py", out, "--epochs", "1")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "train_lo')
    printed = _train_both(tmp_path, "train_uea.py", out, "--resume", "--epochs", "2")[1]
    said = f"{out / 'metrics.jsonl'}: its last line, cut off, is dropped (22 characters without an"
    assert said in printed, printed
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == len(lines) + 1 and records[-1]["epoch"] == 2


@pytest.mark.parametrize("script", SCRIPTS, ids=_id)
def test_train_lra_and_train_uea_compile_by_default_on_cuda_only(script):
    """--compile's default, as --help says: on where CUDA is used, off on the CPU; a flag wins."""
    module = SCRIPTS[script][0]
    cases = (([], True), (["--device", "cpu"], False), (["--no-compile"], False))
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        for flags, compiled in cases:
            assert module.parse_config(flags).compile is compiled, flags
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        assert module.parse_config(["--compile"]).compile is True
        assert module.parse_config([]).compile is False


def test_runs_start_on_a_cpu_without_torchrun(tmp_path):
    """One process, rank 0 of 1, on the CPU: no mixed precision (--amp: CUDA), no checkpoint."""
    cfg = types.SimpleNamespace(out=str(tmp_path / "run"), device="cpu", amp=True)
    cfg.resume, cfg.overwrite = False, False
    try:
        with contextlib.redirect_stdout(io.StringIO()) as said:
            rank, world, device, autocast, ckpt = runs.start(cfg, "train_lra.py", "step", 4)
    finally:
        runs._lock.close()  # the lock start took
    assert (rank, world, device, ckpt) == (0, 1, torch.device("cpu"), None)
    assert not autocast._enabled, "autocast is off on the CPU"
    assert json.loads(said.getvalue()) == vars(cfg), "the settings, printed first"


# ----------------------------------------------------------------------------------------------
# diagnose.py
# ----------------------------------------------------------------------------------------------


def _diag_batch():
    """x (3, 10, 16) float64 (seed 0) and a right-padded mask of 10, 7 and 4 real tokens."""
    torch.manual_seed(0)
    mask = torch.arange(10) < torch.tensor([[10], [7], [4]])
    return torch.randn(3, 10, 16, dtype=torch.float64), mask


def _diag_cosine(hidden_per_batch: list, batches: list) -> torch.Tensor:
    """diagnose()'s cosine for a stand-in model without blocks whose hidden states are given."""
    model = mock.MagicMock(blocks=[], kinds=[], cfg=ModelConfig(n_features=1))
    model.side_effect = [(None, None, hidden) for hidden in hidden_per_batch]
    return diagnose.diagnose(diagnose.LoadedRun(model, batches, "toy", HERE))["cosine"]


def test_diagnose_cosine_similarity_known_cases_and_the_explicit_pairwise_mean():
    """1 for identical tokens, 0 for orthogonal ones, batch-weighted; the mean over pairs i != j."""
    torch.manual_seed(0)
    D = 8
    same = torch.randn(1, 1, D, dtype=torch.float64).expand(3, 6, D).clone()  # 3 sequences
    same[:, 4:] = 1e3 * torch.randn(3, 2, D, dtype=torch.float64)  # junk in the padding
    mask_same = torch.arange(6).expand(3, 6) < 4
    q, _ = torch.linalg.qr(torch.randn(D, D, dtype=torch.float64))
    orth = (q.T[:5] * torch.tensor([1.0, 2, 3, 4, 5], dtype=torch.float64)[:, None])[None]
    mask_orth = torch.ones(1, 5, dtype=torch.bool)
    hidden = [[same, same], [orth, torch.ones_like(orth)]]
    batches = [{"x": same, "mask": mask_same}, {"x": orth, "mask": mask_orth}]
    # layer 0: three sequences at 1, one at 0 -> the mean over the 4 sequences is 0.75
    expected = torch.tensor([0.75, 1.0], dtype=torch.float64)
    assert torch.allclose(_diag_cosine(hidden, batches), expected, atol=1e-12)
    x, mask = _diag_batch()
    cos, pairs = _diag_cosine([[x]], [{"x": x, "mask": mask}]), []
    for h, m in zip(x, mask, strict=True):
        unit = F.normalize(h[m], dim=-1)
        gram, n = unit @ unit.T, len(unit)  # every pair, i = j included
        pairs.append((gram.sum() - gram.diagonal().sum()) / (n * (n - 1)))
    assert torch.allclose(cos[0], torch.stack(pairs).mean(), atol=1e-12)


@pytest.mark.parametrize("style", ["lra", "uea"])
def test_diagnose_hooks_capture_exactly_the_attention_input(style):
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


def test_diagnose_two_tower_capture_keeps_the_first_tower():
    torch.manual_seed(0)
    cfg = ModelConfig(n_classes=2, max_len=10, vocab_size=7, two_tower=True, d_model=16, n_heads=2)
    model = Classifier(cfg).double().eval()
    x, x2 = torch.randint(1, 7, (2, 10)), torch.randint(1, 7, (2, 10))
    mask, mask2 = torch.ones(2, 10, dtype=torch.bool), torch.arange(10).expand(2, 10) < 6
    hidden, inputs = diagnose.capture(model, {"x": x, "mask": mask, "x2": x2, "mask2": mask2})
    _, _, alone = model.encode(x, mask)  # the shared encoder on the first document only
    assert all(torch.equal(a, b) for a, b in zip(hidden, alone, strict=True))
    assert torch.equal(inputs[1][0], model.blocks[1].norm1(alone[1]))
    assert torch.equal(inputs[1][1], mask)


def test_diagnose_sequences_are_spread_over_the_split():
    n_real = np.array([5, 1, 5, 5, 5, 5, 5, 5])  # sequence 1 has one real token: never chosen
    assert diagnose._spread(n_real, 3).tolist() == [0, 4, 7]
    assert diagnose._spread(n_real, None).tolist() == [0, 2, 3, 4, 5, 6, 7]
    assert diagnose._spread(n_real, 50).tolist() == [0, 2, 3, 4, 5, 6, 7]
    assert diagnose._spread(np.array([1, 0, 2]), 4).tolist() == [2]  # 2 real tokens: enough
    even = [round(i * 10 / 3) for i in range(4)]  # 4 of 11 at 0, 3.33, 6.67, 10: rounded
    assert diagnose._spread(np.full(11, 5), 4).tolist() == even == [0, 3, 7, 10]


def test_diagnose_agf_and_gfsa_responses_at_init_and_with_set_coefficients():
    """AGF: g ≡ 1 at init, then Σ θ̃_k P_k(s) by NumPy; GFSA: p(λ) = λ at (0, 1, 0), then Eq. 5,
    and G = p(Ā) has the eigenvalues p(λ)."""
    torch.manual_seed(0)
    layer = AGFAttention(16, 2, order=4, basis="legendre", fix_theta0=True).double()
    x, mask = _diag_batch()
    r = diagnose.agf_response(layer, x, mask, n_points=50)
    assert torch.equal(r["theta"], torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64))
    assert torch.allclose(r["g"], torch.ones(50, dtype=torch.float64), atol=1e-14)
    s_data = torch.sigmoid(layer.W_sigma(x[mask])).flatten().detach()  # the real tokens only
    for junk in (30.0, math.nan):  # padding unlike the real tokens, NaN too: never counted
        seen = diagnose.agf_response(layer, x.masked_fill(~mask[..., None], junk), mask)["s_seen"]
        assert np.allclose(seen.detach(), np.quantile(s_data, [0.05, 0.5, 0.95]), atol=1e-12)
    assert 0 < r["s_seen"][0] <= r["s_seen"][1] <= r["s_seen"][2] < 1
    with torch.no_grad():
        layer.poly_filter.theta.copy_(torch.tensor([0.5, -1.0, 0.3, -0.2]))
    r = diagnose.agf_response(layer, x, mask, n_points=50)
    theta = np.concatenate([[1.0], np.tanh([0.5, -1.0, 0.3, -0.2])])
    expected = np.polynomial.legendre.legval(r["s"].numpy(), theta)  # Σ θ̃_k P_k(s), NumPy
    assert np.allclose(r["g"].numpy(), expected, atol=1e-12)
    assert r["g"].std() > 0.1  # no longer flat
    K = 3
    layer = GFSAttention(16, 2, order=K, learn_w0=True, learn_w1=True).double()  # (0, 1, 0)
    r = diagnose.gfsa_response(layer, x, mask, n_points=41)
    assert torch.allclose(r["grid"], r["lam"].expand(2, -1), atol=1e-14)  # p(λ) = λ
    assert [e.shape for e in r["eig"]] == [(2, 10), (2, 7), (2, 4)]
    for e in r["eig"]:  # Ā is row-stochastic: its largest eigenvalue is 1
        assert torch.allclose(e.real.max(-1).values, torch.ones(2, dtype=torch.float64))
    with torch.no_grad():
        for w, value in ((layer.w0, [0.2, -0.1]), (layer.w1, [0.7, 1.3]), (layer.wK, [0.4, -0.6])):
            w.copy_(torch.tensor(value))
    r = diagnose.gfsa_response(layer, x, mask, n_points=41)
    w0, w1, wK, lam = layer.w0[:, None], layer.w1[:, None], layer.wK[:, None], r["lam"]
    eq5 = w0 + w1 * lam + wK * (lam + (K - 1) * (lam**2 - lam))  # GFSA Eq. 5 with Ā -> λ
    assert torch.allclose(r["grid"], eq5.detach(), atol=1e-14)
    # H = p(Ā) has the eigenvalues p(λ): check through traces, tr(H) = Σ p(λ), tr(H²) = Σ p(λ)²
    with torch.no_grad():
        matrix = diagnose.implied_matrix(layer, "gfsa", x, mask)
    a = r["a"][:, :, None]
    for b, eig in enumerate(r["eig"]):
        filt = matrix[b][:, mask[b]][:, :, mask[b]]  # (H, n, n)
        p = a[0] + a[1] * eig + a[2] * eig**2  # (H, n) complex
        assert torch.allclose(p.sum(-1).real, torch.einsum("hii->h", filt), atol=1e-10)
        assert torch.allclose((p**2).sum(-1).real, torch.einsum("hij,hji->h", filt, filt))


def test_diagnose_a_gfsa_layer_trained_exact_and_its_eigenvalue_panel():
    """high_order="exact": G = w0·I + w1·Ā + wK·Ā^K (Ā^K by matrix_power here) and p(λ) with λ^K;
    the eigenvalue panel plots |1 - λ| against |p(λ)| at each eigenvalue λ of Ā (complex ones)."""
    torch.manual_seed(0)
    K = 3
    layer = GFSAttention(16, 2, order=K, high_order="exact").double()
    with torch.no_grad():
        for w, value in ((layer.w0, [0.2, -0.1]), (layer.w1, [0.7, 1.3]), (layer.wK, [0.4, -0.6])):
            w.copy_(torch.tensor(value))
    x, mask = _diag_batch()
    with torch.no_grad():
        r = diagnose.gfsa_response(layer, x, mask, n_points=41)
        filt = diagnose.implied_matrix(layer, "gfsa", x, mask)
        attn = diagnose.implied_matrix(layer, "softmax", x, mask)
    w0, w1, wK = (w.detach().view(-1, 1) for w in (layer.w0, layer.w1, layer.wK))
    assert r["power"] == K
    assert torch.allclose(r["grid"], w0 + w1 * r["lam"] + wK * r["lam"] ** K, atol=1e-14)
    for b, real in enumerate(mask):
        a = attn[b][:, real][:, :, real]
        eye, power = torch.eye(int(real.sum()), dtype=F64), torch.linalg.matrix_power(a, K)
        g = w0[..., None] * eye + w1[..., None] * a + wK[..., None] * power
        assert torch.allclose(filt[b][:, real][:, :, real], g, atol=1e-12), b
    results = dict(kinds=["gfsa"], cosine=torch.zeros(2), layers=[dict(kind="gfsa", gfsa=r)])
    results["layers"][0]["spectrum"] = torch.ones(3)
    panels = {panel[0]: panel for figure in diagnose.figures(results) for panel in figure}
    _, x_name, y_name, _, curves = panels["gfsa_eigenvalues"]
    assert (x_name, y_name) == ("|1 - lambda|", "|p(lambda)|")
    eig = torch.cat(r["eig"], dim=1)
    assert eig.imag.abs().max() > 0.01, "no complex eigenvalue to tell |1 - λ| from 1 - |λ|"
    for h in range(2):
        lam = eig[h]
        distance, gain = curves[f"layer 1 head {h}"]
        p = w0[h] + w1[h] * lam + wK[h] * lam**K
        assert torch.allclose(distance, torch.sqrt((1 - lam.real) ** 2 + lam.imag**2)), h
        assert torch.allclose(gain, p.abs()), h


def test_diagnose_off_dc_gain_on_known_eigenvalues():
    """The summary's off-DC gain: mean |p(λ)| / |p(1)| over all λ but each sequence's 1."""
    eig = [torch.tensor([[1.0, 0.5, -0.25], [-0.25, 1.0, 0.5]], dtype=torch.complex128)]
    cases = {(0.0, 1.0, 0.0): 0.375, (0.0, 0.0, 1.0): 0.15625, (0.5, 0.0, 1.0): 0.65625 / 1.5}
    for (a0, a1, a2), expected in cases.items():
        a = torch.tensor([[a0, a0], [a1, a1], [a2, a2]], dtype=torch.float64)
        gfsa = dict(a=a, power=2, eig=eig, lam=torch.zeros(1), grid=torch.zeros(2, 1))
        layer = dict(kind="gfsa", n=[3], spectrum=torch.ones(3), gfsa=gfsa)
        results = dict(kinds=["gfsa"], cosine=torch.tensor([0.1, 0.2]), layers=[layer])
        run = diagnose.LoadedRun(None, [{"x": torch.zeros(1, 3)}], "toy", HERE)
        heads = [ln for ln in diagnose.summary(run, results) if ln.startswith("  head")]
        assert len(heads) == 2, heads
        for line in heads:  # both heads: the same λ in another order, the same gains
            found = re.search(r"off-DC gain ([\d.]+), Ā alone ([\d.]+)", line)
            assert float(found[1]) == pytest.approx(expected, abs=1e-3)
            assert float(found[2]) == pytest.approx(0.375, abs=1e-3)  # mean |λ| over λ ≠ 1


def _diag_heads(linear, x, n_heads):
    """(1, n, D) -> (H, n, d): a projection split into heads."""
    return linear(x)[0].view(x.shape[1], n_heads, -1).transpose(0, 1)


def _diag_dense_references(kind, layer, x, mask):
    """Each sequence's real-token N x N matrix (H, n, n), built here without diagnose.py."""
    out, H = [], layer.n_heads
    for b in range(len(x)):
        xb = x[b : b + 1, mask[b]]  # cropped to the real tokens
        n = xb.shape[1]
        if kind in ("softmax", "gfsa"):  # Ā = softmax(QKᵀ/√d) per head
            q, k, _ = layer.W_qkv(xb)[0].view(n, 3, H, -1).permute(1, 2, 0, 3)  # (H, n, d) each
            attn = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
            if kind == "softmax":
                out.append(attn)
                continue
            eye, K = torch.eye(n, dtype=x.dtype), layer.order
            w0, w1, wK = (w.view(-1, 1, 1) for w in (layer.w0, layer.w1, layer.wK))
            out.append(w0 * eye + w1 * attn + wK * (attn + (K - 1) * (attn @ attn - attn)))
        elif kind == "agf":  # A = U diag(g) Vᵀ, g = Σ θ̃_k P_k(s) with NumPy's Legendre P_k
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
def test_diagnose_implied_matrix_equals_an_independent_dense_reference(kind):
    torch.manual_seed(0)
    layer = {
        "softmax": lambda: SoftmaxAttention(16, 2),
        "agf": lambda: AGFAttention(16, 2, order=3, basis="legendre"),
        "gfsa": lambda: GFSAttention(16, 2, order=4, w0=0.3),
        "primal": lambda: PrimalAttention(16, 2, rank=3, rank_multi=2, max_len=10),
    }[kind]().double()
    layer.eval()
    with torch.no_grad():  # non-trivial filters (at init AGF has g ≡ 1, GFSA is plain Ā)
        if kind == "agf":
            layer.poly_filter.theta.normal_()
        if kind == "gfsa":
            layer.wK.normal_()
    x, mask = _diag_batch()
    junk = x.masked_fill(~mask[..., None], 1e3)  # padding must not change any real entry
    with torch.no_grad():
        ours = diagnose.implied_matrix(layer, kind, x, mask)
        ours_junk = diagnose.implied_matrix(layer, kind, junk, mask)
        references = _diag_dense_references(kind, layer, x, mask)
    for b, ref in enumerate(references):  # each (H, n, n)
        for m in (ours, ours_junk):
            assert torch.allclose(m[b][:, mask[b]][:, :, mask[b]], ref, atol=1e-10), (kind, b)


def _diag_mixed_run():
    """An untrained 4-layer UEA-style model with one layer of each kind, and its diagnosis."""
    torch.manual_seed(0)
    kinds, primal = ["softmax", "agf", "gfsa", "primal"], {"primal": {"rank": 3, "rank_multi": 2}}
    shape = dict(n_classes=3, max_len=10, n_features=16, style="uea", d_model=16, n_heads=2)
    cfg = ModelConfig(**shape, n_layers=4, attention=kinds, attention_kwargs=primal)
    model = Classifier(cfg).double().eval()
    with torch.no_grad():
        model.blocks[1].attn.poly_filter.theta.normal_()
        model.blocks[2].attn.wK.normal_()
    x, mask = _diag_batch()
    batches = [{"x": x[:2], "mask": mask[:2]}, {"x": x[2:], "mask": mask[2:]}]
    accuracy, weights = {"val_acc": 0.25, "test_acc": 0.0}, "best.pt (step 8, best val_acc)"
    run = diagnose.LoadedRun(model, batches, "toy", HERE, accuracy, weights)
    return run, diagnose.diagnose(run, dense_sequences=2, n_points=21)


def test_diagnose_spectra_of_a_mixed_model_are_those_of_the_captured_inputs():
    run, results = _diag_mixed_run()
    x, mask = torch.cat([b["x"] for b in run.batches]), torch.cat([b["mask"] for b in run.batches])
    _, inputs = diagnose.capture(run.model, {"x": x[:2], "mask": mask[:2]})
    for (xi, mi), block, layer in zip(inputs, run.model.blocks, results["layers"], strict=True):
        matrix, shares = diagnose.implied_matrix(block.attn, layer["kind"], xi, mi), []
        for b in range(2):
            sigma = torch.linalg.svdvals(matrix[b][:, mask[b]][:, :, mask[b]])
            assert torch.allclose(layer["sigma"][b], sigma, atol=1e-10), layer["kind"]
            share = sigma.cumsum(-1) / sigma.sum(-1, keepdim=True)
            shares.append(F.pad(share, (0, 10 - share.shape[1]), value=1.0))
        assert layer["n"] == [10, 7]
        assert torch.allclose(layer["spectrum"], torch.cat(shares).mean(0), atol=1e-12)
        assert (layer["spectrum"].diff() >= -1e-12).all() and layer["spectrum"][-1] == 1.0


def test_diagnose_report_csv_files_and_plots_from_a_mixed_model(tmp_path):
    run, results = _diag_mixed_run()
    lines = diagnose.summary(run, results)
    assert lines[0] == "toy: 3 sequences, 2 of them for the N x N analyses"
    assert lines[1] == "weights: best.pt (step 8, best val_acc): val_acc 0.2500, test_acc 0.0000"
    no_result = diagnose.summary(run._replace(accuracy={}), results)[1]
    assert no_result.endswith("best val_acc): result.json has no accuracy of them")
    kinds = r"\s+\d+\s+(embedding|softmax|agf|gfsa|primal)"
    table = [ln.split() for ln in lines if re.match(kinds, ln)]
    assert [row[1] for row in table] == ["embedding", "softmax", "agf", "gfsa", "primal"]
    assert np.allclose([float(r[2]) for r in table], results["cosine"].numpy(), atol=5e-4)
    for row, layer in zip(table[1:], results["layers"], strict=True):
        spectrum = layer["spectrum"]
        assert float(row[3]) == pytest.approx(spectrum[0].item(), abs=5e-4)
        assert int(row[4]) == int((spectrum < 0.9).sum()) + 1  # first k at >= 90 %
    [agf] = [ln for ln in lines if ln.startswith("AGF layer 2: θ̃ = ")]  # every θ̃_k, θ̃_0 too
    printed = [float(t) for t in agf.split("= ")[1].split(" (")[0].split()]
    assert printed == pytest.approx(results["layers"][1]["agf"]["theta"].tolist(), abs=5e-4)
    assert agf.endswith(f"({sum(t < 0 for t in printed)} of {len(printed)} < 0)")
    assert sum(ln.startswith("  head") for ln in lines) == 2  # GFSA: one line per head
    data, out = diagnose.figures(results), io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.dict(sys.modules, {"matplotlib": None}):
        paths = diagnose.save_figures(data, tmp_path)
    assert "matplotlib is not installed: CSV files only (pip install matplotlib" in out.getvalue()
    names = "cosine_similarity agf_filter gfsa_filter gfsa_eigenvalues singular_values".split()
    assert [p.name for p in paths] == [f"{n}.csv" for n in names]
    tables = {}
    for path in paths:  # every row has one value per column, all but the label parse as numbers
        header, *body = list(csv.reader(open(path)))
        assert header[0] == "curve" and body and all(len(row) == 3 for row in body), path.name
        assert all(math.isfinite(float(v)) for row in body for v in row[1:])
        tables[path.stem] = body
    cosine, g = results["cosine"].tolist(), results["layers"][1]["agf"]["g"].tolist()
    assert [float(r[2]) for r in tables["cosine_similarity"]] == pytest.approx(cosine, rel=1e-5)
    assert [float(r[2]) for r in tables["agf_filter"]] == pytest.approx(g, abs=1e-5)
    grid = [float(r[2]) for r in tables["gfsa_filter"] if r[0] == "layer 3 head 1"]
    assert grid == pytest.approx(results["layers"][2]["gfsa"]["grid"][1].tolist(), abs=1e-5)
    assert len(tables["gfsa_eigenvalues"]) == 2 * (10 + 7)  # heads x eigenvalues of 2 sequences
    for kind, i in (("primal", 4), ("agf", 2)):
        curve = [float(r[2]) for r in tables["singular_values"] if r[0] == f"layer {i} {kind}"]
        assert curve == pytest.approx(results["layers"][i - 1]["spectrum"].tolist(), rel=1e-5)

    def subplots(rows, cols, **kwargs):  # a stub plt.subplots that keeps what it makes
        figure = mock.MagicMock()  # whose savefig writes the name of the file it was given
        figure.savefig.side_effect = lambda f, **kw: f.write(pathlib.Path(f.name).name.encode())
        made.append((figure, [[mock.MagicMock() for _ in range(cols)]]))
        return made[-1]

    made, plt = [], mock.MagicMock(**{"subplots.side_effect": subplots})
    with mock.patch.dict(sys.modules, {"matplotlib": mock.MagicMock(pyplot=plt)}):
        with mock.patch.dict(sys.modules, {"matplotlib.pyplot": plt}):
            paths = diagnose.save_figures(data, tmp_path)
    png = [f"{n}.png" for n in names if n != "gfsa_eigenvalues"]
    assert [p.name for p in paths if p.suffix == ".png"] == png
    saved = [(tmp_path / name).read_text() for name in png]  # renamed once written whole
    assert [re.sub(rf"\.{os.getpid()}-\d+\.tmp$", "", name) for name in saved] == png
    assert not list(tmp_path.glob("*.tmp"))
    assert [len(axes[0]) for _, axes in made] == [1, 1, 2, 1]  # GFSA: grid and eigenvalues
    (x, y, style), _ = made[0][1][0][0].plot.call_args  # the cosine curve, embedding first
    assert x == [0, 1, 2, 3, 4] and y == pytest.approx(cosine) and style == "o-"
    # floats with 6 significant digits, however small or large; other values as they are
    rows = [[1.5e-7, "agf"], [123456789.0, 2]]
    lines = diagnose.write_csv(tmp_path / "x.csv", ["a", "b"], rows).read_text().splitlines()
    assert lines == ["a,b", "1.5e-07,agf", "1.23457e+08,2"]


def test_diagnose_read_checkpoint_picks_the_weights_or_says_they_are_not_there(tmp_path):
    """Weights not there, or not the file's: one line (which file: the end-to-end tests)."""
    saved = dict(model={}, model_config={}, data={})
    last, best = tmp_path / "checkpoint.pt", tmp_path / "best.pt"
    with pytest.raises(diagnose.NotARun, match="a folder without checkpoint.pt or best.pt"):
        diagnose.read_checkpoint(tmp_path, "best")  # no file at all: no run, skipped
    with pytest.raises(SystemExit, match="^error: one line$"):
        diagnose._fail("one\n    line")
    torch.save(dict(saved, optimizer={}), last)
    with pytest.raises(SystemExit, match=r"has no best.pt \(a UEA run keeps only its last"):
        diagnose.read_checkpoint(tmp_path, "best")
    torch.save(saved, best)
    for file, weights, kept in ((best, "last", "best"), (last, "best", "last")):
        with pytest.raises(SystemExit, match=f"{file.name} holds the {kept} weights, not --we"):
            diagnose.read_checkpoint(file, weights)


_LRA_RESULT = dict(best_step=80, val_acc=0.4, test_acc=0.0, final_val_acc=0.35, steps=150)
_UEA_RESULT = dict(best_test_acc=0.9, best_test_epoch=12, final_test_acc=0.8, epochs=30)
_LRA_LAST = dict(optimizer={}, state=dict(step=150, best_step=80))  # an LRA checkpoint.pt
_UEA_LAST = dict(optimizer={}, data={"name": "Toy"}, state=dict(epoch=30))


@pytest.mark.parametrize("ckpt, result, weights, accuracy", [
    # LRA best.pt: the run's val_acc chose it, its test_acc measured it (0.0 is an accuracy)
    ({}, _LRA_RESULT, "best.pt (step 80, best val_acc)", dict(val_acc=0.4, test_acc=0.0)),
    (dict(step=70, val_acc=0.5), None, "best.pt (step 70, best val_acc)", dict(val_acc=0.5)),
    ({}, None, "best.pt (best val_acc)", {}),
    # LRA checkpoint.pt: the last step; of the result.json accuracies only final_val_acc is its
    (_LRA_LAST, _LRA_RESULT, "checkpoint.pt (step 150, last)", dict(final_val_acc=0.35)),
    (_LRA_LAST, dict(_LRA_RESULT, steps=200), "checkpoint.pt (step 150, last)", {}),
    # UEA checkpoint.pt: the last epoch: final_test_acc, never best_test_acc (another epoch's)
    (_UEA_LAST, _UEA_RESULT, "checkpoint.pt (epoch 30, last)", dict(final_test_acc=0.8)),
    (_UEA_LAST, dict(_UEA_RESULT, epochs=40), "checkpoint.pt (epoch 30, last)", {}),  # running
    (_UEA_LAST, None, "checkpoint.pt (epoch 30, last)", {}),
])  # fmt: skip
def test_diagnose_which_weights_and_their_accuracies(ckpt, result, weights, accuracy, tmp_path):
    if result:
        (tmp_path / "result.json").write_text(json.dumps(result))
    file = tmp_path / ("checkpoint.pt" if "optimizer" in ckpt else "best.pt")
    assert diagnose.which_weights({"data": {}, **ckpt}, file) == (weights, accuracy)


@pytest.fixture(scope="module")
def uea_runs(tmp_path_factory):
    """Two 1-epoch JapaneseVowels runs, tiny models: AGF, and GFSA unmasked (as official UEA)."""
    _real_uea()
    tmp, runs = tmp_path_factory.mktemp("uea"), []
    for attention, *extra in (["agf"], ["gfsa", "--no-attention-mask"]):
        runs.append(tmp / attention)
        argv = [*TINY, "--attention", attention, "--epochs", "1", "--device", "cpu", *extra]
        argv += ["--out", str(runs[-1]), "--data-dir", str(UEA_DIR)]
        _uea_run(argv)
    return runs


def _diag_main(argv: list) -> tuple[list, str]:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        results = diagnose.main([str(a) for a in argv])
    return results, out.getvalue()


def _diag_accuracy(loaded: diagnose.LoadedRun, y: np.ndarray) -> float:
    """The accuracy of the loaded model on its batches (all of a split, in order), labels y."""
    with torch.no_grad():
        pred = torch.cat([loaded.model(b["x"], b["mask"])[0].argmax(-1) for b in loaded.batches])
    assert len(pred) == len(y)
    return (pred.numpy() == y).mean()


def test_diagnose_uea_runs_a_sweep_table_and_its_glob_again(uea_runs, tmp_path, monkeypatch):
    """Each run's report, weights, accuracy; a fixed-width table, its CSV beside the runs; the glob
    again with those and an unreadable run: skipped, noted; twice --split train: beside them."""
    monkeypatch.chdir(tmp_path)
    sweep, args = uea_runs[0].parent, ["--dense", "3", "--batches", "2", "--batch-size", "8"]
    results, printed = _diag_main([*uea_runs, *args])
    assert not list(tmp_path.iterdir())  # nothing written here
    table = printed[printed.index("cosine similarity per layer") :].splitlines()[1:4]
    assert len({len(line) for line in table}) == 1  # fixed width: every line ends on a number
    columns = "run weights attention layers cos_per_layer cos_last final_test_acc"
    assert table[0].split() == columns.split()
    rows = list(csv.DictReader(open(sweep / "comparison.csv")))
    curves = list(csv.DictReader(open(sweep / "cosine_per_layer.csv")))  # the plot's data
    y = load_uea(str(UEA_DIR), "JapaneseVowels").y_test
    for line, row, run, res in zip(table[1:], rows, uea_runs, results, strict=True):
        result = json.loads((run / "result.json").read_text())
        acc, kind = result["final_test_acc"], result["attention"]
        summary = (run / "diagnose" / "summary.txt").read_text().splitlines()
        assert summary[0].startswith(f"JapaneseVowels test, attention {kind}, 2 layers: 16 seque")
        assert summary[1] == f"weights: checkpoint.pt (epoch 1, last): final_test_acc {acc:.4f}"
        assert summary[1] + "\n" in printed  # the last epoch's accuracy: not best_test_acc
        blank_before = "\n\n" + summary[0] + "\n" in printed
        assert blank_before == (run != uea_runs[0]), "a blank line between runs, none first"
        files = {p.name for p in (run / "diagnose").iterdir()}
        assert {"summary.txt", f"{kind}_filter.csv", "singular_values.csv"} <= files
        # the rebuilt model, weights and data reproduce the accuracy printed beside them
        loaded = diagnose.load_run(run, n_cases=None, batch_size=128)
        assert _diag_accuracy(loaded, y) == pytest.approx(acc)
        assert loaded.accuracy == {"final_test_acc": acc}
        cosine = [r.split()[2] for r in summary if re.match(r"\s+\d+\s+(embedding|agf|gfsa)\s", r)]
        weights = rf"\s+checkpoint\.pt \(epoch 1, last\)\s+{kind} "
        assert re.match(re.escape(str(run)) + weights, line), line
        cells = line.split()
        assert cells[-6:-2] == ["2", *cosine]  # layers, the summary's column, embedding first
        assert float(cells[-2]) == pytest.approx(res["cosine"][-1].item(), abs=5e-5)
        assert float(cells[-1]) == pytest.approx(acc, abs=5e-5)
        assert row["run"] == str(run) and row["cos_per_layer"] == " ".join(cosine)
        assert row["weights"] == "checkpoint.pt (epoch 1, last)" and "best_test_acc" not in row
        assert float(row["final_test_acc"]) == pytest.approx(acc, rel=1e-5)
        ys = [float(r["cosine similarity"]) for r in curves if r["curve"] == run.name]
        assert ys == pytest.approx(res["cosine"].tolist(), abs=1e-5)
    # the unmasked (official UEA) model: its attention sees every step, so n = the padded length
    assert all(n == 26 for layer in results[1]["layers"] for n in layer["n"])
    assert any(n < 26 for layer in results[0]["layers"] for n in layer["n"])
    _diag_main([*uea_runs, *args, "--out", sweep / "diagnosis"])
    (sweep / "bad").mkdir()  # a run that cannot be read: skipped with its reason, not the end
    (sweep / "bad" / "checkpoint.pt").write_text("not a checkpoint")
    bad = _diag_error([sweep / "bad"]).removeprefix("error: no run to diagnose: ")
    matched = sorted(sweep.iterdir())  # runs/sweep/*
    assert {p.name for p in matched} >= {"comparison.csv", "cosine_per_layer.csv", "diagnosis"}
    notes = [f"{p} is a file, not a run folder or *.pt" for p in matched if p.is_file()]
    notes += [bad, f"{sweep / 'diagnosis'} is a folder without checkpoint.pt or best.pt"]
    files = lambda: {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}  # noqa: E731
    tested, seen = files(), []  # then the glob, twice as it was and twice --split train:
    for out in ([], ["--out", sweep / "diagnosis"], *[["--split", "train"]] * 2):
        again, printed = _diag_main([*matched, *args, *out])
        assert [r["row"] for r in again] == [r["row"] for r in results] or out[0] == "--split"
        skipped = [line for line in printed.splitlines() if line.startswith("skipped: ")]
        assert skipped == [f"skipped: {note}" for note in notes]
        seen.append(files())
    assert seen[0] == seen[1] == tested and seen[2] == seen[3] and not list(tmp_path.iterdir())
    assert {p: seen[3][p] for p in tested} == tested and sweep / "comparison_train.csv" in seen[3]
    for run in uea_runs:  # its own files, named for the split, beside the test split's
        first = (run / "diagnose" / "train" / "summary.txt").read_text().splitlines()[0]
        assert first.startswith(f"JapaneseVowels train, attention {run.name}, 2 layers: 16 ")
    check = "import sys, diagnose; print(sorted({'train_lra', 'train_uea'} & set(sys.modules)))"
    imported = subprocess.run(
        [sys.executable, "-c", check], cwd=HERE, capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0 and imported.stdout.strip() == "[]", imported.stderr


def _diag_error(argv: list) -> str:
    """The one-line message of a bad input (SystemExit with a string: printed, exit status 1)."""
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stdout(io.StringIO()):
        diagnose.main([str(a) for a in argv])
    message = stop.value.code
    assert isinstance(message, str) and message.startswith("error: ") and "\n" not in message
    return message


def test_diagnose_bad_input_gets_one_clear_line(uea_runs, tmp_path):
    message = f"error: no run to diagnose: {tmp_path} is a folder without checkpoint.pt or best.pt"
    assert _diag_error([tmp_path]) == message
    assert "is no run folder" in _diag_error([tmp_path / "nowhere"])
    (tmp_path / "table.csv").write_text("run\n")
    assert "table.csv is a file, not a run folder or *.pt" in _diag_error([tmp_path / "table.csv"])
    # a checkpoint of a run from before checkpoints held the model's settings
    torch.save({"model": {}, "config": {"seed": 1}}, tmp_path / "checkpoint.pt")
    assert "written by an older train_*.py" in _diag_error([tmp_path])
    (tmp_path / "best.pt").write_text("not a checkpoint")
    assert "best.pt cannot be read as a checkpoint" in _diag_error([tmp_path / "best.pt"])
    message = _diag_error([uea_runs[0], "--data-dir", tmp_path])  # the data is not there
    assert "JapaneseVowels is not in" in message and "point --data-dir at its data" in message
    (tmp_path / "JapaneseVowels").symlink_to(tmp_path / "gone")  # said as uea_data says it
    message = _diag_error([uea_runs[0], "--data-dir", tmp_path])
    assert f"JapaneseVowels is a symbolic link to {tmp_path / 'gone'}, which does not" in message
    (tmp_path / "JapaneseVowels").unlink()
    denied = PermissionError(13, "Permission denied")  # a run folder one may only read
    with mock.patch.object(pathlib.Path, "mkdir", side_effect=denied):
        message = _diag_error([uea_runs[0]])
    summary = uea_runs[0] / "diagnose" / "summary.txt"
    assert message == f"error: cannot write {summary}: permission denied: choose a folder to " + (
        "write to with --out"
    )
    ckpt = torch.load(uea_runs[0] / "checkpoint.pt", weights_only=True)
    ckpt["model_config"]["n_layers"] = 3
    (tmp_path / "other").mkdir()
    torch.save(ckpt, tmp_path / "other" / "checkpoint.pt")
    assert "do not fit the model of its settings" in _diag_error([tmp_path / "other"])
    with mock.patch.object(diagnose, "_spread", return_value=np.array([], dtype=int)):
        message = _diag_error([uea_runs[0]])  # as if every sequence had fewer than 2 real tokens
    assert f"no sequence of the test split of {uea_runs[0]} has 2 real tokens" in message
    usage = [([uea_runs[0], "--out", tmp_path], "same folder name")]  # flags alone: below
    usage += [] if torch.cuda.is_available() else [(["--device", "cuda"], "no CUDA device")]
    for flags, what in usage:  # argparse errors: exit status 2
        with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
            diagnose.main([str(a) for a in (uea_runs[0], *flags)])
        assert stop.value.code == 2 and what in err.getvalue()
    # the real command line: exit status 1, one line on stderr, no traceback
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, HERE / "diagnose.py", tmp_path / "nowhere"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: ")


_DIAG_BAD_FLAGS = [  # (flags, argparse's one sentence): the wrong flag named alone, exit 2
    (["--batches", "0"], "--batches must be at least 1, got 0"),
    (["--batch-size", "-1"], "--batch-size must be at least 1, got -1"),
    (["--dense", "0"], "--dense must be at least 1, got 0"),
    (["--points", "0"], "--points must be at least 1, got 0"),
    (["--dense", "2", "--points", "0", "--batches", "3"], "--points must be at least 1, got 0"),
    (["--data-dir", ""], "--data-dir '' names no folder: leave it out for each run's own"),
    (["--data-dir", " "], "--data-dir ' ' names no folder"),
]


@pytest.mark.parametrize("flags, said", _DIAG_BAD_FLAGS)
def test_diagnose_a_bad_flag_is_named_alone_before_any_run_is_read(flags, said, tmp_path):
    with mock.patch.object(diagnose, "load_run", side_effect=AssertionError("a run was read")):
        with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
            diagnose.main([str(tmp_path), *flags])
    assert stop.value.code == 2 and f"error: {said}" in err.getvalue().splitlines()[-1]


def test_diagnose_end_to_end_on_an_lra_run_best_and_last_weights(tmp_path):
    """diagnose.py on a tiny ListOps run of train_lra.py: best.pt by default (its test_acc) and
    --weights last (checkpoint.pt, its final_val_acc), each printed and reproduced."""
    more = "--steps 6 --device cpu --attention primal+trans".split()
    result = _lra_run(_lra_args(tmp_path / "data", tmp_path / "lra", *more))
    folder = tmp_path / "lra"
    [res], printed = _diag_main([folder, "--batches", "2", "--dense", "2"])
    assert res["kinds"] == ["softmax", "primal"] and res["cosine"].shape == (3,)
    assert len(res["layers"][1]["sigma"]) == 2 and res["layers"][1]["sigma"][0].shape[0] == 2
    best = f"weights: best.pt (step {result['best_step']}, best val_acc): val_acc "
    assert f"{best}{result['val_acc']:.4f}, test_acc {result['test_acc']:.4f}\n" in printed
    _, printed = _diag_main([folder, "--batches", "1", "--dense", "2", "--weights", "last"])
    last = f"weights: checkpoint.pt (step 6, last): final_val_acc {result['final_val_acc']:.4f}"
    assert last + "\n" in printed  # written beside the analysis of best.pt, not over it
    assert (folder / "diagnose" / "last" / "summary.txt").read_text().splitlines()[1] == last
    assert (folder / "diagnose" / "summary.txt").read_text().splitlines()[1].startswith(best)
    # each choice loads exactly that file's weights, which reproduce the accuracy printed
    choices = [("best", "best.pt", "test", "test_acc")]
    for weights, file, split, key in choices + [("last", "checkpoint.pt", "val", "final_val_acc")]:
        loaded = diagnose.load_run(folder, split=split, n_cases=None, weights=weights)
        saved = torch.load(folder / file, weights_only=True)
        assert all(torch.equal(v, saved["model"][k]) for k, v in loaded.model.state_dict().items())
        data = lra_data.load_task(**saved["data"])[0][split]
        assert (data.lengths >= 2).all()  # so every sequence is in loaded.batches, in order
        assert _diag_accuracy(loaded, data.y) == pytest.approx(result[key], abs=1e-5)
        assert loaded.accuracy[key] == result[key]


def test_diagnose_flag_defaults_are_those_its_help_says(monkeypatch):
    """Each default --help prints is what the run takes (--split, --batches x --batch-size
    sequences in batches of --batch-size, --dense, --points, --device); the flags without one
    (--data-dir, --weights, --out) say in words what happens, and are None."""
    said = {k: v[0] for k, v in _help_of(diagnose.main, ["run"]).items() if v}
    assert set(said) == {"split", "batches", "batch-size", "dense", "points", "device"}
    seen = {}

    def load_run(path, *how):
        seen["load_run"] = how
        return "run"

    def measure(run, *how):
        seen["diagnose"] = how
        raise KeyboardInterrupt  # measured nothing: stop here

    monkeypatch.setattr(diagnose, "load_run", load_run)
    monkeypatch.setattr(diagnose, "diagnose", measure)
    with pytest.raises(KeyboardInterrupt):
        diagnose.main(["runs/x"])
    batches, size, dense, points = (
        int(said[k]) for k in ("batches", "batch-size", "dense", "points")
    )
    how = (None, said["split"], batches * size, size, said["device"], None)
    assert seen == dict(load_run=how, diagnose=(dense, points))


def test_diagnose_summary_counts_at_their_boundaries_and_the_table_aligns():
    """90 % is reached at the first k whose share is >= 0.9; a θ̃ of 0 is not < 0; a run without
    an accuracy has "-" in the table; text columns align left, numbers right."""
    theta, seen = torch.tensor([1.0, 0.0, -0.5]), torch.tensor([0.1, 0.5, 0.9])
    agf = dict(theta=theta, g=torch.tensor([0.2, 0.9, 0.1, 0.4]), s_seen=seen)
    spectrum = torch.tensor([0.5, 0.9, 1.0], dtype=torch.float64)
    layer = dict(kind="agf", n=[3], spectrum=spectrum, agf=agf)
    results = dict(kinds=["agf"], cosine=torch.tensor([0.1, 0.2]), layers=[layer])
    run = diagnose.LoadedRun(None, [{"x": torch.zeros(1, 3)}], "toy", HERE)
    lines = diagnose.summary(run, results)
    assert lines[5].endswith("   2 of 3.0"), "the share reaches 0.9 at k = 2"
    assert lines[6].endswith("(1 of 3 < 0)"), "θ̃ = 0 is not negative"
    assert lines[7].endswith(": 0.200 at s→0, 0.400 at s→1"), "g's first and last values"
    assert lines[8].startswith("  range [0.100, 0.900];"), "g's least and largest values"
    row = dict(run="a", weights="w", attention="agf", layers=2, cos_per_layer="0.1 0.2")
    rows = [dict(row, cos_last=0.2, val_acc=0.5), dict(row, cos_last=0.25, cos_per_layer="0 1")]
    header, lines = diagnose.comparison_table(rows)
    assert header[-1] == "val_acc" and lines[2].split()[-1] == "-", "no val_acc: -"
    for name, value in (("attention", "agf"), ("cos_per_layer", "0 1")):  # left
        assert lines[2].index(value) == lines[0].index(name), name
    assert lines[2][lines[0].index("layers") + len("layers") - 1] == "2", "layers: right"


# ----------------------------------------------------------------------------------------------
# bench.py (and .ci/gpu_bench.py, which adds what the GPU checks need)
# ----------------------------------------------------------------------------------------------

sys.path.insert(1, str(HERE / ".ci"))
import dry_run  # noqa: E402
import gpu_bench  # noqa: E402
import gpu_table  # noqa: E402

TINY_BENCH = ["--ns", "32", "64", "--fit-min", "32", "--repeats", "1", "--warmup", "0"]


class _BenchLayer(torch.nn.Module):
    """forward(x, mask) -> (y, aux) as the attention layers: y = x * x (saves x, once); its
    backward sleeps `sleep` s; from N = fail_from on, it raises `error`."""

    def __init__(self, sleep=0.0, fail_from=math.inf, error=None):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.sleep, self.fail_from, self.error, self.calls = sleep, fail_from, error, 0

    def forward(self, x, mask):
        self.calls += 1
        if x.shape[1] >= self.fail_from:
            raise self.error
        y = x * x  # (mask unused: y * mask would save the mask as well)
        if self.sleep and y.requires_grad:
            y.register_hook(lambda grad: time.sleep(self.sleep))
        return y, self.scale * 0


def test_bench_layer_and_step_fill_one_csv_row_each_and_fit_the_slopes(tmp_path, monkeypatch):
    """In another folder, bench.py then .ci/gpu_bench.py: default CSV and PNG, then new names; the
    slopes = log(t2/t1) / log(N2/N1) of the CSV; one N < --fit-min, or a bad --csv: said."""
    monkeypatch.chdir(tmp_path)
    fig = mock.MagicMock()
    plt = mock.MagicMock(**{"subplots.return_value": (fig, [fig] * 2)})
    argv = [*TINY_BENCH, "--what", "layer", "step", "--step-ns", "32", "--step-batch", "2"]
    monkeypatch.setitem(sys.modules, "matplotlib", mock.MagicMock(pyplot=plt))  # these two only:
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)  # (patch.dict would drop inductor's)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        lines = bench.main(argv)
        first = pathlib.Path("runs/bench/bench_cpu.csv").read_bytes()
        again = gpu_bench.main(["--kinds", "agf", "--ns", "32", "--repeats", "1", "--warmup", "0"])
    png = [pathlib.Path(c.args[0].name).as_posix() for c in fig.savefig.call_args_list]
    tmp = rf"\.{os.getpid()}-\d+\.tmp"  # savefig writes into the temporary file, renamed then
    assert [re.sub(tmp, "", name) for name in png] == [
        f"runs/bench/bench_cpu{s}.png" for s in ("", "_2")
    ]
    assert os.listdir() == ["runs"]
    assert first == pathlib.Path("runs/bench/bench_cpu.csv").read_bytes()  # kept
    assert again == ["no log-log slopes: every N measured is below --fit-min 1024"]
    assert f"\n{again[0]}\n" in out.getvalue() and bench.slopes([dict(what="step")], 1) == []
    assert [r["N"] for r in csv.DictReader(open("runs/bench/bench_cpu_2.csv"))] == ["32"]
    with mock.patch.object(bench, "run") as run, pytest.raises(SystemExit) as stop:
        bench.main(["--csv", "runs/bench/bench_cpu.csv/b.csv"])  # a --csv it cannot write
    assert stop.value.code.startswith("--csv: cannot write") and not run.called  # said first
    rows, ns = list(csv.DictReader(open("runs/bench/bench_cpu.csv"))), ["32", "64"]
    assert list(rows[0]) == list(bench.COLUMNS)
    assert len({tuple(r[k] for k in bench.ROW_KEY) for r in rows}) == len(rows) == 6 * 2 + 5
    layers = [r for r in rows if r["what"] == "layer"]
    assert {(r["kind"], r["N"]) for r in layers} == set(itertools.product(bench.KINDS, ns))
    assert all(float(r[k]) > 0 for r in layers for k in ("fwd_ms", "fwdbwd_ms", "mem_mib"))
    steps = [r for r in rows if r["what"] == "step"]
    assert {r["kind"] for r in steps} == set(bench.STEP_KINDS)
    for r in steps:  # tokens per second = batch x N / step time
        assert float(r["tokens_per_s"]) == pytest.approx(2 * 32e3 / float(r["step_ms"]), rel=1e-3)
        assert float(r["mem_mib"]) > 0 and r["mode"] == "eager" and r["fwd_ms"] == ""
    assert len(lines) == 1 + len(bench.KINDS) and "time" in lines[1] and "memory" in lines[1]
    for kind, line in zip(bench.KINDS, lines[1:], strict=True):  # 2 decimals printed: ± 0.005,
        a, b = (r for r in layers if r["kind"] == kind)  # and the CSV's 4 digits: < 0.0015 more
        want = [math.log(float(b[k]) / float(a[k])) / math.log(2) for k in ("fwdbwd_ms", "mem_mib")]
        assert [float(line.split()[i]) for i in (4, 6)] == pytest.approx(want, abs=0.0066), line
    assert bench.slope([1, 2, 4], [3, 12, 48]) == pytest.approx(2.0)  # quadratic
    row = dict(what="layer", kind="agf", dtype="float32", mode="graphs")
    rows = [dict(row, N=n, fwdbwd_ms=n / 4) for n in (8, 16)]
    assert re.search(r"agf float32 graphs\s+time  1.00   memory     -", bench.slopes(rows, 8)[1])
    one = bench.slopes([dict(rows[0], mem_mib=1.0)], 8)[1]
    assert re.search(r"time     -   memory     -   N \[8\]", one), "one N: no slope"


@pytest.mark.parametrize("argv, said", [
    (["--bandwidth-gbs", "nan"], "--bandwidth-gbs must be a finite number above 0"),  # gpu_bench
    (["--bandwidth-gbs", "0"], "--bandwidth-gbs must be a finite number above 0"),
    (["--repeats", 0], "argument --repeats: must be at least 1, got 0"),
    (["--fit-min", 0], "argument --fit-min: must be at least 1, got 0"),
    (["--warmup", -1], "argument --warmup: must be at least 0"),
    (["--batch", "x"], "argument --batch: invalid int value: 'x'"),
    (["--step-ns", 1024, 0], "argument --step-ns: must be at least 1"),
    (["--kinds", "primal+trans"], "--what layer measures none of --kinds primal+trans: primal+"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--kinds", "flash"], "argument --kinds: invalid choice: 'flash'"),
    *([] if torch.cuda.is_available() else [
        (["--device", "cuda"], "--device cuda: this machine has no CUDA GPU")
    ]),
])  # fmt: skip
def test_bench_refuses_bad_flags_with_one_sentence(argv, said):
    """Exit status 2 and one sentence, from bench.py and from .ci/gpu_bench.py."""
    parsers = [gpu_bench.parse_args]
    if "--bandwidth-gbs" not in argv:  # a flag of .ci/gpu_bench.py alone
        parsers.append(bench.parse_args)
    for parse in parsers:
        with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
            parse([str(a) for a in argv])
        assert stop.value.code == 2 and said in err.getvalue().strip().splitlines()[-1]


@pytest.mark.parametrize("argv, modes, gpu_modes", [  # gpu_modes: .ci/gpu_bench.py's
    ("", "eager", "eager"),
    ("--compile", "eager compiled", "eager compiled"),
    ("--device cuda", "eager compiled", "eager compiled graphs"),
    ("--device cuda --no-compile", "eager", "eager"),
    ("--device cuda --no-cuda-graphs", None, "eager compiled"),
])  # fmt: skip
@_torch_flag(torch.cuda, "is_available", lambda: True)
def test_bench_compiles_by_default_on_cuda_only(argv, modes, gpu_modes):
    assert modes is None or bench.parse_args(argv.split()).modes == modes.split()
    ns = [256, 512, 1024, 2048, 4096, 8192]  # --help says
    if "cuda" in argv:
        ns += [16384, 32768]
    assert modes is None or bench.parse_args(argv.split()).ns == ns
    assert gpu_bench.parse_args(argv.split()).modes == gpu_modes.split()
    if not argv:  # the other defaults that --help and the docstring say
        said = dict(what=["layer"], dtypes=["float32"], device="cpu", fit_min=1024, batch=2)
        said.update(step_ns=[1024, 4096], step_batch=32, repeats=5, warmup=2)
        said.update(kinds=[*bench.KINDS, "primal+trans"])
        args = vars(bench.parse_args([]))
        assert {k: args[k] for k in said} == said


@pytest.mark.parametrize("argv", ["", "--device cuda", "--compile --what step", "--ns 8 --csv b"])
def test_bench_help_shows_the_values_the_run_takes(argv):
    """--help (with the flags given beside it) prints each flag's value as the run takes it:
    the sizes, modes and CSV that follow from --device; a list as its flag writes it."""
    with mock.patch.object(torch.cuda, "is_available", return_value=True):
        shown = _help_of(bench.parse_args, argv.split())
        args = vars(bench.parse_args(argv.split()))
    said = {k.replace("-", "_"): v[0] for k, v in shown.items() if v}
    assert set(said) == set(args) - {"modes"}, "every flag says its value"
    for name in said:
        value = args[name]
        assert said[name] == (" ".join(map(str, value)) if isinstance(value, list) else str(value))


def _bench_run(monkeypatch, tmp_path, layers: dict, argv: list) -> list:
    """The rows of .ci/gpu_bench.py's bench.run over the kinds `layers` (name -> module)."""
    for name in layers:
        monkeypatch.setitem(bench.KINDS, name, (name, {}))
    monkeypatch.setattr(bench, "build_attention", lambda name, **kw: layers[name])
    args = gpu_bench.parse_args(argv)
    args.kinds = list(layers)  # not --kinds choices: set after parsing
    rows = bench.Rows(tmp_path / "b.csv", gpu_bench.COLUMNS)
    with contextlib.redirect_stdout(io.StringIO()):
        bench.run(args, rows, gpu_bench.measure_row)
    return rows.rows


def test_bench_out_of_memory_skips_that_n_and_larger_but_not_smaller_ones(tmp_path, monkeypatch):
    """--ns in any order (.ci/gpu puts the sizes that matter first): out of memory at 64 only."""
    big = _BenchLayer(fail_from=64, error=torch.cuda.OutOfMemoryError("CUDA out of memory"))
    argv = ["--ns", "64", "128", "32", "--fit-min", "32", "--repeats", "1"]
    rows = _bench_run(monkeypatch, tmp_path, {"big": big}, argv)
    oom = "out of memory: larger N skipped"
    assert [(r["N"], r.get("note", "")) for r in rows] == [(64, oom), (32, "")]


def test_bench_official_gfsa_stops_at_its_size_cap_and_no_other_kind_does(tmp_path, monkeypatch):
    """gfsa-official forms Ā@Ā (O(N³)): measured up to OFFICIAL_MAX_N, then left out; another
    kind is measured at every N."""
    cap = bench.OFFICIAL_MAX_N
    layers = {"gfsa-official": _BenchLayer(), "square": _BenchLayer()}
    argv = ["--ns", str(cap), str(2 * cap), "--fit-min", str(cap), "--repeats", "1"]
    rows = _bench_run(monkeypatch, tmp_path, layers, argv)
    want = [("gfsa-official", cap), ("square", cap), ("square", 2 * cap)]
    assert [(r["kind"], r["N"]) for r in rows] == want


def test_bench_a_layers_backward_includes_its_aux_loss():
    """fwd_bwd() differentiates mean(y²) + aux, as a training step does: the aux loss's backward
    (AGF's penalty, Primal's KSVD J²) is timed too."""
    reached = []

    class Aux(_BenchLayer):
        def forward(self, x, mask):
            aux = self.scale * x.mean()
            aux.register_hook(lambda grad: reached.append(grad.item()))
            return x * x, aux

    layer, cpu = Aux(), torch.device("cpu")
    _, fwd_bwd, _ = bench.layer_calls(layer, layer, B=1, N=4, D=2, device=cpu, dtype=torch.float32)
    fwd_bwd()
    assert reached == [1.0], "the aux loss in the loss, weight 1"


def test_bench_compile_s_is_the_first_calls_in_seconds(monkeypatch):
    """compile_s: the first (compiling) calls of a compiled row, timed in ms, said in seconds."""
    monkeypatch.setattr(bench, "timed", lambda fn, device, *more: 1500.0)  # every timing: 1.5 s
    args = bench.parse_args(["--repeats", "1"])
    row = dict(what="layer", kind="square", N=8, dtype="float32", mode="compiled", B=2, D=64)
    bench.measure_row(row, _BenchLayer(), args, compile_for=lambda module, mode: module)
    assert row["compile_s"] == 1.5, row
    assert (row["fwd_ms"], row["fwdbwd_ms"]) == (1500.0, 1500.0), "the timings stay in ms"


def test_bench_graphs_mode_and_a_graph_break_are_said_in_the_note(tmp_path, monkeypatch):
    """Mode graphs on the CPU (no CUDA graphs): measured, said in the note; a graph break: said
    where (torch's own words for it vary with its version), no compiled rows at larger N, eager
    rows stay; eager rows count operators."""

    class Breaks(_BenchLayer):
        def forward(self, x, mask):
            if x.sum() > 0:  # data-dependent branch: no single graph
                x = x + 1
            return super().forward(x, mask)

    layers = {"square": _BenchLayer(), "breaks": Breaks()}
    rows = _bench_run(monkeypatch, tmp_path, layers, [*TINY_BENCH, "--compile", "--cuda-graphs"])
    where = f"(at test_all.py:{inspect.getsourcelines(Breaks.forward)[1] + 1})"  # the if
    modes = ("eager", "compiled", "graphs")
    want = [(k, 32, m) for k in layers for m in modes] + [("square", 64, m) for m in modes]
    assert [(r["kind"], r["N"], r["mode"]) for r in rows] == [*want, ("breaks", 64, "eager")]
    for r in rows:
        note = r.get("note", "")
        if r["kind"] == "square":
            assert r["fwdbwd_ms"] > 0 and ("without CUDA graphs" in note) == (r["mode"] == "graphs")
        elif r["mode"] != "eager":
            assert note.startswith("not compiled: graph break: ") and note.endswith(where), note
    assert all(r["ops"] > 0 and r["floor_mib"] > 0 for r in rows if r["mode"] == "eager")


def test_bench_plot_leaves_out_the_memory_of_rows_without_one(tmp_path):
    """Rows without mem_mib (graphs rows on CUDA): drawn for time, left out of memory."""
    axes, plt = [mock.MagicMock(), mock.MagicMock()], mock.MagicMock()
    plt.subplots.return_value = (mock.MagicMock(), axes)
    row = dict(what="layer", kind="agf", dtype="bfloat16", fwdbwd_ms=1.0)
    rows = [{**row, "mode": "eager", "N": n, "mem_mib": 2.0} for n in (8, 16)]
    rows += [{**row, "mode": "graphs", "N": n} for n in (8, 16)]
    stub = {"matplotlib": mock.MagicMock(pyplot=plt), "matplotlib.pyplot": plt}
    with mock.patch.dict(sys.modules, stub), contextlib.redirect_stdout(io.StringIO()):
        bench.plot(rows, tmp_path / "b.csv")
    assert plt.subplots.call_args.args == (1, 2), "one row: time, then memory"
    time_calls, mem_calls = ([c.args[:2] for c in ax.loglog.call_args_list] for ax in axes)
    assert time_calls == [([8, 16], [1.0, 1.0])] * 2
    assert mem_calls == [([8, 16], [2.0, 2.0]), ([], [])]
    with mock.patch.dict(sys.modules, stub), contextlib.redirect_stdout(io.StringIO()):
        bench.plot([dict(row, what="step", mode="eager", N=8)], tmp_path / "s.csv")
    assert plt.subplots.call_count == 1, "no layer rows: no plot"


def test_bench_times_the_backward_and_counts_memory_bytes_and_operators():
    """fwd+bwd exceeds fwd by a 30 ms backward; y = x * x keeps 1 MiB (x, once) and moves 5 MiB
    at least; add, mul, sum are dispatched operators, a view is not; backward counts."""
    args, layer = argparse.Namespace(device="cpu", repeats=3, warmup=1), _BenchLayer(sleep=0.03)
    row = dict(what="layer", B=1, N=8, D=4, dtype="float32", mode="eager")
    bench.measure_row(row, layer, args)
    assert row["fwdbwd_ms"] >= row["fwd_ms"] + 30 and row["fwd_ms"] < 20
    assert layer.calls == 2 * (3 + 1) + 1  # fwd and fwd+bwd timed, then one forward for memory
    sleeps = [0.03, 0.03, 0.0]  # two warm-up calls longer than the one timed: left out

    def sleep():
        time.sleep(sleeps.pop(0))

    assert bench.timed(sleep, torch.device("cpu"), 1, 2) < 15 and not sleeps
    row = dict(row, B=2, N=2048, D=64)
    bench.measure_row(row, _BenchLayer(), args)
    assert row["mem_mib"] == 1.0
    x, mask = torch.randn(2, 2048, 64, requires_grad=True), torch.ones(2, 2048, dtype=torch.bool)
    nbytes, saved = gpu_bench.traffic_floor(_BenchLayer(), x, mask, torch.float32)
    assert nbytes == 5 * 2**20 and len(saved) == 1
    row = dict(row, B=3)
    gpu_bench.floor(_BenchLayer(), row, torch.float32, 2)  # B, GB/s: 1e9 B/s
    assert row["floor_mib"] * 2**20 == 5 * 3 * 2048 * 64 * 4 == pytest.approx(row["floor_ms"] * 2e6)

    class Exp(_BenchLayer):  # y = exp(x) saves y, a new tensor: written in forward, read after
        def forward(self, x, mask):
            return x.exp(), self.scale * 0

    row = dict(row, kind="exp")
    with contextlib.redirect_stdout(io.StringIO()) as out:
        gpu_bench.floor(Exp(), row, torch.float32, 2, show=True)
    x_mib = 3 * 2048 * 64 * 4 / 2**20  # (B, N, D) float32
    assert row["floor_mib"] == (1 + 1 + 4) * x_mib, "y written and read, x y dy dx"
    saved, total = out.getvalue().splitlines()[1:]
    assert saved.split()[-2:] == [f"{x_mib:.2f}", "MiB"], "exp's saved output, the size of x"
    assert f"4 x {x_mib:.2f} MiB;  total {6 * x_mib:.1f} MiB = " in total, total

    class Exps(Exp):  # and two smaller outputs: 1/8 of x (2 % of the total), 1/256 (< 0.5 %)
        def forward(self, x, mask):
            y, aux = super().forward(x, mask)
            return y + x[:, :256].exp().sum() + x[:, :8].exp().sum(), aux

    with contextlib.redirect_stdout(io.StringIO()) as out:
        gpu_bench.floor(Exps(), row, torch.float32, 2, show=True)
    listed = out.getvalue().splitlines()[1:-1]  # each listed, the last under 0.5 % lumped
    assert [line.split()[-2] for line in listed] == ["1.50", "0.19", "0.01"], listed
    assert listed[-1].startswith("    1 smaller tensors: "), listed
    seen = []  # each dtype's forward runs under autocast to that dtype; float32 under none

    def forward(x, mask):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return x, x.sum()

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        cpu = torch.device("cpu")
        bench.layer_calls(layer, forward, B=1, N=2, D=2, device=cpu, dtype=dtype)[0]()
    assert seen == [torch.float16, torch.bfloat16, None], seen
    a = torch.randn(3, 4, requires_grad=True)
    assert gpu_bench.dispatched_ops(lambda: (a + 1).t().mul(2).sum()) == 3
    forward = gpu_bench.dispatched_ops(lambda: (a * a).sum())
    assert gpu_bench.dispatched_ops(lambda: (a * a).sum().backward()) > forward + 1


class _Products(TorchDispatchMode):
    """(dtype, contracted length) of each batched matrix product dispatched while active."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.bmm.default:
            self.seen.append((args[0].dtype, args[0].shape[-1]))
        return func(*args, **(kwargs or {}))


@_torch_flag(torch.backends.cuda.matmul, "allow_tf32", False)  # each form sets it
def test_bench_agf_forms_run_their_own_products_and_equal_the_plain_form(monkeypatch):
    """--forms agf-split, agf-bf16, agf-tf32: AGF's three d x d products over N in chunks of
    --chunk, in bf16, or with TF32 on; y, aux, gradients == the plain form's (bf16: ~3 digits)."""
    for name in ("agf_apply", "orthogonality_penalty"):
        monkeypatch.setattr(agf, name, getattr(agf, name))  # put back whatever happens
    layer, got, chunk = _agf_layer(), {}, 6  # d = 8: each product's contracted length names it
    params = [p for p in layer.parameters() if p.requires_grad]

    def measure(row, *_):  # for bench.measure_row: one forward, its products, and the gradients
        with _Products() as products:
            y, aux = layer(x, mask)
        grads = torch.autograd.grad(y.square().sum() + aux, params)
        got[row["kind"]] = (products.seen, torch.backends.cuda.matmul.allow_tf32, y, aux, *grads)

    monkeypatch.setattr(bench, "measure_row", measure)
    forms = [k for k, (default, _, _) in gpu_bench.FORMS.items() if default == "agf"]
    for N in (5, 24, 29):
        torch.manual_seed(N)
        x, mask = torch.randn(6, N, 32, dtype=F64), _masks(N)
        for kind in ["agf", *forms]:
            row = dict(kind=kind, mode="compiled", dtype="float64")  # compiled: no ops, no floor
            gpu_bench.measure_row(row, layer, argparse.Namespace(chunk=chunk, device="cpu"))
        by_n = {"agf": (F64, N), "agf-tf32": (F64, N), "agf-bf16": (torch.bfloat16, N)}
        for kind, (seen, tf32, *out) in got.items():
            over_n = by_n.get(kind, (F64, min(N, chunk)))  # agf-split: chunks of 6 (N = 5: one)
            assert sorted(seen, key=str) == sorted([(F64, 8), *[over_n] * 3], key=str), kind
            assert tf32 == (kind == "agf-tf32"), kind
            tol = 2e-2 if kind == "agf-bf16" else 1e-12  # of the largest entry
            for plain, other in zip(got["agf"][2:], out, strict=True):
                assert (other - plain).abs().max() <= tol * plain.abs().max() + 1e-13, (kind, N)


def test_bench_report_compares_modes_and_each_kind_at_its_fastest_with_softmax_in_bf16():
    def row(what, kind, dtype, mode, ms, **more):
        col = "step_ms" if what == "step" else "fwdbwd_ms"
        return dict(what=what, kind=kind, N=4096, dtype=dtype, mode=mode, **{col: ms}, **more)

    rows = [
        row("layer", "softmax", "float32", "eager", 1.0),  # faster, but not flash attention
        row("layer", "softmax", "bfloat16", "graphs", 2.0),
        row("layer", "softmax", "bfloat16", "eager", 3.0),
        row("layer", "softmax", "bfloat16", "compiled", 2.5),  # the faster of two modes counts
        row("layer", "agf", "float32", "eager", 4.0, floor_ms=0.1),
        row("layer", "agf", "float32", "compiled", 1.0),
        row("layer", "agf", "bfloat16", "compiled", 1.5),
        row("step", "softmax", "bfloat16", "compiled", 10.0),
        row("step", "primal", "bfloat16", "graphs", 5.0),
    ]
    assert gpu_bench.against_softmax(rows)[1:] == [
        "  step  N=  4096 (softmax compiled bfloat16): primal 2.00x (graphs bfloat16)",
        "  layer N=  4096 (softmax graphs bfloat16): agf 2.00x (compiled float32, 10x its floor)",
    ]
    assert gpu_bench.against_softmax([r for r in rows if r["kind"] != "softmax"]) == []
    line = gpu_bench.side_by_side(rows)[1]  # layer softmax bf16: eager 3, compiled 2.5, graphs 2
    assert "3.00 ms  compiled     2.50 ms  graphs     2.00 ms  (compiled is 1.50x as fast)" in line


def test_bench_forms_verdict_crowns_only_a_form_that_wins_at_every_point_from_some_n_on():
    """--forms: a candidate becomes the default from the smallest N at and above which it is
    >= 1.2x its kind at every point (layer and step alike, each at its fastest); of two such, the
    one from the smaller N, then the larger worst-point ratio."""

    def row(kind, N, ms, what="layer", mode="eager"):
        col = "step_ms" if what == "step" else "fwdbwd_ms"
        return dict(what=what, kind=kind, N=N, dtype="bfloat16", mode=mode, **{col: ms})

    rows = [row("agf", 1024, 10.0), row("agf", 4096, 10.0), row("agf", 4096, 8.0, mode="graphs")]
    rows += [row("agf-split", 1024, 5.0), row("agf-split", 4096, 6.0)]  # 2.0x, 1.33x
    rows += [row("agf-bf16", 1024, 9.0), row("agf-bf16", 4096, 2.0)]  # 1.11x, 4.0x: from 4096
    rows += [row("agf-tf32", 1024, 7.0), row("agf-tf32", 4096, 6.4)]  # 1.43x, 1.25x
    rows += [row("primal", 1024, 10.0), row("primal-fused", 1024, 9.0)]  # 1.11x
    rows += [row("primal", 1024, 20.0, "step"), row("primal-fused", 1024, 10.0, "step")]  # 2.0x
    rows += [row("agf-split", 16384, 1.0)]  # agf not measured there: no point
    rows[0]["floor_ms"], rows[3]["floor_ms"] = 0.5, 0.25  # eager bf16, as the rows timed
    rows += [dict(row("agf-split", 1024, 50.0), dtype="float32", floor_ms=9.0)]  # another dtype
    lines = gpu_bench.forms_verdict(rows)
    at_1024 = [ln for ln in lines if ln.startswith("  layer N=  1024 agf-split")]
    assert at_1024[0].endswith(": 2.00x, agf-split 20x its floor, agf 20x its floor"), at_1024
    summaries = [ln for ln in lines if " over " in ln]
    assert summaries == [
        "  agf-split: 1.33x to 2.00x agf over 2 points: WINS by >= 20 % at every point",
        "  agf-bf16: 1.11x to 4.00x agf over 2 points: WINS by >= 20 % at every point from N = "
        "4096 on, not below",
        "  agf-tf32: 1.25x to 1.43x agf over 2 points: WINS by >= 20 % at every point",
        "  primal-fused: 1.11x to 2.00x primal over 2 points: does not win by 20 % at the "
        "largest N",  # layer and step at the one N: the worse of the two counts
    ]
    assert lines[-2:] == [
        "  agf: agf-split becomes the default from N = 1024",  # agf-bf16 only from 4096
        "  primal: stays (none wins by 20 %)",
    ]
    at_4096 = "  layer N=  4096 agf-split 6.000 ms (eager bfloat16) against agf 8.000 ms (graphs"
    assert any(ln.startswith(at_4096) for ln in lines), "agf at its fastest mode, graphs"
    assert gpu_bench.forms_verdict([r for r in rows if "-" not in r["kind"]]) == []


@pytest.mark.parametrize("ratios, want", [
    ([(1024, 1.3), (4096, 1.2), (8192, 1.5)], (1024, 1.2)),  # exactly 1.2x is a win
    ([(1024, 1.5), (4096, 1.1), (8192, 1.5), (12288, 1.4)], (8192, 1.4)),  # not 1024: 4096 lost
    ([(8192, 1.5), (8192, 1.19), (4096, 2.0)], None),  # the step at the largest N lost
    ([(1024, 0.5), (16384, 1.25), (4096, 3.0)], (4096, 1.25)),  # in any order
])  # fmt: skip
def test_bench_forms_win_from_the_smallest_n_above_which_every_point_wins(ratios, want):
    assert gpu_bench.wins_from(ratios) == want


def test_bench_gpu_rows_eager_alone_count_operators_and_layers_the_floor(monkeypatch):
    """.ci/gpu_bench.py's measure_row: an eager row gets ops, an eager layer row also its floor;
    compiled and graphs rows neither (fused kernels: operators do not count launches there)."""
    monkeypatch.setattr(bench, "measure_row", lambda row, *more: row.update(mem_mib=1.0))
    args, cpu = argparse.Namespace(device="cpu", chunk=16, bandwidth_gbs=2), torch.device("cpu")
    for what, mode in itertools.product(("layer", "step"), ("eager", "compiled", "graphs")):
        row = dict(what=what, kind="softmax", B=1, N=8, D=64, dtype="float32", mode=mode)
        layer = SoftmaxAttention(64, 2) if what == "layer" else None
        gpu_bench.measure_row(row, layer, args)
        assert ("ops" in row) == (mode == "eager"), (what, mode)
        if what == "layer" and mode == "eager":  # forward and backward, as timed
            calls = bench.layer_calls(layer, layer, B=1, N=8, D=64, device=cpu, dtype=torch.float32)
            assert row["ops"] == gpu_bench.dispatched_ops(calls[1]), "the operators of fwd+bwd"
        assert ("floor_ms" in row) == (mode == "eager" and what == "layer"), (what, mode)


def test_bench_gpu_main_floor_then_layer_rows_and_its_own_flags(tmp_path, monkeypatch):
    """.ci/gpu_bench.py --what floor layer: floor rows (each kind's saved tensors printed), then
    layer rows alone; --bandwidth-gbs gives floor_ms, --chunk reaches agf-split's chunks, --forms
    adds its kinds; the official GFSA's floor stops at its size cap, as its timings."""
    chunks, real = [], gpu_bench.agf_reduced

    def reduced(form, chunk):
        chunks.append((form, chunk))
        return real(form, chunk)

    monkeypatch.setattr(gpu_bench, "agf_reduced", reduced)
    monkeypatch.setattr(bench, "OFFICIAL_MAX_N", 40)
    argv = ["--what", "floor", "layer", "--kinds", "agf", "gfsa-official", "--forms", "agf-split"]
    argv += ["--chunk", "16", "--ns", "40", "48", "--fit-min", "40", "--repeats", "1"]
    argv += ["--warmup", "0", "--bandwidth-gbs", "2", "--csv", str(tmp_path / "g.csv")]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        gpu_bench.main(argv)
    rows = list(csv.DictReader(open(tmp_path / "g.csv")))
    floors = [(r["kind"], r["N"]) for r in rows if r["what"] == "floor"]
    assert floors == [("agf", "40"), ("gfsa-official", "40"), ("agf", "48")], floors
    layers = [(r["kind"], r["N"]) for r in rows if r["what"] == "layer"]
    assert sorted(layers) == sorted(floors + [("agf-split", "40"), ("agf-split", "48")]), layers
    assert len(rows) == len(floors) + len(layers), "floor and layer rows, nothing else"
    for r in rows:
        assert float(r["floor_ms"]) == pytest.approx(float(r["floor_mib"]) * 2**20 / 2e6, rel=1e-3)
    assert ("split", 16) in chunks, "--chunk 16 reaches agf-split"
    assert "agf float32, B=2 N=40 D=64: saved for backward" in out.getvalue()


def test_bench_primal_fused_rows_run_fused_primal_which_must_equal_primal(monkeypatch, tmp_path):
    """A primal-fused row, layer or step, runs FusedPrimal (its one (2D) x (2·H·s) product of
    every head's e and r); a primal row never does. A FusedPrimal that differs is not measured."""
    calls, products, row_kind = collections.Counter(), [], {}
    fused_forward = gpu_bench.FusedPrimal.forward

    def counted(self, x, mask=None):
        calls[row_kind["now"]] += 1
        with _Products() as seen:
            out = fused_forward(self, x, mask)
        products.extend(length for _, length in seen.seen)
        return out

    def measure(row, layer, args):  # one forward of the row's layer or step model
        row_kind["now"] = row["kind"]
        if layer is None:
            cpu = torch.device("cpu")
            bench.step_calls(row["kind"], B=2, N=16, device=cpu, dtype=torch.float32)[1]()
        else:
            layer(torch.randn(2, 16, 64), torch.ones(2, 16, dtype=torch.bool))

    monkeypatch.setattr(gpu_bench.FusedPrimal, "forward", counted)
    argv = ["--what", "layer", "step", "--kinds", "primal", "--forms", "primal-fused", "--ns", "16"]
    args = gpu_bench.parse_args(
        [*argv, "--step-ns", "16", "--modes", "eager", "--dtypes", "float32"]
    )
    rows = bench.Rows(tmp_path / "b.csv", gpu_bench.COLUMNS)
    for kind in ("primal", "primal-fused"):
        args.kinds, row_kind["now"] = [kind], "check"
        with gpu_bench.forms_registered(args):
            bench.run(args, rows, measure)
    assert calls["check"] == 2, "FusedPrimal is checked before each measuring"
    # one layer row; a step row's model of two layers runs once when built, once timed
    assert calls["primal-fused"] == 1 + 2 * 2, "one layer row and a step row"
    assert calls["primal"] == 0, "a primal row runs PrimalAttention"
    assert 2 * 64 in products, "the (B, N, 2D) @ (B, 2D, 2·H·s) product of the fused form"
    assert "primal-fused" not in gpu_bench.model.ATTENTION and "primal-fused" not in bench.KINDS
    monkeypatch.setattr(
        gpu_bench.FusedPrimal, "forward", lambda *a: [1.001 * t for t in fused_forward(*a)]
    )
    with pytest.raises(SystemExit, match="FusedPrimal differs from PrimalAttention: not measured"):
        gpu_bench.check_fused_primal()


def _result_line(attention, steps_reached, partial, **more):
    config = dict(steps=20000, batch_size=32, max_len=1000) | more.pop("config", {})
    result = dict(task="text", attention=attention, test_acc=0.6234, final_val_acc=0.6011)
    result.update(best_step=1500, steps=20000, steps_reached=steps_reached, partial=partial)
    result.update(wall_s=400.0, device="NVIDIA H200 x 1", config=config)
    return "RESULT " + json.dumps(result | more)


def test_bench_gpu_table_rows_from_the_last_result_of_each_run_beside_the_paper():
    """.ci/gpu_table.py: a resumed run's last RESULT line wins; partial runs say so; tokens/s is
    steps x batch x max_len over the wall time; the paper's Table 2 beside; no run, dashes."""
    lines = [
        _result_line("agf", 9000, True),  # the first call stopped it at step 9000
        "== not a result",
        _result_line("softmax", 20000, False),
        _result_line("agf", 20000, False, wall_s=800.0),  # the second call finished it
        _result_line("primal", 12500, True),
        _result_line("softmax", 1, False, task="listops", config=dict(steps=1)),  # the data check
        _result_line("exotic", 20000, False, config=dict(max_len=4000)),  # another table
    ]
    got = gpu_table.tables(lines, "torch 2.11")
    text1k = got[: got.index("", 3)]
    assert text1k[0] == (
        "text, max_len 1000, NVIDIA H200 x 1; torch 2.11 (the paper's Text is 4K: max_len 4000):"
    )
    assert text1k[3:] == [
        "|---|---|---|---|---|---|---|---|",
        "| softmax | 62.3 | 60.1 | 1500 | 20000 of 20000 | 400.0 | 1.60 | 65.0 |",
        "| agf | 62.3 | 60.1 | 1500 | 20000 of 20000 | 800.0 | 0.80 | — |",  # 640M tokens
        "| primal | 62.3 | 60.1 | 1500 | 12500 of 20000 (partial) | 400.0 | 1.00 | 61.2 |",
        "| primal+trans | — | — | — | — | — | — | 65.4 |",
        "| gfsa | — | — | — | — | — | — | — |",
    ]
    text4k = got[got.index("", 3) + 1 :]
    assert text4k[0].startswith("text, max_len 4000, NVIDIA H200 x 1; torch 2.11:"), text4k
    assert text4k[-2] == "| exotic | 62.3 | 60.1 | 1500 | 20000 of 20000 | 400.0 | 6.40 | — |"
    assert not any(line.startswith("listops") for line in got), "the one-step data check"


_FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = - ]; then cat >/dev/null; echo "device cpu (no CUDA)"; exit 0; fi
if [ "$1" = .ci/gpu_table.py ]; then echo "| a table |"; exit 0; fi
echo "$*" >>"$CALLS"
while [ $# -gt 0 ]; do
    [ "$1" = --attention ] && kind=$2
    [ "$1" = --out ] && mkdir -p "$2" && printf '{"step": 1}\n{"step": 2}\n' >"$2/metrics.jsonl"
    shift
done
echo "RESULT {}"
exit "$(cat "$RCS/$kind")"
"""


def _ci_gpu_flags(calls: list) -> dict:
    """Each training run's attention -> its last argument (--resume or --overwrite)."""
    return {call.split("--attention ")[1].split()[0]: call.split()[-1] for call in calls}


def test_bench_ci_gpu_resumes_skips_and_fails_training_runs_as_its_header_says(tmp_path):
    """.ci/gpu's listops stage on a stand-in python: a finished run is skipped; a partial one, or
    one with a checkpoint, resumed; others started afresh; a run cut off by its limit is no fail."""
    bin_dir, out, rcs = tmp_path / "bin", tmp_path / "out", tmp_path / "rcs"
    for folder in (bin_dir, rcs):
        folder.mkdir()
    (bin_dir / "python").write_text(_FAKE_PYTHON)
    (bin_dir / "python").chmod(0o755)
    for kind, result in (("softmax", "false"), ("agf", "true")):  # finished; --time-limit stopped
        (out / "listops" / kind).mkdir(parents=True)
        (out / "listops" / kind / "result.json").write_text(f'{{"partial": {result}}}')
    (out / "listops" / "primal").mkdir()
    for kind in ("softmax", "agf", "primal"):  # softmax's weights never come back: finished
        (out / "listops" / kind / "checkpoint.pt").touch()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(tmp_path / "calls"))
    env.update(RCS=str(rcs), STAGES="listops")
    n_results = 0  # RESULT lines in the training logs, which each call appends to
    # a failing call, then a passing one on the same folder: stages.txt holds one call's lines;
    # timeout's exit 124, then 137 (--kill-after): a run cut off by its limit, no failure
    for last_rc, status, cut in ((1, 1, 124), (0, 0, 137)):
        for kind, rc in (("agf", 0), ("primal", cut), ("gfsa", 0), ("primal+trans", last_rc)):
            (rcs / kind).write_text(str(rc))
        (tmp_path / "calls").write_text("")
        command = ["bash", HERE / ".ci" / "gpu", "--dry-run", out]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == status, proc.stdout
        assert ("some stage failed" in proc.stdout) == (status == 1), proc.stdout
        calls = (tmp_path / "calls").read_text().splitlines()
        want = {"agf": "--resume", "primal": "--resume", "gfsa": "--overwrite"}
        assert _ci_gpu_flags(calls) == dict(want, **{"primal+trans": "--overwrite"}), calls
        assert all("--time-limit 220 " in c for c in calls), "LISTOPS_S 340 less MARGIN_S 120"
        stages = (out / "stages.txt").read_text()
        assert "listops softmax: finished earlier\n" in stages
        assert "listops agf: exit 0 (stopped by its --time-limit, a partial result" in stages
        assert (
            f"listops primal: exit {cut} (cut off by its limit: the next call resumes it)" in stages
        )
        assert stages.count("listops agf:") == 1, stages
        assert "listops gfsa: exit 0\n" in stages
        assert f"listops primal+trans: exit {last_rc}\n" in stages
        assert 'listops gfsa last log: {"step": 2}\n' in stages, "each run's last log line"
        n_results += 4
        assert (out / "results.jsonl").read_text().count("RESULT") == n_results
    # BUNDLE packs the stage in one part named .tar.gz; FROM refills a fresh OUTDIR from it
    back, again = tmp_path / "back", tmp_path / "again"
    subprocess.run(command, capture_output=True, env=dict(env, BUNDLE=back), timeout=60)
    assert sorted(p.name for p in back.iterdir()) == [
        "listops.tar.gz", "logs.tar.gz", "results.jsonl", "stages.txt", "tables.md"
    ]  # fmt: skip
    assert (back / "tables.md").read_text() == "| a table |\n"
    with tarfile.open(back / "listops.tar.gz") as tar:
        packed = {name for name in tar.getnames() if name.endswith(".pt")}
    assert packed == {"listops/agf/checkpoint.pt", "listops/primal/checkpoint.pt"}, packed
    (tmp_path / "calls").write_text("")
    command[-1] = again
    newer = '{"partial": false, "newer": 1}'  # what OUTDIR has is kept
    _write(again / "listops" / "softmax" / "result.json", newer)
    subprocess.run(command, capture_output=True, env=dict(env, FROM=back), timeout=60)
    assert "listops softmax: finished earlier" in (again / "stages.txt").read_text()
    assert (again / "listops" / "softmax" / "result.json").read_text() == newer
    calls = (tmp_path / "calls").read_text().splitlines()
    assert _ci_gpu_flags(calls)["agf"] == "--resume", "a partial run comes back and resumes"
    env.update(STAGES="tests nope")
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "STAGES: unknown stage 'nope'" in proc.stdout, proc.stdout


_DRY_ROW = "| agf | 37.1 | 36.0 | 4 | 4 of 4 | 9.0 | 0.01 | — |"
_DRY_FINISHED = "text1k agf: finished earlier"


@pytest.mark.parametrize("step, name, line, count", [
    ("full", "results.jsonl", 'RESULT {"task": "text"}', dry_run.RESULT_LINES),
    ("full", "tables.md", _DRY_ROW, dry_run.TABLE_ROWS),
    ("resumed", "stages.txt", _DRY_FINISHED, 3),
    ("refilled", "stages.txt", _DRY_FINISHED, 10),
])  # fmt: skip
def test_bench_ci_dry_run_checks_count_lines_exactly(tmp_path, step, name, line, count):
    """.ci/run's checks of the dry run (.ci/dry_run.py) on planted output: the right count of
    RESULT lines, table rows, runs found finished passes; one line too few or too many fails,
    in one line naming the count, with stages.txt."""
    out = tmp_path / "gpu"
    _write(out / "listops" / "agf" / "config.json", '{"time_limit": 220}')
    _write(out / "text1k_agf.log", "== 2025-01-01T00:00:00Z --resume\n")
    _write(out / "text1k_softmax.log", "== 2025-01-01T00:00:00Z --resume\n")
    _write(out / "text1k" / "softmax" / "result.json", '{"partial": false}')
    _write(out / "stages.txt", "listops agf: exit 0\n")
    around = {  # lines that must not count: a table's head, its dashes, a row without numbers
        "tables.md": ["", "| attention | test % (best val) |", "|---|---|", "| gfsa | — | — |"],
        "stages.txt": ["text1k agf: exit 0", "text1k: ended after 9 s"],
    }.get(name, [])
    for n in (count - 1, count, count + 1):
        _write(out / name, "\n".join([*around, *[line] * n, *around]) + "\n")
        if step == "full":  # the other count right
            other = "tables.md" if name == "results.jsonl" else "results.jsonl"
            right = [_DRY_ROW] * 15 if other == "tables.md" else ["RESULT {}"] * 16
            _write(out / other, "\n".join(right) + "\n")
        wrong = dry_run.check(step, out)
        assert (wrong is None) == (n == count), (n, wrong)
        assert n == count or wrong.startswith(f"{n} "), wrong
    _write(out / name, line + "\n")  # .ci/run's call: exit 1, the line, stages.txt above it
    run = subprocess.run(
        [sys.executable, HERE / ".ci" / "dry_run.py", step, out], capture_output=True, text=True
    )
    assert run.returncode == 1 and run.stderr == f"gpu dry run: {dry_run.check(step, out)}\n"
    assert run.stdout == (out / "stages.txt").read_text(), "stages.txt, to see why"
    if step == "full":
        _write(out / "listops" / "agf" / "config.json", '{"time_limit": 340}')
        _write(out / name, "\n".join([line] * count) + "\n")
        assert (
            dry_run.check(step, out) == "listops agf ran with --time-limit 340, not 220 (340 - 120)"
        )


# ----------------------------------------------------------------------------------------------
# README.md: its code blocks run
# ----------------------------------------------------------------------------------------------


def test_readme_python_blocks_run():
    """Every ```python block of the README runs as it is (a README that does not run misleads)."""
    text = (HERE / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert blocks, "the README has no python block"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})  # our own README


def test_readme_picture_is_drawn_beside_its_script_or_needs_matplotlib(tmp_path, monkeypatch):
    """figures/attentions.py run twice from another folder, matplotlib a stub: attentions.png
    beside the script (savefig's path), said; without matplotlib: one sentence, twice."""
    monkeypatch.chdir(tmp_path)
    plt = mock.MagicMock(**{"subplots.side_effect": lambda rows, cols, **_: (plt, [plt] * cols)})
    png, said = (HERE / "figures" / "attentions.png").resolve(), []
    pyplot = {"matplotlib": mock.MagicMock(pyplot=plt), "matplotlib.pyplot": plt}
    for stub in [{"matplotlib": None}, pyplot] * 2:
        with mock.patch.dict(sys.modules, stub), contextlib.redirect_stdout(io.StringIO()) as out:
            try:  # python figures/attentions.py
                runpy.run_path(str(HERE / "figures" / "attentions.py"), run_name="__main__")
            except SystemExit as stop:
                said.append(stop.code)
        said.append(out.getvalue())
    needs = "figures/attentions.py draws with matplotlib, which is not installed: pip install"
    assert said == [f"{needs} matplotlib", "", f"wrote {png}\n"] * 2 and not os.listdir()
    assert [c.args[0] for c in plt.savefig.call_args_list] == [png] * 2


def test_readme_picture_layout_boxes_top_down_each_arrow_between_two(tmp_path):
    """figures/attentions.py's layout, matplotlib a stub: each panel's boxes are its steps in
    order, top to bottom below the title, inside the panel; each arrow runs down from one box to
    the next, its label (the first box's shape) between them."""
    axes = [mock.MagicMock() for _ in range(4)]
    plt = mock.MagicMock(**{"subplots.return_value": (mock.MagicMock(), axes)})
    stub = {"matplotlib": mock.MagicMock(pyplot=plt), "matplotlib.pyplot": plt}
    with mock.patch.dict(sys.modules, stub):
        script = runpy.run_path(str(HERE / "figures" / "attentions.py"))  # draw() not yet run
    script["draw"](tmp_path / "a.png")
    for ax, (title, _, _, steps) in zip(axes, script["COLUMNS"], strict=True):
        texts = ax.text.call_args_list
        boxes = [c.args for c in texts if "bbox" in c.kwargs]
        labels = [c.args for c in texts if c.kwargs.get("style") == "italic"]
        heads = [c.args for c in texts if c.kwargs.get("va") == "top"]  # the title, file, cost
        assert [b[2] for b in boxes] == [step[0] for step in steps], title
        assert all(b[0] == 0.5 for b in boxes), "boxes centred"
        ys = [b[1] for b in boxes]
        assert min(h[1] for h in heads) - 0.1 > ys[0], "the first box below the title"
        assert ys == sorted(ys, reverse=True) and ys[-1] > 0.05, "top to bottom, in the panel"
        arrows, pairs = [c.args for c in ax.annotate.call_args_list], list(itertools.pairwise(ys))
        assert len(arrows) == len(steps) - 1, title
        for (upper, lower), (_, (x_end, end), (x_start, start)) in zip(pairs, arrows, strict=True):
            assert upper > start > end > lower, "an arrow down, from one box to the next"
            assert x_start == x_end == 0.5, "an arrow straight down"
        assert [lab[2] for lab in labels] == [step[2] for step in steps[:-1]], title
        for (upper, lower), label in zip(pairs, labels, strict=True):
            assert upper > label[1] > lower, "each shape between its two boxes"


def _documented_commands(text: str) -> list:
    """Each `python <script>.py ...` in ```sh blocks and inline code -> [(script, argv, as
    written)]; `$VAR` takes the values of `VAR="..."` and `for VAR in ...`, `<kind>` each kind."""
    fenced, lines = re.compile(r"```(\w*)\n(.*?)```", re.S), []
    for lang, body in fenced.findall(text):
        if lang == "sh":
            lines += [re.sub(r"\s#.*", "", ln) for ln in body.replace("\\\n", " ").splitlines()]
    lines += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", fenced.sub("", text))]
    values = {"<kind>": KINDS, "<s>": ["0"], "<n>": ["2"], "<gpus>": ["2"]}
    values.update({f"${k}": [v] for k, v in re.findall(r"^\s*(\w+)=\"([^\"]*)\"", text, re.M)})
    values.update({f"${k}": v.split() for k, v in re.findall(r"\bfor (\w+) in ([^;]+);", text)})
    scripts = r"train_lra|train_uea|bench|diagnose|\.ci/gpu_bench"
    script = re.compile(rf"(?:python|nproc_per_node[= ]\S+)\s+({scripts})\.py")
    found = []
    for line in lines:
        if re.match(r"\s*\w+=\"", line):  # an assignment, Q="python ...": used when expanded
            continue
        line = re.sub(r"\$\{(\w+)\}", r"$\1", line)
        names = [n for n in values if re.search(re.escape(n) + r"(?!\w)", line)]
        for chosen in itertools.product(*(values[n] for n in names)):
            expanded = line
            for name, value in zip(names, chosen, strict=True):
                expanded = re.sub(re.escape(name) + r"(?!\w)", lambda m, v=value: v, expanded)
            for m in script.finditer(expanded):
                rest = expanded[m.end() :].split(";")[0]
                assert not re.search(r"<\w+>|\$\w", rest), f"unknown placeholder in: {line}"
                found.append((m[1], [a for a in shlex.split(rest) if a != "..."], expanded))
    return found


def test_readme_test_command_is_the_one_ci_runs():
    """The README's test command is the one .ci/run runs: what a reader types is what CI checks."""
    command = "python -m pytest -q test_all.py"
    assert command in (HERE / "README.md").read_text(), "README.md: the test command changed"
    ci = [ln.strip() for ln in (HERE / ".ci" / "run").read_text().splitlines()]
    assert command in ci, ".ci/run no longer runs the README's test command"


def _notes_departures() -> list:
    """NOTES.md's departures from the official code: (item, [(file, function or None), ...]) for
    each item of its list, from "## Differences from the official code" to "**Same as the
    official code"; each item ends with "(NOTE: `file.py:function`, ...)"."""
    text = (HERE / "NOTES.md").read_text()
    section = text.split("## Differences from the official code\n")[1]
    section = section.split("**Same as the official code")[0]
    items = re.findall(r"^- (.*(?:\n  .*)*)", section, flags=re.M)  # an item and its lines
    departures = []
    for item in map(" ".join, (item.split() for item in items)):
        where = re.search(r"\(NOTE: (`[^`]+`(?:, `[^`]+`)*)\)$", item)
        assert where, f"NOTES.md: a departure does not say where its NOTE is: {item[:70]}"
        tags = [tag.partition(":")[::2] for tag in re.findall(r"`([^`]+)`", where[1])]
        departures.append((item, [(file, name or None) for file, name in tags]))
    return departures


def test_readme_notes_every_departure_listed_has_its_note_in_the_file_named():
    """Each departure NOTES.md lists has a `NOTE:` comment in the file and function it names (the
    def or class of that name, down to its last line): as many NOTEs there as departures name it."""
    departures = _notes_departures()
    assert len(departures) >= 20, departures  # the whole list, not a part cut off
    named = collections.Counter(tag for _, tags in departures for tag in tags)
    for (file, name), count in named.items():
        lines = (HERE / file).read_text().splitlines()
        first, last = 1, len(lines)
        if name:
            nodes = ast.parse("\n".join(lines)).body
            for part in name.split("."):  # Class.method: the method inside the class
                kinds = (ast.FunctionDef, ast.ClassDef)
                node = next((n for n in nodes if isinstance(n, kinds) and n.name == part), None)
                assert node, f"NOTES.md names {file}:{name}, which has no {part}"
                nodes = node.body
            first, last = node.lineno, node.end_lineno
        notes = sum("NOTE:" in line for line in lines[first - 1 : last])
        assert notes >= count, f"{file}:{name}: {notes} NOTE: comments for {count} departures"


@pytest.mark.parametrize("file, paper, fast", [
    ("agf.py", "agf_dense_reference", "agf_apply"),
    ("gfsa.py", "gfsa_dense_reference", "gfsa_apply"),
    ("polynomials.py", "PolynomialFilter", "FilterSum"),
])  # fmt: skip
def test_readme_notes_paper_form_first_then_the_fast_form_with_its_measured_gain(file, paper, fast):
    """NOTES.md's rule: in a mechanism file the paper's form is defined before the fast form, and
    the measured gain the file cites (RESULTS.md, "<entry>") is an entry of RESULTS.md."""
    text = (HERE / file).read_text()
    where = {n.name: n.lineno for n in ast.parse(text).body if hasattr(n, "name")}
    assert where[paper] < where[fast], f"{file}: {fast} comes before {paper}"
    cited = re.findall(r'RESULTS\.md,\s+(?:#\s+)?"([^"]+)"', text)
    assert cited, f"{file}: no measured gain cited"
    entries = (HERE / "RESULTS.md").read_text().replace("`", "")  # titles without their code
    for entry in cited:
        assert "**" + " ".join(entry.split()) in entries, f"{file} cites RESULTS.md, {entry!r}"


def test_readme_file_table_names_every_package_each_file_imports():
    """README's table of files: each package a file imports (numpy, tqdm, matplotlib, scipy,
    pytest; anywhere in it, optional ones too) is named in its row's "depends on"."""
    readme = (HERE / "README.md").read_text()
    rows = re.findall(r"^\| (`[^|]+\.py`[^|]*) \| [^|]* \| ([^|]*) \|$", readme, flags=re.M)
    named = {row: set(re.findall(r"[a-z]+", depends)) for row, depends in rows}
    packages = {"numpy", "tqdm", "matplotlib", "scipy", "pytest"}
    for row, depends in named.items():
        if "everything" in depends:  # test_all.py: whatever the other rows name
            depends |= set.union(*named.values())
        for file in re.findall(r"`([\w.]+\.py)`", row):
            imported = set()
            for node in ast.walk(ast.parse((HERE / file).read_text())):
                if isinstance(node, ast.Import):
                    imported |= {alias.name.split(".")[0] for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module:
                    imported.add(node.module.split(".")[0])
            used = imported & packages
            assert used <= depends, f"README: {file} imports {sorted(used - depends)}, not named"


def test_requirements_name_each_lower_bound_and_ci_installs_each_exactly():
    """requirements.txt: `name>=version` a line, no upper bound (pip would replace a newer torch,
    a CPU build, with PyPI's CUDA one); .ci/run's lowest job reads them as `name==version`."""
    lines = [ln.split("#")[0].strip() for ln in (HERE / "requirements.txt").read_text().split("\n")]
    wanted = [ln for ln in lines if ln]
    for line in wanted:
        assert re.fullmatch(r"[a-z]+>=\d+(\.\d+)*", line), f"requirements.txt: {line}"
    assert [ln.split(">=")[0] for ln in wanted] == ["torch", "numpy", "tqdm", "pytest"]
    sed = re.search(r"^lowest=\$\((sed .*)\)$", (HERE / ".ci" / "run").read_text(), re.M)
    assert sed, ".ci/run: no `lowest=$(sed ...)` line"
    run = subprocess.run(["bash", "-c", sed[1]], cwd=HERE, capture_output=True, text=True)
    assert run.stdout.split() == [ln.replace(">=", "==") for ln in wanted], run.stdout


def test_no_test_hands_a_torch_attribute_to_monkeypatch():
    """torch's flags are kept by _torch_flag, never by pytest's monkeypatch (pytest 9.2 deletes
    an attribute kept outside __dict__, as cuBLASModule's allow_tf32, to put it back): the flag
    comes back after an error, and no monkeypatch call is handed torch or one of its modules."""
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    with pytest.raises(KeyError), _torch_flag(matmul, "allow_tf32", not before):
        assert matmul.allow_tf32 is not before
        raise KeyError("an error inside")
    assert matmul.allow_tf32 is before and "allow_tf32" not in vars(matmul)
    modules = {n: v for n, v in globals().items() if isinstance(v, types.ModuleType)}
    aliases = [n for n, v in modules.items() if v.__name__.split(".")[0] == "torch"]
    assert {"torch", "F"} <= set(aliases), "torch.nn.functional is imported as F"
    names = "|".join(sorted(aliases))
    handed = re.compile(rf"""monkeypatch\.(?:setattr|delattr)\(\s*["']?(?:\w+\.)*(?:{names})\b""")
    call = "monkeypatch." + "setattr("  # not written whole, or this test would find itself
    plants = ['torch.backends.cuda.matmul, "allow_tf32", 0)', "\n    torch._dynamo.config,"]
    plants += ['"torch.cuda.is_available", f)', 'bench.torch.cuda, "is_available", f)']
    for planted in [*plants, 'F, "softmax", f)']:
        assert handed.search(call + planted), planted
    assert not handed.search(call + 'bench, "torch_threads", 1)'), "a name that starts so"
    text = pathlib.Path(__file__).read_text()
    found = [text.count("\n", 0, m.start()) + 1 for m in handed.finditer(text)]
    assert not found, f"test_all.py lines {found}: a torch attribute handed to monkeypatch"


def test_readme_and_results_commands_parse(monkeypatch, tmp_path):
    """Every training, bench (.ci/ too) and diagnose command in README, RESULTS and NOTES parses
    (`--device cuda` as on a GPU; diagnose.py's RUN folders made); .gitignore has their --out."""

    class Parsed(Exception):
        pass

    def parse(name: str, argv: list) -> None:
        if name in ("train_lra", "train_uea"):
            {"train_lra": train_lra, "train_uea": train_uea}[name].parse_config(argv)
        elif name.endswith("bench"):  # bench.py, .ci/gpu_bench.py
            {"bench": bench, ".ci/gpu_bench": gpu_bench}[name].parse_args(argv)
        else:  # diagnose.main checks its flags, then loads the first run: stop there
            for i, arg in enumerate(argv):  # every diagnose flag takes a value
                if not arg.startswith("-") and not (i and argv[i - 1].startswith("-")):
                    (tmp_path / arg).mkdir(parents=True, exist_ok=True)
            with mock.patch.object(diagnose, "load_run", side_effect=Parsed):
                with contextlib.suppress(Parsed):
                    diagnose.main(argv)

    docs = ("README.md", "RESULTS.md", "NOTES.md")
    commands = [(d, *c) for d in docs for c in _documented_commands((HERE / d).read_text())]
    pairs = [pair for *_, a, _ in commands for pair in itertools.pairwise(a)]
    outs = {value.split("/")[0] + "/" for flag, value in pairs if flag in ("--out", "--csv")}
    assert outs <= set((HERE / ".gitignore").read_text().split()), outs  # runs/, diagnosis/
    scripts = {"train_lra", "train_uea", "bench", "diagnose", ".ci/gpu_bench"}
    assert {c[1] for c in commands} == scripts, commands
    assert len(commands) >= 100, commands  # the sweeps of RESULTS.md, every value of each loop
    monkeypatch.chdir(tmp_path)
    with mock.patch.multiple(torch.cuda, is_available=lambda: True, device_count=lambda: 1):
        for doc, name, argv, written in commands:
            try:
                with contextlib.redirect_stderr(io.StringIO()) as err:
                    parse(name, argv)
            except SystemExit as e:
                if e.code == 0 and argv[-1:] == ["--help"]:  # `python bench.py --help`: parsed
                    continue
                said = (err.getvalue().strip().splitlines() or ["(nothing)"])[-1]
                pytest.fail(f"{doc}: `{written}` does not parse: {said}")


_HELP = [  # every top-level module: `python <module> --help` -> exit status, a fragment said
    ("agf.py", 0, "Run:         python agf.py   -> shapes, fast path == dense"),  # the tours
    ("gfsa.py", 0, "Run:         python gfsa.py   -> shapes, one exactness check"),
    ("ksvd_attention.py", 0, "Run:         python ksvd_attention.py  -> shapes, primal == dual"),
    ("polynomials.py", 0, "Run:         python polynomials.py   -> basis checks"),
    ("model.py", 0, "Run:   python model.py   -> aux loss, parameters, padding unread"),
    ("bench.py", 0, "bench.py: what each attention costs as the sequence grows"),  # the tools
    ("diagnose.py", 0, "diagnose.py: look inside trained runs"),
    ("lra_data.py", 0, "LRA task"),
    ("listops.py", 0, "Generate ListOps, as the LRA release has it."),
    ("train_lra.py", 0, "train_lra.py: train one attention mechanism on one Long Range Arena"),
    ("train_uea.py", 0, "train_uea.py: train one attention mechanism on one UEA multivariate"),
    ("download.py", 2, "download.py has no command line; data is fetched by python train_uea.py"),
    ("lra_readers.py", 2, "lra_readers.py has no command line; the LRA data is read by python"),
    ("files.py", 2, "files.py has no command line: it writes the project's files; run python"),
    ("runs.py", 2, "runs.py has no command line: it serves the train scripts; run python train_"),
    ("uea_data.py", 2, "uea_data.py has no command line; a UEA dataset is read by python train_"),
    ("test_all.py", 2, "test_all.py has no command line; run python -m pytest -q test_all.py"),
]


@pytest.mark.parametrize("module, status, said", _HELP, ids=_id)
def test_every_module_help_says_what_it_does_or_what_to_run_instead(module, status, said):
    """--help: a command line's usage and what it does (a tour: the header, its Run: line), or,
    from a module without one, exit status 2 and one line naming what to run instead."""
    assert sorted(row[0] for row in _HELP) == sorted(p.name for p in HERE.glob("*.py"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, module, "--help"], cwd=HERE, capture_output=True, text=True, env=env
    )
    assert run.returncode == status, run.stderr[-2000:]
    if status == 0:
        assert run.stdout.startswith("usage: ") and said in run.stdout and not run.stderr
    else:
        assert run.stderr.strip() == run.stderr.strip().splitlines()[0] and not run.stdout
        assert run.stderr.startswith(said), run.stderr


# ----------------------------------------------------------------------------------------------
# CUDA: skipped without a GPU (`.ci/gpu` runs them where there is one)
# ----------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
ATTENTIONS = dict(
    softmax=SoftmaxAttention, agf=AGFAttention, primal=PrimalAttention, gfsa=GFSAttention
)


@cuda
@pytest.mark.parametrize("kind", list(ATTENTIONS))
def test_cuda_attention_agrees_with_the_cpu(kind):
    """Forward and gradients on CUDA equal the CPU's, float32, with padding, to 1e-4."""
    torch.manual_seed(0)
    layer = ATTENTIONS[kind](64, 2).eval()
    x = torch.randn(3, 300, 64)
    mask = torch.arange(300) < torch.tensor([[300], [211], [5]])
    outs = []
    for device in ("cpu", "cuda"):
        layer.to(device).zero_grad()
        xd = x.to(device).detach().requires_grad_()  # a fresh leaf on each device
        y, aux = layer(xd, mask.to(device))
        (y.square().mean() + aux).backward()
        grads = [xd.grad] + [p.grad for p in layer.parameters()]
        outs.append([t.detach().cpu() for t in (y, aux, *grads)])
    for a, b in zip(*outs, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4), kind


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_autocast_is_finite_at_8192_and_padding_still_does_not_leak(dtype):
    """bf16 and fp16 autocast, N = 8192, padding: forward and backward finite; junk in the padding
    changes the real outputs no more than the dtype's rounding does between two equal calls."""
    torch.manual_seed(0)
    x = torch.randn(2, 8192, 64, device="cuda")
    mask = (torch.arange(8192) < torch.tensor([[8192], [6000]])).cuda()
    junk = torch.where(mask[..., None], x, 1e3 * torch.randn_like(x))
    for kind, cls in ATTENTIONS.items():
        layer = cls(64, 2).cuda().eval()
        with torch.autocast("cuda", dtype):
            y, aux = layer(x.requires_grad_(), mask)
            y2, _ = layer(junk, mask)
        (y.float().square().mean() + aux.float()).backward()
        assert torch.isfinite(y).all() and torch.isfinite(x.grad).all(), (kind, dtype)
        eps = torch.finfo(dtype).eps * y.float().abs().max().item()
        assert (y - y2)[mask].abs().max().item() <= 4 * eps, (kind, dtype)
        x.grad = None


@cuda
def test_cuda_fp16_step_with_grad_scaler_lowers_the_loss():
    torch.manual_seed(0)
    model = Classifier(_tiny("lra", "agf", max_len=64)).cuda()
    x, mask = (t.cuda() for t in _inputs(_tiny("lra"), B=16, N=40))
    y = (x[:, 0] % 3).cuda()  # learnable from the first token
    opt, scaler = torch.optim.Adam(model.parameters(), 3e-3), torch.amp.GradScaler("cuda")
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", torch.float16):
            logits, aux = model(x, mask)
            loss = F.cross_entropy(logits.float(), y) + aux
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses  # (the same on the CPU in bf16: 1.23 -> 0.62)


@cuda
def test_cuda_lra_resume_continues_the_same_run():
    """A resumed GPU run restores the GPU's generator (dropout): the weights of a straight run, up
    to the GPU's summation order (other dropout masks would move them by ~1e-3)."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        args = tmp, "train_lra.py", "--device", "cuda", "--no-amp"
        straight, resumed, logs = _straight_and_resumed(*args)
        a, b = (torch.load(tmp / r / "checkpoint.pt", weights_only=True) for r in "ab")
        assert a["cuda_rng"] is not None
        for k in a["model"]:
            assert torch.allclose(a["model"][k], b["model"][k], rtol=1e-4, atol=1e-5), k
        for ra, rb in zip(*logs, strict=True):
            assert ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-4)


@cuda
def test_cuda_training_scripts_and_torchrun_end_with_a_result_line():
    """train_uea.py and train_lra.py --preset quick --device cuda (a few steps), and torchrun with
    one process on NCCL, each end with RESULT {json} naming the GPU."""
    with tempfile.TemporaryDirectory() as tmp:
        torchrun = "-m torch.distributed.run --standalone --nproc_per_node 1".split()
        commands = [["train_lra.py", *_lra_args(tmp + "/data", tmp + "/lra")]]
        commands += [[*torchrun, "train_lra.py", *_lra_args(tmp + "/data", tmp + "/ddp")]]
        if (UEA_DIR / "JapaneseVowels").exists():
            uea = [*TINY, "--epochs", "2", "--data-dir", str(UEA_DIR), "--out", tmp + "/uea"]
            commands += [["train_uea.py", *uea]]
        for argv in commands:
            argv = [sys.executable, *argv, "--device", "cuda"]
            run = subprocess.run(argv, cwd=HERE, capture_output=True, text=True, timeout=300)
            assert run.returncode == 0, run.stderr[-3000:]
            result = json.loads(run.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
            assert torch.cuda.get_device_name() in result["device"], result["device"]


@cuda
def test_cuda_lra_adamw_is_fused_on_the_gpu_only():
    """train_lra.build: AdamW fused (one kernel for every parameter) on CUDA, plain on the CPU."""
    cfg = train_lra.parse_config(["--preset", "quick", "--d-model", "16", "--d-ff", "32"])
    for device, fused in (("cuda", True), ("cpu", False)):
        assert train_lra.build(cfg, torch.device(device))[1].defaults["fused"] is fused, device


@cuda
def test_cuda_bench_measures_eager_compiled_and_cuda_graphs_side_by_side(tmp_path):
    """.ci/gpu_bench.py on the GPU: AGF, Primal layers and an AGF step in the three modes, all
    compiled, graphs rows without memory, eager rows with operators (last: the slowest)."""
    common = "--device cuda --repeats 2 --warmup 1 --kinds agf".split()
    layer, step = "primal --ns 512 --fit-min 512", "--what step --step-ns 256 --step-batch 4"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        for what, flags in (("layer", layer), ("step", step)):
            gpu_bench.main([*common, *flags.split(), "--csv", str(tmp_path / f"{what}.csv")])
    rows = [r for f in ("layer", "step") for r in csv.DictReader(open(tmp_path / f"{f}.csv"))]
    modes = ("eager", "compiled", "graphs")
    want = {("layer", k, m) for k in ("agf", "primal") for m in modes}
    want |= {("step", "agf", m) for m in modes}
    assert {(r["what"], r["kind"], r["mode"]) for r in rows} == want, out.getvalue()
    assert not any("not compiled" in r["note"] for r in rows), out.getvalue()
    assert all(float(r["fwdbwd_ms"] or r["step_ms"]) > 0 for r in rows)
    assert all((r["mem_mib"] == "") == (r["mode"] == "graphs") for r in rows)
    assert all(int(r["ops"]) > 0 for r in rows if r["mode"] == "eager")


if __name__ == "__main__":  # the suite runs under pytest
    print("test_all.py has no command line; run python -m pytest -q test_all.py", file=sys.stderr)
    sys.exit(2)
