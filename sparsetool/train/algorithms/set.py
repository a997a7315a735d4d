"""Sparse Evolutionary Training (Mocanu et al. 2018, "Scalable training of artificial neural
networks with adaptive sparse connectivity inspired by network science").

Sparsity stays constant. Every ``freq`` steps each sparse tensor drops the fraction ``zeta`` of its
kept weights with the smallest magnitude and regrows the same number at random positions among
the weights that were pruned before this update (the paper's zeta = 0.3), so each tensor's count of
non-zeros never changes: ``k_drop = k_grow = round(zeta * (1 - s) * N)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from sparsetool.errors import ConfigError
from sparsetool.train.algorithms.base import Sparsifier

__all__ = ["SET"]


@dataclass(eq=False)
class SET(Sparsifier):
    """Drop the smallest weights, regrow at random (Mocanu et al. 2018).

    ``drop_fraction``: a number is constant (the paper's zeta); any schedule is accepted, e.g.
    the Cerebras Model Zoo's ``{type: cosine, init: 0.3, half_period: ...}``.
    ``stop_fraction``: without an explicit update stop, updates run until this fraction of the
    run: 1.0 for SET (to the end of training, as Mocanu et al.), 0.75 for RigL (its T_end).
    """

    name = "set"
    KEYS = Sparsifier.KEYS + (
        "drop_fraction",
        "update_freq",
        "update_start",
        "update_stop",
        "stop_fraction",
    )
    UPDATES = True
    DROP_DECAY = "constant"

    drop_fraction: Any = 0.3
    stop_fraction: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        f = self.stop_fraction
        if isinstance(f, bool) or not isinstance(f, Real) or not 0.0 < float(f) <= 1.0:
            raise ConfigError(f"stop_fraction must be a number in (0, 1], got {f!r}")
        if (
            isinstance(self.drop_fraction, Real)
            and not isinstance(self.drop_fraction, bool)
            and not 0.0 <= float(self.drop_fraction) <= 1.0
        ):
            raise ConfigError(f"drop_fraction must be in [0, 1], got {self.drop_fraction}")

    def grow_scores(
        self, weight: torch.Tensor, grad: torch.Tensor | None, gen: torch.Generator
    ) -> torch.Tensor:
        return torch.rand(weight.shape, generator=gen)
