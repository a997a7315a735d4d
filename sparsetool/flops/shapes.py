"""Model shapes and per-layer measured sparsity from a checkpoint's tensor list.

:func:`infer_model` is pure: it takes rows with ``name, shape, dtype, role, targeted, numel,
nonzero`` (plain dicts or any object with those attributes) and rebuilds the Appendix-F shapes:

- ``d_model`` from the token embedding (V, d), else ``config.json``, else the dimension every
  targeted matrix shares; ``vocab`` from the embedding or LM head;
- per layer (index = first integer in the name): ``k*h`` = the non-``d_model`` side of the
  attention output; a mixture of experts' FFN is its experts' (:func:`expert_part`: one matrix per
  expert, or all in one 3-D tensor), each counted once with the expert count beside it, and a
  shared expert's; ``top_k`` comes from ``config.json`` (``num_experts_per_tok``); q+k+v (fused or
  separate) = ``k*h + 2*k*h_kv``; ``d_ff`` = the FFN output matrix's other side; FFN matrices = 1 +
  (sum of FFN-in widths) / ``d_ff`` (3 for SwiGLU, also when gate and up are fused);
- heads from ``config.json`` (``num_attention_heads``/``n_head``); without one, a d_head of
  128 (k*h >= 2048) or 64 is assumed and said so; heads only enter the softmax term 3*h*s*s;
- sparsity per layer and role = 1 - sum(non-zeros) / sum(elements) over the *targeted* tensors of
  that role (the same targets as ``prune``); a matrix that is not targeted counts as dense.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.config import read_model_config as read_hf_config
from sparsetool.errors import CheckpointError, ShapeError
from sparsetool.flops.formula import ROLES
from sparsetool.flops.modelconfig import ModelConfig, default_seq_len
from sparsetool.targets.order import layer_index
from sparsetool.util.wording import plural


@dataclass(frozen=True)
class InferredModel:
    """What a checkpoint says about itself: shapes, measured sparsity, measured parameters."""

    config: ModelConfig
    layer_sparsity: list[dict[str, float]]
    params: dict[str, float]  # {"total", "nonzero"} over floating tensors
    targeted_sparsity: float
    notes: list[str] = field(default_factory=list)
    targeting: dict[str, Any] = field(
        default_factory=dict
    )  # from_checkpoint: targets.recorded summary


def _get(row: Any, key: str) -> Any:
    return row[key] if isinstance(row, Mapping) else getattr(row, key)


def _other_side(name: str, shape: tuple[int, ...], d_model: int) -> int:
    a, b = shape
    if a == d_model:
        return b
    if b == d_model:
        return a
    raise ShapeError(
        f"tensor '{name}' has shape {list(shape)}, neither side equals d_model={d_model}"
    )


FFN_ROLES = ("ffn_in", "ffn_out")
_EXPERT_RE = re.compile(r"(^|\.)experts\.(\d+)\.")
_SHARED_RE = re.compile(r"(^|\.)shared_experts?\.")


def expert_part(name: str, shape: Sequence[int]) -> tuple[str, int | None]:
    """Which part of a layer a linear weight belongs to, for counting experts: ``("expert", N)``
    for expert N's own matrix (``mlp.experts.3.w1.weight``, ``experts.3.gate_proj.weight``),
    ``("stacked", None)`` for the experts' matrices in one 3-D tensor (transformers 5's
    ``mlp.experts.gate_up_proj`` (experts, 2 x ffn, hidden), or gpt-oss's (experts, hidden,
    2 x ffn)), ``("shared", None)`` for a shared expert's (``shared_expert.``, DeepSeek's
    ``shared_experts.``), ``("plain", None)`` for everything else.

    >>> expert_part("model.layers.0.block_sparse_moe.experts.7.w2.weight", (8, 32))
    ('expert', 7)
    >>> expert_part("model.layers.0.mlp.experts.down_proj", (4, 8, 32))
    ('stacked', None)
    >>> expert_part("model.layers.0.mlp.shared_expert.up_proj.weight", (32, 8))
    ('shared', None)
    """
    if len(shape) == 3:
        return "stacked", None
    m = _EXPERT_RE.search(name)
    if m:
        return "expert", int(m.group(2))
    if _SHARED_RE.search(name):
        return "shared", None
    return "plain", None


def is_shared_gate(name: str) -> bool:
    """Qwen2-MoE's d_model x 1 gate on its shared expert (``mlp.shared_expert_gate.weight``)."""
    return ".shared_expert_gate." in f".{name}"


