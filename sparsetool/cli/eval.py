"""``sparsetool eval``: perplexity and bits per byte of one or more checkpoints on the same text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    face_option,
    json_option,
    max_memory_option,
    quiet_option,
    threads_option,
    use_device,
    use_threads,
)
from sparsetool.ops.eval_options import EvalOptions, TasksOptions


def counted_option(name: str) -> Any:
    """A whole-number option of :class:`TasksOptions` whose least value (``minimum``) typer
    checks, as --help shows."""
    value, shown = TasksOptions.face(name)
    return typer.Option(value, shown.flag, min=shown.limits["minimum"], help=shown.help)


# eval's options, each made once from its record's field (typer reads them as defaults)
OPTIONS = {
    **{n: face_option(EvalOptions, n) for n in ("text", "seq", "stride", "max_tokens", "batch")},
    **{n: face_option(TasksOptions, n) for n in ("tasks", "offline", "include_path")},
    "log_samples": face_option(TasksOptions, "log_samples"),
    "limit": counted_option("limit"),
    "num_fewshot": counted_option("num_fewshot"),
    **{n: face_option(EvalOptions, n) for n in ("dtype", "device", "plot")},
    "seed": face_option(TasksOptions, "seed"),
}

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
    text: Path | None = OPTIONS["text"],
    seq: int | None = OPTIONS["seq"],
    stride: int | None = OPTIONS["stride"],
    max_tokens: str | None = OPTIONS["max_tokens"],
    batch: int = OPTIONS["batch"],
    dtype: ComputeDType = OPTIONS["dtype"],
    device: str = OPTIONS["device"],
    max_memory: str | None = max_memory_option(),
    as_json: bool = json_option('Print {"text": ..., "checkpoints": [...]} on stdout.'),
    plot: Path | None = OPTIONS["plot"],
    quiet: bool = quiet_option(),
    tasks: str | None = OPTIONS["tasks"],
    offline: bool = OPTIONS["offline"],
    include_path: Path | None = OPTIONS["include_path"],
    limit: int | None = OPTIONS["limit"],
    num_fewshot: int | None = OPTIONS["num_fewshot"],
    log_samples: Path | None = OPTIONS["log_samples"],
    seed: int | None = OPTIONS["seed"],
    threads: int | None = threads_option(),
) -> None:
    """Perplexity of each checkpoint on the same held-out text, or its accuracy on --tasks.

    Perplexity: mean NLL per predicted token (nats), perplexity = exp(NLL), bits per byte (total
    NLL in bits / UTF-8 bytes of the text), tokens/s (scored tokens over the seconds of scoring, on
    this machine now), and perplexity change vs the first (bits-per-byte change when the
    checkpoints' tokenizers differ). A perplexity from too few tokens to mean much gets a warning.

    Hugging Face models need the hf extra (pip install 'sparsetool[hf]'); their weights are decoded
    by sparsetool, so every encoding (zeros, mask, nan, bitmask) evaluates correctly. Models run
    block by block: one block in memory at a time, as many windows together as the memory allows.

    --tasks scores lm-evaluation-harness tasks (zero-shot, MMLU, generation; --offline with the
    bundled data) on the same engine, each shared context run once, with paired 95% intervals
    against the first checkpoint; it needs the eval extra (pip install 'sparsetool[eval]').
    """
    from sparsetool.cli._tasks import check_options, run

    run_opts, task_opts = check_options(
        {**EvalOptions.pick(locals()), **TasksOptions.pick(locals())}
    )
    use_device(device)
    use_threads(threads)
    if task_opts is not None:
        return run(checkpoints, task_opts, run_opts, as_json=as_json, quiet=quiet)
    from sparsetool.ops.eval import evaluate, plot_eval

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = evaluate(
            checkpoints,
            run_opts,
            progress=progress,
            on_plan=plan_printer(not (as_json or quiet)),
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
