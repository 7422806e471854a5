"""
listops.py: the ListOps task of Long Range Arena, generated. An input is a random expression
tree of the operators MIN, MAX, MED (median) and SM (sum modulo 10) over the digits 0..9, written
with its brackets; its label is its value, 0..9. The model must find the nesting to find it.

    python listops.py --size 100 --out D      # D/basic_{train,val,test}.tsv, three shown
    [MAX 4 [MIN 2 7 ] 9 ]   -> 9

The algorithm of lra_benchmarks/data/listops.py (google-research/long-range-arena), draw for draw,
but seeded (OFFICIAL holds that script's settings). write() puts the splits in the release's
layout, which lra_data.py reads as it reads the release's listops-1000/.
Depends on: tqdm, files.py (how the project writes a file)
"""

import argparse
import contextlib
import csv
import functools
import io
import json
import multiprocessing
import os
import pathlib
import random
import signal
import statistics
import sys

from tqdm import tqdm

import files

SPLITS = ("train", "val", "test")  # the release's basic_<split>.tsv
# lra_benchmarks/data/listops.py's flag defaults (num_train_samples, num_valid_samples, ...):
# min_length < tokens < max_length bound each expression, both strict
OFFICIAL = dict(train=96000, val=2000, test=2000)  # example counts
OFFICIAL |= dict(min_length=500, max_length=2000, max_depth=10, max_args=10)  # tree bounds
# The keys of generator.json, written beside generated files: the settings that made them
KEYS = ("seed", *SPLITS, "min_length", "max_length", "max_depth", "max_args")

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")  # SM = sum modulo 10
END, VALUE_P = "]", 0.25  # VALUE_P: P(operator) for a node at depth < max_depth, else a leaf
APPLY = {"[MIN": min, "[MAX": max, "[SM": lambda xs: sum(xs) % 10}
APPLY["[MED"] = lambda xs: int(statistics.median(xs))  # the official int(np.median(xs))
# The tokens as lra_benchmarks/listops/input_pipeline.py reads a written expression: "]" is "X",
# parentheses are dropped; ids 1..15, 0 is padding, OOV any other word
# NOTE: ids 1..15 in a fixed order; lra_benchmarks/listops/input_pipeline.py's is a set's order
TOKENS = tuple("0123456789") + OPERATORS + ("X",)
IDS = {token: i + 1 for i, token in enumerate(TOKENS)}
OOV = len(TOKENS) + 1  # the id of a token outside the vocabulary (16)


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> tuple:
    """One random expression as the official left-nested tuple tree -> (tree, length in tokens)."""
    # The draws in the official order: node kind, argument count, arguments, then the operator.
    if (rng.random() if depth < max_depth else 1.0) > VALUE_P:
        return rng.choice(range(10)), 1
    n_args = rng.randint(2, max_args)
    args = [generate_tree(rng, depth + 1, max_depth, max_args) for _ in range(n_args)]
    tree = (rng.choice(OPERATORS), args[0][0])
    for arg, _ in args[1:]:
        tree = (tree, arg)
    return (tree, END), 2 + sum(length for _, length in args)  # 2: the operator token and "]"


def to_string(tree) -> str:
    """The release's text form: every tuple adds a parenthesis pair, "( ( [MAX 2 ) 9 ) ] )"."""
    if isinstance(tree, tuple):
        return f"( {to_string(tree[0])} {to_string(tree[1])} )"
    return str(tree)


def to_value(tree):
    """The label: evaluate bottom-up. Partial nodes are (operator, [arguments so far])."""
    if not isinstance(tree, tuple):
        return tree
    left, right = to_value(tree[0]), to_value(tree[1])
    if left in OPERATORS:
        return (left, [right])
    op, args = left
    return APPLY[op](args) if right == END else (op, args + [right])


