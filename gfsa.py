"""
gfsa.py: Graph-Filter-based Self-Attention (GFSA), in one file.

Paper:  J. Choi, H. Wi, J. Kim, Y. Shin, K. Lee, N. Trask, N. Park, "Graph Convolutions Enrich the
        Self-Attention in Transformers!", NeurIPS 2024, arXiv:2312.04234v1. Equation and theorem
        numbers below refer to v1.
Idea:   The softmax attention matrix Ā is row-stochastic: the adjacency matrix of a weighted
        directed graph over tokens, so Ā·V is a first-order graph filter. GFSA uses the richer
        polynomial filter G (the paper's H; here H counts the heads)
            G = w0·I + w1·Ā + wK·Ā^K,  with  Ā^K ≈ Ā + (K-1)·(Ā² - Ā)         (Eqs. 4, 5)
            GFSA(X) = G · X W_val                                              (Eq. 6)
        Written out first below: Ā, Ā², G, G·V. Then the default path: collapsed, G = a0·I +
        a1·Ā + a2·Ā², so G·V = a0·V + a1·(ĀV) + a2·Ā(ĀV), two ordinary attention passes with
        the same mask; Ā² (the official code's dense O(N³) product) is never formed.
Cost:   O(N²·d) per head, about twice one attention pass; kernel="linear" (GFSA on "Efficient
        Attention", Shen et al. 2021): O(N·d²) per head. evaluation="official": O(N³) per head.
        The default path keeps for backward, on the CPU: nothing N×N at attention dropout 0,
        unless causal meets padding (an N×N float mask); at dropout > 0, as the CPU's fused
        kernels take no dropout, Ā, its dropout mask and the dropped Ā, per pass (RESULTS.md).

Symbols (paper -> code -> shape):
    X           x             (B, N, D)     input tokens
    Q, K, V     q, k, v       (B, H, N, d)  queries, keys, values (K = key matrix only in QKᵀ)
    Ā           attn          (B, H, N, N)  attention matrix, rows sum to 1 (dense paths only)
    G (H)       graph_filter  (B, H, N, N)  w0·I + w1·Ā + wK·(Ā + (K-1)(Ā² - Ā)) (dense only)
    w0, w1, wK  w0, w1, wK    (H,)          filter coefficients, one set per head (Eq. 5)
    a0, a1, a2  a0, a1, a2    (1, H, 1, 1)  the same filter as a0·I + a1·Ā + a2·Ā² (derived)
    K           order         int >= 2      order of the high-order term (Eq. 4)
    E_K         taylor_error  (B, H)        ‖Ā^K - (Ā + (K-1)(Ā² - Ā))‖∞ (Theorem 3.1)
Dims:   B batch, N tokens, D model width, H heads, d = D / H head width, K polynomial order
        (legend: README)

Run:         python gfsa.py   -> shapes, one exactness check, the Theorem 3.1 bound, a cost curve
Depends on:  torch
"""

import argparse
import math
import timeit
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

DENSE_MAX_BYTES = 2**32  # 4 GiB: default cap on one (B, H, N, N) matrix of the dense paths


# The paper's form, as written (Eqs. 4-6): Ā, then Ā², the filter G, then G·V. O(N³) per head;
# the official code's order, and what the tests and `python gfsa.py` check the fast path with.


