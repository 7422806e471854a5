"""
diagnose.py: look inside trained runs: over-smoothing, filter responses and spectra.

    python diagnose.py runs/JapaneseVowels/agf-quick-seed666      # a run folder of train_*.py
    python diagnose.py runs/depth/*        # several runs: each one, then a comparison table

- over-smoothing: mean pairwise cosine of the real tokens after each block (1 = all alike; GFSA
  v1 Figs. 2, 4, 5 (b)). AGF: g(s) = Σ θ̃_k P_k(s) on (0, 1), θ̃_k < 0 passes high frequencies.
- GFSA filter: p(λ) = a0 + a1·λ + a2·λ², so G = p(Ā) (GFSA v1 Eqs. 4, 5; λ^K for the exact
  filter), on λ ∈ [-1, 1] and at the eigenvalues of the dense Ā of real sequences (Figs. 2, 4, 5).
  They are complex (Ā is not symmetric): the gain |p(λ)| (|λ| for Ā alone) is shown against
  |1 - λ|, the distance from the eigenvalue 1 of the constant vector (0 = smooth, 2 = alternating).
  The "off-DC gain", mean |p(λ)| / |p(1)| over the other λ, is how much of the non-constant part
  of a signal the filter keeps (Ā alone: mean |λ|; near 0 = strongly low-pass).
- spectra: the normalised cumulative sum Σ_{i<=k} σ_i / Σ_i σ_i of the singular values of each
  layer's N x N matrix (Primal-Attention's spectrum figure); reaching 1 early = low effective
  rank. Per head, on the real tokens (all steps if trained with --no-attention-mask): softmax Ā;
  AGF A = U diag(g) Vᵀ; GFSA G = w0·I + w1·Ā + wK·Ā^K (estimated or exact); Primal Φq Fᵀ F Φkᵀ.

RUN: a run folder, its checkpoint.pt or an LRA best.pt. LRA: best.pt's weights (those the run
tested), or checkpoint.pt's with --weights last; UEA: checkpoint.pt (the last epoch). The summary
names the split, the file and step or epoch, with the result.json accuracies of those weights.
What a glob matches that is no run (comparison.csv, PNGs), or a run it cannot read, is skipped,
with a note. Writes summary.txt and each figure as CSV (and PNG) to <run>/diagnose/ (--split
train: train/ in it; then LRA --weights last: last/ in that) or OUT/<run name>/; several runs add
comparison.csv (--split train: comparison_train.csv) and a cosine_per_layer plot beside them.
Ctrl-C keeps the files of the runs diagnosed (each file is written whole or not at all).
Dims: B batch, N tokens, D width, H heads, d = D/H. Depends on torch, numpy, model.py, the four
mechanism files, lra_data.py and uea_data.py (to read a split's inputs), runs.py (Ctrl-C's line);
matplotlib optional.
"""

import argparse
import csv
import functools
import io
import json
import os
import pathlib
from collections import namedtuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

import files
import lra_data
import runs
import uea_data
from agf import agf_dense_reference
from gfsa import attention_matrix, filter_coefficients, gfsa_dense_reference
from ksvd_attention import ksvd_kernel
from model import Classifier, ModelConfig, layerwise_cosine_similarity
from polynomials import frequency_response

# 1. Rebuild a trained model and a few batches of its data from a run ---------------------------
# LoadedRun: model (Classifier, eval mode); batches (dicts x, mask (B, N) bool [, x2, mask2], on
# the model's device); label (str); folder (the run's); accuracy (the result.json accuracies of
# the weights analysed, by protocol name); weights (str: which file, step or epoch).
LoadedRun = namedtuple(
    "LoadedRun", "model batches label folder accuracy weights", defaults=[{}, ""]
)


class NotARun(Exception):
    """A RUN that is no run (a folder without checkpoint.pt or best.pt): skipped with a note."""


