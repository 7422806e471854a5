"""
train_uea.py: train one attention mechanism on one UEA multivariate time-series dataset.

    # the papers' setting (d_model 512, 8 heads, 100 epochs), CUDA if present:
    python train_uea.py --dataset JapaneseVowels --attention agf
    python train_uea.py --dataset PEMS-SF --attention primal+trans --data-dir data/uea
    # small and fast on a CPU (d_model 64, 2 heads, 10 epochs): ~6 s, test acc ~96% (agf)
    python train_uea.py --dataset JapaneseVowels --attention agf --preset quick --threads 1
    # several processes (GPUs, or Gloo on CPU); --batch-size is per process:
    torchrun --nproc_per_node 2 train_uea.py --dataset Heartbeat --attention primal
    # a dataset that is not on disk yet: fetch <download-url>/<Name>.zip from the UEA archive
    python train_uea.py --dataset UWaveGestureLibrary --download true

Data:     <data-dir>/<Name>/<Name>_TRAIN.ts and <Name>_TEST.ts, as in the UEA archive
          (https://www.timeseriesclassification.com/dataset.php, Multivariate2018_ts.zip).
Protocol: the papers (Flowformer, Primal-Attention, AGF) report the best TEST accuracy over the
          epochs, evaluated every 2 epochs plus the first and last: `best_test_acc` (test used
          for selection). Beside it we report `final_test_acc`, the test accuracy after the
          last epoch, which involves no selection on test.
Results:  JapaneseVowels, paper preset (100 epochs), CPU, --threads 1, two runs at a time on a
          2-core machine; mean ± std over seeds 666/0/1/2/3 (README "Results" lists every run):
              python train_uea.py --dataset JapaneseVowels --attention <kind> --threads 1
          kind          best_test_acc  final_test_acc  paper (best)  params  wall
          softmax        98.9 ± 0.2     95.5 ± 4.7       98.7        6.45M   8 min
          agf            98.9 ± 0.2     97.6 ± 1.2       99.5        6.97M   9-11 min
          primal         98.1 ± 0.6     97.8 ± 0.5       98.4        5.96M   8-9 min
          primal+trans   98.8 ± 0.3     98.5 ± 0.4       98.9        6.20M   8 min
          gfsa           98.8 ± 0.3     95.7 ± 4.3        —          6.45M   8 min
          (paper: Primal-Attention Table 1 for Trans./Primal./Primal.+Trans.; AGF's 99.5 as
          quoted in our issue. Alone on the 2 cores with default threads, an agf run takes
          5.9 min; without --threads 1, two runs on 2 busy cores ran 3x slower.)
Output:   runs/<dataset>/<attention>-seed<seed>/ {config.json, metrics.jsonl, checkpoint.pt,
          result.json}; the last line printed is  RESULT {json}  (same content as result.json).
Resume:   rerun the same command with --resume true: it continues from the last checkpoint and
          gives the same weights and metrics as an uninterrupted run (single process).

Depends on: torch, numpy, tqdm, uea_data.py, model.py, train_common.py (and the mechanism
            files it uses)
"""

import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from tqdm import tqdm

import train_common as common
from model import Classifier, ModelConfig, count_parameters
from train_common import flag
from uea_data import (
    ARCHIVE_ZIPS,
    DatasetNotFoundError,
    TsFormatError,
    UEAData,
    dataset_paths,
    download_dataset,
    load_uea,
    missing_dataset_message,
)

# ---------------------------------------------------------------------------------------------
# Presets from the official scripts. The ten datasets of Flowformer / Primal-Attention / AGF.
# Epochs and optimiser: Flowformer scripts/flowformer.sh, PrimalAttention_TimeSeries
# run_primalformer.sh / run_primal_trans.sh, AGF_UEA/run_agf_best.sh (DATA.md §2.3, PRIMAL.md
# §4.2, AGF.md §3.2): 100 epochs with RAdam, except PEMS-SF (400 epochs) and SpokenArabicDigits
# (Adam). Every other training setting is shared (TrainConfig defaults below).
UEA_DATASETS = {
    "EthanolConcentration": dict(epochs=100, optimizer="radam"),
    "FaceDetection": dict(epochs=100, optimizer="radam"),
    "Handwriting": dict(epochs=100, optimizer="radam"),
    "Heartbeat": dict(epochs=100, optimizer="radam"),
    "JapaneseVowels": dict(epochs=100, optimizer="radam"),
    "PEMS-SF": dict(epochs=400, optimizer="radam"),
    "SelfRegulationSCP1": dict(epochs=100, optimizer="radam"),
    "SelfRegulationSCP2": dict(epochs=100, optimizer="radam"),
    "SpokenArabicDigits": dict(epochs=100, optimizer="adam"),
    "UWaveGestureLibrary": dict(epochs=100, optimizer="radam"),
}

