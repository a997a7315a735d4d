"""Masks laid out like their weights: plain tensors in one process or under DDP, sharded DTensors
under FSDP2 (``torch.distributed.fsdp.fully_shard``), where each rank holds a slice of every
parameter, its gradient and its AdamW moments.

A sparsifier keeps each mask in its parameter's layout, so applying it (weights, gradients,
optimizer moments to zero) touches only the local slice and needs no communication. A mask
decision needs whole tensors (an exact top-k over a tensor): :func:`gathered` all-gathers one
tensor when it is needed and :func:`laid_out_like` keeps this rank's slice of the mask made from
it. Every rank gathers the same values and decides with the same seeded generators, so every rank
makes the same mask and keeps its own part of it. For plain tensors every function here is the
identity (or a plain sum), so one process and DDP run exactly as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard, cast, overload

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = [
    "copy_slice",
    "count_kept",
    "gathered",
    "is_sharded",
    "laid_out_like",
    "zeros_like_layout",
]


def is_sharded(t: torch.Tensor | None) -> TypeGuard[DTensor]:
    """Is ``t`` a DTensor (a parameter, gradient or mask sharded by FSDP2)?"""
    if t is None or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


@overload
def gathered(t: torch.Tensor) -> torch.Tensor: ...
@overload
def gathered(t: None) -> None: ...
@overload
def gathered(t: torch.Tensor | None) -> torch.Tensor | None: ...


def gathered(t: torch.Tensor | None) -> torch.Tensor | None:
    """The whole tensor: all-gathered from every rank's slice if ``t`` is sharded (a collective:
    every rank calls it for the same tensor, in the same order), else ``t`` itself."""
    if is_sharded(t):
        return t.full_tensor()
    return t


def laid_out_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``whole`` (the same on every rank) in the layout of ``like``: this rank's slice as a
    DTensor of ``like``'s mesh and placements when ``like`` is sharded (no communication), on
    the device of ``like``'s own slice (the CPU when FSDP offloads it), else ``whole`` on
    ``like``'s device. The slice is a copy: a view would keep the whole tensor alive."""
    if not is_sharded(like):
        return whole.to(like.device)
    local = like.to_local()
    piece = whole.narrow(0, _offset(like), local.shape[0])
    return _from_local(piece.to(local.device).clone(), like)


def copy_slice(dest: torch.Tensor, whole: torch.Tensor) -> None:
    """Copy into ``dest`` (a parameter, sharded or not) its part of ``whole``: this rank's slice
    only, so a checkpoint read through a memory map is read no further than that slice."""
    if not is_sharded(dest):
        dest.copy_(whole)
        return
    local = dest.to_local()
    local.copy_(whole.narrow(0, _offset(dest), local.shape[0]))


def zeros_like_layout(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Zeros of ``like``'s whole shape in its layout (only this rank's slice is allocated)."""
    if not is_sharded(like):
        return torch.zeros(like.shape, dtype=dtype, device=like.device)
    local = like.to_local()
    return _from_local(torch.zeros(local.shape, dtype=dtype, device=local.device), like)


def _offset(like: DTensor) -> int:
    """Where this rank's slice of ``like`` starts along dimension 0: FSDP2 shards dimension 0
    over a 1-D mesh in ``torch.chunk``'s pieces (each ``ceil(n / ranks)`` rows, the last ones
    shorter or empty)."""
    from torch.distributed.tensor import Shard

    mesh = like.device_mesh
    if mesh.ndim != 1 or tuple(like.placements) != (Shard(0),):
        raise ValueError(
            f"a layout of {like.placements} over a {mesh.ndim}-D mesh is not "
            "FSDP2's Shard(0) over one dimension"
        )
    rows, ranks = like.shape[0], mesh.size()
    return min(rows, mesh.get_local_rank() * -(-rows // ranks))


def _from_local(local: torch.Tensor, like: DTensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def count_kept(mask: torch.Tensor) -> int:
    """True entries of a bool mask, over every rank's slice if it is sharded (a collective)."""
    if is_sharded(mask):
        # torch types a DTensor's operations as returning plain tensors
        return int(cast("DTensor", mask.sum()).full_tensor())
    return int(mask.sum())
