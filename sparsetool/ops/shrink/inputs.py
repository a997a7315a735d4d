"""What every kind of shrink checks before the long part (the model's config, read alone so usage
errors come before a weight; sparsetool's own GPT refused; an output that is not the input and
can be written), and the sizes its result reports after.

sparsetool's GPT (``sparsetool train``) is refused by every kind, before any text is read: its
code fixes the FFN at four times the width and the attention at the width (no config of it holds
a narrower layer), and it has no experts. Only ``--blocks`` could apply; it is refused too, so
that every kind of shrink reads and writes one kind of model, a Hugging Face directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparsetool.checkpoint import Checkpoint, open_checkpoint
from sparsetool.checkpoint.output_files import check_writable
from sparsetool.errors import CheckpointError, SparsetoolError, UsageError
from sparsetool.models.hf import hf_config, import_transformers

__all__ = ["check_output", "model_config", "record_sizes"]

GPT_NAMES = {"tok_emb.weight", "pos_emb.weight"}  # sparsetool's GPT, with or without config.json


def model_config(path: Path, needs: str) -> tuple[dict, Any]:
    """``path``'s config.json and transformers' config object of it (no weight is read); a
    checkpoint of sparsetool's GPT is refused in one line, whatever shrink was asked."""
    with open_checkpoint(path) as ckpt:
        config = ckpt.config
        names = {lt.name for lt in ckpt.logical}
        gpt = (config or {}).get("model_type") == "sparsetool-gpt" or GPT_NAMES.issubset(names)
    if gpt:
        raise SparsetoolError(
            f"{path}: a checkpoint of sparsetool's GPT; shrink rewrites Hugging Face model "
            "directories only: for a smaller GPT train one (sparsetool train --n-layer N "
            "--n-head H --d-model D), or prune this one (sparsetool prune)"
        )
    if config is None:
        raise SparsetoolError(
            f"{path}: no config.json; shrink needs a Hugging Face model directory "
            "(config.json, weights, tokenizer files)"
        )
    transformers = import_transformers("shrinking")
    return config, hf_config(path, config, transformers, command="shrink", needs=needs)


def check_output(path: Path, out: Path) -> None:
    """Refuse ``out`` when it is the input, its directory does not exist, or it cannot be written
    (before the long part)."""
    if out.exists() and out.resolve() == path.resolve():
        raise UsageError(
            f"-o {out} is the input itself; shrink writes a new model: choose another path"
        )
    parent = Path(out).absolute().parent
    if not parent.is_dir():  # said now, not by the writer after the calibration pass
        raise CheckpointError(f"output directory {parent} does not exist; create it first")
    check_writable(out, "-o")


def record_sizes(result, ckpt: Checkpoint, out: Path, removed: int) -> None:
    """``result``'s parameters and bytes on disk before and after, ``removed`` parameters gone."""
    result.parameters_before = sum(lt.numel for lt in ckpt.logical)
    result.parameters_after = result.parameters_before - removed
    result.bytes_before = ckpt.nbytes_on_disk
    result.bytes_after = (
        sum((out / s).stat().st_size for s in ckpt.shards) if ckpt.is_dir else out.stat().st_size
    )