# AGF: AGF_UEA/run_agf_best.sh (AGF.md §3.2). fix_theta0 = the script's --fixI flag.
# Handwriting passes no --alpha/--beta: 1.0 / 0.2 are the options.py defaults. Chebyshev and
# Legendre are Jacobi(-½, -½) and Jacobi(0, 0); their alpha/beta entries are unused.
AGF_FIELDS = ("agf_basis", "agf_order", "agf_alpha", "agf_beta", "agf_gamma", "agf_fix_theta0")
AGF_PRESETS = {  #  basis       K    α     β     γ (--eta)  --fixI
    "EthanolConcentration": ("jacobi", 6, 1.5, -1.5, 0.1, True),
    "FaceDetection": ("jacobi", 9, 2.0, 0.5, 0.1, True),
    "Handwriting": ("jacobi", 3, 1.0, 0.2, 0.01, False),
    "Heartbeat": ("chebyshev", 6, 1.0, 0.2, 0.01, False),
    "JapaneseVowels": ("legendre", 4, 1.0, 0.2, 0.01, False),
    "PEMS-SF": ("jacobi", 5, 1.5, 2.0, 0.1, True),
    "SelfRegulationSCP1": ("jacobi", 9, 1.5, 1.0, 0.1, True),
    "SelfRegulationSCP2": ("jacobi", 7, 2.0, 1.5, 0.1, True),
    "SpokenArabicDigits": ("jacobi", 4, 1.0, 0.0, 0.5, True),
    "UWaveGestureLibrary": ("jacobi", 10, 2.0, 1.5, 0.1, True),
}

# Primal-Attention: s (--low_rank) / η (--eta) / rank_multi, from PrimalAttention_TimeSeries
# run_primalformer.sh ("primal") and run_primal_trans.sh ("primal+trans") (PRIMAL.md §4.2).
# η = 0 switches the KSVD loss off, as in those scripts.
PRIMAL_FIELDS = ("primal_rank", "primal_eta", "primal_rank_multi")
PRIMAL_PRESETS = {  #    primal        primal+trans
    "EthanolConcentration": ((30, 0.1, 10), (40, 0.2, 10)),
    "FaceDetection": ((20, 0.1, 5), (40, 0.2, 5)),
    "Handwriting": ((30, 0.2, 5), (20, 0.5, 5)),
    "Heartbeat": ((30, 0.5, 10), (40, 0.5, 10)),
    "JapaneseVowels": ((40, 0.5, 5), (30, 0.2, 5)),
    "PEMS-SF": ((40, 0.1, 5), (40, 0.0, 5)),
    "SelfRegulationSCP1": ((30, 0.5, 10), (30, 0.2, 10)),
    "SelfRegulationSCP2": ((20, 0.0, 10), (20, 0.2, 10)),
    "SpokenArabicDigits": ((20, 0.1, 5), (30, 0.2, 5)),
    "UWaveGestureLibrary": ((20, 0.0, 10), (40, 0.1, 10)),
}

# GFSA publishes no UEA results, so its preset is our own choice, the same for every dataset:
# the official parametrisation (only wK learned, from 0; w1 = 1; w0 = 0), K = 3 (the best K of
# the DeiT-S-12 sweep, GFSA v1 Table 10) and the softmax baseline's attention dropout 0.1.
# Defaults of the gfsa_* fields below.

QUICK = dict(d_model=64, n_heads=2, d_ff=128, epochs=10)  # --preset quick: seconds per epoch


