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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparsetool.errors import SparsetoolError
from sparsetool.masks.chunks import count_true
from sparsetool.masks.histograms import boundary, bucket_histogram, histogram, histogram_from
from sparsetool.masks.kernel import Scan, Sink, resolve_keep, threshold_mask
from sparsetool.masks.keys import Keys, flat_bits, flat_existing, int_keys, like, shape_of
from sparsetool.util.floatbits import F32_INF, FORMATS, float_format, fp32_bits
from sparsetool.util.wording import plural

__all__ = [
    "MagnitudeHistogram",
    "TensorPlan",
    "GlobalPlan",
    "global_threshold_plan",
    "apply_threshold",
    "global_magnitude_masks",
]

_F32_INF = F32_INF
_F32_ALL = 0x7FFFFFFF  # a NaN pattern: larger than every available key


def _f32_keys(w: Any, alive: np.ndarray | None, dtype: str | None) -> tuple[Keys, int, str]:
    """The kernel's keys of |w| on the fp32 scale, how many low bits they leave out (16 for bf16,
    whose bits are the high half of the fp32 pattern, the low half zero; else 0), and ``w``'s type
    name. fp16, fp64 and fp8 convert to fp32 chunk by chunk; NaN keys are above the key of inf."""
    bits, st = flat_bits(w, dtype)
    if st in ("BF16", "F32"):
        fmt = FORMATS[st]
        assert fmt.inf is not None
        return int_keys(bits, 8 * fmt.itemsize - 1, fmt.inf, alive), 16 if st == "BF16" else 0, st
    dead = None if alive is None else ~alive

    def read(a: int, b: int) -> np.ndarray:
        with np.errstate(over="ignore"):  # fp64 beyond the fp32 range rounds to inf
            k = fp32_bits(bits[a:b], st) & _F32_ALL
        if dead is not None:
            np.copyto(k, _F32_ALL, where=dead[a:b])
        return k

    def bucket(a: int, b: int, d: int) -> np.ndarray:
        k = read(a, b)
        return k[(k >> 16) == d]

    return Keys(bits.size, 31, _F32_INF, 16, read, lambda a, b: read(a, b) >> 16, bucket), 0, st


def _exact_coarse(st: str) -> bool:
    """True if every value of the type has an fp32 pattern with 16 low zero bits."""
    return st == "BF16" or FORMATS[st].fp8 is not None


