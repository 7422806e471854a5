"""
ksvd_attention.py: Primal-Attention, self-attention as an asymmetric kernel SVD, in one file.

Paper:  Y. Chen, Q. Tao, F. Tonin, J. A. K. Suykens, "Primal-Attention: Self-attention through
        Asymmetric Kernel SVD in Primal Representation", NeurIPS 2023, arXiv:2305.19798.
        The paper body is not in our material: we cite Remark 3.3 (project page), the primal
        problem of the authors' poster, and the official code yingyichen-cyy/PrimalAttention.
Idea:   Softmax attention o_i = Σ_j v(x_j) κ(x_i, x_j) is the *dual* form of a kernel SVD with
        an asymmetric kernel κ. The *primal* form computes the same kind of scores as
            e(x) = W_{e|X}ᵀ φ_q(x),   r(x) = W_{r|X}ᵀ φ_k(x)                       (Remark 3.3)
        with data-dependent weights W_{e|X} = f(X)ᵀ W_e, W_{r|X} = f(X)ᵀ W_r built from m
        sampled tokens f(X), and cosine feature maps φ_q(x) = q / ‖q‖₂ of the query q = x W_q
        (φ_k: of the key k = x W_k). The layer outputs a linear map of [e; r]. The KSVD objective
            J = ½ Σ_i e_iᵀ Λ e_i + ½ Σ_j r_jᵀ Λ r_j − Tr(W_eᵀ W_r)          (poster, primal problem)
        is 0 at every stationary point (KKT), so η·J² joins the training loss and pushes each
        layer towards a KSVD solution without ever computing an SVD.
Cost:   per head, O((N + m)·d·s) time for W_{e|X}, W_{r|X} and the scores e, r, and
        O((N + m)·(d + s)) memory; no N x N tensor (the dual form needs O(N²)). W_q, W_k, W_o
        add O(N·D²) time, W_er O(N·D·s).

Symbols (paper -> code -> shape):
    X                 x             (B, N, D)     layer input
    φ_q, φ_k          phi_q, phi_k  (B, H, N, d)  cosine feature maps of queries and keys
    f(X)              f_x           (B, H, m, d)  m sampled real tokens, head h = channels h·d..
    W_e, W_r          We, Wr        (H, m, s)     base projection weights; (H, d, s) if causal
    W_{e|X}, W_{r|X}  W_eX, W_rX    (B, H, d, s)  data-dependent projection weights
    e, r              e, r          (B, H, N, s)  projection scores
    Λ = diag(λ²)      Lambda = λ    (H, s)        KSVD regularisation coefficients (loss only)
    η                 ksvd_weight   float         weight of J² in the training loss
    [e; r] -> o       W_er          Linear(2s, d) the "linear map to the output size" (poster),
                                                  shared by heads; official `concate_weight`
    H_e, H_r          h_e, h_r      (B, H, N, s)  dual variables (dense reference only)
Dims:   B batch, N tokens, D model width, H heads, d = D / H head width, s rank = number of
        KSVD components (the paper's s; r is only the r-scores), m = min(max_len, s·rank_multi)
        sampled tokens (legend: README)

Run:         python ksvd_attention.py  -> shapes, primal == dual check, a cost curve (CPU, seconds)
Depends on:  torch
"""

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor


