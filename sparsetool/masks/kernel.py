"""The one selection kernel: exact top-k of float scores in O(n), by radix select on bit patterns.

What it computes is a sort. Keeping the ``keep`` largest |w| of a tensor, never a NaN nor a weight
already pruned (``alive`` False), ties to the lower flat index, is exactly this::

    def reference(w, keep, alive):
        a = w.double().abs().reshape(-1)
        dead = torch.isnan(a) | ~alive.reshape(-1)
        order = torch.sort(a.masked_fill(dead, -1.0), descending=True, stable=True).indices
        mask = torch.zeros(a.numel(), dtype=torch.bool)
        mask[order[:keep]] = True
        return (mask & ~dead).reshape(w.shape)

(``torch.topk`` finds the same values but does not say which of equal values it keeps; the stable
sort does.) The sort costs O(n log n) time and a float64 copy of the tensor; the kernel below gives
the same mask, bit for bit, in two passes over the tensor's own bit patterns and memory for one
chunk (``tests/masks/test_masks.py`` checks it against this reference on multi-chunk tensors with ties,
NaN and dead weights):

>>> w = torch.tensor([[0.5, -2.0, 0.5], [float("nan"), 0.5, -0.0]])
>>> alive = torch.tensor([[True, True, True], [True, False, True]])
>>> a = w.double().abs().reshape(-1); dead = torch.isnan(a) | ~alive.reshape(-1)
>>> order = torch.sort(a.masked_fill(dead, -1.0), descending=True, stable=True).indices
>>> ref = torch.zeros(a.numel(), dtype=torch.bool); ref[order[:2]] = True
>>> kernel = select_top(magnitude_keys(w, alive.reshape(-1)), 2)
>>> kernel.tolist(), torch.equal(kernel, ref & ~dead)
([True, True, False, False, False, False], True)

Every selection in sparsetool runs here: layer magnitude pruning, random masks, N:M (through
:func:`float_int_view` and :func:`map_chunks`), the global threshold across tensors (through :func:`histogram`,
:func:`bucket_histogram`, :func:`boundary` and :func:`threshold_mask`), and the drop/grow top-k
of every training algorithm (:func:`top_k_mask`). The rules are the same everywhere:

- exact: exactly ``k`` selected, or every available position if fewer are available;
- ties go to the lower flat (row-major) index;
- NaN is never selected, nor a position where the ``allowed``/``existing`` mask is False;
- -0.0 equals 0.0.

For non-negative floats the integer order of the bit patterns is the order of the values, so the
magnitude |w| of a bf16/fp16/fp32/fp64 weight is the integer ``bits & (2**(width-1) - 1)`` and NaN
is any key above the key of +inf (fp8 converts to fp32 exactly; :mod:`sparsetool.masks.keys`). The threshold key is found digit
by digit from the top with histograms (``torch.bincount``): the top 15 bits first (32768 bins, the
whole key for 16-bit floats), then 16-bit digits among the few keys of the boundary bucket: a
most-significant-digit radix select, the selection analogue of radix sorting (Knuth, TAOCP vol. 3,
section 5.2.5). Signed scores are two selections on magnitude keys: the non-negative scores first,
then, if ``k`` is not reached, the negative ones with the key ``inf - |x|`` (smaller magnitude =
higher score). Work runs in chunks of ``_CHUNK`` keys on a small thread pool so temporaries stay
in cache and the single-threaded ``bincount`` uses every core.

>>> top_k_mask(torch.tensor([0.5, -0.9, 0.5, float("nan"), -0.1]), 3)
tensor([ True, False,  True, False,  True])
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError
from sparsetool.masks.counts import sparsity_keep
from sparsetool.masks.keys import (
    Keys,
    digit_shifts,
    flat_existing,
    float_int_view,
    int_keys,
    magnitude_keys,
)
from sparsetool.util import workers as pool

__all__ = ["top_k_mask", "Keys", "int_keys", "magnitude_keys", "histogram", "bucket_histogram",
           "threshold_mask", "select_top", "count", "Scan", "scan", "boundary", "resolve_keep",
           "map_chunks", "row_step"]


def resolve_keep(numel: int, sparsity: float | None, keep: int | None) -> int:
    if (sparsity is None) == (keep is None):
        raise SparsetoolError("give exactly one of sparsity or keep")
    if keep is None:
        assert sparsity is not None  # exactly one of them was given
        return sparsity_keep(numel, sparsity)
    if isinstance(keep, bool) or int(keep) != keep or not 0 <= keep <= numel:
        raise SparsetoolError(
            f"keep must be an integer from 0 to {numel} (the tensor's size), got {keep!r}"
        )
    return int(keep)


_SMALL = 4096


def _bincount(x: Tensor, bins: int) -> Tensor:
    """int64 counts of each value in [0, bins) of a flat integer tensor."""
    if x.numel() * 4 < bins:  # torch.bincount costs ~10 ms at 65536 bins however few the values
        counts = torch.zeros(bins, dtype=torch.int64, device=x.device)
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
    shifts = digit_shifts(nbits)
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


_CHUNK = 1 << 20  # keys per chunk: a chunk's temporaries stay in cache between the steps on it
def map_chunks(fn: Callable[[int, int], Any], n: int, step: int | None = None) -> list[Any]:
    """``fn(start, stop)`` over the chunks of ``range(n)`` (``step`` long, default ``_CHUNK``), in
    order; chunks run on a thread pool (torch releases the GIL, and ``torch.bincount`` is
    single-threaded on CPU)."""
    step = step or _CHUNK
    spans = [(s, min(s + step, n)) for s in range(0, n, step)]
    return pool.run(lambda span: fn(*span), spans)


def row_step(row: int) -> int:
    """A chunk length for :func:`map_chunks` that is a whole number of rows of ``row`` entries."""
    return max(1, _CHUNK // row) * row


def count(mask: Tensor) -> int:
    """True entries of a flat bool mask (``Tensor.sum`` on bool is several times slower)."""
    return sum(map_chunks(lambda a, b: int(torch.count_nonzero(mask[a:b])), mask.numel()))


def boundary(total: Tensor, keep: int) -> tuple[int, int]:
    """The digit d with above(d) < keep <= above(d) + total[d], and above(d)."""
    suffix = total.flip(0).cumsum(0).flip(0)
    d = int((suffix >= keep).nonzero()[-1])
    return d, int(suffix[d]) - int(total[d])


def histogram(keys: Keys) -> tuple[Tensor, list[Tensor]]:
    """Counts of the first digit over the available keys (``2**(nbits - shift)`` int64 counters),
    and the raw counts of each chunk (unavailable keys not removed)."""
    found = scan(keys)
    return found.total, found.per_chunk


@dataclass(frozen=True, eq=False)
class Scan:
    """One histogram pass over a tensor's keys, and what it tells besides the selection.

    ``total`` counts the first digit of the available keys, ``per_chunk`` the raw first digits of
    each chunk; ``above_inf`` is how many keys have a first digit at or above the one of +inf
    (for magnitude keys: the inf and NaN entries, which no finite key shares a digit with);
    ``zeros`` is how many keys are exactly 0 (for magnitude keys: +0.0 and -0.0), or -1 when
    not asked for; it costs a second pass only when the first digit is not the whole key and its
    bucket 0 is not empty.
    """

    keys: Keys
    total: Tensor
    per_chunk: list[Tensor]
    above_inf: int
    zeros: int


def scan(keys: Keys, *, zeros: bool = False) -> Scan:
    """The :class:`Scan` of ``keys``: one pass over them in chunks, on the pool (with ``zeros``,
    the zero keys counted too; see :class:`Scan`)."""
    width = keys.nbits - keys.shift
    per_chunk = map_chunks(lambda a, b: _bincount(keys.top(a, b), 1 << width), keys.n)
    total = torch.zeros(1 << width, dtype=torch.int64, device=keys.device)
    for part in per_chunk:
        total += part
    idig = keys.inf >> keys.shift
    above_inf = int(total[idig:].sum())
    found_zeros = int(total[0]) if zeros else -1
    if keys.shift and found_zeros > 0:  # bucket 0 also holds the smallest non-zero keys
        found_zeros = sum(map_chunks(lambda a, b: int((keys.read(a, b) == 0).sum()), keys.n))
    total[idig + 1:] = 0
    if keys.shift and int(total[idig]) > 0:  # keys above inf (NaN) may share its bucket

        def alive_in_top(a: int, b: int) -> int:
            return int(((keys.top(a, b) == idig) & (keys.read(a, b) <= keys.inf)).sum())

        total[idig] = sum(map_chunks(alive_in_top, keys.n))
    return Scan(keys, total, per_chunk, above_inf, found_zeros)


def bucket_histogram(keys: Keys, digit: int) -> Tensor:
    """Counts of the low ``shift`` bits of the available keys whose first digit is ``digit``
    (``2**shift`` int64 counters: one when the first digit is the whole key)."""
    bins = 1 << keys.shift

    def part(a: int, b: int) -> Tensor:
        k = keys.bucket(a, b, digit)
        return _bincount(k[k <= keys.inf] & (bins - 1), bins)

    total = torch.zeros(bins, dtype=torch.int64, device=keys.device)
    for counts in map_chunks(part, keys.n):
        total += counts
    return total


Sink = Callable[[int, int, Tensor], None]
"""``sink(a, b, mask)`` takes the mask of positions ``[a, b)``; called on the pool's threads."""


