"""A simulation's result as a record: :class:`SimulationResult`, what ``sparsetool.simulate``
returns and ``sparsetool simulate`` renders; its :meth:`~SimulationResult.to_json` is what
``simulate --json`` prints (:func:`~sparsetool.hardware.request.run_simulation`'s keys)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparsetool.checkpoint.output_files import Reclaimed
from sparsetool.hardware.request import RESULT_KEYS

__all__ = ["SimulationResult"]


@dataclass
class SimulationResult:
    """One ``simulate`` request's result. ``runs``: one row per sparsity (the theoretical
    speed-up and each device's); ``workload`` (what was simulated: its label, source, tokens,
    targeted sparsity, notes; with a checkpoint its ``targeting``), ``devices`` (each device's
    forward and training-step time, speed-up and breakdown, or why it refused) and ``layers``
    (each layer's shape, sparsity, busiest core group and speed-ups) describe the last run;
    ``nm_point`` (a sweep of a random ``shape``: the 2:4 cores on a 2:4 mask of it), ``plot``
    (the PNG written) and ``verify`` (the zero-skipping schedule executed and compared with the
    dense masked matmul) are None when not asked. ``reclaimed``: the temporaries of killed runs
    removed beside ``plot`` (not part of the JSON)."""

    workload: dict[str, Any]
    runs: list[dict[str, Any]]
    devices: list[dict[str, Any]]
    layers: list[dict[str, Any]]
    nm_point: dict[str, Any] | None = None
    plot: str | None = None
    verify: dict[str, Any] | None = None
    reclaimed: list[Reclaimed] = field(default_factory=list)

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> SimulationResult:
        """The record of :func:`~sparsetool.hardware.request.run_simulation`'s result (its
        ``reclaimed`` too)."""
        return cls(
            **{key: result[key] for key in RESULT_KEYS},
            reclaimed=list(getattr(result, "reclaimed", [])),
        )

    def to_json(self) -> dict[str, Any]:
        """What ``simulate --json`` prints: :data:`~sparsetool.hardware.request.RESULT_KEYS`, in
        that order."""
        return {key: getattr(self, key) for key in RESULT_KEYS}

    @property
    def sweep(self) -> bool:
        """Several sparsities (a list, ``sweep``, or ``plot``): one speed-up row each."""
        return len(self.runs) > 1

    @property
    def verified(self) -> bool | None:
        """Whether the executed schedule equals the dense masked matmul (None: not verified)."""
        return bool(self.verify["equal"]) if self.verify else None
