"""
model.py: the tiny Transformer classifier that every attention mechanism plugs into.

Two model styles, because the official code of the three papers uses two:
    "lra"  Long Range Arena (Nystromformer code, reused by Primal-Attention and AGF):
           token + learned position embedding, pre-LN blocks, final LayerNorm,
           masked mean pooling, MLP head; optionally two towers for Retrieval.
    "uea"  UEA time series (mvts/Flowformer code, reused by Primal-Attention and AGF):
           Linear(F -> D)·√D + learned position table, post-LN blocks, final LayerNorm,
           GELU, padded steps zeroed, flatten, linear head.

The attention of each layer is chosen by name (ATTENTION below); a list gives one kind per layer,
and "primal+trans" is the papers' hybrid (softmax layers, Primal last). Every attention has one
interface and input checks; padding is never read, NaN included; a batch of 0 has aux loss 0:
    forward(x (B, N, D), mask (B, N) bool, True = real token) -> (y (B, N, D), aux_loss ())
`Classifier.forward` returns (logits (B, C), aux_loss ()), where aux_loss is the mean over the
layers whose mechanism has an auxiliary loss (AGF, Primal), as in the official code.

Dims:  B batch, N tokens, D model width, H heads, d = D / H, C classes, F input channels (UEA)
Run:   python model.py   -> aux loss, parameters, padding unread per kind; Ā V written out == SDPA
Depends on: torch, agf.py (+ polynomials.py), ksvd_attention.py, gfsa.py
"""

