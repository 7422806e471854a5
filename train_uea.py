"""
train_uea.py: train one attention mechanism on one UEA multivariate time-series dataset.

    python train_uea.py --dataset JapaneseVowels --attention agf --preset quick  # small, a CPU
    python train_uea.py --dataset JapaneseVowels --attention agf     # the papers' setting
    torchrun --standalone --nproc_per_node 2 train_uea.py --dataset Heartbeat --attention primal
    python train_uea.py --dataset UWaveGestureLibrary --download     # fetch a missing dataset
    python train_uea.py --dataset Heartbeat --attention agf --help   # the values that run takes

Read top to bottom: the settings (the flags, and the values each dataset's preset gives them), the
data, the model and its optimizer, a training step, an evaluation, and main, which runs them.
Data (--data-dir): <Name>/<Name>_TRAIN.ts and _TEST.ts as in timeseriesclassification.com.
Protocol: best_test_acc, the papers' (Flowformer, Primal-Attention, AGF): the best TEST accuracy
of the evaluations (epoch 1, every 2nd, the last); beside it final_test_acc, the last, unselected.
Output: runs/<dataset>/<attention>-<preset>-seed<seed>/ (see runs.py); last line: RESULT {json}
"""

import os
import pathlib
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

import runs
import uea_data
from agf import VARIANTS
from gfsa import HIGH_ORDER
from model import ATTENTION, Classifier, ModelConfig, count_parameters
from polynomials import BASES
from runs import flag


# 1. Settings -----------------------------------------------------------------------------------
@dataclass
class TrainConfig(runs.Settings):  # + runs.Settings: --attention, --seed, --lr, the model, ...
    dataset: str = flag("JapaneseVowels", "UEA dataset name, e.g. JapaneseVowels, PEMS-SF")
    epochs: int = flag(None, "training epochs (may grow on --resume)", 1)
    optimizer: str = flag(None, "radam | adam (constant lr: the official lr_step 1e6 never acts)")
    grad_clip: float = flag(4.0, "largest gradient norm", 0)
    attn_dropout: float = flag(0.1, "dropout on the softmax and GFSA attention weights", 0, 1)
    max_len: int = flag(0, "time steps fed to the model; 0 = the longest TRAIN series", 0)
    attention_mask: bool = flag(True, "give the attention the padding mask (no = official code)")
    agf_basis: str = flag(None, "AGF: jacobi | legendre | chebyshev | chebyshev_t | monomial")
    agf_fix_theta0: bool = flag(None, "AGF: freeze θ̃_0 = 1 (official --fixI)")
    primal_rank_multi: int = flag(None, "Primal-Attention: m = min(N, s · rank_multi) samples", 1)
    gfsa_w0: float = flag(0.0, "GFSA: w0, the identity's coefficient")
    gfsa_learn_w0: bool = flag(False, "GFSA: learn w0 (official: fixed)")
    gfsa_learn_w1: bool = flag(False, "GFSA: learn w1 (official: fixed at 1)")


