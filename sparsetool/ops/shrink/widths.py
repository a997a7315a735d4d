"""``shrink --ffn F``, ``--heads F`` and ``--hidden F``: narrower feed-forward layers, fewer
attention heads and fewer embedding channels, ranked by their activations on calibration text
(Minitron's criterion), every layer to the same width so the config holds it.

The calibration windows run through the model block by block (one block in memory). In each
block a hook on the FFN's down projection reads its input, one value per channel and token, and
a hook on the attention's output projection reads its input, one ``head_dim`` slice per query
head:

- a channel's score is ``mean_t |a_c(t)|``; each layer keeps its ``round(F x d_ff)`` best;
- a query head's score is ``mean_t ||o_h(t)||_2``. Under grouped-query attention (several query
  heads share a key/value head) whole key/value groups go, ``round(F x n_kv_heads)`` of them,
  when ``F x n_kv_heads`` is a whole number (a group scores the sum of its heads) or each group
  is one head (plain multi-head attention), else the same number of query heads in every group
  (``round(F x heads per group)``): both are what ``num_attention_heads`` /
  ``num_key_value_heads`` express, and the result says which was done, with a note when the
  heads kept are not the whole number nearest ``F x heads`` (0.5 of 9 heads in 3 groups: 6);
- an embedding channel (one dimension of the hidden size, which every block reads and adds to)
  scores ``sum_n mean_t |y_n,c(t)|`` over the outputs ``y_n`` of every norm the hidden size runs
  through (each block's and the final one); the model keeps its ``round(F x hidden)`` best, the
  same channels everywhere.

The output keeps the input's layout: gate/up rows (and biases) and down columns of the kept
channels; q rows, k/v rows of the kept groups and o columns of the kept heads; ``config.json``'s
``intermediate_size`` (GPT-2: ``n_inner``), ``num_attention_heads``, ``num_key_value_heads``
lowered and ``head_dim`` written out. ``--hidden``: the embedding's and the head's columns, the
columns of every projection that reads the hidden states (q/k/v, gate/up), the rows (and biases)
of those that write them (o, down) and the norms' entries of the kept channels, ``hidden_size``
lowered; a tensor whose use of the hidden size is not one of these is refused before anything is
written. Everything else is copied byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.spill import TensorSpill
from sparsetool.checkpoint.writer import CheckpointWriter
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.models.open import open_model
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.shrink.kind import Shrinking, run_kind
from sparsetool.ops.shrink.memory import renorm_bytes, widths_statistics
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.refit import DAMPENING, Gram, refit_columns
from sparsetool.ops.shrink.renorm import refit_readers
from sparsetool.ops.shrink.results import (
    HeadsKept,
    HiddenKept,
    LeastSquares,
    ShrinkResult,
    Width,
    WidthsNarrowed,
)
from sparsetool.ops.shrink.windows import shrink_windows
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = ["shrink_widths"]

NEEDS = "shrink narrows causal language models (Hugging Face directories)"
FFN_IN = ("gate_proj", "up_proj", "c_fc")  # read the block's input; rows = channels
FFN_OUT = ("down_proj", "c_proj")  # reads the channels
READS_HIDDEN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # columns: the hidden size
WRITES_HIDDEN = ("o_proj", "down_proj")  # rows (and bias): the hidden size
PER_HEAD_NORMS = ("q_norm", "k_norm")  # over heads' widths, not the hidden size


@dataclass
class Cut:
    """One stored tensor cut to the indices ``axes[axis]`` along each of its cut axes (stored
    orientation): a query projection loses rows to ``--heads`` and columns to ``--hidden``."""

    axes: dict[int, list[int]] = field(default_factory=dict)


@dataclass
class _Layer:
    """One block's FFN and attention modules (model paths) and their scores."""

    ffn_in: list[str] = field(default_factory=list)  # gate/up (or c_fc) module paths
    ffn_out: str = ""
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    norms: list[str] = field(default_factory=list)  # --hidden: norms over the hidden size
    channels: torch.Tensor | None = None
    heads: torch.Tensor | None = None
    tokens: int = 0
    gram_ffn: Gram | None = None  # the down projection's inputs (reconstruction)
    gram_o: Gram | None = None  # the output projection's inputs (reconstruction)


@dataclass
class _Hidden:
    """``--hidden``: each embedding channel's summed |norm output| and the tokens seen."""

    sums: torch.Tensor | None = None
    tokens: int = 0
    keep: int = 0  # channels kept
    axes: dict[str, int | None] = field(default_factory=dict)  # parameter -> its hidden axis


