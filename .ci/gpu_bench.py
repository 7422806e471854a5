"""
.ci/gpu_bench.py: bench.py with what the GPU performance checks add (.ci/gpu runs it).

    python .ci/gpu_bench.py --device cuda --what step layer --kinds softmax agf primal
    python .ci/gpu_bench.py --kinds softmax agf --ns 1024 --dtypes float32 bfloat16   # ops
    python .ci/gpu_bench.py --what floor --kinds agf primal --ns 16384 --bandwidth-gbs 4800

Every flag of bench.py, and:
  --cuda-graphs (default on CUDA with --compile) adds rows with mode = graphs:
      torch.compile(mode="reduce-overhead"), which records the compiled kernels into CUDA graphs
      and replays them with one launch (shapes are fixed, as in training). No mem_mib on CUDA:
      the graphs' memory pool is allocated once, when they are recorded. A row whose graphs
      inductor did not record says so in its note (TORCH_LOGS=cudagraphs prints why).
  ops (eager rows): the aten operators one forward + backward (a step: one whole step)
      dispatches, views left out. On a GPU each is at least one kernel launch, so at small N,
      where every kernel is short, time ~ ops x the cost of one launch.
  floor_mib, floor_ms (eager layer rows): the memory traffic of forward + backward if every
      tensor the layer saves for backward were written once and read once, plus x, y, dy, dx
      (weights left out); floor_ms = that / --bandwidth-gbs (default from the GPU's name: H100
      3350, H200 4800 GB/s), the time below which no implementation keeping those tensors goes.
  --what floor prints those saved tensors, one line each (one forward pass, no timing).
  A compiled row that breaks the graph names the place in the code that broke it.
The report adds, beside bench.py's slopes, eager against compiled and graphs at each point, and
at each N how many times as fast as softmax attention each kind is, both at their fastest mode
and dtype (softmax in bf16, flash attention, where measured), with a layer's time over its floor.
"""

import argparse
import itertools
import math
import pathlib
import re
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import bench  # noqa: E402

COLUMNS = (*bench.COLUMNS[:-2], "ops", "floor_mib", "floor_ms", *bench.COLUMNS[-2:])
BANDWIDTH_GBS = {"H100": 3350, "H200": 4800}  # HBM bandwidth of the SXM parts, GB/s
MIB = bench.MIB


class _CountOps(TorchDispatchMode):
    """Counts the aten operators dispatched while active, views left out (they launch nothing)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn) -> int:
    """How many aten operators fn() dispatches, forward and backward, views left out."""
    with _CountOps() as counter:
        fn()
    return counter.count


def traffic_floor(layer, x: torch.Tensor, mask: torch.Tensor, dtype) -> tuple[int, list]:
    """Bytes that forward + backward must move if each tensor saved for backward is written
    once (forward) and read once (backward): x read, y written, dy read, dx written, each the
    size of x; the weights (D x D, a few KB) are left out. Returns (bytes, saved tensors)."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    with torch.autocast(x.device.type, dtype, enabled=dtype != torch.float32):
        saved = bench.saved_tensors(lambda: layer(x, mask))
    saved = [s for s in saved if s[3].data_ptr() not in params]
    x_ptr = x.untyped_storage().data_ptr()
    written = sum(s[2] for s in saved if s[3].data_ptr() != x_ptr)  # x exists: not written
    read = sum(s[2] for s in saved)
    return written + read + 4 * x.numel() * x.element_size(), saved


def floor(layer, row: dict, dtype, bandwidth, show: bool = False) -> None:
    """Adds floor_mib (and floor_ms when the bandwidth is known) to a layer row; show: also
    print the saved tensors behind it."""
    device = next(layer.parameters()).device
    x = torch.randn(row["B"], row["N"], row["D"], device=device, requires_grad=True)
    mask = torch.ones(row["B"], row["N"], dtype=torch.bool, device=device)
    nbytes, saved = traffic_floor(layer, x, mask, dtype)
    row["floor_mib"] = nbytes / MIB
    if bandwidth:
        row["floor_ms"] = nbytes / (bandwidth * 1e9) * 1e3
    if not show:
        return
    print(f"{row['kind']} {row['dtype']}, B={row['B']} N={row['N']} D={row['D']}: saved for "
          "backward (written in forward, read in backward):")  # fmt: skip
    small = [s for s in saved if s[2] < nbytes / 200]  # each under 0.5 % of the total
    for shape, t, n, _ in sorted((s for s in saved if s not in small), key=lambda s: -s[2]):
        print(f"    {str(shape):22s} {str(t).removeprefix('torch.'):9s} {n / MIB:9.2f} MiB")
    if small:
        print(f"    {len(small)} smaller tensors: {sum(s[2] for s in small) / MIB:.2f} MiB")
    x_mib = x.numel() * x.element_size() / MIB
    print(f"  + x, y, dy, dx: 4 x {x_mib:.2f} MiB;  total {row['floor_mib']:.1f} MiB"
          + (f" = {row['floor_ms']:.4f} ms at {bandwidth} GB/s" if bandwidth else ""))  # fmt: skip


