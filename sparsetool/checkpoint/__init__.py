"""The checkpoint data plane: read, encode and write safetensors checkpoints, streaming and atomic.

Public names::

    open_checkpoint(path) -> Checkpoint        # file or Hugging Face directory, headers validated
    Checkpoint.logical / read_stored(name) / read_array(name)   # stored tensors, as stored
    decode_array(ckpt, lt) -> (values, mask)   # one logical tensor, whatever its encoding (numpy)
    encode_array(name, values, st_dtype, mask, encoding), encoded_specs(...), stored_count(...)
    decode(ckpt, lt), encode(name, dense, mask, encoding), stored_nonzeros(dense, mask)  # torch
    count_unpruned(ckpt, lt)                   # non-zero, non-pruned entries of one tensor
    tensor_counts(path) -> list[TensorCount]   # every tensor's shape, dtype and non-zeros
    write_checkpoint(src, out, ...) -> CheckpointWriter -> ShardWriter
    write_tensors(out, tensors, *, metadata, encoding, masks)   # a new file from memory
    read_provenance(metadata) / provenance_metadata(previous, record)   # the "sparsetool" entry
    drop_sparsity_config(config), bitmask_sparsity_config(config, modules, global_sparsity)

Each name is imported from its module on first use (``_WHERE``, :mod:`sparsetool.util.lazy`;
``tests/test_structure.py`` resolves every one), so nothing here imports torch but what hands out
torch tensors (``read_stored``, ``decode``, ``encode``, ``zeros``): the codecs work on numpy
arrays of the stored values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparsetool.util.lazy import lazy_names

_WHERE = {
    "bitmask_sparsity_config": ".config",
    "drop_sparsity_config": ".config",
    "ENCODINGS": ".codecs",
    "Codec": ".codecs",
    "codec": ".codecs",
    "encode": ".encodings",
    "decode": ".encodings",
    "encode_array": ".encodings",
    "decode_array": ".encodings",
    "stored_count": ".encodings",
    "encoded_specs": ".encodings",
    "loader_warning": ".encodings",
    "stored_nonzeros": ".encodings",
    "StoredTensor": ".format",
    "TensorSpec": ".format",
    "Checkpoint": ".reader",
    "LogicalTensor": ".reader",
    "open_checkpoint": ".reader",
    "MASK_SUFFIX": ".reader",
    "CheckpointWriter": ".writer",
    "ShardWriter": ".writer",
    "write_checkpoint": ".writer",
    "write_tensors": ".writer",
    "TensorCount": ".counting",
    "tensor_counts": ".counting",
    "count_unpruned": ".counting",
    "PROVENANCE_KEY": ".provenance",
    "read_provenance": ".provenance",
    "provenance_metadata": ".provenance",
}

__all__ = sorted(_WHERE)

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from .codecs import ENCODINGS as ENCODINGS
    from .codecs import Codec as Codec
    from .codecs import codec as codec
    from .config import bitmask_sparsity_config as bitmask_sparsity_config
    from .config import drop_sparsity_config as drop_sparsity_config
    from .counting import TensorCount as TensorCount
    from .counting import count_unpruned as count_unpruned
    from .counting import tensor_counts as tensor_counts
    from .encodings import decode as decode
    from .encodings import decode_array as decode_array
    from .encodings import encode as encode
    from .encodings import encode_array as encode_array
    from .encodings import encoded_specs as encoded_specs
    from .encodings import loader_warning as loader_warning
    from .encodings import stored_count as stored_count
    from .encodings import stored_nonzeros as stored_nonzeros
    from .format import StoredTensor as StoredTensor
    from .format import TensorSpec as TensorSpec
    from .provenance import PROVENANCE_KEY as PROVENANCE_KEY
    from .provenance import provenance_metadata as provenance_metadata
    from .provenance import read_provenance as read_provenance
    from .reader import MASK_SUFFIX as MASK_SUFFIX
    from .reader import Checkpoint as Checkpoint
    from .reader import LogicalTensor as LogicalTensor
    from .reader import open_checkpoint as open_checkpoint
    from .writer import CheckpointWriter as CheckpointWriter
    from .writer import ShardWriter as ShardWriter
    from .writer import write_checkpoint as write_checkpoint
    from .writer import write_tensors as write_tensors

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
