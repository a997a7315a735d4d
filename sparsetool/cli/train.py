"""`sparsetool train`: the built-in byte-level GPT trainer with sparse-training algorithms."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

EPILOG = """
    Examples (the built-in corpus is the Python standard library's own source):

    \b
    sparsetool train --out runs/rigl --preset mini --steps 500 --algorithm rigl --sparsity 0.75

    SPDF: sparse pre-training, then dense fine-tuning on other text (revived weights start at 0):

    \b
    sparsetool train --out runs/pre --algorithm static --sparsity 0.75
    sparsetool train --out runs/ft --init runs/pre/model.safetensors --dense --data my_texts/

    Variable SPDF (90% sparse for 80% of the steps, then dense):

    \b
    sparsetool train --out runs/vspdf --stage 0.9:0.8 --stage 0:0.2

    Continue an interrupted run exactly, and run on several processes:

    \b
    sparsetool train --out runs/rigl --resume
    torchrun --nproc_per_node 2 -m sparsetool train --out runs/ddp ...
"""

_ALGOS = "dense|static|gmp|set|rigl|granet|imp"


def train(
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Run directory (created; holds checkpoints, logs, loss.png)."),
    config: Optional[Path] = typer.Option(None, "--config", help="YAML/TOML file with any of these options (flags override); accepts a Model Zoo 'sparsity:' block."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in --out from its latest checkpoint, exactly."),
    preset: Optional[str] = typer.Option(None, "--preset", help="Model size: tiny, mini (default, 0.9M), small (4.9M), base (10M)."),
    n_layer: Optional[int] = typer.Option(None, "--n-layer", help="Override the preset's layer count."),
    n_head: Optional[int] = typer.Option(None, "--n-head", help="Override the preset's head count."),
    d_model: Optional[int] = typer.Option(None, "--d-model", help="Override the preset's width."),
    context: Optional[int] = typer.Option(None, "--context", help="Override the preset's context (bytes per sequence)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Optimizer steps (default 1000)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Sequences per micro-batch per process (default 16)."),
    grad_accum: Optional[int] = typer.Option(None, "--grad-accum", help="Micro-batches per step per process (default 1)."),
    lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate (default 1e-3)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Linear warm-up steps (default 100), then cosine to 10%."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="AdamW decay of linear matrices (default 0.1)."),
    grad_clip: Optional[float] = typer.Option(None, "--grad-clip", help="Global gradient-norm clip (default 1.0; 0 = off)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for weights, masks and data order (default 0)."),
    data: Optional[str] = typer.Option(None, "--data", help="Text file or directory (default: the Python standard library)."),
    algorithm: Optional[str] = typer.Option(None, "--algorithm", "-a", help=f"Sparse training algorithm: {_ALGOS}."),
    sparsity: Optional[float] = typer.Option(None, "--sparsity", "-s", help="Target sparsity (fraction of zeros) of the targeted matrices."),
    distribution: Optional[str] = typer.Option(None, "--distribution", help="Per-layer sparsity: uniform or erk."),
    init_method: Optional[str] = typer.Option(None, "--init-method", help="Initial mask: random or magnitude."),
    update_freq: Optional[int] = typer.Option(None, "--update-freq", help="Steps between mask updates (dynamic algorithms)."),
    update_start: Optional[int] = typer.Option(None, "--update-start", help="First step of mask updates / pruning."),
    update_stop: Optional[int] = typer.Option(None, "--update-stop", help="Last step of mask updates / pruning."),
    drop_fraction: Optional[float] = typer.Option(None, "--drop-fraction", help="Fraction of kept weights dropped and regrown per update."),
    initial_sparsity: Optional[float] = typer.Option(None, "--initial-sparsity", help="GraNet/GMP: sparsity the cubic ramp starts from (e.g. 0.5 for 50%->75%)."),
    sparsity_option: list[str] = typer.Option([], "--sparsity-option", help="KEY=VALUE passed to the algorithm (repeatable), e.g. init_sparsity=0.5."),
    param_filter: list[str] = typer.Option([], "--param-filter", help="Glob of parameter names to sparsify (repeatable; default: the block matrices)."),
    init: Optional[Path] = typer.Option(None, "--init", help="Start from this checkpoint (any sparsetool encoding); keeps its masks."),
    dense: bool = typer.Option(False, "--dense", help="With --init: revive pruned weights at 0 and train densely (SPDF fine-tuning)."),
    stage: list[str] = typer.Option([], "--stage", help="SPARSITY:FRACTION of the steps (repeatable): Variable SPDF, e.g. 0.9:0.8 then 0:0.2."),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Validation every N steps (default 100) and at the end."),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Checkpoint every N steps (default: only at the end)."),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", help="Stop after this step with a checkpoint; continue later with --resume."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: torch's; 1 is often fastest for small models on a busy machine)."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu, cuda or auto (default)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="auto (bf16 autocast on capable GPUs), float32 or bfloat16."),
    as_json: bool = typer.Option(False, "--json", help="Print the final summary as JSON (no progress bar)."),
) -> None:
    """Train the built-in byte-level GPT, dense or with a sparse-training algorithm.

    Writes checkpoints (safetensors, mask encoding), a JSONL/CSV log and loss.png into --out.
    """
    from rich.markup import escape

    from sparsetool.cli._output import console, failing_cleanly

    with failing_cleanly():
        import yaml

        from sparsetool.errors import ConfigError
        from sparsetool.train.config import merge, parse_stage, read_config_file

        file_values = read_config_file(config) if config else {}
        options = {}
        for item in sparsity_option:
            if "=" not in item:
                raise ConfigError(f"--sparsity-option {item!r} is not KEY=VALUE")
            k, v = item.split("=", 1)
            options[k.strip()] = yaml.safe_load(v)
        flags = {
            "out": str(out) if out else None, "preset": preset, "n_layer": n_layer, "n_head": n_head,
            "d_model": d_model, "context": context, "steps": steps, "batch_size": batch_size,
            "grad_accum": grad_accum, "lr": lr, "warmup": warmup, "weight_decay": weight_decay,
            "grad_clip": grad_clip, "seed": seed, "data": data, "algorithm": algorithm,
            "sparsity": sparsity, "distribution": distribution, "init_method": init_method,
            "update_freq": update_freq, "update_start": update_start, "update_stop": update_stop,
            "drop_fraction": drop_fraction, "initial_sparsity": initial_sparsity, "param_filter": list(param_filter) or None,
            "sparsity_options": options, "init": str(init) if init else None,
            "dense": dense or None, "stages": [parse_stage(s) for s in stage],
            "eval_every": eval_every, "save_every": save_every, "stop_at": stop_at,
            "device": device, "dtype": dtype, "threads": threads,
        }
        if "out" not in file_values and out is None:
            # bad usage (exit 2), not a failure of the run
            raise typer.BadParameter("a run directory to create or resume is required", param_hint="--out")
        if resume:
            from sparsetool.train.config import TrainConfig

            cfg = TrainConfig(out=str(out) if out else file_values["out"])
        else:
            cfg = merge(file_values, flags)
        from sparsetool.train.loop import train as run_training

        overrides = {k: v for k, v in flags.items() if v is not None} if resume else None
        if as_json:
            summary = run_training(cfg, resume=resume, flag_overrides=overrides)
        else:
            summary = run_training(cfg, resume=resume, callback=_Progress(console, escape),
                                   flag_overrides=overrides)
    if as_json:
        from sparsetool.cli._output import emit_json

        if _is_master():
            emit_json(summary)


train.__doc__ = (train.__doc__ or "") + EPILOG


def _is_master() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


class _Progress:
    """Rich progress bar with loss and tokens/s; one summary table at the end (rank 0 only)."""

    def __init__(self, console, escape) -> None:
        self.console = console
        self.escape = escape
        self.bar = None
        self.task = None
        self.master = _is_master()

    def __call__(self, kind: str, info: dict) -> None:
        if not self.master:
            return
        getattr(self, "_" + kind)(info)

    def _start(self, info: dict) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        m = info["model"]
        sp = f", sparsity {info['sparsity']:.1%}" if info["sparsity"] else ""
        self.console.print(
            f"GPT {m['n_layer']}L d{m['d_model']} h{m['n_head']} ctx {m['context']}: "
            f"{info['params']:,} parameters{sp}; {info['world_size']} process(es), global batch "
            f"{info['global_batch']} x {m['context']} bytes; {info['device']} {info['precision']}",
            highlight=False,
        )
        self.console.print(f"data: {self.escape(info['data']['source'])} "
                           f"({info['data']['train_bytes']:,} train / {info['data']['val_bytes']:,} "
                           f"validation bytes)", highlight=False)
        self.bar = Progress(
            TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  val {task.fields[val]}  sparsity {task.fields[sp]}"
                       "  {task.fields[tps]} tok/s"),
            TimeRemainingColumn(), console=self.console, transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task("train", total=info["stop"], completed=info["start_step"],
                                      loss="-", val="-", sp="-", tps="-")

    def _step(self, r: dict) -> None:
        self.bar.update(self.task, completed=r["step"], loss=f"{r['loss']:.4f}",
                        sp=f"{r['sparsity']:.1%}", tps=f"{r['tokens_per_s']:,.0f}")

    def _eval(self, r: dict) -> None:
        self.bar.update(self.task, val=f"{r['val_loss']:.4f}")

    def _stage(self, r: dict) -> None:
        self.bar.console.print(f"step {r['step']}: stage {r['stage'] + 1}, sparsity now {r['sparsity']:.1%}",
                               highlight=False)

    def _end(self, s: dict) -> None:
        self.bar.stop()
        from rich.table import Table

        t = Table(show_header=False, box=None)
        val = "-" if s["val_loss"] is None else f"{s['val_loss']:.4f}"
        rows = [
            ("steps", f"{s['step']} / {s['steps']}" + ("" if s["finished"] else " (stopped; --resume continues)")),
            ("train loss", f"{s['loss']:.4f}"), ("validation loss", val),
            ("sparsity", f"{s['sparsity']:.1%}"), ("tokens", f"{s['tokens']:,}"),
            ("throughput", f"{s['tokens_per_s']:,.0f} tokens/s" if s["tokens_per_s"] else "-"),
            ("checkpoint", self.escape(s["checkpoint"])), ("log", self.escape(s["log"])),
            ("loss curve", self.escape(s["plot"])),
        ]
        for k, v in rows:
            t.add_row(f"[bold]{k}", v)
        self.console.print(t)
