"""
lra_data.py: the Long Range Arena data, from files on disk (or a generator) to numpy arrays.
prepare(task, data_dir, max_len): find_source chooses the source (a release folder, fetched by
download_task; PyTorch-LRA pickles; the ListOps generator, writing a release folder); the
prepared file <data_dir>/lra-cache/<folder>-<max_len>.npz is loaded if made from the same files,
else read_source reads them (lra_readers.py: `Split`s and notes), checks, and write_prepared
writes it. train_lra.py calls load_task (prepare without the file's name); `python lra_data.py
--task text --download` prepares alone.
Official code: google-research/long-range-arena lra_benchmarks/, mlpen/Nystromformer LRA/.
Depends on: numpy, download.py, files.py, listops.py (the ListOps generator), lra_readers.py
"""

import argparse
import contextlib
import json
import os
import pathlib
import sys
import zipfile
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

import download
import files
import listops
from lra_readers import (
    PATHFINDER_SPLITS,
    SPLITS,
    VOCAB,
    DataError,
    Split,
    _listing,
    _release_files,
    read_aan_tsv,
    read_cifar,
    read_imdb,
    read_listops_tsv,
    read_lra_pickle,
    read_pathfinder,
)

# prepare's default ListOps: the paper's (lra_benchmarks/data/listops.py's default flags,
# listops.OFFICIAL), generated in 16 seeded shards at once (as train_lra.py's paper preset).
LISTOPS_PAPER = dict(folder="listops-1000", **listops.OFFICIAL, shards=16)
# Tokens per input in the papers' setting (train_lra.py's paper preset): lra_data.py's default
MAX_LEN = dict(listops=2000, text=1000, retrieval=4000, image=1024, pathfinder=1024)
PATH_HARD = "pathfinder32/curv_contour_length_14"  # and the paper's "Path": Pathfinder32, hard
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
        raise DataError(files.fault(e, folder)) from None
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
