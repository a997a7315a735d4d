"""A calibrated prune's memory plan and how each block's statistics are gathered.

The run's peak is the shared pass's (:func:`sparsetool.ops.calibration.pass_memory`: the model's
block and the calibration windows' activations, plus the routed inputs of a mixture of experts)
with the largest block's statistics beside it, added up from :mod:`.memory_plan`'s sizes. A block
whose statistics would not fit at once (a mixture of experts with SparseGPT: an ``in x in`` matrix
per expert) is calibrated in as few passes of the windows as fit, each gathering and pruning some
of the block's inputs (an expert's, a tensor of every expert's whole) from the block as the
earlier passes left it.
"""

from __future__ import annotations

from typing import NamedTuple

from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import pass_memory, routed_bytes
from sparsetool.ops.prune.memory_plan import (
    Atom,
    feature_statistics_bytes,
    input_statistics_bytes,
    solve_bytes,
    split_passes,
    statistics_peak,
)
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.placement import Placement
from sparsetool.ops.prune.selectors import Selector
from sparsetool.util.memory import MemoryPlan

__all__ = ["PassPlan", "plan_passes"]


class PassPlan(NamedTuple):
    """The run's memory plan; each block's passes (the keys each one gathers and prunes); a note
    when some block takes more than one pass (else None)."""

    memory: MemoryPlan
    passes: dict[int, list[list[str]]]
    note: str | None


def plan_passes(
    model: BlockModel,
    seq: int,
    opts: PruneOptions,
    placement: Placement,
    selector: Selector,
) -> PassPlan:
    """The run's peak over windows of ``seq`` tokens, and each block's passes: one pass of the
    windows through the block, unless its statistics do not fit beside the rest."""
    widths = [placement.n_in(p.lt) for p in placement.where.values() if p.expert is not None]
    routed = 0
    if widths:
        config = getattr(model.module, "config", None)
        k = int(getattr(config, "num_experts_per_tok", 1) or 1)
        routed = routed_bytes(seq, k, model.width, max(widths))
    plan = pass_memory(model, opts.samples, seq, opts.max_memory, routed=routed)
    room = plan.budget - plan.peak

    def peak(atoms: list[Atom]) -> int:
        return _statistics_peak(atoms, placement, selector)

    passes: dict[int, list[list[str]]] = {}
    most = 1
    for i in placement.by_block:
        split = split_passes(block_atoms(i, opts, placement, selector), room, peak)
        passes[i] = [[k for atom in p for k in atom.keys] for p in split]
        plan.statistics = max(plan.statistics, max(map(peak, split)))
        most = max(most, len(split))
    note = None
    if most > 1:
        note = (
            f"a block's statistics do not fit in memory at once: blocks are calibrated in up "
            f"to {most} passes of the windows, each pruning some of the block's layers from "
            "the block as the earlier passes left it (more memory: one pass, and sooner)"
        )
    return PassPlan(plan, passes, note)


def block_atoms(
    block: int, opts: PruneOptions, placement: Placement, selector: Selector
) -> list[Atom]:
    """A block's inputs as atoms, in block order; the experts of a tensor of every expert are
    one (it is pruned whole)."""
    refine = opts.refine == "dsnot"
    per_feature = feature_statistics_bytes(selector.norms or opts.allocation == "owl", refine)
    atoms: list[Atom] = []
    joined: dict[str, int] = {}  # a tensor of every expert -> the atom holding its experts
    for group in placement.expected_groups(block):
        n_in = placement.n_in(group[0][1])
        size = input_statistics_bytes(n_in, per_feature, selector.hessian)
        cost = max(
            solve_bytes(lt.numel, placement.n_in(lt), lt.dtype.itemsize, selector.updates, refine)
            for _key, lt in group
        )
        keys = [key for key, _lt in group]
        fused = [lt.name for key, lt in group if placement.where[key].slot]
        at = next((joined[n] for n in fused if n in joined), None)
        if at is None:
            atoms.append(Atom(keys, size, cost))
            at = len(atoms) - 1
        else:
            old = atoms[at]
            atoms[at] = Atom(old.keys + keys, old.size + size, max(old.cost, cost))
        joined.update({n: at for n in fused})
    return atoms


def _statistics_peak(atoms: list[Atom], placement: Placement, selector: Selector) -> int:
    where, n_in = placement.where, placement.n_in
    widest = max((n_in(where[k].lt) for atom in atoms for k in atom.keys), default=0)
    return statistics_peak(atoms, widest, selector.hessian)
