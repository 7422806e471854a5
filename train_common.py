"""
train_common.py: the plumbing that train_uea.py and train_lra.py share, so each of them reads as
its own story (data -> model -> loop -> result) without repeating the same 150 lines.

    config:      a dataclass whose every field is a command-line flag (--help lists them);
                 defaults < preset < command line
    devices:     --device auto|cpu|cuda|cuda:1, mixed precision on CUDA, torchrun DDP
                 (NCCL on GPU, Gloo on CPU)
    run folder:  config.json, metrics.jsonl, checkpoint.pt, result.json and a final
                 `RESULT {json}` line on stdout

Depends on: torch
"""

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import pathlib
import random
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist


def flag(default, help: str):  # noqa: A002 (argparse's own word)
    """A dataclass field that carries its --help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def _str2bool(s: str) -> bool:
    # argparse's type=bool would turn the string "false" into True.
    if s.lower() in ("1", "true", "yes", "on"):
        return True
    if s.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {s!r}")


def parse_config(cls, preset: Callable[[dict], dict], argv: Optional[list], description: str):
    """Build a `cls` dataclass from the command line.   defaults < preset(given) < command line.

    Every field `some_name` becomes `--some-name` (the spelling `--some_name` works too); a bool
    flag alone means true (`--resume`), or takes a value (`--resume false`). `preset(given)`
    receives the flags given on the command line and returns the preset values (e.g. the
    paper's settings for that dataset and attention).
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(cls):
        kind = _str2bool if isinstance(f.default, bool) else type(f.default)
        names = [f"--{f.name.replace('_', '-')}"] + (["--" + f.name] if "_" in f.name else [])
        text = f"{f.metadata.get('help', '')} (default: {f.default})"
        # A bool flag alone means true (`--resume`); `--resume false` also works.
        extra = dict(nargs="?", const=True) if kind is _str2bool else {}
        parser.add_argument(*names, dest=f.name, type=kind, default=None, help=text, **extra)
    given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
    values = {**preset(given), **given}
    unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"preset sets unknown fields {sorted(unknown)}")
    return cls(**values)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """'auto' -> the local CUDA device when there is one, else the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {name}: CUDA is not available on this machine")
        if device.index is None:  # under torchrun each process takes its own GPU
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    return device


def setup_distributed(device: torch.device) -> tuple[int, int]:
    """Join the process group when started by torchrun; returns (rank, world_size)."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return (dist.get_rank(), world) if world > 1 else (0, 1)


def teardown_distributed(clean: bool = True) -> None:
    """Leave the process group, together when `clean`. Without it a process can exit while its
    peer's Gloo threads still run, and the C++ runtime aborts ("terminate called without an
    active exception", SIGABRT) although the training finished. The DDP model must be gone
    first: its reducer, freed at interpreter exit after the group, triggers the same abort
    (DDP modules sit in reference cycles, hence the explicit gc.collect). After an error, no
    barrier: the peer may be gone, and waiting for it would hang."""
    if dist.is_initialized():
        gc.collect()
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def autocast(device: torch.device, enabled: bool):
    """Mixed precision on CUDA (bf16 where supported, else fp16); a no-op on the CPU."""
    if not enabled or device.type != "cuda":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.autocast("cuda", dtype=dtype)


def all_reduce_sum(values: list, device: torch.device) -> list:
    """Sum a few numbers over the processes (identity without DDP)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


class RunDir:
    """One run's folder: config.json, metrics.jsonl, checkpoint.pt, result.json.

    Only rank 0 writes; every rank can read the checkpoint.
    """

    def __init__(self, path: str, rank: int = 0):
        self.path, self.rank = pathlib.Path(path), rank
        if rank == 0:
            self.path.mkdir(parents=True, exist_ok=True)

    @property
    def checkpoint(self) -> pathlib.Path:
        return self.path / "checkpoint.pt"

    def write_config(self, cfg) -> None:
        if self.rank == 0:
            text = json.dumps(dataclasses.asdict(cfg), indent=2)
            (self.path / "config.json").write_text(text + "\n")

    def log(self, record: dict) -> None:
        """Append one line of metrics."""
        if self.rank == 0:
            with open(self.path / "metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")

    def truncate_log(self, keep) -> None:
        """On resume, drop metric lines written after the checkpoint (keep(record) -> bool)."""
        log = self.path / "metrics.jsonl"
        if self.rank == 0 and log.exists():
            lines = [ln for ln in log.read_text().splitlines() if keep(json.loads(ln))]
            log.write_text("".join(ln + "\n" for ln in lines))

    def save(self, state: dict) -> None:
        """Write the checkpoint atomically (a crash mid-write leaves the previous one intact)."""
        if self.rank == 0:
            tmp = self.checkpoint.with_suffix(".tmp")
            torch.save(state, tmp)
            os.replace(tmp, self.checkpoint)

    def load(self) -> dict:
        if not self.checkpoint.exists():
            raise SystemExit(f"--resume: no checkpoint at {self.checkpoint}")
        return torch.load(self.checkpoint, map_location="cpu", weights_only=False)

    def finish(self, result: dict) -> dict:
        """Write result.json and print the final machine-readable line."""
        if self.rank == 0:
            (self.path / "result.json").write_text(json.dumps(result, indent=2) + "\n")
            print("RESULT " + json.dumps(result), flush=True)
        return result


def rng_state() -> dict:
    """Every random generator's state, for an exact resume."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