def compile_for(fn, mode: str):
    """bench.compile_for, and mode "graphs": compiled into CUDA graphs, which must be told where
    each step begins."""
    if mode != "graphs":
        return bench.compile_for(fn, mode)
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, mode="reduce-overhead")

    def step_begins(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return step_begins


def cudagraph_skips() -> int:
    """How many graphs inductor has run without CUDA graphs since the counters were cleared."""
    return torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)


def graph_break(e: Exception) -> str:
    """One line from a torch.compile error: its first line and, if given, where in our code."""
    text = str(e)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    where = re.findall(r'File "([^"]+)", line (\d+)', text.split("from user code:")[-1])
    return first + (f" (at {pathlib.Path(where[-1][0]).name}:{where[-1][1]})" if where else "")


def measure_row(row: dict, layer, args) -> None:
    """bench.measure_row, plus the graphs mode, the operators of eager rows, the floor of eager
    layer rows and where a graph broke."""
    torch._dynamo.utils.counters.clear()
    try:
        bench.measure_row(row, layer, args, compile_for)
    except torch._dynamo.exc.Unsupported as e:  # fullgraph: a graph break
        raise RuntimeError(f"graph break: {graph_break(e)}") from e
    device, dtype = torch.device(args.device), getattr(torch, row["dtype"])
    if row["mode"] == "graphs" and device.type == "cuda":
        del row["mem_mib"]  # the pool of the graphs is allocated when they are recorded
    if row["mode"] == "graphs" and cudagraph_skips():
        row["note"] = f"{cudagraph_skips()} graphs run without CUDA graphs (TORCH_LOGS=cudagraphs)"
    if row["mode"] == "eager":
        size = dict(B=row["B"], N=row["N"], device=device, dtype=dtype)
        if row["what"] == "step":
            row["ops"] = dispatched_ops(bench.step_calls(row["kind"], **size)[0])
        else:
            row["ops"] = dispatched_ops(bench.layer_calls(layer, layer, D=row["D"], **size)[1])
            floor(layer, row, dtype, args.bandwidth_gbs)


def floors(args, rows: bench.Rows) -> None:
    """--what floor: the floor of each kind, dtype and N, its saved tensors printed."""
    for dtype, N, kind in itertools.product(args.dtypes, args.ns, args.kinds):
        if kind not in bench.KINDS or (kind == "gfsa-official" and N > bench.OFFICIAL_MAX_N):
            continue
        torch.manual_seed(0)
        mechanism, kwargs = bench.KINDS[kind]
        layer = bench.build_attention(mechanism, **bench.LAYER, **kwargs).to(args.device)
        D, H = bench.LAYER["d_model"], bench.LAYER["n_heads"]
        row = dict(what="floor", kind=kind, N=N, dtype=dtype, mode="eager", B=args.batch, D=D,
                   H=H, device=args.device)  # fmt: skip
        floor(layer, row, getattr(torch, dtype), args.bandwidth_gbs, show=True)
        rows.add(row)


def side_by_side(rows: list) -> list:
    """One line per point measured eager and compiled: the time of each mode (step or fwd+bwd)
    and how many times as fast as eager the fastest compiled one is."""
    ms = {}
    for r in rows:
        ms[r["what"], r["kind"], r["dtype"], r["N"], r["mode"]] = r.get(
            "step_ms", r.get("fwdbwd_ms")
        )
    lines = []
    for (what, kind, dtype, N, mode), eager in ms.items():
        others = {m: ms.get((what, kind, dtype, N, m)) for m in ("compiled", "graphs")}
        others = {m: t for m, t in others.items() if t}
        if mode == "eager" and eager and others:
            times = "  ".join(f"{m} {t:8.2f} ms" for m, t in others.items())
            head = f"  {what:5s} {kind:13s} {dtype:8s} N={N:6d}"
            lines.append(
                f"{head}  eager {eager:8.2f} ms  {times}  "
                f"(compiled is {eager / min(others.values()):.2f}x as fast)"
            )
    return ["eager against torch.compile (step, or layer fwd+bwd):", *lines] if lines else []


