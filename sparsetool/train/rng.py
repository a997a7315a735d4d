"""Per-(seed, step, tensor) random generators for mask updates.

Every data-parallel rank, and a resumed run, must draw the same random scores: they come from a
generator seeded from (seed, step, tensor index), never from the global RNG.
"""

from __future__ import annotations

import torch

__all__ = ["step_generator"]

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
    >>> c = torch.rand(3, generator=step_generator(0, 101, 2))
    >>> bool(torch.equal(a, b)), bool(torch.equal(a, c))
    (True, False)
    """
    gen = torch.Generator(device="cpu")
    gen.manual_seed(_mix(seed, step, index))
    return gen