def primal_scores(
    phi_q: Tensor, phi_k: Tensor, f_x: Tensor | None, We: Tensor, Wr: Tensor
) -> tuple[Tensor, Tensor]:
    """Primal projection scores e = Φq W_{e|X}, r = Φk W_{r|X} of each head.     (Remark 3.3)

    Cost per sequence and head: m·d·s multiply-adds for each of W_{e|X}, W_{r|X} (none when
    causal) and N·d·s for each of e, r: O((N + m) d s), linear in N and in H.

    Args:
        phi_q, phi_k: feature maps φ_q(x_i), φ_k(x_j).              (B, H, N, d)
        f_x:    sampled tokens f(X); None for the causal variant,   (B, H, m, d)
                where W_e, W_r are used directly as W_{e|X}, W_{r|X}.
        We, Wr: base weights, shared over the batch or one per      (H, m, s) or (B, H, m, s)
                sequence ((H, d, s) when f_x is None).
    Returns:
        e, r                                                        (B, H, N, s) each
    """
    W_eX, W_rX = We, Wr  # the causal variant (f_x None): the base weights themselves
    if f_x is not None:  # W_{e|X} = f(X)ᵀ W_e first: O(m d s), no (N, m)-sized Φq f(X)ᵀ formed
        W_eX = f_x.transpose(-2, -1) @ We  # (B,H,d,m) @ (H,m,s) -> (B,H,d,s)
        W_rX = f_x.transpose(-2, -1) @ Wr  # (B,H,d,m) @ (H,m,s) -> (B,H,d,s)
    e = phi_q @ W_eX  # e_i = W_{e|X}ᵀ φ_q(x_i) for every i: (B,H,N,d) @ (B,H,d,s) -> (B,H,N,s)
    r = phi_k @ W_rX  # r_j = W_{r|X}ᵀ φ_k(x_j) for every j: (B,H,N,d) @ (B,H,d,s) -> (B,H,N,s)
    return e, r


def ksvd_objective(
    e: Tensor, r: Tensor, Lambda: Tensor, We: Tensor, Wr: Tensor, mask: Tensor, per_sample: bool
) -> Tensor:
    """KSVD objective J of one layer, averaged as in the official code, over real tokens only.

        J = mean_{h,i} ½‖λ_h ⊙ e_i‖² + mean_{h,j} ½‖λ_h ⊙ r_j‖² − mean_h Tr(W_e[h]ᵀ W_r[h])
    (poster, primal problem, with Σ_i replaced by a mean as in the code; λ ⊙ e = Λ^{1/2} e).

    Args:
        e, r:       projection scores.                                  (B, H, N, s)
        Lambda:     λ, with Λ = diag(λ²).                               (H, s)
        We, Wr:     base weights of the trace term.                     (H, m, s) or (H, d, s)
        mask:       True = real token; padded tokens do not count.      (B, N) bool
        per_sample: False: one J for the batch, means over all real tokens of all sequences
                    (LRA, ImageNet code). True: one J_b per sequence (UEA, D4RL, WikiText
                    code); a sequence without real tokens gets J_b = −Tr.
    Returns:
        J () if not per_sample, else J_b (B,)
    """
    # NOTE: differs from the official LRA loss (model_wrapper.py): it averages over all N
    #       positions, padding included. We skip padding, because junk must not change the loss.
    sq = (e.square() + r.square()).masked_fill(~mask[:, None, :, None], 0.0).sum(dim=2)  # (B,H,s)
    energy = 0.5 * (Lambda.square() * sq).sum(-1).mean(1)  # (B,) Σ_c λ_c² Σ_i e_ic²: no λ ⊙ e kept
    # "trace_no_x": the trace couples the *base* weights, as in the poster and every official run
    # NOTE: the official code's other trace (its default, without --trace_no_x, which no
    #       official run uses) is not offered.
    trace = (We * Wr).sum(dim=(-2, -1)).mean()  # mean_h Tr(W_e[h]ᵀ W_r[h]) = mean_h Σ W_e ⊙ W_r
    # clamp(min=1): a batch or sequence without real tokens has energy 0, not 0 / 0 = NaN
    if per_sample:
        return energy / mask.sum(dim=1).clamp(min=1) - trace  # (B,)
    return energy.sum() / mask.sum().clamp(min=1) - trace  # ()


