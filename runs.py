"""
runs.py: what train_lra.py and train_uea.py do alike, kept out of their way (as nanoGPT's
configurator.py beside its train.py): the flags both have and --help with the values a run takes,
torchrun's processes, the run folder, checkpoints, writes that never leave half a file, the RESULT
line, and Ctrl-C's one line (bench.py and diagnose.py end in it too). A run folder holds
config.json, metrics.jsonl, checkpoint.pt, best.pt (LRA), result.json, diagnose/ and `lock`, held
by the running process with fcntl.flock: the operating system releases it when the process ends,
however it ends (without fcntl, as on Windows, the run says that the folder is not locked).
"""

import argparse
import collections
import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import pathlib
import pickle
import re
import shutil
import sys

import torch
import torch.distributed as dist

import files

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
SEEDS = 2**32  # numpy's and torch's seeds lie in [0, 2**32)
# What a run or diagnose.py writes into a run folder; --overwrite removes these and nothing else
WRITTEN = {"config.json", "metrics.jsonl", "checkpoint.pt", "best.pt", "result.json", "diagnose"}
MAY_CHANGE = {"resume", "overwrite", "device", "out", "compile"}  # on --resume; and the script's
_lock = None  # this process's lock file: open, it holds the lock of its run folder


def _written(name: str) -> bool:
    """Whether a run (or diagnose.py) writes a file of this name: one of WRITTEN, or its
    temporary file (files.py's <name>.<pid>-<k>.tmp; <name>.tmp, as older versions named it)."""
    if files.TEMPORARY.fullmatch(name):
        name = name.rsplit(".", 2)[0]
    return name.removesuffix(".tmp") in WRITTEN


def flag(default, help: str, low=None, high=None):  # help: argparse's word
    """A settings field that is also a flag, its value in [low, high)."""
    return dataclasses.field(default=default, metadata=dict(help=help, low=low, high=high))


@dataclasses.dataclass
class Settings:  # the flags both scripts have; None: each script's PAPER dict gives the value
    attention: str = flag(None, "the attention of every layer (primal+trans: Primal in the last)")
    preset: str = flag(None, "paper (the official scripts' settings) | quick (small, CPU)")
    data_dir: str = flag(None, "where the data is")
    download: bool = flag(None, "fetch the data into --data-dir when it is missing")
    download_url: str = flag(None, "a mirror or file:// copy to fetch from (implies --download)")
    seed: int = flag(None, "seed of the weights, dropout and the batch order", 0, SEEDS)
    lr: float = flag(None, "(peak) learning rate (> 0)")
    batch_size: int = flag(None, "examples per step, all processes together", 1)
    eval_every: int = flag(None, "evaluate every this many steps (LRA) or epochs (UEA)", 1)
    d_model: int = flag(None, "D, model width", 1)
    n_heads: int = flag(None, "H, heads (D must be divisible by H)", 1)
    n_layers: int = flag(None, "layers", 1)
    d_ff: int = flag(None, "feed-forward width", 1)
    dropout: float = flag(None, "dropout in the blocks", 0, 1)
    agf_order: int = flag(None, "AGF: polynomial order K", 0)
    agf_alpha: float = flag(None, "AGF: Jacobi α")
    agf_beta: float = flag(None, "AGF: Jacobi β")
    agf_gamma: float = flag(None, "AGF: orthogonality weight γ (official --eta)", 0)
    agf_variant: str = flag(None, "AGF: agf | uv (A = U Vᵀ) | svd (A = U Σ Vᵀ, Σ unfiltered)")
    primal_rank: int = flag(None, "Primal-Attention: rank s (official --low_rank)", 1)
    primal_eta: float = flag(None, "Primal-Attention: KSVD weight η", 0)
    gfsa_order: int = flag(None, "GFSA: order K of the high-order term", 2)
    gfsa_high_order: str = flag(None, "GFSA: Ā^K as taylor (Eq. 4, the paper) | exact")
    # the run folder and the machine: the same in both scripts
    out: str = flag("", "run folder (runs/<task|dataset>/<attention>-<preset>-seed<seed>)")
    resume: bool = flag(False, "continue the run in --out from its checkpoint.pt")
    overwrite: bool = flag(False, "start afresh in a folder that holds a run (deleting its files)")
    device: str = flag("auto", "auto (CUDA when there is one) | cpu | cuda")
    amp: bool = flag(True, "mixed precision on CUDA (bf16, else fp16 with loss scaling)")
    compile: bool = flag(None, "torch.compile the model (by default where CUDA is used)")


