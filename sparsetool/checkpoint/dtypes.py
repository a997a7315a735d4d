"""The one dtype table: safetensors name <-> torch dtype <-> item size <-> integer view.

Imports neither torch nor numpy, so header-only readers (``sparsetool flops``) and the targeting
rules can use it; the torch dtype is looked up only when asked for.

Rows are in the order of the reference implementation's ``Dtype`` enum, which is also the sort
key for the data section of a written file (descending: 8-byte types first, so every tensor stays
aligned). F4/F6 are sub-byte types torch cannot address: they rank (so ordering is right) but have
no torch dtype, so reading them is refused.

"Floating" means a float type with a zero that pruning can write: ``F8_E8M0`` (an exponent-only
scale format, no zero) is not floating here.

>>> st_name("torch.bfloat16"), itemsize("BF16"), is_floating("F8_E4M3"), is_floating("I64")
('BF16', 2, True, False)
>>> INT_VIEW[itemsize("F16")]
'int16'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DType:
    st: str  # safetensors name, e.g. "BF16"
    torch_name: str  # attribute of the torch module, "" if torch has none
    bits: int
    floating: bool

    @property
    def itemsize(self) -> int:
        return self.bits // 8


_TABLE = (
    DType("BOOL", "bool", 8, False),
    DType("F4", "", 4, False),
    DType("F6_E2M3", "", 6, False),
    DType("F6_E3M2", "", 6, False),
    DType("U8", "uint8", 8, False),
    DType("I8", "int8", 8, False),
    DType("F8_E5M2", "float8_e5m2", 8, True),
    DType("F8_E4M3", "float8_e4m3fn", 8, True),
    DType("F8_E8M0", "float8_e8m0fnu", 8, False),
    DType("F8_E4M3FNUZ", "float8_e4m3fnuz", 8, True),
    DType("F8_E5M2FNUZ", "float8_e5m2fnuz", 8, True),
    DType("I16", "int16", 16, False),
    DType("U16", "uint16", 16, False),
    DType("F16", "float16", 16, True),
    DType("BF16", "bfloat16", 16, True),
    DType("I32", "int32", 32, False),
    DType("U32", "uint32", 32, False),
    DType("F32", "float32", 32, True),
    DType("C64", "complex64", 64, False),
    DType("F64", "float64", 64, True),
    DType("I64", "int64", 64, False),
    DType("U64", "uint64", 64, False),
)
RANK = {d.st: i for i, d in enumerate(_TABLE)}
"""Sort rank of each safetensors name (the reference serializer orders by it, descending)."""
BY_ST = {d.st: d for d in _TABLE}

# Other spellings people (and torch) use for the same types.
_ALIASES = {"F8_E4M3FN": "F8_E4M3", "DOUBLE": "F64", "FLOAT": "F32", "HALF": "F16"}
_BY_KEY = {
    **{d.st: d for d in _TABLE},
    **{d.torch_name.upper(): d for d in _TABLE if d.torch_name},
    **{alias: BY_ST[st] for alias, st in _ALIASES.items()},
}

INT_VIEW = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}
"""Signed integer type of each item size: the bit patterns of a float, where -0.0 (only the sign
bit set) is the type's minimum."""


def lookup(dtype: Any) -> DType | None:
    """The table row of a safetensors name, torch name (``"bfloat16"``, ``"torch.bfloat16"``) or
    ``torch.dtype``; None if unknown."""
    text = str(dtype).upper()
    if text.startswith("TORCH."):
        text = text[len("TORCH.") :]
    return _BY_KEY.get(text)


def is_floating(dtype: Any) -> bool:
    """True for float types that hold a zero, given in any spelling :func:`lookup` takes."""
    row = lookup(dtype)
    return row is not None and row.floating


def st_name(dtype: Any) -> str:
    """safetensors name of a dtype (``torch.bfloat16 -> "BF16"``); KeyError if it has none."""
    row = lookup(dtype)
    if row is None:
        raise KeyError(str(dtype))
    return row.st


def itemsize(dtype: Any) -> int:
    """Bytes per element (KeyError for unknown types)."""
    row = lookup(dtype)
    if row is None:
        raise KeyError(str(dtype))
    return row.itemsize


def torch_name(dtype: Any) -> str:
    """``torch.bfloat16`` or ``"BF16"`` -> ``"bfloat16"`` (the name ``report`` prints)."""
    row = lookup(dtype)
    if row is not None and row.torch_name:
        return row.torch_name
    return str(dtype).removeprefix("torch.")


def to_torch(st: str) -> Any:
    """The torch dtype of a safetensors name, or None if this torch has none (imports torch)."""
    import torch

    row = BY_ST.get(st)
    if row is None or not row.torch_name:
        return None
    return getattr(torch, row.torch_name, None)


def int_view(size: int) -> Any:
    """The torch signed integer dtype of ``size`` bytes (imports torch)."""
    import torch

    return getattr(torch, INT_VIEW[size])
