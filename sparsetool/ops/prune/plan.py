"""prune, step 1: decide everything before the first byte of the output is written.

:func:`plan_prune` opens the checkpoint, makes the target plan (the one decision of which tensors
are pruned), refuses what cannot work (nothing targeted, an encoding's name already taken), picks
the planner for the method and runs its :meth:`~sparsetool.ops.prune.planner.Planner.prepare`.
The result, a :class:`PrunePlan`, is what :func:`sparsetool.ops.prune.write.write_pruned` needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparsetool.checkpoint.encodings import encoded_specs
from sparsetool.checkpoint.reader import Checkpoint, LogicalTensor, open_checkpoint
from sparsetool.errors import SparsetoolError
from sparsetool.ops.prune.magnitude import MagnitudePlanner
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.planner import BlockOrderPlanner, FileOrderPlanner
from sparsetool.ops.prune.read import recorded_nan_encoding
from sparsetool.targets import TargetPlan, plan_targets
from sparsetool.targets.order import sort_names
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural, some_names

__all__ = ["PrunePlan", "plan_prune", "checkpoint_plan", "targeted_tensors", "dtype_skipped_note"]


@dataclass
class PrunePlan:
    """What prune decided before writing: the input, the options (with any default the planner
    settled, e.g. the calibration window length), the targets and the prepared planner."""

    ckpt: Checkpoint
    opts: PruneOptions
    targeting: TargetPlan
    targets: list[LogicalTensor]
    planner: FileOrderPlanner | BlockOrderPlanner
    notes: list[str] = field(default_factory=list)
    memory: MemoryPlan | None = None  # calibration methods: the memory plan, checked to fit
    allocation: list[dict] | None = (
        None  # --allocation owl: each block's outlier ratio and sparsity
    )
    experts: bool = False  # a mixture of experts' matrices pruned from their routed tokens

    @property
    def target_names(self) -> set[str]:
        return {lt.name for lt in self.targets}


def checkpoint_plan(
    ckpt: Checkpoint, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> TargetPlan:
    """The targeting plan of an open checkpoint (its logical tensors and ``config.json``)."""
    return plan_targets(ckpt.logical, ckpt.config, include, exclude, source=ckpt.path.name)


def targeted_tensors(
    ckpt: Checkpoint,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    plan: TargetPlan | None = None,
) -> list[LogicalTensor]:
    """The logical tensors ``prune`` would change, in file order."""
    if plan is None:
        plan = checkpoint_plan(ckpt, include, exclude)
    return [lt for lt in ckpt.logical if plan[lt.name].targeted]


def plan_prune(
    src: str | Path,
    opts: PruneOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> PrunePlan:
    """Open ``src``, decide its targets and prepare the planner (the first passes, or for a
    calibration method the checks, the model and the memory plan, which ``on_plan`` hears before
    the read of every targeted tensor)."""
    opts.validate()
    ckpt = open_checkpoint(src)
    targeting = checkpoint_plan(ckpt, opts.include, opts.exclude)  # the one targeting decision
    targets = targeted_tensors(ckpt, plan=targeting)
    if not targets:
        raise _nothing_targeted(src, opts, targeting)
    _check_name_clashes(ckpt, targets, opts.encoding)
    notes: list[str] = []
    memory = allocation = None
    experts = False
    planner: FileOrderPlanner | BlockOrderPlanner
    if opts.calibrated:  # Wanda, SparseGPT, OWL, DSnoT: block by block (calibrated.py)
        from sparsetool.ops.prune.calibrated import CalibratedPlanner

        calibrated = CalibratedPlanner(
            ckpt,
            targets,
            opts,
            targeting,
            nan_ok=recorded_nan_encoding(ckpt),
            progress=progress,
            on_plan=on_plan,
        )
        calibrated.prepare()
        opts = calibrated.options  # with the window length used
        notes += calibrated.notes
        memory = calibrated.memory
        allocation = calibrated.allocation
        experts = calibrated.has_experts
        planner = calibrated
    else:
        planner = MagnitudePlanner(ckpt, targets, opts, targeting, progress=progress)
        planner.prepare()
    note = dtype_skipped_note(targeting)
    if note:
        notes.append(note)
    return PrunePlan(
        ckpt=ckpt,
        opts=opts,
        targeting=targeting,
        targets=targets,
        planner=planner,
        notes=notes,
        memory=memory,
        allocation=allocation,
        experts=experts,
    )


def _dtypes(plan: TargetPlan, names: Sequence[str]) -> str:
    return "/".join(sorted({plan[n].dtype for n in names}))


def dtype_skipped_note(plan: TargetPlan) -> str | None:
    """One line naming the tensors left alone only for their integer or bool dtype, or None."""
    skipped = sort_names(plan.dtype_skipped)
    if not skipped:
        return None
    return (
        f"{plural(len(skipped), 'tensor')} left unpruned for "
        f"{'its' if len(skipped) == 1 else 'their'} {_dtypes(plan, skipped)} dtype (only "
        f"floating-point weights are pruned): {some_names(skipped)}"
    )


def _nothing_targeted(src: str | Path, opts: PruneOptions, plan: TargetPlan) -> SparsetoolError:
    skipped = sort_names(plan.dtype_skipped)
    if skipped:
        return SparsetoolError(
            f"{src}: no tensor is targeted: {plural(len(skipped), 'tensor')} that would be "
            f"({some_names(skipped)}) {'is' if len(skipped) == 1 else 'are'} "
            f"{_dtypes(plan, skipped)}, not floating-point, and integer or bool weights cannot "
            "be pruned; prune the floating-point checkpoint before quantizing it"
        )
    if opts.include:
        return SparsetoolError(
            f"{src}: --include {' '.join(opts.include)} matches no floating-point tensor with 2 "
            "or more dimensions (1-D, integer and _mask tensors are never pruned); run "
            "'sparsetool report' to see the names, shapes and dtypes"
        )
    return SparsetoolError(
        f"{src}: no tensor is targeted (attention/FFN weights inside transformer blocks); "
        "name the tensors with --include GLOB, or run 'sparsetool report' to see the roles"
    )


def _check_name_clashes(ckpt: Checkpoint, targets: list[LogicalTensor], encoding: str) -> None:
    """An encoding must not write a name that another tensor of the checkpoint already uses."""
    target_names = {lt.name for lt in targets}
    taken: dict[str, str] = {}
    for lt in ckpt.logical:
        if lt.name in target_names:
            continue
        for name in lt.stored:
            taken[name] = lt.name
    for lt in targets:
        for spec in encoded_specs(lt.name, lt.st_dtype, tuple(lt.shape), 0, encoding):
            if spec.name in taken:
                raise SparsetoolError(
                    f"{ckpt.path}: encoding {encoding!r} of {lt.name!r} would write "
                    f"{spec.name!r}, but the checkpoint already holds a tensor of that name; "
                    "rename or drop it, exclude the weight with --exclude, or pick another "
                    "--encoding"
                )