def parse(Config, doc: str, choices: dict, values, out: str, argv=None, presets=None):
    """The flags (or `argv`) -> Config: values(given, error) < the flags given, all checked.
    values(given, error): the script's settings and its presets for the flags given (all but
    the run folder's); it may refuse with error(message). out: the run folder's pattern, filled
    with the settings, where --out is not given. --help shows each flag's value for the flags
    given beside it and, where they differ, the value of each preset (name -> its flags)."""
    wrap = argparse.RawDescriptionHelpFormatter  # the docstring's lines kept, the flags' wrapped
    p = argparse.ArgumentParser(description=doc, formatter_class=wrap, add_help=False)
    on = "show this help with the values of the flags given (--task text --help: Text's)"
    p.add_argument("-h", "--help", action="store_true", default=argparse.SUPPRESS, help=on)

    def quietly(message):  # rank 0 says it and exits: torchrun then ends the others, which
        with contextlib.suppress(Exception):  # meanwhile wait where rank 0 would meet them
            dist.init_process_group("gloo")
        raise SystemExit(2)

    if RANK:  # every process parses the same flags: rank 0 alone says what is wrong
        p.error = quietly
    choices = dict(choices, device=("auto", "cpu", "cuda"))  # one GPU per process: pick it with
    shared = {f.name for f in dataclasses.fields(Settings)}  # CUDA_VISIBLE_DEVICES
    for f in sorted(dataclasses.fields(Config), key=lambda f: f.name in shared):  # own first
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        kind["help"] = f.metadata["help"].replace("%", "%%") + " (default: %(default)s)"
        p.add_argument("--" + f.name.replace("_", "-"), choices=choices.get(f.name), **kind)
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    helping = given.pop("help", False)
    cfg = Config(**{**values(given, p.error), **given})
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    cfg.compile = cuda if cfg.compile is None else cfg.compile  # nanoGPT's default: on a GPU
    cfg.out = cfg.out or out.format(**dataclasses.asdict(cfg))
    if helping:  # each preset's settings: this command's, with its flags
        rows = {name: {**given, **flags} for name, flags in (presets or {}).items()}
        defaults = {f.name: f.default for f in dataclasses.fields(Config)}
        rows = {k: {**defaults, **values(g, p.error), **g} for k, g in rows.items()}
        _help(p, cfg, given, rows, {k for flags in (presets or {}).values() for k in flags})
    for f in dataclasses.fields(cfg):
        low, high, value = f.metadata["low"], f.metadata["high"], getattr(cfg, f.name)
        name = "--" + f.name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            p.error(f"{name} must be a finite number, got {value}")
        if (low is not None and value < low) or (high is not None and value >= high):
            where = f"at least {low}" if high is None else f"in [{low}, {high})"
            p.error(f"{name} must be {where}, got {value}")
    if cfg.lr <= 0:
        p.error(f"--lr must be positive, got {cfg.lr}")
    if cfg.d_model % cfg.n_heads:
        p.error(f"--d-model {cfg.d_model} is not divisible by --n-heads {cfg.n_heads}")
    if cfg.device == "cuda" and not cuda:
        p.error("--device cuda: this machine has no CUDA device")
    if cfg.batch_size % WORLD:
        p.error(f"--batch-size {cfg.batch_size} is not divisible by {WORLD} processes")
    if cfg.resume and cfg.overwrite:
        p.error("--resume continues a run and --overwrite deletes it: give one of them")
    said = too_big(cfg, given, gpu_memory() if cuda else None)
    if said:
        p.error(said)
    return cfg


