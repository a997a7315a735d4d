"""The run directory as the training loop sees it: whether a new run may start there, the stored
options a ``--resume`` continues with, the state restored from the latest checkpoint, what one
save writes (:func:`save`, :func:`write_run_json`), the summary a run returns, and the messages
after an interruption; :class:`RunState`, where a run stands (what state.json saves and a resume
restores); :class:`TrainerView`, what these read from the trainer. The files themselves (their
layout and formats) are written and read by :mod:`sparsetool.train.runfiles`.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from sparsetool.errors import CheckpointError, ConfigError, Interrupted
from sparsetool.train import hfrun, runfiles
from sparsetool.train.signals import signal_number
from sparsetool.train.trainconfig import (
    REBATCHABLE,
    RESUMABLE_OVERRIDES,
    TrainConfig,
    setting,
    validate,
)
from sparsetool.util.wording import plural

__all__ = [
    "NullLog",
    "RunState",
    "TrainerView",
    "check_new_run",
    "earlier_settings",
    "interrupted",
    "meta",
    "restore",
    "restore_sharded",
    "resume_command",
    "resumed_config",
    "save",
    "save_step",
    "stopped_by_signal",
    "summary",
    "title",
    "write_run_json",
]


@dataclass
class RunState:
    """Where a run stands: the trainer advances it after each step; a checkpoint's state.json
    saves its first five fields (:func:`save`) and a resume restores them (:func:`restore`)."""

    step: int = 0  # optimizer steps done
    position: int = 0  # the data position: sequences of the global batch read so far
    tokens: int = 0  # tokens trained on
    elapsed_before: float = 0.0  # seconds trained before this process began (a resumed run)
    stage: int = 0  # the stage of the step in progress (0-based)
    stop: int = 0  # the step the run ends after: --stop-at or --steps, or where a signal stopped it
    loss: float = math.nan  # the last step's training loss (averaged over ranks)
    val_loss: float | None = None  # the last validation loss
    interrupted: str | None = None  # the signal that ended the run early, with a checkpoint
    started: float = 0.0  # time.perf_counter() when this process's training loop began

    def elapsed(self) -> float:
        """Seconds of training: this process's and those before a resume."""
        return self.elapsed_before + time.perf_counter() - self.started


class TrainerView(Protocol):
    """What the run directory reads from the trainer (:class:`sparsetool.train.loop.Trainer`) to
    restore a checkpoint, save one, write run.json and make the summary; it changes none of it."""

    cfg: TrainConfig
    run_dir: Path
    resume_from: Path | None  # the checkpoint a resume continues from
    model_cfg: Any  # the model's shape: a GPTConfig, or a Hugging Face run's HFModelInfo
    hf: hfrun.HFModel | None  # a Hugging Face run's model directory, None for sparsetool's GPT
    corpus_info: dict  # what the data is (run.json's "data")
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    targets: dict[str, torch.Tensor]  # the targeted parameters
    log: Any  # runfiles.Log on rank 0, NullLog elsewhere
    sparsifier: Any  # the stage's sparsifier, None while dense
    sparsifier_config: dict | None  # the mapping it was built from
    resolved_settings: dict[int, dict]  # stage (1-based) -> resolved sparse settings
    mask_divergences: int
    world: int
    master: bool
    sharded: bool
    plots: bool  # matplotlib is there: loss.png is drawn at each save

    @property
    def global_batch(self) -> int: ...

    @property
    def num_params(self) -> int: ...

    def sparsity(self) -> float: ...

    def rank_mask_digests(self) -> list[str] | None: ...


def check_new_run(run_dir: Path) -> None:
    """Refuse to start a new run over a run directory or a non-empty directory."""
    if (run_dir / "run.json").exists():
        # A run stopped before its first checkpoint left nothing to keep: it starts again.
        if (run_dir / "latest").exists():
            raise ConfigError(
                f"{run_dir} already holds a run; add --resume to continue "
                "it or pick another -o/--output"
            )
    elif run_dir.exists() and any(run_dir.iterdir()):
        raise ConfigError(f"-o/--output {run_dir} exists and is not empty; pick a new directory")


