"""A model sharded over the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``): every
parameter, its gradient and its AdamW moments are split along their first dimension, one slice per
rank, and a transformer block's whole parameters exist only while it runs (gathered before its
forward and backward, freed after).

:func:`shard_model` shards each block of the model's stack (the built-in GPT's ``blocks``, a
Hugging Face model's ``layers``) as one unit and the rest (embeddings, final norm, head) as the
root unit. Options: ``bf16`` computes with bfloat16 copies of the parameters and reduces the
gradients in float32 into float32 slices (the weights and AdamW stay float32); ``offload`` keeps
the parameter slices, gradients and optimizer state in CPU memory between uses (a GPU run only).

A run whose weights come from a checkpoint (``--init``, a resume) never holds the whole model:
the model is built under :func:`parameters_on_meta` (parameters without memory, buffers as
usual), sharded, given memory for its slices only (``materialize``) and filled by
:func:`load_slices`, each rank reading its slice of each tensor.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from sparsetool.errors import ConfigError
from sparsetool.train.sharding import copy_slice

__all__ = ["block_stack", "load_slices", "parameters_on_meta", "shard_model"]


def block_stack(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """The model's stack of transformer blocks: the shallowest ``ModuleList`` (the longest of
    those at that depth), and its name. A mixture of experts' expert lists lie deeper."""
    found = [
        (name.count("."), -len(m), name, m)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) and name
    ]
    if not found:
        raise ConfigError(
            f"{type(model).__name__} has no stack of blocks (a ModuleList) to shard "
            "with --distributed fsdp; use --distributed ddp"
        )
    _, _, name, stack = min(found, key=lambda f: f[:3])
    return name, stack


def shard_model(
    model: torch.nn.Module, device: torch.device, *, bf16: bool = False, offload: bool = False
) -> list[str]:
    """Shard ``model`` in place over all ranks: its parameters become DTensors whose slices
    FSDP moves to ``device`` (or keeps in CPU memory with ``offload``); the names of the units,
    blocks first, the root last."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    mixed = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    policy: dict[str, Any] = {
        "mp_policy": mixed,
        "mesh": init_device_mesh(device.type, (dist.get_world_size(),)),
    }
    if offload:
        policy["offload_policy"] = CPUOffloadPolicy()
    name, stack = block_stack(model)
    units = []
    for i, block in enumerate(stack):
        fully_shard(block, **policy)
        units.append(f"{name}.{i}")
    fully_shard(model, **policy)
    return units + ["(root)"]


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Build a model inside: each parameter is moved to the meta device as it is registered (one
    parameter exists in memory at a time), buffers (a rotary embedding's frequencies) are made
    as usual. A parameter registered again (a tied head) stays the same parameter."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        if param is not None and param.device.type != "meta":
            param = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    module_class: Any = torch.nn.Module  # its method is replaced while the block runs
    module_class.register_parameter = on_meta
    try:
        yield
    finally:
        module_class.register_parameter = register


def load_slices(
    model: torch.nn.Module,
    device: torch.device,
    weights: Mapping[str, torch.Tensor],
    *,
    offload: bool = False,
) -> None:
    """Give a model built under :func:`parameters_on_meta` and sharded memory for this rank's
    slices (on ``device``, or the CPU with ``offload``) and copy into them their part of
    ``weights`` (model names -> whole tensors; every parameter must be there, a tied one once).
    Without ``weights`` (a resume) the slices are left for the checkpoint's loader to fill."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device="cpu" if offload else device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
        if not weights:
            return
        filled: set[int] = set()
        for name, p in model.named_parameters(remove_duplicate=False):
            if name in weights:
                copy_slice(p, weights[name])  # converted slice by slice, not whole
                filled.add(id(p))
        empty = [n for n, p in model.named_parameters() if id(p) not in filled]
        if empty:
            raise ConfigError(
                f"the weights read leave {empty[:3]} of the model unset; "
                "check the checkpoint against the model"
            )
