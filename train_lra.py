"""
train_lra.py: train one attention mechanism on one Long Range Arena task.

    python train_lra.py --preset quick --attention agf         # small generated ListOps, a CPU
    python train_lra.py --task listops --attention agf         # the papers' setting, a GPU
    torchrun --standalone --nproc_per_node 4 train_lra.py --task image --attention primal
    python train_lra.py --task listops --attention agf --resume    # continue an interrupted run

Data (--data-dir): the LRA release layout (gs://long-range-arena/lra_release), IMDB and CIFAR-10
beside it, or PyTorch-LRA pickles (lra_data.py); ListOps is generated (seeded) when missing.
Protocol: every eval_every steps the model is evaluated on the validation split; the weights
that score best there are kept (best.pt) and the test split is evaluated once, with them.
Output: runs/<task>/<attention>-<preset>-seed<seed>/ {config.json, metrics.jsonl, checkpoint.pt,
best.pt, result.json}, and a lock file while the run writes; the last line is  RESULT {json}.
"""

import argparse
import dataclasses
import json
import math
import os
import pathlib
import socket
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from lra_data import LISTOPS_PAPER, N_CLASSES, VOCAB, DataError, Split, load_task
from model import ATTENTION, Classifier, ModelConfig, count_parameters

ATTENTIONS = (*ATTENTION, "primal+trans")  # primal+trans: softmax layers, Primal in the last
DEVICES = ("auto", "cpu", "cuda")  # one GPU per process; pick it with CUDA_VISIBLE_DEVICES
SEEDS = 2**32  # numpy's and torch's seeds lie in [0, 2**32)
RUN_FILES = ("config.json", "metrics.jsonl", "checkpoint.pt", "best.pt", "result.json")


def flag(default, help: str, low=None, high=None):  # noqa: A002 (argparse's word)
    """A field that is also a flag; a value must lie in [low, high) (checked when parsed)."""
    return field(default=default, metadata=dict(help=help, low=low, high=high))


@dataclass
class TrainConfig:
    task: str = flag("listops", "listops | text | retrieval | image | pathfinder")
    attention: str = flag("agf", " | ".join(ATTENTIONS))
    preset: str = flag("paper", "paper (the official scripts' settings) | quick (small, CPU)")
    data_dir: str = flag("data", "the LRA release layout, aclImdb/ and cifar-10-batches-py/")
    out: str = flag("", "run folder (default runs/<task>/<attention>-<preset>-seed<seed>)")
    resume: bool = flag(False, "continue the run in --out from its checkpoint.pt")
    overwrite: bool = flag(False, "start afresh in a folder that holds a run (deleting its files)")
    seed: int = flag(0, "seed of the initial weights, dropout and the batch order", 0, SEEDS)
    device: str = flag("auto", "auto (CUDA when there is one) | cpu | cuda")
    amp: bool = flag(True, "mixed precision on CUDA (bf16, else fp16 with loss scaling)")
    compile: bool = flag(None, "torch.compile the model (default: on CUDA yes, on a CPU no); the "
                         "first steps and evaluations of each batch shape pay the compile time")
    # optimisation: AdamW, betas (0.9, 0.999), eps 1e-6, no weight decay, OneCycleLR
    steps: int = flag(5000, "optimizer steps (a new value rescales the preset's warm-up)", 1)
    warmup: int = flag(1000, "linear warm-up steps: 0, or 2 .. steps - 1", 0)
    lr: float = flag(1e-4, "peak learning rate (> 0)")
    batch_size: int = flag(32, "examples per step, all processes together", 1)
    eval_every: int = flag(50, "evaluate on the validation split every this many steps", 1)
    max_len: int = flag(2000, "tokens per input; longer inputs are cut", 1)
    # model: the LRA setting of the three papers
    d_model: int = flag(64, "D, model width", 1)
    n_heads: int = flag(2, "H, heads (D must be divisible by H)", 1)
    n_layers: int = flag(2, "layers", 1)
    d_ff: int = flag(128, "feed-forward width", 1)
    dropout: float = flag(0.1, "dropout, also on the softmax and GFSA attention weights", 0, 1)
    agf_order: int = flag(5, "AGF: Jacobi polynomial order K", 0)
    agf_alpha: float = flag(2.0, "AGF: Jacobi α")
    agf_beta: float = flag(-1.0, "AGF: Jacobi β")
    agf_gamma: float = flag(0.01, "AGF: orthogonality weight γ", 0)
    agf_variant: str = flag("agf", "AGF: agf | uv (H = U Vᵀ) | svd (H = U Σ Vᵀ, Σ unfiltered)")
    primal_rank: int = flag(20, "Primal-Attention: rank s", 1)
    primal_eta: float = flag(0.1, "Primal-Attention: KSVD weight η", 0)
    gfsa_order: int = flag(2, "GFSA: order K of the high-order term", 2)
    gfsa_high_order: str = flag("taylor", "GFSA: Ā^K as taylor (Eq. 4, the paper) | exact")
    # data
    data_seed: int = flag(0, "seed of the ListOps generator and the Pathfinder split", 0, SEEDS)
    listops_size: int = flag(96000, "generated ListOps: training examples", 1)
    listops_eval_size: int = flag(2000, "generated ListOps: validation, test examples each", 1)


