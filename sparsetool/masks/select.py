"""Pure tensor -> mask functions with exact counts: magnitude, random, N:M, and global magnitude.

A mask is a bool array of the weight's shape, True = kept: a numpy array for numpy input (a float
array's bit patterns with ``dtype=`` its safetensors name, or a native numpy float array), a torch
tensor on the input's device for torch input (the selection itself runs in numpy either way, see
:mod:`sparsetool.masks.kernel`; torch is imported only by a caller that has a tensor). Every
function here:

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
values for non-negative floats, and ``np.partition`` over the available non-zero keys finds the
threshold key. Then every key above the threshold is kept, plus the first ``keep - above`` keys
equal to it.

Global scope (one magnitude threshold across many tensors, streamed) lives in
:mod:`sparsetool.masks.global_magnitude` and is re-exported here; its module docstring gives the
pass protocol.

>>> import torch
>>> w = torch.tensor([[0.5, -2.0, 0.0, 1.0], [1.0, 3.0, -0.5, 0.25]])
>>> magnitude_mask(w, 0.5)
tensor([[False,  True, False,  True],
        [ True,  True, False, False]])
>>> magnitude_mask(w.to(torch.bfloat16).view(torch.int16).numpy(), 0.5, dtype="BF16")
array([[False,  True, False,  True],
       [ True,  True, False, False]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sparsetool.errors import SparsetoolError
from sparsetool.masks.chunks import map_chunks, row_step
from sparsetool.masks.kernel import resolve_keep, select_top
from sparsetool.masks.keys import (
    bool_array,
    flat_existing,
    float_int_view,
    int_keys,
    is_torch,
    like,
    magnitude_keys,
    shape_of,
)

__all__ = ["magnitude_mask", "random_keys", "random_mask", "nm_kept_count", "nm_mask"]


def magnitude_mask(
    w: Any,
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Any = None,
    dtype: str | None = None,
) -> Any:
    """Keep the ``keep`` largest |w| (or ``numel - round(sparsity * numel)``); True = kept.

    Magnitude pruning (Han et al. 2015, "Learning both Weights and Connections"): the score of a
    weight is |w|. Ties keep the lower flat index; NaN is never kept; where ``existing`` is False
    nothing is kept, and if fewer than ``keep`` are alive, all alive are kept. -0.0 equals 0.0.
    Exact and O(n) (a selection on the bit pattern of |w|, see the module docstring). ``w`` is a
    torch tensor (a torch mask comes back) or numpy bit patterns with ``dtype`` (a numpy mask).

    >>> import torch
    >>> magnitude_mask(torch.tensor([0.1, -0.9, 0.5, 0.3]), 0.5)
    tensor([False,  True,  True, False])
    >>> alive = np.array([True, False, True, True])
    >>> magnitude_mask(np.array([0x3F80] * 4, dtype=np.int16), keep=3, existing=alive, dtype="BF16")
    array([ True, False,  True,  True])
    """
    shape = shape_of(w)
    k = resolve_keep(math.prod(shape), sparsity, keep)
    alive = flat_existing(existing, shape)
    out = select_top(magnitude_keys(w, alive, dtype=dtype), k)
    assert out is not None
    return like(out.reshape(shape), w)


_DRAW = 1 << 20  # draws per call of the generator: a bounded temporary


def random_keys(n: int, seed: int) -> np.ndarray:
    """The 30-bit draws of ``torch.randint(0, 2**30, (n,), dtype=torch.int32,
    generator=torch.Generator().manual_seed(seed))``, bit for bit, made in numpy: torch's CPU
    generator is MT19937 seeded with the low 32 bits of the seed, and each draw below 2**32 takes
    two 32-bit outputs, the second of which holds the low bits."""
    bg = np.random.MT19937(0)
    bg._legacy_seeding(int(seed) & 0xFFFF_FFFF)
    out = np.empty(n, dtype=np.int32)
    for a in range(0, n, _DRAW):
        b = min(a + _DRAW, n)
        raw = bg.random_raw(2 * (b - a))
        out[a:b] = raw[1::2] & ((1 << 30) - 1)
    return out


def random_mask(
    shape: Sequence[int],
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Any = None,
    generator: Any = None,
    seed: int | None = None,
    as_numpy: bool = False,
) -> Any:
    """Keep exactly ``keep`` positions chosen uniformly at random (random pruning, as SET's
    initial topology, Mocanu et al. 2018); True = kept.

    Reproducible: the same ``seed`` (or a torch generator in the same state) gives the same mask.
    With neither, seed 0 is used. Give one generator and call in a fixed order to get a different
    mask per tensor. Composes like :func:`magnitude_mask`: only alive positions of ``existing``
    can be kept. The mask is a numpy array when ``existing`` is one or ``as_numpy`` is set, else
    a torch tensor (on ``existing``'s device); with a seed the draws are made in numpy, equal to
    torch's (:func:`random_keys`).

    >>> int(random_mask((2, 4), 0.5, seed=0, as_numpy=True).sum())
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
        bits = random_keys(numel, 0 if seed is None else int(seed))
    else:  # the caller's torch stream, drawn as torch draws it
        import torch

        bits = (
            torch.randint(0, 1 << 30, shape, generator=generator, dtype=torch.int32)
            .reshape(-1)
            .numpy()
        )
    # Random 30-bit keys below the "inf" key 2**30 (room above for the "dead" key); the rare
    # ties among them are broken by index, deterministically.
    alive = flat_existing(existing, shape)
    out = select_top(int_keys(bits, 31, 1 << 30, alive), k)
    assert out is not None
    out = out.reshape(shape)
    if as_numpy or (existing is not None and not is_torch(existing)):
        return out
    if existing is not None:
        return like(out, existing)
    import torch

    return torch.from_numpy(out)


def nm_kept_count(alive: Any, n: int, m: int, dim: int = -1) -> int:
    """How many weights :func:`nm_mask` keeps given the ``alive`` ones, whatever their values:
    ``min(n, alive)`` in each group of ``m`` along ``dim``.

    >>> nm_kept_count(np.array([[True, True, True, False, False, False, False, True]]), 2, 4)
    3
    """
    a = bool_array(alive)
    size = a.shape[dim]
    if size % m:
        raise SparsetoolError(
            f"N:M {n}:{m}: the size along dimension {dim % a.ndim} is {size}, not divisible by "
            f"{m}; choose an M that divides it or exclude this tensor"
        )
    groups = np.moveaxis(a, dim, -1).reshape(-1, size // m, m)
    return int(np.minimum(groups.sum(-1), n).sum())


def nm_mask(
    w: Any, n: int, m: int, *, dim: int = -1, existing: Any = None, dtype: str | None = None
) -> Any:
    """N:M pattern: keep the ``n`` largest |w| in every group of ``m`` consecutive weights along
    ``dim`` (the input dimension, see :func:`sparsetool.targets.input_dim`); True = kept.

    The structured pattern of NVIDIA's sparse tensor cores (2:4; Mishra et al. 2021,
    "Accelerating Sparse Deep Neural Networks"). Ties keep the lower index, NaN is never kept, dead
    positions of ``existing`` stay dead (a group with fewer than ``n`` alive keeps fewer). ``w``
    as in :func:`magnitude_mask`.

    >>> import torch
    >>> nm_mask(torch.tensor([[1.0, -4.0, 3.0, 2.0, 0.0, 0.0, 0.0, 5.0]]), 2, 4)
    tensor([[False,  True,  True, False,  True, False, False,  True]])
    """
    if isinstance(n, bool) or isinstance(m, bool) or int(n) != n or int(m) != m:
        raise SparsetoolError(f"N:M needs integers, got {n!r}:{m!r}")
    n, m = int(n), int(m)
    if m < 1 or not 0 <= n <= m:
        raise SparsetoolError(
            f"N:M must have 0 <= N <= M and M >= 1 (keep N of every M), got {n}:{m}"
        )
    shape = shape_of(w)
    ndim = len(shape)
    if ndim == 0:
        raise SparsetoolError("N:M needs a tensor with at least one dimension")
    if not -ndim <= dim < ndim:
        raise SparsetoolError(f"dim {dim} is out of range for a tensor of shape {shape}")
    size = shape[dim]
    if size % m:
        raise SparsetoolError(
            f"N:M {n}:{m}: the size along dimension {dim % ndim} is {size}, not divisible by {m}; "
            "choose an M that divides it or exclude this tensor"
        )
    src, nbits, inf = float_int_view(w, dtype)
    full = (1 << nbits) - 1
    alive = flat_existing(existing, shape)
    d = dim % ndim
    inner = math.prod(shape[d + 1 :])
    row = m * inner  # one row = the groups at one (outer, group) position, side by side
    mask = np.empty(src.size, dtype=np.bool_)

    def part(a: int, b: int) -> None:
        keys = src[a:b] & full  # non-negative, so -1 is free to mean "dead"
        dead = keys > inf
        if alive is not None:
            dead |= ~alive[a:b]
        np.copyto(keys, -1, where=dead)
        keys = keys.reshape(-1, m, inner)  # groups run along axis 1
        out = mask[a:b].reshape(-1, m, inner)
        if m > 16:  # a stable sort keeps the lower index first among equal magnitudes
            order = np.argsort(-keys, axis=1, kind="stable")[:, :n]
            out.fill(False)
            np.put_along_axis(out, order, True, axis=1)
            out &= keys >= 0
            return
        # Small M: each weight's rank in its group by pairwise comparison (M passes, no sort);
        # an earlier equal weight outranks a later one.
        for j in range(m):
            kj = keys[:, j]
            rank = np.zeros(kj.shape, dtype=np.uint8)
            for i in range(m):
                if i != j:
                    rank += keys[:, i] >= kj if i < j else keys[:, i] > kj
            np.logical_and(rank < n, kj >= 0, out=out[:, j])

    map_chunks(part, src.size, step=row_step(row))
    return like(mask.reshape(shape), w)
