"""Shared output helpers for commands: clean errors, JSON on stdout, rich on a terminal."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from sparsetool.errors import SparsetoolError
from sparsetool.util.wording import plural

console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def failing_cleanly() -> Iterator[None]:
    """Turn a SparsetoolError into one ``error: ...`` line on stderr and exit code 1 (an
    :class:`~sparsetool.errors.Interrupted` one: its own code, 130 for Ctrl-C), after the note of
    what the work reclaimed before it stopped (the error's ``reclaimed``, Ctrl-C's too).

    Only SparsetoolError is caught: typer.Exit and real bugs pass through untouched.
    """
    try:
        yield
    except SparsetoolError as e:
        note_reclaimed(e.reclaimed)
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True, highlight=False)
        raise typer.Exit(getattr(e, "exit_code", 1)) from None
    except KeyboardInterrupt as e:
        note_reclaimed(getattr(e, "reclaimed", ()))
        err_console.print("error: interrupted; no output was written", highlight=False)
        raise typer.Exit(130) from None


def note_reclaimed(reclaimed: Iterable[Any]) -> None:
    """One stderr line per directory where the library removed temporaries of killed runs (the
    ``reclaimed`` of its result or error; files were deleted: said even in --quiet; stdout and
    --json are untouched)."""
    for r in reclaimed:
        err_console.print(
            f"note: removed {plural(r.files, 'stale temporary file')} of killed runs "
            f"in {r.directory} ({decimal_bytes(r.bytes)})",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )


def emit_json(obj: Any) -> None:
    """Plain JSON on stdout (never through rich, which would wrap and colour it). JSON has no
    infinity or NaN: such a figure (a perplexity that overflowed, say) is written as null."""
    sys.stdout.write(
        json.dumps(_finite(obj), indent=2, default=_json_default, allow_nan=False) + "\n"
    )
    sys.stdout.flush()


def _finite(o: Any) -> Any:
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def warn(text: str) -> None:
    """One ``warning:`` line on stderr (the text taken literally, never as markup): the command
    goes on, but its result may not be what was meant."""
    err_console.print(f"warning: {text}", highlight=False, soft_wrap=True, markup=False)


def fail(message: str) -> None:
    """Raise the clean error (for checks done in the command itself)."""
    raise SparsetoolError(message)


PROGRESS_INTERVAL_ENV = "SPARSETOOL_PROGRESS_INTERVAL"
"""Seconds between two progress lines when stderr is not a terminal (default 30; 0: a line for
every unit of work)."""


def progress_interval() -> float:
    """The seconds between two progress lines: ``SPARSETOOL_PROGRESS_INTERVAL`` or 30 (a value
    that is not a number of seconds >= 0 is said once, as a warning, and the default used)."""
    import os

    from sparsetool.util.progress import DEFAULT_INTERVAL

    given = os.environ.get(PROGRESS_INTERVAL_ENV, "").strip()
    if not given:
        return DEFAULT_INTERVAL
    try:
        seconds = float(given)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and math.isfinite(seconds)):
        warn(
            f"{PROGRESS_INTERVAL_ENV}={given!r} is not a number of seconds >= 0; progress lines "
            f"come every {DEFAULT_INTERVAL:g} s"
        )
        return DEFAULT_INTERVAL
    return seconds


def log_line(text: str) -> None:
    """One plain line on stderr, as it is (no markup, never wrapped), written at once."""
    err_console.print(text, highlight=False, soft_wrap=True, markup=False)


_log_progress: Any = None  # the ProgressLines of the command's work while stderr is a log


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Any]:
    """A ``progress(stage, done, total)`` callback for a command's long work (None when not
    ``enabled``: --quiet, --json). On a terminal it draws a rich bar on stderr; otherwise (a
    pipe, a file, CI) it prints plain throttled lines there (:class:`ProgressLines`: nothing in
    the first 30 s, then one line at most every 30 s and one at each stage's end), and the memory
    plan :func:`plan_printer` hands it."""
    if not enabled:
        yield None
        return
    if not err_console.is_terminal:
        from sparsetool.util.progress import ProgressLines

        global _log_progress
        lines = _log_progress = ProgressLines(log_line, progress_interval())
        try:
            yield lines
        finally:
            _log_progress = None
            lines.close()
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    ) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        yield update


def plan_printer(enabled: bool = True) -> Callable[..., None] | None:
    """A callback printing a model-level run's memory plan on stderr (not with --quiet or --json):
    the figures a user needs before the long part starts. ``plan(plan)`` or ``plan(name, plan)``.

    On a terminal it is printed at once; in a log it goes with the progress lines of the work in
    progress (:meth:`ProgressLines.hold`): once the first 30 s have passed, before the first
    progress line, so a short run adds nothing to the log."""
    if not enabled:
        return None

    def show(*args: Any) -> None:
        *name, plan = args
        where = f"{name[0]}: " if name else ""
        text = f"{where}{plan.describe()}"
        if _log_progress is not None and not err_console.is_terminal:
            _log_progress.hold(text)
        else:
            log_line(text)

    return show


def note_left_out(names: list[str]) -> None:
    """One line naming the input entries an output directory leaves out (none: nothing)."""
    if names:
        console.print(
            f"note: left out (not part of a model directory): {escape(', '.join(names))}",
            highlight=False,
            soft_wrap=True,
        )


def percent(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f}%"


_PREFIXES = (
    (1e24, "Y"),
    (1e21, "Z"),
    (1e18, "E"),
    (1e15, "P"),
    (1e12, "T"),
    (1e9, "G"),
    (1e6, "M"),
    (1e3, "k"),
    (1.0, ""),
    (1e-3, "m"),
    (1e-6, "u"),
    (1e-9, "n"),
    (1e-12, "p"),
)


def si(x: float, unit: str) -> str:
    """Engineering notation with an SI prefix and a unit, at least 4 significant digits:
    ``si(2.3609e20, "FLOP")`` -> ``"236.09 EFLOP"``, ``si(7.464e12, "FLOP")`` -> ``"7.464 TFLOP"``;
    ``si(1.28e-6, "s")`` -> ``"1.280 us"``; past the largest prefix or below the smallest it
    falls back to ``"1.000e+30 FLOP"``."""
    for div, prefix in _PREFIXES if abs(x) < 0.99995e27 else ():
        if abs(x) >= 0.99995 * div:  # 999.99995 G prints as 1.000 T, not 1000.00 G
            m = x / div
            decimals = max(2, 4 - len(str(int(abs(m)))))
            return f"{m:.{decimals}f} {prefix}{unit}"
    return "0 " + unit if x == 0 else f"{x:.3e} {unit}"


def short_count(x: float) -> str:
    """A count of tokens or parameters: ``2.5B``, ``64.51M``, ``1K``; past 1,000T scientific."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= 1000 * div and unit == "T":
            return f"{x:.4g}"
        if abs(x) >= div:
            return f"{x / div:.4g}{unit}"
    return f"{x:.4g}"


def decimal_bytes(n: float) -> str:
    """Bytes in powers of 1000 (KB, MB, GB) for file sizes."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


TABLE_FORMATS = ("rich", "plain", "markdown", "github")


def print_table(
    header: Sequence[str] | None,
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    align: str | None = None,
    fmt: str = "rich",
    sections: Collection[int] = (),
) -> None:
    """The one table renderer of every command. Cells are plain text (no markup); a cell is never
    cut.

    ``align`` has one letter per column, ``l`` or ``r`` (default: the first left, the rest right).
    ``fmt`` ``rich`` draws a rich table on a terminal wide enough for every cell whole, and falls
    back to ``plain`` (aligned columns at their natural width, by display width so wide characters
    line up) when piped or narrow; ``markdown`` and ``github`` print pipe tables. ``sections``: row
    indices after which rich draws a rule. ``header`` None: no header row.
    """
    ncols = len(header) if header is not None else max((len(r) for r in rows), default=0)
    align = align or ("l" + "r" * max(0, ncols - 1))
    cells = [list(r) + [""] * (ncols - len(r)) for r in rows]
    if fmt == "rich":
        table = _rich_table(header, cells, title, align, sections)
        unbounded = console.options.update_width(1 << 16)  # the width every cell whole needs
        if (
            console.is_terminal
            and console.measure(table, options=unbounded).maximum <= console.width
        ):
            console.print(table)
            return
        fmt = "plain"
    lines = _text_table(header, cells, align, fmt)
    if title:
        lines = [
            title if fmt == "plain" else f"**{title}**",
            *([""] if fmt != "plain" else []),
            *lines,
        ]
    if fmt != "plain":
        lines.append("")  # a pipe table ends at a blank line; text after it would become a row
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def _rich_table(
    header: Sequence[str] | None,
    rows: list[list[str]],
    title: str | None,
    align: str,
    sections: Collection[int],
) -> Any:
    from rich.table import Table

    if header is None:
        table = Table(show_header=False, box=None, title=escape(title) if title else None)
    else:
        table = Table(title=escape(title) if title else None, title_justify="left")
    for i in range(len(align)):
        table.add_column(
            # rich types a header as a renderable; a headerless table's columns have None
            escape(header[i]) if header is not None else None,  # type: ignore[arg-type]
            no_wrap=True,
            overflow="fold",
            justify="right" if align[i] == "r" else "left",
            style="bold" if header is None and i == 0 else None,
        )
    for i, r in enumerate(rows):
        table.add_row(*[escape(c) for c in r], end_section=i in sections)
    return table


def _text_table(
    header: Sequence[str] | None, rows: list[list[str]], align: str, fmt: str
) -> list[str]:
    from rich.cells import cell_len

    pipe = fmt in ("markdown", "github")
    if pipe:
        rows = [[c.replace("|", "\\|") for c in r] for r in rows]
        header = header if header is not None else [""] * len(align)
    body = ([list(header)] if header is not None else []) + rows
    widths = [max((cell_len(r[i]) for r in body), default=0) for i in range(len(align))]
    if pipe:
        widths = [max(3, w) for w in widths]

    def pad(text: str, i: int) -> str:
        gap = " " * (widths[i] - cell_len(text))
        return gap + text if align[i] == "r" else text + gap

    def line(cells: Sequence[str]) -> str:
        if pipe:
            return "| " + " | ".join(pad(c, i) for i, c in enumerate(cells)) + " |"
        return "  ".join(pad(c, i) for i, c in enumerate(cells)).rstrip()

    out = [line(r) for r in body]
    if header is not None:
        if pipe:
            rules = [
                ("-" * (w - 1) + ":") if align[i] == "r" and fmt == "markdown" else "-" * w
                for i, w in enumerate(widths)
            ]
            out.insert(1, "| " + " | ".join(rules) + " |")
        else:
            out.insert(1, "  ".join("-" * w for w in widths))
    return out


def targeting_note(note: str | None, quiet: bool = False) -> None:
    """The one stderr line saying the targets came from the checkpoint's record (not in --quiet)."""
    if note and not quiet:
        err_console.print(
            f"note: {escape(note)} (--default-targets for the built-in roles)",
            highlight=False,
            soft_wrap=True,
        )
