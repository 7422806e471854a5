"""
.ci/primal_official.py: PrimalAttention against the official LRA layer's order of operations,
and against a block-diagonal form of its scores, interleaved in one process (a shared machine's
load then falls on all alike), on the CPU or one CUDA GPU.

    taskset -c 0,1 python .ci/primal_official.py --ns 512 1024 2048 4096 8192 --repeats 30
    python .ci/primal_official.py --heads 2 8 --ns 1024 4096  # H = 2 (LRA) and 8 (UEA), D = 64
    python .ci/primal_official.py --ns 2048 --saved      # the tensors each saves for backward
    python .ci/primal_official.py --ns 2048 --profile    # torch.profiler, the costliest operators
    python .ci/primal_official.py --device cuda --ns 8192 16384 32768 --repeats 10  # peak memory

One layer as bench.py's: B = 2, D = 64, H = 2 (--heads, --d-model), s = 20, m = 200, float32,
no padding; forward + backward of mean(y²) + aux. "official" is written here from the order of
operations of the official PrimalFormer (PrimalAttention_LRA/PrimalFormer/attentions/
attention.py, class Attention; attention_primal_cos.py, PrimalCosAttention; the LRA KSVD loss of
model_wrapper.py): f(X) by an index into the channel-major input, f(X)ᵀW by einsum, e and r by
einsum, the mask multiplied before the output map, λ applied as e @ diag(λ) and the norm
squared. It shares our layer's parameters, and without padding all three forms give the same y
and aux (checked first, float64).
"block-diag" is our layer with e and r of all heads from one (B, N, H·d) @ (H·d, H·s) product per
sequence, each head's W_{e|X} on the block diagonal: φ stays in W_q's (B, N, H, d) layout (no
copy), at H times the multiplications of the per-head products (B, H, N, d) @ (B, H, d, s).
Per H and N: the median fwd+bwd time of each over --repeats rounds (the order turns every
round), wall clock and, on the CPU, the process's CPU time (on a shared machine the steadier of
the two), the ratio of each to official, and the bytes each saves for backward
(bench.saved_tensors); on CUDA also each one's peak memory: the most allocated during one
forward + backward, less what was allocated before it (x, the weights), and its ratio to
official's.
"""

import argparse
import pathlib
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import bench
from ksvd_attention import PrimalAttention

FORMS = ("ours", "block-diag", "official")


def official(layer: PrimalAttention, x: torch.Tensor, mask: torch.Tensor):
    """(y, aux) of the official LRA layer and loss, in their order, with `layer`'s parameters."""
    B, N, D = x.shape
    H, d, m = layer.n_heads, layer.d_head, layer.n_samples
    q = layer.W_q(x).reshape(B, N, H, d).transpose(1, 2)
    k = layer.W_k(x).reshape(B, N, H, d).transpose(1, 2)
    idx = torch.linspace(0, N - 1, m, dtype=int)
    f_x = x.transpose(-2, -1).reshape(B, H, d, N)[:, :, :, idx].transpose(1, 2)  # (B, d, H, m)
    we = torch.einsum("bahd,hde->bahe", f_x, layer.We).transpose(1, 2)  # (B, H, d, s)
    wr = torch.einsum("bahd,hde->bahe", f_x, layer.Wr).transpose(1, 2)
    e = torch.einsum("...nd,...de->...ne", F.normalize(q, p=2, dim=-1), we)
    r = torch.einsum("...nd,...de->...ne", F.normalize(k, p=2, dim=-1), wr)
    o = layer.W_er(torch.cat((e, r), dim=-1)) * mask.to(x.dtype)[:, None, :, None]
    y = layer.W_o(o.transpose(1, 2).reshape(B, N, D))
    lam = torch.diag_embed(layer.Lambda).unsqueeze(0).repeat(B, 1, 1, 1)  # (B, H, s, s)
    e_term = torch.mean(torch.einsum("...nd,...ds->...ns", e, lam).norm(dim=-1, p=2) ** 2) / 2
    r_term = torch.mean(torch.einsum("...nd,...ds->...ns", r, lam).norm(dim=-1, p=2) ** 2) / 2
    trace = torch.einsum("...ps,...pd->...sd", layer.We, layer.Wr).mean(dim=0).trace()
    return y, layer.ksvd_weight * (e_term + r_term - trace) ** 2


class BlockDiagonal(PrimalAttention):
    """Our layer with e, r of all heads from one product per sequence, on a block diagonal."""

    def scores(self, x: torch.Tensor, mask: torch.Tensor):
        x = x.to(self.W_q.weight.dtype).masked_fill(~mask[..., None], 0.0)
        phi_q, phi_k = self.feature_maps(x, mask)  # (B, H, N, d) views of (B, N, H, d) each
        f_x = self.sampled_tokens(x, mask).transpose(-2, -1)  # (B, H, d, m)
        H = self.n_heads
        eye = torch.eye(H, dtype=x.dtype, device=x.device)[:, None, :, None]  # (H, 1, H, 1)
        e_r = []
        for phi, W in ((phi_q, self.We), (phi_k, self.Wr)):
            W_X = f_x @ W  # W_{e|X} (or W_{r|X}): (B, H, d, s)
            block = (W_X.unsqueeze(-2) * eye).flatten(-4, -3).flatten(-2)  # (B, H·d, H·s)
            score = phi.transpose(1, 2).flatten(2) @ block  # (B, N, H·d) @ (B, H·d, H·s)
            e_r.append(score.unflatten(-1, (H, -1)).transpose(1, 2))  # (B, H, N, s)
        return e_r[0], e_r[1]


