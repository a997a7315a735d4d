"""The one progress callback type of the library's long operations, and its plain-text form for
a log (:class:`ProgressLines`: what the command line prints when stderr is not a terminal)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)`` after each unit of work of a stage (a tensor, a
block, a batch); the CLI draws it as a bar, the Python API leaves it out. A stage that counts in
steps of many units (eval's tokens) reports ``done=0`` when it starts: a first report above 0 is
read as one unit after a resumed run's earlier ones, and the time left is measured from there."""


class Steps:
    """Counts the steps of one job and reports each to ``report(done, total)`` (if given): the
    ``tick`` a loop calls after each unit of work.

    >>> seen = []; tick = Steps(3, lambda d, t: seen.append((d, t))); tick(); tick(); seen
    [(1, 3), (2, 3)]
    """

    def __init__(self, total: int, report: Callable[[int, int], None] | None = None):
        self.total, self.report, self.done = total, report, 0

    def __call__(self) -> None:
        self.done += 1
        if self.report:
            self.report(self.done, self.total)


@dataclass
class _Stage:
    """Where one stage of a :class:`ProgressLines` stands."""

    start: float  # when it began (the end of the previous unit of work)
    start_done: int  # the units done before it began (a resumed run's earlier steps)
    first_time: float  # its first report
    first_done: int  # the units done at that report
    latest: int = 0  # the units done at the latest report
    ended: bool = False  # its end has been printed


DEFAULT_INTERVAL = 30.0
"""Seconds between two progress lines of :class:`ProgressLines` (stage ends aside)."""


class ProgressLines:
    """A :data:`Progress` callback that writes plain lines for a log, throttled.

    Nothing in the first ``interval`` seconds (a short command prints no progress at all); after
    that a line at each stage's end and at most one every ``interval`` seconds in between, e.g.
    ``progress: calibrate 12/30 (40%), 1m48s elapsed, about 2m42s left``. The elapsed time is the
    stage's; the time left follows the pace since the stage's first report (so neither the set-up
    before its first unit nor a resumed run's earlier steps skew it). ``write`` gets each line
    (without its newline); ``clock`` is ``time.monotonic`` unless a test injects one. Safe to
    call from several threads.

    >>> now = [0.0]; lines = []
    >>> p = ProgressLines(lines.append, interval=30, clock=lambda: now[0])
    >>> for step in range(1, 7):
    ...     now[0] = 20.0 * step
    ...     p("scan", step, 6)
    >>> lines
    ['progress: scan 2/6 (33%), 40s elapsed, about 1m20s left', \
'progress: scan 4/6 (67%), 1m20s elapsed, about 40s left', 'progress: scan 6/6 done in 2m00s']
    """

    def __init__(
        self,
        write: Callable[[str], None],
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write, self.interval, self.clock = write, interval, clock
        self.started = self.last_line = self.last_call = clock()
        self.stages: dict[str, _Stage] = {}
        self.held: list[str] = []  # lines for the log once it gets any (:meth:`hold`)
        self.lock = threading.Lock()

    def hold(self, text: str) -> None:
        """A line (a memory plan, say) for a log that gets progress: written now once the first
        ``interval`` has passed, else kept and written before the first progress line (or at
        :meth:`close` of a run that lasted that long); a short run writes none of it."""
        with self.lock:
            self.held.append(text)
            if self.clock() - self.started >= self.interval:
                self._release()

    def close(self) -> None:
        """The end of the work: held lines are written if the run lasted ``interval``."""
        with self.lock:
            if self.clock() - self.started >= self.interval:
                self._release()
            self.held.clear()

    def _release(self) -> None:
        for text in self.held:
            self.write(text)
        self.held.clear()

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None:
        """Report ``done`` of ``total`` units of ``stage``; ``detail`` (a loss, say) follows the
        counts of a line printed between stage ends."""
        with self.lock:
            now = self.clock()
            s = self.stages.get(stage)
            if s is None or done < s.latest:  # a new stage, or the same name started again
                # it began when the previous unit of work ended (the first report follows its
                # first unit), or now if it says 0 done
                s = _Stage(self.last_call if done else now, max(0, done - 1), now, done)
                self.stages[stage] = s
            s.latest = done
            self.last_call = now
            if now - self.started < self.interval:
                return
            if total and done >= total:
                if not s.ended:
                    s.ended = True
                    took = duration(now - s.start)
                    self._line(f"{stage} {done:,}/{total:,} done in {took}", now)
            elif now - self.last_line >= self.interval and done > s.start_done:
                self._line(self._middle(stage, done, total, detail, s, now), now)

    @staticmethod
    def _middle(stage: str, done: int, total: int, detail: str, s: _Stage, now: float) -> str:
        text = f"{stage} {done:,}/{total:,}" if total else f"{stage} {done:,}"
        if total:
            text += f" ({done / total:.0%})"
        if detail:
            text += f", {detail}"
        text += f", {duration(now - s.start)} elapsed"
        if not total:
            return text
        # the pace since the first report, once there is one to measure from: the time before
        # the first unit ended (a model loading, say) does not stretch the estimate
        if done > s.first_done:
            pace = (now - s.first_time) / (done - s.first_done)
        else:
            pace = (now - s.start) / (done - s.start_done)
        return f"{text}, about {duration(pace * (total - done))} left"

    def _line(self, text: str, now: float) -> None:
        self._release()
        self.last_line = now
        self.write(f"progress: {text}")


def duration(seconds: float) -> str:
    """A duration for a progress line: seconds, then minutes and seconds, then hours.

    >>> duration(4.4), duration(65), duration(3600 * 2 + 61)
    ('4s', '1m05s', '2h01m')
    """
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


__all__ = ["DEFAULT_INTERVAL", "Progress", "ProgressLines", "Steps", "duration"]
