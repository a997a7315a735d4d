"""Timing one call many times: the median and the spread, never a single run.

The first call warms up (allocations, caches, lazy initialisation) and gives the result that is
checked; it is not counted. Then the call is repeated at least ``repeats`` times, and more while
the runs so far took less than ``min_time`` seconds in all (short calls are noisy), up to
``10 * repeats``. A device that runs asynchronously is synchronised around each call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median, the 25th and 75th percentiles, and how many calls."""

    median_s: float
    low_s: float
    high_s: float
    repeats: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(times: list[float]) -> Timing:
    """>>> summarise([3.0, 1.0, 2.0, 4.0])
    Timing(median_s=2.5, low_s=1.75, high_s=3.25, repeats=4)
    """
    if not times:
        raise ValueError("no timed calls")
    q = np.percentile(np.asarray(times, dtype=np.float64), [50, 25, 75])
    return Timing(float(q[0]), float(q[1]), float(q[2]), len(times))


def measure(
    call: Callable[[], Any],
    *,
    repeats: int = 5,
    min_time: float = 0.2,
    sync: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[Timing, Any]:
    """Time ``call``; returns the timing and the warm-up call's result."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    sync = sync or (lambda: None)
    sync()
    out = call()
    sync()
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_time and len(times) < 10 * repeats):
        start = clock()
        call()
        sync()
        times.append(clock() - start)
    return summarise(times), out
