"""Static sparse training: one mask, chosen at the start, kept to the end.

The pre-training recipe of SPDF (Thangarasa et al. 2023) and stage 1 of Variable SPDF: a random
mask at sparsity ``s`` spread uniformly over the attention and FFN matrices, never updated;
``s`` stays constant, ``s_t = s``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsetool.train.algorithms.base import Sparsifier

__all__ = ["Static"]


@dataclass(eq=False)
class Static(Sparsifier):
    """Fixed mask, random (default) or magnitude at ``attach``; the masks never change.

    Masked weights are held at exactly 0 and their AdamW moments too, so after :meth:`densify`
    (dense fine-tuning) the revived weights start from 0 with fresh moments.
    """

    name = "static"
