"""
bench.py: what each attention costs as the sequence grows, one layer and one training step.

    python bench.py                           # CPU: one layer, N = 256 .. 8192, every kind
    python bench.py --kinds agf primal --ns 1024 2048 4096
    python bench.py --what step               # CPU: training steps of the LRA model, N = 1K, 4K
    python bench.py --device cuda --what layer step --dtypes float32 bfloat16   # eager + compiled

--what layer: one attention layer (B = --batch, D = 64, H = 2: the LRA width) at each N of --ns:
fwd_ms, fwdbwd_ms (medians of --repeats runs after --warmup), mem_mib (CUDA: the peak of forward
+ backward; CPU: what autograd saves for backward); then the log-log slopes against N >= --fit-min
(1 = linear, 2 = quadratic). --what step: a training step (forward, loss, backward, AdamW) of
model.py's Classifier at the LRA Text size, batch --step-batch, at each N of --step-ns: step_ms,
tokens_per_s, mem_mib. --compile adds compiled rows (torch.compile(fullgraph=True) afresh per
point; compile_s: the first calls); --dtypes bfloat16 / float16 run under torch.autocast. Output:
a CSV row per (what, kind, N, dtype, mode) as it is measured; a PNG of the layer rows
(matplotlib). --help shows each flag's value (--device cuda --help: a GPU's). Ctrl-C keeps the
rows measured.

Kinds: softmax (the baseline), agf, primal, gfsa (Ā(ĀV): two attention passes), gfsa-official
(the official order, Ā@Ā formed: O(N³) per head, run up to N = 2048), gfsa-linear (GFSA on a
linear attention, O(N d²)); for --what step also primal+trans (Primal in the last layer only).

Depends on: torch, numpy, model.py and the mechanism files, runs.py (--help, Ctrl-C)
"""

import argparse
import csv
import functools
import io
import itertools
import math
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import files
import runs
from model import Classifier, ModelConfig, build_attention

# name -> (model.py attention kind, constructor keyword arguments)
KINDS = {"softmax": ("softmax", {}), "agf": ("agf", {}), "primal": ("primal", {"max_len": 65536}),
         "gfsa": ("gfsa", {}), "gfsa-official": ("gfsa", {"evaluation": "official"}),
         "gfsa-linear": ("gfsa", {"kernel": "linear"})}  # fmt: skip
OFFICIAL_MAX_N = 2048  # gfsa-official forms Ā@Ā: O(N³) time and N² memory per head
STEP_KINDS = ("softmax", "agf", "primal", "primal+trans", "gfsa")  # the five trained on LRA
LAYER = dict(d_model=64, n_heads=2)  # D, H of --what layer: the LRA width
# --what step: the LRA Text model of train_lra.py (bytes + 1 as tokens, 0 = padding; 2 classes)
STEP_MODEL = dict(n_classes=2, vocab_size=257, style="lra", n_layers=2, d_ff=128, **LAYER)
ROW_KEY = ("what", "kind", "N", "dtype", "mode", "B", "D", "H", "device")  # what a row measures
COLUMNS = (*ROW_KEY, *"fwd_ms fwdbwd_ms step_ms tokens_per_s mem_mib compile_s note".split())
MIB = 2**20


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


def timed(fn, device: torch.device, repeats: int = 1, warmup: int = 0) -> float:
    """Median wall time of fn() in ms after `warmup` untimed calls. CUDA runs asynchronously:
    the clock stops once the GPU has finished (synchronize), before and after each call."""
    sync = torch.get_device_module(device).synchronize  # torch.cuda's, or the CPU's (a no-op)
    times = []
    for _ in range(warmup + repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[warmup:])


def peak_mib(fn, fwd_only, device: torch.device) -> float:
    """CUDA: peak memory of fn() above what was allocated before. CPU: what fwd_only() saves."""
    if device.type != "cuda":
        return sum(s[2] for s in saved_tensors(fwd_only)) / MIB
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / MIB


def compile_for(fn, mode: str):
    """What a row of `mode` runs: fn itself ("eager"), or fn compiled as one graph of fixed
    shapes ("compiled"; fullgraph: a graph break is an error, not a silent slow path)."""
    return fn if mode == "eager" else torch.compile(fn, fullgraph=True, dynamic=False)