@dataclass
class TrainConfig:
    """Every knob of a run; each field is a flag (`--d-model 64`). Defaults: the papers' setup
    (mvts / Primal / AGF options.py), the mechanism fields at their JapaneseVowels values."""

    # what to run
    dataset: str = flag("JapaneseVowels", "UEA dataset name, e.g. JapaneseVowels, PEMS-SF")
    attention: str = flag("softmax", "softmax | agf | primal | primal+trans | gfsa")
    preset: str = flag("paper", "paper (official scripts' settings) | quick (small, CPU)")
    data_dir: str = flag("data/uea", "holds <Name>/<Name>_TRAIN.ts and <Name>_TEST.ts")
    download: bool = flag(False, "fetch <download-url>/<Name>.zip when the dataset is missing")
    download_url: str = flag(ARCHIVE_ZIPS, "base URL of the per-dataset zips")
    # model: options.py defaults of the official UEA code (the scripts do not override them)
    d_model: int = flag(512, "D, model width")
    n_heads: int = flag(8, "H, attention heads (d = D / H)")
    n_layers: int = flag(2, "encoder layers")
    d_ff: int = flag(2048, "feed-forward hidden width")
    dropout: float = flag(0.1, "dropout in embedding, blocks and head")
    attn_dropout: float = flag(0.1, "dropout on the attention weights (softmax, GFSA)")
    max_len: int = flag(0, "time steps fed to the model; 0 = longest TRAIN series")
    attention_mask: bool = flag(
        True, "feed the padding mask to the attention (false = the official UEA code)"
    )
    # training: Flowformer / Primal / AGF scripts
    epochs: int = flag(100, "training epochs (PEMS-SF preset: 400)")
    batch_size: int = flag(16, "cases per step and process")
    lr: float = flag(1e-3, "learning rate, constant (official lr_step 1e6: no decay)")
    optimizer: str = flag("radam", "radam | adam (SpokenArabicDigits preset: adam)")
    grad_clip: float = flag(4.0, "max gradient norm")
    eval_every: int = flag(2, "evaluate on TEST every k epochs (and after the first and last)")
    seed: int = flag(666, "random seed (the official UEA scripts fix 666)")
    # AGF (agf.py), per-dataset preset above
    agf_basis: str = flag("legendre", "jacobi | legendre | chebyshev | chebyshev_t | monomial")
    agf_order: int = flag(4, "K, highest polynomial degree")
    agf_alpha: float = flag(1.0, "Jacobi α")
    agf_beta: float = flag(0.2, "Jacobi β")
    agf_gamma: float = flag(0.01, "γ, orthogonality-penalty weight (official --eta)")
    agf_fix_theta0: bool = flag(False, "freeze θ̃_0 = 1 (official --fixI)")
    # Primal-Attention (ksvd_attention.py), per-dataset preset above
    primal_rank: int = flag(40, "s, number of KSVD components (official --low_rank)")
    primal_eta: float = flag(0.5, "η, KSVD-loss weight")
    primal_rank_multi: int = flag(5, "m = min(max_len, s * rank_multi) sampled time steps")
    # GFSA (gfsa.py): our choice, see above
    gfsa_order: int = flag(3, "K of the high-order term")
    gfsa_w0: float = flag(0.0, "w0, identity coefficient (fixed unless learned)")
    gfsa_learn_w0: bool = flag(False, "learn w0 (official: fixed)")
    gfsa_learn_w1: bool = flag(False, "learn w1 (official: fixed at 1)")
    # machinery
    device: str = flag("auto", "auto | cpu | cuda | cuda:1")
    threads: int = flag(0, "CPU threads (0 = torch's choice; 1 is fastest on busy cores)")
    amp: bool = flag(True, "mixed precision on CUDA (bf16, else fp16 with a GradScaler)")
    resume: bool = flag(False, "continue from <out>/checkpoint.pt")
    out: str = flag("", "run folder; default runs/<dataset>/<attention>-seed<seed>")
    progress: bool = flag(True, "tqdm bars (only on a terminal, rank 0)")


