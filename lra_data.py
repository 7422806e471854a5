"""
lra_data.py: the Long Range Arena data, from files on disk (or a generator) to numpy arrays.
Each reader returns `Split`s: int16 ids right-padded with 0 and the true lengths, so the mask
is `arange(N) < length`, never `ids != 0` (a pixel of value 0 is a real token), together with
notes: plain sentences on what is surprising in the data (skipped examples, unknown tokens),
which the training script prints. Examples with no real token never reach the model.
prepare(task, data_dir, max_len): find_source chooses the source (a release folder, fetched by
download_task; PyTorch-LRA pickles; the ListOps generator, writing a release folder); the
prepared file <data_dir>/lra-cache/<folder>-<max_len>.npz is loaded if made from the same files,
else read_source reads, checks, and write_prepared writes it. train_lra.py calls load_task
(prepare without the file's name); `python lra_data.py --task text --download` prepares alone.
Official code: google-research/long-range-arena lra_benchmarks/, mlpen/Nystromformer LRA/.
Depends on: numpy, tqdm, download.py, listops.py (the ListOps generator)
"""

import argparse
import contextlib
import hashlib
import io
import json
import os
import pathlib
import pickle
import pickletools
import re
import struct
import sys
import zipfile
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from tqdm import tqdm

import download
import files
import listops

# Token ids per task: ListOps 0 pad, 1..15 tokens, 16 OOV; bytes + 1 with 0 pad; pixel values.
VOCAB = {"listops": 17, "text": 257, "retrieval": 257, "image": 256, "pathfinder": 256}
N_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}
SPLITS = ("train", "val", "test")
# prepare's default ListOps: the paper's (lra_benchmarks/data/listops.py's default flags,
# listops.OFFICIAL), generated in 16 seeded shards at once (as train_lra.py's paper preset).
LISTOPS_PAPER = dict(folder="listops-1000", **listops.OFFICIAL, shards=16)
# Tokens per input in the papers' setting (train_lra.py's paper preset): lra_data.py's default
MAX_LEN = dict(listops=2000, text=1000, retrieval=4000, image=1024, pathfinder=1024)
PATH_HARD = "pathfinder32/curv_contour_length_14"  # and the paper's "Path": Pathfinder32, hard
# lra_benchmarks/data/pathfinder.py: each difficulty folder is the TFDS split of this name
PATHFINDER_SPLITS = dict(curv_baseline="easy", curv_contour_length_9="intermediate")
PATHFINDER_SPLITS |= dict(curv_contour_length_14="hard")
# Each task's standard folder under data_dir (ListOps, Pathfinder: the one asked for), the files
# the reader needs there (the first shows the folder is there; a folder lacking any is fetched by
# --download, the files there kept); for --download its archive, size in bytes and MD5 where
# published (torchtext checks IMDB's, torchvision CIFAR-10's; the ~7.7 GB release, read as it
# arrives up to the folder's end, has none), the files kept below the folder (default all),
# found by name anywhere in it.
RELEASE = "https://storage.googleapis.com/long-range-arena/lra_release.gz"  # a gzipped tar
LRA = dict(url=RELEASE, size=None, md5=None)  # the release's tasks
ARCHIVES = {
    "text": dict(url="https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz", size=None,
                 md5="7c2ac02c03563afcf9b574c7e56c153a", folder="aclImdb", need=("train", "test"),
                 keep=r"(train|test)/(pos|neg)/[^/]+\.txt"),  # not unsup/, not the *.feat files
    "image": dict(url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", size=170498071,
                  md5="c58f30108f718f92721af3b95e74349a", folder="cifar-10-batches-py",
                  need=(*(f"data_batch_{i}" for i in range(1, 6)), "test_batch")),
    "listops": dict(LRA, folder="listops-1000",
                    need=("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")),
    "retrieval": dict(LRA, folder="tsv_data",
                      need=tuple(f"new_aan_pairs.{s}.tsv" for s in ("train", "eval", "test"))),
    "pathfinder": dict(LRA, folder=PATH_HARD, need=("metadata", "imgs")),
}  # fmt: skip
PATHFINDER_DIRS = {name: f"pathfinder32/{folder}" for folder, name in PATHFINDER_SPLITS.items()}
# What the readers do to each task's release files, said in the run's log
DONE = dict(listops="words to ids 1..15, 16 for any other", text="bytes + 1; val is test")
DONE |= dict(retrieval="bytes + 1, each text first cut to 10,000 bytes, as officially")
DONE |= dict(image="grey as tf.image.rgb_to_grayscale; TFDS order, train cut at 90 %")
DONE |= dict(pathfinder="the {} difficulty; TFDS order, cut at 80 % and 90 %", pickles="as read")
CACHE_VERSION = 3  # of the readers' rules and the key: raise it when they change (all rebuilt)


class DataError(ValueError):
    """Missing or malformed data; the message names the file (and line) and what is wrong."""


@dataclass
class Split:
    """One split in memory: token ids, 0 = padding, real tokens first."""

    x: np.ndarray  # (n, max_len) int16
    lengths: np.ndarray  # (n,) int64, real tokens per row
    y: np.ndarray  # (n,) int64 labels
    x2: np.ndarray | None = None  # (n, max_len) Retrieval: the second document
    lengths2: np.ndarray | None = None  # (n,)
    cut: int = 0  # inputs (documents) cut at max_len

    def batch(self, idx: np.ndarray) -> dict:
        """Examples `idx` as model inputs: int64 ids x (B, N), bool mask (B, N), int64 labels
        y (B,) [, x2, mask2]. Real tokens come first, so mask = position < length."""
        positions, ids = np.arange(self.x.shape[1]), lambda a: a[idx].astype(np.int64)
        batch = dict(x=ids(self.x), mask=positions < self.lengths[idx, None], y=self.y[idx])
        if self.x2 is not None:
            batch.update(x2=ids(self.x2), mask2=positions < self.lengths2[idx, None])
        return batch


def pack(sequences: list, max_len: int, shift: int = 0) -> tuple:
    """Cut to max_len, add shift, right-pad with 0 -> (ids (n, max_len) int16, lengths (n,),
    how many sequences were cut)."""
    # shift=1 for bytes (tfds ByteTextEncoder: id = byte + 1, 0 = padding); int16 holds ids < 257
    what = f"{len(sequences):,} inputs of {max_len:,} tokens"
    said = files.too_big(2 * len(sequences) * max_len, what, "--max-len")
    if said:  # before numpy tries
        raise DataError(said)
    x, lengths = np.zeros((len(sequences), max_len), np.int16), np.zeros(len(sequences), np.int64)
    for i, seq in enumerate(sequences):
        seq = np.asarray(seq[:max_len], dtype=np.int16) + shift
        x[i, : len(seq)], lengths[i] = seq, len(seq)
    return x, lengths, sum(len(seq) > max_len for seq in sequences)


