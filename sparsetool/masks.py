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

Magnitude selection is exact and O(n): |w| is read as the IEEE bit pattern of its absolute value,
whose integer order is the order of the values for non-negative floats, and a radix select finds the
threshold key with histograms (``torch.bincount``) of 15/16-bit digits: one 32768-bin pass for
bf16/fp16, a second 65536-bin pass inside the boundary bucket for fp32 (four for fp64). Then every
key above the threshold is kept, plus the first ``keep - above`` keys equal to it.

Global scope (one magnitude threshold across many tensors, "global magnitude pruning" as in
Blalock et al. 2020, "What is the state of neural network pruning?") is done in streaming passes
over tensors that never sit in memory together. All tensors are compared on one scale: the fp32 bit
pattern of |w| (bf16, fp16 and fp8 convert to fp32 exactly; fp64 is compared at fp32 precision).
The pass protocol, with ``load(name)`` reading one tensor and ``alive(name)`` its existing mask
(or None)::

    names = [...]                                   # the targeted tensors, in checkpoint order
    keep = sparsity_keep(sum(numels), sparsity)     # or fraction_keep(total_nnz, fraction)
    # pass 1: one coarse histogram (32768 int64 counters) per tensor
    hists = [MagnitudeHistogram.of(load(n), alive(n)) for n in names]
    plan = global_threshold_plan(hists, keep)
    # pass 2, only if the boundary bucket holds distinct fp16/fp32 values: re-read the few tensors
    # that have entries in that bucket (plan.refine lists their indices)
    if not plan.done:
        fine = {i: MagnitudeHistogram.of(load(names[i]), alive(names[i]), refine=plan.refine_bucket)
                for i in plan.refine}
        plan = global_threshold_plan(hists, keep, refined=fine)
    # pass 3: mask and write each tensor
    for i, n in enumerate(names):
        mask = apply_threshold(load(n), plan.tensors[i], alive(n))

The plan is exact: the total kept equals ``keep`` (or every alive weight if fewer), every kept
|w| >= every dropped alive |w|, and ties at the threshold go to earlier tensors first, then to lower
flat indices.

>>> w = torch.tensor([[0.5, -2.0, 0.0, 1.0], [1.0, 3.0, -0.5, 0.25]])
>>> magnitude_mask(w, 0.5)
tensor([[False,  True, False,  True],
        [ True,  True, False, False]])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError

__all__ = [
    "magnitude_mask", "random_mask", "nm_mask", "fraction_keep", "sparsity_keep",
    "check_sparsity", "check_fraction",
    "MagnitudeHistogram", "TensorPlan", "GlobalPlan", "global_threshold_plan", "apply_threshold",
    "global_magnitude_masks",
]

# (integer view dtype, number of magnitude bits) for each float dtype read bit-for-bit.
_LAYOUT = {
    torch.bfloat16: (torch.int16, 15),
    torch.float16: (torch.int16, 15),
    torch.float32: (torch.int32, 31),
    torch.float64: (torch.int64, 63),
}
_F32_INF = 0x7F800000
_F32_ALL = 0x7FFFFFFF  # a NaN pattern: larger than every available key


# ----------------------------------------------------------------------------------------------
# counts and option checks


def check_sparsity(value: float, option: str = "--sparsity") -> float:
    """Return ``value`` if it is a sparsity (a fraction of zeros, 0 <= S <= 1), else raise.

    >>> check_sparsity(0.75)
    0.75
    >>> check_sparsity(1.5)
    Traceback (most recent call last):
    ...
    sparsetool.errors.SparsetoolError: --sparsity must be a number from 0 to 1 (the fraction of weights set to zero), got 1.5; for example --sparsity 0.75
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= 1):
        raise SparsetoolError(
            f"{option} must be a number from 0 to 1 (the fraction of weights set to zero), "
            f"got {value!r}; for example {option} 0.75"
        )
    return float(value)


def check_fraction(value: float, option: str = "--fraction") -> float:
    """Return ``value`` if it is a pruning fraction (0 <= F < 1), else raise.

    F is the fraction of the *remaining* non-zeros to prune in one iterative step; F = 1 would
    prune everything and is refused (use a sparsity of 1 for that).

    >>> check_fraction(0.2)
    0.2
    >>> check_fraction(1.0)
    Traceback (most recent call last):
    ...
    sparsetool.errors.SparsetoolError: --fraction must be at least 0 and below 1 (the fraction of the remaining non-zeros to prune), got 1.0; for example --fraction 0.2
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < 1):
        raise SparsetoolError(
            f"{option} must be at least 0 and below 1 (the fraction of the remaining non-zeros "
            f"to prune), got {value!r}; for example {option} 0.2"
        )
    return float(value)


def sparsity_keep(numel: int, sparsity: float) -> int:
    """How many of ``numel`` weights a sparsity keeps: ``numel - round(sparsity * numel)``.

    >>> sparsity_keep(10, 0.75), sparsity_keep(4, 0.5), sparsity_keep(7, 0.0)
    (2, 2, 7)
    """
    check_sparsity(sparsity, "sparsity")
    return int(numel) - round(sparsity * int(numel))


def fraction_keep(nnz: int, fraction: float) -> int:
    """How many of ``nnz`` remaining non-zeros survive pruning a ``fraction`` of them.

    One step of iterative magnitude pruning (Han et al. 2015; Frankle & Carbin 2019) keeps
    ``nnz - round(fraction * nnz)``.

    >>> fraction_keep(100, 0.2), fraction_keep(80, 0.2)
    (80, 64)
    """
    check_fraction(fraction, "fraction")
    return int(nnz) - round(fraction * int(nnz))


def _resolve_keep(numel: int, sparsity: float | None, keep: int | None) -> int:
    if (sparsity is None) == (keep is None):
        raise SparsetoolError("give exactly one of sparsity or keep")
    if keep is None:
        return sparsity_keep(numel, sparsity)  # type: ignore[arg-type]
    if isinstance(keep, bool) or int(keep) != keep or not 0 <= keep <= numel:
        raise SparsetoolError(f"keep must be an integer from 0 to {numel} (the tensor's size), got {keep!r}")
    return int(keep)


def _flat_existing(existing: Tensor | None, shape: torch.Size) -> Tensor | None:
    if existing is None:
        return None
    if tuple(existing.shape) != tuple(shape):
        raise SparsetoolError(
            f"existing mask has shape {tuple(existing.shape)} but the weight has shape {tuple(shape)}; "
            "a mask must match its weight"
        )
    if existing.dtype != torch.bool:
        existing = existing != 0
    return existing.reshape(-1)


# ----------------------------------------------------------------------------------------------
# exact selection on integer keys


def _magnitude_bits(w: Tensor) -> tuple[Tensor, int, int]:
    """Flat non-negative integer keys of |w| (IEEE bit pattern), their bit width, the key of inf."""
    if not w.dtype.is_floating_point:
        raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
    if w.dtype not in _LAYOUT:  # fp8 and friends convert to fp32 exactly
        w = w.to(torch.float32)
    int_dtype, nbits = _LAYOUT[w.dtype]
    bits = w.contiguous().view(int_dtype).reshape(-1) & ((1 << nbits) - 1)
    inf = int(torch.tensor(math.inf, dtype=w.dtype).view(int_dtype).item())
    return bits, nbits, inf


def _shifts(nbits: int) -> list[int]:
    """Digit positions from the top: 15 bits first, then 16-bit digits."""
    out, s = [], nbits - 15
    while s > 0:
        out.append(s)
        s -= 16
    out.append(0)
    return out


_SMALL = 4096


def _bincount(x: Tensor, bins: int) -> Tensor:
    """int64 counts of each value in [0, bins) of a flat integer tensor."""
    if x.numel() * 4 < bins:  # torch.bincount costs ~10 ms at 65536 bins however few the values
        counts = torch.zeros(bins, dtype=torch.int64)
        values, n = torch.unique(x.to(torch.int64), return_counts=True)
        counts[values] = n
        return counts
    return torch.bincount(x, minlength=bins).to(torch.int64)


def _select(bits: Tensor, nbits: int, inf: int, keep: int) -> tuple[int, int, int, int]:
    """Radix select: the threshold key T so that keep lies in (above(T), above(T) + equal(T)].

    ``bits`` are non-negative keys; those above ``inf`` are unavailable (NaN or already pruned).
    Returns (T, above, equal, available). If keep >= available, T is -1 and above = available.
    """
    cand = bits
    need = keep
    above_total = 0
    hi = 0  # the digits chosen so far
    shifts = _shifts(nbits)
    width = nbits - shifts[0]
    available = -1
    for level, shift in enumerate(shifts):
        if cand.numel() <= _SMALL:  # a sort beats 32768-bin histograms on few keys
            live = cand[cand <= inf]
            if level == 0:
                available = live.numel()
                if keep >= available:
                    return -1, available, 0, available
                if keep <= 0:
                    return (1 << nbits) - 1, 0, 0, available
            t = int(torch.sort(live, descending=True).values[need - 1])
            return t, above_total + int((live > t).sum()), int((live == t).sum()), available
        if level > 0:
            width = 16
        digits = cand >> shift if level == 0 else (cand >> shift) & 0xFFFF
        hist = _bincount(digits.reshape(-1), 1 << width)
        if hi == inf >> (shift + width):
            idig = (inf >> shift) & ((1 << width) - 1)
            hist[idig + 1:] = 0
            if shift and int(hist[idig]) > 0:  # NaN payloads share inf's bucket; count inf alone
                hist[idig] = int((cand == inf).sum())
        suffix = hist.flip(0).cumsum(0).flip(0)  # suffix[d] = count of digits >= d
        if level == 0:
            available = int(suffix[0])
            if keep >= available:
                return -1, available, 0, available
            if keep <= 0:
                return (1 << nbits) - 1, 0, 0, available
        d = int((suffix >= need).nonzero()[-1])
        above = int(suffix[d]) - int(hist[d])
        need -= above
        above_total += above
        hi = (hi << width) | d
        if level == len(shifts) - 1:
            return hi, above_total, int(hist[d]), available
        cand = cand[digits == d]
    raise AssertionError("unreachable")


def _mask_from_threshold(
    bits: Tensor, threshold: int, ties: int, upper: int | None, what: str = "tensor"
) -> Tensor:
    """Keys > threshold (and <= upper, if given), plus the first ``ties`` keys == threshold."""
    mask = bits > threshold
    if upper is not None:
        mask &= bits <= upper
    if ties > 0:
        where = (bits == threshold).nonzero().reshape(-1)
        if where.numel() < ties:
            raise SparsetoolError(
                f"{what}: the plan asks for {ties} weights at the threshold but only "
                f"{where.numel()} are there; did the tensor change between passes?"
            )
        mask[where[:ties]] = True
    return mask


def _top_keys(bits: Tensor, nbits: int, inf: int, keep: int) -> Tensor:
    """Flat mask keeping the ``keep`` largest available keys, ties to the lower index."""
    t, above, _, available = _select(bits, nbits, inf, keep)
    upper = None if available == bits.numel() else inf
    if t < 0:
        return bits <= inf if upper is not None else torch.ones_like(bits, dtype=torch.bool)
    return _mask_from_threshold(bits, t, keep - above, upper)


