"""Shared output helpers for commands: clean errors, JSON on stdout, rich on a terminal."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Iterator

import typer
from rich.console import Console
from rich.markup import escape

from sparsetool.errors import SparsetoolError

console = Console()
err_console = Console(stderr=True)


@contextlib.contextmanager
def failing_cleanly() -> Iterator[None]:
    """Turn a SparsetoolError into one ``error: ...`` line on stderr and exit code 1.

    Only SparsetoolError is caught: typer.Exit and real bugs pass through untouched.
    """
    try:
        yield
    except SparsetoolError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("error: interrupted; no output was written", highlight=False)
        raise typer.Exit(130) from None


def emit_json(obj: Any) -> None:
    """Plain JSON on stdout (never through rich, which would wrap and colour it)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_json_default) + "\n")
    sys.stdout.flush()


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__fspath__"):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def fail(message: str) -> None:
    """Raise the clean error (for checks done in the command itself)."""
    raise SparsetoolError(message)


@contextlib.contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Any]:
    """A ``progress(stage, done, total)`` callback drawing a rich bar on stderr (terminals only)."""
    if not enabled or not err_console.is_terminal:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:>8}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done)

        yield update


def note_left_out(names: list[str]) -> None:
    """One line naming the input entries an output directory leaves out (none: nothing)."""
    if names:
        console.print(f"note: left out (not part of a model directory): {escape(', '.join(names))}",
                      highlight=False, soft_wrap=True)


def percent(x: float, digits: int = 2) -> str:
    return f"{100 * x:.{digits}f}%"


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n} B"


def check_plot_path(path: Any) -> None:
    """Refuse a --plot path that cannot be written, before any work is done."""
    from pathlib import Path

    path = Path(path)
    if path.suffix.lower() != ".png":
        fail(f"--plot {path}: give a file name ending in .png")
    if not path.parent.is_dir():
        fail(f"--plot {path}: directory '{path.parent}' does not exist; create it first")
