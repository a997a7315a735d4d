"""OWL: each transformer block's sparsity follows its share of outlier weights.

Yin et al. 2024, "Outlier Weighed Layerwise Sparsity (OWL): A Missing Secret Sauce for Pruning
LLMs to High Sparsity" (ICML). A block's *outlier ratio* is the share of its Wanda scores
``|W[i, j]| * ||X[:, j]||_2`` (over every targeted weight of the block, taken together) that are
above ``m`` times their mean (the paper's M, default 5). Blocks with more outliers are pruned less:
the ratios are scaled linearly onto ``[0, 2 * lam]`` (lambda, default 0.08), centred on their
mean, and each block keeps ``1 - sparsity`` plus its centred value, so the most and the least
pruned blocks lie ``2 * lam`` apart and the sparsities average to the target. (The paper writes
the range as ``target +- lam``; it is that when the centred ratios are symmetric, and shifted
toward the side of the few blocks that stand out otherwise, as in the authors' code.)

Two things here go further than the paper's arithmetic, and say so:

* the mean is weighted by each block's number of targeted weights (the paper's plain mean is the
  same when every block has the same targets, as in the models it prunes), so the total kept stays
  the target's even when ``--include``/``--exclude`` leave blocks uneven;
* counts are exact: every tensor's kept count is an integer, the counts add up to exactly the
  uniform total, ``sum(numel - round(sparsity * numel))`` (largest remainders), and a block's
  sparsity is clipped to [0, 1] before the remainders are spread.

>>> owl_sparsities([0.01, 0.02, 0.03], [10, 10, 10], 0.5, 0.08)
[0.58, 0.5, 0.42]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks.calibration_defaults import OWL_LAMBDA, OWL_M
from sparsetool.masks.distributions import largest_remainder, uniform_keep
from sparsetool.masks.wanda import wanda_scores

__all__ = ["OutlierCount", "owl_sparsities", "owl_keep", "block_sparsity"]


class OutlierCount:
    """One block's outlier ratio, from its targeted weights and their inputs' sums of squares.

    The ratio needs the block's mean score before any score can be counted, so the layers are
    seen twice: :meth:`add_sum` for each, then :meth:`add_count` for each (scores are recomputed
    rather than held: a block's scores are as large as its weights).

    >>> import torch
    >>> c = OutlierCount(m=2.0)
    >>> w, sq = torch.tensor([[1.0, 1.0, 1.0, 9.0]]), torch.ones(4)
    >>> c.add_sum(w, sq); c.add_count(w, sq); c.ratio
    0.25
    """

    def __init__(self, m: float = OWL_M):
        self.m = m
        self.total = 0.0
        self.numel = 0
        self.above = 0

    def add_sum(self, w: Tensor, sq_norms: Tensor) -> None:
        self.total += float(wanda_scores(w, sq_norms).double().sum())
        self.numel += w.numel()

    def add_count(self, w: Tensor, sq_norms: Tensor) -> None:
        if not self.numel:
            raise SparsetoolError("outlier counts need every layer's sum first")
        threshold = self.m * self.total / self.numel
        self.above += int((wanda_scores(w, sq_norms).double() > threshold).sum())

    @property
    def ratio(self) -> float:
        return self.above / self.numel if self.numel else 0.0


def owl_sparsities(
    ratios: Sequence[float], sizes: Sequence[int], sparsity: float, lam: float = OWL_LAMBDA
) -> list[float]:
    """Each block's sparsity from its outlier ratio: spread over ``2 * lam``, lower where the
    ratio is higher, the mean weighted by ``sizes`` (targeted weights) equal to ``sparsity``.
    Equal ratios (or one block) give the target everywhere."""
    if len(ratios) != len(sizes) or not ratios:
        raise SparsetoolError("one outlier ratio and one size per block")
    lo, hi = min(ratios), max(ratios)
    if hi == lo:
        return [float(sparsity)] * len(ratios)
    scaled = [(r - lo) / (hi - lo) * 2 * lam for r in ratios]
    total = sum(sizes)
    mean = sum(s * n for s, n in zip(scaled, sizes)) / total if total else 0.0
    return [round(sparsity - (s - mean), 12) for s in scaled]


def owl_keep(
    blocks: Sequence[Mapping[str, int]], sparsities: Sequence[float], sparsity: float
) -> dict[str, int]:
    """Kept counts of each tensor (``blocks[b]``: name -> numel of block b's targets) at its
    block's sparsity, adding up to exactly the uniform total at ``sparsity``."""
    numel = {name: n for block in blocks for name, n in block.items()}
    target = sum(uniform_keep(numel, sparsity).values())
    real = {
        name: (1.0 - min(1.0, max(0.0, s))) * n
        for block, s in zip(blocks, sparsities)
        for name, n in block.items()
    }
    return largest_remainder(real, numel, target)


def block_sparsity(keep: Mapping[str, int], block: Mapping[str, int]) -> float:
    """The sparsity a block's kept counts give."""
    n = sum(block.values())
    return 1.0 - sum(keep[name] for name in block) / n if n else 0.0
