"""
train_lra.py: train one attention mechanism on one Long Range Arena task.

    python train_lra.py --preset quick --attention agf         # small generated ListOps, a CPU
    python train_lra.py --task listops --attention agf         # the papers' setting, a GPU
    torchrun --standalone --nproc_per_node 4 train_lra.py --task image --attention primal
    python train_lra.py --task listops --attention agf --resume    # continue an interrupted run
    python train_lra.py --task text --attention primal --help  # the values that run would take

Read top to bottom: the settings (the flags, and the values each task's preset gives them), the
data, the model and its optimizer, a training step, an evaluation, and main, which runs them.
Data (--data-dir): the LRA release layout (gs://long-range-arena/lra_release), IMDB and CIFAR-10
beside it, or PyTorch-LRA pickles (lra_data.py); ListOps is generated (seeded) when missing, and
--download fetches a task's folder when missing (lra_data.ARCHIVES: the URLs, what is kept).
`python lra_data.py --task <task> --download` does all that alone: the run then reads its file.
Protocol: every eval_every steps the model is evaluated on the validation split; the weights
that score best there are kept (best.pt) and the test split is evaluated once, with them.
--time-limit S stops at the last evaluation that ends within S seconds (a GPU call of fixed
length); the result then says partial, with steps_reached.
Output: runs/<task>/<attention>-<preset>-seed<seed>/ (see runs.py); last line: RESULT {json}
"""

import os
import pathlib
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import runs
from agf import VARIANTS
from gfsa import HIGH_ORDER
from lra_data import LISTOPS_PAPER, PATHFINDER_DIRS, load_task
from lra_readers import N_CLASSES, VOCAB, DataError, Split
from model import ATTENTION, Classifier, ModelConfig, count_parameters
from runs import flag


# 1. Settings -----------------------------------------------------------------------------------
@dataclass
class TrainConfig(runs.Settings):  # + runs.Settings: --attention, --seed, --lr, the model, ...
    task: str = flag("listops", "the LRA task; its preset: TASKS, MECHANISMS")
    pathfinder: str = flag("hard", "Pathfinder: easy | intermediate | hard (the papers' choice)")
    cache: bool = flag(True, "keep the arrays read in <data-dir>/lra-cache (--no-cache: read anew)")
    steps: int = flag(None, "optimizer steps (a new value rescales the preset's warm-up)", 1)
    warmup: int = flag(None, "linear warm-up steps: 0, or 2 .. steps - 1", 0)
    max_len: int = flag(None, "tokens per input; longer inputs are cut", 1)
    time_limit: float = flag(0.0, "seconds of this start: stop at the last evaluation in them", 0)
    data_seed: int = flag(0, "seed of the ListOps generator", 0, runs.SEEDS)
    listops_size: int = flag(96000, "generated ListOps: training examples", 1)
    listops_eval_size: int = flag(2000, "generated ListOps: validation, test examples each", 1)


# The flags both scripts have (runs.Settings) take these values here: the three papers' LRA setting
# (lra_config.py: D 64, H 2, 2 layers, feed-forward 128, dropout 0.1 in the blocks and on the
# softmax and GFSA attention weights); AGF's and Primal's are ListOps', for the other attentions.
PAPER = dict(attention="agf", preset="paper", data_dir="data", download=False, download_url="")
PAPER.update(seed=0, lr=1e-4, d_model=64, n_heads=2, n_layers=2, d_ff=128, dropout=0.1)
PAPER.update(agf_order=5, agf_alpha=2.0, agf_beta=-1.0, agf_gamma=0.01, agf_variant="agf")
PAPER.update(primal_rank=20, primal_eta=0.1, gfsa_order=2, gfsa_high_order="taylor")
# Per task, the schedule of the PyTorch LRA code that all three papers use (mlpen/Nystromformer
# LRA/code/lra_config.py, reused by PrimalAttention and AGF_LRA). Text: 1000 tokens as LRA's
# base_tc_config; `--max-len 4000` for Primal-Attention's "Text (4K)" label (NOTES.md says more).
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
    "paper": LISTOPS_PAPER,  # listops-1000, 500 < tokens < 2000, depth 10, 16 shards
    "quick": dict(folder="listops-quick", min_length=20, max_length=100, max_depth=3, max_args=5),
}