@dataclass(frozen=True, eq=False)
class MagnitudeHistogram:
    """Counts of alive, non-NaN |w| keys (fp32 bit patterns) of one tensor, or of several merged.

    Coarse (``bucket`` None): 32768 counters over the high 16 bits of the key. Refined
    (``bucket`` B): 65536 counters over the low 16 bits of keys whose high 16 bits are B.
    ``exact`` means every counted key has zero low bits (bf16, fp8), so a coarse bucket holds one
    value and needs no refinement.

    >>> h = MagnitudeHistogram.of(
    ...     np.array([0x3F80, -0x4080, 0x4000, 0x7FC0], dtype=np.int16), dtype="BF16"
    ... )
    >>> h.total, h.exact, int(h.counts[0x3F80]), int(h.counts[0x4000])
    (3, True, 2, 1)
    """

    counts: np.ndarray
    bucket: int | None = None
    exact: bool = False

    @classmethod
    def of(
        cls, w: Any, existing: Any = None, *, refine: int | None = None, dtype: str | None = None
    ) -> MagnitudeHistogram:
        """Histogram of ``w`` (coarse, or refined inside bucket ``refine``): a torch tensor, or
        numpy bit patterns with ``dtype``."""
        keys, _, st = _f32_keys(w, flat_existing(existing, shape_of(w)), dtype)
        exact = _exact_coarse(st)
        if refine is None:  # the kernel's first digit is the high 16 bits of the fp32 key
            return cls(histogram(keys)[0], None, exact)
        if isinstance(refine, bool) or not 0 <= refine <= _F32_INF >> 16:
            raise SparsetoolError(f"refine bucket {refine} is outside 0..{_F32_INF >> 16}")
        fine = bucket_histogram(keys, int(refine))
        if fine.size == 1:  # bf16: every key in the bucket is refine << 16 exactly
            fine = np.concatenate([fine, np.zeros((1 << 16) - 1, dtype=np.int64)])
        return cls(fine, int(refine), exact)

    @classmethod
    def of_scan(
        cls, found: Scan, dtype: Any, *, low: int | None = None, high: int | None = None
    ) -> MagnitudeHistogram:
        """The coarse histogram of a bf16 or fp32 tensor whose zeros are pruned (as if ``of`` were
        given the mask of its non-zeros), from the :func:`~sparsetool.masks.kernel.scan` of its
        magnitude keys: bucket 0, which holds the zero keys, loses them. ``dtype`` is the
        tensor's safetensors type name or torch dtype.

        With ``low`` (for a finite tensor: no inf, no NaN), only the buckets from ``low`` to
        ``high`` are counted one by one (:func:`~sparsetool.masks.kernel.histogram_from`); the
        keys below are counted together in bucket ``low - 1``, those above in ``high + 1``. That
        is enough for a plan whose boundary bucket lies in ``[low, high]``, and costs a fraction
        of the whole histogram when both come from a sample
        (:func:`~sparsetool.masks.kernel.sampled_histogram`)."""
        try:
            st = float_format(dtype).st
        except KeyError:
            st = str(dtype)
        if st not in ("BF16", "F32") or found.zeros < 0:
            raise SparsetoolError(
                f"of_scan takes the scan of bf16 or fp32 keys with its zeros "
                f"counted (scan(keys, zeros=True)), not {dtype}"
            )
        if low or high is not None:
            low = low or 0
            if found.above_inf:
                raise SparsetoolError("of_scan with low takes the scan of a finite tensor")
            counts = histogram_from(found.keys, low, high)
            counts[low - 1] -= found.zeros  # the zero keys are below low, counted in low - 1
        else:
            counts = found.total.copy()
            counts[0] -= found.zeros
        return cls(counts, None, _exact_coarse(st))

    @property
    def total(self) -> int:
        """How many keys are counted."""
        return int(self.counts.sum())

    def merge(self, other: MagnitudeHistogram) -> MagnitudeHistogram:
        """The histogram of both tensors' keys together."""
        if self.bucket != other.bucket:
            raise SparsetoolError(
                f"cannot merge histograms of buckets {self.bucket} and {other.bucket}"
            )
        return MagnitudeHistogram(
            self.counts + other.counts, self.bucket, self.exact and other.exact
        )

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

    >>> import torch
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
        raise SparsetoolError(
            "global_threshold_plan takes the coarse histograms (refine=None) first"
        )
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
    total = histograms[0].counts.copy()
    for h in histograms[1:]:
        total += h.counts
    b, above = boundary(total, keep)
    need = keep - above
    above_each = [int(h.counts[b + 1 :].sum()) for h in histograms]
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
    fine_of: Mapping[int, MagnitudeHistogram] = refined
    fine_total = np.zeros(1 << 16, dtype=np.int64)
    for i in range(len(histograms)):
        if i in inexact:
            f = fine_of[i]
            if f.bucket != b or f.total != in_b[i]:
                raise SparsetoolError(
                    f"refined histogram of tensor {i} counts {f.total} keys in bucket {f.bucket}, "
                    f"expected {in_b[i]} in bucket {b}; did the tensor change between passes?"
                )
            fine_total += f.counts
        else:  # exact keys sit at low digit 0
            fine_total[0] += in_b[i]
    low, above_low = boundary(fine_total, need)
    at_low = []
    for i in range(len(histograms)):
        if i in inexact:
            counts = fine_of[i].counts
            above_each[i] += int(counts[low + 1 :].sum())
            at_low.append(int(counts[low]))
        else:
            at_low.append(in_b[i] if low == 0 else 0)
    return GlobalPlan(_share_ties((b << 16) | low, need - above_low, above_each, at_low), keep)


