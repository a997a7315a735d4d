"""``sparsetool densify``: any sparse encoding back to a plain dense checkpoint."""

from __future__ import annotations

from pathlib import Path

import typer

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    note_left_out,
    note_reclaimed,
    progress_bar,
)
from sparsetool.cli._params import (
    checkpoint_argument,
    in_place_conflict,
    json_option,
    output_option,
    quiet_option,
    usage_error,
    use_workers,
    workers_option,
)
from sparsetool.util.wording import plural

EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool densify model-bitmask/ -o model-dense/",
    "sparsetool densify model-75.safetensors -o model-75-dense.safetensors --json",
)


def densify(
    checkpoint: Path = checkpoint_argument(),
    output: Path | None = output_option(),
    in_place: bool = typer.Option(
        False, "--in-place", help="Allow OUTPUT to be the input itself (replaced atomically)."
    ),
    quiet: bool = quiet_option(),
    workers: int | None = workers_option(),
    as_json: bool = json_option(),
) -> None:
    """Write CHECKPOINT as plain dense tensors: pruned weights become 0.0.

    Decodes every encoding (zeros, _mask tensors, NaN sentinels, compressed-tensors bitmask, and
    mixtures), drops _mask tensors, turns -0.0 into +0.0, and removes a sparsity_config from a
    carried config.json so loaders see an ordinary dense model.
    """
    if output is None and not in_place:
        usage_error("give -o OUTPUT (or --in-place to replace the input)")
    in_place_conflict(checkpoint, output, in_place)
    from sparsetool.ops.densify import densify_checkpoint

    use_workers(workers)
    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = densify_checkpoint(
            checkpoint, output or checkpoint, in_place=in_place, progress=progress
        )
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
        return
    from rich.markup import escape

    if not quiet:
        note_left_out(result.left_out)
    decoded = ", ".join(f"{n} {enc}" for enc, n in sorted(result.decoded.items())) or "none"
    console.print(
        f"densified {plural(result.tensors, 'tensor')} (decoded: {decoded}); "
        f"wrote {escape(str(result.output))}",
        highlight=False,
        soft_wrap=True,
    )
