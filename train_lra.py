"""
train_lra.py: train one attention mechanism on one Long Range Arena task.

    python train_lra.py --preset quick --attention agf        # CPU, a few minutes, no download
    python train_lra.py --task listops --attention agf        # the papers' setting, CUDA GPU
    torchrun --nproc_per_node 4 train_lra.py --task image --attention primal   # several GPUs
    python train_lra.py --task listops --attention agf --resume true          # continue a run

Tasks and data (DESIGN.md "One command-line vocabulary"; formats: spec DATA.md §1). `--data-dir`
holds the LRA release layout plus two standard downloads beside it:
    listops   listops-1000/basic_{train,val,test}.tsv   generated here when missing (seeded)
    text      aclImdb/{train,test}/{pos,neg}/*.txt      IMDB reviews, bytes + 1 (val = test)
    retrieval tsv_data/new_aan_pairs.{train,eval,test}.tsv   AAN pairs, two towers
    image     cifar-10-batches-py/{data_batch_1..5,test_batch}   CIFAR-10 -> grayscale
    pathfinder  pathfinder32/curv_contour_length_14/{metadata/*.npy, imgs/*/sample_*.png}
or the pickles made by the PyTorch LRA code (Nystromformer, Skyformer, Primal-Attention, AGF):
`<data-dir>/<task>.{train,dev,test}.pickle` (pathfinder: pathfinder32-curv_contour_length_14.*).
The release comes from gs://long-range-arena/lra_release (lra_release.gz); IMDB from
ai.stanford.edu/~amaas/data/sentiment; CIFAR-10 (python version) from cs.toronto.edu/~kriz.
Nothing is downloaded by this script.

Protocol (DESIGN.md "Evaluation protocols"): every `eval_every` steps the model is evaluated on a
fixed subset of `eval_batches` dev batches; the weights with the best dev accuracy are kept and
the full test set is evaluated once with them at the end: RESULT has val_acc and test_acc.
Hyperparameters: TrainConfig below, filled by `preset()` from TASKS and MECHANISMS (paper) or
QUICK. Command line > preset > defaults.
Runs are split and continued with --stop-at k and --resume true; the continuation is exact.
The last line printed is  RESULT {json}  (the same content as <out>/result.json).

Measured with this code on 2 shared cores of a cloud VM (torch 2.13 CPU):
    --preset quick (generated ListOps: 6000 expressions of depth <= 3, 21-36 tokens, 1500
    steps): test accuracy softmax 32.2 %, agf 34.2 %, primal 33.0 % (chance 10 %, majority
    class 13 %); about 2 min with OMP_NUM_THREADS=1 (3.5 min with the default 2 threads on
    the busy machine: a tiny model gains nothing from threads).
    --task listops, paper preset (2000 tokens, batch 32), seconds per training step: softmax
    ~22, agf ~4.3, primal ~3.9, so 5000 steps take about 30 h / 6 h / 5.5 h on such a CPU:
    the paper presets are meant for a CUDA GPU.

Dims:  B batch, N tokens, D model width, H heads, d = D / H, C classes
Depends on: torch, numpy, tqdm, lra_data.py, model.py, train_common.py (and the mechanism
            files)
"""

import dataclasses
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from lra_data import N_CLASSES, VOCAB, DataError, Split, load_task
from model import Classifier, ModelConfig, count_parameters
from train_common import (
    RunDir,
    all_reduce_sum,
    autocast,
    flag,
    parse_config,
    resolve_device,
    rng_state,
    seed_everything,
    set_rng_state,
    setup_distributed,
    teardown_distributed,
)

# ----------------------------------------------------------------------------------------------
# 1. Configuration: one dataclass, the presets that fill it
# ----------------------------------------------------------------------------------------------

