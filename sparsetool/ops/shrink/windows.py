"""The calibration windows shrink scores on: prune's windows (the same text, tokenizer, seed and
length rules), their count recorded on the result."""

from __future__ import annotations

import torch

from sparsetool.models.blocks import BlockModel
from sparsetool.ops.prune.calibrated import calibration_windows, window_length
from sparsetool.ops.shrink.options import ShrinkOptions, ShrinkResult

__all__ = ["shrink_windows"]


def shrink_windows(
    model: BlockModel, opts: ShrinkOptions, text: str, result: ShrinkResult
) -> torch.Tensor:
    """``opts.samples`` windows of ``opts.seq`` tokens (or the default length) of ``text``."""
    seq, note = window_length(opts.seq, model.context, model.path)
    if note:
        result.notes.append(note)
    windows = calibration_windows(
        model.encode(text).ids, opts.samples, seq, opts.seed, str(opts.calibration)
    )
    result.tokens = windows.numel()
    return windows
