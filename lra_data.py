"""
lra_data.py: the Long Range Arena data, from files on disk (or a generator) to numpy arrays.

    ListOps     generated here with the released generator's algorithm, seeded, written in the
                release's tsv format; or the release's listops-1000/basic_*.tsv
    Text        the standard aclImdb folder, UTF-8 bytes + 1 (0 = padding)
    Retrieval   the release's tsv_data/new_aan_pairs.*.tsv, two documents per example
    Image       the CIFAR-10 python batches, converted to grayscale with TF's formula
    Pathfinder  the release's pathfinder32/<difficulty>/{metadata, imgs} (PNG read with zlib)
    any task    the pickles of the PyTorch LRA code (Nystromformer, Skyformer, Primal, AGF)

Formats and the official behaviour: spec DATA.md §1. Every reader returns a `Split` of int
arrays padded with 0 plus the true lengths, so the mask is `arange(N) < length`, never
`ids != 0` (a pixel of value 0 is a real token). Malformed files raise `DataError` naming the
file and the line. `cfg` below is train_lra.TrainConfig (any object with its fields works).

Depends on: numpy, tqdm, torch (only torch.distributed, to let rank 0 generate ListOps)
"""

import csv
import json
import pathlib
import pickle
import random
import statistics
import struct
import zlib
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch.distributed as dist
from tqdm import tqdm

# Token ids per task: ListOps 0 pad, 1..15 tokens, 16 OOV; bytes + 1 with 0 pad; pixel values.
VOCAB = {"listops": 17, "text": 257, "retrieval": 257, "image": 256, "pathfinder": 256}
N_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}

# ----------------------------------------------------------------------------------------------
# 1. ListOps: the released generator's algorithm (lra_benchmarks/data/listops.py), seeded
# ----------------------------------------------------------------------------------------------

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")  # SM = sum modulo 10
END = "]"
VALUE_P = 0.25  # probability that a node below max_depth is an operator, not a leaf