def is_router_bias(name: str) -> bool:
    """DeepSeek-V3's score-correction bias beside its router (``mlp.gate.e_score_correction_bias``):
    a bias of the router, not of a matmul."""
    return name.endswith("e_score_correction_bias")


LATENT_PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj")
"""Multi-head latent attention's projections (DeepSeek-V2/V3); ``q_proj`` stands for q_a/q_b
in a model without a query latent."""


def _module(name: str) -> str:
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else name


def latent_attention_widths(rows: Sequence[Any], d_model: int, what: str) -> tuple[int, ...]:
    """Multi-head latent attention's widths from one layer's ``qkv`` matrices, stored (out, in):
    ``(q_rank, q_width, kv_a, kv_rank, kv_b)``: the query latent (0: none, a plain ``q_proj``),
    the queries' ``heads * d_head``, ``kv_rank + d_rope``, ``kv_rank`` and
    ``heads * (d_nope + d_v)``."""
    by = {_module(str(_get(r, "name"))): tuple(int(x) for x in _get(r, "shape")) for r in rows}
    needed = ["kv_a_proj_with_mqa", "kv_b_proj"] + (
        ["q_proj"] if "q_proj" in by else ["q_a_proj", "q_b_proj"]
    )
    missing = [n for n in needed if n not in by]
    if missing:
        raise ShapeError(
            f"{what} has multi-head latent attention without {', '.join(missing)}, "
            "so its shape cannot be inferred; put its config.json beside the weights"
        )
    kv_a = _other_side("kv_a_proj_with_mqa", by["kv_a_proj_with_mqa"], d_model)
    kv_b, kv_rank = by["kv_b_proj"]
    if "q_proj" in by:
        q_rank, q_width = 0, _other_side("q_proj", by["q_proj"], d_model)
    else:
        q_rank = _other_side("q_a_proj", by["q_a_proj"], d_model)
        q_width = by["q_b_proj"][0]
    if kv_a <= kv_rank or by.get("q_b_proj", (0, q_rank))[1] != q_rank:
        raise ShapeError(
            f"the latent-attention projections of {what} do not fit together "
            f"({', '.join(f'{n} {list(sh)}' for n, sh in by.items())}); describe the "
            "model with its config.json beside the weights"
        )
    return q_rank, q_width, kv_a, kv_rank, kv_b


def beyond_stated_layers(indices: Iterable[int], hf_config: Mapping[str, Any] | None) -> list[int]:
    """The layer indices at or past config.json's ``num_hidden_layers`` (DeepSeek-V3's checkpoint
    stores its multi-token prediction module as layer 61 of 61), when some layers are not."""
    stated = _pick(hf_config, "num_hidden_layers", "n_layer", "num_layers")
    indices = set(indices)
    extra = sorted(i for i in indices if stated is not None and i >= int(stated))
    return extra if len(extra) < len(indices) else []


def _pick(cfg: Mapping[str, Any] | None, *keys: str) -> Any:
    for k in keys:
        if cfg and cfg.get(k) is not None:
            return cfg[k]
    return None


