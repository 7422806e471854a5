"""
uea_data.py: the UEA multivariate time-series archive, from `.ts` files to padded arrays.

    read_ts    a `.ts` reader: every header tag, unequal lengths, '?' interpolated as the
               official loader; errors name file, line, fault
    load_uea   <data-dir>/<Name>/<Name>_{TRAIN,TEST}.ts -> standardised (TRAIN statistics),
               zero-padded arrays, a padding mask, notes on what is surprising in the data
    download_dataset   one dataset's zip from the UEA archive, with download.py

Format: aeon-toolkit/aeon aeon/datasets/_data_loaders.py. Official loader (thuml/Flowformer and
Primal-Attention reuse it): gzerveas/mvts_transformer src/datasets/{data,dataset}.py.
Depends on: numpy, download.py (the training script turns the arrays into tensors)
"""

import pathlib
import re
import sys
from dataclasses import dataclass, field

import numpy as np

import download

ARCHIVE_PAGE = "https://www.timeseriesclassification.com/dataset.php"
ARCHIVE_ZIPS = "https://timeseriesclassification.com/aeon-toolkit"  # <Name>.zip, as aeon uses
HEADER_TAGS = ("problemname", "timestamps", "missing", "univariate", "dimensions")
HEADER_TAGS += ("equallength", "serieslength", "classlabel", "targetlabel", "data")
NUMBER = r"[-+.\deE?]+"  # a value or '?', as it may stand in the label's place


class TsFormatError(ValueError):
    """A malformed .ts file. The message names the file, the line and what is wrong."""

    def __init__(self, path, line_no: int | None, what: str):
        super().__init__(f"{path}:{line_no}: {what}" if line_no else f"{path}: {what}")
        self.path, self.line_no = str(path), line_no


class DatasetNotFoundError(FileNotFoundError):
    """No such dataset: not in --data-dir, not downloadable, or no plain name (as '../etc')."""


@dataclass
class TsFile:
    """One parsed .ts file."""

    path: str
    header: dict  # lower-case tag -> value as written, e.g. {"problemname": "JapaneseVowels"}
    series: list  # one float64 array (L_i, F) per case; missing values already interpolated
    labels: np.ndarray | None  # int64 (n,) indices into class_names, float64 targets, or None
    class_names: list  # the @classLabel vocabulary, in the order the header lists it
    line_numbers: list  # the file line of each case, for error messages


def read_ts(path, require_labels: bool = False) -> TsFile:
    """Read a UEA/aeon `.ts` file: multivariate, equal or unequal length, '?' = missing.

    NOTE: labels map to indices in `@classLabel` order, unlike the official loader (pandas
    category codes = SORTED labels found in that one file), because the header lists the whole
    vocabulary: a split lacking a class would shift the codes. Only the numbering changes
    (BasicMotions: Standing = 0 here, Badminton = 0 there).

    Args:
        path: the `.ts` file.
        require_labels: refuse a file without class labels at its header, before its data
            lines: read without labels, a line that does end in a label would otherwise be
            reported as a case with one dimension too many.
    """
    header, class_names, series, labels, line_numbers = {}, [], [], [], []
    n_dims, has_label, in_data = None, False, False
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as e:  # a folder so named, no permission (load_uea names a broken link)
        raise TsFormatError(path, None, f"cannot be read ({e.strerror})") from None
    if not data.strip():
        raise TsFormatError(path, None, "empty file")
    if b"\0" in data:  # text never holds NUL; zip, gzip, UTF-16 text and other binaries do
        raise TsFormatError(path, None, "NUL bytes: a binary or UTF-16 file, not .ts text")
    # Archive comments may hold non-UTF-8 bytes (a latin-1 µ): replace them; refuse them below.
    # Lines end as in Python's text mode (\n, \r\n, \r), not str.splitlines' (also \f, \x85):
    # "# note\f1,2:up" is a comment, as the official loader reads it.
    # A byte-order mark opens the file, or it is text (U+FEFF, not white space) like any other.
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    for line_no, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "\ufffd" in line and (in_data or line.startswith("@")):
            raise TsFormatError(path, line_no, "bytes that are not UTF-8 text (a binary file?)")
        if "\ufeff" in line and (in_data or line.lstrip("\ufeff").startswith("@")):
            raise TsFormatError(path, line_no, "a byte-order mark inside the file (files joined?)")
        if in_data:
            values, label = _parse_case(line, has_label, n_dims, class_names, header, path, line_no)
            n_dims = len(values)
            series.append(_fill_missing(values, path, line_no))
            labels.append(_parse_label(label, class_names, header, path, line_no))
            line_numbers.append(line_no)
        elif line.startswith("@"):  # aeon tolerates free text before @data; so do we
            # the tag starts right after "@", as the official loader reads it ("@ data" is none)
            tag, value = re.match(r"(\S*)(.*)", line[1:]).groups()
            in_data = _parse_tag(tag.lower(), value.strip(), header, class_names, path, line_no)
            if in_data:
                if require_labels and not class_names:
                    raise TsFormatError(path, None, _no_labels_message(header))
                has_label = _bool(header, "classlabel") or _bool(header, "targetlabel")
                # @dimensions, else 1 for @univariate true, else None: set by the first case
                n_dims = int(header.get("dimensions", _bool(header, "univariate"))) or None
    if not in_data:
        raise TsFormatError(path, None, "no @data line (is this a .ts file?)")
    if not series:
        raise TsFormatError(path, None, "no cases after @data")
    dtype = np.int64 if class_names else np.float64  # class indices or regression targets
    labels = np.array(labels, dtype) if class_names or _bool(header, "targetlabel") else None
    return TsFile(str(path), header, series, labels, class_names, line_numbers)


