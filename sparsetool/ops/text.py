"""The text a command reads (``eval --text``, ``prune --calibration``): a UTF-8 file, or the files
under a directory."""

from __future__ import annotations

from pathlib import Path

from sparsetool.errors import SparsetoolError

__all__ = ["read_text"]


def read_text(path: str | Path, option: str = "--text") -> str:
    """A UTF-8 file, or every non-hidden file under a directory (sorted, joined by a newline)."""
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(
            q
            for q in p.rglob("*")
            if q.is_file() and not any(s.startswith(".") for s in q.relative_to(p).parts)
        )
        if not files:
            raise SparsetoolError(f"{option} {p}: directory holds no files; point it at text files")
    else:
        raise SparsetoolError(f"{option} {p}: no such file or directory")
    parts = []
    for f in files:
        try:
            parts.append(f.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SparsetoolError(
                f"{option} {f}: not UTF-8 text (byte {e.start}); convert it or leave it out"
            ) from None
        except OSError as e:
            raise SparsetoolError(f"{option} {f}: cannot read ({e.strerror})") from None
    return "\n".join(parts)