def infer_model(
    rows: Iterable[Any],
    *,
    name: str = "checkpoint",
    hf_config: Mapping[str, Any] | None = None,
    seq_len: int | None = None,
    vocab: int | None = None,
) -> InferredModel:
    """Rebuild a :class:`ModelConfig` and per-layer role sparsities from tensor rows.

    >>> rows = [dict(name=f"h.{i}.{m}.weight", shape=s, dtype="float32", role=r, targeted=True,
    ...              numel=s[0] * s[1], nonzero=s[0] * s[1] // 2)
    ...         for i in range(2) for m, r, s in [("attn.c_attn", "qkv", (8, 24)),
    ...             ("attn.c_proj", "attn_out", (8, 8)), ("mlp.c_fc", "ffn_in", (8, 32)),
    ...             ("mlp.c_proj", "ffn_out", (32, 8))]]
    >>> rows.append(dict(name="wte.weight", shape=(100, 8), dtype="float32", role="embedding",
    ...                  targeted=False, numel=800, nonzero=800))
    >>> m = infer_model(rows, hf_config={"n_head": 2, "n_positions": 16})
    >>> c = m.config
    >>> (c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_ff, c.vocab, c.context, c.ffn_matrices)
    (2, 8, 2, 4, 32, 100, 16, 2)
    >>> m.layer_sparsity[1]["ffn_in"], m.targeted_sparsity
    (0.5, 0.5)
    """
    notes: list[str] = []
    floating = _floating_rows(rows, name)
    linear = _linear_rows(floating, name)
    embeds, heads, positions = (_matrices(floating, ro) for ro in ("embedding", "head", "position"))
    tok = max(embeds, key=lambda r: _shape(r)[0]) if embeds else None
    d_model = _d_model(tok, linear, hf_config, name)
    layers = _group_layers(linear, hf_config, name, notes)
    shapes = _layer_shapes(layers, d_model, name)
    qkv_w, kh, moe, f, ratio = _uniform_shapes(shapes, name)
    moe_fields = (
        _moe_fields(moe, shapes.dense_layers, floating, hf_config, name, notes)
        if moe is not None
        else {}
    )
    n_heads, d_head, n_kv, mla = _heads(qkv_w, kh, hf_config, name, notes)
    if vocab is None:
        vocab = _vocab(tok, heads, hf_config, name)
    context, seq_len, seq_source = _context(positions, hf_config, seq_len, notes)
    cfg = ModelConfig(
        name=name,
        n_layers=len(shapes.layer_sparsity),
        d_model=d_model,
        n_heads=n_heads,
        d_head=d_head,
        d_ff=int(f),
        vocab=int(vocab),
        seq_len=int(seq_len),
        ffn_matrices=int(1 + ratio),
        context=int(context) if context is not None else None,
        seq_len_source=seq_source,
        n_kv_heads=n_kv,
        learned_positions=bool(positions),
        tied_embeddings=not heads,
        biases=any(
            _get(r, "role") == "bias" and not is_router_bias(str(_get(r, "name"))) for r in floating
        ),
        router_bias=bool(moe_fields)
        and any(is_router_bias(str(_get(r, "name"))) for r in floating),
        **moe_fields,
        **mla,
    )
    for r in floating:
        if _get(r, "targeted") and _get(r, "role") not in ROLES:
            notes.append(
                f"'{_get(r, 'name')}' is targeted but is not an attention/FFN matmul; "
                "its zeros count in the non-zero parameters, not in the FLOPs"
            )
    total = sum(int(_get(r, "numel")) for r in floating)
    nonzero = sum(int(_get(r, "nonzero")) for r in floating)
    t_sparsity = _sparsity([r for r in linear if _get(r, "targeted")])
    return InferredModel(
        cfg,
        shapes.layer_sparsity,
        {"total": float(total), "nonzero": float(nonzero)},
        t_sparsity,
        notes,
    )


# ------------------------------------------------------------------ infer_model's parts, in order


def _shape(r: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in _get(r, "shape"))


def _sparsity(rows: Sequence[Any]) -> float:
    """1 - non-zeros / elements over ``rows`` (0 for none)."""
    numel = sum(int(_get(r, "numel")) for r in rows)
    return 1.0 - sum(int(_get(r, "nonzero")) for r in rows) / numel if numel else 0.0


def _floating_rows(rows: Iterable[Any], name: str) -> list[Any]:
    """The floating-point tensors (same dtype rule as prune and report), masks left out."""
    from sparsetool.targets import is_floating

    floating = [
        r
        for r in rows
        if not str(_get(r, "name")).endswith("_mask") and is_floating(_get(r, "dtype"))
    ]
    if not floating:
        raise ShapeError(f"'{name}' holds no floating-point tensors to account")
    return floating


def _linear_rows(floating: Sequence[Any], name: str) -> list[Any]:
    """The attention and FFN matrices (an FFN's experts may be one 3-D tensor)."""
    linear = [
        r
        for r in floating
        if _get(r, "role") in ROLES
        and (len(_shape(r)) == 2 or (len(_shape(r)) == 3 and _get(r, "role") in FFN_ROLES))
    ]
    if not linear:
        raise ShapeError(
            f"'{name}' has no attention or feed-forward weight matrices that sparsetool recognises"
        )
    return linear