def gpu_memory() -> int | None:
    """The first CUDA device's memory in bytes; None where there is none to ask."""
    try:
        return torch.cuda.get_device_properties(0).total_memory
    except (RuntimeError, AssertionError):  # no device after all (or a torch without CUDA)
        return None


def too_big(cfg, given: dict, memory: int | None) -> str | None:
    """The sentence where a training step of cfg cannot fit in memory (None: this machine's),
    from the flags, before anything is allocated; else None. A lower bound, term by term: the
    weights with their gradients and Adam's two moments, and one float32 tensor of activations
    a layer (no N×N term: SDPA's fused kernels never form one). Each names its flags, those
    given first."""
    D, L, B, N = cfg.d_model, cfg.n_layers, cfg.batch_size, cfg.max_len or 1  # UEA: 0, unknown
    terms = [  # (bytes, what, flags)
        (16 * L * (4 * D * D + 2 * D * cfg.d_ff), "weights", ("d_model", "d_ff", "n_layers")),
        (4 * B * N * D * L, "activations", ("batch_size", "max_len", "d_model")),
    ]
    nbytes, what, names = max(terms)
    names = sorted(names, key=lambda name: name not in given)[: 1 if set(names) & set(given) else 3]
    flags = " or ".join(f"--{name.replace('_', '-')}" for name in names)
    return files.too_big(nbytes, f"One training step's {what}", flags, memory)


def _help(p, cfg, given: dict, presets: dict, chosen: set) -> None:
    """Print p's help with cfg's value of each flag (", given": on the command line), and where
    the presets (name -> settings) differ, each one's ("else": most presets'), but for the flags
    that choose a preset. Exit 0."""
    shown = {}
    for key, value in dataclasses.asdict(cfg).items():
        said = f"{value}, given" if key in given else f"{value}"
        each = {name: settings[key] for name, settings in presets.items()}
        if len(set(each.values())) > 1 and key not in chosen:
            usual, n = collections.Counter(each.values()).most_common(1)[0]
            listed = [f"{name} {v}" for name, v in each.items() if n == 1 or v != usual]
            said += "; by preset: " + ", ".join(listed + [f"else {usual}"] * (n > 1))
        shown[key] = said
    print_help(p, shown)


def print_help(p: argparse.ArgumentParser, values: dict) -> None:
    """Print p's help with each flag's "%(default)s" the value in `values` that this command
    takes (a list as the flags write it), then exit 0. The scripts', bench.py's --help."""
    for key, value in values.items():
        p.set_defaults(**{key: " ".join(map(str, value)) if isinstance(value, list) else value})
    p.print_help()
    raise SystemExit(0)


def start(cfg, script: str, unit: str, total: int, may_change=()) -> tuple:
    """Rank 0 locks and checks the run folder cfg.out and prints the settings, then torchrun's
    processes meet (one per GPU, or per share of a CPU) -> (rank, world, device, autocast, the
    checkpoint to resume or None). unit: "step" or "epoch", counted to `total`; may_change: what
    else --resume may change. Rank 0 says a refusal: torchrun ends the others where they wait."""
    out = pathlib.Path(cfg.out)
    ckpt = _open(cfg, out, script, unit, total, MAY_CHANGE | set(may_change)) if RANK == 0 else None
    if RANK == 0:
        print(json.dumps(vars(cfg)), flush=True)  # the resolved settings first
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ:  # under torchrun (it sets RANK); without: one process, rank 0
        dist.init_process_group("nccl" if cuda else "gloo")
    if RANK and cfg.resume:  # rank 0 has checked it
        ckpt = load(out / "checkpoint.pt")
    half = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    return RANK, WORLD, device, torch.autocast(device.type, half, enabled=cuda and cfg.amp), ckpt


