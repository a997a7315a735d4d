"""Global magnitude pruning in streaming passes: one threshold across many tensors.

Global scope ranks all targeted weights together instead of layer by layer ("global magnitude
pruning", compared with layerwise pruning in Blalock et al. 2020, "What is the state of neural
network pruning?"). Here it is done without the tensors ever sitting in memory together. All
tensors are compared on one scale, the fp32 bit pattern of |w| (bf16, fp16 and fp8 convert to fp32
exactly; fp64 is compared at fp32 precision).
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

At most three passes read each tensor: histogram, (rarely) refinement, apply. A coarse bucket of
bf16 or fp8 keys holds one value, so bf16 checkpoints never need the refinement pass.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsetool.masks import radix
from sparsetool.errors import SparsetoolError
from sparsetool.masks.radix import _bincount, _boundary, _flat_existing, _map, _resolve_keep

__all__ = [
    "MagnitudeHistogram", "TensorPlan", "GlobalPlan", "global_threshold_plan", "apply_threshold",
    "global_magnitude_masks",
]

_F32_INF = 0x7F800000
_F32_ALL = 0x7FFFFFFF  # a NaN pattern: larger than every available key


def _f32_flat(w: Tensor) -> Tensor:
    if not w.dtype.is_floating_point:
        raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
    return w.contiguous().reshape(-1)


def _f32_chunk(flat: Tensor, a: int, b: int) -> tuple[Tensor, bool]:
    """Keys of ``flat[a:b]`` on the fp32 scale, and whether they are only the high 16 bits (bf16:
    its bits are the high half of the fp32 pattern, the low half is zero). NaN keys are above the
    key of inf (``_F32_INF``, or ``_F32_INF >> 16`` for high keys)."""
    x = flat[a:b]
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16) & 0x7FFF, True
    if x.dtype != torch.float32:
        x = x.to(torch.float32)
    return x.view(torch.int32) & _F32_ALL, False


def _top_halves(flat: Tensor) -> Tensor | None:
    """For fp32 on a little-endian machine, ``flat`` as int16 pairs (the high half second)."""
    if flat.dtype == torch.float32 and sys.byteorder == "little":
        return flat.view(torch.int16)
    return None


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
        flat = _f32_flat(w)
        alive = _flat_existing(existing, w.shape)
        exact = _exact_coarse(w.dtype)
        n = flat.numel()
        if refine is None:

            top = _top_halves(flat)

            def coarse(a: int, b: int) -> Tensor:
                if top is not None:  # fp32: read the high int16 of each key in place
                    digits = top[2 * a + 1:2 * b:2] & 0x7FFF
                else:
                    k, high = _f32_chunk(flat, a, b)
                    digits = k if high else k >> 16
                if alive is not None:
                    digits.masked_fill_(~alive[a:b], 0x7FFF)
                return _bincount(digits, 1 << 15)

            counts = torch.zeros(1 << 15, dtype=torch.int64)
            for part in _map(coarse, n):
                counts += part
            counts[(_F32_INF >> 16) + 1:] = 0  # NaN and dead keys
            if int(counts[_F32_INF >> 16]) and w.dtype != torch.bfloat16:
                # fp32 NaN payloads below 0x7F810000 share the bucket of inf: count inf alone

                def infinite(a: int, b: int) -> int:
                    is_inf = _f32_chunk(flat, a, b)[0] == _F32_INF
                    return int((is_inf if alive is None else is_inf & alive[a:b]).sum())

                counts[_F32_INF >> 16] = sum(_map(infinite, n))
            return cls(counts, None, exact)
        if isinstance(refine, bool) or not 0 <= refine <= _F32_INF >> 16:
            raise SparsetoolError(f"refine bucket {refine} is outside 0..{_F32_INF >> 16}")

        def fine(a: int, b: int) -> Tensor:
            k, high = _f32_chunk(flat, a, b)
            inside = (k == refine) if high else (k >> 16) == refine
            inside &= k <= (_F32_INF >> 16 if high else _F32_INF)
            if alive is not None:
                inside &= alive[a:b]
            if high:  # every bf16 key in the bucket is refine << 16 exactly
                out = torch.zeros(1 << 16, dtype=torch.int64)
                out[0] = int(inside.sum())
                return out
            return _bincount(k[inside] & 0xFFFF, 1 << 16)

        counts = torch.zeros(1 << 16, dtype=torch.int64)
        for part in _map(fine, n):
            counts += part
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
    >>> hists = [MagnitudeHistogram.of(a), MagnitudeHistogram.of(b)]
    >>> plan = global_threshold_plan(hists, 3)
    >>> plan.done, plan.refine
    (False, (0, 1))
    >>> fine = {i: MagnitudeHistogram.of(t, refine=plan.refine_bucket) for i, t in [(0, a), (1, b)]}
    >>> plan = global_threshold_plan(hists, 3, refined=fine)
    >>> [p.kept for p in plan.tensors]
    [2, 1]
    >>> apply_threshold(a, plan.tensors[0]), apply_threshold(b, plan.tensors[1])
    (tensor([ True, False,  True]), tensor([False,  True]))
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
    flat = _f32_flat(w)
    alive = _flat_existing(existing, w.shape)
    n = flat.numel()
    out = torch.empty(n, dtype=torch.bool)

    def cut(high: bool) -> tuple[int, bool, int]:
        """The threshold on a chunk's key scale, whether keys can equal it, the key of inf."""
        if high:
            return plan.threshold >> 16, plan.threshold & 0xFFFF == 0, _F32_INF >> 16
        return plan.threshold, True, _F32_INF

    def above(a: int, b: int) -> int:
        k, high = _f32_chunk(flat, a, b)
        t, _, inf = cut(high)
        part = out[a:b]
        torch.gt(k, t, out=part)
        part &= k <= inf
        if alive is not None:
            part &= alive[a:b]
        return int(part.sum())

    kept = sum(_map(above, n))
    ties = plan.ties
    for a in range(0, n, radix._CHUNK):  # ties go to the lowest flat indices: scan in order
        if ties == 0:
            break
        k, high = _f32_chunk(flat, a, min(a + radix._CHUNK, n))
        t, can_tie, _ = cut(high)
        if not can_tie:
            break
        equal = k == t
        if alive is not None:
            equal &= alive[a:a + radix._CHUNK]
        where = equal.nonzero().reshape(-1)[:ties]
        out[a + where] = True
        ties -= where.numel()
        kept += where.numel()
    if ties or kept != plan.kept:
        raise SparsetoolError(
            f"the plan keeps {plan.kept} weights of this tensor but its threshold keeps {kept}; "
            "did the tensor change between passes?"
        )
    return out.reshape(w.shape)


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
        fine = {
            i: MagnitudeHistogram.of(tensors[i], alive[i], refine=plan.refine_bucket)
            for i in plan.refine
        }
        plan = global_threshold_plan(hists, k, refined=fine)
    return [apply_threshold(t, p, e) for t, p, e in zip(tensors, plan.tensors, alive)]
