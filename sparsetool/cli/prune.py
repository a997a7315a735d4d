"""``sparsetool prune``: mask the targeted tensors of a checkpoint to a sparsity."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from sparsetool.cli._output import (
    console,
    emit_json,
    err_console,
    failing_cleanly,
    note_left_out,
    note_reclaimed,
    percent,
    plan_printer,
    print_table,
    progress_bar,
    warn,
)
from sparsetool.cli._params import (
    ENCODING_NAMES,
    ComputeDType,
    checkpoint_argument,
    choices,
    exclude_option,
    face_choice,
    face_option,
    in_place_conflict,
    include_option,
    json_option,
    max_memory_option,
    output_option,
    quiet_option,
    sparsity_option,
    threads_option,
    usage_error,
    usage_errors,
    use_device,
    use_threads,
    use_workers,
    workers_option,
)
from sparsetool.masks.distributions import DISTRIBUTIONS
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.util.faces import OptionFace
from sparsetool.util.options import ALLOCATIONS, METHODS, REFINEMENTS, SCOPES
from sparsetool.util.wording import plural

if TYPE_CHECKING:  # str Enums to the type checker; typer reads the choices made below
    from sparsetool.cli._params import Choice as Allocation
    from sparsetool.cli._params import Choice as Distribution
    from sparsetool.cli._params import Choice as Encoding
    from sparsetool.cli._params import Choice as Method
    from sparsetool.cli._params import Choice as Refinement
    from sparsetool.cli._params import Choice as Scope
else:
    Method = choices("Method", METHODS)
    Scope = choices("Scope", SCOPES)
    Distribution = choices("Distribution", DISTRIBUTIONS)
    Encoding = choices("Encoding", ENCODING_NAMES)
    Allocation = choices("Allocation", ALLOCATIONS)
    Refinement = choices("Refinement", REFINEMENTS)


def face(name: str) -> OptionFace:
    """How the option ``name`` of :class:`PruneOptions` shows on the command line."""
    return PruneOptions.face(name)[1]


def record_option(name: str) -> Any:
    """A typer option made from :class:`PruneOptions`' field ``name``."""
    return face_option(PruneOptions, name)


def record_choice(kind: Any, name: str) -> Any:
    """A choice option (``kind``, a :func:`choices` Enum) from :class:`PruneOptions`' field."""
    return face_choice(PruneOptions, kind, name)


EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool prune model/ -o model-75/ --sparsity 0.75",
    "sparsetool prune model.safetensors -o step2.safetensors --fraction 0.2 --encoding mask",
    "sparsetool prune model/ -o model-70/ --sparsity 0.7 --method wanda --calibration text.txt "
    "--allocation owl --refine dsnot",
)


