"""Stopping a training run cleanly on SIGINT (Ctrl-C) or SIGTERM (kill, job schedulers).

While the step loop runs, :class:`StopRequest` holds both signals' handlers. The first signal only
records itself: the loop finishes the optimizer step in progress (never a half-updated state),
saves a checkpoint at it and stops, so ``--resume`` continues exactly. A second signal stops at
once: nothing more is saved, and the last complete checkpoint stays (checkpoints are written to a
temporary directory and renamed). The handlers in place before the loop are put back when it
ends; between a second signal and then, more signals change nothing (two signals that came
together run the handler twice, and the second run must not reach the handler put back).

Python runs a signal's handler only between two of its own instructions, in the main thread: not
during one long call into torch, such as a backward pass, and two signals of one kind that land
in one such call run the handler once (it only records that the signal came). So the signals are
also counted as they arrive, by a thread that reads the byte Python's C-level handler writes to
the wakeup file descriptor (:func:`signal.set_wakeup_fd`) for each. While the loop computes (its
:meth:`StopRequest.at_once` blocks: forward, backward, the optimizer; no file is being written
then) a second signal ends the process from that thread, with the run's own message
(``on_second``) and exit code 128 + the first signal's number; elsewhere (a save, the log) it
raises ``KeyboardInterrupt`` in the main thread, which removes what was half written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """The loop's signal handlers (a context manager); ``enabled=False`` installs none.

    ``notice(name)`` is called on the first signal (``"SIGINT"``...), from the handler or from
    the counting thread: it should only write a line. ``on_second(first, second)`` is called from
    that thread when a second signal comes during an :meth:`at_once` block, just before the
    process exits: it says why (one line, written straight to the file descriptor).
    """

    def __init__(
        self,
        enabled: bool = True,
        notice: Callable[[str], None] | None = None,
        on_second: Callable[[int, int], None] | None = None,
    ) -> None:
        self.enabled = enabled
        self.notice = notice or (lambda name: None)
        self.on_second = on_second or (lambda first, second: None)
        self.signum: int | None = None  # the first signal, once one came
        self.second: int | None = None  # the one that stopped the run at once
        self._saved: dict[int, Any] = {}
        self._unraisable: Any = None
        # re-entrant: the handler may run in the main thread while it holds the lock (at_once)
        self._lock = threading.RLock()
        self._handled = 0  # times the Python handler ran (signals of one kind may merge)
        self._counted = 0  # signals the thread read (every one, a little later)
        self._noticed = False
        self._raised = False  # the handler raised the second signal's KeyboardInterrupt
        self._kinds: list[int] = []  # the kinds that came, in the order they were seen
        self._computing = False  # inside at_once(): a second signal ends the process
        self._pipe: tuple[int, int] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> StopRequest:
        if self.enabled and threading.current_thread() is threading.main_thread():
            self._unraisable, sys.unraisablehook = sys.unraisablehook, self._swallowed
            for signum in SIGNALS:
                previous = signal.getsignal(signum)
                # None: set outside Python; SIG_IGN: ignored on purpose (nohup, `cmd &`): leave both
                if previous is not None and previous != signal.SIG_IGN:
                    self._saved[signum] = signal.signal(signum, self._handle)
            if self._saved:
                self._start_counting()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()
        self._stop_counting()
        if self._unraisable is not None:
            sys.unraisablehook, self._unraisable = self._unraisable, None

    def _start_counting(self) -> None:
        """The wakeup descriptor and the thread that counts the signals, unless another part of
        the program (asyncio) already reads that descriptor: then the handler alone decides."""
        read, write = os.pipe()
        os.set_blocking(write, False)
        try:
            previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read)
            os.close(write)
            return
        if previous != -1:  # someone else's: give it back
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return
        self._pipe = read, write
        self._reader = threading.Thread(target=self._count, name="sparsetool-signals", daemon=True)
        self._reader.start()

    def _stop_counting(self) -> None:
        if self._pipe is None:
            return
        signal.set_wakeup_fd(-1)
        read, write = self._pipe
        self._pipe = None
        os.close(write)  # the thread's read returns b"": it ends
        if self._reader is not None:
            self._reader.join(timeout=5)
        os.close(read)

    def _count(self) -> None:
        """The counting thread: one byte, the signal's number, for every signal delivered."""
        assert self._pipe is not None
        read = self._pipe[0]
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in SIGNALS:
                    self._came(signum, counted=True)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """A block of computation only (no file written): a second signal during it ends the
        process at once, even inside one long call into torch."""
        if self.second is not None:  # counted while no block ran: stop here, at once
            self._raised = True
            raise KeyboardInterrupt
        with self._lock:
            self._computing = True
        try:
            yield
        finally:
            with self._lock:  # not while the thread is deciding to end the process
                self._computing = False

    def _came(self, signum: int, counted: bool) -> bool:
        """Record one signal (``counted``: read by the thread, else a run of the handler);
        whether it is the second."""
        notice = False
        with self._lock:
            if counted:
                self._counted += 1
            else:
                self._handled += 1
            if self.signum is None:
                self.signum = signum
            if signum not in self._kinds:
                self._kinds.append(signum)
            if not self._noticed:
                self._noticed = notice = True
            elif self.second is None and max(self._counted, self._handled) >= 2:
                # the two counts may see two kinds in either order: the second is the kind that
                # is not the first, if one came
                self.second = next((k for k in self._kinds if k != self.signum), self.signum)
            second = self.second is not None
            if second and counted and self._computing:
                self._exit_now()  # holding the lock: the main thread cannot leave the block
        if notice:
            self.notice(signal_name(self.signum))
        return second

    def _exit_now(self) -> None:
        assert self.signum is not None and self.second is not None
        with contextlib.suppress(Exception):
            self.on_second(self.signum, self.second)
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(128 + self.signum)

    def _swallowed(self, unraisable: Any) -> None:
        """Python's report of an exception it could not raise (one inside ``__del__``): the second
        signal's KeyboardInterrupt is not news (:meth:`pending` raises it again), anything else
        is."""
        if not (unraisable.exc_type is KeyboardInterrupt and self.second is not None):
            self._unraisable(unraisable)

    def restore(self) -> None:
        """Put back the handlers that were in place before (a later signal acts as they say)."""
        saved, self._saved = self._saved, {}
        for signum, handler in saved.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self._came(signum, counted=False) and not self._raised:
            self._raised = True
            raise KeyboardInterrupt

    def pending(self) -> int | None:
        """The first signal (None before one came), read between steps. A second signal's
        ``KeyboardInterrupt`` raised inside a finalizer (``__del__``, a weakref callback) is
        swallowed by Python ("Exception ignored in ..."), and one the thread counted may not
        have reached the handler: either is raised here, so the run still stops at once rather
        than saving a checkpoint."""
        if self.second is not None:
            self._raised = True
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