# ----------------------------------------------------------------------------------------------
# per-tensor masks


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
    >>> magnitude_mask(torch.tensor([1.0, 1.0, 1.0, 1.0]), keep=3, existing=torch.tensor([True, False, True, True]))
    tensor([ True, False,  True,  True])
    """
    k = _resolve_keep(w.numel(), sparsity, keep)
    bits, nbits, inf = _magnitude_bits(w)
    alive = _flat_existing(existing, w.shape)
    if alive is not None:
        bits = torch.where(alive, bits, torch.tensor((1 << nbits) - 1, dtype=bits.dtype))
    return _top_keys(bits, nbits, inf, k).reshape(w.shape)


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
    k = _resolve_keep(numel, sparsity, keep)
    if generator is not None and seed is not None:
        raise SparsetoolError("give a generator or a seed, not both")
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
    # Random 31-bit keys; the few ties among them are broken by index, deterministically.
    # 30-bit keys leave room above them for the "dead" key.
    bits = torch.randint(0, 1 << 30, shape, generator=generator, dtype=torch.int32).reshape(-1)
    inf = (1 << 30) - 1
    alive = _flat_existing(existing, torch.Size(shape))
    if alive is not None:
        bits = torch.where(alive, bits, torch.tensor(0x7FFFFFFF, dtype=torch.int32))
    return _top_keys(bits, 31, inf, k).reshape(shape)


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
    bits, nbits, inf = _magnitude_bits(w)
    bits = bits.to(torch.int64)
    dead = bits > inf
    alive = _flat_existing(existing, w.shape)
    if alive is not None:
        dead |= ~alive
    bits = bits.masked_fill(dead, -1).reshape(w.shape).movedim(dim, -1)
    moved_shape = bits.shape
    groups = bits.reshape(-1, m)
    # A stable descending sort keeps the lower index first among equal magnitudes.
    order = torch.sort(groups, dim=1, descending=True, stable=True).indices[:, :n]
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order, True)
    mask &= groups >= 0
    return mask.reshape(moved_shape).movedim(-1, dim).contiguous()


# ----------------------------------------------------------------------------------------------
# global magnitude: histograms, plan, apply


def _f32_keys(w: Tensor) -> Tensor:
    """Flat int32 keys: the fp32 bit pattern of |w|."""
    if not w.dtype.is_floating_point:
        raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
    if w.dtype != torch.float32:
        w = w.to(torch.float32)
    return w.contiguous().view(torch.int32).reshape(-1) & _F32_ALL


def _exact_coarse(dtype: torch.dtype) -> bool:
    """True if every value of ``dtype`` has an fp32 pattern with 16 low zero bits."""
    return dtype == torch.bfloat16 or (dtype.is_floating_point and dtype.itemsize == 1)


@dataclass(frozen=True, eq=False)
class MagnitudeHistogram:
    """Counts of alive, non-NaN |w| keys (fp32 bit patterns) of one tensor, or of several merged.

    Coarse (``bucket`` None): 32768 counters over the high 16 bits of the key. Refined
    (``bucket`` B): 65536 counters over the low 16 bits of keys whose high 16 bits are B.
    ``exact`` means every counted key has zero low bits (bf16, fp8), so a coarse bucket holds one
    value and needs no refinement.

    >>> h = MagnitudeHistogram.of(torch.tensor([1.0, -1.0, 2.0, float("nan")], dtype=torch.bfloat16))
    >>> h.total, h.exact, int(h.counts[0x3F80]), int(h.counts[0x4000])
    (3, True, 2, 1)
    """

    counts: Tensor
    bucket: int | None = None
    exact: bool = False

    @classmethod
    def of(
        cls, w: Tensor, existing: Tensor | None = None, *, refine: int | None = None
    ) -> MagnitudeHistogram:
        """Histogram of ``w`` (coarse, or refined inside bucket ``refine``)."""
        keys = _f32_keys(w)
        alive = _flat_existing(existing, w.shape)
        keys = keys.masked_fill(keys > _F32_INF, _F32_ALL)
        if alive is not None:
            keys = keys.masked_fill(~alive, _F32_ALL)
        exact = _exact_coarse(w.dtype)
        if refine is None:
            counts = _bincount(keys >> 16, 1 << 15)
            counts[(_F32_INF >> 16) + 1:] = 0  # NaN and dead keys were all moved to the top bucket
            return cls(counts, None, exact)
        if not 0 <= refine < (_F32_INF >> 16) + 1:
            raise SparsetoolError(f"refine bucket {refine} is outside 0..{_F32_INF >> 16}")
        inside = keys[(keys >> 16) == refine]
        counts = _bincount(inside & 0xFFFF, 1 << 16)
        return cls(counts, int(refine), exact)

    @property
    def total(self) -> int:
        """How many keys are counted."""
        return int(self.counts.sum())

    def merge(self, other: MagnitudeHistogram) -> MagnitudeHistogram:
        """The histogram of both tensors' keys together."""
        if self.bucket != other.bucket:
            raise SparsetoolError(f"cannot merge histograms of buckets {self.bucket} and {other.bucket}")
        return MagnitudeHistogram(self.counts + other.counts, self.bucket, self.exact and other.exact)

    __add__ = merge


