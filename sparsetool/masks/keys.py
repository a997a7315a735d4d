"""Integer keys for the selection kernel (:mod:`sparsetool.masks.kernel`): what it ranks, in numpy.

A float's magnitude |w| is the integer ``bits & (2**(width-1) - 1)`` of its bit pattern (the order
of the keys is the order of the values), NaN any key above the key of +inf; fp8 converts to fp32
exactly (:mod:`sparsetool.util.floatbits`). :class:`Keys` reads them chunk by chunk, with the first
radix digit and the keys of one bucket.

The kernel works on numpy arrays only. A float array on the numpy side is its bit patterns (the
signed integers of its width) with the safetensors name of its type (``dtype="BF16"``); native
numpy float16/32/64 arrays are read the same way. A torch tensor crosses here, at the boundary:
``.detach().cpu()``, viewed as integers, ``.numpy()`` (no copy for a contiguous CPU tensor); a mask
goes back with :func:`like` (``torch.from_numpy``, then to the input's device). torch is never
imported by this module: a torch tensor can only exist once torch is loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparsetool.errors import SparsetoolError
from sparsetool.util.floatbits import F32_INF, FORMATS, float_format, fp32_bits

__all__ = [
    "Keys",
    "int_keys",
    "magnitude_keys",
    "flat_existing",
    "float_int_view",
    "digit_shifts",
    "is_torch",
    "flat_bits",
    "bool_array",
    "like",
    "shape_of",
]

_NATIVE = {"float16": "F16", "float32": "F32", "float64": "F64"}


def is_torch(x: Any) -> bool:
    """Is ``x`` a torch tensor (False without importing torch when it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def shape_of(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def flat_bits(w: Any, dtype: str | None = None) -> tuple[np.ndarray, str]:
    """``w`` flat as the signed integers of its width, and its safetensors type name.

    ``w`` is a torch float tensor, a native numpy float array, or a numpy integer array of bit
    patterns with ``dtype`` its type's name.
    """
    if is_torch(w):
        torch = sys.modules["torch"]
        if not w.dtype.is_floating_point:
            raise SparsetoolError(f"magnitude needs a floating tensor, got dtype {w.dtype}")
        try:
            fmt = float_format(w.dtype)
        except KeyError:  # another float type: fp32 holds it exactly or it is not pruned
            w, fmt = w.to(torch.float32), FORMATS["F32"]
        t = w.detach().cpu().contiguous().view(getattr(torch, fmt.view)).reshape(-1)
        return t.numpy(), fmt.st
    a = np.asarray(w)
    if dtype is None:
        st = _NATIVE.get(a.dtype.name)
        if st is None:
            raise SparsetoolError(
                f"magnitude needs a floating tensor, got dtype {a.dtype} "
                "(give the bit patterns' type as dtype=)"
            )
        return np.ascontiguousarray(a).reshape(-1).view(FORMATS[st].view), st
    fmt = float_format(dtype)
    if a.dtype.kind not in "iu" or a.dtype.itemsize != fmt.itemsize:
        raise SparsetoolError(f"{fmt.st} bit patterns are {fmt.view}, got an array of {a.dtype}")
    return np.ascontiguousarray(a).reshape(-1).view(fmt.view), fmt.st


def bool_array(x: Any) -> np.ndarray:
    """A numpy bool array of ``x`` (numpy or torch, bool or numbers: non-zero is True)."""
    if is_torch(x):
        x = x.detach().cpu()
        x = (x if x.dtype == sys.modules["torch"].bool else x != 0).numpy()
    a = np.asarray(x)
    return a if a.dtype == np.bool_ else a != 0


def like(mask: np.ndarray, ref: Any) -> Any:
    """``mask`` as a torch tensor on ``ref``'s device when ``ref`` is a torch tensor, else as is."""
    if not is_torch(ref):
        return mask
    # np.ascontiguousarray makes a 0-d array 1-d: the reshape keeps the shape
    return (
        sys.modules["torch"]
        .from_numpy(np.ascontiguousarray(mask))
        .reshape(mask.shape)
        .to(ref.device)
    )


def flat_existing(existing: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    if existing is None:
        return None
    if shape_of(existing) != tuple(shape):
        raise SparsetoolError(
            f"existing mask has shape {shape_of(existing)} but the weight has shape "
            f"{tuple(shape)}; "
            "a mask must match its weight"
        )
    return bool_array(existing).reshape(-1)


def float_int_view(w: Any, dtype: str | None = None) -> tuple[np.ndarray, int, int]:
    """``w`` flat as integers (no copy for bf16/fp16/fp32/fp64; fp8 converts to fp32); the
    magnitude's bit width (the sign is the bit above it); and the magnitude key of +inf."""
    bits, st = flat_bits(w, dtype)
    fmt = FORMATS[st]
    if fmt.fp8 is not None:
        return fp32_bits(bits, st), 31, F32_INF
    assert fmt.inf is not None
    return bits, 8 * fmt.itemsize - 1, fmt.inf


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
    """The integer keys of ``n`` positions, read chunk by chunk (numpy arrays).

    Keys are non-negative and below ``2**nbits``; a key above ``inf`` is unavailable (NaN, or dead
    in an alive mask) and never selected. ``top(a, b)`` is the first radix digit ``key >> shift`` of
    positions ``[a, b)``, ``bucket(a, b, d)`` the keys there whose first digit is ``d``.
    """

    n: int
    nbits: int
    inf: int
    shift: int
    read: Callable[[int, int], np.ndarray]
    top: Callable[[int, int], np.ndarray]
    bucket: Callable[[int, int, int], np.ndarray]
    read_into: Callable[[int, int, np.ndarray], None] | None = None  # read(a, b) into an array

    def read_to(self, a: int, b: int, out: np.ndarray) -> np.ndarray:
        """The keys of ``[a, b)`` written into ``out`` (``b - a`` long, the keys' dtype) and
        returned: no temporary array where the keys allow it."""
        if self.read_into is None:
            out[...] = self.read(a, b)
        else:
            self.read_into(a, b, out)
        return out


def int_keys(src: np.ndarray, nbits: int, inf: int, alive: Any = None) -> Keys:
    """Keys ``src & (2**nbits - 1)`` of a flat integer array; dead (all ones) where ``alive`` is
    False."""
    src = np.asarray(src).reshape(-1)
    full = (1 << nbits) - 1
    shift = digit_shifts(nbits)[0]
    dead = None if alive is None else ~bool_array(alive).reshape(-1)

    def read(a: int, b: int) -> np.ndarray:
        k = src[a:b] & full
        if dead is not None:
            np.copyto(k, full, where=dead[a:b])
        return k

    mask = np.array(full).astype(src.dtype)

    def read_into(a: int, b: int, out: np.ndarray) -> None:
        np.bitwise_and(src[a:b], mask, out=out)
        if dead is not None:
            np.copyto(out, full, where=dead[a:b])

    def top(a: int, b: int) -> np.ndarray:
        return read(a, b) >> shift if shift else read(a, b)  # 16-bit keys: the digit is the key

    def bucket(a: int, b: int, d: int) -> np.ndarray:
        k = read(a, b)
        return k[(k >> shift) == d]

    return Keys(src.size, nbits, inf, shift, read, top, bucket, read_into)


def magnitude_keys(w: Any, alive: Any = None, *, dtype: str | None = None) -> Keys:
    """Keys of |w| in ``w``'s own bit width (fp8: fp32); ``w`` a torch tensor or numpy bit
    patterns with ``dtype``; ``alive`` flat bool (numpy or torch) or None."""
    src, nbits, inf = float_int_view(w, dtype)
    return int_keys(src, nbits, inf, alive)
