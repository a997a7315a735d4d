"""Counting on the bit patterns of stored values, in numpy: no torch, no decoding, no copy.

The magnitude of an IEEE float is its bit pattern without the sign bit, an integer; it is 0 for
+0.0 and -0.0 alike, and above the pattern of +inf exactly for NaN. So "non-zero" is one ``&`` and
one count per element, and "NaN" one comparison, over the raw values a checkpoint maps
(:meth:`sparsetool.checkpoint.Checkpoint.read_array`), chunk by chunk on the worker pool.

>>> import numpy as np
>>> # bf16 1, -0, 0, NaN, -1:
>>> bits = np.array([0x3F80, -0x8000, 0x0000, 0x7FC0, -0x4080], dtype=np.int16)
>>> count_nonzero_bits(bits), count_nonzero_bits(bits, "BF16", nan_is_zero=True)
(3, 2)
>>> holds_nan_or_negative_zero(bits, "BF16")
True
"""

from __future__ import annotations

import numpy as np

from sparsetool.util import workers
from sparsetool.util.floatbits import FORMATS

FLOAT_KEYS = {
    st: (f.magnitude, f.inf) for st, f in FORMATS.items() if f.fp8 is None and f.inf is not None
}
"""(magnitude mask, magnitude of +inf) of the float types whose zeros and NaN are told apart on
the bits this way (fp8 types are not: some have no inf, and in the FNUZ ones 0x80 is NaN), from
the one table of float formats (:data:`sparsetool.util.floatbits.FORMATS`)."""

CHUNK = 1 << 21


def _chunks(fn, n: int) -> list:
    return workers.run(lambda a: fn(a, min(a + CHUNK, n)), range(0, n, CHUNK))


def count_nonzero_bits(
    bits: np.ndarray, st_dtype: str | None = None, *, nan_is_zero: bool = False
) -> int:
    """Entries of a flat float array given by its bits (signed integers of its width) that are
    not zero (-0.0 is zero). With ``nan_is_zero`` (a NaN sentinel; ``st_dtype`` one of
    ``FLOAT_KEYS``) NaN counts as zero too."""
    mag = np.iinfo(bits.dtype).max  # every bit but the sign
    inf: int | None = None
    if nan_is_zero:
        if st_dtype is None:
            raise AssertionError("nan_is_zero needs the tensor's st_dtype")
        inf = FLOAT_KEYS[st_dtype][1]

    def part(a: int, b: int) -> int:
        k = bits[a:b] & mag
        found = int(np.count_nonzero(k))
        if inf is not None:
            found -= int(np.count_nonzero(k > inf))
        return found

    return sum(_chunks(part, bits.size))


def nonzero_bits(values: np.ndarray, *, floating: bool) -> np.ndarray:
    """``values != 0`` as a bool array, for floats given by their bits (``floating``): -0.0 (only
    the sign bit set, the type's minimum) is a zero too; NaN is not.

    >>> nonzero_bits(np.array([0, -0x8000, 0x3F80, 0x7FC0], dtype=np.int16), floating=True).tolist()
    [False, False, True, True]
    """
    mask = values != 0
    if floating:
        negative_zero = np.iinfo(values.dtype).min
        if (values == negative_zero).any():
            mask &= values != negative_zero
    return mask


def holds_nan_or_negative_zero(bits: np.ndarray, st_dtype: str) -> bool:
    """Does a flat float array given by its bits (``FLOAT_KEYS`` types) hold a NaN or a -0.0?

    Three reductions per chunk, no temporary arrays: on the signed view -0.0 is the type's
    minimum and a positive NaN lies above +inf; on the unsigned view a negative NaN lies above
    the pattern of -inf.

    >>> holds_nan_or_negative_zero(np.array([0x3F80, -0x4080, 0], dtype=np.int16), "BF16")
    False
    >>> [
    ...     holds_nan_or_negative_zero(np.array([0x3F80, x], dtype=np.int16), "BF16")
    ...     for x in (-0x8000, 0x7FC0, -0x40)
    ... ]
    [True, True, True]
    """
    inf = FLOAT_KEYS[st_dtype][1]
    negative_zero = int(np.iinfo(bits.dtype).min)  # only the sign bit set
    unsigned = bits.view(bits.dtype.str.replace("i", "u"))
    negative_inf = -negative_zero + inf  # the unsigned pattern of -inf

    def part(a: int, b: int) -> bool:
        if b <= a:
            return False
        return (
            int(bits[a:b].max()) > inf
            or int(bits[a:b].min()) == negative_zero
            or int(unsigned[a:b].max()) > negative_inf
        )

    return any(_chunks(part, bits.size))


def count_nonzero_ints(values: np.ndarray) -> int:
    """Non-zero entries of an integer or uint8 (bool) array."""
    return sum(_chunks(lambda a, b: int(np.count_nonzero(values[a:b])), values.size))
