"""Starting a run from a checkpoint (``--init``): the model shape it implies, its weights, the
masks it carries, and what ``--sparsity`` means next to those masks.

The rule for ``--init SPARSE --sparsity S`` (``s0`` the checkpoint's sparsity over the targeted
tensors): ``S == s0`` (to within one weight per tensor) keeps the masks; ``S > s0`` prunes further
from them by magnitude, never reviving a pruned weight (the sparsifier does it at ``attach``);
``S < s0`` is an error unless ``--dense`` revives every weight on purpose.
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Real
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.errors import ConfigError
from sparsetool.models.gpt import PRESETS, GPTConfig, infer_config
from sparsetool.train.trainconfig import DEFAULT_PRESET, TrainConfig
from sparsetool.util.wording import plural

__all__ = [
    "check_init_is_a_model",
    "check_init_sparsity",
    "init_model_config",
    "matched_weights",
    "loaded_sparsity",
    "mask_origin",
    "masks_from",
]


SHAPE = ("n_layer", "n_head", "d_model", "context")


def check_init_is_a_model(path: str | Path) -> None:
    """Refuse, before its weights are read, a ``--init`` checkpoint that is neither sparsetool's
    GPT nor a Hugging Face model: without config.json the message says so, as eval's and prune's
    do (a Hugging Face directory has already been taken as one)."""
    with open_checkpoint(path) as ckpt:
        if ckpt.config is None and not {"tok_emb.weight", "pos_emb.weight"} <= {
            lt.name for lt in ckpt.logical
        }:
            raise ConfigError(
                f"{path}: no config.json; train --init needs a Hugging Face model directory "
                "(config.json, weights, tokenizer files) or a checkpoint of sparsetool train"
            )


def init_model_config(cfg: TrainConfig, weights: dict[str, torch.Tensor], meta: dict) -> GPTConfig:
    """The model shape of the ``--init`` checkpoint; a shape flag or a ``--preset`` that
    disagrees is an error (a preset that agrees is fine, and gives the head count a checkpoint
    without train's metadata lacks)."""
    preset = PRESETS[cfg.preset or DEFAULT_PRESET]
    head = meta.get("model", {}).get("n_head") or cfg.n_head or preset.n_head
    shapes = {k: tuple(v.shape) for k, v in weights.items()}
    model_cfg = replace(infer_config(shapes, head), dropout=cfg.dropout)
    for k in SHAPE:
        given = getattr(cfg, k)
        if given is not None and given != getattr(model_cfg, k):
            raise ConfigError(
                f"--{k.replace('_', '-')} {given} disagrees with --init {cfg.init} "
                f"({k} {getattr(model_cfg, k)}); the model's shape comes from the checkpoint"
            )
    # the preset's sizes that no shape flag replaces must be the checkpoint's
    own = [k for k in SHAPE if getattr(cfg, k) is None]
    if cfg.preset is not None and any(getattr(preset, k) != getattr(model_cfg, k) for k in own):
        has = ", ".join(f"{k} {getattr(model_cfg, k)}" for k in own)
        raise ConfigError(
            f"--preset {cfg.preset} disagrees with --init {cfg.init} ({has}; {cfg.preset} has "
            f"{', '.join(str(getattr(preset, k)) for k in own)}); the model's shape comes from the "
            "checkpoint"
        )
    return model_cfg


def matched_weights(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], source: Any
) -> dict[str, torch.Tensor]:
    """``weights`` for every tensor of ``model``, checked: each there, of the same shape."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    if missing:
        raise ConfigError(
            f"--init {source} lacks {plural(len(missing), 'tensor')} of the model, e.g. "
            f"{missing[0]!r}; it must be a checkpoint of sparsetool's GPT"
        )
    for name, t in own.items():
        if tuple(weights[name].shape) != tuple(t.shape):
            raise ConfigError(
                f"--init: tensor {name!r} has shape {list(weights[name].shape)}, "
                f"the model needs {list(t.shape)}"
            )
    return {name: weights[name] for name in own}


def masks_from(
    targets: dict[str, torch.nn.Parameter], masks: dict[str, torch.Tensor], loaded: bool
) -> dict[str, torch.Tensor]:
    """The targeted tensors' masks of a loaded checkpoint: its stored masks, or, in a ``zeros``
    encoded one (no masks), ``w != 0`` for every targeted tensor that holds an exact zero."""
    out = {n: m for n, m in masks.items() if n in targets}
    if not out and loaded:
        for n, p in targets.items():
            zero = p.detach() == 0
            if bool(zero.any()):
                out[n] = ~zero.cpu()
    return out


def mask_origin(
    init: Any, masks: dict[str, torch.Tensor], stored: dict[str, torch.Tensor]
) -> str | None:
    """Where the initial masks of a run from ``--init`` come from, as the start of a run says it
    (None: the checkpoint carries none and the sparsifier makes them).

    >>> mask_origin(
    ...     "ckpt", {"w": torch.ones(2, dtype=torch.bool)}, {"w": torch.ones(2, dtype=torch.bool)}
    ... )
    'from --init ckpt (its stored masks)'
    >>> mask_origin("ckpt", {"w": torch.ones(2, dtype=torch.bool)}, {})
    'from --init ckpt (its zero weights)'
    """
    if not masks:
        return None
    how = "its stored masks" if any(n in stored for n in masks) else "its zero weights"
    return f"from --init {init} ({how})"


def loaded_sparsity(masks: dict[str, torch.Tensor]) -> float:
    """Overall sparsity of ``masks`` (pruned / total)."""
    total = sum(m.numel() for m in masks.values())
    return 1.0 - sum(int(m.sum()) for m in masks.values()) / total


def check_init_sparsity(requested: Any, masks: dict[str, torch.Tensor], init: Any) -> None:
    """Refuse a number ``requested`` below the sparsity of the ``--init`` masks: training would
    revive pruned weights without saying so. Equal (to within one weight per tensor) or higher is
    fine; a schedule is left to the algorithm.

    >>> m = {"w": torch.arange(100) < 25}                # 75% sparse
    >>> check_init_sparsity(0.75, m, "a.safetensors"), check_init_sparsity(0.9, m, "a.safetensors")
    (None, None)
    >>> check_init_sparsity(0.5, m, "a.safetensors")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --sparsity 0.5 is below the sparsity of --init a.safetensors
    (0.75): training would revive pruned weights. To make every pruned weight trainable (from 0),
    use --dense without --sparsity; to keep the checkpoint's masks, use --sparsity 0.75 or leave
    --sparsity out; a higher --sparsity prunes further
    """
    if not masks or not isinstance(requested, Real) or isinstance(requested, bool):
        return
    total = sum(m.numel() for m in masks.values())
    have = loaded_sparsity(masks)
    if float(requested) < have - len(masks) / total:
        raise ConfigError(
            f"--sparsity {requested:g} is below the sparsity of --init {init} ({have:.4g}): "
            f"training would revive pruned weights. To make every pruned weight trainable "
            f"(from 0), use --dense without --sparsity; to keep the checkpoint's masks, use "
            f"--sparsity {have:.4g} or leave --sparsity out; a higher --sparsity prunes further"
        )
