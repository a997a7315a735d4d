"""Hyper-parameter schedules for sparse training: a value (sparsity, drop fraction) or a yes/no
"update the masks now?" as a function of the training step.

Every schedule is a small frozen dataclass called with the 0-based step index of the optimizer
step about to run, so the same object gives the same answer on every data-parallel rank and after
a resume (no hidden state, nothing to checkpoint). As in torch.ao.pruning, a schedule only sets a
level; the sparsifier decides what to do with it.

>>> Polynomial(0.0, 0.75, begin_step=0, end_step=100)(50)   # 0.75 * (1 - 0.5**3)
0.65625
>>> Cosine(0.3, 0.0, begin_step=0, end_step=100)(50)        # RigL drop fraction at T_end / 2
0.15
>>> Periodic(every=100, begin_step=100, end_step=300)(200)
True

No torch here: importing this module is cheap and the arithmetic is plain float.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from numbers import Real
from typing import Any

from sparsetool.errors import ConfigError

__all__ = [
    "Schedule",
    "Constant",
    "Cosine",
    "Polynomial",
    "Periodic",
    "SCHEDULES",
    "Wiring",
    "build_schedule",
    "update_window",
    "default_interval",
    "DEFAULT_INTERVAL",
    "wire",
]


@dataclass(frozen=True)
class Constant:
    """The same value at every step (RigL/SET sparsity, the static mask's sparsity).

    >>> Constant(0.75)(12345)
    0.75
    """

    value: float

    def __call__(self, step: int) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Cosine:
    """Half a cosine from ``start`` at ``begin_step`` down (or up) to ``end`` at ``end_step``.

    ``v(t) = end + (start - end) * (1 + cos(pi * (t - begin_step) / (end_step - begin_step))) / 2``,
    held at ``start`` before ``begin_step`` and at ``end`` from ``end_step`` on.

    With ``start = alpha``, ``end = 0`` and ``begin_step = 0`` this is the drop-fraction decay of
    RigL (Evci et al. 2020, Eq. 1): ``f_decay(t; alpha, T_end) = alpha/2 * (1 + cos(t * pi /
    T_end))``. The Cerebras Model Zoo writes the same schedule as ``{type: cosine, init: alpha,
    half_period: T_end}`` (its ``minimum`` is our ``end``).

    >>> f = Cosine(start=0.3, end=0.0, begin_step=0, end_step=1000)
    >>> [round(f(t), 6) for t in (0, 250, 500, 1000, 5000)]
    [0.3, 0.256066, 0.15, 0.0, 0.0]
    """

    start: float
    end: float
    begin_step: int
    end_step: int

    def __post_init__(self) -> None:
        if self.end_step <= self.begin_step:
            raise ConfigError(
                f"cosine schedule: end_step ({self.end_step}) must be after begin_step "
                f"({self.begin_step})"
            )

    def __call__(self, step: int) -> float:
        if step <= self.begin_step:
            return float(self.start)
        if step >= self.end_step:
            return float(self.end)
        phase = (step - self.begin_step) / (self.end_step - self.begin_step)
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * phase))


@dataclass(frozen=True)
class Polynomial:
    """Polynomial ramp from ``initial`` to ``final``; with ``power=3`` the gradual magnitude pruning
    schedule of Zhu & Gupta 2017 ("To prune, or not to prune", Eq. 1):

    ``s_t = s_f + (s_i - s_f) * (1 - (t - t0) / (n * dt)) ** 3``  for ``t0 <= t <= t0 + n*dt``,

    here with ``begin_step = t0`` and ``end_step = t0 + n*dt``. Held at ``initial`` before
    ``begin_step`` and at exactly ``final`` from ``end_step`` on. Also GraNet's sparsity schedule
    (Liu et al. 2021, Eq. 1 is the same cubic).

    >>> s = Polynomial(initial=0.5, final=0.75, begin_step=100, end_step=200)
    >>> [s(t) for t in (0, 100, 150, 200, 300)]
    [0.5, 0.5, 0.71875, 0.75, 0.75]
    """

    initial: float
    final: float
    begin_step: int
    end_step: int
    power: float = 3

    def __post_init__(self) -> None:
        if self.end_step <= self.begin_step:
            raise ConfigError(
                f"polynomial schedule: end_step ({self.end_step}) must be after begin_step "
                f"({self.begin_step})"
            )
        if self.power <= 0:
            raise ConfigError(f"polynomial schedule: power must be > 0, got {self.power}")

    def __call__(self, step: int) -> float:
        if step <= self.begin_step:
            return float(self.initial)
        if step >= self.end_step:
            return float(self.final)
        remaining = 1.0 - (step - self.begin_step) / (self.end_step - self.begin_step)
        return self.final + (self.initial - self.final) * remaining**self.power


@dataclass(frozen=True)
class Periodic:
    """``True`` every ``every`` steps from ``begin_step`` (included) until ``end_step`` (excluded,
    as the Cerebras Model Zoo's ``update: {freq, start, stop}`` -- "stop updates at step N (not
    inclusive)"); ``end_step=None`` never stops.

    >>> p = Periodic(every=10, begin_step=5, end_step=35)
    >>> [t for t in range(50) if p(t)]
    [5, 15, 25]
    """

    every: int
    begin_step: int = 0
    end_step: int | None = None

    def __post_init__(self) -> None:
        if int(self.every) != self.every or self.every < 1:
            raise ConfigError(
                f"periodic schedule: every (freq) must be an integer >= 1, got {self.every}"
            )
        if self.begin_step < 0:
            raise ConfigError(f"periodic schedule: begin_step must be >= 0, got {self.begin_step}")

    def __call__(self, step: int) -> bool:
        if step < self.begin_step:
            return False
        if self.end_step is not None and step >= self.end_step:
            return False
        return (step - self.begin_step) % self.every == 0


Schedule = Constant | Cosine | Polynomial | Periodic

SCHEDULES: dict[str, type] = {
    "constant": Constant,
    "cosine": Cosine,
    "polynomial": Polynomial,
    "cubic": Polynomial,  # polynomial with power 3 (Zhu & Gupta 2017)
    "periodic": Periodic,
}

# Other spellings of the same arguments (Cerebras Model Zoo hyper-parameter and update-schedule
# keys, and the short forms people type). Mapped onto the dataclass field names.
_ALIASES: dict[str, dict[str, str]] = {
    "constant": {},
    "cosine": {
        "init": "start",
        "initial": "start",
        "minimum": "end",
        "final": "end",
        "begin": "begin_step",
        "half_period": "end_step",
        "end_step": "end_step",
    },
    "polynomial": {
        "init": "initial",
        "init_sparsity": "initial",
        "end": "final",
        "end_sparsity": "final",
        "begin": "begin_step",
        "start": "begin_step",
        "stop": "end_step",
        "exponent": "power",
    },
    "periodic": {
        "freq": "every",
        "start": "begin_step",
        "begin": "begin_step",
        "stop": "end_step",
        "end": "end_step",
    },
}


def build_schedule(spec: Schedule | Mapping[str, Any] | str | float | int) -> Schedule:
    """Make a schedule from a config value.

    A number is a :class:`Constant`; a schedule object is returned as is; a mapping names its type
    under ``type`` (one of ``constant, cosine, polynomial, cubic, periodic``) and its arguments by
    field name or by the Cerebras Model Zoo spelling (``init``, ``half_period``, ``minimum``,
    ``freq``, ``start``, ``stop``...). A string is a number or the bare type name of a schedule
    whose arguments all have defaults.

    >>> build_schedule(0.8)
    Constant(value=0.8)
    >>> build_schedule({"type": "cosine", "init": 0.3, "half_period": 3584})
    Cosine(start=0.3, end=0.0, begin_step=0, end_step=3584)
    >>> build_schedule(
    ...     {"type": "cubic", "initial": 0.0, "final": 0.9, "begin_step": 0, "end_step": 10}
    ... )
    Polynomial(initial=0.0, final=0.9, begin_step=0, end_step=10, power=3)
    """
    if isinstance(spec, (Constant, Cosine, Polynomial, Periodic)):
        return spec
    if isinstance(spec, bool):
        raise ConfigError(f"schedule: expected a number or a mapping with 'type', got {spec!r}")
    if isinstance(spec, (int, float)):
        return Constant(float(spec))
    if isinstance(spec, str):
        try:
            return Constant(float(spec))
        except ValueError:
            return build_schedule({"type": spec})
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"schedule: expected a number or a mapping with 'type', got {type(spec).__name__}"
        )
    args = dict(spec)
    kind = str(args.pop("type", "constant" if "value" in args else "")).lower()
    if kind not in SCHEDULES:
        raise ConfigError(
            f"schedule: unknown type {kind!r}; valid types: {', '.join(sorted(SCHEDULES))}"
        )
    cls = SCHEDULES[kind]
    canon = "polynomial" if kind == "cubic" else kind
    aliases = _ALIASES[canon]
    valid = {f.name for f in fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in args.items():
        name = aliases.get(key, key)
        if name not in valid:
            allowed = sorted(valid | set(aliases))
            raise ConfigError(
                f"schedule {kind!r}: unknown key {key!r}; valid keys: {', '.join(allowed)}"
            )
        if name in kwargs:
            raise ConfigError(f"schedule {kind!r}: {key!r} given twice (under another spelling)")
        kwargs[name] = value
    if canon == "cosine":
        kwargs.setdefault("end", 0.0)
        kwargs.setdefault("begin_step", 0)
    if canon == "polynomial":
        kwargs.setdefault("initial", 0.0)
        kwargs.setdefault("begin_step", 0)
        if kind == "cubic" and kwargs.setdefault("power", 3) != 3:
            raise ConfigError(
                "schedule 'cubic' has power 3; use type 'polynomial' for another power"
            )
    missing = [f.name for f in fields(cls) if f.name not in kwargs and f.default is MISSING]
    if missing:
        raise ConfigError(f"schedule {kind!r}: missing {', '.join(missing)}")
    for name, value in kwargs.items():
        if isinstance(value, bool) or (value is not None and not isinstance(value, (int, float))):
            raise ConfigError(f"schedule {kind!r}: {name} must be a number, got {value!r}")
    return cls(**kwargs)


# ---------------------------------------------------------------- wiring one sparsifier's schedules


DEFAULT_INTERVAL = 100
"""RigL's dT (Evci et al. 2020, section 4): steps between mask updates unless a run is short."""


def default_interval(total_steps: int) -> int:
    """Steps between mask updates when none is given: RigL's 100, or a quarter of the run for
    runs under 400 steps (which then see at most three updates).

    A regrown weight starts at 0 with zero AdamW moments; with fewer steps than this before the
    next update it has no time to grow past the weights it competes with, and is dropped again.

    >>> default_interval(10_000), default_interval(600), default_interval(200), default_interval(2)
    (100, 100, 50, 1)
    """
    return max(1, min(DEFAULT_INTERVAL, int(total_steps) // 4))


def update_window(
    total_steps: int,
    freq: int | None = None,
    start: int | None = None,
    stop: int | None = None,
    *,
    warmup: int = 0,
    stop_fraction: float = 0.75,
) -> tuple[int, int, int]:
    """(freq, start, stop) of mask updates, each given value kept. Defaults:

    - ``freq``: :func:`default_interval` (100 steps; a quarter of the run under 400 steps);
    - ``start``: the end of the LR warm-up or one interval, whichever is later (so no update falls
      inside the warm-up); when that leaves no update before ``stop``, one interval;
    - ``stop``: ``stop_fraction`` of the run (RigL's T_end = 75%; SET and GraNet's regrowth: 1.0).

    >>> update_window(10_000)
    (100, 100, 7500)
    >>> update_window(600, warmup=100), update_window(600, warmup=150, stop_fraction=1.0)
    ((100, 100, 450), (100, 150, 600))
    >>> update_window(60, warmup=100), update_window(60, freq=5, stop=50)
    ((15, 15, 45), (5, 5, 50))
    """
    freq = int(freq) if freq is not None else default_interval(total_steps)
    stop = int(stop) if stop is not None else int(stop_fraction * total_steps)
    if start is None:
        start = max(freq, int(warmup))
        if start >= stop:
            start = freq
    return freq, int(start), stop


@dataclass(frozen=True)
class Wiring:
    """Every schedule of one sparsifier in one run, made by :func:`wire`: the target sparsity, the
    mask-update steps and the drop fraction of an update.

    ``final_update`` is one more update step off the ``updates`` grid: a ramp (GMP, GraNet)
    updates at its end step so that the final sparsity is reached exactly.

    >>> w = Wiring(Constant(0.5), Periodic(10, 10, 35), final_update=35)
    >>> [t for t in range(50) if w.is_update_step(t)]
    [10, 20, 30, 35]
    """

    sparsity: Schedule
    updates: Periodic | None = None
    drop_fraction: Schedule = Constant(0.0)
    final_update: int | None = None

    def is_update_step(self, step: int) -> bool:
        return (self.updates is not None and bool(self.updates(step))) or step == self.final_update


def _drop_schedule(spec: Any, stop: int, decay: str) -> Schedule:
    """A number is SET's constant zeta (``decay="constant"``) or RigL's alpha, cosine-decayed to 0
    at the update stop (``decay="cosine"``); a schedule mapping is built as given, except that a
    cosine without an end defaults to the update stop (Model Zoo configs give half_period = stop).
    """
    if isinstance(spec, Real) and not isinstance(spec, bool):
        if decay == "cosine":
            return Cosine(start=float(spec), end=0.0, begin_step=0, end_step=stop)
        return Constant(float(spec))
    if (
        isinstance(spec, Mapping)
        and str(spec.get("type", "")).lower() == "cosine"
        and not {"end_step", "half_period"} & set(spec)
    ):
        spec = {**spec, "end_step": stop}
    return build_schedule(spec)


def wire(
    name: str,
    total_steps: int,
    sparsity: Any,
    *,
    updates: bool = False,
    ramp_from: float | None = None,
    drop_fraction: Any = None,
    drop_decay: str = "constant",
    update_freq: int | None = None,
    update_start: int | None = None,
    update_stop: int | None = None,
    warmup: int = 0,
    stop_fraction: float = 0.75,
    regrow_to_end: bool = False,
) -> Wiring:
    """The one place where an algorithm's declarations become schedules, once ``total_steps`` is
    known. ``name`` is the algorithm (for messages).

    - ``updates``: the masks update every ``freq`` steps in ``[start, stop)``
      (:func:`update_window`, which reads ``warmup`` and ``stop_fraction`` for the defaults).
    - ``ramp_from``: with a number ``sparsity``, it rises on Zhu & Gupta's cubic from ``ramp_from``
      at ``start`` to ``sparsity`` at ``stop`` (GMP, GraNet), with a last update at ``stop``.
      A ``sparsity`` schedule is used as given (the last update at ``stop`` stays).
    - ``drop_fraction``: the fraction swapped at an update (None: no drop-and-grow), a number made
      a schedule as ``drop_decay`` says (``constant`` or ``cosine`` to the update stop).
    - ``regrow_to_end`` (GraNet): the ramp ends at ``stop``, but drop-and-grow updates go on every
      ``freq`` steps to the end of the run, the drop fraction decaying over the whole run.

    >>> wire("rigl", 10_000, 0.9, updates=True, drop_fraction=0.3, drop_decay="cosine")
    Wiring(sparsity=Constant(value=0.9), updates=Periodic(every=100, begin_step=100, end_step=7500),
    drop_fraction=Cosine(start=0.3, end=0.0, begin_step=0, end_step=7500), final_update=None)
    >>> wire("gmp", 200, 0.8, updates=True, ramp_from=0.0, update_start=0, update_stop=100).sparsity
    Polynomial(initial=0.0, final=0.8, begin_step=0, end_step=100, power=3)
    >>> w = wire("granet", 1000, 0.8, updates=True, ramp_from=0.0, drop_fraction=0.3,
    ...          drop_decay="cosine", regrow_to_end=True)
    >>> w.updates, w.drop_fraction.end_step, w.final_update
    (Periodic(every=100, begin_step=100, end_step=1000), 1000, 750)
    """
    if not updates:
        return Wiring(build_schedule(sparsity))
    freq, start, stop = update_window(
        total_steps,
        update_freq,
        update_start,
        update_stop,
        warmup=warmup,
        stop_fraction=stop_fraction,
    )
    if stop <= start:
        raise ConfigError(
            f"{name}: update stop ({stop}) must be after start ({start}); "
            f"with {total_steps} training steps set update.start/update.stop explicitly"
        )
    is_number = isinstance(sparsity, Real) and not isinstance(sparsity, bool)
    if ramp_from is not None and is_number:
        if float(sparsity) < ramp_from:
            raise ConfigError(
                f"{name}: final sparsity {sparsity} is below initial_sparsity {ramp_from}; "
                "pruning never revives weights"
            )
        level: Schedule = Polynomial(ramp_from, float(sparsity), start, stop, power=3)
    else:
        level = build_schedule(sparsity)
    update_end = max(stop, int(total_steps)) if regrow_to_end else stop
    return Wiring(
        sparsity=level,
        updates=Periodic(freq, start, update_end),
        drop_fraction=(
            Constant(0.0)
            if drop_fraction is None
            else _drop_schedule(drop_fraction, update_end, drop_decay)
        ),
        final_update=stop if ramp_from is not None else None,
    )
