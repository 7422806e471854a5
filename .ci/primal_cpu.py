"""
.ci/primal_cpu.py: PrimalAttention against the official LRA layer's order of operations on the
CPU, interleaved in one process (a shared machine's load then falls on both alike).

    taskset -c 0,1 python .ci/primal_cpu.py --ns 512 1024 2048 4096 8192 --repeats 30
    python .ci/primal_cpu.py --ns 2048 --saved      # the tensors each saves for backward
    python .ci/primal_cpu.py --ns 2048 --profile    # torch.profiler, the costliest operators

One layer as bench.py's: B = 2, D = 64, H = 2, s = 20, m = 200, float32, no padding; forward +
backward of mean(y²) + aux. "official" is written here from the order of operations of the
official PrimalFormer (PrimalAttention_LRA/PrimalFormer/attentions/attention.py, class
Attention; attention_primal_cos.py, PrimalCosAttention; the LRA KSVD loss of model_wrapper.py):
f(X) by an index into the channel-major input, f(X)ᵀW by einsum, e and r by einsum, the mask
multiplied before the output map, λ applied as e @ diag(λ) and the norm squared. It shares our
layer's parameters, and without padding both give the same y and aux (checked first, float64).
Per N: the median fwd+bwd time of each over --repeats rounds (the order alternates every round),
wall clock and the process's CPU time (on a shared machine the steadier of the two), the ratio
ours / official of each, and the bytes each saves for backward (bench.saved_tensors).
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


def same_outputs() -> None:
    """Without padding the two give the same y and aux (float64): else the timing is moot."""
    torch.manual_seed(0)
    layer = PrimalAttention(64, 2, max_len=65536).double()
    x, mask = torch.randn(2, 300, 64, dtype=torch.float64), torch.ones(2, 300, dtype=torch.bool)
    for a, b in zip(layer(x, mask), official(layer, x, mask), strict=True):
        if not torch.allclose(a, b, rtol=1e-10, atol=1e-12):
            sys.exit(f"ours and the official order differ: {(a - b).abs().max().item():.3g}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ns", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    p.add_argument("--repeats", type=int, default=30, help="interleaved rounds per N")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--saved", action="store_true", help="list the tensors saved for backward")
    p.add_argument("--profile", action="store_true", help="torch.profiler's costliest operators")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    same_outputs()
    torch.manual_seed(0)
    layer = PrimalAttention(64, 2, max_len=65536)
    forms = {"ours": layer, "official": lambda x, mask: official(layer, x, mask)}

    def fwd_bwd(form, x, mask):
        y, aux = form(x, mask)
        (y.square().mean() + aux).backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, B=2 D=64 H=2 float32")
    for N in args.ns:
        x = torch.randn(2, N, 64, requires_grad=True)
        mask = torch.ones(2, N, dtype=torch.bool)

        times = {(name, clock): [] for name in forms for clock in ("wall", "cpu")}
        for i in range(args.repeats + 2):  # the first two rounds warm up
            for name in list(forms)[:: 1 if i % 2 else -1]:
                t0, c0 = time.perf_counter(), time.process_time()
                fwd_bwd(forms[name], x, mask)
                times[name, "cpu"].append((time.process_time() - c0) * 1e3)
                times[name, "wall"].append((time.perf_counter() - t0) * 1e3)
        ms = {key: statistics.median(t[2:]) for key, t in times.items()}
        saved = {n: bench.saved_tensors(lambda f=f, a=(x, mask): f(*a)) for n, f in forms.items()}
        mib = {n: sum(s[2] for s in v) / bench.MIB for n, v in saved.items()}
        line = f"N={N:5d}"
        for clock in ("wall", "cpu"):
            ours, theirs = ms["ours", clock], ms["official", clock]
            line += f"  {clock}: ours {ours:7.2f} official {theirs:7.2f} ms ({ours / theirs:.3f})"
        print(f"{line}  saved MiB: ours {mib['ours']:.2f}, official {mib['official']:.2f}")
        for name in forms if args.saved else ():
            for shape, dtype, nbytes, _ in sorted(saved[name], key=lambda s: -s[2]):
                print(
                    f"    {name:8s} {str(shape):20s} {str(dtype)[6:]:8s} {nbytes / 2**10:8.1f} KiB"
                )
        for name in forms if args.profile else ():
            with torch.profiler.profile() as prof:
                for _ in range(5):
                    fwd_bwd(forms[name], x, mask)
            print(f"  {name}, 5 calls:")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main()
