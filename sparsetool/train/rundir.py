"""The run directory as the training loop sees it: whether a new run may start there, the stored
options a ``--resume`` continues with, the state restored from the latest checkpoint, what one
save writes, and the message after an interruption. The files themselves are written and read by
:mod:`sparsetool.train.io`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.train import io
from sparsetool.train.config import RESUMABLE_OVERRIDES, TrainConfig, setting, validate
from sparsetool.wording import plural

__all__ = ["NullLog", "check_new_run", "earlier_settings", "interrupted", "restore", "resumed_config", "save_step",
           "title"]


def check_new_run(run_dir: Path) -> None:
    """Refuse to start a new run over a run directory or a non-empty directory."""
    if (run_dir / "run.json").exists():
        # A run stopped before its first checkpoint left nothing to keep: it starts again.
        if (run_dir / "latest").exists():
            raise ConfigError(f"{run_dir} already holds a run; add --resume to continue "
                              "it or pick another -o/--output")
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
        if v is None or k in ("out",) or (
            k in ("stages", "sparsity_options", "include", "exclude") and not v
        ):
            continue
        if k in RESUMABLE_OVERRIDES:
            setattr(stored, k, v)
        elif getattr(stored, k) != v:
            raise ConfigError(
                f"--resume continues the stored run exactly; {setting(k)} "
                f"{v!r} differs from its {getattr(stored, k)!r} (start a new run to change it)"
            )
    return validate(stored), saved.get("model"), io.latest_checkpoint(run_dir)


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


def restore(checkpoint: Path, world: int, cfg: TrainConfig) -> tuple[dict, dict, dict]:
    """(state, resume, weights) of a checkpoint directory; the global RNG state is set back.
    The number of processes must be the one the run was trained on (the global batch)."""
    state, resume = io.load_resume(checkpoint)
    weights, _, _ = io.read_init_checkpoint(checkpoint / "model.safetensors")
    io.set_rng_state(state["rng"])
    if int(state.get("world_size", 1)) * cfg.batch_size * cfg.grad_accum != \
            world * cfg.batch_size * cfg.grad_accum:
        raise ConfigError(
            f"this run was trained on {plural(int(state.get('world_size', 1)), 'process', 'processes')}; "
            "resume it "
            f"with the same number (now {world}) so the global batch stays the same"
        )
    return state, resume, weights


def save_step(run_dir: Path, step: int, *, model: torch.nn.Module, model_cfg: dict,
              optimizer: torch.optim.Optimizer, sparsifier: Any, sparsifier_config: dict | None,
              meta: dict, state: dict, keep_last: int, write_files=None) -> None:
    """One checkpoint: the model (masks in the ``mask`` encoding), the optimizer and sparsifier
    state for an exact resume, and ``state`` (step, data position, RNG...)."""
    resume = {
        "optimizer": optimizer.state_dict(),
        "sparsifier": sparsifier.state_dict() if sparsifier is not None else None,
        "sparsifier_config": json.dumps(sparsifier_config) if sparsifier is not None else None,
    }
    masks = dict(sparsifier.masks) if sparsifier is not None else {}
    io.save_checkpoint(run_dir, step, model, masks, meta, model_cfg, resume, state, keep_last,
                       write_files)


def title(cfg: TrainConfig, run_dir: Path, n_layer: int, d_model: int, sparse: bool) -> str:
    """The loss plot's title: what it trains, the model size and the run directory's name.

    >>> title(TrainConfig(algorithm="rigl", sparsity=0.75, steps=600), Path("runs/rigl"), 4, 128, True)
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
            f", sparsity {float(level):.0%}" if isinstance(level, (int, float, str))
            and _is_number(level) else "")
    return f"{what}, {n_layer}L d{d_model}, {cfg.steps} steps (run {run_dir.name})"


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def interrupted(run_dir: Path, step: int) -> SparsetoolError:
    """The error for Ctrl-C during ``step`` (0-based), naming the checkpoint to resume from."""
    pointer = run_dir / "latest"
    where = (f"the last checkpoint ({pointer.read_text().strip()}) is in {run_dir}; "
             f"--resume continues from it exactly" if pointer.exists()
             else "no checkpoint had been written yet")
    return SparsetoolError(f"interrupted during step {step + 1}; {where}")


class NullLog:
    """The log of a rank that is not rank 0: records nothing."""

    records: list = []

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass
