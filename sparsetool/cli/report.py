"""``sparsetool report``: per-tensor sparsity table and summary."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparsetool.cli._output import (
    TABLE_FORMATS,
    console,
    decimal_bytes,
    emit_json,
    failing_cleanly,
    note_reclaimed,
    percent,
    print_table,
    progress_bar,
    targeting_note,
)
from sparsetool.cli._params import (
    checkpoint_argument,
    choice_option,
    choices,
    conflicting,
    default_targets_option,
    exclude_option,
    given,
    include_option,
    json_option,
    plot_option,
    quiet_option,
    use_workers,
    value_of,
    workers_option,
)
from sparsetool.util.wording import plural

if TYPE_CHECKING:  # a str Enum to the type checker; typer reads the choices made below
    from sparsetool.cli._params import Choice as Format
else:
    Format = choices("Format", TABLE_FORMATS)


EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool report model-75/",
    "sparsetool report model.safetensors --json",
    "sparsetool report model-75/ --plot sparsity.png",
)


def report(
    checkpoint: Path = checkpoint_argument(),
    as_json: bool = json_option('Print {"tensors": [...], "summary": {...}} on stdout.'),
    plot: Path | None = plot_option(
        "Also draw the sparsity of the listed tensors into this PNG: one bar each, or a layer x "
        "matrix heatmap past 40 tensors."
    ),
    all_tensors: bool = typer.Option(
        True, "--all/--targeted", help="Show every tensor (default) or only the targeted ones."
    ),
    fmt: Format = choice_option(
        Format,
        "rich",
        "--format",
        help="Table style (rich falls back to plain when piped or narrow).",
    ),
    include: list[str] = include_option(
        "Count tensors matching this glob as targeted (repeatable)."
    ),
    exclude: list[str] = exclude_option(
        "Do not count tensors matching this glob as targeted (repeatable; wins over --include)."
    ),
    default_targets: bool = default_targets_option(),
    quiet: bool = quiet_option(),
    workers: int | None = workers_option(),
) -> None:
    """Per-tensor sparsity of CHECKPOINT, with each tensor's role and whether prune targets it.

    The summary gives the sparsity over the targeted tensors AND over all parameters. A checkpoint
    pruned with --include/--exclude counts the tensors prune targeted (see --default-targets).
    """
    fmt = value_of(fmt)
    conflicting(
        as_json and given("fmt"),
        "--json",
        f"--format {fmt}",
        "--json prints no table; drop --format, or drop --json to print the table",
    )
    conflicting(
        as_json and not all_tensors and plot is None,
        "--json",
        "--targeted",
        '--json lists every tensor, each with "targeted" (--targeted filters the table '
        "and the plot); drop --targeted, or drop --json to print the targeted ones",
    )
    from sparsetool.ops.report import plot_report, summarize

    use_workers(workers)
    with failing_cleanly():
        with progress_bar(not (as_json or quiet)) as progress:
            rep = summarize(
                checkpoint,
                tuple(include),
                tuple(exclude),
                default_targets=default_targets,
                progress=progress,
                plot=plot,
            )
        targeting_note(rep.targeting["note"], quiet)
    if as_json:
        emit_json(rep.to_json())
    else:
        _print(rep, checkpoint, all_tensors, fmt)
    if plot is not None:  # after the results: a plot that fails to be written does not lose them
        with failing_cleanly():
            written = plot_report(rep, plot, all_tensors=all_tensors)
        note_reclaimed(written.reclaimed)
        if not (as_json or quiet):
            drawn = sum(1 for t in rep.tensors if all_tensors or t.targeted)
            console.print(
                f"plot: {plot}" + ("" if drawn else " (it says there is no tensor to draw)"),
                highlight=False,
                soft_wrap=True,
            )


def _print(rep, checkpoint, all_tensors: bool, fmt: str) -> None:
    rows = [t for t in rep.tensors if all_tensors or t.targeted]
    header = ["name", "shape", "dtype", "role", "targeted", "numel", "non-zero", "sparsity"]
    tied = rep.targeting.get("tied_head")
    cells = [
        [
            t.name,
            "x".join(map(str, t.shape)) or "scalar",
            t.dtype,
            f"{t.role} + tied head" if t.name == tied else t.role,
            "yes" if t.targeted else "",
            f"{t.numel:,}",
            f"{t.nonzero:,}",
            percent(t.sparsity),
        ]
        for t in rows
    ]
    s = rep.summary
    summary = [
        (
            "targeted sparsity",
            f"{percent(s['targeted_sparsity'])} of "
            f"{plural(s['targeted_numel'], 'weight')} in "
            f"{plural(s['targeted_tensors'], 'tensor')}",
        ),
        (
            "overall sparsity",
            f"{percent(s['overall_sparsity'])} of {plural(s['numel'], 'parameter')}",
        ),
        ("non-zero parameters", f"{s['nonzero']:,}"),
        ("bytes on disk", decimal_bytes(s["bytes"])),
    ]
    if s["non_float_tensors"]:  # never targeted, so outside both sparsities above
        summary.insert(
            2,
            (
                "non-float parameters",
                f"{s['non_float_numel']:,} in {plural(s['non_float_tensors'], 'tensor')} "
                f"({', '.join(s['non_float_dtypes'])}), never pruned and not in the "
                f"sparsities above",
            ),
        )
    allocation, refine = s.get("allocation"), s.get("refine")
    if allocation and allocation.get("blocks"):
        spread = [b["sparsity"] for b in allocation["blocks"]]
        summary.append(
            (
                "allocation",
                f"OWL (M {allocation['m']:g}, lambda {allocation['lambda']:g}): "
                f"block sparsities {percent(min(spread))} to {percent(max(spread))} "
                f"over {plural(len(spread), 'block')}",
            )
        )
    if refine:
        summary.append(
            (
                "refinement",
                f"DSnoT (at most {refine['iterations']} swaps per row, "
                f"threshold {refine['threshold']:g})",
            )
        )
    align = "lllllrrr"
    if any(
        t.expert is not None or t.experts is not None for t in rep.tensors
    ):  # a mixture of experts
        header.insert(4, "expert")
        for t, row in zip(rows, cells):
            row.insert(4, _expert_cell(t))
        align = "llllllrrr"
    if rep.made_by:  # how the checkpoint was made, from its provenance
        typer.echo(f"made by: {rep.made_by}")
    print_table(header, cells, title=str(checkpoint), align=align, fmt=fmt)
    for k, v in summary:
        typer.echo(f"{k}: {v}")


def _expert_cell(t) -> str:
    """The routed expert of a per-expert tensor; a fused tensor's experts and their spread."""
    if t.expert is not None:
        return str(t.expert)
    if t.experts is None:
        return ""
    spread = t.experts.sparsity
    return f"0-{len(spread) - 1}: {percent(min(spread))} to {percent(max(spread))}"