def _matrices(floating: Sequence[Any], role: str) -> list[Any]:
    return [r for r in floating if _get(r, "role") == role and len(_shape(r)) == 2]


def _d_model(
    tok: Any, linear: Sequence[Any], hf_config: Mapping[str, Any] | None, name: str
) -> int:
    """The token embedding's width, else config.json's, else the side all matrices share."""
    d_model = (
        _shape(tok)[1] if tok is not None else _pick(hf_config, "hidden_size", "n_embd", "d_model")
    )
    if d_model is None:
        common = set(_shape(linear[0])[-2:])
        for r in linear[1:]:
            common &= set(_shape(r)[-2:])
        if len(common) != 1:
            raise ShapeError(
                f"cannot tell d_model of '{name}' (no token embedding, no config.json)"
            )
        d_model = common.pop()
    return int(d_model)


# layer index -> part ("plain": attention and a dense FFN; "expert", "stacked", "shared") ->
# expert number (None but for "expert") -> role -> rows
_Layers = dict[int, dict[str, dict[Any, dict[str, list[Any]]]]]


def _group_layers(
    linear: Sequence[Any], hf_config: Mapping[str, Any] | None, name: str, notes: list[str]
) -> _Layers:
    """Matrices by layer index, by part and by role; layers past config.json's count left out."""
    layers: _Layers = {}
    for r in linear:
        nm = str(_get(r, "name"))
        index = layer_index(nm)
        if index is None:
            continue
        part, expert = expert_part(nm, _shape(r))
        layers.setdefault(index, {}).setdefault(part, {}).setdefault(expert, {}).setdefault(
            _get(r, "role"), []
        ).append(r)
    if not layers:
        raise ShapeError(f"no layer index found in the tensor names of '{name}'")
    extra = beyond_stated_layers(layers, hf_config)
    if extra:
        for i in extra:
            del layers[i]
        notes.append(
            f"{plural(len(extra), 'layer')} past config.json's num_hidden_layers "
            f"({', '.join(map(str, extra))}: DeepSeek-V3's multi-token prediction module is "
            "one) left out of the shapes and FLOPs; their parameters count in the total"
        )
    return layers


@dataclass
class _LayerShapes:
    """What the layers measured: each distinct attention (q+k+v widths or latent attention's,
    k*h), dense FFN (d_ff, FFN-in widths) and experts' FFN (experts, d_expert, its FFN-in widths,
    d_shared, its FFN-in widths); the dense layers' positions; each layer's role sparsities."""

    attention: set[tuple[int | tuple[int, ...], int]] = field(default_factory=set)
    dense: set[tuple[int, int]] = field(default_factory=set)
    moe: set[tuple[int, int, int, int, int]] = field(default_factory=set)
    dense_layers: list[int] = field(default_factory=list)
    layer_sparsity: list[dict[str, float]] = field(default_factory=list)


def _layer_shapes(layers: _Layers, d_model: int, name: str) -> _LayerShapes:
    shapes = _LayerShapes()
    for pos, idx in enumerate(sorted(layers)):
        parts = layers[idx]
        plain = parts.get("plain", {}).get(None, {})
        shapes.attention.add(_attention_widths(idx, plain, d_model, name))
        if "expert" in parts or "stacked" in parts:
            shapes.moe.add(_experts_widths(idx, parts, d_model, name))
        else:
            shapes.dense.add(_ffn_widths(plain, f"layer {idx}", d_model, name))
            shapes.dense_layers.append(pos)
        everything = [
            r for by_key in parts.values() for by_role in by_key.values() for r in by_role.items()
        ]
        shapes.layer_sparsity.append(
            {
                ro: _sparsity(
                    [
                        r
                        for role_, rs in everything
                        if role_ == ro
                        for r in rs
                        if _get(r, "targeted")
                    ]
                )
                for ro in ROLES
            }
        )
    return shapes


