"""``sparsetool eval --tasks``: its option checks (before torch loads) and its tables; the paired
interval cells and legend ``eval``'s perplexity table shares."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sparsetool.cli._output import (
    emit_json,
    failing_cleanly,
    note_reclaimed,
    percent,
    plan_printer,
    print_table,
    progress_bar,
    warn,
)
from sparsetool.cli._params import usage_errors

if TYPE_CHECKING:  # torch-free, but loaded only when eval runs
    from sparsetool.ops.eval_options import EvalOptions, TasksOptions

NOISE = "~"  # marks a difference whose paired 95% interval holds no change


def change_interval(comparison: dict | None) -> str:
    """A perplexity ratio's paired interval as a change in percent: ``-0.12% .. +0.31%``."""
    if comparison is None:
        return "-"
    return f"{100 * (comparison['low'] - 1):+.2f}% .. {100 * (comparison['high'] - 1):+.2f}%"


def noise_legend(over: str, items: int | None) -> str:
    """The line under a table with paired intervals, saying what they are and what ``~`` means."""
    from sparsetool.ops.paired import RESAMPLES

    count = f" the {items:,}" if items else ""
    return (
        f"95% interval: paired with the first checkpoint over{count} {over} (bootstrap, "
        f"{RESAMPLES:,} resamples); {NOISE} marks a difference inside the noise (its interval "
        "holds no change)"
    )


def check_options(values: dict[str, Any]) -> tuple[EvalOptions, TasksOptions | None]:
    """``eval``'s two records from the command line's values (by field name): the perplexity
    options, and the task options or None without --tasks; usage errors for options that would
    be ignored (:func:`sparsetool.ops.eval_options.eval_options`, the Python API's checks too)."""
    from sparsetool.ops.eval_options import eval_options

    if values.get("tasks") is not None:
        # the harness's own progress bars (sparsetool draws one): tqdm reads this when it is
        # imported, and torch imports it, so before --device or --threads load torch
        os.environ.setdefault("TQDM_DISABLE", "1")
    with usage_errors():
        return eval_options(**values)


def run(
    checkpoints: list[Path],
    tasks: TasksOptions,
    options: EvalOptions,
    *,
    as_json: bool,
    quiet: bool,
) -> None:
    """``eval --tasks``: score the tasks, warn of what the figures are not, print them (``--json``
    or the tables) and draw ``--plot``."""
    from sparsetool.ops.tasks import evaluate_tasks

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = evaluate_tasks(
            checkpoints,
            tasks,
            options,
            progress=progress,
            on_plan=plan_printer(not (as_json or quiet)),
        )
    for source in result.sources:  # even with --json or -q: the figures are not the harness's own
        if source.reason:
            warn(
                f"--tasks {source.task}: {source.reason}; scored the {source.split} split bundled "
                f"by {source.package} instead (--offline goes there at once)"
            )
    for message in result.warnings:  # even with --json or -q: inputs were cut to the context
        warn(message)
    if as_json:
        emit_json(result.to_json())
    else:
        print_results(result, options.text is not None)
        if tasks.log_samples is not None:
            files = sum(len(r.logged) for r in result.rows)
            typer.echo(f"samples: {files} JSON-lines files in {tasks.log_samples}")
    if options.plot is not None:  # after the results: a plot that fails loses nothing
        with failing_cleanly():
            written = plot_tasks(result, options.plot)
        note_reclaimed(written.reclaimed)


def plot_tasks(result: Any, plot: str | Path) -> Any:
    """``eval --tasks --text --plot``: the perplexity column against targeted sparsity
    (:func:`sparsetool.ops.eval.plot_eval`)."""
    from sparsetool.ops.eval import EvalResult, EvalRow, plot_eval

    rows = [
        EvalRow(
            name=r.name,
            kind=r.kind,
            targeted_sparsity=r.targeted_sparsity,
            params=r.params,
            nonzero_params=r.nonzero_params,
            nll=0.0,
            perplexity=r.perplexity or float("nan"),
            bits_per_byte=0.0,
            tokens=0,
            bytes=0,
            seq=0,
            stride=0,
            seconds=r.seconds,
        )
        for r in result.rows
    ]
    return plot_eval(EvalResult(result.text_source or "", rows), plot)


