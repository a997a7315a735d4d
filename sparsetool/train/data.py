"""Byte-level training batches from a corpus (:mod:`sparsetool.util.corpus`): a sampler that can
resume exactly, and a fixed validation set.

Batches are a pure function of ``(seed, position)``: position ``k`` counts training sequences
already served. Each epoch is a seeded permutation of the non-overlapping windows of the train
stream (with a seeded offset, so epochs do not share window boundaries), hence resuming at
position ``k`` continues exactly where the interrupted run was and never repeats data within an
epoch (the Variable SPDF post: a restart "should not repeat data from Stage-1").
"""

from __future__ import annotations

import numpy as np
import torch

from sparsetool.errors import ConfigError


class Sampler:
    """Training sequences as a pure function of ``(seed, position)``.

    >>> s = Sampler(np.arange(100, dtype=np.uint8), context=9, seed=0)
    >>> s.windows_per_epoch
    11
    >>> x, y = s.batch(0, 2)
    >>> x.shape, bool((x[:, 1:] == y[:, :-1]).all())
    (torch.Size([2, 9]), True)
    >>> bool((s.batch(5, 3)[0] == torch.cat([s.batch(5, 1)[0], s.batch(6, 2)[0]])).all())
    True
    """

    def __init__(self, data: np.ndarray, context: int, seed: int) -> None:
        if data.size < context + 1:
            raise ConfigError(f"{data.size} training bytes cannot fill one {context}-byte sequence")
        self.data = data
        self.context = context
        self.seed = seed
        # Windows hold context + 1 bytes (inputs and the shifted targets) and do not overlap.
        self.windows_per_epoch = (data.size - 1) // context
        self._epoch = -1
        self._starts = np.empty(0, dtype=np.int64)

    def _epoch_starts(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            n = self.windows_per_epoch
            slack = self.data.size - 1 - n * self.context  # bytes left over after n windows
            offset = int(rng.integers(0, slack + 1))
            self._starts = offset + rng.permutation(n).astype(np.int64) * self.context
            self._epoch = epoch
        return self._starts

    def starts(self, position: int, count: int) -> np.ndarray:
        """Start offsets of sequences ``position .. position + count - 1``."""
        out = np.empty(count, dtype=np.int64)
        n = self.windows_per_epoch
        for i in range(count):
            k = position + i
            out[i] = self._epoch_starts(k // n)[k % n]
        return out

    def batch(self, position: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets, each (count, context) int64."""
        idx = self.starts(position, count)[:, None] + np.arange(self.context + 1)[None, :]
        seq = torch.from_numpy(self.data[idx].astype(np.int64))
        return seq[:, :-1], seq[:, 1:]


def eval_batches(
    data: np.ndarray, context: int, n_sequences: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed validation set: ``n_sequences`` windows spread evenly over the stream (no seed,
    so every run and every algorithm is measured on the same bytes)."""
    last = data.size - context - 1
    if last < 0:
        raise ConfigError(f"{data.size} validation bytes cannot fill one {context}-byte sequence")
    n = max(1, min(n_sequences, last + 1))
    starts = np.linspace(0, last, n).astype(np.int64)
    idx = starts[:, None] + np.arange(context + 1)[None, :]
    seq = torch.from_numpy(data[idx].astype(np.int64))
    return seq[:, :-1], seq[:, 1:]
