"""
agf.py: Attentive Graph Filter (AGF), self-attention as a learned graph filter in the singular
value domain, linear in the sequence length, in one file.

Paper:  H. Wi, J. Choi, N. Park, "Learning Advanced Self-Attention for Linear Transformers in
        the Singular Value Domain", IJCAI 2025, arXiv:2505.08516v1. The paper body is not
        available, so nothing here cites an equation number: sources are the AGF README and the
        official code (jeongwhanchoi/agf @ f338b5b, AGF_LRA/attention_svd.py, polyconv.py).
Idea:   Attention is a graph filter A over tokens (AGF README: H). AGF builds it in SVD form,
            AGF(X) = A · X W_val,   A = U(X) Σ(X) V(X)ᵀ                     (AGF README)
        with "singular vectors" U = softmax over d (rows), V = softmax over tokens (columns),
        and token-wise "singular values" Σ_i = diag(g(sigmoid(x_i W_Σ))), where g is a learned
        polynomial g(s) = Σ_k θ̃_k P_k^(α,β)(s) (polynomials.py). Negative θ̃_k let A pass high
        frequencies too (README, Theorem 2). A penalty γ·(mean|UᵀU - I| + mean|VᵀV - I|)
        pushes U and V towards orthonormal columns. The paper's ablation compares two reduced
        forms, here variant="uv" (A = U Vᵀ: no Σ, linear attention with softmax feature maps)
        and variant="svd" (A = U Σ Vᵀ with Σ_i = diag(sigmoid(x_i W_Σ)) unfiltered).
        Written out first below, as the paper writes it: U, V, Σ, A, then A · X W_val. Then the
        default path, the same product right to left, Y = (U ⊙ g)·(Vᵀ·Val): A is never formed.
Cost:   written out, O(N²·d) time and O(N²) memory per head; right to left, O(N·d²) and O(N·d).

Symbols (paper -> code -> shape), in the order `agf_dense_reference` computes them:
    X          x                 (B, N, D)     input tokens
    U(X)       u                 (B, H, N, d)  softmax_d(X W_U): each row sums to 1
    V(X)       v                 (B, H, N, d)  softmax_N(X W_V): each column sums to 1
    σ(X W_Σ)   s                 (B, H, N, d)  sigmoid, in (0, 1)
    Σ(X)       g                 (B, H, N, d)  g_θ̃(σ): the d diagonal entries of each Σ_i
    A (H)      graph_filter      (B, H, N, N)  U Σ Vᵀ, the graph filter (written out only)
    X W_val    values            (B, H, N, d)  the values
    A·X W_val  y                 (B, H, N, d)  each head's output, before W_o
    W_U, W_V   W_u, W_v          Linear(D, D)  singular vectors (official W_q, W_k)
    W_Σ, W_val W_sigma, W_val    Linear(D, D)  singular values; values (official W_v)
    θ_k        poly_filter.theta (K,)          one set per layer, shared by heads
    γ          ortho_weight      float         weight of the orthogonality penalty
Dims:   B batch, N tokens, D model width, H heads, d = D/H head width (here also the rank),
        K polynomial order (legend: README)

Run:         python agf.py   -> shapes, fast path == dense N x N reference, a cost curve
Depends on:  torch, polynomials.py (copy both)
"""

import argparse
import math
import time

import torch
import torch.nn as nn
from torch import Tensor

from polynomials import PolynomialFilter

DENSE_MAX_BYTES = 2**32  # 4 GiB: default cap on the (B, H, N, N) matrix A of the paper's form


# The paper's form, as written: U, V and Σ, then the N x N graph filter A = U Σ Vᵀ, then A·X W_val.
# O(N² d) time and O(N²) memory per head: for reading, for the tests and for diagnose.py (reads A).


