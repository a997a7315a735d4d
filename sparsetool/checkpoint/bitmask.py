"""The compressed-tensors "sparse-bitmask" layout, reproduced exactly.

For a weight ``<module>.weight`` of shape ``[rows, cols]`` the compressor stores four tensors and
removes the ``.weight`` key:

- ``<module>.shape``: int64 ``[ndim]``, the dense shape;
- ``<module>.compressed``: the non-zero values (``w != 0``) in row-major order, weight dtype, 1-D;
- ``<module>.bitmask``: uint8 ``[rows, ceil(cols / 8)]``: bit ``j % 8`` (least significant first)
  of byte ``j // 8`` in row ``i`` is set when ``w[i, j] != 0``; each row is padded to whole bytes;
- ``<module>.row_offsets``: int64 ``[rows]``, exclusive prefix sum of the per-row non-zero counts
  (where row ``i``'s values start in ``compressed``).

Which entries are "non-zero" is decided by ``w != 0``: ``-0.0`` is dropped (read back as ``+0.0``)
and NaN is kept. Releases before the prefix change (<= 0.8) named the parts after the full
parameter (``<module>.weight.compressed``, ...) and compressed every parameter, 1-D included; the
decoder accepts both.

>>> w = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]], dtype=np.float32).view(np.int32)
>>> values, bits, offs = compress(w, floating=True)
>>> values.view(np.float32).tolist(), bits.tolist(), offs.tolist()
([1.5, 2.0, -3.0], [[2], [5]], [0, 1])
>>> scatter(values, unpack(bits, [2, 3])).view(np.float32).tolist()
[[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]]

Everything here is numpy on the values as stored (floats as the signed integers of their bit
patterns, :mod:`sparsetool.util.floatbits`): no torch.
"""

from __future__ import annotations

import math

import numpy as np

from sparsetool.checkpoint.bits import nonzero_bits
from sparsetool.errors import CheckpointError


def packed_cols(cols: int) -> int:
    return (cols + 7) // 8


def compress(values: np.ndarray, *, floating: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(stored values, packed bitmask, row offsets) of a 2-D array of stored values (floats as
    their bits, ``floating``); see the module docstring. -0.0 is not stored, NaN is."""
    keep = nonzero_bits(values, floating=floating)
    row_counts = keep.sum(axis=-1, dtype=np.int64)
    row_offsets = np.cumsum(row_counts) - row_counts
    stored = np.compress(keep.reshape(-1), values.reshape(-1))
    return stored, np.packbits(keep, axis=-1, bitorder="little"), row_offsets


def unpack(bits: np.ndarray, shape: list[int]) -> np.ndarray:
    """Bool mask of ``shape`` from the packed bitmask (little bit order, rows padded)."""
    cols = shape[-1] if shape else 1
    rows = bits.view(np.uint8).reshape(math.prod(shape[:-1]) if shape else 1, packed_cols(cols))
    arr = np.unpackbits(rows, axis=-1, count=cols, bitorder="little")
    return arr.reshape(shape).astype(bool)


def scatter(values: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Zeros of ``keep``'s shape with ``values`` placed, in row-major order, where ``keep`` is
    set."""
    out = np.zeros(keep.size, dtype=values.dtype)
    out[np.flatnonzero(keep)] = values
    return out.reshape(keep.shape)


def check_parts(
    group: str,
    shape: list[int],
    compressed_shape: tuple[int, ...],
    bitmask_shape: tuple[int, ...],
    where: str,
) -> None:
    """Header-level consistency of one bitmask group (data-level checks happen on read)."""
    if len(compressed_shape) != 1:
        raise CheckpointError(
            f"{where}: {group}.compressed must be 1-D, got shape {list(compressed_shape)}"
        )
    if not shape:
        raise CheckpointError(f"{where}: {group}.shape is empty")
    expect = tuple(shape[:-1]) + (packed_cols(shape[-1]),)
    if tuple(bitmask_shape) != expect:
        raise CheckpointError(
            f"{where}: {group}.bitmask has shape {list(bitmask_shape)} but dense shape {shape} "
            f"needs {list(expect)}"
        )
    if compressed_shape[0] > math.prod(shape):
        raise CheckpointError(
            f"{where}: {group}.compressed holds more values than the dense shape {shape}"
        )
