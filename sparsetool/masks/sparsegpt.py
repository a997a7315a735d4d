"""SparseGPT: prune a linear layer and update its surviving weights to reconstruct its output.

Frantar and Alistarh 2023, "SparseGPT: Massive Language Models Can Be Accurately Pruned in
One-Shot". For ``y = W x`` with ``W`` (out, in) and calibration inputs ``X`` (tokens, in), the
layer's squared reconstruction error ``||W X^T - W' X^T||^2`` has Hessian ``H = X^T X`` (one for
every row). Columns are visited left to right in blocks of ``blocksize``; inside a block the weights
of column ``j`` that are pruned are set to zero and their error ``(w - q) / [H^-1]_jj`` is spread
over the columns after ``j`` by the optimal brain surgeon update ``W[:, j:] -= err [H^-1]_{j, j:}``,
using the upper Cholesky factor of ``H^-1`` (so each column sees the inverse Hessian of the columns
not yet visited). The mask of a block is chosen when the block starts, from the weights as updated
so far, by the score ``w^2 / [chol(H^-1)]_jj^2`` (adaptive mask selection); with N:M, every ``M``
columns choose their pattern when the first of them is reached.

``H`` is dampened by ``dampening * mean(diag H)`` on its diagonal before inversion; inputs that were
always zero (``H_jj = 0``) get ``H_jj = 1`` so the inverse exists. With sparsity 0 nothing is
pruned, so no error is spread and the weights come back unchanged.

Counts are exact: the tensor prunes ``P = numel - keep``, block ``b`` prunes
``floor(P * end_b / numel + 1/2) - floor(P * start_b / numel + 1/2)`` (the shares add up to P), and
each block's selection runs in the one kernel (:func:`sparsetool.masks.kernel.top_k_mask`).

The factor and the sweep run on one torch thread whatever the caller's count
(:func:`sparsetool.util.threads.torch_threads`): MKL's products and LAPACK's Cholesky round
differently on one thread and on two, and the masks chosen after them diverged, so the same
weights and ``X^T X`` give the same bits whatever ``--threads`` says.
"""

from __future__ import annotations

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks.kernel import top_k_mask
from sparsetool.masks.select import nm_kept_count, nm_mask
from sparsetool.util.threads import torch_threads
from sparsetool.util.wording import plural

__all__ = [
    "ROWS",
    "block_prune_counts",
    "inverse_hessian_factor",
    "transpose_square",
    "sparsegpt_prune",
    "sparsegpt_update",
    "sparsegpt_kept_count",
]


ROWS = 1024
"""Rows of a matrix product made at once (the OBS update of the columns after a block, and
``X^T X`` in calibration): a product of ``ROWS x cols`` floats beside its target instead of the
whole. Each entry is the same dot product, in the same order, either way."""


def block_prune_counts(rows: int, cols: int, prune: int, blocksize: int) -> list[int]:
    """How many weights each column block prunes: ``prune`` in all, in proportion to block sizes.

    >>> block_prune_counts(2, 5, 5, 2)
    [2, 2, 1]
    """
    numel = rows * cols
    if not 0 <= prune <= numel:
        raise SparsetoolError(f"cannot prune {prune} of {plural(numel, 'weight')}")
    out, prev = [], 0
    for start in range(0, cols, blocksize):
        end = min(start + blocksize, cols) * rows
        cum = (2 * prune * end + numel) // (2 * numel) if numel else 0
        out.append(cum - prev)
        prev = cum
    return out