def fastest(rows: list, what: str, kind: str, N: int, dtype=None):
    """The fastest row of a kind at N, over modes and (unless dtype is given) dtypes, or None."""
    col = "step_ms" if what == "step" else "fwdbwd_ms"
    rows = [r for r in rows if (r["what"], r["kind"], r["N"]) == (what, kind, N) and col in r]
    return min((r for r in rows if dtype in (None, r["dtype"])), key=lambda r: r[col], default=None)


def against_softmax(rows: list) -> list:
    """At each N, how many times as fast as softmax attention each kind is, both at their
    fastest (mode and dtype; softmax in bf16, flash attention, where measured): a step's time
    ratio is its tokens/s ratio. Layers: also that fastest time over the memory-traffic floor."""
    lines = []
    for what in ("step", "layer"):
        col = "step_ms" if what == "step" else "fwdbwd_ms"
        mine = [r for r in rows if r["what"] == what and col in r]
        for N in dict.fromkeys(r["N"] for r in mine):
            base = fastest(mine, what, "softmax", N, "bfloat16")
            base = base or fastest(mine, what, "softmax", N)
            parts = []
            for kind in dict.fromkeys(r["kind"] for r in mine if r["kind"] != "softmax"):
                best = fastest(mine, what, kind, N)
                if base is None or best is None:
                    continue
                same = (kind, N, best["dtype"])  # the floor: from the eager row of that dtype
                floor_ms = [r["floor_ms"] for r in mine if (r["kind"], r["N"], r["dtype"]) == same
                            and "floor_ms" in r]  # fmt: skip
                floor = f", {best[col] / floor_ms[0]:.0f}x its floor" if floor_ms else ""
                parts.append(
                    f"{kind} {base[col] / best[col]:.2f}x ({best['mode']} {best['dtype']}{floor})"
                )
            if parts:
                head = f"  {what:5s} N={N:6d} (softmax {base['mode']} {base['dtype']})"
                lines.append(f"{head}: " + ", ".join(parts))
    return ["as fast as softmax attention, each at its fastest:", *lines] if lines else []


def parse_args(argv=None) -> argparse.Namespace:
    """bench.py's command line, plus --what floor, --cuda-graphs and --bandwidth-gbs."""
    p = bench.build_parser(whats=("layer", "step", "floor"))
    p.description = __doc__
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="also measure mode graphs (default: on CUDA with --compile)")  # fmt: skip
    p.add_argument("--bandwidth-gbs", type=float, default=None,
                   help="memory bandwidth for floor_ms (default: from the GPU's name)")  # fmt: skip
    args = bench.parse_args(argv, p)
    if args.bandwidth_gbs is not None and not (0 < args.bandwidth_gbs < math.inf):
        p.error(f"--bandwidth-gbs must be a finite number above 0, got {args.bandwidth_gbs}")
    if args.cuda_graphs is None:
        args.cuda_graphs = args.compile and args.device == "cuda"
    if args.cuda_graphs:
        args.modes.append("graphs")
    return args


def main(argv=None) -> list:
    """Measure, write the CSV (and the PNG), print the report; returns the report's lines."""
    args = parse_args(argv)
    if args.bandwidth_gbs is None and args.device == "cuda":
        name = torch.cuda.get_device_name()
        args.bandwidth_gbs = next((v for k, v in BANDWIDTH_GBS.items() if k in name), None)
    print(f"torch {torch.__version__}, {' and '.join(args.modes)}", flush=True)
    path = pathlib.Path(args.csv)  # bench.parse_args: the default never replaces a CSV
    rows = bench.Rows(path, COLUMNS)
    if "floor" in args.what:
        floors(args, rows)
    args.what = [w for w in args.what if w != "floor"]
    bench.run(args, rows, measure_row)
    if not rows.rows:
        sys.exit("nothing was measured")
    print(f"wrote {path}")
    lines = side_by_side(rows.rows) + against_softmax(rows.rows)
    lines += bench.slopes(rows.rows, args.fit_min)
    print("\n".join(lines))
    bench.plot(rows.rows, path)
    return lines


if __name__ == "__main__":
    main()
