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
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

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


def _int_view(w: Tensor) -> tuple[Tensor, int, int]:
    """``w`` flat, viewed as integers (no copy for bf16/fp16/fp32/fp64); the magnitude's bit width
    (the sign is the bit above it); and the magnitude key of +inf."""
    if not w.dtype.is_floating_point:
        raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
    if w.dtype not in _LAYOUT:  # fp8 and friends convert to fp32 exactly
        w = w.to(torch.float32)
    int_dtype, nbits = _LAYOUT[w.dtype]
    inf = int(torch.tensor(math.inf, dtype=w.dtype).view(int_dtype).item())
    return w.contiguous().view(int_dtype).reshape(-1), nbits, inf


def _magnitude_bits(w: Tensor) -> tuple[Tensor, int, int]:
    """Flat non-negative integer keys of |w| (IEEE bit pattern), their bit width, the key of inf."""
    src, nbits, inf = _int_view(w)
    return src & ((1 << nbits) - 1), nbits, inf


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


_CHUNK = 1 << 20  # keys per chunk: a chunk's temporaries stay in cache between the steps on it
_POOL: ThreadPoolExecutor | None = None


def _map(fn: Callable[[int, int], Any], n: int) -> list[Any]:
    """``fn(start, stop)`` over the chunks of ``range(n)``, in order; chunks run on a thread pool
    (torch releases the GIL, and ``torch.bincount`` is single-threaded on CPU)."""
    global _POOL
    spans = [(s, min(s + _CHUNK, n)) for s in range(0, n, _CHUNK)]
    workers = max(1, torch.get_num_threads())
    if len(spans) < 2 or workers < 2:
        return [fn(a, b) for a, b in spans]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=min(workers, 8), thread_name_prefix="sparsetool-mask")
    return list(_POOL.map(lambda span: fn(*span), spans))


