"""The checkpoint data plane: read, encode and write safetensors checkpoints, streaming and atomic.

Public names::

    open_checkpoint(path) -> Checkpoint        # file or Hugging Face directory, headers validated
    Checkpoint.logical / read(lt) / read_stored(name)
    list_tensors(path) -> list[TensorInfo]     # names, shapes, dtypes from the headers (no torch)
    count_nonzero(ckpt, lt)                    # non-zero, non-pruned entries of one tensor
    encode(name, dense, mask, encoding), encoded_specs(...), stored_nonzeros(dense, mask)
    write_checkpoint(src, out, ...) -> CheckpointWriter -> ShardWriter
    write_tensors(out, tensors, *, metadata, encoding, masks)   # a new file from memory
    read_provenance(metadata) / provenance_metadata(previous, record)   # the "sparsetool" entry
    drop_sparsity_config(config), bitmask_sparsity_config(config, modules, global_sparsity)

The names are loaded on first use, so the torch-free parts (``format``, ``dtypes``, ``listing``,
``provenance``) can be imported without torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "bitmask_sparsity_config": "config", "drop_sparsity_config": "config",
    "ENCODINGS": "encodings", "MASK_SUFFIX": "encodings", "encode": "encodings",
    "encoded_specs": "encodings", "stored_nonzeros": "encodings",
    "StoredTensor": "format", "TensorSpec": "format",
    "Checkpoint": "reader", "LogicalTensor": "reader", "open_checkpoint": "reader",
    "CheckpointWriter": "writer", "ShardWriter": "writer", "write_checkpoint": "writer",
    "write_tensors": "writer",
    "TensorInfo": "listing", "list_tensors": "listing", "count_nonzero": "counting",
    "PROVENANCE_KEY": "provenance", "read_provenance": "provenance",
    "provenance_metadata": "provenance",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparsetool.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"sparsetool.checkpoint.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
