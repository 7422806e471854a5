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
  --forms KIND...: candidate forms measured beside agf and primal (add those to --kinds), each a
      kind of its own: agf-split (AGF's d x d products over N, Vᵀ·Val, UᵀU and VᵀV, reduce N
      in chunks of --chunk tokens, summed afterwards: reduce_over_n below), agf-bf16 (those
      products on bf16 operands), agf-tf32 (agf.py's plain form with TF32 float32 matmuls, a
      process-wide switch of torch: every float32 matmul of the row) and primal-fused
      (FusedPrimal below: fewer kernels, the same y and aux, checked first). The report then
      says, for each, how many times as fast as its default kind it is at each point, both at
      their fastest, and which wins by >= 20 % at every point (else the plain form stays).
  --modes: the modes measured (default: eager, compiled when compiling, graphs with CUDA graphs).
The report adds, beside bench.py's slopes, eager against compiled and graphs at each point, and
at each N how many times as fast as softmax attention each kind is, both at their fastest mode
and dtype (softmax in bf16, flash attention, where measured), with a layer's time over its floor.
"""

import argparse
import contextlib
import itertools
import math
import pathlib
import re
import signal
import sys

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import agf
import bench
import model
from ksvd_attention import PrimalAttention, ksvd_objective

COLUMNS = (*bench.COLUMNS[:-2], "ops", "floor_mib", "floor_ms", *bench.COLUMNS[-2:])
BANDWIDTH_GBS = {"H100": 3350, "H200": 4800}  # HBM bandwidth of the SXM parts, GB/s
MIB = bench.MIB
# --forms: candidate kind -> (its default kind, AGF's reduction over N (None: agf.py's), TF32)
FORMS = {
    "agf-split": ("agf", "split", False),
    "agf-bf16": ("agf", "bf16", False),
    "agf-tf32": ("agf", None, True),
    "primal-fused": ("primal", None, False),
}
WIN = 1.2  # a candidate becomes the default only if it is this many times as fast everywhere
CHUNK = 1024  # agf-split: tokens per chunk (--chunk)
AGF_PLAIN = agf.agf_apply, agf.orthogonality_penalty  # agf.py's own: aᵀ b as one matmul


def reduce_over_n(a: torch.Tensor, b: torch.Tensor, form: str, chunk: int) -> torch.Tensor:
    """aᵀ b, the sum over N of d x d products, (B, H, N, d) twice -> (B, H, d, d), in a candidate
    form: "bf16" (bf16 operands, float32 sums on a GPU: about 3 significant digits) or "split"
    (N in chunks of `chunk` tokens, zero rows padding the last, one product per chunk, summed
    afterwards: at N = 16K and 1024 tokens, 16 times the thread blocks of one product)."""
    if form == "bf16":
        return (a.transpose(-2, -1).bfloat16() @ b.bfloat16()).to(a.dtype)
    if a.shape[-2] <= chunk:  # one chunk: the plain product
        return a.transpose(-2, -1) @ b
    a, b = (F.pad(t, (0, 0, 0, -t.size(-2) % chunk)).unflatten(-2, (-1, chunk)) for t in (a, b))
    return (a.transpose(-2, -1) @ b).sum(-3)  # (B,H,n,d,chunk) @ (B,H,n,chunk,d), summed over n


def agf_reduced(form: str, chunk: int) -> tuple:
    """agf.agf_apply and agf.orthogonality_penalty with their d x d products over N (Vᵀ·Val, UᵀU,
    VᵀV) as reduce_over_n(form, chunk) computes them; the same formulas otherwise."""

    def reduce(a, b):
        return reduce_over_n(a, b, form, chunk)

    def agf_apply(u, g, v, values):
        return (u * g) @ reduce(v, values)

    def orthogonality_penalty(u, v):
        eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device)
        gram_u, gram_v = reduce(u, u) - eye, reduce(v, v) - eye
        return gram_u.abs().mean(dim=(1, 2, 3)) + gram_v.abs().mean(dim=(1, 2, 3))

    return agf_apply, orthogonality_penalty


def use_form(kind: str, chunk: int = CHUNK) -> None:
    """What a row of `kind` runs: a candidate of FORMS sets AGF's reduction over N (agf.py's
    functions replaced) and TF32; any other kind gets agf.py's plain form and TF32 off."""
    _, reduction, tf32 = FORMS.get(kind, (None, None, False))
    plain = reduction is None
    agf.agf_apply, agf.orthogonality_penalty = AGF_PLAIN if plain else agf_reduced(reduction, chunk)
    torch.backends.cuda.matmul.allow_tf32 = tf32