def resumed_config(run_dir: Path, flags: dict) -> tuple[TrainConfig, dict | None, Path]:
    """The stored run's options (with the flags a resume may change), its model shape and the
    checkpoint to continue from. Any other flag that differs from the stored run is an error."""
    path = run_dir / "run.json"
    if not path.exists():
        raise ConfigError(f"--resume: {path} not found; is {run_dir} a run directory?")
    saved = json.loads(path.read_text())
    stored = TrainConfig.from_dict(saved["config"])
    stored.stop_at = None  # the interruption point is not part of the run; runs to the end
    for k, v in flags.items():
        if (
            v is None
            or k in ("out",)
            or (k in ("stages", "sparsity_options", "include", "exclude") and not v)
        ):
            continue
        if k in RESUMABLE_OVERRIDES or (k in REBATCHABLE and stored.distributed == "fsdp"):
            setattr(stored, k, v)  # a new split of the global batch is checked by restore
        elif getattr(stored, k) != v:
            raise ConfigError(
                f"--resume continues the stored run exactly; {setting(k)} "
                f"{v!r} differs from its {getattr(stored, k)!r} (start a new run to change it)"
            )
    return validate(stored), saved.get("model"), runfiles.latest_checkpoint(run_dir)


def earlier_settings(run_dir: Path, stage_idx: int, resumed: Path | None) -> dict[int, dict]:
    """The resolved sparse-training settings ``run.json`` holds for stages before ``stage_idx``
    (0-based) when the run is ``resumed`` (a resumed run keeps them and adds its own), else {}."""
    if resumed is None:
        return {}
    try:
        saved = json.loads((run_dir / "run.json").read_text()).get("sparse_training") or {}
    except (OSError, ValueError):
        return {}
    return {int(k): v for k, v in saved.items() if int(k) <= stage_idx}


def restore(checkpoint: Path, world: int, cfg: TrainConfig) -> tuple[RunState, dict, dict]:
    """(run state, resume, weights) of a checkpoint directory; the global RNG state is set back.
    The number of processes must be the one the run was trained on (the global batch)."""
    state, resume = runfiles.load_resume(checkpoint)
    weights, _, _ = runfiles.read_init_checkpoint(checkpoint / "model.safetensors")
    runfiles.set_rng_state(state["rng"])
    return _run_state(state, world, cfg), resume, weights


def restore_sharded(trainer: TrainerView) -> tuple[RunState, dict]:
    """(run state, resume) of an FSDP run's latest checkpoint (``trainer.resume_from``), its weights
    and AdamW state loaded into the trainer's model and optimizer, resharded to this number of
    processes; the global RNG state is set back."""
    from sparsetool.train import shardedckpt

    checkpoint = trainer.resume_from
    if checkpoint is None:  # only a resumed run restores
        raise AssertionError("no checkpoint to resume from")
    path = checkpoint / "state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} cannot be read ({e}); resume from an earlier checkpoint"
        ) from None
    run = _run_state(state, trainer.world, trainer.cfg)  # before anything is loaded
    resume = shardedckpt.restore(
        checkpoint,
        model=trainer.model,
        optimizer=trainer.optimizer,
        params=dict(trainer.model.named_parameters()),
    )
    runfiles.set_rng_state(state["rng"])
    return run, resume


def _run_state(state: dict, world: int, cfg: TrainConfig) -> RunState:
    """Where the saved ``state`` stands, checked to continue with the same global batch
    (sequences per step over every process and micro-batch)."""
    saved_world = int(state.get("world_size", 1))
    before = int(state.get("global_batch", saved_world * cfg.batch_size * cfg.grad_accum))
    now = world * cfg.batch_size * cfg.grad_accum
    if before != now:
        how = (
            "with the same number of processes"
            if cfg.distributed != "fsdp"
            else "with --batch-size x --grad-accum x processes equal to it"
        )
        raise ConfigError(
            f"this run was trained on {plural(saved_world, 'process', 'processes')} with a global "
            f"batch of {before} sequences, now {now} ({world} x --batch-size {cfg.batch_size} x "
            f"--grad-accum {cfg.grad_accum}); resume it {how} so the global batch stays the same"
        )
    return RunState(
        step=int(state["step"]),
        position=int(state["data_position"]),
        tokens=int(state["tokens"]),
        elapsed_before=float(state["elapsed_s"]),
        stage=int(state["stage"]),
    )


def save_step(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    model_cfg: dict,
    optimizer: torch.optim.Optimizer,
    sparsifier: Any,
    sparsifier_config: dict | None,
    meta: dict,
    state: dict,
    keep_last: int,
    write_files=None,
) -> None:
    """One checkpoint: the model (masks in the ``mask`` encoding), the optimizer and sparsifier
    state for an exact resume, and ``state`` (step, data position, RNG...)."""
    resume = {
        "optimizer": optimizer.state_dict(),
        "sparsifier": sparsifier.state_dict() if sparsifier is not None else None,
        "sparsifier_config": json.dumps(sparsifier_config) if sparsifier is not None else None,
    }
    masks = dict(sparsifier.masks) if sparsifier is not None else {}
    runfiles.save_checkpoint(
        run=run_dir,
        step=step,
        model=model,
        masks=masks,
        meta=meta,
        model_cfg=model_cfg,
        resume=resume,
        state=state,
        keep_last=keep_last,
        write_files=write_files,
    )


