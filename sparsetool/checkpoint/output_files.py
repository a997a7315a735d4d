"""What an output gets from the files and the filesystem around it: a temporary path beside it,
the atomic rename into place, permission bits, room, errors.

An output keeps its input's permission bits, as ``cp -p`` does for the mode: a private (0600)
checkpoint stays private whatever the umask. Files are created owner-only and given their final
mode before they are renamed into place.

Each output file's size is known from its header before its first byte: the free space is checked
then, and any OSError while writing (no space, I/O error, permission) becomes one clean error.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import shutil
import stat
from glob import escape as glob_escape
from pathlib import Path

from sparsetool.checkpoint.layout import TMP_MARK
from sparsetool.errors import CheckpointError

PRIVATE = 0o600  # the mode a file is created with, before it gets its input's mode
PRIVATE_DIR = 0o700


def mode_of(path: str | os.PathLike) -> int:
    """The permission bits (user, group, others) of ``path``, following symlinks."""
    return stat.S_IMODE(os.stat(path).st_mode) & 0o777


def copy_mode(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Give ``dst`` the permission bits of ``src``."""
    os.chmod(dst, mode_of(src))


# What to do about an error the filesystem reports while an output is written.
_ADVICE = {
    errno.ENOSPC: "free some space or choose another -o",
    errno.EDQUOT: "free some of your quota or choose another -o",
    errno.EACCES: "choose an -o in a directory you may write to",
    errno.EPERM: "choose an -o in a directory you may write to",
    errno.EROFS: "the filesystem is read-only; choose another -o",
    errno.EIO: "the device reported an I/O error; check it, or choose another -o",
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
            f"{_ADVICE[errno.ENOSPC]}"
        )


def write_error(e: OSError, out: str | os.PathLike) -> CheckpointError:
    """One clean error for an OSError met while writing ``out`` (whose partial files are gone)."""
    code = errno.errorcode.get(e.errno or 0, "")
    what = f"{e.strerror or e}" + (f" [{code}]" if code else "")
    advice = _ADVICE.get(e.errno or 0, "check the output location or choose another -o")
    return CheckpointError(f"writing {out} failed: {what}; nothing was written. {advice[0].upper()}{advice[1:]}")


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
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def put_in_place(tmp: Path, out: Path) -> None:
    """Rename the finished ``tmp`` to ``out``, atomically where the system can (a directory that
    exists is swapped with renameat2, then the old one removed)."""
    if not out.is_dir() or out.is_symlink():
        os.replace(tmp, out)  # atomic for files (and for a directory when out does not exist)
        return
    if _exchange(tmp, out):
        remove(tmp)  # tmp now holds the old output
        return
    old = out.with_name(f".{out.name}{TMP_MARK}old-{secrets.token_hex(4)}")
    os.rename(out, old)
    os.rename(tmp, out)
    remove(old)


def _remove_stale_temps(parent: Path, name: str) -> None:
    """Remove temporary outputs for ``name`` left by a run that was killed (its process is gone)."""
    prefix = f".{name}{TMP_MARK}"
    for p in parent.glob(f".{glob_escape(name)}{TMP_MARK}*"):
        pid_text = p.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            remove(p)
        except PermissionError:
            pass  # alive, someone else's


def temp_beside(out: Path) -> Path:
    """A new temporary path beside ``out`` (same filesystem, so the final rename is atomic), named
    after this process; temporaries of killed runs for the same output are removed first."""
    _remove_stale_temps(out.parent, out.name)
    return out.parent / f".{out.name}{TMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