def presets(given: dict, error) -> dict:
    """The values of the flags for the flags given: PAPER, the task's, the attention's for the
    task, then --preset quick's; the warm-up rescaled to a --steps given."""
    task, preset = given.get("task", TrainConfig.task), given.get("preset", PAPER["preset"])
    if preset == "quick" and task != "listops":
        error("--preset quick is a small generated ListOps: use it with --task listops")
    attention = given.get("attention", PAPER["attention"])
    values = {**PAPER, **TASKS[task], **MECHANISMS.get((attention, task), {})}
    values.update(QUICK if preset == "quick" else {})
    if "steps" in given and "warmup" not in given:  # keep the preset's warm-up fraction
        warmup = round(values["warmup"] * given["steps"] / values["steps"])
        warmup = 2 if warmup == 1 else warmup  # OneCycleLR cannot warm up in 1 step
        values["warmup"] = warmup if warmup < given["steps"] else 0  # too short to warm up
    warmup, steps = given.get("warmup", values["warmup"]), given.get("steps", values["steps"])
    if steps > 0 and (warmup == 1 or warmup >= steps):  # (--steps 0 is refused as it is)
        error(f"--warmup must be 0 or 2 .. --steps - 1 = {steps - 1}, got {warmup}")
    return values


def parse_config(argv=None) -> TrainConfig:
    """The flags (or `argv`) -> TrainConfig: PAPER < the presets < the flags, all checked here."""
    choices = dict(task=list(TASKS), attention=(*ATTENTION, "primal+trans"), preset=list(LISTOPS))
    choices.update(agf_variant=VARIANTS, gfsa_high_order=HIGH_ORDER, pathfinder=PATHFINDER_DIRS)
    out = "runs/{task}/{attention}-{preset}-seed{seed}"  # where --out is not given
    each = {task: dict(task=task, preset="paper") for task in TASKS}  # shown by --help
    each["quick"] = dict(task="listops", preset="quick")
    return runs.parse(TrainConfig, __doc__, choices, presets, out, argv, each)


DATA_FLAGS = dict(pathfinder="pathfinder", data_seed="listops")  # the task whose data each reads
DATA_FLAGS.update(listops_size="listops", listops_eval_size="listops")


def unused_flags(cfg: TrainConfig) -> list:
    """A note for each data flag set away from its default that cfg.task's data does not read."""
    notes = []
    for name, task in DATA_FLAGS.items():
        value = getattr(cfg, name)
        if task != cfg.task and value != getattr(TrainConfig, name):
            flag_name = "--" + name.replace("_", "-")
            notes.append(f"{flag_name} {value}: unused, as only --task {task} reads it")
    return notes


# 2. Data, 3. the model and its optimizer -------------------------------------------------------
def to_batch(split: Split, idx: np.ndarray, device) -> dict:
    """Examples idx as tensors on `device`: ids x, bool mask (B, N), labels y [, x2, mask2]."""
    batch = {k: torch.from_numpy(v) for k, v in split.batch(idx).items()}
    if torch.device(device).type == "cuda":  # from pinned memory, without waiting for the GPU
        batch = {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return batch


def build(cfg: TrainConfig, device: torch.device) -> tuple:
    """-> (model, AdamW, OneCycleLR, GradScaler), with the same initial weights in every process."""
    torch.manual_seed(cfg.seed)
    agf = dict(order=cfg.agf_order, basis="jacobi", alpha=cfg.agf_alpha, beta=cfg.agf_beta)
    agf.update(ortho_weight=cfg.agf_gamma, fix_theta0=True, variant=cfg.agf_variant)
    # the LRA code samples m = s · rank_multi tokens, rank_multi = 10; KSVD loss of batch means
    ksvd = dict(rank=cfg.primal_rank, rank_multi=10, ksvd_weight=cfg.primal_eta)
    ksvd.update(ksvd_reduction="batch")
    gfsa = dict(order=cfg.gfsa_order, dropout=cfg.dropout, high_order=cfg.gfsa_high_order)
    kwargs = dict(agf=agf, primal=ksvd, gfsa=gfsa)  # each attention's, passed on by model.py
    arch = dict(n_classes=N_CLASSES[cfg.task], max_len=cfg.max_len, vocab_size=VOCAB[cfg.task])
    arch.update(style="lra", two_tower=cfg.task == "retrieval", d_model=cfg.d_model)
    arch.update(n_heads=cfg.n_heads, n_layers=cfg.n_layers, d_ff=cfg.d_ff, dropout=cfg.dropout)
    arch.update(attn_dropout=cfg.dropout, attention=cfg.attention, attention_kwargs=kwargs)
    model = Classifier(ModelConfig(**arch)).to(device)
    # fused on CUDA (one kernel for every parameter: fewer launches), as nanoGPT; same update
    adamw = dict(eps=1e-6, weight_decay=0, fused=device.type == "cuda")
    opt = torch.optim.AdamW(model.parameters(), cfg.lr, (0.9, 0.999), **adamw)
    # As the official code: linear warm-up lr/25 -> lr, linear decay -> lr/25e4, β₁ 0.95 <-> 0.85
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, cfg.lr, cfg.steps, anneal_strategy="linear", pct_start=cfg.warmup / cfg.steps
    )
    fp16 = device.type == "cuda" and cfg.amp and not torch.cuda.is_bf16_supported()
    return model, opt, sched, torch.amp.GradScaler("cuda", enabled=fp16)  # bf16 needs no scaling


