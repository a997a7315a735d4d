"""GraNet (Liu et al. 2021, "Sparse training via boosting pruning plasticity with
neuroregeneration").

Gradual magnitude pruning on the cubic schedule of Zhu & Gupta (GraNet Eq. 1)

    s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3,

plus RigL's neuroregeneration at every update: first prune to density ``1 - s_t`` by magnitude,
then drop a further fraction ``f_decay(t)`` of each tensor's remaining weights by magnitude and
regrow as many where |grad| is largest. It runs dense-to-sparse (``initial_sparsity = 0``) or
sparse-to-sparse (e.g. 0.5 -> 0.8 as in the Cerebras runs).

``scope`` chooses how the pruning step ranks weights:

- ``global`` (default, the paper's method): one magnitude threshold across all sparse tensors,
  so layers end up with different sparsities (the selection of ``prune --scope global``,
  :func:`sparsetool.masks.global_magnitude.global_magnitude_masks`);
- ``layer`` (the paper's "uniform" variant): each tensor is pruned to its own count from the
  distribution (uniform or ERK).

The cubic ramp ends at the update stop (75% of the run unless given); drop-and-grow then goes on
every ``update_freq`` steps to the end of the run, the drop fraction cosine-decaying to 0 at the
last step, as the official implementation does.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsetool.errors import ConfigError
from sparsetool.masks.global_magnitude import global_magnitude_masks
from sparsetool.train.algorithms.rigl import RigL

__all__ = ["GraNet", "SCOPES"]

SCOPES = ("global", "layer")


@dataclass(eq=False)
class GraNet(RigL):
    """RigL whose sparsity follows GMP's cubic ramp from ``initial_sparsity`` to ``sparsity``,
    pruned with one global magnitude threshold (``scope="global"``) or tensor by tensor
    (``scope="layer"``); drop-and-grow continues after the ramp to the end of the run."""

    name = "granet"
    KEYS = RigL.KEYS + ("initial_sparsity", "scope")
    DEFAULT_INIT = "random"
    RAMP = True
    REGROW_TO_END = True

    initial_sparsity: float = 0.0
    scope: str = "global"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scope not in SCOPES:
            raise ConfigError(f"granet scope {self.scope!r} is not known; valid: global, layer")

    def update_counts(self, step: int) -> dict[str, int | list[int]]:
        """Per tensor, the weights kept at ``step``: with global scope, as many as the largest
        |w| over all kept weights of all tensors give at the target sparsity (a tensor never
        gains weights here; regrowth is counted apart)."""
        if self.scope == "layer":
            return super().update_counts(step)
        per_layer = self.keep_counts(self.sparsity_at(step))
        names = list(self._params)
        chosen = global_magnitude_masks(
            [self._params[n].detach() for n in names], keep=sum(per_layer.values()),
            existing=[self.masks[n] for n in names])
        return {n: int(m.sum()) for n, m in zip(names, chosen)}
