"""Measured non-zeros of stored tensors: the one count ``report``, ``flops`` and ``simulate`` use.

A pruned entry is zero whatever the encoding says (a ``_mask`` False, a NaN sentinel, a cleared
bitmask bit), and -0.0 is zero too; NaN at a kept position counts as non-zero.

Every tensor is counted on its bits in numpy (:mod:`sparsetool.checkpoint.bits`) without importing
torch: plain ones as they are stored, the other encodings (and fp8) decoded first
(:func:`sparsetool.checkpoint.encodings.decode_array`); complex ones as pairs of fp32 bits.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sparsetool.checkpoint import bits
from sparsetool.checkpoint.dtypes import torch_name
from sparsetool.checkpoint.reader import Checkpoint, LogicalTensor, open_checkpoint


def count_unpruned(ckpt: Checkpoint, lt: LogicalTensor) -> int:
    """Non-zero, non-pruned entries of one logical tensor (NaN sentinels and masked count as 0)."""
    if lt.encoding == "plain" and lt.st_dtype in bits.FLOAT_KEYS:
        return bits.count_nonzero_bits(ckpt.read_array(lt.stored[0]), lt.st_dtype, nan_is_zero=True)
    if lt.encoding == "plain" and not lt.floating and lt.st_dtype not in ("C64",):
        return bits.count_nonzero_ints(ckpt.read_array(lt.stored[0]))
    if lt.st_dtype == "C64":  # complex: zero when both fp32 parts are +-0.0 (NaN is not zero)
        parts = ckpt.read_array(lt.stored[0]).view(np.int32).reshape(-1, 2) & 0x7FFF_FFFF
        return int(np.count_nonzero((parts != 0).any(axis=1)))
    from sparsetool.checkpoint.encodings import decode_array

    values, mask = decode_array(ckpt, lt)
    alive = bits.nonzero_bits(values, floating=lt.floating)
    if mask is not None:
        alive &= mask
    return int(np.count_nonzero(alive))


def count_unpruned_parts(ckpt: Checkpoint, lt: LogicalTensor, parts: int) -> list[int]:
    """:func:`count_unpruned` of each of ``parts`` equal slices of ``lt`` along its first
    dimension (the experts of a fused experts tensor), in order; they sum to the whole count."""
    if parts <= 1:
        return [count_unpruned(ckpt, lt)]
    size = lt.numel // parts
    if lt.encoding == "plain" and lt.st_dtype in bits.FLOAT_KEYS:
        flat = ckpt.read_array(lt.stored[0]).reshape(-1)
        return [
            bits.count_nonzero_bits(flat[e * size : (e + 1) * size], lt.st_dtype, nan_is_zero=True)
            for e in range(parts)
        ]
    from sparsetool.checkpoint.encodings import decode_array

    values, mask = decode_array(ckpt, lt)
    alive = bits.nonzero_bits(values, floating=lt.floating)
    if mask is not None:
        alive &= mask
    return [int(n) for n in np.count_nonzero(alive.reshape(parts, -1), axis=1)]


@dataclass(frozen=True)
class TensorCount:
    """One logical tensor as the header describes it, with its measured non-zeros."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch name, e.g. "bfloat16"
    encoding: str
    numel: int
    nonzero: int
    bytes: int


def tensor_counts(
    path: str | os.PathLike,
    *,
    progress: Callable[[str, int, int], None] | None = None,
    label: str = "count",
) -> list[TensorCount]:
    """Every logical tensor of the checkpoint at ``path``, read once each, in file order;
    ``progress(label, done, total)`` after each."""
    out: list[TensorCount] = []
    with open_checkpoint(path) as ckpt:
        total = len(ckpt.logical)
        for lt in ckpt.logical:
            out.append(
                TensorCount(
                    lt.name,
                    tuple(lt.shape),
                    torch_name(lt.st_dtype),
                    lt.encoding,
                    lt.numel,
                    count_unpruned(ckpt, lt),
                    lt.nbytes,
                )
            )
            if progress:
                progress(label, len(out), total)
    return out
