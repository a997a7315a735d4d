"""``sparsetool diff``: how the weights moved between two checkpoints, matrix by matrix."""

from __future__ import annotations

from pathlib import Path

import typer

from sparsetool.cli._output import (
    emit_json,
    err_console,
    failing_cleanly,
    note_reclaimed,
    percent,
    print_table,
    progress_bar,
)
from sparsetool.cli._params import (
    exclude_option,
    include_option,
    json_option,
    plot_option,
    threads_option,
    use_threads,
)
from sparsetool.util.wording import plural

HEADER = [
    "matrix",
    "layer",
    "kind",
    "sparsity A",
    "sparsity B",
    "mask IoU",
    "revived",
    "pruned",
    "rel L2",
    "angular",
]


def _number(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:#.4g}"


EXAMPLES = (  # the end of --help: each runs as written (given the checkpoints named)
    "sparsetool diff sparse-pretrained/ finetuned/",
    "sparsetool diff step-1000.safetensors step-2000.safetensors --json",
    "sparsetool diff sparse-pretrained/ finetuned/ --plot angular.png --quiet",
)


def diff(
    a: Path = typer.Argument(
        ..., metavar="A", help="The first checkpoint (.safetensors file or Hugging Face directory)."
    ),
    b: Path = typer.Argument(
        ..., metavar="B", help="The second checkpoint, with the same tensor names and shapes."
    ),
    as_json: bool = json_option('Print {"tensors": [...], "summary": {...}} on stdout.'),
    plot: Path | None = plot_option(
        "Also draw the angular distance heatmap (layers x matrices) into this PNG."
    ),
    include: list[str] = include_option("Also compare tensors matching this glob (repeatable)."),
    exclude: list[str] = exclude_option(
        "Do not compare tensors matching this glob (repeatable; wins over --include)."
    ),
    quiet: bool = typer.Option(
        False,
        "-q",
        "--quiet",
        help="Print only the summary line: no table, no progress bar, no notes.",
    ),
    threads: int | None = threads_option(),
) -> None:
    """Compare the targeted weights of checkpoints A and B (say before and after fine-tuning).

    Per matrix (fused Q/K/V split into Q, K and V): sparsity of each, mask IoU of the non-zero sets,
    weights revived (zero in A, non-zero in B) and newly pruned, relative L2 change ||B-A||/||A||
    and angular distance 1 - cos(A, B). The summary pools all targeted weights as one vector.
    """
    from sparsetool.ops.diff import diff as run_diff
    from sparsetool.ops.diff import plot_diff

    use_threads(threads)
    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = run_diff(
            a, b, include=tuple(include), exclude=tuple(exclude), progress=progress, plot=plot
        )
    for note in [] if quiet else result.notes:
        err_console.print(f"note: {note}", highlight=False, soft_wrap=True, markup=False)
    if as_json:
        emit_json(result.to_json())
    else:
        _print(result, a, b, quiet)
    if plot is not None:  # after the results: a plot that fails to be written does not lose them
        with failing_cleanly():
            written = plot_diff(result, plot)
        note_reclaimed(written.reclaimed)
        if not as_json:
            typer.echo(f"plot: {plot}")


def _print(result, a, b, quiet: bool) -> None:
    t = result.total
    summary = (
        f"all {plural(t.numel, 'targeted weight')} "
        f"({plural(len(result.rows), 'matrix', 'matrices')}): sparsity {percent(t.sparsity_a)} -> "
        f"{percent(t.sparsity_b)}, mask IoU {t.iou:.4f}, revived {t.revived:,}, newly pruned "
        f"{t.pruned:,}, rel L2 {_number(t.rel_l2)}, angular distance {_number(t.angular_distance)}"
    )
    if not quiet:
        cells = [
            [
                r.label,
                "" if r.layer is None else str(r.layer),
                r.kind,
                percent(r.stats.sparsity_a),
                percent(r.stats.sparsity_b),
                f"{r.stats.iou:.4f}",
                f"{r.stats.revived:,}",
                f"{r.stats.pruned:,}",
                _number(r.stats.rel_l2),
                _number(r.stats.angular_distance),
            ]
            for r in result.rows
        ]
        print_table(HEADER, cells, title=f"{a} -> {b}", align="lrlrrrrrrr")
    typer.echo(summary)