def agf_dense_reference(
    layer: "AGFAttention",
    x: Tensor,
    mask: Tensor | None = None,
    *,
    max_bytes: int = DENSE_MAX_BYTES,
) -> tuple[Tensor, Tensor]:
    """AGF(X) = A · X W_val with A = U(X) Σ(X) V(X)ᵀ written out as an N x N matrix. (AGF README)

    Same output as layer(x, mask)[0] (tested equal: values and gradients), with the same
    handling of padding: a padded token's row of U and column of V are 0, so its row and column
    of A are 0; its output is 0. The rows of A do not sum to 1.

    Args:
        layer: an AGFAttention (below): its W_U, W_V, W_Σ, W_val, filter g_θ̃ and W_o.
        x: (B, N, D); mask: (B, N) bool, True = real token, or None.
        max_bytes: MemoryError, before allocating, if A would take more bytes (default 4 GiB).
    Returns:
        y (B, N, D), graph_filter A (B, H, N, N)
    """
    B, N, D = x.shape
    work = torch.promote_types(x.dtype, torch.float32)  # float32 at least, as `factors`, below
    shape, gib = (B, layer.n_heads, N, N), 2**30  # refuse A before torch tries it (and swaps)
    size = math.prod(shape) * work.itemsize
    if size > max_bytes:
        raise MemoryError(f"x: dense A {shape} {work}: {size / gib:.1f} GiB > {max_bytes=}")
    real = torch.ones(B, N, dtype=torch.bool, device=x.device) if mask is None else mask
    x = x.masked_fill(~real[..., None], 0.0)  # junk at padded tokens, NaN too, is replaced

    def heads(t: Tensor) -> Tensor:  # (B, N, D) -> (B, N, H, d) -> (B, H, N, d), in `work`
        return t.view(B, N, layer.n_heads, layer.d_head).transpose(1, 2).to(work)

    u = heads(layer.W_u(x)).softmax(dim=-1)  # U(X) = softmax_d(X W_U)               (B, H, N, d)
    u = u.masked_fill(~real[:, None, :, None], 0.0)  # padded rows of U: 0 (NOTE in `factors`)
    v = masked_token_softmax(heads(layer.W_v(x)), mask)  # V(X) = softmax_N(X W_V), real tokens
    if layer.variant == "uv":  # ablation "uv": no Σ, A = U Vᵀ
        g = torch.ones_like(u)
    else:
        s = torch.sigmoid(heads(layer.W_sigma(x)))  # σ(X W_Σ) ∈ (0, 1)          (B, H, N, d)
        g = layer.poly_filter(s) if layer.variant == "agf" else s  # Σ(X) = g_θ̃(σ); "svd": σ
    graph_filter = (u * g) @ v.transpose(-2, -1)  # A = U Σ Vᵀ: (B,H,N,d) @ (B,H,d,N) -> (B,H,N,N)
    y = graph_filter @ heads(layer.W_val(x))  # A·X W_val: (B,H,N,N) @ (B,H,N,d) -> (B,H,N,d)
    y = layer.W_o(y.transpose(1, 2).reshape(B, N, D).to(x.dtype))  # merge heads, project
    return y.masked_fill(~real[..., None], 0.0), graph_filter


# The same product right to left (the default path): Vᵀ·X W_val first, one d x d matrix per head,
# so A (N x N) is never formed: O(N d²) time and O(N d) memory instead of O(N² d) and O(N²).
# Measured with bench.py's timer on the CPU (one layer, B = 2, D = 64, H = 2, forward + backward;
# RESULTS.md, "AGF: right to left against A written out"): 3.1-3.7x as fast, keeping 3.9x less
# for backward, at N = 1024 (Image, Pathfinder); 7.6-9.0x and 6.6x at 2000 (ListOps); 13.6-16.4x
# and 12.3x at 4000 (Retrieval).


def agf_apply(u: Tensor, g: Tensor, v: Tensor, values: Tensor) -> Tensor:
    """Y = U Σ Vᵀ Val with Σ_i = diag(g_i), evaluated right to left.      (AGF README)

    Row i: Y_i = (u_i ⊙ g_i)ᵀ (Vᵀ Val), so the N x N filter A is never built.

    Args:
        u: U(X), rows sum to 1.                      (B, H, N, d)
        g: g(Σ), one diagonal of d values per token. (B, H, N, d)
        v: V(X), columns sum to 1.                   (B, H, N, d)
        values: X W_val.                             (B, H, N, d)
    Returns:
        Y                                            (B, H, N, d)
    Cost: O(N d²) time, O(N d) memory.
    """
    vt_val = v.transpose(-2, -1) @ values  # Vᵀ Val: (B,H,d,N) @ (B,H,N,d) -> (B,H,d,d)
    return (u * g) @ vt_val  # U Σ ·:     (B,H,N,d) @ (B,H,d,d) -> (B,H,N,d)


