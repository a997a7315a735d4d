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
the same mask, bit for bit, in numpy, on the tensor's own bit patterns, in a few passes over them
(``tests/masks/test_masks.py`` and ``tests/masks/test_kernel.py`` check it against this reference
on multi-chunk tensors with ties, NaN and dead weights, and the numpy and torch entries against
each other):

>>> import torch
>>> w = torch.tensor([[0.5, -2.0, 0.5], [float("nan"), 0.5, -0.0]])
>>> alive = torch.tensor([[True, True, True], [True, False, True]])
>>> a = w.double().abs().reshape(-1); dead = torch.isnan(a) | ~alive.reshape(-1)
>>> order = torch.sort(a.masked_fill(dead, -1.0), descending=True, stable=True).indices
>>> ref = torch.zeros(a.numel(), dtype=torch.bool); ref[order[:2]] = True
>>> from sparsetool.masks.keys import magnitude_keys
>>> kernel = select_top(magnitude_keys(w, alive.reshape(-1)), 2)
>>> kernel.tolist(), bool((kernel == (ref & ~dead).numpy()).all())
([True, True, False, False, False, False], True)

This numpy kernel is the one implementation. numpy arrays of bit patterns (with the safetensors
type name, ``dtype="BF16"``) come in and numpy bool masks go out; a torch tensor (of any device)
crosses to CPU numpy at the entry (:mod:`sparsetool.masks.keys`) and its mask goes back to the
tensor's device, so torch is imported only by a caller that already has a tensor.

Every selection in sparsetool runs here: layer magnitude pruning, random masks, N:M (through
:func:`float_int_view` and :func:`map_chunks`), the global threshold across tensors (through
:func:`histogram`, :func:`bucket_histogram`, :func:`boundary` and :func:`threshold_mask`), Wanda's
and SparseGPT's selections and the drop/grow top-k of every training algorithm
(:func:`top_k_mask`). The rules are the same everywhere:

- exact: exactly ``k`` selected, or every available position if fewer are available;
- ties go to the lower flat (row-major) index;
- NaN is never selected, nor a position where the ``allowed``/``existing`` mask is False;
- -0.0 equals 0.0.

For non-negative floats the integer order of the bit patterns is the order of the values, so the
magnitude |w| of a bf16/fp16/fp32/fp64 weight is the integer ``bits & (2**(width-1) - 1)`` and NaN
is any key above the key of +inf (fp8 converts to fp32 exactly; :mod:`sparsetool.masks.keys`).
The threshold key of one tensor is found by ``np.partition`` (introselect, O(n)) over its
available non-zero keys: the zeros and the unavailable keys are counted, not partitioned, since a
partition slows down a hundredfold on one value repeated over most of the array (an already
pruned tensor). The global scope finds its threshold across tensors from histograms of the first
digit (``np.bincount``): the top 15 bits (32768 bins, the whole key for 16-bit floats), then the
16-bit digit below it inside the boundary bucket: a most-significant-digit radix select, the
selection analogue of radix sorting (Knuth, TAOCP vol. 3, section 5.2.5). Either way one function,
:func:`threshold_mask`, writes the mask: the keys above the threshold, plus the first ties equal
to it. Signed scores are two selections on magnitude keys: the non-negative scores first, then, if
``k`` is not reached, the negative ones with the key ``inf - |x|`` (smaller magnitude = higher
score). Passes run in chunks of ``chunks.CHUNK`` keys (:mod:`sparsetool.masks.chunks`) on a small
thread pool (numpy releases the GIL in its loops), so temporaries stay in cache and every core
works.

>>> top_k_mask(torch.tensor([0.5, -0.9, 0.5, float("nan"), -0.1]), 3)
tensor([ True, False,  True, False,  True])
>>> top_k_mask(np.array([0.5, -0.9, 0.5, np.nan, -0.1], dtype=np.float32), 3)
array([ True, False,  True, False,  True])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, overload

import numpy as np

from sparsetool.errors import SparsetoolError
from sparsetool.masks import chunks
from sparsetool.masks.chunks import count_true, map_chunks
from sparsetool.masks.counts import sparsity_keep
from sparsetool.masks.histograms import histogram
from sparsetool.masks.keys import (
    Keys,
    flat_existing,
    float_int_view,
    int_keys,
    like,
    shape_of,
)

__all__ = ["resolve_keep", "Scan", "scan", "Sink", "threshold_mask", "select_top", "top_k_mask"]


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


_LOW: list[np.ndarray] = []


def _low_index() -> np.ndarray:
    """The low 16 bits of each index in a chunk (int32), made once."""
    if not _LOW or _LOW[0].size != chunks.CHUNK:
        _LOW[:] = [np.arange(chunks.CHUNK, dtype=np.int32) & 0xFFFF]
    return _LOW[0]