# 4. A training step, an evaluation -------------------------------------------------------------
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
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # correct, loss: read at the end
    for start in tqdm(range(0, n, batch_size), desc="evaluating", leave=False, disable=None):
        batch = to_batch(split, np.arange(start, min(start + batch_size, n)), device)
        with autocast:
            logits, _ = model(batch["x"], batch["mask"], batch.get("x2"), batch.get("mask2"))
        loss = F.cross_entropy(logits.float(), batch["y"], reduction="sum")
        sums += torch.stack([(logits.argmax(-1) == batch["y"]).sum().double(), loss.double()])
    model.train()
    return tuple((sums / n).tolist())  # (accuracy, mean loss)


def _expected_finish(cfg: TrainConfig, first_step: int, step: int, per_step: float) -> str:
    """The seconds a step has taken in this start (from first_step; evaluations included), and
    when the run will end: at cfg.steps, or near the step where --time-limit stops it."""
    minutes = per_step * (cfg.steps - step) / 60
    said = f"{per_step * 1e3:.0f} ms a step: step {cfg.steps} in about {minutes:.1f} more min"
    last = int(first_step + cfg.time_limit / per_step) // cfg.eval_every * cfg.eval_every
    if cfg.time_limit > 0 and last < cfg.steps:
        said += f"; --time-limit {cfg.time_limit:g} s stops it near step {max(last, step)}"
    return said


