"""
.ci/dry_run.py: what .ci/run checks of the GPU script's dry run (`.ci/gpu --dry-run OUTDIR`), one
step at a time. Exit 0, or 1 with one line saying what is wrong and OUTDIR's stages.txt.

    python .ci/dry_run.py full OUTDIR      after the whole dry run: its 16 RESULT lines (five
                                           runs of each of listops, text1k, text4k, and the
                                           one-step data check), tables.md's 15 rows (three
                                           tables of five attentions), each training run given
                                           its stage's limit less the margin (340 - 120 s)
    python .ci/dry_run.py cut OUTDIR       makes agf's text1k run one cut off by its limit at
                                           step 2 of 4 (a checkpoint, no result) and softmax's
                                           one its --time-limit stopped there (a partial result)
    python .ci/dry_run.py resumed OUTDIR   after STAGES=text1k on the same OUTDIR: both resumed,
                                           softmax's result whole, the other 3 finished earlier
    python .ci/dry_run.py refilled OUTDIR  after FROM=bundle into a fresh OUTDIR: the 10 Text
                                           runs found finished
"""

import json
import pathlib
import sys

RESULT_LINES = 16
TABLE_ROWS = 15
TIME_LIMIT = 340 - 120  # LISTOPS_S less MARGIN_S


def _text(path: pathlib.Path) -> str:
    """The file's text, "" if there is none."""
    return path.read_text() if path.is_file() else ""


def _count(path: pathlib.Path, wanted) -> int:
    """How many lines of the file `wanted(line)` accepts."""
    return sum(1 for line in _text(path).splitlines() if wanted(line))


def _table_row(line: str) -> bool:
    """A table row with numbers: "| agf | 37.1 | ...", not the header nor a row of dashes."""
    cells = [cell.strip() for cell in line.split("|")]
    return len(cells) > 3 and cells[0] == "" and cells[1] != "" and cells[2][:1].isdigit()


def check(step: str, out: pathlib.Path) -> str | None:
    """None when OUTDIR holds what the step expects, else the first thing wrong, in one line."""
    if step == "full":
        n = _count(out / "results.jsonl", lambda line: line.startswith("RESULT "))
        if n != RESULT_LINES:
            return f"{n} RESULT lines in results.jsonl, not {RESULT_LINES}"
        n = _count(out / "tables.md", _table_row)
        if n != TABLE_ROWS:
            return f"{n} rows with numbers in tables.md, not {TABLE_ROWS}"
        config = out / "listops" / "agf" / "config.json"
        limit = json.loads(config.read_text())["time_limit"] if config.is_file() else None
        if limit != TIME_LIMIT:
            return f"listops agf ran with --time-limit {limit}, not {TIME_LIMIT} (340 - 120)"
    elif step == "resumed":
        for kind in ("agf", "softmax"):
            if "--resume" not in _text(out / f"text1k_{kind}.log"):
                return f"text1k {kind} did not resume"
        if '"partial": false' not in _text(out / "text1k" / "softmax" / "result.json"):
            return "text1k softmax: its resumed result is still partial"
        n = _count(out / "stages.txt", lambda line: line.endswith("finished earlier"))
        if n != 3:
            return f"{n} runs found finished earlier, not the 3 the cut left whole"
    elif step == "refilled":
        n = _count(out / "stages.txt", lambda line: line.endswith("finished earlier"))
        if n != 10:
            return f"{n} runs found finished earlier, not the 10 of the bundle: FROM lost runs"
    else:
        return f"unknown step {step!r} (full, cut, resumed, refilled)"
    return None


def cut(out: pathlib.Path) -> None:
    """agf's text1k run as one cut off at step 2 of 4; softmax's as one its limit stopped there."""
    import torch

    for kind in ("agf", "softmax"):
        run = out / "text1k" / kind
        ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
        ckpt["state"]["step"] = 2  # and the schedule with it (the weights stay: only mechanics)
        ckpt["scheduler"].update(last_epoch=2, _step_count=3)
        torch.save(ckpt, run / "checkpoint.pt")
        result = json.loads((run / "result.json").read_text())
        (run / "result.json").unlink()
        if kind == "softmax":
            result.update(steps_reached=2, partial=True)
            (run / "result.json").write_text(json.dumps(result, indent=2))


def main(argv: list) -> None:
    if len(argv) != 2:
        sys.exit("usage: python .ci/dry_run.py full|cut|resumed|refilled OUTDIR")
    step, out = argv[0], pathlib.Path(argv[1])
    if step == "cut":
        cut(out)
        return
    wrong = check(step, out)
    if wrong:
        print(_text(out / "stages.txt"), end="")
        sys.exit(f"gpu dry run: {wrong}")
    print(f"gpu dry run: {step} checked")


if __name__ == "__main__":
    main(sys.argv[1:])