def _say(*lines: str) -> None:
    """Print lines; a closed stdout (`| head`) silences the rest and the files are still written."""
    try:
        for line in lines:
            print(line, flush=True)
    except BrokenPipeError:  # stdout to /dev/null from here: Python's last flush says nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # fd 1: stdout


def _fail(message: str):
    """Stop with one line on stderr and exit status 1, no traceback: for bad input."""
    raise SystemExit("error: " + " ".join(message.split()))


def read_checkpoint(path, weights: str | None = None) -> tuple[dict, pathlib.Path]:
    """(the checkpoint dict, its file) of a run folder, its checkpoint.pt or best.pt. In a
    folder: best.pt where there is one, else checkpoint.pt; weights "best" or "last" insists."""
    path = pathlib.Path(path)
    if path.is_dir():
        best, last = path / "best.pt", path / "checkpoint.pt"
        if weights == "best" and not best.is_file() and last.is_file():
            why = "a UEA run keeps only its last epoch's checkpoint.pt"
            _fail(f"{path} has no best.pt ({why}): use --weights last")
        file = best if weights != "last" and best.is_file() else last
        if not file.is_file():
            raise NotARun(f"{path} is a folder without checkpoint.pt or best.pt")
    elif path.is_file():
        file = path
    else:
        _fail(f"{path} is no run folder of train_uea.py / train_lra.py, checkpoint.pt or best.pt")
    try:  # weights_only: tensors, numbers, strings and their containers; more could run code
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, empty, not a torch file: name the file
        unsafe = runs.refused(e)  # what torch refused to unpickle
        if unsafe:
            what = "which no checkpoint of train_uea.py / train_lra.py holds"
            _fail(f"{file} asks for {unsafe}, {what}: it is not read, as it could run code")
        _fail(f"{file} cannot be read as a checkpoint ({type(e).__name__}: {e!s:.99})")
    if not isinstance(ckpt, dict) or not {"model", "model_config", "data"} <= set(ckpt):
        why = "it was written by an older train_*.py, before checkpoints said what they hold"
        _fail(f"{file} holds no model settings beside its weights: {why}; train that run again")
    kept = "last" if "optimizer" in ckpt else "best"  # checkpoint.pt: to resume; best.pt: not
    if weights and weights != kept:
        _fail(f"{file} holds the {kept} weights, not --weights {weights}: name the run folder")
    return ckpt, file


def which_weights(ckpt: dict, file: pathlib.Path) -> tuple[str, dict]:
    """(which weights: file, step or epoch; the result.json accuracies of exactly them): LRA
    best.pt val_acc, test_acc, its last step final_val_acc; UEA's last epoch final_test_acc (not
    best_test_acc, another epoch's); none from a result.json of another step or epoch."""
    result = file.parent / "result.json"
    result = json.loads(result.read_text()) if result.is_file() else {}
    if "optimizer" not in ckpt:  # best.pt; the training script may write its step beside it
        step = ckpt.get("step", result.get("best_step"))
        val, test = ckpt.get("val_acc", result.get("val_acc")), result.get("test_acc")
        accuracy = {k: v for k, v in dict(val_acc=val, test_acc=test).items() if v is not None}
        return f"{file.name} ({'' if step is None else f'step {step}, '}best val_acc)", accuracy
    state, uea = ckpt.get("state", {}), "name" in ckpt["data"]
    at, key = ("epoch", "final_test_acc") if uea else ("step", "final_val_acc")
    done = at in state and result.get(f"{at}s") == state[at]  # result.json's epochs or steps
    return f"{file.name} ({at} {state.get(at, '?')}, last)", {key: result[key]} if done else {}


def _spread(n_real: np.ndarray, n_cases: int | None) -> np.ndarray:
    """Indices of n_cases sequences with >= 2 real tokens, evenly spaced over the split."""
    # Evenly spaced, not the first n: split files are often sorted (JapaneseVowels TEST is sorted
    # by speaker), and the first cases alone can give a cosine similarity far from the split's.
    candidates = np.flatnonzero(n_real >= 2)
    n = len(candidates) if n_cases is None else min(n_cases, len(candidates))
    return candidates[np.linspace(0, len(candidates) - 1, n).round().astype(int)]