def _no_labels_message(header: dict) -> str:
    """Why a file without class labels cannot be a classification dataset, in one sentence."""
    need = "a classification dataset needs them"
    if _bool(header, "targetlabel"):
        return f"this file holds regression targets (@targetLabel true), not class labels; {need}"
    why = "@classLabel false" if "classlabel" in header else "no @classLabel line"
    return f"this file has no labels ({why}); {need}"


def _bool(header: dict, tag: str) -> bool:
    """A true/false header tag (absent = false); @classLabel is true when it lists labels."""
    return header.get(tag, "false").split(maxsplit=1)[0].lower() == "true"


def _parse_tag(tag: str, value: str, header: dict, class_names: list, path, line_no) -> bool:
    """Store one header tag; return True for @data."""
    if not tag:
        raise TsFormatError(path, line_no, "no tag right after '@' (as in @data)")
    if tag not in HEADER_TAGS:
        raise TsFormatError(path, line_no, f"unknown header tag @{tag}")
    if tag in ("timestamps", "missing", "univariate", "equallength", "targetlabel"):
        if value.lower() not in ("true", "false"):
            raise TsFormatError(path, line_no, f"@{tag} must be true or false, got {value!r}")
    if tag == "timestamps" and value.lower() == "true":
        # Decision: refuse rather than drop the time stamps (irregular sampling would be lost
        # silently); none of the UEA classification datasets uses them.
        raise TsFormatError(path, line_no, "@timeStamps true: timestamps not supported")
    if tag in ("dimensions", "serieslength") and not re.fullmatch("0*[1-9][0-9]*", value):
        raise TsFormatError(path, line_no, f"@{tag} must be a positive integer, got {value!r}")
    if tag == "classlabel":
        words = value.split()
        if not words or words[0].lower() not in ("true", "false"):
            raise TsFormatError(path, line_no, "@classLabel must be 'true <labels...>' or 'false'")
        names = words[1:] if words[0].lower() == "true" else []
        if words[0].lower() == "true" and not names:
            raise TsFormatError(path, line_no, "@classLabel true lists no labels")
        if len(set(names)) != len(names):
            raise TsFormatError(path, line_no, f"@classLabel repeats a label: {names}")
        class_names.extend(names)
    if tag == "data" and value:
        raise TsFormatError(path, line_no, f"@data must have no value, got {value!r}")
    header[tag] = value
    return tag == "data"