import argparse
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from agf import AGFAttention
from gfsa import GFSAttention
from ksvd_attention import PrimalAttention


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention, the baseline:  Y = Ā V,  Ā = softmax(QKᵀ/√d).  In forward,
    the first branch writes Ā out, to read and step through (fused=False); the second, the
    default, gives the same result in one call of `F.scaled_dot_product_attention` (SDPA), as
    nanoGPT keeps both; tested equal.
    Kept for backward on the CPU: written out, Ā (B, H, N, N); SDPA, nothing N x N at dropout 0
    without causal, an N x N float mask with causal; at dropout > 0, as the CPU's fused kernels
    take no dropout, Ā, its dropout mask and the dropped Ā (RESULTS.md).

    Args:
        d_model: D, token width.
        n_heads: H; each head has width d = D / H.
        dropout: dropout on the attention weights (LRA code: 0.1), active in training only.
        causal:  if True, token t attends to tokens <= t only.
        fused:   True: SDPA (a fused kernel where one exists); False: Ā written out (N x N memory).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        dropout: float = 0.0,
        causal: bool = False,
        fused: bool = True,
    ):
        super().__init__()
        if n_heads < 1 or d_model % n_heads:  # n_heads 0: a ValueError, not ZeroDivisionError
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.d_model, self.n_heads, self.d_head = d_model, n_heads, d_model // n_heads
        self.dropout, self.causal, self.fused = dropout, causal, fused
        self.W_qkv = nn.Linear(d_model, 3 * d_model)  # W_Q, W_K, W_V of all heads, fused
        self.W_o = nn.Linear(d_model, d_model)  # output projection

    def forward(self, x: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        # a float 0/1 mask would act in SDPA as an additive bias: the check refuses it
        _check_inputs(x, mask, self.d_model, self.W_qkv.weight.dtype)
        B, N, D = x.shape
        if mask is not None:  # padded tokens are replaced, not multiplied by 0 (0 · NaN = NaN)
            x = x.masked_fill(~mask[..., None], 0.0)
        # 1) project, split heads: (B, N, 3D) -> 3 x (B, H, N, d)
        q, k, v = self.W_qkv(x).view(B, N, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        # 2) allowed[b, i, j]: may query i attend to key j? Real keys only (a sequence with none
        #    may use all: its rows are zeroed in 4); if causal, keys j <= i only, and j = i always,
        #    so that no row is empty (a padded query whose whole past is padding)
        allowed = None if mask is None else (mask | ~mask.any(1, keepdim=True))[:, None, None]
        if self.causal:
            past = torch.ones(N, N, dtype=torch.bool, device=x.device).tril()  # (N, N): j <= i
            itself = torch.eye(N, dtype=torch.bool, device=x.device)  # (N, N): j = i
            allowed = past if mask is None else (allowed | itself) & past  # (B, 1, N, N)
        dropout_p = self.dropout if self.training else 0.0
        if not self.fused:  # 3) Ā = softmax(QKᵀ/√d), then Ā V, written out
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # (B,H,N,d) @ (B,H,d,N)
            if allowed is not None:  # finfo.min, not -inf: exp underflows to exactly 0
                scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
            attn = F.dropout(scores.softmax(dim=-1), dropout_p)  # Ā, rows sum to 1: (B,H,N,N)
            y = attn @ v  # Ā V: (B,H,N,N) @ (B,H,N,d) -> (B,H,N,d)
        else:  # 3) the same result, fused: one SDPA call (what it keeps: docstring)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
        # 4) merge heads, project; padded query rows are set to zero (they are never read)
        # NOTE: differs from the official LRA code (Nystromformer's softmax attention), which
        #       masks keys only and leaves padded rows as they come.
        y = self.W_o(y.transpose(1, 2).reshape(B, N, D))
        if mask is not None:
            y = y.masked_fill(~mask[..., None], 0.0)
        return y, x.new_zeros(())


# A plain dict, not a registry: one place to read which name builds which class.
ATTENTION = dict(
    softmax=SoftmaxAttention, agf=AGFAttention, primal=PrimalAttention, gfsa=GFSAttention
)
AUX_KINDS = ("agf", "primal")  # mechanisms with an auxiliary loss, averaged over their layers


def layer_kinds(attention: str | list, n_layers: int) -> list:
    """One kind per layer: "agf" -> ["agf"] * n_layers; a list is taken as it is; "primal+trans"
    -> ["softmax"] * (n_layers - 1) + ["primal"] (the papers' Primal.+Trans.: Primal last)."""
    kinds = [attention] * n_layers if isinstance(attention, str) else list(attention)
    if attention == "primal+trans":
        kinds = ["softmax"] * (n_layers - 1) + ["primal"]
    if len(kinds) != n_layers:
        raise ValueError(f"attention list {kinds} has {len(kinds)} entries for {n_layers} layers")
    for kind in kinds:
        if kind not in ATTENTION:
            raise ValueError(f"unknown attention {kind!r}; choose from {list(ATTENTION)}")
    return kinds


def build_attention(kind: str, d_model: int, n_heads: int, **kwargs) -> nn.Module:
    """Construct attention `kind` (see ATTENTION) as Class(d_model, n_heads, **kwargs)."""
    return ATTENTION[kind](d_model, n_heads, **kwargs)


@dataclass
class ModelConfig:
    """Every knob of the classifier. Defaults = the LRA setting shared by the three papers."""

    n_classes: int = 2
    max_len: int = 1024  # size of the position table = longest input accepted
    vocab_size: int = 0  # > 0: inputs are token ids (B, N)
    n_features: int = 0  # > 0: inputs are real-valued features (B, N, F)
    style: str = "lra"  # "lra" (pre-LN, mean pool, MLP head) | "uea" (post-LN, flatten head)
    d_model: int = 64  # D
    n_heads: int = 2  # H
    n_layers: int = 2
    d_ff: int = 128  # hidden width of the feed-forward block
    dropout: float = 0.1
    attn_dropout: float = 0.1  # on the softmax baseline's attention weights
    attention: str | list = "softmax"  # a kind, "primal+trans", or one kind per layer
    attention_kwargs: dict = field(default_factory=dict)  # per kind, e.g. {"agf": {"order": 5}}
    two_tower: bool = False  # LRA Retrieval: shared encoder, head on [a, b, a*b, a-b]
    # False = the official UEA code: no mask reaches the attention, so padded steps (read as 0)
    # are keys and queries; pooling still drops them. True: padding stays out of attention too.
    attention_mask: bool = True
    head_hidden: int = 128  # LRA MLP head width


class Block(nn.Module):
    """One Transformer layer: attention + feed-forward, pre-LN ("lra") or post-LN ("uea")."""

    def __init__(self, cfg: ModelConfig, attention: nn.Module):
        super().__init__()
        self.attn, self.pre_ln = attention, cfg.style == "lra"
        self.norm1, self.norm2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        # The UEA code writes this as two 1x1 Conv1d; a Linear on the last axis is the same map.
        D, p = cfg.d_model, cfg.dropout
        self.mlp = nn.Sequential(
            nn.Linear(D, cfg.d_ff), nn.GELU(), nn.Dropout(p), nn.Linear(cfg.d_ff, D), nn.Dropout(p)
        )

    def forward(self, x: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.pre_ln:  # LRA:  x + Drop(Attn(LN(x))),  then  x + MLP(LN(x))
            y, aux = self.attn(self.norm1(x), mask)
            x = x + self.drop(y)
            return x + self.mlp(self.norm2(x)), aux
        y, aux = self.attn(x, mask)  # UEA:  LN(x + Drop(Attn(x))),  then  LN(x + MLP(x))
        x = self.norm1(x + self.drop(y))
        return self.norm2(x + self.mlp(x)), aux


class Classifier(nn.Module):
    """Embedding -> L blocks -> pooling -> head.  forward(x, mask) -> (logits (B, C), aux ())."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if (cfg.vocab_size > 0) == (cfg.n_features > 0):
            raise ValueError("set exactly one of vocab_size (tokens) or n_features (features)")
        if cfg.style not in ("lra", "uea"):
            raise ValueError(f"style must be 'lra' or 'uea', got {cfg.style!r}")
        if cfg.two_tower and cfg.style != "lra":
            raise ValueError("two_tower needs style='lra' (the UEA head flattens one sequence)")
        for name in ("n_classes", "max_len", "d_model", "n_layers", "d_ff"):
            if getattr(cfg, name) < 1:  # sizes: 0 would build empty layers that fail later
                raise ValueError(f"{name}={getattr(cfg, name)} must be >= 1")
        self.cfg, D, tokens = cfg, cfg.d_model, cfg.vocab_size > 0
        self.kinds = layer_kinds(cfg.attention, cfg.n_layers)
        self.embed = nn.Embedding(cfg.vocab_size, D) if tokens else nn.Linear(cfg.n_features, D)
        self.pos = nn.Parameter(torch.empty(cfg.max_len, D))  # learned position table
        if cfg.style == "lra":  # Nystromformer LRA code: both tables N(0, 0.02)
            nn.init.normal_(self.pos, std=0.02)
            if tokens:
                nn.init.normal_(self.embed.weight, std=0.02)
        else:  # mvts LearnablePositionalEncoding: U(-0.02, 0.02)
            nn.init.uniform_(self.pos, -0.02, 0.02)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, self._attention(kind)) for kind in self.kinds)
        self.norm = nn.LayerNorm(D)
        if cfg.style == "lra":  # MLP head on the pooled vector, or on [a, b, a*b, a-b]
            width, hidden, C = (4 * D if cfg.two_tower else D), cfg.head_hidden, cfg.n_classes
            self.head = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, C))
        else:  # one linear map of the flattened (max_len, D) sequence
            self.head = nn.Linear(cfg.max_len * D, cfg.n_classes)

    def _attention(self, kind: str) -> nn.Module:
        """Build one layer's attention: config defaults, then the config's kwargs for that kind."""
        cfg = self.cfg  # Primal-Attention samples m = min(max_len, s·rank_multi) tokens
        defaults = {"softmax": {"dropout": cfg.attn_dropout}, "primal": {"max_len": cfg.max_len}}
        kwargs = {**defaults.get(kind, {}), **cfg.attention_kwargs.get(kind, {})}
        return build_attention(kind, cfg.d_model, cfg.n_heads, **kwargs)

    def _check(self, x: Tensor, mask: Tensor | None, names: tuple) -> Tensor:
        """`_check_inputs`, N <= max_len and the values; returns the mask (all True for None)."""
        cfg, (x_name, mask_name), V = self.cfg, names, self.cfg.vocab_size
        _check_inputs(x, mask, cfg.n_features, None if V else self.embed.weight.dtype, names)
        if x.shape[1] > cfg.max_len:
            got = f"got shape {tuple(x.shape)}"
            raise ValueError(f"{x_name}: expected N <= max_len = {cfg.max_len} (positions), {got}")
        if V > 0:
            found = lambda: f", found [{x.min().item()}, {x.max().item()}]"  # noqa: E731
            _require(((x >= 0) & (x < V)).all(), f"{x_name}: token ids must lie in [0, {V})", found)
        if mask is None:
            return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        _require(mask.any(dim=1).all(), f"{mask_name}: every sequence needs a real token")
        return mask

    def encode(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, list]:
        """Embed and run the blocks -> (h (B, N, D), aux (), [L+1 hidden states (B, N, D)])."""
        # UEA (mvts code): the input projection is scaled by √D; LRA: no scale
        scale = math.sqrt(self.cfg.d_model) if self.cfg.style == "uea" else 1.0
        if x.is_floating_point():  # features: padded steps read 0, as the official loaders pad;
            x = x.masked_fill(~mask[..., None], 0.0)  # replaced, not multiplied: 0 · NaN = NaN
        h = self.drop(self.embed(x) * scale + self.pos[: x.shape[1]])  # (B, N, D)
        hidden, aux = [h], []
        attention_mask = mask if self.cfg.attention_mask else None
        for kind, block in zip(self.kinds, self.blocks, strict=True):
            h, layer_aux = block(h, attention_mask)
            hidden.append(h)
            if kind in AUX_KINDS:
                aux.append(layer_aux)
        # Official code: the auxiliary losses are averaged (not summed) over the layers.
        aux_loss = torch.stack(aux).mean() if aux else h.new_zeros(())
        return self.norm(h), aux_loss, hidden

    def pool(self, h: Tensor, mask: Tensor) -> Tensor:
        """LRA: mean over real tokens (B, D).  UEA: zero padded steps, flatten (B, max_len·D)."""
        h = h.masked_fill(~mask[..., None], 0.0)  # padding replaced by 0 (0 · NaN would be NaN)
        if self.cfg.style == "lra":
            # NOTE: the official LRA code divides by the padded length N; we divide by the number
            #       of real tokens, so padding cannot dilute the average (NOTES.md: differences).
            return h.sum(1) / mask.sum(1, keepdim=True)
        h = self.drop(F.gelu(h))  # (B, N, D), padded steps stay exactly zero: GELU(0) = 0
        h = F.pad(h, (0, 0, 0, self.cfg.max_len - h.shape[1]))  # shorter inputs: pad to max_len
        return h.flatten(1)

    def forward(self, x: Tensor, mask=None, x2=None, mask2=None, return_hidden=False):
        """Classify x: token ids (B, N) long or features (B, N, F) float, with mask (B, N) bool
        (True = real token; None = no padding); x2, mask2: the second document of a two-tower
        model (LRA Retrieval). Returns logits (B, C), aux_loss () and, if return_hidden, the hidden
        states [embedding, block 1, ..., block L], each (B, N, D), one list per tower."""
        if self.cfg.two_tower != (x2 is not None):
            need = "needs the second document x2" if self.cfg.two_tower else "takes no x2"
            raise ValueError(f"this model (two_tower={self.cfg.two_tower}) {need}")
        mask = self._check(x, mask, ("x", "mask"))
        h, aux, hidden = self.encode(x, mask)
        z = self.pool(h, mask)
        if self.cfg.two_tower:
            mask2 = self._check(x2, mask2, ("x2", "mask2"))
            h2, aux2, hidden2 = self.encode(x2, mask2)
            z2 = self.pool(h2, mask2)
            z = torch.cat([z, z2, z * z2, z - z2], dim=-1)  # (B, 4D), the LRA "NLI" interaction
            aux, hidden = (aux + aux2) / 2, [hidden, hidden2]
        logits = self.head(z)
        return (logits, aux, hidden) if return_hidden else (logits, aux)


def layerwise_cosine_similarity(hidden_states: list, mask: Tensor | None = None) -> Tensor:
    """Mean pairwise cosine similarity of the real tokens, per layer: the over-smoothing measure.

    For unit vectors x̂_i, Σ_{i≠j} x̂_i·x̂_j = ‖Σ_i x̂_i‖² − n, so the mean over the n(n−1) ordered
    pairs costs O(N D) per sequence: no N x N matrix. 1 means all tokens point the same way.

    Args: hidden_states, L tensors (B, N, D), e.g. from `Classifier(..., return_hidden=True)`;
        mask (B, N) bool, True = real token, >= 2 real tokens per sequence.
    Returns: (L,) similarity per layer, averaged over the sequences of the batch.
    """
    out = []
    for h in hidden_states:
        m = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device) if mask is None else mask
        n = m.sum(1).to(h.dtype)  # (B,)
        if (n < 2).any():
            raise ValueError("cosine similarity needs at least 2 real tokens per sequence")
        unit = F.normalize(h, dim=-1) * m[..., None]  # (B, N, D), padded tokens removed
        pair_sum = unit.sum(1).pow(2).sum(-1) - n  # ‖Σ x̂_i‖² − n   (B,)
        out.append((pair_sum / (n * (n - 1))).mean())
    return torch.stack(out)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _check_inputs(x: Tensor, mask: Tensor | None, width: int, dtype, names=("x", "mask")):
    """TypeError (dtype) or ValueError (shape, device) naming the argument, what it expected and
    what came, as in the mechanism files; dtype None: x holds token ids. Reads no values."""
    (x_name, mask_name), ids = names, dtype is None
    amp = x.dtype != dtype and x.is_floating_point() and torch.is_autocast_enabled(x.device.type)
    bad_dtype = x.is_floating_point() if ids else x.dtype != dtype and not amp  # AMP mixes dtypes
    want = f"{dtype} (the layer's dtype) of shape (B, N >= 1, {width})"
    want = "integer token ids of shape (B, N >= 1)" if ids else want
    shape_ok = (x.dim() == 2 if ids else x.dim() == 3 and x.shape[2] == width) and x.shape[1] > 0
    if bad_dtype or not shape_ok:
        got = f"got {x.dtype} of shape {tuple(x.shape)}"
        raise (TypeError if bad_dtype else ValueError)(f"{x_name}: expected {want}, {got}")
    if mask is None or (mask.dtype, mask.shape, mask.device) == (torch.bool, x.shape[:2], x.device):
        return
    error = ValueError if mask.dtype == torch.bool else TypeError
    got = f"got {mask.dtype} of shape {tuple(mask.shape)} on {mask.device}"
    raise error(f"{mask_name}: expected bool of shape {tuple(x.shape[:2])} on {x.device}, {got}")


def _require(ok: Tensor, message: str, found=lambda: "") -> None:
    """ValueError(message + found()) unless ok; compiled, an in-graph assert (RuntimeError)."""
    if torch.compiler.is_compiling():
        torch._assert_async(ok, message)
    elif not ok:
        raise ValueError(message + found())


if __name__ == "__main__":
    # `python model.py`: each attention in both styles; junk in the padding must not change logits.
    raw = argparse.RawDescriptionHelpFormatter  # --help: the header above (Run: the tour)
    argparse.ArgumentParser(description=__doc__, formatter_class=raw).parse_args()
    torch.manual_seed(0)
    mask = torch.arange(64) < torch.tensor([[64], [40]])  # (2, 64): 24 padded steps in row 2
    inputs = {"lra": torch.randint(1, 20, (2, 64)), "uea": torch.randn(2, 64, 12)}
    for kind in ["softmax", "agf", "primal", "primal+trans", "gfsa"]:
        for style, x in inputs.items():
            sizes = dict(vocab_size=20) if style == "lra" else dict(n_features=12)
            model = Classifier(ModelConfig(5, 64, style=style, attention=kind, **sizes)).eval()
            junk = torch.where(mask if style == "lra" else mask[..., None], x, 7)  # padding only
            with torch.no_grad():
                (logits, aux), (logits2, _) = model(x, mask), model(junk, mask)
            same, n = torch.allclose(logits, logits2, atol=1e-5), count_parameters(model)
            print(f"{kind:12s} {style}  aux {aux.item():.4f}  params {n:,}  padding unread: {same}")
    written = SoftmaxAttention(64, 2, causal=True, fused=False).double()
    fused = SoftmaxAttention(64, 2, causal=True).double()
    fused.load_state_dict(written.state_dict())
    x = torch.randn(2, 64, 64).double()
    same = torch.allclose(written(x, mask)[0], fused(x, mask)[0])
    print("SoftmaxAttention: Ā V written out == SDPA:", same)
