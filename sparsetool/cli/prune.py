"""``sparsetool prune``: mask the targeted tensors of a checkpoint to a sparsity."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sparsetool.cli._output import console, emit_json, failing_cleanly, percent, progress_bar


def prune(
    checkpoint: Path = typer.Argument(..., metavar="CHECKPOINT", help="A .safetensors file or a Hugging Face model directory."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write (same layout as the input)."),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", "-s", help="Fraction of zeros wanted in each targeted tensor, in [0, 1]."),
    fraction: Optional[float] = typer.Option(None, "--fraction", help="Prune this fraction of the REMAINING non-zeros, in [0, 1) (one iterative-pruning step)."),
    nm: Optional[str] = typer.Option(None, "--nm", help="Structured N:M: keep N of every M consecutive weights along the input dimension, e.g. 2:4."),
    method: str = typer.Option("magnitude", "--method", help="magnitude (keep the largest |w|) or random."),
    scope: str = typer.Option("layer", "--scope", help="layer: the same sparsity in every tensor; global: one magnitude threshold across all targeted tensors."),
    distribution: str = typer.Option("uniform", "--distribution", help="uniform or erk (Erdos-Renyi-Kernel per-tensor sparsities, same total non-zeros)."),
    seed: int = typer.Option(0, "--seed", help="Seed for --method random."),
    encoding: str = typer.Option("zeros", "--encoding", help="How pruned weights are stored: zeros, mask (bool <name>_mask tensors), nan (NaN sentinels), bitmask (compressed-tensors sparse-bitmask)."),
    include: List[str] = typer.Option([], "--include", help="Also target tensors whose name matches this glob (repeatable)."),
    exclude: List[str] = typer.Option([], "--exclude", help="Never target tensors whose name matches this glob (repeatable; wins over --include)."),
    in_place: bool = typer.Option(False, "--in-place", help="Allow OUTPUT to be the input itself (replaced atomically)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Prune CHECKPOINT: zero the smallest (or random) weights of every targeted tensor.

    Targets are the attention (q/k/v, output) and feed-forward weights inside the transformer
    blocks; never embeddings, norms, biases or the LM head. Already-pruned weights stay pruned.
    The input is never modified; the output appears only when complete.

    Examples:

    \b
    sparsetool prune model/ -o model-75/ --sparsity 0.75
    sparsetool prune model.safetensors -o step2.safetensors --fraction 0.2 --encoding mask
    sparsetool prune model/ -o model-24/ --nm 2:4
    """
    from sparsetool.ops.prune import PruneOptions, parse_nm, prune_checkpoint

    if output is None and not in_place:
        raise typer.BadParameter("give -o OUTPUT (or --in-place to replace the input)", param_hint="-o")
    with failing_cleanly():
        opts = PruneOptions(
            sparsity=sparsity, fraction=fraction, nm=parse_nm(nm) if nm else None,
            method=method, scope=scope, distribution=distribution, seed=seed,
            encoding=encoding, include=tuple(include), exclude=tuple(exclude),
        )
        with progress_bar(not as_json) as progress:
            result = prune_checkpoint(checkpoint, output or checkpoint, opts,
                                      in_place=in_place, progress=progress)
    if as_json:
        emit_json(result.to_json())
        return
    from rich.markup import escape

    before = sum(t.nonzero_before for t in result.tensors)
    console.print(
        f"pruned {len(result.tensors)} tensors ({result.numel:,} weights): "
        f"targeted sparsity {percent(1 - before / result.numel if result.numel else 0.0)} -> "
        f"[bold]{percent(result.targeted_sparsity)}[/], encoding {opts.encoding}",
        highlight=False, soft_wrap=True,
    )
    asked = bool(opts.sparsity or opts.fraction or opts.nm)
    untouched = sum(1 for t in result.tensors if t.numel and t.nonzero == t.nonzero_before)
    if not asked:
        untouched = 0
    if untouched:
        console.print(f"note: {untouched} tensor(s) were already at least as sparse as asked and "
                      "were left as they were (pruning never revives a weight)",
                      highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)
