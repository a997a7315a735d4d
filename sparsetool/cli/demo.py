"""``sparsetool demo``: the toolkit end to end on built-in data, with one summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from sparsetool.cli._output import (
    emit_json,
    err_console,
    failing_cleanly,
    note_reclaimed,
    percent,
    print_table,
)
from sparsetool.cli._params import (
    json_option,
    output_option,
    quiet_option,
    seed_option,
    threads_option,
    use_threads,
)
from sparsetool.demo import DEFAULT_FINETUNE_STEPS, DEFAULT_OUTPUT, DEFAULT_STEPS, SPARSITY
from sparsetool.util.wording import plural

EXAMPLES = (  # the end of --help: each runs as written
    "sparsetool demo -o demo",
    "sparsetool demo -o demo-quick --steps 100 --finetune-steps 30 --quiet",
    "sparsetool demo -o demo-seed1 --seed 1 --json",
)

HEADER = [
    "model",
    "targeted sparsity",
    "train FLOPs vs dense",
    "perplexity Python",
    "perplexity English",
]
LABELS = {
    "dense": "dense",
    "sparse": f"{SPARSITY:.0%} sparse",
    "finetuned": "sparse -> dense fine-tuned",
}
KIND_LABELS = {
    "Q": "Q",
    "K": "K",
    "V": "V",
    "QKV": "QKV",
    "attn_out": "attention out",
    "ffn_in": "FFN in",
    "ffn_out": "FFN out",
    "other": "other",
}


def demo(
    output: Path | None = output_option(
        f"Directory for the three runs, the plots and summary.json [default: {DEFAULT_OUTPUT}]. "
        "It must be new, empty or an earlier demo's output (which is replaced)."
    ),
    steps: int = typer.Option(
        DEFAULT_STEPS,
        "--steps",
        min=1,
        metavar="N",
        help="Pre-training steps of each of the dense and the sparse model.",
    ),
    finetune_steps: int = typer.Option(
        DEFAULT_FINETUNE_STEPS,
        "--finetune-steps",
        min=1,
        metavar="N",
        help="Dense fine-tuning steps on the English text.",
    ),
    seed: int = seed_option("Seed for weights, masks and data order."),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(
        "Print the summary as JSON on stdout (as summary.json; no progress)."
    ),
    threads: int | None = threads_option(),
) -> None:
    """Run the whole toolkit end to end on built-in data and print one summary table.

    Pre-trains a small dense GPT and a static 75%-sparse one with the same budget on Python's
    own source, fine-tunes the sparse one densely on Python's English help topics (SPDF),
    evaluates all three on held-out Python and English, compares the sparse pre-trained and the
    fine-tuned weights (angular distance per layer and matrix) and counts each run's training
    FLOPs. With the defaults it takes 1.5-2 minutes on 2 CPU cores; nothing is downloaded.
    """
    from sparsetool.demo import run_demo

    out = output if output is not None else Path(DEFAULT_OUTPUT)
    use_threads(threads)
    with failing_cleanly(), _Progress(enabled=not (quiet or as_json)) as progress:
        summary = run_demo(
            out,
            steps=steps,
            finetune_steps=finetune_steps,
            seed=seed,
            threads=threads,
            progress=progress,
        )
    note_reclaimed(summary.reclaimed)
    if as_json:
        emit_json(summary)
        return
    _render(summary)


class _Progress:
    """One bar per phase on a terminal; otherwise one line per finished phase (stderr)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.current: dict = {}

    def __enter__(self) -> _Progress | None:
        if not self.enabled:
            return None
        if err_console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[note]}"),
                TimeElapsedColumn(),
                console=err_console,
            )
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, kind: str, info: dict) -> None:
        key = info["phase"]
        if kind == "phase":
            self.current = info
            if self.bar is not None:
                self.tasks[key] = self.bar.add_task(
                    f"[{info['index']}/{info['phases']}] {info['title']}",
                    total=info["total"],
                    note="",
                )
        elif kind == "step":
            self.current.update(loss=info.get("loss"), total=info["total"])
            if self.bar is not None:
                note = f"loss {info['loss']:.3f}" if "loss" in info else ""
                self.bar.update(
                    self.tasks[key], completed=info["done"], total=info["total"], note=note
                )
        elif kind == "done" and self.bar is None:
            c = self.current
            loss = f", loss {c['loss']:.4f}" if c.get("loss") is not None else ""
            err_console.print(
                f"[{c['index']}/{c['phases']}] {c['title']}: {c['total']:,} "
                f"{c['unit']}{loss}, {info['seconds']:.1f} s",
                highlight=False,
                markup=False,
                soft_wrap=True,
            )


def _render(s: dict) -> None:
    cells = [
        [
            LABELS.get(m["name"], m["name"]),
            percent(m["targeted_sparsity"], 1),
            f"{m['train_flops_ratio']:.3f}",
            f"{m['perplexity']['python']:.3f}",
            f"{m['perplexity']['english']:.3f}",
        ]
        for m in s["models"]
    ]
    print_table(HEADER, cells)
    d = s["diff"]
    kinds = ", ".join(f"{KIND_LABELS.get(k, k)} {v:.4f}" for k, v in d["by_kind"].items())
    held = s["heldout"]
    lines = [
        f"angular distance sparse -> fine-tuned, 1 - cos over all {d['numel']:,} targeted weights: "
        f"{d['angular_distance']:.4f} ({kinds}); {plural(d['revived'], 'weight')} revived, "
        f"rel L2 {d['rel_l2']:.4f}",
        "train FLOPs: sparsetool.flops for each run's shapes, sparsity and tokens; fine-tuned = "
        "(sparse pre-training + dense fine-tuning) / (dense pre-training + the same fine-tuning)",
        f"perplexity per byte on held-out text: Python {held['python']['bytes']:,} bytes, English "
        f"{held['english']['bytes']:,} bytes ({Path(held['python']['file']).parent})",
        f"{s['settings']['steps']:,} pre-training and {s['settings']['finetune_steps']:,} "
        f"fine-tuning steps; {s['seconds']:.1f} s; plots: {s['files']['perplexity_plot']}, "
        f"{s['files']['angular_distance_plot']}, */loss.png; summary: {s['files']['summary']}",
    ]
    for line in lines:
        typer.echo(line)