# Per task: data facts and the training schedule of the PyTorch LRA code shared by the three
# papers (Nystromformer lra_config.py = Primal-Attention = AGF; DATA.md §1.6, AGF.md §3.1,
# PRIMAL.md §4.1). max_len is the LRA max_length; the official arrays carry extra zero padding
# (2000 + 48 = 2048, ...), which changes nothing in our padding-invariant model and is left out.
# Text: 1000 as LRA base_tc_config, Nystromformer's pickles and AGF; `--max-len 4000` gives the
# "4K" setting of Skyformer's pickles and of Primal-Attention's Text numbers (DATA.md §1.3).
TASKS = {
    "listops": dict(
        max_len=2000, batch_size=32, warmup=1000, steps=5000, eval_every=50, eval_batches=62
    ),
    "text": dict(
        max_len=1000, batch_size=32, warmup=8000, steps=20000, eval_every=500, eval_batches=781
    ),
    "retrieval": dict(
        max_len=4000, batch_size=32, warmup=800, steps=30000, eval_every=300, eval_batches=565
    ),
    "image": dict(
        max_len=1024, batch_size=256, warmup=175, steps=35000, eval_every=175, eval_batches=20
    ),
    "pathfinder": dict(
        max_len=1024, batch_size=256, warmup=312, steps=62400, eval_every=312, eval_batches=312
    ),
}

# Per mechanism and task, from the official run scripts.
MECHANISMS = {
    # AGF_LRA/best_agf.sh (AGF.md §3.1): Jacobi order K, α, β, orthogonality weight γ
    "agf": {
        "listops": dict(agf_order=5, agf_alpha=2.0, agf_beta=-1.0, agf_gamma=0.01),
        "text": dict(agf_order=5, agf_alpha=2.0, agf_beta=-2.0, agf_gamma=0.01),
        "retrieval": dict(agf_order=5, agf_alpha=2.0, agf_beta=-1.5, agf_gamma=1e-4),
        "image": dict(agf_order=6, agf_alpha=1.5, agf_beta=2.0, agf_gamma=0.1),
        "pathfinder": dict(agf_order=4, agf_alpha=1.5, agf_beta=-1.0, agf_gamma=1e-4),
    },
    # PrimalFormer/bashes/run_tasks.sh (PRIMAL.md §4.1): rank s, KSVD weight η
    "primal": {
        "listops": dict(primal_rank=20, primal_eta=0.1),
        "text": dict(primal_rank=20, primal_eta=0.05),
        "retrieval": dict(primal_rank=30, primal_eta=0.0),
        "image": dict(primal_rank=30, primal_eta=0.1),
        "pathfinder": dict(primal_rank=30, primal_eta=0.1),
    },
    # Primal.+Trans./bashes/run_tasks.sh (PRIMAL.md §4.1)
    "primal+trans": {
        "listops": dict(primal_rank=30, primal_eta=0.05),
        "text": dict(primal_rank=30, primal_eta=0.1),
        "retrieval": dict(primal_rank=20, primal_eta=0.05),
        "image": dict(primal_rank=30, primal_eta=0.1),
        "pathfinder": dict(primal_rank=20, primal_eta=0.05),
    },
}
# GFSA has no LRA scripts (GFSA.md §6.2): our choice is K = 2 (H = w0·I + w1·Ā + wK·Ā², the
# spec's default) on every layer, with the softmax baseline's attention dropout 0.1.

# A small ListOps that trains in minutes on a laptop CPU (measured numbers: README): short
# expressions of depth <= 3, so the task can be learned from 6k examples. Same model as paper.
QUICK = dict(
    listops_dir="listops-quick",
    listops_size=6000,
    listops_eval_size=500,
    listops_min_len=20,
    listops_max_len=100,
    listops_depth=3,
    listops_args=5,
    max_len=100,
    lr=1e-3,
    steps=1500,
    warmup=150,
    eval_every=100,
    eval_batches=16,
    batch_size=32,
)


