"""``sparsetool shrink``: structured compression into a smaller dense model."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    log_line,
    note_left_out,
    note_reclaimed,
    plan_printer,
    print_table,
    progress_bar,
)
from sparsetool.cli._params import (
    ComputeDType,
    checkpoint_argument,
    choices,
    face_choice,
    face_option,
    json_option,
    output_option,
    quiet_option,
    threads_option,
    usage_error,
    usage_errors,
    use_device,
    use_threads,
)
from sparsetool.ops.shrink.options import BLOCK_CRITERIA, CRITERIA, ShrinkOptions

if TYPE_CHECKING:
    from sparsetool.ops.shrink.results import ParamsSearch, ShrinkResult

if TYPE_CHECKING:  # a choice's name to the type checker; typer reads the choices made below
    Criterion = str
    BlockCriterion = str
else:
    Criterion = choices("Criterion", CRITERIA)
    BlockCriterion = choices("BlockCriterion", BLOCK_CRITERIA)


EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool shrink qwen3-moe/ -o qwen3-moe-half/ --experts 0.5 --calibration text.txt",
    "sparsetool shrink llama/ -o llama-mix/ --blocks 4 --ffn 0.75 --calibration text.txt",
    "sparsetool shrink llama/ -o llama-3q/ --params 0.75 --calibration text.txt",
)


def _option(name: str) -> Any:
    """The typer option of :class:`ShrinkOptions`' field ``name``: its default, flag, metavar,
    help and check from the record (a choice as its Enum)."""
    if name in CHOICES:
        return face_choice(ShrinkOptions, CHOICES[name], name)
    return face_option(ShrinkOptions, name)


CHOICES = {"criterion": Criterion, "block_criterion": BlockCriterion}
OPTION = {name: _option(name) for name in ShrinkOptions.defaults()}
"""Each option of the command, made once from the record's fields."""


def shrink(
    checkpoint: Path = checkpoint_argument(),
    output: Path | None = output_option("Where to write the smaller model (a new directory)."),
    experts: float | None = OPTION["experts"],
    experts_keep: int | None = OPTION["experts_keep"],
    criterion: Criterion = OPTION["criterion"],
    blocks: float | None = OPTION["blocks"],
    block_criterion: BlockCriterion = OPTION["block_criterion"],
    ffn: float | None = OPTION["ffn"],
    heads: float | None = OPTION["heads"],
    hidden: float | None = OPTION["hidden"],
    multiple_of: int = OPTION["multiple_of"],
    params: str | None = OPTION["params"],
    candidates: int = OPTION["candidates"],
    reconstruct: bool = OPTION["reconstruct"],
    merge: bool = OPTION["merge"],
    calibration: Path | None = OPTION["calibration"],
    text_field: str = OPTION["text_field"],
    samples: int = OPTION["samples"],
    seq: int | None = OPTION["seq"],
    seed: int = OPTION["seed"],
    device: str = OPTION["device"],
    dtype: ComputeDType = OPTION["dtype"],
    max_memory: str | None = OPTION["max_memory"],
    quiet: bool = quiet_option(),
    threads: int | None = threads_option(),
    as_json: bool = json_option(),
) -> None:
    """Remove experts, blocks or widths (FFN, heads, hidden) into a smaller dense model.

    Everything is scored on the calibration text block by block (one block in memory; each block
    sees what the already-shrunk earlier blocks feed it). --experts F removes the lowest-scoring
    experts of a Mixture-of-Experts model, the same number in every layer (and router group): the
    kept experts renumbered, the router's rows of the removed ones gone, config.json's expert count
    lowered; its logits are the input's with the removed experts' router logits at -inf. --blocks N
    removes N whole transformer blocks of any causal LM, renumbers the rest and lowers config.json's
    layer count; each removed run becomes a least-squares linear map folded into the down projection
    of the block before it (ReplaceMe; --no-reconstruct: removed only). --ffn F, --heads F and
    --hidden F narrow every layer alike (channels and heads ranked by their activations), refit what
    reads the kept ones by least squares, and write the new widths into config.json. --blocks
    combines with them (the blocks go first). --params F (or N) asks for a size instead and
    chooses the cuts by measurement: each kind alone, then the mixes predicted best, each made
    and scored on calibration text it never ran; the best is written and a table shows them all.
    Every refit's damping is chosen on held-back calibration windows, and a cut no refit
    improves there is kept plain.

    The output is a Hugging Face directory of the same architecture that transformers loads as it
    is (every other tensor and the tokenizer copied); what was kept, every score and every refit
    are recorded in its provenance and --json. The input is a Hugging Face directory (a checkpoint
    of sparsetool train is refused) and is never modified; the output appears only when complete.
    """
    if output is None:
        usage_error("give -o OUTPUT, a new directory for the smaller model")
    assert output is not None  # usage_error raised
    with usage_errors():
        opts = ShrinkOptions.from_values(**ShrinkOptions.pick(locals()))  # as the API does
        opts.validate()
    use_device(device)
    use_threads(threads)
    from sparsetool.ops.shrink import shrink_checkpoint

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = shrink_checkpoint(
            checkpoint,
            output,
            opts,
            progress=progress,
            on_plan=plan_printer(not (as_json or quiet)),
            on_search=None if as_json or quiet else _say_search,
        )
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
        return
    print_result(result, quiet)


def _say_search(search: ParamsSearch) -> None:
    for line in search.plan_lines():
        log_line(line)


def print_result(result: ShrinkResult, quiet: bool) -> None:
    """What was removed (with --experts, per layer unless ``quiet``; with --params, the
    candidates), the notes, the output."""
    if result.search is not None:
        print_table(
            ["candidate (* chosen)", "made as", "parameters", "predicted loss", "loss", "s"],
            result.search.rows(),
            title=f"--params: the candidates (loss: nats/token on {result.search.windows} "
            "windows of calibration text none was fitted on; ! misses the budget by over 1%)",
        )
    if result.plan is not None and not quiet:
        print_table(
            ["block", "removed", "lowest kept", "highest removed"],
            result.expert_rows(),
            title=f"experts removed per layer (of {result.plan.experts}; saliency on either side "
            "of the cut)",
        )
    console.print(result.summary(), highlight=False, soft_wrap=True)
    if not quiet:
        note_left_out(result.left_out)
        for note in result.notes:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)
