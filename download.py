"""
download.py: fetch an archive (http, https, file://), check it, unpack only the files asked for,
in the steps of torchvision's download_url and extract_archive:
    download_url  one URL to one file: progress; size and MD5 checked; renamed into place
    extract       the wanted members of a tar or zip file on disk
    stream_tar    the same from a tar read as it arrives (the LRA release: GBs, no checksum),
                  stopping past the folder asked for once every file it needs is there (a
                  folder in two places, as `tar -r` leaves it, is read on; later members win)
    fetch         one of these, under a lock, into a folder renamed into place; a failure
                  (Ctrl-C, the network, a wrong MD5 or size, a full or read-only disk) leaves
                  nothing half-written, no folder it made, and is one sentence (Failed; Ctrl-C:
                  KeyboardInterrupt, which the caller says)
Into a folder that holds some of the archive's files already, fetch keeps them, byte for byte,
unpacks the rest and says which it kept; a file where a folder goes (or the reverse), or a
symbolic link that leads nowhere where the archive's files go (broken_link), is refused.
As under tarfile's "data" filter, a kept member whose path is absolute or holds '..', a link (a
zip's symlink entry too) or a device is refused.
Depends on: tqdm (used by uea_data.py for the UEA zips, lra_data.py for the LRA tasks' archives)
"""

import contextlib
import dataclasses
import errno
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
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from tqdm import tqdm

import files

if sys.platform != "win32":  # Windows has no fcntl, and _lock no lock
    import fcntl

# URLError, HTTPError, a full disk: OSError; a cut stream: IncompleteRead or tarfile's ReadError
FAILURES = (OSError, ValueError, tarfile.TarError, http.client.HTTPException, zipfile.BadZipFile)
# what tarfile and zipfile raise on damaged bytes (zlib.error, EOFError: a cut or flipped zip;
# NotImplementedError, RuntimeError: a zip's method or encryption flag flipped)
DAMAGED = (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError)
DAMAGED += (RuntimeError,)
# errors of the data folder, not of the download (a read-only, full or misshapen folder)
FOLDER_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
FOLDER_ERRNOS += (errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY)


class Failed(ValueError):
    """An archive that could not be fetched or is not what was asked for; the message, one
    sentence, names the URL and the fault."""


class FolderError(Failed):
    """The archive may be fine, but the data folder cannot take it (read-only, full, a file
    where a folder goes); the message names the path and what to do."""


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


def fetch(archive: Archive, dest, progress: bool = True, complete: Callable | None = None) -> None:
    """Unpack archive's wanted files into the folder dest, unless it is complete: complete(dest)
    is true (default: all of archive.need are there); files of the archive already in dest are
    kept (said on stderr), the others unpacked.

    Raises Failed: one sentence, the URL and what failed; nothing half-written is left, nor a
    folder that fetch made. A URL without a scheme is a local file (file://) where one is there.
    Ctrl-C: KeyboardInterrupt, after the same cleaning; the caller says it.
    """
    dest = pathlib.Path(dest)
    archive = dataclasses.replace(archive, url=_as_url(archive.url))
    part, whole = dest.parent / f".{dest.name}.part", dest.parent / f".{dest.name}.download"
    # a process killed on its way leaves these: the half-unpacked folder, the archive, its half
    leftovers = (part, whole, whole.with_name(f"{whole.name}.part"))
    made = [path for path in (dest.parent, *dest.parent.parents) if not path.exists()]
    lock = None
    try:
        for path in (dest, *(dest / name for name in archive.need)):  # and the folders above
            said = broken_link(path)  # read as absent: it would be replaced, or fail to be made
            if said:
                how = f"nothing was unpacked from {archive.url}; restore its target or remove it"
                raise FolderError(f"{said}: {how}")
        if dest.exists() and not dest.is_dir():
            raise FolderError(f"{dest} is a file, where {archive.url} goes as a folder: move it")
        dest.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock(dest.parent)
        if complete(dest) if complete else all((dest / n).exists() for n in archive.need):
            return  # there already, or another process has just fetched it (nothing was made)
        _remove(*leftovers)  # of a process killed on its way (this one holds the lock)
        label = str(dest) if progress else None
        if archive.kind == "zip" or archive.md5 or archive.size:  # check first, then unpack
            download_url(archive.url, whole, md5=archive.md5, size=archive.size, label=label)
            extract(whole, part, archive)
        else:  # nothing to check at the end: read as it arrives, up to the folder's end
            stream_tar(archive, part, label)
        _place(part, dest, archive)
        made = []  # in place: the folders made stay
    except Failed:
        raise
    except DAMAGED as e:
        what = f"is no whole {archive.kind} archive ({_line(e)}): cut short, or an error page?"
        raise Failed(f"{archive.url} {what}") from None
    except FAILURES as e:  # the network, the disk
        raise _failure(e, archive.url, dest) from None
    finally:
        with contextlib.suppress(OSError):  # a read-only folder: nothing to remove there
            _remove(*leftovers)
        for path in made:  # a failure leaves no folder it made (data/, pathfinder32/, uea/)
            with contextlib.suppress(OSError):
                path.rmdir()
        if lock is not None:
            os.close(lock)  # and with it the lock