def generate_tree(rng: random.Random, depth: int, max_depth: int, max_args: int):
    """One random expression as the official left-nested tuple tree -> (tree, length in tokens).

    The random draws come in the official order: node kind, number of arguments, the arguments
    (recursively), then the operator.
    """
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return rng.choice(range(10)), 1
    length, args = 2, []  # the operator token and "]"
    for _ in range(rng.randint(2, max_args)):
        arg, arg_length = generate_tree(rng, depth + 1, max_depth, max_args)
        args.append(arg)
        length += arg_length
    tree = (rng.choice(OPERATORS), args[0])
    for arg in args[1:]:
        tree = (tree, arg)
    return (tree, END), length


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
    if right != END:
        return (op, args + [right])
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[MED":  # official int(np.median(xs)): the mean of the two middle values, truncated
        return int(statistics.median(args))
    return sum(args) % 10


def generate_listops(
    n: int,
    seed: int,
    min_len: int,
    max_len: int,
    max_depth: int = 10,
    max_args: int = 10,
    progress: bool = True,
) -> list:
    """n distinct (expression, label) pairs with min_len < length < max_len (both strict).

    As the official generator, but seeded (random.Random(seed), never the global RNG) and
    deduplicated in first-seen order; the official code converts a set to a list, whose order
    is arbitrary. About 2 s per 1000 examples at the paper's lengths (8 % of draws accepted).
    """
    rng, found, misses = random.Random(seed), {}, 0
    bar = tqdm(total=n, desc="generating ListOps", disable=not progress, leave=False)
    while len(found) < n:
        tree, length = generate_tree(rng, 1, max_depth, max_args)
        text = to_string(tree) if min_len < length < max_len else None
        if text is None or text in found:
            misses += 1
            if misses == 200_000:  # bounds that (almost) no tree meets, or n too large for them
                raise DataError(
                    f"ListOps: 200000 draws in a row gave no new expression with {min_len} < "
                    f"length < {max_len}, depth <= {max_depth}, <= {max_args} arguments"
                )
            continue
        found[text], misses = to_value(tree), 0
        bar.update()
    bar.close()
    return list(found.items())


# The vocabulary in a FIXED order: ids 1..15. The official order came from a Python set (DATA.md
# §1.2), i.e. arbitrary; id 0 = padding, id 16 = out of vocabulary, 17 ids in all.
LISTOPS_TOKENS = tuple("0123456789") + OPERATORS + ("X",)
LISTOPS_IDS = {token: i + 1 for i, token in enumerate(LISTOPS_TOKENS)}
LISTOPS_OOV = len(LISTOPS_TOKENS) + 1


def tokenize_listops(expression: str) -> list:
    """LRA input pipeline: "]" -> "X", drop parentheses, split on whitespace, map to ids."""
    tokens = expression.replace("]", "X").replace("(", "").replace(")", "").split()
    return [LISTOPS_IDS.get(token, LISTOPS_OOV) for token in tokens]


# ----------------------------------------------------------------------------------------------
# 2. Readers: the released (or standard) format of each task -> numpy arrays in memory
# ----------------------------------------------------------------------------------------------


class DataError(ValueError):
    """Missing or malformed data; the message names the file (and line) and what was expected."""


@dataclass
class Split:
    """One split in memory: token ids (n, max_len), 0 = padding, real tokens first."""

    x: np.ndarray  # (n, max_len) int16
    lengths: np.ndarray  # (n,) real tokens per row
    y: np.ndarray  # (n,) int64 labels
    x2: Optional[np.ndarray] = None  # Retrieval: the second document
    lengths2: Optional[np.ndarray] = None


def pack(sequences: list, max_len: int) -> tuple:
    """Cut each id sequence to max_len and right-pad with 0 -> (ids (n, max_len), lengths (n,))."""
    # int16 holds every id (< 257) in half the memory of int32: Retrieval's 147k training
    # pairs of 2 x 4000 ids take 2.4 GB. Batches are widened to int64 in to_tensors.
    x = np.zeros((len(sequences), max_len), dtype=np.int16)
    lengths = np.zeros(len(sequences), dtype=np.int64)
    for i, seq in enumerate(sequences):
        seq = np.asarray(seq[:max_len], dtype=np.int16)
        x[i, : len(seq)], lengths[i] = seq, len(seq)
    return x, lengths


def byte_ids(text: bytes) -> np.ndarray:
    """tfds ByteTextEncoder: id = UTF-8 byte + 1, so that 0 stays free for padding."""
    return np.frombuffer(text, dtype=np.uint8).astype(np.int16) + 1


def read_listops_tsv(path: pathlib.Path, max_len: int) -> Split:
    """basic_{train,val,test}.tsv: header Source<TAB>Target, then expression<TAB>label 0..9."""
    sequences, labels = [], []
    with open(path, newline="") as f:
        reader = csv.reader(f, delimiter="\t")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:  # a blank line
                continue
            if reader.line_num == 1:
                if row != ["Source", "Target"]:
                    raise DataError(f"{where}: expected the header 'Source<TAB>Target', got {row}")
                continue
            if len(row) != 2 or not row[1].strip().isdigit() or int(row[1]) > 9:
                raise DataError(f"{where}: expected 'expression<TAB>label 0..9', got {row}"[:300])
            sequences.append(tokenize_listops(row[0]))
            labels.append(int(row[1]))
    return Split(*pack(sequences, max_len), np.array(labels, dtype=np.int64))


def prepare_listops(cfg, rank: int = 0) -> pathlib.Path:
    """The ListOps folder; generated (once, by rank 0) when it holds no tsv files.

    A folder with tsv files but no generator.json is taken as the release (or the user's own
    data) and used as it is. A generated folder whose generator.json differs from the
    requested settings is an error, never silently reused or overwritten.
    """
    folder = pathlib.Path(cfg.data_dir) / cfg.listops_dir
    files = [folder / f"basic_{s}.tsv" for s in ("train", "val", "test")]
    marker = folder / "generator.json"
    sizes = [cfg.listops_size, cfg.listops_eval_size, cfg.listops_eval_size]
    wanted = dict(
        seed=cfg.data_seed,
        train=sizes[0],
        val=sizes[1],
        test=sizes[2],
        min_length=cfg.listops_min_len,
        max_length=cfg.listops_max_len,
        max_depth=cfg.listops_depth,
        max_args=cfg.listops_args,
    )
    present = [f.exists() for f in files]
    if rank == 0 and any(present) and not all(present):
        raise DataError(f"{folder}: incomplete, expected all of {[f.name for f in files]}")
    if rank == 0 and all(present) and marker.exists():
        if json.loads(marker.read_text()) != wanted:
            raise DataError(
                f"{folder} was generated with {marker.read_text().strip()}, but this run asks "
                f"for {json.dumps(wanted)}: pick another --listops-dir or delete that folder"
            )
    if rank == 0 and not any(present):
        print(f"generating ListOps into {folder} ({sum(sizes)} examples, once)", flush=True)
        pairs = generate_listops(
            sum(sizes),
            cfg.data_seed,
            cfg.listops_min_len,
            cfg.listops_max_len,
            cfg.listops_depth,
            cfg.listops_args,
        )
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(wanted) + "\n")  # first: tsv files never lack it
        ends = np.cumsum(sizes)
        for file, start, end in zip(files, [0, *ends[:2]], ends, strict=True):
            tmp = file.with_suffix(".tmp")  # written whole, then renamed: no half files
            with open(tmp, "w", newline="") as f:
                writer = csv.writer(f, delimiter="\t")  # as the release (and its \r\n endings)
                writer.writerow(["Source", "Target"])
                writer.writerows(pairs[start:end])
            tmp.replace(file)
    if dist.is_initialized():
        dist.barrier()  # the other processes wait for rank 0's checks and files
    return folder


