"""Histograms of the kernel's keys by their first radix digit: what one threshold across many
tensors is found with (:mod:`sparsetool.masks.global_magnitude`), and the count of a tensor's
keys around a threshold.

The first digit of a key is ``key >> shift`` (:class:`~sparsetool.masks.keys.Keys`): the whole
15-bit magnitude of a bf16 or fp16 weight, the high 15 bits of an fp32 one. Counting every digit
costs an ``np.bincount`` per key; :func:`sampled_histogram` estimates the counts from one block in
64, and :func:`histogram_from` counts exactly only around the place the estimate points to.
"""

from __future__ import annotations

import numpy as np

from sparsetool.masks.chunks import bincount, map_chunks
from sparsetool.masks.keys import Keys

__all__ = ["histogram", "sampled_histogram", "histogram_from", "bucket_histogram", "boundary"]


def boundary(total: np.ndarray, keep: int) -> tuple[int, int]:
    """The digit d with above(d) < keep <= above(d) + total[d], and above(d)."""
    suffix = np.cumsum(np.asarray(total)[::-1])[::-1]  # suffix[d] = count of digits >= d
    d = int(np.flatnonzero(suffix >= keep)[-1])
    return d, int(suffix[d]) - int(total[d])


def histogram(keys: Keys) -> tuple[np.ndarray, list[np.ndarray]]:
    """Counts of the first digit over the available keys (``2**(nbits - shift)`` int64 counters),
    and the raw counts of each chunk (unavailable keys not removed)."""
    width = keys.nbits - keys.shift
    per_chunk = map_chunks(lambda a, b: bincount(keys.top(a, b), 1 << width), keys.n)
    total = np.zeros(1 << width, dtype=np.int64)
    for part in per_chunk:
        total += part
    idig = keys.inf >> keys.shift
    total[idig + 1 :] = 0
    if keys.shift and int(total[idig]) > 0:  # keys above inf (NaN) may share its bucket

        def alive_in_top(a: int, b: int) -> int:
            k = keys.read(a, b)
            return int(np.count_nonzero(((k >> keys.shift) == idig) & (k <= keys.inf)))

        total[idig] = sum(map_chunks(alive_in_top, keys.n))
    return total, per_chunk


_SAMPLE_BLOCK, _SAMPLE_EVERY = 4096, 64


def sampled_histogram(keys: Keys) -> np.ndarray:
    """An estimate of the counts of the first digit (float64): a histogram of one block of
    4096 keys in every 64, scaled to all of them; every key when there are few. For keys that
    are all available (a finite tensor's magnitudes)."""
    width = keys.nbits - keys.shift
    stride = _SAMPLE_BLOCK * _SAMPLE_EVERY
    if keys.n <= stride:
        return bincount(keys.top(0, keys.n), 1 << width).astype(np.float64)
    blocks = [keys.top(a, min(a + _SAMPLE_BLOCK, keys.n)) for a in range(0, keys.n, stride)]
    sample = np.concatenate(blocks)
    return bincount(sample, 1 << width) * (keys.n / sample.size)


_FEW = 16  # digits counted one comparison each; more take a compress and a bincount


def histogram_from(keys: Keys, low: int, high: int | None = None) -> np.ndarray:
    """The counts of the first digit of keys that are all available, exact for the digits from
    ``low`` to ``high`` (None: the last); the keys below ``low`` are counted together in bin
    ``low - 1``, those above ``high`` in bin ``high + 1``. A plan whose boundary digit lies in
    ``[low, high]`` needs no more. When ``low`` and ``high`` are near that boundary (found from
    :func:`sampled_histogram`) this costs a fraction of :func:`histogram`: a few comparisons
    per key where ``np.bincount`` costs several times as much."""
    width = keys.nbits - keys.shift
    bins = 1 << width
    high = bins - 1 if high is None else min(int(high), bins - 1)
    few = high - low + 1 <= _FEW

    def part(a: int, b: int) -> np.ndarray:
        d = keys.top(a, b)
        counts = np.zeros(bins, dtype=np.int64)
        if few:
            for v in range(low, high + 1):
                counts[v] = np.count_nonzero(d == v)
        else:
            inside = np.compress((d >= low) & (d <= high), d)
            counts += bincount(inside, bins)
            counts[:low] = 0
        above = int(np.count_nonzero(d > high)) if high < bins - 1 else 0
        if above:
            counts[high + 1] = above
        if low > 0:
            counts[low - 1] = (b - a) - int(counts[low:].sum())
        return counts

    total = np.zeros(bins, dtype=np.int64)
    for counts in map_chunks(part, keys.n):
        total += counts
    return total


def bucket_histogram(keys: Keys, digit: int) -> np.ndarray:
    """Counts of the low ``shift`` bits of the available keys whose first digit is ``digit``
    (``2**shift`` int64 counters: one when the first digit is the whole key)."""
    bins = 1 << keys.shift

    def part(a: int, b: int) -> np.ndarray:
        k = keys.bucket(a, b, digit)
        return bincount(k[k <= keys.inf] & (bins - 1), bins)

    total = np.zeros(bins, dtype=np.int64)
    for counts in map_chunks(part, keys.n):
        total += counts
    return total