def _as_url(url: str) -> str:
    """url, or the file:// URL of a local path given without a scheme; else Failed."""
    if "://" in url:
        return url
    path = pathlib.Path(url).expanduser()
    if not path.is_file():
        how = f"give http(s)://..., or a local copy as file://{path.resolve()}"
        raise Failed(f"{url} is no URL (no scheme) and no file: {how}")
    return path.resolve().as_uri()


def _failure(e: Exception, url: str, dest: pathlib.Path) -> Failed:
    """The one sentence of an OSError or another failure: the folder's (FolderError: the path,
    the fault, what to do) or the download's (the URL, urllib's message on one line)."""
    disk = isinstance(e, OSError) and not isinstance(e, urllib.error.URLError)  # (HTTPError too)
    written = isinstance(e, files.WriteError)  # files.write's: the disk's, said already
    if not disk or (e.errno not in FOLDER_ERRNOS and e.filename is None and not written):
        return Failed(f"could not download {url} ({_line(e)})")
    said = files.fault(e, e.filename or dest.parent)
    how = "make it writable, or choose another --data-dir"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        how = "free some space there, or choose another --data-dir"
    if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENOTEMPTY):
        how = "move it away"
    return FolderError(f"{said}, unpacking {url}: {how}")


def data_folder(data_dir) -> pathlib.Path:
    """--data-dir as a Path; '' (or blanks) names no folder, where pathlib reads the current one:
    refused (FolderError), as every reader and writer of data would use the current folder."""
    if not str(data_dir).strip():
        said = f"--data-dir {str(data_dir)!r} names no folder"
        raise FolderError(f"{said}: give one ('.' for the current folder)")
    return pathlib.Path(data_dir)


def broken_link(path) -> str | None:
    """The sentence naming the first symbolic link on the way to path (a folder above it, or path)
    that leads nowhere: its target is gone, or links loop; None where there is none. Such a link
    reads as absent (Path.exists), so a writer would replace it without a word."""
    path = pathlib.Path(path)
    for link in (*reversed(path.parents), path):
        if link.is_symlink():
            try:
                link.stat()
            except OSError as e:
                end = "links that loop" if e.errno == errno.ELOOP else "which does not exist"
                return f"{link} is a symbolic link to {os.readlink(link)}, {end}"
    return None


def _line(e: Exception) -> str:
    """e's message on one line (urllib's redirect error spans three)."""
    return " ".join(str(e).split())


def download_url(
    url: str, file, md5: str | None = None, size: int | None = None, label: str | None = None
) -> None:
    """Download url into file through files.write: checked (size, else the Content-Length the
    server gave; MD5), then renamed to file. label: the progress bar's name (None: no progress).
    Raises Failed on a wrong size or MD5, OSError or HTTPException when the download fails."""

    def fill(out) -> None:
        with urllib.request.urlopen(url, timeout=60) as response:
            reader = _Reader(response, label, url)
            shutil.copyfileobj(reader, out)
        _check(reader, url, md5, size)

    files.write(file, fill)


def extract(file, folder: pathlib.Path, archive: Archive) -> None:
    """Write archive's wanted members of the tar or zip file (archive.kind) into folder."""
    zipped = archive.kind == "zip"
    with zipfile.ZipFile(file) if zipped else tarfile.open(file) as opened:
        for member in _zip_members(opened) if zipped else _tar_members(opened):
            _write(member, _path_below(member.name, archive), folder, archive)


