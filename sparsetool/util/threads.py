"""torch's CPU threads: how many, and how they wait (the one policy; ``--threads N``).

A command that computes with torch calls :func:`use_threads` before it computes. Two things made
every such command several times slower on a machine whose cores something else was using
(benchmarks/archive/RESULTS-archive.md, "threads"):

- torch's OpenMP workers spin between parallel regions, by default for a while before sleeping.
  With another process on the cores, a spinning worker takes the time slice the worker with real
  work needed, and every operator waits for the slowest of them. :func:`before_torch` makes them
  sleep at once (``OMP_WAIT_POLICY=PASSIVE``); OpenMP reads that when torch loads its runtime,
  so it must run before torch is imported (the command line does it first thing).
- torch starts one thread per CPU it may run on, whoever else uses them. :func:`default_threads`
  counts only the cores that are free: the usable ones less those other processes keep busy.

An explicit ``--threads N`` (or ``OMP_NUM_THREADS``, e.g. from torchrun) wins. Imports neither
torch nor numpy until :func:`use_threads` runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sparsetool.util.workers import usable_cores

_LOADAVG = "/proc/loadavg"


def before_torch() -> None:
    """OpenMP workers sleep as soon as they are idle (unless ``OMP_WAIT_POLICY`` says otherwise).

    Has an effect only before torch is first imported in this process."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def default_threads(usable: int, busy: float) -> int:
    """Threads for torch on ``usable`` cores of which other processes keep ``busy`` running.

    The free cores, rounded to the nearest whole one, at least 1 and at most ``usable``:
    ``default_threads(2, 0.0) == 2``, ``default_threads(2, 1.0) == 1``,
    ``default_threads(8, 2.6) == 5``.
    """
    usable = max(1, int(usable))
    free = usable - max(0.0, float(busy))
    return max(1, min(usable, int(free + 0.5)))


def busy_elsewhere(samples: int = 3, gap: float = 0.005) -> float:
    """How many cores other processes are running on now: the runnable tasks of the system
    (``/proc/loadavg``'s 4th field, which counts this process too), the fewest of ``samples``
    readings ``gap`` seconds apart (a task that ran for a moment is not a busy core); 0 where
    that cannot be read."""
    counts = []
    for i in range(samples):
        if i:
            time.sleep(gap)
        try:
            with open(_LOADAVG) as f:
                counts.append(int(f.read().split()[3].split("/")[0]))
        except (OSError, ValueError, IndexError):
            return 0.0
    return max(0.0, min(counts) - 1.0)


def use_threads(n: int | None = None) -> int:
    """Run torch's operators on ``n`` threads (None: the default policy) and return the number.

    Without ``n``, ``OMP_NUM_THREADS`` set in the environment is left in force, and the number
    torch already runs on is never raised."""
    import torch

    if n is None:
        if os.environ.get("OMP_NUM_THREADS"):
            return torch.get_num_threads()
        # never more than the process already runs on (a caller's torch.set_num_threads(1) stands)
        n = min(default_threads(usable_cores(), busy_elsewhere()), torch.get_num_threads())
    torch.set_num_threads(int(n))
    return int(n)


@contextmanager
def torch_threads(n: int = 1) -> Iterator[None]:
    """Run the block's torch operators on exactly ``n`` threads (one by default), then restore the
    count in force before.

    For results that must not depend on ``--threads``: MKL splits a matrix product's inner sums,
    and LAPACK's Cholesky its panels, differently on one thread and on two, so SparseGPT's ``X^T
    X``, its inverse factor and its column updates differed in their last bits from one thread
    count to another, and the mask choices after them diverged
    (benchmarks/archive/RESULTS-archive.md, "reproducible calibration pruning"). On one fixed
    count they are the same bits every time."""
    import torch

    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


__all__ = ["before_torch", "busy_elsewhere", "default_threads", "torch_threads", "use_threads"]
