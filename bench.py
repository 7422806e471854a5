"""
bench.py: what each attention costs as the sequence grows, forward and forward+backward.

    python bench.py                          # CPU: N = 256 .. 8192, every kind (a few minutes)
    python bench.py --device cuda            # GPU: N up to 32768, or until memory runs out
    python bench.py --kinds agf primal --n-min 1024 --n-max 4096 --repeats 5
    python bench.py --device cuda --dtypes float32 bfloat16 --compile   # autocast, torch.compile

For every kind and N (doubling) it measures, at the LRA width (D = 64, H = 2, d = 32):
    fwd_ms     median forward time over --repeats runs, after --warmup runs
    fwdbwd_ms  median forward + backward time (CUDA: from CUDA events, after warm-up)
    mem_mb     CUDA: peak memory allocated during forward + backward, minus what was already
               allocated (torch.cuda.max_memory_allocated);
               CPU: total size of the tensors autograd saves for backward (each storage counted
               once). That is the memory a training step must keep between forward and backward,
               the part that grows with N; the CPU allocator has no exact peak counter.
Then it fits the log-log slope of time and memory against N over [--fit-min, --n-max]:
1 means linear in N, 2 quadratic. Results go to a CSV (and a PNG when matplotlib is installed).

Kinds: softmax (the baseline in model.py), agf, primal, gfsa (two attention passes, Ā(ĀV)),
gfsa-official (the official code's order: Ā@Ā materialised, O(N³) per head; only up to
--official-max-n), gfsa-linear (GFSA on a kernelised linear attention, O(N d²)).

Depends on: torch, numpy, model.py and the mechanism files
"""

import argparse
import math
import pathlib
import statistics
import sys
import time

import numpy as np
import torch

from model import build_attention