def load_run(
    path, data_dir=None, split="test", n_cases=64, batch_size=16, device="cpu", weights=None
):
    """A run's model rebuilt from its saved settings (model.py) with its weights (read_checkpoint),
    and n_cases sequences of `split` (None: all; _spread) from data_dir (None: the run's)."""
    ckpt, file = read_checkpoint(path, weights)
    folder = file.parent
    data_args = dict(ckpt["data"], **({"data_dir": data_dir} if data_dir else {}))
    uea = "name" in data_args  # uea_data.load_uea(data_dir, name, max_len), else a LRA task
    try:  # (a generated ListOps that is missing is generated again, seeded, as in training)
        data = uea_data.load_uea(**data_args) if uea else lra_data.load_task(**data_args)[0]
    except uea_data.DatasetNotFoundError as e:  # one line (a link to nowhere, say): as it is
        where = f"{data_args['name']} is not in {data_args['data_dir']}"
        _fail(f"UEA dataset {where}: point --data-dir at its data" if "\n" in str(e) else str(e))
    except (uea_data.TsFormatError, lra_data.DataError) as e:
        _fail(f"{e} (point --data-dir at the data of {folder})")
    if uea:
        x, mask = getattr(data, f"x_{split}"), getattr(data, f"mask_{split}")
        index = _spread(mask.sum(1), n_cases)
        tensors = {"x": torch.from_numpy(x[index]), "mask": torch.from_numpy(mask[index])}
    else:  # choose the sequences first: a whole split as int64 tensors can take GBs
        chosen = data[split]
        real = chosen.lengths if chosen.x2 is None else np.minimum(chosen.lengths, chosen.lengths2)
        index = _spread(real, n_cases)
        tensors = {k: torch.from_numpy(v) for k, v in chosen.batch(index).items() if k != "y"}
    if not len(index):
        _fail(f"no sequence of the {split} split of {folder} has 2 real tokens")
    model = Classifier(ModelConfig(**ckpt["model_config"]))
    try:
        model.load_state_dict(ckpt["model"])
    except Exception as e:  # the weights of another model, or no state_dict at all
        _fail(f"the weights of {folder} do not fit the model of its settings ({e!r:.150})")
    chunks = torch.arange(len(index)).split(batch_size)
    batches = [{k: v[c].to(device) for k, v in tensors.items()} for c in chunks]
    name = data_args["name"] if uea else data_args["task"]
    label = f"{name} {split}, attention {model.cfg.attention}, {model.cfg.n_layers} layers"
    kept, accuracy = which_weights(ckpt, file)
    return LoadedRun(model.to(device).eval(), batches, label, folder, accuracy, kept)


# 2. What each attention layer sees, and the measures -------------------------------------------
@torch.no_grad()
def capture(model: Classifier, batch: dict) -> tuple[list, list]:
    """Hidden states [embedding, block 1, ..., block L] (B, N, D) of tower 1 and per block its
    attention's input (x (B, N, D), mask (B, N); all True for a None mask: it sees every step)."""
    inputs: dict = {}

    def hook(module, args) -> None:  # tower 1 runs first: keep only its input of each block
        inputs.setdefault(module, args)

    hooks = [block.attn.register_forward_pre_hook(hook) for block in model.blocks]  # removed below
    try:
        out = model(batch["x"], batch["mask"], batch.get("x2"), batch.get("mask2"), True)
    finally:
        for handle in hooks:
            handle.remove()
    hidden, every = (out[2][0] if model.cfg.two_tower else out[2]), torch.ones_like(batch["mask"])
    seen = [inputs[block.attn] for block in model.blocks]
    return hidden, [(x, every if mask is None else mask) for x, mask in seen]


