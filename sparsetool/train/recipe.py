"""The recipe pieces of a run that are pure functions of its options: the LR schedule, the
AdamW parameter groups, the model size and the Variable SPDF stage plan (:class:`Stage`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from sparsetool.models.gpt import PRESETS, GPTConfig
from sparsetool.train.trainconfig import DEFAULT_PRESET, TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup`` steps, then half a cosine down to
    ``min_lr_ratio * lr`` at the last step (SPDF paper, Appendix A.1: "a learning rate warm-up
    ... followed by a cosine decay to 10% of the peak learning rate").

    ``lr(t) = lr * (t + 1) / warmup`` for ``t < warmup``, else
    ``lr_min + (lr - lr_min) * (1 + cos(pi * (t - warmup) / (steps - warmup))) / 2``.

    >>> cfg = TrainConfig(lr=1.0, warmup=10, steps=110, min_lr_ratio=0.1)
    >>> [round(lr_at(t, cfg), 3) for t in (0, 9, 10, 60, 110)]
    [0.1, 1.0, 1.0, 0.55, 0.1]
    """
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    lo = cfg.lr * cfg.min_lr_ratio
    span = max(1, cfg.steps - cfg.warmup)
    t = min(1.0, (step - cfg.warmup) / span)
    return lo + (cfg.lr - lo) * 0.5 * (1.0 + math.cos(math.pi * t))


def model_config(cfg: TrainConfig) -> GPTConfig:
    base = PRESETS[cfg.preset or DEFAULT_PRESET]
    over = {
        k: getattr(cfg, k) for k in ("n_layer", "n_head", "d_model", "context") if getattr(cfg, k)
    }
    return replace(base, dropout=cfg.dropout, **over)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay the matrices of linear layers only; norms, biases and embeddings are not decayed
    (as nanoGPT and the Model Zoo do: decaying a LayerNorm gain or an embedding row pulls it
    toward zero for no regularisation benefit)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():  # a Hugging Face model's tied head is its embedding
        if p.dim() >= 2 and id(p) not in embeddings:
            decay.append(p)
        else:
            no_decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


@dataclass(frozen=True)
class Stage:
    """One stage of a run (Variable SPDF): its sparsity over steps ``start`` to ``end`` (0-based,
    ``end`` excluded). ``sparsity`` is as --sparsity gives it: a number, a schedule mapping or
    None (dense, or --init's masks)."""

    sparsity: Any
    start: int
    end: int


def stage_plan(cfg: TrainConfig) -> list[Stage]:
    """The stages over steps; one stage without --stage.

    >>> stage_plan(TrainConfig(steps=100, stages=[(0.9, 0.8), (0.0, 0.2)]))
    [Stage(sparsity=0.9, start=0, end=80), Stage(sparsity=0.0, start=80, end=100)]
    """
    if not cfg.stages:
        return [Stage(cfg.sparsity, 0, cfg.steps)]
    out: list[Stage] = []
    acc = 0.0
    for s, f in cfg.stages:
        start = out[-1].end if out else 0
        acc += f
        end = cfg.steps if len(out) == len(cfg.stages) - 1 else int(round(acc * cfg.steps))
        out.append(Stage(s, start, end))
    return out


def sparsifier_config(
    cfg: TrainConfig, sparsity, init_masks: dict, later_stage: bool
) -> dict | None:
    """The ``build_sparsifier`` mapping for one stage of a run, or None when it trains densely.

    Without an explicit sparsity, a run started from a masked checkpoint keeps that checkpoint's
    sparsity (static masks unless another algorithm is asked for).

    >>> sparsifier_config(TrainConfig(algorithm="rigl", update_freq=50), 0.75, {}, False)
    {'algorithm': 'rigl', 'seed': 0, 'sparsity': 0.75, 'update': {'freq': 50}}
    >>> sparsifier_config(TrainConfig(stages=[(0.9, 0.8), (0.0, 0.2)]), 0.0, {}, True) is None
    True
    """
    algorithm = cfg.algorithm
    if cfg.dense or algorithm == "dense":
        return None
    if sparsity is None and not init_masks and "sparsity" not in cfg.sparsity_options:
        return None
    if isinstance(sparsity, (int, float)) and sparsity == 0 and (cfg.stages or algorithm is None):
        return None
    out: dict[str, Any] = {"algorithm": algorithm or "static", "seed": cfg.seed}
    if cfg.param_filter:
        out["param_filter"] = list(cfg.param_filter)
    if cfg.initial_sparsity is not None:
        out["initial_sparsity"] = cfg.initial_sparsity
    if sparsity is None and init_masks:
        total = sum(m.numel() for m in init_masks.values())
        sparsity = 1.0 - sum(int(m.sum()) for m in init_masks.values()) / total
    if sparsity is not None:
        out["sparsity"] = sparsity
    for k in ("distribution", "init_method", "drop_fraction"):
        if getattr(cfg, k) is not None:
            out[k] = getattr(cfg, k)
    upd = {p: getattr(cfg, f"update_{p}") for p in ("freq", "start", "stop")}
    if out["algorithm"] == "imp" and upd["freq"] is not None:
        out["period"] = upd.pop("freq")  # IMP's "update" is its pruning period
    if any(v is not None for v in upd.values()):
        out["update"] = {k: v for k, v in upd.items() if v is not None}
    if later_stage and out["algorithm"] != "imp":
        # A later sparse stage starts from trained weights: prune the smallest, not at random.
        out["init_method"] = "magnitude"
    out.update(cfg.sparsity_options)
    return out
