"""``sparsetool prune``: the whole pipeline, streaming, in the order a reader can follow it.

The checkpoint never sits in memory: each targeted tensor is read, masked and written on its own.
:func:`prune_checkpoint` is two steps:

1. :func:`~sparsetool.ops.prune.plan.plan_prune` (``plan.py``) decides everything before the first
   byte is written: the options' checks (:class:`PruneOptions`, ``options.py``), the targets (the
   :class:`~sparsetool.targets.TargetPlan`), and the **planner**, which decides the masks
   (``planner.py`` declares what a planner is). Some options need to know something about every
   tensor before writing, so the planner's ``prepare`` makes passes over the file (a second read
   comes from the page cache):

   * magnitude or random, layer scope, ``--sparsity``, encodings zeros/mask/nan: no pass;
   * ``--fraction`` or the ``bitmask`` encoding: a pass counts non-zeros (the bitmask header
     holds the size of each ``compressed`` tensor, so it must be known before writing);
   * ``--scope global``: a pass builds |w| histograms to find the one exact threshold (a second,
     rarely needed, refines it for fp16/fp32);
   * ``--method wanda|sparsegpt``: a pass checks each tensor and counts what it will keep, then
     the model and the calibration text are loaded and the memory plan is checked.

   ``magnitude.py`` is the planner of magnitude and random masks (file order), ``calibrated.py``
   the one of Wanda and SparseGPT (block order).
2. :func:`~sparsetool.ops.prune.write.write_pruned` (``write.py``) writes the output in the
   planner's order: for each targeted tensor, read (``read.py``: the alive mask, NaN/inf
   refused), select (:mod:`sparsetool.masks`), encode, write; a plain float tensor takes the fast
   path (``stream.py``: one scan, then the mask written chunk by chunk on the worker threads).

Pruning composes: a weight that is already pruned (zero, NaN sentinel, masked or missing from a
bitmask) is never revived. :class:`PruneResult` (``to_json()`` is ``prune --json``) says what was
done.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparsetool.util.lazy import lazy_names

# loaded on first use, so that the options (``options.py``, no numpy, no torch) import alone
_WHERE = {
    "PruneOptions": ".options",
    "PruneResult": ".options",
    "TensorResult": ".options",
    "PrunePlan": ".plan",
    "prune_checkpoint": ".pipeline",
    "plan_prune": ".plan",
    "write_pruned": ".write",
    "targeted_tensors": ".plan",
    "checkpoint_plan": ".plan",
}
__all__ = sorted(_WHERE)
if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from .options import PruneOptions as PruneOptions
    from .options import PruneResult as PruneResult
    from .options import TensorResult as TensorResult
    from .pipeline import prune_checkpoint as prune_checkpoint
    from .plan import PrunePlan as PrunePlan
    from .plan import checkpoint_plan as checkpoint_plan
    from .plan import plan_prune as plan_prune
    from .plan import targeted_tensors as targeted_tensors
    from .write import write_pruned as write_pruned

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