def _drop_empty(split: Split, places: list, source: str) -> tuple:
    """Drop the examples with no real token (in either document) -> (Split, notes): the model
    pools over real tokens, so such an example has nothing to attend to (and a mask with no True
    row fails in the attention). places[i] says where example i came from."""
    if not len(split.y):  # a split without examples: an evaluation would divide by zero
        raise DataError(f"{source}: no example")
    empty = (split.lengths == 0) | (split.lengths2 == 0)  # lengths2 None: None == 0 is False
    if not empty.any():
        return split, []
    first = places[np.flatnonzero(empty)[0]]
    if empty.all():
        raise DataError(f"{source}: no example has a real token (the first: {first})")
    keep = ~empty
    arrays = [None if a is None else a[keep] for a in (split.x2, split.lengths2)]
    what = f"{empty.sum()} of {len(empty)} examples with no real token (the first: {first})"
    note = f"{source}: skipped {what}: the model would have nothing to attend to"
    return Split(split.x[keep], split.lengths[keep], split.y[keep], *arrays, split.cut), [note]


def _text(path: pathlib.Path) -> str:
    """A text file's content decoded as UTF-8; a byte that is not: DataError naming the line."""
    data = _read(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: byte {data[e.start]:#x} is not UTF-8 text") from None


def _read(path: pathlib.Path) -> bytes:
    """A file's bytes; a folder, no permission, a broken link: DataError naming it."""
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e})") from None


def _listing(folder: pathlib.Path, suffix: str) -> list:
    """The files folder/*<suffix> a reader reads, sorted: hidden ones (macOS's ._<name>) never;
    an entry of that name that is no regular file (a folder, a broken link): DataError."""
    try:
        entries = list(os.scandir(folder))
    except OSError:  # no such folder: the reader says what it expected
        return []
    names = [e for e in entries if e.name.endswith(suffix) and not e.name.startswith(".")]
    odd = [e.path for e in names if not e.is_file()]  # a link to a file is read
    if odd:
        raise DataError(f"{min(odd)}: not a regular file, but named like the {suffix} files read")
    return sorted(e.path for e in names)


def read_listops_tsv(path: pathlib.Path, max_len: int) -> tuple:
    """basic_{train,val,test}.tsv: header Source<TAB>Target, then expression<TAB>label 0..9.

    Returns:
        (Split, notes): a word outside the vocabulary (a typo such as "[MAXX") becomes the OOV
        id and is named in a note with its file and line. (The official tokenizer splits such a
        word around its operator instead, "[MAX" and "X" = "]"; we do not imitate that.)
    """
    sequences, labels, places, unknown = [], [], [], []  # unknown: (line, word) per bad line
    # Lines split on "\n" (a "\r" before it dropped), fields on tabs: the release quotes nothing,
    # so no csv (its quoting reads a stray '"' as the start of a field up to the file's end).
    for line_num, line in enumerate(_text(path).split("\n"), start=1):
        row, where = line.removesuffix("\r").split("\t"), f"{path}:{line_num}"
        if line_num == 1 and row != ["Source", "Target"]:
            raise DataError(f"{where}: expected the header 'Source<TAB>Target', got {row}"[:300])
        if row == [""] or line_num == 1:  # a blank line, the header
            continue
        if len(row) != 2 or not re.fullmatch("[0-9]", row[1]):  # ASCII: "²" is no label
            raise DataError(f"{where}: expected 'expression<TAB>label 0..9', got {row}"[:300])
        words = listops.words(row[0])
        bad = [word for word in words if word not in listops.IDS]
        if bad:
            unknown.append((line_num, bad[0]))
        sequences.append([listops.IDS.get(word, listops.OOV) for word in words])
        labels.append(int(row[1]))
        places.append(where)
    x, lengths, cut = pack(sequences, max_len)
    split, notes = _drop_empty(Split(x, lengths, np.array(labels, np.int64), cut=cut), places, path)
    if unknown:  # the vocabulary as the file writes it: "X" is "]"
        (line, word), vocabulary = unknown[0], " ".join(listops.TOKENS[:-1] + ("]",))
        token = f"{path}:{line}: {word!r} is not a ListOps token ({vocabulary}); it and the other"
        what = f"unknown tokens of {len(unknown)} line(s) of this file become the OOV id"
        notes.insert(0, f"{token} {what} {listops.OOV}")
    return split, notes


def read_imdb(folder: pathlib.Path, max_len: int) -> tuple:
    """aclImdb/{train,test}/{neg,pos}/*.txt -> bytes + 1; neg = 0, pos = 1 (tfds ClassLabel).

    Hidden files (macOS's ._<name>.txt) are not reviews: never read (_listing).
    As tfds imdb_reviews: a review is its file's raw bytes, stripped of ASCII whitespace at
    either end (bytes.strip); nothing is decoded, so line ends stay and any bytes are read.

    Returns:
        ({"train", "val", "test"} -> Split, notes); val is test, as officially. An empty (or
        all-whitespace) review is skipped, with a note.
    """
    splits, notes = {}, []
    for name in ("train", "test"):
        neg, pos = (_listing(folder / name / p, ".txt") for p in ("neg", "pos"))
        if not neg or not pos:
            raise DataError(f"no *.txt files in {folder / name}/neg or {folder / name}/pos")
        files = tqdm(neg + pos, desc=f"reading {name}", leave=False, disable=None)
        texts = [np.frombuffer(_read(f).strip(), np.uint8) for f in files]  # tfds imdb.py
        x, lengths, cut = pack(texts, max_len, 1)
        split = Split(x, lengths, np.array([0] * len(neg) + [1] * len(pos), np.int64), cut=cut)
        splits[name], skipped = _drop_empty(split, neg + pos, folder / name)
        notes += skipped
    return {"train": splits["train"], "val": splits["test"], "test": splits["test"]}, notes


def read_aan_tsv(path: pathlib.Path, max_len: int) -> tuple:
    """new_aan_pairs.*.tsv: no header; label, id1, id2, text1, text2, separated by tabs.

    Returns:
        (Split with x2 and lengths2, notes): a pair with an empty text is skipped, with a note.
    """
    docs1, docs2, labels, places = [], [], [], []
    lines = _read(path).split(b"\n")  # bytes: the texts are encoded byte by byte anyway
    for line_num, line in enumerate(lines, start=1):
        where, fields = f"{path}:{line_num}", line.removesuffix(b"\r").split(b"\t")
        if fields == [b""]:  # a blank line
            continue
        if line.startswith(b"\xef\xbb\xbf"):
            raise DataError(f"{where}: starts with a byte-order mark, which the release lacks")
        if len(fields) != 5:
            what = "5 tab-separated columns 'label id1 id2 text1 text2'"
            raise DataError(f"{where}: expected {what}, got {len(fields)}")
        # The official reader parses the label as a float, then casts it to int.
        # NOTE: differs from lra_benchmarks/matching/input_pipeline.py: 0.5 is refused, not 0
        try:
            labels.append(float(fields[0]))
        except ValueError:
            labels.append(None)  # not a number: on line 1, a header?
        if labels[-1] not in (0, 1):  # a word on line 1: a header, which the release lacks
            what = f"the label {fields[0].decode('latin-1')!r} is not 0 or 1"
            if labels[-1] is None and line_num == 1:
                what += " (a header?)"
            raise DataError(f"{where}: {what}")
        # lra_benchmarks/matching/input_pipeline.py: each text cut to 10000 bytes, then max_len
        docs1.append(np.frombuffer(fields[3][:10000], np.uint8))
        docs2.append(np.frombuffer(fields[4][:10000], np.uint8))
        places.append(where)
    (x, lengths, cut), (x2, lengths2, cut2) = pack(docs1, max_len, 1), pack(docs2, max_len, 1)
    split = Split(x, lengths, np.array(labels, dtype=np.int64), x2, lengths2, cut + cut2)
    return _drop_empty(split, places, path)