@torch_threads(1)
def inverse_hessian_factor(
    h: Tensor, dampening: float = 0.01, *, overwrite: bool = False
) -> Tensor:
    """The upper Cholesky factor of ``(H + d I)^-1``, ``d = dampening * mean(diag H)``, where
    never-active inputs get ``H_jj = 1``. Raises if ``H`` is not positive definite even dampened.

    With ``overwrite`` the factor is computed in ``h``'s own memory (a contiguous square matrix)
    and ``h`` is returned holding it: no other ``in x in`` matrix is made, where the three steps
    out of place would hold two or three at once (and ``d I`` one more). The factor is the same bit
    for bit either way: LAPACK's in-place routines see the same column-major matrix torch's
    out-of-place calls copy ``H`` into (``H`` is symmetric, so its rows are its columns).
    """
    if not overwrite:
        h = h.clone(memory_format=torch.contiguous_format)
    elif not h.is_contiguous():
        raise SparsetoolError("overwrite needs a contiguous X^T X")
    diag = torch.diagonal(h)
    diag[diag == 0] = 1
    damp = dampening * float(diag.mean())
    diag += damp  # what adding damp * I does, without the identity matrix
    col = h.mT  # the same memory as a column-major matrix: what LAPACK works on in place
    try:
        torch.linalg.cholesky(col, out=col)
        torch.cholesky_inverse(col, out=col)
        torch.linalg.cholesky(col, upper=True, out=col)
    except RuntimeError:  # torch.linalg.LinAlgError
        raise SparsetoolError(
            f"X^T X of this layer is not positive definite with dampening {dampening} "
            "(its inputs are nearly collinear); raise --dampening, e.g. to 0.1"
        ) from None
    transpose_square(h)  # row-major again, as the solve reads its rows
    return h


def transpose_square(t: Tensor, block: int = 512) -> None:
    """Transpose the square matrix ``t`` in place, a ``block x block`` tile at a time (one tile of
    extra memory)."""
    n = t.shape[0]
    for i in range(0, n, block):
        ie = min(i + block, n)
        t[i:ie, i:ie] = t[i:ie, i:ie].mT.clone()
        for j in range(ie, n, block):
            je = min(j + block, n)
            upper = t[i:ie, j:je].clone()
            t[i:ie, j:je] = t[j:je, i:ie].mT
            t[j:je, i:ie] = upper.mT


def sparsegpt_prune(
    w: Tensor,
    h: Tensor,
    *,
    keep: int | None = None,
    nm: tuple[int, int] | None = None,
    existing: Tensor | None = None,
    blocksize: int = 128,
    dampening: float = 0.01,
) -> tuple[Tensor, Tensor]:
    """(updated weights, kept mask) of ``w`` (out, in) given ``h = X^T X`` (in, in).

    The math runs in float64 when ``h`` is float64, else float32; the weights come back in that
    dtype. ``existing`` (True = alive) positions that are already pruned are never kept again.
    ``w`` and ``h`` are left as they are; :func:`inverse_hessian_factor` and
    :func:`sparsegpt_update` are the two steps, for a caller that shares one ``H`` between layers
    or can give up its copies.
    """
    _check(w, h.shape, keep, nm, blocksize)
    dt = torch.float64 if h.dtype == torch.float64 else torch.float32
    h_dt, w_dt = h.to(dt).contiguous(), w.to(dt)
    hinv = inverse_hessian_factor(h_dt, dampening, overwrite=h_dt is not h)  # a copy already
    return sparsegpt_update(
        w_dt,
        hinv,
        keep=keep,
        nm=nm,
        existing=existing,
        blocksize=blocksize,
        overwrite=w_dt is not w,
    )


def _check(
    w: Tensor,
    h_shape,
    keep: int | None,
    nm: tuple[int, int] | None,
    blocksize: int,
    fixed: Tensor | None = None,
) -> None:
    if fixed is not None:
        if keep is not None or nm is not None or fixed.shape != w.shape:
            raise SparsetoolError(
                "a fixed mask takes neither keep nor nm, and has the weight's shape"
            )
    elif (keep is None) == (nm is None):
        raise SparsetoolError("give exactly one of keep or nm")
    rows, cols = w.shape
    if tuple(h_shape) != (cols, cols):
        raise SparsetoolError(f"X^T X has shape {tuple(h_shape)}, the weight {tuple(w.shape)}")
    if blocksize < 1 or (nm is not None and blocksize % nm[1]):
        raise SparsetoolError(f"blocksize {blocksize} must be a positive multiple of M")
    if nm is not None and cols % nm[1]:
        raise SparsetoolError(
            f"N:M {nm[0]}:{nm[1]}: the input size {cols} is not divisible by "
            f"{nm[1]}; choose an M that divides it or exclude this tensor"
        )


