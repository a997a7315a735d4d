"""The thread pool the selection kernel runs its chunks on.

Ctrl-C and SIGTERM (which the command line turns into Ctrl-C) raise ``KeyboardInterrupt`` between
any two Python instructions of the main thread. Raised inside ``ThreadPoolExecutor.submit``, after
a worker thread started but before the executor recorded it, it leaves a thread that nothing ever
wakes, and the interpreter then waits for it forever at exit. So work is handed to the pool with
those two signals deferred (a signal arriving then is acted on right after, as it would have been),
and results are awaited with them live: an interrupted wait cancels the chunks not yet started.
Blocking the signals would not do: another thread (torch's, OpenMP's) would take them instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import torch

_HELD = {signal.SIGINT, signal.SIGTERM}
_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0  # a forked child inherits the pool object but not its threads: make a new one


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
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    if came:
        handler = saved[came[0]]
        if callable(handler):
            handler(came[0], None)  # Python's Ctrl-C handler raises KeyboardInterrupt here
        elif handler == signal.SIG_DFL:
            signal.raise_signal(came[0])


def run(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``, on the pool when there are several items and threads."""
    global _POOL, _POOL_PID
    workers = max(1, torch.get_num_threads())
    if len(items) < 2 or workers < 2:
        return [fn(x) for x in items]
    futures: list[Future] = []
    try:
        with signals_deferred():
            if _POOL is None or _POOL_PID != os.getpid():
                _POOL = ThreadPoolExecutor(max_workers=min(workers, 8), thread_name_prefix="sparsetool-mask")
                _POOL_PID = os.getpid()
            futures = [_POOL.submit(fn, x) for x in items]  # starts the threads it needs
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()  # an interrupted caller wants no more of this work done
        raise