def _whole_numbers(values, high: int) -> np.ndarray | None:
    """values (a list, an array of any dtype and shape) as int64 when each is a whole number in
    [0, high) (an integer, a float such as 3.0, a bool as Python's 0 and 1); else None (strings,
    None, NaN, 2.5, -1)."""
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):  # a ragged list
        return None
    if array.dtype.kind not in "biuf":
        return None
    with np.errstate(invalid="ignore"):  # NaN compares False: refused
        whole = (array >= 0) & (array < high) & (array % 1 == 0)
    return array.astype(np.int64) if whole.all() else None


def _class_labels(values, n: int, n_classes: int) -> np.ndarray | None:
    """n class indices 0..n_classes - 1, shaped (n,) or (n, 1) (keras' layout) -> (n,) int64;
    else None."""
    labels = _whole_numbers(values, n_classes)
    if labels is not None and labels.shape == (n, 1):
        labels = labels[:, 0]
    return labels if labels is not None and labels.shape == (n,) else None


def tfds_split(split: str, keys: list, percents: tuple = ()) -> list:
    """The indices of keys in the order TFDS stores split `split` (ascending MD5 of split + key,
    tensorflow_datasets/core/hashing.py), cut as the slices "[:p%]" at round(p * n / 100.0)
    (Python's round: half to even) for each p of percents -> len(percents) + 1 index arrays."""
    md5 = [int(hashlib.md5((split + key).encode()).hexdigest(), 16) for key in keys]
    order = np.array(sorted(range(len(keys)), key=md5.__getitem__), dtype=np.int64)
    return np.split(order, [round(p * len(keys) / 100.0) for p in percents])


def rgb_to_gray(rgb: np.ndarray) -> np.ndarray:
    """(..., 3, P) uint8 RGB -> (..., P) int16, as tf.image.rgb_to_grayscale on uint8 images.

    TF computes in float32: convert_image_dtype multiplies by 1/255 (not a division: 71 colours
    differ), the weights are added red + green first, then blue, and the way back multiplies by
    255.5 and truncates. The same steps in float64 give 237 of the 2^24 colours one level less.
    """
    r, g, b = np.moveaxis(rgb.astype(np.float32) * np.float32(1 / 255), -2, 0)
    gray = (r * np.float32(0.2989) + g * np.float32(0.5870)) + b * np.float32(0.1140)
    return (gray * np.float32(255.5)).astype(np.int16)


def _latin1(text: str, encoding: str) -> bytes:
    """Protocol 2 writes bytes as _codecs.encode(text, "latin1"): that call, and no other codec."""
    if encoding != "latin1":
        raise DataError(f"_codecs.encode(..., {encoding[:20]!r})")
    return text.encode("latin1")


# What a PyTorch-LRA pickle or a CIFAR-10 batch names besides lists, dicts, numbers and strings
# (these have opcodes of their own): numpy writes an array as _reconstruct (protocols 2 to 4) or
# _frombuffer (5), a scalar (a label np.int32(3)) as scalar, each with numpy.dtype; numpy 1.x
# names their modules numpy.core.*, numpy 2.x numpy._core.*, and both read with this numpy's,
# those it pickles an array and a scalar with. Protocols 2 and 3 name set, frozenset, bytearray
# (Python 2: in __builtin__) and protocol 2 bytes as _codecs.encode. No other name is looked up.
_ARRAY = np.zeros(1)
_NUMPY = [("multiarray", _ARRAY.__reduce__()[0]), ("numeric", _ARRAY.__reduce_ex__(5)[0])]
_NUMPY.append(("multiarray", np.int32(0).__reduce__()[0]))
PICKLED = {(f"numpy.{core}.{m}", f.__name__): f for m, f in _NUMPY for core in ("core", "_core")}
PICKLED |= {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}
PICKLED |= {
    (m, t.__name__): t for m in ("builtins", "__builtin__") for t in (set, frozenset, bytearray)
}
PICKLED[("_codecs", "encode")] = _latin1


class _DataUnpickler(pickle.Unpickler):
    """pickle's Unpickler that finds the names in PICKLED only: DataError naming any other."""

    def find_class(self, module: str, name: str):
        if (module, name) not in PICKLED:
            raise DataError(repr(f"{module}.{name}"[:100]))
        return PICKLED[module, name]


def _unpickle(path: pathlib.Path, **options):
    """path's pickled object, of what the data files hold (PICKLED); a damaged pickle:
    pickle.UnpicklingError naming what was raised (the pickle module's documentation:
    "including (but not necessarily limited to) AttributeError, EOFError, ImportError, and
    IndexError"); any other name: DataError, and nothing it names is called."""
    data = _read(path)
    try:
        # pickle.loads keeps its memo in an array as long as the largest index the file names:
        # one flipped bit can make that 2³¹ entries, 16 GB zeroed before any error. A pickle of
        # n bytes memoizes fewer than n objects, so a larger index is damage, refused first.
        for opcode, index, _ in pickletools.genops(data):
            if opcode.name in ("PUT", "BINPUT", "LONG_BINPUT") and index >= len(data):
                raise ValueError(f"memo index {index} in a pickle of {len(data)} bytes")
        return _DataUnpickler(io.BytesIO(data), **options).load()
    except DataError as e:  # a name no data file holds: unpickling would call it (os.system)
        what = "which no data file holds (numpy arrays, numbers, strings, lists, dicts)"
        said = f"{path}: the pickle asks for {e}, {what}: refused, as it could run code"
        raise DataError(said) from None
    except Exception as e:  # any: a pickle names what to call
        raise pickle.UnpicklingError(f"{type(e).__name__}: {e}"[:200]) from None


def read_cifar(folder: pathlib.Path, max_len: int = 1024) -> dict:
    """cifar-10-batches-py -> 1024 gray pixels, all real; train[:90%], train[90%:], test.

    The splits of lra_benchmarks/image/input_pipeline.py, with TFDS's keys (an image's index in
    data_batch_1..5, or in test_batch) in TFDS's order (tfds_split): the 5,000 validation images
    are TFDS's, not the last of data_batch_5. Labels: a list, or an array (n,) or (n, 1) (as
    keras.datasets.cifar10 gives them) of whole numbers 0..9.
    """
    if max_len != 1024:  # as read_pathfinder: an image is as long as its pixels, never cut
        raise DataError(f"{folder}: CIFAR-10 images have 1024 pixels, but max_len is {max_len}")
    xs, ys = [], []  # data_batch_1..5, test_batch
    for file in _release_files("image", folder):
        try:
            batch = _unpickle(file, encoding="bytes")
            if not isinstance(batch, dict):
                raise TypeError(f"a pickled {type(batch).__name__}, not a dict")
            data, labels = np.asarray(batch[b"data"]), batch[b"labels"]
        except DataError:  # a name no batch holds: _unpickle said it
            raise
        except (pickle.UnpicklingError, KeyError, TypeError, ValueError) as e:
            raise DataError(f"{file}: not a CIFAR-10 python batch ({e!r})") from None
        if not data.size:  # one empty batch would silently drop a fifth of the images
            raise DataError(f"{file}: an empty batch, no image")
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:  # (n, 32, 32, 3)
            what = "uint8 (n, 3072): 1024 red, green, then blue values"
            raise DataError(f"{file}: data is {data.dtype} {data.shape}; CIFAR-10 holds {what}")
        labels = _class_labels(labels, len(data), 10)  # a crash after all training, else
        if labels is None:
            raise DataError(f"{file}: a label that is not a class 0..9, or not one per image")
        xs.append(rgb_to_gray(data.reshape(-1, 3, 1024)))  # (n, 1024)
        ys.append(labels)
    x, y = np.concatenate(xs[:5]), np.concatenate(ys[:5])  # (50000, 1024), (50000,)
    train, val = tfds_split("train", [str(i) for i in range(len(x))], (90,))  # [:90%], [90%:]
    (test,) = tfds_split("test", [str(i) for i in range(len(ys[5]))])
    parts = dict(train=(x, y, train), val=(x, y, val), test=(xs[5], ys[5], test))
    return {s: Split(x[i], np.full(len(i), 1024, np.int64), y[i]) for s, (x, y, i) in parts.items()}


