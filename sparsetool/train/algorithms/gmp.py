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

from sparsetool.train.algorithms.base import Sparsifier

__all__ = ["GMP"]


@dataclass(eq=False)
class GMP(Sparsifier):
    """Gradual magnitude pruning from ``initial_sparsity`` to ``sparsity`` on the cubic schedule.

    ``sparsity`` may also be any schedule (``{type: polynomial, ...}``); updates then follow it.
    """

    name = "gmp"
    KEYS = Sparsifier.KEYS + ("initial_sparsity", "update_freq", "update_start", "update_stop")
    DEFAULT_INIT = "magnitude"
    UPDATES = True
    RAMP = True

    initial_sparsity: float = 0.0
