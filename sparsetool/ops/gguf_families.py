"""Each architecture as llama.cpp holds it in GGUF, for ``convert DIR -o FILE.gguf``: the
architecture's name, its tensors' names, its config keys, and what llama.cpp would run otherwise
than transformers does (refused before anything is written).

By config.json's ``model_type`` (the GGUF architecture written, then what is particular):

- ``llama`` (Llama, SmolLM2): ``llama``; query and key rows reordered for llama.cpp's rotary
  layout; Llama 3.1's RoPE scaling (``llama3``) as the ``rope_freqs.weight`` llama.cpp reads.
- ``mixtral``: ``llama``; each block's experts stacked into ``ffn_{gate,up,down}_exps``, the
  router as ``ffn_gate_inp``.
- ``qwen2``: ``qwen2``; attention biases. ``qwen3``: ``qwen3``; query and key norms.
- ``qwen3_moe``: ``qwen3moe``; query and key norms, experts of their own width
  (``expert_feed_forward_length``), the chosen experts' weights renormalised.
- ``gemma3_text``: ``gemma3``; four norms a block, applied as ``1 + w`` and written so (as
  llama.cpp's converter does); sliding and full layers (the pattern per layer, each kind's RoPE
  base); linear RoPE scaling of the full layers; GELU (tanh).

llama.cpp holds one FFN width, one head count and one expert count for all blocks, which is what
``shrink`` writes. A Gemma-3 model with fewer blocks keeps each block's kind: the pattern is
written per layer (``attention.sliding_window_pattern``), not as llama.cpp's default of every
sixth. Gemma-3's embedding scale (the square root of the width) is applied by llama.cpp itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparsetool.errors import CheckpointError

__all__ = [
    "FAMILIES",
    "Family",
    "expert_count",
    "expert_key",
    "extra_tensors",
    "family_of",
    "gguf_name",
    "write_config",
]

_ATTENTION_NAMES = {  # a block's tensor, after "model.layers.N.", -> llama.cpp's, after "blk.N."
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_DENSE_FFN = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LLAMA_NAMES = {**_ATTENTION_NAMES, **_DENSE_FFN}
_QK_NORMS = {
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
_GEMMA3_NAMES = {
    **_LLAMA_NAMES,
    **_QK_NORMS,
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}
_OUTER_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_STACKED = {
    "gate": "ffn_gate_exps.weight",
    "up": "ffn_up_exps.weight",
    "down": "ffn_down_exps.weight",
}


@dataclass(frozen=True)
class Family:
    """One architecture as GGUF holds it."""

    arch: str  # the GGUF architecture
    names: dict[str, str]  # block tensors: after "model.layers.N." -> after "blk.N."
    experts: str = ""  # the experts' prefix in a block ("mlp.experts."), if it has experts
    expert_names: dict[str, str] = field(default_factory=dict)  # after "experts.E." -> stacked
    expert_count: tuple[str, ...] = ()  # config.json's keys for the number of experts
    rotary_rows: bool = False  # query and key rows reordered for llama.cpp's rotary layout
    norm_shift: float = 0.0  # added to every norm's weight (Gemma's 1 + w)
    activation: str = "silu"  # the FFN's activation llama.cpp applies


FAMILIES = {
    "llama": Family("llama", _LLAMA_NAMES, rotary_rows=True),
    "mixtral": Family(
        "llama",
        {**_ATTENTION_NAMES, "block_sparse_moe.gate.weight": "ffn_gate_inp.weight"},
        experts="block_sparse_moe.experts.",
        expert_names={
            f"{w}.weight": _STACKED[p] for w, p in (("w1", "gate"), ("w3", "up"), ("w2", "down"))
        },
        expert_count=("num_local_experts",),
        rotary_rows=True,
    ),  # fmt: skip
    "qwen2": Family("qwen2", _LLAMA_NAMES),
    "qwen3": Family("qwen3", {**_LLAMA_NAMES, **_QK_NORMS}),
    "qwen3_moe": Family(
        "qwen3moe",
        {**_ATTENTION_NAMES, **_QK_NORMS, "mlp.gate.weight": "ffn_gate_inp.weight"},
        experts="mlp.experts.",
        expert_names={f"{p}_proj.weight": _STACKED[p] for p in ("gate", "up", "down")},
        expert_count=("num_local_experts", "num_experts"),  # transformers 5's, 4's
    ),
    "gemma3_text": Family("gemma3", _GEMMA3_NAMES, norm_shift=1.0, activation="gelu_pytorch_tanh"),
}
"""config.json's ``model_type`` -> how it is written."""


def gguf_name(family: Family, name: str) -> tuple[str | None, int | None]:
    """A checkpoint tensor's GGUF name (None: not one llama.cpp reads) and, for an expert's
    tensor, the expert's index (its tensor is stacked with the other experts' under that name)."""
    if name in _OUTER_NAMES:
        return _OUTER_NAMES[name], None
    parts = name.split(".")
    if len(parts) < 4 or parts[:2] != ["model", "layers"] or not parts[2].isdigit():
        return None, None
    block, inner = parts[2], ".".join(parts[3:])
    if family.experts and inner.startswith(family.experts):
        index, _, rest = inner[len(family.experts) :].partition(".")
        stacked = family.expert_names.get(rest)
        if stacked is None or not index.isdigit():
            return None, None
        return f"blk.{block}.{stacked}", int(index)
    mapped = family.names.get(inner)
    if mapped is None:
        return None, None
    return f"blk.{block}.{mapped}", None


def family_of(config: dict, source: Path) -> Family:
    """The family ``config`` (config.json) is written as; one error naming ``source`` and the
    key when llama.cpp would run the model otherwise than transformers does."""
    model_type = str(config.get("model_type"))
    family = FAMILIES.get(model_type)
    if family is None:
        hint = " (a Gemma-3 with vision: save its text model)" if model_type == "gemma3" else ""
        raise CheckpointError(
            f"{source}: model_type {model_type!r} is not one convert writes as GGUF yet{hint}; "
            f"it writes {', '.join(sorted(FAMILIES))}"
        )
    for problem in _problems(config, family):
        raise CheckpointError(
            f"{source}: config.json's {problem}; convert does not write it into GGUF"
        )
    return family


def _problems(config: dict, family: Family) -> list[str]:
    """Each setting llama.cpp's architecture cannot hold, and what it would do instead."""
    found = []
    arch = family.arch
    activation = config.get("hidden_activation") or config.get("hidden_act") or family.activation
    if activation != family.activation:
        found.append(f"hidden_act {activation!r}, where llama.cpp's {arch} applies "
                     f"{family.activation!r}")  # fmt: skip
    kinds = ("full_attention", "sliding_attention") if arch == "gemma3" else (None,)
    for kind in kinds:
        scaling, _, _ = rope(config, kind)
        allowed = ("default", "linear") if kind == "full_attention" else ("default",)
        if arch == "llama":
            allowed = ("default", "llama3")  # Llama 3.1's, as llama.cpp's rope_freqs
        if scaling not in allowed:
            found.append(f"RoPE scaling {scaling!r}, which llama.cpp would run the model without")
    window = config.get("sliding_window")
    context = int(config.get("max_position_embeddings") or 0)
    windowed = window and config.get("use_sliding_window", True) and int(window) < context
    if arch != "gemma3" and windowed:
        found.append(f"sliding_window {window}, where llama.cpp's {arch} attends to every "
                     "earlier token")  # fmt: skip
    if family.expert_count:
        if not expert_count(config, family):
            found.append(f"{' or '.join(family.expert_count)} missing (the experts a block has)")
        if not config.get("num_experts_per_tok"):
            found.append("num_experts_per_tok missing (the experts a token is routed to)")
    if arch == "qwen3moe":
        if not config.get("moe_intermediate_size"):
            found.append("moe_intermediate_size missing (the experts' width)")
        if not config.get("norm_topk_prob"):
            found.append("norm_topk_prob false, where llama.cpp renormalises the chosen "
                         "experts' weights")  # fmt: skip
        if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step") or 1) != 1:
            found.append("mlp_only_layers (dense blocks among the experts'), which llama.cpp's "
                         "qwen3moe does not hold")  # fmt: skip
    if arch == "gemma3":
        found.extend(_gemma3_problems(config))
    return found


def _gemma3_problems(config: dict) -> list[str]:
    found = []
    if config.get("attn_logit_softcapping") is not None:
        found.append("attn_logit_softcapping, which llama.cpp's gemma3 does not apply")
    if config.get("use_bidirectional_attention"):
        found.append("use_bidirectional_attention, where llama.cpp's gemma3 is causal")
    heads = int(config["num_attention_heads"])
    # llama.cpp scales queries by 1/sqrt(head_dim), or for 62 blocks (27B) by 1/sqrt(hidden/heads)
    width = (int(config["hidden_size"]) // heads if int(config["num_hidden_layers"]) == 62
             else head_dim(config))  # fmt: skip
    scalar = config.get("query_pre_attn_scalar")
    if scalar is not None and float(scalar) != float(width):
        found.append(f"query_pre_attn_scalar {scalar}, where llama.cpp scales this model's "
                     f"queries by 1/sqrt({width})")  # fmt: skip
    if "sliding_attention" in layer_types(config) and not config.get("sliding_window"):
        found.append("sliding_window missing, with sliding layers in layer_types")
    kinds = set(layer_types(config)) - {"sliding_attention", "full_attention"}
    if kinds:
        found.append(f"layer_types {', '.join(sorted(kinds))}, which llama.cpp's gemma3 has not")
    return found


