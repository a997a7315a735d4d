"""``shrink --experts``: remove whole routed experts of a Mixture-of-Experts model, block by block.

Two phases, one block in memory at a time:

1. **Choose.** The calibration windows' hidden states enter block 0; for each block in turn its
   weights are read, and in a block with routed experts a hook on the experts module gathers each
   expert's statistics (:mod:`~sparsetool.ops.shrink.saliency`) while the windows run through it.
   The layer's kept experts are chosen (and, with ``--merge``, the clusters folded into them);
   the block is then shrunk in memory exactly as the output will hold it (rows of the router and
   experts removed, merged experts averaged, the modules' expert counts lowered) and run again
   to make the next block's inputs, so each block is scored on what the shrunk model feeds it.
   ``--criterion random`` without ``--merge`` runs nothing: it draws.
2. **Write.** The output is streamed (:class:`~sparsetool.ops.shrink.write.ExpertWriter`), with
   the choices recorded in its provenance and ``config.json``'s expert count lowered.

Removal means what setting the removed experts' router logits to -inf means: the router's
normalisation runs over the kept experts only (tests/ops/shrink/test_shrink.py checks the written
model against that definition in transformers for each family).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.writer import CheckpointWriter
from sparsetool.errors import UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.shrink.inputs import model_config
from sparsetool.ops.shrink.kind import Shrinking, run_kind
from sparsetool.ops.shrink.layers import EXPERT_COUNT_KEYS, ExpertLayer, expert_count, expert_layers
from sparsetool.ops.shrink.options import ExpertPlan, ShrinkOptions, plan_experts
from sparsetool.ops.shrink.results import ShrinkResult
from sparsetool.ops.shrink.saliency import (
    ExpertStatistics,
    choose_kept,
    merge_clusters,
    random_scores,
)
from sparsetool.ops.shrink.windows import shrink_windows
from sparsetool.ops.shrink.write import Averaged, ExpertWriter, averaged
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["NEEDS", "ExpertsKind", "plan_shrink", "shrink_experts"]

NEEDS = "shrink removes experts of causal language models (Hugging Face directories)"


def plan_shrink(path: str | Path, opts: ShrinkOptions) -> ExpertPlan:
    """The experts each layer keeps, from ``path``'s config.json alone: every usage error (no
    routed experts, a request that removes none or leaves too few) before a weight is read."""
    opts.validate()
    path = Path(path)
    config, cfg = model_config(path, NEEDS)
    return _plan(opts, path, config, cfg)


def _plan(opts: ShrinkOptions, path: Path, config: dict[str, Any], cfg: Any) -> ExpertPlan:
    experts, top_k = expert_count(cfg, config, path)
    groups = int(getattr(cfg, "n_group", None) or 1)
    return plan_experts(
        opts,
        experts,
        top_k,
        groups=groups,
        topk_group=int(getattr(cfg, "topk_group", None) or 1),
        # DeepSeek-V3's router ranks its groups by the sum of each group's best two
        group_top=2 if hasattr(cfg, "n_group") else 0,
        model=str(path),
    )


def shrink_experts(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Remove ``opts``' share of every Mixture-of-Experts layer's routed experts of the model at
    ``path`` and write the smaller model at ``out``; see the module docstring."""
    return run_kind(ExpertsKind(opts), path, out, opts, progress=progress, on_plan=on_plan)


