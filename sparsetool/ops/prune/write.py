"""prune, step 2: write the output a :class:`~sparsetool.ops.prune.plan.PrunePlan` decided.

The output has the input's layout (shards, index, ``config.json``), is written beside its final
path and renamed into place at the end (:func:`sparsetool.checkpoint.writer.write_checkpoint`).
Untargeted tensors are copied byte for byte; each targeted one is encoded
(:func:`sparsetool.checkpoint.encodings.encode`) in one of the two orders its planner works in
(:mod:`sparsetool.ops.prune.planner`).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sparsetool.checkpoint.codecs import codec
from sparsetool.checkpoint.config import bitmask_sparsity_config, drop_sparsity_config
from sparsetool.checkpoint.encodings import as_array, encode_array, encoded_specs, loader_warning
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.checkpoint.reader import LogicalTensor
from sparsetool.checkpoint.writer import CheckpointWriter, write_checkpoint
from sparsetool.ops.prune.options import PruneResult, TensorResult, options_record
from sparsetool.ops.prune.plan import PrunePlan
from sparsetool.ops.prune.planner import BlockOrderPlanner, FileOrderPlanner
from sparsetool.targets import tied_head_warning
from sparsetool.targets.order import tensor_sort_key
from sparsetool.util.progress import Progress

if TYPE_CHECKING:
    import torch

__all__ = ["write_pruned"]


def write_pruned(
    plan: PrunePlan, out: str | Path, *, in_place: bool = False, progress: Progress | None = None
) -> PruneResult:
    """Write the pruned checkpoint ``out`` (or over the input, ``in_place``); what was done."""
    ckpt, opts = plan.ckpt, plan.opts
    result = PruneResult(output=Path(out), options=opts, notes=list(plan.notes))
    if plan.memory is not None:
        result.memory = plan.memory.to_json()
    result.allocation = plan.allocation
    metadata = provenance_metadata(
        ckpt.metadata(), {"command": "prune", **options_record(opts, plan.allocation, plan.experts)}
    )
    with write_checkpoint(
        ckpt,
        Path(out),
        in_place=in_place,
        metadata_extra=metadata,
        config_transform=functools.partial(_config, plan, result),
    ) as writer:
        result.left_out = list(writer.left_out)
        if isinstance(plan.planner, BlockOrderPlanner):
            _write_in_block_order(plan, plan.planner, writer, result)
        else:
            _write_in_file_order(plan, plan.planner, writer, result, progress)
    warning = (
        loader_warning(opts.encoding, out, "prune")
        if ckpt.is_dir and ckpt.config is not None
        else None
    )
    if warning:
        result.warnings.append(warning)
    tied = tied_head_warning(plan.targeting)
    if tied:
        result.warnings.append(tied)
    result.tensors.sort(key=lambda t: tensor_sort_key(t.name, plan.targeting[t.name].role))
    return result


def _config(plan: PrunePlan, result: PruneResult, config: dict) -> dict:
    """``config.json`` of the output. Loaders decide from it whether weights are compressed: say
    so exactly when the output holds bitmask groups (transformers otherwise re-initialises them
    silently)."""
    target_names = plan.target_names
    untouched_bitmask = [
        lt.name for lt in plan.ckpt.logical if lt.compressed and lt.name not in target_names
    ]
    if codec(plan.opts.encoding).compressed:
        modules = [t.name.removesuffix(".weight") for t in result.tensors]
        modules += [name.removesuffix(".weight") for name in untouched_bitmask]
        return bitmask_sparsity_config(config, modules, result.targeted_sparsity)
    return config if untouched_bitmask else drop_sparsity_config(config)


def _shard_specs(plan: PrunePlan, shard: str) -> list[TensorSpec]:
    """The header of one output shard: each tensor's stored names, dtypes and shapes."""
    ckpt, target_names = plan.ckpt, plan.target_names
    nonzero_after = plan.planner.nonzero_after
    specs: list[TensorSpec] = []
    for lt in ckpt.logical_in(shard):
        if lt.name in target_names:
            specs += encoded_specs(
                lt.name,
                lt.st_dtype,
                tuple(lt.shape),
                nonzero_after.get(lt.name, 0),
                plan.opts.encoding,
            )
        else:
            for name in lt.stored:
                e = ckpt.entry(name)
                specs.append(TensorSpec(name, e.st_dtype, tuple(e.shape)))
    return specs


def _write_in_file_order(
    plan: PrunePlan,
    planner: FileOrderPlanner,
    writer: CheckpointWriter,
    result: PruneResult,
    progress: Progress | None,
) -> None:
    """Magnitude and random pruning: shard after shard, each tensor in file order."""
    ckpt, target_names, encoding = plan.ckpt, plan.target_names, plan.opts.encoding
    done = 0
    for shard in ckpt.shards:
        with writer.shard(shard, _shard_specs(plan, shard)) as sw:
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
                    nonzero = int(
                        np.count_nonzero(mask)
                    )  # the mask keeps only alive, non-zero weights
                    for name, array in encode_array(lt.name, dense, lt.st_dtype, mask, encoding):
                        sw.write_array(name, array)
                    del dense, mask
                result.tensors.append(
                    TensorResult(lt.name, tuple(lt.shape), lt.numel, before, nonzero)
                )
                done += 1
                if progress:
                    progress("prune", done, len(target_names))


def _write_in_block_order(
    plan: PrunePlan, planner: BlockOrderPlanner, writer: CheckpointWriter, result: PruneResult
) -> None:
    """Calibration pruning: every output shard open at once (their headers are fixed up front),
    untouched tensors copied first, each pruned tensor written at its place as its block ends."""
    ckpt, target_names, encoding = plan.ckpt, plan.target_names, plan.opts.encoding
    with contextlib.ExitStack() as stack:
        writers = {
            shard: stack.enter_context(writer.shard(shard, _shard_specs(plan, shard)))
            for shard in ckpt.shards
        }
        for lt in ckpt.logical:
            if lt.name not in target_names:
                for name in lt.stored:
                    writers[lt.shard].copy_stored(name, ckpt, name)

        def sink(lt: LogicalTensor, values: torch.Tensor, kept: torch.Tensor) -> None:
            stored, st = as_array(values)
            mask = kept.detach().cpu().contiguous().numpy()
            for name, array in encode_array(lt.name, stored, st, mask, encoding):
                writers[lt.shard].write_array(name, array)
            result.tensors.append(
                TensorResult(
                    lt.name,
                    tuple(lt.shape),
                    lt.numel,
                    planner.nonzero_before[lt.name],
                    int(np.count_nonzero(mask)),
                )
            )

        planner.run(sink)
    result.refined = planner.refined
    result.experts = planner.experts