@torch.no_grad()
def implied_matrix(layer: torch.nn.Module, kind: str, x: Tensor, mask: Tensor) -> Tensor:
    """The N x N matrix of a layer of `kind` (header; "softmax" on GFSA: its Ā) per head, for x
    (B, N, D), mask (B, N) bool -> (B, H, N, N); only the real tokens' rows and columns count."""
    if kind == "agf":
        return agf_dense_reference(layer, x, mask)[1]  # A = U diag(g) Vᵀ
    if kind == "primal":  # as PrimalAttention.scores: padded rows zeroed, then φ_q, φ_k and f(X)
        x = x.to(layer.W_q.weight.dtype).masked_fill(~mask[..., None], 0.0)
        phi_q, phi_k = layer.feature_maps(x, mask)  # (B, H, N, d) each
        return ksvd_kernel(phi_q, phi_k, layer.sampled_tokens(x, mask), mask)  # Φq Fᵀ F Φkᵀ
    B, N, D = x.shape  # softmax and GFSA: split the fused projection, (B, H, N, d) each
    q, k, v = layer.W_qkv(x).view(B, N, 3, layer.n_heads, -1).permute(2, 0, 3, 1, 4)
    attn = attention_matrix(q, k, mask, layer.causal, getattr(layer, "kernel", "softmax"))
    if kind == "gfsa":  # the filter G (the paper's H) of Eq. 5, official order
        exact = layer.high_order == "exact"  # the real Ā^K, or Eq. 4's estimate
        return gfsa_dense_reference(attn, v, layer.w0, layer.w1, layer.wK, layer.order, exact)[1]
    return attn


def agf_response(layer, x: Tensor, mask: Tensor, n_points: int = 199) -> dict:
    """The learned AGF filter -> dict: s, g (n_points,) = g(s) on (0, 1); theta (K + 1,) = θ̃_k;
    s_seen (3,) = the 5 %, 50 %, 95 % quantiles of s = sigmoid(x W_Σ) over the real tokens."""
    s, g = frequency_response(layer.poly_filter, n_points)
    # step 3 of AGFAttention.factors: s = sigmoid(X W_Σ); only where the data put s matters
    s_data = torch.sigmoid(layer.W_sigma(x[mask])).flatten().double().cpu()
    s_seen = torch.quantile(s_data, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64))
    theta = layer.poly_filter.coefficients().detach().cpu()
    return dict(s=s.cpu(), g=g.cpu(), theta=theta, s_seen=s_seen)


def gfsa_response(layer, x: Tensor, mask: Tensor, n_points: int = 199) -> dict:
    """The GFSA filter as a function of the eigenvalues λ of Ā: Ā u = λ u gives Ā² u = λ² u, so
    G u = p(λ) u, G keeps Ā's eigenvectors and scales each by p(λ) = a0 + a1 λ + a2 λ^power
    (power 2; K with a = w0, w1, wK for high_order="exact"). -> dict: a (3, H), power, lam
    (n_points,) on [-1, 1]; grid (H, n_points) = p(lam); eig: per sequence (H, n_b)."""
    power = layer.order if layer.high_order == "exact" else 2
    w = (layer.w0, layer.w1, layer.wK)
    a = w if power != 2 else filter_coefficients(*w, layer.order)
    a = torch.stack([c.view(-1) for c in a]).detach().double().cpu()  # (3, H)
    lam, eig = torch.linspace(-1.0, 1.0, n_points, dtype=torch.float64), []
    for b, real in enumerate(mask):  # one sequence at a time: (1, H, N, N) stays small
        attn = implied_matrix(layer, "softmax", x[b : b + 1], mask[b : b + 1])[0]
        # float64: eigenvalues of a non-symmetric matrix are ill-conditioned, float32 blurs them
        eig.append(torch.linalg.eigvals(attn[:, real][:, :, real].double()).cpu())  # (H, n_b)
    grid = a[0, :, None] + a[1, :, None] * lam + a[2, :, None] * lam**power  # (H, n_points)
    return dict(a=a, power=power, lam=lam, grid=grid, eig=eig)