# The schedule of the PyTorch LRA code that all three papers use (mlpen/Nystromformer
# LRA/code/lra_config.py, reused by PrimalAttention and AGF_LRA). Text: 1000 tokens as LRA's
# base_tc_config; `--max-len 4000` is the "4K" setting of Primal-Attention's Text numbers.
TASKS = {
    "listops": dict(max_len=2000, batch_size=32, warmup=1000, steps=5000, eval_every=50),
    "text": dict(max_len=1000, batch_size=32, warmup=8000, steps=20000, eval_every=500),
    "retrieval": dict(max_len=4000, batch_size=32, warmup=800, steps=30000, eval_every=300),
    "image": dict(max_len=1024, batch_size=256, warmup=175, steps=35000, eval_every=175),
    "pathfinder": dict(max_len=1024, batch_size=256, warmup=312, steps=62400, eval_every=312),
}
# Per attention and task, from the official run scripts: jeongwhanchoi/agf AGF_LRA/best_agf.sh;
# yingyichen-cyy/PrimalAttention LRA/bashes/run_tasks.sh (and Primal.+Trans./ for primal+trans).
# GFSA publishes no LRA scripts: K = 2 (exactly Ā²) is our choice, attention dropout 0.1.
MECHANISMS = {
    ("agf", "listops"): dict(agf_order=5, agf_alpha=2.0, agf_beta=-1.0, agf_gamma=0.01),
    ("agf", "text"): dict(agf_order=5, agf_alpha=2.0, agf_beta=-2.0, agf_gamma=0.01),
    ("agf", "retrieval"): dict(agf_order=5, agf_alpha=2.0, agf_beta=-1.5, agf_gamma=1e-4),
    ("agf", "image"): dict(agf_order=6, agf_alpha=1.5, agf_beta=2.0, agf_gamma=0.1),
    ("agf", "pathfinder"): dict(agf_order=4, agf_alpha=1.5, agf_beta=-1.0, agf_gamma=1e-4),
    ("primal", "listops"): dict(primal_rank=20, primal_eta=0.1),
    ("primal", "text"): dict(primal_rank=20, primal_eta=0.05),
    ("primal", "retrieval"): dict(primal_rank=30, primal_eta=0.0),
    ("primal", "image"): dict(primal_rank=30, primal_eta=0.1),
    ("primal", "pathfinder"): dict(primal_rank=30, primal_eta=0.1),
    ("primal+trans", "listops"): dict(primal_rank=30, primal_eta=0.05),
    ("primal+trans", "text"): dict(primal_rank=30, primal_eta=0.1),
    ("primal+trans", "retrieval"): dict(primal_rank=20, primal_eta=0.05),
    ("primal+trans", "image"): dict(primal_rank=30, primal_eta=0.1),
    ("primal+trans", "pathfinder"): dict(primal_rank=20, primal_eta=0.05),
}
# --preset quick: a small ListOps of short expressions (depth <= 3) that a CPU learns in minutes.
QUICK = dict(listops_size=6000, listops_eval_size=500, max_len=100, lr=1e-3, steps=1000, warmup=100)
# ListOps generator bounds (LRA lra_benchmarks/data/listops.py); 16 seeded shards, in parallel
LISTOPS = {
    "paper": dict(LISTOPS_PAPER, shards=16),  # listops-1000, 500 < tokens < 2000, depth 10
    "quick": dict(folder="listops-quick", min_length=20, max_length=100, max_depth=3, max_args=5),
}


