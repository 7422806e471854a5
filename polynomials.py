"""
polynomials.py: polynomial bases by three-term recurrence, and a learnable polynomial filter.

Paper:  H. Wi, J. Choi, N. Park, "Learning Advanced Self-Attention for Linear Transformers in
        the Singular Value Domain", IJCAI 2025, arXiv:2505.08516. Only the README and the
        official code (jeongwhanchoi/agf, AGF_LRA/polyconv.py) are available, so no equation
        numbers are cited; the recurrence below is the standard one (DLMF §18.9).
Idea:   AGF filters each "singular value" s ∈ (0, 1) with a learned polynomial
            g(s) = Σ_{k=0..K} θ̃_k P_k(s),   θ̃_k = tanh(θ_k),  θ̃_0 = 1 (frozen) by default
        where P_k is a Jacobi polynomial P_k^(α,β) (Legendre and "Chebyshev" are special cases)
        or the monomial s^k. Negative θ̃_k let g pass high as well as low frequencies
        (AGF README, Theorem 2).
Cost:   O(K) elementwise operations per entry of s; any tensor shape.

Symbols (paper -> code -> shape):
    s            x / s         any shape      points where the basis is evaluated
    P_k^(α,β)    jacobi()      (K+1, *shape)  Jacobi polynomials, k = 0..K
    α, β         alpha, beta   float          Jacobi parameters (α + β > -2)
    θ_k          theta         (K,)           raw coefficients of P_1..P_K, θ̃_k = tanh(θ_k)
    θ_0          theta0        ()             raw constant coefficient (only if not frozen)
    g(s)         PolynomialFilter(s)  shape of s
Dims:   B batch, N tokens, D model width, H heads, d = D/H head width,
        K polynomial order (legend: README)

Run:         python polynomials.py   -> basis checks, a frequency response, FilterSum == the
                                        plain sum, a cost curve
Depends on:  torch
"""

import argparse
import math
import timeit

import torch
import torch.nn as nn
from torch import Tensor

BASES = ("jacobi", "legendre", "chebyshev", "chebyshev_t", "monomial")


def jacobi_recurrence(order: int, alpha: float, beta: float) -> list:
    """(a_k, b_k, c_k), k = 1..K, of the Jacobi recurrence (DLMF §18.9; term for term the official
    AGF_LRA/polyconv.py), in the form every basis of this file takes (see `evaluate_basis`):
        P_1(x) = ½ (α - β + (α + β + 2) x)                 a_1 = (α + β + 2)/2, b_1 = (α - β)/2
        P_k(x) = (a_k x + b_k) P_{k-1}(x) - c_k P_{k-2}(x),   k >= 2, with n = 2k + α + β:
        a_k = n (n-1) / (2k (k+α+β)),  b_k = (n-1)(α² - β²) / (2k (k+α+β)(n-2)),
        c_k = (k+α-1)(k+β-1) n / (k (k+α+β)(n-2))
    α + β > -2 keeps every denominator non-zero. β <= -1 (AGF's tuned -1, -1.5, -2) is allowed:
    the recurrence is finite there, but no integrable weight makes the P_k orthogonal.
    """
    a, b = alpha, beta
    if a + b <= -2:
        raise ValueError(f"Jacobi needs alpha + beta > -2, got alpha={a}, beta={b}")
    coefs = [((a + b + 2) / 2, (a - b) / 2, 0.0)][:order]
    for k in range(2, order + 1):
        n, kab = 2 * k + a + b, k * (k + a + b)  # kab = k (k+α+β), in every denominator
        a_k, b_k = n * (n - 1) / (2 * kab), (n - 1) * (a * a - b * b) / (2 * kab * (n - 2))
        coefs.append((a_k, b_k, (k + a - 1) * (k + b - 1) * n / (kab * (n - 2))))  # c_k last
    return coefs