def layer_calls(layer, forward, *, B: int, N: int, D: int, device, dtype) -> tuple:
    """fwd(), fwd_bwd() and fwd_only() of one layer on a random x (B, N, D), no padding:
    forward without autograd; forward + backward of mean(y²) + aux; forward keeping what backward
    needs. forward: the layer or its compiled form, called as forward(x, mask) -> (y, aux)."""
    x = torch.randn(B, N, D, device=device, requires_grad=True)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)

    def fwd(grad: bool = False):
        with torch.set_grad_enabled(grad), autocast:
            return forward(x, mask)

    def fwd_bwd():
        y, aux = fwd(grad=True)
        (y.float().square().mean() + aux).backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return fwd, fwd_bwd, lambda: fwd(grad=True)


def step_calls(kind: str, *, B: int, N: int, device, dtype, forward_for=lambda f: f) -> tuple:
    """step() and fwd_only() of the LRA Text model on one random batch (B, N): step is forward,
    cross-entropy + aux loss, backward and an AdamW step (fused on CUDA, as in train_lra.py).
    forward_for: what the step runs for the model's forward (compiled, say)."""
    mechanism, kwargs = KINDS.get(kind, (kind, {}))
    extra = {"attention_kwargs": {mechanism: kwargs}} if kwargs else {}
    cfg = ModelConfig(max_len=N, attention=mechanism, **STEP_MODEL, **extra)
    model = Classifier(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    x = torch.randint(1, cfg.vocab_size, (B, N), device=device)
    mask = torch.ones(B, N, dtype=torch.bool, device=device)
    labels = torch.randint(0, cfg.n_classes, (B,), device=device)
    model(x, mask)  # Classifier.forward checks its input, once; the step leaves the checks out:

    def unchecked(x, mask):  # torch.compile cannot trace their data-dependent branches
        h, aux, _ = model.encode(x, mask)
        return model.head(model.pool(h, mask)), aux

    forward = forward_for(unchecked)
    autocast = torch.autocast(device.type, dtype, enabled=dtype != torch.float32)

    def fwd():
        with autocast:
            return forward(x, mask)

    def step():
        logits, aux = fwd()
        (F.cross_entropy(logits.float(), labels) + aux).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step, fwd


def measure_row(row: dict, layer, args, compile_for=compile_for) -> None:
    """Measure one (what, kind, N, dtype, mode) into row; layer: the attention (None for step)."""
    torch._dynamo.reset()  # a fresh compile per point: no recompile limit, nothing reused
    mode, device = row["mode"], torch.device(args.device)
    size = dict(B=row["B"], N=row["N"], device=device, dtype=getattr(torch, row["dtype"]))
    if row["what"] == "step":
        call, fwd_only = step_calls(row["kind"], forward_for=lambda f: compile_for(f, mode), **size)
        timings = {"step_ms": call}
    else:
        fwd, call, fwd_only = layer_calls(layer, compile_for(layer, mode), D=row["D"], **size)
        timings = {"fwd_ms": fwd, "fwdbwd_ms": call}
    if mode != "eager":  # the first calls compile
        row["compile_s"] = timed(lambda: [fn() for fn in timings.values()], device) / 1e3
    row.update({k: timed(fn, device, args.repeats, args.warmup) for k, fn in timings.items()})
    if "step_ms" in row:
        row["tokens_per_s"] = row["B"] * row["N"] / (row["step_ms"] / 1e3)
    row["mem_mib"] = peak_mib(call, fwd_only, device)


class Rows:
    """The rows measured; each printed and added to the CSV at once (a run cut off keeps it)."""

    def __init__(self, path: pathlib.Path, columns: tuple = COLUMNS):
        try:  # before any time is spent measuring
            files.write(path, ",".join(columns) + "\n")
        except files.WriteError as e:
            sys.exit(f"--csv: {e}")
        self.path, self.columns, self.rows = path, columns, []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        text = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()}
        line = io.StringIO()
        csv.DictWriter(line, self.columns, restval="", lineterminator="").writerow(text)
        try:
            files.append(self.path, line.getvalue())
        except files.WriteError as e:  # the disk filled meanwhile, say: the rows so far stay
            sys.exit(f"--csv: {e}")
        head = "{what:5s} {kind:13s} {dtype:8s} {mode:8s} N={N:6d}".format(**row)
        print(head, *(f" {k} {v}" for k, v in text.items() if k not in ROW_KEY), flush=True)


