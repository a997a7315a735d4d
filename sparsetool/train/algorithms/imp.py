"""Iterative magnitude pruning with learning-rate rewinding (Frankle & Carbin 2019, "The lottery
ticket hypothesis"; Renda et al. 2020, "Comparing rewinding and fine-tuning in neural network
pruning").

Train ``period`` steps, then prune, in each sparse tensor separately, the fraction ``p`` of its
``n`` remaining weights with the smallest magnitude (``round(p * n)`` of them; 20% in Renda et al.,
20-33% per iteration in the Cerebras GPT-3 XL runs, which also prune each layer on its own), then
retrain with the learning-rate schedule rewound. Each round is "retrained for a full training run,
rewinding the learning rate schedule back to step 0" (the iterative-pruning post; Renda et al.
replay the schedule): round ``r`` covers steps ``[t_r, t_(r+1))`` and replays the run's whole
schedule (warm-up, then decay to its minimum) from ``origin`` to its end, compressed into the
round's length. The schedule is read at

    lr_step(t) = origin + (t - t_r) * (total_steps - origin) / (t_(r+1) - t_r)

with ``origin = 0`` for the first (dense) round and ``rewind_step`` after each pruning step
(``rewind_step = 0``: Renda et al.'s rewind to the start; later, as the Cerebras runs often did).
So every round ends at the schedule's minimum, as a dense run does.

After ``r`` rounds a tensor's density is about ``(1 - p) ** r``. With a target ``sparsity`` the
rounds continue until every tensor reaches it exactly (the last round prunes only what is left to
prune). With ``rounds`` and a target, the per-round fraction is derived so that ``rounds`` rounds
reach the target: ``p = 1 - (1 - sparsity) ** (1 / rounds)`` (a ``fraction`` given as well is
refused). With ``rounds`` alone the number of rounds is fixed and ``fraction`` is pruned in each.
Weights are not rewound (LR rewinding only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from numbers import Real
from typing import Any

import torch

from sparsetool.errors import ConfigError
from sparsetool.masks.kernel import top_k_mask
from sparsetool.train.algorithms.base import Sparsifier, is_whole
from sparsetool.train.schedules import Periodic
from sparsetool.train.sharding import gathered

__all__ = ["IMP"]

_MAX_ROUNDS = 10_000


@dataclass(eq=False)
class IMP(Sparsifier):
    """Prune ``fraction`` of each tensor's remaining weights every ``period`` steps and rewind the
    learning-rate schedule to ``rewind_step``.

    ``period`` defaults to ``total_steps // (rounds + 1)`` so the last round also gets a full
    retraining period.
    """

    name = "imp"
    KEYS = (
        "sparsity",
        "fraction",
        "period",
        "rewind_step",
        "rounds",
        "distribution",
        "seed",
        "param_filter",
    )
    DEFAULT_INIT = "magnitude"

    sparsity_level: Any = None  # target sparsity, optional
    fraction: float | None = None  # 0.2 unless derived from sparsity and rounds
    period: int | None = None
    rewind_step: int = 0
    rounds: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sparsity_level is not None and not (
            isinstance(self.sparsity_level, Real) and not isinstance(self.sparsity_level, bool)
        ):
            raise ConfigError("imp: sparsity is a target number in [0, 1), not a schedule")
        if self.fraction is not None and (
            not isinstance(self.fraction, Real) or not 0.0 < float(self.fraction) < 1.0
        ):
            raise ConfigError(f"imp: fraction must be in (0, 1), got {self.fraction!r}")
        for key, low in (("period", 1), ("rounds", 1), ("rewind_step", 0)):
            value = getattr(self, key)
            if value is not None and not is_whole(value, low):
                raise ConfigError(f"imp: {key} must be a whole number >= {low}, got {value!r}")
        if self.sparsity_level is None and self.rounds is None:
            raise ConfigError("imp: give a target sparsity or a number of rounds")
        if self.sparsity_level is not None and self.rounds is not None:
            if self.fraction is not None:
                raise ConfigError(
                    f"imp: sparsity {self.sparsity_level} with rounds={self.rounds} fixes the "
                    "fraction "
                    "pruned per round "
                    f"({1 - (1 - float(self.sparsity_level)) ** (1 / int(self.rounds)):.4f}); "
                    "give two of sparsity, rounds and fraction, not all three"
                )
            # rounds rounds of fraction p leave (1 - p) ** rounds: reach the target exactly.
            self.fraction = 1.0 - (1.0 - float(self.sparsity_level)) ** (1.0 / int(self.rounds))
        elif self.fraction is None:
            self.fraction = 0.2
        self._plan: tuple[int, int] | None = None  # (rounds, period)

    def sparsity_spec(self) -> float:
        """IMP starts dense (or from init_masks / a resume); ``sparsity`` is where rounds stop."""
        return 0.0

    def attach(
        self,
        named_params: Mapping[str, torch.nn.Parameter] | Iterable[tuple[str, torch.nn.Parameter]],
        optimizer: torch.optim.Optimizer | None,
        total_steps: int,
        warmup: int = 0,
    ) -> None:
        super().attach(named_params, optimizer, total_steps, warmup)
        if self._plan is None and not self.densified:
            self._plan = self._make_plan(total_steps)
        self._wire_plan()

    def _wire_plan(self) -> None:
        """Prune at steps ``period, 2 * period, ..., rounds * period``, as one more schedule."""
        if self._plan is not None and self.schedules is not None:
            rounds, period = self._plan
            self.schedules = replace(
                self.schedules, updates=Periodic(period, period, rounds * period + 1)
            )

    def _targets(self) -> dict[str, int] | None:
        if self.sparsity_level is None:
            return None
        return self.keep_counts(float(self.sparsity_level))

    def _prune_count(self, n: int, target: int | None) -> int:
        count = int(round(float(self.fraction) * n))
        if target is None:
            return min(count, n)
        if n <= target:
            return 0
        # At least one per round, or a small tensor would never reach the target.
        return min(max(count, 1), n - target)

    def _make_plan(self, total_steps: int) -> tuple[int, int]:
        targets = self._targets()
        if self.rounds is not None:
            rounds = int(self.rounds)
        else:
            assert targets is not None
            rounds = 0
            for name in self.masks:
                n, r = self._kept(name), 0
                while n > targets[name]:
                    n -= self._prune_count(n, targets[name])
                    r += 1
                    if r > _MAX_ROUNDS:
                        raise ConfigError(
                            "imp: the target sparsity needs too many rounds; raise fraction"
                        )
                rounds = max(rounds, r)
        period = int(self.period) if self.period is not None else total_steps // (rounds + 1)
        if period < 1:
            raise ConfigError(
                f"imp: {rounds} rounds do not fit in {total_steps} steps; set period or train "
                "longer"
            )
        return rounds, period

    @property
    def plan(self) -> tuple[int, int]:
        """(rounds, period) of this run."""
        assert self._plan is not None, "attach() first"
        return self._plan

    def lr_step(self, step: int) -> float:
        """The point of the run's schedule read at ``step``: each round replays the schedule from
        its origin (0, then ``rewind_step``) to the end, compressed into the round's length."""
        if self._plan is None or self.total_steps <= 0:
            return step
        rounds, period = self._plan
        r = min(step // period, rounds)
        start = r * period
        end = (r + 1) * period if r < rounds else self.total_steps
        origin = 0 if r == 0 else min(int(self.rewind_step), self.total_steps)
        return origin + (step - start) * (self.total_steps - origin) / max(1, end - start)

    def update(self, step: int) -> None:
        """One round: each unit (a tensor, or each expert's matrix of a mixture of experts'
        merged experts) prunes ``fraction`` of its kept weights, the last round onto its target."""
        units = (
            None if self.sparsity_level is None else self.unit_counts(float(self.sparsity_level))
        )
        last_round = self._plan is not None and step >= self._plan[0] * self._plan[1]
        self.last_update = {}
        for name, p in self._params.items():
            # whole tensors, one at a time (gathered from every rank's slice under FSDP)
            old, scores = self._whole_mask(name), self.drop_scores(gathered(p.detach()), None)
            dropped = [0]

            def choose(unit, target, old=old, scores=scores, dropped=dropped):
                mask = unit(old)
                n = int(mask.sum())
                count = self._prune_count(n, target)
                if last_round and target is not None:
                    count = max(0, n - target)  # the last round lands on the target exactly
                dropped[0] += count
                return top_k_mask(unit(scores), n - count, allowed=mask)

            targets = units[name] if units is not None else [None] * self._parts.get(name, 1)
            self.masks[name] = self._laid_out(name, self._by_unit(name, choose, targets))
            self.last_update[name] = {"dropped": dropped[0], "grown": 0}
        self._finish_update(step, dict(self.masks), 0.0)

    def _extra_state(self) -> dict[str, Any]:
        if self._plan is None:
            return {}
        return {"imp_rounds": self._plan[0], "imp_period": self._plan[1]}

    def _load_extra_state(self, d: Mapping[str, Any]) -> None:
        if "imp_rounds" in d and "imp_period" in d:
            self._plan = (int(d["imp_rounds"]), int(d["imp_period"]))
            self._wire_plan()