# The flags both scripts have (runs.Settings), and this script's that the presets set, take these
# values here: the official UEA code's options.py defaults (mvts, reused by Primal and AGF: batch
# 16, RAdam, lr 1e-3, TEST evaluated every 2nd epoch); GFSA has no UEA scripts: K = 3 is ours.
PAPER = dict(attention="softmax", preset="paper", data_dir="data/uea", download=False)
PAPER.update(download_url="", seed=666, lr=1e-3, batch_size=16, eval_every=2, epochs=100)
PAPER.update(optimizer="radam", d_model=512, n_heads=8, n_layers=2, d_ff=2048, dropout=0.1)
PAPER.update(agf_basis="legendre", agf_order=4, agf_alpha=1.0, agf_beta=0.2, agf_gamma=0.01)
PAPER.update(agf_fix_theta0=False, agf_variant="agf", primal_rank=40, primal_eta=0.5)
PAPER.update(primal_rank_multi=5, gfsa_order=3, gfsa_high_order="taylor")
# 100 epochs of RAdam but for these two (thuml/Flowformer scripts, PrimalAttention TimeSeries
# run_*.sh, agf AGF_UEA). AGF: run_agf_best.sh; no --alpha/--beta there: options.py's 1.0 / 0.2.
DATASETS = {"PEMS-SF": dict(epochs=400), "SpokenArabicDigits": dict(optimizer="adam")}
JACOBI = dict(agf_basis="jacobi", agf_gamma=0.1, agf_fix_theta0=True)  # shared by 7 of the 10
AGF = {
    "EthanolConcentration": dict(JACOBI, agf_order=6, agf_alpha=1.5, agf_beta=-1.5),
    "FaceDetection": dict(JACOBI, agf_order=9, agf_alpha=2.0, agf_beta=0.5),
    "Handwriting": dict(agf_basis="jacobi", agf_order=3, agf_gamma=0.01),
    "Heartbeat": dict(agf_basis="chebyshev", agf_order=6, agf_gamma=0.01),
    "JapaneseVowels": dict(agf_basis="legendre", agf_order=4, agf_gamma=0.01),
    "PEMS-SF": dict(JACOBI, agf_order=5, agf_alpha=1.5, agf_beta=2.0),
    "SelfRegulationSCP1": dict(JACOBI, agf_order=9, agf_alpha=1.5, agf_beta=1.0),
    "SelfRegulationSCP2": dict(JACOBI, agf_order=7, agf_alpha=2.0, agf_beta=1.5),
    "SpokenArabicDigits": dict(JACOBI, agf_order=4, agf_alpha=1.0, agf_beta=0.0, agf_gamma=0.5),
    "UWaveGestureLibrary": dict(JACOBI, agf_order=10, agf_alpha=2.0, agf_beta=1.5),
}
# Primal-Attention: PrimalAttention TimeSeries run_primalformer.sh ("primal") and
# run_primal_trans.sh ("primal+trans"): s = --low_rank, η = --eta (0 = no KSVD loss), rank_multi.
PRIMAL = {
    "primal": {
        "EthanolConcentration": dict(primal_rank=30, primal_eta=0.1, primal_rank_multi=10),
        "FaceDetection": dict(primal_rank=20, primal_eta=0.1, primal_rank_multi=5),
        "Handwriting": dict(primal_rank=30, primal_eta=0.2, primal_rank_multi=5),
        "Heartbeat": dict(primal_rank=30, primal_eta=0.5, primal_rank_multi=10),
        "JapaneseVowels": dict(primal_rank=40, primal_eta=0.5, primal_rank_multi=5),
        "PEMS-SF": dict(primal_rank=40, primal_eta=0.1, primal_rank_multi=5),
        "SelfRegulationSCP1": dict(primal_rank=30, primal_eta=0.5, primal_rank_multi=10),
        "SelfRegulationSCP2": dict(primal_rank=20, primal_eta=0.0, primal_rank_multi=10),
        "SpokenArabicDigits": dict(primal_rank=20, primal_eta=0.1, primal_rank_multi=5),
        "UWaveGestureLibrary": dict(primal_rank=20, primal_eta=0.0, primal_rank_multi=10),
    },
    "primal+trans": {
        "EthanolConcentration": dict(primal_rank=40, primal_eta=0.2, primal_rank_multi=10),
        "FaceDetection": dict(primal_rank=40, primal_eta=0.2, primal_rank_multi=5),
        "Handwriting": dict(primal_rank=20, primal_eta=0.5, primal_rank_multi=5),
        "Heartbeat": dict(primal_rank=40, primal_eta=0.5, primal_rank_multi=10),
        "JapaneseVowels": dict(primal_rank=30, primal_eta=0.2, primal_rank_multi=5),
        "PEMS-SF": dict(primal_rank=40, primal_eta=0.0, primal_rank_multi=5),
        "SelfRegulationSCP1": dict(primal_rank=30, primal_eta=0.2, primal_rank_multi=10),
        "SelfRegulationSCP2": dict(primal_rank=20, primal_eta=0.2, primal_rank_multi=10),
        "SpokenArabicDigits": dict(primal_rank=30, primal_eta=0.2, primal_rank_multi=5),
        "UWaveGestureLibrary": dict(primal_rank=40, primal_eta=0.1, primal_rank_multi=10),
    },
}
# GFSA has no UEA scripts: the gfsa_* defaults (only wK learned, K = 3) are ours. --preset quick:
QUICK = dict(d_model=64, n_heads=2, d_ff=128, epochs=10)


