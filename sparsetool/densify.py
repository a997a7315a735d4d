"""Turn any sparse encoding back into a plain dense checkpoint: ``sparsetool densify``.

Every encoding sparsetool knows (zeros, ``_mask`` tensors, NaN sentinels, compressed-tensors
bitmask, and mixtures of them in one file) becomes plain tensors with pruned entries +0.0.
``_mask`` tensors are dropped, and a ``sparsity_config`` in a carried ``config.json`` is removed:
a loader that still saw it would expect compressed weights (transformers 5 re-initialises
bitmask-described weights at random, without an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from sparsetool.checkpoint import (
    Checkpoint,
    LogicalTensor,
    TensorSpec,
    drop_sparsity_config,
    open_checkpoint,
    write_checkpoint,
)
from sparsetool.prune import sparsetool_metadata

Progress = Callable[[str, int, int], None]


@dataclass
class DensifyResult:
    output: Path
    decoded: dict[str, int] = field(default_factory=dict)  # encoding -> tensors decoded
    negative_zeros: int = 0  # tensors in which -0.0 became +0.0
    tensors: int = 0

    def to_json(self) -> dict:
        return {"output": str(self.output), "tensors": self.tensors,
                "decoded": self.decoded, "negative_zeros_fixed": self.negative_zeros}


def _plain(ckpt: Checkpoint, lt: LogicalTensor) -> tuple[torch.Tensor, str]:
    """The dense tensor and the encoding it was found in ("plain" if none)."""
    if not lt.dtype.is_floating_point:
        return ckpt.read_stored(lt.stored[0]), "plain"
    dense, mask = ckpt.read(lt)
    encoding = lt.encoding
    if mask is not None:
        dense = dense.masked_fill(~mask, 0.0)
        if encoding == "plain":
            encoding = "nan"
    return dense, encoding


def _drop_negative_zero(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """-0.0 -> +0.0 (a pruned entry must be a plain zero), without touching any other value."""
    if not t.is_floating_point():
        return t, False
    itype = _INT_VIEW.get(t.element_size())
    if itype is not None and t.is_contiguous():
        # -0.0 is the bit pattern with only the sign bit set: the int type's minimum.
        neg_zero = t.view(itype) == torch.iinfo(itype).min
    else:
        neg_zero = (t == 0) & torch.signbit(t)
    if not bool(neg_zero.any()):
        return t, False
    return t.masked_fill(neg_zero, 0.0), True


_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def densify_checkpoint(src: str | Path, out: str | Path, *, in_place: bool = False,
                       progress: Progress | None = None) -> DensifyResult:
    """Write checkpoint ``src`` to ``out`` (same layout) with every tensor plain and dense."""
    ckpt = open_checkpoint(src)
    result = DensifyResult(output=Path(out))
    metadata = sparsetool_metadata(ckpt, {"command": "densify"})
    total, done = len(ckpt.logical), 0
    with write_checkpoint(ckpt, Path(out), in_place=in_place, metadata_extra=metadata,
                          config_transform=drop_sparsity_config) as writer:
        for shard in ckpt.shards:
            tensors = ckpt.logical_in(shard)
            specs = [TensorSpec(lt.name, lt.dtype, tuple(lt.shape)) for lt in tensors]
            with writer.shard(shard, specs) as sw:
                for lt in tensors:
                    dense, encoding = _plain(ckpt, lt)
                    dense, fixed = _drop_negative_zero(dense)
                    result.negative_zeros += fixed
                    if encoding != "plain":
                        result.decoded[encoding] = result.decoded.get(encoding, 0) + 1
                    sw.write(lt.name, dense)
                    result.tensors += 1
                    done += 1
                    if progress:
                        progress("densify", done, total)
    return result