class FusedPrimal(PrimalAttention):
    """PrimalAttention (non-causal) in fewer kernels, a candidate for the GPU: W_q and W_k as one
    projection and one normalize; W_{e|X}, W_{r|X} from one product; e and r of every head from
    one (B, N, 2D) @ (2D, 2Hs) product, its weight block-diagonal over (q, k) x heads (2H times
    the multiplications of the per-head products: fewer, larger kernels for more arithmetic),
    laid out so that each head's [e; r] is adjacent for W_er. Same y and aux as PrimalAttention."""

    def forward(self, x, mask=None):
        B, N, D = x.shape
        H, d, s = self.n_heads, self.d_head, self.We.shape[-1]
        mask = torch.ones(B, N, dtype=torch.bool, device=x.device) if mask is None else mask
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = x.to(self.W_q.weight.dtype).masked_fill(~mask[..., None], 0.0)
            weight = torch.cat([self.W_q.weight, self.W_k.weight])  # (2D, D)
            qk = F.linear(x, weight, torch.cat([self.W_q.bias, self.W_k.bias]))
            phi = F.normalize(qk.view(B, N, 2 * H, d), p=2.0, dim=-1).flatten(2)  # (B, N, 2D)
            W = self.sampled_tokens(x, mask).transpose(-2, -1) @ torch.cat([self.We, self.Wr], -1)
            W = W.view(B, H, d, 2, s).permute(0, 3, 1, 2, 4)  # (B, q|k, H, d, s)
            eye_h, eye_2 = torch.eye(H, device=x.device), torch.eye(2, device=x.device)
            # (B, q|k, H, d, H, e|r, s): nonzero where the two heads and q|k, e|r agree
            blocks = W[:, :, :, :, None, None, :] * eye_h[:, None, :, None, None]
            blocks = blocks * eye_2[:, None, None, None, :, None]
            er = (phi @ blocks.reshape(B, 2 * H * d, 2 * H * s)).view(B, N, H, 2 * s)
            y = self.W_o(self.W_er(er).flatten(2)).masked_fill(~mask[..., None], 0.0)
            e, r = er.transpose(1, 2).chunk(2, dim=-1)  # (B, H, N, s) each
            per_sample = self.ksvd_reduction == "sample"
            J = ksvd_objective(e, r, self.Lambda, self.We, self.Wr, mask, per_sample)
            aux = self.ksvd_weight * J.pow(2).mean() if B > 0 else J.new_zeros(())
        return y.to(x.dtype), aux


