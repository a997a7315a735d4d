"""Wanda: prune by weight magnitude times input activation norm, compared within each output row.

Sun, Liu, Bair and Kolter 2023, "A Simple and Effective Pruning Approach for Large Language Models".
For a linear layer ``y = W x`` with ``W`` of shape (out, in) and calibration inputs ``X`` (tokens,
in), the score of ``W[i, j]`` is ``|W[i, j]| * ||X[:, j]||_2``; each output row keeps its
highest-scoring weights (the paper's per-output comparison group), and the surviving weights are
not changed. Everything here works on the (out, in) orientation; a GPT-2 ``Conv1D`` weight is
transposed by the caller.

Counts are exact: a tensor asked to keep ``keep`` weights prunes ``P = numel - keep``, spread over
the rows as evenly as integers allow (the first ``P mod rows`` rows prune one more), and each row's
selection runs in the one kernel (:func:`sparsetool.masks.kernel.top_k_mask`: ties to the lower
index, never a dead position). N:M keeps the ``N`` highest scores of every ``M`` consecutive inputs
(:func:`sparsetool.masks.select.nm_mask` on the scores).

>>> w = torch.tensor([[1.0, -2.0, 3.0, 0.5], [4.0, 1.0, -1.0, 2.0]])
>>> x_sq = torch.tensor([100.0, 1.0, 1.0, 100.0])  # sum of squares of each input column
>>> wanda_scores(w, x_sq)
tensor([[10.,  2.,  3.,  5.],
        [40.,  1.,  1., 20.]])
>>> wanda_mask(w, x_sq, keep=4)
tensor([[ True, False, False,  True],
        [ True, False, False,  True]])
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks.kernel import top_k_mask
from sparsetool.masks.select import nm_kept_count, nm_mask
from sparsetool.util.wording import plural

__all__ = ["wanda_scores", "row_prune_counts", "row_top_k", "wanda_mask", "wanda_kept_count"]


def wanda_scores(w: Tensor, sq_norms: Tensor) -> Tensor:
    """``|W| * sqrt(sq_norms)`` in float32 (float64 for a float64 ``w``): ``w`` is (out, in),
    ``sq_norms`` the sum over calibration tokens of each input feature's square, shape (in,)."""
    if w.ndim != 2 or sq_norms.shape != (w.shape[1],):
        raise SparsetoolError(
            f"Wanda needs a weight (out, in) and one norm per input; got "
            f"{tuple(w.shape)} and {tuple(sq_norms.shape)}"
        )
    dt = torch.float64 if w.dtype == torch.float64 else torch.float32
    return w.to(dt).abs() * sq_norms.to(dt).clamp_min(0).sqrt().unsqueeze(0)


def row_prune_counts(rows: int, cols: int, prune: int) -> list[int]:
    """``prune`` weights spread over ``rows`` rows of ``cols``: as even as possible, the first rows
    taking the remainder.

    >>> row_prune_counts(3, 4, 7)
    [3, 2, 2]
    """
    if not 0 <= prune <= rows * cols:
        raise SparsetoolError(f"cannot prune {prune} of {plural(rows * cols, 'weight')}")
    base, extra = divmod(prune, rows) if rows else (0, 0)
    return [base + (1 if r < extra else 0) for r in range(rows)]


def row_top_k(scores: Tensor, keeps: list[int], allowed: Tensor | None = None) -> Tensor:
    """Row ``r`` keeps its ``keeps[r]`` highest scores (among ``allowed``), by the one kernel."""
    out = torch.zeros(scores.shape, dtype=torch.bool)
    for r, k in enumerate(keeps):
        out[r] = top_k_mask(scores[r], k, None if allowed is None else allowed[r])
    return out


def wanda_mask(
    w: Tensor,
    sq_norms: Tensor,
    *,
    keep: int | None = None,
    nm: tuple[int, int] | None = None,
    existing: Tensor | None = None,
) -> Tensor:
    """The kept positions of ``w`` (out, in): ``keep`` weights in all, or N:M along the input.

    ``existing`` (True = alive) positions that are already pruned are never kept again; a row with
    fewer alive weights than its share keeps them all.
    """
    scores = wanda_scores(w, sq_norms)
    if (keep is None) == (nm is None):
        raise SparsetoolError("give exactly one of keep or nm")
    if nm is not None:
        return nm_mask(scores, nm[0], nm[1], dim=1, existing=existing)
    if keep is None:  # refused above
        raise AssertionError("neither keep nor nm")
    rows, cols = w.shape
    if not 0 <= keep <= w.numel():
        raise SparsetoolError(f"keep must be from 0 to {w.numel()}, got {keep}")
    prunes = row_prune_counts(rows, cols, w.numel() - keep)
    return row_top_k(scores, [cols - p for p in prunes], existing)


def wanda_kept_count(
    alive: Tensor, *, keep: int | None = None, nm: tuple[int, int] | None = None
) -> int:
    """How many weights :func:`wanda_mask` keeps of a weight whose ``alive`` (out, in) positions
    are not pruned yet, whatever the scores: each row keeps its share or all it has alive. Known
    before any activation is seen, so a writer can size its output up front.

    >>> alive = torch.tensor([[True, True, True, True], [True, False, False, False]])
    >>> (
    ...     wanda_kept_count(alive, keep=4),
    ...     int(wanda_mask(torch.ones(2, 4), torch.ones(4), keep=4, existing=alive).sum()),
    ... )
    (3, 3)
    """
    if nm is not None:
        return nm_kept_count(alive, nm[0], nm[1], dim=1)
    if keep is None:  # the selectors give one of keep or nm
        raise AssertionError("neither keep nor nm")
    rows, cols = alive.shape
    prunes = row_prune_counts(rows, cols, alive.numel() - keep)
    shares = torch.tensor([cols - p for p in prunes], dtype=torch.long)
    return int(torch.minimum(shares, alive.sum(1)).sum())
