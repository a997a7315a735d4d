"""Deterministic selection for mask updates: the top-k of a score with exact tie-breaking, and
per-(seed, step, tensor) random generators.

Both exist so that every data-parallel rank, and a resumed run, makes the same choice: the top-k
is a stable sort (ties keep the lower flat index, the job the Cerebras library gives its
``ScoreTieBreaker``), and random scores come from a generator seeded from (seed, step, tensor
index), never from the global RNG.
"""

from __future__ import annotations

import torch

__all__ = ["step_generator", "top_k_mask"]

_MASK64 = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit seed from integers (SplitMix64 finaliser): nearby (seed, step) pairs give unrelated
    streams, and the result does not depend on Python's hash randomisation or the torch version."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK64)) & _MASK64
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 29
    return h & ((1 << 63) - 1)


def step_generator(seed: int, step: int, index: int) -> torch.Generator:
    """A CPU generator for tensor number ``index`` at ``step``: the same on every rank and after a
    resume, whatever the global RNG did in between.

    >>> a = torch.rand(3, generator=step_generator(0, 100, 2))
    >>> b = torch.rand(3, generator=step_generator(0, 100, 2))
    >>> bool(torch.equal(a, b)), bool(torch.equal(a, torch.rand(3, generator=step_generator(0, 101, 2))))
    (True, False)
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_mix(seed, step, index))
    return gen


def top_k_mask(scores: torch.Tensor, k: int, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask of the ``k`` highest ``scores`` among the ``allowed`` positions.

    Ties keep the lower flat index, so the result is exact and deterministic; NaN scores rank below
    every number. ``k`` must not exceed the number of allowed positions.

    >>> top_k_mask(torch.tensor([0.5, 0.9, 0.5, 0.5]), 2)
    tensor([ True,  True, False, False])
    >>> top_k_mask(torch.tensor([0.5, 0.9, 0.5, 0.5]), 2, allowed=torch.tensor([True, False, False, True]))
    tensor([ True, False, False,  True])
    """
    flat = scores.detach().reshape(-1).float()
    numel = flat.numel()
    if allowed is not None:
        # Work on the allowed entries only (a drop looks at the kept ~(1 - s) of a tensor): nonzero
        # returns them in flat order, so "lower index first" survives the compression.
        where = torch.nonzero(allowed.reshape(-1)).flatten()
        flat = flat[where]
    if not 0 <= k <= flat.numel():
        raise ValueError(f"top_k_mask: k={k} outside [0, {flat.numel()}] allowed positions")
    lowest = torch.finfo(torch.float32).min
    flat = torch.nan_to_num(flat, nan=lowest, posinf=torch.finfo(torch.float32).max, neginf=lowest)
    mask = torch.zeros(numel, dtype=torch.bool, device=scores.device)
    if k:
        # Threshold = k-th largest; everything above it is in, and the k - (count above) places
        # left go to the entries equal to it with the lowest indices. topk alone would pick among
        # equal entries in an unspecified order, a full stable sort is ~5x slower.
        threshold = torch.topk(flat, k, sorted=False).values.min()
        chosen = flat > threshold
        left = k - int(chosen.sum())
        if left:
            chosen[torch.nonzero(flat == threshold).flatten()[:left]] = True
        picked = torch.nonzero(chosen).flatten()
        mask[picked if allowed is None else where[picked]] = True
    return mask.reshape(scores.shape)
