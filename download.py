"""
download.py: fetch an archive (http, https, file://), check it, unpack only the files asked for,
in the steps of torchvision's download_url and extract_archive:
    download_url  one URL to one file: progress; size and MD5 checked; renamed into place
    extract       the wanted members of a tar or zip file on disk
    stream_tar    the same from a tar read as it arrives (the LRA release: GBs, no checksum),
                  stopping past the folder asked for (a tar holds a folder's members together)
    fetch         one of these, under a lock, into a folder renamed into place; a failure
                  (Ctrl-C, the network, a wrong MD5 or size, a full disk) leaves nothing
                  half-written and is one sentence (Failed)
As under tarfile's "data" filter, a kept member whose path is absolute or holds '..', a link (a
zip's symlink entry too) or a device is refused.
Depends on: tqdm (used by uea_data.py for the UEA zips, lra_data.py for the LRA tasks' archives)
"""

import functools
import hashlib
import http.client
import os
import pathlib
import re
import shutil
import stat
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from tqdm import tqdm

if sys.platform != "win32":  # Windows has no fcntl, and _lock no lock
    import fcntl

# URLError, HTTPError, a full disk: OSError; a cut stream: IncompleteRead or tarfile's ReadError
FAILURES = (OSError, ValueError, tarfile.TarError, http.client.HTTPException, zipfile.BadZipFile)


class Failed(ValueError):
    """An archive that could not be fetched or is not what was asked for; the message, one
    sentence, names the URL and the fault."""


@dataclass(frozen=True)
class Archive:
    """An archive and the files to take from it: those below `folder`, under their path below
    it, where that path matches `keep`; `need` names the paths it must yield."""

    url: str
    folder: str = ""  # "/"-separated names anywhere in a member's path; "": by file name alone
    keep: str = ".*"  # a regular expression
    need: tuple = ()  # a member so named but for case takes that name
    kind: str = "tar"  # "tar" (any compression) or "zip"
    md5: str | None = None  # of the whole archive, where known
    size: int | None = None  # in bytes, where known


class Member(NamedTuple):
    """One member of a tar or zip, as both describe it."""

    name: str  # its path in the archive
    is_dir: bool
    is_file: bool  # a regular file: not a link, not a device
    open: Callable  # () -> a binary file object of its bytes


def fetch(archive: Archive, dest, progress: bool = True) -> None:
    """Unpack archive's wanted files into the folder dest, unless all of archive.need are there.

    Raises Failed: one sentence, the URL and what failed; nothing half-written is left.
    """
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, whole = dest.parent / f".{dest.name}.part", dest.parent / f".{dest.name}.download"
    lock = _lock(dest.parent)
    try:
        if all((dest / name).exists() for name in archive.need):
            return  # there already, or another process has just fetched it
        _remove(part, whole)  # left by a process killed on its way (we hold the lock)
        label = dest.name if progress else None
        if archive.kind == "zip" or archive.md5 or archive.size:  # check first, then unpack
            download_url(archive.url, whole, md5=archive.md5, size=archive.size, label=label)
            extract(whole, part, archive)
        else:  # nothing to check at the end: read as it arrives, up to the folder's end
            stream_tar(archive, part, label)
        _place(part, dest, archive)
    except KeyboardInterrupt:
        print(f"\nthe download of {archive.url} was interrupted: nothing was kept", file=sys.stderr)
        raise
    except Failed:
        raise
    except (tarfile.TarError, zipfile.BadZipFile) as e:
        what = f"is no whole {archive.kind} archive ({e}): cut short, or an error page?"
        raise Failed(f"{archive.url} {what}") from None
    except FAILURES as e:  # the network, the disk
        raise Failed(f"could not download {archive.url} ({e})") from None
    finally:
        _remove(part, whole)
        if lock is not None:
            os.close(lock)  # and with it the lock


