"""
download.py: fetch an archive (http, https, file://), check it, unpack only the files asked for.
Ctrl-C, a dropped connection, an HTTP error, a wrong MD5, a full disk: nothing is left half-written,
and one sentence says what failed. A tar is read as it arrives, never kept (with no MD5 or size to
check, reading stops past the folder asked for: a tar holds a folder's members one after another);
a zip is fetched first. As under tarfile's "data" filter, a kept member whose path is absolute or
holds '..', a link, a device, is refused. Files go to temporary names beside the destination,
renamed into place last, under a lock on its parent folder: a second process waits, saying so.
Depends on: tqdm (used by uea_data.py for the UEA zips, lra_data.py for the LRA tasks' archives)
"""

import hashlib
import http.client
import os
import pathlib
import re
import shutil
import sys
import tarfile
import urllib.request
import zipfile

from tqdm import tqdm

if sys.platform != "win32":  # Windows has no fcntl, and _lock no lock
    import fcntl

# URLError, HTTPError, a full disk: OSError; a cut stream: IncompleteRead or tarfile's ReadError
FAILURES = (OSError, ValueError, tarfile.TarError, http.client.HTTPException, zipfile.BadZipFile)


class Failed(ValueError):
    """An archive that is not what was asked for; the message names the URL and the fault."""


def fetch(url: str, dest, need: list, archive: dict, progress=True, error=Failed, by_hand=""):
    """Unpack into the folder `dest`, from the tar (any compression) or zip (archive["kind"] "zip")
    at url, the files below archive["folder"] ("/"-separated names anywhere in a member's path;
    none: any file, by name alone) whose path below it matches archive["keep"] (none: all). need:
    paths it must yield (a member so named but for case takes that name); archive's md5, size:
    where known (lra_data.ARCHIVES); by_hand: how to fetch it by hand, ending `error`'s message."""
    dest, md5, size = pathlib.Path(dest), archive.get("md5"), archive.get("size")
    kind = archive.get("kind", "tar")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, whole = dest.parent / f".{dest.name}.part", dest.parent / f".{dest.name}.download"
    lock = _lock(dest.parent)
    try:
        if all((dest / name).exists() for name in need):
            return  # there already, or another process has just fetched it
        _remove(part, whole)  # left by a process killed on its way (we hold the lock)
        with urllib.request.urlopen(url, timeout=60) as response:
            reader = _Reader(response, dest.name, progress)
            if kind == "zip":  # its index is at its end: the whole file first
                with open(whole, "wb") as f:
                    shutil.copyfileobj(reader, f)
                with zipfile.ZipFile(whole) as z:
                    members = [(i.filename, i.is_dir(), True, z.open, i) for i in z.infolist()]
                    stop = _unpack(members, part, archive, need, url, stop=False)
            else:  # with nothing to check at the end, reading stops past the folder
                with tarfile.open(fileobj=reader, mode="r|*") as tar:
                    members = ((m.name, m.isdir(), m.isfile(), tar.extractfile, m) for m in tar)
                    stop = _unpack(members, part, archive, need, url, not (md5 or size))
            while not stop and reader.read(1 << 20):  # to the end: the size, the MD5 of it all
                pass
        if not stop and (expected := size or reader.total) and (n := reader.done) != expected:
            raise Failed(f"{url} gave {n:,} bytes, not {expected:,} (cut short, or another file?)")
        if not stop and md5 and (got := reader.md5.hexdigest()) != md5:
            raise Failed(f"{url} is not the expected archive: its MD5 is {got}, not {md5}")
        if missing := [name for name in need if not (part / name).exists()]:
            where = "/".join(filter(None, (archive.get("folder"), missing[0])))
            raise Failed(f"{url} holds no {where}")
        if dest.exists():  # file by file into the folder there
            shutil.copytree(part, dest, copy_function=os.replace, dirs_exist_ok=True)
        else:  # the folder at once
            os.replace(part, dest)
    except KeyboardInterrupt:
        print(f"\nthe download of {url} was interrupted: nothing was kept", file=sys.stderr)
        raise
    except FAILURES as e:
        if isinstance(e, (tarfile.TarError, zipfile.BadZipFile)):
            e = Failed(f"{url} is no whole {kind} archive ({e}): cut short, or an error page?")
        what = str(e) if isinstance(e, Failed) else f"could not download {url} ({e})"
        raise error(f"{what}{by_hand}") from None
    finally:
        _remove(part, whole)
        if lock is not None:
            os.close(lock)  # and with it the lock


class _Reader:
    """The response, counted and hashed as read; a bar on a terminal, else a line per tenth."""

    def __init__(self, response, name: str, progress: bool):
        self.response, self.name, self.md5, self.done = response, name, hashlib.md5(), 0
        self.total = int(response.headers.get("Content-Length") or 0) or None
        tty = progress and sys.stderr.isatty()
        self.bar = tqdm(total=self.total, unit="B", unit_scale=True, desc=name, disable=not tty)
        self.lines, self.said = progress and not tty and self.total, 0

    def read(self, n: int = -1) -> bytes:
        chunk = self.response.read(n)
        self.md5.update(chunk)
        self.done += len(chunk)
        self.bar.update(len(chunk))
        if self.lines and (tenth := 10 * self.done // self.total) > self.said:
            self.said = tenth
            print(f"{self.name}: {self.done:,} of {self.total:,} bytes", file=sys.stderr)
        return chunk


def _unpack(members, part: pathlib.Path, archive: dict, need: list, url: str, stop: bool) -> bool:
    """Write the kept members into part -> True if stopped past the folder (when `stop`)."""
    folder, names = archive.get("folder", ""), {name.lower(): name for name in need}
    inside, seen = tuple(folder.split("/")) if folder else (), False
    for name, is_dir, is_file, open_member, member in members:
        parts = pathlib.PurePosixPath(name).parts
        at = next((i for i in range(len(parts)) if parts[i : i + len(inside)] == inside), None)
        if at is None:
            if seen and stop:
                return True  # past the folder: the rest of the archive is not read
            continue
        seen, below = True, "/".join(parts[at + len(inside) :] if inside else parts[-1:])
        below = names.get(below.lower(), below)  # a UEA zip's "japanesevowels_train.ts", say
        if is_dir or not re.fullmatch(archive.get("keep", ".*"), below):
            continue
        if name.startswith(("/", "\\")) or ".." in parts or not is_file:
            what = "has an absolute path or '..'" if is_file else "is a link or a device"
            raise Failed(f"{url}: the member {name!r} {what}: refused, nothing was kept")
        (part / below).parent.mkdir(parents=True, exist_ok=True)
        with open_member(member) as src, open(part / below, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return False


def _remove(*paths: pathlib.Path) -> None:
    for path in paths:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


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
