"""Where a run executes: one process or a torchrun group (DDP over gloo on CPU, nccl on GPU),
which device, and whether to autocast to bf16."""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from typing import Callable

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


def setup_runtime(device: str, dtype: str) -> Runtime:
    """Read torchrun's environment (WORLD_SIZE, RANK, LOCAL_RANK), pick the device and join the
    process group. bf16 autocast: asked for, or ``auto`` on a GPU that supports it (on CPU
    float32 is the default: bf16 matmuls are slow on most CPUs and change the numerics)."""
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
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    use_bf16 = dtype == "bfloat16" or (
        dtype == "auto" and dev.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    autocast = ((lambda: torch.autocast(dev.type, dtype=torch.bfloat16))
                if use_bf16 else contextlib.nullcontext)
    return Runtime(world, rank, dev, autocast, "bf16 autocast" if use_bf16 else "float32")


def mask_digest(masks: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the names and bits of ``masks``.

    >>> m = {"w": torch.tensor([True, False])}
    >>> mask_digest(m) == mask_digest({"w": torch.tensor([True, False])}) != mask_digest({"w": torch.tensor([False, True])})
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
    out: list = [None] * world
    dist.all_gather_object(out, mask_digest(masks))
    return out


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` under DistributedDataParallel, never syncing buffers between steps."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    # Masks live in the sparsifier, not in module buffers; and the built-in model has no buffers.
    # broadcast_buffers=False guarantees DDP never overwrites anything between steps.
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(DDP).parameters
                      else {"broadcast_buffers": False})
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None, **no_buffer_sync)
