"""Exact selection of the k largest keys in O(n): a radix select over IEEE bit patterns.

For non-negative floats the integer order of the bit patterns is the order of the values, so the
magnitude |w| of a bf16/fp16/fp32/fp64 weight is the integer ``bits & (2**(width-1) - 1)`` and NaN
is any key above the key of +inf. The threshold key is found digit by digit from the top with
histograms (``torch.bincount``): the top 15 bits first (32768 bins, the whole key for 16-bit
floats), then 16-bit digits among the few keys of the boundary bucket: a most-significant-digit
radix select, the selection analogue of radix sorting (Knuth, TAOCP vol. 3, section 5.2.5). Work
runs in chunks of ``_CHUNK`` keys on a small thread pool so temporaries stay in cache and the
single-threaded ``bincount`` uses every core.

Private to sparsetool: :mod:`sparsetool.masks.select` is the public interface.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch import Tensor

from sparsetool.masks.counts import sparsity_keep
from sparsetool.errors import SparsetoolError

# (integer view dtype, number of magnitude bits) for each float dtype read bit-for-bit.
_LAYOUT = {
    torch.bfloat16: (torch.int16, 15),
    torch.float16: (torch.int16, 15),
    torch.float32: (torch.int32, 31),
    torch.float64: (torch.int64, 63),
}


def _resolve_keep(numel: int, sparsity: float | None, keep: int | None) -> int:
    if (sparsity is None) == (keep is None):
        raise SparsetoolError("give exactly one of sparsity or keep")
    if keep is None:
        return sparsity_keep(numel, sparsity)  # type: ignore[arg-type]
    if isinstance(keep, bool) or int(keep) != keep or not 0 <= keep <= numel:
        raise SparsetoolError(
            f"keep must be an integer from 0 to {numel} (the tensor's size), got {keep!r}"
        )
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
            if shift and int(hist[idig]) > 0:  # keys above inf (NaN) may share its bucket
                hist[idig] = int(((digits == idig) & (cand <= inf)).sum())
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
_POOL_PID = 0  # a forked child inherits the pool object but not its threads: make a new one


def _map(fn: Callable[[int, int], Any], n: int, step: int | None = None) -> list[Any]:
    """``fn(start, stop)`` over the chunks of ``range(n)`` (``step`` long, default ``_CHUNK``), in
    order; chunks run on a thread pool (torch releases the GIL, and ``torch.bincount`` is
    single-threaded on CPU)."""
    global _POOL, _POOL_PID
    step = step or _CHUNK
    spans = [(s, min(s + step, n)) for s in range(0, n, step)]
    workers = max(1, torch.get_num_threads())
    if len(spans) < 2 or workers < 2:
        return [fn(a, b) for a, b in spans]
    if _POOL is None or _POOL_PID != os.getpid():
        _POOL = ThreadPoolExecutor(max_workers=min(workers, 8), thread_name_prefix="sparsetool-mask")
        _POOL_PID = os.getpid()
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
    halves = src.element_size() // 2
    if shift and shift == 16 * halves - 16 and sys.byteorder == "little":
        # The top digit is the top int16 of each key: read it in place, half or a quarter of the
        # bytes, and count 16-bit values as fast as bf16 keys.
        top = src.view(torch.int16)

        def digits(a: int, b: int) -> Tensor:
            t = top[a * halves + halves - 1:b * halves:halves] & 0x7FFF
            if alive is not None:
                t.masked_fill_(~alive[a:b], 0x7FFF)
            return t
    else:

        def digits(a: int, b: int) -> Tensor:
            return keys(a, b) >> shift

    per_chunk = torch.stack(_map(lambda a, b: _bincount(digits(a, b), 1 << width), n))
    hist = per_chunk.sum(0)
    idig = inf >> shift
    hist[idig + 1:] = 0
    if shift and int(hist[idig]) > 0:  # keys above inf (NaN) may share its bucket
        def alive_in_top(a: int, b: int) -> int:
            return int(((digits(a, b) == idig) & (keys(a, b) <= inf)).sum())

        hist[idig] = sum(_map(alive_in_top, n))
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
        cands = _map(lambda a, b: src[a:b][digits(a, b) == d] & full, n)
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


def _boundary(total: Tensor, keep: int) -> tuple[int, int]:
    """The digit d with above(d) < keep <= above(d) + total[d], and above(d)."""
    suffix = total.flip(0).cumsum(0).flip(0)
    d = int((suffix >= keep).nonzero()[-1])
    return d, int(suffix[d]) - int(total[d])
