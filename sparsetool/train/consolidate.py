"""One safetensors file from a model whose parameters may be sharded over ranks (FSDP2), streamed:
each tensor is gathered whole (:func:`~sparsetool.train.sharding.gathered`), written at
its place by the writing rank and dropped before the next, so no rank ever holds the whole model.

Every rank calls :func:`write_model` with the same tensors in the same order (each gather is a
collective); only the rank with ``write=True`` opens the file. The header is fixed before any
data (:class:`~sparsetool.checkpoint.writer.ShardWriter`): shapes and types are known from the
parameters, and the ``bitmask`` encoding's stored counts from a first pass over the tensors. The
file goes to a temporary path beside the output and is renamed into place only when complete.
For plain tensors (one process) the same code writes what
:func:`~sparsetool.checkpoint.writer.write_tensors` would.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from sparsetool.checkpoint.codecs import codec
from sparsetool.checkpoint.encodings import encode, encoded_specs, stored_nonzeros
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.output_files import remove, temp_beside, write_error
from sparsetool.checkpoint.writer import ShardWriter
from sparsetool.train.sharding import gathered

__all__ = ["write_model"]


def write_model(
    out: Path,
    tensors: Sequence[tuple[str, torch.Tensor]],
    masks: Mapping[str, torch.Tensor],
    *,
    encoding: str,
    metadata: Mapping[str, str],
    dtype: torch.dtype | None = None,
    write: bool = True,
) -> None:
    """Write ``tensors`` (name, tensor; sharded or not) to ``out``, those with an entry in
    ``masks`` (True = kept, laid out like their tensor) in ``encoding``; floating tensors cast
    to ``dtype`` if given. A collective: every rank calls it alike, ``write`` on one of them."""

    def whole(name: str, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        value = gathered(t.detach())  # every rank takes part; only the writer keeps a copy
        mask = masks.get(name)
        mask = None if mask is None else gathered(mask)
        if not write:
            return value, mask
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.cpu(), None if mask is None else mask.cpu()

    nnz: dict[str, int] = {}
    if codec(encoding).compressed:  # the stored count of each masked tensor, before the header
        for name, t in tensors:
            if name in masks:
                value, mask = whole(name, t)  # a collective: every rank, writer or not
                if write:
                    nnz[name] = stored_nonzeros(value, mask)
    specs: list[TensorSpec] = []
    for name, t in tensors:
        st_dtype = dtype if dtype is not None and t.is_floating_point() else t.dtype
        if name in masks:
            specs += encoded_specs(name, st_dtype, tuple(t.shape), nnz.get(name, 0), encoding)
        else:
            specs.append(TensorSpec(name, st_dtype, tuple(t.shape)))
    tmp = temp_beside(out) if write else None
    try:
        with (
            ShardWriter(tmp, out.name, specs, dict(metadata))
            if tmp is not None
            else contextlib.nullcontext()
        ) as writer:
            for name, t in tensors:
                value, mask = whole(name, t)  # every rank takes part in the gather
                if writer is not None:
                    stored = (
                        [(name, value)] if mask is None else encode(name, value, mask, encoding)
                    )
                    for stored_name, stored_value in stored:
                        writer.write(stored_name, stored_value)
                    del stored
                del value, mask  # one whole tensor at a time
        if tmp is not None:
            os.replace(tmp, out)
    except BaseException as e:
        if tmp is not None:
            remove(tmp)
        if isinstance(e, OSError):
            raise write_error(e, out) from None
        raise
