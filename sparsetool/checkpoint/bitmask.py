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

>>> w = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
>>> values, bits, offs = compress(w)
>>> values.tolist(), bits.tolist(), offs.tolist()
([1.5, 2.0, -3.0], [[2], [5]], [0, 1])
>>> decompress(values, bits, [2, 3]).tolist()
[[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]]
"""

from __future__ import annotations

import math

import numpy as np
import torch

from sparsetool.checkpoint import zeros
from sparsetool.errors import CheckpointError


def packed_cols(cols: int) -> int:
    return (cols + 7) // 8


def _np_bits(dense: torch.Tensor) -> np.ndarray:
    return zeros.int_bits(dense.contiguous()).numpy()


def nonzero_mask(dense: torch.Tensor) -> torch.Tensor:
    """The entries the bitmask stores: ``dense != 0`` (so -0.0 is not stored, NaN is)."""
    return zeros.nonzero_mask(dense)


def compress(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(values, packed bitmask, row offsets) of a dense tensor; see the module docstring."""
    keep = nonzero_mask(dense)
    keep_np = keep.numpy()
    row_counts = torch.from_numpy(keep_np.sum(axis=-1, dtype=np.int64))
    row_offsets = torch.cumsum(row_counts, 0) - row_counts
    if dense.dtype.is_floating_point:
        values = torch.from_numpy(np.compress(keep_np.reshape(-1), _np_bits(dense).reshape(-1))).view(dense.dtype)
    else:
        values = dense[keep]
    bits = torch.from_numpy(np.packbits(keep_np, axis=-1, bitorder="little"))
    return values, bits, row_offsets


def unpack(bits: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Bool mask of ``shape`` from the packed bitmask (little bit order, rows padded)."""
    cols = shape[-1] if shape else 1
    arr = np.unpackbits(bits.numpy(), axis=-1, count=cols, bitorder="little")
    return torch.from_numpy(arr.reshape(shape).astype(bool))


def decompress(values: torch.Tensor, bits: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Dense tensor with zeros (+0.0) where the bitmask is clear."""
    return scatter(values, unpack(bits, shape))


def scatter(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zeros of ``keep``'s shape with ``values`` placed, in row-major order, where ``keep`` is set."""
    if zeros.has_bits(values):
        # on the raw bits in numpy: several times faster than torch's boolean index assignment
        src = _np_bits(values)
        out = np.zeros(keep.numel(), dtype=src.dtype)
        out[np.flatnonzero(keep.numpy())] = src
        return torch.from_numpy(out.reshape(tuple(keep.shape))).view(values.dtype)
    out = torch.zeros(keep.shape, dtype=values.dtype)
    out[keep] = values
    return out


def check_parts(group: str, shape: list[int], compressed_shape: tuple[int, ...], bitmask_shape: tuple[int, ...],
                where: str) -> None:
    """Header-level consistency of one bitmask group (data-level checks happen on read)."""
    if len(compressed_shape) != 1:
        raise CheckpointError(f"{where}: {group}.compressed must be 1-D, got shape {list(compressed_shape)}")
    if not shape:
        raise CheckpointError(f"{where}: {group}.shape is empty")
    expect = tuple(shape[:-1]) + (packed_cols(shape[-1]),)
    if tuple(bitmask_shape) != expect:
        raise CheckpointError(
            f"{where}: {group}.bitmask has shape {list(bitmask_shape)} but dense shape {shape} needs {list(expect)}"
        )
    if compressed_shape[0] > math.prod(shape):
        raise CheckpointError(f"{where}: {group}.compressed holds more values than the dense shape {shape}")
