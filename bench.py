"""
bench.py: what each attention costs as the sequence grows, one layer and one training step.

    python bench.py                           # CPU: one layer, N = 256 .. 8192, every kind
    python bench.py --kinds agf primal --n-min 1024 --n-max 4096 --repeats 5
    python bench.py --what step               # CPU: training steps of the LRA model, N = 1K, 4K
    python bench.py --device cuda --what layer step --dtypes float32 bfloat16
                                              # GPU: eager and torch.compile side by side
    python bench.py --what floor --kinds agf primal --n-min 16384 --n-max 16384
                                              # the memory-traffic floor, tensor by tensor

--what layer (default): one attention layer (B = --batch, D = 64, H = 2, d = 32: the LRA width)
at N = --n-min, doubling, up to --n-max (or at the N of --ns):
    fwd_ms     median forward time over --repeats runs, after --warmup runs
    fwdbwd_ms  median forward + backward time (CUDA: from CUDA events)
    mem_mib    CUDA: peak memory allocated during forward + backward above what was allocated
               before (torch.cuda.max_memory_allocated), in MiB (2^20 bytes); not for mode
               graphs, whose memory pool is allocated once, when the graph is recorded;
               CPU: total size of the tensors autograd saves for backward (each storage once),
               the part of a training step's memory that grows with N, in MiB
    ops        eager rows: the aten operators one forward + backward dispatches (views, which
               launch nothing, left out): on a GPU each is at least one kernel launch, so at small
               N, where every kernel is short, time ~ ops x the cost of one launch
    floor_mib, floor_ms  the memory traffic of forward + backward if every tensor the layer saves
               for backward were written once and read once, plus x and y, dy and dx (weights
               left out); floor_ms = that / --bandwidth-gbs, the time below which no
               implementation that keeps these tensors can go
Then, at each N, how many times as fast as softmax attention each kind is, both at their fastest
mode and dtype (softmax in bf16, flash attention, where measured), and a layer's fastest time
over its floor; and the log-log slope of time and memory against N over [--fit-min, --n-max]:
1 means linear in N, 2 quadratic.
--what step: one training step of model.py's Classifier at the LRA Text size (D = 64, H = 2,
2 layers, d_ff = 128), batch --step-batch, for each N of --step-ns: forward, loss, backward and
an AdamW step (fused on CUDA, as the training scripts); step_ms, tokens_per_s (batch x N / step
time), mem_mib (CUDA: the step's peak above the model and optimizer state; CPU: saved for
backward) and ops (eager: the operators one whole step dispatches, optimizer included).
--what floor: prints the tensors behind floor_mib, one line each (one forward pass, no timing).

--compile (default on CUDA, off on the CPU) adds rows with mode = compiled beside the eager
ones: torch.compile(fullgraph=True, dynamic=False), compiled afresh for every point (compile_s:
the first call, which compiles); a graph break is reported with its place in the code (a row
with a note), and that kind's other compiled rows are skipped.
--cuda-graphs (default on CUDA with --compile) adds rows with mode = graphs:
torch.compile(mode="reduce-overhead"), which also records the compiled kernels into CUDA graphs
and replays them with one launch (shapes are fixed here, as in training); a row whose graphs
inductor did not record says so in its note (TORCH_LOGS=cudagraphs prints why).
--dtypes bfloat16 / float16 run under torch.autocast, as in training.
Output: a CSV with one row per (what, kind, N, dtype, mode), written as each row is measured.

Kinds: softmax (the baseline in model.py), agf, primal, gfsa (two attention passes, Ā(ĀV)),
gfsa-official (the official code's order: Ā@Ā materialised, O(N³) per head; layer only, up to
--official-max-n), gfsa-linear (GFSA on a kernelised linear attention, O(N d²)), and, for
--what step, primal+trans (softmax layers, Primal-Attention in the last one).

Depends on: torch, numpy, model.py and the mechanism files
"""

import argparse
import csv
import itertools
import math
import pathlib
import re
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from model import Classifier, ModelConfig, build_attention

# name -> (model.py attention kind, constructor keyword arguments)
KINDS = {
    "softmax": ("softmax", {}),
    "agf": ("agf", {}),
    "primal": ("primal", {"max_len": 65536}),
    "gfsa": ("gfsa", {}),
    "gfsa-official": ("gfsa", {"evaluation": "official"}),
    "gfsa-linear": ("gfsa", {"kernel": "linear"}),
}
STEP_KINDS = ("softmax", "agf", "primal", "primal+trans", "gfsa")  # the five trained on LRA
# --what step: the LRA Text model of train_lra.py (bytes + 1 as tokens, 0 = padding; 2 classes)
STEP_MODEL = dict(
    n_classes=2, vocab_size=257, style="lra", d_model=64, n_heads=2, n_layers=2, d_ff=128
)
WHATS = ("layer", "step", "floor")
COLUMNS = "what kind N dtype mode B D H device fwd_ms fwdbwd_ms step_ms tokens_per_s mem_mib"
COLUMNS = (*COLUMNS.split(), "ops", "floor_mib", "floor_ms", "compile_s", "note")  # of the CSV
BANDWIDTH_GBS = {"H100": 3350, "H200": 4800}  # HBM bandwidth of the SXM parts, GB/s
MIB = 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def saved_tensors(fn) -> list:
    """(shape, dtype, bytes, storage) of every tensor autograd saves for backward while fn()
    runs a forward pass; each storage once (a view of a saved tensor costs nothing more)."""
    seen = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen.setdefault(storage.data_ptr(), (tuple(t.shape), t.dtype, storage.nbytes(), storage))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return list(seen.values())


class _CountOps(TorchDispatchMode):
    """Counts the aten operators dispatched while active, views left out (they launch nothing)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def dispatched_ops(fn) -> int:
    """How many aten operators fn() dispatches, forward and backward, views left out: in eager
    mode on a GPU each is at least one kernel launch."""
    with _CountOps() as counter:
        fn()
    return counter.count


def traffic_floor(layer, x: torch.Tensor, mask: torch.Tensor, dtype) -> tuple[int, list]:
    """Bytes that forward + backward must move if each tensor saved for backward is written
    once (forward) and read once (backward): x read, y written, dy read, dx written, each the
    size of x; the weights (D x D, a few KB) are left out. Returns (bytes, saved tensors)."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    with torch.autocast(x.device.type, dtype, enabled=dtype != torch.float32):
        saved = saved_tensors(lambda: layer(x, mask))
    saved = [s for s in saved if s[3].data_ptr() not in params]
    x_ptr = x.untyped_storage().data_ptr()
    written = sum(s[2] for s in saved if s[3].data_ptr() != x_ptr)  # x exists: not written
    read = sum(s[2] for s in saved)
    return written + read + 4 * x.numel() * x.element_size(), saved


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


def first_call_s(fn, device: torch.device) -> float:
    """Wall time of one call of fn() in seconds: for a compiled fn, its compile time."""
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def peak_mib(fn, saved_fn, device: torch.device) -> float:
    """CUDA: peak memory of fn() above what was allocated before. CPU: what saved_fn() saves."""
    if device.type != "cuda":
        return sum(s[2] for s in saved_tensors(saved_fn)) / MIB
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / MIB