def parse_config(argv=None) -> TrainConfig:
    """The flags (or `argv`) -> TrainConfig: defaults < preset < flags, all checked here."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    choices = dict(task=list(TASKS), attention=ATTENTIONS, preset=list(LISTOPS), device=DEVICES,
                   agf_variant=("agf", "uv", "svd"), gfsa_high_order=("taylor", "exact"))
    for f in dataclasses.fields(TrainConfig):  # a bool is --amp / --no-amp
        kind = dict(action=argparse.BooleanOptionalAction) if f.type is bool else dict(type=f.type)
        p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, choices=choices.get(f.name),
                       help=f"{f.metadata['help']} (default: {f.default})", **kind)
    given = {k: v for k, v in vars(p.parse_args(argv)).items() if v is not None}
    task = given.get("task", TrainConfig.task)
    attention = given.get("attention", TrainConfig.attention)
    preset = given.get("preset", TrainConfig.preset)
    if preset == "quick" and task != "listops":
        p.error("--preset quick is a small generated ListOps: use it with --task listops")
    values = {**TASKS[task], **MECHANISMS.get((attention, task), {})}
    values.update(QUICK if preset == "quick" else {})
    if "steps" in given and "warmup" not in given:  # keep the preset's warm-up fraction
        warmup = round(values["warmup"] * given["steps"] / values["steps"])
        values["warmup"] = 2 if warmup == 1 else warmup  # OneCycleLR cannot warm up in 1 step
    cfg = TrainConfig(**{**values, **given})
    for f in dataclasses.fields(cfg):
        low, high, value = f.metadata["low"], f.metadata["high"], getattr(cfg, f.name)
        name = "--" + f.name.replace("_", "-")
        if isinstance(value, float) and not math.isfinite(value):
            p.error(f"{name} must be a finite number, got {value}")
        if (low is not None and value < low) or (high is not None and value >= high):
            p.error(f"{name} must be " + (f"at least {low}" if high is None
                    else f"in [{low}, {high})") + f", got {value}")
    if cfg.warmup == 1 or cfg.warmup >= cfg.steps:
        p.error(f"--warmup must be 0 or 2 .. --steps - 1 = {cfg.steps - 1}, got {cfg.warmup}")
    if cfg.lr <= 0:
        p.error(f"--lr must be positive, got {cfg.lr}")
    if cfg.d_model % cfg.n_heads:
        p.error(f"--d-model {cfg.d_model} is not divisible by --n-heads {cfg.n_heads}")
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cfg.device == "cuda" and not cuda:
        p.error("--device cuda: this machine has no CUDA device (use auto or cpu)")
    world = int(os.environ.get("WORLD_SIZE", 1))  # torchrun's number of processes
    if cfg.batch_size % world:
        p.error(f"--batch-size {cfg.batch_size} is not divisible by {world} processes")
    cfg.compile = cuda if cfg.compile is None else cfg.compile
    return cfg


def open_run(cfg: TrainConfig, out: pathlib.Path, master: bool) -> dict | None:
    """Check the run folder before anything is written -> the checkpoint to resume, or None."""
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is a file, not a folder: choose another --out")
    if not cfg.resume and not cfg.overwrite and (out / "config.json").exists():
        raise SystemExit(f"{out} holds a run already: add --resume to continue it, --overwrite "
                         "to start it again (deleting its files), or choose another --out")
    file = out / "checkpoint.pt"
    lock = out / "lock"
    if cfg.resume and not file.exists():
        raise SystemExit(f"--resume: there is no checkpoint at {file}; start with --overwrite")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=False) if cfg.resume else None
        then, done = (ckpt["config"], ckpt["state"]["step"]) if ckpt else ({}, 0)
    except Exception as e:  # truncated, empty, or not a checkpoint of this script
        raise SystemExit(f"{file} is damaged ({type(e).__name__}): use --overwrite") from None
    may_change = ("resume", "overwrite", "device", "out", "compile")
    changed = {k: (v, getattr(cfg, k, None)) for k, v in then.items()
               if k not in may_change and v != getattr(cfg, k, None)}
    if changed:
        raise SystemExit(f"--resume: {out} ran with other settings (then, now): {changed}")
    if ckpt and done >= cfg.steps:
        raise SystemExit(f"{out} finished its {done} steps: nothing to resume; --overwrite "
                         "starts it again")
    if master and lock.exists():  # one run writes to a folder at a time
        pid, _, host = lock.read_text().partition("@")
        gone = False
        if host == socket.gethostname():  # on another machine we cannot tell: it may run
            try:
                os.kill(int(pid), 0)  # signal 0 only asks whether the process exists
            except (ProcessLookupError, ValueError):
                gone = True
        if not gone:
            raise SystemExit(f"{out} is in use by process {pid} on {host}: wait for it, "
                             f"choose another --out, or delete {lock} if that run is gone")
        print(f"{lock} was left by process {pid}, which is no longer running: removing it")
        lock.unlink()
    return ckpt


def lock_run(out: pathlib.Path) -> None:
    """Create the run folder and its lock (pid@host); check that its files are writable."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:  # a read-only file, folder or disk: one sentence, before step 1
            if (out / name).exists() and not os.access(out / name, os.W_OK):
                raise PermissionError(13, "Permission denied", str(out / name))
        with open(out / "lock", "x") as lock:  # "x" fails if another run made it meanwhile
            lock.write(f"{os.getpid()}@{socket.gethostname()}")
    except FileExistsError:
        raise SystemExit(f"{out} is in use by another run: wait, or choose another --out") from None
    except OSError as e:
        raise SystemExit(f"cannot write the run to {e.filename or out}: {e.strerror}") from None


