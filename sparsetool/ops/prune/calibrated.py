"""Calibration pruning (``prune --method wanda|sparsegpt``): the model, one block at a time.

Both papers prune a transformer one block at a time, and so does memory here: the model is a
skeleton whose weights stay in the checkpoint (:class:`sparsetool.models.blocks.BlockModel`) until their
block's turn. Calibration text is tokenized by the model's own tokenizer (bytes for sparsetool's
GPT, as ``eval`` does) and cut into ``samples`` windows of ``seq`` tokens, chosen among the
non-overlapping windows of the text by ``seed``. The inputs of block 0 are captured from the
model's own forward pass (embeddings only are read); then for each block in order:

1. its weights are read from the checkpoint, in compute precision on the device;
2. the current inputs run through the block while hooks on its targeted linear layers accumulate
   their input statistics in float32 or better (Wanda: the sum of squares of each input feature;
   SparseGPT: ``X^T X``), one set per distinct input tensor: layers that read the same tensor
   (Llama's q/k/v projections, its gate/up projections) share it (:class:`BlockStatistics`);
3. each targeted weight of the block is read again in its stored precision and pruned in float32
   on the CPU (:mod:`sparsetool.masks.wanda`, :mod:`sparsetool.masks.sparsegpt`), handed to the writer
   (``sink``) at once, and put back into the block. The layers of one input are pruned together,
   the inputs of the smallest layers first; SparseGPT turns an input's ``X^T X`` into its inverse
   factor in place when the first of its layers is pruned, and an input's statistics are dropped
   after its last layer;
4. the inputs run through the pruned block; its outputs are the next block's inputs; the block's
   weights are dropped.

Memory holds one block, the calibration activations (a block's inputs and outputs) and one block's
statistics (one per distinct input), whatever the depth (:mod:`sparsetool.util.memory` estimates it before the long part and
refuses a run that cannot fit). The output's header is known before the first block runs: a
tensor's kept count depends only on which of its weights are alive and how many it must keep
(:func:`~sparsetool.masks.wanda.wanda_kept_count`, :func:`~sparsetool.masks.sparsegpt.sparsegpt_kept_count`),
so even the ``bitmask`` encoding's compressed sizes are fixed up front and each tensor is written
at its place as its block finishes. Wanda writes the input's weights under the new mask, SparseGPT
its updated weights.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.zeros import count_nonzero_values
from sparsetool.errors import CheckpointError, SparsetoolError
from sparsetool.masks.distributions import part_keep_counts
from sparsetool.masks.dsnot import dsnot_refine
from sparsetool.masks.owl import OutlierCount, block_sparsity, owl_keep, owl_sparsities
from sparsetool.masks.select import magnitude_mask
from sparsetool.masks.sparsegpt import (
    ROWS,
    inverse_hessian_factor,
    sparsegpt_kept_count,
    sparsegpt_update,
)
from sparsetool.masks.wanda import wanda_kept_count, wanda_mask
from sparsetool.models.blocks import BlockModel, Call
from sparsetool.models.hf import Piece
from sparsetool.models.open import open_model
from sparsetool.ops.prune.options import DEFAULT_SEQ, PruneOptions
from sparsetool.ops.prune.planner import Sink
from sparsetool.ops.prune.read import read_alive_tensors
from sparsetool.ops.prune.statistics import BlockStatistics, InputStatistics
from sparsetool.ops.text import read_text
from sparsetool.targets import STACKED_LAYOUTS, TargetPlan
from sparsetool.util.memory import MemoryPlan, budget, process_memory, release_freed_memory
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = ["CalibratedPlanner", "calibration_windows", "NEEDS", "LOWER_MEMORY"]

NEEDS = "calibration pruning (--method wanda or sparsegpt) runs causal language models only"
LOWER_MEMORY = "--samples, --seq, --dtype bfloat16, or --max-memory if more is free than detected"


def calibration_windows(
    ids: list[int], samples: int, seq: int, seed: int, source: str
) -> torch.Tensor:
    """``samples`` windows (rows) of ``seq`` tokens: distinct non-overlapping windows of the text,
    picked at random by ``seed`` and kept in text order."""
    need = samples * seq
    if len(ids) < need:
        raise SparsetoolError(
            f"--calibration {source}: {plural(len(ids), 'token')} for this model's tokenizer, but "
            f"--samples {samples} x --seq {seq} needs {need:,}; give more text or lower "
            "--samples or --seq"
        )
    n = len(ids) // seq
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:samples].sort().values
    t = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    return t[pick]


@dataclass(frozen=True)
class _Place:
    """Where a targeted checkpoint tensor (``lt``) lives in the model: the parameter (``own``)
    and its place there; for one expert's matrix of a Mixture of Experts, the experts module, the expert,
    and whether it reads the block's hidden states (``"in"``: gate, up) or the gated product
    (``"out"``: down)."""

    lt: LogicalTensor
    own: str
    piece: Piece
    experts: torch.nn.Module | None = None
    expert: int | None = None
    part: str = ""
    slot: bool = False  # the checkpoint tensor holds every expert: this is its ``[expert]``


def _is_experts(module: torch.nn.Module) -> bool:
    """transformers' fused experts: 3-D parameters, one matrix per expert, and a down projection."""
    return hasattr(module, "down_proj") and any(
        p.ndim == 3 for p in module.parameters(recurse=False)
    )


