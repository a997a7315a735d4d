"""The resolved settings of a sparsifier: every default filled in, as ``run.json`` records them
and the start of a run prints them."""

from __future__ import annotations

from typing import Any

from sparsetool.train.schedules import Constant, Cosine

__all__ = ["resolved", "describe"]


def resolved(sp: Any) -> dict[str, Any]:
    """Every setting of this sparsifier with its defaults filled in, as ``run.json`` and the
    start of a run show them (after :meth:`~.base.Sparsifier.attach`)."""
    out: dict[str, Any] = {
        "algorithm": sp.name,
        "distribution": sp.distribution,
        "init_method": sp.init_method,
    }
    if getattr(sp, "mask_origin", None):  # set by the trainer: --init's masks, not made here
        out["initial_mask"] = sp.mask_origin
    out["sparsity"] = sp.sparsity_level  # a number or the schedule mapping as given
    if sp.RAMP:
        out["initial_sparsity"] = float(sp.initial_sparsity)
    if hasattr(sp, "scope"):
        out["scope"] = sp.scope
    w = sp.schedules
    if w is not None and w.updates is not None:
        out["update_freq"] = w.updates.every
        out["update_start"] = w.updates.begin_step
        out["update_stop"] = w.final_update if w.final_update is not None else w.updates.end_step
        if sp.REGROW_TO_END:
            out["regrow_stop"] = w.updates.end_step
    if sp.DROP_DECAY and w is not None:
        d = w.drop_fraction
        out["drop_fraction"] = float(d(0))
        out["drop_decay"] = (
            f"cosine to {d.end:g} at step {d.end_step}"
            if isinstance(d, Cosine)
            else "constant"
            if isinstance(d, Constant)
            else repr(d)
        )
    return out


def describe(settings: dict[str, Any]) -> list[str]:
    """The lines the start of a run prints for :func:`resolved` settings.

    >>> describe(
    ...     {
    ...         "algorithm": "rigl",
    ...         "sparsity": 0.75,
    ...         "distribution": "uniform",
    ...         "init_method": "random",
    ...         "update_freq": 100,
    ...         "update_start": 100,
    ...         "update_stop": 450,
    ...         "drop_fraction": 0.3,
    ...         "drop_decay": "cosine to 0 at step 450",
    ...     }
    ... )
    ['sparse training: rigl, sparsity 75% (uniform), random initial mask', 'mask updates: every 100
    steps from step 100 until step 450; drop fraction 0.3, cosine to 0 at step 450']
    >>> describe({"algorithm": "static", "sparsity": 0.5, "distribution": "uniform", "init_method":
    ...           "random", "initial_mask": "from --init m.safetensors (its stored masks), kept"})
    ['sparse training: static, sparsity 50% (uniform), initial mask from --init m.safetensors (its
    stored masks), kept']
    >>> describe({"algorithm": "static", "sparsity": 0.0003, "distribution": "uniform",
    ...           "init_method": "random"})
    ['sparse training: static, sparsity 0.03% (uniform), random initial mask']
    """
    level = settings.get("sparsity")
    what = f"{level:.0%}" if isinstance(level, (int, float)) else str(level)
    if isinstance(level, (int, float)) and 0 < level < 0.01:  # a few zeros: not "0%"
        what = f"{level:.2%}"
    if "initial_sparsity" in settings:
        what = f"{settings['initial_sparsity']:.0%} -> {what}"
    lines = [
        f"sparse training: {settings['algorithm']}, sparsity {what} "
        f"({settings['distribution']}"
        f"{', ' + settings['scope'] + ' pruning' if 'scope' in settings else ''}), "
        + (
            f"initial mask {settings['initial_mask']}"
            if settings.get("initial_mask")
            else f"{settings['init_method']} initial mask"
        )
    ]
    if "update_freq" in settings:
        line = (
            f"mask updates: every {settings['update_freq']} steps from step "
            f"{settings['update_start']} until step {settings['update_stop']}"
        )
        if "regrow_stop" in settings:
            line += f", then drop-and-grow until step {settings['regrow_stop']}"
        if "drop_fraction" in settings:
            line += f"; drop fraction {settings['drop_fraction']:g}, {settings['drop_decay']}"
        lines.append(line)
    return lines
