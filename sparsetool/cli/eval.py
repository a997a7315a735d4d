"""``sparsetool eval``: perplexity and bits per byte of one or more checkpoints on the same text."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from sparsetool.cli._output import check_plot_path, console, emit_json, failing_cleanly, percent, print_table, progress_bar
from sparsetool.cli._params import choices, json_option, quiet_option, threads_option, tokens_option, use_threads, value_of

DTYPES = ("float32", "bfloat16")

EXAMPLES = (  # the end of --help: each runs as written (given the checkpoints named)
    "sparsetool eval runs/dense runs/static75",
    "sparsetool eval gpt2/ gpt2-50/ gpt2-75/ --text wiki.txt --seq 512 --stride 256 --plot ppl.png",
    "sparsetool eval model-75/ --text docs/ --max-tokens 20K --json",
)
DType = choices("DType", DTYPES)


def eval_command(
    checkpoints: List[Path] = typer.Argument(..., metavar="CHECKPOINT", help="Checkpoints written by sparsetool train (file or run directory) or Hugging Face causal-LM directories (config.json, weights, tokenizer files); the first is the baseline."),
    text: Optional[Path] = typer.Option(None, "--text", help="UTF-8 text file, or a directory of them (joined in name order). Default: the held-out split of the built-in training corpus."),
    seq: Optional[int] = typer.Option(None, "--seq", help="Window length in tokens. Default: the model's context, at most 2048."),
    stride: Optional[int] = typer.Option(None, "--stride", help="Start a window every S tokens (S < --seq: overlapping windows, each scoring only tokens no earlier window scored). Default: --seq (no overlap)."),
    max_tokens: Optional[str] = tokens_option("--max-tokens", "Score only the first N tokens of the text (e.g. 20000 or 20K)."),
    batch: int = typer.Option(1, "--batch", help="Windows per forward pass."),
    dtype: DType = typer.Option("float32", "--dtype", help="Compute precision."),
    as_json: bool = json_option("Print {\"text\": ..., \"checkpoints\": [...]} on stdout."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw perplexity vs targeted sparsity into this PNG."),
    quiet: bool = quiet_option(),
    threads: Optional[int] = threads_option(),
) -> None:
    """Perplexity of each checkpoint on the same held-out text.

    Mean NLL per predicted token (nats), perplexity = exp(NLL), bits per byte (total NLL in bits / UTF-8 bytes of the text), and perplexity change vs the first.

    Hugging Face models need the hf extra (pip install 'sparsetool[hf]'); their weights are decoded
    by sparsetool, so every encoding (zeros, mask, nan, bitmask) evaluates correctly.
    """
    dtype = value_of(dtype)
    from sparsetool.ops.eval import evaluate, plot_eval

    use_threads(threads)
    with failing_cleanly():
        if plot is not None:
            check_plot_path(plot)
        with progress_bar(not (as_json or quiet)) as progress:
            result = evaluate(checkpoints, text=text, seq=seq, stride=stride, max_tokens=max_tokens,
                              batch=batch, dtype=dtype, progress=progress)
        if plot is not None:
            plot_eval(result, plot)
    if as_json:
        emit_json(result.to_json())
        return
    header = ["checkpoint", "targeted sparsity", "non-zero params", "NLL", "perplexity", "bits/byte",
              "tokens", "change"]
    cells = [[r.name, percent(r.targeted_sparsity, 1), f"{r.nonzero_params:,}", f"{r.nll:.4f}",
              f"{r.perplexity:.3f}", f"{r.bits_per_byte:.4f}",
              f"{r.tokens:,}", "baseline" if i == 0 else f"{100 * r.change:+.2f}%"]
             for i, r in enumerate(result.rows)]
    shapes = sorted({(r.seq, r.stride) for r in result.rows})
    footer = f"text: {result.text_source}; windows of " + ", ".join(
        f"{n} tokens" + (f" every {s}" if s != n else "") for n, s in shapes)
    print_table(header, cells)
    typer.echo(footer)
    if plot is not None and not quiet:
        console.print(f"plot: {plot}", highlight=False, soft_wrap=True)
