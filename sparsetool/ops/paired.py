"""Paired comparison of two checkpoints scored on the same items: is a difference more than noise?

Two checkpoints evaluated on the same documents (task accuracy) or the same windows of a text
(perplexity) make *paired* measurements: an item that is hard for one is hard for the other, so
the difference of their means is known far better than the two means' own errors suggest. The
interval of a difference is a percentile bootstrap over the items: the items are drawn with
replacement ``resamples`` times (10,000 by default) from a seeded numpy generator, the statistic
is recomputed on each draw, and the 2.5% and 97.5% quantiles bound the 95% interval. Nothing is
assumed about the items' distribution (0/1 accuracies, per-window log-losses), identical inputs
give the degenerate interval ``[0, 0]``, and the same seed gives the same interval.

- :func:`mean_difference`: mean of ``b - a`` over the items (one task's accuracy, B minus A);
- :func:`mean_of_differences`: the mean over several groups of each group's mean difference
  (the mean accuracy over tasks), each group resampled on its own;
- :func:`loss_ratio`: ``exp((sum(b) - sum(a)) / sum(tokens))`` for per-window log-loss sums, the
  perplexity ratio B / A, with the windows resampled.

Each returns an :class:`Interval`; ``inside_noise`` says that its interval holds the value of no
change (0 for a difference, 1 for a ratio). numpy only: no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CONFIDENCE",
    "RESAMPLES",
    "SEED",
    "Interval",
    "loss_ratio",
    "mean_difference",
    "mean_of_differences",
    "method",
]

RESAMPLES = 10_000
SEED = 0
CONFIDENCE = 0.95
# Draws are made this many numbers at a time at most (resamples x items), whatever the sizes.
CHUNK = 2**22
# At most this many distinct items are drawn as counts of each (a multinomial draw per resample,
# exact and fast for 0/1 accuracies, whose differences take three values); more are drawn item by
# item.
DISTINCT = 16


@dataclass(frozen=True)
class Interval:
    """``estimate`` with its paired ``confidence`` interval ``[low, high]`` over ``items`` paired
    items; ``null`` is the value of no change (0 for a difference, 1 for a ratio)."""

    estimate: float
    low: float
    high: float
    items: int
    null: float = 0.0
    confidence: float = CONFIDENCE

    @property
    def inside_noise(self) -> bool:
        """Whether the interval holds no change: the difference is not told apart from noise."""
        return self.low <= self.null <= self.high

    def to_json(self) -> dict:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "items": self.items,
            "inside_noise": self.inside_noise,
        }


def method(resamples: int = RESAMPLES, seed: int = SEED, confidence: float = CONFIDENCE) -> dict:
    """How the intervals are made, as recorded beside them (``--json``)."""
    return {
        "method": "paired percentile bootstrap",
        "confidence": confidence,
        "resamples": resamples,
        "seed": seed,
    }


def _resampled_sums(rows: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``(resamples, k)``: for each draw of ``len(rows)`` rows with replacement, the column sums of
    the drawn rows. Few distinct rows are drawn as counts of each (a multinomial), exactly the
    same distribution; many are drawn row by row, a bounded chunk of draws at a time."""
    n = len(rows)
    distinct, counts = np.unique(rows, axis=0, return_counts=True)
    out = np.empty((resamples, rows.shape[1]))
    if len(distinct) <= DISTINCT:
        p = counts / n
        step = max(1, CHUNK // len(distinct))
        for lo in range(0, resamples, step):
            hi = min(resamples, lo + step)
            out[lo:hi] = rng.multinomial(n, p, size=hi - lo) @ distinct
        return out
    step = max(1, CHUNK // n)
    columns = [np.ascontiguousarray(rows[:, k]) for k in range(rows.shape[1])]
    for lo in range(0, resamples, step):
        hi = min(resamples, lo + step)
        picks = rng.integers(0, n, size=(hi - lo, n), dtype=np.int32 if n < 2**31 else np.int64)
        for k, column in enumerate(columns):
            out[lo:hi, k] = np.take(column, picks).sum(axis=1)
    return out


def _paired(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(
            f"paired values need one value per item on each side, got {x.shape} and {y.shape}"
        )
    if not len(x):
        raise ValueError("a paired comparison needs at least one item")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("paired values must be finite")
    return y - x


def _bounds(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return float(low), float(high)


def mean_of_differences(
    groups: Sequence[tuple[Sequence[float], Sequence[float]]],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The mean over ``groups`` of each group's mean of ``b - a`` (each group a pair of equally
    long sequences, item ``i`` of ``a`` paired with item ``i`` of ``b``), with its interval:
    each group's items are resampled within the group, the groups in the order given.

    >>> mean_of_differences([([1, 1, 0, 0], [1, 1, 0, 0]), ([0, 1], [0, 1])])
    Interval(estimate=0.0, low=0.0, high=0.0, items=6, null=0.0, confidence=0.95)
    """
    if not groups:
        raise ValueError("a paired comparison needs at least one group of items")
    rng = np.random.default_rng(seed)
    diffs = [_paired(a, b) for a, b in groups]
    stats = np.zeros(resamples)
    for d in diffs:
        stats += _resampled_sums(d[:, None], resamples, rng)[:, 0] / len(d)
    stats /= len(diffs)
    estimate = float(np.mean([d.mean() for d in diffs]))
    low, high = _bounds(stats, confidence)
    return Interval(estimate, low, high, sum(len(d) for d in diffs), 0.0, confidence)


def mean_difference(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The mean of ``b - a`` over paired items (B's accuracy minus A's on the same documents),
    with its bootstrap interval.

    Two items of eight that only B gets right are no evidence yet; sixty of 240 are:

    >>> r = mean_difference([1, 0, 1, 1, 0, 1, 0, 1], [1, 1, 1, 1, 0, 1, 1, 1])
    >>> r.estimate, r.inside_noise
    (0.25, True)
    >>> mean_difference([1, 0, 1, 1, 0, 1, 0, 1] * 30, [1, 1, 1, 1, 0, 1, 1, 1] * 30).inside_noise
    False
    """
    return mean_of_differences([(a, b)], resamples=resamples, seed=seed, confidence=confidence)


def loss_ratio(
    a: Sequence[float],
    b: Sequence[float],
    tokens: Sequence[int],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    confidence: float = CONFIDENCE,
) -> Interval:
    """The perplexity ratio B / A, ``exp((sum(b) - sum(a)) / sum(tokens))``, from each window's
    summed log-loss (nats) under A and B and its scored ``tokens``, with the interval of a
    bootstrap over the windows (a window's loss difference and its tokens drawn together). The
    windows are the unit: tokens within one are not independent draws.

    >>> r = loss_ratio([10.0, 12.0], [10.0, 12.0], [5, 6])
    >>> r.estimate, r.low, r.high, r.inside_noise
    (1.0, 1.0, 1.0, True)
    """
    d = _paired(a, b)
    n = np.asarray(tokens, dtype=np.float64)
    if n.shape != d.shape or (n <= 0).any():
        raise ValueError("each window needs its positive count of scored tokens")
    rng = np.random.default_rng(seed)
    sums = _resampled_sums(np.stack([d, n], axis=1), resamples, rng)
    stats = np.exp(sums[:, 0] / sums[:, 1])
    low, high = _bounds(stats, confidence)
    estimate = math.exp(float(d.sum()) / float(n.sum()))
    return Interval(estimate, low, high, len(d), 1.0, confidence)
