"""
files.py: the one way this project writes a file, the one sentence when it cannot, and the
size check before an array is allocated.

    write(path, content)  content (bytes, str, or fill(f) writing into a binary file) goes into a
                          temporary file beside path, which is then renamed onto path: a reader
                          sees the old file or the new one, never half of one. Whatever stops
                          the write (a full disk, Ctrl-C, an error in fill) removes the temporary
                          file; an OSError becomes WriteError, one sentence naming the path and
                          the fault (read-only, full, name too long, a file where a folder goes,
                          permission).
    writable(folder)      WriteError now, where no file could be written into folder
    append(path, line)    a line added to a log (metrics.jsonl), the whole log written anew
    read_log(path)        a log's lines, less a torn last one (a process killed mid-write)
    too_big(nbytes, ...)  the sentence where an array sized by flags cannot fit in memory: said
                          before numpy or torch tries to allocate it, naming the flag to lower

A temporary file is named <name>.<pid>-<k>.tmp, the k-th write of process pid: whose it is. A
process killed outright (SIGKILL, a power cut) leaves its own behind; the first write of a later
process into that folder removes those of processes that are gone.
Depends on: the standard library alone.
"""

import contextlib
import errno
import itertools
import os
import pathlib
import re
import sys

# errno -> what stands in the way, said in the sentence (other faults: the system's own words)
FAULTS = {
    errno.EROFS: "the file system is read-only",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.ENAMETOOLONG: "the name is too long",
    errno.ENOTDIR: "a file stands where a folder of its path goes",
    errno.EEXIST: "a file stands where a folder of its path goes",  # mkdir over a file
    errno.EISDIR: "a folder stands where the file goes",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
}
TEMPORARY = re.compile(r".+\.(\d+)-\d+\.tmp")  # <name>.<pid>-<k>.tmp: the k-th write of pid
NAME_MAX = 255  # bytes in one name on the usual file systems (ext4, xfs, APFS, NTFS's 255 chars)
_swept = set()  # the folders this process has swept
_writes = itertools.count()  # this process's writes, numbered


class WriteError(OSError):
    """A file that could not be written; the message, one sentence, names the path and the fault.
    An OSError, so that code catching OSError catches it too."""


def write(path, content) -> None:
    """Write content (bytes; str, as UTF-8; or a callable fill(f) writing into a binary file)
    to path, through a temporary file beside it renamed onto it; path's folders are made.
    Raises WriteError (one sentence) for an OSError of the disk; any other exception (Ctrl-C,
    or an OSError of what fill reads from, a network stream say) goes on as it is. Either way
    no temporary file is left."""
    path = pathlib.Path(path)
    tmp, filling = _temporary(path), False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _sweep(path.parent)
        f = open(tmp, "wb")  # over one of a killed process whose pid this one has now
        try:
            if callable(content):
                filling = True  # its own OSErrors are not the disk's: those of _Disk's write are
                content(_Disk(f, path))
                filling = False
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.close()  # the last bytes go to the disk here: it may be full
        finally:
            with contextlib.suppress(OSError):  # after a failure: its error is the one to say
                f.close()
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):  # none was made where the folder is read-only
            tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, WriteError) and not filling:
            raise _error(e, path) from None
        raise


def writable(folder) -> None:
    """Raise WriteError where no file can be written into folder (made if absent): said before
    minutes of work whose file would then be lost. A full disk shows only when a file is."""
    folder = pathlib.Path(folder)
    probe = _temporary(folder / "probe")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        open(probe, "wb").close()
    except OSError as e:
        raise _error(e, folder) from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def append(path, line: str) -> None:
    """Add line (no newline in it) to the log at path: the log is written anew with it, so a
    process killed meanwhile leaves the old log whole."""
    path = pathlib.Path(path)
    old = path.read_bytes() if path.exists() else b""
    if old and not old.endswith(b"\n"):  # a torn last line (read_log says so): dropped
        old = old[: old.rfind(b"\n") + 1]
    write(path, old + line.encode() + b"\n")