def build(cfg: TrainConfig, device: torch.device) -> tuple:
    """-> (model, AdamW, OneCycleLR, GradScaler), with the same initial weights in every process."""
    torch.manual_seed(cfg.seed)
    kwargs = {  # each attention's constructor arguments (model.py passes them on)
        "agf": dict(order=cfg.agf_order, basis="jacobi", alpha=cfg.agf_alpha, beta=cfg.agf_beta,
                    ortho_weight=cfg.agf_gamma, fix_theta0=True, variant=cfg.agf_variant),
        # the LRA code samples m = s · rank_multi tokens, rank_multi = 10; KSVD loss of batch means
        "primal": dict(rank=cfg.primal_rank, rank_multi=10, ksvd_weight=cfg.primal_eta,
                       ksvd_reduction="batch"),
        "gfsa": dict(order=cfg.gfsa_order, dropout=cfg.dropout, high_order=cfg.gfsa_high_order),
    }
    model = Classifier(ModelConfig(
        n_classes=N_CLASSES[cfg.task], max_len=cfg.max_len, vocab_size=VOCAB[cfg.task],
        style="lra", two_tower=cfg.task == "retrieval", d_model=cfg.d_model, n_heads=cfg.n_heads,
        n_layers=cfg.n_layers, d_ff=cfg.d_ff, dropout=cfg.dropout, attn_dropout=cfg.dropout,
        attention=cfg.attention, attention_kwargs=kwargs)).to(device)
    # fused on CUDA (one kernel for every parameter: fewer launches), as nanoGPT; same update
    opt = torch.optim.AdamW(model.parameters(), cfg.lr, (0.9, 0.999), eps=1e-6, weight_decay=0,
                            fused=device.type == "cuda")
    # As the official code: linear warm-up lr/25 -> lr, linear decay -> lr/25e4, β₁ 0.95 <-> 0.85
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, cfg.lr, cfg.steps, anneal_strategy="linear",
                                                pct_start=cfg.warmup / cfg.steps)
    fp16 = device.type == "cuda" and cfg.amp and not torch.cuda.is_bf16_supported()
    return model, opt, sched, torch.amp.GradScaler("cuda", enabled=fp16)  # bf16 needs no scaling


