"""Pure tensor -> mask functions with exact counts: magnitude, random, N:M, and global magnitude.

A mask is a bool tensor of the weight's shape, True = kept. Every function here:

- keeps an exact number of weights (``keep``), so "sparsity S" means ``round(S * numel)`` zeros
  (:func:`sparsity_keep`) and "prune a fraction F of the remaining non-zeros" means keeping
  ``nnz - round(F * nnz)`` (:func:`fraction_keep`), as in iterative magnitude pruning
  (Frankle & Carbin 2019; Han et al. 2015). ``round`` is Python's (halves go to the even integer);
- breaks ties deterministically: among equal magnitudes the lower flat (row-major) index is kept;
- composes: with ``existing`` (a bool mask, True = still alive) a position that is already pruned is
  never kept again, and if fewer than ``keep`` positions are alive all of them are kept;
- never keeps NaN.

Every selection runs in the one kernel, :mod:`sparsetool.masks.kernel` (also the trainer's
drop/grow top-k, :func:`top_k_mask`, re-exported here). Magnitude selection is exact and O(n): |w|
is read as the IEEE bit pattern of its absolute value, whose integer order is the order of the
values for non-negative floats, and a radix select finds the
threshold key with histograms (``torch.bincount``) of 15/16-bit digits: one 32768-bin pass for
bf16/fp16, a second 65536-bin pass inside the boundary bucket for fp32 (four for fp64). Then every
key above the threshold is kept, plus the first ``keep - above`` keys equal to it.

Global scope (one magnitude threshold across many tensors, streamed) lives in
:mod:`sparsetool.masks.global_magnitude` and is re-exported here; its module docstring gives the pass
protocol.

>>> w = torch.tensor([[0.5, -2.0, 0.0, 1.0], [1.0, 3.0, -0.5, 0.25]])
>>> magnitude_mask(w, 0.5)
tensor([[False,  True, False,  True],
        [ True,  True, False, False]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks import kernel
from sparsetool.masks.counts import check_fraction, check_sparsity, fraction_keep, sparsity_keep
from sparsetool.masks.global_magnitude import (
    GlobalPlan,
    MagnitudeHistogram,
    TensorPlan,
    apply_threshold,
    global_magnitude_masks,
    global_threshold_plan,
)
from sparsetool.masks.kernel import (
    flat_existing,
    float_int_view,
    int_keys,
    magnitude_keys,
    map_chunks,
    resolve_keep,
    select_top,
    top_k_mask,
)

__all__ = [
    "magnitude_mask", "random_mask", "nm_mask", "nm_kept_count", "fraction_keep", "sparsity_keep",
    "check_sparsity", "check_fraction",
    "MagnitudeHistogram", "TensorPlan", "GlobalPlan", "global_threshold_plan", "apply_threshold",
    "global_magnitude_masks", "top_k_mask",
]


def magnitude_mask(
    w: Tensor,
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Tensor | None = None,
) -> Tensor:
    """Keep the ``keep`` largest |w| (or ``numel - round(sparsity * numel)``); True = kept.

    Magnitude pruning (Han et al. 2015, "Learning both Weights and Connections"): the score of a
    weight is |w|. Ties keep the lower flat index; NaN is never kept; where ``existing`` is False
    nothing is kept, and if fewer than ``keep`` are alive, all alive are kept. -0.0 equals 0.0.
    Exact and O(n) (a radix select on the bit pattern of |w|, see the module docstring).

    >>> magnitude_mask(torch.tensor([0.1, -0.9, 0.5, 0.3]), 0.5)
    tensor([False,  True,  True, False])
    >>> alive = torch.tensor([True, False, True, True])
    >>> magnitude_mask(torch.tensor([1.0, 1.0, 1.0, 1.0]), keep=3, existing=alive)
    tensor([ True, False,  True,  True])
    """
    k = resolve_keep(w.numel(), sparsity, keep)
    alive = flat_existing(existing, w.shape)
    return select_top(magnitude_keys(w, alive), k).reshape(w.shape)


def random_mask(
    shape: Sequence[int] | torch.Size,
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
) -> Tensor:
    """Keep exactly ``keep`` positions chosen uniformly at random (random pruning, as SET's
    initial topology, Mocanu et al. 2018); True = kept.

    Reproducible: the same ``seed`` (or a generator in the same state) gives the same mask. With
    neither, seed 0 is used. Give one generator and call in a fixed order to get a different mask
    per tensor. Composes like :func:`magnitude_mask`: only alive positions of ``existing`` can be
    kept.

    >>> random_mask((2, 4), 0.5, seed=0).sum().item()
    4
    >>> bool((random_mask((8, 8), 0.5, seed=3) == random_mask((8, 8), 0.5, seed=3)).all())
    True
    """
    shape = tuple(int(s) for s in shape)
    numel = math.prod(shape)
    k = resolve_keep(numel, sparsity, keep)
    if generator is not None and seed is not None:
        raise SparsetoolError("give a generator or a seed, not both")
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
    # Random 30-bit keys below the "inf" key 2**30 (room above for the "dead" key); the rare
    # ties among them are broken by index, deterministically.
    bits = torch.randint(0, 1 << 30, shape, generator=generator, dtype=torch.int32).reshape(-1)
    alive = flat_existing(existing, torch.Size(shape))
    return select_top(int_keys(bits, 31, 1 << 30, alive), k).reshape(shape)


def nm_kept_count(alive: Tensor, n: int, m: int, dim: int = -1) -> int:
    """How many weights :func:`nm_mask` keeps given the ``alive`` ones, whatever their values:
    ``min(n, alive)`` in each group of ``m`` along ``dim``.

    >>> nm_kept_count(torch.tensor([[True, True, True, False, False, False, False, True]]), 2, 4)
    3
    """
    size = alive.shape[dim]
    if size % m:
        raise SparsetoolError(
            f"N:M {n}:{m}: the size along dimension {dim % alive.ndim} is {size}, not divisible by "
            f"{m}; choose an M that divides it or exclude this tensor")
    groups = alive.movedim(dim, -1).reshape(-1, size // m, m)
    return int(groups.sum(-1).clamp(max=n).sum())


def nm_mask(
    w: Tensor, n: int, m: int, *, dim: int = -1, existing: Tensor | None = None
) -> Tensor:
    """N:M pattern: keep the ``n`` largest |w| in every group of ``m`` consecutive weights along
    ``dim`` (the input dimension, see :func:`sparsetool.targets.input_dim`); True = kept.

    The structured pattern of NVIDIA's sparse tensor cores (2:4; Mishra et al. 2021,
    "Accelerating Sparse Deep Neural Networks"). Ties keep the lower index, NaN is never kept, dead
    positions of ``existing`` stay dead (a group with fewer than ``n`` alive keeps fewer).

    >>> nm_mask(torch.tensor([[1.0, -4.0, 3.0, 2.0, 0.0, 0.0, 0.0, 5.0]]), 2, 4)
    tensor([[False,  True,  True, False,  True, False, False,  True]])
    """
    if isinstance(n, bool) or isinstance(m, bool) or int(n) != n or int(m) != m:
        raise SparsetoolError(f"N:M needs integers, got {n!r}:{m!r}")
    n, m = int(n), int(m)
    if m < 1 or not 0 <= n <= m:
        raise SparsetoolError(f"N:M must have 0 <= N <= M and M >= 1 (keep N of every M), got {n}:{m}")
    if w.ndim == 0:
        raise SparsetoolError("N:M needs a tensor with at least one dimension")
    if not -w.ndim <= dim < w.ndim:
        raise SparsetoolError(f"dim {dim} is out of range for a tensor of shape {tuple(w.shape)}")
    size = w.shape[dim]
    if size % m:
        raise SparsetoolError(
            f"N:M {n}:{m}: the size along dimension {dim % w.ndim} is {size}, not divisible by {m}; "
            "choose an M that divides it or exclude this tensor"
        )
    src, nbits, inf = float_int_view(w)
    full = (1 << nbits) - 1
    alive = flat_existing(existing, w.shape)
    d = dim % w.ndim
    inner = math.prod(w.shape[d + 1:])
    row = m * inner  # one row = the groups at one (outer, group) position, side by side
    mask = torch.empty(w.numel(), dtype=torch.bool)

    def part(a: int, b: int) -> None:
        keys = src[a:b] & full  # non-negative, so -1 is free to mean "dead"
        dead = keys > inf
        if alive is not None:
            dead |= ~alive[a:b]
        keys = keys.masked_fill_(dead, -1).view(-1, m, inner)  # groups run along axis 1
        out = mask[a:b].view(-1, m, inner)
        if m > 16:  # a stable descending sort keeps the lower index first among equal magnitudes
            order = torch.sort(keys, dim=1, descending=True, stable=True).indices[:, :n]
            out.zero_().scatter_(1, order, True)
            out &= keys >= 0
            return
        # Small M: each weight's rank in its group by pairwise comparison (M passes, no sort);
        # an earlier equal weight outranks a later one.
        for j in range(m):
            kj = keys[:, j]
            rank = torch.zeros(kj.shape, dtype=torch.uint8)
            for i in range(m):
                if i != j:
                    rank += keys[:, i] >= kj if i < j else keys[:, i] > kj
            torch.logical_and(rank < n, kj >= 0, out=out[:, j])

    map_chunks(part, w.numel(), step=kernel.row_step(row))
    return mask.reshape(w.shape)
