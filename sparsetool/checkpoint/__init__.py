"""The checkpoint data plane: read, encode and write safetensors checkpoints, streaming and atomic.

Public names::

    open_checkpoint(path) -> Checkpoint        # file or Hugging Face directory, headers validated
    Checkpoint.logical / read(lt) / read_stored(name)
    encode(name, dense, mask, encoding), encoded_specs(...), stored_nonzeros(dense, mask)
    write_checkpoint(src, out, ...) -> CheckpointWriter -> ShardWriter
    drop_sparsity_config(config), bitmask_sparsity_config(config, modules, global_sparsity)
"""

from sparsetool.checkpoint.config import bitmask_sparsity_config, drop_sparsity_config
from sparsetool.checkpoint.encodings import ENCODINGS, MASK_SUFFIX, encode, encoded_specs, stored_nonzeros
from sparsetool.checkpoint.format import StoredTensor, TensorSpec
from sparsetool.checkpoint.reader import Checkpoint, LogicalTensor, open_checkpoint
from sparsetool.checkpoint.writer import CheckpointWriter, ShardWriter, write_checkpoint

__all__ = [
    "ENCODINGS",
    "MASK_SUFFIX",
    "Checkpoint",
    "CheckpointWriter",
    "LogicalTensor",
    "ShardWriter",
    "StoredTensor",
    "TensorSpec",
    "bitmask_sparsity_config",
    "drop_sparsity_config",
    "encode",
    "encoded_specs",
    "open_checkpoint",
    "stored_nonzeros",
    "write_checkpoint",
]