def _parse_case(line: str, has_label: bool, n_dims, class_names, header, path, line_no):
    """One data line 'v,v,...:v,v,...:label' -> (list of F float arrays, label string)."""
    fields = line.split(":")
    label = fields.pop().strip() if has_label else None
    # The label is the field after the last ':', so a line without one loses a channel to it:
    # the "label" is then empty, holds commas, or is a number on a case one dimension short.
    short = n_dims is not None and len(fields) == n_dims - 1 and re.fullmatch(NUMBER, label or "")
    if has_label and label not in class_names and (not label or "," in label or short):
        what = "class label" if class_names else "target value"
        why = f"{label[:40]!r} holds values" if label else "the line ends in ':'"
        raise TsFormatError(path, line_no, f"the {what} is missing ({why})")
    if not fields:
        raise TsFormatError(path, line_no, "a case needs values before its label")
    if n_dims is not None and len(fields) != n_dims:
        source = "the header" if "dimensions" in header or _bool(header, "univariate") else "case 1"
        raise TsFormatError(path, line_no, f"{len(fields)} dimension(s), not {n_dims} ({source})")
    values = [_parse_values(text, k, path, line_no) for k, text in enumerate(fields)]
    lengths = sorted({len(v) for v in values})
    if len(lengths) > 1:
        raise TsFormatError(path, line_no, f"channels of different lengths {lengths} in one case")
    if _bool(header, "equallength") and int(header.get("serieslength", lengths[0])) != lengths[0]:
        what = f"length {lengths[0]}, but @seriesLength {header['serieslength']}"
        raise TsFormatError(path, line_no, what)
    return values, label


def _parse_values(text: str, dim: int, path, line_no) -> np.ndarray:
    """'1.5,?,2' -> [1.5, nan, 2.0]; '?' (and 'nan') mark missing values."""
    # Unstripped: float() (and numpy) take the white space around a number, and refuse what
    # str.strip would also remove (control characters such as \x1f: a damaged file).
    tokens = text.split(",")
    try:  # fast path: numpy parses the whole channel at once
        out = np.array(tokens, dtype=np.float64)
    except ValueError:
        out = np.empty(len(tokens))
        for i, token in enumerate(tokens):
            try:
                out[i] = np.nan if token.strip() == "?" else float(token)
            except ValueError:
                where = f"(dimension {dim + 1}, step {i + 1})"
                raise TsFormatError(path, line_no, f"non-numeric value {token!r} {where}") from None
    # The model sees float32: a value beyond its range (1e300, or 'inf', which parses as a
    # float) would become inf there, and inf turns the TRAIN statistics into NaN.
    largest = np.finfo(np.float32).max
    beyond = np.flatnonzero(np.abs(out) > largest)  # NaN compares False: kept
    if beyond.size:
        i = beyond[0]
        where = f"in dimension {dim + 1} (step {i + 1})"
        if np.isinf(out[i]):
            raise TsFormatError(path, line_no, f"infinite value {where}: {tokens[i]!r}")
        what = f"the value {tokens[i]} {where} overflows float32 (largest {largest:.4g})"
        raise TsFormatError(path, line_no, what)
    return out


def _fill_missing(values: list, path, line_no) -> np.ndarray:
    """NaN -> linear interpolation over time per channel, ends = nearest value -> (L, F), as the
    official loader's pandas interpolate(method="linear", limit_direction="both")."""
    x, steps = np.stack(values, axis=1), np.arange(len(values[0]))  # x: (L, F)
    for c in np.flatnonzero(np.isnan(x).any(axis=0)):
        known = ~np.isnan(x[:, c])
        if not known.any():
            raise TsFormatError(path, line_no, f"dimension {c + 1} has no values (all missing)")
        x[~known, c] = np.interp(steps[~known], steps[known], x[known, c])
    return x


def _parse_label(label, class_names: list, header: dict, path, line_no):
    """Label string -> class index (@classLabel order) or float target; None if unlabelled."""
    if class_names:
        if label not in class_names:
            what = f"unknown class label {label!r}; @classLabel lists {class_names}"
            raise TsFormatError(path, line_no, what)
        return class_names.index(label)
    if _bool(header, "targetlabel"):
        try:
            return float(label)
        except ValueError:
            raise TsFormatError(path, line_no, f"non-numeric target {label!r}") from None
    return None