@torch_threads(1)
def sparsegpt_update(
    w: Tensor,
    hinv: Tensor,
    *,
    keep: int | None = None,
    nm: tuple[int, int] | None = None,
    existing: Tensor | None = None,
    blocksize: int = 128,
    overwrite: bool = False,
    fixed: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`sparsegpt_prune` given the factor ``hinv`` (:func:`inverse_hessian_factor`) instead
    of ``H``: the math runs in ``hinv``'s dtype. With ``overwrite`` the updated weights are
    written into ``w`` itself (of that dtype), which is returned, instead of into a copy.

    With a ``fixed`` mask (True = kept; instead of ``keep`` and ``nm``) nothing is selected: the
    sweep prunes what the mask says and spreads each pruned weight's error over the columns
    after it, as it does for a mask of its own choosing."""
    _check(w, hinv.shape, keep, nm, blocksize, fixed)
    rows, cols = w.shape
    W = w if overwrite and w.dtype == hinv.dtype else w.to(hinv.dtype).clone()
    kept = torch.zeros((rows, cols), dtype=torch.bool) if fixed is None else fixed.bool().clone()
    prunes: list[int] | None = None
    if nm is None and fixed is None:
        if keep is None:  # _check refused it
            raise AssertionError("neither keep, nm nor a fixed mask")
        prunes = block_prune_counts(rows, cols, rows * cols - keep, blocksize)
    for b, i1 in enumerate(range(0, cols, blocksize)):
        i2 = min(i1 + blocksize, cols)
        w1, hinv1 = W[:, i1:i2].clone(), hinv[i1:i2, i1:i2]
        err1 = torch.zeros_like(w1)
        alive = None if existing is None else existing[:, i1:i2].bool()
        diag = torch.diagonal(hinv1)
        if prunes is not None:
            score = w1**2 / diag.unsqueeze(0) ** 2
            kept[:, i1:i2] = top_k_mask(score, w1.numel() - prunes[b], alive)
        for i in range(i2 - i1):
            if fixed is None and nm is not None and i % nm[1] == 0:
                group = slice(i, i + nm[1])
                score = w1[:, group] ** 2 / diag[group].unsqueeze(0) ** 2
                kept[:, i1 + i : i1 + i + nm[1]] = nm_mask(
                    score, nm[0], nm[1], dim=1, existing=None if alive is None else alive[:, group]
                )
            col = w1[:, i]
            q = torch.where(kept[:, i1 + i], col, torch.zeros_like(col))
            err = (col - q) / hinv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) * hinv1[i, i:].unsqueeze(0)
            w1[:, i] = q
            err1[:, i] = err
        W[:, i1:i2] = w1
        for r in range(0, rows, ROWS):  # the product a slice of rows at a time: the same sums
            W[r : r + ROWS, i2:] -= err1[r : r + ROWS] @ hinv[i1:i2, i2:]
    return W, kept


def sparsegpt_kept_count(
    alive: Tensor,
    *,
    keep: int | None = None,
    nm: tuple[int, int] | None = None,
    blocksize: int = 128,
) -> int:
    """How many weights :func:`sparsegpt_prune` keeps of a weight whose ``alive`` (out, in)
    positions are not pruned yet, whatever the Hessian: each column block keeps its share or all
    it has alive. Known before any activation is seen, so a writer can size its output up front.

    >>> alive = torch.tensor([[True, True, False, False], [True, True, False, True]])
    >>> sparsegpt_kept_count(alive, keep=4, blocksize=2)
    3
    """
    if nm is not None:
        return nm_kept_count(alive, nm[0], nm[1], dim=1)
    if keep is None:  # the selectors give one of keep or nm
        raise AssertionError("neither keep nor nm")
    rows, cols = alive.shape
    prunes = block_prune_counts(rows, cols, alive.numel() - keep, blocksize)
    kept = 0
    for b, i1 in enumerate(range(0, cols, blocksize)):
        block = alive[:, i1 : i1 + blocksize]
        kept += min(block.numel() - prunes[b], int(block.sum()))
    return kept
