"""Rigging the Lottery (Evci et al. 2020, "Rigging the lottery: making all tickets winners").

Like SET, but regrow where the dense gradient magnitude |dL/dw| is largest, and decay the drop
fraction on a cosine (their Eq. 1)

    f_decay(t; alpha, T_end) = alpha / 2 * (1 + cos(t * pi / T_end)),

dropping and regrowing ``f_decay(t) * (1 - s) * N`` weights per tensor every ``dT`` steps until
``T_end`` (defaults alpha = 0.3, dT = 100, T_end = 75% of training, as in the paper). Regrown
weights start at 0 with zero optimizer moments. The gradient is the all-reduced one, so every
data-parallel rank makes the same choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sparsetool.train.algorithms.set import SET

__all__ = ["RigL"]


@dataclass(eq=False)
class RigL(SET):
    """Like SET, but regrow where |gradient| is largest (Evci et al. 2020).

    A number for ``drop_fraction`` is alpha of the cosine decay to 0 at the update stop.
    """

    name = "rigl"
    DROP_DECAY = "cosine"
    USES_GRADIENT = True

    stop_fraction: float = 0.75

    def grow_scores(
        self, weight: torch.Tensor, grad: torch.Tensor | None, gen: torch.Generator
    ) -> torch.Tensor:
        if grad is None:  # a tensor that took no part in the loss: no preference, lowest index
            return torch.zeros_like(weight)
        return grad.detach().abs()