def recurrence(basis: str, order: int, alpha: float = 0.0, beta: float = 0.0) -> list:
    """(a_k, b_k, c_k), k = 1..K, of one of the BASES.

    "legendre" is Jacobi(0, 0), exactly Legendre P_k. "chebyshev" is Jacobi(-½, -½) as in the
    official code, which equals (2k)! / (4^k (k!)²) · T_k: T_k only up to a constant per k
    (1, ½, 3/8, 5/16, ...). "chebyshev_t" is T_k itself (T_k(cos t) = cos kt: T_1 = x,
    T_k = 2x T_{k-1} - T_{k-2}); "monomial" is x^k (x^k = x · x^{k-1}). alpha and beta are used
    by "jacobi" only.
    """
    if basis == "monomial":
        return [(1.0, 0.0, 0.0)] * order
    if basis == "chebyshev_t":
        # NOTE: not in the official code, whose "chebyshev" (kept as it is) is T_k only up to
        #       the constant above; added so that the true T_k can be compared.
        return [(1.0, 0.0, 0.0)] + [(2.0, 0.0, 1.0)] * (order - 1) if order else []
    known = {"jacobi": (alpha, beta), "legendre": (0.0, 0.0), "chebyshev": (-0.5, -0.5)}
    if basis not in known:
        raise ValueError(f"unknown basis {basis!r}; choose one of {BASES}")
    return jacobi_recurrence(order, *known[basis])


def evaluate_basis(x: Tensor, coefs: list) -> Tensor:
    """P_0 .. P_K at x (elementwise) from P_0 = 1, P_{-1} = 0 and, for k = 1..K,
    P_k(x) = (a_k x + b_k) P_{k-1}(x) - c_k P_{k-2}(x),  with (a_k, b_k, c_k) = coefs[k - 1].

    Args:
        x: points, any shape and float dtype. AGF passes raw s ∈ (0, 1), no map to [-1, 1].
        coefs: K triples, e.g. from `recurrence`.
    Returns:
        (K + 1, *x.shape)
    """
    basis = [torch.zeros_like(x), torch.ones_like(x)]  # P_{-1}, P_0
    for a, b, c in coefs:
        basis.append((a * x + b) * basis[-1] - c * basis[-2])
    return torch.stack(basis[1:])


def jacobi(x: Tensor, order: int, alpha: float, beta: float) -> Tensor:
    """Jacobi polynomials P_0^(α,β) .. P_order^(α,β) at x, unnormalised (scipy's).  (K+1, *x)"""
    return evaluate_basis(x, jacobi_recurrence(order, alpha, beta))


def polynomial_basis(
    x: Tensor, order: int, basis: str = "jacobi", alpha: float = 0.0, beta: float = 0.0
) -> Tensor:
    """One of the BASES, evaluated elementwise at x (see `recurrence`).  (K+1, *x)"""
    return evaluate_basis(x, recurrence(basis, order, alpha, beta))


class PolynomialFilter(nn.Module):
    """Learnable filter g(s) = Σ_{k=0..K} θ̃_k P_k(s), applied elementwise (AGF README).

    As in the official AGF_LRA/polyconv.py: K + 1 coefficients θ̃_k = tanh(θ_k) with θ_k
    initialised to 0, so each θ̃_k ∈ (-1, 1) and may go negative (Theorem 2 needs that). With
    fix_theta0 the constant coefficient is frozen at θ̃_0 = 1 (all LRA runs, UEA with --fixI), so
    g ≡ 1 at init; without it θ̃_0 = tanh(θ_0) is learned from 0, so g ≡ 0 at init.

    Args:
        order: K, the highest degree (K + 1 terms).
        basis: one of BASES.
        alpha, beta: Jacobi α, β (basis "jacobi" only).
        fix_theta0: freeze θ̃_0 = 1 instead of learning tanh(θ_0).
        lean: True: the sum by FilterSum (the default, less memory); False: forward's plain
            sum, to read and step through (the same g; tested equal).
    Shapes:
        forward(s (any shape)) -> g(s) (same shape)
    """

    def __init__(self, order: int, basis="jacobi", alpha=0.0, beta=0.0, fix_theta0=True, lean=True):
        super().__init__()
        if order < 0:
            raise ValueError(f"order K={order} must be >= 0")
        if basis not in BASES:
            raise ValueError(f"unknown basis {basis!r}; choose one of {BASES}")
        self.order, self.basis, self.alpha, self.beta = order, basis, alpha, beta
        self.theta = nn.Parameter(torch.zeros(order))  # θ_1..θ_K; tanh(0) = 0: g starts flat
        # θ_0: None means "frozen at θ̃_0 = 1" (a constant needs no parameter)
        # NOTE: differs from the official polyconv.py, whose frozen θ_0 is a Parameter with
        #       requires_grad=False: a constant here, so it is not in the state_dict.
        self.theta0: nn.Parameter | None = None if fix_theta0 else nn.Parameter(torch.zeros(()))
        self.lean = lean

    def coefficients(self) -> Tensor:
        """θ̃_0 .. θ̃_K, the effective coefficients. Returns (K + 1,)."""
        if self.theta0 is None:
            theta0 = torch.ones(1, dtype=self.theta.dtype, device=self.theta.device)
        else:
            theta0 = torch.tanh(self.theta0).view(1)
        return torch.cat([theta0, torch.tanh(self.theta)])

    def forward(self, s: Tensor) -> Tensor:
        theta = self.coefficients().to(s.dtype)  # θ̃_0 .. θ̃_K
        coefs = recurrence(self.basis, self.order, self.alpha, self.beta)  # K triples
        if not self.lean:  # g(s) = Σ_k θ̃_k P_k(s): the K + 1 terms P_k(s) stacked, then summed
            return torch.tensordot(theta, evaluate_basis(s, coefs), dims=1)
        # The same sum (the default path): FilterSum, below, keeps for backward 2 tensors the
        # size of s, where autograd through the line above keeps every P_k and every product.
        return FilterSum.apply(s, theta, coefs)

    def extra_repr(self) -> str:
        ab = f", alpha={self.alpha}, beta={self.beta}" if self.basis == "jacobi" else ""
        frozen = "frozen θ̃_0=1" if self.theta0 is None else "learned θ̃_0"
        return f"order={self.order}, basis={self.basis}{ab}, {frozen}"