def check_fused_primal() -> None:
    """FusedPrimal gives PrimalAttention's y, aux and gradients (float64, padding): else stop."""
    torch.manual_seed(0)
    ours = PrimalAttention(32, 4, rank=5, rank_multi=3, max_len=64).double()
    fused = FusedPrimal(32, 4, rank=5, rank_multi=3, max_len=64).double()
    fused.load_state_dict(ours.state_dict())
    x = torch.randn(3, 40, 32, dtype=torch.float64)
    mask = torch.arange(40) < torch.tensor([[40], [29], [7]])  # right padding, 7 real tokens
    outs = []
    for layer in (ours, fused):
        y, aux = layer(x, mask)
        grads = torch.autograd.grad(y.square().sum() + aux, list(layer.parameters()))
        outs.append((y, aux, *grads))
    if not all(torch.allclose(a, b, atol=1e-12) for a, b in zip(*outs, strict=True)):
        sys.exit("FusedPrimal differs from PrimalAttention: not measured")


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
    print(
        f"{row['kind']} {row['dtype']}, B={row['B']} N={row['N']} D={row['D']}: saved for "
        "backward (written in forward, read in backward):"
    )
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
    use_form(row["kind"], args.chunk)
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
        row = dict(
            what="floor",
            kind=kind,
            N=N,
            dtype=dtype,
            mode="eager",
            B=args.batch,
            D=D,
            H=H,
            device=args.device,
        )
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
                floor_ms = [
                    r["floor_ms"]
                    for r in mine
                    if (r["kind"], r["N"], r["dtype"]) == same and "floor_ms" in r
                ]
                floor = f", {best[col] / floor_ms[0]:.0f}x its floor" if floor_ms else ""
                parts.append(
                    f"{kind} {base[col] / best[col]:.2f}x ({best['mode']} {best['dtype']}{floor})"
                )
            if parts:
                head = f"  {what:5s} N={N:6d} (softmax {base['mode']} {base['dtype']})"
                lines.append(f"{head}: " + ", ".join(parts))
    return ["as fast as softmax attention, each at its fastest:", *lines] if lines else []


def wins_from(ratios: list):
    """(N0, the worst ratio from N0 on) for the smallest measured N0 from which every point,
    (N, ratio) with N >= N0, is a win by WIN; None when the largest N is no such win."""
    found = None
    for N0 in sorted({n for n, _ in ratios}, reverse=True):
        worst = min(r for n, r in ratios if n >= N0)
        if worst < WIN:
            break
        found = N0, worst
    return found


def forms_verdict(rows: list) -> list:
    """--forms: each candidate against its default kind at every point both were measured at,
    each at its fastest (mode and dtype; layers: also that time over the floor), and from which N
    on it wins by >= 20 % at every point (layer and step alike): of such, the one winning from
    the smallest N (then by the larger worst ratio) becomes the default from there, else the
    plain form stays."""
    lines, wins = [], {}
    for form, (kind, _, _) in FORMS.items():
        ratios = []  # (N, old time / new time), one per point
        for what, N in dict.fromkeys((r["what"], r["N"]) for r in rows if r["kind"] == form):
            col = "step_ms" if what == "step" else "fwdbwd_ms"
            new, old = fastest(rows, what, form, N), fastest(rows, what, kind, N)
            if new is None or old is None:
                continue
            ratios.append((N, old[col] / new[col]))
            floors = {
                r["kind"]: r["floor_ms"]
                for r in rows
                if "floor_ms" in r
                and r["N"] == N
                and r["what"] == what
                and r["dtype"] == new["dtype"]
            }
            over = "".join(
                f", {k} {t[col] / floors[k]:.0f}x its floor"
                for k, t in ((form, new), (kind, old))
                if k in floors
            )
            lines.append(
                f"  {what:5s} N={N:6d} {form} {new[col]:.3f} ms ({new['mode']} "
                f"{new['dtype']}) against {kind} {old[col]:.3f} ms ({old['mode']} "
                f"{old['dtype']}): {ratios[-1][1]:.2f}x{over}"
            )
        if ratios:
            wins[form] = wins_from(ratios)
            low, high = min(r for _, r in ratios), max(r for _, r in ratios)
            if wins[form] is None:
                said = "does not win by 20 % at the largest N"
            elif wins[form][0] == min(n for n, _ in ratios):
                said = "WINS by >= 20 % at every point"
            else:
                said = f"WINS by >= 20 % at every point from N = {wins[form][0]} on, not below"
            lines.append(
                f"  {form}: {low:.2f}x to {high:.2f}x {kind} over {len(ratios)} points: {said}"
            )
    for kind in dict.fromkeys(k for k, _, _ in FORMS.values()):
        won = {f: w for f, w in wins.items() if FORMS[f][0] == kind and w is not None}
        best = min(won, key=lambda f: (won[f][0], -won[f][1]), default=None)
        if any(FORMS[f][0] == kind for f in wins):
            verdict = "stays (none wins by 20 %)"
            if best:
                verdict = f"{best} becomes the default from N = {won[best][0]}"
            lines.append(f"  {kind}: {verdict}")
    return ["candidate forms against their default kind (--forms):", *lines] if lines else []


