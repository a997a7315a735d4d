"""``sparsetool shrink``: structured compression into a smaller dense model that loads anywhere.

``--experts F`` removes whole routed experts of a Mixture-of-Experts model
(:mod:`~sparsetool.ops.shrink.experts`): each layer's experts are scored from calibration text
block by block (:mod:`~sparsetool.ops.shrink.saliency`: REAP, frequency, EAN, random), the
lowest go or are merged into their most similar kept expert, and the output is streamed in the
input's layout with renumbered experts and a lowered expert count
(:mod:`~sparsetool.ops.shrink.write`, :mod:`~sparsetool.ops.shrink.layers`). The options and
their checks are torch-free (:mod:`~sparsetool.ops.shrink.options`).

``--blocks N`` removes whole transformer blocks (:mod:`~sparsetool.ops.shrink.blocks`: block
influence or angular distance on calibration text); :func:`shrink_checkpoint` (``run.py``) runs
whichever is asked; ``--ffn F`` / ``--heads F`` / ``--hidden F`` narrow every layer alike
(:mod:`~sparsetool.ops.shrink.widths`: channels and heads ranked by their activations; what each
layer keeps ``width_plan``, the scores ``width_scores``, the cuts and the writing ``width_cuts``,
the refits ``width_refit``). Every kind runs one skeleton (:mod:`~sparsetool.ops.shrink.kind`)
and returns a :class:`~sparsetool.ops.shrink.results.ShrinkResult`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparsetool.util.lazy import lazy_names

_WHERE = {
    "ExpertPlan": ".options",
    "ShrinkOptions": ".options",
    "ShrinkResult": ".results",
    "plan_experts": ".options",
    "plan_shrink": ".experts",
    "plan_blocks": ".blocks",
    "shrink_blocks": ".blocks",
    "shrink_checkpoint": ".run",
    "shrink_experts": ".experts",
    "shrink_widths": ".widths",
}
__all__ = sorted(_WHERE)
if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from .blocks import plan_blocks as plan_blocks
    from .blocks import shrink_blocks as shrink_blocks
    from .experts import plan_shrink as plan_shrink
    from .experts import shrink_experts as shrink_experts
    from .options import ExpertPlan as ExpertPlan
    from .options import ShrinkOptions as ShrinkOptions
    from .options import plan_experts as plan_experts
    from .results import ShrinkResult as ShrinkResult
    from .run import shrink_checkpoint as shrink_checkpoint
    from .widths import shrink_widths as shrink_widths

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