class CalibratedPlanner:
    """A :class:`~sparsetool.ops.prune.planner.BlockOrderPlanner`: decides each targeted tensor's mask (and, for SparseGPT, values) by running calibration
    text through the model block by block. :meth:`prepare` checks everything and fixes what the
    output's header needs (``nonzero_after``) before the long part; :meth:`run` prunes and hands
    each tensor to a sink as its block finishes."""

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
        self.keep: dict[str, int] = {}
        self._part_keep: dict[str, list[int]] = {}  # a tensor of every expert: each one's count
        if opts.sparsity is not None:
            self._part_keep = part_keep_counts(
                {lt.name: tuple(lt.shape) for lt in targets},
                {lt.name: plan[lt.name].experts for lt in targets if plan[lt.name].experts},
                opts.sparsity,
                opts.distribution,
            )
            self.keep = {name: sum(parts) for name, parts in self._part_keep.items()}
        self.nonzero_before: dict[str, int] = {}
        self.nonzero_after: dict[str, int] = {}  # kept counts, known before pruning
        self.notes: list[str] = []
        self.allocation: list[dict] | None = None  # --allocation owl: each block's plan
        self.swaps = 0  # --refine dsnot: the swaps made
        self.memory: MemoryPlan | None = None
        self.model: BlockModel | None = None
        # block -> (key, tensor); the key is the model's parameter name, or for one expert's
        # matrix the checkpoint tensor's (the experts of a block share their parameters)
        self._by_block: dict[int, list[tuple[str, LogicalTensor]]] = {}
        self._where: dict[str, _Place] = {}
        self._passes: dict[int, list[list[str]]] = {}  # block -> the keys of each pass
        self.fallback: list[str] = []  # experts' matrices pruned by magnitude: too few tokens
        self.routed: dict[str, int] = {}  # expert's matrix -> calibration tokens routed to it
        self._windows: torch.Tensor | None = None
        self.shared: dict[
            int, list[list[str]]
        ] = {}  # block -> the targeted tensors of each distinct input

    # ------------------------------------------------------------------ before the long part
    def prepare(self) -> None:
        o = self.opts
        for lt in self.targets:
            if self.target_plan[lt.name].layout not in ("linear", "conv1d") + STACKED_LAYOUTS:
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: --method {o.method} prunes "
                    "linear layers (2-D weights) only; leave it out with --exclude"
                )
        text = read_text(o.calibration, "--calibration")  # a bad file fails before the model loads
        self.model = model = open_model(self.ckpt.path, o.dtype, o.device, needs=NEEDS)
        self._place_targets(model)
        seq = o.seq
        if seq is None:
            seq = min(DEFAULT_SEQ, model.context)
            if seq < DEFAULT_SEQ:
                self.notes.append(
                    f"calibration windows of {seq} tokens, the model's context "
                    f"(shorter than the default --seq {DEFAULT_SEQ})"
                )
        elif seq > model.context:
            raise SparsetoolError(
                f"--seq {seq}: {self.ckpt.path} takes at most {model.context} "
                f"tokens at once; use --seq {model.context} or less"
            )
        self.opts = dataclasses.replace(o, seq=seq)
        self._windows = calibration_windows(
            model.encode(text).ids, o.samples, seq, o.seed, o.calibration
        )
        self.memory = self._memory_plan(model, seq)
        self.memory.check(f"prune --method {o.method}", LOWER_MEMORY)
        if self.on_plan is not None:
            self.on_plan(self.memory)
        if o.allocation == "owl":
            self._allocate()
            release_freed_memory()  # the statistics pass's heap, before the pruning pass
        # Then one read of every targeted tensor: NaN/inf refused, what is there and what will be
        # kept counted (the output's headers need the kept counts before the first block runs).
        for i, lt in enumerate(self.targets):
            _dense, alive = read_alive_tensors(self.ckpt, lt, nan_means_pruned=self.nan_ok)
            self.nonzero_before[lt.name] = count_nonzero_values(alive)
            try:
                self.nonzero_after[lt.name] = self._kept_count(lt, self._oriented(lt, alive))
            except SparsetoolError as e:
                raise SparsetoolError(f"tensor {lt.name!r} {list(lt.shape)}: {e}") from None
            del _dense, alive
            if self.progress:
                self.progress("check", i + 1, len(self.targets))

    def _oriented(self, lt: LogicalTensor, t: torch.Tensor) -> torch.Tensor:
        """``t`` as (out, in), or (experts, out, in) for a tensor of every expert: a GPT-2 Conv1D
        weight is stored (in, out), gpt-oss's experts (experts, in, out). Its own inverse."""
        layout = self.target_plan[lt.name].layout
        return t.T if layout == "conv1d" else t.transpose(1, 2) if layout == "stacked_t" else t

    def _n_in(self, lt: LogicalTensor) -> int:
        """Input features of a targeted weight (of each expert's matrix)."""
        return lt.shape[self.target_plan[lt.name].input_dim]

    def _keep(self, lt: LogicalTensor, expert: int | None = None) -> int | None:
        """How many of ``lt``'s weights to keep; of its ``expert``'s matrix, for a tensor of
        every expert (OWL's count of the tensor shared out as evenly as the counts allow)."""
        if self.opts.nm is not None:
            return None
        total = self.keep.get(lt.name, lt.numel - round(self.opts.sparsity * lt.numel))
        if expert is None:
            return total
        parts = self._part_keep.get(lt.name)
        if parts is not None and sum(parts) == total:
            return parts[expert]
        n = lt.shape[0]
        return total // n + (expert < total % n)

    def _kept_count(self, lt: LogicalTensor, alive: torch.Tensor) -> int:
        if alive.ndim == 3:  # one count per expert's matrix
            return sum(self._matrix_kept_count(lt, a, e) for e, a in enumerate(alive))
        return self._matrix_kept_count(lt, alive, None)

    def _matrix_kept_count(self, lt: LogicalTensor, alive: torch.Tensor, expert: int | None) -> int:
        o = self.opts
        keep = self._keep(lt, expert)
        if o.method == "magnitude":
            return min(keep, count_nonzero_values(alive))
        if o.method == "wanda":
            return wanda_kept_count(alive, keep=keep, nm=o.nm)
        return sparsegpt_kept_count(alive, keep=keep, nm=o.nm, blocksize=o.blocksize)

    def _place_targets(self, model: BlockModel) -> None:
        for lt in self.targets:
            found = model.piece_of(lt.name)
            if found is None:
                raise SparsetoolError(
                    f"tensor {lt.name!r} is not a parameter of the {model.kind} "
                    "model; leave it out with --exclude"
                )
            own, piece = found
            i = next((j for j, names in enumerate(model.blocks) if own in names), None)
            if i is None:
                raise SparsetoolError(
                    f"tensor {lt.name!r} is outside the transformer blocks ({model.block_prefix}.N); "
                    f"--method {self.opts.method} prunes block weights only: leave it out with --exclude"
                )
            owner, _, attr = own.rpartition(".")
            module = model.module.get_submodule(owner)
            if not _is_experts(module):
                self._where[own] = _Place(lt, own, piece)
                self._by_block.setdefault(i, []).append((own, lt))
                continue
            if not hasattr(module, "has_gate"):  # not transformers' experts interface (Llama 4)
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: the experts of {type(module).__name__} "
                    "are not called with each token's chosen experts and routing weights, so "
                    f"--method {self.opts.method} cannot tell which tokens each expert sees; prune "
                    "them by magnitude, or leave them out with --exclude '*.experts.*'"
                )
            part = "out" if attr.startswith("down") else "in"
            transposed = bool(module.is_transposed)
            if piece.index and not transposed:  # one expert's matrix
                self._where[lt.name] = _Place(lt, own, piece, module, int(piece.index[0]), part)
                self._by_block.setdefault(i, []).append((lt.name, lt))
            elif not piece.index and transposed == (
                self.target_plan[lt.name].layout == "stacked_t"
            ):
                for e in range(lt.shape[0]):  # every expert's matrix, each a unit of its own
                    key = f"{lt.name}[{e}]"
                    self._where[key] = _Place(lt, own, piece, module, e, part, slot=True)
                    self._by_block.setdefault(i, []).append((key, lt))
            else:
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: its experts are stored "
                    f"{'(in, out)' if self.target_plan[lt.name].layout == 'stacked_t' else '(out, in)'}"
                    f" but the model reads them the other way; --method {self.opts.method} cannot "
                    "prune it: prune it by magnitude, or leave it out with --exclude"
                )

    def expected_inputs(self, block: int) -> list[list[str]]:
        """The plan's guess, before anything runs, of which targeted tensors of ``block`` read one
        input: the query/key/value projections of one attention module, and the feed-forward input
        projections (gate, up) of one module, when they take as many inputs; every other layer its
        own. :class:`BlockStatistics` sees the real sharing when the block runs (``shared``); this
        is for the memory plan."""
        return [
            [lt.name for _key, lt in group]
            for group in self._expected_groups(self._by_block.get(block, []))
        ]

    def _expected_groups(
        self, pairs: list[tuple[str, LogicalTensor]]
    ) -> list[list[tuple[str, LogicalTensor]]]:
        groups: dict[tuple, list[tuple[str, LogicalTensor]]] = {}
        for key, lt in pairs:
            place = self._where[key]
            role = self.target_plan[lt.name].role
            if place.expert is not None:  # an expert's gate and up read its routed tokens
                group = (place.own.rpartition(".")[0], place.expert, place.part)
            elif role in ("qkv", "ffn_in"):
                group = (role, place.own.rpartition(".")[0].rpartition(".")[0], self._n_in(lt))
            else:
                group = (key,)
            groups.setdefault(group, []).append((key, lt))
        return list(groups.values())

    def _memory_plan(self, model: BlockModel, seq: int) -> MemoryPlan:
        """The run's peak, and how each block's statistics are gathered: in one pass of the
        windows through the block, or, when a block's statistics would not fit (a mixture of
        experts with SparseGPT: an ``in x in`` matrix per expert), in as few passes as fit, each
        gathering and pruning some of the block's inputs (an expert's, a tensor of every
        expert's whole) from the block as the earlier passes left it (``_passes``)."""
        o = self.opts
        hidden = o.samples * seq * model.width * model.dtype.itemsize
        total, source = budget(o.max_memory)
        plan = MemoryPlan(
            fixed=process_memory(),
            weights=max(model.largest_block_bytes, model.bytes_of(model.outer)),
            activations=2 * hidden + model.block_work_bytes(1, seq) + self._routed_bytes(seq),
            statistics=0,
            budget=total,
            budget_source=source,
        )
        room = total - plan.peak
        most = 1
        for i, pairs in self._by_block.items():
            atoms = self._atoms(pairs)
            passes: list[list[tuple[list[str], int, int]]] = [[]]
            for atom in atoms:
                if passes[-1] and self._statistics_peak(passes[-1] + [atom]) > room:
                    passes.append([])
                passes[-1].append(atom)
            self._passes[i] = [[k for keys, _size, _cost in p for k in keys] for p in passes]
            plan.statistics = max(plan.statistics, max(map(self._statistics_peak, passes)))
            most = max(most, len(passes))
        if most > 1:
            self.notes.append(
                f"a block's statistics do not fit in memory at once: blocks are calibrated in up "
                f"to {most} passes of the windows, each pruning some of the block's layers from "
                "the block as the earlier passes left it (more memory: one pass, and sooner)"
            )
        return plan

    def _routed_bytes(self, seq: int) -> int:
        """A window's routed inputs of every expert, held while its statistics are added: the
        hidden states each token's experts read and their gated products, as they are and
        scaled by the routing weights (float32 at most)."""
        widths = [self._n_in(p.lt) for p in self._where.values() if p.expert is not None]
        if not widths:
            return 0
        k = int(getattr(getattr(self.model.module, "config", None), "num_experts_per_tok", 1) or 1)
        return 2 * seq * k * (self.model.width + max(widths)) * 4

    def _atoms(self, pairs: list[tuple[str, LogicalTensor]]) -> list[tuple[list[str], int, int]]:
        """A block's inputs as (keys, statistics bytes, largest solve's bytes), in block order;
        the experts of a tensor of every expert are one (it is pruned whole)."""
        o = self.opts
        per_input = 8 * (o.method == "wanda" or o.allocation == "owl") + 16 * (o.refine == "dsnot")
        atoms: list[tuple[list[str], int, int]] = []
        joined: dict[str, int] = {}  # a tensor of every expert -> the atom holding its experts
        for group in self._expected_groups(pairs):
            n_in = self._n_in(group[0][1])
            size = (n_in * n_in * 4 if o.method == "sparsegpt" else 0) + n_in * per_input
            cost = max(self._solve_bytes(lt) for _key, lt in group)
            keys = [key for key, _lt in group]
            fused = [lt.name for key, lt in group if self._where[key].slot]
            at = next((joined[n] for n in fused if n in joined), None)
            if at is None:
                atoms.append((keys, size, cost))
                at = len(atoms) - 1
            else:
                old = atoms[at]
                atoms[at] = (old[0] + keys, old[1] + size, max(old[2], cost))
            joined.update({n: at for n in fused})
        return atoms

    def _statistics_peak(self, atoms: list[tuple[list[str], int, int]]) -> int:
        """The most one pass over these inputs holds: all their statistics while the windows run
        (with SparseGPT's product of ``ROWS`` rows), then, inputs solved from the cheapest, each
        solve beside the statistics not yet dropped."""
        if not atoms:
            return 0
        held = sum(size for _keys, size, _cost in atoms)
        n_in = max(self._n_in(self._where[k].lt) for keys, _s, _c in atoms for k in keys)
        peak = held + (ROWS * n_in * 4 if self.opts.method == "sparsegpt" else 0)
        for _keys, size, cost in sorted(atoms, key=lambda a: a[2]):
            peak = max(peak, held + cost)
            held -= size
        return peak

    def _solve_bytes(self, lt: LogicalTensor) -> int:
        """What pruning one tensor holds beside the statistics and the block. SparseGPT: its
        alive mask, the weight in float32 (updated in place) and the kept mask, with a slice of
        ``ROWS`` rows of the solve's product; then the kept mask and its inverse and the stored
        values written. Wanda: the weight in float32 a few times."""
        refine = 0
        if self.opts.refine == "dsnot":  # the weight kept as it was, and a slice of rows sorted
            refine = lt.numel * 4 + min(lt.numel, 1 << 21) * 6 * 8
        if self.opts.method != "sparsegpt":
            return 3 * lt.numel * 4 + refine
        stored = lt.dtype.itemsize
        return lt.numel * max(1 + 4 + 1, stored + 4 + 2) + ROWS * self._n_in(lt) * 4 + refine

    # ------------------------------------------------------------------ the block-by-block run
    def run(self, sink: Sink) -> None:
        """Prune every targeted tensor, block by block, handing each to ``sink`` when done."""
        model = self.model
        assert model is not None and self._windows is not None, "prepare() first"
        if not self._reads_inputs:  # magnitude with OWL's counts: no forward pass left to run
            try:
                for i, lt in enumerate(self.targets):
                    self._prune(lt, [(None, None)], sink)
                    if self.progress:
                        self.progress("prune", i + 1, len(self.targets))
            finally:
                model.close()
            return
        try:
            with torch.no_grad():
                calls = model.capture([row.unsqueeze(0) for row in self._windows])
                last = max(self._by_block)
                for i in range(last + 1):
                    model.load_block(i)
                    pairs = self._by_block.get(i, [])
                    if pairs:
                        self._prune_block(i, dict(pairs), calls, sink)
                    if i < last:
                        calls = [c.passed(model.run_block(i, c)) for c in calls]
                    model.release_block(i)
                    if self.progress:
                        self.progress("calibrate", i + 1, last + 1)
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
        return self._reads_inputs and any(p.expert is not None for p in self._where.values())

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
    def _reads_inputs(self) -> bool:
        """Whether the masks need each layer's inputs (all but magnitude without DSnoT)."""
        return self.opts.method != "magnitude" or self.opts.refine != "none"

    def _gather(
        self,
        i: int,
        layers: dict[str, LogicalTensor],
        calls: list[Call],
        *,
        hessian: bool,
        moments: bool,
        outputs: list | None = None,
    ) -> BlockStatistics:
        """Run every window through block ``i`` (loaded) with hooks on its targeted ``layers``;
        the block's outputs go into ``outputs`` when it is given (the block as it is now)."""
        model = self.model
        stats = BlockStatistics(
            {key: self._n_in(lt) for key, lt in layers.items()}, hessian, model.device, moments
        )
        hooks = []
        experts: dict[str, tuple[torch.nn.Module, dict[int, dict[str, list[str]]]]] = {}
        for key in layers:
            place = self._where[key]
            owner = place.own.rpartition(".")[0]
            if place.experts is None:
                hooks.append(
                    model.module.get_submodule(owner).register_forward_hook(stats.hook(key))
                )
            else:
                units = experts.setdefault(owner, (place.experts, {}))[1]
                units.setdefault(place.expert, {}).setdefault(place.part, []).append(key)
        for module, units in experts.values():
            hooks.append(
                module.register_forward_pre_hook(
                    stats.experts_hook(module, units), with_kwargs=True
                )
            )
        try:
            for call in calls:
                out = model.run_block(i, call)
                if outputs is not None:
                    outputs.append(call.passed(out))
                stats.window_done()
        finally:
            for h in hooks:
                h.remove()
        return stats

    def _allocate(self) -> None:
        """OWL: one pass of the dense model, block by block, counting each block's outlier
        ratio; then each tensor's kept count from its block's sparsity (masks/owl.py)."""
        model, o = self.model, self.opts
        last = max(self._by_block)
        ratios: list[float] = []
        blocks: list[dict[str, int]] = []
        with torch.no_grad():
            calls = model.capture([row.unsqueeze(0) for row in self._windows])
            for i in range(last + 1):
                pairs = self._by_block.get(i, [])
                model.load_block(i)
                outputs: list[Call] = []  # the dense block's outputs: the next block's inputs
                if pairs:
                    layers = dict(pairs)
                    stats = self._gather(
                        i,
                        layers,
                        calls,
                        hessian=False,
                        moments=False,
                        outputs=outputs if i < last else None,
                    )
                    count = OutlierCount(o.owl_m)
                    by_tensor: dict[str, tuple[LogicalTensor, list[str]]] = {}
                    for key, lt in layers.items():  # a tensor of every expert: read once
                        by_tensor.setdefault(lt.name, (lt, []))[1].append(key)
                    for add in (count.add_sum, count.add_count):
                        for lt, keys in by_tensor.values():
                            dense = self._dense(lt)
                            for key in keys:
                                place = self._where[key]
                                add(
                                    dense[place.expert] if place.slot else dense,
                                    stats.of(key).sq.cpu(),
                                )
                            del dense
                    ratios.append(count.ratio)
                    blocks.append({lt.name: lt.numel for lt in layers.values()})
                if i < last:
                    calls = outputs or [c.passed(model.run_block(i, c)) for c in calls]
                model.release_block(i)
                if self.progress:
                    self.progress("outliers", i + 1, last + 1)
        del calls
        sparsities = owl_sparsities(
            ratios, [sum(b.values()) for b in blocks], o.sparsity, o.owl_lambda
        )
        self.keep = owl_keep(blocks, sparsities, o.sparsity)
        self.allocation = [
            {
                "block": b,
                "outlier_ratio": r,
                "sparsity": block_sparsity(self.keep, block),
                "targeted": sum(block.values()),
                "kept": sum(self.keep[n] for n in block),
            }
            for b, r, block in zip(sorted(self._by_block), ratios, blocks)
        ]

    def _dense(self, lt: LogicalTensor) -> torch.Tensor:
        """A targeted weight as stored, (out, in) (or (experts, out, in)), in float32 (pruned
        positions are zeros)."""
        dense, _alive = read_alive_tensors(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        return self._oriented(lt, dense).float()

    def _prune_block(
        self, i: int, layers: dict[str, LogicalTensor], calls: list[Call], sink: Sink
    ) -> None:
        """Prune block ``i``'s targeted ``layers`` (key -> tensor) in the passes the memory plan
        chose (one, unless the statistics do not fit at once): each gathers its layers'
        statistics over every window, then prunes them, dropping an input's statistics after its
        last layer. A tensor of every expert is pruned whole, each expert's matrix from its own
        statistics, when the first of its experts comes."""
        passes = self._passes.get(i) or [list(layers)]
        self.shared[i] = []
        for keys in passes:
            self._prune_pass(i, {k: layers[k] for k in keys}, calls, sink)

    def _prune_pass(
        self, i: int, layers: dict[str, LogicalTensor], calls: list[Call], sink: Sink
    ) -> None:
        o = self.opts
        stats = self._gather(
            i, layers, calls, hessian=o.method == "sparsegpt", moments=o.refine == "dsnot"
        )
        self.shared[i] += [[layers[key].name for key in group] for group in stats.groups()]
        slots: dict[str, list[str]] = {}
        for key, lt in layers.items():
            if self._where[key].slot:
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
        o = self.opts
        dense, alive = read_alive_tensors(self.ckpt, lt, nan_means_pruned=self.nan_ok)
        # The statistics were gathered on the device; the selection and the solve run on the CPU.
        w, alive = self._oriented(lt, dense).float(), self._oriented(lt, alive)
        stored, copied = dense.dtype, w.dtype != dense.dtype
        if o.method == "sparsegpt":  # its output is the updated weights: the stored ones can go
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
        stored_new = self._oriented(lt, new)
        place = self._where.get(units[0][0]) if units[0][0] is not None else None
        if place is not None and place.piece.index:  # one expert's matrix
            self.model.set_piece(place.own, place.piece, stored_new)
        elif place is not None:
            self.model.set_weight(
                place.own, stored_new
            )  # the next inputs come from the pruned block
        kept = self._oriented(lt, kept).contiguous()
        if count_nonzero_values(kept) != self.nonzero_after[lt.name]:
            raise CheckpointError(
                f"tensor {lt.name!r}: kept {plural(count_nonzero_values(kept), 'weight')} "
                f"where {self.nonzero_after[lt.name]:,} were planned; please report this"
            )
        values = stored_new.to(stored).contiguous() if o.method == "sparsegpt" else dense
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
        """One matrix (out, in) of ``lt``: (its new values, its kept mask) by the method; ``w`` may
        be overwritten when ``copied`` (it is a float32 copy of the stored values).

        An expert's matrix whose expert was routed fewer calibration tokens than
        ``--expert-min-tokens`` is pruned by magnitude, in its method's comparison groups (Wanda
        with every input norm 1: each row's largest weights; SparseGPT with ``X^T X`` the
        identity: each column block's, no update)."""
        o = self.opts
        place = self._where.get(key) if key is not None else None
        few = False
        name = f"{lt.name}[{expert}]" if expert is not None else lt.name
        if place is not None and place.expert is not None and stats is not None:
            self.routed[name] = stats.tokens
            few = stats.tokens < o.expert_min_tokens and o.method != "magnitude"
            if few:
                self.fallback.append(name)
        keep = self._keep(lt, expert)
        refine = o.refine == "dsnot" and not few
        if o.method == "sparsegpt" and few:
            identity = inverse_hessian_factor(torch.eye(w.shape[1]), o.dampening, overwrite=True)
            return sparsegpt_update(
                w,
                identity,
                keep=keep,
                nm=o.nm,
                existing=alive,
                blocksize=o.blocksize,
                overwrite=copied,
            )
        if o.method == "sparsegpt":
            if stats.factor is None:  # the first layer of this input: X^T X becomes the factor
                h, stats.h = stats.h.cpu(), None  # from a GPU: a copy, and the GPU's is dropped
                stats.factor = inverse_hessian_factor(h, o.dampening, overwrite=True)
                del h
            new, kept = sparsegpt_update(
                w,
                stats.factor,
                keep=keep,
                nm=o.nm,
                existing=alive,
                blocksize=o.blocksize,
                overwrite=copied and not refine,
            )
        elif o.method == "wanda":
            norms = torch.ones(w.shape[1], dtype=torch.float64) if few else stats.sq.cpu()
            kept = wanda_mask(w, norms, keep=keep, nm=o.nm, existing=alive)
        else:
            kept = magnitude_mask(w, keep=keep, existing=alive)
        if refine:
            mean, var = stats.moments()
            kept, swaps = dsnot_refine(
                w,
                kept,
                mean=mean,
                var=var,
                sq_norms=stats.sq.cpu(),
                window=self.opts.seq,
                alive=alive,
                iterations=o.dsnot_iterations,
                threshold=o.dsnot_threshold,
            )
            self.swaps += swaps
            if o.method == "sparsegpt":  # the refined mask's pruned weights, compensated
                del new
                new, kept = sparsegpt_update(
                    w, stats.factor, fixed=kept, blocksize=o.blocksize, overwrite=copied
                )
        if o.method != "sparsegpt":
            new = w * kept
        return new, kept
