"""
.ci/gpu_table.py: the training runs of a .ci/gpu call as Markdown tables for RESULTS.md, one per
task and max_len, with Primal-Attention's Table 2 in its own column.

    python .ci/gpu_table.py runs/gpu/results.jsonl --env runs/gpu/env.txt

Reads the RESULT lines .ci/gpu gathers (train_lra.py's result.json, one per line; the last line
of a run's result wins: a resumed run prints one per call). Per run: the test accuracy of the
weights with the best validation accuracy (LRA Text: validation = test, as the LRA pipeline),
the last evaluation's validation accuracy, the step of the best, the steps reached (partial:
stopped by --time-limit before the last), the run's wall time (start-up, compilation and
evaluations included), and the padded tokens it trained on per second of that wall time.
"""

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import bench

# Primal-Attention (Chen et al., NeurIPS 2023) Table 2, test accuracy %: ListOps (2K), Text (4K)
PAPER = {
    "listops": {"softmax": 37.1, "primal": 37.3, "primal+trans": 37.3},
    "text": {"softmax": 65.0, "primal": 61.2, "primal+trans": 65.4},
}
KINDS = bench.STEP_KINDS  # the five attentions trained on LRA, in the tables' order
HEAD = (
    "| attention | test % (best val) | last val % | best step | steps reached | wall s | "
    "tokens/s (M) | paper (Primal-Attention Table 2) |"
)


def read(lines) -> dict:
    """(task, max_len) -> attention -> its last result; the one-step data check left out."""
    tables = {}
    for line in lines:
        if not line.startswith("RESULT "):
            continue
        result = json.loads(line[len("RESULT ") :])
        cfg = result["config"]
        if cfg["steps"] > 1:
            tables.setdefault((result["task"], cfg["max_len"]), {})[result["attention"]] = result
    return tables


def row(kind: str, result: dict | None, paper: float | None) -> str:
    """One Markdown row; a run that did not report gets dashes."""
    cited = "—" if paper is None else f"{paper:.1f}"
    if result is None:
        return f"| {kind} | — | — | — | — | — | — | {cited} |"
    cfg = result["config"]
    reached = f"{result['steps_reached']} of {result['steps']}"
    if result["partial"]:
        reached += " (partial)"
    tokens = result["steps_reached"] * cfg["batch_size"] * cfg["max_len"]
    rate = tokens / result["wall_s"] / 1e6 if result["wall_s"] > 0 else float("nan")
    cells = (
        f"{100 * result['test_acc']:.1f}",
        f"{100 * result['final_val_acc']:.1f}",
        str(result["best_step"]),
        reached,
        f"{result['wall_s']:.1f}",
        f"{rate:.2f}",
        cited,
    )
    return f"| {kind} | " + " | ".join(cells) + " |"


def tables(lines, env: str = "") -> list:
    """The Markdown lines: per (task, max_len) a caption, the head and one row per attention."""
    out = []
    for (task, max_len), runs in sorted(read(lines).items()):
        caption = f"{task}, max_len {max_len}, {next(iter(runs.values()))['device']}"
        if env:
            caption += f"; {env}"
        if task == "text" and max_len != 4000:
            caption += " (the paper's Text is 4K: max_len 4000)"
        out += [caption + ":", "", HEAD]
        out.append("|---" * 8 + "|")
        for kind in (*KINDS, *sorted(set(runs) - set(KINDS))):  # the five, then any other
            out.append(row(kind, runs.get(kind), PAPER.get(task, {}).get(kind)))
        out.append("")
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("results", type=pathlib.Path, help="results.jsonl of a .ci/gpu call")
    p.add_argument("--env", type=pathlib.Path, help="its env.txt: the torch and CUDA versions")
    args = p.parse_args(argv)
    env = args.env.read_text().splitlines()[0] if args.env else ""
    print("\n".join(tables(args.results.read_text().splitlines(), env)))


if __name__ == "__main__":
    main()