@torch.no_grad()
def frequency_response(poly_filter: PolynomialFilter, n_points: int = 199) -> tuple[Tensor, Tensor]:
    """The filter's response g(s) on an even grid of s strictly inside (0, 1), for plotting.

    s is the sigmoid output in AGF, so (0, 1) is the whole range the filter ever sees.

    Returns:
        s (n_points,), g(s) (n_points,)
    """
    p = poly_filter.theta
    s = torch.linspace(0.0, 1.0, n_points + 2, dtype=p.dtype, device=p.device)[1:-1]
    return s, poly_filter(s)


# Second read: FilterSum, the default path of PolynomialFilter.forward, for memory. Autograd
# through the plain sum keeps every P_k and every product for backward (at K = 5, 10 tensors of
# 15 times the bytes of s: 9 the size of s and the K + 1 terms stacked); FilterSum keeps 2, s and
# g'(s). Measured on the CPU: one AGF layer (B = 2, D = 64, H = 2, K = 5) at N = 4096 keeps
# 18.1 MiB instead of 46.1, and the filter's forward + backward is 1.3-2.2x as fast (RESULTS.md,
# "AGF's polynomial filter: FilterSum against the plain sum").


def _buffer(s: Tensor, fill: float | None = None) -> Tensor:
    """A contiguous tensor of the shape, dtype and device of s, filled with `fill` (or left
    uninitialised), whatever the strides of s. AGF passes a transposed view, and torch.compile
    cannot trace `out=` into a non-contiguous tensor, which `empty_like(s)` would copy from s."""
    buffer = torch.empty(s.shape, dtype=s.dtype, device=s.device)
    return buffer if fill is None else buffer.fill_(fill)


class FilterSum(torch.autograd.Function):
    """g(s) = Σ_k θ̃_k P_k(s), the plain sum of `PolynomialFilter.forward`, keeping two tensors the
    size of s for backward, not K + 1 or more.

    Autograd through the recurrence would keep every P_k and every intermediate product. Here the
    forward pass also runs the derivative of the recurrence,
        P_k' = a_k P_{k-1} + (a_k s + b_k) P_{k-1}' - c_k P_{k-2}',   P_0' = P_{-1}' = 0,
    and keeps s and the slope g'(s) = Σ_k θ̃_k P_k'(s). Backward then needs
        ∂L/∂s = ∂L/∂g · g'(s)   and   ∂L/∂θ̃_k = Σ over all entries of ∂L/∂g · P_k(s),
    the second by running the recurrence for P_k once more.
    Both passes write each step in place into a few buffers the size of s, passed round (P_{k-2}'s
    buffer, no longer needed, takes the next step's work): a new tensor per step would cost time,
    on the CPU most of all, where each fresh allocation is paged in anew.
    """

    @staticmethod
    def forward(ctx, s: Tensor, theta: Tensor, coefs: list) -> Tensor:
        # P_{k-2}, P_{k-1} and a buffer for P_k; the same for the derivatives P'
        p_prev, p, t = _buffer(s, 0.0), _buffer(s, 1.0), _buffer(s)
        d_prev, d, e = _buffer(s, 0.0), _buffer(s, 0.0), _buffer(s)
        g, slope = theta[0] * p, _buffer(s, 0.0)  # Σ θ̃_k P_k and Σ θ̃_k P_k' so far
        for k, (a, b, c) in enumerate(coefs, 1):  # k from 1 (torch 2.4 compiles no start=)
            torch.mul(s, a, out=t).add_(b)  # t = a_k s + b_k
            torch.mul(p, a, out=e).addcmul_(t, d).sub_(d_prev, alpha=c)  # e = P_k' (see above)
            t.mul_(p).sub_(p_prev, alpha=c)  # t = P_k = (a_k s + b_k) P_{k-1} - c_k P_{k-2}
            # the names move on; the buffer of P_{k-2} (P_{k-2}') is the next t (e)
            p_prev, p, t, d_prev, d, e = p, t, p_prev, d, e, d_prev
            g.addcmul_(theta[k], p)  # g += θ̃_k P_k (θ̃_k stays a tensor: no sync with a GPU)
            slope.addcmul_(theta[k], d)
        ctx.save_for_backward(s, slope)
        ctx.coefs = coefs
        return g

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_g: Tensor):
        s, slope = ctx.saved_tensors
        p_prev, p, t = _buffer(s, 0.0), _buffer(s, 1.0), _buffer(s)
        grad_theta = [grad_g.sum()]  # P_0 = 1
        for a, b, c in ctx.coefs:
            torch.mul(s, a, out=t).add_(b).mul_(p).sub_(p_prev, alpha=c)  # t = P_k
            p_prev, p, t = p, t, p_prev
            grad_theta.append(torch.tensordot(grad_g, p, dims=p.dim()))  # Σ ∂L/∂g · P_k
        return grad_g * slope, torch.stack(grad_theta), None


