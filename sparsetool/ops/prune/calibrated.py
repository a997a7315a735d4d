"""Calibration pruning (``prune --method wanda|sparsegpt``): the model, one block at a time.

Both papers prune a transformer one block at a time, and so does memory here: the model is a
skeleton whose weights stay in the checkpoint (:class:`sparsetool.models.blocks.BlockModel`) until
their block's turn. Calibration text is tokenized by the model's own tokenizer (bytes for
sparsetool's GPT, as ``eval`` does) and cut into ``samples`` windows of ``seq`` tokens, chosen
among the non-overlapping windows of the text by ``seed``. The inputs of block 0 are captured from
the model's own forward pass (embeddings only are read); then for each block in order:

1. its weights are read from the checkpoint, in compute precision on the device;
2. the current inputs run through the block while hooks on its targeted linear layers accumulate
   their input statistics in float32 or better (Wanda: the sum of squares of each input feature;
   SparseGPT: ``X^T X``), one set per distinct input tensor: layers that read the same tensor
   (Llama's q/k/v projections, its gate/up projections) share it (:class:`BlockStatistics`);
3. each targeted weight of the block is read again in its stored precision and pruned in float32 on
   the CPU (:mod:`sparsetool.masks.wanda`, :mod:`sparsetool.masks.sparsegpt`), handed to the writer
   (``sink``) at once, and put back into the block. The layers of one input are pruned together,
   the inputs of the smallest layers first; SparseGPT turns an input's ``X^T X`` into its inverse
   factor in place when the first of its layers is pruned, and an input's statistics are dropped
   after its last layer;
4. the inputs run through the pruned block; its outputs are the next block's inputs; the block's
   weights are dropped.

Memory holds one block, the calibration activations (a block's inputs and outputs) and one block's
statistics (one per distinct input), whatever the depth (:mod:`sparsetool.util.memory` estimates it
before the long part and refuses a run that cannot fit). The output's header is known before the
first block runs: a tensor's kept count depends only on which of its weights are alive and how many
it must keep (:func:`~sparsetool.masks.wanda.wanda_kept_count`,
:func:`~sparsetool.masks.sparsegpt.sparsegpt_kept_count`), so even the ``bitmask`` encoding's
compressed sizes are fixed up front and each tensor is written at its place as its block finishes.
Wanda writes the input's weights under the new mask, SparseGPT its updated weights.

This module is the block loop; its parts live beside it: where each target sits in the model
(``placement.py``), how many weights each tensor keeps (``keep_counts.py``), the statistics hooks
(``statistics.py``), the memory arithmetic (``memory_plan.py``) and the run's memory plan with
each block's passes (``pass_plan.py``), OWL's pass (``owl_pass.py``) and each method's choice of
a matrix's kept weights (``selectors.py``). The windows, the block iterator and the pass's
memory are the calibration pass prune and shrink share (:mod:`sparsetool.ops.calibration`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.zeros import count_nonzero_values
from sparsetool.errors import CheckpointError, SparsetoolError
from sparsetool.masks.wanda import wanda_mask
from sparsetool.models.blocks import BlockModel, Call
from sparsetool.models.open import open_model
from sparsetool.ops.calibration import BlockPass, calibration_windows, window_length
from sparsetool.ops.prune.keep_counts import KeepCounts, count_kept
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.prune.owl_pass import owl_allocation
from sparsetool.ops.prune.pass_plan import plan_passes
from sparsetool.ops.prune.placement import Placement, check_layouts, place_targets
from sparsetool.ops.prune.planner import Sink
from sparsetool.ops.prune.read import read_alive_tensors
from sparsetool.ops.prune.selectors import Refinement, select_matrix, selector_for
from sparsetool.ops.prune.statistics import InputStatistics, gather_statistics
from sparsetool.ops.text import read_text
from sparsetool.targets import TargetPlan
from sparsetool.util.memory import MemoryPlan, release_freed_memory
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = ["CalibratedPlanner", "NEEDS", "LOWER_MEMORY"]

NEEDS = "calibration pruning (--method wanda or sparsegpt) runs causal language models only"
LOWER_MEMORY = "--samples, --seq, --dtype bfloat16, or --max-memory if more is free than detected"


class CalibratedPlanner:
    """A :class:`~sparsetool.ops.prune.planner.BlockOrderPlanner`: decides each targeted tensor's
    mask (and, for SparseGPT, values) by running calibration text through the model block by
    block. :meth:`prepare` checks everything and fixes what the output's header needs
    (``nonzero_after``) before the long part; :meth:`run` prunes and hands each tensor to a sink
    as its block finishes."""

    def __init__(
        self,
        ckpt: Checkpoint,
        targets: list[LogicalTensor],
        opts: PruneOptions,
        plan: TargetPlan,
        *,
        nan_ok: bool = False,
        progress: Progress | None = None,
        on_plan: Callable[[MemoryPlan], None] | None = None,
    ):
        self.ckpt, self.targets, self.opts, self.progress = ckpt, targets, opts, progress
        self.on_plan = on_plan
        self.target_plan, self.nan_ok = plan, nan_ok
        self.selector = selector_for(opts, wanda=wanda_mask)  # the module's, which a test swaps
        self.counts = KeepCounts(targets, plan, opts)  # how many each tensor keeps
        self.seq: int | None = opts.seq  # the windows' length, settled by prepare()
        self.refinement: Refinement | None = None  # --refine dsnot's settings, by prepare()
        self.nonzero_before: dict[str, int] = {}
        self.nonzero_after: dict[str, int] = {}  # kept counts, known before pruning
        self.notes: list[str] = []
        self.allocation: list[dict] | None = None  # --allocation owl: each block's plan
        self.swaps = 0  # --refine dsnot: the swaps made
        self.memory: MemoryPlan | None = None
        self.model: BlockModel | None = None
        self.placement = Placement(plan)
        self.passes: dict[int, list[list[str]]] = {}  # block -> the keys of each pass
        self.fallback: list[str] = []  # experts' matrices pruned by magnitude: too few tokens
        self.routed: dict[str, int] = {}  # expert's matrix -> calibration tokens routed to it
        self.windows: torch.Tensor | None = None
        # block -> the targeted tensors of each distinct input
        self.shared: dict[int, list[list[str]]] = {}

    @property
    def options(self) -> PruneOptions:
        """The options as run: with the window length :meth:`prepare` settled."""
        return dataclasses.replace(self.opts, seq=self.seq)

    # ------------------------------------------------------------------ before the long part
    def prepare(self) -> None:
        o = self.opts
        check_layouts(self.targets, self.target_plan, o.method)
        assert o.calibration is not None, "PruneOptions.validate(): a calibrated method's text"
        text = read_text(o.calibration, "--calibration")  # a bad file fails before the model loads
        self.model = model = open_model(
            self.ckpt.path, o.dtype, o.device, needs=NEEDS, attention="eager"
        )
        self.placement = place_targets(model, self.targets, self.target_plan, o.method)
        self.seq, note = window_length(o.seq, model.context, self.ckpt.path)
        if note:
            self.notes.append(note)
        if o.refine == "dsnot":
            self.refinement = Refinement(o.dsnot_iterations, o.dsnot_threshold, self.seq)
        self.windows = calibration_windows(
            model.encode(text).ids, o.samples, self.seq, o.seed, o.calibration
        )
        self.memory, self.passes, note = plan_passes(
            model, self.seq, o, self.placement, self.selector
        )
        if note:
            self.notes.append(note)
        self.memory.check(f"prune --method {o.method}", LOWER_MEMORY)
        if self.on_plan is not None:
            self.on_plan(self.memory)
        if o.allocation == "owl":
            assert o.sparsity is not None, "PruneOptions.validate(): --allocation owl's sparsity"
            self.counts.keep, self.allocation = owl_allocation(
                model,
                self.windows,
                self.placement,
                self._dense,
                sparsity=o.sparsity,
                m=o.owl_m,
                lam=o.owl_lambda,
                progress=self.progress,
            )
            release_freed_memory()  # the statistics pass's heap, before the pruning pass
        # Then one read of every targeted tensor (the output's headers need the kept counts
        # before the first block runs).
        self.nonzero_before, self.nonzero_after = count_kept(
            self.ckpt,
            self.targets,
            self.placement,
            self.counts,
            self.selector,
            nan_ok=self.nan_ok,
            progress=self.progress,
        )

    def expected_inputs(self, block: int) -> list[list[str]]:
        """The plan's guess, before anything runs, of which targeted tensors of ``block`` read one
        input (:meth:`~sparsetool.ops.prune.placement.Placement.expected_groups`).
        :class:`~sparsetool.ops.prune.statistics.BlockStatistics` sees the real sharing when the
        block runs (``shared``); this is for the memory plan."""
        return [[lt.name for _key, lt in group] for group in self.placement.expected_groups(block)]

    # ------------------------------------------------------------------ the block-by-block run
    def run(self, sink: Sink) -> None:
        """Prune every targeted tensor, block by block, handing each to ``sink`` when done."""
        model = self.model
        assert model is not None and self.windows is not None, "prepare() first"
        if not self._reads_inputs:  # magnitude with OWL's counts: no forward pass left to run
            try:
                for i, lt in enumerate(self.targets):
                    self._prune(lt, [(None, None)], sink)
                    if self.progress:
                        self.progress("prune", i + 1, len(self.targets))
            finally:
                model.close()
            return
        by_block = self.placement.by_block
        blocks = BlockPass(model, self.windows, "calibrate", self.progress, last=max(by_block))
        try:
            for step in blocks:
                pairs = by_block.get(step.index, [])
                if pairs:
                    self._prune_block(step.index, dict(pairs), step.calls, sink)
        finally:
            model.close()

    @property
    def refined(self) -> dict | None:
        o = self.opts
        if o.refine != "dsnot":
            return None
        return {
            "method": "dsnot",
            "iterations": o.dsnot_iterations,
            "threshold": o.dsnot_threshold,
            "swaps": self.swaps,
        }

    @property
    def has_experts(self) -> bool:
        """Whether a mixture of experts' matrices are pruned from their routed tokens."""
        return self._reads_inputs and self.placement.has_experts

    @property
    def experts(self) -> dict | None:
        """A Mixture of Experts' matrices: the calibration tokens routed to each, and those pruned
        by magnitude for having fewer than ``--expert-min-tokens`` (None: no experts targeted)."""
        if not self.has_experts:
            return None
        return {
            "min_tokens": self.opts.expert_min_tokens,
            "magnitude": list(self.fallback),
            "routed_tokens": dict(self.routed),
        }

    @property
    def _loaded(self) -> BlockModel:
        """The model :meth:`prepare` opened."""
        assert self.model is not None, "prepare() first"
        return self.model

    @property
    def _reads_inputs(self) -> bool:
        """Whether the masks need each layer's inputs (all but magnitude without DSnoT)."""
        return self.opts.method != "magnitude" or self.opts.refine != "none"

    def _dense(self, lt: LogicalTensor) -> torch.Tensor:
        """A targeted weight as stored, (out, in) (or (experts, out, in)), in float32 (pruned
        positions are zeros)."""
        dense, _alive = read_alive_tensors(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        return self.placement.oriented(lt, dense).float()

    def _prune_block(
        self, i: int, layers: dict[str, LogicalTensor], calls: list[Call], sink: Sink
    ) -> None:
        """Prune block ``i``'s targeted ``layers`` (key -> tensor) in the passes the memory plan
        chose (one, unless the statistics do not fit at once): each gathers its layers'
        statistics over every window, then prunes them, dropping an input's statistics after its
        last layer. A tensor of every expert is pruned whole, each expert's matrix from its own
        statistics, when the first of its experts comes."""
        passes = self.passes.get(i) or [list(layers)]
        self.shared[i] = []
        for keys in passes:
            self._prune_pass(i, {k: layers[k] for k in keys}, calls, sink)

    def _prune_pass(
        self, i: int, layers: dict[str, LogicalTensor], calls: list[Call], sink: Sink
    ) -> None:
        stats = gather_statistics(
            self._loaded,
            i,
            layers,
            calls,
            self.placement,
            hessian=self.selector.hessian,
            moments=self.opts.refine == "dsnot",
        )
        self.shared[i] += [[layers[key].name for key in group] for group in stats.groups()]
        slots: dict[str, list[str]] = {}
        for key, lt in layers.items():
            if self.placement.where[key].slot:
                slots.setdefault(lt.name, []).append(key)
        done: set[str] = set()
        for key in stats.solve_order(lambda key: layers[key].numel):
            lt = layers[key]
            if lt.name in done:
                continue
            keys = slots.get(lt.name, [key])
            self._prune(lt, [(k, stats.of(k)) for k in keys], sink)
            for k in keys:
                stats.release(k)
            done.add(lt.name)

    def _prune(
        self, lt: LogicalTensor, units: list[tuple[str | None, InputStatistics | None]], sink: Sink
    ) -> None:
        """Prune one tensor from its stored values (float32 math), write it, put it back into
        the block. ``units`` are its matrices (key, statistics): one, or each expert's of a
        tensor of every expert; (None, None) when no block runs."""
        updates = self.selector.updates
        placement = self.placement
        dense, alive = read_alive_tensors(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        # The statistics were gathered on the device; the selection and the solve run on the CPU.
        w, alive = placement.oriented(lt, dense).float(), placement.oriented(lt, alive)
        stored, copied = dense.dtype, w.dtype != dense.dtype
        if updates:  # its output is the updated weights: the stored ones can go
            del dense
        experts = w.ndim == 3
        if experts and len(units) == 1:  # no block runs: every expert's matrix alike
            units = units * w.shape[0]
        try:
            if experts:
                new, kept = torch.empty_like(w), torch.empty(w.shape, dtype=torch.bool)
                for e, (key, stats) in enumerate(units):
                    new[e], kept[e] = self._select(key, lt, w[e], alive[e], stats, e, copied)
            else:
                key, stats = units[0]
                new, kept = self._select(key, lt, w, alive, stats, None, copied)
        except SparsetoolError as e:
            raise SparsetoolError(f"tensor {lt.name!r} {list(lt.shape)}: {e}") from None
        del w, alive
        new.masked_fill_(~kept, 0)
        stored_new = placement.oriented(lt, new)
        place = placement.where.get(units[0][0]) if units[0][0] is not None else None
        if place is not None and place.piece.index:  # one expert's matrix
            self._loaded.set_piece(place.own, place.piece, stored_new)
        elif place is not None:  # the next inputs come from the pruned block
            self._loaded.set_weight(place.own, stored_new)
        kept = placement.oriented(lt, kept).contiguous()
        if count_nonzero_values(kept) != self.nonzero_after[lt.name]:
            raise CheckpointError(
                f"tensor {lt.name!r}: kept {plural(count_nonzero_values(kept), 'weight')} "
                f"where {self.nonzero_after[lt.name]:,} were planned; please report this"
            )
        values = stored_new.to(stored).contiguous() if updates else dense
        sink(lt, values, kept)

    def _select(
        self,
        key: str | None,
        lt: LogicalTensor,
        w: torch.Tensor,
        alive: torch.Tensor,
        stats: InputStatistics | None,
        expert: int | None,
        copied: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One matrix (out, in) of ``lt``: (its new values, its kept mask) by the method's
        selector (``selectors.py``); ``w`` may be overwritten when ``copied``.

        An expert's matrix whose expert was routed fewer calibration tokens than
        ``--expert-min-tokens`` is pruned by magnitude, in its method's comparison groups."""
        o = self.opts
        place = self.placement.where.get(key) if key is not None else None
        few = False
        name = f"{lt.name}[{expert}]" if expert is not None else lt.name
        if place is not None and place.expert is not None and stats is not None:
            self.routed[name] = stats.tokens
            few = stats.tokens < o.expert_min_tokens and o.method != "magnitude"
            if few:
                self.fallback.append(name)
        new, kept, swaps = select_matrix(
            self.selector,
            w,
            alive,
            stats,
            self.counts.of(lt, expert),
            few=few,
            copied=copied,
            refine=self.refinement,
        )
        self.swaps += swaps
        return new, kept
