"""Read a checkpoint in any encoding back as plain dense tensors."""

from __future__ import annotations

from pathlib import Path

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.zeros import negative_zeros

__all__ = ["load"]


def load(path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint at ``path`` (a file or a Hugging Face directory), dense.

    Whatever the encoding (zeros, mask, nan or bitmask, or a mixture), each weight comes back under
    its own name with its own dtype and shape, pruned entries as +0.0; ``<name>_mask`` tensors and
    the parts of a bitmask group are folded into the weight they describe. This is what transformers
    cannot read from a ``nan`` or ``bitmask`` checkpoint and sparsetool can.
    """
    out: dict[str, torch.Tensor] = {}
    with open_checkpoint(path) as ckpt:
        for lt in ckpt.logical:
            dense, _mask = decode(ckpt, lt)  # pruned entries are +0.0 whatever the encoding
            negative = negative_zeros(dense)
            if negative is not None:
                dense = dense.masked_fill(negative, 0.0)
            out[lt.name] = dense
    return out
