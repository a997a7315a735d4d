"""What an output gets from the files and the filesystem around it: permission bits, room, errors.

An output keeps its input's permission bits, as ``cp -p`` does for the mode: a private (0600)
checkpoint stays private whatever the umask. Files are created owner-only and given their final
mode before they are renamed into place.
"""

from __future__ import annotations

import os
import stat

PRIVATE = 0o600  # the mode a file is created with, before it gets its input's mode
PRIVATE_DIR = 0o700


def mode_of(path: str | os.PathLike) -> int:
    """The permission bits (user, group, others) of ``path``, following symlinks."""
    return stat.S_IMODE(os.stat(path).st_mode) & 0o777


def copy_mode(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Give ``dst`` the permission bits of ``src``."""
    os.chmod(dst, mode_of(src))
