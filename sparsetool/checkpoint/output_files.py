"""What an output gets from the files and the filesystem around it: permission bits, room, errors.

An output keeps its input's permission bits, as ``cp -p`` does for the mode: a private (0600)
checkpoint stays private whatever the umask. Files are created owner-only and given their final
mode before they are renamed into place.

Each output file's size is known from its header before its first byte: the free space is checked
then, and any OSError while writing (no space, I/O error, permission) becomes one clean error.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

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