def dataset_paths(data_dir: str, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """(<data-dir>/<Name>/<Name>_TRAIN.ts, ..._TEST.ts), always by name (never a glob).

    NOTE: differs from the official SpokenArabicDigits commands, which omit --pattern TRAIN so
    that the first .ts file glob returns (possibly TEST) becomes the training set.
    """
    # A name with a path in it would read (or, with --download, write) outside data_dir
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\"):
        what = "a plain folder name such as 'Heartbeat', without '/', '\\' or '..'"
        raise DatasetNotFoundError(f"{name!r} is no UEA dataset name: a name is {what}")
    try:  # --data-dir '' would read (and with --download write) the current folder
        folder = download.data_folder(data_dir) / name
    except download.FolderError as e:
        raise DatasetNotFoundError(str(e)) from None
    return folder / f"{name}_TRAIN.ts", folder / f"{name}_TEST.ts"


def _in_the_way(paths: tuple) -> str | None:
    """Why the files at paths that are not there are not read, where the folder shows it: a
    symbolic link that leads nowhere, or the user's files named but for case (or one folder up);
    None where nothing shows."""
    missing = [path for path in paths if not path.exists()]
    for path in missing:
        said = download.broken_link(path)
        if said:
            return f"{said}: restore its target or remove it"
    found = {path: _look_alikes(path) for path in missing}
    found = {path: alike[0] for path, alike in found.items() if alike}
    if not found:
        return None
    one = len(found) == 1
    names, read = (" and ".join(map(str, paths)) for paths in (found.values(), found))
    what = "the file read is" if one else "the files read are"
    why = "the UEA archive's names: case matters, and a dataset's files lie in <data-dir>/<Name>/"
    return f"found {names}, but {what} {read} ({why}): rename or move {'it' if one else 'them'}"


def _look_alikes(path: pathlib.Path) -> list:
    """The files path (<data-dir>/<Name>/<Name>_TRAIN.ts) may be meant by: named so but for case,
    in <data-dir>/<Name>/ (the folder's name in any case) or in <data-dir> itself."""
    data_dir, folder, name = path.parent.parent, path.parent.name.lower(), path.name.lower()
    folders = [data_dir, *(d for d in _entries(data_dir) if d.name.lower() == folder)]
    return sorted(f for d in folders for f in _entries(d) if f.name.lower() == name and f != path)


def _entries(folder: pathlib.Path) -> list:
    """The paths in folder; none where it is no folder or cannot be read."""
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def missing_dataset_message(data_dir: str, name: str, base_url: str, download: bool = True) -> str:
    """Where we looked and how to get the data: by hand, or (download=True) with --download."""
    train, test = dataset_paths(data_dir, name)
    rerun = ", or rerun with --download to fetch and unpack that zip." if download else "."
    looked = f"UEA dataset {name!r} not found; looked for\n  {train}\n  {test}\n"
    put = "the two files at the paths above"
    there = [path for path in (train, test) if path.exists()]
    if there:  # one of the two: --download keeps it and unpacks the other
        missing = test if there[0] == train else train
        looked = f"UEA dataset {name!r} is incomplete: {there[0]} is there, but not\n  {missing}\n"
        put = "the file at the path above"
    file = next((path for path in train.parents if path.is_file()), None)  # --data-dir a file
    if file:
        looked += f"({file} is a file: --data-dir names the folder that holds {name}/)\n"
    zipped = [p for p in _entries(train.parent.parent) if p.name.lower() == f"{name.lower()}.zip"]
    if zipped:  # the dataset's zip, not unpacked: --download-url unpacks it from there
        url = zipped[0].parent.resolve().as_uri()
        into = f"unzip its two .ts files into {train.parent}, or pass --download-url {url}"
        looked += f"({zipped[0]} is not unpacked: {into})\n"
    whole = f"{ARCHIVE_PAGE} (Multivariate2018_ts.zip; put {put})"
    one = f"the per-dataset zip {base_url.rstrip('/')}/{name}.zip{rerun}"
    return f"{looked}Get it from the UEA archive, {whole},\nor {one}"


def download_dataset(name: str, data_dir: str, base_url: str, progress: bool = True):
    """Fetch <base_url>/<Name>.zip and unpack <Name>_TRAIN.ts / _TEST.ts (wherever they stand
    in the zip, named in any case) into <data-dir>/<Name>/, when either is missing (one there is
    kept, and said); download.py writes nothing else."""
    paths = dataset_paths(data_dir, name)
    said = _in_the_way(paths)  # the user's files under other names: not fetched over
    if said:
        raise DatasetNotFoundError(said)
    url, names = f"{base_url.rstrip('/')}/{name}.zip", [p.name for p in paths]
    keep = "|".join(map(re.escape, names))  # no folder: found by file name alone
    archive = download.Archive(url, keep=keep, need=tuple(names), kind="zip")
    try:
        download.fetch(archive, paths[0].parent, progress)
    except download.FolderError as e:  # the zip was not at fault: no way by hand
        raise DatasetNotFoundError(str(e)) from None
    except download.Failed as e:
        by_hand = missing_dataset_message(data_dir, name, base_url, download=False)
        raise DatasetNotFoundError(f"{e}\n{by_hand}") from None


@dataclass
class UEAData:
    """A dataset ready for the model, as numpy arrays (the script makes tensors of its batches).

    x holds the standardised values, zero-padded or clipped to max_len steps; mask is True at
    real time steps; y indexes class_names (TEST labels are mapped onto TRAIN's numbering).
    """

    x_train: np.ndarray  # (B, N, F) float32
    mask_train: np.ndarray  # (B, N) bool
    y_train: np.ndarray  # (B,) int64
    x_test: np.ndarray  # (B, N, F) float32
    mask_test: np.ndarray  # (B, N) bool
    y_test: np.ndarray  # (B,) int64
    class_names: list  # TRAIN's @classLabel list: y = k is class_names[k]
    mean: np.ndarray  # (F,) float64 standardisation statistics, from TRAIN only
    std: np.ndarray  # (F,) ddof = 1; 0 when TRAIN has a single time step
    n_clipped_train: int  # TRAIN cases longer than max_len, clipped
    n_clipped_test: int  # TEST cases longer than max_len, clipped
    constant_channels: list = field(default_factory=list)  # 0-based, constant in TRAIN: centred
    notes: list = field(default_factory=list)  # sentences for the run's log: what is surprising


def load_uea(data_dir: str, name: str, max_len: int = 0) -> UEAData:
    """Read TRAIN and TEST, standardise with TRAIN statistics, zero-pad, build padding masks.

    Args:
        data_dir: folder holding <Name>/<Name>_{TRAIN,TEST}.ts.
        name: dataset name.
        max_len: steps per case; 0 = the longest TRAIN series. Longer cases are clipped, as
            the official mvts collate_fn does (JapaneseVowels: train max 26, test max 29).

    Returns:
        UEAData; its `notes` say what the run's log should tell (clipped cases, constant
        channels, classes TRAIN lacks, padding far beyond the longest series).

    Raises:
        DatasetNotFoundError: a .ts file is missing (the message says where to get it), or
            the name is no plain name ('../etc').
        TsFormatError: a file that is malformed or does not fit the other, naming it.
        ValueError: a max_len below 0.
    """
    train_path, test_path = dataset_paths(data_dir, name)
    if not (train_path.exists() and test_path.exists()):
        said = _in_the_way((train_path, test_path))
        raise DatasetNotFoundError(said or missing_dataset_message(data_dir, name, ARCHIVE_ZIPS))
    train, test = (read_ts(path, require_labels=True) for path in (train_path, test_path))
    f_test, f = test.series[0].shape[1], train.series[0].shape[1]
    if f_test != f:
        raise TsFormatError(test.path, None, f"{f_test} dimensions, TRAIN has {f}")
    # TEST may list its labels in another order: map them by name onto the TRAIN indices.
    unknown = [c for c in test.class_names if c not in train.class_names]
    if unknown:
        raise TsFormatError(test.path, None, f"classes {unknown} not in TRAIN {train.class_names}")
    y_test = np.array([train.class_names.index(c) for c in test.class_names], np.int64)[test.labels]
    # Per-feature standardisation with TRAIN statistics only, as mvts (pandas ddof=1; ddof=0 for
    # a lone time step, where ddof=1 is NaN). TSLib uses TEST statistics on TEST: a leak we avoid.
    steps = np.concatenate(train.series)  # (all TRAIN time steps, F)
    mean, std = steps.mean(axis=0), steps.std(axis=0, ddof=min(1, len(steps) - 1))
    # NOTE: differs from the mvts Normalizer, (x - mean) / (std + eps), where a channel constant
    # in TRAIN divides TEST's other values by eps. As scikit-learn's StandardScaler, a scale that
    # is 0 or rounding noise (equal values give std ~ eps * |mean|) becomes 1: only centred.
    constant = std < 10 * np.finfo(np.float64).eps * np.maximum(1.0, np.abs(mean))
    scale = np.where(constant, 1.0, std)
    max_len = max_len or max(len(s) for s in train.series)  # pad_series checks it
    train_arrays = (*_standardise(train, mean, scale, max_len), train.labels)  # x, mask, y
    test_arrays = (*_standardise(test, mean, scale, max_len), y_test)
    n_clipped = [sum(len(s) > max_len for s in split.series) for split in (train, test)]
    channels = np.flatnonzero(constant).tolist()  # constant_channels
    data = UEAData(*train_arrays, *test_arrays, train.class_names, mean, std, *n_clipped, channels)
    data.notes = _notes(data, train, test)
    return data


def _standardise(split: TsFile, mean: np.ndarray, scale: np.ndarray, max_len: int) -> tuple:
    """pad_series for one file, refusing a case whose standardised values overflow float32."""
    x, mask = pad_series(split.series, mean, scale, max_len)
    # A TEST value far outside TRAIN's range, over a small TRAIN std, can exceed float32.
    bad = np.argwhere(~np.isfinite(x))
    if bad.size:  # the first case, its first such step
        case, _, channel = bad[0]
        stats = f"mean {mean[channel]:.4g}, scale {scale[channel]:.4g}"
        what = f"dimension {channel + 1} standardised with the TRAIN statistics ({stats})"
        raise TsFormatError(split.path, split.line_numbers[case], f"{what} overflows float32")
    return x, mask


def _notes(data: UEAData, train: TsFile, test: TsFile) -> list:
    """What the run's log should say about this dataset, one plain sentence each."""
    notes, max_len = [], data.x_train.shape[1]
    channels = data.constant_channels
    if channels:
        why = "(0-based indices; dividing by their std of ~0 would blow TEST values up)"
        notes.append(f"channels {channels} are constant in TRAIN: centred, not scaled {why}")
    train_classes = np.unique(data.y_train)
    if len(train_classes) == 1:
        only = f"TRAIN holds one class only ({data.class_names[train_classes[0]]!r})"
        notes.append(f"{only}: the model can learn nothing but to predict it")
    test_only = sorted(set(data.y_test.tolist()) - set(train_classes.tolist()))
    if test_only:
        names = [data.class_names[k] for k in test_only]
        n = int(np.isin(data.y_test, test_only).sum())
        notes.append(
            f"classes {names} occur only in TEST ({n} of {len(data.y_test)} TEST cases): TRAIN's "
            "@classLabel lists them, so the model has an output for them, but no TRAIN case to "
            "learn them from: whatever it gets right of those cases, it gets right by chance"
        )
    longest = [max(len(s) for s in split.series) for split in (train, test)]
    if data.n_clipped_train or data.n_clipped_test:
        notes.append(
            f"max_len {max_len} clips {data.n_clipped_train} of {len(data.y_train)} TRAIN cases "
            f"and {data.n_clipped_test} of {len(data.y_test)} TEST cases (longest {longest[0]} "
            f"and {longest[1]} steps): their later steps are dropped, as the official loader does"
        )
    most = max(longest)
    if max_len > 2 * most:
        far = f"max_len {max_len} is more than twice the longest series ({most} steps)"
        pad = f"every case is zero-padded to {max_len} steps (0 = the longest TRAIN series)"
        notes.append(f"{far}: {pad}")
    return notes


def pad_series(series: list, mean: np.ndarray, std: np.ndarray, max_len: int) -> tuple:
    """(x - mean) / std, zero-padded or clipped to max_len -> x (n, max_len, F) float32, mask.

    std is the scale to divide by: positive (load_uea puts 1 for a constant channel). mask
    (n, max_len) is True at real time steps; padded steps are exactly 0 (the mean after scaling).
    A value beyond the float32 range becomes inf (load_uea refuses such a case, naming it).
    """
    mean, std = np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < 1:
        raise ValueError(f"max_len must be a positive integer (or 0 in load_uea), got {max_len!r}")
    if mean.shape != std.shape or mean.ndim != 1 or not (np.isfinite(mean + std) & (std > 0)).all():
        raise ValueError(f"need finite mean and positive std of shape (F,): {mean}, {std}")
    bad = [i for i, s in enumerate(series) if np.shape(s)[1:] != mean.shape]
    if bad:
        raise ValueError(f"cases {bad[:9]} are not (L, F) arrays with F = {len(mean)} channels")
    x = np.zeros((len(series), max_len, len(mean)), dtype=np.float32)
    mask = np.zeros((len(series), max_len), dtype=bool)
    with np.errstate(over="ignore"):  # float64 -> float32 overflow: inf, found by the caller
        for i, s in enumerate(series):
            n = min(len(s), max_len)
            x[i, :n] = (np.asarray(s[:n]) - mean) / std
            mask[i, :n] = True
    return x, mask


if __name__ == "__main__":  # a library: no command line of its own
    run = "python train_uea.py --dataset <Name> (--download fetches it)"
    print(f"uea_data.py has no command line; a UEA dataset is read by {run}", file=sys.stderr)
    sys.exit(2)