def attention_matrix(
    q: Tensor,
    k: Tensor,
    mask: Tensor | None,
    causal: bool,
    kernel: str,
    *,
    max_bytes: int = DENSE_MAX_BYTES,
) -> Tensor:
    """Ā = softmax(QKᵀ/√d) written out as an N×N matrix, masked as the fast path masks it.

    Args:
        q, k: queries and keys.                                   (B, H, N, d)
        mask: (B, N) bool, True = real token, or None.
        causal: query t sees keys <= t only (kernel="softmax" only).
        kernel: "softmax", or "linear" (Ā = ρ_q(Q) ρ_k(K)ᵀ, see `efficient_attention_features`).
        max_bytes: MemoryError, before allocating, if Ā would take more bytes (default 4 GiB).
    Returns:
        Ā, rows sum to 1                                          (B, H, N, N)
    """
    B, H, N, _ = q.shape
    _refuse_dense(f"q: dense Ā {(B, H, N, N)} {q.dtype}", (B, H, N, N), q.dtype, max_bytes)
    if kernel == "softmax":
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B,H,N,d) @ (B,H,d,N)
        keep = attention_keep_mask(mask, N, causal, q.device)  # -> (B,H,N,N) above
        if keep is not None:
            # finfo.min, not -1e9: fp16-safe, and exp underflows to exactly 0 as with SDPA's mask
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        return scores.softmax(dim=-1)
    rho_q, rho_k = efficient_attention_features(q, k, mask)  # second read: kernel="linear"
    return rho_q @ rho_k.transpose(-2, -1)  # (B,H,N,d) @ (B,H,d,N) -> (B,H,N,N)


def gfsa_dense_reference(
    attn: Tensor,
    v: Tensor,
    w0: Tensor,
    w1: Tensor,
    wK: Tensor,
    order: int,
    exact: bool = False,
    *,
    max_bytes: int = DENSE_MAX_BYTES,
) -> tuple[Tensor, Tensor]:
    """G·V as the paper writes it and the official code computes it: Ā², the filter G, then G·V.

    Written literally from Eq. 5 (not from `filter_coefficients`), so comparing it with
    `gfsa_apply` also checks the collapse to a0·I + a1·Ā + a2·Ā². Cost O(N³) per head.

    Args:
        attn: Ā, rows sum to 1.                                   (B, H, N, N)
        v: values.                                                (B, H, N, d)
        w0, w1, wK: filter coefficients, one per head.            (H,)
        order: K >= 2.
        exact: the real Ā^K (matrix_power, O(N³ log K)) instead of the estimate of Eq. 4.
        max_bytes: MemoryError, before allocating, if Ā² or G would take more (default 4 GiB).
    Returns:
        G·V                                                       (B, H, N, d)
        graph_filter, the filter G                                (B, H, N, N)
    """
    _refuse_dense(f"attn: dense Ā², G {tuple(attn.shape)}, each", attn.shape, attn.dtype, max_bytes)
    w0, w1, wK = w0.view(1, -1, 1, 1), w1.view(1, -1, 1, 1), wK.view(1, -1, 1, 1)
    eye = torch.eye(attn.shape[-1], dtype=attn.dtype, device=attn.device)
    if exact:  # second read: the real Ā^K
        attn_pow_k = torch.linalg.matrix_power(attn, order)
    else:
        attn_sq = attn @ attn  # (B,H,N,N) @ (B,H,N,N) -> (B,H,N,N): the O(N³) product
        attn_pow_k = attn + (order - 1) * (attn_sq - attn)  # Ā^K ≈ Ā + (K-1)(Ā² - Ā)  (Eq. 4)
    graph_filter = w0 * eye + w1 * attn + wK * attn_pow_k  # G                     (Eq. 5)
    return graph_filter @ v, graph_filter  # (B,H,N,N) @ (B,H,N,d) -> (B,H,N,d)   (Eq. 6)


# The same G·V, fast (the default path): collapse G to degree 2 in Ā, then two attention passes.


def filter_coefficients(w0: Tensor, w1: Tensor, wK: Tensor, order: int) -> tuple[Tensor, ...]:
    """Collapse the GFSA filter of Eq. 5 into a degree-2 polynomial in Ā.

        w0·I + w1·Ā + wK·(Ā + (K-1)(Ā² - Ā)) = a0·I + a1·Ā + a2·Ā²
        a0 = w0,   a1 = w1 + (2-K)·wK,   a2 = (K-1)·wK
    So K never produces a real K-th power: it only sets how wK is shared between Ā and Ā².

    Args:
        w0, w1, wK: filter coefficients, one per head.       (H,)
        order: K >= 2.
    Returns:
        a0, a1, a2, each shaped to broadcast over (B, H, N, d).   (1, H, 1, 1)
    """
    a0, a1, a2 = w0, w1 + (2 - order) * wK, (order - 1) * wK
    return a0.view(1, -1, 1, 1), a1.view(1, -1, 1, 1), a2.view(1, -1, 1, 1)


