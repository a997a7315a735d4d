"""The selection kernel's chunks: work over a long array in pieces of ``CHUNK`` keys that stay
in the CPU's cache, on the worker pool (numpy releases the GIL in its loops).

``CHUNK`` is read when a function runs (``chunks.CHUNK``, not a copy), so a test can make it
small to run the chunked paths on small inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sparsetool.util import workers as pool

__all__ = ["CHUNK", "map_chunks", "row_step", "count_true", "bincount"]

CHUNK = 1 << 20  # keys per chunk: a chunk's temporaries stay in cache between the steps on it


def map_chunks(fn: Callable[[int, int], Any], n: int, step: int | None = None) -> list[Any]:
    """``fn(start, stop)`` over the chunks of ``range(n)`` (``step`` long, default ``CHUNK``), in
    order; chunks run on a thread pool (numpy releases the GIL in its loops)."""
    step = step or CHUNK
    spans = [(s, min(s + step, n)) for s in range(0, n, step)]
    return pool.run(lambda span: fn(*span), spans)


def row_step(row: int) -> int:
    """A chunk length for :func:`map_chunks` that is a whole number of rows of ``row`` entries."""
    return max(1, CHUNK // row) * row


def count_true(mask: np.ndarray) -> int:
    """True entries of a flat bool mask."""
    return sum(map_chunks(lambda a, b: int(np.count_nonzero(mask[a:b])), mask.size))


def bincount(x: np.ndarray, bins: int) -> np.ndarray:
    """int64 counts of each value in [0, bins) of a flat non-negative integer array."""
    return np.bincount(x.reshape(-1), minlength=bins).astype(np.int64, copy=False)
