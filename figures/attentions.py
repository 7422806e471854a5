"""
figures/attentions.py: draw attentions.png, the four attentions side by side (README's picture).

Each column runs top to bottom in the order the code multiplies, one head, batch left out, with
the code's own names: the boxes are what is computed, the arrows carry the shapes. A box's colour
is the cost of computing it, per head: red O(N² d) (every query against every key: softmax and
GFSA, whether or not an N×N matrix is kept), green a product linear in N (the projections O(N D d),
AGF's O(N d²), Primal's O(N d s)), grey O(N d) or less. "≈" marks an estimate (GFSA's Ā^K for
K > 2, Eq. 4).

    python figures/attentions.py      # needs matplotlib (not a dependency of the project)

It writes attentions.png beside itself (figures/attentions.png), from whatever folder it is run.
"""

import pathlib
import sys

try:
    import matplotlib

    matplotlib.use("Agg")  # files only, no window
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit(
        "figures/attentions.py draws with matplotlib, which is not installed: "
        "pip install matplotlib"
    )

QUADRATIC, LINEAR, PLAIN = "#f6c9c4", "#cdebc5", "#eef0f4"
# (title, file, cost, [(box text, colour, shape on the arrow into the next box), ...])
COLUMNS = [
    ("softmax attention", "model.py:SoftmaxAttention", "O(N² d)", [
        ("x", PLAIN, "N×D"),
        ("q = x W_Q,  k = x W_K,  v = x W_V", LINEAR, "N×d  each"),
        ("Ā = softmax(q kᵀ/√d)", QUADRATIC, "N×N"),
        ("y = Ā v", QUADRATIC, "N×d"),
    ]),
    ("GFSA", "gfsa.py:GFSAttention", "O(N² d), two passes", [
        ("x", PLAIN, "N×D"),
        ("q, k, v as in softmax", LINEAR, "N×d  each"),
        ("Ā v = softmax(q kᵀ/√d) v\n(one SDPA call; Ā² never formed)", QUADRATIC, "N×d"),
        ("Ā(Ā v): the same Ā, a second pass", QUADRATIC, "N×d  each"),
        ("y = a0 v + a1 Ā v + a2 Ā(Ā v)\n≈ (w0 I + w1 Ā + wK Ā^K) v   (= for K = 2)", PLAIN, "N×d"),
    ]),
    ("AGF", "agf.py:AGFAttention", "O(N d²)", [
        ("x", PLAIN, "N×D"),
        ("u = softmax_d(x W_u),  v = softmax_N(x W_v)\ns = sigmoid(x W_Σ)\nvalues = x W_val",
         LINEAR, "N×d  each"),
        ("g = Σₖ θ̃ₖ Pₖ(s),  θ̃ₖ = tanh θₖ\nthe singular values, filtered", PLAIN, "N×d"),
        ("vᵀ values", LINEAR, "d×d"),
        ("y = (u ⊙ g)(vᵀ values)\n= U Σ Vᵀ X W_val,  A never formed", LINEAR, "N×d"),
    ]),
    ("Primal-Attention", "ksvd_attention.py:PrimalAttention", "O(N d s)", [
        ("x", PLAIN, "N×D"),
        ("φ_q = q/‖q‖,  φ_k = k/‖k‖\nq = x W_q,  k = x W_k\nf(X) = m evenly spaced real tokens",
         LINEAR, "N×d, m×d"),
        ("W_e|X = f(X)ᵀ W_e,  W_r|X = f(X)ᵀ W_r", PLAIN, "d×s  each"),
        ("e = φ_q W_e|X,  r = φ_k W_r|X\n(aux loss η·J², KSVD)", LINEAR, "N×s  each"),
        ("y = W_er [e; r]   (2s -> d)", LINEAR, "N×d"),
    ]),
]  # fmt: skip


def draw(path: pathlib.Path) -> None:
    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(16, 6.6))
    shape_style = dict(fontsize=9, color="#1f4e9a", va="center", style="italic")  # on the arrows
    for ax, (title, where, cost, steps) in zip(axes, COLUMNS, strict=True):
        ax.set(xlim=(0, 1), ylim=(0, 1))
        ax.axis("off")
        ax.text(0.5, 0.98, title, ha="center", va="top", fontsize=13, weight="bold")
        ax.text(0.5, 0.92, f"{where}\ncost {cost}", ha="center", va="top", fontsize=9)
        ys = [0.78 - i * 0.7 / (len(steps) - 1) for i in range(len(steps))]
        for i, ((text, colour, shape), y) in enumerate(zip(steps, ys, strict=True)):
            box = dict(boxstyle="round,pad=0.45", fc=colour, ec="#555555", lw=0.8)
            ax.text(0.5, y, text, ha="center", va="center", fontsize=9.5, bbox=box)
            if i + 1 < len(steps):  # the arrow into the next box, labelled with this box's shape
                gap = 0.055 + 0.02 * text.count("\n")
                arrow = dict(arrowstyle="-|>", color="#333333", lw=1)
                ax.annotate("", (0.5, ys[i + 1] + 0.05), (0.5, y - gap), arrowprops=arrow)
                ax.text(0.53, (y + ys[i + 1]) / 2, shape, **shape_style)
    legend = (
        "N tokens, D model width, d head width, s rank, m sampled tokens;  ≈: an estimate.\n"
        "The cost of a box, per head: red O(N² d); green a product linear in N "
        "(O(N D d), O(N d²), O(N d s)); grey O(N d) or less"
    )
    fig.text(0.5, 0.02, legend, ha="center", fontsize=9.5)
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    png = pathlib.Path(__file__).resolve().with_suffix(".png")  # beside this file
    draw(png)
    print(f"wrote {png}")
