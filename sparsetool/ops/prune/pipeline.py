"""``prune`` end to end: :func:`prune_checkpoint` is plan (``plan.py``), then write
(``write.py``); the package's docstring tells the whole pipeline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparsetool.checkpoint.output_files import check_writable, reclaiming
from sparsetool.ops.prune.options import PruneOptions, PruneResult
from sparsetool.ops.prune.plan import plan_prune
from sparsetool.ops.prune.write import write_pruned
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["prune_checkpoint"]


def prune_checkpoint(
    src: str | Path,
    out: str | Path,
    opts: PruneOptions,
    *,
    in_place: bool = False,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> PruneResult:
    """Prune the targeted tensors of checkpoint ``src`` into ``out`` (same layout), streaming.

    With a calibration method, ``on_plan`` is called with the memory plan once it is made,
    before the long part (a plan that cannot fit raises instead). The temporaries of killed runs
    removed beside ``out`` are the result's ``reclaimed`` (an error's, if it fails)."""
    with reclaiming() as reclaimed:
        check_writable(out, "-o")  # before the plan, which may load a model and calibration text
        # calibration records: their text field, and src's chat template for chat messages
        plan = plan_prune(src, opts.reading(src), progress=progress, on_plan=on_plan)
        result = write_pruned(plan, out, in_place=in_place, progress=progress)
    result.reclaimed = reclaimed
    return result