@dataclass
class TrainConfig:
    """Every knob of a run. The preset fills the task-dependent fields; flags override it."""

    task: str = flag("listops", "listops | text | retrieval | image | pathfinder")
    attention: str = flag("agf", "softmax | agf | primal | primal+trans | gfsa")
    preset: str = flag("paper", "paper (official settings per task) | quick (small ListOps, CPU)")
    data_dir: str = flag("data", "LRA release layout, aclImdb/ and cifar-10-batches-py/ inside")
    out: str = flag("", "run folder; default runs/<task>/<attention>-seed<seed>")
    seed: int = flag(0, "seed of the model init, dropout and the data order")
    device: str = flag("auto", "auto | cpu | cuda | cuda:<k>")
    amp: bool = flag(True, "mixed precision on CUDA (bf16 where supported, else fp16)")
    resume: bool = flag(False, "continue from <out>/checkpoint.pt")
    stop_at: int = flag(0, "end this process after this step (then --resume true); 0 = never")
    # optimisation (official: AdamW, lr 1e-4, betas (0.9, 0.999), eps 1e-6, wd 0, OneCycleLR)
    steps: int = flag(5000, "optimizer steps (a new value also rescales the preset's warmup)")
    warmup: int = flag(1000, "OneCycleLR warm-up steps (pct_start = warmup / steps)")
    lr: float = flag(1e-4, "peak learning rate")
    batch_size: int = flag(32, "global batch (all processes and accumulation steps together)")
    accumulate: int = flag(1, "split each batch into this many micro-batches (small GPUs)")
    eval_every: int = flag(50, "evaluate on the dev subset every this many steps")
    eval_batches: int = flag(62, "size of the dev subset, in batches")
    max_len: int = flag(2000, "tokens per input (position table size); longer inputs are cut")
    # model (the LRA setting of the three papers)
    d_model: int = flag(64, "D")
    n_heads: int = flag(2, "H")
    n_layers: int = flag(2, "layers")
    d_ff: int = flag(128, "feed-forward width")
    dropout: float = flag(0.1, "dropout (also the softmax and GFSA attention dropout)")
    # mechanisms (preset per task from the official scripts)
    agf_order: int = flag(5, "AGF polynomial order K")
    agf_alpha: float = flag(2.0, "AGF Jacobi α")
    agf_beta: float = flag(-1.0, "AGF Jacobi β")
    agf_gamma: float = flag(0.01, "AGF orthogonality weight γ")
    primal_rank: int = flag(20, "Primal-Attention rank s")
    primal_eta: float = flag(0.1, "Primal-Attention KSVD weight η")
    gfsa_order: int = flag(2, "GFSA order K")
    # data
    data_seed: int = flag(0, "seed of the ListOps generator, the Pathfinder split, dev subset")
    listops_dir: str = flag("listops-1000", "ListOps folder under --data-dir")
    listops_size: int = flag(96000, "generated ListOps: training examples")
    listops_eval_size: int = flag(2000, "generated ListOps: examples in val and in test, each")
    listops_min_len: int = flag(500, "generated ListOps: length > this (tokens, no parentheses)")
    listops_max_len: int = flag(2000, "generated ListOps: length < this")
    listops_depth: int = flag(10, "generated ListOps: maximum tree depth")
    listops_args: int = flag(10, "generated ListOps: maximum arguments per operator (>= 2)")
    pathfinder_dir: str = flag("pathfinder32/curv_contour_length_14", "under --data-dir")


def preset(given: dict) -> dict:
    """The preset values for the task, attention and preset named in `given` (the flags)."""
    task = given.get("task", TrainConfig.task)
    attention = given.get("attention", TrainConfig.attention)
    name = given.get("preset", TrainConfig.preset)
    if task not in TASKS:
        raise SystemExit(f"--task {task!r}: choose from {sorted(TASKS)}")
    values = dict(lr=1e-4, **TASKS[task], **MECHANISMS.get(attention, {}).get(task, {}))
    if name == "quick":
        if task != "listops":
            raise SystemExit("--preset quick is a small generated ListOps: use --task listops")
        values.update(QUICK)
    elif name != "paper":
        raise SystemExit(f"--preset {name!r}: choose 'paper' or 'quick'")
    if "steps" in given and "warmup" not in given:  # keep the preset's warm-up fraction
        warmup = round(values["warmup"] * given["steps"] / values["steps"])
        values["warmup"] = 2 if warmup == 1 else warmup  # see build(): 1 is not allowed
    return values