class PrimalAttention(nn.Module):
    """Primal-Attention: multi-head self-attention as the primal form of an asymmetric KSVD.

    Args:
        d_model:     D, token width.
        n_heads:     H; each head has width d = D / H.
        rank:        s, KSVD components per head (paper s; official `low_rank`). Default 20 and
                     the other defaults: LRA ListOps, Primal. (official PrimalFormer run_tasks.sh).
        rank_multi:  m = min(max_len, rank·rank_multi) sampled tokens (official `rank_multi`).
        max_len:     caps m; set it to the longest sequence (UEA code: min(N_max, s·rank_multi)).
                     A longer input is allowed: m stays fixed, only the sample spacing grows.
                     rank_multi and max_len are unused when causal=True (no sampling).
        ksvd_weight: η, the weight of J² in the returned aux loss (LRA ListOps Primal.: 0.1).
        causal:      decoder variant of the official D4RL / WikiText code: running means of q
                     and k, data-independent W_e, W_r of shape (H, d, s).
        ksvd_reduction: "batch": η·J² with J averaged over the whole batch (LRA, ImageNet code);
                     "sample": η·mean_b J_b² over per-sequence J_b (UEA, D4RL, WikiText code).
                     "sample" asks every sequence to sit at a stationary point; "batch" lets
                     sequences with J_b > 0 and J_b < 0 cancel. Use the one of the code you
                     reproduce; with equal J_b the two coincide.
    Shapes:
        forward(x (B, N, D), mask (B, N) bool, True = real token) -> (y (B, N, D), aux_loss ())
        y is 0 at padded positions; aux_loss = η·J² (already weighted).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rank: int = 20,
        rank_multi: int = 10,
        max_len: int = 1024,
        ksvd_weight: float = 0.1,
        causal: bool = False,
        ksvd_reduction: str = "batch",
    ):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:  # n_heads 0: a ValueError, not ZeroDivisionError
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if ksvd_reduction not in ("batch", "sample"):
            raise ValueError(f"ksvd_reduction={ksvd_reduction!r}: expected 'batch' or 'sample'")
        for name, value in (("rank", rank), ("rank_multi", rank_multi), ("max_len", max_len)):
            if value < 1:  # s = 0 or m = 0: no component or no sampled token
                raise ValueError(f"{name}={value} must be >= 1")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.n_samples = min(max_len, rank * rank_multi)  # m
        self.ksvd_weight, self.causal, self.ksvd_reduction = ksvd_weight, causal, ksvd_reduction
        self.W_q = nn.Linear(d_model, d_model)  # queries; there is no value projection
        self.W_k = nn.Linear(d_model, d_model)  # keys
        # orthogonal_ flattens (H, m, s) to H x (m·s): the H rows are orthonormal, so each head's
        # block has unit Frobenius norm but is not itself orthogonal (as in the official code)
        rows = self.d_head if causal else self.n_samples
        self.We = nn.Parameter(nn.init.orthogonal_(torch.empty(n_heads, rows, rank)))
        self.Wr = nn.Parameter(nn.init.orthogonal_(torch.empty(n_heads, rows, rank)))
        self.Lambda = nn.Parameter(torch.rand(n_heads, rank))  # λ ~ U(0, 1); Λ = diag(λ²)
        # W_er: the 2s -> d "linear map to the output size" (poster) of [e; r], shared by all heads
        # as in the official code, which calls it `concate_weight`
        self.W_er = nn.Linear(2 * rank, self.d_head)
        self.W_o = nn.Linear(d_model, d_model)  # output projection

    def feature_maps(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Cosine feature maps φ_q = q / ‖q‖₂, φ_k = k / ‖k‖₂ (no softmax, no √d), (B, H, N, d)
        each, for x (B, N, D), mask (B, N) bool."""
        B, N, _ = x.shape
        q = self.W_q(x).view(B, N, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, N, d)
        k = self.W_k(x).view(B, N, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, N, d)
        if self.causal:  # mean over the past *before* the feature map, as the official code
            q, k = causal_running_mean(q, mask), causal_running_mean(k, mask)
        # normalize's eps (1e-12) maps a zero vector to 0, not NaN; on W_q's layout (its rows are
        # contiguous: faster than on the head view)
        return tuple(F.normalize(z.transpose(1, 2), p=2.0, dim=-1).transpose(1, 2) for z in (q, k))

    def sampled_tokens(self, x: Tensor, mask: Tensor) -> Tensor | None:
        """f(X) (B, H, m, d), heads split by *input* channels (official code); None if causal."""
        if self.causal:  # sampling tokens from the whole sequence would leak the future
            return None
        f_x = sample_real_tokens(x, mask, self.n_samples)  # (B, m, D)
        return f_x.view(x.shape[0], self.n_samples, self.n_heads, self.d_head).transpose(1, 2)

    def scores(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """Steps 1-3 of forward: e, r (B, H, N, s) each, for x (B, N, D), mask (B, N) bool."""
        # zero the padding first: even inf / NaN junk then cannot reach a real position
        # (NaN · 0 is NaN, so masking later would not be enough for the backward pass)
        x = x.to(self.W_q.weight.dtype).masked_fill(~mask[..., None], 0.0)
        phi_q, phi_k = self.feature_maps(x, mask)  # (B, H, N, d) each
        return primal_scores(phi_q, phi_k, self.sampled_tokens(x, mask), self.We, self.Wr)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Args: x (B, N, D); mask (B, N) bool, True = real token, None = all real.
        Returns: y (B, N, D), 0 at padded rows; aux_loss () = η·J² per `ksvd_reduction`."""
        _check_inputs(x, mask, self.W_q.weight)  # TypeError / ValueError naming the argument
        B, N, D = x.shape
        if mask is None:
            mask = torch.ones(B, N, dtype=torch.bool, device=x.device)
        # The block runs in the parameters' dtype (fp32 under AMP), as the official LRA code:
        # squared scores in J and long running sums lose too much in fp16 / bf16.
        with torch.autocast(device_type=x.device.type, enabled=False):
            # 1-3) φ_q, φ_k; W_{e|X} = f(X)ᵀ W_e, W_{r|X}; e = Φq W_{e|X}, r = Φk W_{r|X}
            e, r = self.scores(x, mask)  # (B, H, N, s) each                        (Remark 3.3)
            # 4) o_i = W_er [e_i ; r_i], 2s -> d, the same map for every head       (poster)
            o = self.W_er(torch.cat([e.transpose(1, 2), r.transpose(1, 2)], dim=-1))  # (B,N,H,d)
            # 5) merge heads, project, zero padded rows
            # NOTE: the official LRA code zeroes before the projection (padded rows = its bias)
            y = self.W_o(o.flatten(2))  # (B, N, D)
            y = y.masked_fill(~mask[..., None], 0.0)
            # 6) KSVD loss η·J² (or η·mean_b J_b²), J = 0 at a KSVD stationary point (poster)
            per_sample = self.ksvd_reduction == "sample"
            J = ksvd_objective(e, r, self.Lambda, self.We, self.Wr, mask, per_sample)
            # an empty batch (B = 0) has no KSVD to fit: 0, not NaN (or η·Tr² for "batch")
            aux_loss = self.ksvd_weight * J.pow(2).mean() if B > 0 else J.new_zeros(())
        return y.to(x.dtype), aux_loss


def sample_real_tokens(x: Tensor, mask: Tensor, m: int) -> Tensor:
    """f(X): m evenly spaced *real* tokens of each sequence.

    idx = floor(linspace(0, n_real - 1, m)) over the real positions of each sequence, so left,
    right or scattered padding never enters f(X). With n_real < m some tokens repeat, which is
    harmless (their rows of W_e simply add up).

    Args:
        x:    layer input.                                         (B, N, D)
        mask: True = real token.                                   (B, N) bool
        m:    number of samples.
    Returns:
        f(X)                                                       (B, m, D)
    """
    B, N, D = x.shape
    # NOTE: differs from the official code (LRA attention.py, UEA Primal_Attention.py): it
    #       samples linspace(0, N - 1, m) over all N positions, padding included. We sample real
    #       tokens only, because padding must change neither f(X) nor, through it, any output.
    #       Same positions when nothing is padded.
    real_first = torch.argsort(~mask, dim=1, stable=True)  # (B, N) real positions first, in order
    n_real = mask.sum(dim=1, keepdim=True)  # (B, 1)
    j = torch.arange(m, device=x.device)  # (m,)
    # floor(j (n_real - 1) / (m - 1)) in integers: exact, where a float linspace can land on
    # 4.999… instead of 5. max(·, 1) covers m = 1; clamp covers a sequence with no real token.
    k_th = j * (n_real - 1).clamp(min=0) // max(m - 1, 1)  # (B, m) ranks among the real tokens
    positions = real_first.gather(1, k_th)  # (B, m) positions in the sequence
    return x.gather(1, positions[..., None].expand(B, m, D))  # (B, m, D)


def causal_running_mean(z: Tensor, mask: Tensor) -> Tensor:
    """z̄_t = mean of z_τ over the real positions τ ≤ t (official D4RL / WikiText code).

    Args:
        z:    queries or keys.                                     (B, H, N, d)
        mask: True = real token.                                   (B, N) bool
    Returns:
        z̄                                                          (B, H, N, d)
    """
    real = mask[:, None, :, None]  # (B, 1, N, 1)
    # NOTE: differs from the official causal code (D4RL / WikiText primal_attention.py): it
    #       divides cumsum(z) by t + 1 and ignores the mask. We count real tokens only, because
    #       a padded token would otherwise leak into every later position.
    z_sum = z.masked_fill(~real, 0.0).cumsum(dim=2)  # Σ_{τ ≤ t, real} z_τ
    # clamp: before the first real token (left padding) the count is 0; 0 / 1 = 0 instead of NaN
    count = real.to(z.dtype).cumsum(dim=2).clamp(min=1)  # (B, 1, N, 1)
    return z_sum / count


DENSE_MAX_BYTES = 2**32  # 4 GiB: default cap on one (B, H, N, N) matrix of the dense dual form


def ksvd_kernel(
    phi_q: Tensor, phi_k: Tensor, f_x: Tensor | None, mask: Tensor, *, max_bytes=DENSE_MAX_BYTES
) -> Tensor:
    """The N x N asymmetric kernel the primal form never builds: tests, teaching, diagnose.py.

        κ(x_i, x_j) = φ_q(x_i)ᵀ f(X)ᵀ f(X) φ_k(x_j),   K_X = Φq Fᵀ F Φkᵀ
    With f_x None (causal variant: W_{e|X} is the free variable) F = I and K = Φq Φkᵀ.
    Rows and columns of padded tokens are 0: they are not data points of the KSVD.

    Args:
        max_bytes: MemoryError, before allocating, if K_X would take more bytes (default 4 GiB).
    Returns:
        K_X                                                          (B, H, N, N)
    """
    B, H, N, _ = phi_q.shape
    shape, gib = (B, H, N, N), 2**30  # refuse K_X before torch tries it (and swaps)
    size = math.prod(shape) * phi_q.dtype.itemsize
    if size > max_bytes:
        raise MemoryError(f"phi_q: dense K_X {shape}: {size / gib:.1f} GiB > {max_bytes=}")
    if f_x is not None:
        phi_k = phi_k @ (f_x.transpose(-2, -1) @ f_x)  # Φk Fᵀ F: (B,H,N,d) @ (B,H,d,d)
    kernel = phi_q @ phi_k.transpose(-2, -1)  # (B,H,N,d) @ (B,H,d,N) -> (B,H,N,N)
    pair_is_real = mask[:, None, :, None] & mask[:, None, None, :]  # (B, 1, N, N)
    return kernel.masked_fill(~pair_is_real, 0.0)


def kkt_base_weights(
    phi_q: Tensor, phi_k: Tensor, f_x: Tensor | None, h_e: Tensor, h_r: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Base weights given by dual variables through the KKT conditions of the primal problem.

        ∂L/∂W_r = 0:  W_e = F Σ_j φ_k(x_j) h_{r_j}ᵀ = F Φkᵀ H_r
        ∂L/∂W_e = 0:  W_r = F Σ_i φ_q(x_i) h_{e_i}ᵀ = F Φqᵀ H_e
    (F = I when f_x is None). Then primal e = Φq Fᵀ W_e = K_X H_r and r = K_Xᵀ H_e (Remark 3.3).

    Args:
        h_e, h_r: dual variables; rows of padded tokens are ignored.      (B, H, N, s)
    Returns:
        W_e, W_r, one pair per sequence: (B, H, m, s), or (B, H, d, s) when f_x is None
    """
    real = mask[:, None, :, None]  # (B, 1, N, 1)
    W_e = phi_k.transpose(-2, -1) @ h_r.masked_fill(~real, 0.0)  # (B,H,d,N) @ (B,H,N,s)
    W_r = phi_q.transpose(-2, -1) @ h_e.masked_fill(~real, 0.0)  # -> (B, H, d, s)
    if f_x is None:
        return W_e, W_r
    return f_x @ W_e, f_x @ W_r  # (B,H,m,d) @ (B,H,d,s) -> (B,H,m,s)


def ksvd_dual_reference(
    phi_q: Tensor,
    phi_k: Tensor,
    f_x: Tensor | None,
    h_e: Tensor,
    h_r: Tensor,
    mask: Tensor,
    *,
    max_bytes: int = DENSE_MAX_BYTES,
) -> tuple[Tensor, Tensor]:
    """Dual form of the scores with the N x N kernel written out. Tests and teaching only.

        e(x_i) = Σ_j h_{r_j} κ(x_i, x_j)   ->  E = K_X H_r                        (Remark 3.3)
        r(x_j) = Σ_i h_{e_i} κ(x_i, x_j)   ->  R = K_Xᵀ H_e                        (Remark 3.3)
    Equals `primal_scores` at the real tokens when W_e, W_r come from `kkt_base_weights`.
    max_bytes: the cap on K_X, see `ksvd_kernel`.

    Returns:
        e, r                                                         (B, H, N, s) each
    """
    kernel = ksvd_kernel(phi_q, phi_k, f_x, mask, max_bytes=max_bytes)  # (B, H, N, N)
    return kernel @ h_r, kernel.transpose(-2, -1) @ h_e  # (B,H,N,N) @ (B,H,N,s) -> (B,H,N,s)


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
    # `python ksvd_attention.py`: a few-second tour of this file; CPU is fine.
    raw = argparse.RawDescriptionHelpFormatter  # --help: the header above (Run: the tour)
    argparse.ArgumentParser(description=__doc__, formatter_class=raw).parse_args()
    torch.manual_seed(0)
    B, N, D, H, s = 2, 64, 32, 4, 8
    layer = PrimalAttention(D, H, rank=s, rank_multi=4, max_len=N)  # m = min(64, 8·4) = 32
    x = torch.randn(B, N, D)
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, 48:] = False  # 2nd sequence: last 16 tokens are padding
    y, aux = layer(x, mask)
    n_params, m = sum(p.numel() for p in layer.parameters()), layer.n_samples
    print(f"x {tuple(x.shape)} -> y {tuple(y.shape)}  aux={aux.item():.4f}  {n_params=:,}  {m=}")

    # Check (Remark 3.3): build W_e, W_r from random dual variables H_e, H_r through the KKT
    # conditions; the O(N) primal scores must then equal the dual ones from the N x N kernel.
    layer, x = layer.double(), x.double()
    with torch.no_grad():
        phi_q, phi_k = layer.feature_maps(x, mask)
        f_x = layer.sampled_tokens(x, mask)
        h_e, h_r = torch.randn(2, B, H, N, s, dtype=torch.float64)
        W_e, W_r = kkt_base_weights(phi_q, phi_k, f_x, h_e, h_r, mask)  # (B, H, m, s)
        e, r = primal_scores(phi_q, phi_k, f_x, W_e, W_r)
        e_dual, r_dual = ksvd_dual_reference(phi_q, phi_k, f_x, h_e, h_r, mask)
    real = mask[:, None, :, None]  # compare at real tokens; the dual form is 0 at padding
    same = torch.allclose(e.masked_fill(~real, 0.0), e_dual)
    same &= torch.allclose(r.masked_fill(~real, 0.0), r_dual)
    print("primal scores == dual (N x N kernel) scores:", same)

    # Cost: one forward + backward as N doubles (expect ~2x per doubling: O(N d s));
    # (xR): R times the row above.
    layer, last = PrimalAttention(D, H, rank=s, rank_multi=4, max_len=N), None
    for n in (1024, 2048, 4096, 8192):
        xn, times = torch.randn(4, n, D, requires_grad=True), []
        for _ in range(3):  # best of 3: the first call pays one-off allocation costs
            t0 = time.perf_counter()
            yn, auxn = layer(xn)
            (yn.sum() + auxn).backward()
            times.append((time.perf_counter() - t0) * 1e3)
        ms = min(times)
        print(f"N={n:5d}  fwd+bwd {ms:7.1f} ms" + (f" (x{ms / last:.1f})" if last else ""))
        last = ms
