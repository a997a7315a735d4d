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
  :mod:`sparsetool.masks.global_magnitude`, read one tensor at a time);
- ``layer`` (the paper's "uniform" variant): each tensor is pruned to its own count from the
  distribution (uniform or ERK).

The cubic ramp ends at the update stop (75% of the run unless given); drop-and-grow then goes on
every ``update_freq`` steps to the end of the run, the drop fraction cosine-decaying to 0 at the
last step, as the official implementation does.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsetool.errors import ConfigError
from sparsetool.masks.global_magnitude import MagnitudeHistogram, global_threshold_plan
from sparsetool.train.algorithms.rigl import RigL
from sparsetool.train.sharding import gathered

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

        def histogram(name: str, refine: int | None = None) -> MagnitudeHistogram:
            # one whole tensor at a time (gathered from every rank's slice under FSDP)
            return MagnitudeHistogram.of(
                gathered(self._params[name].detach()), self._whole_mask(name), refine=refine
            )

        keep = sum(per_layer.values())
        hists = [histogram(n) for n in names]
        plan = global_threshold_plan(hists, keep)
        if not plan.done:  # the boundary bucket holds distinct values: count inside it
            fine = {i: histogram(names[i], plan.refine_bucket) for i in plan.refine}
            plan = global_threshold_plan(hists, keep, refined=fine)
        return {n: int(t.kept) for n, t in zip(names, plan.tensors)}
