"""Integer keys for the selection kernel (:mod:`sparsetool.masks.kernel`): what it ranks.

A float's magnitude |w| is the integer ``bits & (2**(width-1) - 1)`` of its bit pattern (the order
of the keys is the order of the values), NaN any key above the key of +inf; fp8 converts to fp32
exactly. :class:`Keys` reads them chunk by chunk, with the first radix digit and the keys of one
bucket read as cheaply as the layout allows.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from sparsetool.errors import SparsetoolError

__all__ = ["Keys", "int_keys", "magnitude_keys", "flat_existing", "float_int_view", "digit_shifts"]

# (integer view dtype, number of magnitude bits) for each float dtype read bit-for-bit.
_LAYOUT = {
    torch.bfloat16: (torch.int16, 15),
    torch.float16: (torch.int16, 15),
    torch.float32: (torch.int32, 31),
    torch.float64: (torch.int64, 63),
}


def flat_existing(existing: Tensor | None, shape: torch.Size) -> Tensor | None:
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


def float_int_view(w: Tensor) -> tuple[Tensor, int, int]:
    """``w`` flat, viewed as integers (no copy for bf16/fp16/fp32/fp64); the magnitude's bit width
    (the sign is the bit above it); and the magnitude key of +inf."""
    if not w.dtype.is_floating_point:
        raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
    if w.dtype not in _LAYOUT:  # fp8 and friends convert to fp32 exactly
        w = w.to(torch.float32)
    int_dtype, nbits = _LAYOUT[w.dtype]
    inf = int(torch.tensor(math.inf, dtype=w.dtype).view(int_dtype).item())
    return w.contiguous().view(int_dtype).reshape(-1), nbits, inf


def digit_shifts(nbits: int) -> list[int]:
    """Digit positions from the top: 15 bits first, then 16-bit digits."""
    out, s = [], nbits - 15
    while s > 0:
        out.append(s)
        s -= 16
    out.append(0)
    return out


@dataclass(frozen=True, eq=False)
class Keys:
    """The integer keys of ``n`` positions, read chunk by chunk.

    Keys are non-negative and below ``2**nbits``; a key above ``inf`` is unavailable (NaN, or dead
    in an alive mask) and never selected. ``top(a, b)`` is the first radix digit ``key >> shift`` of
    positions ``[a, b)`` (maybe read faster than the keys), ``bucket(a, b, d)`` the keys there whose
    first digit is ``d``.
    """

    n: int
    nbits: int
    inf: int
    shift: int
    read: Callable[[int, int], Tensor]
    top: Callable[[int, int], Tensor]
    bucket: Callable[[int, int, int], Tensor]
    device: torch.device


def int_keys(src: Tensor, nbits: int, inf: int, alive: Tensor | None = None) -> Keys:
    """Keys ``src & (2**nbits - 1)`` of a flat integer tensor; dead (all ones) where ``alive`` is
    False."""
    full = (1 << nbits) - 1
    shift = digit_shifts(nbits)[0]

    def read(a: int, b: int) -> Tensor:
        k = src[a:b] & full
        if alive is not None:
            k.masked_fill_(~alive[a:b], full)
        return k

    halves = src.element_size() // 2
    if shift and shift == 16 * halves - 16 and sys.byteorder == "little":
        # The top digit is the top int16 of each key: read it in place, half or a quarter of the
        # bytes, and count 16-bit values as fast as bf16 keys.
        high = src.contiguous().view(torch.int16)

        def top(a: int, b: int) -> Tensor:
            t = high[a * halves + halves - 1:b * halves:halves] & 0x7FFF
            if alive is not None:
                t.masked_fill_(~alive[a:b], 0x7FFF)
            return t
    else:

        def top(a: int, b: int) -> Tensor:
            return read(a, b) >> shift if shift else read(a, b)  # 16-bit keys: the digit is the key

    def bucket(a: int, b: int, d: int) -> Tensor:
        return src[a:b][top(a, b) == d] & full

    return Keys(src.numel(), nbits, inf, shift, read, top, bucket, src.device)


def magnitude_keys(w: Tensor, alive: Tensor | None = None) -> Keys:
    """Keys of |w| in ``w``'s own bit width (fp8: fp32); ``alive`` is flat bool or None."""
    src, nbits, inf = float_int_view(w)
    return int_keys(src, nbits, inf, alive)
