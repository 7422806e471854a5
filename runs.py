"""
runs.py: what train_lra.py and train_uea.py do alike, kept out of their way (as nanoGPT's
configurator.py beside its train.py): flags, torchrun's processes, the run folder, checkpoints,
writes that never leave half a file. A run folder holds config.json, metrics.jsonl,
checkpoint.pt, best.pt (LRA), result.json, diagnose/ and `lock`, held by the running process
with fcntl.flock: the operating system releases it when the process ends, however it ends
(without fcntl, as on Windows, the run says that the folder is not locked).
"""

import argparse
import contextlib
import dataclasses
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

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

RANK, WORLD = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))  # torchrun's
SEEDS = 2**32  # numpy's and torch's seeds lie in [0, 2**32)
# What a run or diagnose.py writes into a run folder; --overwrite removes these and nothing else
WRITTEN = {"config.json", "metrics.jsonl", "checkpoint.pt", "best.pt", "result.json", "diagnose"}
WRITTEN |= {name + ".tmp" for name in WRITTEN}
MAY_CHANGE = {"resume", "overwrite", "device", "out", "compile"}  # on --resume; and the script's
_lock = None  # this process's lock file: open, it holds the lock of its run folder


def flag(default, help: str, low=None, high=None):  # help: argparse's word
    """A settings field that is also a flag, its value in [low, high)."""
    return dataclasses.field(default=default, metadata=dict(help=help, low=low, high=high))


@dataclasses.dataclass
class Settings:  # the flags of a run both scripts share; each script's TrainConfig adds its own
    out: str = flag("", "run folder (default runs/<task|dataset>/<attention>-<preset>-seed<seed>)")
    resume: bool = flag(False, "continue the run in --out from its checkpoint.pt")
    overwrite: bool = flag(False, "start afresh in a folder that holds a run (deleting its files)")
    device: str = flag("auto", "auto (CUDA when there is one) | cpu | cuda")
    amp: bool = flag(True, "mixed precision on CUDA (bf16, else fp16 with loss scaling)")
    compile: bool = flag(
        None, "torch.compile the model (default: on CUDA only); each new batch shape compiles first"
    )


def parse(Config, doc: str, choices: dict, presets, out: str, argv=None):
    """The flags (or `argv`) -> Config: defaults < presets(given, error) < flags, all checked.
    presets returns the preset values for the flags given; it may refuse with error(message).
    out: the run folder's pattern, filled with the settings, where --out is not given."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)

    def quietly(message):  # rank 0 says it and exits: torchrun then ends the others, which
        with contextlib.suppress(Exception):  # meanwhile wait where rank 0 would meet them
            dist.init_process_group("gloo")
        raise SystemExit(2)

    if RANK:  # every process parses the same flags: rank 0 alone says what is wrong
        p.error = quietly
    choices = dict(choices, device=("auto", "cpu", "cuda"))  # one GPU per process: pick it with
    for f in dataclasses.fields(Config):  # CUDA_VISIBLE_DEVICES; a bool is --amp / --no-amp
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        kind["help"] = f"{f.metadata['help']} (default: {f.default})"
        p.add_argument("--" + f.name.replace("_", "-"), choices=choices.get(f.name), **kind)
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    cfg = Config(**{**presets(given, p.error), **given})
    for f in dataclasses.fields(cfg):
        low, high, value = f.metadata["low"], f.metadata["high"], getattr(cfg, f.name)
        name = "--" + f.name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            p.error(f"{name} must be a finite number, got {value}")
        if (low is not None and value < low) or (high is not None and value >= high):
            where = f"at least {low}" if high is None else f"in [{low}, {high})"
            p.error(f"{name} must be {where}, got {value}")
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
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
    cfg.compile = cuda if cfg.compile is None else cfg.compile  # nanoGPT's default: on a GPU
    cfg.out = cfg.out or out.format(**dataclasses.asdict(cfg))
    return cfg


def start(cfg, script: str, unit: str, total: int, may_change=()) -> tuple:
    """Rank 0 locks and checks the run folder cfg.out, then torchrun's processes meet (one per
    GPU, or per share of a CPU) -> (rank, world, device, autocast, the checkpoint to resume or
    None). unit: "step" or "epoch", counted to `total`; may_change: what else --resume may change.
    A refusal is said by rank 0 before the others meet it: torchrun ends them where they wait."""
    out = pathlib.Path(cfg.out)
    ckpt = _open(cfg, out, script, unit, total, MAY_CHANGE | set(may_change)) if RANK == 0 else None
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
    if found - WRITTEN and not cfg.resume:  # nothing a run did not write is ever deleted
        unknown = ", ".join(sorted(found - WRITTEN))
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
    return ckpt


def load(file: pathlib.Path, **options) -> dict:
    """A checkpoint or best.pt, read to the CPU with torch.load(weights_only=True): tensors,
    numbers, strings and their containers, which is all checkpoint() saves. Unpickling anything
    else could run code, from a run folder someone shared: refused in one sentence, never run."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True, **options)
    except pickle.UnpicklingError as e:
        name = re.search(r"GLOBAL ([\w.]+)", str(e))  # torch's message names what it refused
        if name is None:  # damaged: the caller says so
            raise
        what = f"{file} asks for {name[1]}, which no checkpoint of train_lra.py or train_uea.py "
        how = "start the run again with --overwrite, or choose another --out"
        raise SystemExit(f"{what}holds: it is not read, as it could run code; {how}") from None


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


def save(path: pathlib.Path, obj) -> None:
    """Write obj to path (.json: JSON; .jsonl: a line appended; else torch.save) through a
    temporary file and a rename: a crash leaves the old file whole, a failed write one sentence."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        if path.suffix == ".json":
            tmp.write_text(json.dumps(obj, indent=2, allow_nan=False))
        elif path.suffix == ".jsonl":
            tmp.write_text((path.read_text() if path.exists() else "") + json.dumps(obj) + "\n")
        else:
            torch.save(obj, tmp)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch.save says RuntimeError when the disk is full
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else "is the disk full?"
        raise SystemExit(
            f"cannot write {path} ({why}): the run stops; --resume goes on from its last checkpoint"
        ) from None


def finish(out: pathlib.Path, result: dict) -> dict:
    """Rank 0 writes result.json and prints RESULT {json} as the last line; processes part."""
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


def run(main, cfg, unit: str, errors) -> None:
    """main(cfg), from the command line: Ctrl-C or a closed stdout (`| head`; exit status 130,
    as a shell's Ctrl-C) and an error of the data (`errors`) end in one sentence, no traceback.
    However it ends, a run folder this process locked that holds only `lock` is removed."""
    out = pathlib.Path(cfg.out)
    try:
        main(cfg)
    except (KeyboardInterrupt, BrokenPipeError) as e:  # Ctrl-C, or `| head` closed stdout
        why = "interrupted" if isinstance(e, KeyboardInterrupt) else "its output was closed"
        if isinstance(e, BrokenPipeError):  # and Python's flush of stdout at exit says nothing
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        file = out / "checkpoint.pt"  # rank 0 alone reads it, and only to say where to go on
        how = " before the first checkpoint: the same command starts the run again"
        if RANK == 0 and file.exists():
            done = load(file, mmap=True)["state"][unit]
            how = f"; continue from its {unit} {done} with --resume"
        if RANK == 0:
            sys.stderr.write(f"\n{why}{how}\n")
        raise SystemExit(130) from None
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