def run(args, rows: Rows, measure_row=measure_row) -> None:
    """Measure every (what, dtype, N, kind, mode) asked for, in that order, N and kinds in the
    order given (a run cut off early has every mode side by side at the first N). Out of memory
    skips larger N for that (what, kind, dtype, mode); a mode that does not compile skips every
    N for that kind; the row's note says so."""
    layers = {}  # one layer per kind, the same in every mode
    stop_at = {}  # (what, kind, dtype, mode) -> the smallest N it no longer runs at
    for what in args.what:
        kinds = [k for k in args.kinds if k in (STEP_KINDS if what == "step" else KINDS)]
        ns = args.step_ns if what == "step" else args.ns
        for dtype, N, kind, mode in itertools.product(args.dtypes, ns, kinds, args.modes):
            key = (what, kind, dtype, mode)
            if N >= stop_at.get(key, math.inf) or (kind == "gfsa-official" and N > OFFICIAL_MAX_N):
                continue
            if what == "layer" and kind not in layers:
                torch.manual_seed(0)
                mechanism, kwargs = KINDS[kind]
                layers[kind] = build_attention(mechanism, **LAYER, **kwargs).to(args.device)
            B = args.step_batch if what == "step" else args.batch
            row = dict(what=what, kind=kind, N=N, dtype=dtype, mode=mode, B=B)
            row.update(D=LAYER["d_model"], H=LAYER["n_heads"], device=args.device)
            try:
                measure_row(row, layers[kind] if what == "layer" else None, args)
            except torch.cuda.OutOfMemoryError:  # N < stop_at here: this N is the new limit
                row["note"], stop_at[key] = "out of memory: larger N skipped", N
                torch.cuda.empty_cache()
            except Exception as e:  # torch.compile's errors have many types
                if mode == "eager":
                    raise
                reason = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), repr(e))
                row["note"], stop_at[key] = f"not compiled: {reason}", 0
            rows.add(row)


def slope(ns: list, values: list) -> float:
    """Least-squares slope of log(value) against log(N): 1 = linear, 2 = quadratic."""
    return float(np.polyfit(np.log(ns), np.log(values), 1)[0])


def slopes(rows: list, fit_min: int) -> list:
    """One line per (kind, dtype, mode) of the layer rows: the log-log slopes of time and of
    memory over N >= fit_min ("-": fewer than two N, or a row without that column)."""
    layer = [r for r in rows if r["what"] == "layer" and "fwdbwd_ms" in r]
    rows, lines = [r for r in layer if r["N"] >= fit_min], []
    for key in dict.fromkeys((r["kind"], r["dtype"], r["mode"]) for r in rows):
        fit = [r for r in rows if (r["kind"], r["dtype"], r["mode"]) == key]
        ns = [r["N"] for r in fit]
        cols = [[r.get(col) for r in fit] for col in ("fwdbwd_ms", "mem_mib")]
        t, m = [f"{slope(ns, v):5.2f}" if len(ns) > 1 and None not in v else "    -" for v in cols]
        lines.append(f"  {' '.join(key):30s} time {t}   memory {m}   N {ns}")
    head = f"log-log slope over N >= {fit_min} (1 = linear, 2 = quadratic):"
    if lines:
        return [head, *lines]
    if layer:
        return [f"no log-log slopes: every N measured is below --fit-min {fit_min}"]
    return []


def plot(rows: list, path: pathlib.Path) -> None:
    """A PNG of the layer rows' time and memory against N, when matplotlib is installed."""
    rows = [r for r in rows if r["what"] == "layer" and "fwdbwd_ms" in r]
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib for one)")
        return
    if not rows:
        return
    plt.switch_backend("Agg")  # files only, no window
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for key in dict.fromkeys((r["kind"], r["dtype"], r["mode"]) for r in rows):
        sub = [r for r in rows if (r["kind"], r["dtype"], r["mode"]) == key]
        for ax, col in zip(axes, ("fwdbwd_ms", "mem_mib"), strict=True):
            pts = [r for r in sub if col in r]  # a row may lack a column (memory, say)
            ax.loglog([r["N"] for r in pts], [r[col] for r in pts], "o-", label=" ".join(key))
            ax.set_xlabel("N")
            ax.set_ylabel(col)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    files.write(path.with_suffix(".png"), functools.partial(fig.savefig, dpi=120, format="png"))
    print(f"wrote {path.with_suffix('.png')}")


def at_least(low: int):
    """An argparse type: an int >= low (argparse's error then names the flag)."""

    def parse(text: str) -> int:
        if int(text) < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text}")
        return int(text)

    parse.__name__ = "int"  # argparse's message for "x": invalid int value: 'x'
    return parse