# name -> (model.py attention kind, constructor keyword arguments)
KINDS = {
    "softmax": ("softmax", {}),
    "agf": ("agf", {}),
    "primal": ("primal", {"max_len": 65536}),
    "gfsa": ("gfsa", {}),
    "gfsa-official": ("gfsa", {"evaluation": "official"}),
    "gfsa-linear": ("gfsa", {"kernel": "linear"}),
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def saved_bytes(layer: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor) -> int:
    """Bytes autograd keeps for backward in one forward pass (each storage counted once)."""
    seen = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, aux = layer(x, mask)
    del y, aux
    return sum(seen.values())


def timed(fn, device: torch.device, repeats: int, warmup: int) -> float:
    """Median time of fn() in ms, after `warmup` untimed calls. On CUDA from CUDA events, which
    time the GPU's own work; on the CPU from the wall clock."""
    times = []
    for i in range(warmup + repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def measure(layer, B: int, N: int, D: int, device, repeats: int, warmup: int, dtype) -> dict:
    """Median forward and forward+backward time (ms) and memory (MB) of one layer at length N.
    dtype bfloat16 / float16: the layer runs under torch.autocast, as in training."""
    x = torch.randn(B, N, D, device=device, requires_grad=True)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)

    def fwd():
        with torch.no_grad(), autocast:
            layer(x, mask)

    def fwd_bwd():
        with autocast:
            y, aux = layer(x, mask)
        (y.float().square().mean() + aux).backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    out = {"fwd_ms": timed(fwd, device, repeats, warmup)}
    out["fwdbwd_ms"] = timed(fwd_bwd, device, repeats, warmup)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fwd_bwd()
        _sync(device)
        out["mem_mb"] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    else:
        with autocast:
            out["mem_mb"] = saved_bytes(layer, x, mask) / 2**20
    return out


def slope(ns: list, values: list) -> float:
    """Least-squares slope of log(value) against log(N): 1 = linear, 2 = quadratic."""
    if len(ns) < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def run(args) -> list:
    """Measure every (kind, N); returns one dict per row."""
    device = torch.device(
        args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    torch.manual_seed(0)
    rows = []
    ns = [args.n_min * 2**i for i in range(int(math.log2(args.n_max // args.n_min)) + 1)]
    for kind, dtype_name in [(k, t) for k in args.kinds for t in args.dtypes]:
        mechanism, kwargs = KINDS[kind]
        layer = build_attention(mechanism, args.d_model, args.n_heads, **kwargs).to(device)
        if args.compile:
            layer = torch.compile(layer, fullgraph=True)  # fullgraph: a graph break is an error
        dtype = getattr(torch, dtype_name)
        for N in ns:
            if kind == "gfsa-official" and N > args.official_max_n:
                continue
            row = {"kind": kind, "dtype": dtype_name, "compiled": args.compile, "N": N}
            row.update(B=args.batch, D=args.d_model, device=str(device))
            try:
                row.update(measure(layer, args.batch, N, args.d_model, device, args.repeats,
                                   args.warmup, dtype))  # fmt: skip
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"{kind:14s} N={N:6d}  out of memory: larger N skipped", flush=True)
                break
            except Exception as e:  # noqa: BLE001 (torch.compile's errors have many types)
                if not args.compile:
                    raise
                print(f"{kind:14s} does not compile without graph breaks: {str(e).splitlines()[0]}")
                break
            rows.append(row)
            print(
                f"{kind:14s} {dtype_name:8s} N={N:6d}  fwd {row['fwd_ms']:9.1f} ms  fwd+bwd "
                f"{row['fwdbwd_ms']:9.1f} ms  mem {row['mem_mb']:9.1f} MB",
                flush=True,
            )
            if row["fwdbwd_ms"] > args.max_seconds * 1e3:
                print(f"{kind:14s} one step took over {args.max_seconds} s: larger N skipped")
                break
    return rows


def report(rows: list, args) -> list:
    """Print the slopes and the two GFSA ratios the README quotes; return the summary lines."""
    lines = [f"log-log slope over N >= {args.fit_min} (1 = linear, 2 = quadratic):"]
    for kind, dtype in dict.fromkeys((r["kind"], r["dtype"]) for r in rows):
        fit = [
            r for r in rows if (r["kind"], r["dtype"]) == (kind, dtype) and r["N"] >= args.fit_min
        ]
        ns = [r["N"] for r in fit]
        name = kind if len(args.dtypes) == 1 else f"{kind} {dtype}"
        lines.append(
            f"  {name:17s} time {slope(ns, [r['fwdbwd_ms'] for r in fit]):5.2f}   "
            f"memory {slope(ns, [r['mem_mb'] for r in fit]):5.2f}   "
            f"(N = {min(ns, default=0)}..{max(ns, default=0)})"
        )
    at = {(r["kind"], r["N"]): r["fwdbwd_ms"] for r in rows if r["dtype"] == args.dtypes[0]}
    for a, b, n in (("gfsa", "softmax", 1024), ("gfsa-official", "gfsa", 2048)):
        if (a, n) in at and (b, n) in at:
            lines.append(f"  fwd+bwd time {a} / {b} at N={n}: {at[(a, n)] / at[(b, n)]:.2f}x")
    print("\n".join(lines))
    return lines


def save(rows: list, path: pathlib.Path) -> None:
    """CSV of every row, and a PNG of time and memory against N when matplotlib is installed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = list(rows[0])
    path.write_text(
        "\n".join([",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in rows]) + "\n"
    )
    print(f"wrote {path}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib for one)")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind in dict.fromkeys((r["kind"], r["dtype"]) for r in rows):
        sub = [r for r in rows if (r["kind"], r["dtype"]) == kind]
        for ax, key in zip(axes, ("fwdbwd_ms", "mem_mb"), strict=True):
            ax.loglog([r["N"] for r in sub], [r[key] for r in sub], "o-", label=" ".join(kind))
            ax.set_xlabel("N")
            ax.set_ylabel(key)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    print(f"wrote {path.with_suffix('.png')}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--kinds",
        nargs="+",
        default=list(KINDS),
        choices=list(KINDS),
        help="attention kinds to measure (default: all)",
    )
    p.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16", "float16"],
        help="precisions to measure; bfloat16 and float16 run under autocast (default: float32)",
    )
    p.add_argument(
        "--compile",
        action="store_true",
        help="measure torch.compile(layer, fullgraph=True); a kind with graph breaks is reported",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1 or auto (default: cpu)")
    p.add_argument("--n-min", type=int, default=256, help="smallest N (default: 256)")
    p.add_argument(
        "--n-max",
        type=int,
        default=None,
        help="largest N, doubling from --n-min (default: 8192 on CPU, 32768 on CUDA)",
    )
    p.add_argument(
        "--fit-min",
        type=int,
        default=1024,
        help="smallest N used for the slope fit (default: 1024)",
    )
    p.add_argument("--batch", type=int, default=2, help="batch size B (default: 2)")
    p.add_argument("--d-model", type=int, default=64, help="model width D (default: 64, LRA)")
    p.add_argument("--n-heads", type=int, default=2, help="heads H (default: 2, LRA)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per point (default: 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    p.add_argument(
        "--official-max-n",
        type=int,
        default=2048,
        help="largest N for gfsa-official, which costs O(N³) (default: 2048)",
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=30.0,
        help="stop growing N for a kind once one fwd+bwd takes longer (default: 30)",
    )
    p.add_argument("--threads", type=int, default=0, help="CPU threads (default: torch's)")
    p.add_argument("--csv", default=None, help="output CSV (default: runs/bench/bench_<dev>.csv)")
    args = p.parse_args(argv)
    if args.n_max is None:
        args.n_max = 32768 if args.device.startswith("cuda") else 8192
    if args.n_min <= 0 or args.n_max < args.n_min:
        p.error("need 0 < --n-min <= --n-max")
    return args


def main(argv=None) -> list:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, "
        f"B={args.batch} D={args.d_model} H={args.n_heads}",
        flush=True,
    )
    rows = run(args)
    if not rows:
        sys.exit("nothing was measured")
    lines = report(rows, args)
    save(rows, pathlib.Path(args.csv or f"runs/bench/bench_{args.device.replace(':', '')}.csv"))
    return lines


if __name__ == "__main__":
    main()