def make_forms(d_model: int, n_heads: int, dtype: torch.dtype, device: str) -> dict:
    """The three forms, with the same parameters: name -> (x, mask) -> (y, aux)."""
    torch.manual_seed(0)
    layer = PrimalAttention(d_model, n_heads, max_len=65536).to(device, dtype)
    block = BlockDiagonal(d_model, n_heads, max_len=65536).to(device, dtype)
    block.load_state_dict(layer.state_dict())
    return {"ours": layer, "block-diag": block, "official": lambda x, m: official(layer, x, m)}


def same_outputs(d_model: int, n_heads: int, device: str) -> None:
    """Without padding all give the same y and aux (float64): else the timing is moot."""
    forms = make_forms(d_model, n_heads, torch.float64, device)
    x = torch.randn(2, 300, d_model, dtype=torch.float64, device=device)
    mask = torch.ones(2, 300, dtype=torch.bool, device=device)
    want = forms["official"](x, mask)
    for name in ("ours", "block-diag"):
        for a, b in zip(forms[name](x, mask), want, strict=True):
            if not torch.allclose(a, b, rtol=1e-10, atol=1e-12):
                sys.exit(f"{name} and the official order differ: {(a - b).abs().max():.3g}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ns", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--repeats", type=int, default=30, help="interleaved rounds per N")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--heads", type=int, nargs="+", default=[2], help="H; one layer per value")
    p.add_argument("--d-model", type=int, default=64, help="D, the same at every H")
    p.add_argument("--saved", action="store_true", help="list the tensors saved for backward")
    p.add_argument("--profile", action="store_true", help="torch.profiler's costliest operators")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda: adds peak memory")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device here")
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "the CPU"
    print(f"torch {torch.__version__}, {where}, {torch.get_num_threads()} threads, B=2 float32")
    for H in args.heads:
        same_outputs(args.d_model, H, args.device)
        forms = make_forms(args.d_model, H, torch.float32, args.device)
        for N in args.ns:
            measure(forms, H, N, args)


def measure(forms: dict, H: int, N: int, args: argparse.Namespace) -> None:
    """One line per (H, N) and clock: median times, ratios to official; then saved MiB and on
    CUDA peak MiB; --saved, --profile."""
    x = torch.randn(2, N, args.d_model, device=args.device, requires_grad=True)
    mask = torch.ones(2, N, dtype=torch.bool, device=args.device)
    cuda = x.is_cuda
    sync = torch.get_device_module(x.device).synchronize  # torch.cuda's, or the CPU's (a no-op)
    clocks = ("wall",) if cuda else ("wall", "cpu")  # a GPU's time is not the process's CPU time

    def fwd_bwd(form, x, mask):
        y, aux = form(x, mask)
        (y.square().mean() + aux).backward()
        x.grad = None
        for module in (forms["ours"], forms["block-diag"]):
            module.zero_grad(set_to_none=True)

    times = {(name, clock): [] for name in FORMS for clock in ("wall", "cpu")}
    for i in range(args.repeats + 2):  # the first two rounds warm up
        for j in range(len(FORMS)):  # each form goes first in turn
            name = FORMS[(i + j) % len(FORMS)]
            sync(x.device)
            t0, c0 = time.perf_counter(), time.process_time()
            fwd_bwd(forms[name], x, mask)
            sync(x.device)
            times[name, "cpu"].append((time.process_time() - c0) * 1e3)
            times[name, "wall"].append((time.perf_counter() - t0) * 1e3)
    ms = {key: statistics.median(t[2:]) for key, t in times.items()}
    saved = {n: bench.saved_tensors(lambda f=f, a=(x, mask): f(*a)) for n, f in forms.items()}
    mib = {n: sum(s[2] for s in v) / bench.MIB for n, v in saved.items()}
    for clock in clocks:
        line = f"H={H} D={args.d_model} N={N:5d} {clock:4s}:"
        for name in FORMS:
            line += f" {name} {ms[name, clock]:7.2f}"
        ours, block = (ms[name, clock] / ms["official", clock] for name in ("ours", "block-diag"))
        print(f"{line} ms; / official: ours {ours:.3f}, block-diag {block:.3f}")
    print("    saved MiB: " + ", ".join(f"{n} {mib[n]:.2f}" for n in FORMS))
    if cuda:
        peak = {
            name: bench.peak_mib(lambda f=f: fwd_bwd(f, x, mask), lambda f=f: f(x, mask), x.device)
            for name, f in forms.items()
        }
        line = ", ".join(f"{n} {peak[n]:.2f}" for n in FORMS)
        ours, block = (peak[name] / peak["official"] for name in ("ours", "block-diag"))
        print(f"    peak MiB: {line}; / official: ours {ours:.3f}, block-diag {block:.3f}")
    for name in FORMS if args.saved else ():
        for shape, dtype, nbytes, _ in sorted(saved[name], key=lambda s: -s[2]):
            print(f"    {name:10s} {str(shape):20s} {str(dtype)[6:]:8s} {nbytes / 2**10:8.1f} KiB")
    for name in FORMS if args.profile else ():
        with torch.profiler.profile() as prof:
            for _ in range(5):
                fwd_bwd(forms[name], x, mask)
        print(f"  {name}, 5 calls:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
