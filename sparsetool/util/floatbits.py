"""Float formats on their bit patterns, in numpy: what a dtype's bits mean, without torch.

A float tensor is handled here as its bit patterns, a numpy array of the signed integers of its
width (what :meth:`sparsetool.checkpoint.Checkpoint.read_array` maps), and the safetensors name of
its type. numpy has no bf16 or fp8, but none is needed: for the IEEE-style formats the magnitude
|w| is the integer ``bits & magnitude`` (its order is the order of the values, +0.0 and -0.0 are
both 0, NaN is any key above the key of +inf), and the 256 patterns of an fp8 format convert to
fp32 exactly through a table (:func:`fp32_bits`).

>>> bits = np.array([0x3F80, -0x4080, -0x8000, 0x7FC0], dtype=np.int16)  # bf16: 1, -1, -0.0, NaN
>>> fp32_bits(bits, "BF16").view(np.float32).tolist()[:3]
[1.0, -1.0, -0.0]
>>> is_nan(bits, "BF16").tolist()
[False, False, False, True]
>>> (
...     hex(FORMATS["F8_E4M3"].nan),
...     float(fp32_bits(np.array([0x7E], dtype=np.int8), "F8_E4M3").view(np.float32)[0]),
... )
('0x7f', 448.0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FloatFormat", "FORMATS", "float_format", "fp32_bits", "is_nan", "F32_INF", "F32_NAN"]

F32_INF = 0x7F80_0000
"""The fp32 pattern of +inf: every finite magnitude key on the fp32 scale is below it."""
F32_NAN = 0x7FC0_0000
"""The fp32 pattern of the NaN that conversions produce."""


@dataclass(frozen=True)
class FloatFormat:
    """One float type as bits: ``view`` is the numpy signed integer type of its width,
    ``magnitude`` every bit but the sign, ``inf`` the magnitude of +inf (None: the format has
    none), ``nan`` the pattern of NaN as a signed integer of the width (the one torch writes)."""

    st: str
    view: str
    magnitude: int
    inf: int | None
    nan: int
    fp8: tuple[int, int, int, bool] | None = None  # exponent bits, mantissa bits, bias, "fnuz"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.view).itemsize


FORMATS = {
    f.st: f
    for f in (
        FloatFormat("BF16", "int16", 0x7FFF, 0x7F80, 0x7FC0),
        FloatFormat("F16", "int16", 0x7FFF, 0x7C00, 0x7E00),
        FloatFormat("F32", "int32", 0x7FFF_FFFF, F32_INF, F32_NAN),
        FloatFormat(
            "F64", "int64", 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, 0x7FF8_0000_0000_0000
        ),
        FloatFormat("F8_E4M3", "int8", 0x7F, None, 0x7F, (4, 3, 7, False)),
        FloatFormat("F8_E5M2", "int8", 0x7F, 0x7C, 0x7F, (5, 2, 15, False)),
        FloatFormat("F8_E4M3FNUZ", "int8", 0x7F, None, -0x80, (4, 3, 8, True)),
        FloatFormat("F8_E5M2FNUZ", "int8", 0x7F, None, -0x80, (5, 2, 16, True)),
    )
}
"""Every float type sparsetool prunes, by safetensors name."""

_TORCH_NAMES = {
    "bfloat16": "BF16",
    "float16": "F16",
    "half": "F16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
    "double": "F64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
}


def float_format(dtype: Any) -> FloatFormat:
    """The :class:`FloatFormat` of a safetensors name (``"BF16"``) or a torch dtype (without
    importing torch: by its name); KeyError for a type that is not one of :data:`FORMATS`."""
    text = str(dtype)
    if text in FORMATS:
        return FORMATS[text]
    return FORMATS[_TORCH_NAMES[text.removeprefix("torch.")]]


def _fp8_table(fmt: FloatFormat) -> np.ndarray:
    """The fp32 pattern (int32) of each of the 256 patterns of an fp8 format (index: the byte)."""
    assert fmt.fp8 is not None
    ebits, mbits, bias, fnuz = fmt.fp8
    byte = np.arange(256)
    sign = np.where(byte >> 7, -1.0, 1.0)
    exp = (byte >> mbits) & ((1 << ebits) - 1)
    mant = byte & ((1 << mbits) - 1)
    value = np.where(
        exp == 0,
        mant / (1 << mbits) * 2.0 ** (1 - bias),
        (1 + mant / (1 << mbits)) * 2.0 ** (exp - bias),
    )
    value = sign * value
    if fnuz:
        nan = byte == 0x80
    else:
        top = (byte & 0x7F) >> mbits == (1 << ebits) - 1
        nan = top & (mant != 0) if fmt.inf is not None else (byte & 0x7F) == 0x7F
        if fmt.inf is not None:
            value = np.where(top & (mant == 0), sign * np.inf, value)
    out = value.astype(np.float32).view(np.int32)
    out[nan] = F32_NAN
    return out


_FP8_TABLES: dict[str, np.ndarray] = {}


def fp32_bits(bits: np.ndarray, st: str) -> np.ndarray:
    """The fp32 bit patterns (int32, a new array) of values of type ``st`` given by their bits:
    exact for bf16, fp16 and fp8; fp64 rounds to the nearest fp32 (overflow to inf)."""
    fmt = FORMATS[st]
    if fmt.fp8 is not None:
        table = _FP8_TABLES.get(st)
        if table is None:
            table = _FP8_TABLES[st] = _fp8_table(fmt)
        return table[bits.view(np.uint8)]
    if st == "BF16":
        return bits.astype(np.int32) << 16
    if st == "F16":
        return bits.view(np.float16).astype(np.float32).view(np.int32)
    if st == "F32":
        return bits.copy()
    return bits.view(np.float64).astype(np.float32).view(np.int32)


def is_nan(bits: np.ndarray, st: str) -> np.ndarray:
    """Where the values of type ``st`` given by their bits are NaN (a bool array)."""
    fmt = FORMATS[st]
    if fmt.fp8 is not None:
        return (fp32_bits(bits, st) & 0x7FFF_FFFF) > F32_INF
    assert fmt.inf is not None
    nan: np.ndarray = (bits & np.array(fmt.magnitude).astype(bits.dtype)) > fmt.inf
    return nan