def presets(given: dict, error) -> dict:
    """The values of the flags for the flags given: PAPER, the dataset's for the attention, then
    --preset quick's."""
    name, preset = given.get("dataset", TrainConfig.dataset), given.get("preset", PAPER["preset"])
    try:  # a name with a path in it: said before any folder is made
        uea_data.dataset_paths(".", name)
    except uea_data.DatasetNotFoundError as e:
        error(f"--dataset: {e}")
    primal = PRIMAL.get(given.get("attention", PAPER["attention"]), PRIMAL["primal"])
    values = {**PAPER, **DATASETS.get(name, {}), **AGF.get(name, {}), **primal.get(name, {})}
    values.update(QUICK if preset == "quick" else {})
    if preset == "paper" and name not in AGF:  # the ten datasets of the papers' scripts
        values["preset"] = "default"  # recorded as what it is: the options.py defaults
    return values


def parse_config(argv=None) -> TrainConfig:
    """The flags (or `argv`) -> TrainConfig: PAPER < the presets < the flags, all checked here."""
    choices = dict(attention=(*ATTENTION, "primal+trans"), preset=("paper", "quick"))
    choices.update(optimizer=("radam", "adam"), agf_basis=BASES, agf_variant=VARIANTS)
    choices.update(gfsa_high_order=HIGH_ORDER)
    out = "runs/{dataset}/{attention}-{preset}-seed{seed}"  # where --out is not given
    each = {name: dict(dataset=name, preset="paper") for name in AGF}  # shown by --help
    each["quick"] = dict(preset="quick")
    return runs.parse(TrainConfig, __doc__, choices, presets, out, argv, each)


# 2. Data, 3. the model and its optimizer -------------------------------------------------------
def to_batch(data: uea_data.UEAData, split: str, idx: np.ndarray, device) -> tuple:
    """Features x (B, N, F), bool mask (B, N) and labels y (B,) of `split`, on `device`."""
    arrays = (getattr(data, f"{name}_{split}") for name in ("x", "mask", "y"))
    batch = tuple(torch.from_numpy(a[idx]) for a in arrays)
    if torch.device(device).type == "cuda":  # from pinned memory, without waiting for the GPU
        batch = tuple(t.pin_memory().to(device, non_blocking=True) for t in batch)
    return batch


def build(cfg: TrainConfig, data: uea_data.UEAData, device: torch.device) -> tuple:
    """-> (model, optimizer, GradScaler), with the same initial weights in every process."""
    torch.manual_seed(cfg.seed)
    # each attention's constructor arguments (model.py passes them on)
    agf = dict(order=cfg.agf_order, basis=cfg.agf_basis, alpha=cfg.agf_alpha, beta=cfg.agf_beta)
    agf.update(ortho_weight=cfg.agf_gamma, fix_theta0=cfg.agf_fix_theta0, variant=cfg.agf_variant)
    primal = dict(rank=cfg.primal_rank, rank_multi=cfg.primal_rank_multi)
    # the UEA code squares each case's KSVD objective J, then averages over the batch
    primal.update(ksvd_weight=cfg.primal_eta, ksvd_reduction="sample")
    gfsa = dict(order=cfg.gfsa_order, high_order=cfg.gfsa_high_order, dropout=cfg.attn_dropout)
    gfsa.update(w0=cfg.gfsa_w0, learn_w0=cfg.gfsa_learn_w0, learn_w1=cfg.gfsa_learn_w1)
    kwargs = dict(agf=agf, primal=primal, gfsa=gfsa)
    _, max_len, n_features = data.x_train.shape  # (B, N, F)
    args = dict(n_classes=len(data.class_names), max_len=max_len, n_features=n_features)
    args.update(d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers, d_ff=cfg.d_ff)
    args.update(dropout=cfg.dropout, attn_dropout=cfg.attn_dropout, attention=cfg.attention)
    args.update(attention_kwargs=kwargs, attention_mask=cfg.attention_mask)
    model = Classifier(ModelConfig(style="uea", **args)).to(device)
    # No weight decay. torch's RAdam takes the steps of the official code's own RAdam class.
    optimizer = {"radam": torch.optim.RAdam, "adam": torch.optim.Adam}[cfg.optimizer]
    fp16 = device.type == "cuda" and cfg.amp and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler("cuda", enabled=fp16)  # bf16 needs no loss scaling
    return model, optimizer(model.parameters(), lr=cfg.lr), scaler


# 4. A training step, an evaluation -------------------------------------------------------------
def train_step(model, opt, scaler, x, mask, y, cfg: TrainConfig, autocast) -> tuple:
    """One optimizer step -> (loss, aux loss, number of correct predictions), as tensors."""
    opt.zero_grad(set_to_none=True)
    # NOTE: differs from the official UEA code, whose attention gets no mask (padded steps are
    # zeroed before the head only), because padding must not leak. --no-attention-mask: official.
    with autocast:  # the forward pass only; backward runs outside autocast
        logits, aux = model(x, mask)
        # aux: weighted in each attention (γ, η), averaged over layers by model.py: added as it is
        loss = F.cross_entropy(logits.float(), y) + aux.float()
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # clip the true gradients, not the fp16-scaled ones
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    scaler.step(opt)
    scaler.update()
    return loss.detach(), aux.detach().float(), (logits.argmax(-1) == y).sum()


@torch.no_grad()
def evaluate(model, data: uea_data.UEAData, batch_size: int, device, autocast) -> tuple:
    """(accuracy, mean cross-entropy) on TEST, in eval mode (a bar on a terminal)."""
    model.eval()
    n = len(data.y_test)
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct: read at the end
    for start in tqdm(range(0, n, batch_size), desc="evaluating", leave=False, disable=None):
        x, mask, y = to_batch(data, "test", np.arange(start, min(start + batch_size, n)), device)
        with autocast:
            logits, _ = model(x, mask)
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
        sums += torch.stack([loss.double(), (logits.argmax(-1) == y).sum().double()])
    model.train()
    loss, correct = sums.tolist()
    return correct / n, loss / n


