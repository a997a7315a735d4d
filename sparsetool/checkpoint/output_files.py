"""What an output gets from the files and the filesystem around it: a temporary path beside it,
the atomic rename into place, permission bits, room, errors.

An output keeps its input's permission bits, as ``cp -p`` does for the mode: a private (0600)
checkpoint stays private whatever the umask, a 0644 one gives 0644 outputs. Files are created
owner-only and given their final mode before they are renamed into place. An output directory
filled by another library (``convert``'s, written by transformers, whose safetensors writer makes
model.safetensors as a private temporary file) gets the same from :func:`put_in_place`
(``like``): every file the input file's bits, every directory those bits with search allowed
wherever reading is. An output made from no input file (a plot, a training run's checkpoint) is
an ordinary new file: ``0o666`` less the umask, as ``open()`` makes it.

Each output file's size is known from its header before its first byte: the free space is checked
then, and any OSError while writing (no space, I/O error, permission) becomes one clean error.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import os
import re
import secrets
import shutil
import socket
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sparsetool.checkpoint.layout import TMP_MARK
from sparsetool.errors import CheckpointError, SparsetoolError

PRIVATE = 0o600  # the mode a file is created with, before it gets its input's mode
PRIVATE_DIR = 0o700
ORDINARY = 0o666  # the mode open() asks for (the umask then takes its bits away)


def mode_of(path: str | os.PathLike) -> int:
    """The permission bits (user, group, others) of ``path``, following symlinks."""
    return stat.S_IMODE(os.stat(path).st_mode) & 0o777


def copy_mode(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Give ``dst`` the permission bits of ``src``."""
    os.chmod(dst, mode_of(src))


def directory_mode(file_mode: int) -> int:
    """The mode of a directory holding files of ``file_mode``: search allowed wherever reading is.

    >>> oct(directory_mode(0o644)), oct(directory_mode(0o600)), oct(directory_mode(0o640))
    ('0o755', '0o700', '0o750')
    """
    return file_mode | (file_mode & 0o444) >> 2


def give_mode(tree: Path, mode: int) -> None:
    """Give ``tree`` (a file, or a directory and everything under it) the file mode ``mode``:
    files exactly that, directories :func:`directory_mode`; symlinks are left as they are."""
    if tree.is_symlink():
        return
    if not tree.is_dir():
        os.chmod(tree, mode)
        return
    for root, dirs, files in os.walk(tree):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), mode)
        for name in dirs:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), directory_mode(mode))
    os.chmod(tree, directory_mode(mode))


# What to do about an error the filesystem reports while an output is written ({option}: the
# option that named the output, -o or --plot).
_ADVICE = {
    errno.ENOSPC: "free some space or choose another {option}",
    errno.EDQUOT: "free some of your quota or choose another {option}",
    errno.EACCES: "give {option} a path in a directory you may write to",
    errno.EPERM: "give {option} a path in a directory you may write to",
    errno.EROFS: "the filesystem is read-only; choose another {option}",
    errno.EIO: "the device reported an I/O error; check it, or choose another {option}",
    errno.ENOTDIR: "part of the path is a file, not a directory; choose another {option}",
}


