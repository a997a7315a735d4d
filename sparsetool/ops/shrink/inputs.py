"""What every kind of shrink checks before the long part (the model's config, read alone so usage
errors come before a weight; an output that is not the input and can be written), and the sizes
its result reports after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparsetool.checkpoint import Checkpoint, open_checkpoint
from sparsetool.checkpoint.output_files import check_writable
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.hf import hf_config, import_transformers

__all__ = ["check_output", "model_config", "record_sizes"]


def model_config(path: Path, needs: str) -> tuple[dict, Any]:
    """``path``'s config.json and transformers' config object of it (no weight is read)."""
    with open_checkpoint(path) as ckpt:
        config = ckpt.config
    if config is None:
        raise SparsetoolError(
            f"{path}: no config.json; shrink needs a Hugging Face model directory "
            "(config.json, weights, tokenizer files)"
        )
    transformers = import_transformers("shrinking")
    return config, hf_config(path, config, transformers, command="shrink", needs=needs)


def check_output(path: Path, out: Path) -> None:
    """Refuse ``out`` when it is the input, or cannot be written (before the long part)."""
    if out.exists() and out.resolve() == path.resolve():
        raise UsageError(
            f"-o {out} is the input itself; shrink writes a new model: choose another path"
        )
    check_writable(out, "-o")


def record_sizes(result, ckpt: Checkpoint, out: Path, removed: int) -> None:
    """``result``'s parameters and bytes on disk before and after, ``removed`` parameters gone."""
    result.parameters_before = sum(lt.numel for lt in ckpt.logical)
    result.parameters_after = result.parameters_before - removed
    result.bytes_before = ckpt.nbytes_on_disk
    result.bytes_after = (
        sum((out / s).stat().st_size for s in ckpt.shards) if ckpt.is_dir else out.stat().st_size
    )