def preset(given: dict) -> dict:
    """Preset values for the dataset / attention / preset named on the command line."""
    name = given.get("dataset", TrainConfig.dataset)
    attention = given.get("attention", TrainConfig.attention)
    kind = given.get("preset", TrainConfig.preset)
    if kind not in ("paper", "quick"):
        raise SystemExit(f"--preset {kind!r}: choose 'paper' or 'quick'")
    # A dataset outside the ten keeps the TrainConfig defaults.
    values = dict(UEA_DATASETS.get(name, {}))
    if name in AGF_PRESETS:
        values.update(zip(AGF_FIELDS, AGF_PRESETS[name], strict=True))
    if name in PRIMAL_PRESETS:
        s_eta_multi = PRIMAL_PRESETS[name][attention == "primal+trans"]
        values.update(zip(PRIMAL_FIELDS, s_eta_multi, strict=True))
    if kind == "quick":
        values.update(QUICK)
    return values


def parse_config(argv: Optional[list] = None) -> TrainConfig:
    """TrainConfig from the command line:  defaults < preset < flags.  `--help` lists them."""
    return common.parse_config(TrainConfig, preset, argv, __doc__)


def attention_kwargs(cfg: TrainConfig) -> dict:
    """Constructor keyword arguments per attention kind, for ModelConfig.attention_kwargs."""
    return {
        "agf": dict(
            order=cfg.agf_order,
            basis=cfg.agf_basis,
            alpha=cfg.agf_alpha,
            beta=cfg.agf_beta,
            ortho_weight=cfg.agf_gamma,
            fix_theta0=cfg.agf_fix_theta0,
        ),
        # The UEA code squares the per-sample KSVD objective J, then averages over the batch.
        "primal": dict(
            rank=cfg.primal_rank,
            rank_multi=cfg.primal_rank_multi,
            ksvd_weight=cfg.primal_eta,
            ksvd_reduction="sample",
        ),
        "gfsa": dict(
            order=cfg.gfsa_order,
            w0=cfg.gfsa_w0,
            learn_w0=cfg.gfsa_learn_w0,
            learn_w1=cfg.gfsa_learn_w1,
            dropout=cfg.attn_dropout,
        ),
    }


# ---------------------------------------------------------------------------------------------
# Training.


def build_model(cfg: TrainConfig, data: UEAData) -> Classifier:
    """The UEA-style classifier of model.py (post-LN blocks, flatten head) for this data."""
    return Classifier(
        ModelConfig(
            n_classes=len(data.class_names),
            max_len=data.x_train.shape[1],
            n_features=data.x_train.shape[2],
            style="uea",
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            n_layers=cfg.n_layers,
            d_ff=cfg.d_ff,
            dropout=cfg.dropout,
            attn_dropout=cfg.attn_dropout,
            attention=cfg.attention,
            attention_kwargs=attention_kwargs(cfg),
            attention_mask=cfg.attention_mask,
        )
    )


def make_optimizer(cfg: TrainConfig, model: torch.nn.Module) -> torch.optim.Optimizer:
    """RAdam (Adam for SpokenArabicDigits), constant lr, no weight decay (official scripts)."""
    # The official code ships its own RAdam class; torch.optim.RAdam takes the same steps
    # (test_torch_radam_is_the_official_rectified_adam writes that rule out and compares).
    optimizers = {"radam": torch.optim.RAdam, "adam": torch.optim.Adam}
    if cfg.optimizer not in optimizers:
        raise SystemExit(f"--optimizer {cfg.optimizer!r}: choose from {sorted(optimizers)}")
    return optimizers[cfg.optimizer](model.parameters(), lr=cfg.lr)


def train_one_epoch(net, opt, scaler, data: UEAData, order: Tensor, cfg, device, bar) -> dict:
    """One pass over the TRAIN cases in `order` -> summed {loss, aux, correct, n}."""
    net.train()
    sums = torch.zeros(4, dtype=torch.float64)
    for batch in order.split(cfg.batch_size):
        x, mask, y = (t[batch].to(device) for t in (data.x_train, data.mask_train, data.y_train))
        # NOTE: differs from the official UEA code, which gives the attention no mask (padded
        #       steps are zeroed only before the head), because padding must not leak (DESIGN.md).
        #       --attention-mask false restores the official behaviour (model.py drops the mask).
        with common.autocast(device, cfg.amp):
            logits, aux = net(x, mask)
        # aux is already weighted inside the attention (γ for AGF, η for Primal, 0 otherwise)
        # and averaged over the layers by model.py: add it as it is.
        loss = F.cross_entropy(logits.float(), y) + aux.float()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()}; try a smaller --lr")
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)  # clip the true gradients, not the fp16-scaled ones
        torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        n = len(y)
        correct = (logits.argmax(-1) == y).sum().item()
        sums += torch.tensor([loss.item() * n, aux.item() * n, correct, n], dtype=torch.float64)
        bar.update(1)
    return dict(zip(("loss", "aux", "correct", "n"), sums.tolist(), strict=True))