def prune(
    checkpoint: Path = checkpoint_argument(),
    output: Path | None = output_option(),
    sparsity: str | None = sparsity_option(face("sparsity").help),
    fraction: str | None = record_option("fraction"),
    nm: str | None = record_option("nm"),
    method: Method = record_choice(Method, "method"),
    scope: Scope = record_choice(Scope, "scope"),
    distribution: Distribution = record_choice(Distribution, "distribution"),
    seed: int = record_option("seed"),
    encoding: Encoding = record_choice(Encoding, "encoding"),
    include: list[str] = include_option(),
    exclude: list[str] = exclude_option(),
    calibration: Path | None = record_option("calibration"),
    text_field: str = record_option("text_field"),
    samples: int = record_option("samples"),
    seq: int | None = record_option("seq"),
    dampening: str = record_option("dampening"),
    blocksize: int = record_option("blocksize"),
    allocation: Allocation = record_choice(Allocation, "allocation"),
    owl_m: str = record_option("owl_m"),
    owl_lambda: str = record_option("owl_lambda"),
    refine: Refinement = record_choice(Refinement, "refine"),
    dsnot_iterations: int = record_option("dsnot_iterations"),
    dsnot_threshold: str = record_option("dsnot_threshold"),
    expert_min_tokens: int = record_option("expert_min_tokens"),
    device: str = record_option("device"),
    dtype: ComputeDType = record_option("dtype"),
    max_memory: str | None = max_memory_option(),
    in_place: bool = typer.Option(
        False, "--in-place", help="Allow OUTPUT to be the input itself (replaced atomically)."
    ),
    quiet: bool = quiet_option(),
    workers: int | None = workers_option(),
    threads: int | None = threads_option(", with --method wanda or sparsegpt"),
    as_json: bool = json_option(),
) -> None:
    """Prune CHECKPOINT: zero the smallest (or random) weights of every targeted tensor.

    With --method wanda or sparsegpt and --calibration FILE|DIR, the model runs the text block by
    block and each block is pruned from its own inputs (Hugging Face causal LMs, sparsetool's GPT):
    one block is in memory at a time, read from the checkpoint when its turn comes and written as
    it finishes, so any size prunes on the memory of one block plus the activations (the memory
    plan is printed first; a run that cannot fit stops at once).

    Targets are the attention (q/k/v, output) and feed-forward weights inside the transformer
    blocks, each expert's of a mixture of experts a unit of its own; never embeddings, norms,
    biases, routers or the LM head. Already-pruned weights stay pruned.
    A targeted tensor holding NaN or inf is refused (except NaN in a nan-encoded input, which
    means pruned). The input is never modified; the output appears only when complete.
    """
    from sparsetool.ops.prune.pipeline import prune_checkpoint

    values = PruneOptions.pick(locals())
    if output is None and not in_place:
        usage_error("give -o OUTPUT (or --in-place to replace the input)")
    in_place_conflict(checkpoint, output, in_place)
    with usage_errors():
        opts = PruneOptions.from_values(**values)  # as sparsetool.prune makes them
        opts.validate()
    use_device(device)
    use_workers(workers)
    if opts.calibrated:  # only the calibration methods compute with torch
        use_threads(threads)
    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = prune_checkpoint(
            checkpoint,
            output or checkpoint,
            opts,
            in_place=in_place,
            progress=progress,
            on_plan=plan_printer(not (as_json or quiet)),
        )
    note_reclaimed(result.reclaimed)
    if result.not_a_model and not quiet:  # on stderr: --json's output stays whole
        err_console.print(
            f"note: {result.not_a_model}", highlight=False, soft_wrap=True, markup=False
        )
    for warning in result.warnings:  # printed even with --quiet/--json: the output will mislead
        warn(warning)
    if as_json:
        emit_json(result.to_json())
        return
    before = sum(t.nonzero_before for t in result.tensors)
    console.print(
        f"pruned {plural(len(result.tensors), 'tensor')} ({plural(result.numel, 'weight')}): "
        f"targeted sparsity {percent(1 - before / result.numel if result.numel else 0.0)} -> "
        f"[bold]{percent(result.targeted_sparsity)}[/], encoding {opts.encoding}",
        highlight=False,
        soft_wrap=True,
    )
    asked = bool(opts.sparsity or opts.fraction or opts.nm)
    untouched = sum(1 for t in result.tensors if t.numel and t.nonzero == t.nonzero_before)
    if not asked or quiet:
        untouched = 0
    if result.allocation and not quiet:
        print_allocation(result.allocation)
    if result.refined and not quiet:
        console.print(
            f"DSnoT: {plural(result.refined['swaps'], 'swap')} of a pruned weight for a kept one "
            f"(at most {result.refined['iterations']} per row)",
            highlight=False,
            soft_wrap=True,
        )
    if result.experts and not quiet:
        print_experts(result.experts)
    for note in [] if quiet else result.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    if untouched:
        console.print(
            f"note: {plural(untouched, 'tensor')} {'was' if untouched == 1 else 'were'} "
            "already at least as sparse as asked and left as "
            f"{'it was' if untouched == 1 else 'they were'} (pruning never revives a weight)",
            highlight=False,
            soft_wrap=True,
        )
    if not quiet:
        note_left_out(result.left_out)
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)


def print_allocation(blocks: list[dict]) -> None:
    """OWL's plan: each block's outlier ratio and the sparsity it was given."""
    rows = [
        [
            str(b["block"]),
            f"{100 * b['outlier_ratio']:.2f}%",
            percent(b["sparsity"]),
            f"{b['kept']:,} of {b['targeted']:,}",
        ]
        for b in blocks
    ]
    print_table(
        ["block", "outliers", "sparsity", "kept"],
        rows,
        title="OWL allocation (outliers: scores above M x the block's mean)",
    )


def print_experts(experts: dict) -> None:
    """A Mixture of Experts: how many calibration tokens its experts' matrices saw, and which
    were pruned by magnitude for too few."""
    tokens = list(experts["routed_tokens"].values())
    fallback = experts["magnitude"]
    if len(tokens) > len(fallback):
        console.print(
            f"experts: {plural(len(tokens) - len(fallback), 'matrix', 'matrices')} pruned "
            f"from the tokens routed to their expert ({min(tokens):,} to {max(tokens):,} "
            "tokens routed)",
            highlight=False,
            soft_wrap=True,
        )
    if fallback:
        console.print(
            f"note: {plural(len(fallback), 'expert matrix', 'expert matrices')} pruned by "
            f"magnitude: their expert was routed fewer than {experts['min_tokens']} "
            f"calibration tokens (--expert-min-tokens); first: {escape(fallback[0])}",
            highlight=False,
            soft_wrap=True,
        )