def measure(
    layer,
    *,
    B: int,
    N: int,
    D: int,
    device,
    dtype=torch.float32,
    repeats: int = 5,
    warmup: int = 2,
    forward=None,
    graphs: bool = False,
) -> dict:
    """Forward and forward + backward time (ms, median) and memory (MiB) of one layer, called
    as forward(x, mask) -> (y, aux) with x (B, N, D) (forward: the layer, or its compiled form;
    graphs: compiled into CUDA graphs, which need to be told where each step begins).
    dtype bfloat16 / float16: under torch.autocast, as in training."""
    forward = layer if forward is None else forward
    begin = torch.compiler.cudagraph_mark_step_begin if graphs else lambda: None
    x = torch.randn(B, N, D, device=device, requires_grad=True)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)

    def fwd():
        begin()
        with torch.no_grad(), autocast:
            forward(x, mask)

    def fwd_bwd():
        begin()
        with autocast:
            y, aux = forward(x, mask)
        (y.float().square().mean() + aux).backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    def fwd_only():
        begin()
        with autocast:
            forward(x, mask)

    out = {}
    if forward is not layer:  # compiled: the first calls compile (forward, then backward)
        out["compile_s"] = first_call_s(lambda: (fwd(), fwd_bwd()), device)
    else:
        out["ops"] = dispatched_ops(fwd_bwd)
    out["fwd_ms"] = timed(fwd, device, repeats, warmup)
    out["fwdbwd_ms"] = timed(fwd_bwd, device, repeats, warmup)
    if not (graphs and device.type == "cuda"):  # CUDA graphs allocate their pool when recorded
        out["mem_mib"] = peak_mib(fwd_bwd, fwd_only, device)
    return out


def _forward_unchecked(model: Classifier):
    """Classifier.forward without its input checks, whose data-dependent branches torch.compile
    cannot trace in one graph (fullgraph): what a step runs on a batch checked beforehand."""

    def forward(x, mask):
        h, aux, _ = model.encode(x, mask)
        return model.head(model.pool(h, mask)), aux

    return forward


def measure_step(
    kind: str,
    *,
    B: int,
    N: int,
    device,
    dtype=torch.float32,
    mode: str = "eager",
    repeats: int = 5,
    warmup: int = 2,
) -> dict:
    """Time (ms, median), tokens per second and memory (MiB) of one training step of the LRA
    Text model: forward, cross-entropy + auxiliary loss, backward, AdamW step (fused on CUDA).
    mode: "eager", "compiled" (torch.compile) or "graphs" (compiled into CUDA graphs)."""
    mechanism, kwargs = KINDS.get(kind, (kind, {}))
    extra = {"attention_kwargs": {mechanism: kwargs}} if kwargs else {}
    cfg = ModelConfig(max_len=N, attention=mechanism, **STEP_MODEL, **extra)
    model = Classifier(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    forward = _forward_unchecked(model)
    if mode != "eager":
        forward = compile_fn(forward, mode)
    begin = torch.compiler.cudagraph_mark_step_begin if mode == "graphs" else lambda: None
    x = torch.randint(1, cfg.vocab_size, (B, N), device=device)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    labels = torch.randint(0, cfg.n_classes, (B,), device=device)
    model(x, mask)  # the checks that the step leaves out, once
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)

    def step():
        begin()
        with autocast:
            logits, aux = forward(x, mask)
        (F.cross_entropy(logits.float(), labels) + aux).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def fwd_only():
        begin()
        with autocast:
            forward(x, mask)

    out = {"compile_s": first_call_s(step, device)} if mode != "eager" else {}
    if mode == "eager":
        out["ops"] = dispatched_ops(step)
    ms = out["step_ms"] = timed(step, device, repeats, warmup)
    out["tokens_per_s"] = B * N / (ms / 1e3)
    if not (mode == "graphs" and device.type == "cuda"):  # the pool is allocated when recorded
        out["mem_mib"] = peak_mib(step, fwd_only, device)
    return out


def compile_fn(fn, mode: str):
    """torch.compile for one graph of fixed shapes; mode "graphs" also records CUDA graphs."""
    options = dict(mode="reduce-overhead") if mode == "graphs" else {}
    return torch.compile(fn, fullgraph=True, dynamic=False, **options)


def cudagraph_skips() -> int:
    """How many graphs inductor has run without CUDA graphs since the counters were cleared."""
    return torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)


def graph_break(e: Exception) -> str:
    """One line from a torch.compile error: its first line and, if given, where in our code."""
    text = str(e)
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(e).__name__)
    where = re.findall(r'File "([^"]+)", line (\d+)', text.split("from user code:")[-1])
    return first + (f" (at {pathlib.Path(where[-1][0]).name}:{where[-1][1]})" if where else "")