def orthogonality_penalty(u: Tensor, v: Tensor) -> Tensor:
    """mean|UᵀU - I| + mean|VᵀV - I| per sample, as in official AGF_LRA/attention_svd.py.

    The mean runs over heads and the d x d entries. Rows of padded tokens must already be zero
    in u and v, so that padding does not enter the Gram matrices.
    It cannot reach 0 when N > d²: rows of U are distributions, so trace(UᵀU) >= N/d > d.

    Args:
        u, v: U(X), V(X).                            (B, H, N, d)
    Returns:
        the unweighted penalty per sample            (B,)
    """
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)
    gram_u = u.transpose(-2, -1) @ u  # UᵀU: (B,H,d,N) @ (B,H,N,d) -> (B,H,d,d)
    gram_v = v.transpose(-2, -1) @ v  # VᵀV: (B,H,d,N) @ (B,H,N,d) -> (B,H,d,d)
    return (gram_u - eye).abs().mean(dim=(1, 2, 3)) + (gram_v - eye).abs().mean(dim=(1, 2, 3))


VARIANTS = ("agf", "uv", "svd")  # AGF; A = U Vᵀ; A = U Σ Vᵀ with Σ unfiltered (AGFAttention)


class AGFAttention(nn.Module):
    """Multi-head AGF attention: Y = U(X) g(Σ(X)) V(X)ᵀ X W_val, then W_o.   (AGF README)

    Defaults are the LRA ListOps preset (official AGF_LRA/best_agf.sh): K=5, Jacobi(2, -1),
    γ = 0.01, θ̃_0 frozen at 1. No 1/√d scaling and no attention dropout, as in the official code.
    At init (θ_k = 0, θ̃_0 = 1) g ≡ 1 and AGF is exactly linear attention with softmax feature
    maps, softmax_d(Q) · (softmax_N(K)ᵀ V).

    Args:
        d_model: D, token width.
        n_heads: H; each head has width d = D / H.
        order: K, highest degree of the polynomial filter.
        basis: "jacobi", "legendre", "chebyshev" (= Jacobi(-½,-½), as official), "chebyshev_t"
            (true T_k) or "monomial"; see polynomials.py.
        alpha, beta: Jacobi α, β (basis "jacobi" only).
        ortho_weight: γ, weight of the orthogonality penalty (official --reg / --eta).
        fix_theta0: freeze θ̃_0 = 1 (LRA; UEA --fixI) instead of learning tanh(θ_0) from 0.
        variant: "agf" (the full model), "uv" (A = U Vᵀ, no W_Σ and no filter) or "svd"
            (A = U Σ Vᵀ, Σ = diag(sigmoid(X W_Σ)) as it is, no filter): the paper's ablation.
    Shapes:
        forward(x (B, N, D), mask (B, N) bool, True = real token) -> (y (B, N, D), aux_loss ())
        aux_loss = γ · penalty, averaged over the batch, in float32 (float64 for float64 x);
        y is in x's dtype and is 0 at padded positions.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        order: int = 5,
        basis: str = "jacobi",
        alpha: float = 2.0,
        beta: float = -1.0,
        ortho_weight: float = 0.01,
        fix_theta0: bool = True,
        variant: str = "agf",
    ):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:  # n_heads 0: a ValueError, not ZeroDivisionError
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r}: expected 'agf', 'uv' or 'svd'")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.ortho_weight, self.variant = ortho_weight, variant
        self.W_u = nn.Linear(d_model, d_model)  # -> U, left singular vectors
        self.W_v = nn.Linear(d_model, d_model)  # -> V, right singular vectors
        # -> Σ, singular values (not in the "uv" form)
        self.W_sigma = nn.Linear(d_model, d_model) if variant != "uv" else None
        self.W_val = nn.Linear(d_model, d_model)  # -> values X W_val
        self.W_o = nn.Linear(d_model, d_model)  # output projection
        # One θ per layer, shared by all heads, tokens and diagonal entries (official code);
        filtered = variant == "agf"  # only the full model filters Σ
        self.poly_filter = (
            PolynomialFilter(order, basis, alpha, beta, fix_theta0) if filtered else None
        )

    def factors(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, ...]:
        """Steps 1-4 of forward: U, g(Σ), V and the values, (B, H, N, d) each, in float32 (float64
        stays float64), for x (B, N, D), mask (B, N) or None; u and v are 0 at padded tokens."""
        B, N, D = x.shape
        if mask is not None:
            # Junk at padded tokens (even NaN, as 0 · NaN = NaN) must not reach anything below.
            x = x.masked_fill(~mask[..., None], 0.0)
        # The projections X W run under the caller's autocast, as in the official code; all after
        # them in float32, as its autocast(enabled=False) block: softmaxes, sigmoid and filter.
        work = torch.promote_types(x.dtype, torch.float32)
        # Autocast: x cast once here; else each of the four maps casts it and keeps its own copy.
        if torch.is_autocast_enabled(x.device.type) and x.dtype == torch.float32:
            x = x.to(torch.get_autocast_dtype(x.device.type))

        def heads(t: Tensor) -> Tensor:  # (B, N, D) -> (B, N, H, d) -> (B, H, N, d), in `work`
            return t.view(B, N, self.n_heads, self.d_head).transpose(1, 2).to(work)

        # 1) U = softmax_d(X W_U): left singular vectors, each row sums to 1      (AGF README)
        u = heads(self.W_u(x)).softmax(dim=-1)  # (B, H, N, d)
        # 2) V = softmax_N(X W_V) over the real tokens: each column sums to 1     (AGF README)
        v = masked_token_softmax(heads(self.W_v(x)), mask)  # (B, H, N, d)
        if mask is not None:
            # NOTE: differs from the official code: padded rows of U are zeroed, because
            #       padding must not enter UᵀU (the aux loss) nor A. The official LRA code
            #       keeps them; its UEA code masks nothing at all.
            u = u.masked_fill(~mask[:, None, :, None], 0.0)
        # 3) Σ_i = diag(g(s_i)), s = sigmoid(X W_Σ) ∈ (0, 1), g(s) = Σ_k θ̃_k P_k(s)  (AGF README)
        #    "svd": g(s) = s, unfiltered; "uv": no Σ, g = 1
        if self.variant == "uv":
            g = torch.ones_like(u)
        else:
            s = torch.sigmoid(heads(self.W_sigma(x)))  # (B, H, N, d)
            # the polynomial's sum in float32 under autocast too (|P_k| up to ~21 by default)
            with torch.autocast(device_type=x.device.type, enabled=False):
                g = self.poly_filter(s) if self.variant == "agf" else s
        # 4) the values X W_val, made contiguous once (not once per matmul that reads them)
        return u, g, v, heads(self.W_val(x)).contiguous()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_inputs(x, mask, self.W_u.weight)  # TypeError / ValueError naming the argument
        B, N, D = x.shape
        # 1)-4) U, V, g(Σ) and the values (see factors)
        u, g, v, values = self.factors(x, mask)
        with torch.autocast(device_type=x.device.type, enabled=False):
            # 5) Y = (U ⊙ g) · (Vᵀ · Val), O(N d²)                          (AGF README)
            y = agf_apply(u, g, v, values)  # (B, H, N, d)
            # 6) aux = γ · (mean|UᵀU - I| + mean|VᵀV - I|), per sample, then the batch mean
            #    (sum / max(B, 1): an empty batch gives 0, not 0 / 0 = NaN)
            aux = self.ortho_weight * orthogonality_penalty(u, v).sum() / max(B, 1)
        # 7) merge heads, project: (B, H, N, d) -> (B, N, H, d) -> (B, N, D)
        y = self.W_o(y.transpose(1, 2).reshape(B, N, D).to(x.dtype))
        if mask is not None:
            # NOTE: differs from the official code: outputs at padded positions are set to 0,
            #       because they are meaningless (the official LRA code gives them U-weighted
            #       values plus W_o's bias) and then nothing downstream can pick them up.
            y = y.masked_fill(~mask[..., None], 0.0)
        return y.to(x.dtype), aux


def masked_token_softmax(logits: Tensor, mask: Tensor | None) -> Tensor:
    """V(X) (B, H, N, d): softmax of the logits X W_V (B, H, N, d) over the token axis N, where
    padded tokens (False in mask (B, N); None: no padding) get exactly zero weight. Each column is
    a distribution over the real tokens (all zero if none)."""
    if mask is None:
        return logits.softmax(dim=-2)
    keep = mask[:, None, :, None]  # (B, 1, N, 1)
    # finfo.min, not -inf: a column whose tokens are all padding stays finite (softmax of all
    # -inf is NaN); otherwise exp(finfo.min - max) underflows to exactly 0 at padded tokens.
    # NOTE: the official code subtracts 1e9 (not fp16-safe); same result in float32.
    logits = logits.masked_fill(~keep, torch.finfo(logits.dtype).min)
    # All-padding sample: the softmax is uniform over padding; refill with 0 so V is exactly 0.
    return logits.softmax(dim=-2).masked_fill(~keep, 0.0)


def _check_inputs(x: Tensor, mask: Tensor | None, weight: Tensor) -> None:
    """TypeError (dtype) or ValueError (shape, device) naming the argument, what it expected and
    what came (raised, not asserted: python -O drops asserts); reads no values (torch.compile)."""
    D, dtype, got = weight.shape[1], weight.dtype, f"got {x.dtype} of shape {tuple(x.shape)}"
    amp = x.dtype != dtype and x.is_floating_point() and torch.is_autocast_enabled(x.device.type)
    if (x.dtype != dtype and not amp) or x.dim() != 3 or x.shape[1] == 0 or x.shape[2] != D:
        error = TypeError if x.dtype != dtype and not amp else ValueError  # autocast mixes dtypes
        raise error(f"x: expected {dtype} (the layer's dtype) of shape (B, N >= 1, {D}), {got}")
    if mask is None or (mask.dtype, mask.shape, mask.device) == (torch.bool, x.shape[:2], x.device):
        return
    error = ValueError if mask.dtype == torch.bool else TypeError
    got = f"got {mask.dtype} of shape {tuple(mask.shape)} on {mask.device}"
    raise error(f"mask: expected bool of shape {tuple(x.shape[:2])} on {x.device}, {got}")


if __name__ == "__main__":
    # `python agf.py`: a few-second tour of this file; CPU is fine.
    raw = argparse.RawDescriptionHelpFormatter  # --help: the header above (Run: the tour)
    argparse.ArgumentParser(description=__doc__, formatter_class=raw).parse_args()
    torch.manual_seed(0)
    B, N, D, H = 2, 64, 64, 2  # LRA width: D = 64, 2 heads of d = 32
    layer = AGFAttention(D, H).double()
    with torch.no_grad():
        layer.poly_filter.theta.normal_()  # a non-trivial filter (at init g ≡ 1)
    x = torch.randn(B, N, D, dtype=torch.float64)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 48:] = False  # 2nd sequence: last 16 tokens are padding
    y, aux = layer(x, mask)
    n_params = sum(p.numel() for p in layer.parameters())
    print(f"x {tuple(x.shape)} -> y {tuple(y.shape)}   aux_loss={aux.item():.4f}   {n_params=:,}")
    print(layer.poly_filter)

    # Check: the O(N d²) path equals the explicit N x N filter A = U diag(g) Vᵀ.
    y_dense, graph_filter = agf_dense_reference(layer, x, mask)
    same = torch.allclose(y, y_dense, atol=1e-12)
    print(f"fast path == dense A (B, H, N, N) = {tuple(graph_filter.shape)}: {same}")

    # Cost: fwd+bwd time and memory saved for backward as N doubles (expect ~2x each: O(N d²));
    # (xR): R times the row above.
    layer, saved, last = AGFAttention(D, H), {}, None

    def pack(t: Tensor) -> Tensor:  # notes the bytes autograd keeps for backward, each storage once
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    for n in (512, 1024, 2048, 4096):
        xn, times = torch.randn(1, n, D, requires_grad=True), []
        for _ in range(3):  # best of 3: the first call pays one-off allocation costs
            saved.clear()
            t0 = time.perf_counter()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y, aux = layer(xn, torch.ones(1, n, dtype=torch.bool))
            (y.sum() + aux).backward()
            times.append((time.perf_counter() - t0) * 1e3)
        ms, mib = min(times), sum(saved.values()) / 2**20
        ms_x, mib_x = (f"(x{ms / last[0]:.1f})", f"(x{mib / last[1]:.1f})") if last else ("", "")
        mib_text = f"saved for backward {mib:6.1f} MiB {mib_x}"
        print(f"N={n:5d}   fwd+bwd {ms:6.1f} ms {ms_x:6s}   {mib_text}".rstrip())
        last = ms, mib