def generate(
    n, seed, min_length, max_length, max_depth=10, max_args=10, progress=True, shards=1
) -> list:
    """n distinct (expression, label) pairs with min_length < tokens < max_length (both strict).

    shards > 1: shard s draws from random.Random(f"{seed}/{s}") in a process of its own, and the
    shards are joined in order, duplicates dropped: the same data on any number of cores.
    Raises ValueError when the bounds give too few distinct trees.
    """
    if shards > 1:
        spare = n // (100 * shards) + 1  # a few more per shard: duplicates across shards drop out
        bounds = (min_length, max_length, max_depth, max_args)
        jobs = [(n // shards + spare, f"{seed}/{s}", *bounds, False) for s in range(shards)]
        # Workers ignore Ctrl-C (the parent stops them): forked while this process ignores it,
        # so none starts with Python's handler, and set so where they start afresh (spawn).
        quiet = (signal.signal, (signal.SIGINT, signal.SIG_IGN))
        handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            pool = multiprocessing.Pool(min(shards, os.cpu_count() or 1), *quiet)
        finally:
            signal.signal(signal.SIGINT, handler)
        with pool:
            found = dict(pair for part in pool.starmap(generate, jobs) for pair in part)
        if len(found) < n:
            raise ValueError(f"ListOps: {shards} shards gave {len(found)} distinct trees, not {n}")
        return list(found.items())[:n]
    # NOTE: seeded and deduplicated in first-seen order; the official code: global RNG, a set
    rng, found, misses = random.Random(seed), {}, 0
    with tqdm(total=n, desc="generating ListOps", disable=not progress or None, leave=False) as bar:
        while len(found) < n:
            tree, length = generate_tree(rng, 1, max_depth, max_args)
            text = to_string(tree) if min_length < length < max_length else None
            if text is not None and text not in found:
                found[text], misses = to_value(tree), 0
                bar.update()
                continue
            misses += 1
            if misses == 200_000:  # bounds (almost) no tree meets, or n too large
                what = f"no new tree of {min_length} < length < {max_length} found"
                raise ValueError(f"ListOps: {what}")
    return list(found.items())


def words(expression: str) -> list:
    """The input pipeline's words: "]" -> "X", parentheses dropped, split on whitespace."""
    return expression.replace("]", "X").replace("(", "").replace(")", "").split()


def tokenize(expression: str) -> list:
    """The words of an expression as ids 1..15; any other word -> OOV."""
    return [IDS.get(word, OOV) for word in words(expression)]


def write(folder: pathlib.Path, settings: dict, progress: bool = True) -> None:
    """Generate ListOps with settings (KEYS, and "shards" where more than 1) into folder, in the
    release's layout: basic_<split>.tsv, a header "Source<TAB>Target", then expression<TAB>label;
    and generator.json, the settings. The splits are consecutive slices of one generated stream.
    Raises files.WriteError (one sentence) where the folder cannot be written: before the
    minutes of generating where it can tell."""
    folder, sizes = pathlib.Path(folder), [settings[split] for split in SPLITS]
    args = [settings[k] for k in KEYS[4:]] + [progress, settings.get("shards", 1)]
    made, written = not folder.exists(), []
    # Each file whole (files.write); generator.json last, as the mark that the three are ours.
    # Runs generating into one folder at once write the same bytes (seeded): either's will do.
    try:
        files.writable(folder)
        pairs = generate(sum(sizes), settings["seed"], *args)  # the tree bounds, ..., shards
        for split, start in zip(SPLITS, [0, sizes[0], sizes[0] + sizes[1]], strict=True):
            rows = [("Source", "Target"), *pairs[start : start + settings[split]]]  # a header
            written.append(folder / f"basic_{split}.tsv")
            files.write(written[-1], functools.partial(_tsv, rows))
        files.write(folder / "generator.json", json.dumps(settings) + "\n")
    except BaseException:  # an error or Ctrl-C on the way: none of its files stays, nor the
        with contextlib.suppress(OSError):  # folder made for them
            for path in written:
                path.unlink(missing_ok=True)
            if made:
                folder.rmdir()  # (empty now)
        raise


def _tsv(rows: list, f) -> None:
    """rows into the binary file f as the release writes them: UTF-8, tabs, \\r\\n ends."""
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    csv.writer(text, delimiter="\t").writerows(rows)
    text.flush()
    text.detach()  # f stays open: files.write closes it


def ready(folder: pathlib.Path, settings: dict, progress: bool = True) -> bool:
    """folder's basic_{train,val,test}.tsv, written (write) when none is there -> True when they
    are ours (their generator.json holds settings), False when another's (the release has no
    generator.json: read as they are). Raises ValueError: only some of the files are there, or
    a generator.json of other settings (the files would not be what was asked for)."""
    folder = pathlib.Path(folder)
    files, made_with = [folder / f"basic_{s}.tsv" for s in SPLITS], folder / "generator.json"
    if not any(file.exists() for file in files):
        write(folder, settings, progress)
    found = sum(file.exists() for file in files)
    if found < len(files):
        what = f"{folder} holds {found} of the {len(files)} files basic_{{train,val,test}}.tsv"
        how = "delete it to generate it again" if made_with.exists() else "complete it"
        raise ValueError(f"{what}: incomplete (an unpack or copy cut short?); {how}")
    if made_with.exists() and json.loads(made_with.read_text()) != settings:
        what = f"{folder} was generated with {made_with.read_text().strip()}"
        fix = "pick another ListOps folder or delete that one"
        raise ValueError(f"{what}, but this run asks for {json.dumps(settings)}: {fix}")
    return made_with.exists()


def main(argv: list | None = None) -> None:
    """python listops.py --size N --out D: write a ListOps set, show three of its examples."""
    parser = argparse.ArgumentParser(description="Generate ListOps, as the LRA release has it.")
    add = parser.add_argument
    add("--out", required=True, type=pathlib.Path, help="the folder to write (made if absent)")
    add("--size", type=int, default=OFFICIAL["train"], help="train examples (default %(default)s)")
    val = f"--size // 48, at least 1: {OFFICIAL['val']} for {OFFICIAL['train']}"
    add("--eval-size", type=int, help=f"val and test examples each (default {val})")
    add("--seed", type=int, default=0, help="the generator's seed (default %(default)s)")
    bounds = dict(min_length="tokens per expression: more than", max_length="and fewer than")
    bounds |= dict(max_depth="the deepest node's depth", max_args="the most arguments of a node")
    for key, what in bounds.items():  # the tree bounds, the official script's
        flag = f"--{key.replace('_', '-')}"
        add(flag, type=int, default=OFFICIAL[key], help=f"{what} (default %(default)s)")
    add("--shards", type=int, default=1, help="processes that generate at once (default 1)")
    args = parser.parse_args(argv)
    n_eval = max(1, args.size // 48) if args.eval_size is None else args.eval_size  # 96000 / 48
    if min(args.size, n_eval, args.shards) < 1:
        parser.error("--size, --eval-size and --shards must be at least 1")
    settings = dict(seed=args.seed, train=args.size, val=n_eval, test=n_eval)
    settings |= {key: getattr(args, key) for key in KEYS[4:]}
    if args.shards > 1:
        settings["shards"] = args.shards
    try:
        write(args.out, settings)
    except ValueError as e:
        sys.exit(f"listops.py: {e}")
    except KeyboardInterrupt:  # one line, as a shell's Ctrl-C: exit status 130
        sys.stderr.write(f"\nlistops.py: interrupted: nothing was written to {args.out}\n")
        sys.exit(130)
    with open(args.out / "basic_train.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:4]  # after the header
    print(
        f"wrote {args.out}/basic_{{train,val,test}}.tsv: {args.size}, {n_eval}, {n_eval} examples"
    )
    for expression, label in rows:  # the words the model reads: brackets kept, parentheses not
        words = [word for word in expression.split() if word not in "()"]
        shown = " ".join(words) if len(words) <= 24 else " ".join(words[:20]) + " ..."
        print(f"{shown}   ({len(words)} tokens)   -> {label}")


if __name__ == "__main__":
    main()