@torch.no_grad()
def evaluate(model, data: UEAData, cfg, device, rank: int, world: int) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) on TEST; each process takes every world-th case."""
    model.eval()
    correct = loss = 0.0
    for batch in torch.arange(rank, len(data.y_test), world).split(cfg.batch_size):
        x, mask, y = (t[batch].to(device) for t in (data.x_test, data.mask_test, data.y_test))
        with common.autocast(device, cfg.amp):
            logits, _ = model(x, mask)
        loss += F.cross_entropy(logits.float(), y, reduction="sum").item()
        correct += (logits.argmax(-1) == y).sum().item()
    correct, loss = common.all_reduce_sum([correct, loss], device)
    return correct / len(data.y_test), loss / len(data.y_test)


def prepare_data(cfg: TrainConfig, rank: int, world: int) -> UEAData:
    """Load the dataset; with --download, rank 0 fetches it first when it is missing."""
    if not all(p.exists() for p in dataset_paths(cfg.data_dir, cfg.dataset)):
        if not cfg.download:
            raise DatasetNotFoundError(
                missing_dataset_message(cfg.data_dir, cfg.dataset, cfg.download_url)
            )
        if rank == 0:
            download_dataset(cfg.dataset, cfg.data_dir, cfg.download_url, cfg.progress)
        if world > 1:
            dist.barrier()  # the other processes wait for the files
    return load_uea(cfg.data_dir, cfg.dataset, cfg.max_len)


# Fields that may change between a run and its --resume; any other change is refused.
RESUMABLE = ("epochs", "resume", "progress", "device", "threads", "amp", "download", "out")


def main(cfg: TrainConfig) -> dict:
    """Train, evaluate on TEST under both protocols, write the run folder; return the result."""
    if cfg.threads > 0:
        # Small models on shared cores: extra threads mostly spin-wait (1 thread was 10x+
        # faster than 2 on a busy 2-core machine).
        torch.set_num_threads(cfg.threads)
    device = common.resolve_device(cfg.device)
    rank, world = common.setup_distributed(device)
    say = tqdm.write if rank == 0 else (lambda *_: None)
    say("config " + json.dumps(dataclasses.asdict(cfg)))  # the resolved config, always first

    # 1) data: TRAIN statistics, zero padding, padding masks
    data = prepare_data(cfg, rank, world)
    say(
        f"{cfg.dataset}: train {tuple(data.x_train.shape)}, test {tuple(data.x_test.shape)} "
        f"(B, N, F), {len(data.class_names)} classes, {data.n_clipped} test cases clipped"
    )
    run = common.RunDir(cfg.out or f"runs/{cfg.dataset}/{cfg.attention}-seed{cfg.seed}", rank)
    # 2) model (same initial weights in every process), optimiser, fp16 loss scaling
    common.seed_everything(cfg.seed)
    model = build_model(cfg, data).to(device)
    common.seed_everything(cfg.seed + rank)  # own dropout masks per process; rank 0 = seed
    opt = make_optimizer(cfg, model)
    fp16 = cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported()
    scaler = torch.amp.GradScaler(device.type, enabled=fp16)  # bf16 and fp32 need none
    # 3) fresh start, or exact continuation from the last checkpoint
    state = dict(epoch=0, best_test_acc=-1.0, best_epoch=0, final_test_acc=None, wall_s=0.0)
    if cfg.resume:
        state = resume(run, cfg, model, opt, scaler)
    else:
        run.truncate_log(lambda record: False)  # a fresh run starts a fresh metrics.jsonl
    run.write_config(cfg)
    # 4) the epochs
    fit(cfg, model, opt, scaler, data, state, run, device, rank, world, say)
    # 5) the result under both protocols
    return run.finish(summary(cfg, state, model, device, world))


def fit(cfg, model, opt, scaler, data, state: dict, run, device, rank, world, say) -> None:
    """Epochs state["epoch"] + 1 .. cfg.epochs: train, evaluate, log, checkpoint."""
    net = DistributedDataParallel(model) if world > 1 else model
    # Each epoch's order comes from a generator seeded with seed + epoch, so a resumed run sees
    # the same order; with several processes each takes its share of it (padded to equal size).
    sampler = DistributedSampler(range(len(data.y_train)), world, rank, seed=cfg.seed)
    steps = math.ceil(len(sampler) / cfg.batch_size) * (cfg.epochs - state["epoch"])
    show = cfg.progress and rank == 0 and sys.stderr.isatty()
    bar = tqdm(total=steps, disable=not show, unit="step", desc=f"{cfg.dataset} {cfg.attention}")
    for epoch in range(state["epoch"] + 1, cfg.epochs + 1):
        t0 = time.perf_counter()
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler))
        sums = train_one_epoch(net, opt, scaler, data, order, cfg, device, bar)
        loss, aux, correct, n = common.all_reduce_sum(list(sums.values()), device)
        record = dict(epoch=epoch, train_loss=loss / n, train_aux=aux / n, train_acc=correct / n)
        # Papers' schedule: every eval_every (2) epochs, plus the first and the last.
        if epoch == 1 or epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
            test_acc, test_loss = evaluate(model, data, cfg, device, rank, world)
            if test_acc > state["best_test_acc"]:
                state.update(best_test_acc=test_acc, best_epoch=epoch)
            state["final_test_acc"] = test_acc
            record.update(test_acc=test_acc, test_loss=test_loss)
            record["best_test_acc"] = state["best_test_acc"]
            say("  ".join(f"{k} {v:.4g}" for k, v in record.items()))
        run.log(record)
        state.update(epoch=epoch, wall_s=state["wall_s"] + time.perf_counter() - t0)
        checkpoint = dict(model=model.state_dict(), optimizer=opt.state_dict())
        checkpoint.update(scaler=scaler.state_dict(), state=state, rng=common.rng_state())
        run.save({**checkpoint, "config": dataclasses.asdict(cfg)})
    bar.close()


def summary(cfg: TrainConfig, state: dict, model, device: torch.device, world: int) -> dict:
    """The RESULT record: accuracies under their protocol names, size, time, device, config."""
    return dict(
        dataset=cfg.dataset,
        attention=cfg.attention,
        seed=cfg.seed,
        preset=cfg.preset,
        best_test_acc=state["best_test_acc"],
        best_test_epoch=state["best_epoch"],
        final_test_acc=state["final_test_acc"],
        protocols={
            "best_test_acc": "papers' protocol: test used for selection (best over evaluations)",
            "final_test_acc": "test accuracy after the last epoch, no selection on test",
        },
        epochs=cfg.epochs,
        n_params=count_parameters(model),
        wall_s=round(state["wall_s"], 2),  # training and evaluation, summed over resumes
        device=device_name(device, world),
        config=dataclasses.asdict(cfg),
    )


def resume(run: common.RunDir, cfg: TrainConfig, model, opt, scaler) -> dict:
    """Load model, optimiser, scaler, RNG states and best metrics; return the loop state."""
    ckpt = run.load()
    changed = {
        k: (v, getattr(cfg, k))
        for k, v in ckpt["config"].items()
        if k not in RESUMABLE and v != getattr(cfg, k)
    }
    if changed:
        raise SystemExit(f"--resume: the run in {run.path} used other settings {changed}")
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    scaler.load_state_dict(ckpt["scaler"])
    common.set_rng_state(ckpt["rng"])
    state = ckpt["state"]
    run.truncate_log(lambda record: record["epoch"] <= state["epoch"])
    return state


def device_name(device: torch.device, world: int) -> str:
    """E.g. 'cpu (2 threads) x 1 process' or 'NVIDIA H100 x 2 processes'."""
    if device.type == "cuda":
        what = torch.cuda.get_device_name(device)
    else:
        n = torch.get_num_threads()
        what = f"cpu ({n} thread{'s' if n > 1 else ''})"
    return f"{what} x {world} process{'es' if world > 1 else ''}"


if __name__ == "__main__":
    try:
        main(parse_config())
        common.teardown_distributed()
    except (TsFormatError, DatasetNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    finally:
        common.teardown_distributed(clean=False)  # a no-op after a clean teardown