def _kth(cand: np.ndarray, need: int) -> tuple[int, int]:
    """The ``need``-th largest of ``cand`` (1 <= need <= size; ``cand`` is reordered) and how many
    are larger."""
    pos = cand.size - need
    cand.partition(pos)
    t = int(cand[pos])
    return t, int(np.count_nonzero(cand[pos + 1 :] > t))


def _select(bits: np.ndarray, inf: int, keep: int) -> tuple[int, int, int]:
    """Select among few keys: the threshold key T so that keep lies in (above(T), above(T) +
    equal(T)]; returns (T, above, available). Keys above ``inf`` are unavailable. If keep >=
    available, T is -1 and above = available; if keep <= 0, T is above every key."""
    live = bits[bits <= inf]
    if keep >= live.size:
        return -1, live.size, live.size
    if keep <= 0:
        return np.iinfo(bits.dtype).max, 0, live.size
    t, above = _kth(live, keep)
    return t, above, live.size


class Scan:
    """One pass over a tensor's keys, and what it tells besides the selection.

    ``above_inf`` is how many keys have a first digit at or above the one of +inf (for magnitude
    keys: the inf and NaN entries, and the dead ones); ``zeros`` is how many keys are exactly 0
    (for magnitude keys: +0.0 and -0.0), or -1 when not asked for. ``total`` counts the first digit
    of the available keys, ``per_chunk`` the raw first digits of each chunk: a histogram made on
    first use (the global scope's), which :func:`select_top` does not need.
    """

    def __init__(
        self, keys: Keys, above_inf: int, zeros: int, dead: int = -1, copy: np.ndarray | None = None
    ):
        self.keys, self.above_inf, self.zeros = keys, above_inf, zeros
        self.dead, self.copy = (
            dead,
            copy,
        )  # with ``copy``: the keys above inf, and the keys themselves
        self._hist: tuple[np.ndarray, list[np.ndarray]] | None = None

    @property
    def total(self) -> np.ndarray:
        if self._hist is None:
            self._hist = histogram(self.keys)
        return self._hist[0]

    @property
    def per_chunk(self) -> list[np.ndarray]:
        if self._hist is None:
            self._hist = histogram(self.keys)
        return self._hist[1]


def scan(keys: Keys, *, zeros: bool = False, copy: bool = False) -> Scan:
    """The :class:`Scan` of ``keys``: one pass over them in chunks, on the pool (with ``zeros``,
    the zero keys counted too; see :class:`Scan`). With ``copy`` the same pass keeps a copy of
    the keys and counts the unavailable ones, the first pass of :func:`select_top`, which then
    reads them no more."""
    edge = (keys.inf >> keys.shift) << keys.shift  # the smallest key with the first digit of inf
    out = np.empty(keys.n, dtype=keys.read(0, 1).dtype) if copy else None
    inf = keys.inf

    def part(a: int, b: int) -> tuple[int, int, int]:
        k = keys.read(a, b) if out is None else keys.read_to(a, b, out[a:b])
        found_zeros = (b - a) - int(np.count_nonzero(k)) if zeros or copy else -1
        if b > a and int(k.max()) < edge:  # one pass says: nothing at or above inf
            return 0, found_zeros, 0 if copy else -1
        return (
            int(np.count_nonzero(k >= edge)),
            found_zeros,
            int(np.count_nonzero(k > inf)) if copy else -1,
        )

    parts = map_chunks(part, keys.n)
    above_inf = sum(p[0] for p in parts)
    found_zeros = sum(p[1] for p in parts) if zeros or copy else -1
    return Scan(keys, above_inf, found_zeros, sum(p[2] for p in parts) if copy else -1, out)


Sink = Callable[[int, int, np.ndarray], None]
"""``sink(a, b, mask)`` takes the numpy bool mask of positions ``[a, b)``; called on the pool's
threads."""


@overload
def threshold_mask(
    keys: Keys,
    threshold: int,
    ties: int,
    equal: list[int] | None = None,
    *,
    all_available: bool = False,
    sink: None = None,
) -> np.ndarray: ...
@overload
def threshold_mask(
    keys: Keys,
    threshold: int,
    ties: int,
    equal: list[int] | None = None,
    *,
    all_available: bool = False,
    sink: Sink | None,
) -> np.ndarray | None: ...