def free_bytes(directory: str | os.PathLike) -> int | None:
    """Bytes an unprivileged user may still write in ``directory``'s filesystem (None: unknown)."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def check_room(directory: Path, needed: int, name: str) -> None:
    """Refuse, before the first byte, an output file the filesystem has no room for."""
    free = free_bytes(directory)
    if free is not None and needed > free:
        raise CheckpointError(
            f"no room for {name}: it needs {needed:,} bytes and {free:,} are free on that disk; "
            f"{_ADVICE[errno.ENOSPC].format(option='-o')}"
        )


def write_error(
    e: OSError, out: str | os.PathLike, option: str = "-o", kept: str = "nothing was written"
) -> CheckpointError:
    """One clean error for an OSError met while writing ``out`` (named by ``option``), whatever
    its errno: what the system said, what is left (``kept``: by default nothing, the partial files
    being gone), and what to do."""
    code = errno.errorcode.get(e.errno or 0, "")
    what = f"{e.strerror or e}" + (f" [{code}]" if code else "")
    advice = _ADVICE.get(e.errno or 0, "check the output location or choose another {option}")
    advice = advice.format(option=option)
    return CheckpointError(f"writing {out} failed: {what}; {kept}. {advice[0].upper()}{advice[1:]}")


def check_writable(
    out: str | os.PathLike,
    option: str = "-o",
    *,
    directory: bool = False,
    shown: str | os.PathLike | None = None,
) -> None:
    """Refuse, before any work is done, an output that cannot be written: a file is made (and
    removed) where the output will go, so a read-only or immutable directory, a full quota or a
    path through a file is one clean error (:func:`write_error`) at once, not after the work.

    ``directory``: ``out`` is a directory the command writes into, made with its parents if
    missing (the probe goes into the nearest one that exists); otherwise ``out`` is written
    beside its siblings, into its parent. A parent that does not exist is left to the caller's
    own message. ``shown``: the output as the message names it (default ``out``)."""
    shown = out if shown is None else shown
    out = Path(out)
    where = Path(os.path.abspath(out if directory else out.parent))
    while not os.path.lexists(where) and where != where.parent:
        if not directory:
            return
        where = where.parent
    if not where.is_dir():
        raise write_error(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), shown, option)
    probe = (
        where
        / f".{out.name or 'probe'}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}-{_host_tag()}"
    )
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE))
    except OSError as e:
        raise write_error(e, shown, option) from None
    with contextlib.suppress(OSError):
        os.unlink(probe)


def check_png(path: str | os.PathLike, option: str = "--plot") -> Path:
    """Refuse a PNG output (``option``'s) that cannot be written, before any work is done: a
    name ending in .png, in a directory that exists and takes a new file (:func:`check_writable`:
    a read-only or full disk is said at once, not after the work)."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise SparsetoolError(f"{option} {path}: give a file name ending in .png")
    check_writable(path, option)
    if not path.parent.is_dir():
        raise SparsetoolError(
            f"{option} {path}: directory '{path.parent}' does not exist; create it first"
        )
    return path


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False if the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    res = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return res == 0


def remove(p: Path) -> None:
    """Delete a file or a directory tree; nothing if it is gone already."""
    if not os.path.lexists(p):  # unlink would fail with EROFS, not ENOENT, on a read-only disk
        return
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def put_in_place(tmp: Path, out: Path, like: str | os.PathLike | None = None) -> None:
    """Rename the finished ``tmp`` to ``out``, atomically where the system can (a directory that
    exists is swapped with renameat2, then the old one removed). ``like``: the input file whose
    permission bits every file of ``tmp`` gets first (:func:`give_mode`), whatever modes the
    writer left them."""
    if like is not None:
        give_mode(tmp, mode_of(like))
    if not out.is_dir() or out.is_symlink():
        os.replace(tmp, out)  # atomic for files (and for a directory when out does not exist)
        return
    if _exchange(tmp, out):
        remove(tmp)  # tmp now holds the old output
        return
    old = temp_beside(out)
    os.rename(out, old)
    os.rename(tmp, out)
    remove(old)


def _host_tag() -> str:
    """This machine in a temporary's name: a run on another machine writing to a shared disk has a
    process id that means nothing here, so only this machine's temporaries are judged.

    >>> _host_tag() == _host_tag() and "-" not in _host_tag() and 0 < len(_host_tag()) <= 24
    True
    """
    host = re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname().split(".")[0]) or "host"
    return host if len(host) <= 24 else f"{host[:15]}_{zlib.crc32(host.encode()):08x}"