def attention_kwargs(cfg: TrainConfig) -> dict:
    """Constructor arguments of each attention kind (ModelConfig.attention_kwargs)."""
    return {
        "agf": dict(
            order=cfg.agf_order,
            basis="jacobi",
            alpha=cfg.agf_alpha,
            beta=cfg.agf_beta,
            ortho_weight=cfg.agf_gamma,
            fix_theta0=True,
        ),
        # LRA code: m = s · rank_multi sampled tokens, rank_multi = 10; KSVD loss on batch means
        "primal": dict(
            rank=cfg.primal_rank, rank_multi=10, ksvd_weight=cfg.primal_eta, ksvd_reduction="batch"
        ),
        "gfsa": dict(order=cfg.gfsa_order, dropout=cfg.dropout),
    }


# ----------------------------------------------------------------------------------------------
# 2. Batches: a seeded permutation per epoch, a pure function of (seed, step) so resume is exact
# ----------------------------------------------------------------------------------------------


def forever(n: int, batch: int, seed: int, start_step: int) -> Iterator[np.ndarray]:
    """Example indices of each training batch from `start_step` on, epoch after epoch.

    Epoch e visits the examples in the order np.random.default_rng([seed, e]).permutation(n)
    and drops the last partial batch, so batch k is the same whether or not the run stopped.
    """
    # The pair [seed, epoch] seeds its own stream; seed + epoch would give seed 1 the epochs
    # of seed 0 shifted by one.
    per_epoch = n // batch
    if per_epoch == 0:
        raise DataError(f"the training split has {n} examples, fewer than one batch ({batch})")
    epoch, first = divmod(start_step, per_epoch)
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(n)
        for k in range(first, per_epoch):
            yield order[k * batch : (k + 1) * batch]
        epoch, first = epoch + 1, 0


def to_tensors(split: Split, idx: np.ndarray) -> dict:
    """Model inputs and labels for the examples `idx` (x, mask, [x2, mask2], y), on the CPU."""
    positions = np.arange(split.x.shape[1])  # mask = position < length: real tokens come first
    batch = {"x": split.x[idx], "mask": positions < split.lengths[idx, None], "y": split.y[idx]}
    if split.x2 is not None:
        batch.update(x2=split.x2[idx], mask2=positions < split.lengths2[idx, None])
    # ids and labels as int64 (what nn.Embedding and cross_entropy take), masks stay bool
    return {
        k: torch.as_tensor(v if k.startswith("mask") else v.astype(np.int64))
        for k, v in batch.items()
    }


# ----------------------------------------------------------------------------------------------
# 3. Training
# ----------------------------------------------------------------------------------------------


@dataclass
class Trainer:
    """What a run updates: the model (DDP-wrapped under torchrun), optimizer, schedule, scaler."""

    model: torch.nn.Module
    plain: torch.nn.Module  # the model without the DDP wrapper (for its state_dict)
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler


