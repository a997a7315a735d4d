"""Sparse Evolutionary Training (Mocanu et al. 2018, "Scalable training of artificial neural
networks with adaptive sparse connectivity inspired by network science").

Sparsity stays constant. Every ``freq`` steps each sparse tensor drops the fraction ``zeta`` of its
kept weights with the smallest magnitude and regrows the same number at random positions among
the weights that were pruned before this update (the paper's zeta = 0.3), so each tensor's count of
non-zeros never changes: ``k_drop = k_grow = round(zeta * (1 - s) * N)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from numbers import Real
from typing import Any

import torch

from sparsetool.errors import ConfigError
from sparsetool.train.schedules import Constant, Periodic, Schedule, build_schedule
from sparsetool.train.algorithms.base import Sparsifier

__all__ = ["SET"]


@dataclass(eq=False)
class SET(Sparsifier):
    """Drop the smallest weights, regrow at random (Mocanu et al. 2018).

    ``drop_fraction``: a number is constant (the paper's zeta); any schedule is accepted, e.g.
    the Cerebras Model Zoo's ``{type: cosine, init: 0.3, half_period: ...}``.
    """

    name = "set"
    KEYS = Sparsifier.KEYS + ("drop_fraction", "update_freq", "update_start", "update_stop")

    drop_fraction: Any = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.drop_fraction, Real) and not isinstance(self.drop_fraction, bool):
            if not 0.0 <= float(self.drop_fraction) <= 1.0:
                raise ConfigError(f"drop_fraction must be in [0, 1], got {self.drop_fraction}")
        self._drop_schedule: Schedule | None = None

    def _number_drop_schedule(self, value: float, stop: int) -> Schedule:
        return Constant(value)

    def _resolve(self, total_steps: int) -> None:
        freq, start, stop = self._default_update(total_steps)
        if stop <= start:
            raise ConfigError(
                f"{self.name}: update stop ({stop}) must be after start ({start}); "
                f"with {total_steps} training steps set update.start/update.stop explicitly"
            )
        self._sparsity_schedule = build_schedule(self.sparsity_level)
        self._update_schedule = Periodic(freq, start, stop)
        self._drop_schedule = self._build_drop(stop)

    def _build_drop(self, stop: int) -> Schedule:
        spec = self.drop_fraction
        if isinstance(spec, Real) and not isinstance(spec, bool):
            return self._number_drop_schedule(float(spec), stop)
        if isinstance(spec, Mapping) and str(spec.get("type", "")).lower() == "cosine":
            if not {"end_step", "half_period"} & set(spec):
                # Model Zoo configs give half_period = update stop; default to the same.
                spec = {**spec, "end_step": stop}
        return build_schedule(spec)

    def drop_fraction_at(self, step: int) -> float:
        assert self._drop_schedule is not None, "attach() first"
        value = float(self._drop_schedule(step))
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"the drop_fraction schedule gives {value} at step {step}; it must stay in [0, 1]")
        return value

    def grow_scores(self, weight: torch.Tensor, grad: torch.Tensor | None,
                    gen: torch.Generator) -> torch.Tensor:
        return torch.rand(weight.shape, generator=gen)
