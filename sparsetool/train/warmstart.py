"""Starting a run from a checkpoint (``--init``): the model shape it implies, its weights, the
masks it carries, and what ``--sparsity`` means next to those masks.

The rule for ``--init SPARSE --sparsity S`` (``s0`` the checkpoint's sparsity over the targeted
tensors): ``S == s0`` (to within one weight per tensor) keeps the masks; ``S > s0`` prunes further
from them by magnitude, never reviving a pruned weight (the sparsifier does it at ``attach``);
``S < s0`` is an error unless ``--dense`` revives every weight on purpose.

A checkpoint without stored masks (the ``zeros`` encoding, or any dense model) has only its zero
weights to say what was pruned, and a model that was never pruned has some too: dequantizing a
4-bit GGUF leaves 0.03% of SmolLM2-135M's targeted weights at exactly 0 and 4.55% of Gemma-3's.
So its zeros become masks only when the run asks for sparse training (``--algorithm``,
``--sparsity``, ``--stage``), when its provenance records a prune (``sparsetool prune``, or a
sparse ``sparsetool train`` run) or when at least :data:`ZEROS_ARE_MASKS` of its targeted weights
are 0 (a prune made elsewhere); otherwise the run trains densely, and its start says so and how
to keep the zeros (:func:`zero_weight_masks`).
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Real
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.provenance import read_provenance
from sparsetool.errors import ConfigError
from sparsetool.models.gpt import PRESETS, GPTConfig, infer_config
from sparsetool.train.trainconfig import DEFAULT_PRESET, TrainConfig
from sparsetool.util.wording import plural

__all__ = [
    "check_init_is_a_model",
    "check_init_sparsity",
    "init_model_config",
    "recorded_prune",
    "sparse_training_asked",
    "zero_weight_masks",
    "matched_weights",
    "loaded_sparsity",
    "mask_origin",
    "masks_from",
]


SHAPE = ("n_layer", "n_head", "d_model", "context")

ZEROS_ARE_MASKS = 0.10
"""The share of exact zeros among the targeted weights of an ``--init`` from which they are taken
for a prune's masks without a prune in its provenance; below it they are what a conversion left
and the run trains densely. Above the 4.55% a 4-bit GGUF of Gemma-3 leaves, below any prune
worth training sparsely."""


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
    encoded one (no masks), ``w != 0`` for every targeted tensor once one holds an exact zero
    (a tensor without a zero keeps all its weights: the sparsifier needs a mask for each)."""
    out = {n: m for n, m in masks.items() if n in targets}
    if not out and loaded:
        for n, p in targets.items():
            out[n] = (p.detach() != 0).cpu()
        if all(bool(m.all()) for m in out.values()):
            return {}
    return out


def recorded_prune(path: Any) -> bool:
    """Whether the provenance of the checkpoint ``path`` records a prune in any of its steps:
    ``sparsetool prune``, or a ``sparsetool train`` run that was sparse (a later ``densify`` or
    ``shrink`` keeps the steps before it)."""
    with open_checkpoint(path) as ckpt:
        entry = read_provenance(ckpt.metadata()) or {}
    steps = [entry, *(h for h in entry.get("history", []) if isinstance(h, dict))]
    for step in steps:
        if step.get("command") == "prune":
            return True
        sparsity = step.get("sparsity")
        trained = step.get("producer") == "sparsetool train"
        if trained and isinstance(sparsity, Real) and float(sparsity) > 0:
            return True
    return False


def sparse_training_asked(cfg: TrainConfig) -> bool:
    """Whether the settings ask for sparse training themselves: an ``--algorithm`` other than
    dense, a ``--sparsity`` (or the ``sparsity`` of ``--sparsity-option``) or a ``--stage``."""
    return (
        cfg.algorithm not in (None, "dense")
        or cfg.sparsity is not None
        or bool(cfg.stages)
        or "sparsity" in cfg.sparsity_options
    )


def zero_weight_masks(
    init: Any, masks: dict[str, torch.Tensor], *, asked: bool, pruned: bool
) -> tuple[dict[str, torch.Tensor], str, str | None]:
    """What becomes of masks made from the zero weights of ``--init`` (none stored): ``(masks,
    how, note)``. They stay when sparse training is ``asked`` for, when the checkpoint's
    provenance records a prune (``pruned``) or when at least :data:`ZEROS_ARE_MASKS` of the
    targeted weights are 0; ``how`` then says why, in the words of the initial mask's origin.
    Otherwise they are dropped, the run trains densely and ``note`` says so in one line, with how
    to keep them.

    >>> m = {"w": torch.arange(10_000) >= 3}                      # 0.03% zeros
    >>> kept, how, note = zero_weight_masks("s-blocks4", m, asked=False, pruned=False)
    >>> kept, how
    ({}, '')
    >>> print(note)
    --init s-blocks4: trained densely: 0.03% of its targeted weights are exactly 0 and no prune
    made it (its zeros count as masks from 10%, or after sparsetool prune); to keep them at 0 as
    masks, add --algorithm static
    >>> zero_weight_masks("p", m, asked=False, pruned=True)[1:]
    ('its zero weights: a sparsetool prune; --dense revives them', None)
    >>> zero_weight_masks("p", {"w": torch.arange(100) >= 50}, asked=False, pruned=False)[1:]
    ('its zero weights: 50.00% of the targeted weights; --dense revives them', None)
    """
    share = loaded_sparsity(masks)
    if asked:
        return masks, "its zero weights", None
    if pruned:
        return masks, "its zero weights: a sparsetool prune; --dense revives them", None
    if share >= ZEROS_ARE_MASKS:
        return (
            masks,
            f"its zero weights: {share:.2%} of the targeted weights; --dense revives them",
            None,
        )
    return (
        {},
        "",
        f"--init {init}: trained densely: {share:.2%} of its targeted weights are exactly 0 and "
        f"no prune made it (its zeros count as masks from {ZEROS_ARE_MASKS:.0%}, or after "
        "sparsetool prune); to keep them at 0 as masks, add --algorithm static",
    )


def mask_origin(
    init: Any, masks: dict[str, torch.Tensor], stored: dict[str, torch.Tensor], zeros: str = ""
) -> str | None:
    """Where the initial masks of a run from ``--init`` come from, as the start of a run says it
    (None: the checkpoint carries none and the sparsifier makes them); ``zeros``: what
    :func:`zero_weight_masks` says of masks made from zero weights.

    >>> mask_origin(
    ...     "ckpt", {"w": torch.ones(2, dtype=torch.bool)}, {"w": torch.ones(2, dtype=torch.bool)}
    ... )
    'from --init ckpt (its stored masks)'
    >>> mask_origin("ckpt", {"w": torch.ones(2, dtype=torch.bool)}, {})
    'from --init ckpt (its zero weights)'
    """
    if not masks:
        return None
    how = "its stored masks" if any(n in stored for n in masks) else zeros or "its zero weights"
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