def resolve_device(name: str) -> torch.device:
    """--device: "auto" is CUDA when there is a GPU, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def lengths(args) -> list:
    """The layer's N: --ns, or --n-min, doubling, up to --n-max."""
    if args.ns:
        return args.ns
    return [args.n_min * 2**i for i in range(int(math.log2(args.n_max // args.n_min)) + 1)]


class Rows:
    """The CSV, one row written (and flushed) as soon as it is measured: a run cut off by a time
    limit keeps what it measured. Also keeps the rows for the report."""

    def __init__(self, path: pathlib.Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.rows, self.file = path, [], open(path, "w", newline="")  # noqa: SIM115
        self.writer = csv.DictWriter(self.file, COLUMNS, restval="")
        self.writer.writeheader()

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.writer.writerow(
            {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
        )
        self.file.flush()


def measure_row(row: dict, layer, args, device, bandwidth) -> None:
    """Measure one (what, kind, N, dtype, mode) into row; layer: the attention (None for step)."""
    dtype, mode = getattr(torch, row["dtype"]), row["mode"]
    if row["what"] == "floor":
        return floor(layer, row, dtype, bandwidth)
    torch._dynamo.reset()  # a fresh compile per point: no recompile limit, nothing reused
    torch._dynamo.utils.counters.clear()
    size = dict(B=row["B"], N=row["N"], device=device, dtype=dtype)
    timing = dict(repeats=args.repeats, warmup=args.warmup)
    if row["what"] == "step":
        row.update(measure_step(row["kind"], mode=mode, **size, **timing))
    else:
        forward = compile_fn(layer, mode) if mode != "eager" else layer
        graphs = mode == "graphs"
        row.update(measure(layer, D=args.d_model, forward=forward, graphs=graphs, **size, **timing))
    if mode == "graphs" and cudagraph_skips():
        row["note"] = f"{cudagraph_skips()} graphs run without CUDA graphs (TORCH_LOGS=cudagraphs)"
    if mode == "eager" and row["what"] == "layer":
        floor(layer, row, dtype, bandwidth)


def describe(row: dict) -> str:
    """One printed line per row."""
    text = f"{row['what']:5s} {row['kind']:13s} {row['dtype']:8s} {row['mode']:8s} N={row['N']:6d}"
    if "step_ms" in row:
        text += f"  step {row['step_ms']:9.1f} ms  {row['tokens_per_s']:10.0f} tokens/s"
    if "fwdbwd_ms" in row:
        text += f"  fwd {row['fwd_ms']:9.1f} ms  fwd+bwd {row['fwdbwd_ms']:9.1f} ms"
    if "mem_mib" in row:
        text += f"  mem {row['mem_mib']:9.1f} MiB"
    if "ops" in row:
        text += f"  {row['ops']:5d} ops"
    if "floor_ms" in row:
        text += f"  floor {row['floor_ms']:.3f} ms"
    if "compile_s" in row:
        text += f"  (compiled in {row['compile_s']:.1f} s)"
    return text


def run(args, rows: Rows) -> None:
    """Measure every (what, dtype, N, kind, mode) asked for, in that order, N and kinds in the
    order given (so a run cut off by a time limit has every mode side by side at the first N);
    each row goes to rows. A (kind, dtype, mode) skips every N from the one where memory ran
    out or one run took over --max-seconds upwards, and every N once (compiled, graphs) the
    graph breaks."""
    device = resolve_device(args.device)
    bandwidth = args.bandwidth_gbs
    if bandwidth is None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        bandwidth = next((v for k, v in BANDWIDTH_GBS.items() if k in name), None)
    layers = {}  # one layer per kind, the same in every mode
    stop_at = {}  # (what, kind, dtype, mode) -> the smallest N it no longer runs at
    for what in args.what:
        kinds = [k for k in args.kinds if k in (STEP_KINDS if what == "step" else KINDS)]
        ns = args.step_ns if what == "step" else lengths(args)
        for dtype, N, kind, mode in itertools.product(args.dtypes, ns, kinds, modes(args)):
            key = (what, kind, dtype, mode)
            if N >= stop_at.get(key, math.inf) or (what == "floor" and mode != "eager"):
                continue
            if kind == "gfsa-official" and N > args.official_max_n:
                continue
            if what != "step" and kind not in layers:
                torch.manual_seed(0)
                mechanism, kwargs = KINDS[kind]
                layer = build_attention(mechanism, args.d_model, args.n_heads, **kwargs)
                layers[kind] = layer.to(device)
            B = args.step_batch if what == "step" else args.batch
            row = dict(what=what, kind=kind, N=N, dtype=dtype, mode=mode, B=B)
            sizes = (
                STEP_MODEL if what == "step" else dict(d_model=args.d_model, n_heads=args.n_heads)
            )
            row.update(D=sizes["d_model"], H=sizes["n_heads"], device=str(device))
            try:
                measure_row(row, layers.get(kind), args, device, bandwidth)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                print(f"{describe(row)}  out of memory: larger N skipped", flush=True)
                stop_at[key] = min(N, stop_at.get(key, math.inf))
                continue
            except Exception as e:  # noqa: BLE001 (torch.compile's errors have many types)
                if mode == "eager":
                    raise
                broke = isinstance(e, torch._dynamo.exc.Unsupported)  # fullgraph: a break
                row["note"] = ("graph break: " if broke else "compile failed: ") + graph_break(e)
                stop_at[key] = 0
            rows.add(row)
            if what != "floor":  # floor printed its own lines
                print(describe(row) + (f"  {row['note']}" if row.get("note") else ""), flush=True)
            if row.get("step_ms", row.get("fwdbwd_ms", 0)) > args.max_seconds * 1e3:
                print(f"{' '.join(key)}: one run took over {args.max_seconds} s: larger N skipped")
                stop_at[key] = min(N, stop_at.get(key, math.inf))


def floor(layer, row: dict, dtype, bandwidth) -> None:
    """Adds floor_mib (and floor_ms when the bandwidth is known) to a layer row; --what floor
    also prints the saved tensors behind it."""
    device = next(layer.parameters()).device
    x = torch.randn(row["B"], row["N"], row["D"], device=device, requires_grad=True)
    mask = torch.ones(row["B"], row["N"], dtype=torch.bool, device=device)
    nbytes, saved = traffic_floor(layer, x, mask, dtype)
    row["floor_mib"] = nbytes / MIB
    if bandwidth:
        row["floor_ms"] = nbytes / (bandwidth * 1e9) * 1e3
    if row["what"] == "floor":
        head = f"{row['kind']} {row['dtype']}, B={row['B']} N={row['N']} D={row['D']}"
        print(f"{head}: saved for backward (written in forward, read in backward):")
        small = [s for s in saved if s[2] < nbytes / 200]  # each under 0.5 % of the total
        for shape, t, n, _ in sorted((s for s in saved if s not in small), key=lambda s: -s[2]):
            print(f"    {str(shape):22s} {str(t).removeprefix('torch.'):9s} {n / MIB:9.2f} MiB")
        if small:
            print(f"    {len(small)} smaller tensors: {sum(s[2] for s in small) / MIB:.2f} MiB")
        x_mib = x.numel() * x.element_size() / MIB
        print(
            f"  + x, y, dy, dx: 4 x {x_mib:.2f} MiB;  total {row['floor_mib']:.1f} MiB"
            + (f" = {row['floor_ms']:.4f} ms at {bandwidth} GB/s" if bandwidth else "")
        )


def slope(ns: list, values: list) -> float:
    """Least-squares slope of log(value) against log(N): 1 = linear, 2 = quadratic."""
    if len(ns) < 2:
        return float("nan")
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


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


def report(rows: list, args) -> list:
    """Print eager against compiled, each kind against softmax, the slopes of the layer rows
    and the two GFSA ratios; return the summary lines."""
    lines = side_by_side(rows) + against_softmax(rows)
    layer_rows = [r for r in rows if r["what"] == "layer" and "fwdbwd_ms" in r]
    if not layer_rows:
        print("\n".join(lines))
        return lines
    lines += [f"log-log slope over N >= {args.fit_min} (1 = linear, 2 = quadratic):"]
    for key in dict.fromkeys((r["kind"], r["dtype"], r["mode"]) for r in layer_rows):
        fit = [r for r in layer_rows if (r["kind"], r["dtype"], r["mode"]) == key]
        ns = [r["N"] for r in fit if r["N"] >= args.fit_min]
        name = " ".join(
            k
            for k, many in zip(key, (True, len(args.dtypes) > 1, len(modes(args)) > 1), strict=True)
            if many
        )
        if len(ns) < 2:
            lines.append(
                f"  {name:26s} time and memory: no slope (measured at N >= "
                f"{args.fit_min}: {ns or 'none'})"
            )
            continue
        fit = [r for r in fit if r["N"] >= args.fit_min]
        mem = [r.get("mem_mib") for r in fit]  # none for CUDA graphs
        mem = f"{slope(ns, mem):5.2f}" if None not in mem else "    -"
        lines.append(
            f"  {name:26s} time {slope(ns, [r['fwdbwd_ms'] for r in fit]):5.2f}   "
            f"memory {mem}   (N = {min(ns)}..{max(ns)})"
        )
    at = {
        (r["kind"], r["N"]): r["fwdbwd_ms"]
        for r in layer_rows
        if r["dtype"] == args.dtypes[0] and r["mode"] == "eager"
    }
    for a, b, n in (("gfsa", "softmax", 1024), ("gfsa-official", "gfsa", 2048)):
        if (a, n) in at and (b, n) in at:
            lines.append(f"  fwd+bwd time {a} / {b} at N={n}: {at[(a, n)] / at[(b, n)]:.2f}x")
    print("\n".join(lines))
    return lines


def plot(rows: list, path: pathlib.Path) -> None:
    """A PNG of the layer rows' time and memory against N, when matplotlib is installed."""
    rows = [r for r in rows if r["what"] == "layer" and "fwdbwd_ms" in r]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib for one)")
        return
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key in dict.fromkeys((r["kind"], r["dtype"], r["mode"]) for r in rows):
        sub = [r for r in rows if (r["kind"], r["dtype"], r["mode"]) == key]
        for ax, col in zip(axes, ("fwdbwd_ms", "mem_mib"), strict=True):
            pts = [r for r in sub if col in r]  # graphs rows have no mem_mib
            ax.loglog([r["N"] for r in pts], [r[col] for r in pts], "o-", label=" ".join(key))
            ax.set_xlabel("N")
            ax.set_ylabel(col)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    print(f"wrote {path.with_suffix('.png')}")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = p.add_argument
    add(
        "--what",
        nargs="+",
        default=["layer"],
        choices=WHATS,
        help="layer: one attention layer; step: LRA training steps; floor: the traffic floor",
    )
    add(
        "--kinds",
        nargs="+",
        default=list(dict.fromkeys([*KINDS, *STEP_KINDS])),
        choices=list(dict.fromkeys([*KINDS, *STEP_KINDS])),
        help="attention kinds (default: all; each --what takes the kinds it has)",
    )
    add(
        "--dtypes",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16", "float16"],
        help="precisions; bfloat16 and float16 run under autocast (default: float32)",
    )
    add(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure torch.compile(fullgraph=True) beside eager (default: on CUDA only)",
    )
    add(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure torch.compile(mode='reduce-overhead'), CUDA graphs (default: on "
        "CUDA with --compile; CUDA only)",
    )
    add("--device", default="cpu", help="cpu, cuda, cuda:1 or auto (default: cpu)")
    add("--n-min", type=int, default=256, help="layer: smallest N (default: 256)")
    add(
        "--n-max",
        type=int,
        default=None,
        help="layer: largest N, doubling from --n-min (default: 8192 on CPU, 32768 on CUDA)",
    )
    add("--ns", type=int, nargs="+", default=None, help="layer: these N instead of the doubling")
    add("--fit-min", type=int, default=1024, help="smallest N of the slope fit (default: 1024)")
    add("--batch", type=int, default=2, help="layer: batch size B (default: 2)")
    add(
        "--step-ns",
        type=int,
        nargs="+",
        default=[1024, 4096],
        help="step: sequence lengths (default: 1024 4096)",
    )
    add("--step-batch", type=int, default=32, help="step: batch size (default: 32, LRA)")
    add("--d-model", type=int, default=64, help="layer: width D (default: 64, LRA)")
    add("--n-heads", type=int, default=2, help="layer: heads H (default: 2, LRA)")
    add("--repeats", type=int, default=5, help="timed runs per point (default: 5)")
    add("--warmup", type=int, default=2, help="untimed runs first (default: 2)")
    add(
        "--official-max-n",
        type=int,
        default=2048,
        help="largest N for gfsa-official, which costs O(N³) (default: 2048)",
    )
    add(
        "--max-seconds",
        type=float,
        default=30.0,
        help="stop growing N for a kind once one run takes longer (default: 30)",
    )
    add(
        "--bandwidth-gbs",
        type=float,
        default=None,
        help="memory bandwidth for floor_ms, GB/s (default: H100 3350, H200 4800, else none)",
    )
    add("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    add("--csv", default=None, help="output CSV (default: runs/bench/bench_<device>.csv)")
    args = p.parse_args(argv)
    if args.n_max is None:
        args.n_max = 32768 if args.device.startswith("cuda") else 8192
    at_least = dict(
        repeats=1,
        warmup=0,
        n_heads=1,
        d_model=1,
        batch=1,
        step_batch=1,
        n_min=1,
        official_max_n=1,
        threads=1,
    )
    for name, low in at_least.items():
        value = getattr(args, name)
        if value is not None and value < low:
            p.error(f"--{name.replace('_', '-')} must be at least {low}, got {value}")
    for name in ("step_ns", "ns"):
        if min(getattr(args, name) or [1]) < 1:
            p.error(f"--{name.replace('_', '-')} must all be at least 1, got {getattr(args, name)}")
    for name in ("max_seconds", "bandwidth_gbs"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            p.error(f"--{name.replace('_', '-')} must be a finite number above 0, got {value}")
    if args.d_model % args.n_heads:
        p.error(f"--d-model {args.d_model} is not divisible by --n-heads {args.n_heads}")
    if args.n_max < args.n_min:
        p.error(f"--n-min {args.n_min} is above --n-max {args.n_max}")
    if "layer" in args.what and max(lengths(args)) < args.fit_min:
        name = f"--ns {max(args.ns)}" if args.ns else f"--n-max {args.n_max}"
        p.error(f"{name} is below --fit-min {args.fit_min}: no N to fit a slope to")
    try:
        device = resolve_device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r} is not a device: use cpu, cuda, cuda:1 or auto")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error(f"--device {args.device}: this machine has no CUDA GPU (torch {torch.__version__})")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {args.device}: there are {torch.cuda.device_count()} GPUs")
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device {args.device}: only cpu and cuda are measured")
    if args.compile is None:
        args.compile = device.type == "cuda"
    if args.cuda_graphs and device.type != "cuda":
        p.error(f"--cuda-graphs needs a CUDA device, not --device {args.device}")
    if args.cuda_graphs is None:
        args.cuda_graphs = args.compile and device.type == "cuda"
    return args


def modes(args) -> list:
    """The modes measured at each point: eager, then compiled and graphs as asked."""
    return ["eager"] + ["compiled"] * args.compile + ["graphs"] * args.cuda_graphs


def main(argv=None) -> list:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    measured = " and ".join(modes(args))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, layer B={args.batch} "
        f"D={args.d_model} H={args.n_heads}, step batch {args.step_batch}, {measured}",
        flush=True,
    )
    path = pathlib.Path(args.csv or f"runs/bench/bench_{args.device.replace(':', '')}.csv")
    rows = Rows(path)
    try:
        run(args, rows)
    finally:
        rows.file.close()
    if not rows.rows:
        sys.exit("nothing was measured")
    print(f"wrote {path}")
    lines = report(rows.rows, args)
    plot(rows.rows, path)
    return lines


if __name__ == "__main__":
    main()