def read_imdb(folder: pathlib.Path, max_len: int) -> dict:
    """aclImdb/{train,test}/{neg,pos}/*.txt -> bytes + 1. neg = 0, pos = 1 (tfds ClassLabel)."""
    splits = {}
    for split in ("train", "test"):
        sequences, labels = [], []
        for label, polarity in enumerate(("neg", "pos")):
            files = sorted((folder / split / polarity).glob("*.txt"))
            if not files:
                raise DataError(f"no *.txt files in {folder / split / polarity}")
            for file in tqdm(files, desc=f"reading {split}/{polarity}", leave=False):
                try:  # tfds: text = f.read().strip(), then UTF-8 bytes
                    text = file.read_text(encoding="utf-8").strip().encode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{file}: not UTF-8 text ({e})") from None
                sequences.append(byte_ids(text[:max_len]))
                labels.append(label)
        splits[split] = Split(*pack(sequences, max_len), np.array(labels, dtype=np.int64))
    # Official LRA pipeline: there is no IMDB validation split, val = test.
    return {"train": splits["train"], "val": splits["test"], "test": splits["test"]}


def read_aan_tsv(path: pathlib.Path, max_len: int) -> Split:
    """new_aan_pairs.*.tsv: no header; label, id1, id2, text1, text2, separated by tabs."""
    docs1, docs2, labels = [], [], []
    with open(path, "rb") as f:  # bytes: the texts are encoded byte by byte anyway
        for line_num, line in enumerate(f, start=1):
            fields = line.rstrip(b"\r\n").split(b"\t")
            if fields == [b""]:  # a blank line
                continue
            try:  # the official reader parses the label as a float, then casts it to int
                label = int(float(fields[0]))
                assert len(fields) == 5 and label in (0, 1)
            except (ValueError, AssertionError):
                raise DataError(
                    f"{path}:{line_num}: expected 5 tab-separated columns 'label id1 id2 "
                    f"text1 text2' with label 0 or 1, got {len(fields)} columns"
                ) from None
            # each text is cut to 10000 bytes before encoding, then to max_len (DATA.md §1.4)
            docs1.append(byte_ids(fields[3][:10000][:max_len]))
            docs2.append(byte_ids(fields[4][:10000][:max_len]))
            labels.append(label)
    x, lengths = pack(docs1, max_len)
    x2, lengths2 = pack(docs2, max_len)
    return Split(x, lengths, np.array(labels, dtype=np.int64), x2, lengths2)


