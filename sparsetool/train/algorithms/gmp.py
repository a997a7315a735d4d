"""Gradual magnitude pruning (Zhu & Gupta 2017, "To prune, or not to prune").

Sparsity rises on the cubic schedule (their Eq. 1)

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3,   t in {t0, t0 + dt, ..., t0 + n*dt}

and at each of those steps every sparse tensor keeps its largest-magnitude weights at density
``1 - s_t``; a pruned weight never comes back. Here ``t0`` is the update ``start``, ``dt`` the
update ``freq`` and ``t0 + n*dt`` the update ``stop``, where the final sparsity is reached exactly
(an extra update runs at ``stop`` if it is not on the ``dt`` grid).
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

from sparsetool.errors import ConfigError
from sparsetool.train.schedules import Periodic, Polynomial, build_schedule
from sparsetool.train.algorithms.base import Sparsifier

__all__ = ["GMP"]


def ramp(sparsifier: Sparsifier, initial: float, total_steps: int) -> int:
    """Set the cubic sparsity schedule and the update schedule shared by GMP and GraNet; returns
    the ramp's end step."""
    freq, start, stop = sparsifier._default_update(total_steps)
    if stop <= start:
        raise ConfigError(
            f"{sparsifier.name}: update stop ({stop}) must be after start ({start}); "
            f"with {total_steps} training steps set update.start/update.stop explicitly"
        )
    level = sparsifier.sparsity_level
    if isinstance(level, Real) and not isinstance(level, bool):
        if float(level) < initial:
            raise ConfigError(
                f"{sparsifier.name}: final sparsity {level} is below initial_sparsity {initial}; "
                "pruning never revives weights"
            )
        sparsifier._sparsity_schedule = Polynomial(initial, float(level), start, stop, power=3)
    else:
        sparsifier._sparsity_schedule = build_schedule(level)
    sparsifier._update_schedule = Periodic(freq, start, stop)
    return stop


@dataclass(eq=False)
class GMP(Sparsifier):
    """Gradual magnitude pruning from ``initial_sparsity`` to ``sparsity`` on the cubic schedule.

    ``sparsity`` may also be any schedule (``{type: polynomial, ...}``); updates then follow it.
    """

    name = "gmp"
    KEYS = Sparsifier.KEYS + ("initial_sparsity", "update_freq", "update_start", "update_stop")
    DEFAULT_INIT = "magnitude"

    initial_sparsity: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_sparsity_value(self.initial_sparsity, "initial_sparsity")
        self._ramp_end = -1

    def _resolve(self, total_steps: int) -> None:
        self._ramp_end = ramp(self, float(self.initial_sparsity), total_steps)

    def is_update_step(self, step: int) -> bool:
        return super().is_update_step(step) or step == self._ramp_end
