"""OWL's pass of calibration pruning (``--allocation owl``): the dense model, block by block,
counting each block's outlier ratio from its inputs' norms (:mod:`sparsetool.masks.owl`); then
each targeted tensor's kept count from its block's sparsity. It runs once, before the pruning
pass, which then prunes each tensor to its count."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sparsetool.checkpoint import LogicalTensor
from sparsetool.masks.owl import OutlierCount, block_sparsity, owl_keep, owl_sparsities
from sparsetool.models.blocks import BlockModel, Call
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.prune.placement import Placement
from sparsetool.ops.prune.statistics import gather_statistics
from sparsetool.util.progress import Progress

__all__ = ["owl_allocation"]


def owl_allocation(
    model: BlockModel,
    windows: torch.Tensor,
    placement: Placement,
    dense: Callable[[LogicalTensor], torch.Tensor],
    *,
    sparsity: float,
    m: float,
    lam: float,
    progress: Progress | None = None,
) -> tuple[dict[str, int], list[dict]]:
    """(each targeted tensor's kept count, each block's plan: its outlier ratio, sparsity,
    targeted and kept weights) for ``sparsity`` overall, a score above ``m`` times its block's
    mean an outlier, block sparsities spread over ``2 * lam``. ``dense(lt)`` reads a targeted
    weight (out, in) in float32."""
    by_block = placement.by_block
    last = max(by_block)
    ratios: list[float] = []
    blocks: list[dict[str, int]] = []
    for step in BlockPass(model, windows, "outliers", progress, last=last):
        i, calls = step.index, step.calls
        pairs = by_block.get(i, [])
        if pairs:
            outputs: list[Call] = []  # the dense block's outputs: the next block's inputs
            layers = dict(pairs)
            stats = gather_statistics(
                model,
                i,
                layers,
                calls,
                placement,
                hessian=False,
                moments=False,
                outputs=outputs if i < last else None,
            )
            count = OutlierCount(m)
            by_tensor: dict[str, tuple[LogicalTensor, list[str]]] = {}
            for key, lt in layers.items():  # a tensor of every expert: read once
                by_tensor.setdefault(lt.name, (lt, []))[1].append(key)
            for add in (count.add_sum, count.add_count):
                for lt, keys in by_tensor.values():
                    weight = dense(lt)
                    for key in keys:
                        place = placement.where[key]
                        add(
                            weight[place.expert] if place.slot else weight,
                            stats.of(key).squares().cpu(),
                        )
                    del weight
            ratios.append(count.ratio)
            blocks.append({lt.name: lt.numel for lt in layers.values()})
            if outputs:
                step.outputs = outputs
    sparsities = owl_sparsities(ratios, [sum(b.values()) for b in blocks], sparsity, lam)
    keep = owl_keep(blocks, sparsities, sparsity)
    allocation = [
        {
            "block": b,
            "outlier_ratio": r,
            "sparsity": block_sparsity(keep, block),
            "targeted": sum(block.values()),
            "kept": sum(keep[n] for n in block),
        }
        for b, r, block in zip(sorted(by_block), ratios, blocks)
    ]
    return keep, allocation
