"""``sparsetool shrink``: one entry point for what it removes (experts or whole blocks)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparsetool.checkpoint.output_files import reclaiming
from sparsetool.ops.shrink.blocks import shrink_blocks
from sparsetool.ops.shrink.experts import shrink_experts
from sparsetool.ops.shrink.mix import shrink_mix
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.results import ParamsSearch, ShrinkResult
from sparsetool.ops.shrink.search import shrink_to_params
from sparsetool.ops.shrink.widths import shrink_widths
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["shrink_checkpoint"]


def shrink_checkpoint(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
    on_search: Callable[[ParamsSearch], None] | None = None,
) -> ShrinkResult:
    """Write the smaller model ``opts`` asks for: whole blocks removed (``opts.blocks``), FFN
    channels, attention heads or embedding channels (``opts.ffn``, ``opts.heads``,
    ``opts.hidden``), both (the blocks first: :mod:`~sparsetool.ops.shrink.mix`), else routed
    experts (``opts.experts`` or ``opts.experts_keep``). The temporaries of killed runs
    removed beside ``out`` are the result's ``reclaimed`` (an error's, if it fails). When text
    runs, ``on_plan`` hears the memory plan (checked against ``opts.max_memory``) before it does."""
    opts.validate()
    opts = opts.reading(path)  # calibration records: their text field, path's chat template
    kinds = {"blocks": shrink_blocks, "widths": shrink_widths, "blocks and widths": shrink_mix}
    shrink = kinds.get(opts.removes, shrink_experts)
    with reclaiming() as reclaimed:
        if opts.params is not None:  # the cuts chosen for a size (said by on_search first)
            result = shrink_to_params(
                path, out, opts, progress=progress, on_plan=on_plan, on_search=on_search
            )
        else:
            result = shrink(path, out, opts, progress=progress, on_plan=on_plan)
    result.reclaimed = reclaimed
    return result