def title(cfg: TrainConfig, run_dir: Path, n_layer: int, d_model: int, sparse: bool) -> str:
    """The loss plot's title: what it trains, the model size and the run directory's name.

    >>> title(
    ...     TrainConfig(algorithm="rigl", sparsity=0.75, steps=600), Path("runs/rigl"), 4, 128, True
    ... )
    'rigl, sparsity 75%, 4L d128, 600 steps (run rigl)'
    """
    what = "dense"
    if cfg.stages:
        what = "stages " + " -> ".join(f"{s:g}:{f:g}" for s, f in cfg.stages)
    elif cfg.dense:
        what = "dense from init"
    elif sparse or cfg.algorithm not in (None, "dense"):
        level = cfg.sparsity
        what = f"{cfg.algorithm or 'static'}" + (
            f", sparsity {float(level):.0%}"
            if isinstance(level, (int, float, str)) and _is_number(level)
            else ""
        )
    return f"{what}, {n_layer}L d{d_model}, {cfg.steps} steps (run {run_dir.name})"


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def resume_command(run_dir: Path, world: int = 1) -> str:
    """The command that continues the run in ``run_dir`` (under torchrun with ``world``
    processes)."""
    launch = "sparsetool" if world == 1 else f"torchrun --nproc_per_node {world} -m sparsetool"
    return f"{launch} train -o {shlex.quote(str(run_dir))} --resume"


def stopped_by_signal(summary: dict) -> str:
    """The line after a signal stopped a run (``summary["interrupted"]`` names it) with a
    checkpoint at the step it had reached."""
    run_dir, step = Path(summary["run_dir"]), summary["step"]
    return (
        f"interrupted by {summary['interrupted']} at step {step} of {summary['steps']}: saved a "
        f"checkpoint ({run_dir / 'checkpoints' / runfiles.checkpoint_name(step)}); continue with: "
        f"{resume_command(run_dir, summary['world_size'])}"
    )


def interrupted(
    run_dir: Path, step: int, world: int = 1, first: str | None = None, second: str | None = None
) -> Interrupted:
    """The error for a stop during ``step`` (0-based) without a checkpoint of it: Ctrl-C where no
    handler of the loop's was installed, or the ``second`` signal after the ``first`` (names);
    it names the checkpoint to resume from. Exit code: 128 + the first signal's number."""
    if first is None or second is None:
        cause = "interrupted"
    elif second == first:
        cause = f"stopped at once by a second {second}"
    else:
        cause = f"stopped at once by {second} after {first}"
    pointer = run_dir / "latest"
    where = (
        f"the last checkpoint ({pointer.read_text().strip()}) is in {run_dir}; continue with: "
        f"{resume_command(run_dir, world)}"
        if pointer.exists()
        else "no checkpoint had been written yet; the same command starts the run again"
    )
    return Interrupted(
        f"{cause} during step {step + 1}; {where}", exit_code=128 + signal_number(first or "SIGINT")
    )


class NullLog:
    """The log of a rank that is not rank 0: records nothing."""

    records: list = []

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------- what a trainer writes and returns
# These read the trainer's public state (:class:`TrainerView`) and never change it.


def meta(trainer: TrainerView, step: int) -> dict:
    """The ``sparsetool`` metadata entry of a checkpoint saved at ``step``."""
    return {
        "producer": "sparsetool train",
        "format_version": runfiles.FORMAT_VERSION,
        "encoding": "mask" if trainer.sparsifier is not None else "plain",
        "step": step,
        "model": trainer.model_cfg.to_dict(),
        "algorithm": (trainer.sparsifier_config or {}).get("algorithm")
        if trainer.sparsifier
        else "dense",
        "sparsity": round(trainer.sparsity(), 6),
        "targeted": sorted(trainer.targets),
    }


