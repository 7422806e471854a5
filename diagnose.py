"""
diagnose.py: look inside a trained model: over-smoothing, filter responses and spectra.

    python diagnose.py runs/JapaneseVowels/agf-seed666             # a run folder of train_*.py
    python diagnose.py runs/listops-quick/gfsa-seed0/best.pt --data-dir data --out /tmp/diag
    python diagnose.py depth --dataset JapaneseVowels --data-dir data/uea --epochs 10
                           # trains 2-, 4- and 8-layer models with each attention (CPU, minutes)

The three papers argue with pictures; this script draws them for your own runs.
  over-smoothing   mean pairwise cosine similarity of the real tokens after each block. Deep
                   softmax Transformers drive it towards 1, all tokens alike (GFSA v1 Figs. 2, 4,
                   5 (b); the AGF paper's over-smoothing figure).
  AGF filter       the learned g(s) = Σ_k θ̃_k P_k(s) of each layer over s ∈ (0, 1), and the
                   signs of θ̃_k: negative ones let the filter pass high frequencies (AGF README,
                   Theorem 2).
  GFSA filter      p(λ) = a0 + a1·λ + a2·λ², the filter H = p(Ā) as a function of an eigenvalue
                   λ of Ā, on λ ∈ [-1, 1] and at the eigenvalues of the dense Ā of real
                   sequences (GFSA v1 Eqs. 4, 5; Figs. 2, 4, 5 (a) plot a filter response).
  spectra          singular values σ_1 >= σ_2 >= ... of each layer's implied N x N matrix, as the
                   normalised cumulative sum Σ_{i<=k} σ_i / Σ_i σ_i (the Primal-Attention
                   spectrum figure, pics/heatmap.jpg of the official code): a curve that reaches 1
                   early means a matrix of low effective rank.

The implied N x N matrix of each attention kind, on the real tokens of one sequence (on every
step for a model trained with --attention-mask false), per head:
    softmax  Ā = softmax(QKᵀ/√d), padded keys masked (from the layer's own W_qkv)
    agf      H = U diag(g) Vᵀ, token-wise diagonal (agf.agf_dense_reference)
    gfsa     H = w0·I + w1·Ā + wK·(Ā + (K-1)(Ā² - Ā)) (gfsa.gfsa_dense_reference, GFSA v1 Eq. 5)
    primal   K_X = Φq Fᵀ F Φkᵀ, the asymmetric kernel whose SVD the layer's primal form
             approximates (ksvd_attention.ksvd_kernel). Its rank is at most d. It is not the
             map from values to outputs (Primal-Attention has no values): it is the matrix the
             KSVD loss is about.
Complex eigenvalues: Ā is not symmetric, so its eigenvalues λ are complex in general. We report
the gain |p(λ)| (the factor by which H scales that eigen-direction; for Ā alone it is |λ|), and
order eigenvalues by their distance |1 - λ| from the eigenvalue 1 of the constant vector (the
lowest frequency; 0 = smooth, up to 2 = alternating). The summary's "off-DC gain" is the mean
|p(λ)| / |p(1)| over every eigenvalue but that 1: how much of the non-constant part of a signal
the filter keeps, relative to its mean (Ā alone: mean |λ|; near 0 = a strong low-pass filter).

Every layer's input is captured with a forward pre-hook on block.attn, so it is exactly what the
attention saw: LN(x) in the LRA style (pre-LN), x in the UEA style (post-LN).
Outputs: a summary on the terminal (also summary.txt), CSV files in <run>/diagnose/ (or --out),
PNG figures when matplotlib is installed (optional: pip install matplotlib).

Symbols:  Ā attention matrix (B, H, N, N); H graph filter (B, H, N, N) (H is also the head
          count in shapes); K_X Primal kernel (B, H, N, N); g(s) AGF filter response;
          θ̃_k AGF coefficients (K + 1,); p(λ) GFSA response; a0, a1, a2 (H,) each: the GFSA
          filter as a0·I + a1·Ā + a2·Ā², a0 = w0, a1 = w1 + (2-K)·wK, a2 = (K-1)·wK
          (gfsa.filter_coefficients); σ_i singular values; λ eigenvalues of Ā.
Dims:     B batch, N tokens, D model width, H heads, d = D/H head width, r rank,
          K polynomial order (legend: README)
Run:      `python diagnose.py RUN` prints the summary and writes the files above;
          `python diagnose.py depth` (defaults: 2, 4, 8 layers x 5 kinds, 10 epochs, D = 64)
          prints a table of last-layer cosine similarity and test accuracy and writes depth.csv:
          88 s on 2 shared CPU cores (torch 2.13); the table is in the README.
Depends on: torch, numpy, model.py, the mechanism files, train_uea.py / train_lra.py (to
            rebuild a run); matplotlib optional
"""