def threshold_mask(
    keys: Keys, threshold: int, ties: int, equal: list[int] | None = None,
    *, all_available: bool = False, sink: Sink | None = None,
) -> Tensor | None:
    """Flat mask: the available keys above ``threshold`` plus the first ``ties`` equal to it.

    With ``equal`` (per chunk, how many keys equal ``threshold``) one parallel pass writes it all:
    chunks before the one holding the last kept tie keep ">= threshold", that chunk keeps
    "> threshold" plus its first ties, later ones "> ". Without, the ties are found by a scan in
    flat order after the pass, which stops once they are all found. ``all_available`` skips the
    test against ``inf``.

    With ``sink``, each chunk's mask goes to ``sink(a, b, mask)`` as soon as it is made and
    nothing is returned: the whole mask never exists (``equal`` is counted first if ties need it).
    """
    n = keys.n
    if sink is not None and ties > 0 and equal is None:
        equal = map_chunks(lambda a, b: int((keys.read(a, b) == threshold).sum()), n)
    plan: list[int] = []
    for e in equal if ties > 0 and equal is not None else []:
        plan.append(min(ties, e) if 0 < ties < e else (-1 if ties >= e > 0 else 0))
        ties -= min(ties, e)
    out = torch.empty(n, dtype=torch.bool, device=keys.device) if sink is None else None

    def write(a: int, b: int) -> None:
        k = keys.read(a, b)  # written in place: "out[a:b] &= x" would copy back
        dst = out[a:b] if out is not None else torch.empty(b - a, dtype=torch.bool, device=keys.device)
        part = plan[a // _CHUNK] if plan else 0
        (torch.ge if part < 0 else torch.gt)(k, threshold, out=dst)
        if not all_available:
            dst &= k <= keys.inf
        if part > 0:
            dst[(k == threshold).nonzero().reshape(-1)[:part]] = True
        if sink is not None:
            sink(a, b, dst)

    map_chunks(write, n)
    if sink is not None:
        if ties > 0:
            raise SparsetoolError(
                f"the plan asks for {ties} more weights at the threshold than there are; "
                "did the tensor change between passes?"
            )
        return None
    for a in range(0, n, _CHUNK) if ties > 0 and not plan else []:
        where = (keys.read(a, min(a + _CHUNK, n)) == threshold).nonzero().reshape(-1)[:ties]
        out[a + where] = True
        ties -= where.numel()
        if ties == 0:
            break
    if ties > 0 and not plan:
        raise SparsetoolError(
            f"the plan asks for {ties} more weights at the threshold than there are; "
            "did the tensor change between passes?"
        )
    return out


def _whole(mask: Tensor, sink: Sink | None) -> Tensor | None:
    if sink is None:
        return mask
    sink(0, mask.numel(), mask)
    return None


def select_top(keys: Keys, keep: int, *, found: Scan | None = None,
               sink: Sink | None = None) -> Tensor | None:
    """Flat mask keeping the ``keep`` largest available keys, ties to the lower index.

    Two passes over the keys in chunks: a histogram of the first digit (plus, for keys wider than
    16 bits, the few candidates in the boundary bucket), then the comparison that writes the mask.
    ``found`` is the first pass when the caller has made it already (:func:`scan`); with ``sink``
    the mask is handed over chunk by chunk (:func:`threshold_mask`) and None is returned.
    """
    n, nbits, inf, shift = keys.n, keys.nbits, keys.inf, keys.shift
    if n <= _SMALL:  # one chunk: a sort beats 32768-bin histograms on few keys
        t, above, _, available = _select(keys.read(0, n), nbits, inf, keep)
        if t < 0:
            return _whole(keys.read(0, n) <= inf, sink)
        return _whole(threshold_mask(keys, t, keep - above, all_available=available == n), sink)
    if found is None:
        found = scan(keys)
    hist, per_chunk = found.total, found.per_chunk
    available = int(hist.sum())
    if keep >= available:
        if available == n:  # everything: no key needs reading
            return threshold_mask(keys, -1, 0, all_available=True, sink=sink)
        return threshold_mask(keys, -1, 0, sink=sink)
    if keep <= 0:
        return threshold_mask(keys, (1 << nbits) - 1, 0, all_available=True, sink=sink)
    d, above = boundary(hist, keep)
    if shift == 0:  # the digit is the whole key
        t, equal = d, [int(c[d]) for c in per_chunk]
    elif keep - above == int(hist[d]):  # all of bucket d is kept: no select inside it
        t, equal, above = (d << shift) - 1, None, keep
    else:  # finish the select among the keys of bucket d, which are few for real weights
        cands = map_chunks(lambda a, b: keys.bucket(a, b, d), n)
        t, above_in, _, _ = _select(torch.cat(cands), nbits, inf, keep - above)
        above += above_in
        equal = [int((c == t).sum()) for c in cands]
    return threshold_mask(keys, t, keep - above, equal, all_available=available == n, sink=sink)


def top_k_mask(scores: Tensor, k: int, allowed: Tensor | None = None) -> Tensor:
    """Bool mask of the ``k`` highest ``scores`` among the ``allowed`` positions; True = selected.

    Signed order (-inf < -1 < -0.0 == 0.0 < 1 < inf); ties keep the lower flat index; NaN is never
    selected; if fewer than ``k`` positions are allowed and not NaN, all of them are selected.
    Exact and deterministic, so every data-parallel rank and a resumed run choose the same (the
    job the Cerebras library gives its ``ScoreTieBreaker``).

    >>> top_k_mask(torch.tensor([0.5, 0.9, 0.5, 0.5]), 2)
    tensor([ True,  True, False, False])
    >>> top_k_mask(torch.tensor([0.5, 0.9, 0.5, 0.5]), 2, allowed=torch.tensor([True, False, False, True]))
    tensor([ True, False, False,  True])
    >>> top_k_mask(torch.tensor([-2.0, -1.0, -0.0, 3.0]), 3)
    tensor([False,  True,  True,  True])
    """
    keep = resolve_keep(scores.numel(), None, k)
    src, nbits, inf = float_int_view(scores.detach())
    alive = flat_existing(allowed, scores.shape)
    negative = src < 0  # the sign bit
    if not bool(negative.any()):  # |w|, |grad| and uniform draws: one magnitude selection
        return select_top(int_keys(src, nbits, inf, alive), keep).reshape(scores.shape)
    full = (1 << nbits) - 1
    magnitude = src & full
    negative &= magnitude != 0  # -0.0 is zero; a NaN with the sign bit stays unavailable below
    upper = ~negative if alive is None else alive & ~negative
    out = select_top(int_keys(src, nbits, inf, upper), keep)
    got = count(out)
    if got < keep:  # below zero the smaller magnitude is the higher score: key inf - |x|
        flipped = torch.where(magnitude <= inf, inf - magnitude, torch.full_like(magnitude, full))
        lower = negative if alive is None else alive & negative
        out |= select_top(int_keys(flipped, nbits, inf, lower), keep - got)
    return out.reshape(scores.shape)