@dataclass(frozen=True)
class TensorPlan:
    """What one tensor keeps under a global threshold.

    Keep every alive key (fp32 bit pattern of |w|) greater than ``threshold``, plus the first
    ``ties`` alive keys equal to it in flat order; ``kept`` is the resulting count.
    """

    threshold: int
    ties: int
    kept: int


@dataclass(frozen=True)
class GlobalPlan:
    """Result of :func:`global_threshold_plan`.

    Either ``done`` with one :class:`TensorPlan` per tensor, or not done: then the histograms of
    ``refine_bucket`` are needed for the tensors listed in ``refine`` (indices).
    """

    tensors: tuple[TensorPlan, ...]
    kept: int
    refine_bucket: int | None = None
    refine: tuple[int, ...] = ()

    @property
    def done(self) -> bool:
        return self.refine_bucket is None


def _boundary(total: Tensor, keep: int) -> tuple[int, int]:
    """The digit d with above(d) < keep <= above(d) + total[d], and above(d)."""
    suffix = total.flip(0).cumsum(0).flip(0)
    d = int((suffix >= keep).nonzero()[-1])
    return d, int(suffix[d]) - int(total[d])


def global_threshold_plan(
    histograms: Sequence[MagnitudeHistogram],
    keep: int,
    *,
    refined: Mapping[int, MagnitudeHistogram] | None = None,
) -> GlobalPlan:
    """Plan one magnitude threshold across tensors so that exactly ``keep`` weights survive.

    ``histograms`` are the coarse histograms of the tensors, in tensor order. If the boundary bucket
    holds distinct values (fp16/fp32 entries), the plan comes back not ``done``: pass ``refined``,
    a mapping from each index in ``plan.refine`` to its refined histogram of ``plan.refine_bucket``,
    and call again. Ties at the threshold go to earlier tensors first, then lower flat index.

    >>> a = torch.tensor([3.0, 1.0, 2.0]); b = torch.tensor([2.0, 5.0])
    >>> plan = global_threshold_plan([MagnitudeHistogram.of(a), MagnitudeHistogram.of(b)], 3)
    >>> plan.done, plan.refine
    (False, (0, 1))
    >>> fine = {i: MagnitudeHistogram.of(t, refine=plan.refine_bucket) for i, t in [(0, a), (1, b)]}
    >>> plan = global_threshold_plan([MagnitudeHistogram.of(a), MagnitudeHistogram.of(b)], 3, refined=fine)
    >>> [p.kept for p in plan.tensors], apply_threshold(a, plan.tensors[0]), apply_threshold(b, plan.tensors[1])
    ([2, 1], tensor([ True, False,  True]), tensor([False,  True]))
    """
    if any(h.bucket is not None for h in histograms):
        raise SparsetoolError("global_threshold_plan takes the coarse histograms (refine=None) first")
    if isinstance(keep, bool) or int(keep) != keep or keep < 0:
        raise SparsetoolError(f"keep must be a non-negative integer, got {keep!r}")
    if not histograms:
        return GlobalPlan((), 0)
    per = [h.total for h in histograms]
    available = sum(per)
    if keep >= available:
        return GlobalPlan(tuple(TensorPlan(-1, 0, c) for c in per), available)
    if keep == 0:
        return GlobalPlan(tuple(TensorPlan(_F32_ALL, 0, 0) for _ in per), 0)
    total = histograms[0].counts.clone()
    for h in histograms[1:]:
        total += h.counts
    b, above = _boundary(total, keep)
    need = keep - above
    above_each = [int(h.counts[b + 1:].sum()) for h in histograms]
    in_b = [int(h.counts[b]) for h in histograms]
    if need == int(total[b]):  # the whole bucket goes: no tie-breaking inside it
        return GlobalPlan(
            tuple(TensorPlan((b << 16) - 1, 0, a + c) for a, c in zip(above_each, in_b)), keep
        )
    inexact = tuple(i for i, h in enumerate(histograms) if in_b[i] and not h.exact)
    if not inexact:  # bucket b is the single value b << 16 in every tensor that has it
        return GlobalPlan(_share_ties(b << 16, need, above_each, in_b), keep)
    if refined is None or any(i not in refined for i in inexact):
        return GlobalPlan((), 0, b, inexact)
    fine_total = torch.zeros(1 << 16, dtype=torch.int64)
    for i in range(len(histograms)):
        if i in inexact:
            f = refined[i]
            if f.bucket != b or f.total != in_b[i]:
                raise SparsetoolError(
                    f"refined histogram of tensor {i} counts {f.total} keys in bucket {f.bucket}, "
                    f"expected {in_b[i]} in bucket {b}; did the tensor change between passes?"
                )
            fine_total += f.counts
        else:  # exact keys sit at low digit 0
            fine_total[0] += in_b[i]
    low, above_low = _boundary(fine_total, need)
    at_low = []
    for i in range(len(histograms)):
        if i in inexact:
            counts = refined[i].counts  # type: ignore[index]
            above_each[i] += int(counts[low + 1:].sum())
            at_low.append(int(counts[low]))
        else:
            at_low.append(in_b[i] if low == 0 else 0)
    return GlobalPlan(_share_ties((b << 16) | low, need - above_low, above_each, at_low), keep)