def build(cfg: TrainConfig, device: torch.device, world: int) -> Trainer:
    """Model (DDP-wrapped when world > 1), AdamW, OneCycleLR and the fp16 GradScaler."""
    seed_everything(cfg.seed)  # the same initial weights on every process
    model_cfg = ModelConfig(
        n_classes=N_CLASSES[cfg.task],
        max_len=cfg.max_len,
        vocab_size=VOCAB[cfg.task],
        style="lra",
        d_model=cfg.d_model,
        n_heads=cfg.n_heads,
        n_layers=cfg.n_layers,
        d_ff=cfg.d_ff,
        dropout=cfg.dropout,
        attn_dropout=cfg.dropout,
        attention=cfg.attention,
        attention_kwargs=attention_kwargs(cfg),
        two_tower=cfg.task == "retrieval",
    )
    plain = Classifier(model_cfg).to(device)
    model = plain
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(plain, device_ids=ids)
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0
    )
    # OneCycleLR divides by (warm-up steps - 1) and by the decay steps: both must be > 0.
    if cfg.warmup == 1 or not 0 <= cfg.warmup < cfg.steps:
        raise SystemExit(f"--warmup {cfg.warmup}: use 0 or 2 .. --steps - 1 = {cfg.steps - 1}")
    # As the official code: linear warm-up from lr/25 to lr, linear decay to lr/25e4, and the
    # default β₁ cycling between 0.95 and 0.85 (OneCycleLR's cycle_momentum=True).
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt,
        max_lr=cfg.lr,
        total_steps=cfg.steps,
        pct_start=cfg.warmup / cfg.steps,
        anneal_strategy="linear",
    )
    fp16 = device.type == "cuda" and cfg.amp and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)  # bf16 needs no loss scaling
    return Trainer(model, plain, opt, sched, scaler)


def run_model(model: torch.nn.Module, batch: dict, device: torch.device) -> tuple:
    """-> (logits (B, C), aux_loss (), labels (B,)) for one batch (one or two towers)."""
    b = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    logits, aux = model(b["x"], b["mask"], b.get("x2"), b.get("mask2"))
    return logits, aux, b["y"]


def train_step(t: Trainer, batch: dict, cfg: TrainConfig, device: torch.device) -> list:
    """One optimizer step over `accumulate` micro-batches -> [loss sum, correct, count]."""
    # Equal micro-batches (batch_size is a multiple of accumulate), so the mean of their mean
    # losses is the batch mean. A loss that is not a mean over examples is computed per micro-
    # batch (Primal's "batch" KSVD loss squares a batch mean), as in the official code.
    loss_sum = correct = 0.0
    for i in range(cfg.accumulate):
        chunk = {k: v[i :: cfg.accumulate] for k, v in batch.items()}
        last = i == cfg.accumulate - 1  # DDP: all-reduce the gradients once, after the last
        no_sync = t.model.no_sync() if t.model is not t.plain and not last else nullcontext()
        with no_sync:
            with autocast(device, cfg.amp):  # the forward only: backward runs outside autocast
                logits, aux, y = run_model(t.model, chunk, device)
                # aux is already weighted inside each attention module (γ for AGF, η for
                # Primal, 0 for softmax and GFSA): added as it is, no second weight here.
                loss = F.cross_entropy(logits.float(), y) + aux
            t.scaler.scale(loss / cfg.accumulate).backward()
        loss_sum += loss.detach() * len(y)
        correct += (logits.argmax(-1) == y).sum()
    t.scaler.step(t.opt)
    t.scaler.update()
    t.opt.zero_grad(set_to_none=True)
    t.sched.step()
    return [loss_sum, correct, len(batch["y"])]


@torch.no_grad()
def evaluate(t: Trainer, split: Split, idx: np.ndarray, cfg: TrainConfig, device, world) -> float:
    """Accuracy on the examples `idx`, each process taking every world-th one."""
    rank, micro = dist.get_rank() if world > 1 else 0, cfg.batch_size // world // cfg.accumulate
    # The model without its DDP wrapper: the processes may see different numbers of batches
    # here, and the wrapper would wait for the others at each forward.
    t.plain.eval()
    correct = count = 0
    mine = idx[rank::world]
    for start in range(0, len(mine), micro):
        with autocast(device, cfg.amp):
            batch = to_tensors(split, mine[start : start + micro])
            logits, _, y = run_model(t.plain, batch, device)
        correct += (logits.argmax(-1) == y).sum().item()
        count += len(y)
    t.plain.train()
    correct, count = all_reduce_sum([correct, count], device)  # each process counted its share
    return correct / max(count, 1)


