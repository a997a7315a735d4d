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

import torch

__all__ = ["count_kept", "gathered", "is_sharded", "laid_out_like", "local", "zeros_like_layout"]


def is_sharded(t: torch.Tensor | None) -> bool:
    """Is ``t`` a DTensor (a parameter, gradient or mask sharded by FSDP2)?"""
    if t is None or not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def gathered(t: torch.Tensor | None) -> torch.Tensor | None:
    """The whole tensor: all-gathered from every rank's slice if ``t`` is sharded (a collective:
    every rank calls it for the same tensor, in the same order), else ``t`` itself."""
    if is_sharded(t):
        return t.full_tensor()
    return t


def laid_out_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``whole`` (the same on every rank) in the layout of ``like``: this rank's slice as a
    DTensor of ``like``'s mesh and placements when ``like`` is sharded (no communication), else
    ``whole`` on ``like``'s device."""
    if is_sharded(like):
        from torch.distributed.tensor import distribute_tensor

        local_device = like.to_local().device
        # The slice is a view of ``whole`` and would keep all of it alive: a copy of the slice
        # alone is what this rank keeps.
        return distribute_tensor(whole.to(local_device), like.device_mesh, like.placements,
                                 src_data_rank=None).clone()
    return whole.to(like.device)


def zeros_like_layout(like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Zeros of ``like``'s whole shape in its layout (only this rank's slice is allocated)."""
    if is_sharded(like):
        from torch.distributed.tensor import zeros

        return zeros(tuple(like.shape), dtype=dtype, device_mesh=like.device_mesh,
                     placements=like.placements)
    return torch.zeros(like.shape, dtype=dtype, device=like.device)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of a sharded tensor, ``t`` itself otherwise."""
    return t.to_local() if is_sharded(t) else t


def count_kept(mask: torch.Tensor) -> int:
    """True entries of a bool mask, over every rank's slice if it is sharded (a collective)."""
    if is_sharded(mask):
        return int(mask.sum().full_tensor())
    return int(mask.sum())
