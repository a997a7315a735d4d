"""The one progress callback type of the library's long operations."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)`` after each unit of work of a stage (a tensor, a
block, a batch); the CLI draws it as a bar, the Python API leaves it out."""


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


__all__ = ["Progress", "Steps"]