def _side_sum(rows: Sequence[Any], d_model: int) -> int:
    """The summed non-``d_model`` sides of ``rows`` (per expert for stacked ones)."""
    return sum(_other_side(_get(r, "name"), _shape(r)[-2:], d_model) for r in rows)


def _attention_widths(
    idx: int, plain: dict[str, list[Any]], d_model: int, name: str
) -> tuple[int | tuple[int, ...], int]:
    """(q+k+v width, or latent attention's widths; k*h) of layer ``idx``."""
    if "qkv" not in plain:
        raise ShapeError(
            f"layer {idx} of '{name}' has no qkv weight, so its shape cannot be inferred"
        )
    if any(_module(str(_get(r, "name"))) in LATENT_PROJECTIONS for r in plain["qkv"]):
        # the widths of multi-head latent attention's matrices stand for qkv's
        if "attn_out" not in plain:
            raise ShapeError(
                f"layer {idx} of '{name}' has no attention output weight (o_proj), "
                "so its shape cannot be inferred"
            )
        latent = latent_attention_widths(plain["qkv"], d_model, f"layer {idx} of '{name}'")
        return latent, _side_sum(plain["attn_out"], d_model)
    qkv_w = _side_sum(plain["qkv"], d_model)
    kh = _side_sum(plain["attn_out"], d_model) if "attn_out" in plain else qkv_w // 3
    return qkv_w, kh


def _ffn_widths(
    by_role: dict[str, list[Any]], what: str, d_model: int, name: str
) -> tuple[int, int]:
    """(FFN output width, summed FFN input widths) of one FFN, per expert for stacked ones."""
    if "ffn_out" not in by_role:
        raise ShapeError(
            f"{what} of '{name}' has no ffn_out weight (the feed-forward output), "
            "so its shape cannot be inferred"
        )
    w = {ro: _side_sum(rs, d_model) for ro, rs in by_role.items() if ro in FFN_ROLES}
    return w["ffn_out"], w.get("ffn_in", w["ffn_out"])


def _experts_widths(
    idx: int, parts: dict[str, dict[Any, dict[str, list[Any]]]], d_model: int, name: str
) -> tuple[int, int, int, int, int]:
    """(experts, d_expert, its FFN-in widths, d_shared, its FFN-in widths) of layer ``idx``."""
    if "stacked" in parts:
        stacked = parts["stacked"][None]
        n_exp = _shape(stacked.get("ffn_out", next(iter(stacked.values())))[0])[0]
        fe, fe_in = _ffn_widths(stacked, f"the experts of layer {idx}", d_model, name)
    else:
        n_exp = len(parts["expert"])
        first = parts["expert"][min(parts["expert"])]
        fe, fe_in = _ffn_widths(first, f"expert 0 of layer {idx}", d_model, name)
    shared = parts.get("shared", {}).get(None)
    fs, fs_in = (
        _ffn_widths(shared, f"the shared expert of layer {idx}", d_model, name)
        if shared
        else (0, 0)
    )
    return n_exp, fe, fe_in, fs, fs_in


def _uniform_shapes(
    shapes: _LayerShapes, name: str
) -> tuple[int | tuple[int, ...], int, tuple[int, int, int, int, int] | None, int, float]:
    """The one attention, experts' FFN (or None) and FFN shape every layer has:
    ``(qkv widths, k*h, experts, d_ff, FFN-in / d_ff)``; refused when the layers differ."""
    if len(shapes.attention) != 1 or len(shapes.dense) > 1 or len(shapes.moe) > 1:
        raise ShapeError(
            f"the layers of '{name}' differ in shape ({len(shapes.attention)} attention, "
            f"{len(shapes.dense)} dense FFN and {len(shapes.moe)} expert variants); the Appendix-F "
            "count assumes identical layers (dense and expert layers may alternate)"
        )
    qkv_w, kh = next(iter(shapes.attention))
    moe = next(iter(shapes.moe)) if shapes.moe else None
    if shapes.dense:
        f, ffn_in_w = next(iter(shapes.dense))
    else:
        assert moe is not None  # every layer is dense or of experts
        f, ffn_in_w = moe[1], moe[2]
    ratio = ffn_in_w / f
    ratios = (
        {ratio}
        | ({moe[2] / moe[1]} if moe else set())
        | ({moe[4] / moe[3]} if moe and moe[3] else set())
    )
    if len(ratios) != 1 or ratio not in (1.0, 2.0):
        raise ShapeError(
            f"feed-forward input width {ffn_in_w} is not 1x or 2x the output width {f} in "
            f"'{name}'" + (" in every expert and dense layer" if moe else "")
        )
    return qkv_w, kh, moe, f, ratio


