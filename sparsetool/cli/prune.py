"""``sparsetool prune``: mask the targeted tensors of a checkpoint to a sparsity."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    note_left_out,
    percent,
    plan_printer,
    print_table,
    progress_bar,
    warn,
)
from sparsetool.cli._params import (
    ENCODING_NAMES,
    ComputeDType,
    checked,
    checkpoint_argument,
    choice_option,
    choices,
    compute_dtype_option,
    device_option,
    exclude_option,
    in_place_conflict,
    include_option,
    json_option,
    max_memory_option,
    output_option,
    quiet_option,
    seed_option,
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
from sparsetool.util import options
from sparsetool.util.options import ALLOCATIONS, METHODS, REFINEMENTS, SCOPES
from sparsetool.util.wording import plural

Method = choices("Method", METHODS)
Scope = choices("Scope", SCOPES)
Distribution = choices("Distribution", DISTRIBUTIONS)
Encoding = choices("Encoding", ENCODING_NAMES)
Allocation = choices("Allocation", ALLOCATIONS)
Refinement = choices("Refinement", REFINEMENTS)


EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool prune model/ -o model-75/ --sparsity 0.75",
    "sparsetool prune model.safetensors -o step2.safetensors --fraction 0.2 --encoding mask",
    "sparsetool prune model/ -o model-70/ --sparsity 0.7 --method wanda --calibration text.txt --allocation owl --refine dsnot",
)


def prune(
    checkpoint: Path = checkpoint_argument(),
    output: Optional[Path] = output_option(),
    sparsity: Optional[str] = sparsity_option(
        "Fraction of zeros wanted in each targeted tensor, from 0 to 1."
    ),
    fraction: Optional[str] = typer.Option(
        None,
        "--fraction",
        metavar="F",
        callback=checked(options.parse_fraction),
        help="Prune this fraction of the REMAINING non-zeros, at least 0 and below 1 (one iterative-pruning step).",
    ),
    nm: Optional[str] = typer.Option(
        None,
        "--nm",
        metavar="N:M",
        callback=checked(options.parse_nm),
        help="Structured N:M: keep N of every M consecutive weights along the input dimension, e.g. 2:4.",
    ),
    method: Method = choice_option(
        Method,
        "magnitude",
        "--method",
        help="magnitude (keep the largest |w|), random, or with --calibration: wanda (|w| times the input's norm, per output row) or sparsegpt (OBS reconstruction; updates the kept weights).",
    ),
    scope: Scope = choice_option(
        Scope,
        "layer",
        "--scope",
        help="layer: the same sparsity in every tensor; global: one magnitude threshold across all targeted tensors.",
    ),
    distribution: Distribution = choice_option(
        Distribution,
        "uniform",
        "--distribution",
        help="uniform or erk (Erdos-Renyi-Kernel per-tensor sparsities, same total non-zeros).",
    ),
    seed: int = seed_option("Seed for --method random."),
    encoding: Encoding = choice_option(
        Encoding,
        "zeros",
        "--encoding",
        help="How pruned weights are stored: zeros, mask (bool <name>_mask tensors), nan (NaN sentinels), bitmask (compressed-tensors sparse-bitmask).",
    ),
    include: List[str] = include_option(),
    exclude: List[str] = exclude_option(),
    calibration: Optional[Path] = typer.Option(
        None,
        "--calibration",
        metavar="FILE|DIR",
        help="UTF-8 text (a file, or every file under a directory) run through the model by --method wanda/sparsegpt.",
    ),
    samples: int = typer.Option(
        128,
        "--samples",
        metavar="N",
        callback=checked(options.check_count),
        help="Calibration windows (wanda/sparsegpt).",
    ),
    seq: Optional[int] = typer.Option(
        None,
        "--seq",
        metavar="T",
        callback=checked(options.check_count, minimum=2),
        help="Tokens per calibration window (wanda/sparsegpt). Default: 512, or the model's context if shorter.",
    ),
    dampening: str = typer.Option(
        "0.01",
        "--dampening",
        metavar="D",
        callback=checked(options.check_dampening),
        help="sparsegpt: add D x the mean diagonal of X^T X to its diagonal.",
    ),
    blocksize: int = typer.Option(
        128,
        "--blocksize",
        metavar="B",
        callback=checked(options.check_count),
        help="sparsegpt: columns per block (lazy updates, one mask choice per block).",
    ),
    allocation: Allocation = choice_option(
        Allocation,
        "uniform",
        "--allocation",
        help="How --sparsity is spread over the transformer blocks: uniform, or owl (each block's sparsity follows its share of outlier Wanda scores, spread over 2 x --owl-lambda around the target; the total stays exact). Needs --calibration; works with magnitude, wanda and sparsegpt.",
    ),
    owl_m: str = typer.Option(
        "5",
        "--owl-m",
        metavar="M",
        callback=checked(options.check_owl_m),
        help="owl: a score above M times its block's mean is an outlier.",
    ),
    owl_lambda: str = typer.Option(
        "0.08",
        "--owl-lambda",
        metavar="L",
        callback=checked(options.check_owl_lambda),
        help="owl: the most and the least pruned block lie 2 x L apart (the paper: 'target +- L').",
    ),
    refine: Refinement = choice_option(
        Refinement,
        "none",
        "--refine",
        help="dsnot: after the mask is chosen, swap pruned and kept weights row by row while that lowers the row's expected output error (no training; exact counts). Needs --calibration; works with magnitude, wanda and sparsegpt.",
    ),
    dsnot_iterations: int = typer.Option(
        50,
        "--dsnot-iterations",
        metavar="T",
        callback=checked(options.check_count, minimum=0),
        help="dsnot: at most T swaps per row.",
    ),
    dsnot_threshold: str = typer.Option(
        "0.1",
        "--dsnot-threshold",
        metavar="E",
        callback=checked(options.check_threshold),
        help="dsnot: a row stops once its expected error (its output summed over a window) is at most E.",
    ),
    expert_min_tokens: int = typer.Option(
        32,
        "--expert-min-tokens",
        metavar="N",
        callback=checked(options.check_count, minimum=0),
        help="wanda/sparsegpt on a Mixture of Experts: each expert's matrices are pruned from the tokens routed to it; one routed fewer than N calibration tokens is pruned by magnitude instead (counted in the output).",
    ),
    device: str = device_option(
        "wanda/sparsegpt: where the blocks run: auto (a GPU if there is one), cpu, cuda or cuda:N."
    ),
    dtype: ComputeDType = compute_dtype_option(
        "wanda/sparsegpt: precision of the forward passes; statistics and the SparseGPT solve stay float32."
    ),
    max_memory: Optional[str] = max_memory_option(),
    in_place: bool = typer.Option(
        False, "--in-place", help="Allow OUTPUT to be the input itself (replaced atomically)."
    ),
    quiet: bool = quiet_option(),
    workers: Optional[int] = workers_option(),
    threads: Optional[int] = threads_option(", with --method wanda or sparsegpt"),
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
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

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
    with failing_cleanly():
        with progress_bar(not (as_json or quiet)) as progress:
            result = prune_checkpoint(
                checkpoint,
                output or checkpoint,
                opts,
                in_place=in_place,
                progress=progress,
                on_plan=plan_printer(not (as_json or quiet)),
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
