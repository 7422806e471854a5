"""
lra_readers.py: the Long Range Arena's file formats, each read into numpy arrays.

    read_listops_tsv   ListOps: basic_{train,val,test}.tsv, words to the generator's ids
    read_imdb          Text: aclImdb/{train,test}/{neg,pos}/*.txt, bytes + 1
    read_aan_tsv       Retrieval: new_aan_pairs.*.tsv, two documents per example
    read_cifar         Image: cifar-10-batches-py's pickled batches, grey as TensorFlow's
    read_pathfinder    Pathfinder: metadata/*.npy and the PNGs it names (read_png_gray)
    read_lra_pickle    any task: a PyTorch-LRA pickle

Each reader returns `Split`s: int16 ids right-padded with 0 and the true lengths, so the mask
is `arange(N) < length`, never `ids != 0` (a pixel of value 0 is a real token), together with
notes: plain sentences on what is surprising in the data (skipped examples, unknown tokens),
which the training script prints. Examples with no real token never reach the model. A pickle
is read by _unpickle, which finds only the names the data files hold (PICKLED): a pickle naming
anything else is refused, and nothing it names runs. lra_data.py chooses the files to read and
keeps the splits in its prepared file (raise its CACHE_VERSION when a reader's rules change).
Official code: google-research/long-range-arena lra_benchmarks/, mlpen/Nystromformer LRA/.
Depends on: numpy, tqdm, files.py (too_big), listops.py (the ListOps vocabulary)
"""

import hashlib
import io
import os
import pathlib
import pickle
import pickletools
import re
import struct
import sys
import zlib
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

import files
import listops

# Token ids per task: ListOps 0 pad, 1..15 tokens, 16 OOV; bytes + 1 with 0 pad; pixel values.
VOCAB = {"listops": 17, "text": 257, "retrieval": 257, "image": 256, "pathfinder": 256}
N_CLASSES = {"listops": 10, "text": 2, "retrieval": 2, "image": 10, "pathfinder": 2}
SPLITS = ("train", "val", "test")
# lra_benchmarks/data/pathfinder.py: each difficulty folder is the TFDS split of this name
PATHFINDER_SPLITS = dict(curv_baseline="easy", curv_contour_length_9="intermediate")
PATHFINDER_SPLITS |= dict(curv_contour_length_14="hard")


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


if __name__ == "__main__":  # a library: no command line of its own
    run = "python lra_data.py --task <task> (or train_lra.py)"
    print(f"lra_readers.py has no command line; the LRA data is read by {run}", file=sys.stderr)
    sys.exit(2)