@torch.no_grad()
def diagnose(run: LoadedRun, dense_sequences: int = 8, n_points: int = 199) -> dict:
    """Every measure of the header -> dict, on the CPU: kinds (L,); cosine (L + 1,), embedding
    first; layers: per block kind, n (real tokens of the first dense_sequences sequences), sigma
    (their σ, (H, n_b) each), spectrum (mean cumulative share), agf / gfsa (*_response)."""
    model, total, dense = run.model, 0.0, []
    for batch in run.batches:
        hidden, inputs = capture(model, batch)
        n = len(batch["x"])  # model.py gives the batch mean; weighted by n: the mean of all
        total = total + layerwise_cosine_similarity(hidden, batch["mask"]).double().cpu() * n
        if inputs and sum(len(d[0][0]) for d in dense) < dense_sequences:
            dense.append(inputs)
    layers = []
    for i, (kind, block) in enumerate(zip(model.kinds, model.blocks, strict=True)):
        x, mask = (torch.cat([inputs[i][j] for inputs in dense])[:dense_sequences] for j in (0, 1))
        sigma = []
        for b, real in enumerate(mask):  # one at a time: (1, H, N, N) stays small for LRA's N
            matrix = implied_matrix(block.attn, kind, x[b : b + 1], mask[b : b + 1])[0]
            # float64: the small σ that decide where the curve saturates are lost in float32
            sigma.append(torch.linalg.svdvals(matrix[:, real][:, :, real].double()).cpu())
        # Σ_{i<=k} σ_i / Σ σ_i (clamp: 0 / 0 for an all-zero head); pad with 1 (shorter: done)
        width, tiny = max(s.shape[1] for s in sigma), torch.finfo(torch.float64).tiny
        shares = [s.cumsum(-1) / s.sum(-1, keepdim=True).clamp_min(tiny) for s in sigma]
        spectrum = torch.cat([F.pad(c, (0, width - c.shape[1]), value=1.0) for c in shares]).mean(0)
        layers.append(dict(kind=kind, n=mask.sum(1).tolist(), sigma=sigma, spectrum=spectrum))
        response = {"agf": agf_response, "gfsa": gfsa_response}.get(kind)  # its filter, if any
        if response and getattr(block.attn, "poly_filter", True) is not None:  # AGF "uv", "svd"
            layers[-1][kind] = response(block.attn, x, mask, n_points)
    n_cases = sum(len(batch["x"]) for batch in run.batches)
    return dict(kinds=list(model.kinds), cosine=total / n_cases, layers=layers)