def print_results(result: Any, with_perplexity: bool) -> None:
    """The table of task metrics (and perplexity), its footer, and where the data came from."""
    from sparsetool.ops.tasks import mean_metric, shown_metrics

    columns = []  # (task, metric)
    for task in result.tasks:
        columns += [(task, m) for m in shown_metrics(result.rows[0].metrics.get(task, {}))]
    mean = mean_metric(result.rows[0], result.tasks)
    header = ["checkpoint", "targeted sparsity"] + (["perplexity"] if with_perplexity else [])
    header += [f"{task} {metric}" for task, metric in columns]
    header += [f"mean {mean}"] if mean else []
    cells = []
    for r in result.rows:
        row = [r.name, percent(r.targeted_sparsity, 1)]
        if with_perplexity:
            row.append(f"{r.perplexity:.3f}" if r.perplexity is not None else "-")
        for task, metric in columns:
            value, err = r.metric(task, metric), r.metric(task, f"{metric}_stderr")
            row.append(
                "-"
                if value is None
                else f"{value:.4f}" + (f" ± {err:.4f}" if err is not None else "")
            )
        if mean:
            values = [r.metric(t, mean) for t in result.tasks]
            row.append(f"{sum(values) / len(values):.4f}" if None not in values else "-")
        cells.append(row)
    print_table(header, cells)
    shots = {result.n_shot.get(t, 0) for t in result.scored()}
    docs = {n for r in result.rows[:1] for n in r.samples.values()}
    counts = "/".join(str(d) for d in sorted(docs)) + " documents per task"
    if len(docs) > 3:  # MMLU's 57 subjects: not 40 counts
        total = sum(n for r in result.rows[:1] for n in r.samples.values())
        counts = f"{min(docs)} to {max(docs)} documents per task, {total:,} in all"
    typer.echo(
        f"lm-evaluation-harness {result.harness}; "
        + ", ".join(f"{t} v{result.versions.get(t, '?')}" for t in result.tasks)
        + f"; {'/'.join(str(s) for s in sorted(shots))}-shot"
        + (f"; {counts}" if docs else "")
        + (f"; perplexity on {result.text_source}" if with_perplexity else "")
    )
    bundled = [s for s in result.sources if s.origin == "bundled"]
    if bundled:
        parts: list[str] = []
        for split in dict.fromkeys(s.split for s in bundled):
            mine = [s for s in bundled if s.split == split]
            other = [s for s in mine if s.harness_split != s.split]
            text = f"the {split} splits" + ("" if parts else f" bundled by {bundled[0].package}")
            text += " for " + ", ".join(s.task for s in mine)
            if other:
                text += f" (the harness's own {', '.join(s.task for s in other)} " + (
                    f"task scores its {other[0].harness_split} split)"
                    if len(other) == 1
                    else f"tasks score their {other[0].harness_split} splits)"
                )
            parts.append(text)
        notes = "".join(f"; {s.task}: {s.note}" for s in bundled if s.note)
        typer.echo("data: " + ", ".join(parts) + notes)
    if len(result.rows) > 1:
        print_differences(result, columns, mean, with_perplexity)


def _difference(interval: dict[str, Any] | None, digits: int = 4) -> str:
    """``-0.0833 [-0.2500, +0.0833] ~``: a difference, its paired 95% interval, the noise mark."""
    if interval is None:
        return "-"
    e, lo, hi = interval["estimate"], interval["low"], interval["high"]
    mark = f" {NOISE}" if interval["inside_noise"] else ""
    return f"{e:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]{mark}"


def print_differences(
    result: Any, columns: list[tuple[str, str]], mean: str | None, with_perplexity: bool
) -> None:
    """Each checkpoint after the first against the first: per task and metric the difference with
    its paired 95% interval over the documents, the mean over tasks, the perplexity change over
    the windows, and the legend of the noise mark."""
    header = ["difference to " + result.rows[0].name]
    header += ["perplexity change"] if with_perplexity else []
    header += [f"{task} {metric}" for task, metric in columns]
    header += [f"mean {mean}"] if mean else []
    cells = []
    for r in result.rows[1:]:
        comparison = r.comparison or {}
        row = [r.name]
        if with_perplexity:
            ppl = comparison.get("perplexity")
            row.append(
                "-"
                if ppl is None
                else f"{100 * (ppl['estimate'] - 1):+.2f}% ({change_interval(ppl)})"
                + (f" {NOISE}" if ppl["inside_noise"] else "")
            )
        per_task = comparison.get("tasks", {})
        row += [_difference(per_task.get(task, {}).get(metric)) for task, metric in columns]
        if mean:
            row.append(_difference(comparison.get("mean")))
        cells.append(row)
    typer.echo("")
    print_table(header, cells)
    over = "documents of each task" + (" (windows for perplexity)" if with_perplexity else "")
    typer.echo(noise_legend(over, None))
