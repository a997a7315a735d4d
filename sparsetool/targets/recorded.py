"""The targeting a checkpoint records: read-only commands plan with the globs prune was given.

``sparsetool prune --include/--exclude`` records its globs in the checkpoint's ``sparsetool``
metadata entry (:mod:`sparsetool.checkpoint.provenance`). A command that only reads a pruned
checkpoint (``report``, ``simulate``, ``flops --checkpoint``) plans its targets with
:func:`plan_checkpoint_targets`, whose rule is, first match wins:

1. globs given now (``include``/``exclude`` not empty): those, and the record is ignored;
2. ``default_targets=True``: the built-in roles, and the record is ignored;
3. the globs of the newest recorded ``prune`` step, when it had any: the same tensors count as
   targeted as prune pruned (the plan says so in :attr:`TargetPlan.recorded_by`);
4. otherwise the built-in roles.

A recorded glob that matches no tensor of the file (the file was renamed or edited since) is an
error, as a glob given now would be, saying that it came from the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sparsetool.checkpoint.provenance import read_provenance
from sparsetool.errors import ConfigError
from sparsetool.targets import TargetPlan, plan_targets

RECORDING_COMMANDS = ("prune",)
"""Commands whose recorded ``include``/``exclude`` are the checkpoint's targeting."""


def recorded_globs(
    metadata: Mapping[str, str] | None,
) -> tuple[str, tuple[str, ...], tuple[str, ...]] | None:
    """``(command, include, exclude)`` of the newest recorded step that targeted with globs, or
    None (no entry, or the newest prune used the built-in roles).

    >>> from sparsetool.checkpoint.provenance import provenance_metadata
    >>> md = provenance_metadata(None, {"command": "prune", "include": ["*wte*"], "exclude": []})
    >>> recorded_globs(provenance_metadata(md, {"command": "densify"}))
    ('prune', ('*wte*',), ())
    >>> recorded_globs(provenance_metadata(md, {"command": "prune", "include": [], "exclude": []}))
    """
    entry = read_provenance(metadata)
    if entry is None:
        return None
    history = entry.get("history")
    steps = [entry] + (list(reversed(history)) if isinstance(history, list) else [])
    for step in steps:
        if not isinstance(step, dict) or step.get("command") not in RECORDING_COMMANDS:
            continue
        globs = []
        for key in ("include", "exclude"):
            value = step.get(key) or ()
            if isinstance(value, str):
                value = (value,)
            globs.append(tuple(str(g) for g in value if isinstance(g, str) and g))
        if not any(globs):
            return None
        return str(step["command"]), globs[0], globs[1]
    return None


def plan_checkpoint_targets(
    tensors: Mapping[str, tuple[Sequence[int], Any]] | Iterable[Any],
    config: Mapping[str, Any] | None,
    metadata: Mapping[str, str] | None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    default_targets: bool = False,
    source: str = "the checkpoint",
) -> TargetPlan:
    """:func:`~sparsetool.targets.plan_targets` for a checkpoint that may record its targeting.

    ``metadata`` is the checkpoint's safetensors metadata (first shard); see the module
    docstring for which globs are used. The plan's ``recorded_by`` names the command whose record
    supplied the globs (None when they were given, or the built-in roles were used).

    >>> from sparsetool.checkpoint.provenance import provenance_metadata
    >>> md = provenance_metadata(None, {"command": "prune", "include": ["wte.*"], "exclude": []})
    >>> tensors = {"wte.weight": ((50, 8), "F32"), "h.0.mlp.c_fc.weight": ((8, 32), "F32")}
    >>> plan = plan_checkpoint_targets(tensors, None, md)
    >>> plan.targeted, plan.recorded_by, plan.include
    (['wte.weight', 'h.0.mlp.c_fc.weight'], 'prune', ('wte.*',))
    >>> plan_checkpoint_targets(tensors, None, md, default_targets=True).targeted
    ['h.0.mlp.c_fc.weight']
    """
    if include or exclude or default_targets:
        return plan_targets(tensors, config, include, exclude, source=source)
    recorded = recorded_globs(metadata)
    if recorded is None:
        return plan_targets(tensors, config, source=source)
    command, rec_include, rec_exclude = recorded
    try:
        plan = plan_targets(tensors, config, rec_include, rec_exclude, source=source)
    except ConfigError as e:
        raise ConfigError(
            f"the targeting {command} recorded in {source} no longer fits it: {e}; "
            "pass your own --include/--exclude, or --default-targets for the "
            "built-in roles"
        ) from None
    plan.recorded_by = command
    return plan


def targeting_summary(plan: TargetPlan) -> dict[str, Any]:
    """What a command reports about its targeting: ``{"rule", "include", "exclude", "note",
    "tied_head"}``, the rule being ``"recorded by prune"``, ``"given"`` or ``"default"``, the note
    :func:`recorded_note`'s line (None unless the globs came from the record), ``tied_head`` the
    embedding that is also the LM head (:func:`sparsetool.targets.tied_embedding`) or None.

    >>> targeting_summary(plan_targets({"wte.weight": ((50, 8), "F32")}))
    {'rule': 'default', 'include': [], 'exclude': [], 'note': None, 'tied_head': None}
    """
    if plan.recorded_by:
        rule = f"recorded by {plan.recorded_by}"
    else:
        rule = "given" if plan.include or plan.exclude else "default"
    return {
        "rule": rule,
        "include": list(plan.include),
        "exclude": list(plan.exclude),
        "note": recorded_note(plan),
        "tied_head": plan.tied_head,
    }


def recorded_note(plan: TargetPlan) -> str | None:
    """One line saying the targets came from the checkpoint's record, or None when they did not.

    >>> from sparsetool.checkpoint.provenance import provenance_metadata
    >>> md = provenance_metadata(
    ...     None, {"command": "prune", "include": ["wte.*"], "exclude": ["h.1.*"]}
    ... )
    >>> tensors = {"wte.weight": ((50, 8), "F32"), "h.1.mlp.c_fc.weight": ((8, 32), "F32")}
    >>> recorded_note(plan_checkpoint_targets(tensors, None, md))
    "targets as recorded by prune: --include 'wte.*' --exclude 'h.1.*'"
    """
    if not plan.recorded_by:
        return None
    globs = [f"--include '{g}'" for g in plan.include] + [f"--exclude '{g}'" for g in plan.exclude]
    return f"targets as recorded by {plan.recorded_by}: {' '.join(globs)}"


__all__ = [
    "RECORDING_COMMANDS",
    "recorded_globs",
    "plan_checkpoint_targets",
    "targeting_summary",
    "recorded_note",
]