def to_batch(split: Split, idx: np.ndarray, device) -> dict:
    """Examples idx as tensors on `device`: ids x, bool mask (B, N), labels y [, x2, mask2]."""
    batch = {k: torch.from_numpy(v) for k, v in split.batch(idx).items()}
    if torch.device(device).type == "cuda":  # from pinned memory, without waiting for the GPU
        batch = {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return batch


def train_step(model, opt, sched, scaler, batch: dict, autocast) -> tuple:
    """One optimizer step -> (loss, number of correct predictions), as tensors."""
    opt.zero_grad(set_to_none=True)
    with autocast:  # the forward pass only; backward runs outside autocast
        logits, aux = model(batch["x"], batch["mask"], batch.get("x2"), batch.get("mask2"))
        # aux: weighted in each attention (γ, η), averaged over layers by model.py: added as it is
        loss = F.cross_entropy(logits.float(), batch["y"]) + aux.float()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    sched.step()
    return loss.detach(), (logits.argmax(-1) == batch["y"]).sum()


@torch.no_grad()
def evaluate(model, split: Split, batch_size: int, device, autocast) -> tuple:
    """(accuracy, mean cross-entropy) on a whole split, in eval mode (a bar on a terminal)."""
    model.eval()
    n = len(split.y)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct: read at the end
    for start in tqdm(range(0, n, batch_size), desc="evaluating", leave=False, disable=None):
        batch = to_batch(split, np.arange(start, min(start + batch_size, n)), device)
        with autocast:
            logits, _ = model(batch["x"], batch["mask"], batch.get("x2"), batch.get("mask2"))
        loss = F.cross_entropy(logits.float(), batch["y"], reduction="sum")
        sums += torch.stack([loss.double(), (logits.argmax(-1) == batch["y"]).sum().double()])
    model.train()
    loss, correct = sums.tolist()
    return correct / n, loss / n


def main(cfg: TrainConfig) -> dict:
    """Train, keep the weights that score best on validation, test them -> the result dict."""
    # 1) processes and device: torchrun sets RANK and starts one process per GPU (or CPU share)
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    master = rank == 0  # only this process writes files and prints
    device = torch.device(f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    half = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float16
    autocast = torch.autocast(device.type, half, enabled=cuda and cfg.amp)
    out = pathlib.Path(cfg.out or f"runs/{cfg.task}/{cfg.attention}-{cfg.preset}-seed{cfg.seed}")
    ckpt = open_run(cfg, out, master)
    state = dict(step=0, best_val_acc=-1.0, best_step=0, elapsed=0.0)  # what a checkpoint keeps
    try:
        return train(cfg, out, ckpt, state, device, rank, world, autocast)
    except KeyboardInterrupt:
        if master:
            saved = (out / "checkpoint.pt").exists()
            then = "continue with --resume" if saved else "no checkpoint yet: --overwrite"
            sys.stderr.write(f"\ninterrupted at step {state['step']}; {then}\n")
        raise SystemExit(130) from None
    finally:  # the lock goes, if this process took it
        lock = out / "lock"
        if master and lock.exists() and lock.read_text() == f"{os.getpid()}@{socket.gethostname()}":
            lock.unlink()
        if ddp:
            dist.destroy_process_group()


def train(cfg: TrainConfig, out: pathlib.Path, ckpt, state: dict, device, rank, world, autocast):
    """The run, in the folder that `main` checked and locked -> the result dict (rank 0)."""
    ddp = "RANK" in os.environ
    master = rank == 0
    cuda = device.type == "cuda"
    if master:
        print(json.dumps(dataclasses.asdict(cfg)), flush=True)  # the resolved settings first
    # 2) data; rank 0 first, as it may generate ListOps, then the others read what it wrote
    listops = dict(LISTOPS[cfg.preset], train=cfg.listops_size, val=cfg.listops_eval_size,
                   test=cfg.listops_eval_size)
    if ddp and not master:
        dist.barrier()
    data_args = dict(task=cfg.task, data_dir=cfg.data_dir, max_len=cfg.max_len, seed=cfg.data_seed,
                     listops=listops)  # kept in the checkpoints, so diagnose.py reads the same
    data, notes = load_task(**data_args)
    if ddp and master:
        dist.barrier()
    for note in notes if master else ():
        print(note, flush=True)
    n_train = len(data["train"].y)
    if n_train < cfg.batch_size:
        raise SystemExit(f"the training split has {n_train} examples, fewer than one batch")

    # 3) model, optimizer, schedule: fresh, or as the interrupted run left them
    if master:
        lock_run(out)  # from here on, this run alone writes to out
    model, opt, sched, scaler = build(cfg, device)
    parts = dict(model=model, optimizer=opt, scheduler=sched, scaler=scaler)
    if ckpt is not None:
        for key, part in parts.items():
            part.load_state_dict(ckpt[key])
        torch.set_rng_state(ckpt["rng"])  # dropout goes on with the masks it would have drawn
        if cuda and ckpt.get("cuda_rng") is not None:  # on a GPU, dropout draws from its own
            torch.cuda.set_rng_state(ckpt["cuda_rng"])
        state.update(ckpt["state"])
    else:
        torch.manual_seed(cfg.seed + rank)  # each process draws its own dropout masks
        if master:
            for name in RUN_FILES:  # --overwrite: nothing of the old run stays
                (out / name).unlink(missing_ok=True)
            (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    # The checkpoints say what they hold: the model's settings beside its weights (diagnose.py)
    model_config = dataclasses.asdict(model.cfg)
    # fast: compiled (fixed shapes: one graph per batch shape); net: what trains (DDP under
    # torchrun). model holds the weights: it is saved and loaded, fast and net share them.
    fast = torch.compile(model, dynamic=False) if cfg.compile else model
    net = torch.nn.parallel.DistributedDataParallel(fast) if ddp else fast

    # 4) train. Batch k is a function of (seed, k) alone, so a resumed run sees the batches it
    # would have seen; each process takes its share of every batch.
    bar = tqdm(total=cfg.steps, initial=state["step"], desc=cfg.attention,
               disable=not master or None)  # None: shown on a terminal only
    sums = torch.zeros(3, device=device)
    t0 = time.time()
    per_epoch = n_train // cfg.batch_size
    while state["step"] < cfg.steps:
        epoch, k = divmod(state["step"], per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(n_train)
        idx = order[k * cfg.batch_size : (k + 1) * cfg.batch_size][rank::world]
        lr = opt.param_groups[0]["lr"]  # the rate this step uses (the schedule moves on after it)
        batch = to_batch(data["train"], idx, device)
        loss, correct = train_step(net, opt, sched, scaler, batch, autocast)
        sums += torch.stack([loss * len(idx), correct, torch.tensor(len(idx), device=device)])
        state["step"] = step = state["step"] + 1
        bar.update()
        if step % cfg.eval_every and step != cfg.steps:
            continue
        if ddp:
            dist.all_reduce(sums)  # the training loss and accuracy of all processes
        loss_sum, n_correct, n = sums.tolist()
        sums.zero_()
        if not math.isfinite(loss_sum):
            raise SystemExit(f"the training loss is {loss_sum / n} at step {step}: the run "
                             "diverged (a smaller --lr may help); its last good checkpoint stays")
        val_acc, val_loss = evaluate(fast, data["val"], cfg.batch_size, device, autocast)
        if val_acc > state["best_val_acc"]:  # the first of equal scores is kept
            state.update(best_val_acc=val_acc, best_step=step)
            if master:
                best = dict(model=model.state_dict(), model_config=model_config, data=data_args)
                torch.save(best, out / "best.pt")
        state["elapsed"] += time.time() - t0
        t0 = time.time()
        record = dict(step=step, lr=lr, train_loss=round(loss_sum / n, 5),
                      train_acc=round(n_correct / n, 5), val_acc=round(val_acc, 5),
                      val_loss=round(val_loss, 5), time_s=round(state["elapsed"], 1))
        bar.set_postfix(loss=record["train_loss"], val=record["val_acc"])
        if master:  # the checkpoint first: a crash in between loses a log line, not a step
            ckpt = {k: part.state_dict() for k, part in parts.items()}
            ckpt.update(rng=torch.get_rng_state(), state=state, config=dataclasses.asdict(cfg))
            ckpt.update(cuda_rng=torch.cuda.get_rng_state() if cuda else None)
            ckpt.update(model_config=model_config, data=data_args)
            torch.save(ckpt, out / "checkpoint.tmp")
            os.replace(out / "checkpoint.tmp", out / "checkpoint.pt")  # never half a file
            with open(out / "metrics.jsonl", "a") as log:
                log.write(json.dumps(record) + "\n")
    bar.close()

    # 5) test once (rank 0), with the weights that scored best on validation
    result = None
    if master:
        model.load_state_dict(torch.load(out / "best.pt", map_location=device)["model"])
        # NOTE: differs from the official test loader (drop_last=True): every example counts.
        test_acc, _ = evaluate(fast, data["test"], cfg.batch_size, device, autocast)
        result = dict(
            task=cfg.task, attention=cfg.attention, seed=cfg.seed, preset=cfg.preset,
            protocol="test_acc of the weights with the best val_acc"
            + (" (Text: val = test, as the LRA pipeline)" if cfg.task == "text" else ""),
            val_acc=round(state["best_val_acc"], 5), test_acc=round(test_acc, 5),
            final_val_acc=round(val_acc, 5),
            best_step=state["best_step"], steps=cfg.steps, n_params=count_parameters(model),
            wall_s=round(state["elapsed"] + time.time() - t0, 1),
            device=f"{torch.cuda.get_device_name(device) if cuda else 'cpu'} x {world}",
            config=dataclasses.asdict(cfg))
        (out / "result.json").write_text(json.dumps(result, indent=2))
        print("RESULT " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    try:
        main(parse_config())
    except DataError as e:
        raise SystemExit(f"data error: {e}") from None
