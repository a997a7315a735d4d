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
whichever is asked; ``--ffn F`` / ``--heads F`` narrow every layer alike
(:mod:`~sparsetool.ops.shrink.widths`: channels and heads ranked by their activations).
"""

from __future__ import annotations

from sparsetool.util.lazy import lazy_names

_WHERE = {
    "ExpertPlan": ".options",
    "ShrinkOptions": ".options",
    "ShrinkResult": ".options",
    "plan_experts": ".options",
    "plan_shrink": ".experts",
    "plan_blocks": ".blocks",
    "shrink_blocks": ".blocks",
    "shrink_checkpoint": ".run",
    "shrink_experts": ".experts",
    "shrink_widths": ".widths",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_names(__name__, _WHERE)
