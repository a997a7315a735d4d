"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (kill, job schedulers).

While the step loop runs, :class:`StopRequest` holds both signals' handlers. The first signal only
records itself: the loop finishes the optimizer step in progress (never a half-updated state),
saves a checkpoint at it and stops, so ``--resume`` continues exactly. A second signal stops at
once, by raising ``KeyboardInterrupt`` wherever the loop is: nothing more is saved, and the last
complete checkpoint stays (checkpoints are written to a temporary directory and renamed).
The handlers in place before the loop are put back when it ends, and after a second signal.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The loop's signal handlers (a context manager); ``enabled=False`` installs none.

    ``notice(name)`` is called from the handler on the first signal (``"SIGINT"``...): it runs
    between two Python instructions of the main thread, so it should only write a line.
    """

    def __init__(self, enabled: bool = True, notice: Callable[[str], None] | None = None) -> None:
        self.enabled = enabled
        self.notice = notice or (lambda name: None)
        self.signum: int | None = None  # the first signal, once one came
        self.second: int | None = None  # the one that stopped the run at once
        self._saved: dict[int, Any] = {}
        self._unraisable: Any = None

    def __enter__(self) -> StopRequest:
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._swallowed
            for signum in SIGNALS:
                previous = signal.getsignal(signum)
                # None: set outside Python; SIG_IGN: ignored on purpose (nohup, `cmd &`): leave both
                if previous is not None and previous != signal.SIG_IGN:
                    self._saved[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
        if self._unraisable is not None:
            sys.unraisablehook, self._unraisable = self._unraisable, None

    def _swallowed(self, unraisable: Any) -> None:
        """Python's report of an exception it could not raise (one inside ``__del__``): the second
        signal's KeyboardInterrupt is not news (:meth:`pending` raises it again), anything else
        is."""
        if not (unraisable.exc_type is KeyboardInterrupt and self.second is not None):
            self._unraisable(unraisable)

    def restore(self) -> None:
        """Put back the handlers that were in place before (a third signal acts as they say)."""
        saved, self._saved = self._saved, {}
        for signum, handler in saved.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            self.notice(self.name)
            return
        self.second = signum
        self.restore()
        raise KeyboardInterrupt

    def pending(self) -> int | None:
        """The first signal (None before one came), read between steps. A second signal's
        ``KeyboardInterrupt`` raised inside a finalizer (``__del__``, a weakref callback) is
        swallowed by Python ("Exception ignored in ..."): it is raised again here, so the run
        still stops at once rather than saving a checkpoint."""
        if self.second is not None:
            raise KeyboardInterrupt
        return self.signum

    @property
    def name(self) -> str | None:
        """The first signal's name (``"SIGINT"``, ``"SIGTERM"``), None before one came."""
        return None if self.signum is None else signal_name(self.signum)


def signal_name(signum: int) -> str:
    """``signal_name(2)`` -> ``'SIGINT'``."""
    return signal.Signals(signum).name


def signal_number(name: str) -> int:
    """``signal_number('SIGTERM')`` -> 15."""
    return int(signal.Signals[name])
