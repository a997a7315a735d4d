"""The calibration windows shrink scores on (prune's windows: the same text, tokenizer, seed and
length rules, their count recorded on the result) and the run's memory plan, checked before
any text runs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import (
    calibration_windows,
    hidden_bytes,
    pass_memory,
    routed_bytes,
    window_length,
)
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.results import ShrinkResult
from sparsetool.util.memory import MemoryPlan

__all__ = ["LOWER_MEMORY", "shrink_windows"]

LOWER_MEMORY = (
    "--samples, --seq, --dtype bfloat16, --no-reconstruct, or --max-memory if more is free "
    "than detected"
)


def shrink_windows(
    model: BlockModel,
    opts: ShrinkOptions,
    text: str,
    result: ShrinkResult,
    *,
    statistics: int = 0,
    held: int = 0,
    routed: tuple[int, int] | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> torch.Tensor:
    """``opts.samples`` windows of ``opts.seq`` tokens (or the default length) of ``text``, once
    the run's memory plan (the calibration pass's, with ``statistics`` bytes, ``held`` more sets
    of the windows' hidden states, and a Mixture of Experts' routed inputs: ``routed`` = (experts
    per token, an expert's input width)) fits: else one
    error naming the figures. ``on_plan`` hears the plan; the result records it."""
    seq, note = window_length(opts.seq, model.context, model.path)
    if note:
        result.notes.append(note)
    windows = calibration_windows(
        model.encode(text).ids, opts.samples, seq, opts.seed, str(opts.calibration)
    )
    result.tokens = windows.numel()
    plan = pass_memory(
        model,
        opts.samples,
        seq,
        opts.max_memory,
        routed=routed_bytes(seq, routed[0], model.width, routed[1]) if routed else 0,
        held=held * hidden_bytes(model, opts.samples, seq),
    )
    plan.statistics = statistics
    plan.check(f"shrink {opts.asked}", LOWER_MEMORY)
    result.memory = plan
    if on_plan is not None:
        on_plan(plan)
    return windows
