"""The memory arithmetic of calibration pruning, as pure functions of sizes in bytes.

:func:`~sparsetool.ops.prune.pass_plan.plan_passes` adds these up into the run's
:class:`~sparsetool.util.memory.MemoryPlan` before the long part (the activations of the
calibration windows are the shared pass's, :func:`sparsetool.ops.calibration.pass_memory`): each
block input's statistics, what one tensor's solve holds beside them,
and, when a block's statistics do not fit at once, the passes they are gathered in
(:func:`split_passes`). Each constant below names what it counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from sparsetool.masks.sparsegpt import ROWS

__all__ = [
    "Atom",
    "feature_statistics_bytes",
    "input_statistics_bytes",
    "solve_bytes",
    "split_passes",
    "statistics_peak",
]

FLOAT32 = 4  # bytes of a float32: X^T X, the weights being solved, products
FLOAT64 = 8  # bytes of a float64: the per-feature sums (sum of squares, DSnoT's sum)
# SparseGPT's solve, per weight: the alive mask (bool), the weight (float32, updated in place) and
# the kept mask (bool) ...
SOLVE_PER_WEIGHT = 1 + 4 + 1
# ... then, writing: the kept mask and its inverse (bools) and the float32 values beside the stored
WRITE_PER_WEIGHT = 4 + 2  # (plus the stored dtype's bytes)
UNCHANGED_COPIES = 3  # Wanda or magnitude: the weight in float32 a few times (copy, scores, w*kept)
DSNOT_CHUNK = 1 << 21  # weights DSnoT refines at once (masks/dsnot.py) ...
DSNOT_SORTED = 6  # ... holding this many 8-byte tensors of that many entries (sorted indices)


class Atom(NamedTuple):
    """What must be gathered in one pass: the keys of a block's units reading one input (or the
    experts of one tensor of every expert), the bytes of their statistics, and the bytes of
    their largest solve."""

    keys: list[str]
    size: int
    cost: int


def feature_statistics_bytes(norms: bool, moments: bool) -> int:
    """Bytes per input feature of one input's statistics: the sum of squares (Wanda, OWL), and
    DSnoT's mean and variance (a sum and a sum of squares)."""
    return FLOAT64 * norms + 2 * FLOAT64 * moments


def input_statistics_bytes(n_in: int, per_feature: int, hessian: bool) -> int:
    """One input's statistics: SparseGPT's ``X^T X`` (float32) and ``per_feature`` bytes for
    each of its ``n_in`` features."""
    return (n_in * n_in * FLOAT32 if hessian else 0) + n_in * per_feature


def solve_bytes(numel: int, n_in: int, stored: int, updates: bool, refine: bool) -> int:
    """What pruning one tensor (``numel`` weights of ``stored`` bytes each, ``n_in`` inputs)
    holds beside the statistics and the block. SparseGPT (``updates``): its alive mask, the weight
    in float32 and the kept mask, with a slice of ``ROWS`` rows of the solve's product; then the
    kept mask and its inverse and the stored values written. Wanda: the weight in float32 a few
    times. DSnoT (``refine``): the weight kept as it was, and a chunk of rows sorted."""
    extra = numel * FLOAT32 + min(numel, DSNOT_CHUNK) * DSNOT_SORTED * FLOAT64 if refine else 0
    if not updates:
        return UNCHANGED_COPIES * numel * FLOAT32 + extra
    per_weight = max(SOLVE_PER_WEIGHT, stored + WRITE_PER_WEIGHT)
    return numel * per_weight + ROWS * n_in * FLOAT32 + extra


def statistics_peak(atoms: Sequence[Atom], widest_input: int, hessian: bool) -> int:
    """The most one pass over these inputs holds: all their statistics while the windows run
    (with SparseGPT's product of ``ROWS`` rows of its widest input), then, inputs solved from the
    cheapest, each solve beside the statistics not yet dropped."""
    if not atoms:
        return 0
    held = sum(a.size for a in atoms)
    peak = held + (ROWS * widest_input * FLOAT32 if hessian else 0)
    for atom in sorted(atoms, key=lambda a: a.cost):
        peak = max(peak, held + atom.cost)
        held -= atom.size
    return peak


def split_passes(
    atoms: Sequence[Atom], room: int, peak: Callable[[list[Atom]], int]
) -> list[list[Atom]]:
    """A block's atoms, in order, in as few passes as keep each pass's ``peak`` within ``room``
    (a pass holds at least one atom, whatever it needs)."""
    passes: list[list[Atom]] = [[]]
    for atom in atoms:
        if passes[-1] and peak(passes[-1] + [atom]) > room:
            passes.append([])
        passes[-1].append(atom)
    return passes