def gfsa_apply(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w0: Tensor,
    w1: Tensor,
    wK: Tensor,
    order: int,
    mask: Tensor | None,
    causal: bool,
    kernel: str,
    dropout_p: float,
) -> Tensor:
    """G·V = a0·V + a1·(ĀV) + a2·Ā(ĀV): two attention passes, no Ā² nor G.  (Eqs. 5, 6)

    Both passes use the same Ā: same scale 1/√d, padding mask and causal flag. Padded rows of ĀV
    are harmless, because the second pass gives padded keys zero weight.
    Dropout: each pass draws its own dropout mask (two SDPA calls cannot share one), so each
    factor of Ā(ĀV) is an unbiased dropped Ā. With dropout_p = 0 (eval mode) the result is exact.

    Args:
        q, k, v: queries, keys, values.                           (B, H, N, d)
        w0, w1, wK: Eq. 5's filter coefficients, one per head.    (H,)
        order: K >= 2, the order of the high-order term.
        mask: (B, N) bool, True = real token, or None.
        causal: query t sees keys <= t only (kernel="softmax" only).
        kernel: "softmax" (Ā = softmax(QKᵀ/√d)) or "linear" (Ā = ρ_q(Q) ρ_k(K)ᵀ).
        dropout_p: dropout on the attention weights, per pass.
    Returns:
        G·V                                                       (B, H, N, d)
    """
    a0, a1, a2 = filter_coefficients(w0, w1, wK, order)  # G = a0·I + a1·Ā + a2·Ā²  (1, H, 1, 1)
    attend = attention_pass(q, k, mask, causal, kernel, dropout_p)  # values -> Ā·values
    # Why two passes: Ā(ĀV) costs O(N²d) per head where Ā@Ā costs O(N³), and neither Ā² nor G
    # is formed; the gain measured against the paper's form: RESULTS.md, "GFSA: two passes".
    # NOTE: differs from the official code, which forms Ā@Ā and G, then G@V; the result is the
    #       same in exact arithmetic.
    # NOTE: dropout differs from the official code's, one mask on Ā shared by both factors (NLP)
    #       or dropout(G) (vision): a mask per pass, because two SDPA calls cannot share one.
    av = attend(v)  # Ā V                                                       (B, H, N, d)
    return a0 * v + a1 * av + a2 * attend(av)  # (a0·I + a1·Ā + a2·Ā²) V = G V   (Eq. 6)