def read_log(path) -> tuple:
    """The lines of the log at path -> (lines, torn): torn is the last line, cut by a process
    killed mid-write (no newline at its end), dropped from lines; else None."""
    text = pathlib.Path(path).read_text(encoding="utf-8") if pathlib.Path(path).exists() else ""
    lines = text.split("\n")
    torn = lines.pop() or None  # "" after the last newline: nothing torn
    return lines, torn


def fault(e: OSError, path) -> str:
    """The one sentence for e, met writing path: the path (the file in the way, for a file
    where a folder goes) and the fault; a WriteError's own, which says them already."""
    if isinstance(e, WriteError):
        return str(e)
    path = pathlib.Path(path)
    what = FAULTS.get(e.errno, e.strerror or str(e) or type(e).__name__)
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        with contextlib.suppress(OSError):  # the first folder of the path that is a file
            on_the_way = (*reversed(path.parents), path)
            path = next((p for p in on_the_way if p.exists() and not p.is_dir()), path)
        return f"cannot write below {path}: {what}"
    if e.errno == errno.ENAMETOOLONG:
        longest = max(len(os.fsencode(part)) for part in path.parts)
        what += f" (its longest part has {longest} bytes; the path {len(os.fsencode(path))})"
    return f"cannot write {path}: {what}"


class _Disk:
    """The temporary file as fill sees it: an OSError of any of its methods (write, and flush,
    seek, ... which write what the buffer holds) is the disk's: WriteError. Those of whatever
    fill reads from are not."""

    def __init__(self, f, path: pathlib.Path):
        self._f, self._path = f, path

    def __getattr__(self, name):  # write, tell, seek, flush, name, ...: what numpy, torch use
        value = getattr(self._f, name)
        if not callable(value):
            return value

        def method(*args, **kwargs):
            try:
                return value(*args, **kwargs)
            except OSError as e:
                raise _error(e, self._path) from None

        return method


def _error(e: OSError, path: pathlib.Path) -> WriteError:
    """e as a WriteError: its sentence, and its errno kept for a caller's advice."""
    error = WriteError(fault(e, path))
    error.errno = e.errno
    return error


def too_big(nbytes: int, what: str, flags: str, memory: int | None = None) -> str | None:
    """The sentence where nbytes (what: the array, sized by flags) are more than memory bytes
    (None: this machine's physical memory), naming the flags to lower; else None."""
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if nbytes <= memory:
        return None
    return (
        f"{what} would take {_size(nbytes)}, more than the {_size(memory)} of memory: lower {flags}"
    )


def _size(nbytes: float) -> str:
    """nbytes in the largest binary unit that keeps it at least 1: "1.5 TiB"."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"]
    i = 0
    while nbytes >= 1024 and i < len(units) - 1:
        nbytes, i = nbytes / 1024, i + 1
    return f"{nbytes:.1f} {units[i]}"


def _temporary(path: pathlib.Path) -> pathlib.Path:
    """path's temporary file, <name>.<pid>-<k>.tmp (threads writing one file at once: each its
    own), the name cut to fit NAME_MAX."""
    tail = f".{os.getpid()}-{next(_writes)}.tmp"
    name = os.fsencode(path.name)[: NAME_MAX - len(tail)].decode(errors="ignore")
    return path.with_name(name + tail)


def _sweep(folder: pathlib.Path) -> None:
    """Remove folder's temporary files of processes that are gone (once a folder a process)."""
    if folder in _swept or sys.platform == "win32":  # Windows: os.kill(pid, 0) would kill
        return
    _swept.add(folder)
    for entry in os.scandir(folder):
        match = TEMPORARY.fullmatch(entry.name)
        if match and int(match[1]) != os.getpid() and not _alive(int(match[1])):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _alive(pid: int) -> bool:
    """Whether a process pid runs (one of another user's counts: it may not be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


if __name__ == "__main__":
    run = "python train_lra.py, train_uea.py or lra_data.py, which write with it"
    print(
        f"files.py has no command line: it writes the project's files; run {run}", file=sys.stderr
    )
    raise SystemExit(2)