def save_checkpoint(run: RunDir, t: Trainer, state: dict, cfg: TrainConfig, device, world):
    """Everything an exact resume needs; the data order is a function of (seed, step)."""
    rngs = [rng_state()]  # the dropout RNG differs per process: keep every process's state
    if world > 1:
        rngs = [None] * world
        dist.all_gather_object(rngs, rng_state())
    # the training-loss sums since the last evaluation, over all processes (kept by rank 0)
    sums = all_reduce_sum([float(x) for x in state["sums"]], device)
    run.save(
        dict(
            model=t.plain.state_dict(),
            optimizer=t.opt.state_dict(),
            scheduler=t.sched.state_dict(),
            scaler=t.scaler.state_dict(),
            state=dict(state, sums=sums),
            rng=rngs,
            config=dataclasses.asdict(cfg),
        )
    )


def load_checkpoint(run: RunDir, t: Trainer, cfg: TrainConfig, rank: int) -> dict:
    """Restore a run saved by save_checkpoint -> its progress state."""
    ckpt = run.load()
    # Settings that may change on resume; any other change would not continue the same run.
    free = {"resume", "stop_at", "device", "out"}
    now = dataclasses.asdict(cfg)
    changed = {k: (v, now[k]) for k, v in ckpt["config"].items() if k not in free and now[k] != v}
    if changed:
        raise SystemExit(f"--resume: the run at {run.path} used other settings: {changed}")
    t.plain.load_state_dict(ckpt["model"])
    t.opt.load_state_dict(ckpt["optimizer"])
    t.sched.load_state_dict(ckpt["scheduler"])
    t.scaler.load_state_dict(ckpt["scaler"])
    set_rng_state(ckpt["rng"][rank % len(ckpt["rng"])])
    state = ckpt["state"]
    if rank != 0:  # rank 0 carries the loss sums of all processes
        state["sums"] = [0.0, 0.0, 0]
    run.truncate_log(lambda record: record["step"] <= state["step"])  # drop lines after it
    return state


def train(cfg: TrainConfig, t: Trainer, data: dict, run: RunDir, state: dict, device, world):
    """The training loop from state["step"] on; evaluates, keeps best.pt, checkpoints."""
    rank, per_rank = run.rank, cfg.batch_size // world
    # The dev subset: the first eval_batches batches of a fixed permutation (the same for
    # every evaluation and seed). NOTE: differs from the official code, whose endless dev
    # iterator shows each evaluation other batches, because a fixed subset compares
    # checkpoints on equal terms. For the paper presets it covers (nearly) the whole dev split.
    val_idx = np.random.default_rng(cfg.data_seed).permutation(len(data["val"].y))
    val_idx = val_idx[: cfg.eval_batches * cfg.batch_size]
    batches = forever(len(data["train"].y), cfg.batch_size, cfg.seed, state["step"])
    bar = tqdm(total=cfg.steps, initial=state["step"], disable=rank != 0, desc=cfg.attention)
    t0 = time.time()
    while state["step"] < cfg.steps:
        idx = next(batches)[rank * per_rank : (rank + 1) * per_rank]  # this process's share
        lr = t.opt.param_groups[0]["lr"]  # the rate this step uses
        out = train_step(t, to_tensors(data["train"], idx), cfg, device)
        state["sums"] = [a + b for a, b in zip(state["sums"], out, strict=True)]
        state["step"] = step = state["step"] + 1
        state["elapsed"], t0 = state["elapsed"] + time.time() - t0, time.time()
        bar.update()
        if step == cfg.stop_at and step < cfg.steps:  # checkpoint between evaluations, leave
            save_checkpoint(run, t, state, cfg, device, world)
            break
        if step % cfg.eval_every and step != cfg.steps:
            continue
        val_acc = evaluate(t, data["val"], val_idx, cfg, device, world)
        loss_sum, n_correct, n = all_reduce_sum([float(x) for x in state["sums"]], device)
        state["sums"] = [0.0, 0.0, 0]
        if val_acc > state["best_acc"]:
            state.update(best_acc=val_acc, best_step=step)
            if rank == 0:
                torch.save(t.plain.state_dict(), run.path / "best.pt")
        record = dict(step=step, train_loss=round(loss_sum / n, 5), lr=lr)
        record.update(train_acc=round(n_correct / n, 5), val_acc=round(val_acc, 5))
        run.log({**record, "time_s": round(state["elapsed"], 1)})
        bar.set_postfix(loss=record["train_loss"], val=record["val_acc"])
        save_checkpoint(run, t, state, cfg, device, world)
    bar.close()
    state["elapsed"] += time.time() - t0
    return state