def attention_pass(
    q: Tensor, k: Tensor, mask: Tensor | None, causal: bool, kernel: str, dropout_p: float
) -> Callable[[Tensor], Tensor]:
    """values (B, H, N, d) -> Ā·values (B, H, N, d), Ā as `attention_matrix` builds it but not
    written out: kernel="softmax", one `F.scaled_dot_product_attention` call (memory: header)."""
    if kernel == "linear":  # second read
        return linear_attention_pass(q, k, mask, dropout_p)
    # Pure causal gets the is_causal flag, which lets fused kernels skip the upper triangle;
    # SDPA takes no flag together with a mask, so causal + padding passes a (B, 1, N, N) mask
    # (on the CPU turned into floats and kept for backward: N×N memory).
    is_causal = causal and mask is None
    keep = None if is_causal else attention_keep_mask(mask, q.shape[-2], causal, q.device)

    def attend(values: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(
            q, k, values, attn_mask=keep, dropout_p=dropout_p, is_causal=is_causal
        )

    return attend


HIGH_ORDER = ("taylor", "exact")  # Ā^K as Eq. 4's estimate (the paper's), or exactly


class GFSAttention(nn.Module):
    """Multi-head self-attention with Ā·V replaced by the GFSA graph filter G·V.  (Eqs. 5, 6)

    Args:
        d_model: D, token width.
        n_heads: H; each head has width d = D / H.
        order: K of the high-order term (K >= 2). Default 2, because K only sets how wK is shared
            between Ā and Ā² (see `filter_coefficients`), and at K = 2 the Taylor estimate of
            Eq. 4 is exact: G = w0·I + w1·Ā + wK·Ā² (E_2 = 0, Theorem 3.1). The paper tunes K
            per task in 2..10.
        w0: the identity weight; a fixed scalar unless learn_w0 (official code: 0, or a tuned
            fixed scalar in NLP).
        dropout: attention dropout; fast path: an independent mask per pass (see `gfsa_apply`);
            evaluation="official": one mask on Ā before filtering (official NLP convention).
            On the CPU, dropout > 0 in training keeps N×N tensors for backward (header).
        causal: query t sees tokens <= t only (kernel="softmax" only).
      Second read, the other modes:
        learn_w0: learn w0 per head (init w0), as Eq. 5 allows; the official code does not.
        learn_w1: learn w1 per head (init 1), as Eq. 5 allows; the official code fixes w1 = 1.
        kernel: "softmax" (the paper) or "linear" (GFSA on Efficient Attention, O(N d²)).
        evaluation: "fast" (two attention passes) or "official" (the paper's form in the
            official order: dense Ā, Ā², G, G·V; for benchmarks and tests).
        high_order: "taylor" (Eq. 4's estimate of Ā^K, the paper's) or "exact" (the real Ā^K,
            as K attention passes on the fast path: K/2 times the cost, for comparison).
    Shapes:
        forward(x (B, N, D), mask (B, N) bool, True = real token) -> (y (B, N, D), aux_loss ())
        Outputs at padded positions are zero. GFSA has no auxiliary loss: aux_loss is always 0.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        order: int = 2,
        w0: float = 0.0,
        learn_w0: bool = False,
        learn_w1: bool = False,
        dropout: float = 0.0,
        causal: bool = False,
        kernel: str = "softmax",
        evaluation: str = "fast",
        high_order: str = "taylor",
    ):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:  # n_heads 0: a ValueError, not ZeroDivisionError
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if order < 2:
            raise ValueError(f"order K={order}: the high-order term needs K >= 2")
        for name, value, choices in (
            ("kernel", kernel, ("softmax", "linear")),
            ("evaluation", evaluation, ("fast", "official")),
            ("high_order", high_order, HIGH_ORDER),
        ):
            if value not in choices:
                raise ValueError(f"{name}={value!r}: expected one of {choices}")
        if causal and kernel == "linear":  # ρ_k(K) normalises each key feature over all N tokens
            why = "Efficient Attention's key softmax runs over all N tokens: it has no causal form"
            raise ValueError(f"causal=True needs kernel='softmax': {why}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.order, self.dropout, self.causal = order, dropout, causal
        self.kernel, self.evaluation, self.high_order = kernel, evaluation, high_order
        self.W_qkv = nn.Linear(d_model, 3 * d_model)  # W_Q, W_K, W_val of all heads, fused
        self.W_o = nn.Linear(d_model, d_model)  # output projection
        # wK per head, learned from 0 (official code): at init (w0 = 0) exactly softmax attention
        # NOTE: differs from GFSA Eq. 5, where w0 and w1 may be learned: fixed by default, because
        #       the official code fixes them; learn_w0 / learn_w1 give the paper's form.
        self.wK = nn.Parameter(torch.zeros(n_heads))
        for name, init, learn in (("w0", float(w0), learn_w0), ("w1", 1.0, learn_w1)):
            value = torch.full((n_heads,), init)
            if learn:
                self.register_parameter(name, nn.Parameter(value))
            else:  # a constant, not state: kept out of the state_dict
                self.register_buffer(name, value, persistent=False)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        _check_inputs(x, mask, self.W_qkv.weight)  # TypeError / ValueError naming the argument
        B, N, D = x.shape
        if mask is not None:  # padded tokens are replaced, not multiplied by 0 (0 · NaN = NaN)
            x = x.masked_fill(~mask[..., None], 0.0)
        # 1) project, then split heads: (B, N, 3D) -> 3 x (B, H, N, d)
        q, k, v = self.W_qkv(x).view(B, N, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        dropout_p = self.dropout if self.training else 0.0  # eval mode is exact
        # 2) G·V, the graph filter applied to the values                          (Eqs. 5, 6)
        w, K, exact = (self.w0, self.w1, self.wK), self.order, self.high_order == "exact"
        if self.evaluation == "official":  # the paper's form: Ā (one dropout mask), Ā², G, G·V
            attn = F.dropout(attention_matrix(q, k, mask, self.causal, self.kernel), dropout_p)
            y, _ = gfsa_dense_reference(attn, v, *w, K, exact)
        elif not exact:  # the default: a0·V + a1·ĀV + a2·Ā(ĀV), two attention passes
            y = gfsa_apply(q, k, v, *w, K, mask, self.causal, self.kernel, dropout_p)
        else:  # second read: w0·V + w1·ĀV + wK·Ā^K V, K attention passes
            attend = attention_pass(q, k, mask, self.causal, self.kernel, dropout_p)
            y = gfsa_exact_apply(attend, v, *w, K)
        # 3) merge heads and project: (B, H, N, d) -> (B, N, D)
        y = self.W_o(y.transpose(1, 2).reshape(B, N, D))
        # 4) zero the padded rows, so the model sees exact zeros there (W_o's bias would not be)
        # NOTE: differs from the official code, which leaves padded rows as they come.
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, x.new_zeros(())  # GFSA has no auxiliary loss


# Second read: the masks, the other modes (kernel="linear", high_order="exact"), Theorem 3.1.


def _real_keys(mask: Tensor) -> Tensor:
    """(B, N) bool: the keys a query may use; a sequence with no real token may use them all."""
    # An all-padding sequence would otherwise give an all-False row and softmax 0/0 = NaN on some
    # backends. Its outputs are zeroed at the end of forward, so what it attends to is irrelevant.
    return mask | ~mask.any(dim=-1, keepdim=True)


def attention_keep_mask(
    mask: Tensor | None, n: int, causal: bool, device: torch.device
) -> Tensor | None:
    """Which keys each query may attend to, True = allowed, broadcastable to (B, H, N, N).

    Args:
        mask: (B, N) bool, True = real token, or None (all tokens real).
        n, device: N, the number of tokens, and where to build the mask.
        causal: query t may only see keys <= t.
    Returns:
        None (no restriction), (B, 1, 1, N) key padding, (N, N) causal, or (B, 1, N, N) both.
    """
    keep = None if mask is None else _real_keys(mask)[:, None, None, :]  # (B, 1, 1, N)
    if causal:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()  # (N, N): t sees s <= t
        if keep is None:
            return tril
        # The diagonal keeps a padded query whose whole prefix is padding from getting an empty
        # row (NaN); real queries always see their own real key, so their rows do not change.
        eye = torch.eye(n, dtype=torch.bool, device=device)
        keep = (keep | eye) & tril  # (B, 1, N, N)
    return keep


def linear_attention_pass(
    q: Tensor, k: Tensor, mask: Tensor | None, dropout_p: float
) -> Callable[[Tensor], Tensor]:
    """values (B, H, N, d) -> Ā·values (B, H, N, d), Ā = ρ_q(Q) ρ_k(K)ᵀ, right to left: O(N d²)."""
    rho_q, rho_k = efficient_attention_features(q, k, mask)

    def attend(values: Tensor) -> Tensor:
        # Dropout on ρ_k(K) keeps E[Ā] = Ā, the analogue of attention dropout.
        context = F.dropout(rho_k, dropout_p).transpose(-2, -1) @ values  # (B, H, d, d)
        return rho_q @ context  # (B,H,N,d) @ (B,H,d,d) -> (B,H,N,d)

    return attend


def efficient_attention_features(q: Tensor, k: Tensor, mask: Tensor | None) -> tuple[Tensor, ...]:
    """Feature maps of "Efficient Attention" (Shen et al., WACV 2021, arXiv:1812.01243).

        ρ_q(Q) = softmax over d  (each query's d features sum to 1)
        ρ_k(K) = softmax over N  (each key feature sums to 1 over the real tokens)
        Ā = ρ_q(Q) ρ_k(K)ᵀ,  row sums  Σ_j Ā_ij = Σ_c ρ_q(Q)_ic · Σ_j ρ_k(K)_jc = Σ_c ρ_q(Q)_ic = 1
    So Ā is row-stochastic by construction: the row normalisation D⁻¹ with D = diag(Ā·1) of a
    generic kernelised attention is the identity here and needs no division and no eps. No 1/√d
    scaling, as in the official Efficient Attention code (cmsflash/efficient-attention).
    NOTE: not in the official GFSA code: the NeurIPS version reports "Efficient Attention + GFSA"
    on LRA but released no code for it; GFSA on Ā = ρ_q(Q)ρ_k(K)ᵀ is our reading of it.

    Args:
        q, k: queries and keys.                                   (B, H, N, d)
        mask: (B, N) bool, True = real token, or None.
    Returns:
        rho_q, rho_k                                              (B, H, N, d) each
    """
    rho_q = q.softmax(dim=-1)
    if mask is not None:
        # finfo.min (not -1e9, fp16-safe): exp underflows to exactly 0, so a padded key gets
        # exactly zero weight and junk stored there cannot reach any real output.
        k = k.masked_fill(~_real_keys(mask)[:, None, :, None], torch.finfo(k.dtype).min)
    return rho_q, k.softmax(dim=-2)


def gfsa_exact_apply(
    attend: Callable[[Tensor], Tensor], v: Tensor, w0: Tensor, w1: Tensor, wK: Tensor, order: int
) -> Tensor:
    """high_order="exact": the real Ā^K instead of Eq. 4's estimate, G = w0·I + w1·Ā + wK·Ā^K,
    by K successive passes of attend (values -> Ā·values, from `attention_pass`; a dropout mask
    per pass), O(K N² d); Ā^K is never formed. v (B, H, N, d), w (H,) -> G·V (B, H, N, d)."""
    w0, w1, wK = w0.view(1, -1, 1, 1), w1.view(1, -1, 1, 1), wK.view(1, -1, 1, 1)
    av = attend(v)  # Ā V                                                       (B, H, N, d)
    apv = av  # Ā^power V, power = 1
    for _ in range(order - 1):  # Ā^(power+1) V = Ā (Ā^power V): one O(N²d) pass each
        apv = attend(apv)
    return w0 * v + w1 * av + wK * apv  # (w0·I + w1·Ā + wK·Ā^K) V


def taylor_error(attn: Tensor, order: int) -> tuple[Tensor, int, int]:
    """E_K = ‖Ā^K - (Ā + (K-1)(Ā² - Ā))‖∞, the error of Eq. 4, against its bounds.

    Theorem 3.1 bounds it by 2K. Writing the error as Ā^K + (K-2)·Ā - (K-1)·Ā² gives the tighter
    2(K-1), attained by a cyclic-shift (permutation) matrix with N > K; E_2 = 0 exactly.

    Args:
        attn: Ā, rows sum to 1.                                   (..., N, N)
        order: K >= 2.
    Returns:
        E_K, max row sum of |·| per matrix                        (...)
        the paper's bound 2K, and the tight bound 2(K-1)
    """
    exact = torch.linalg.matrix_power(attn, order)  # the real Ā^K
    estimate = attn + (order - 1) * (attn @ attn - attn)  # (Eq. 4)
    error = (exact - estimate).abs().sum(dim=-1).amax(dim=-1)  # ‖·‖∞ = max row sum
    return error, 2 * order, 2 * (order - 1)


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


def _refuse_dense(what: str, shape: tuple, dtype: torch.dtype, max_bytes: int) -> None:
    """MemoryError naming `what` if one tensor of `shape` would take more than max_bytes, raised
    before torch tries to allocate it (and the machine swaps)."""
    size = math.prod(shape) * dtype.itemsize
    if size > max_bytes:
        raise MemoryError(f"{what}: {size / 2**30:.1f} GiB > {max_bytes=}")


if __name__ == "__main__":
    # `python gfsa.py`: a few-second tour of this file; CPU is fine.
    raw = argparse.RawDescriptionHelpFormatter  # --help: the header above (Run: the tour)
    argparse.ArgumentParser(description=__doc__, formatter_class=raw).parse_args()
    torch.manual_seed(0)
    B, N, D, H = 2, 64, 32, 4
    layer = GFSAttention(D, H, order=3)
    x = torch.randn(B, N, D)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 48:] = False  # 2nd sequence: the last 16 tokens are padding
    y, aux = layer(x, mask)
    n_params = sum(p.numel() for p in layer.parameters())
    print(f"x {tuple(x.shape)} -> y {tuple(y.shape)}   aux_loss={aux.item():.1f}   {n_params=:,}")

    # Check: with a learned wK ≠ 0 (at init wK = 0, which would leave the second pass unread),
    # the two attention passes == the dense filter G = w0·I + w1·Ā + wK·(Ā + (K-1)(Ā² - Ā)) V.
    with torch.no_grad():
        layer.wK.normal_()
        y = layer(x, mask)[0]
        q, k, v = layer.W_qkv(x).view(B, N, 3, H, D // H).permute(2, 0, 3, 1, 4)
        attn = attention_matrix(q, k, mask, False, "softmax")  # Ā written out: (B, H, N, N)
        ref, _ = gfsa_dense_reference(attn, v, layer.w0, layer.w1, layer.wK, layer.order)
        ref = layer.W_o(ref.transpose(1, 2).reshape(B, N, D)) * mask[..., None]
    print(f"two passes == dense G, wK ≠ 0, K = {layer.order}:", torch.allclose(y, ref, atol=1e-5))

    # Theorem 3.1 on this layer's Ā: the Taylor estimate of Ā^K is exact for K = 2 only.
    attn = attention_matrix(q.double(), k.double(), mask, False, "softmax")
    for K in (2, 3, 6):
        err, paper, tight = taylor_error(attn, K)
        print(f"K={K}: max E_K = {err.max():.3f}   (Theorem 3.1 bound {paper}, tight {tight})")

    # Cost: forward time as N doubles, fast path (~4x per doubling) vs the official order
    # (Ā@Ā, ~8x per doubling for large N) vs GFSA on linear attention (~2x per doubling);
    # (xR): R times the row above.
    kinds = {
        "fast": layer,
        "official": GFSAttention(D, H, order=3, evaluation="official"),
        "linear": GFSAttention(D, H, order=3, kernel="linear"),
    }
    print("    N" + "".join(f"{name:>18s}" for name in kinds))

    def best_of_3_ms(module: nn.Module, xn: Tensor) -> float:
        # best of 3: the first call pays one-off allocation costs
        return min(timeit.repeat(lambda: module(xn), number=1, repeat=3)) * 1e3

    with torch.no_grad():
        last = {}
        for n in (256, 512, 1024):
            xn = torch.randn(1, n, D)
            now = {name: best_of_3_ms(m, xn) for name, m in kinds.items()}
            growth = {k: f"(x{now[k] / last[k]:.1f})" if last else "" for k in now}
            print(f"{n:5d}" + "".join(f"{now[k]:9.1f} ms {growth[k]:>6s}" for k in now).rstrip())
            last = now