import argparse
import contextlib
import csv
import dataclasses
import json
import pathlib
import shlex
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from agf import agf_dense_reference
from gfsa import attention_matrix, filter_coefficients, gfsa_dense_reference
from ksvd_attention import ksvd_kernel
from model import Classifier, layerwise_cosine_similarity
from polynomials import frequency_response

KINDS = ("softmax", "agf", "primal", "primal+trans", "gfsa")  # --attention of the train scripts


# ---------------------------------------------------------------------------------------------
# 1. Rebuild a trained model and a few batches of its data from a run folder
# ---------------------------------------------------------------------------------------------


@dataclass
class LoadedRun:
    """A trained model in eval mode and some of its data, ready to look at."""

    model: Classifier
    batches: list  # dicts: x, mask (B, N) bool [, x2, mask2 for two towers], on the model's device
    label: str  # e.g. "UEA JapaneseVowels, attention agf, 2 layers"
    folder: pathlib.Path


def read_checkpoint(path: pathlib.Path) -> tuple[dict, dict, pathlib.Path]:
    """(state_dict, config dict, run folder) from a run folder, its checkpoint.pt or best.pt."""
    path = pathlib.Path(path)
    file = path / "checkpoint.pt" if path.is_dir() else path
    if not file.exists():
        raise SystemExit(f"no checkpoint at {file}: give a run folder of train_uea.py/train_lra.py")
    # weights_only=False: the checkpoint also holds RNG states and the config (plain Python and
    # NumPy objects). Load only checkpoints you trust, as with any pickle.
    ckpt = torch.load(file, map_location="cpu", weights_only=False)
    if "model" in ckpt and "config" in ckpt:  # checkpoint.pt
        return ckpt["model"], ckpt["config"], file.parent
    config = file.parent / "config.json"  # best.pt holds only the weights; the config sits beside
    if not config.exists():
        raise SystemExit(f"{file} holds no config and there is no {config}")
    return ckpt, json.loads(config.read_text()), file.parent


