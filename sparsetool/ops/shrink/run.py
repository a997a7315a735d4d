"""``sparsetool shrink``: one entry point for what it removes (experts or whole blocks)."""

from __future__ import annotations

from pathlib import Path

from sparsetool.ops.shrink.blocks import shrink_blocks
from sparsetool.ops.shrink.experts import shrink_experts
from sparsetool.ops.shrink.options import ShrinkOptions, ShrinkResult
from sparsetool.util.progress import Progress

__all__ = ["shrink_checkpoint"]


def shrink_checkpoint(
    path: str | Path, out: str | Path, opts: ShrinkOptions, *, progress: Progress | None = None
) -> ShrinkResult:
    """Write the smaller model ``opts`` asks for: whole blocks removed (``opts.blocks``), else
    routed experts (``opts.experts`` or ``opts.experts_keep``)."""
    opts.validate()
    if opts.blocks is not None:
        return shrink_blocks(path, out, opts, progress=progress)
    return shrink_experts(path, out, opts, progress=progress)