def threshold_mask(
    keys: Keys,
    threshold: int,
    ties: int,
    equal: list[int] | None = None,
    *,
    all_available: bool = False,
    sink: Sink | None = None,
) -> np.ndarray | None:
    """Flat mask: the available keys above ``threshold`` plus the first ``ties`` equal to it.

    With ``equal`` (per chunk, how many keys equal ``threshold``) one parallel pass writes it all:
    chunks before the one holding the last kept tie keep ">= threshold", that chunk keeps
    "> threshold" plus its first ties, later ones "> ". Without, the ties are found by a scan in
    flat order after the pass (each chunk's candidates found in the pass). ``all_available``
    skips the test against ``inf``.

    With ``sink``, each chunk's mask goes to ``sink(a, b, mask)`` as soon as it is made and
    nothing is returned: the whole mask never exists (``equal`` is counted first if ties need it).
    """
    n = keys.n
    if sink is not None and ties > 0 and equal is None:
        _held_ties(keys, threshold, ties, all_available, sink)
        return None
    plan: list[int] = []
    for e in equal if ties > 0 and equal is not None else []:
        plan.append(min(ties, e) if 0 < ties < e else (-1 if ties >= e > 0 else 0))
        ties -= min(ties, e)
    out = np.empty(n, dtype=np.bool_) if sink is None else None

    def write(a: int, b: int) -> np.ndarray | None:
        k = keys.read(a, b)
        dst = out[a:b] if out is not None else np.empty(b - a, dtype=np.bool_)
        part = plan[a // chunks.CHUNK] if plan else 0
        if threshold < 0:  # everything available (the threshold fits no key type here)
            dst.fill(True)
        else:
            (np.greater_equal if part < 0 else np.greater)(k, threshold, out=dst)
        if not all_available:
            dst &= k <= keys.inf
        if part > 0:
            dst[np.flatnonzero(k == threshold)[:part]] = True
        if sink is not None:
            sink(a, b, dst)
        elif ties > 0 and not plan:  # the ties are chosen in flat order after the pass
            return np.flatnonzero(k == threshold)[:ties]
        return None

    candidates = map_chunks(write, n)
    if sink is not None:
        if ties > 0:
            raise SparsetoolError(
                f"the plan asks for {ties} more weights at the threshold than there are; "
                "did the tensor change between passes?"
            )
        return None
    assert out is not None
    for a, where in zip(range(0, n, chunks.CHUNK), candidates) if ties > 0 and not plan else []:
        where = where[:ties]
        out[a + where] = True
        ties -= where.size
        if ties == 0:
            break
    if ties > 0 and not plan:
        raise SparsetoolError(
            f"the plan asks for {ties} more weights at the threshold than there are; "
            "did the tensor change between passes?"
        )
    return out


def _held_ties(keys: Keys, threshold: int, ties: int, all_available: bool, sink: Sink) -> None:
    """:func:`threshold_mask` into a sink when ties must be placed and their counts per chunk are
    not known: one pass makes each chunk's "> threshold" mask and finds its keys equal to the
    threshold, the ties go to the first of those in flat order, then the chunks go to the sink
    (each chunk's mask is held meanwhile: one byte per key, instead of a second read of every key).
    """
    n = keys.n

    def first(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        k = keys.read(a, b)
        dst = np.greater(k, threshold)
        if not all_available:
            dst &= k <= keys.inf
        return dst, np.flatnonzero(k == threshold)

    made = map_chunks(first, n)
    for dst, equal in made:
        take = min(ties, equal.size)
        dst[equal[:take]] = True
        ties -= take
    if ties > 0:
        raise SparsetoolError(
            f"the plan asks for {ties} more weights at the threshold than there are; "
            "did the tensor change between passes?"
        )
    map_chunks(lambda a, b: sink(a, b, made[a // chunks.CHUNK][0]), n)


def _whole(mask: np.ndarray, sink: Sink | None) -> np.ndarray | None:
    if sink is None:
        return mask
    sink(0, mask.size, mask)
    return None


def select_top(
    keys: Keys, keep: int, *, found: Scan | None = None, sink: Sink | None = None
) -> np.ndarray | None:
    """Flat numpy bool mask keeping the ``keep`` largest available keys, ties to the lower index.

    One pass over the keys in chunks copies them out and counts the zeros and unavailable ones,
    ``np.partition`` over the available non-zero keys finds the threshold, then
    :func:`threshold_mask` writes the mask; with ``sink`` it is handed over chunk by chunk and
    None is returned. ``found`` is the caller's ``scan(keys, copy=True)``, when it made one (any
    other scan is not used).
    """
    n, inf = keys.n, keys.inf
    if n <= _SMALL:  # one chunk: partition it whole
        k = keys.read(0, n)
        t, above, available = _select(k, inf, keep)
        if t < 0:
            return _whole(k <= inf, sink)
        return _whole(threshold_mask(keys, t, keep - above, all_available=available == n), sink)
    # One pass: every key copied out for the partition, its zeros and unavailable keys counted
    # (made by the caller's scan(keys, copy=True) if it has one).
    if found is None or found.copy is None or found.keys is not keys:
        found = scan(keys, copy=True)
    cand, zeros, dead = found.copy, found.zeros, found.dead
    found.copy = None  # the partition reorders it: one selection per copy
    assert cand is not None
    available = n - dead
    if keep >= available:
        return threshold_mask(keys, -1, 0, all_available=dead == 0, sink=sink)
    if keep <= 0:
        return threshold_mask(keys, (1 << keys.nbits) - 1, 0, all_available=True, sink=sink)
    nonzero = available - zeros
    if keep > nonzero:  # every non-zero key, and the first zeros
        t, above = 0, nonzero
    elif (
        zeros + dead
    ) * 4 <= n:  # few repeated keys: partition them all; the dead ones are the largest
        t, above = _kth(cand, keep + dead)
        above -= dead
    elif cand.itemsize <= 2:
        # A partition crawls on one value repeated over much of the array (the zeros of a pruned
        # tensor, the dead keys: 100x slower at half the array, measured): spread every value by the
        # low 16 bits of its index, below the key's own bits, and select the (keep + dead)-th
        # largest; its high half is the threshold.
        wide = np.empty(n, dtype=np.int32)
        low = _low_index()

        def spread(a: int, b: int) -> None:
            if cand is None:  # dropped only once spread
                raise AssertionError("the keys' copy is gone")
            np.left_shift(cand[a:b], 16, out=wide[a:b], dtype=np.int32)
            wide[a:b] |= low[: b - a]

        map_chunks(spread, n)
        cand = None
        t, above = _kth(wide, keep + dead)
        above = int(np.count_nonzero(wide[n - keep - dead + 1 :] >= (t >> 16) + 1 << 16)) - dead
        t >>= 16
        del wide
    else:  # wider keys: leave the zeros and dead keys out of the partition

        def live(a: int, b: int) -> np.ndarray:
            assert cand is not None
            k = cand[a:b]
            return k[(k != 0) & (k <= inf)]

        t, above = _kth(np.concatenate(map_chunks(live, n)), keep)
    cand = None  # the copies go before the mask is written
    return threshold_mask(keys, t, keep - above, all_available=dead == 0, sink=sink)


def top_k_mask(scores: Any, k: int, allowed: Any = None) -> Any:
    """Bool mask of the ``k`` highest ``scores`` among the ``allowed`` positions; True = selected.

    ``scores`` is a torch float tensor (the mask comes back on its device) or a numpy float16/32/64
    array (a numpy mask comes back). Signed order (-inf < -1 < -0.0 == 0.0 < 1 < inf); ties keep
    the lower flat index; NaN is never selected; if fewer than ``k`` positions are allowed and not
    NaN, all of them are selected. Exact and deterministic, so every data-parallel rank and a
    resumed run choose the same (the job the Cerebras library gives its ``ScoreTieBreaker``).

    >>> import torch
    >>> top_k_mask(torch.tensor([0.5, 0.9, 0.5, 0.5]), 2)
    tensor([ True,  True, False, False])
    >>> top_k_mask(
    ...     torch.tensor([0.5, 0.9, 0.5, 0.5]), 2, allowed=torch.tensor([True, False, False, True])
    ... )
    tensor([ True, False, False,  True])
    >>> top_k_mask(np.array([-2.0, -1.0, -0.0, 3.0]), 3)
    array([False,  True,  True,  True])
    """
    shape = shape_of(scores)
    keep = resolve_keep(int(np.prod(shape, dtype=np.int64)), None, k)
    src, nbits, inf = float_int_view(scores)
    alive = flat_existing(allowed, shape)
    negative = src < 0  # the sign bit
    if not negative.any():  # |w|, |grad| and uniform draws: one magnitude selection
        out = select_top(int_keys(src, nbits, inf, alive), keep)
        assert out is not None
        return like(out.reshape(shape), scores)
    full = (1 << nbits) - 1
    magnitude = src & full
    negative &= magnitude != 0  # -0.0 is zero; a NaN with the sign bit stays unavailable below
    upper = ~negative if alive is None else alive & ~negative
    out = select_top(int_keys(src, nbits, inf, upper), keep)
    assert out is not None
    got = count_true(out)
    if got < keep:  # below zero the smaller magnitude is the higher score: key inf - |x|
        flipped = inf - magnitude
        flipped[magnitude > inf] = full
        lower = negative if alive is None else alive & negative
        more = select_top(int_keys(flipped, nbits, inf, lower), keep - got)
        assert more is not None
        out |= more
    return like(out.reshape(shape), scores)