# 5. main: the run folder, the data, the model, the loop, the test ------------------------------
def main(cfg: TrainConfig) -> dict:
    """Train, keep the weights that score best on validation, test them -> the result dict."""
    # 1) the run folder, locked and checked before anything is read or written, the settings
    # printed; then the processes: torchrun starts one per GPU (or per share of a CPU)
    again = ("download", "download_url", "cache", "time_limit")  # --resume may change these
    rank, world, device, autocast, ckpt = runs.start(cfg, "train_lra.py", "step", cfg.steps, again)
    ddp, master, out = "RANK" in os.environ, rank == 0, pathlib.Path(cfg.out)
    if master and (cfg.task, cfg.preset, device.type) == ("listops", "paper", "cpu"):
        print("note: the paper preset is the GPU setting: on a CPU, --preset quick", flush=True)

    # 2) data; rank 0 first, as it may generate ListOps or download, then the others read it
    n_eval = cfg.listops_eval_size
    listops = dict(LISTOPS[cfg.preset], train=cfg.listops_size, val=n_eval, test=n_eval)
    if ddp and not master:
        dist.barrier()
    data_args = dict(task=cfg.task, data_dir=cfg.data_dir, max_len=cfg.max_len, seed=cfg.data_seed)
    pathfinder_dir = PATHFINDER_DIRS[cfg.pathfinder]  # data_args: checkpointed, read by diagnose.py
    data_args.update(listops=listops, pathfinder_dir=pathfinder_dir, cache=cfg.cache)
    preset_len = (QUICK if cfg.preset == "quick" else TASKS[cfg.task])["max_len"]
    # --download: rank 0 only; a --download-url alone implies it (a mirror, a file:// copy)
    fetch = cfg.download_url if master and (cfg.download or cfg.download_url) else None
    data, notes = load_task(**data_args, padding_note=cfg.max_len != preset_len, download=fetch)
    if ddp and master:
        dist.barrier()
    for note in [*notes, *unused_flags(cfg)] if master else ():
        print(note, flush=True)
    n_train = len(data["train"].y)
    if n_train < cfg.batch_size:
        raise DataError(f"the training split has {n_train} examples, fewer than one batch")

    # 3) model, optimizer, schedule: fresh, or as the interrupted run left them, its data checked
    model, opt, sched, scaler = build(cfg, device)
    parts = dict(model=model, optimizer=opt, scheduler=sched, scaler=scaler)
    state = dict(step=0, best_val_acc=-1.0, best_step=0, val_acc=None, elapsed=0.0)
    about = dict(script="train_lra.py", data=data_args)  # in the checkpoints, for diagnose.py
    arrays = {f"{k} {f}": v for k, s in data.items() for f, v in vars(s).items() if f != "cut"}
    fast, net = runs.prepare(cfg, ckpt, parts, state, about, arrays)

    # 4) train. Batch k is a function of (seed, k) alone, so a resumed run sees the batches it
    # would have seen; each process takes its share of every batch.
    hide = not master or None  # None: shown on a terminal only
    bar = tqdm(total=cfg.steps, initial=state["step"], desc=cfg.attention, disable=hide)
    sums = torch.zeros(3, device=device)
    first_step, elapsed_before, t0 = state["step"], state["elapsed"], time.time()  # this start's
    while state["step"] < cfg.steps:
        epoch, k = divmod(state["step"], n_train // cfg.batch_size)
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
        train_loss, train_acc = runs.means(sums, f"at step {step}")  # of all processes
        val_acc, val_loss = evaluate(fast, data["val"], cfg.batch_size, device, autocast)
        state["val_acc"] = round(val_acc, 5)
        if val_acc > state["best_val_acc"]:  # the first of equal scores is kept
            state.update(best_val_acc=val_acc, best_step=step)
            if master:
                best = dict(model=model.state_dict(), step=step, val_acc=val_acc, **about)
                runs.save(out / "best.pt", best)
        state["elapsed"] += time.time() - t0
        t0 = time.time()
        # --time-limit: stop here when the next evaluation would end past the limit, in this
        # start's seconds (the result then says partial, with the step reached)
        per_step = (state["elapsed"] - elapsed_before) / (step - first_step)  # evaluations too
        late = state["elapsed"] - elapsed_before + cfg.eval_every * per_step > cfg.time_limit
        stop = torch.tensor(float(cfg.time_limit > 0 and late), device=device)
        if ddp:
            dist.broadcast(stop, 0)  # rank 0's clock decides for every process
        if master and step - first_step <= cfg.eval_every:  # the first evaluation of this start
            tqdm.write(_expected_finish(cfg, first_step, step, per_step), file=sys.stdout)
        record = dict(step=step, lr=lr, train_loss=round(train_loss, 5))
        record.update(train_acc=round(train_acc, 5), val_acc=round(val_acc, 5))
        record.update(val_loss=round(val_loss, 5), time_s=round(state["elapsed"], 1))
        bar.set_postfix(loss=record["train_loss"], val=record["val_acc"])
        line = runs.log(out, parts, state, about, record)  # the checkpoint, metrics.jsonl
        if line and bar.disable:  # no bar (not a terminal: a log file, CI, nohup): a line instead
            print(line, flush=True)
        if stop.item():
            break
    bar.close()
    if master and state["step"] < cfg.steps:
        print(f"--time-limit {cfg.time_limit:g} s: stopped at step {state['step']}", flush=True)

    # 5) test once (rank 0), with the weights that scored best on validation. A run stopped
    # after its last checkpoint but before this ends here on --resume. Text: the test split is
    # the validation split (as officially), where those weights scored best_val_acc already.
    result, test_acc = None, state["best_val_acc"]
    if master and data["val"] is not data["test"]:
        model.load_state_dict(runs.load(out / "best.pt")["model"])
        # NOTE: differs from the official test loader (drop_last=True): every example counts.
        test_acc, _ = evaluate(fast, data["test"], cfg.batch_size, device, autocast)
    if master:
        text = " (Text: val = test, as the LRA pipeline)" if cfg.task == "text" else ""
        result = dict(task=cfg.task, attention=cfg.attention, seed=cfg.seed, preset=cfg.preset)
        result.update(protocol=f"test_acc of the weights with the best val_acc{text}")
        result.update(val_acc=round(state["best_val_acc"], 5), test_acc=round(test_acc, 5))
        result.update(final_val_acc=state["val_acc"], best_step=state["best_step"], steps=cfg.steps)
        # partial: stopped by --time-limit before cfg.steps; steps_reached says where
        result.update(steps_reached=state["step"], partial=state["step"] < cfg.steps)
        wall_s = round(state["elapsed"] + time.time() - t0, 1)
        result.update(n_params=count_parameters(model), wall_s=wall_s, config=about["config"])
    return runs.finish(out, result, device)  # result.json, and RESULT {json} as the last line


if __name__ == "__main__":
    runs.run(main, parse_config(), "step", DataError)
