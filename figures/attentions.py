"""
figures/attentions.py: draw attentions.png, the four attentions side by side (README's picture).

Each column runs top to bottom in the order the code multiplies, one head, batch left out: the
boxes are what is formed, the arrows carry the shapes. The matrix in the middle is the one that
sets the cost: N×N for softmax and GFSA (red), d×d or d×s for AGF and Primal (green).

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
    sys.exit("figures/attentions.py draws with matplotlib, which is not installed: "
             "pip install matplotlib")

QUADRATIC, LINEAR, PLAIN = "#f6c9c4", "#cdebc5", "#eef0f4"
# (title, file, cost, [(box text, colour, shape on the arrow into the next box), ...])
COLUMNS = [
    ("softmax attention", "model.py:SoftmaxAttention", "O(N² d)", [
        ("X", PLAIN, "N×D"),
        ("Q = XW_q,  K = XW_k,  V = XW_v", PLAIN, "N×d  each"),
        ("Ā = softmax(QKᵀ/√d)", QUADRATIC, "N×N"),
        ("Y = Ā V", PLAIN, "N×d"),
    ]),
    ("GFSA", "gfsa.py:GFSAttention", "O(N² d), two passes", [
        ("X", PLAIN, "N×D"),
        ("Q, K, V as in softmax", PLAIN, "N×d  each"),
        ("Ā = softmax(QKᵀ/√d)\n(Ā² never formed)", QUADRATIC, "N×N"),
        ("ĀV, then Ā(ĀV)", PLAIN, "N×d  each"),
        ("Y = a₀V + a₁ĀV + a₂Ā(ĀV)\n= (w₀I + w₁Ā + w_K Ā^K) V", PLAIN, "N×d"),
    ]),
    ("AGF", "agf.py:AGFAttention", "O(N d²)", [
        ("X", PLAIN, "N×D"),
        ("U = softmax_d(XW_U),  V = softmax_N(XW_V)\ns = σ(XW_Σ),  X W_val", PLAIN, "N×d  each"),
        ("g(s) = Σₖ θₖ Pₖ(s)\nthe singular values, filtered", PLAIN, "N×d"),
        ("Vᵀ(X W_val)", LINEAR, "d×d"),
        ("Y = (U ⊙ g(s)) (Vᵀ X W_val)\n= U Σ Vᵀ X W_val", PLAIN, "N×d"),
    ]),
    ("Primal-Attention", "ksvd_attention.py:PrimalAttention", "O(N d s)", [
        ("X", PLAIN, "N×D"),
        ("φ_q(x), φ_k(x) = cosine features\nf(X) = m real tokens", PLAIN, "N×d, m×d"),
        ("W_e(X) = f(X)ᵀW_e,  W_r(X) = f(X)ᵀW_r", LINEAR, "d×s  each"),
        ("e = φ_q W_e(X),  r = φ_k W_r(X)\n(+ KSVD loss η J²)", PLAIN, "N×s  each"),
        ("Y = Linear([e; r])", PLAIN, "N×d"),
    ]),
]


def draw(path: pathlib.Path) -> None:
    fig, axes = plt.subplots(1, len(COLUMNS), figsize=(15, 6.2))
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
                ax.text(0.53, (y + ys[i + 1]) / 2, shape, fontsize=9, color="#1f4e9a",
                        va="center", style="italic")
    fig.text(0.5, 0.02, "N tokens, D model width, d head width, s rank, m sampled tokens; "
             "red: an N×N matrix is formed, green: only d×d or d×s in the middle",
             ha="center", fontsize=9.5)
    fig.savefig(path, dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    png = pathlib.Path(__file__).resolve().with_suffix(".png")  # beside this file
    draw(png)
    print(f"wrote {png}")
