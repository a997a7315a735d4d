"""A model sharded over the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``): every
parameter, its gradient and its AdamW moments are split along their first dimension, one slice per
rank, and a transformer block's whole parameters exist only while it runs (gathered before its
forward and backward, freed after).

:func:`shard_model` shards each block of the model's stack (the built-in GPT's ``blocks``, a
Hugging Face model's ``layers``) as one unit and the rest (embeddings, final norm, head) as the
root unit. Options: ``bf16`` computes with bfloat16 copies of the parameters and reduces the
gradients in float32 into float32 slices (the weights and AdamW stay float32); ``offload`` keeps
the parameter slices, gradients and optimizer state in CPU memory between uses (a GPU run only).
"""

from __future__ import annotations

import torch

from sparsetool.errors import ConfigError

__all__ = ["block_stack", "shard_model"]


def block_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The model's stack of transformer blocks: the shallowest ``ModuleList`` (the longest of
    those at that depth), and its name. A mixture of experts' expert lists lie deeper."""
    found = [(name.count("."), -len(m), name, m) for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) and name]
    if not found:
        raise ConfigError(f"{type(model).__name__} has no stack of blocks (a ModuleList) to shard "
                          "with --distributed fsdp; use --distributed ddp")
    _, _, name, stack = min(found, key=lambda f: f[:3])
    return name, stack


def shard_model(model: torch.nn.Module, device: torch.device, *, bf16: bool = False,
                offload: bool = False) -> list[str]:
    """Shard ``model`` in place over all ranks: its parameters become DTensors whose slices
    FSDP moves to ``device`` (or keeps in CPU memory with ``offload``); the names of the units,
    blocks first, the root last."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mixed = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
             if bf16 else MixedPrecisionPolicy())
    policy = {"mp_policy": mixed,
              "mesh": init_device_mesh(device.type, (dist.get_world_size(),))}
    if offload:
        policy["offload_policy"] = CPUOffloadPolicy()
    name, stack = block_stack(model)
    units = []
    for i, block in enumerate(stack):
        fully_shard(block, **policy)
        units.append(f"{name}.{i}")
    fully_shard(model, **policy)
    return units + ["(root)"]