def main(cfg: TrainConfig) -> dict:
    """Train, select on the dev split, test the selected weights -> the result dict."""
    device = resolve_device(cfg.device)
    rank, world = setup_distributed(device)
    if cfg.batch_size % (world * cfg.accumulate):
        raise SystemExit(
            f"--batch-size {cfg.batch_size} is not divisible by processes x --accumulate "
            f"= {world * cfg.accumulate}"
        )
    if rank == 0:
        print(json.dumps(dataclasses.asdict(cfg)), flush=True)  # the resolved config first
    data = load_task(cfg, rank)  # before the run folder: missing data leaves no empty run
    quick = "-quick" if cfg.preset == "quick" else ""
    run = RunDir(cfg.out or f"runs/{cfg.task}{quick}/{cfg.attention}-seed{cfg.seed}", rank)
    run.write_config(cfg)
    t = build(cfg, device, world)
    if cfg.resume:
        state = load_checkpoint(run, t, cfg, rank)
    else:
        state = dict(step=0, best_acc=-1.0, best_step=0, elapsed=0.0, sums=[0.0, 0.0, 0])
        run.truncate_log(lambda record: False)  # a fresh run starts a fresh log
        torch.manual_seed(cfg.seed + rank)  # dropout: a different stream on each process
    state = train(cfg, t, data, run, state, device, world)
    if state["step"] < cfg.steps:  # --stop-at: the checkpoint is written, continue later
        return dict(stopped_at=state["step"], checkpoint=str(run.checkpoint))
    # Test once, with the weights that scored best on the dev subset.
    if world > 1:
        dist.barrier()  # rank 0 has written best.pt
    t.plain.load_state_dict(torch.load(run.path / "best.pt", map_location=device))
    # NOTE: differs from the official code (test loader with drop_last=True): every test
    # example counts, the last partial batch too.
    t0 = time.time()
    test_acc = evaluate(t, data["test"], np.arange(len(data["test"].y)), cfg, device, world)
    result = dict(
        task=cfg.task,
        attention=cfg.attention,
        seed=cfg.seed,
        preset=cfg.preset,
        protocol="LRA: weights selected by val_acc (dev subset), test_acc on the full test set"
        + (" (Text: val = test, as the official pipeline)" if cfg.task == "text" else ""),
        val_acc=round(state["best_acc"], 5),
        test_acc=round(test_acc, 5),
        best_step=state["best_step"],
        steps=cfg.steps,
        params=count_parameters(t.plain),
        wall_time_s=round(state["elapsed"] + time.time() - t0, 1),  # train + eval + test
        device=str(device),
        processes=world,
        config=dataclasses.asdict(cfg),
    )
    return run.finish(result)


def parse(argv: Optional[list] = None) -> TrainConfig:
    """The command line (or `argv`) -> TrainConfig.  defaults < preset < flags."""
    return parse_config(TrainConfig, preset, argv, __doc__)


if __name__ == "__main__":
    try:
        main(parse())
        teardown_distributed()
    except DataError as e:
        raise SystemExit(f"data error: {e}") from None
    finally:
        teardown_distributed(clean=False)  # a no-op after a clean teardown