def _open(cfg, out: pathlib.Path, script, unit, total, may_change):
    global _lock
    _lock = None  # one run at a time in a process: the lock file before, replaced, closes
    try:
        out.mkdir(parents=True, exist_ok=True)
        held = open(out / "lock", "a")  # open until the process ends
        if fcntl is not None:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _lock = held  # this process holds it: run() may remove it
    except BlockingIOError:  # another process holds it
        raise SystemExit(f"{out} is in use by another run: wait, or choose another --out") from None
    except OSError as e:  # a file named out, too: "File exists"
        raise SystemExit(f"cannot write the run to {out}: {e.strerror}") from None
    if fcntl is None:
        print(f"no fcntl on this system: {out} is not locked; start one run per folder")
    # From here on this process alone writes to out, and checks what is in it now
    found = {p.name for p in out.iterdir()} - {"lock"}
    unknown = ", ".join(sorted(name for name in found if not _written(name)))
    if unknown and not cfg.resume:  # nothing a run did not write is ever deleted
        raise SystemExit(f"{out} holds files that no run wrote ({unknown}): choose another --out")
    # A run is there once it has a checkpoint or a result; what a start stopped before its first
    # checkpoint left (config.json, say) is no run: a fresh start replaces it, as --overwrite
    held = found & {"checkpoint.pt", "result.json"}
    if not cfg.resume:
        if held and not cfg.overwrite:
            how = "add --resume to continue it, --overwrite to start it again (deleting its files)"
            raise SystemExit(f"{out} holds a run already: {how}, or choose another --out")
        for name in found:
            if (out / name).is_dir():
                shutil.rmtree(out / name)
            else:
                (out / name).unlink()
        return None
    file = out / "checkpoint.pt"
    if not file.exists():
        how = "with --overwrite" if held else "without --resume"
        raise SystemExit(f"--resume: there is no checkpoint at {file}; start the run {how}")
    try:
        ckpt = load(file)
        then = ckpt["config"]
    except Exception as e:  # truncated, empty, or not a checkpoint at all
        raise SystemExit(f"{file} is damaged ({type(e).__name__}): use --overwrite") from None
    writer = ckpt.get("script") or ("train_lra.py" if "task" in then else "train_uea.py")
    if writer != script:
        what = ", ".join(f"{k} {then[k]}" for k in ("task", "dataset") if k in then)
        raise SystemExit(
            f"{file} was written by {writer} ({what}): resume it with {writer} or use another --out"
        )
    now = {k: getattr(cfg, k, None) for k in then}  # None: a setting this version lacks
    changed = {k: (v, now[k]) for k, v in then.items() if k not in may_change and v != now[k]}
    if changed:
        raise SystemExit(f"--resume: {out} ran with other settings (then, now): {changed}")
    done = ckpt["state"][unit]
    if done >= total and (out / "result.json").exists():
        more = f"--{unit}s above {done} continues it, " if f"{unit}s" in may_change else ""
        more += "--overwrite starts it again"
        raise SystemExit(f"{out} finished its {done} {unit}s: nothing to resume ({more})")
    torn = files.read_log(out / "metrics.jsonl")[1]  # a process killed while writing a line
    if torn is not None:  # (files.append never leaves one; a copy cut short, an editor might)
        what = f"its last line, cut off, is dropped ({len(torn)} characters without an end)"
        print(f"{out / 'metrics.jsonl'}: {what}", flush=True)
    return ckpt


def refused(e: Exception) -> str | None:
    """The name torch.load(weights_only=True) refused to unpickle, from its error's message (a
    global that no checkpoint holds); None for any other error (a damaged file)."""
    name = re.search(r"GLOBAL ([\w.]+)", str(e))
    return name[1] if name else None