def _top_keys(src: Tensor, nbits: int, inf: int, keep: int, alive: Tensor | None) -> Tensor:
    """Flat mask keeping the ``keep`` largest available keys, ties to the lower index.

    The key of position i is ``src[i] & (2**nbits - 1)``, or "dead" (all ones, above ``inf``)
    where ``alive`` is False; keys above ``inf`` are never kept. Two passes over ``src`` in chunks:
    a histogram of the top digit (plus, for keys wider than 16 bits, the few candidates in the
    boundary bucket), then the comparison that writes the mask.
    """
    n = src.numel()
    full = (1 << nbits) - 1

    def keys(a: int, b: int) -> Tensor:
        k = src[a:b] & full
        if alive is not None:
            k.masked_fill_(~alive[a:b], full)
        return k

    if n <= _SMALL:
        bits = keys(0, n)
        t, above, _, available = _select(bits, nbits, inf, keep)
        upper = None if available == n else inf
        if t < 0:
            return bits <= inf if upper is not None else torch.ones(n, dtype=torch.bool)
        return _mask_from_threshold(bits, t, keep - above, upper)

    shift = _shifts(nbits)[0]
    width = nbits - shift
    per_chunk = torch.stack(_map(lambda a, b: _bincount((keys(a, b) >> shift).reshape(-1), 1 << width), n))
    hist = per_chunk.sum(0)
    idig = inf >> shift
    hist[idig + 1:] = 0
    if shift and int(hist[idig]) > 0:  # NaN payloads share inf's bucket: count inf alone
        hist[idig] = sum(_map(lambda a, b: int((keys(a, b) == inf).sum()), n))
    available = int(hist.sum())
    upper = None if available == n else inf
    if keep >= available:
        out = torch.empty(n, dtype=torch.bool)
        _map(lambda a, b: torch.le(keys(a, b), inf, out=out[a:b]), n)
        return out
    if keep <= 0:
        return torch.zeros(n, dtype=torch.bool)
    d, above = _boundary(hist, keep)
    if shift == 0:  # the digit is the whole key
        t = d
        equal = per_chunk[:, d].tolist()
    elif keep - above == int(hist[d]):  # all of bucket d is kept: no select inside it
        t = (d << shift) - 1
        equal = [0] * len(per_chunk)
    else:  # finish the select among the keys of bucket d, which are few for real weights
        cands = _map(lambda a, b: (k := keys(a, b))[(k >> shift) == d], n)
        t, above_in, _, _ = _select(torch.cat(cands), nbits, inf, keep - above)
        above += above_in
        equal = [int((c == t).sum()) for c in cands]
    # Chunks before the one holding the last kept tie keep ">= t", that chunk keeps "> t" plus its
    # first ties, later chunks keep "> t".
    ties = keep - above
    plan = []
    for e in equal:
        plan.append(min(ties, e) if 0 < ties < e else (-1 if ties >= e > 0 else 0))
        ties -= min(ties, e)
    out = torch.empty(n, dtype=torch.bool)

    def write(a: int, b: int) -> None:
        k = keys(a, b)
        part = plan[a // _CHUNK]
        if part < 0:
            torch.ge(k, t, out=out[a:b])
        else:
            torch.gt(k, t, out=out[a:b])
        if upper is not None:
            out[a:b] &= k <= upper
        if part > 0:
            out[a + (k == t).nonzero().reshape(-1)[:part]] = True

    _map(write, n)
    return out


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
    src, nbits, inf = _int_view(w)
    alive = _flat_existing(existing, w.shape)
    return _top_keys(src, nbits, inf, k, alive).reshape(w.shape)


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
    alive = _flat_existing(existing, torch.Size(shape))
    return _top_keys(bits, 31, (1 << 30) - 1, k, alive).reshape(shape)


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
    dead = bits > inf
    alive = _flat_existing(existing, w.shape)
    if alive is not None:
        dead |= ~alive
    keys = bits.to(torch.int32 if nbits <= 31 else torch.int64).masked_fill_(dead, -1)
    d = dim % w.ndim
    outer, inner = math.prod(w.shape[:d]), math.prod(w.shape[d + 1:])
    keys = keys.view(outer, size // m, m, inner)  # groups run along axis 2, no copy
    if m > 16:  # a stable descending sort keeps the lower index first among equal magnitudes
        groups = keys.movedim(2, -1)
        order = torch.sort(groups, dim=-1, descending=True, stable=True).indices[..., :n]
        mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, order, True)
        mask &= groups >= 0
        return mask.movedim(-1, 2).reshape(w.shape).contiguous()
    # Small M: the rank of each weight in its group by pairwise comparison (O(M) passes over the
    # tensor, no sort); an earlier equal weight outranks a later one.
    mask = torch.empty(keys.shape, dtype=torch.bool)
    for j in range(m):
        kj = keys[:, :, j]
        rank = torch.zeros(kj.shape, dtype=torch.uint8)
        for i in range(m):
            if i != j:
                rank += keys[:, :, i] >= kj if i < j else keys[:, :, i] > kj
        mask[:, :, j] = (rank < n) & (kj >= 0)
    return mask.reshape(w.shape)


# ----------------------------------------------------------------------------------------------
# global magnitude: histograms, plan, apply


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

            def coarse(a: int, b: int) -> Tensor:
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
    for a in range(0, n, _CHUNK):  # ties go to the lowest flat indices: scan in order
        if ties == 0:
            break
        k, high = _f32_chunk(flat, a, min(a + _CHUNK, n))
        t, can_tie, _ = cut(high)
        if not can_tie:
            break
        equal = k == t
        if alive is not None:
            equal &= alive[a:a + _CHUNK]
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
        fine = {i: MagnitudeHistogram.of(tensors[i], alive[i], refine=plan.refine_bucket) for i in plan.refine}
        plan = global_threshold_plan(hists, k, refined=fine)
    return [apply_threshold(t, p, e) for t, p, e in zip(tensors, plan.tensors, alive)]
