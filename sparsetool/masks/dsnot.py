"""DSnoT: refine a pruned layer's mask, row by row, without training.

Zhang et al. 2024, "Dynamic Sparse No Training: Training-Free Fine-tuning for Sparse LLMs" (ICLR).
For a linear layer ``y = W x`` pruned to a mask, row ``i``'s *expected reconstruction error* is
``m_i = sum over its pruned j of W[i, j] * mu_j`` (``mu_j``: input ``j``'s mean over the calibration
tokens). While ``window * |m_i|`` (the paper's units: the error of the row's output summed over a
window of ``window`` tokens) is above ``threshold`` (the paper's 0.1), for at most ``iterations``
cycles (the paper's 50), the row swaps one pruned weight in and one kept weight out, both chosen to
shrink ``m_i``:

* grown: among the row's pruned weights whose ``W mu`` has the sign of ``m_i``, the largest
  ``|W mu| / var_j`` (a large correction through a steady input);
* pruned: among its kept weights whose ``W mu`` has the opposite sign, the lowest Wanda score
  ``|W| * ||X_j||`` (the least important).

Each weight moves at most once. One rule is stricter than the authors' code: a swap is made only if
it lowers ``|m_i|`` **and** the row's expected squared error with the inputs taken as independent,
``m_i**2 + sum over pruned j of W[i, j]**2 * var_j`` (the mean alone can fall while the spread
grows: on SmolLM2's query projections, swaps chosen by the mean alone raised the squared error on
the calibration tokens by 68%); a row whose next swap would not stops there. So the refinement
never raises any row's expected error. Every swap keeps one weight for one, so each row keeps
exactly as many weights as before (and the tensor its exact count); a weight that was not
``alive`` is never grown. Ties go to the lower column (stable sorts), so the result is
deterministic.

>>> w = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
>>> kept = torch.tensor([[True, False, True, False]])  # m = 2 + 0.5 = 2.5
>>> ones = torch.ones(4)
>>> new, swaps = dsnot_refine(w, kept, mean=ones, var=ones / 100, sq_norms=ones, window=1)
>>> new, swaps  # 2.0 grown, -1.0 pruned: m = 0.5 - 1.0
(tensor([[ True,  True, False, False]]), 1)
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks.calibration_defaults import DSNOT_ITERATIONS, DSNOT_THRESHOLD

__all__ = ["dsnot_refine"]

_CHUNK = 1 << 21  # weights refined at once: a few sorted index tensors of this size are held


def dsnot_refine(
    w: Tensor,
    kept: Tensor,
    *,
    mean: Tensor,
    var: Tensor,
    sq_norms: Tensor,
    window: float,
    alive: Tensor | None = None,
    iterations: int = DSNOT_ITERATIONS,
    threshold: float = DSNOT_THRESHOLD,
) -> tuple[Tensor, int]:
    """(the refined mask of ``w`` (out, in), the number of swaps made). ``kept`` is the mask to
    refine (True = kept; it is not changed); ``mean``, ``var`` and ``sq_norms`` hold one value per
    input: its mean and variance over the calibration tokens, and its sum of squares; ``window``
    is the tokens of a calibration window (the threshold's units)."""
    rows, cols = w.shape
    if kept.shape != w.shape or any(t.shape != (cols,) for t in (mean, var, sq_norms)):
        raise SparsetoolError(
            f"DSnoT needs a mask like the weight {tuple(w.shape)} and one "
            "mean, variance and norm per input"
        )
    if iterations < 0 or threshold < 0:
        raise SparsetoolError("DSnoT's iterations and threshold must be at least 0")
    out = kept.clone()
    swaps = 0
    step = max(1, _CHUNK // max(cols, 1))
    for r in range(0, rows, step):
        part = slice(r, min(r + step, rows))
        swaps += _refine_rows(
            w[part].double(),
            out[part],
            mean.double(),
            var.double(),
            sq_norms.double(),
            None if alive is None else alive[part].bool(),
            iterations,
            threshold / window,
        )
    return out, swaps


def _ranked(keys: Tensor, allowed: Tensor) -> tuple[Tensor, Tensor]:
    """Per row, the columns of ``allowed`` by ``keys`` from highest (ties: lower column first),
    and how many there are."""
    order = torch.sort(
        keys.masked_fill(~allowed, float("-inf")), dim=1, descending=True, stable=True
    ).indices
    return order, allowed.sum(1)


def _refine_rows(
    w: Tensor,
    kept: Tensor,
    mean: Tensor,
    var: Tensor,
    sq: Tensor,
    alive: Tensor | None,
    iterations: int,
    threshold: float,
) -> int:
    """Refine ``kept`` (these rows) in place; the number of swaps. ``threshold`` is per token."""
    n = w.shape[0]
    d = w * mean.unsqueeze(0)  # each weight's share of its row's expected output
    spread = w * w * var.unsqueeze(0)  # and of its variance, inputs taken as independent
    pruned = ~kept if alive is None else ~kept & alive
    grow_key = d / var.clamp_min(torch.finfo(torch.float64).tiny).unsqueeze(0)
    importance = w.abs() * sq.clamp_min(0).sqrt().unsqueeze(0)
    # Index 1: the lists used while e > 0 (grow a positive share, prune a negative one); 0: e < 0.
    grow = [_ranked(-grow_key, pruned & (d < 0)), _ranked(grow_key, pruned & (d > 0))]
    cut = [_ranked(-importance, kept & (d > 0)), _ranked(-importance, kept & (d < 0))]
    g_order, g_n = torch.stack([grow[0][0], grow[1][0]]), torch.stack([grow[0][1], grow[1][1]], 1)
    c_order, c_n = torch.stack([cut[0][0], cut[1][0]]), torch.stack([cut[0][1], cut[1][1]], 1)
    del grow, cut, grow_key, importance
    e = d.masked_fill(kept, 0).sum(1)
    v = spread.masked_fill(kept, 0).sum(1)
    at_grow = torch.zeros((n, 2), dtype=torch.long)
    at_cut = torch.zeros((n, 2), dtype=torch.long)
    rows = torch.arange(n)
    last = w.shape[1] - 1
    active = torch.ones(n, dtype=torch.bool)
    swaps = 0
    for _ in range(iterations):
        active &= e.abs() > threshold
        side = (e > 0).long()
        g_at, c_at = at_grow[rows, side], at_cut[rows, side]
        active &= (g_at < g_n[rows, side]) & (c_at < c_n[rows, side])
        if not active.any():
            break
        g = g_order[side, rows, g_at.clamp(max=last)]
        c = c_order[side, rows, c_at.clamp(max=last)]
        after = e - d[rows, g] + d[rows, c]
        v_after = v - spread[rows, g] + spread[rows, c]
        active &= (after.abs() < e.abs()) & (after * after + v_after < e * e + v)
        if not active.any():
            break
        ra, sa = rows[active], side[active]
        kept[ra, g[active]] = True
        kept[ra, c[active]] = False
        e = torch.where(active, after, e)
        v = torch.where(active, v_after, v)
        at_grow[ra, sa] += 1
        at_cut[ra, sa] += 1
        swaps += len(ra)
    return swaps
