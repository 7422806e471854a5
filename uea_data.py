"""
uea_data.py: the UEA multivariate time-series archive, from `.ts` files to padded arrays.

    read_ts       a `.ts` reader in the standard library and numpy: every header tag, ':'-separated
                  dimensions, unequal lengths, '?' missing values (linear interpolation per case
                  and channel, as the official loader); errors name the file, the line and what
                  is wrong (TsFormatError)
    load_uea      <data-dir>/<Name>/<Name>_{TRAIN,TEST}.ts -> standardised (TRAIN statistics
                  only), zero-padded arrays with a padding mask
    download_dataset   one dataset's zip from the UEA archive, with a progress bar

Format and the official loaders' behaviour: spec DATA.md §2.
Depends on: numpy, torch (tensors for the padded batches), tqdm
"""

import pathlib
import shutil
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

# ---------------------------------------------------------------------------------------------
# The .ts reader (format: DATA.md §2.1; the aeon / sktime readers), standard library + numpy.
ARCHIVE_PAGE = "https://www.timeseriesclassification.com/dataset.php"
ARCHIVE_ZIPS = "https://timeseriesclassification.com/aeon-toolkit"  # <Name>.zip, as aeon uses
HEADER_TAGS = (
    "problemname", "timestamps", "missing", "univariate", "dimensions",
    "equallength", "serieslength", "classlabel", "targetlabel", "data",
)  # fmt: skip


class TsFormatError(ValueError):
    """A malformed .ts file. The message names the file, the line and what is wrong."""

    def __init__(self, path, line_no: Optional[int], what: str):
        super().__init__(f"{path}:{line_no}: {what}" if line_no else f"{path}: {what}")
        self.path, self.line_no = str(path), line_no


class DatasetNotFoundError(FileNotFoundError):
    """The dataset's .ts files are not where --data-dir says."""


@dataclass
class TsFile:
    """One parsed .ts file.

    Attributes:
        header: lower-case tag -> value as written, e.g. {"problemname": "JapaneseVowels"}.
        series: one float64 array (L_i, F) per case; missing values already interpolated.
        labels: int64 (n,) indices into class_names, float64 (n,) targets, or None.
        class_names: the @classLabel vocabulary, in the order the header lists it.
        line_numbers: the file line of each case, for error messages.
    """

    path: str
    header: dict
    series: list
    labels: Optional[np.ndarray]
    class_names: list
    line_numbers: list


def read_ts(path) -> TsFile:
    """Read a UEA/aeon `.ts` file: multivariate, equal or unequal length, '?' = missing.

    Labels map to indices in the order of `@classLabel`.
    NOTE: differs from the official loader (pandas category codes = SORTED label strings),
    because the issue asks for the header's order. Only the numbering of the classes changes
    (e.g. BasicMotions: Standing = 0 here, Badminton = 0 there), not what is learned.

    Raises:
        TsFormatError: naming the file, the line and the problem.
    """
    header, class_names, series, labels, line_numbers = {}, [], [], [], []
    n_dims, has_label, in_data = None, False, False
    # Some archive files carry non-UTF-8 bytes in their comments (DATA.md §2.1).
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    for line_no, raw in enumerate(lines, start=1):
        line = raw.strip().lstrip("\ufeff")
        if not line or line.startswith("#"):
            continue
        if in_data:
            values, label = _parse_case(line, has_label, n_dims, header, path, line_no)
            n_dims = len(values)
            series.append(_fill_missing(values, path, line_no))
            labels.append(_parse_label(label, class_names, header, path, line_no))
            line_numbers.append(line_no)
        elif line.startswith("@"):
            tag, value = (line[1:].split(maxsplit=1) + [""])[:2]
            in_data = _parse_tag(tag.lower(), value.strip(), header, class_names, path, line_no)
            if in_data:
                has_label = _bool(header, "classlabel") or _bool(header, "targetlabel")
                n_dims = int(header["dimensions"]) if "dimensions" in header else None
        # aeon tolerates free text before @data; so do we.
    if not in_data:
        raise TsFormatError(path, None, "no @data line (is this a .ts file?)")
    if not series:
        raise TsFormatError(path, None, "no cases after @data")
    if class_names:
        labels = np.array(labels, dtype=np.int64)
    else:
        labels = np.array(labels, dtype=np.float64) if _bool(header, "targetlabel") else None
    return TsFile(str(path), header, series, labels, class_names, line_numbers)


def _bool(header: dict, tag: str) -> bool:
    """A true/false header tag (absent = false); @classLabel is true when it lists labels."""
    return header.get(tag, "false").split(maxsplit=1)[0].lower() == "true"


