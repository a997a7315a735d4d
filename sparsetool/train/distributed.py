"""Where a run executes: one process or a torchrun group (DDP or FSDP2 over gloo on CPU, nccl on
GPU), which device, and how bf16 is used (autocast, or FSDP's bf16 parameters)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sparsetool.errors import ConfigError


@dataclass
class Runtime:
    world: int
    rank: int
    device: torch.device
    autocast: Callable[[], contextlib.AbstractContextManager]
    precision: str
    sharded: bool = False  # FSDP2: parameters, gradients, AdamW and masks split over the ranks
    bf16_params: bool = False  # FSDP2 computes with bf16 parameters, reduces in float32


def setup_runtime(device: str, dtype: str, strategy: str = "ddp", offload: bool = False) -> Runtime:
    """Read torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK), pick the device and join the
    process group. bf16 autocast: asked for, or ``auto`` on a GPU that supports it (on CPU
    float32 is the default: bf16 matmuls are slow on most CPUs and change the numerics). With
    ``strategy`` fsdp the group exists even for one process (FSDP2 needs one; without torchrun it
    is a group of one in memory) and bf16 means FSDP's bf16 parameters instead of autocast; with
    ``offload`` the slices FSDP keeps in CPU memory are gathered over gloo beside nccl."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    want = device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu")
        dev = torch.device("cuda", local) if world > 1 else torch.device(want)
        if world > 1:
            torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    sharded = strategy == "fsdp"
    backend = "nccl" if dev.type == "cuda" else "gloo"
    if dev.type == "cuda" and sharded and offload:
        backend = "cpu:gloo,cuda:nccl"
    if (world > 1 or sharded) and not dist.is_initialized():
        if "RANK" in os.environ or world > 1:  # under torchrun
            dist.init_process_group(backend)
        else:  # one process without torchrun: a group of one, its store in memory
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    use_bf16 = dtype == "bfloat16" or (
        dtype == "auto" and dev.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if sharded:
        precision = "bf16 parameters, float32 reduction" if use_bf16 else "float32"
        return Runtime(
            world,
            rank,
            dev,
            contextlib.nullcontext,
            f"{precision}, FSDP",
            sharded=True,
            bf16_params=use_bf16,
        )
    autocast = (
        (lambda: torch.autocast(dev.type, dtype=torch.bfloat16))
        if use_bf16
        else contextlib.nullcontext
    )
    return Runtime(world, rank, dev, autocast, "bf16 autocast" if use_bf16 else "float32")


def mask_digest(masks: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names and bits of ``masks``.

    >>> m = {"w": torch.tensor([True, False])}
    >>> mask_digest(m) == mask_digest({"w": torch.tensor([True, False])}) != mask_digest(
    ...     {"w": torch.tensor([False, True])}
    ... )
    True
    """
    h = hashlib.sha256()
    for name in sorted(masks):
        h.update(name.encode())
        h.update(masks[name].to("cpu", torch.uint8).numpy().tobytes())
    return h.hexdigest()


def gather_mask_digests(masks: dict[str, torch.Tensor], world: int) -> list[str]:
    """Every rank's :func:`mask_digest`: equal strings mean the data-parallel mask decisions
    agreed bit for bit."""
    return gather_digests(mask_digest(masks), world)


def gather_digests(digest: str, world: int) -> list[str]:
    """Every rank's ``digest`` (a collective)."""
    out: list = [None] * world
    dist.all_gather_object(out, digest)
    return out


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` under DistributedDataParallel, never syncing buffers between steps."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    # Masks live in the sparsifier, not in module buffers; and the built-in model has no buffers.
    # broadcast_buffers=False guarantees DDP never overwrites anything between steps.
    no_buffer_sync: dict[str, Any] = (
        {"forward_sync_buffers": False}
        if "forward_sync_buffers" in inspect.signature(DDP).parameters
        else {"broadcast_buffers": False}
    )
    return DDP(
        model, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync
    )
