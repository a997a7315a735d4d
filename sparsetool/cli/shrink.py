"""``sparsetool shrink``: structured compression into a smaller dense model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    note_left_out,
    note_reclaimed,
    plan_printer,
    print_table,
    progress_bar,
)
from sparsetool.cli._params import (
    ComputeDType,
    checked,
    checkpoint_argument,
    choice_option,
    choices,
    compute_dtype_option,
    device_option,
    json_option,
    max_memory_option,
    output_option,
    quiet_option,
    seed_option,
    threads_option,
    usage_error,
    usage_errors,
    use_device,
    use_threads,
    value_of,
)
from sparsetool.ops.calibration import DEFAULT_SAMPLES, TEXT_FIELD_HELP
from sparsetool.ops.shrink.options import BLOCK_CRITERIA, CRITERIA, ShrinkOptions
from sparsetool.ops.text import DEFAULT_FIELD
from sparsetool.util import options
from sparsetool.util.wording import plural

Criterion = choices("Criterion", CRITERIA)
BlockCriterion = choices("BlockCriterion", BLOCK_CRITERIA)


EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool shrink qwen3-moe/ -o qwen3-moe-half/ --experts 0.5 --calibration text.txt",
    "sparsetool shrink llama/ -o llama-minus-4/ --blocks 4 --calibration text.txt",
    "sparsetool shrink llama/ -o llama-narrow/ --ffn 0.75 --hidden 0.75 --calibration text.txt",
)


def shrink(
    checkpoint: Path = checkpoint_argument(),
    output: Path | None = output_option("Where to write the smaller model (a new directory)."),
    experts: float | None = typer.Option(
        None,
        "--experts",
        metavar="F",
        help="Remove this fraction of each Mixture-of-Experts layer's routed experts (0.5: half).",
    ),
    experts_keep: int | None = typer.Option(
        None,
        "--experts-keep",
        metavar="N",
        help="Instead of --experts: the routed experts each layer keeps.",
    ),
    criterion: Criterion = choice_option(
        Criterion,
        "reap",
        "--criterion",
        help="How experts are ranked on the calibration tokens (the lowest go): reap (mean of "
        "routing weight x output norm over the tokens routed to it), frequency (tokens routed), "
        "ean (summed output norm), or random (seeded; needs no text).",
    ),
    blocks: float | None = typer.Option(
        None,
        "--blocks",
        metavar="N",
        help="Instead: remove N whole transformer blocks (a fraction below 1: of the blocks).",
    ),
    block_criterion: BlockCriterion = choice_option(
        BlockCriterion,
        "bi",
        "--block-criterion",
        help="Which blocks --blocks removes: bi (the N of least influence, 1 - mean cosine of "
        "each block's input and output) or angular (the run of N consecutive blocks whose input "
        "and output lie closest in angle).",
    ),
    ffn: float | None = typer.Option(
        None,
        "--ffn",
        metavar="F",
        help="Instead: keep this fraction of every FFN's channels, round(F x d_ff) of them "
        "(ranked by mean |activation|).",
    ),
    heads: float | None = typer.Option(
        None,
        "--heads",
        metavar="F",
        help="Keep this fraction of every layer's attention heads (ranked by their output "
        "norm): round(F x kv-heads) whole key/value groups when F x kv-heads is whole or each "
        "group is one head, else round(F x group size) query heads of every group (a note says "
        "when that is not F of the heads: 0.5 of 9 heads in groups of 3 keeps 6).",
    ),
    hidden: float | None = typer.Option(
        None,
        "--hidden",
        metavar="F",
        help="Keep this fraction of the embedding channels, round(F x hidden size) of them "
        "(ranked by mean |activation| after every norm): embeddings, norms, head and every "
        "projection's side.",
    ),
    reconstruct: bool = typer.Option(
        True,
        "--reconstruct/--no-reconstruct",
        help="--ffn/--heads: refit the projection that reads the kept channels or heads (the "
        "FFN's down projection, attention's output projection) by least squares on the "
        "calibration activations, block after block on what the shrunk blocks before feed it; "
        "--hidden: refit what reads each RMS norm (q/k/v, gate/up) to the kept channels as the "
        "narrower norm gives them; "
        "--blocks: replace each removed run by a least-squares linear map folded into the down "
        "projection of the block before it (ReplaceMe). --no-reconstruct writes the plain "
        "slices and removals.",
    ),
    merge: bool = typer.Option(
        False,
        "--merge",
        help="Fold each removed expert into the kept expert of most similar output (a "
        "routed-frequency-weighted average of their weights) instead of dropping it.",
    ),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        metavar="FILE|DIR",
        help="UTF-8 text (a file, or every file under a directory), or records (.jsonl, "
        ".parquet, .arrow: see --text-field), the model is scored on.",
    ),
    text_field: str = typer.Option(
        DEFAULT_FIELD, "--text-field", metavar="NAME", help=TEXT_FIELD_HELP
    ),
    samples: int = typer.Option(
        DEFAULT_SAMPLES,
        "--samples",
        metavar="N",
        callback=checked(options.check_count),
        help="Calibration windows.",
    ),
    seq: int | None = typer.Option(
        None,
        "--seq",
        metavar="T",
        callback=checked(options.check_count, minimum=2),
        help="Tokens per calibration window. Default: 512, or the model's context if shorter.",
    ),
    seed: int = seed_option("Seed of the windows picked from the text and of --criterion random."),
    device: str = device_option(
        "Where the blocks run: auto (a GPU if there is one), cpu, cuda or cuda:N."
    ),
    dtype: ComputeDType = compute_dtype_option(
        "Precision of the forward passes (the statistics stay float64)."
    ),
    max_memory: str | None = max_memory_option(),
    quiet: bool = quiet_option(),
    threads: int | None = threads_option(),
    as_json: bool = json_option(),
) -> None:
    """Remove whole experts (Mixture of Experts) or whole blocks into a smaller model.

    Each layer's experts are scored on the calibration text block by block (one block in memory;
    each block sees what the already-shrunk earlier blocks feed it) and the lowest-scoring go, the
    same number in every layer (and in every router group). The output is a Hugging Face
    directory of the same architecture that transformers loads as it is: the kept experts
    renumbered, the router's rows of the removed ones gone, config.json's expert count lowered,
    every other tensor and the tokenizer copied. Its logits are the input's with the removed
    experts' router logits at -inf. Kept experts and every saliency are recorded in the output's
    provenance and --json.

    --blocks N removes N whole transformer blocks of any causal LM (the blocks scored on the
    calibration text the same way), renumbers the rest and lowers config.json's layer count.
    --ffn F, --heads F and --hidden F narrow every layer alike (channels and heads ranked by
    their activations on the calibration text) and write the new widths into config.json.
    The input is a Hugging Face directory (a checkpoint of sparsetool train is refused) and is
    never modified; the output appears only when complete.
    """
    if output is None:
        usage_error("give -o OUTPUT, a new directory for the smaller model")
    with usage_errors():
        opts = ShrinkOptions(
            experts=experts,
            experts_keep=experts_keep,
            criterion=value_of(criterion),
            blocks=blocks,
            block_criterion=value_of(block_criterion),
            ffn=ffn,
            heads=heads,
            hidden=hidden,
            reconstruct=reconstruct,
            merge=merge,
            calibration=calibration,
            text_field=text_field,
            samples=samples,
            seq=seq,
            seed=seed,
            dtype=value_of(dtype),
            device=device,
            max_memory=None if max_memory is None else options.parse_size(max_memory),
        )
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
        )
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
        return
    plan = result.plan
    if result.widths is not None:
        w = result.widths
        done = []
        if "ffn" in w:
            done.append(f"FFN channels {w['ffn']['before']:,} -> {w['ffn']['after']:,}")
        if "heads" in w:
            h = w["heads"]
            done.append(
                f"attention heads {h['before']['heads']} -> {h['after']['heads']} (key/value "
                f"heads {h['before']['kv_heads']} -> {h['after']['kv_heads']}; {h['mode']})"
            )
        if "hidden" in w:
            done.append(f"hidden size {w['hidden']['before']:,} -> {w['hidden']['after']:,}")
        if "refit" in w:
            r = w["refit"]
            done.append(
                f"refit by least squares: {', '.join(r['projections'])} (calibration error "
                f"{r['error_before']:.3g} -> {r['error_after']:.3g}, mean over layers)"
            )
        if "refit" in w.get("hidden", {}):
            r = w["hidden"]["refit"]
            done.append(
                f"readers of the narrower norms refit: {', '.join(r['readers'])} (calibration "
                f"error {r['error_before']:.3g} -> {r['error_after']:.3g}, mean over layers)"
            )
        console.print(
            f"narrowed {plural(len(w['layers']), 'layer')}: {'; '.join(done)}; parameters "
            f"{result.parameters_before:,} -> {result.parameters_after:,}",
            highlight=False,
            soft_wrap=True,
        )
    elif result.blocks is not None:
        b = result.blocks
        maps = (b.get("reconstruct") or {}).get("maps", [])
        mapped = "".join(
            f"; blocks {m['run'][0]}-{m['run'][-1]} replaced by a least-squares map folded into "
            f"block {m['folded_into']}'s down projection (calibration error "
            f"{m['error_before']:.3g} -> {m['error_after']:.3g})"
            for m in maps
        )
        console.print(
            f"removed {plural(len(b['removed']), 'block')} of {b['before']} ({b['criterion']}): "
            f"{', '.join(map(str, b['removed']))}{mapped}; parameters "
            f"{result.parameters_before:,} -> {result.parameters_after:,}",
            highlight=False,
            soft_wrap=True,
        )
    else:
        assert plan is not None
        if not quiet:
            print_layers(result.layers, plan.experts)
        console.print(
            f"shrank {plural(len(result.layers), 'layer')}: {plan.experts} -> {plan.keep} routed "
            f"experts each ({opts.criterion}{', merged' if opts.merge else ''}); parameters "
            f"{result.parameters_before:,} -> {result.parameters_after:,}",
            highlight=False,
            soft_wrap=True,
        )
    if not quiet:
        note_left_out(result.left_out)
        for note in result.notes:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)


def print_layers(layers: list[dict], experts: int) -> None:
    """Per layer: the experts removed and the saliencies on either side of the cut."""
    rows = []
    for layer in layers:
        scores = layer["scores"]
        kept_low = min(scores[e] for e in layer["kept"])
        removed_high = max(scores[e] for e in layer["removed"])
        shown = ", ".join(str(e) for e in layer["removed"][:8])
        more = len(layer["removed"]) - 8
        rows.append(
            [
                str(layer["block"]),
                shown + (f" (+{more})" if more > 0 else ""),
                f"{kept_low:.4g}",
                f"{removed_high:.4g}",
            ]
        )
    print_table(
        ["block", "removed", "lowest kept", "highest removed"],
        rows,
        title=f"experts removed per layer (of {experts}; saliency on either side of the cut)",
    )
