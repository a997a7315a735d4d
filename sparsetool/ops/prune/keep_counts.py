"""How many weights a calibrated prune keeps of each targeted tensor, fixed before any block runs.

A tensor keeps its share of ``--sparsity`` (by ``--distribution``, or OWL's count of it); a tensor
of every expert shares its count out among its experts' matrices, each a unit of the distribution
(:func:`~sparsetool.masks.distributions.part_keep_counts`). With ``--nm`` the pattern decides. The
weights a method will keep of a matrix follow from which of its weights are alive and that count
alone (:meth:`~sparsetool.ops.prune.selectors.Selector.kept_count`), so the output's header is
known before the first block runs (:func:`count_kept`).
"""

from __future__ import annotations

import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.zeros import count_nonzero_values
from sparsetool.errors import SparsetoolError
from sparsetool.masks.distributions import part_keep_counts
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.placement import Placement
from sparsetool.ops.prune.read import read_alive_tensors
from sparsetool.ops.prune.selectors import Selector
from sparsetool.targets import TargetPlan
from sparsetool.util.progress import Progress

__all__ = ["KeepCounts", "count_kept"]


class KeepCounts:
    """Each targeted tensor's count to keep (``keep``; OWL sets its own), and for a tensor of
    every expert each expert's (``part_keep``)."""

    def __init__(self, targets: list[LogicalTensor], plan: TargetPlan, opts: PruneOptions):
        self.nm, self.sparsity = opts.nm, opts.sparsity
        self.keep: dict[str, int] = {}
        self.part_keep: dict[str, list[int]] = {}  # a tensor of every expert: each one's count
        if opts.sparsity is not None:
            self.part_keep = part_keep_counts(
                {lt.name: tuple(lt.shape) for lt in targets},
                {lt.name: plan[lt.name].experts for lt in targets if plan[lt.name].experts},
                opts.sparsity,
                opts.distribution,
            )
            self.keep = {name: sum(parts) for name, parts in self.part_keep.items()}

    def of(self, lt: LogicalTensor, expert: int | None = None) -> int | None:
        """How many of ``lt``'s weights to keep; of its ``expert``'s matrix, for a tensor of
        every expert (OWL's count of the tensor shared out as evenly as the counts allow)."""
        if self.nm is not None:
            return None
        assert self.sparsity is not None, "PruneOptions.validate(): --sparsity or --nm"
        total = self.keep.get(lt.name, lt.numel - round(self.sparsity * lt.numel))
        if expert is None:
            return total
        parts = self.part_keep.get(lt.name)
        if parts is not None and sum(parts) == total:
            return parts[expert]
        n = lt.shape[0]
        return total // n + (expert < total % n)

    def kept_count(self, selector: Selector, lt: LogicalTensor, alive: torch.Tensor) -> int:
        """The weights ``selector`` will keep of ``lt``, whose alive weights are ``alive``."""
        if alive.ndim == 3:  # one count per expert's matrix
            return sum(selector.kept_count(a, self.of(lt, e)) for e, a in enumerate(alive))
        return selector.kept_count(alive, self.of(lt, None))


def count_kept(
    ckpt: Checkpoint,
    targets: list[LogicalTensor],
    placement: Placement,
    counts: KeepCounts,
    selector: Selector,
    *,
    nan_ok: bool,
    progress: Progress | None,
) -> tuple[dict[str, int], dict[str, int]]:
    """One read of every targeted tensor: NaN/inf refused, what is there and what will be kept
    counted (the non-zeros before, the kept counts after)."""
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for i, lt in enumerate(targets):
        _dense, alive = read_alive_tensors(ckpt, lt, nan_means_pruned=nan_ok)
        before[lt.name] = count_nonzero_values(alive)
        try:
            after[lt.name] = counts.kept_count(selector, lt, placement.oriented(lt, alive))
        except SparsetoolError as e:
            raise SparsetoolError(f"tensor {lt.name!r} {list(lt.shape)}: {e}") from None
        del _dense, alive
        if progress:
            progress("check", i + 1, len(targets))
    return before, after