def expert_count(config: dict, family: Family) -> int:
    """The experts a block holds, by config.json (0: not an experts' family)."""
    key = expert_key(config, family)
    return int(config[key]) if key in config and config[key] is not None else 0


def expert_key(config: dict, family: Family) -> str:
    """config.json's key for the experts a block holds: the first of the family's it has."""
    found = [k for k in family.expert_count if config.get(k) is not None]
    return found[0] if found else (family.expert_count or ("",))[0]


def head_dim(config: dict) -> int:
    heads = int(config["num_attention_heads"])
    return int(config.get("head_dim") or int(config["hidden_size"]) // heads)


def layer_types(config: dict) -> list[str]:
    """Each block's attention (``sliding_attention`` or ``full_attention``): config.json's
    ``layer_types``, else every ``sliding_window_pattern``-th block full (older configs)."""
    types = config.get("layer_types")
    if isinstance(types, list):
        return [str(t) for t in types]
    pattern = int(config.get("sliding_window_pattern") or 6)
    blocks = int(config["num_hidden_layers"])
    return [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(blocks)
    ]


def rope(config: dict, kind: str | None = None) -> tuple[str, float, float]:
    """(scaling type, base, factor) of the RoPE of ``kind``'s layers (None: every layer), from
    ``rope_parameters`` (per layer kind or one for all) or the older ``rope_scaling`` and
    ``rope_theta`` (``rope_local_base_freq`` for Gemma-3's sliding layers, never scaled)."""
    params = config.get("rope_parameters")
    if not isinstance(params, dict):
        params = {}
    legacy = config.get("rope_scaling") or {}
    if kind is not None and isinstance(params.get(kind), dict):
        params, legacy = params[kind], {}  # per layer kind: rope_scaling left over is not read
    elif kind == "sliding_attention":  # older Gemma-3 configs: the local base, unscaled
        base = config.get("rope_local_base_freq") or 10000.0
        return "default", float(base), 1.0
    named = (params.get("rope_type"), legacy.get("rope_type"), legacy.get("type"))
    scaling = next((t for t in named if t and t != "default"), "default")  # either key's scaling
    base = params.get("rope_theta") or config.get("rope_theta") or 10000.0
    factor = params.get("factor") or legacy.get("factor") or 1.0
    return str(scaling), float(base), float(factor)


def extra_tensors(config: dict, family: Family) -> dict[str, np.ndarray]:
    """Tensors llama.cpp reads that the checkpoint does not store: Llama 3.1's RoPE scaling as
    ``rope_freqs.weight``, each rotary frequency's divisor (1 for the high frequencies, ``factor``
    for the low, smoothed between), as llama.cpp's converter computes it."""
    scaling, base, factor = rope(config, None)
    if family.arch != "llama" or scaling != "llama3":
        return {}
    params = config.get("rope_parameters") or {}
    params = {**(config.get("rope_scaling") or {}), **params}
    low = float(params.get("low_freq_factor", 1.0))
    high = float(params.get("high_freq_factor", 4.0))
    context = float(params.get("original_max_position_embeddings", 8192))
    dim = head_dim(config)
    freqs = 1.0 / np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
    wavelen = 2 * math.pi / freqs.astype(np.float64)
    smooth = (context / wavelen - low) / (high - low)
    divisor = np.where(
        wavelen < context / high,
        1.0,
        np.where(wavelen > context / low, factor, 1 / ((1 - smooth) / factor + smooth)),
    )
    return {"rope_freqs.weight": divisor.astype(np.float32)}


def write_config(writer: Any, config: dict, family: Family) -> None:
    """The model's shape and settings as llama.cpp's keys (``{arch}.block_count`` ...)."""
    import gguf

    heads = int(config["num_attention_heads"])
    width = head_dim(config)
    writer.add_context_length(int(config.get("max_position_embeddings") or 2048))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_key_length(width)
    writer.add_value_length(width)
    writer.add_rope_dimension_count(width)
    kind = "full_attention" if family.arch == "gemma3" else None
    scaling, base, factor = rope(config, kind)
    writer.add_rope_freq_base(base)
    if scaling == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(factor)
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps") or 1e-6))
    writer.add_vocab_size(int(config["vocab_size"]))
    if family.expert_count:
        writer.add_expert_count(expert_count(config, family))
        writer.add_expert_used_count(int(config["num_experts_per_tok"]))
    if family.arch == "qwen3moe":
        writer.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))
    if family.arch == "gemma3":
        types = layer_types(config)
        if "sliding_attention" in types:
            writer.add_sliding_window(int(config["sliding_window"]))
            writer.add_sliding_window_pattern([t == "sliding_attention" for t in types])
            writer.add_rope_freq_base_swa(rope(config, "sliding_attention")[1])
        if config.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