def _moe_fields(
    moe: tuple[int, int, int, int, int],
    dense_layers: list[int],
    floating: Sequence[Any],
    hf_config: Mapping[str, Any] | None,
    name: str,
    notes: list[str],
) -> dict[str, Any]:
    """A mixture of experts' :class:`ModelConfig` fields; top_k from config.json."""
    top_k = _pick(hf_config, "num_experts_per_tok", "moe_topk", "top_k")
    if top_k is None:
        raise ShapeError(
            f"'{name}' holds {plural(moe[0], 'expert')} per layer, but no config.json beside "
            "it says how many each token goes to (num_experts_per_tok)",
            missing="top_k",
        )
    notes.append(
        f"mixture of experts: {plural(moe[0], 'expert')} per layer, {int(top_k)} per token "
        "(config.json); measured sparsity of a layer's FFN is over all its experts"
    )
    return dict(
        n_experts=int(moe[0]),
        top_k=int(top_k),
        d_expert=int(moe[1]),
        d_shared=int(moe[3]),
        dense_layers=tuple(dense_layers),
        shared_gate=any(is_shared_gate(str(_get(r, "name"))) for r in floating),
    )


def _heads(
    qkv_w: int | tuple[int, ...],
    kh: int,
    hf_config: Mapping[str, Any] | None,
    name: str,
    notes: list[str],
) -> tuple[int, int, int | None, dict[str, Any]]:
    """``(n_heads, d_head, n_kv_heads, latent attention's fields)``: config.json's heads, else
    an assumed head size; key/value heads from the q+k+v width (None: as many as the heads, or
    latent attention's latent)."""
    n_heads = _pick(hf_config, "num_attention_heads", "n_head", "n_heads")
    d_head = _pick(hf_config, "head_dim")
    if isinstance(qkv_w, tuple):
        mla = _latent_heads(qkv_w, kh, n_heads, name)
        return mla.pop("n_heads"), mla.pop("d_head"), None, mla
    if n_heads is not None:
        n_heads = int(n_heads)
        d_head = int(d_head) if d_head else kh // n_heads
    else:
        d_head = 128 if kh >= 2048 and kh % 128 == 0 else 64 if kh % 64 == 0 else kh
        n_heads = kh // d_head
        notes.append(
            f"no head count in a config.json beside the checkpoint: assumed d_head={d_head}, "
            f"so {plural(n_heads, 'head')} (this only changes the softmax term 3*h*s*s)"
        )
    kv_w = (qkv_w - kh) / 2
    n_kv = _pick(hf_config, "num_key_value_heads")
    if n_kv is None and kv_w != kh:
        n_kv = kv_w / d_head
    if n_kv is not None and (int(n_kv) != n_kv or int(n_kv) * d_head != kv_w):
        raise ShapeError(
            f"q/k/v widths of '{name}' ({qkv_w} in all, attention output {kh}) do not fit "
            f"{plural(n_heads, 'head')} of {d_head}; give the heads in a config.json beside it"
        )
    n_kv = int(n_kv) if n_kv is not None and int(n_kv) != n_heads else None
    return n_heads, d_head, n_kv, {}


def _vocab(tok: Any, heads: Sequence[Any], hf_config: Mapping[str, Any] | None, name: str) -> int:
    """The token embedding's rows, else the LM head's, else config.json's ``vocab_size``."""
    if tok is not None:
        vocab = _shape(tok)[0]
    elif heads:
        vocab = max(_shape(r)[0] for r in heads)
    else:
        vocab = _pick(hf_config, "vocab_size")
    if vocab is None:
        raise ShapeError(
            f"cannot tell the vocabulary size of '{name}' (no token embedding, "
            "no LM head, no vocab_size in a config.json)",
            missing="vocab",
        )
    return int(vocab)