# .NAME.sparsetool-tmp-PID-HEX-HOST (HOST absent in names written before it was added)
_TEMP_RE = re.compile(
    rf"\..+{re.escape(TMP_MARK)}(?P<pid>[0-9]+)-[0-9a-f]+(?:-(?P<host>[A-Za-z0-9_]+))?"
)


@dataclass(frozen=True)
class Reclaimed:
    """Temporaries of killed runs removed from ``directory``: how many, and the bytes freed."""

    directory: Path
    files: int
    bytes: int


@dataclass(frozen=True)
class Written:
    """An output file written (a plot, say) and what was reclaimed beside it
    (:func:`reclaiming`)."""

    path: Path
    reclaimed: list[Reclaimed]


class ResultDict(dict):
    """A JSON-ready result (the dict a command's --json prints) that also carries ``reclaimed``:
    the temporaries of killed runs removed beside what it wrote, which its JSON leaves out."""

    def __init__(self, data: dict, reclaimed: list[Reclaimed]) -> None:
        super().__init__(data)
        self.reclaimed = reclaimed


# The lists of the reclaiming() blocks open in this context, innermost last.
_collecting: contextvars.ContextVar[tuple[list[Reclaimed], ...]] = contextvars.ContextVar(
    "sparsetool_reclaiming", default=()
)


@contextlib.contextmanager
def reclaiming() -> Iterator[list[Reclaimed]]:
    """What :func:`remove_stale_temps` frees inside the block (in this thread or task), for the
    result a library function returns: the list it yields, filled as the block runs. An exception
    leaving the block (an error, Ctrl-C's KeyboardInterrupt) carries it as its ``reclaimed``
    attribute, so what was freed is said however the work ends. Blocks nest: an outer one also
    gets what an inner one collected."""
    mine: list[Reclaimed] = []
    token = _collecting.set((*_collecting.get(), mine))
    try:
        yield mine
    except BaseException as e:
        e.reclaimed = list(mine)  # type: ignore[attr-defined]  # an outer block: a superset
        raise
    finally:
        _collecting.reset(token)


def _pid_is_gone(pid: int) -> bool:
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive (someone else's) or unknown: keep it
    return False


def _disk_bytes(p: Path) -> int:
    """Bytes ``p`` occupies on disk (a directory: every file under it); what removing it frees."""
    try:
        st = p.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512 if hasattr(st, "st_blocks") else st.st_size
    return sum(_disk_bytes(c) for c in p.iterdir())


def remove_stale_temps(directory: str | os.PathLike) -> Reclaimed | None:
    """Remove from ``directory`` the temporary outputs of sparsetool runs that were killed (a
    ``kill -9`` mid-write leaves one as big as the output): only names of the form
    :func:`temp_beside` gives, owned by this user, made on this machine by a process that no longer
    exists (``os.kill(pid, 0)``). Returns what was freed (also added to the lists of the
    :func:`reclaiming` blocks open), None when nothing was."""
    directory = Path(directory)
    files = freed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    host, uid = _host_tag(), os.getuid() if hasattr(os, "getuid") else None
    for entry in entries:
        m = _TEMP_RE.fullmatch(entry.name)
        if m is None or (m["host"] is not None and m["host"] != host):
            continue
        try:
            if uid is not None and entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if not _pid_is_gone(int(m["pid"])):
            continue
        p = Path(entry.path)
        size = _disk_bytes(p)
        remove(p)
        if not p.exists() and not p.is_symlink():
            files, freed = files + 1, freed + size
    if not files:
        return None
    done = Reclaimed(Path(os.path.abspath(directory)), files, freed)
    for collected in _collecting.get():
        collected.append(done)
    return done


def temp_beside(out: Path) -> Path:
    """A new temporary path beside ``out`` (same filesystem, so the final rename is atomic), named
    after this process and machine; temporaries of killed runs in that directory are removed
    first (:func:`remove_stale_temps`)."""
    out = Path(out)
    remove_stale_temps(out.parent)
    return out.parent / f".{out.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}-{_host_tag()}"