def read_png_gray(path: pathlib.Path) -> np.ndarray:
    """An 8-bit grayscale non-interlaced PNG -> (h, w) uint8, with zlib alone (no PIL)."""
    data, pos, chunks = _read(path), 8, {}
    while pos + 8 <= len(data) and b"IEND" not in chunks:  # each: length, type, body, CRC
        size, chunk_type = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + size]
        chunks[chunk_type], pos = chunks.get(chunk_type, b"") + body, pos + 12 + size
    header = struct.unpack(">IIBBBBB", chunks.get(b"IHDR", b"").ljust(13, b"\0")[:13])
    if data[:8] != b"\x89PNG\r\n\x1a\n" or header[2:4] != (8, 0) or header[6] != 0:
        raise DataError(f"{path}: not an 8-bit grayscale non-interlaced PNG (IHDR {header})")
    try:  # rows (h, 1 + w): the filter type, then the filtered bytes
        raw = np.frombuffer(zlib.decompress(chunks.get(b"IDAT", b"")), dtype=np.uint8)
        image = raw.reshape(header[1], header[0] + 1).astype(np.int64)
    except (zlib.error, ValueError) as e:
        raise DataError(f"{path}: corrupt image data ({e})") from None
    # Filters 1 Sub, 2 Up, 3 Average, 4 Paeth add a prediction from the left (a), upper (b),
    # upper-left (c) bytes, modulo 256 (PNG spec 9); column 0 becomes the first byte's a = 0.
    filters, image[:, 0], above = image[:, 0].copy(), 0, np.zeros(image.shape[1], dtype=np.int64)
    for i, (filter_type, line) in enumerate(zip(filters, image, strict=True)):  # line: a view
        if filter_type == 1:  # Sub: x + a, a running sum along the row
            line[:] = np.cumsum(line) % 256
        elif filter_type == 2:  # Up: x + b
            line[:] = (line + above) % 256
        elif filter_type in (3, 4):  # Average: x + (a + b) // 2; Paeth: x + neighbour nearest p
            for j in range(1, len(line)):
                a, b, c = line[j - 1], above[j], above[j - 1]
                p = a + b - c  # the middle entries break ties: a, then b, then c
                paeth = min((abs(p - a), 0, a), (abs(p - b), 1, b), (abs(p - c), 2, c))[2]
                line[j] = (line[j] + ((a + b) // 2 if filter_type == 3 else paeth)) % 256
        elif filter_type != 0:  # 0: None
            raise DataError(f"{path}: row {i} has the unknown filter type {filter_type}")
        above = line
    return image[:, 1:].astype(np.uint8)


def read_pathfinder(folder: pathlib.Path, max_len: int) -> tuple:
    """pathfinder32/<difficulty>: metadata/*.npy (text lines) + PNGs -> the official split.

    As lra_benchmarks/data/pathfinder.py and image/input_pipeline.py: the difficulty is a TFDS
    split (PATHFINDER_SPLITS); line l of a metadata file, "imgs/<k> sample_<i>.png i label ...",
    has the key "imgs/<k>_sample_<i>.png_<l>"; the lines in TFDS order (tfds_split) are cut at
    80 % and 90 % of their number, and only then are empty PNG files (the release holds some)
    dropped, so a split may come out a few images short.

    Returns:
        ({"train", "val", "test"} -> Split, notes): notes count the empty PNGs left out.
    """
    if folder.name not in PATHFINDER_SPLITS:  # the difficulty's name picks the split's order
        raise DataError(f"{folder}: a Pathfinder folder is one of {list(PATHFINDER_SPLITS)}")
    metas = _listing(folder / "metadata", ".npy")
    if not metas:
        raise DataError(f"no metadata/*.npy in {folder}")
    keys, examples, notes = [], [], []  # examples: (png, label) per key
    for meta in metas:
        lines = _text(meta).split("\n")  # the official reader: text.split("\n")[:-1]
        if not "".join(lines).strip():  # reading on would silently drop its share of the data
            raise DataError(f"{meta}: empty; the release's metadata files each list many images")
        if lines[-1]:
            notes.append(f"{meta}:{len(lines)}: no newline at the end: left out, as officially")
        for line_num, line in enumerate(lines[:-1], start=1):
            # "imgs/<k> sample_<i>.png i label ...", label 1 = the markers are on the same path
            fields, where = line.split(" "), f"{meta}:{line_num}"
            if not line.strip():  # a blank line (the official reader fails on it)
                continue
            ok = len(fields) > 3 and fields[3] in ("0", "1")  # plain names: no ../, no ._x
            ok = ok and re.fullmatch(r"imgs/[^/.\0][^/\0]*", fields[0])
            if not ok or not re.fullmatch(r"[^/.\0][^/\0]*\.png", fields[1]):
                raise DataError(f"{where}: expected 'imgs/<k> sample_<i>.png i label'")
            png = folder / fields[0] / fields[1]
            if not os.path.isfile(png):  # no file, a folder, a broken link
                raise DataError(f"{where}: image {png} does not exist (as a regular file)")
            keys.append(f"{fields[0]}_{fields[1]}_{line_num}")
            examples.append((png, int(fields[3])))
    parts = tfds_split(PATHFINDER_SPLITS[folder.name], keys, (80, 90))  # [:80%], [80%:90%], ...
    splits, empty, side = {}, [], round(max_len**0.5)  # Pathfinder's images are square
    for name, part in zip(SPLITS, parts, strict=True):
        images, labels = [], []
        for i in tqdm(part, desc=f"reading Pathfinder {name}", leave=False, disable=None):
            png, label = examples[i]
            if png.stat().st_size == 0:
                empty.append(png)
                continue
            images.append(read_png_gray(png))
            if images[-1].shape != (side, side) or side * side != max_len:
                what = f"{images[-1].shape[1]}x{images[-1].shape[0]} pixels"
                raise DataError(f"{png}: {what}, but max_len {max_len} asks for square images")
            labels.append(label)
        x = np.array(images, dtype=np.int16).reshape(len(images), max_len)  # all real tokens
        splits[name] = Split(x, np.full(len(x), max_len, np.int64), np.array(labels, np.int64))
    if len(empty) == len(examples):
        raise DataError(f"{folder}: the metadata names no image that is not empty")
    none = [name for name in SPLITS if not len(splits[name].y)]
    if none:
        raise DataError(f"{folder}: no image in the {none[0]} split of {len(keys)} metadata lines")
    if empty:
        what = f"{len(empty)} empty PNG file(s) (the first: {empty[0]})"
        notes.append(f"{folder}: skipped {what}, as the official pipeline does")
    return splits, notes


def read_lra_pickle(path: pathlib.Path, task: str, max_len: int) -> tuple:
    """A PyTorch-LRA pickle (read by _unpickle): dicts of input_ids_0 (, _1), label.

    Returns:
        (Split, notes): a token example without a real (non-zero) id is skipped, with a note.
    """
    keys = ["input_ids_0", "input_ids_1"] if task == "retrieval" else ["input_ids_0"]
    try:
        items = _unpickle(path)
        if not isinstance(items, list):  # a pickled ndarray, say
            raise TypeError(f"a pickled {type(items).__name__}")
        columns = {key: [item[key] for item in items] for key in ["label", *keys]}
    except (pickle.UnpicklingError, KeyError, TypeError, IndexError) as e:
        raise DataError(f"{path}: not a PyTorch-LRA pickle (list of dicts): {e!r}") from None
    if not items:
        raise DataError(f"{path}: an empty list, no example")
    documents, cut = [], 0  # ids, lengths of input_ids_0 (, of input_ids_1); inputs cut
    image = task in ("image", "pathfinder")
    for key in keys:
        rows = []  # rows cut to max_len and padded each on its own (pack): any lengths
        for i, ids in enumerate(columns[key]):
            row = _whole_numbers(ids, VOCAB[task])  # image tasks: an (h, w) image, or its row
            if row is None or not (row.ndim == 1 or (image and row.ndim == 2)):
                what = f"token ids in [0, {VOCAB[task]}) of task {task} in a row"
                raise DataError(f"{path}: {key} of item {i} holds something other than {what}")
            rows.append(row.reshape(-1))
        x, row_lengths, cut_rows = pack(rows, max_len)  # token rows: real ids cut, not padding
        cut += cut_rows if image else sum(len(np.trim_zeros(row, "b")) > max_len for row in rows)
        # The pickles pad token sequences with 0 themselves: real tokens end at the last non-0.
        # NOTE: images keep every pixel; mlpen/Nystromformer LRA/code/dataset.py masks ids == 0
        nonzero = x != 0
        lengths = np.where(nonzero.any(1), max_len - np.argmax(nonzero[:, ::-1], axis=1), 0)
        documents += [x, row_lengths if image else lengths]
    # one class index per item; a wrong one would only fail inside the loss, on a GPU
    labels = _class_labels(columns["label"], len(items), N_CLASSES[task])
    if labels is None:
        what = f"a label that is not a class 0..{N_CLASSES[task] - 1} of task {task}"
        raise DataError(f"{path}: {what}")
    split = Split(*documents[:2], labels, *documents[2:], cut=cut)
    return _drop_empty(split, [f"{path}, item {i}" for i in range(len(items))], path)


@dataclass
class Source:
    """Where a task's three splits are read from: chosen by find_source, read by read_source."""

    kind: str  # "release" (a folder in the release layout), "generated" (ListOps), "pickles",
    # "prepared": a prepared file alone, its source files not under data_dir (used as it is)
    folder: pathlib.Path  # the release or generated folder; the pickles' data_dir
    files: list  # every file read: their names, sizes and times key the prepared file
    name: str  # the prepared file is lra-cache/<name>-<max_len>.npz
    said: str  # how the first note names it
    done: str  # what the readers do to it (DONE)
    settings: dict | None = None  # generated ListOps: the generator's (its generator.json)


class Prepared(NamedTuple):
    """What prepare returns: the splits, the notes for the run's log, the prepared file."""

    splits: dict  # {"train", "val", "test"} -> Split
    notes: list  # plain sentences: what was read first, then what is surprising in it
    file: pathlib.Path | None  # lra-cache/<name>-<max_len>.npz; None: not written
    unwritten: str | None = None  # the note saying why the prepared file could not be written


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while prepare fetches, generates, reads or writes; the message, one sentence, says
    what it was doing and what was kept (no stage leaves a file half-written)."""


@contextlib.contextmanager
def _interruptible(doing: str, kept: str):
    """Turn a Ctrl-C inside the block into Interrupted("interrupted while <doing>: <kept>")."""
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted while {doing}: {kept}") from None


def prepare(
    task: str,
    data_dir: str | pathlib.Path,
    max_len: int,
    *,
    seed: int = 0,
    listops: dict | None = None,
    pathfinder_dir: str = PATH_HARD,
    padding_note: bool = True,
    download: str | None = None,
    cache: bool = True,
) -> Prepared:
    """One LRA task's three splits: from the prepared file <data_dir>/lra-cache/<folder>-
    <max_len>.npz when it was made from the same files (_prepared_key), at this max_len and
    CACHE_VERSION, or when none of its files is there (a prepared data_dir copied alone); else
    read from the source (find_source), checked and written to the prepared file.

    Args:
        task: a key of VOCAB.
        data_dir: the folder of the release layout (and of aclImdb/, cifar-10-batches-py/).
        max_len: tokens per input: longer ones are cut, shorter ones right-padded with 0.
        seed: the ListOps generator's seed.
        listops: the ListOps settings, LISTOPS_PAPER's keys (None = LISTOPS_PAPER).
        pathfinder_dir: the Pathfinder folder under data_dir.
        padding_note: add the note on padding far beyond the longest input (see the Returns).
        download: a URL ("" = ARCHIVES'): fetch a missing or incomplete folder; None: not.
        cache: False: read the files, write no prepared file (and use none).

    Returns:
        Prepared(splits, notes, file, unwritten): notes are plain sentences for the run's log:
        first what was read (split sizes, source, what was done to it, inputs cut at max_len),
        then skipped examples, unknown ListOps tokens, a rebuilt prepared file, long padding.

    Raises:
        DataError: no data, incomplete or malformed data, or bad arguments; the message names
        the file. Interrupted: Ctrl-C, said in one sentence.
    """
    if task not in VOCAB:
        raise DataError(f"unknown task {task!r}: one of {list(VOCAB)}")
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
        raise DataError(f"max_len must be a positive integer, got {max_len!r}")
    root, asked = pathlib.Path(data_dir), listops or LISTOPS_PAPER
    # 1) the source, chosen explicitly (fetched first with download; ListOps: generated first),
    # unless only its prepared file is here
    alone = _prepared_alone(task, root, max_len, asked, seed, pathfinder_dir) if cache else None
    source, key = alone or (find_source(task, root, asked, seed, pathfinder_dir, download), None)
    file = root / "lra-cache" / f"{source.name}-{max_len}.npz"
    key = key or _prepared_key(root, source.files, max_len, source.settings)
    # 2) the prepared file, when it was made from these very files at this max_len
    splits, notes, why = None, [], None
    if cache:
        splits, notes, why = load_prepared(file, key, root)
    from_file = splits is not None
    # 3) else the source is read and checked, and the prepared file written
    kept = "no prepared file was written; the data files are kept"
    if not from_file:
        with _interruptible(f"reading {source.said}", kept):
            splits, notes = read_source(task, source, max_len)
        _check_generated(source, splits)
    unwritten = []  # a note on a cache that could not be written: then it was not rebuilt
    if cache and not from_file:
        with _interruptible(f"writing {file}", kept):
            unwritten = write_prepared(file, key, splits, notes, source.done)
    if why is not None and not unwritten:
        notes = notes + [f"{file}: rebuilt, as {why}"]
    notes = notes + unwritten
    fetched = ARCHIVES["listops"]["folder"]  # ListOps in any other folder is generated alone
    given = f"--download-url {download}" if download else "--download"
    if download is not None and source.kind == "generated" and source.folder.name != fetched:
        notes = notes + [f"{given} is not used: {source.folder} is generated, never fetched"]
    if download is not None and source.kind == "prepared":
        notes = notes + [f"{given} is not used: the prepared file is here"]
    # 4) what was read, said first; padding far beyond the longest input, said last
    notes = [_summary(task, source, splits, max_len, file if from_file else None), *notes]
    if padding_note:
        notes = notes + _padding_note(splits, max_len)
    written = file if cache and file.exists() and not unwritten else None
    return Prepared(splits, notes, written, unwritten[0] if unwritten else None)


def load_task(task: str, data_dir: str | pathlib.Path, max_len: int, **options) -> tuple:
    """prepare(task, data_dir, max_len, **options) without the file's name -> (splits, notes)."""
    prepared = prepare(task, data_dir, max_len, **options)
    return prepared.splits, prepared.notes


def _folder(task: str, root: pathlib.Path, asked: dict, pathfinder_dir: str) -> tuple:
    """The task's folder under root (ListOps, Pathfinder: the one asked for) and the stem of
    its PyTorch-LRA pickles' names -> (folder, stem)."""
    names = dict(listops=asked["folder"], pathfinder=pathfinder_dir)  # else the standard one
    stem = pathfinder_dir.replace("/", "-") if task == "pathfinder" else task
    return root / names.get(task, ARCHIVES[task]["folder"]), stem


def find_source(task: str, root, asked: dict, seed: int, pathfinder_dir: str, download) -> Source:
    """The task's source under root: its release folder (ListOps: generated there first, when
    absent), else the PyTorch-LRA pickles; with download (a URL, "" = ARCHIVES'), a folder
    missing or incomplete (_incomplete) is fetched first, the files there kept, where there are
    no pickles. Raises DataError when there is none or it is incomplete, naming the counts."""
    folder, stem = _folder(task, root, asked, pathfinder_dir)
    marker = folder / ARCHIVES[task]["need"][0]
    pickles = _find_pickles(root, stem)
    generated = task == "listops" and folder.name != ARCHIVES[task]["folder"]  # never fetched
    generated |= (folder / "generator.json").exists()  # nor completed from the release
    lacks = None if generated else _incomplete(task, folder)
    if download is not None and lacks is not None and pickles is None:
        download_task(task, root, download, pathfinder_dir)
        lacks = _incomplete(task, folder)
    if task == "listops" and (marker.exists() or pickles is None):
        if generated or lacks is None or not folder.exists():  # (absent: generated there)
            return _listops_source(folder, asked, seed)
    elif marker.exists() and lacks is None:
        said, done = f"the release folder {folder}", DONE[task]
        done = done.format(PATHFINDER_SPLITS.get(folder.name))  # Pathfinder: the difficulty
        return Source("release", folder, _release_files(task, folder), folder.name, said, done)
    elif pickles is not None and not marker.exists():
        said = f"the PyTorch-LRA pickles {root}/{stem}.*.pickle"
        return Source("pickles", root, pickles, f"{stem}-pickles", said, DONE["pickles"])
    if folder.exists():  # the folder is there, but not all of it
        how = "--download fetches the rest and keeps these"
        if download is not None:  # fetched, and still not as the release: not its folder
            how = f"after fetching {download or ARCHIVES[task]['url']}: move it away, fetch again"
        raise DataError(f"{lacks}: the {task} data is incomplete (an unpack cut short?); {how}")
    url, names = ARCHIVES[task]["url"], f"{root}/{stem}.{{train,dev,test}}.pickle"
    where = f"{marker} (from {url.split('//')[-1].rsplit('/', 1)[0]})"
    fetch = f"train_lra.py's or lra_data.py's --download fetches {url}"  # (not diagnose.py)
    what = f"expected {where} or the PyTorch-LRA pickles {names}; {fetch}"
    raise DataError(f"no data for task {task}: {what}")


# Text: the reviews the release has in each folder its reader reads, aclImdb/{train,test}/{neg,pos}
IMDB_REVIEWS = 12_500


def _incomplete(task: str, folder: pathlib.Path) -> str | None:
    """What the task's release folder lacks, naming the count found and the count expected (an
    unpack cut short), or None when it has all: Text, IMDB_REVIEWS reviews in each of its four
    folders; the other tasks, every file of ARCHIVES' need (Pathfinder's images are checked
    against its metadata by the reader, CIFAR-10's batches by unpickling them)."""
    if task == "text":
        for part in (folder / s / p for s in ("train", "test") for p in ("neg", "pos")):
            found = len(_listing(part, ".txt"))
            if found != IMDB_REVIEWS:
                return f"{part} holds {found:,} reviews, where the release has {IMDB_REVIEWS:,}"
        return None
    need = ARCHIVES[task]["need"]
    missing = [name for name in need if not os.path.exists(folder / name)]
    if missing:
        found = f"{len(need) - len(missing)} of the {len(need)} entries the release has there"
        return f"{folder} holds {found} (no {missing[0]})"
    return None


def _check_generated(source: Source, splits: dict) -> None:
    """A generated ListOps folder holds the example counts its generator.json names; fewer: a
    copy cut short, refused (DataError)."""
    for name in SPLITS if source.kind == "generated" else ():
        found, wanted = len(splits[name].y), source.settings[name]
        if found != wanted:
            what = f"holds {found:,} examples, where its generator.json says {wanted:,}"
            fix = f"a copy cut short? Delete {source.folder} to generate it again"
            raise DataError(f"{source.folder / f'basic_{name}.tsv'} {what}: {fix}")


def _find_pickles(root: pathlib.Path, stem: str) -> list | None:
    """The PyTorch-LRA pickles of train, dev (our val) and test, named as Nystromformer's or as
    Skyformer's ("lra-" first) -> their three paths, or None unless all three are there."""
    names = [[f"{stem}.{n}.pickle", f"lra-{stem}.{n}.pickle"] for n in ("train", "dev", "test")]
    found = [next((root / p for p in pair if (root / p).exists()), None) for pair in names]
    return found if all(found) else None


def read_source(task: str, source: Source, max_len: int) -> tuple:
    """Read and check source's three splits -> ({"train", "val", "test"} -> Split, notes)."""
    if source.kind == "pickles":
        results = [read_lra_pickle(path, task, max_len) for path in source.files]
    elif task == "listops":  # the release's files or the generator's, read alike
        results = [read_listops_tsv(source.folder / f"basic_{s}.tsv", max_len) for s in SPLITS]
    elif task == "retrieval":
        results = [read_aan_tsv(path, max_len) for path in source.files]
    elif task == "text":
        return read_imdb(source.folder, max_len)
    elif task == "image":
        return read_cifar(source.folder, max_len), []
    else:
        return read_pathfinder(source.folder, max_len)
    splits = {name: split for name, (split, _) in zip(SPLITS, results, strict=True)}
    return splits, [note for _, split_notes in results for note in split_notes]


def _summary(task: str, source: Source, splits: dict, max_len: int, prepared_file) -> str:
    """The first note: split sizes, the source (prepared_file: read from it), what was done."""
    sizes = ", ".join(f"{name} {len(split.y)}" for name, split in splits.items())
    where = source.said
    if prepared_file is not None and source.kind != "prepared":
        where = f"the prepared cache {prepared_file} of {source.said}"
    said = f"{task}: {sizes} examples from {where}; {source.done}"
    parts = {id(split): split for split in splits.values()}.values()  # Text: val is test
    cut = sum(split.cut for split in parts)
    if cut:
        inputs = sum(len(s.y) * (1 if s.x2 is None else 2) for s in parts)
        said += f"; {cut} of {inputs} inputs cut at max_len {max_len}: their ends dropped"
    return said


def _padding_note(splits: dict, max_len: int) -> list:
    """[a note] when max_len is more than twice the longest input, else []."""
    parts = {id(split): split for split in splits.values()}.values()  # Text: val is test
    lengths = [s.lengths for s in parts] + [s.lengths2 for s in parts if s.x2 is not None]
    longest = max(int(n.max(initial=0)) for n in lengths)
    if 2 * longest >= max_len:
        return []
    far = f"max_len {max_len} is more than twice the longest input ({longest} tokens)"
    return [f"{far}: every input is padded to {max_len} tokens, and attention pays for the padding"]


# The prepared file: the arrays of each split (Text: val is test, kept once) and a "meta" entry,
# JSON of its key (_prepared_key), the readers' notes, each split's count of inputs cut and what
# the readers did (Source.done)
FIELDS = ("x", "lengths", "y", "x2", "lengths2")
# What the key holds of each source file: what tar, zip, scp -p, cp -p and rsync -a all keep
KEY_HOLDS = "each file's size and modification time in whole seconds"


def _prepared_key(root: pathlib.Path, files: list, max_len: int, settings=None) -> dict:
    """What the prepared file was made from: each file's name (under root), size and
    modification time in whole seconds (a folder: its time alone, as its size is the file
    system's), max_len, CACHE_VERSION and a generated ListOps' settings."""
    stamps = []
    for path in files:
        stat = os.stat(path)
        size = None if os.path.isdir(path) else stat.st_size
        name = str(path).removeprefix(f"{root}{os.sep}")
        stamps.append([name, size, stat.st_mtime_ns // 1_000_000_000])  # floor, as tar keeps it
    return dict(version=CACHE_VERSION, max_len=max_len, settings=settings, sources=stamps)


def _why_rebuilt(old: dict, new: dict, root: pathlib.Path) -> str:
    """Why a prepared file made with key old is not used for key new: the first that differs
    of CACHE_VERSION, max_len, the ListOps settings and the source files."""
    if old.get("version") != new["version"]:
        return f"the readers changed (version {old.get('version')}, now {new['version']})"
    if old["max_len"] != new["max_len"]:
        return f"it was made for max_len {old['max_len']}, not {new['max_len']}"
    if old.get("settings") != new["settings"]:
        return f"it was made with other ListOps settings ({json.dumps(old.get('settings'))})"
    was, now = ({name: stamp for name, *stamp in key["sources"]} for key in (old, new))
    changed = {name for name in was.keys() & now.keys() if was[name] != now[name]}
    name = min(changed | (was.keys() ^ now.keys()), default=None)
    what = "is new" if name not in was else "is gone" if name not in now else "changed"
    return f"{root / str(name)} {what} (the key holds {KEY_HOLDS})"


def load_prepared(file: pathlib.Path, key: dict, root: pathlib.Path) -> tuple:
    """The prepared file's splits and notes, if it was made with key -> (splits, notes, None);
    else (None, [], why it is rebuilt: another key, or damaged; None when there is no file)."""
    try:
        with np.load(file) as npz:  # every array read whole: a damaged one fails here
            arrays = {name: npz[name] for name in npz.files}
        meta = json.loads(str(arrays.pop("meta")))
        if meta["key"] != key:
            return None, [], _why_rebuilt(meta["key"], key, root)
        cuts = meta["cut"].items()  # per split kept
        found = {n: Split(*(arrays.get(f"{n}.{f}") for f in FIELDS), cut=c) for n, c in cuts}
        splits = {name: found.get(name, found["test"]) for name in SPLITS}  # Text: val
        return splits, meta["notes"], None
    except (FileNotFoundError, NotADirectoryError):  # not prepared yet
        return None, [], None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        return None, [], f"it was damaged ({type(e).__name__})"


def _prepared_alone(task, root, max_len: int, asked: dict, seed: int, pathfinder_dir) -> tuple:
    """A prepared file of the task whose sources (folder, pickles) are all absent under root (a
    data_dir prepared elsewhere, copied without them), when it was made at this max_len and
    CACHE_VERSION (a generated ListOps: with these settings) -> (Source, its key); else None."""
    folder, stem = _folder(task, root, asked, pathfinder_dir)
    if folder.exists() or _find_pickles(root, stem) is not None:
        return None
    settings = _listops_settings(asked, seed) if task == "listops" else None
    for name in (folder.name, f"{stem}-pickles"):
        file = root / "lra-cache" / f"{name}-{max_len}.npz"
        try:
            with np.load(file) as npz:  # the meta entry alone is read here
                meta = json.loads(str(npz["meta"]))
            key = meta["key"]
            usable = (key["version"], key["max_len"]) == (CACHE_VERSION, max_len)
        except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile):
            continue  # none, or damaged: the source is looked for as ever
        if usable and key["settings"] in (None, settings):  # None: made from a release
            said = f"the prepared file {file}, used as it is: the files it was made from are "
            source = Source("prepared", folder, [], name, f"{said}not here", meta["done"])
            return source, key
    return None


def write_prepared(file: pathlib.Path, key: dict, splits: dict, notes: list, done="") -> list:
    """Write the splits, notes, key and what the readers did (done) to the prepared file through
    files.write (whole or not at all; Ctrl-C leaves no temporary file) -> [a note] if it cannot
    be written."""
    kept = {name: s for name, s in splits.items() if name == "test" or s is not splits["test"]}
    arrays = {}  # a Split's fields, but Retrieval's alone hold x2 and lengths2
    for name, split in kept.items():
        arrays |= {
            f"{name}.{f}": getattr(split, f) for f in FIELDS if getattr(split, f) is not None
        }
    cut = {name: split.cut for name, split in kept.items()}
    meta = dict(key=key, notes=notes, cut=cut, done=done)
    try:  # two runs at once: each file lands whole
        files.write(file, lambda f: np.savez(f, meta=json.dumps(meta), **arrays))
    except files.WriteError as e:  # a read-only data folder, a full disk: a run goes on without
        return [f"{e}: the next run reads the data again"]
    return []


def download_task(task: str, data_dir, url: str = "", pathfinder_dir: str = PATH_HARD) -> None:
    """Fetch the task's folder (ARCHIVES; Pathfinder: pathfinder_dir) into data_dir from `url`, a
    mirror or a file:// copy ("" = the table's URL), unless it is complete (_incomplete); the
    files there are kept. The archive's size and MD5 are checked where known. Raises DataError,
    one sentence: what failed, the URL, how to fetch it by hand."""
    table = ARCHIVES[task]
    folder = pathfinder_dir if task == "pathfinder" else table["folder"]
    root, url = pathlib.Path(data_dir), url or table["url"]
    keep, need = table.get("keep", ".*"), table["need"]
    archive = download.Archive(url, folder, keep, need, md5=table["md5"], size=table["size"])
    kept = "nothing was unpacked; the files there before are kept"
    try:
        with _interruptible(f"downloading {url} into {root / folder}", kept):
            download.fetch(
                archive, root / folder, complete=lambda dest: not _incomplete(task, dest)
            )
    except download.FolderError as e:  # the archive was not at fault: no way by hand
        raise DataError(str(e)) from None
    except download.Failed as e:
        by_hand = f"by hand: download {url} and unpack the {folder}/ in it as {root / folder}"
        raise DataError(f"{e}; {by_hand}") from None


def _release_files(task: str, folder: pathlib.Path) -> list:
    """The files the reader of task's release folder reads (Text: 50,000 paths as strings, which
    are quicker); Pathfinder: the metadata and the image folders (whose times change when an
    image is added, removed or renamed)."""
    if task == "text":
        parts = [folder / s / p for s in ("train", "test") for p in ("neg", "pos")]
        return [file for part in parts for file in _listing(part, ".txt")]
    if task == "retrieval":  # the LRA "eval" file is our val
        return [folder / f"new_aan_pairs.{name}.tsv" for name in ("train", "eval", "test")]
    if task == "image":
        return [folder / f"data_batch_{i}" for i in range(1, 6)] + [folder / "test_batch"]
    images = [path for path in sorted((folder / "imgs").glob("[!.]*")) if path.is_dir()]
    return _listing(folder / "metadata", ".npy") + images


def _listops_settings(asked: dict, seed: int) -> dict:
    """The generator's settings (generator.json's keys, and shards where more than 1) of the
    ListOps settings asked (LISTOPS_PAPER's keys) and seed."""
    missing = [key for key in listops.KEYS[1:] if key not in asked]
    if missing:
        raise DataError(f"the ListOps settings lack {missing} (LISTOPS_PAPER has every key)")
    settings = {"seed": seed, **{key: asked[key] for key in listops.KEYS[1:]}}
    if asked.get("shards", 1) > 1:
        settings["shards"] = asked["shards"]
    return settings


def _listops_source(folder: pathlib.Path, asked: dict, seed: int) -> Source:
    """ListOps: folder's basic_{train,val,test}.tsv, generated there first when absent
    (listops.ready): the release's (no generator.json) read as they are, ours only when made
    with the settings asked."""
    settings = _listops_settings(asked, seed)
    # each expression has more than min_length tokens, each at least 2 characters with its space
    sizes = dict(train=settings["train"], eval=settings["val"] + settings["test"])
    flag = "--listops-size" if sizes["train"] >= sizes["eval"] else "--listops-eval-size"
    what = f"ListOps' {sum(sizes.values()):,} expressions"
    said = files.too_big(2 * settings["min_length"] * sum(sizes.values()), what, flag)
    if said and not (folder / "basic_train.tsv").exists():  # to be generated: refused first
        raise DataError(said)
    try:
        with _interruptible(f"generating ListOps into {folder}", "nothing was written there"):
            generated = listops.ready(folder, settings)
    except ValueError as e:  # incomplete, other settings, bounds that (almost) no tree meets
        raise DataError(str(e)) from None
    except OSError as e:  # a read-only or full disk, a file where the folder goes
        said = str(e) if isinstance(e, files.WriteError) else files.fault(e, folder)
        raise DataError(said) from None
    tsvs = [folder / f"basic_{s}.tsv" for s in SPLITS]
    if not generated:
        said = f"the release folder {folder} (not generated: the sizes asked for do not apply)"
        return Source("release", folder, tsvs, folder.name, said, DONE["listops"])
    said, read = (
        f"the generator (seed {seed}), written to {folder}",
        [*tsvs, folder / "generator.json"],
    )
    return Source("generated", folder, read, folder.name, said, DONE["listops"], settings)


def parse_args(argv: list | None = None) -> argparse.Namespace:
    """The flags of python lra_data.py (--help): train_lra.py's names and paper defaults."""
    about = "Fetch (--download), read, check one LRA task and write <data-dir>/lra-cache/<folder>-"
    about += "<max-len>.npz, which train_lra.py (same flags) then reads: prepare where there is "
    about += "internet, then copy <data-dir> (or its lra-cache/ alone) to a machine without."
    parser = argparse.ArgumentParser(description=about)
    add = parser.add_argument
    add("--task", choices=list(VOCAB), default="listops", help="the task (default listops)")
    add("--data-dir", default="data", help="the task's folder is or goes there (default data)")
    lengths = ", ".join(f"{task} {n}" for task, n in MAX_LEN.items())
    add("--max-len", type=int, help=f"tokens per input, longer ones cut (default {lengths})")
    add("--data-seed", type=int, default=0, help="ListOps: the generator's seed (default 0)")
    n, n_eval = LISTOPS_PAPER["train"], LISTOPS_PAPER["val"]
    what = "ListOps generated (not the release's): "
    add("--listops-size", type=int, default=n, help=f"{what}train examples (default {n})")
    add("--listops-eval-size", type=int, default=n_eval, help=f"val, test each (default {n_eval})")
    add("--pathfinder", choices=list(PATHFINDER_DIRS), default="hard", help="(default hard)")
    add("--download", action="store_true", help="fetch the task's folder, missing or incomplete")
    urls = "; ".join(f"{task} {table['url']}" for task, table in ARCHIVES.items())
    add("--download-url", help=f"a mirror or file:// copy; implies --download (default {urls})")
    return parser.parse_args(argv)


def main(argv: list | None = None) -> Prepared:
    """python lra_data.py --task T: prepare one task's data, as train_lra.py reads it; say the
    split sizes, the source and the file written. Exit 1 when it cannot (the data is wrong, or
    the prepared file cannot be written); 130 on Ctrl-C, saying what was kept."""
    args = parse_args(argv)
    max_len = MAX_LEN[args.task] if args.max_len is None else args.max_len
    n_eval = args.listops_eval_size
    settings = dict(LISTOPS_PAPER, train=args.listops_size, val=n_eval, test=n_eval)
    fetch = args.download_url or "" if args.download or args.download_url else None
    options = dict(seed=args.data_seed, listops=settings, download=fetch)
    options.update(pathfinder_dir=PATHFINDER_DIRS[args.pathfinder])
    try:
        prepared = prepare(args.task, args.data_dir, max_len, **options)
    except DataError as e:
        sys.exit(f"lra_data.py: {e}")  # one sentence, exit status 1
    except KeyboardInterrupt as e:  # one sentence, exit status 130 (a shell's for Ctrl-C)
        said = str(e) if isinstance(e, Interrupted) else "interrupted: nothing is half-written"
        sys.stderr.write(f"\nlra_data.py: {said}\n")
        sys.exit(130)
    for note in prepared.notes:
        if note != prepared.unwritten:
            print(note)
    if prepared.unwritten is not None:  # the one thing it is run for
        sys.exit(f"lra_data.py: {prepared.unwritten}")
    print(f"prepared file: {prepared.file}")
    return prepared


if __name__ == "__main__":
    main()