def _config(cls, values: dict, **override):
    """A train script's TrainConfig from a saved dict (fields it does not know are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{**{k: v for k, v in values.items() if k in names}, **override})


def _spread(n_real: np.ndarray, n_cases: Optional[int]) -> np.ndarray:
    """Indices of n_cases sequences with >= 2 real tokens, evenly spaced over the split."""
    # Evenly spaced, not the first n: split files are often sorted (JapaneseVowels TEST is sorted
    # by speaker): in an 8-layer AGF run its first 64 cases gave a last-layer cosine of 0.92,
    # all 370 cases 0.82.
    candidates = np.flatnonzero(n_real >= 2)
    if n_cases is None or n_cases >= len(candidates):
        return candidates
    return candidates[np.linspace(0, len(candidates) - 1, n_cases).round().astype(int)]


def load_run(
    path,
    data_dir: Optional[str] = None,
    split: str = "test",
    n_cases: Optional[int] = 64,
    batch_size: int = 16,
    device: str = "cpu",
) -> LoadedRun:
    """Rebuild the model of a run with the train script's own functions and load its weights.

    Args:
        path: run folder (its checkpoint.pt), a checkpoint.pt, or an LRA best.pt.
        data_dir: where the data lives now (default: the run's --data-dir).
        split: "test" or "train".
        n_cases: how many sequences, evenly spaced over the split (None = all); sequences with
            fewer than 2 real tokens are skipped (a cosine similarity needs a pair).
        batch_size: sequences per batch.
        device: where the model runs.
    Returns:
        LoadedRun
    """
    state_dict, config, folder = read_checkpoint(path)
    data_dir = data_dir or config.get("data_dir")
    if "dataset" in config:  # train_uea.py
        import train_uea
        import uea_data

        cfg = _config(train_uea.TrainConfig, config, data_dir=data_dir, download=False)
        try:
            data = uea_data.load_uea(cfg.data_dir, cfg.dataset, cfg.max_len)
        except (uea_data.DatasetNotFoundError, uea_data.TsFormatError) as e:
            raise SystemExit(f"error: {e}\n(point --data-dir at the run's data)") from None
        model = train_uea.build_model(cfg, data)
        x, mask = getattr(data, f"x_{split}"), getattr(data, f"mask_{split}")
        index = _spread(mask.sum(1).numpy(), n_cases)
        tensors, label = {"x": x[index], "mask": mask[index]}, f"UEA {cfg.dataset}"
    elif "task" in config:  # train_lra.py
        import train_lra

        cfg = _config(train_lra.TrainConfig, config, data_dir=data_dir, resume=False)
        try:  # (generated ListOps that is missing is generated again, seeded, as in training)
            data = train_lra.load_task(cfg)
        except train_lra.DataError as e:
            raise SystemExit(f"data error: {e}\n(point --data-dir at the run's data)") from None
        model = train_lra.build(cfg, torch.device("cpu"), 1).plain
        chosen = data[split]
        # pick the sequences first: the whole training split as int64 tensors can take GBs
        real = np.minimum(chosen.lengths, chosen.lengths if chosen.x2 is None else chosen.lengths2)
        tensors = train_lra.to_tensors(chosen, _spread(real, n_cases))
        tensors.pop("y")
        label = f"LRA {cfg.task}"
    else:
        raise SystemExit(f"{folder}: the config names neither a dataset (UEA) nor a task (LRA)")
    model.load_state_dict(state_dict)
    model.to(device).eval()
    chunks = torch.arange(len(tensors["x"])).split(batch_size)
    batches = [{k: v[chunk].to(device) for k, v in tensors.items()} for chunk in chunks]
    label += f", attention {cfg.attention}, {cfg.n_layers} layers"
    return LoadedRun(model, batches, label, folder)


# ---------------------------------------------------------------------------------------------
# 2. Run the model once and capture what each attention layer sees
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def capture(model: Classifier, batch: dict) -> tuple[list, list]:
    """Hidden states and the input of every attention layer, for the first (or only) tower.

    Args:
        model: a Classifier in eval mode.
        batch: x, mask (B, N) bool [, x2, mask2].
    Returns:
        hidden: [embedding, block 1, ..., block L], each (B, N, D)
        inputs: per block, (x (B, N, D), mask (B, N)) exactly as block.attn received them
            (all True in a model built with attention_mask=False: its attention sees every step)
    """
    inputs: dict = {}

    def keep_first(i: int):
        def hook(module, args):
            x, mask = args[0].detach(), args[1]
            if mask is None:
                mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
            inputs.setdefault(i, (x, mask))  # tower 1 runs first

        return hook

    handles = [b.attn.register_forward_pre_hook(keep_first(i)) for i, b in enumerate(model.blocks)]
    try:
        out = model(batch["x"], batch["mask"], batch.get("x2"), batch.get("mask2"), True)
    finally:
        for handle in handles:
            handle.remove()
    hidden = out[2][0] if model.cfg.two_tower else out[2]
    return hidden, [inputs[i] for i in range(len(model.blocks))]


def cosine_curve(model: Classifier, batches: list) -> Tensor:
    """Mean pairwise cosine similarity of real tokens per hidden state, over all sequences.

    Returns:
        (L + 1,): the embedding, then the output of each block
    """
    total, count = 0.0, 0
    for batch in batches:
        hidden, _ = capture(model, batch)
        n = batch["x"].shape[0]
        # model.py gives the batch mean; weighting by n gives the mean over all sequences
        total = total + layerwise_cosine_similarity(hidden, batch["mask"]).double() * n
        count += n
    return total / count


# ---------------------------------------------------------------------------------------------
# 3. The implied N x N matrices, their spectra, and the two filter responses
# ---------------------------------------------------------------------------------------------


def _attention_and_values(layer, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Dense Ā (B, H, N, N) and values (B, H, N, d) of a softmax or GFSA layer (fused W_qkv)."""
    B, N, D = x.shape
    qkv = layer.W_qkv(x).view(B, N, 3, layer.n_heads, layer.d_head).permute(2, 0, 3, 1, 4)
    q, k, v = qkv  # 3 x (B, H, N, d)
    return attention_matrix(q, k, mask, layer.causal, getattr(layer, "kernel", "softmax")), v


@torch.no_grad()
def implied_matrix(layer: torch.nn.Module, kind: str, x: Tensor, mask: Tensor) -> Tensor:
    """The N x N matrix a layer applies (see the header), per head.

    Args:
        layer: the block's attention module, of kind "softmax", "agf", "gfsa" or "primal".
        x: the layer's input (B, N, D); mask (B, N) bool, True = real token.
    Returns:
        (B, H, N, N); only the rows and columns of real tokens are meaningful.
    """
    if kind == "agf":
        return agf_dense_reference(layer, x, mask)[1]  # H = U diag(g) Vᵀ
    if kind == "primal":
        # as PrimalAttention.scores: padded rows zeroed, then φ_q, φ_k and f(X)
        x = x.to(layer.W_q.weight.dtype).masked_fill(~mask[..., None], 0.0)
        phi_q, phi_k = layer.feature_maps(x, mask)  # (B, H, N, d) each
        return ksvd_kernel(phi_q, phi_k, layer.sampled_tokens(x, mask), mask)  # Φq Fᵀ F Φkᵀ
    attn, v = _attention_and_values(layer, x, mask)
    if kind == "softmax":
        return attn
    if kind == "gfsa":  # the filter H of GFSA v1 Eq. 5, in the official order
        return gfsa_dense_reference(attn, v, layer.w0, layer.w1, layer.wK, layer.order)[1]
    raise ValueError(f"unknown attention kind {kind!r}")


def real_block(matrix: Tensor, real: Tensor) -> Tensor:
    """(H, N, N) -> (H, n, n): the rows and columns of the n real tokens of one sequence."""
    return matrix[:, real][:, :, real]


def singular_values(matrix: Tensor, mask: Tensor) -> list:
    """σ_1 >= σ_2 >= ... of each sequence's real block, per head.

    Args:
        matrix: (B, H, N, N); mask (B, N) bool.
    Returns:
        B tensors (H, n_b), float64
    """
    # float64: the small singular values, which decide where the cumulative curve saturates,
    # are lost to rounding in float32 (relative accuracy ~1e-7 of σ_1).
    return [
        torch.linalg.svdvals(real_block(m, r).double()) for m, r in zip(matrix, mask, strict=True)
    ]


def cumulative_share(sigma: Tensor) -> Tensor:
    """Σ_{i<=k} σ_i / Σ_i σ_i along the last axis (the Primal-Attention spectrum figure)."""
    # clamp: an all-zero matrix (a head that outputs nothing) gives 0 / 0 otherwise
    return sigma.cumsum(-1) / sigma.sum(-1, keepdim=True).clamp_min(torch.finfo(sigma.dtype).tiny)


@torch.no_grad()
def agf_response(layer, x: Tensor, mask: Tensor, n_points: int = 199) -> dict:
    """The learned AGF filter: g(s) on (0, 1), θ̃_k, and where the data put s.

    Returns:
        dict: s (n_points,), g (n_points,), theta (K + 1,),
              s_seen: 5 %, 50 %, 95 % quantiles of s = sigmoid(x W_Σ) over real tokens (3,)
    """
    s, g = frequency_response(layer.poly_filter, n_points)
    # step 3 of AGFAttention.factors: s = sigmoid(X W_Σ); only where the data put s matters
    s_data = torch.sigmoid(layer.W_sigma(x[mask])).flatten().double()
    s_seen = torch.quantile(s_data, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    return dict(s=s, g=g, theta=layer.poly_filter.coefficients().detach(), s_seen=s_seen)


def gfsa_polynomial(a: Tensor, lam: Tensor) -> Tensor:
    """p(λ) = a0 + a1·λ + a2·λ² per head.   a (3, H), lam (H, n) or (n,) -> (H, n)."""
    return a[0, :, None] + a[1, :, None] * lam + a[2, :, None] * lam**2


@torch.no_grad()
def gfsa_response(layer, x: Tensor, mask: Tensor, n_points: int = 201) -> dict:
    """The GFSA filter H = p(Ā) as a function of the eigenvalues λ of Ā.

    Ā u = λ u gives Ā² u = λ² u, so H u = (a0 + a1 λ + a2 λ²) u = p(λ) u: H keeps Ā's
    eigenvectors and scales each by p(λ) (the collapsed form of GFSA v1 Eq. 5, gfsa.py).

    Returns:
        dict: a (3, H) = a0, a1, a2; lam (n_points,) on [-1, 1]; grid (H, n_points) = p(lam);
              eig: one (H, n_b) complex tensor of eigenvalues of Ā per sequence
    """
    a = torch.stack(
        [c.view(-1) for c in filter_coefficients(layer.w0, layer.w1, layer.wK, layer.order)]
    )
    a = a.double()  # (3, H)
    lam = torch.linspace(-1.0, 1.0, n_points, dtype=torch.float64)
    eig = []
    for i in range(len(x)):  # one sequence at a time, as in diagnose()
        attn, _ = _attention_and_values(layer, x[i : i + 1], mask[i : i + 1])  # (1, H, N, N)
        # float64: eigenvalues of a non-symmetric matrix are ill-conditioned, float32 blurs them
        eig.append(torch.linalg.eigvals(real_block(attn[0], mask[i]).double()))  # (H, n_b)
    return dict(a=a, lam=lam, grid=gfsa_polynomial(a, lam), eig=eig)


def off_dc_gains(a: Tensor, eig: Tensor) -> tuple[Tensor, Tensor]:
    """Mean gain over all eigenvalues but the top one (λ = 1, the constant vector), per head.

    Args:
        a: (3, H); eig: (H, n) complex.
    Returns:
        mean |p(λ)| / |p(1)| (GFSA), mean |λ| (Ā alone, whose gain at λ = 1 is 1); (H,) each
    """
    order = eig.real.argsort(dim=-1, descending=True)
    rest = eig.gather(-1, order[:, 1:])  # (H, n - 1): drop the Perron eigenvalue 1
    dc = gfsa_polynomial(a, torch.ones(1, dtype=torch.float64)).abs()[:, 0]  # |p(1)| (H,)
    # clamp: a filter with p(1) = 0 passes no constant component; the ratio is then undefined
    ratio = gfsa_polynomial(a, rest).abs().mean(-1) / dc.clamp_min(torch.finfo(dc.dtype).tiny)
    return ratio, rest.abs().mean(-1)


def diagnose(run: LoadedRun, dense_sequences: int = 8, n_points: int = 199) -> dict:
    """Every measure of the header on a loaded run.

    Args:
        run: from load_run.
        dense_sequences: how many sequences get the dense N x N analyses (spectra, eigenvalues).
        n_points: grid size of the filter responses.
    Returns:
        dict: kinds (L,), cosine (L + 1,), layers: one dict per block with kind, n (real tokens
        per dense sequence), sigma (list of (H, n_b)), and agf / gfsa (see agf_response,
        gfsa_response) for those kinds.
    """
    if dense_sequences < 1:
        raise ValueError(f"dense_sequences={dense_sequences}: the N x N analyses need >= 1")
    model, need = run.model, dense_sequences
    dense = [[] for _ in model.blocks]  # per layer: (x, mask) of the dense sequences
    for batch in run.batches:
        if need <= 0:
            break
        _, inputs = capture(model, batch)
        for store, (x, mask) in zip(dense, inputs, strict=True):
            store.append((x[:need], mask[:need]))
        need -= min(need, batch["x"].shape[0])
    layers = []
    for kind, block, store in zip(model.kinds, model.blocks, dense, strict=True):
        x, mask = torch.cat([x for x, _ in store]), torch.cat([m for _, m in store])
        sigma = []
        for i in range(len(x)):  # one at a time: (1, H, N, N) stays small for LRA's N = 2000+
            one_x, one_mask = x[i : i + 1], mask[i : i + 1]
            sigma += singular_values(implied_matrix(block.attn, kind, one_x, one_mask), one_mask)
        info = dict(kind=kind, n=mask.sum(1).tolist(), sigma=sigma)
        if kind == "agf":
            info["agf"] = agf_response(block.attn, x, mask, n_points)
        if kind == "gfsa":
            info["gfsa"] = gfsa_response(block.attn, x, mask, n_points)
        layers.append(info)
    return dict(kinds=list(model.kinds), cosine=cosine_curve(model, run.batches), layers=layers)


# ---------------------------------------------------------------------------------------------
# 4. Report: terminal summary, CSV files, PNG figures
# ---------------------------------------------------------------------------------------------


def _mean(values: list) -> float:
    return float(np.mean(values)) if values else float("nan")


def summary(run: LoadedRun, results: dict) -> list:
    """The readable summary, one string per line."""
    n_cases = sum(b["x"].shape[0] for b in run.batches)
    n_dense = len(results["layers"][0]["n"]) if results["layers"] else 0
    lines = [f"{run.label}: {n_cases} sequences, {n_dense} of them for the N x N analyses"]
    lines.append("over-smoothing: mean pairwise cosine similarity of real tokens (1 = all alike)")
    names = ["embedding", *results["kinds"]]
    for i, (name, cos) in enumerate(zip(names, results["cosine"].tolist(), strict=True)):
        lines.append(f"  layer {i:2d}  {name:9s} {cos:7.3f}")
    agf = [(i, layer["agf"]) for i, layer in enumerate(results["layers"], 1) if "agf" in layer]
    if agf:
        lines.append(
            "AGF filter g(s) = Σ θ̃_k P_k(s), s ∈ (0, 1); θ̃_k < 0 can pass high frequencies"
        )
    for i, r in agf:
        theta, g = r["theta"].tolist(), r["g"]
        negative = sum(t < 0 for t in theta[1:])
        lines.append(
            f"  layer {i:2d}: θ̃ = {' '.join(f'{t:+.3f}' for t in theta)}  "
            f"({negative} of {len(theta) - 1} negative for k >= 1)"
        )
        q05, q50, q95 = r["s_seen"].tolist()
        lines.append(
            f"            g = {g[0]:.3f} at s→0, {g[-1]:.3f} at s→1, range [{g.min():.3f}, "
            f"{g.max():.3f}]; s on the data 5/50/95 %: {q05:.2f}/{q50:.2f}/{q95:.2f}"
        )
    gfsa = [(i, layer["gfsa"]) for i, layer in enumerate(results["layers"], 1) if "gfsa" in layer]
    if gfsa:
        lines.append(
            "GFSA filter p(λ) = a0 + a1·λ + a2·λ² at the eigenvalues λ of Ā; off-DC gain = mean "
            "|p(λ)| / |p(1)| over λ ≠ 1 (Ā alone: mean |λ|)"
        )
    for i, r in gfsa:
        gains = [off_dc_gains(r["a"], eig) for eig in r["eig"]]  # per sequence: 2 x (H,)
        ours = torch.stack([g[0] for g in gains]).mean(0)  # (H,), mean over the sequences
        plain = torch.stack([g[1] for g in gains]).mean(0)
        for h, (a0, a1, a2) in enumerate(r["a"].T.tolist()):
            lines.append(
                f"  layer {i:2d} head {h}: a = ({a0:+.3f}, {a1:+.3f}, {a2:+.3f}), p(1) = "
                f"{a0 + a1 + a2:.3f}, off-DC gain {ours[h]:.3f} (Ā alone {plain[h]:.3f})"
            )
    lines.append(
        "implied N x N matrix per head on the tokens it attends to: share of σ_1, of the first "
        "5, and k where the cumulative share reaches 90 % (means over heads and sequences)"
    )
    for i, layer in enumerate(results["layers"], 1):
        shares = [cumulative_share(s) for s in layer["sigma"]]  # (H, n_b) each
        top1 = _mean([c[:, 0].mean().item() for c in shares])
        top5 = _mean([c[:, min(4, c.shape[1] - 1)].mean().item() for c in shares])
        k90 = _mean([((c < 0.9).sum(-1) + 1).double().mean().item() for c in shares])
        lines.append(
            f"  layer {i:2d}  {layer['kind']:8s} σ_1 {top1:.3f}  first 5 {top5:.3f}  "
            f"90 % at k = {k90:.1f} of n = {_mean(layer['n']):.1f}"
        )
    return lines


def write_csv(path: pathlib.Path, header: list, rows) -> pathlib.Path:
    """One CSV file; floats with 6 significant digits."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for row in rows:
            writer.writerow([f"{v:.6g}" if isinstance(v, float) else v for v in row])
    return path


def write_csvs(results: dict, out: pathlib.Path) -> list:
    """The CSV files of the header (the AGF and GFSA ones only for models that have them)."""
    names = ["embedding", *results["kinds"]]
    cosine = [(i, names[i], c) for i, c in enumerate(results["cosine"].tolist())]
    paths = [write_csv(out / "cosine_similarity.csv", ["layer", "kind", "cosine"], cosine)]
    spectra, agf_g, agf_theta, gfsa_a, gfsa_grid, gfsa_eig = [], [], [], [], [], []
    for i, layer in enumerate(results["layers"], 1):
        for b, sigma in enumerate(layer["sigma"]):
            for h, (row, share) in enumerate(
                zip(sigma.tolist(), cumulative_share(sigma).tolist(), strict=True)
            ):
                spectra += [
                    (i, layer["kind"], b, h, k, *sc)
                    for k, sc in enumerate(zip(row, share, strict=True))
                ]
        if "agf" in layer:
            r = layer["agf"]
            agf_g += [(i, s, g) for s, g in zip(r["s"].tolist(), r["g"].tolist(), strict=True)]
            agf_theta += [(i, k, t) for k, t in enumerate(r["theta"].tolist())]
        if "gfsa" in layer:
            r = layer["gfsa"]
            for h, row in enumerate(r["grid"].tolist()):
                gfsa_a.append((i, h, *r["a"][:, h].tolist()))
                gfsa_grid += [(i, h, lam, p) for lam, p in zip(r["lam"].tolist(), row, strict=True)]
            for b, eig in enumerate(r["eig"]):
                gain = gfsa_polynomial(r["a"], eig).abs().tolist()  # (H, n_b)
                for h, (lams, gains) in enumerate(zip(eig.tolist(), gain, strict=True)):
                    gfsa_eig += [
                        (i, b, h, lam.real, lam.imag, abs(1 - lam), g, abs(lam))
                        for lam, g in zip(lams, gains, strict=True)
                    ]
    tables = {
        "singular_values": (
            ["layer", "kind", "sequence", "head", "index", "sigma", "cumulative"],
            spectra,
        ),
        "agf_filter": (["layer", "s", "g"], agf_g),
        "agf_theta": (["layer", "k", "theta"], agf_theta),
        "gfsa_coefficients": (["layer", "head", "a0", "a1", "a2"], gfsa_a),
        "gfsa_filter": (["layer", "head", "lambda", "p"], gfsa_grid),
        "gfsa_eigenvalues": (
            ["layer", "sequence", "head", "real", "imag", "frequency", "gain", "gain_attn"],
            gfsa_eig,
        ),
    }
    for name, (header, rows) in tables.items():
        if rows:
            paths.append(write_csv(out / f"{name}.csv", header, rows))
    return paths


def _pyplot():
    """matplotlib.pyplot for writing files, or None (with a message) when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no window
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: CSV files only (pip install matplotlib for figures)")
        return None
    return plt


def plot(results: dict, out: pathlib.Path, title: str = "") -> list:
    """PNG figures of the CSV contents -> their paths; none without matplotlib."""
    plt, paths = _pyplot(), []
    if plt is None:
        return paths

    def save(fig, name: str) -> None:
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        paths.append(out / name)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(range(len(results["cosine"])), results["cosine"].tolist(), "o-")
    ax.set(xlabel="layer (0 = embedding)", ylabel="mean cosine similarity", ylim=(-0.05, 1.05))
    save(fig, "cosine_similarity.png")
    layers = list(enumerate(results["layers"], 1))
    agf = [(i, layer["agf"]) for i, layer in layers if "agf" in layer]
    if agf:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for i, r in agf:
            ax.plot(r["s"].tolist(), r["g"].tolist(), label=f"layer {i}")
        ax.set(xlabel="s = sigmoid(x W_Σ)", ylabel="g(s)", title="AGF filter response")
        ax.legend()
        save(fig, "agf_filter.png")
    gfsa = [(i, layer["gfsa"]) for i, layer in layers if "gfsa" in layer]
    if gfsa:
        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
        left.plot(gfsa[0][1]["lam"].tolist(), gfsa[0][1]["lam"].tolist(), "k--", label="Ā alone")
        for i, r in gfsa:
            eig = torch.cat(r["eig"], dim=1)  # (H, all eigenvalues of all dense sequences)
            gain = gfsa_polynomial(r["a"], eig).abs()
            for h, row in enumerate(r["grid"].tolist()):
                line = left.plot(r["lam"].tolist(), row, label=f"layer {i} head {h}")[0]
                frequency = (1 - eig[h]).abs().tolist()  # same colour as the curve on the left
                right.plot(frequency, gain[h].tolist(), ".", color=line.get_color(), markersize=3)
        left.set(xlabel="λ", ylabel="p(λ)", title="GFSA filter on λ ∈ [-1, 1]")
        left.legend(fontsize=7)
        right.set(xlabel="|1 - λ| (0 = constant vector)", ylabel="|p(λ)|", title="at Ā's λ")
        save(fig, "gfsa_filter.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for i, layer in layers:
        width = max(s.shape[1] for s in layer["sigma"])
        # shorter sequences have reached 1 already: pad their curves with 1 before averaging
        curves = [
            torch.nn.functional.pad(cumulative_share(s), (0, width - s.shape[1]), value=1.0)
            for s in layer["sigma"]
        ]
        ax.plot(torch.cat(curves).mean(0).tolist(), label=f"layer {i} {layer['kind']}")
    ax.set(xlabel="singular value index", ylabel="normalised cumulative sum", ylim=(0, 1.02))
    ax.legend(fontsize=7)
    save(fig, "singular_values.png")
    return paths


# ---------------------------------------------------------------------------------------------
# 5. The depth experiment: does the last layer over-smooth as models get deeper?
# ---------------------------------------------------------------------------------------------

# Settings that may differ between a finished run and a new request for the same run.
FREE = ("out", "progress", "threads", "device", "resume", "data_dir")


def _train_or_reuse(cfg, out: pathlib.Path) -> dict:
    """train_uea.main(cfg) with its output in <out>/train.log, or the finished run's result."""
    import train_uea

    done = out / "result.json"
    if done.exists():
        result = json.loads(done.read_text())
        asked = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in FREE}
        if {k: result["config"].get(k) for k in asked} == asked:
            return result
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "w") as log, contextlib.redirect_stdout(log):
        return train_uea.main(cfg)


def depth_experiment(args: argparse.Namespace) -> list:
    """Train every (attention, depth) on a UEA dataset; last-layer cosine similarity and accuracy.

    Each run is train_uea.py with --preset quick (D = 64, 2 heads) and the given depth and epochs;
    the cosine similarity is measured on every TEST sequence. A run whose folder already holds a
    result.json with the same settings is reused, so the grid can be filled one attention at a
    time and the table printed again at no cost.
    """
    import train_uea

    rows, out = [], pathlib.Path(args.out or f"runs/depth/{args.dataset}")
    for attention in args.attentions:
        for depth in args.depths:
            folder = out / f"{attention}-L{depth}"
            argv = (
                f"--dataset {args.dataset} --preset quick --attention {attention} --n-layers "
                f"{depth} --epochs {args.epochs} --seed {args.seed} --threads {args.threads} "
                "--progress false"
            ).split()
            argv += ["--data-dir", args.data_dir, "--out", str(folder)]
            cfg = train_uea.parse_config(argv + shlex.split(args.train_args))
            result = _train_or_reuse(cfg, folder)
            run = load_run(folder, args.data_dir, "test", None, 64)  # every TEST sequence
            cosine = cosine_curve(run.model, run.batches).tolist()
            rows.append(
                dict(
                    attention=attention,
                    n_layers=depth,
                    cos_last=round(cosine[-1], 4),
                    best_test_acc=round(result["best_test_acc"], 4),
                    final_test_acc=round(result["final_test_acc"], 4),
                    cos_per_layer=" ".join(f"{c:.3f}" for c in cosine),  # embedding first
                    n_params=result["n_params"],
                    train_s=result["wall_s"],  # training + evaluation, from result.json
                )
            )
            r = rows[-1]
            print(
                f"{attention:12s} L={depth}: cosine per layer {r['cos_per_layer']} | best test "
                f"acc {r['best_test_acc']:.4f}, final {r['final_test_acc']:.4f} | "
                f"trained in {r['train_s']} s",
                flush=True,
            )
    print(
        f"\nlast-layer cosine similarity / best test accuracy %, {args.dataset}, {args.epochs} ep."
    )
    print(f"{'attention':12s}" + "".join(f"{f'L={d}':>16s}" for d in args.depths))
    for attention in args.attentions:
        cells = [r for r in rows if r["attention"] == attention]
        line = "".join(f"{r['cos_last']:9.3f} / {100 * r['best_test_acc']:4.1f}" for r in cells)
        print(f"{attention:12s}{line}")
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "depth.csv", list(rows[0]), (list(r.values()) for r in rows))
    print(f"wrote {out / 'depth.csv'}")
    plt = _pyplot()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for attention in args.attentions:
            cells = [r for r in rows if r["attention"] == attention]
            ax.plot(
                [r["n_layers"] for r in cells],
                [r["cos_last"] for r in cells],
                "o-",
                label=attention,
            )
        ax.set(xlabel="layers", ylabel="last-layer cosine similarity", title=args.dataset)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "depth.png", dpi=120)
        plt.close(fig)
        print(f"wrote {out / 'depth.png'}")
    return rows