# 3. Report: terminal summary, each figure's data as CSV and PNG --------------------------------
def summary(run: LoadedRun, results: dict) -> list:
    """The readable summary, one string per line."""
    n_cases, n_dense = sum(len(b["x"]) for b in run.batches), len(results["layers"][0]["n"])
    lines = [f"{run.label}: {n_cases} sequences, {n_dense} of them for the N x N analyses"]
    add = lines.append
    if run.weights:  # which file and step or epoch, and the result.json accuracies of just them
        accuracy = ", ".join(f"{k} {v:.4f}" for k, v in run.accuracy.items())
        add(f"weights: {run.weights}: {accuracy or 'result.json has no accuracy of them'}")
    add("cosine of the real tokens (1 = all alike); spectrum of the N x N matrix, mean over")
    add("heads and sequences: σ_1's share, k where Σ_{i<=k} σ_i / Σ σ_i reaches 90 %")
    add("layer  kind        cosine   σ_1 share   90 % at k of n")
    for i, cos in enumerate(results["cosine"].tolist()):
        add(f"{i:5d}  {(['embedding', *results['kinds']])[i]:9s}  {cos:7.3f}")
        if i:  # block i: its spectrum
            c, n = results["layers"][i - 1]["spectrum"], np.mean(results["layers"][i - 1]["n"])
            lines[-1] += f"   {c[0]:9.3f}   {int((c < 0.9).sum()) + 1:4d} of {n:.1f}"
    for i, layer in enumerate(results["layers"], 1):
        if "agf" in layer:
            theta, g = layer["agf"]["theta"], layer["agf"]["g"]
            seen = "/".join(f"{q:.2f}" for q in layer["agf"]["s_seen"])  # 5, 50, 95 % quantiles
            neg = f"{int((theta < 0).sum())} of {len(theta)} < 0"  # θ̃_0 too
            add(f"AGF layer {i}: θ̃ = {' '.join(f'{t:+.3f}' for t in theta)} ({neg})")
            add(f"  g(s) = Σ θ̃_k P_k(s): {g[0]:.3f} at s→0, {g[-1]:.3f} at s→1")
            add(f"  range [{g.min():.3f}, {g.max():.3f}]; s on the data 5/50/95 %: {seen}")
        gfsa = layer.get("gfsa")
        if gfsa:
            # every λ but each sequence's largest, the λ = 1 of the constant vector: (H, ...)
            rest = [e.gather(1, e.real.argsort(1, descending=True)[:, 1:]) for e in gfsa["eig"]]
            rest, power = torch.cat(rest, dim=1), gfsa["power"]
            add(f"GFSA layer {i}: p(λ) = a0 + a1·λ + a2·λ^{power}, off-DC gain: mean |p(λ)/p(1)|")
            for h, (a0, a1, a2) in enumerate(gfsa["a"].T.tolist()):
                lam = rest[h]  # off-DC gain: what G keeps of a non-constant signal
                gain = (a0 + a1 * lam + a2 * lam**power).abs().mean() / abs(a0 + a1 + a2)
                a = f"a = ({a0:+.3f}, {a1:+.3f}, {a2:+.3f}), p(1) = {a0 + a1 + a2:.3f}"
                add(f"  head {h}: {a}, off-DC gain {gain:.3f}, Ā alone {lam.abs().mean():.3f}")
    return lines


def figures(results: dict) -> list:
    """What the figures show: a list of figures, each a list of panels (name, x name, y name,
    style, {curve label: (x values, y values)}); AGF and GFSA ones only for models with them."""
    layers, cosine = list(enumerate(results["layers"], 1)), results["cosine"].tolist()
    curve = {" ".join(["embedding", *results["kinds"]]): (range(len(cosine)), cosine)}
    out = [[("cosine_similarity", "layer", "mean cosine similarity", "o-", curve)]]
    agf = {f"layer {i}": (r["agf"]["s"], r["agf"]["g"]) for i, r in layers if "agf" in r}
    if agf:
        out.append([("agf_filter", "s = sigmoid(x W_sigma)", "g(s)", "-", agf)])
    grid, gains = {}, {}
    for i, r in [(i, layer["gfsa"]) for i, layer in layers if "gfsa" in layer]:
        eig = torch.cat(r["eig"], dim=1)  # (H, the eigenvalues of all dense sequences)
        for h, ((a0, a1, a2), lam) in enumerate(zip(r["a"].T.tolist(), eig, strict=True)):
            grid[f"layer {i} head {h}"] = (r["lam"], r["grid"][h])
            p = a0 + a1 * lam + a2 * lam ** r["power"]
            gains[f"layer {i} head {h}"] = ((1 - lam).abs(), p.abs())
            grid.setdefault("A alone: p(lambda) = lambda", (r["lam"], r["lam"]))
    at_eigenvalues = ("gfsa_eigenvalues", "|1 - lambda|", "|p(lambda)|", ".", gains)
    if grid:
        out.append([("gfsa_filter", "lambda", "p(lambda)", "-", grid), at_eigenvalues])
    ranked = {f"layer {i} {r['kind']}": r["spectrum"] for i, r in layers}
    spectra = {k: (range(1, len(c) + 1), c) for k, c in ranked.items()}
    return out + [[("singular_values", "k", "cumulative share of sigma", "-", spectra)]]


def write_csv(path: pathlib.Path, header: list, rows) -> pathlib.Path:
    """One CSV file; floats with 6 significant digits."""
    text = io.StringIO()
    rows = ([f"{v:.6g}" if isinstance(v, float) else v for v in row] for row in rows)
    csv.writer(text).writerows([header, *rows])
    files.write(path, text.getvalue())
    return path


