"""``--ffn``, ``--heads``, ``--hidden``: the stored tensors cut to what each layer keeps (rows and
columns in the stored orientation), the output written shard by shard, and config.json's new
widths."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.spill import TensorSpill
from sparsetool.checkpoint.writer import CheckpointWriter
from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.shrink.results import (
    HiddenKept,
    ShrinkResult,
    WidthsNarrowed,
)
from sparsetool.ops.shrink.width_plan import (
    Geometry,
    WidthPlan,
)
from sparsetool.ops.shrink.width_scores import (
    PER_HEAD_NORMS,
    Hidden,
    Layer,
    is_norm,
)

READS_HIDDEN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # columns: the hidden size

WRITES_HIDDEN = ("o_proj", "down_proj")  # rows (and bias): the hidden size


@dataclass
class Cut:
    """One stored tensor cut to the indices ``axes[axis]`` along each of its cut axes (stored
    orientation): a query projection loses rows to ``--heads`` and columns to ``--hidden``."""

    axes: dict[int, list[int]] = field(default_factory=dict)


def choose_widths(
    model: BlockModel, layers: list[Layer], g: Geometry, plan: WidthPlan
) -> tuple[dict[str, Cut], WidthsNarrowed]:
    """The stored tensors to cut and how, and the record of what was kept."""
    cuts: dict[str, Cut] = {}
    record = WidthsNarrowed(ffn=plan.ffn, heads=plan.heads)
    for i, layer in enumerate(layers):
        record.layers.append(choose_layer(model, i, layer, g, plan, cuts))
    return cuts, record


def choose_layer(
    model: BlockModel, i: int, layer: Layer, g: Geometry, plan: WidthPlan, cuts: dict[str, Cut]
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


def stored_name(model: BlockModel, param: str) -> str | None:
    pieces = model.sources.get(param)
    if not pieces:
        return None
    if len(pieces) != 1 or pieces[0].index:
        raise SparsetoolError(f"{model.path}: {param} is merged from several tensors; "
                              "shrink cannot cut it")  # fmt: skip
    return pieces[0].stored


def _cut_rows(model, module: str, rows: list[int], cuts: dict, conv1d: bool = False) -> None:
    """The output rows ``rows`` of a linear layer: weight rows (a Conv1D's columns) and bias."""
    w = stored_name(model, f"{module}.weight")
    if w is not None:
        _cut(cuts, w, 1 if conv1d else 0, rows)
    b = stored_name(model, f"{module}.bias")
    if b is not None:
        _cut(cuts, b, 0, rows)


def _cut_cols(model, module: str, cols: list[int], cuts: dict, conv1d: bool = False) -> None:
    """The input columns ``cols`` of a linear layer (a Conv1D's rows); its bias stays."""
    w = stored_name(model, f"{module}.weight")
    if w is not None:
        _cut(cuts, w, 0 if conv1d else 1, cols)


def _cut(cuts: dict[str, Cut], stored: str, axis: int, keep: list[int]) -> None:
    cuts.setdefault(stored, Cut()).axes[axis] = keep


def hidden_axes(model: BlockModel) -> dict[str, int | None]:
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
        elif leaf in WRITES_HIDDEN or is_norm(model, module, path):
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


def cut_hidden(
    model: BlockModel, hidden: Hidden, head_dim: int, cuts: dict[str, Cut], result: ShrinkResult
) -> HiddenKept:
    """The cuts of the embedding channels ``--hidden`` keeps, and their record."""
    width, keep = model.width, hidden.keep
    assert hidden.sums is not None, "no norm over the hidden size ran"
    score = hidden.sums / max(hidden.tokens, 1)
    kept = sorted(sorted(range(width), key=lambda c: (-float(score[c]), c))[:keep])
    for name, axis in hidden.axes.items():
        stored = stored_name(model, name) if axis is not None else None
        if stored is not None and axis is not None:
            _cut(cuts, stored, axis, kept)
    hf: Any = model.module  # a transformers model
    if hasattr(hf.get_input_embeddings(), "embed_scale"):
        result.notes.append(
            "the model scales its embeddings by sqrt(hidden_size) (Gemma); the narrower model "
            f"scales them by sqrt({keep}), not sqrt({width})"
        )
    return HiddenKept(width, keep, kept, head_dim)


def write_widths(
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


def removed_params(ckpt: Checkpoint, name: str, cut: Cut) -> int:
    e = ckpt.entry(name)
    before = after = 1
    for axis, d in enumerate(e.shape):
        before *= d
        after *= len(cut.axes[axis]) if axis in cut.axes else d
    return before - after


def widths_config(config: dict[str, Any], cfg: Any, record: WidthsNarrowed) -> dict[str, Any]:
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