def _share_ties(threshold: int, ties: int, above: list[int], at: list[int]) -> tuple[TensorPlan, ...]:
    plans = []
    for a, c in zip(above, at):
        take = min(c, ties)
        ties -= take
        plans.append(TensorPlan(threshold, take, a + take))
    return tuple(plans)


def apply_threshold(w: Tensor, plan: TensorPlan, existing: Tensor | None = None) -> Tensor:
    """The mask of one tensor under its :class:`TensorPlan` (True = kept).

    Raises if the result does not keep ``plan.kept`` weights (the tensor or its mask changed since
    its histogram was taken).

    >>> apply_threshold(torch.tensor([0.5, 2.0, 1.0]), TensorPlan(0x3F800000, 0, 1))
    tensor([False,  True, False])
    """
    keys = _f32_keys(w)
    alive = _flat_existing(existing, w.shape)
    keys = keys.masked_fill(keys > _F32_INF, _F32_ALL)
    if alive is not None:
        keys = keys.masked_fill(~alive, _F32_ALL)
    mask = _mask_from_threshold(keys, plan.threshold, plan.ties, _F32_INF)
    kept = int(mask.sum())
    if kept != plan.kept:
        raise SparsetoolError(
            f"the plan keeps {plan.kept} weights of this tensor but its threshold keeps {kept}; "
            "did the tensor change between passes?"
        )
    return mask.reshape(w.shape)


def global_magnitude_masks(
    tensors: Sequence[Tensor],
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Sequence[Tensor | None] | None = None,
) -> list[Tensor]:
    """Global magnitude pruning of tensors that fit in memory together (the pass protocol of the
    module docstring, run in place). ``sparsity`` counts over the total size of all tensors.

    >>> global_magnitude_masks([torch.tensor([3.0, 1.0, 2.0]), torch.tensor([2.0, 5.0])], keep=3)
    [tensor([ True, False,  True]), tensor([False,  True])]
    """
    alive = list(existing) if existing is not None else [None] * len(tensors)
    k = _resolve_keep(sum(t.numel() for t in tensors), sparsity, keep)
    hists = [MagnitudeHistogram.of(t, e) for t, e in zip(tensors, alive)]
    plan = global_threshold_plan(hists, k)
    if not plan.done:
        fine = {i: MagnitudeHistogram.of(tensors[i], alive[i], refine=plan.refine_bucket) for i in plan.refine}
        plan = global_threshold_plan(hists, k, refined=fine)
    return [apply_threshold(t, p, e) for t, p, e in zip(tensors, plan.tensors, alive)]