if __name__ == "__main__":
    # `python polynomials.py`: a few-second tour of this file; CPU is fine.
    raw = argparse.RawDescriptionHelpFormatter  # --help: the header above (Run: the tour)
    argparse.ArgumentParser(description=__doc__, formatter_class=raw).parse_args()
    torch.manual_seed(0)
    x = torch.linspace(-1, 1, 101, dtype=torch.float64)
    K = 6

    # Check 1: "chebyshev" = Jacobi(-½, -½) = (2k)! / (4^k (k!)²) · T_k.
    scale = torch.tensor([math.comb(2 * k, k) / 4**k for k in range(K + 1)], dtype=x.dtype)
    jacobi_half, t_k = (polynomial_basis(x, K, basis) for basis in ("chebyshev", "chebyshev_t"))
    ok = torch.allclose(jacobi_half, scale[:, None] * t_k)
    print("Jacobi(-1/2, -1/2) == c_k * T_k:", ok)
    # Check 2: Legendre (Jacobi(0, 0)) at degree 3 is (5x³ - 3x) / 2.
    ok = torch.allclose(polynomial_basis(x, 3, "legendre")[3], (5 * x**3 - 3 * x) / 2)
    print("Jacobi(0, 0) == Legendre (P_3 = (5x^3 - 3x)/2):", ok)

    # The AGF ListOps filter (K=5, α=2, β=-1) with random coefficients, on s ∈ (0, 1).
    poly = PolynomialFilter(5, "jacobi", alpha=2.0, beta=-1.0)
    print(poly)
    with torch.no_grad():
        poly.theta.normal_()
    s, g = frequency_response(poly, n_points=5)
    print("s   :", [round(v, 2) for v in s.tolist()])
    print("g(s):", [round(v, 2) for v in g.tolist()])
    s = frequency_response(poly)[0]
    print("max |P_k(s)| on (0, 1), k <= 5:", round(jacobi(s, 5, 2.0, -1.0).abs().max().item(), 1))
    plain = PolynomialFilter(5, "jacobi", alpha=2.0, beta=-1.0, lean=False)
    plain.load_state_dict(poly.state_dict())
    print("FilterSum == the plain Σ_k θ̃_k P_k(s):", torch.allclose(poly(s), plain(s), atol=1e-5))

    # Cost: elementwise, so time grows linearly in the number of entries (here N·d, d = 64);
    # (xR): R times the row above.
    last = None
    for n in (1024, 2048, 4096, 8192):
        s = torch.rand(n, 64, requires_grad=True)
        # best of 3: the first call pays one-off allocation costs (s=s: this pass's s)
        times = timeit.repeat(lambda s=s: poly(s).sum().backward(), number=1, repeat=3)
        ms = min(times) * 1e3
        print(f"N={n:5d} x d=64   fwd+bwd {ms:6.2f} ms" + (f" (x{ms / last:.1f})" if last else ""))
        last = ms
