"""Turn any sparse encoding back into a plain dense checkpoint: ``sparsetool densify``.

Plain tensors without NaN or -0.0 (all of them, in a checkpoint of the zeros encoding) are
screened on their bits in numpy and copied byte for byte; the others are decoded in numpy
(:func:`~sparsetool.checkpoint.encodings.decode_array`): densify never imports torch. Every encoding
sparsetool knows (zeros, ``_mask`` tensors, NaN sentinels, compressed-tensors bitmask, and mixtures
of them in one file) becomes plain tensors with pruned entries +0.0. ``_mask`` tensors are dropped,
and a ``sparsity_config`` in a carried ``config.json`` is removed: a loader that still saw it would
expect compressed weights (transformers 5 re-initialises bitmask-described weights at random,
without an error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sparsetool.checkpoint import (
    Checkpoint,
    LogicalTensor,
    TensorSpec,
    bits,
    drop_sparsity_config,
    open_checkpoint,
    write_checkpoint,
)
from sparsetool.checkpoint.codecs import NAN
from sparsetool.checkpoint.encodings import decode_array
from sparsetool.checkpoint.output_files import Reclaimed, reclaiming
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.util import workers
from sparsetool.util.progress import Progress


@dataclass
class DensifyResult:
    output: Path
    decoded: dict[str, int] = field(default_factory=dict)  # encoding -> tensors decoded
    negative_zeros: int = 0  # tensors in which -0.0 became +0.0
    tensors: int = 0
    left_out: list[str] = field(default_factory=list)  # input entries not part of a model directory
    reclaimed: list[Reclaimed] = field(default_factory=list)  # stale temporaries removed

    def to_json(self) -> dict:
        return {
            "output": str(self.output),
            "tensors": self.tensors,
            "decoded": self.decoded,
            "negative_zeros_fixed": self.negative_zeros,
            "left_out": list(self.left_out),
        }


def densify_checkpoint(
    src: str | Path, out: str | Path, *, in_place: bool = False, progress: Progress | None = None
) -> DensifyResult:
    """Write checkpoint ``src`` to ``out`` (same layout) with every tensor plain and dense. The
    temporaries of killed runs removed beside ``out`` are the result's ``reclaimed`` (an
    error's, if it fails)."""
    ckpt = open_checkpoint(src)
    result = DensifyResult(output=Path(out))
    metadata = provenance_metadata(ckpt.metadata(), {"command": "densify"})
    total, done = len(ckpt.logical), 0
    with (
        reclaiming() as result.reclaimed,
        write_checkpoint(
            ckpt,
            Path(out),
            in_place=in_place,
            metadata_extra=metadata,
            config_transform=drop_sparsity_config,
        ) as writer,
    ):
        result.left_out = list(writer.left_out)
        for shard in ckpt.shards:
            tensors = ckpt.logical_in(shard)
            specs = [TensorSpec(lt.name, lt.st_dtype, tuple(lt.shape)) for lt in tensors]
            # the next tensor is screened on another core while this one is copied
            unchanged = workers.imap(lambda lt: _unchanged(ckpt, lt), tensors)
            with writer.shard(shard, specs) as sw:
                for lt, same in zip(tensors, unchanged):
                    if same:
                        # unchanged bytes: copied in the kernel, never decoded (nor torch loaded)
                        sw.copy_stored(lt.name, ckpt, lt.stored[0])
                    else:
                        # decode_array gives pruned entries as +0.0 whatever the encoding
                        values, mask = decode_array(ckpt, lt)
                        encoding = (
                            lt.encoding if lt.encoding != "plain" or mask is None else NAN.name
                        )
                        if encoding != "plain":
                            result.decoded[encoding] = result.decoded.get(encoding, 0) + 1
                        negative = None
                        if lt.floating:  # -0.0: only the sign bit set, the integer view's minimum
                            negative = values == np.iinfo(values.dtype).min
                            if not negative.any():
                                negative = None
                        if negative is not None:
                            values = np.where(negative, np.zeros((), dtype=values.dtype), values)
                            result.negative_zeros += 1
                        if encoding == "plain" and negative is None:
                            # unchanged bytes: copy them in the kernel, not through memory
                            sw.copy_stored(lt.name, ckpt, lt.stored[0])
                        else:
                            sw.write_array(lt.name, values)
                    result.tensors += 1
                    done += 1
                    if progress:
                        progress("densify", done, total)
    return result


def _unchanged(ckpt: Checkpoint, lt: LogicalTensor) -> bool:
    """Is the tensor already what densify writes? A plain tensor that is not a float, or a float
    holding neither NaN (a sentinel to decode) nor -0.0 (to make +0.0), told from its bits
    without torch; False when that cannot be told so (fp8) or it has an encoding."""
    if lt.encoding != "plain":
        return False
    if not lt.floating:
        return True
    if lt.st_dtype not in bits.FLOAT_KEYS:
        return False
    return not bits.holds_nan_or_negative_zero(ckpt.read_array(lt.stored[0]), lt.st_dtype)