def stream_tar(archive: Archive, folder: pathlib.Path, label: str | None = None) -> None:
    """Read the tar at archive.url as it arrives and write its wanted members into folder;
    reading stops at the first member past archive.folder once all of archive.need are there
    (a folder that goes on later, as `tar -r` leaves it, is read on, later members winning as
    under tar -x; none past it: to the archive's end, its length checked)."""
    with urllib.request.urlopen(archive.url, timeout=60) as response:
        reader = _Reader(response, label, archive.url)
        inside = False  # a member below the folder has been seen
        try:
            tar = tarfile.open(fileobj=reader, mode="r|*")
        except TypeError:  # gzip's header cut short: tarfile's stream mode calls ord(b"")
            raise tarfile.ReadError("its gzip header is cut short") from None
        with tar:
            for member in _tar_members(tar):
                below = _path_below(member.name, archive)
                if below is None and inside and all((folder / n).exists() for n in archive.need):
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
    with member.open() as src:
        files.write(folder / below, functools.partial(shutil.copyfileobj, src))


def _place(part: pathlib.Path, dest: pathlib.Path, archive: Archive) -> None:
    """Move the unpacked folder part to dest, once it holds every file archive.need names: at
    once where dest is absent, else file by file, the needed ones last, keeping (and naming) the
    files already there; a file where a folder goes, or the reverse: FolderError, nothing moved."""
    missing = [name for name in archive.need if not (part / name).exists()]
    if missing:
        where = "/".join(name for name in (archive.folder, missing[0]) if name)
        raise Failed(f"{archive.url} holds no {where}")
    if not dest.exists():
        os.replace(part, dest)
        return
    files = sorted(path.relative_to(part) for path in part.rglob("*") if not path.is_dir())
    files.sort(key=lambda path: path.parts[0] in archive.need)  # stable: the needed ones last
    below = sorted({dest / p for path in files for p in (*path.parents, path) if p.parts})
    broken = [path for path in below if path.is_symlink() and not path.exists()]  # fetch: above
    if broken:
        how = f"nothing was unpacked into {dest}; restore its target or remove it"
        raise FolderError(f"{broken_link(broken[0])}: {how}, then fetch {archive.url} again")
    kept = {path for path in files if (dest / path).is_file()}
    for path in files:
        above = [dest / folder for folder in path.parents if folder.parts]
        clash = [there for there in above if there.exists() and not there.is_dir()]
        if (dest / path).is_dir() or clash:
            there = (clash or [dest / path])[0]
            what = "a file, where the archive has a folder" if clash else "a folder, not a file"
            how = f"move it away, then fetch {archive.url} again"
            raise FolderError(f"{there} is {what}: nothing was unpacked into {dest}; {how}")
    for path in files:
        if path not in kept:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            os.replace(part / path, dest / path)
    if kept:
        names = ", ".join(str(path) for path in sorted(kept)[:3])
        if len(kept) > 3:
            names += ", ..."
        what = f"kept the {len(kept)} file(s) of {archive.url} already there ({names})"
        print(f"{dest}: {what}, unpacked the other {len(files) - len(kept)}", file=sys.stderr)


class _Reader:
    """The response, counted and hashed as read; a bar on a terminal, else a line per tenth."""

    def __init__(self, response, label: str | None, url: str):
        self.response, self.md5, self.done = response, hashlib.md5(), 0
        self.total = int(response.headers.get("Content-Length") or 0) or None
        self.label = None if label is None else pathlib.Path(label).name
        if label is not None:  # said first, on a terminal or in a log
            size = "size unknown" if self.total is None else f"{self.total:,} bytes"
            print(f"downloading {url} ({size}) into {label}", file=sys.stderr)
        tty = label is not None and sys.stderr.isatty()
        bar = dict(unit="B", unit_scale=True, desc=self.label, disable=not tty)
        self.bar = tqdm(total=self.total, **bar)
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


if __name__ == "__main__":  # a library: no command line of its own
    fetch_by = "python train_uea.py --download, python lra_data.py --download"
    print(f"download.py has no command line; data is fetched by {fetch_by}", file=sys.stderr)
    sys.exit(2)
