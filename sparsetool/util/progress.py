"""The one progress callback type of the library's long operations."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)`` after each unit of work of a stage (a tensor, a
block, a batch); the CLI draws it as a bar, the Python API leaves it out."""

__all__ = ["Progress"]