def _parse_tag(tag: str, value: str, header: dict, class_names: list, path, line_no) -> bool:
    """Store one header tag; return True for @data."""
    if tag not in HEADER_TAGS:
        raise TsFormatError(path, line_no, f"unknown header tag @{tag}")
    if tag in ("timestamps", "missing", "univariate", "equallength", "targetlabel"):
        if value.lower() not in ("true", "false"):
            raise TsFormatError(path, line_no, f"@{tag} must be true or false, got {value!r}")
    if tag == "timestamps" and value.lower() == "true":
        # Decision: refuse rather than drop the time stamps (irregular sampling would be lost
        # silently); none of the UEA classification datasets uses them.
        raise TsFormatError(path, line_no, "@timeStamps true: timestamps not supported")
    if tag in ("dimensions", "serieslength") and not (value.isdigit() and int(value) > 0):
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


def _parse_case(line: str, has_label: bool, n_dims, header: dict, path, line_no):
    """One data line 'v,v,...:v,v,...:label' -> (list of F float arrays, label string)."""
    fields = line.split(":")
    label = fields.pop().strip() if has_label else None
    if not fields:
        raise TsFormatError(path, line_no, "a case needs values before its label")
    if n_dims is None and _bool(header, "univariate"):
        n_dims = 1
    if n_dims is not None and len(fields) != n_dims:
        raise TsFormatError(
            path, line_no, f"found {len(fields)} dimensions, expected {n_dims} (header or case 1)"
        )
    values = [_parse_values(field, k, path, line_no) for k, field in enumerate(fields)]
    lengths = sorted({len(v) for v in values})
    if len(lengths) > 1:
        raise TsFormatError(path, line_no, f"channels of different lengths {lengths} in one case")
    if _bool(header, "equallength") and "serieslength" in header:
        if lengths[0] != int(header["serieslength"]):
            raise TsFormatError(
                path, line_no, f"length {lengths[0]}, but @seriesLength {header['serieslength']}"
            )
    return values, label


def _parse_values(field: str, dim: int, path, line_no) -> np.ndarray:
    """'1.5,?,2' -> [1.5, nan, 2.0]; '?' (and 'nan') mark missing values."""
    tokens = [t.strip() for t in field.split(",")]
    try:  # fast path: numpy parses the whole channel at once
        out = np.array(tokens, dtype=np.float64)
    except ValueError:
        out = np.empty(len(tokens))
        for i, token in enumerate(tokens):
            try:
                out[i] = np.nan if token == "?" else float(token)
            except ValueError:
                where = f"(dimension {dim + 1}, step {i + 1})"
                raise TsFormatError(path, line_no, f"non-numeric value {token!r} {where}") from None
    if np.isinf(out).any():  # 'inf' parses as a float but would turn the statistics into NaN
        raise TsFormatError(path, line_no, f"infinite value in dimension {dim + 1}")
    return out


def _fill_missing(values: list, path, line_no) -> np.ndarray:
    """NaN -> linear interpolation over time per channel; the ends take the nearest value.

    Same as the official loader's pandas interpolate(method="linear", limit_direction="both")
    on each case and channel. Returns (L, F).
    """
    x = np.stack(values, axis=1)  # (L, F)
    steps = np.arange(len(x))
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
            raise TsFormatError(
                path, line_no, f"unknown class label {label!r}; @classLabel lists {class_names}"
            )
        return class_names.index(label)
    if _bool(header, "targetlabel"):
        try:
            return float(label)
        except ValueError:
            raise TsFormatError(path, line_no, f"non-numeric target {label!r}") from None
    return None


# ---------------------------------------------------------------------------------------------
# Finding (or downloading) a dataset, then turning it into padded tensors.


def dataset_paths(data_dir: str, name: str) -> tuple[pathlib.Path, pathlib.Path]:
    """(<data-dir>/<Name>/<Name>_TRAIN.ts, ..._TEST.ts), always by name (never a glob).

    NOTE: differs from the official SpokenArabicDigits commands, which omit --pattern TRAIN so
    that the first .ts file glob returns (possibly TEST) becomes the training set.
    """
    folder = pathlib.Path(data_dir) / name
    return folder / f"{name}_TRAIN.ts", folder / f"{name}_TEST.ts"


def missing_dataset_message(data_dir: str, name: str, base_url: str) -> str:
    """Where we looked and how to get the data."""
    train, test = dataset_paths(data_dir, name)
    return (
        f"UEA dataset {name!r} not found; looked for\n  {train}\n  {test}\n"
        f"Get it from the UEA archive, {ARCHIVE_PAGE} (Multivariate2018_ts.zip; put the two "
        f"files at the paths above),\nor the per-dataset zip {base_url}/{name}.zip, "
        f"or rerun with --download true to fetch and unpack that zip."
    )


