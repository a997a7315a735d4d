"""GraNet (Liu et al. 2021, "Sparse training via boosting pruning plasticity with
neuroregeneration").

Gradual magnitude pruning on the cubic schedule of Zhu & Gupta (GraNet Eq. 1)

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3,

plus RigL's neuroregeneration at every update: first prune each tensor by magnitude to density
``1 - s_t``, then drop a further fraction ``f_decay(t)`` of the remaining weights by magnitude and
regrow as many where |grad| is largest (cosine-decayed, as RigL). It runs dense-to-sparse
(``initial_sparsity = 0``) or sparse-to-sparse (e.g. 0.5 -> 0.8 as in the Cerebras runs).
Each tensor is pruned to its own count from the distribution (uniform or ERK); there is no global
magnitude threshold across tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsetool.train.algorithms.rigl import RigL

__all__ = ["GraNet"]


@dataclass(eq=False)
class GraNet(RigL):
    """RigL whose sparsity follows GMP's cubic ramp from ``initial_sparsity`` to ``sparsity``
    (the drop fraction decays to 0 at the ramp's end, the update stop)."""

    name = "granet"
    KEYS = RigL.KEYS + ("initial_sparsity",)
    DEFAULT_INIT = "random"
    RAMP = True

    initial_sparsity: float = 0.0