def shrink_widths(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Narrow the FFNs (``opts.ffn``), the attention (``opts.heads``) and/or the embedding
    channels (``opts.hidden``) of the model at ``path`` into ``out``; see the module docstring."""
    return run_kind(WidthsKind(opts), path, out, opts, progress=progress, on_plan=on_plan)


class WidthsKind:
    """``--ffn``, ``--heads``, ``--hidden`` as a :class:`~sparsetool.ops.shrink.kind.ShrinkKind`:
    every check needs the opened model (its blocks and widths)."""

    key = "widths"
    needs = NEEDS

    def __init__(self, opts: ShrinkOptions):
        self.opts = opts

    def plan(self, path: Path, config: dict[str, Any], cfg: Any) -> None:
        """Nothing before the model opens (sparsetool's GPT, a file without config.json: refused
        by the skeleton's read of the config)."""

    def open(self, path: Path) -> BlockModel:
        return open_model(path, self.opts.dtype, self.opts.device, needs=NEEDS, attention="eager")

    def choose(
        self,
        model: BlockModel,
        text: str | None,
        result: ShrinkResult,
        held: contextlib.ExitStack,
        progress: Progress | None,
        on_plan: Callable[[MemoryPlan], None] | None,
    ) -> Shrinking:
        opts = self.opts
        assert text is not None
        cfg = model.module.config
        layers = [_find(model, i, opts) for i in range(len(model.blocks))]
        geometry = _geometry(model, cfg, opts)
        plan = _plan(geometry, opts, str(model.path))  # none or all: refused before any text
        result.notes += plan.notes
        hidden = _Hidden() if opts.hidden is not None else None
        if hidden is not None:  # refuse what --hidden cannot narrow before any text is run
            hidden.axes = _hidden_axes(model)
            hidden.keep = _hidden_keep(model, opts)
        _check_divides(cfg, plan, geometry, model.width, hidden.keep if hidden else None, opts)
        if hidden is not None and not any(layer.norms for layer in layers):
            raise SparsetoolError(
                f"{model.path}: its blocks have no norm with weights over the hidden size "
                "(as OLMo's, without weights), whose outputs --hidden ranks channels by"
            )
        renorm = opts.reconstruct and opts.hidden is not None
        spill: TensorSpill | None = None
        if _refits(opts) or renorm:  # the refit tensors wait on disk beside the output
            spill = TensorSpill(result.output)
            held.callback(spill.close)
        refit = None  # --ffn/--heads refit in the scoring pass; --hidden's readers after it
        if _refits(opts) and spill is not None:
            refit = _Refitter(model, layers, geometry, plan, spill)
        statistics = _statistics(model, layers, geometry, plan) if refit is not None else 0
        if renorm and hidden is not None:  # its own pass, after the first
            widest = max(geometry.ffn, geometry.heads * geometry.head_dim)
            statistics = max(statistics, renorm_bytes(model.width, hidden.keep, widest))
        windows = shrink_windows(model, opts, text, result, statistics=statistics, on_plan=on_plan)
        _score(model, layers, windows, progress, hidden, refit)
        if refit is None:
            cuts, record = _choose(model, layers, geometry, plan)
        else:
            cuts, record = refit.cuts, refit.record()
        values: dict[str, int | None] = refit.values if refit is not None else {}
        if hidden is not None:
            # head_dim written out: the config's default, hidden size / heads, no longer holds
            record.hidden = _cut_hidden(model, hidden, geometry.head_dim, cuts, result)
            if renorm and spill is not None:
                found = refit_readers(model, windows, record.hidden.kept, spill, values, progress)
                record.hidden.refit = LeastSquares.of_readers(found)
                result.notes.append(
                    "--hidden: the residual stream's removed channels are sliced out of the "
                    "embeddings, the head and the rows of what writes them (no least-squares "
                    "answer brings them back); what reads each RMS norm is refit"
                    + (
                        f" (not: {', '.join(found['not_refit'])}, not RMS norms)"
                        if found["not_refit"]
                        else ""
                    )  # fmt: skip
                )
        result.widths = record
        ckpt = model.ckpt
        return Shrinking(
            record=record.to_json(),
            config=lambda config: _config(config, cfg, record),
            write=lambda cw: _write(ckpt, cw, cuts, values, spill),
            removed=lambda: sum(_removed(ckpt, n, cut) for n, cut in cuts.items()),
        )


def _find(model: BlockModel, i: int, opts: ShrinkOptions) -> _Layer:
    """Block ``i``'s FFN and attention projections, by the names transformers gives them."""
    block = model.block_list[i]
    base = f"{model.block_prefix}.{i}"
    layer = _Layer()
    names = dict(block.named_modules())
    if opts.ffn is not None:
        mlp = next((n for n in ("mlp", "feed_forward") if n in names), None)
        found_in = [f"{mlp}.{p}" for p in FFN_IN if f"{mlp}.{p}" in names] if mlp else []
        found_out = [f"{mlp}.{p}" for p in FFN_OUT if f"{mlp}.{p}" in names] if mlp else []
        if not found_in or len(found_out) != 1:
            raise SparsetoolError(
                f"{model.path}: block {i} has no feed-forward layer shrink knows (gate_proj/"
                "up_proj/down_proj or c_fc/c_proj under mlp); --ffn cannot narrow it"
            )
        layer.ffn_in = [f"{base}.{n}" for n in found_in]
        layer.ffn_out = f"{base}.{found_out[0]}"
    if opts.heads is not None or opts.hidden is not None:
        attn = next((n for n in ("self_attn", "attn") if n in names), None)
        parts = {p: f"{attn}.{p}_proj" for p in "qkvo"} if attn else {}
        if not parts or any(n not in names for n in parts.values()):
            what = (
                "--heads cannot remove heads of it"
                if opts.heads is not None
                else "--hidden cannot narrow it"
            )
            raise SparsetoolError(
                f"{model.path}: block {i}'s attention has no separate q_proj, k_proj, v_proj and "
                "o_proj (a fused projection, GPT-2's c_attn, holds every head in one matrix whose "
                f"width the config ties to the hidden size); {what}"
            )
        if opts.heads is not None:
            layer.q, layer.k, layer.v, layer.o = (f"{base}.{parts[p]}" for p in "qkvo")
    if opts.hidden is not None:
        layer.norms = [f"{base}.{n}" for n, m in names.items() if _is_norm(model, m, n)]
    return layer


def _is_norm(model: BlockModel, module: torch.nn.Module, name: str) -> bool:
    """Whether ``module`` (``name`` in its block or model) normalises over the hidden size."""
    weight = getattr(module, "weight", None)
    leaf = name.rsplit(".", 1)[-1]
    return (
        "norm" in leaf.lower()
        and leaf not in PER_HEAD_NORMS
        and isinstance(weight, torch.Tensor)
        and weight.ndim == 1
        and weight.shape[0] == model.width
    )


@dataclass(frozen=True)
class _Geometry:
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int


def _geometry(model: BlockModel, cfg, opts: ShrinkOptions) -> _Geometry:
    heads = int(getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_head", 0) or 0)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or (model.width // max(heads, 1)))
    ffn = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 0)
    if opts.ffn is not None and not ffn:
        ffn = 4 * model.width  # GPT-2's default n_inner
    return _Geometry(heads, kv, head_dim, ffn)


def _statistics(model: BlockModel, layers: list[_Layer], g: _Geometry, plan: _Plan) -> int:
    """The most a block's refits hold (:func:`~sparsetool.ops.shrink.memory.widths_statistics`)."""
    layer = layers[0]
    ffn = (g.ffn, plan.keep_ffn) if layer.ffn_out and plan.keep_ffn is not None else None
    heads = None
    if layer.o:
        heads = (g.heads * g.head_dim, plan.kept_groups * plan.per_group * g.head_dim)
    bias = bool(layer.ffn_out) and _stored(model, f"{layer.ffn_out}.bias") is not None
    return widths_statistics(width=model.width, ffn=ffn, heads=heads, bias=bias)


def _score(
    model: BlockModel,
    layers: list[_Layer],
    windows: torch.Tensor,
    progress: Progress | None,
    hidden: _Hidden | None = None,
    refit: _Refitter | None = None,
) -> None:
    """Each layer's channel and head scores, and the embedding channels' (``hidden``), from the
    calibration windows: of the original model, or with ``refit`` of the model as shrunk so far
    (each block cut and refit once scored, then run again for the next block's inputs)."""
    blocks = BlockPass(model, windows, "score", progress, final=hidden is not None)
    for step in blocks:
        i, layer = step.index, layers[step.index]
        handles = []
        if layer.ffn_out:
            handles.append(_hook(model, layer.ffn_out, layer, "channels", None))
        if layer.o:
            handles.append(_hook(model, layer.o, layer, "heads", _head_dim(model, layer)))
        if hidden is not None:
            handles += [_norm_hook(model, n, hidden) for n in layer.norms]
        if refit is not None:
            handles += refit.hooks(layer)
        try:
            step.run()
        finally:
            for h in handles:
                h.remove()
        if refit is not None:
            refit.block(i)  # this block cut and refit in memory: run it again
            step.run()
    if hidden is not None:
        with torch.no_grad():
            hidden.tokens = sum(int(row.numel()) for row in windows)
            _final_norm_scores(model, blocks.calls, hidden)


def _norm_hook(model: BlockModel, path: str, hidden: _Hidden):
    """A forward hook on the norm ``path`` adding its output's per-channel sum of |y|."""

    def see(module, args, output) -> None:
        _add_abs(hidden, output[0] if isinstance(output, tuple) else output)

    return model.module.get_submodule(path).register_forward_hook(see)


def _add_abs(hidden: _Hidden, y: torch.Tensor) -> None:
    add = y.reshape(-1, y.shape[-1]).float().abs().double().sum(0).cpu()
    hidden.sums = add if hidden.sums is None else hidden.sums + add


def _final_norm_scores(model: BlockModel, calls: list, hidden: _Hidden) -> None:
    """The final norms' outputs (the head's input) on the last block's outputs ``calls``."""
    norms = {n.rsplit(".", 1)[0] for n in model.outer} - {""}
    found = [n for n in sorted(norms) if _is_norm(model, model.module.get_submodule(n), n)]
    names = [p for p in model.outer if p.rsplit(".", 1)[0] in found]
    model.load(names)
    try:
        for n in found:
            norm = model.module.get_submodule(n)
            for call in calls:
                _add_abs(hidden, norm(call.hidden))
    finally:
        model.release(names)


def _head_dim(model: BlockModel, layer: _Layer) -> int:
    cfg = model.module.config
    return int(getattr(cfg, "head_dim", None) or model.width // int(cfg.num_attention_heads))


def _hook(model: BlockModel, path: str, layer: _Layer, what: str, head_dim: int | None):
    """A forward pre-hook on ``path`` adding its input's per-channel mean |x| (or per-head mean
    L2 norm, ``head_dim`` wide slices) into ``layer``."""

    def see(module, args, kwargs) -> None:
        x = args[0] if args else next(iter(kwargs.values()))
        x = x.reshape(-1, x.shape[-1]).float()
        if head_dim is None:
            add = x.abs().double().sum(0)
        else:
            add = x.view(x.shape[0], -1, head_dim).norm(dim=-1).double().sum(0)
        old = getattr(layer, what)
        setattr(layer, what, add.cpu() if old is None else old + add.cpu())
        if what == "channels" or not layer.ffn_out:
            layer.tokens += x.shape[0]

    return model.module.get_submodule(path).register_forward_pre_hook(see, with_kwargs=True)


@dataclass(frozen=True)
class _Plan:
    """What ``--ffn`` and ``--heads`` keep per layer, checked before any text runs."""

    keep_ffn: int | None
    mode: str | None  # "groups", "query heads per group", or None: heads kept
    kept_groups: int
    per_group: int
    ffn: Width | None  # --ffn: the channels per layer before and after
    heads: HeadsKept | None  # --heads
    notes: list[str] = field(default_factory=list)  # a kept fraction not the one asked


def _check_kept(flag: str, f: float, kept: int, total: int, what: str, rule: str) -> None:
    """A :class:`UsageError` when ``flag f`` keeps none or all of ``total`` ``what`` (``rule``:
    how ``kept`` was counted, shown in the message)."""
    if 1 <= kept < total:
        return
    if kept < 1:
        raise UsageError(
            f"{flag} {f:g} keeps none of {what} ({rule} = 0); ask for a larger fraction"
        )
    raise UsageError(
        f"{flag} {f:g} keeps all of {what} ({rule} = {kept:,}); ask for a smaller fraction"
    )


def _rounded_away(f: float, kept: int, total: int) -> bool:
    """Whether ``kept`` of ``total`` is not the whole number nearest ``f x total`` (a tie is
    either neighbour): the fraction made is then not the fraction asked.

    >>> _rounded_away(0.5, 6, 9), _rounded_away(0.5, 4, 9), _rounded_away(0.6, 4, 8)
    (True, False, True)
    """
    return abs(kept - f * total) > 0.5 + 1e-9


def _plan(g: _Geometry, opts: ShrinkOptions, model: str = "the model") -> _Plan:
    """The widths ``opts`` asks for on geometry ``g``; a :class:`UsageError` for none or all.

    Heads: whole key/value groups (``round(F x kv-heads)`` of them) when ``F x kv-heads`` is
    whole or every group is one head (plain multi-head attention), else ``round(F x group)``
    query heads of every group; a note when that is not the fraction asked."""
    ffn: Width | None = None
    heads: HeadsKept | None = None
    notes: list[str] = []
    keep_ffn = None
    if opts.ffn is not None:
        keep_ffn = round(opts.ffn * g.ffn)
        _check_kept("--ffn", opts.ffn, keep_ffn, g.ffn, f"{model}'s {g.ffn:,} FFN channels per "
                   "layer", f"round({opts.ffn:g} x {g.ffn:,})")  # fmt: skip
        ffn = Width(g.ffn, keep_ffn)
    mode, kept_groups, per_group = None, g.kv_heads, g.heads // max(g.kv_heads, 1)
    if opts.heads is not None:
        f, group = opts.heads, g.heads // g.kv_heads
        what = f"{model}'s {g.heads} attention heads per layer"
        if g.kv_heads > 1 and (group == 1 or float(f * g.kv_heads).is_integer()):
            mode, kept_groups = "groups", round(f * g.kv_heads)
            rule = f"whole key/value groups: round({f:g} x {g.kv_heads})"
            _check_kept("--heads", f, kept_groups, g.kv_heads, what, rule)
        else:
            mode, per_group = "query heads per group", round(f * group)
            rule = f"heads are kept per key/value group of {group}: round({f:g} x {group})"
            _check_kept("--heads", f, per_group, group, what, rule)
            kept = kept_groups * per_group
            if _rounded_away(f, kept, g.heads):
                notes.append(
                    f"--heads {f:g} keeps {kept} of {plural(g.heads, 'head')} "
                    f"({kept / g.heads:.2f}): "
                    f"heads are kept per key/value group, round({f:g} x {group}) = {per_group} "
                    f"of each group of {group}"
                )
        kept = kept_groups * per_group
        heads = HeadsKept(mode, g.heads, g.kv_heads, kept, kept_groups, g.head_dim)
    return _Plan(keep_ffn, mode, kept_groups, per_group, ffn, heads, notes)


def _choose(
    model: BlockModel, layers: list[_Layer], g: _Geometry, plan: _Plan
) -> tuple[dict[str, Cut], WidthsNarrowed]:
    """The stored tensors to cut and how, and the record of what was kept."""
    cuts: dict[str, Cut] = {}
    record = WidthsNarrowed(ffn=plan.ffn, heads=plan.heads)
    for i, layer in enumerate(layers):
        record.layers.append(_choose_layer(model, i, layer, g, plan, cuts))
    return cuts, record


def _choose_layer(
    model: BlockModel, i: int, layer: _Layer, g: _Geometry, plan: _Plan, cuts: dict[str, Cut]
) -> dict:
    """Block ``i``'s kept channels and heads by its scores, their cuts added to ``cuts``; its
    record."""
    keep_ffn, mode, kept_groups, per_group = (
        plan.keep_ffn,
        plan.mode,
        plan.kept_groups,
        plan.per_group,
    )
    rec: dict = {"block": i}
    if keep_ffn is not None:
        assert layer.channels is not None, f"block {i}'s FFN never ran"
        score = layer.channels / max(layer.tokens, 1)
        kept = sorted(sorted(range(len(score)), key=lambda c: (-float(score[c]), c))[:keep_ffn])
        rec["ffn_kept"] = kept
        for p in layer.ffn_in:
            _cut_rows(model, p, kept, cuts, conv1d=p.endswith("c_fc"))
        _cut_cols(model, layer.ffn_out, kept, cuts, conv1d=layer.ffn_out.endswith("c_proj"))
    if mode is not None:
        assert layer.heads is not None, f"block {i}'s attention never ran"
        score = layer.heads / max(layer.tokens, 1)
        group = g.heads // g.kv_heads
        if mode == "groups":
            sums = score.view(g.kv_heads, group).sum(1)
            groups = sorted(
                sorted(range(g.kv_heads), key=lambda k: (-float(sums[k]), k))[:kept_groups]
            )
            heads = [k * group + j for k in groups for j in range(group)]
        else:
            groups = list(range(g.kv_heads))
            heads = []
            for k in groups:
                members = range(k * group, (k + 1) * group)
                best = sorted(members, key=lambda h: (-float(score[h]), h))[:per_group]
                heads += sorted(best)
        rec["heads_kept"], rec["kv_kept"] = heads, groups
        rows = [h * g.head_dim + d for h in heads for d in range(g.head_dim)]
        kv_rows = [k * g.head_dim + d for k in groups for d in range(g.head_dim)]
        _cut_rows(model, layer.q, rows, cuts)
        if mode == "groups":
            _cut_rows(model, layer.k, kv_rows, cuts)
            _cut_rows(model, layer.v, kv_rows, cuts)
        _cut_cols(model, layer.o, rows, cuts)
    return rec


def _refits(opts: ShrinkOptions) -> bool:
    """Whether the run refits: ``--ffn`` or ``--heads`` without ``--no-reconstruct``."""
    return opts.reconstruct and (opts.ffn is not None or opts.heads is not None)


class _Refitter:
    """``--ffn``/``--heads`` with reconstruction. Each block's kept channels and heads are chosen
    as soon as it is scored (on what the shrunk blocks before it feed it); the projections that
    read them (the FFN's down projection, attention's output projection) are refit by least
    squares on the block's calibration inputs (:mod:`sparsetool.ops.shrink.refit`) and put into
    the block in memory, the removed inputs' columns at zero (which computes what the narrower
    block computes), before the block runs again for the next one's inputs. The refit weights,
    in the stored dtype and orientation, wait for the writer; the ``X^T X`` of a block is freed
    once it is refit."""

    def __init__(
        self, model: BlockModel, layers: list[_Layer], g: _Geometry, plan: _Plan, spill: TensorSpill
    ):
        self.model, self.layers, self.geometry, self.plan = model, layers, g, plan
        self.cuts: dict[str, Cut] = {}
        # stored name -> the axis its refit tensor (in ``spill``: one tensor in memory at a time,
        # whatever the depth) is already cut along to the kept inputs; None: a bias
        self.values: dict[str, int | None] = {}
        self.spill = spill
        self.layer_records: list[dict] = []

    def hooks(self, layer: _Layer) -> list:
        """Forward pre-hooks gathering ``X^T X`` of the inputs of ``layer``'s projections."""
        handles = []
        if layer.ffn_out:
            layer.gram_ffn = Gram()
            handles.append(_gram_hook(self.model, layer.ffn_out, layer.gram_ffn))
        if layer.o:
            layer.gram_o = Gram()
            handles.append(_gram_hook(self.model, layer.o, layer.gram_o))
        return handles

    def block(self, i: int) -> None:
        """Choose block ``i``'s kept channels and heads, refit its projections (in memory)."""
        layer = self.layers[i]
        rec = _choose_layer(self.model, i, layer, self.geometry, self.plan, self.cuts)
        if layer.ffn_out and layer.gram_ffn is not None:
            conv1d = layer.ffn_out.endswith("c_proj")
            rec["ffn_refit"] = self._refit(layer.ffn_out, layer.gram_ffn, rec["ffn_kept"], conv1d)
        if layer.o and layer.gram_o is not None:
            hd = self.geometry.head_dim
            rows = [h * hd + d for h in rec["heads_kept"] for d in range(hd)]
            rec["o_refit"] = self._refit(layer.o, layer.gram_o, rows, False)
        layer.gram_ffn = layer.gram_o = None
        self.layer_records.append(rec)

    def _refit(self, path: str, gram: Gram, kept: list[int], conv1d: bool) -> dict:
        model = self.model
        module = model.module.get_submodule(path)
        stored_w = _stored(model, f"{path}.weight")
        stored_b = _stored(model, f"{path}.bias")
        if stored_w is None:
            raise SparsetoolError(f"{model.path}: {path}.weight is not stored; cannot refit it")
        w = model.ckpt.read_stored(stored_w)  # the stored precision, not the compute dtype's
        b = model.ckpt.read_stored(stored_b) if stored_b is not None else None
        fit = refit_columns(w.T if conv1d else w, gram, kept, bias=b)
        k = torch.tensor(kept, dtype=torch.long)
        full = torch.zeros((w.shape[1], w.shape[0]) if conv1d else w.shape, dtype=torch.float64)
        full[:, k] = fit.weight  # (out, in), the removed inputs' columns at zero
        weight = module.weight
        weight.copy_((full.T if conv1d else full).to(weight.dtype))
        kept_w = fit.weight.T if conv1d else fit.weight
        self._keep(stored_w, kept_w.to(w.dtype), 0 if conv1d else 1)
        if b is not None and stored_b is not None and fit.bias is not None:
            module.bias.copy_(fit.bias.to(module.bias.dtype))
            self._keep(stored_b, fit.bias.to(b.dtype), None)
        return fit.record()

    def _keep(self, name: str, t: torch.Tensor, axis: int | None) -> None:
        self.spill.put(name, t)
        self.values[name] = axis

    def record(self) -> WidthsNarrowed:
        """The widths' record with each layer's refit errors and their summary."""
        kinds = [k for k in ("ffn_refit", "o_refit") if any(k in r for r in self.layer_records)]
        fits = [r[k] for r in self.layer_records for k in kinds if k in r]
        names = {"ffn_refit": self.layers[0].ffn_out, "o_refit": self.layers[0].o}
        refit = LeastSquares(
            [names[k].rsplit(".", 1)[-1] for k in kinds],
            "least squares on the kept inputs' X^T X (float64), sequential",
            DAMPENING,
            sum(f["error_before"] for f in fits) / max(len(fits), 1),
            sum(f["error_after"] for f in fits) / max(len(fits), 1),
        )
        return WidthsNarrowed(self.plan.ffn, self.plan.heads, self.layer_records, refit)


def _gram_hook(model: BlockModel, path: str, gram: Gram):
    """A forward pre-hook on ``path`` adding its input into ``gram``."""

    def see(module, args, kwargs) -> None:
        gram.add(args[0] if args else next(iter(kwargs.values())))

    return model.module.get_submodule(path).register_forward_pre_hook(see, with_kwargs=True)


def _stored(model: BlockModel, param: str) -> str | None:
    pieces = model.sources.get(param)
    if not pieces:
        return None
    if len(pieces) != 1 or pieces[0].index:
        raise SparsetoolError(f"{model.path}: {param} is merged from several tensors; "
                              "shrink cannot cut it")  # fmt: skip
    return pieces[0].stored


def _cut_rows(model, module: str, rows: list[int], cuts: dict, conv1d: bool = False) -> None:
    """The output rows ``rows`` of a linear layer: weight rows (a Conv1D's columns) and bias."""
    w = _stored(model, f"{module}.weight")
    if w is not None:
        _cut(cuts, w, 1 if conv1d else 0, rows)
    b = _stored(model, f"{module}.bias")
    if b is not None:
        _cut(cuts, b, 0, rows)


def _cut_cols(model, module: str, cols: list[int], cuts: dict, conv1d: bool = False) -> None:
    """The input columns ``cols`` of a linear layer (a Conv1D's rows); its bias stays."""
    w = _stored(model, f"{module}.weight")
    if w is not None:
        _cut(cuts, w, 0 if conv1d else 1, cols)


def _cut(cuts: dict[str, Cut], stored: str, axis: int, keep: list[int]) -> None:
    cuts.setdefault(stored, Cut()).axes[axis] = keep


def _hidden_axes(model: BlockModel) -> dict[str, int | None]:
    """Each parameter's axis that spans the hidden size (None: none does), by what reads or
    writes the hidden states; a parameter used otherwise is a :class:`SparsetoolError`."""
    axes: dict[str, int | None] = {}
    params = [n for block in model.blocks for n in block] + model.outer + model.head
    for name in params:
        path, kind = name.rsplit(".", 1) if "." in name else ("", name)
        leaf = path.rsplit(".", 1)[-1]
        module = model.module.get_submodule(path)
        shape = tuple(model.module.get_parameter(name).shape)
        if isinstance(module, torch.nn.Embedding) or name in model.head or leaf in READS_HIDDEN:
            axis = 1 if kind == "weight" else None
        elif leaf in WRITES_HIDDEN or _is_norm(model, module, path):
            axis = 0
        elif leaf in PER_HEAD_NORMS:
            axis = None
        else:
            axis = -1
        if axis == -1 or (axis is not None and (len(shape) <= axis or shape[axis] != model.width)):
            raise SparsetoolError(
                f"{model.path}: --hidden narrows embeddings, norms, the head and the q/k/v/o and "
                f"gate/up/down projections; {name} (shape {list(shape)}) is none of these: the "
                "hidden size cannot be cut through it (Mixture-of-Experts and fused layouts are "
                "not narrowed)"
            )
        axes[name] = axis
    return axes


def _check_divides(
    cfg, plan: _Plan, g: _Geometry, before: int, keep: int | None, opts: ShrinkOptions
) -> None:
    """A :class:`UsageError` when the kept attention heads do not divide the kept hidden size
    and the model's transformers config refuses that (Llama's and Gemma-3's do, even with
    ``head_dim`` written out; Qwen's do not): the output would load nowhere."""
    if opts.heads is None and opts.hidden is None:
        return
    heads = plan.heads.heads_after if plan.heads is not None else g.heads
    width = before if keep is None else keep
    if not heads or width % heads == 0:
        return
    values = cfg.to_dict()
    try:
        type(cfg).from_dict(values)
    except Exception:  # the config does not round-trip as it is: a changed copy says nothing
        return
    values.update(hidden_size=width, num_attention_heads=heads)
    if "head_dim" in values:
        values["head_dim"] = g.head_dim
    try:
        type(cfg).from_dict(values)
        return
    except Exception as e:  # the config's own validation, quoted
        reason = str(e).strip().splitlines()[-1].strip()
    said = f"transformers refuses such a {type(cfg).__name__} ({reason})"
    if opts.hidden is None:
        raise UsageError(
            f"--heads {opts.heads:g} keeps {plural(heads, 'attention head')}, which do not "
            f"divide the hidden size {width:,}: {said}; ask for another --heads fraction"
        )
    lower = width // heads * heads
    near = [m for m in (lower, lower + heads) if 0 < m < before]
    offers = " or ".join(
        f"--hidden {m / before:.6g} ({m:,}{', a multiple of 32' if m % 32 == 0 else ''})"
        for m in near
    )
    raise UsageError(
        f"--hidden {opts.hidden:g} keeps {width:,} embedding channels, not a multiple of the "
        f"{plural(heads, 'attention head')} kept: {said}; ask for {offers or 'another fraction'}"
    )


def _hidden_keep(model: BlockModel, opts: ShrinkOptions) -> int:
    """The embedding channels ``--hidden`` keeps; a :class:`UsageError` for none or all."""
    assert opts.hidden is not None
    keep = round(opts.hidden * model.width)
    _check_kept("--hidden", opts.hidden, keep, model.width,
               f"{model.path}'s {model.width:,} embedding channels",
               f"round({opts.hidden:g} x {model.width:,})")  # fmt: skip
    return keep


def _cut_hidden(
    model: BlockModel, hidden: _Hidden, head_dim: int, cuts: dict[str, Cut], result: ShrinkResult
) -> HiddenKept:
    """The cuts of the embedding channels ``--hidden`` keeps, and their record."""
    width, keep = model.width, hidden.keep
    assert hidden.sums is not None, "no norm over the hidden size ran"
    score = hidden.sums / max(hidden.tokens, 1)
    kept = sorted(sorted(range(width), key=lambda c: (-float(score[c]), c))[:keep])
    for name, axis in hidden.axes.items():
        stored = _stored(model, name) if axis is not None else None
        if stored is not None:
            _cut(cuts, stored, axis, kept)
    if hasattr(model.module.get_input_embeddings(), "embed_scale"):
        result.notes.append(
            "the model scales its embeddings by sqrt(hidden_size) (Gemma); the narrower model "
            f"scales them by sqrt({keep}), not sqrt({width})"
        )
    return HiddenKept(width, keep, kept, head_dim)


def _write(
    ckpt: Checkpoint,
    cw: CheckpointWriter,
    cuts: dict[str, Cut],
    values: dict[str, int | None],
    spill: TensorSpill | None,
) -> None:
    """Every stored tensor, cut by ``cuts`` (a refit one from ``spill``: ``values`` names the
    axis it is already cut along, the other cuts still applied)."""
    lts = {lt.name: lt for lt in ckpt.logical}
    for name in cuts:
        lt = lts[name]
        if len(lt.stored) != 1 or lt.stored[0] != name:
            raise SparsetoolError(
                f"tensor {name!r} is stored in a sparse encoding ({', '.join(lt.stored)}); "
                "shrink cuts it as a plain tensor: run sparsetool densify on the model first"
            )
    for shard in ckpt.shards:
        specs = []
        for lt in ckpt.logical_in(shard):
            for part in lt.stored:
                e = ckpt.entry(part)
                shape = list(e.shape)
                for axis, keep in cuts[part].axes.items() if part in cuts else ():
                    shape[axis] = len(keep)
                specs.append(TensorSpec(part, e.st_dtype, tuple(shape)))
        with cw.shard(shard, specs) as sw:
            for spec in specs:
                cut = cuts.get(spec.name)
                if cut is None and spec.name not in values:
                    sw.copy_stored(spec.name, ckpt, spec.name)
                    continue
                if spill is not None and spec.name in values:
                    t, done = spill.get(spec.name), values[spec.name]
                else:
                    t, done = ckpt.read_stored(spec.name), None
                for axis, keep in cut.axes.items() if cut is not None else ():
                    if axis != done:
                        t = t.index_select(axis, torch.tensor(keep))
                sw.write(spec.name, t.contiguous())


def _removed(ckpt: Checkpoint, name: str, cut: Cut) -> int:
    e = ckpt.entry(name)
    before = after = 1
    for axis, d in enumerate(e.shape):
        before *= d
        after *= len(cut.axes[axis]) if axis in cut.axes else d
    return before - after


def _config(config: dict[str, Any], cfg: Any, record: WidthsNarrowed) -> dict[str, Any]:
    """config.json with the new widths (the family's own keys), ``head_dim`` written out."""
    if record.ffn is not None:
        key = "n_inner" if "n_inner" in config or "n_layer" in config else "intermediate_size"
        config[key] = record.ffn.after
    if record.heads is not None:
        config["num_attention_heads"] = record.heads.heads_after
        if "num_key_value_heads" in config or getattr(cfg, "num_key_value_heads", None):
            config["num_key_value_heads"] = record.heads.kv_after
        config["head_dim"] = record.heads.head_dim
    if record.hidden is not None:
        config["hidden_size"] = record.hidden.after
        config["head_dim"] = record.hidden.head_dim
    return config
