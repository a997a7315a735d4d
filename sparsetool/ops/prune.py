"""Streaming pruning of a whole checkpoint: ``sparsetool prune``.

The checkpoint never sits in memory: each targeted tensor is read, masked and written on its own.
Some options need to know something about every tensor before the first byte is written, so the
work is done in passes over the file (the second read comes from the page cache):

* layer scope, ``--sparsity``, encodings zeros/mask/nan: one pass (read, mask, write);
* ``--fraction`` or the ``bitmask`` encoding: a first pass counts non-zeros (the bitmask header
  holds the size of each ``compressed`` tensor, so it must be known before writing);
* ``--scope global``: a first pass builds |w| histograms to find the one exact threshold
  (a second, rarely needed, refines it for fp16/fp32), then the writing pass.

Pruning composes: a weight that is already pruned (zero, NaN sentinel, masked or missing from a
bitmask) is never revived.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Sequence

import torch

from sparsetool.checkpoint import (
    bitmask_sparsity_config,
    drop_sparsity_config,
    Checkpoint,
    LogicalTensor,
    TensorSpec,
    encode,
    encoded_specs,
    open_checkpoint,
    write_checkpoint,
)
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.checkpoint.writer import CheckpointWriter, ShardWriter
from sparsetool.masks.distributions import keep_counts
from sparsetool.util.options import CALIBRATION_METHODS
from sparsetool.errors import SparsetoolError
from sparsetool.masks.select import (
    MagnitudeHistogram,
    apply_threshold,
    fraction_keep,
    global_threshold_plan,
    magnitude_mask,
    nm_mask,
    random_mask,
)
from sparsetool.targets import TargetPlan, plan_targets
from sparsetool.targets.order import sort_names, tensor_sort_key
from sparsetool.util.wording import plural, some_names
from sparsetool.checkpoint.zeros import count_nonzero
from sparsetool.util.memory import MemoryPlan
from sparsetool.ops.prune_input import read_alive, recorded_nan_encoding
from sparsetool.ops.prune_stream import Scanned, stream_plan, stream_top, streams
from sparsetool.ops.prune_options import (
    LOADER_WARNINGS,
    PruneOptions,
    PruneResult,
    TensorResult,
    options_record,
)

Progress = Callable[[str, int, int], None]
"""Called as ``progress(stage, done, total)`` after each tensor of a pass."""


def checkpoint_plan(ckpt: Checkpoint, include: Sequence[str] = (),
                    exclude: Sequence[str] = ()) -> TargetPlan:
    """The targeting plan of an open checkpoint (its logical tensors and ``config.json``)."""
    return plan_targets(ckpt.logical, ckpt.config, include, exclude, source=ckpt.path.name)


def targeted_tensors(ckpt: Checkpoint, include: Sequence[str] = (), exclude: Sequence[str] = (),
                     *, plan: TargetPlan | None = None) -> list[LogicalTensor]:
    """The logical tensors ``prune`` would change, in file order."""
    if plan is None:
        plan = checkpoint_plan(ckpt, include, exclude)
    return [lt for lt in ckpt.logical if plan[lt.name].targeted]


class _Planner:
    """Decides each targeted tensor's mask. Layer scope needs nothing global; the rest is
    prepared by :meth:`prepare` in a first pass."""

    def __init__(self, ckpt: Checkpoint, targets: list[LogicalTensor], opts: PruneOptions,
                 progress: Progress | None, plan: TargetPlan):
        self.ckpt, self.targets, self.opts, self.progress = ckpt, targets, opts, progress
        self.target_plan = plan
        self._index = {lt.name: i for i, lt in enumerate(targets)}
        self.keep: dict[str, int] = {}
        self.plan: dict | None = None
        self.nonzero_after: dict[str, int] = {}
        self.nonzero_before: dict[str, int] = {}
        # NaN already in the input is a sentinel only if the input says it was written as one.
        self.nan_ok = recorded_nan_encoding(ckpt)
        self.plain: set[str] = set()  # global scope: plain finite tensors (zeros the only pruned)
        if opts.sparsity is not None and opts.scope == "layer":
            shapes = {lt.name: tuple(lt.shape) for lt in targets}
            self.keep = keep_counts(shapes, opts.sparsity, opts.distribution)

    @property
    def needs_first_pass(self) -> bool:
        o = self.opts
        return o.fraction is not None or o.scope == "global" or o.encoding == "bitmask"

    def prepare(self) -> None:
        o = self.opts
        hists: list = []
        total_nnz = 0
        for i, lt in enumerate(self.targets):
            if o.scope == "global" and self._streams(lt) and lt.dtype in (torch.bfloat16, torch.float32):
                scanned = Scanned(self.ckpt, lt)  # one pass: histogram, zeros, inf/NaN
                if scanned.finite:  # its zeros are the only weights already pruned
                    self.plain.add(lt.name)
                    self.nonzero_before[lt.name] = scanned.nonzero
                    total_nnz += scanned.nonzero
                    hists.append(MagnitudeHistogram.of_scan(scanned.found, lt.dtype))
                    if self.progress:
                        self.progress("scan", i + 1, len(self.targets))
                    continue
            dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
            nnz = count_nonzero(existing)
            self.nonzero_before[lt.name] = nnz
            total_nnz += nnz
            if o.scope == "global":
                hists.append(MagnitudeHistogram.of(dense, existing))
            elif o.fraction is not None:
                self.keep[lt.name] = fraction_keep(nnz, o.fraction)
            if o.encoding == "bitmask" and o.scope == "layer":
                # The compressed size goes into the header, so count the result now.
                self.nonzero_after[lt.name] = count_nonzero(self._mask(lt, dense, existing))
            if self.progress:
                self.progress("scan", i + 1, len(self.targets))
        if o.scope == "global":
            numel = sum(lt.numel for lt in self.targets)
            if o.fraction is not None:
                total_keep = fraction_keep(total_nnz, o.fraction)
            else:
                total_keep = numel - round(o.sparsity * numel)
            self.plan = self._global_plan(hists, total_keep)
            if o.encoding == "bitmask":
                for lt in self.targets:
                    dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
                    self.nonzero_after[lt.name] = count_nonzero(self._mask(lt, dense, existing))

    def _global_plan(self, hists: list, total_keep: int):
        plan = global_threshold_plan(hists, total_keep)
        if not plan.done:
            # The boundary bucket holds distinct fp16/fp32 values: re-read only the tensors that
            # have entries in it.
            fine = {}
            for i in plan.refine:
                dense, existing = read_alive(self.ckpt, self.targets[i], nan_means_pruned=self.nan_ok)
                fine[i] = MagnitudeHistogram.of(dense, existing, refine=plan.refine_bucket)
                if self.progress:
                    self.progress("refine", len(fine), len(plan.refine))
            plan = global_threshold_plan(hists, total_keep, refined=fine)
        return plan

    def _mask(self, lt: LogicalTensor, dense: torch.Tensor, existing: torch.Tensor) -> torch.Tensor:
        o = self.opts
        if o.nm is not None:
            n, m = o.nm
            entry = self.target_plan[lt.name]
            if entry.layout not in ("linear", "conv1d"):
                # Stacked experts are stored (experts, out, in) by some models and (experts, in,
                # out) by others: the input dimension cannot be told from the name and shape.
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: --nm needs the input dimension, which "
                    "is ambiguous for a stacked (3-D) tensor; leave it out with --exclude "
                    f"'{lt.name}' or prune it without --nm"
                )
            try:
                return nm_mask(dense, n, m, dim=entry.input_dim, existing=existing)
            except SparsetoolError as e:
                raise SparsetoolError(f"tensor {lt.name!r} {list(lt.shape)}: {e}") from None
        if o.scope == "global":
            index = self._index[lt.name]
            return apply_threshold(dense, self.plan.tensors[index], existing)
        keep = self._layer_keep(lt)
        if o.method == "random":
            gen = torch.Generator().manual_seed(_tensor_seed(o.seed, lt.name))
            return random_mask(tuple(lt.shape), keep=keep, existing=existing, generator=gen)
        return magnitude_mask(dense, keep=keep, existing=existing)

    def _streams(self, lt: LogicalTensor) -> bool:
        o = self.opts
        return o.method == "magnitude" and o.nm is None and streams(lt, o.encoding)

    def stream(self, lt: LogicalTensor, sw: ShardWriter) -> tuple[int, int] | None:
        """Write ``lt`` by the fast path (``ops/prune_stream.py``): (non-zeros before, kept), or
        None, having written nothing, when the general path must take it."""
        if not self._streams(lt):
            return None
        if self.opts.scope == "layer":
            return stream_top(self.ckpt, lt, sw, self._layer_keep(lt), self.opts.encoding)
        if lt.name in self.plain:  # global scope, scanned by prepare
            plan = self.plan.tensors[self._index[lt.name]]
            kept = stream_plan(self.ckpt, lt, sw, plan, self.opts.encoding)
            return self.nonzero_before[lt.name], kept
        return None

    def _layer_keep(self, lt: LogicalTensor) -> int:
        keep = self.keep.get(lt.name)
        if keep is None:  # layer scope --sparsity (--fraction always has a first pass)
            keep = lt.numel - round(self.opts.sparsity * lt.numel)
        return keep

    def mask(self, lt: LogicalTensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        dense, existing = read_alive(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        mask = self._mask(lt, dense, existing)
        before = self.nonzero_before.get(lt.name)
        if before is None:
            before = count_nonzero(existing)
        return dense, mask, before


def _spec(ckpt: Checkpoint, name: str) -> TensorSpec:
    e = ckpt.entry(name)
    return TensorSpec(name, e.dtype, tuple(e.shape))


def _dtypes(plan: TargetPlan, names: Sequence[str]) -> str:
    return "/".join(sorted({plan[n].dtype for n in names}))


def dtype_skipped_note(plan: TargetPlan) -> str | None:
    """One line naming the tensors left alone only for their integer or bool dtype, or None."""
    skipped = sort_names(plan.dtype_skipped)
    if not skipped:
        return None
    return (f"{plural(len(skipped), 'tensor')} left unpruned for {'its' if len(skipped) == 1 else 'their'} "
            f"{_dtypes(plan, skipped)} dtype (only floating-point weights are pruned): "
            f"{some_names(skipped)}")


def _tensor_seed(seed: int, name: str) -> int:
    """A per-tensor seed that depends only on (seed, name): same masks whatever the file order."""
    import zlib

    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1)


def prune_checkpoint(src: str | Path, out: str | Path, opts: PruneOptions, *,
                     in_place: bool = False, progress: Progress | None = None,
                     on_plan: Callable[[MemoryPlan], None] | None = None) -> PruneResult:
    """Prune the targeted tensors of checkpoint ``src`` into ``out`` (same layout), streaming.

    With a calibration method, ``on_plan`` is called with the memory plan once it is made,
    before the long part (a plan that cannot fit raises instead)."""
    opts.validate()
    ckpt = open_checkpoint(src)
    plan = checkpoint_plan(ckpt, opts.include, opts.exclude)  # the one targeting decision
    targets = targeted_tensors(ckpt, plan=plan)
    if not targets:
        skipped = sort_names(plan.dtype_skipped)
        if skipped:
            raise SparsetoolError(
                f"{src}: no tensor is targeted: {plural(len(skipped), 'tensor')} that would be "
                f"({some_names(skipped)}) {'is' if len(skipped) == 1 else 'are'} "
                f"{_dtypes(plan, skipped)}, not floating-point, and integer or bool weights cannot "
                "be pruned; prune the floating-point checkpoint before quantizing it"
            )
        if opts.include:
            raise SparsetoolError(
                f"{src}: --include {' '.join(opts.include)} matches no floating-point tensor with 2 "
                "or more dimensions (1-D, integer and _mask tensors are never pruned); run "
                "'sparsetool report' to see the names, shapes and dtypes"
            )
        raise SparsetoolError(
            f"{src}: no tensor is targeted (attention/FFN weights inside transformer blocks); "
            "name the tensors with --include GLOB, or run 'sparsetool report' to see the roles"
        )
    _check_name_clashes(ckpt, targets, opts.encoding)
    result = PruneResult(output=Path(out), options=opts)
    if opts.method in CALIBRATION_METHODS:  # Wanda, SparseGPT: block by block (ops/calibrate.py)
        from sparsetool.ops.calibrate import CalibratedPlanner

        calibrated = CalibratedPlanner(ckpt, targets, opts, plan, nan_ok=recorded_nan_encoding(ckpt),
                                       progress=progress)
        calibrated.prepare()
        opts = result.options = calibrated.opts  # with the window length used
        result.memory = calibrated.memory.to_json()
        result.notes += calibrated.notes
        if on_plan is not None:
            on_plan(calibrated.memory)
        nonzero_after = calibrated.nonzero_after
    else:
        planner = _Planner(ckpt, targets, opts, progress, plan)
        if planner.needs_first_pass:
            planner.prepare()
        nonzero_after = planner.nonzero_after

    target_names = {lt.name for lt in targets}
    note = dtype_skipped_note(plan)
    if note:
        result.notes.append(note)
    metadata = provenance_metadata(ckpt.metadata(), {"command": "prune", **options_record(opts)})

    def config_transform(config: dict) -> dict:
        # Loaders decide from config.json whether weights are compressed: say so exactly when
        # the output holds bitmask groups (transformers otherwise re-initialises them silently).
        untouched_bitmask = [lt.name for lt in ckpt.logical
                             if lt.encoding == "bitmask" and lt.name not in target_names]
        if opts.encoding == "bitmask":
            modules = [t.name.removesuffix(".weight") for t in result.tensors]
            modules += [name.removesuffix(".weight") for name in untouched_bitmask]
            return bitmask_sparsity_config(config, modules, result.targeted_sparsity)
        return config if untouched_bitmask else drop_sparsity_config(config)

    def shard_specs(shard: str) -> list[TensorSpec]:
        specs: list[TensorSpec] = []
        for lt in ckpt.logical_in(shard):
            if lt.name in target_names:
                specs += encoded_specs(lt.name, lt.dtype, tuple(lt.shape),
                                       nonzero_after.get(lt.name, 0), opts.encoding)
            else:
                specs += [_spec(ckpt, name) for name in lt.stored]
        return specs

    with write_checkpoint(ckpt, Path(out), in_place=in_place, metadata_extra=metadata,
                          config_transform=config_transform) as writer:
        result.left_out = list(writer.left_out)
        if opts.method in CALIBRATION_METHODS:
            _write_in_block_order(ckpt, writer, shard_specs, calibrated, target_names, result)
        else:
            _write_in_file_order(ckpt, writer, shard_specs, planner, target_names, result, progress)
    if ckpt.is_dir and ckpt.config is not None and opts.encoding in LOADER_WARNINGS:
        result.warnings.append(LOADER_WARNINGS[opts.encoding].format(out=out))
    result.tensors.sort(key=lambda t: tensor_sort_key(t.name, plan[t.name].role))  # as report lists
    return result


def _write_in_file_order(ckpt: Checkpoint, writer: CheckpointWriter,
                         shard_specs: Callable[[str], list[TensorSpec]], planner: _Planner,
                         target_names: set[str], result: PruneResult,
                         progress: Progress | None) -> None:
    """Magnitude and random pruning: shard after shard, each tensor in file order."""
    done = 0
    encoding = result.options.encoding
    for shard in ckpt.shards:
        with writer.shard(shard, shard_specs(shard)) as sw:
            for lt in ckpt.logical_in(shard):
                if lt.name not in target_names:
                    for name in lt.stored:
                        sw.copy_stored(name, ckpt, name)
                    continue
                streamed = planner.stream(lt, sw)
                if streamed is not None:
                    before, nonzero = streamed
                else:
                    dense, mask, before = planner.mask(lt)
                    nonzero = count_nonzero(mask)  # the mask keeps only alive, non-zero weights
                    for name, tensor in encode(lt.name, dense, mask, encoding):
                        sw.write(name, tensor)
                    del dense, mask
                result.tensors.append(TensorResult(lt.name, tuple(lt.shape), lt.numel, before, nonzero))
                done += 1
                if progress:
                    progress("prune", done, len(target_names))


def _write_in_block_order(ckpt: Checkpoint, writer: CheckpointWriter,
                          shard_specs: Callable[[str], list[TensorSpec]], planner,
                          target_names: set[str], result: PruneResult) -> None:
    """Calibration pruning: every output shard open at once (their headers are fixed up front),
    untouched tensors copied first, each pruned tensor written at its place as its block ends."""
    encoding = result.options.encoding
    with contextlib.ExitStack() as stack:
        writers = {shard: stack.enter_context(writer.shard(shard, shard_specs(shard)))
                   for shard in ckpt.shards}
        for lt in ckpt.logical:
            if lt.name not in target_names:
                for name in lt.stored:
                    writers[lt.shard].copy_stored(name, ckpt, name)

        def sink(lt: LogicalTensor, values: torch.Tensor, kept: torch.Tensor) -> None:
            for name, tensor in encode(lt.name, values, kept, encoding):
                writers[lt.shard].write(name, tensor)
            result.tensors.append(TensorResult(lt.name, tuple(lt.shape), lt.numel,
                                               planner.nonzero_before[lt.name], count_nonzero(kept)))

        planner.run(sink)


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
        for spec in encoded_specs(lt.name, lt.dtype, tuple(lt.shape), 0, encoding):
            if spec.name in taken:
                raise SparsetoolError(
                    f"{ckpt.path}: encoding {encoding!r} of {lt.name!r} would write "
                    f"{spec.name!r}, but the checkpoint already holds a tensor of that name; "
                    "rename or drop it, exclude the weight with --exclude, or pick another --encoding"
                )


__all__ = ["PruneOptions", "PruneResult", "TensorResult", "prune_checkpoint",
           "targeted_tensors", "checkpoint_plan"]