def _share_ties(
    threshold: int, ties: int, above: list[int], at: list[int]
) -> tuple[TensorPlan, ...]:
    plans = []
    for a, c in zip(above, at):
        take = min(c, ties)
        ties -= take
        if take and take == c:  # every key at the threshold is kept: ">= T", no ties to find
            plans.append(TensorPlan(threshold - 1, 0, a + take))
        else:
            plans.append(TensorPlan(threshold, take, a + take))
    return tuple(plans)


def apply_threshold(
    w: Any,
    plan: TensorPlan,
    existing: Any = None,
    *,
    sink: Sink | None = None,
    dtype: str | None = None,
) -> Any:
    """The mask of one tensor under its :class:`TensorPlan` (True = kept); with ``sink``, handed
    over chunk by chunk instead (see :func:`sparsetool.masks.kernel.threshold_mask`).

    Raises if the result does not keep ``plan.kept`` weights (the tensor or its mask changed since
    its histogram was taken). ``w`` as in :meth:`MagnitudeHistogram.of`; the mask is a torch
    tensor for a torch ``w``, else numpy (the sink always gets numpy chunks).

    >>> apply_threshold(np.array([0.5, 2.0, 1.0], dtype=np.float32), TensorPlan(0x3F800000, 0, 1))
    array([False,  True, False])
    """
    shape = shape_of(w)
    keys, lack, _ = _f32_keys(w, flat_existing(existing, shape), dtype)
    # On bf16's 16-bit keys "> T" is "> T >> 16", and only a T with zero low bits can be equalled.
    threshold = plan.threshold >> lack
    can_tie = plan.threshold & ((1 << lack) - 1) == 0
    counted: list[int] = []
    if sink is not None:
        inner = sink

        def sink(a: int, b: int, mask: np.ndarray) -> None:  # counts what it passes on
            counted.append(count_true(mask))
            inner(a, b, mask)

    out = threshold_mask(keys, threshold, plan.ties if can_tie else 0, sink=sink)
    kept = sum(counted) if out is None else count_true(out)
    if kept != plan.kept or (plan.ties and not can_tie):
        raise SparsetoolError(
            f"the plan keeps {plural(plan.kept, 'weight')} of this tensor but its threshold keeps "
            f"{kept}; "
            "did the tensor change between passes?"
        )
    return None if out is None else like(out.reshape(shape), w)


def global_magnitude_masks(
    tensors: Sequence[Any],
    sparsity: float | None = None,
    *,
    keep: int | None = None,
    existing: Sequence[Any] | None = None,
) -> list[Any]:
    """Global magnitude pruning of tensors that fit in memory together (the pass protocol of the
    module docstring, run in place). ``sparsity`` counts over the total size of all tensors.
    Torch tensors (or native numpy float arrays) in, masks of the same kind out.

    >>> import torch
    >>> global_magnitude_masks([torch.tensor([3.0, 1.0, 2.0]), torch.tensor([2.0, 5.0])], keep=3)
    [tensor([ True, False,  True]), tensor([False,  True])]
    """
    alive = list(existing) if existing is not None else [None] * len(tensors)
    k = resolve_keep(
        sum(int(np.prod(shape_of(t), dtype=np.int64)) for t in tensors), sparsity, keep
    )
    hists = [MagnitudeHistogram.of(t, e) for t, e in zip(tensors, alive)]
    plan = global_threshold_plan(hists, k)
    if not plan.done:
        fine = {
            i: MagnitudeHistogram.of(tensors[i], alive[i], refine=plan.refine_bucket)
            for i in plan.refine
        }
        plan = global_threshold_plan(hists, k, refined=fine)
    return [apply_threshold(t, p, e) for t, p, e in zip(tensors, plan.tensors, alive)]