def save(trainer: TrainerView, run: RunState) -> None:
    """A checkpoint at ``run.step`` (rank 0 only; every rank together for an FSDP run): weights,
    optimizer, sparsifier, data position and RNG, so that ``--resume`` continues exactly; then
    RUN/model/ of a Hugging Face run, log.csv and loss.png."""
    if not (trainer.master or trainer.sharded):
        return
    step = run.step
    state = {
        "step": step,
        "data_position": run.position,
        "tokens": run.tokens,
        "elapsed_s": run.elapsed(),
        "stage": run.stage,  # the stage whose sparsifier state is saved
        "sparse": trainer.sparsifier is not None,
        "rng": runfiles.rng_state(),
        "world_size": trainer.world,
        "global_batch": trainer.global_batch,
    }
    if trainer.sharded:
        _save_sharded(trainer, step, state)
        if trainer.master:
            _save_plots(trainer)
        return
    save_step(
        trainer.run_dir,
        step,
        model=trainer.model,
        model_cfg=trainer.model_cfg.to_dict(),
        optimizer=trainer.optimizer,
        sparsifier=trainer.sparsifier,
        sparsifier_config=trainer.sparsifier_config,
        meta=meta(trainer, step),
        state=state,
        keep_last=trainer.cfg.keep_last,
        write_files=trainer.hf.write_files if trainer.hf else None,
    )
    if trainer.hf:
        trainer.hf.export(
            trainer.run_dir,
            trainer.model,
            dict(trainer.sparsifier.masks) if trainer.sparsifier else {},
            trainer.cfg.encoding,
            meta(trainer, step),
            trainer.model_cfg.dtype,
        )
    _save_plots(trainer)


def _save_sharded(trainer: TrainerView, step: int, state: dict) -> None:
    """An FSDP run's checkpoint and RUN/model/, every rank taking part (:mod:`.shardedckpt`)."""
    from sparsetool.train import shardedckpt

    shardedckpt.save(
        trainer.run_dir,
        step,
        model=trainer.model,
        optimizer=trainer.optimizer,
        sparsifier=trainer.sparsifier,
        sparsifier_config=trainer.sparsifier_config,
        meta=meta(trainer, step),
        model_cfg=trainer.model_cfg.to_dict(),
        state=state,
        keep_last=trainer.cfg.keep_last,
        master=trainer.master,
        write_files=trainer.hf.write_files if trainer.hf else None,
    )
    if trainer.hf:
        trainer.hf.export(
            trainer.run_dir,
            trainer.model,
            dict(trainer.sparsifier.masks) if trainer.sparsifier else {},
            trainer.cfg.encoding,
            meta(trainer, step),
            trainer.model_cfg.dtype,
            write=trainer.master,
        )


def _save_plots(trainer: TrainerView) -> None:
    """log.csv, and loss.png when matplotlib (the ``plot`` extra) is installed: the run's results
    never depend on the optional picture."""
    trainer.log.write_csv(trainer.run_dir)
    if not trainer.plots:
        return
    trainer.log.plot(
        trainer.run_dir,
        title(
            trainer.cfg,
            trainer.run_dir,
            trainer.model_cfg.n_layer,
            trainer.model_cfg.d_model,
            trainer.sparsifier is not None,
        ),
        "token" if trainer.hf else "byte",
    )


def write_run_json(trainer: TrainerView) -> None:
    """run.json: options as given, model, data; each stage's resolved sparse settings."""
    runfiles.write_json(
        trainer.run_dir / "run.json",
        {
            "config": trainer.cfg.to_dict(),
            "model": trainer.model_cfg.to_dict(),
            "data": trainer.corpus_info,
            "sparse_training": {str(k): v for k, v in sorted(trainer.resolved_settings.items())},
        },
    )


def summary(trainer: TrainerView, run: RunState) -> dict:
    """What ``train`` returns (and prints as --json) at the end of ``run``; ``interrupted``: the
    signal that ended the run at ``run.stop`` with a checkpoint, or None."""
    cfg, stop, elapsed = trainer.cfg, run.stop, run.elapsed()
    digests = trainer.rank_mask_digests()
    return {
        "run_dir": str(trainer.run_dir),
        "step": stop,
        "steps": cfg.steps,
        "finished": stop == cfg.steps,
        "loss": round(run.loss, 6),
        "val_loss": None if run.val_loss is None else round(run.val_loss, 6),
        "sparsity": round(trainer.sparsity(), 6),
        "tokens": run.tokens,
        "elapsed_s": round(elapsed, 3),
        "tokens_per_s": round(run.tokens / elapsed, 1) if elapsed > 0 else None,
        "params": trainer.num_params,
        "world_size": trainer.world,
        "masks_identical_across_ranks": None if digests is None else len(set(digests)) == 1,
        "mask_updates_that_diverged": trainer.mask_divergences if trainer.world > 1 else None,
        "checkpoint": str(
            trainer.run_dir / (hfrun.MODEL_DIR if trainer.hf else "model.safetensors")
        ),
        "huggingface": trainer.hf is not None,
        "log": str(trainer.run_dir / "log.jsonl"),
        "plot": str(trainer.run_dir / "loss.png") if trainer.plots else None,
        "interrupted": run.interrupted,
    }