class ExpertsKind:
    """``--experts`` / ``--experts-keep`` as a :class:`~sparsetool.ops.shrink.kind.ShrinkKind`."""

    key = "experts"
    needs = NEEDS

    def __init__(self, opts: ShrinkOptions):
        self.opts = opts
        self.expert_plan: ExpertPlan | None = None
        self.path = Path()

    def plan(self, path: Path, config: dict[str, Any], cfg: Any) -> None:
        self.path = path
        self.expert_plan = _plan(self.opts, path, config, cfg)

    def choose(
        self,
        model: BlockModel,
        text: str | None,
        result: ShrinkResult,
        held: contextlib.ExitStack,
        progress: Progress | None,
        on_plan: Callable[[MemoryPlan], None] | None,
    ) -> Shrinking:
        plan, opts = self.expert_plan, self.opts
        assert plan is not None, "plan() runs first"
        result.plan = plan
        layers = expert_layers(model, plan.experts)
        if not layers:
            raise UsageError(
                f"{model.path}: no block has routed experts; nothing for shrink to remove"
            )
        writer = ExpertWriter(model.ckpt, layers, plan.experts, plan.keep)
        choices = _choose(model, layers, plan, opts, text, result, progress, on_plan)
        result.layers = [_layer_record(layers[i], c, plan) for i, c in sorted(choices.items())]

        def write(cw: CheckpointWriter) -> None:
            with writer.open(cw):
                for n, (i, choice) in enumerate(sorted(choices.items())):
                    writer.layer(layers[i], choice.kept, choice.clusters, model.read)
                    if progress:
                        progress("write", n + 1, len(choices))

        return Shrinking(
            record=_experts_record(plan, result),
            config=lambda config: _config(config, plan),
            write=write,
            removed=lambda: _removed(model.ckpt, layers, plan),
        )


class _Choice:
    """One layer's decision: the experts kept (ascending), every expert's saliency, and with
    ``--merge`` each kept expert's cluster."""

    def __init__(
        self,
        kept: list[int],
        scores: torch.Tensor,
        routed: torch.Tensor | None,
        clusters: dict[int, list[tuple[int, float]]] | None,
    ):
        self.kept, self.scores, self.routed, self.clusters = kept, scores, routed, clusters


