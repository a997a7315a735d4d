"""The one bounded thread pool: the selection kernel's chunks, and the checkpoint commands' work
across tensors and across chunks of a tensor (``--workers N``).

How many threads: :func:`set_workers` when a command was given ``--workers``; otherwise the
usable cores (``os.sched_getaffinity``), capped by torch's thread setting when torch is loaded
(``train --threads``, tests running on one thread). Every result is gathered in input order, so
the output never depends on the number of workers. Imports neither torch nor numpy.

Ctrl-C and SIGTERM (which the command line turns into Ctrl-C) raise ``KeyboardInterrupt`` between
any two Python instructions of the main thread. Raised inside ``ThreadPoolExecutor.submit``, after
a worker thread started but before the executor recorded it, it leaves a thread that nothing ever
wakes, and the interpreter then waits for it forever at exit. So work is handed to the pool with
those two signals deferred (a signal arriving then is acted on right after, as it would have been),
and results are awaited with them live: an interrupted wait cancels the chunks not yet started.
Blocking the signals would not do: another thread (torch's, OpenMP's) would take them instead.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

_HELD = {signal.SIGINT, signal.SIGTERM}
_PREFIX = "sparsetool-worker"
_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0  # a forked child inherits the pool object but not its threads: make a new one
_POOL_SIZE = 0
_WORKERS: int | None = None  # set by --workers


@functools.cache
def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity when first asked), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def set_workers(n: int | None) -> None:
    """Use ``n`` threads from now on (None: back to the default)."""
    global _WORKERS
    if n is not None and (isinstance(n, bool) or int(n) != n or n < 1):
        raise ValueError(f"workers must be a whole number of 1 or more, got {n!r}")
    _WORKERS = None if n is None else int(n)


def worker_count() -> int:
    """How many threads the pool runs work on (see the module docstring)."""
    if _WORKERS is not None:
        return _WORKERS
    n = usable_cores()
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        n = min(n, max(1, torch.get_num_threads()))
    return n


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then act on the first one that came.

    Only the main thread runs signal handlers; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    saved: dict[int, Any] = {}
    try:
        for signum in _HELD:
            handler = signal.getsignal(signum)
            if handler is not None:  # None: set outside Python, cannot be put back
                saved[signum] = signal.signal(signum, lambda s, _frame: came.append(s))
        yield
    finally:
        for held, handler in saved.items():
            signal.signal(held, handler)
    if came:
        handler = saved[came[0]]
        if callable(handler):
            handler(came[0], None)  # Python's Ctrl-C handler raises KeyboardInterrupt here
        elif handler == signal.SIG_DFL:
            signal.raise_signal(came[0])


def _pool(workers: int) -> ThreadPoolExecutor:
    """The pool of ``workers`` threads (call with signals deferred)."""
    global _POOL, _POOL_PID, _POOL_SIZE
    if _POOL is None or os.getpid() != _POOL_PID or workers != _POOL_SIZE:
        if _POOL is not None and os.getpid() == _POOL_PID:
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_PREFIX)
        _POOL_PID, _POOL_SIZE = os.getpid(), workers
    return _POOL


def _serial(workers: int) -> bool:
    # in a worker already, nesting would wait on itself
    return workers < 2 or threading.current_thread().name.startswith(_PREFIX)


def run(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``, on the pool when there are several items and threads."""
    workers = worker_count()
    if len(items) < 2 or _serial(workers):
        return [fn(x) for x in items]
    futures: list[Future[Any]] = []
    try:
        with signals_deferred():
            pool = _pool(workers)
            futures = [pool.submit(fn, x) for x in items]  # starts the threads it needs
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()  # an interrupted caller wants no more of this work done
        raise


def imap(fn: Callable[[Any], Any], items: Iterable[Any], ahead: int = 1) -> Iterator[Any]:
    """``fn(x)`` for each item, yielded in order, the next ``ahead`` items computed on the pool
    while the caller works on the current one (e.g. screening a tensor while copying the one
    before). At most ``ahead + 1`` results exist at once. When the caller stops early (an
    error, Ctrl-C), the items not started are cancelled and the running ones are waited for."""
    workers = worker_count()
    if _serial(workers):
        yield from map(fn, items)
        return
    pending: collections.deque[Future[Any]] = collections.deque()
    source = iter(items)

    def submit() -> None:
        for x in source:
            with signals_deferred():
                pending.append(_pool(workers).submit(fn, x))
            return

    try:
        for _ in range(ahead + 1):
            submit()
        while pending:
            got = pending.popleft().result()
            submit()
            yield got
    finally:
        for f in pending:
            f.cancel()  # a caller that stopped early (an error, Ctrl-C) wants no more
        # ... and those already running finish before the caller goes on: they may write to a
        # file the caller is about to close and remove.
        concurrent.futures.wait(pending)