def build_parser(whats: tuple = ("layer", "step")) -> argparse.ArgumentParser:
    """bench.py's command line; whats: the choices of --what."""
    raw = argparse.RawDescriptionHelpFormatter  # the docstring's lines kept
    p = argparse.ArgumentParser(description=__doc__, formatter_class=raw, add_help=False)
    on = "show this help with the values the flags given lead to"
    p.add_argument("-h", "--help", action="store_true", default=argparse.SUPPRESS, help=on)

    def add(*flag, help: str, **kw) -> None:  # each flag's help ends with its value
        p.add_argument(*flag, help=help + " (default: %(default)s)", **kw)

    kinds = list(dict.fromkeys([*KINDS, *STEP_KINDS]))
    add("--what", nargs="+", default=["layer"], choices=whats, help="a layer, a training step")
    add("--kinds", nargs="+", default=kinds, choices=kinds, help="each --what takes its own")
    dtypes = ["float32", "bfloat16", "float16"]
    add("--dtypes", nargs="+", default=dtypes[:1], choices=dtypes, help="float32 or autocast")
    compiled = dict(action=argparse.BooleanOptionalAction, default=None)  # default: on CUDA
    add("--compile", **compiled, help="also torch.compile each point")
    add("--device", default="cpu", choices=["cpu", "cuda"], help="where to measure")
    add("--ns", type=at_least(1), nargs="+", help="layer: N (256 doubling to 8192; CUDA: 32768)")
    add("--fit-min", type=at_least(1), default=1024, help="smallest N of the slopes")
    add("--batch", type=at_least(1), default=2, help="layer: batch size B")
    add("--step-ns", type=at_least(1), nargs="+", default=[1024, 4096], help="step: N")
    add("--step-batch", type=at_least(1), default=32, help="step: batch size (LRA)")
    add("--repeats", type=at_least(1), default=5, help="timed runs per point")
    add("--warmup", type=at_least(0), default=2, help="untimed runs first")
    add("--csv", help="runs/bench/bench_<device>.csv (_2, _3, ... if taken)")
    return p


def parse_args(argv=None, parser=None) -> argparse.Namespace:
    """The command line (of `parser`, default build_parser()), checked, with the defaults that
    depend on the device; args.modes: the modes measured at each point."""
    p = parser or build_parser()
    args = p.parse_args(argv)
    args.ns = args.ns or [256 * 2**i for i in range(8 if args.device == "cuda" else 6)]
    why = {"layer": "primal+trans is a model (--what step), not a layer", "step": "layers only"}
    for what, kinds in (("layer", KINDS), ("step", STEP_KINDS)):
        if what in args.what and not set(args.kinds) & set(kinds):  # not "nothing was measured"
            p.error(f"--what {what} measures none of --kinds {' '.join(args.kinds)}: {why[what]}")
    args.compile = args.device == "cuda" if args.compile is None else args.compile
    args.modes = ["eager", "compiled"] if args.compile else ["eager"]
    names = (f"runs/bench/bench_{args.device}_{i}.csv" for i in itertools.count(2))
    names = itertools.chain([f"runs/bench/bench_{args.device}.csv"], names)
    args.csv = args.csv or next(n for n in names if not pathlib.Path(n).exists())  # none replaced
    if vars(args).pop("help", False):
        runs.print_help(p, {k: v for k, v in vars(args).items() if k != "modes"})
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda: this machine has no CUDA GPU (torch {torch.__version__})")
    memory = runs.gpu_memory() if args.device == "cuda" else None
    for flag, batch, ns in (
        ("--ns", "--batch", args.ns),
        ("--step-ns", "--step-batch", args.step_ns),
    ):
        B = getattr(args, batch[2:].replace("-", "_"))
        for N in ns:  # x (B, N, D = 64) in float32: a lower bound of a point's memory
            nbytes, what = 4 * B * N * 64, f"N = {N:,} at batch {B:,}"
            said = files.too_big(nbytes, what, f"{flag} or {batch}", memory)
            if said:
                p.error(said)
    return args


def main(argv=None) -> list:
    """Measure, write the CSV (and the PNG), print the slopes; returns the slope lines."""
    args = parse_args(argv)
    modes = " and ".join(args.modes)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, {modes}", flush=True)
    path = pathlib.Path(args.csv)
    rows = Rows(path)

    with runs.ctrl_c(lambda: f": the rows measured so far ({len(rows.rows)}) are in {path}"):
        run(args, rows)  # Ctrl-C: one line, saying so
    if not rows.rows:
        sys.exit("nothing was measured")
    print(f"wrote {path}")
    lines = slopes(rows.rows, args.fit_min)
    for line in lines:  # none without layer rows
        print(line)
    plot(rows.rows, path)
    return lines


if __name__ == "__main__":
    main()