# ---------------------------------------------------------------------------------------------
# 6. Command line
# ---------------------------------------------------------------------------------------------


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help keeps the docstring's layout and shows every default."""


def parse_args(argv: Optional[list]) -> tuple[str, argparse.Namespace]:
    """("inspect", args) for `diagnose.py RUN ...`, ("depth", args) for `diagnose.py depth ...`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["depth"]:
        p = argparse.ArgumentParser("diagnose.py depth", description=depth_experiment.__doc__)
        p.formatter_class, add = _Help, p.add_argument
        add("--dataset", default="JapaneseVowels", help="UEA dataset")
        add("--data-dir", default="data/uea", help="holds <Name>/<Name>_TRAIN.ts, as train_uea")
        add("--depths", type=int, nargs="+", default=[2, 4, 8], help="numbers of layers")
        add("--attentions", nargs="+", default=list(KINDS), choices=KINDS, help="kinds to train")
        add("--epochs", type=int, default=10, help="training epochs per run")
        add("--seed", type=int, default=666, help="seed of every run (train_uea.py's default)")
        add("--threads", type=int, default=1, help="CPU threads (1 is fastest for tiny models)")
        add("--train-args", default="", help='more train_uea.py flags, e.g. "--lr 5e-4"')
        add("--out", default="", help="one folder per run inside; '' = runs/depth/<dataset>")
        return "depth", p.parse_args(argv[1:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=_Help)
    add = p.add_argument
    add("run", help="run folder of train_uea.py / train_lra.py, or its checkpoint.pt / best.pt")
    add("--data-dir", default=None, help="where the run's data is now (None = its --data-dir)")
    add("--split", default="test", choices=("test", "train"), help="which data to look at")
    add("--batches", type=int, default=4, help="batches for the cosine similarity")
    add("--batch-size", type=int, default=16, help="sequences per batch")
    add("--dense", type=int, default=8, help="sequences for the N x N analyses")
    add("--points", type=int, default=199, help="grid size of the filter responses")
    add("--device", default="cpu", help="cpu | cuda")
    add("--out", default="", help="output folder ('' = <run>/diagnose)")
    return "inspect", p.parse_args(argv)


def main(argv: Optional[list] = None):
    """Inspect one run (-> the results dict) or run the depth experiment (-> its rows)."""
    command, args = parse_args(argv)
    if command == "depth":
        return depth_experiment(args)
    n_cases = args.batches * args.batch_size
    run = load_run(args.run, args.data_dir, args.split, n_cases, args.batch_size, args.device)
    results = diagnose(run, args.dense, args.points)
    lines = summary(run, results)
    print("\n".join(lines))
    out = pathlib.Path(args.out) if args.out else run.folder / "diagnose"
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.txt").write_text("\n".join(lines) + "\n")
    paths = write_csvs(results, out) + plot(results, out, run.label)
    print(f"wrote summary.txt and {len(paths)} files to {out}: {' '.join(p.name for p in paths)}")
    return results


if __name__ == "__main__":
    main()
