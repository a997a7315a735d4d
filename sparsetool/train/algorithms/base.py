"""The shared machinery of every sparse-training algorithm: which tensors are sparse, their masks,
keeping pruned weights and their optimizer moments at exactly zero, and the one mask update that
every algorithm is a special case of.

Following JaxPruner (Lee et al. 2024), one base class does the shared work -- initial masks, drop,
grow, per-tensor keep counts -- and an algorithm overrides a scoring hook and declares its
schedules (``UPDATES``, ``RAMP``, ``DROP_DECAY``), which :func:`sparsetool.train.schedules.wire`
turns into schedules in one place:

===========  =====================  ========================  ===============================
algorithm    sparsity schedule      drop (by ``drop_scores``)  grow (by ``grow_scores``)
===========  =====================  ========================  ===============================
static       constant               never updated             --
gmp          cubic (Zhu & Gupta)    smallest |w|               --
set          constant               smallest |w|, fraction f   random
rigl         constant               smallest |w|, fraction f   largest |grad|
granet       cubic                  smallest |w|, to s_t + f   largest |grad|
imp          fraction of remaining  smallest |w|               --
===========  =====================  ========================  ===============================

As in torch.ao.pruning the mask state lives beside the model, keyed by each parameter's full name,
never inside the weights (:class:`~.maskstate.MaskState`); a pruned weight is an ordinary parameter
entry held at +0.0.

Protocol with the training loop (``step`` is the 0-based index of the optimizer step about to run)::

    sparsifier.attach(model.named_parameters(), optimizer, total_steps)
    for step in range(start, total_steps):
        loss.backward()                      # grads final (all-reduced under DDP)
        sparsifier.before_step(step)         # may update masks; zeroes grads of pruned weights
        lr = schedule(sparsifier.lr_step(step))
        optimizer.step()
        sparsifier.after_step(step)          # weights and AdamW moments at pruned positions -> 0

Data-parallel safety: every decision uses only tensors that are identical on all ranks (the
weights, the all-reduced gradients) and ``torch.Generator`` objects seeded from (seed, step,
tensor index), never the global RNG; :meth:`Sparsifier.broadcast_masks` is a safety net on top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from sparsetool.errors import ConfigError
from sparsetool.masks.kernel import top_k_mask
from sparsetool.train.algorithms.maskstate import MaskState
from sparsetool.train.rng import step_generator
from sparsetool.train.schedules import Wiring, wire
from sparsetool.train.sharding import gathered, is_sharded
from sparsetool.util.options import check_sparsity

__all__ = ["Sparsifier", "is_whole"]


def is_whole(value: Any, low: int) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value == int(value) >= low
    )


@dataclass(eq=False)
class Sparsifier(MaskState):
    """Static sparse training: masks chosen once at :meth:`attach` and never changed; the base of
    every other algorithm (see the module docstring for the protocol with the training loop).

    ``sparsity_level`` (config key ``sparsity``) is the fraction of zeros in the targeted tensors
    (a number or a schedule);
    ``distribution`` spreads it over tensors (``uniform``: the same in each; ``erk``:
    Erdos-Renyi-Kernel, Evci et al. 2020); ``init_method`` picks the first mask (``random``, as
    the SPDF and Variable SPDF pre-training runs, or ``magnitude``). ``param_filter`` globs select
    the sparse tensors by full name (Cerebras Model Zoo ``param_filter``); without it the default
    targets of :func:`sparsetool.targets.plan_targets` are used (attention and FFN matrices).
    """

    name: ClassVar[str] = "static"
    # Config keys this algorithm accepts (besides ``algorithm``); see ``build_sparsifier``.
    KEYS: ClassVar[tuple[str, ...]] = (
        "sparsity",
        "init_method",
        "distribution",
        "seed",
        "param_filter",
    )
    DEFAULT_INIT: ClassVar[str] = "random"
    # Schedule declarations, turned into schedules in one place (:func:`schedules.wire`):
    # UPDATES: the masks update every update_freq steps in [update_start, update_stop);
    # RAMP: a number sparsity rises on the cubic from ``initial_sparsity`` over that window;
    # DROP_DECAY: a number ``drop_fraction`` is "constant" (SET) or "cosine"-decayed (RigL),
    # None: no drop-and-grow; REGROW_TO_END: drop-and-grow goes on after the ramp (GraNet).
    UPDATES: ClassVar[bool] = False
    RAMP: ClassVar[bool] = False
    DROP_DECAY: ClassVar[str | None] = None
    REGROW_TO_END: ClassVar[bool] = False
    # Whether drop_scores or grow_scores read the gradient (RigL, GraNet): only then is a
    # sharded gradient gathered whole for a mask update.
    USES_GRADIENT: ClassVar[bool] = False

    # The config key ``sparsity``; named apart from the ``sparsity()`` report method.
    sparsity_level: Any = 0.5
    init_method: str | None = None
    distribution: str = "uniform"
    seed: int = 0
    param_filter: tuple[str, ...] | None = None
    update_freq: int | None = None
    update_start: int | None = None
    update_stop: int | None = None
    init_masks: Mapping[str, torch.Tensor] | None = field(default=None, repr=False)

    masks: dict[str, torch.Tensor] = field(default_factory=dict, init=False, repr=False)
    densified: bool = field(default=False, init=False)
    total_steps: int = field(default=0, init=False)
    # What the last mask update changed, per tensor: {"dropped": n, "grown": n} (for logs/tests).
    last_update: dict[str, dict[str, int]] = field(default_factory=dict, init=False, repr=False)
    updates_done: int = field(default=0, init=False)
    # The totals of the last mask update, as the training log records them.
    last_event: dict[str, Any] | None = field(default=None, init=False, repr=False)
    warmup: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.init_method is None:
            self.init_method = self.DEFAULT_INIT
        if self.init_method not in ("random", "magnitude"):
            raise ConfigError(
                f"init_method {self.init_method!r} is not known; valid: magnitude, random"
            )
        if self.distribution not in ("uniform", "erk"):
            raise ConfigError(
                f"distribution {self.distribution!r} is not known; valid: erk, uniform"
            )
        if isinstance(self.param_filter, str):
            self.param_filter = (self.param_filter,)
        elif self.param_filter is not None:
            self.param_filter = tuple(self.param_filter)
        self._init_mask_state()
        self.schedules: Wiring | None = None  # made at attach(), when total_steps is known
        for key in ("update_freq", "update_start", "update_stop"):
            value = getattr(self, key)
            if value is not None and not is_whole(value, 0):
                raise ConfigError(f"{key} must be a whole number >= 0, got {value!r}")
        if self.update_freq is not None and self.update_freq < 1:
            raise ConfigError(f"update freq must be >= 1, got {self.update_freq}")
        self._check_sparsity_value(self.sparsity_level, "sparsity")
        if self.RAMP:
            self._check_sparsity_value(self.initial_sparsity, "initial_sparsity")

    # ----------------------------------------------------------------- configuration hooks

    @staticmethod
    def _check_sparsity_value(value: Any, key: str) -> None:
        # a number is a sparsity like every other (sparsetool.util.options); a mapping is a schedule
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            check_sparsity(value, key)

    def sparsity_spec(self) -> Any:
        """The sparsity schedule's config value (IMP overrides: its ``sparsity`` is a target)."""
        return self.sparsity_level

    def _wire(self, total_steps: int) -> Wiring:
        """This algorithm's schedules for a run of ``total_steps``, from its declarations."""
        return wire(
            self.name,
            total_steps,
            self.sparsity_spec(),
            updates=self.UPDATES,
            ramp_from=float(self.initial_sparsity) if self.RAMP else None,
            drop_fraction=self.drop_fraction if self.DROP_DECAY else None,
            drop_decay=self.DROP_DECAY or "constant",
            update_freq=self.update_freq,
            update_start=self.update_start,
            update_stop=self.update_stop,
            warmup=self.warmup,
            stop_fraction=float(getattr(self, "stop_fraction", 0.75)),
            regrow_to_end=self.REGROW_TO_END,
        )

    def resolved(self) -> dict[str, Any]:
        """Every setting, defaults filled in (after :meth:`attach`): :func:`.settings.resolved`."""
        from sparsetool.train.algorithms.settings import resolved

        return resolved(self)

    def sparsity_at(self, step: int) -> float:
        """Target sparsity of the sparse tensors at ``step``."""
        assert self.schedules is not None, "attach() first"
        value = float(self.schedules.sparsity(step))
        return check_sparsity(value, f"the sparsity schedule at step {step}")

    def drop_fraction_at(self, step: int) -> float:
        """Fraction of each tensor's kept weights swapped at an update (0: no drop-and-grow)."""
        assert self.schedules is not None, "attach() first"
        value = float(self.schedules.drop_fraction(step))
        if not 0.0 <= value <= 1.0:
            raise ConfigError(
                f"the drop_fraction schedule gives {value} at step {step}; it must stay in [0, 1]"
            )
        return value

    def is_update_step(self, step: int) -> bool:
        return self.schedules is not None and self.schedules.is_update_step(step)

    # The scoring hooks (JaxPruner's shape): an algorithm changes what is dropped and grown.
    def drop_scores(self, weight: torch.Tensor, grad: torch.Tensor | None) -> torch.Tensor:
        """Higher = keep. Magnitude, as every algorithm here (|w|)."""
        return weight.detach().abs()

    def grow_scores(
        self, weight: torch.Tensor, grad: torch.Tensor | None, gen: torch.Generator
    ) -> torch.Tensor | None:
        """Higher = regrow first; ``None`` means the algorithm never regrows."""
        return None

    # ----------------------------------------------------------------- attaching

    def select(
        self, named_params: Mapping[str, torch.nn.Parameter]
    ) -> dict[str, torch.nn.Parameter]:
        """The parameters this sparsifier masks, in the model's order."""
        from sparsetool.targets import plan_targets

        plan = plan_targets(
            ((n, tuple(p.shape), p.dtype) for n, p in named_params.items()),
            select=self.param_filter,
        )
        # a mixture of experts' merged experts: each expert's matrix is a unit of its own
        self._parts = {name: plan[name].experts for name in plan.targeted if plan[name].experts}
        return {name: named_params[name] for name in plan.targeted}

    def attach(
        self,
        named_params: Mapping[str, torch.nn.Parameter] | Iterable[tuple[str, torch.nn.Parameter]],
        optimizer: torch.optim.Optimizer | None,
        total_steps: int,
        warmup: int = 0,
    ) -> None:
        """Choose the sparse tensors, make (or adopt) their masks and apply them. ``warmup`` (the
        run's LR warm-up steps) places the first default mask update after it.

        Masks already set by :meth:`load_state_dict` (a resume) or passed as ``init_masks`` are
        used as they are (:meth:`prune_further` makes the latter sparser if asked); otherwise
        the initial masks are made at ``sparsity_at(0)``.
        """
        named = dict(named_params.items() if isinstance(named_params, Mapping) else named_params)
        self._params = self.select(named)
        if not self._params:
            how = (
                f"param_filter {list(self.param_filter)}"
                if self.param_filter is not None
                else "the default targets (attention and FFN weight matrices)"
            )
            raise ConfigError(
                f"no parameter matches {how}; names seen: {', '.join(list(named)[:6])}"
                f"{'...' if len(named) > 6 else ''}. Set param_filter to globs of the weights to "
                "sparsify"
            )
        self._optimizer = optimizer
        self.total_steps = int(total_steps)
        self.warmup = int(warmup)
        self.schedules = self._wire(self.total_steps)
        if self.densified:
            self.masks = {}
            return
        given = self.masks or (dict(self.init_masks) if self.init_masks is not None else None)
        if given:
            self.masks = self._adopt(given)
        else:
            self.masks = self.initial_masks()
        self._adopt_grown()
        self._apply(self.masks)

    def prune_further(self) -> bool:
        """After :meth:`attach` with masks denser than ``sparsity_at(0)`` (by more than one weight
        per tensor; ``train --init SPARSE --sparsity S`` with a higher ``S``): prune them to it.
        Each tensor keeps its highest ``drop_scores`` among its kept weights, at most its count
        at that sparsity; a pruned weight is never revived. True if the masks changed."""
        if self.densified or not self.masks:
            return False
        total = sum(m.numel() for m in self.masks.values())
        have = 1.0 - sum(self._kept(n) for n in self.masks) / total
        if self.sparsity_at(0) <= have + len(self.masks) / total:
            return False
        keep = self.unit_counts(self.sparsity_at(0))
        for name, p in self._params.items():
            if self._kept(name) > sum(keep[name]):  # the same on every rank: gathers agree
                m = self._whole_mask(name)
                scores = self.drop_scores(gathered(p.detach()), None)
                self.masks[name] = self._laid_out(
                    name,
                    self._by_unit(
                        name,
                        lambda u, k, s=scores, m=m: top_k_mask(u(s), k, allowed=u(m)),
                        keep[name],
                    ),
                )
        self._apply(self.masks)
        return True

    def unit_counts(self, sparsity: float) -> dict[str, list[int]]:
        """Non-zeros of each unit of each sparse tensor at ``sparsity``: one count per tensor,
        or one per expert of a mixture of experts' merged experts (each a matrix of its own)."""
        from sparsetool.masks.distributions import part_keep_counts

        shapes = {n: tuple(p.shape) for n, p in self._params.items()}
        parts = getattr(self, "_parts", {})
        return {
            n: [int(k) for k in ks]
            for n, ks in part_keep_counts(shapes, parts, sparsity, self.distribution).items()
        }

    def _by_unit(
        self, name: str, choose: Callable[[Callable, int], torch.Tensor], counts: list[int]
    ) -> torch.Tensor:
        """``choose(unit, count)`` for each unit of tensor ``name`` (``unit(t)``: that unit's part
        of a tensor shaped like it), put together: the mask of the whole tensor."""
        if len(counts) == 1:
            return choose(lambda t: t, counts[0])
        return torch.stack([choose(lambda t, e=e: t[e], k) for e, k in enumerate(counts)])

    def keep_counts(self, sparsity: float) -> dict[str, int]:
        """Non-zeros per sparse tensor at overall ``sparsity`` under the chosen distribution (a
        tensor of every expert: the sum of its experts' counts, :meth:`unit_counts`)."""
        return {n: sum(ks) for n, ks in self.unit_counts(sparsity).items()}

    def initial_masks(self) -> dict[str, torch.Tensor]:
        from sparsetool.masks.select import magnitude_mask, random_mask

        keep = self.unit_counts(self.sparsity_at(0))
        masks = {}
        for index, (name, p) in enumerate(self._params.items()):
            if self.init_method == "magnitude":
                w = gathered(p.detach())  # one whole tensor at a time when sharded
                m = self._by_unit(name, lambda u, k, w=w: magnitude_mask(u(w), keep=k), keep[name])
            else:
                # Step -1: the initial draw never coincides with an update's stream.
                gen = step_generator(self.seed, -1, index)
                shape = torch.empty(tuple(p.shape), device="meta")  # the whole tensor's units
                m = self._by_unit(
                    name,
                    lambda u, k, shape=shape, gen=gen: random_mask(
                        tuple(u(shape).shape), keep=k, generator=gen
                    ),
                    keep[name],
                )
            masks[name] = self._laid_out(name, m)
        return masks

    # ----------------------------------------------------------------- per-step work

    def before_step(self, step: int) -> None:
        """After backward, before ``optimizer.step()``: update the masks if ``step`` is an update
        step, then zero the gradient of every weight that is pruned -- and of every weight regrown
        just now, so that it enters the next step at exactly 0 with zero AdamW moments."""
        self._grown = {}
        if self.densified or not self._params:
            return
        if self.is_update_step(step):
            self.update(step)
            self.updates_done += 1
        self._mask_grads()

    def after_step(self, step: int) -> None:
        """After ``optimizer.step()``: pruned weights and their optimizer state back to +0.0
        (weight decay and momentum would otherwise move them)."""
        if self.densified or not self._params:
            return
        self._apply(self.masks)

    def lr_step(self, step: int) -> int:
        """The step the learning-rate schedule should see (IMP rewinds it)."""
        return step

    def update_counts(self, step: int) -> dict[str, int | list[int]]:
        """Weights each tensor keeps after the update at ``step``: one count, or one per expert
        of a tensor of every expert (GraNet overrides: global scope, one count per tensor)."""
        return dict(self.unit_counts(self.sparsity_at(step)))

    def update(self, step: int) -> None:
        """One mask update (JaxPruner's drop-and-grow, general form).

        Per tensor with ``n`` kept weights and target ``k`` kept at ``sparsity_at(step)``: keep the
        ``min(n, k) - d`` highest ``drop_scores`` among the kept weights, then grow ``d + max(k - n,
        0)`` weights with the highest ``grow_scores`` among the positions that were pruned *before*
        this update (so a weight dropped now is never regrown now), where
        ``d = round(drop_fraction_at(step) * min(n, k))``. The kept count is exactly ``k``.
        Regrown weights start at 0 with zero optimizer moments (RigL, section 3).
        """
        keep = self.update_counts(step)
        fraction = self.drop_fraction_at(step)
        self.last_update = {}
        new_masks: dict[str, torch.Tensor] = {}
        for index, (name, p) in enumerate(self._params.items()):
            gen = step_generator(self.seed, step, index)
            # Whole tensors, one at a time (gathered from every rank's slice under FSDP); the
            # gradient is the reduced one, the same on every rank.
            weight = gathered(p.detach())
            grad = gathered(p.grad) if self.USES_GRADIENT else None
            grow = self.grow_scores(weight, grad, gen)
            drop = self.drop_scores(weight, grad)
            counts = keep[name] if isinstance(keep[name], list) else [keep[name]]
            tally = {"dropped": 0, "grown": 0}
            grown_parts: list[torch.Tensor] = []

            whole = self._whole_mask(name)

            def choose(
                unit: Callable,
                k: int,
                old=whole,
                drop=drop,
                grow=grow,
                tally=tally,
                grown_parts=grown_parts,
            ) -> torch.Tensor:
                mask = unit(old)
                n, numel = int(mask.sum()), mask.numel()
                base = min(n, k)
                if grow is None:  # an algorithm that never regrows cannot lower sparsity
                    n_swap = n_extra = 0
                else:
                    n_extra = k - base
                    n_swap = max(0, min(int(round(fraction * base)), numel - n - n_extra))
                kept = top_k_mask(unit(drop), base - n_swap, allowed=mask)
                tally["dropped"] += n - (base - n_swap)
                tally["grown"] += n_swap + n_extra
                grown = (
                    top_k_mask(unit(grow).to(mask.device), n_swap + n_extra, allowed=~mask)
                    if n_swap + n_extra
                    else torch.zeros_like(mask)
                )
                grown_parts.append(grown)
                return kept | grown

            new_masks[name] = self._laid_out(name, self._by_unit(name, choose, counts))
            if tally["grown"]:
                grown = grown_parts[0] if len(counts) == 1 else torch.stack(grown_parts)
                self._grown[name] = self._laid_out_grown(name, grown)
            self.last_update[name] = dict(tally)
        self._finish_update(step, new_masks, fraction)

    # ----------------------------------------------------------------- state

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, d: Mapping[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """``{"algorithm", "seed", "densified", "updates_done", ..., "masks": {name: bool
        tensor}}``: every entry but ``masks`` and ``grown_before`` (bool tensors) is a JSON scalar.
        """
        d: dict[str, Any] = {
            "algorithm": self.name,
            "seed": int(self.seed),
            "densified": bool(self.densified),
            "updates_done": int(self.updates_done),
        }
        d.update(self._extra_state())
        d["masks"] = {n: _saved(m) for n, m in self.masks.items()}
        if self._grown_before:  # what the next update's survival count compares against
            d["grown_before"] = {n: _saved(g) for n, g in self._grown_before.items()}
        return d

    def load_state_dict(self, d: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave. Before :meth:`attach` the masks are adopted there;
        after it they are checked and applied at once."""
        if d.get("algorithm") != self.name:
            raise ConfigError(
                f"the saved sparsity state is for algorithm {d.get('algorithm')!r}, this run uses "
                f"{self.name!r}; resume with the same algorithm"
            )
        self.seed = int(d.get("seed", self.seed))
        self.densified = bool(d.get("densified", False))
        self.updates_done = int(d.get("updates_done", 0))
        self._load_extra_state(d)
        self._grown_before = {n: _loaded(g) for n, g in dict(d.get("grown_before", {})).items()}
        masks = {n: _loaded(m) for n, m in dict(d.get("masks", {})).items()}
        if self.densified:
            self.masks = {}
        elif self._params:
            self.masks = self._adopt(masks)
            self._adopt_grown()
            self._apply(self.masks)
        else:
            self.masks = masks


def _saved(mask: torch.Tensor) -> torch.Tensor:
    """A mask as a state dict holds it: a bool copy on the CPU, or a sharded one as it is laid
    out (a sharded checkpoint saves each rank's slice)."""
    if is_sharded(mask):
        return mask.detach().to(torch.bool).clone()
    return mask.detach().to("cpu", torch.bool).clone()


def _loaded(mask) -> torch.Tensor:
    return mask.to(torch.bool) if is_sharded(mask) else torch.as_tensor(mask).to(torch.bool)
