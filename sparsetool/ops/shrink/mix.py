"""``shrink --blocks N`` with ``--ffn``/``--heads``/``--hidden`` in one command: the blocks are
removed first (scored on the whole model, each removed run mapped as ``--blocks`` does) into a
temporary directory beside the output, then the blocks kept are narrowed (scored on what the
smaller model computes, refit as the widths alone are) into the output; one result holds both
records. The output's provenance is the widths' step after the blocks' step (its history), as if
the two commands had run one after the other, and the temporary is removed however the run ends
(a killed run's, by the next run beside it).

Every usage error either step can see in ``config.json`` is raised before the first step reads a
weight (the widths' geometry taken from the config, the layer count lowered by the blocks)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sparsetool.checkpoint.output_files import temp_beside
from sparsetool.ops.shrink.blocks import plan_blocks, shrink_blocks
from sparsetool.ops.shrink.inputs import check_output, model_config
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.results import ShrinkResult
from sparsetool.ops.shrink.width_plan import config_geometry, plan_widths
from sparsetool.ops.shrink.widths import NEEDS, shrink_widths
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["shrink_mix", "split_mix"]


def split_mix(opts: ShrinkOptions) -> tuple[ShrinkOptions, ShrinkOptions]:
    """The options of the two steps: the blocks alone, then the widths alone."""
    return replace(opts, ffn=None, heads=None, hidden=None), replace(opts, blocks=None)


def shrink_mix(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Remove ``opts.blocks`` blocks, then narrow what is kept by ``opts.ffn``/``heads``/
    ``hidden``, from the model at ``path`` into ``out``; see the module docstring."""
    path, out = Path(path), Path(out)
    first, second = split_mix(opts)
    first.validate()
    second.validate()
    plan_blocks(path, first)
    _config, cfg = model_config(path, NEEDS)
    width = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0) or 0)
    plan_widths(config_geometry(cfg, width, second), second, str(path))  # none or all: now
    check_output(path, out)
    mid = temp_beside(out)
    try:
        removed = shrink_blocks(path, mid, first, progress=progress, on_plan=on_plan)
        narrowed = shrink_widths(mid, out, second, progress=progress, on_plan=on_plan)
    finally:
        shutil.rmtree(mid, ignore_errors=True)
    result = ShrinkResult(
        output=out,
        options=opts,
        blocks=removed.blocks,
        widths=narrowed.widths,
        parameters_before=removed.parameters_before,
        parameters_after=narrowed.parameters_after,
        bytes_before=removed.bytes_before,
        bytes_after=narrowed.bytes_after,
        tokens=removed.tokens + narrowed.tokens,
        memory=max(
            (m for m in (removed.memory, narrowed.memory) if m is not None),
            key=lambda m: m.peak,
            default=None,
        ),
        notes=[*removed.notes, *narrowed.notes],
        left_out=narrowed.left_out,
    )
    return result