def load(file: pathlib.Path, **options) -> dict:
    """A checkpoint or best.pt, read to the CPU with torch.load(weights_only=True): tensors,
    numbers, strings and their containers, which is all checkpoint() saves. Unpickling anything
    else could run code, from a run folder someone shared: refused in one sentence, never run."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, **options)
    except pickle.UnpicklingError as e:
        name = refused(e)
        if name is None:  # damaged: the caller says so
            raise
        what = f"{file} asks for {name}, which no checkpoint of train_lra.py or train_uea.py "
        how = "start the run again with --overwrite, or choose another --out"
        raise SystemExit(f"{what}holds: it is not read, as it could run code; {how}") from None


def prepare(cfg, ckpt, parts: dict, state: dict, about: dict, data: dict) -> tuple:
    """Go on from the checkpoint, or start afresh (restore); write config.json -> (fast, net):
    the model compiled (fixed shapes: one graph per batch shape) and what trains (DDP under
    torchrun); parts["model"] holds the weights, which both share. Rank 0 first checks that
    `data` (name -> array) are those the run began with: their shapes and a digest of each."""
    arrays = {k: a for k, a in data.items() if a is not None and RANK == 0}  # (None: no array)
    hashed = {k: a if a.flags.c_contiguous else a.copy() for k, a in arrays.items()}
    now = {k: [list(a.shape), hashlib.blake2b(a).hexdigest()[:16]] for k, a in hashed.items()}
    then = (ckpt or {}).get("data_digest", now)  # the checkpoint of an older version has none
    if RANK == 0 and then != now:
        changed = []
        for name in (k for k in {**then, **now} if then.get(k) != now.get(k)):
            a, b = (tuple(d[0]) if d else "none" for d in (then.get(name), now.get(name)))
            changed.append(f"{name} {a} then, {b} now" if a != b else f"{name}: other values")
        why = f"the data differ from those the run began with ({'; '.join(changed)})"
        raise SystemExit(f"--resume: {why}: resume with those, or start again with --overwrite")
    restore(ckpt, parts, state, seed=cfg.seed + RANK)
    model = parts["model"]
    about.update(config=dataclasses.asdict(cfg), model_config=dataclasses.asdict(model.cfg))
    about.update(data_digest=now)  # in every checkpoint: the settings, the model's, the data's
    if RANK == 0:
        save(pathlib.Path(cfg.out, "config.json"), about["config"])  # the settings of this start
    fast = torch.compile(model, dynamic=False) if cfg.compile else model
    return fast, torch.nn.parallel.DistributedDataParallel(fast) if "RANK" in os.environ else fast


def checkpoint(parts: dict, state: dict, **more) -> dict:
    """What a resumed run needs: each part's state_dict, the counters, the RNGs (dropout goes on
    with the masks it would have drawn), and `more` (settings, the model's configuration)."""
    cuda_rng = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None
    states = {k: part.state_dict() for k, part in parts.items()}
    return dict(states, state=state, **more, rng=torch.get_rng_state(), cuda_rng=cuda_rng)


def restore(ckpt, parts: dict, state: dict, seed: int) -> None:
    """Load what checkpoint() saved, or seed a fresh run's dropout (each process its own seed)."""
    if ckpt is None:
        torch.manual_seed(seed)
        return
    for key, part in parts.items():
        part.load_state_dict(ckpt[key])
    state.update(ckpt["state"])
    torch.set_rng_state(ckpt["rng"])
    if ckpt.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(ckpt["cuda_rng"])


def means(sums: torch.Tensor, where: str) -> list:
    """sums (..., count) of every process (all-reduced under torchrun), divided by the count;
    the first, the training loss, must be finite. sums is zeroed for the next ones."""
    if "RANK" in os.environ:
        dist.all_reduce(sums)
    *totals, count = sums.tolist()
    sums.zero_()
    if not math.isfinite(totals[0]):
        why = "the run diverged (a smaller --lr may help); its last good checkpoint stays"
        raise SystemExit(f"the training loss is {totals[0] / count} {where}: {why}")
    return [total / count for total in totals]


def log(out: pathlib.Path, parts: dict, state: dict, about: dict, record: dict) -> str:
    """Rank 0 writes the checkpoint, then the record to metrics.jsonl (a crash in between loses
    a log line, not a step) -> the record as a line to print ("" in the other processes)."""
    if RANK:
        return ""
    save(out / "checkpoint.pt", checkpoint(parts, state, **about))
    save(out / "metrics.jsonl", record)
    return "  ".join(f"{k} {v:.4g}" for k, v in record.items())


def save(path: pathlib.Path, obj) -> None:
    """Write obj to path (.json: JSON; .jsonl: a line appended; else torch.save) through
    files.write: a crash leaves the old file whole, Ctrl-C no temporary file, and a failed write
    stops the run in one sentence that says how to go on."""
    if path.suffix == ".json":
        content = json.dumps(obj, indent=2, allow_nan=False)
    elif path.suffix != ".jsonl":
        buffer = io.BytesIO()  # in memory first: torch.save says RuntimeError on a full disk
        torch.save(obj, buffer)
        content = buffer.getvalue()
    try:
        if path.suffix == ".jsonl":
            files.append(path, json.dumps(obj))
        else:
            files.write(path, content)
    except OSError as e:  # a WriteError, or a log that cannot be read
        how = "--resume goes on from its last checkpoint"
        if not os.path.exists(path.parent / "checkpoint.pt"):  # (False for a name too long)
            how = "there is no checkpoint yet: once it is mended, the same command starts again"
        raise SystemExit(f"{files.fault(e, path)}: the run stops; {how}") from None


def finish(out: pathlib.Path, result: dict, device=None) -> dict:
    """Rank 0 writes result.json (with the device, where given) and prints RESULT {json} as the
    last line; the processes part."""
    if result is not None and device is not None:
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        result["device"] = f"{gpu} x {WORLD}"
    bad = [k for k, v in (result or {}).items() if v != v or v in (math.inf, -math.inf)]
    if bad:
        raise SystemExit(f"the result's {', '.join(bad)} is not a finite number: nothing written")
    if RANK == 0:
        save(out / "result.json", result)
        print("RESULT " + json.dumps(result, allow_nan=False), flush=True)
    if dist.is_initialized():
        dist.barrier()  # the processes part together: none tears gloo down while one still runs
        dist.destroy_process_group()
    return result


@contextlib.contextmanager
def ctrl_c(kept):
    """Ctrl-C, or a closed stdout (`| head`), inside: rank 0 says why and kept() (what was kept
    and how to go on) in one line on stderr, and the process exits with status 130 (as a
    shell's Ctrl-C), no traceback."""
    try:
        yield
    except (KeyboardInterrupt, BrokenPipeError) as e:
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else "its output was closed"
        if isinstance(e, BrokenPipeError):  # and Python's flush of stdout at exit says nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if RANK == 0:
            sys.stderr.write(f"\n{why}{kept()}\n")
        raise SystemExit(130) from None


def run(main, cfg, unit: str, errors) -> None:
    """main(cfg), from the command line: Ctrl-C, a closed stdout and an error of the data
    (`errors`) end in one sentence, no traceback. However it ends, a run folder this process
    locked that holds only `lock` is removed."""
    out = pathlib.Path(cfg.out)

    def kept() -> str:  # rank 0 alone reads the checkpoint, and only to say where to go on
        if not (out / "checkpoint.pt").exists():
            return " before the first checkpoint: the same command starts the run again"
        done = load(out / "checkpoint.pt", mmap=True)["state"][unit]
        return f"; continue from its {unit} {done} with --resume"

    try:
        with ctrl_c(kept):
            main(cfg)
    except errors as e:
        raise SystemExit(f"error: {e}") from None
    finally:  # a run that never began (a refused download, say) leaves no folder behind
        held = _lock is not None and _lock.name == str(out / "lock")  # not another's lock
        if RANK == 0 and held and out.is_dir() and os.listdir(out) == ["lock"]:
            with contextlib.suppress(OSError):
                (out / "lock").unlink()
                os.removedirs(out)  # nor empty folders above it


if __name__ == "__main__":  # a library of train_lra.py and train_uea.py: no command line
    run = "python train_uea.py or train_lra.py (--help lists their flags)"
    print(f"runs.py has no command line: it serves the train scripts; run {run}", file=sys.stderr)
    sys.exit(2)