def save_figures(data: list, out: pathlib.Path, title: str = "") -> list:
    """Each panel as <name>.csv (curve, x, y), with matplotlib each figure as PNG -> the paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no window
        import matplotlib.pyplot as plt
    except ImportError:
        _say("matplotlib is not installed: CSV files only (pip install matplotlib for figures)")
        plt = None
    paths = []
    for panels in data:
        for name, x, y, _, curves in panels:
            pairs = [(label, zip(us, vs, strict=True)) for label, (us, vs) in curves.items()]
            rows = [(label, float(u), float(v)) for label, uv in pairs for u, v in uv]
            paths.append(write_csv(out / f"{name}.csv", ["curve", x, y], rows))
        if plt is None:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.5), squeeze=False)
        for ax, (name, x, y, style, curves) in zip(axes[0], panels, strict=True):
            for label, (xs, ys) in curves.items():
                xs, ys = torch.as_tensor(xs).tolist(), torch.as_tensor(ys).tolist()
                ax.plot(xs, ys, style, label=label, markersize=3)
            ax.set(title=name, xlabel=x, ylabel=y)
            ax.legend(fontsize=7)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        png = out / f"{panels[0][0]}.png"
        files.write(png, functools.partial(fig.savefig, dpi=120, format="png"))
        paths.append(png)
        plt.close(fig)
    return paths


# 4. Several runs side by side, and the command line --------------------------------------------
def comparison_table(rows: list) -> tuple[list, list]:
    """(header, lines of a fixed-width table): one row per run; text left, numbers right."""
    header = ["run", "weights", "attention", "layers", "cos_per_layer", "cos_last"]
    header += list(dict.fromkeys(k for row in rows for k in row if k.endswith("_acc")))
    cells = [[r.get(k, "-") for k in header] for r in rows]
    cells = [header] + [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in r] for r in cells]
    widths = [max(len(row[j]) for row in cells) for j in range(len(header))]
    left = ("run", "weights", "attention", "cos_per_layer")
    align = [str.ljust if k in left else str.rjust for k in header]
    lines = ["  ".join(f(c, w) for f, c, w in zip(align, r, widths, strict=True)) for r in cells]
    return header, [line.rstrip() for line in lines]


def main(argv: list | None = None, written: list | None = None) -> list:
    """Diagnose every RUN -> one results dict each (with "row", its comparison table row).
    written: a list to which each run's output folder is added once its files are written."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add = p.add_argument
    add("runs", nargs="+", metavar="RUN", help="run folder, its checkpoint.pt, or an LRA best.pt")
    add("--data-dir", help="where the data is now; without it, each run's own --data-dir")
    value = " (default: %(default)s)"  # the values a flag takes when not given
    add("--split", default="test", choices=("test", "train"), help="which data" + value)
    add("--batches", type=int, default=4, help="batches for the cosine similarity" + value)
    add("--batch-size", type=int, default=16, help="sequences per batch" + value)
    add("--dense", type=int, default=8, help="sequences for the N x N analyses" + value)
    add("--points", type=int, default=199, help="grid of the filter responses" + value)
    add("--device", default="cpu", choices=("cpu", "cuda"), help="where to compute" + value)
    weights = "best.pt or checkpoint.pt (last); without it, best.pt where there is one (LRA)"
    add("--weights", choices=("best", "last"), help=weights)
    where = "OUT/<run name>/ and OUT/comparison.csv; without it <run>/diagnose/, and the\ntable"
    add("--out", help=where + " of several runs in the folder that holds them, e.g. runs/depth/")
    args = p.parse_args(argv)
    for name in ("batches", "batch_size", "dense", "points"):  # each named alone
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.data_dir is not None and not args.data_dir.strip():  # '' would be the current folder
        p.error(f"--data-dir {args.data_dir!r} names no folder: leave it out for each run's own")
    if args.device == "cuda" and not torch.cuda.is_available():  # checked before any data is read
        p.error("--device cuda: this machine has no CUDA device")
    # A glob such as runs/sweep/* also matches what an earlier call wrote there (comparison.csv,
    # PNGs, an --out folder): files other than *.pt are skipped here, such folders by load_run.
    given = list(map(pathlib.Path, args.runs))
    folders = [q for q in given if not q.is_file() or q.suffix == ".pt"]
    skipped = [f"{q} is a file, not a run folder or *.pt" for q in given if q not in folders]
    names = [(q if q.is_dir() else q.parent).resolve().name for q in folders]
    if args.out and len(set(names)) < len(names):
        p.error(f"--out: runs of the same folder name would share an output folder: {names}")
    _say(*(f"skipped: {reason}" for reason in skipped))
    everything, tag = [], "" if args.split == "test" else f"_{args.split}"  # train/, *_train.csv
    how = (args.data_dir, args.split, args.batches * args.batch_size, args.batch_size, args.device)
    written = [] if written is None else written
    for path, name in zip(folders, names, strict=True):
        try:
            run = load_run(path, *how, args.weights)
        except (NotARun, SystemExit) as e:  # of several runs, one that cannot be read is skipped
            skipped.append(str(e).removeprefix("error: "))
            _say(f"skipped: {skipped[-1]}")
            continue
        results = diagnose(run, args.dense, args.points)
        lines, data = summary(run, results), figures(results)
        if everything:  # a blank line between runs
            _say("")
        _say(*lines)
        out = (pathlib.Path(args.out, name) if args.out else run.folder / "diagnose") / tag[1:]
        if run.weights.startswith("checkpoint.pt") and (run.folder / "best.pt").is_file():
            out = out / "last"  # beside the analysis of best.pt, the LRA default, not over it
        try:  # a run folder one may read but not write to (another's, read-only)
            files.write(out / "summary.txt", "\n".join(lines) + "\n")
            paths = [f.name for f in save_figures(data, out, run.label)]
        except files.WriteError as e:
            _fail(f"{e}: choose a folder to write to with --out")
        _say(f"wrote summary.txt and {len(paths)} files to {out}: {' '.join(paths)}")
        written.append(out)  # its files whole
        cos = results["cosine"].tolist()
        row = dict(run=str(run.folder.resolve()), weights=run.weights, layers=len(cos) - 1)
        row.update(attention=run.model.cfg.attention, cos_last=cos[-1])
        row.update(cos_per_layer=" ".join(f"{c:.3f}" for c in cos))
        results["row"], results["name"] = dict(row, **run.accuracy), name
        everything.append(results)
    if not everything:
        _fail(f"no run to diagnose: {'; '.join(skipped)}")
    if len(everything) > 1:
        rows = [r["row"] for r in everything]
        header, lines = comparison_table(rows)
        _say("", "cosine similarity per layer (embedding first), accuracy", *lines)
        beside = os.path.commonpath([r["row"]["run"] for r in everything])  # holds the runs
        path = pathlib.Path(args.out or beside, f"comparison{tag}.csv")
        cos = {r["name"]: (range(len(r["cosine"])), r["cosine"]) for r in everything}
        panel = (f"cosine_per_layer{tag}", "layer (0 = embedding)", "cosine similarity", "o-", cos)
        title = "mean pairwise cosine similarity of the real tokens"
        try:
            _say(f"wrote {write_csv(path, header, [[r.get(k, '') for k in header] for r in rows])}")
            save_figures([[panel]], path.parent, title)
        except files.WriteError as e:
            _fail(f"{e}: choose a folder to write to with --out")
    return everything


if __name__ == "__main__":
    done = []  # the output folders written: what Ctrl-C keeps (each file whole or absent)

    def kept() -> str:
        if not done:
            return ": no run's files are written"
        return f": the files of {len(done)} runs are written, the last to {done[-1]}"

    with runs.ctrl_c(kept):
        main(written=done)