def download_dataset(name: str, data_dir: str, base_url: str, progress: bool = True):
    """Fetch <base_url>/<Name>.zip and unpack <Name>_TRAIN.ts / _TEST.ts into <data-dir>/<Name>/.

    Only the two .ts files are written, each to a path we build (no other member of the zip
    is extracted, so a hostile archive cannot write outside the folder).
    """
    url = f"{base_url.rstrip('/')}/{name}.zip"
    folder = pathlib.Path(data_dir) / name
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f"{name}.zip.part"
    try:
        with urllib.request.urlopen(url) as response, open(part, "wb") as f:
            total = int(response.headers.get("Content-Length") or 0) or None
            show = progress and sys.stderr.isatty()
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=name, disable=not show)
            with bar:
                while chunk := response.read(1 << 16):
                    f.write(chunk)
                    bar.update(len(chunk))
    except (urllib.error.URLError, OSError) as e:
        part.unlink(missing_ok=True)
        msg = f"could not download {url}: {e}\n" + missing_dataset_message(data_dir, name, base_url)
        raise DatasetNotFoundError(msg) from None
    try:
        with zipfile.ZipFile(part) as archive:
            members = {pathlib.PurePosixPath(m).name.lower(): m for m in archive.namelist()}
            for path in dataset_paths(data_dir, name):
                member = members.get(path.name.lower())
                if member is None:
                    raise DatasetNotFoundError(f"{url} holds no {path.name}: {sorted(members)}")
                with archive.open(member) as src, open(path, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile:
        raise DatasetNotFoundError(f"{url} is not a zip file") from None
    finally:
        part.unlink()


@dataclass
class UEAData:
    """A dataset ready for the model: x (n, max_len, F) float32, mask (n, max_len) bool, y (n,)."""

    x_train: Tensor
    mask_train: Tensor
    y_train: Tensor
    x_test: Tensor
    mask_test: Tensor
    y_test: Tensor
    class_names: list
    mean: np.ndarray  # (F,) standardisation statistics, from TRAIN only
    std: np.ndarray  # (F,)
    n_clipped: int  # TEST cases longer than max_len, clipped


def load_uea(data_dir: str, name: str, max_len: int = 0) -> UEAData:
    """Read TRAIN and TEST, standardise with TRAIN statistics, zero-pad, build padding masks.

    Args:
        data_dir: folder holding <Name>/<Name>_{TRAIN,TEST}.ts.
        name: dataset name.
        max_len: steps per case; 0 = the longest TRAIN series. Longer cases are clipped, as
            the official mvts collate_fn does (JapaneseVowels: train max 26, test max 29).
    """
    train_path, test_path = dataset_paths(data_dir, name)
    if not (train_path.exists() and test_path.exists()):
        raise DatasetNotFoundError(missing_dataset_message(data_dir, name, ARCHIVE_ZIPS))
    train, test = read_ts(train_path), read_ts(test_path)
    for split in (train, test):
        if not split.class_names:
            raise TsFormatError(split.path, None, "no @classLabel: not a classification file")
        if split.series[0].shape[1] != train.series[0].shape[1]:
            raise TsFormatError(split.path, None, "TRAIN and TEST have different dimensions")
    # TEST may list its labels in another order: map them by name onto the TRAIN indices.
    to_train = [_train_index(train, test, c) for c in test.class_names]
    y_test = np.array(to_train, dtype=np.int64)[test.labels]
    # Per-feature standardisation with TRAIN statistics only (mvts "standardization", pandas
    # ddof=1, eps = float64 machine epsilon). TSLib normalises TEST with TEST statistics: a
    # leak we avoid.
    steps = np.concatenate(train.series)  # (all TRAIN time steps, F)
    mean, std = steps.mean(axis=0), steps.std(axis=0, ddof=1)
    max_len = max_len or max(len(s) for s in train.series)
    x_train, m_train = pad_series(train.series, mean, std, max_len)
    x_test, m_test = pad_series(test.series, mean, std, max_len)
    return UEAData(
        x_train, m_train, torch.from_numpy(train.labels), x_test, m_test,
        torch.from_numpy(y_test), train.class_names, mean, std,
        n_clipped=sum(len(s) > max_len for s in test.series),
    )  # fmt: skip


def _train_index(train: TsFile, test: TsFile, label: str) -> int:
    """Index of a TEST class name in the TRAIN vocabulary."""
    if label not in train.class_names:
        raise TsFormatError(test.path, None, f"class {label!r} is not in TRAIN's @classLabel")
    return train.class_names.index(label)


def pad_series(series: list, mean: np.ndarray, std: np.ndarray, max_len: int):
    """Standardise, zero-pad or clip to max_len -> x (n, max_len, F) float32, mask (n, max_len).

    mask is True at real time steps; padded steps are exactly 0 (the mean after scaling).
    """
    # eps keeps a constant channel (std = 0) finite, as in the official Normalizer.
    eps = np.finfo(np.float64).eps
    x = np.zeros((len(series), max_len, len(mean)), dtype=np.float32)
    mask = np.zeros((len(series), max_len), dtype=bool)
    for i, s in enumerate(series):
        n = min(len(s), max_len)
        x[i, :n] = (s[:n] - mean) / (std + eps)
        mask[i, :n] = True
    return torch.from_numpy(x), torch.from_numpy(mask)