def cifar_gray(rgb: np.ndarray) -> np.ndarray:
    """(n, 3072) uint8, channel-first as in the CIFAR batches -> (n, 1024) gray values 0..255.

    tf.image.rgb_to_grayscale on uint8 (DATA.md §1.5): /255, weighted sum, *255.5, truncate.
    NOTE: computed in float64; TF uses float32, so a value on a rounding edge may differ by 1.
    """
    r, g, b = (rgb[:, k * 1024 : (k + 1) * 1024].astype(np.float64) for k in range(3))
    return (((0.2989 * r + 0.5870 * g + 0.1140 * b) / 255) * 255.5).astype(np.int16)


def read_cifar(folder: pathlib.Path) -> dict:
    """cifar-10-batches-py (python pickles) -> 1024 gray pixels per image, no padding.

    Pixel value 0 is a real value, not padding, so the masks are all True and the vocabulary
    is the 256 pixel values. (The PyTorch LRA code masks `input_ids != 0`: black pixels drop
    out of attention there; we do not copy that quirk.) Split as LRA: train[:90%] / train[90%:].
    """
    parts = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        try:
            with open(folder / name, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data, labels = np.asarray(batch[b"data"], dtype=np.uint8), batch[b"labels"]
        except (OSError, pickle.UnpicklingError, KeyError, TypeError, EOFError) as e:
            raise DataError(f"{folder / name}: not a CIFAR-10 python batch ({e!r})") from None
        if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
            raise DataError(f"{folder / name}: expected data (n, 3072) and n labels")
        parts[name] = (cifar_gray(data), np.asarray(labels, dtype=np.int64))
    x = np.concatenate([parts[f"data_batch_{i}"][0] for i in range(1, 6)])
    y = np.concatenate([parts[f"data_batch_{i}"][1] for i in range(1, 6)])
    cut = len(x) * 9 // 10
    x_test, y_test = parts["test_batch"]
    return {
        "train": _unpadded(x[:cut], y[:cut]),
        "val": _unpadded(x[cut:], y[cut:]),
        "test": _unpadded(x_test, y_test),
    }


def _unpadded(x: np.ndarray, y: np.ndarray) -> Split:
    """A split of images: every pixel is a real token."""
    return Split(x, np.full(len(x), x.shape[1], dtype=np.int64), y)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def read_png_gray(path: pathlib.Path) -> np.ndarray:
    """Decode an 8-bit grayscale, non-interlaced PNG with zlib alone -> (height, width) uint8.

    Enough for the Pathfinder images, so that PIL is not a dependency. Each scanline starts
    with a filter byte; filters 1-4 predict a byte from its left (a), upper (b) and upper-left
    (c) neighbours, and the stored byte is the difference modulo 256 (PNG spec §9).
    """
    data = path.read_bytes()
    if data[:8] != PNG_SIGNATURE:
        raise DataError(f"{path}: not a PNG file")
    pos, compressed, header = 8, [], None
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body, pos = data[pos + 8 : pos + 8 + size], pos + 12 + size  # 4 bytes length, 4 type, CRC
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            compressed.append(body)
        elif kind == b"IEND":
            break
    if header is None or header[2:4] != (8, 0) or header[6] != 0:
        raise DataError(
            f"{path}: only 8-bit grayscale non-interlaced PNGs are read (IHDR {header})"
        )
    width, height = header[0], header[1]
    try:
        raw = np.frombuffer(zlib.decompress(b"".join(compressed)), dtype=np.uint8)
        rows = raw.reshape(height, width + 1).astype(np.int64)
    except (zlib.error, ValueError) as e:
        raise DataError(f"{path}: corrupt image data ({e})") from None
    image, above = np.zeros((height, width), dtype=np.int64), np.zeros(width, dtype=np.int64)
    for i, (kind, line) in enumerate(zip(rows[:, 0], rows[:, 1:], strict=True)):
        if kind == 0:  # None
            line = line.copy()
        elif kind == 1:  # Sub: x + a, a running sum along the row
            line = np.cumsum(line) % 256
        elif kind == 2:  # Up: x + b
            line = (line + above) % 256
        elif kind in (3, 4):  # Average: x + (a + b) // 2;  Paeth: x + the neighbour nearest p
            line = line.copy()
            for j in range(width):
                a, b = (line[j - 1], above[j]) if j else (0, above[j])
                c = above[j - 1] if j else 0
                if kind == 3:
                    line[j] = (line[j] + (a + b) // 2) % 256
                    continue
                p = a + b - c
                nearest = min((abs(p - a), 0, a), (abs(p - b), 1, b), (abs(p - c), 2, c))[2]
                line[j] = (line[j] + nearest) % 256
        else:
            raise DataError(f"{path}: row {i} has the unknown filter type {kind}")
        image[i], above = line, line
    return image.astype(np.uint8)


def read_pathfinder(folder: pathlib.Path, max_len: int, seed: int) -> dict:
    """pathfinder32/<difficulty>: metadata/*.npy (text lines) + PNGs -> seeded 80/10/10 split.

    Metadata fields, split on ' ': [imgs/<k>, sample_<i>.png, i, label, ...]; the image is
    <folder>/<f0>/<f1>, the label field 3 (1 = the two markers lie on the same path). Empty
    PNG files exist in the release and are skipped, as by the official preprocessing.
    """
    meta_files = sorted((folder / "metadata").glob("*.npy"), key=lambda p: (len(p.stem), p.stem))
    if not meta_files:
        raise DataError(f"no metadata/*.npy in {folder}")
    images, labels = [], []
    for meta in tqdm(meta_files, desc="reading Pathfinder", leave=False):
        for line_num, line in enumerate(meta.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split(" ")
            if len(fields) < 4 or fields[3] not in ("0", "1"):
                raise DataError(f"{meta}:{line_num}: expected 'imgs/<k> sample_<i>.png i label'")
            png = folder / fields[0] / fields[1]
            if not png.exists():
                raise DataError(f"{meta}:{line_num}: image {png} does not exist")
            if png.stat().st_size == 0:
                continue
            pixels = read_png_gray(png).reshape(-1)
            if len(pixels) != max_len:
                raise DataError(f"{png}: {len(pixels)} pixels, but --max-len is {max_len}")
            images.append(pixels)
            labels.append(int(fields[3]))
    x, y = np.stack(images).astype(np.int16), np.array(labels, dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(x))  # the official split is shuffled too
    cuts = [0, len(x) * 8 // 10, len(x) * 9 // 10, len(x)]
    return {
        name: Split(x[idx], np.full(len(idx), max_len, dtype=np.int64), y[idx])
        for name, idx in zip(("train", "val", "test"), np.split(order, cuts[1:3]), strict=True)
    }


def read_lra_pickle(path: pathlib.Path, task: str, max_len: int) -> Split:
    """A PyTorch-LRA pickle: a list of dicts with input_ids_0 (, input_ids_1), label.

    Token tasks: the real tokens are those before the trailing zeros. Image tasks: every pixel
    is real (their mask `input_ids != 0` drops black pixels; we do not copy that quirk).
    Only open pickles you trust: unpickling can run code.
    """
    try:
        with open(path, "rb") as f:
            items = pickle.load(f)
        columns = {key: [item[key] for item in items] for key in ("input_ids_0", "label")}
        if task == "retrieval":
            columns["input_ids_1"] = [item["input_ids_1"] for item in items]
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError) as e:
        raise DataError(f"{path}: not a PyTorch-LRA pickle (list of dicts): {e!r}") from None

    def ids_and_lengths(key: str) -> tuple:
        x = np.stack([np.asarray(a, dtype=np.int64)[:max_len] for a in columns[key]])
        x = np.pad(x, ((0, 0), (0, max_len - x.shape[1])))
        if x.min() < 0 or x.max() >= VOCAB[task]:
            raise DataError(f"{path}: {key} outside [0, {VOCAB[task]}) for task {task}")
        if task in ("image", "pathfinder"):
            return x.astype(np.int16), np.full(len(x), max_len, dtype=np.int64)
        lengths = max_len - np.argmax((x != 0)[:, ::-1], axis=1)  # after the last nonzero id
        return x.astype(np.int16), np.where((x != 0).any(1), lengths, 0)

    x, lengths = ids_and_lengths("input_ids_0")
    x2, lengths2 = ids_and_lengths("input_ids_1") if task == "retrieval" else (None, None)
    return Split(x, lengths, np.asarray(columns["label"], dtype=np.int64), x2, lengths2)


# Where each task's data comes from, for the message when it is missing.
DATA_SOURCES = {
    "listops": "LRA release listops-1000/basic_{train,val,test}.tsv",
    "text": "IMDB folder aclImdb/{train,test}/{neg,pos}/*.txt from ai.stanford.edu/~amaas/data/"
    "sentiment",
    "retrieval": "LRA release tsv_data/new_aan_pairs.{train,eval,test}.tsv",
    "image": "CIFAR-10 python batches cifar-10-batches-py/ from cs.toronto.edu/~kriz/cifar.html",
    "pathfinder": "LRA release pathfinder32/<difficulty>/{metadata/*.npy, imgs/<k>/*.png}",
}


def read_release(cfg, rank: int = 0) -> dict:
    """{"train", "val", "test"} -> Split, from the release (or standard) format of the task."""
    root, L = pathlib.Path(cfg.data_dir), cfg.max_len
    if cfg.task == "listops":
        folder = prepare_listops(cfg, rank)
        names = ("train", "val", "test")
        return {s: read_listops_tsv(folder / f"basic_{s}.tsv", L) for s in names}
    if cfg.task == "text":
        return read_imdb(root / "aclImdb", L)
    if cfg.task == "retrieval":  # the LRA "eval" file is the validation split
        files = {"train": "train", "val": "eval", "test": "test"}
        folder = root / "tsv_data"
        return {s: read_aan_tsv(folder / f"new_aan_pairs.{f}.tsv", L) for s, f in files.items()}
    if cfg.task == "image":
        return read_cifar(root / "cifar-10-batches-py")
    return read_pathfinder(root / cfg.pathfinder_dir, L, cfg.data_seed)


def load_task(cfg, rank: int = 0) -> dict:
    """{"train", "val", "test"} -> Split: the release format if there, else PyTorch-LRA pickles,
    else (ListOps only) generate the data."""
    root, task = pathlib.Path(cfg.data_dir), cfg.task
    release = {
        "listops": root / cfg.listops_dir / "basic_train.tsv",
        "text": root / "aclImdb" / "train",
        "retrieval": root / "tsv_data" / "new_aan_pairs.train.tsv",
        "image": root / "cifar-10-batches-py" / "data_batch_1",
        "pathfinder": root / cfg.pathfinder_dir / "metadata",
    }[task]
    stem = cfg.pathfinder_dir.replace("/", "-") if task == "pathfinder" else task
    pickles = {}  # their "dev" is our "val"; Nystromformer names, or Skyformer's "lra-" prefix
    for split, name in (("train", "train"), ("val", "dev"), ("test", "test")):
        names = (root / f"{stem}.{name}.pickle", root / f"lra-{stem}.{name}.pickle")
        pickles[split] = next((p for p in names if p.exists()), None)
    has_pickles = all(pickles.values())
    if release.exists() or (task == "listops" and not has_pickles):
        return read_release(cfg, rank)
    if has_pickles:
        return {split: read_lra_pickle(path, task, cfg.max_len) for split, path in pickles.items()}
    raise DataError(
        f"no data for --task {task}: expected {release} (the {DATA_SOURCES[task]}) or the "
        f"PyTorch-LRA pickles {root}/{stem}.{{train,dev,test}}.pickle. See the header of "
        "train_lra.py and README section 'Data'."
    )