def _choose(
    model: BlockModel,
    layers: dict[int, ExpertLayer],
    plan: ExpertPlan,
    opts: ShrinkOptions,
    text: str | None,
    result: ShrinkResult,
    progress: Progress | None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> dict[int, _Choice]:
    """Phase 1: every layer's kept experts (see the module docstring)."""
    choices: dict[int, _Choice] = {}
    if text is None:  # --criterion random, no --merge: nothing to run
        for i in layers:
            scores = random_scores(plan.experts, opts.seed, i)
            choices[i] = _Choice(choose_kept(scores, plan), scores, None, None)
        return choices
    cfg = model.module.config
    widest = (
        getattr(cfg, "moe_intermediate_size", None)
        or getattr(cfg, "intermediate_size", None)
        or 4 * model.width
    )
    # the kept experts' copy of a block's experts (and with --merge their averages)
    copies = model.largest_block_bytes * plan.keep // plan.experts * (2 if opts.merge else 1)
    windows = shrink_windows(
        model,
        opts,
        text,
        result,
        statistics=copies,
        routed=(plan.top_k, int(widest)),
        on_plan=on_plan,
    )
    last = max(layers)
    for step in BlockPass(model, windows, "shrink", progress, last=last):
        i = step.index
        restore: Callable[[], None] = lambda: None  # noqa: E731
        if i in layers:
            layer = layers[i]
            choices[i] = choice = _score(model, layer, plan, opts, step.calls)
            shrunk = averaged(layer, choice.kept, choice.clusters, model.read)
            restore = _shrink_in_memory(model, layer, plan, choice.kept, shrunk)
        if i < last:
            step.run()  # the next inputs come from the shrunk block
        restore()
    return choices


def _score(
    model: BlockModel, layer: ExpertLayer, plan: ExpertPlan, opts: ShrinkOptions, calls: list
) -> _Choice:
    """Run the block's windows with the statistics hook on its experts; the layer's choice."""
    module = model.module.get_submodule(layer.experts_path)
    stats = ExpertStatistics(plan.experts, model.width, outputs=opts.merge)
    handle = module.register_forward_pre_hook(stats.hook(module), with_kwargs=True)
    try:
        for c in calls:
            model.run_block(layer.block, c)
    finally:
        handle.remove()
    if opts.criterion == "random":
        scores = random_scores(plan.experts, opts.seed, layer.block)
    else:
        scores = stats.scores(opts.criterion)
    kept = choose_kept(scores, plan)
    clusters = merge_clusters(kept, stats, plan) if opts.merge else None
    return _Choice(kept, scores, stats.count.clone(), clusters)


def _shrink_in_memory(
    model: BlockModel, layer: ExpertLayer, plan: ExpertPlan, kept: list[int], shrunk: list[Averaged]
) -> Callable[[], None]:
    """Make the loaded block what the output holds: the kept experts' rows of every parameter
    and buffer with one per expert, the averaged experts in place, the modules' expert counts
    lowered. Returns what undoes the changes that releasing the block does not."""
    index = torch.tensor(kept)
    experts = model.module.get_submodule(layer.experts_path)
    router = model.module.get_submodule(layer.router_path)
    for n, p in experts.named_parameters(recurse=False):
        name = f"{layer.experts_path}.{n}"
        value = p.data[index].clone()
        for a in shrunk:
            if a.role.param == name:
                value[a.index] = a.value.to(value.dtype)
        model.set_weight(name, value)
    undo: list[tuple[torch.nn.Module, str, object]] = []
    for n, p in router.named_parameters(recurse=False):
        if p.ndim and p.shape[0] == plan.experts:
            model.set_weight(f"{layer.router_path}.{n}", p.data[index].clone())
    for n, b in router.named_buffers(recurse=False):
        if b.ndim and b.shape[0] == plan.experts:
            undo.append((router, n, b))
            setattr(router, n, b[index].clone())
    for m in (experts, router):
        for attr in EXPERT_COUNT_KEYS:
            if getattr(m, attr, None) == plan.experts:
                undo.append((m, attr, plan.experts))
                setattr(m, attr, plan.keep)

    def restore() -> None:
        for m, attr, value in reversed(undo):
            setattr(m, attr, value)

    return restore


def _config(config: dict, plan: ExpertPlan) -> dict:
    """config.json with the routed experts per layer lowered (the family's own key)."""
    keys = [k for k in EXPERT_COUNT_KEYS if config.get(k) == plan.experts]
    for k in keys or [EXPERT_COUNT_KEYS[0]]:
        config[k] = plan.keep
    return config


def _layer_record(layer: ExpertLayer, choice: _Choice, plan: ExpertPlan) -> dict:
    rec: dict = {
        "block": layer.block,
        "kept": list(choice.kept),
        "removed": [e for e in range(plan.experts) if e not in choice.kept],
        "scores": [float(f"{float(s):.6g}") for s in choice.scores],
    }
    if choice.routed is not None:
        rec["routed_tokens"] = [int(c) for c in choice.routed]
    if choice.clusters is not None:
        rec["merged"] = {
            str(k): [[j, round(w, 6)] for j, w in group]
            for k, group in choice.clusters.items()
            if len(group) > 1
        }
    return rec


def _experts_record(plan: ExpertPlan, result: ShrinkResult) -> dict:
    return {
        "before": plan.experts,
        "after": plan.keep,
        "top_k": plan.top_k,
        "groups": plan.groups,
        "calibration_tokens": result.tokens,
        "layers": result.layers,
    }


def _removed(ckpt: Checkpoint, layers: dict[int, ExpertLayer], plan: ExpertPlan) -> int:
    """The parameters the removed experts held (their pieces, their share of fused tensors and of
    the router)."""
    lts = {lt.name: lt for lt in ckpt.logical}
    removed = 0
    for layer in layers.values():
        for role in layer.roles:
            if role.fused:
                removed += lts[role.fused].numel * plan.removed // plan.experts
            removed += sum(lts[p.stored].numel for e, p in role.pieces.items() if e >= plan.keep)
        removed += sum(lts[s].numel * plan.removed // plan.experts for s in layer.router.values())
    return removed