def _context(
    positions: Sequence[Any],
    hf_config: Mapping[str, Any] | None,
    seq_len: int | None,
    notes: list[str],
) -> tuple[int | None, int, str]:
    """``(context, seq_len, where seq_len came from)``. The context: the model's position table,
    else config.json. Counting uses 2048 tokens (as for every model source), or the context when
    shorter, unless ``seq_len`` is given; the output says which and notes the context."""
    stated = _pick(hf_config, "max_position_embeddings", "n_positions", "n_ctx")
    context = _shape(positions[0])[0] if positions else stated
    if context is None and seq_len is None:
        notes.append(
            "no context length in the checkpoint or a config.json: seq_len assumed 2048 "
            "(pass --seq-len)"
        )
    if seq_len is not None:
        return context, seq_len, "--seq-len"
    return context, *default_seq_len(stated if stated is not None else context)


def _latent_heads(
    widths: tuple[int, ...], value_width: int, n_heads: Any, name: str
) -> dict[str, Any]:
    """Heads and head sizes of multi-head latent attention from its matrices' widths
    (:func:`latent_attention_widths`) and the output projection's ``heads * d_v``: keys expanded
    from the latent are ``heads * d_nope`` wide, so the rotary part of the queries,
    ``heads * d_rope``, gives the heads when config.json does not."""
    q_rank, q_width, kv_a, kv_rank, kv_b = widths
    d_rope = kv_a - kv_rank
    nope_width = kv_b - value_width
    rope_width = q_width - nope_width
    heads = int(n_heads) if n_heads is not None else rope_width // d_rope if rope_width > 0 else 0
    if heads < 1 or rope_width != heads * d_rope or nope_width % heads or value_width % heads:
        raise ShapeError(
            f"the latent-attention widths of '{name}' (queries {q_width}, keys and values "
            f"{kv_b}, output {value_width}, rotary key {d_rope}) do not fit "
            f"{plural(heads, 'head') if heads > 0 else 'whole heads'}; give num_attention_heads in "
            "a config.json beside it"
        )
    return dict(
        n_heads=heads,
        d_head=q_width // heads,
        kv_rank=kv_rank,
        q_rank=q_rank or None,
        d_rope=d_rope,
        d_v=value_width // heads,
    )


def from_checkpoint(
    path: str | Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    seq_len: int | None = None,
    vocab: int | None = None,
    progress: Any = None,
    default_targets: bool = False,
) -> InferredModel:
    """Count the non-zeros of the checkpoint at ``path`` and infer its shapes (reads every
    tensor once; the checkpoint reader, and torch with it, is imported only here). Without
    ``include``/``exclude``, a checkpoint pruned with globs is measured on the tensors prune
    targeted, unless ``default_targets`` (:mod:`sparsetool.targets.recorded`)."""
    try:
        from sparsetool.checkpoint.counting import tensor_counts
    except ImportError as e:
        raise CheckpointError(
            f"reading a checkpoint needs the checkpoint reader (and torch), which failed to load "
            f"({e}); reinstall sparsetool with its dependencies"
        ) from None
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.targets.recorded import plan_checkpoint_targets, targeting_summary

    p = Path(path)
    if not p.exists():
        raise CheckpointError(
            f"checkpoint '{path}' not found; pass a .safetensors file or a directory"
        )
    counts = tensor_counts(p, progress=progress, label="report")
    hf_config = read_hf_config(p)
    with open_checkpoint(p) as ck:
        metadata = ck.metadata()
    plan = plan_checkpoint_targets(
        [(t.name, t.shape, t.dtype) for t in counts],
        hf_config,
        metadata,
        include,
        exclude,
        default_targets=default_targets,
        source=p.name,
    )
    rows = [
        dict(
            name=t.name,
            shape=t.shape,
            dtype=t.dtype,
            numel=t.numel,
            nonzero=t.nonzero,
            role=plan[t.name].role,
            targeted=plan[t.name].targeted,
        )
        for t in counts
    ]
    name = p.name.removesuffix(".safetensors") or str(p)
    inferred = infer_model(rows, name=name, hf_config=hf_config, seq_len=seq_len, vocab=vocab)
    return replace(inferred, targeting=targeting_summary(plan))
