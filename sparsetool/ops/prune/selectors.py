"""How each calibration method chooses one matrix's kept weights (and, for SparseGPT, their new
values), behind one small protocol, :class:`Selector`; :func:`select_matrix` adds DSnoT's
refinement of the chosen mask.

A matrix is (out, in) float32 on the CPU; ``stats`` its input's
:class:`~sparsetool.ops.prune.statistics.InputStatistics` (None when no block runs: magnitude
with OWL's counts); ``few`` says its expert was routed too few calibration tokens, so it is pruned
by magnitude in its method's comparison groups (Wanda with every input norm 1: each row's largest
weights; SparseGPT with ``X^T X`` the identity: each column block's, no update).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

import sparsetool.masks.sparsegpt as sparsegpt
from sparsetool.checkpoint.zeros import count_nonzero_values
from sparsetool.masks.dsnot import dsnot_refine
from sparsetool.masks.select import magnitude_mask
from sparsetool.masks.wanda import wanda_kept_count, wanda_mask
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.statistics import InputStatistics

__all__ = [
    "Selector",
    "MagnitudeSelector",
    "WandaSelector",
    "SparseGPTSelector",
    "Refinement",
    "selector_for",
    "select_matrix",
]


class Selector(Protocol):
    """One method's choice of a matrix's kept weights."""

    hessian: bool  # it needs each input's X^T X
    norms: bool  # it needs each input feature's sum of squares
    updates: bool  # it changes the kept weights (its output is new values)

    def kept_count(self, alive: torch.Tensor, keep: int | None) -> int:
        """How many weights it will keep of a matrix whose alive weights are ``alive``, asked to
        keep ``keep`` (None: N:M), known before anything runs."""
        ...

    def select(
        self,
        w: torch.Tensor,
        alive: torch.Tensor,
        stats: InputStatistics | None,
        keep: int | None,
        few: bool,
        overwrite: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(the new values, or None when the kept weights keep theirs; the kept mask). ``w``
        may be overwritten when ``overwrite``."""
        ...

    def refit(
        self, w: torch.Tensor, kept: torch.Tensor, stats: InputStatistics, overwrite: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The values (and mask) for a mask refined after :meth:`select` (``updates`` only)."""
        ...


@dataclass(frozen=True)
class MagnitudeSelector:
    """Keep the largest |w| (OWL's counts, or DSnoT's starting mask)."""

    hessian = False
    norms = False
    updates = False

    def kept_count(self, alive: torch.Tensor, keep: int | None) -> int:
        if keep is None:  # magnitude has no N:M here: it is given a count
            raise AssertionError("magnitude without a keep count")
        return min(keep, count_nonzero_values(alive))

    def select(self, w, alive, stats, keep, few, overwrite):
        return None, magnitude_mask(w, keep=keep, existing=alive)

    def refit(self, w, kept, stats, overwrite):
        raise AssertionError("magnitude keeps the kept weights' values")


@dataclass(frozen=True)
class WandaSelector:
    """Wanda: |w| times its input feature's norm, the largest of each output row (or N:M), by
    ``mask`` (:func:`~sparsetool.masks.wanda.wanda_mask`)."""

    nm: tuple[int, int] | None
    mask: Callable[..., torch.Tensor] = wanda_mask
    hessian = False
    norms = True
    updates = False

    def kept_count(self, alive: torch.Tensor, keep: int | None) -> int:
        return wanda_kept_count(alive, keep=keep, nm=self.nm)

    def select(self, w, alive, stats, keep, few, overwrite):
        norms = torch.ones(w.shape[1], dtype=torch.float64) if few else stats.sq.cpu()
        return None, self.mask(w, norms, keep=keep, nm=self.nm, existing=alive)

    def refit(self, w, kept, stats, overwrite):
        raise AssertionError("Wanda keeps the kept weights' values")


@dataclass(frozen=True)
class SparseGPTSelector:
    """SparseGPT: the mask chosen column block by column block while the kept weights are
    updated to make up for the pruned ones, from the inverse of ``X^T X``. The input's
    ``X^T X`` becomes its inverse factor, in place, for the first of its layers."""

    nm: tuple[int, int] | None
    blocksize: int
    dampening: float
    hessian = True
    norms = False
    updates = True

    def kept_count(self, alive: torch.Tensor, keep: int | None) -> int:
        return sparsegpt.sparsegpt_kept_count(
            alive, keep=keep, nm=self.nm, blocksize=self.blocksize
        )

    def select(self, w, alive, stats, keep, few, overwrite):
        if few:
            factor = sparsegpt.inverse_hessian_factor(
                torch.eye(w.shape[1]), self.dampening, overwrite=True
            )
        else:
            factor = self.factor(stats)
        return sparsegpt.sparsegpt_update(
            w,
            factor,
            keep=keep,
            nm=self.nm,
            existing=alive,
            blocksize=self.blocksize,
            overwrite=overwrite,
        )

    def refit(self, w, kept, stats, overwrite):
        return sparsegpt.sparsegpt_update(
            w, stats.factor, fixed=kept, blocksize=self.blocksize, overwrite=overwrite
        )

    def factor(self, stats: InputStatistics) -> torch.Tensor:
        """The input's inverse factor, made from its ``X^T X`` by the first of its layers."""
        if stats.factor is None:  # the first layer of this input: X^T X becomes the factor
            if stats.h is None:  # gathered: SparseGPT asks for X^T X (hessian)
                raise AssertionError("no X^T X to factor")
            h, stats.h = stats.h.cpu(), None  # from a GPU: a copy, and the GPU's is dropped
            stats.factor = sparsegpt.inverse_hessian_factor(h, self.dampening, overwrite=True)
            del h
        return stats.factor


def selector_for(
    opts: PruneOptions, *, wanda: Callable[..., torch.Tensor] = wanda_mask
) -> Selector:
    """The selector of ``opts.method`` (magnitude, wanda or sparsegpt); Wanda's by ``wanda``."""
    if opts.method == "sparsegpt":
        return SparseGPTSelector(opts.nm, opts.blocksize, opts.dampening)
    if opts.method == "wanda":
        return WandaSelector(opts.nm, wanda)
    return MagnitudeSelector()


@dataclass(frozen=True)
class Refinement:
    """DSnoT's settings: at most ``iterations`` swaps per row, a row left alone once its
    expected error is at most ``threshold``, over windows of ``window`` tokens."""

    iterations: int
    threshold: float
    window: int


def select_matrix(
    selector: Selector,
    w: torch.Tensor,
    alive: torch.Tensor,
    stats: InputStatistics | None,
    keep: int | None,
    *,
    few: bool,
    copied: bool,
    refine: Refinement | None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One matrix: (its new values, its kept mask, DSnoT's swaps) by ``selector``, the mask
    refined by DSnoT when ``refine`` is given (and the matrix is not ``few``). ``w`` may be
    overwritten when ``copied`` (it is a float32 copy of the stored values)."""
    refining = refine is not None and not few
    new, kept = selector.select(w, alive, stats, keep, few, copied and not refining)
    swaps = 0
    if refine is not None and not few:  # refining
        if stats is None:  # DSnoT's pass gathers the inputs' moments
            raise AssertionError("DSnoT without input statistics")
        mean, var = stats.moments()
        kept, swaps = dsnot_refine(
            w,
            kept,
            mean=mean,
            var=var,
            sq_norms=stats.squares().cpu(),
            window=refine.window,
            alive=alive,
            iterations=refine.iterations,
            threshold=refine.threshold,
        )
        if selector.updates:  # the refined mask's pruned weights, compensated
            del new
            new, kept = selector.refit(w, kept, stats, copied)
    if not selector.updates:
        new = w * kept
    elif new is None:  # a selector that updates the kept weights returns them
        raise AssertionError("no new values from an updating selector")
    return new, kept, swaps