def download_url(
    url: str, file, md5: str | None = None, size: int | None = None, label: str | None = None
) -> None:
    """Download url into file: written to file.part, checked (size, else the Content-Length the
    server gave; MD5), then renamed to file. label: the progress bar's name (None: no progress).
    Raises Failed on a wrong size or MD5, OSError or HTTPException when the download fails."""
    file = pathlib.Path(file)
    tmp = file.with_name(f"{file.name}.part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(tmp, "wb") as out:
            reader = _Reader(response, label)
            shutil.copyfileobj(reader, out)
        _check(reader, url, md5, size)
        os.replace(tmp, file)
    finally:
        tmp.unlink(missing_ok=True)


def extract(file, folder: pathlib.Path, archive: Archive) -> None:
    """Write archive's wanted members of the tar or zip file (archive.kind) into folder."""
    zipped = archive.kind == "zip"
    with zipfile.ZipFile(file) if zipped else tarfile.open(file) as opened:
        for member in _zip_members(opened) if zipped else _tar_members(opened):
            _write(member, _path_below(member.name, archive), folder, archive)


def stream_tar(archive: Archive, folder: pathlib.Path, label: str | None = None) -> None:
    """Read the tar at archive.url as it arrives and write its wanted members into folder;
    reading stops at the first member past archive.folder (none past it: to the archive's end,
    whose length is checked against the Content-Length)."""
    with urllib.request.urlopen(archive.url, timeout=60) as response:
        reader = _Reader(response, label)
        inside = False  # a member below the folder has been seen
        with tarfile.open(fileobj=reader, mode="r|*") as tar:
            for member in _tar_members(tar):
                below = _path_below(member.name, archive)
                if below is None and inside:
                    return  # past the folder: the rest of the archive is not read
                if below is not None:
                    inside = True
                    _write(member, below, folder, archive)
        while reader.read(1 << 20):  # the end-of-archive padding, to the last byte
            pass
        _check(reader, archive.url, md5=None, size=None)


def _tar_members(tar: tarfile.TarFile) -> Iterable[Member]:
    """tar's members as Member records, in the archive's order."""
    for info in tar:
        opener = functools.partial(tar.extractfile, info)
        yield Member(info.name, info.isdir(), info.isfile(), opener)


def _zip_members(z: zipfile.ZipFile) -> Iterable[Member]:
    """z's members as Member records; a symlink entry (its Unix mode in the high 16 bits of
    external_attr) is no regular file, though zipfile would write it as one holding its target."""
    for info in z.infolist():
        regular = not info.is_dir() and not stat.S_ISLNK(info.external_attr >> 16)
        yield Member(info.filename, info.is_dir(), regular, functools.partial(z.open, info))


def _path_below(name: str, archive: Archive) -> str | None:
    """The member's path below archive.folder (its file name when there is no folder), or None
    when the member is not below the folder."""
    parts = pathlib.PurePosixPath(name).parts
    if not archive.folder:
        return parts[-1] if parts else None
    inside = tuple(archive.folder.split("/"))
    for at in range(len(parts)):
        if parts[at : at + len(inside)] == inside:
            return "/".join(parts[at + len(inside) :])
    return None


def _write(member: Member, below: str | None, folder: pathlib.Path, archive: Archive) -> None:
    """Write member into folder as `below` (its path below archive.folder; None: not below it)
    when archive keeps it; refuse (Failed) a kept member that is a link or a device, or whose
    path could leave folder."""
    if below is None or member.is_dir:
        return
    names = {name.lower(): name for name in archive.need}
    below = names.get(below.lower(), below)  # a UEA zip's "japanesevowels_train.ts", say
    if not re.fullmatch(archive.keep, below):
        return
    parts = pathlib.PurePosixPath(member.name).parts
    if not member.is_file or member.name.startswith(("/", "\\")) or ".." in parts:
        what = "is a link or a device" if not member.is_file else "has an absolute path or '..'"
        raise Failed(f"{archive.url}: the member {member.name!r} {what}: refused, nothing was kept")
    (folder / below).parent.mkdir(parents=True, exist_ok=True)
    with member.open() as src, open(folder / below, "wb") as dst:
        shutil.copyfileobj(src, dst)


def _place(part: pathlib.Path, dest: pathlib.Path, archive: Archive) -> None:
    """Move the unpacked folder part to dest, once it holds every file archive.need names."""
    missing = [name for name in archive.need if not (part / name).exists()]
    if missing:
        where = "/".join(name for name in (archive.folder, missing[0]) if name)
        raise Failed(f"{archive.url} holds no {where}")
    if dest.exists():  # file by file into the folder there
        shutil.copytree(part, dest, copy_function=os.replace, dirs_exist_ok=True)
    else:  # the folder at once
        os.replace(part, dest)


class _Reader:
    """The response, counted and hashed as read; a bar on a terminal, else a line per tenth."""

    def __init__(self, response, label: str | None):
        self.response, self.label, self.md5, self.done = response, label, hashlib.md5(), 0
        self.total = int(response.headers.get("Content-Length") or 0) or None
        tty = label is not None and sys.stderr.isatty()
        self.bar = tqdm(total=self.total, unit="B", unit_scale=True, desc=label, disable=not tty)
        self.lines = label is not None and not tty and self.total is not None
        self.said = 0  # tenths of the total said so far

    def read(self, n: int = -1) -> bytes:
        chunk = self.response.read(n)
        self.md5.update(chunk)
        self.done += len(chunk)
        self.bar.update(len(chunk))
        if self.lines and 10 * self.done // self.total > self.said:
            self.said = 10 * self.done // self.total
            print(f"{self.label}: {self.done:,} of {self.total:,} bytes", file=sys.stderr)
        return chunk


def _check(reader: _Reader, url: str, md5: str | None, size: int | None) -> None:
    """Failed unless the bytes read number size (else the Content-Length) and have md5."""
    expected = size or reader.total
    if expected and reader.done != expected:
        what = f"{reader.done:,} bytes, not {expected:,} (cut short, or another file?)"
        raise Failed(f"{url} gave {what}")
    got = reader.md5.hexdigest()
    if md5 and got != md5:
        raise Failed(f"{url} is not the expected archive: its MD5 is {got}, not {md5}")


def _remove(*paths: pathlib.Path) -> None:
    """Remove each path, a folder or a file, where it exists."""
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _lock(folder: pathlib.Path) -> int | None:
    """flock on the folder itself (no lock file is left) -> its descriptor; waits, saying so."""
    if sys.platform == "win32":  # no lock: two downloads at once would only repeat the work
        return None
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"another process is downloading into {folder}: waiting", file=sys.stderr)
        fcntl.flock(fd, fcntl.LOCK_EX)
    return fd