# 5. main: the run folder, the data, the model, the loop, the result ----------------------------
def main(cfg: TrainConfig) -> dict:
    """Train, evaluate on TEST under both protocols, write the run folder -> the result dict."""
    # 1) the run folder, locked and checked before anything is read or written (--resume may
    # add epochs), the settings printed; then the processes: under torchrun one per GPU or CPU
    again = ("epochs", "download", "download_url")  # --resume may change these
    rank, world, device, autocast, ckpt = runs.start(
        cfg, "train_uea.py", "epoch", cfg.epochs, again
    )
    ddp, master, out = "RANK" in os.environ, rank == 0, pathlib.Path(cfg.out)
    say = tqdm.write if master else (lambda *_: None)  # rank 0 alone prints and writes
    if cfg.preset == "default":
        say(f"{cfg.dataset} has no preset from the papers' scripts: the defaults above are used")

    # 2) data: TRAIN statistics, zero padding, padding masks; rank 0 downloads, if asked to
    if (cfg.download or cfg.download_url) and master:  # only when its files are missing
        base = cfg.download_url or uea_data.ARCHIVE_ZIPS  # a --download-url implies --download
        uea_data.download_dataset(cfg.dataset, cfg.data_dir, base)
    if ddp:
        dist.barrier()  # the others wait for the files
    data_args = dict(data_dir=cfg.data_dir, name=cfg.dataset, max_len=cfg.max_len)
    data = uea_data.load_uea(**data_args)  # data_args: in the checkpoint, for diagnose.py
    say(
        f"{cfg.dataset}: train {data.x_train.shape}, test {data.x_test.shape} (B, N, F), "
        f"{len(data.class_names)} classes"
    )
    for note in data.notes:
        say(note)

    # 3) model and optimizer: fresh, or as the interrupted run left them, its data checked
    model, opt, scaler = build(cfg, data, device)
    parts = dict(model=model, optimizer=opt, scaler=scaler)
    state = dict(epoch=0, best_test_acc=-1.0, best_epoch=0, final_test_acc=None, elapsed=0.0)
    about = dict(script="train_uea.py", data=data_args)  # in the checkpoints, for diagnose.py
    arrays = {"TRAIN series": data.x_train, "TRAIN labels": data.y_train}
    arrays.update({"TEST series": data.x_test, "TEST labels": data.y_test})
    arrays["standardisation statistics"] = np.stack([data.mean, data.std])  # TRAIN's
    fast, net = runs.prepare(cfg, ckpt, parts, state, about, arrays)

    # 4) train. Epoch e visits TRAIN in an order seeded by (seed, e), so a resumed run sees the
    # batches it would have seen; each process takes its share of every batch.
    n = len(data.y_train)
    steps = -(-n // cfg.batch_size) * (cfg.epochs - state["epoch"])  # what is left of the run
    bar = tqdm(total=steps, desc=cfg.attention, disable=not master or None)  # None: terminals only
    sums = torch.zeros(4, device=device)  # over the cases: loss, aux loss, correct, count
    for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
        t0 = time.time()
        order = np.random.default_rng([cfg.seed, epoch]).permutation(n)
        for start in range(0, n, cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            if len(batch) < world:
                continue  # a last batch too small to share: every process needs a case
            x, mask, y = to_batch(data, "train", batch[rank::world], device)
            loss, aux, correct = train_step(net, opt, scaler, x, mask, y, cfg, autocast)
            sums += torch.stack([loss * len(y), aux * len(y), correct, loss.new_tensor(len(y))])
            bar.update()
        loss, aux, acc = runs.means(sums, f"in epoch {epoch}")  # of all processes
        record = dict(epoch=epoch, train_loss=loss, train_aux=aux, train_acc=acc)
        if epoch == 1 or epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            test_acc, test_loss = evaluate(fast, data, cfg.batch_size, device, autocast)
            if test_acc > state["best_test_acc"]:  # the first of equal scores is kept
                state.update(best_test_acc=test_acc, best_epoch=epoch)
            state["final_test_acc"] = record["test_acc"] = test_acc
            record.update(test_loss=test_loss, best_test_acc=state["best_test_acc"])
        state.update(epoch=epoch, elapsed=state["elapsed"] + time.time() - t0)
        line = runs.log(out, parts, state, about, record)  # the checkpoint, metrics.jsonl
        if "test_acc" in record:  # a line per evaluation
            say(line)
    bar.close()

    # 5) the result under both protocols
    protocols = {
        "best_test_acc": "the papers': the best TEST accuracy over the evaluations",
        "final_test_acc": "TEST accuracy after the last epoch, no selection on TEST",
    }
    result = dict(dataset=cfg.dataset, attention=cfg.attention, seed=cfg.seed, preset=cfg.preset)
    result.update(best_test_acc=state["best_test_acc"], best_test_epoch=state["best_epoch"])
    result.update(final_test_acc=state["final_test_acc"], protocols=protocols, epochs=cfg.epochs)
    result.update(n_params=count_parameters(model), wall_s=round(state["elapsed"], 1))
    result.update(config=about["config"])
    return runs.finish(out, result, device)  # result.json, and RESULT {json} as the last line


if __name__ == "__main__":
    runs.run(main, parse_config(), "epoch", (uea_data.TsFormatError, uea_data.DatasetNotFoundError))