def parse_args(argv=None) -> argparse.Namespace:
    """bench.py's command line, plus --what floor, --cuda-graphs, --bandwidth-gbs, --forms,
    --chunk and --modes."""
    p = bench.build_parser(whats=("layer", "step", "floor"))
    p.description = __doc__
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure mode graphs (default: on CUDA with --compile)",
    )
    p.add_argument(
        "--bandwidth-gbs",
        type=float,
        default=None,
        help="memory bandwidth for floor_ms (default: from the GPU's name)",
    )
    p.add_argument(
        "--forms",
        nargs="+",
        default=[],
        choices=list(FORMS),
        help="candidate forms, measured beside their default kinds",
    )
    p.add_argument(
        "--chunk",
        type=bench.at_least(1),
        default=CHUNK,
        help=f"agf-split: tokens per chunk (default {CHUNK})",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        dest="only_modes",
        choices=["eager", "compiled", "graphs"],
        help="default: from --compile and --cuda-graphs",
    )
    args = bench.parse_args(argv, p)
    if args.bandwidth_gbs is not None and not (0 < args.bandwidth_gbs < math.inf):
        p.error(f"--bandwidth-gbs must be a finite number above 0, got {args.bandwidth_gbs}")
    if args.cuda_graphs is None:
        args.cuda_graphs = args.compile and args.device == "cuda"
    if args.cuda_graphs:
        args.modes.append("graphs")
    args.modes = args.only_modes or args.modes  # --modes: exactly those
    args.kinds += [f for f in args.forms if f not in args.kinds]
    return args


@contextlib.contextmanager
def forms_registered(args):
    """--forms: the candidate kinds exist (bench's kinds, model's attentions) while measuring;
    afterwards all is as before, agf.py's plain form and TF32 off."""
    if "primal-fused" in args.forms:
        check_fused_primal()
    saved = dict(bench.KINDS), bench.STEP_KINDS, dict(model.ATTENTION), model.AUX_KINDS
    for form in args.forms:
        kind = FORMS[form][0]
        mechanism, kwargs = bench.KINDS[kind]
        bench.KINDS[form] = ("primal-fused" if kind == "primal" else mechanism, kwargs)
    bench.STEP_KINDS = (*bench.STEP_KINDS, *args.forms)
    model.ATTENTION["primal-fused"] = FusedPrimal
    model.AUX_KINDS = (*model.AUX_KINDS, "primal-fused")
    try:
        yield
    finally:
        kinds, bench.STEP_KINDS, attention, model.AUX_KINDS = saved
        bench.KINDS.clear()
        bench.KINDS.update(kinds)
        model.ATTENTION.clear()
        model.ATTENTION.update(attention)
        use_form("agf")


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
    cut = False
    with forms_registered(args):
        try:  # a time limit's SIGTERM (.ci/gpu): the report still covers the rows measured
            signal.signal(signal.SIGTERM, _cut_off)
            bench.run(args, rows, measure_row)
        except KeyboardInterrupt:
            cut = True
            print("cut off (SIGTERM): the report covers the rows measured so far", flush=True)
    if not rows.rows:
        sys.exit("nothing was measured")
    print(f"wrote {path}")
    lines = side_by_side(rows.rows) + against_softmax(rows.rows) + forms_verdict(rows.rows)
    lines += bench.slopes(rows.rows, args.fit_min)
    print("\n".join(lines))
    bench.plot(rows.rows, path)
    if cut:
        sys.exit(124)  # as timeout's own code: the stage was cut off
    return lines


def _cut_off(*_):
    raise KeyboardInterrupt


if __name__ == "__main__":
    main()
