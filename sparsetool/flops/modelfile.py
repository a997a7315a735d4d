"""A model description file -> :class:`~sparsetool.flops.modelconfig.ModelConfig`: sparsetool's
own keys or a Hugging Face ``config.json`` (TOML, JSON or YAML; :data:`FIELD_NAMES` maps the
names), with each Hugging Face family's defaults and its mixture-of-experts and latent-attention
keys.

Nothing here imports torch (or numpy): ``sparsetool flops`` must start fast.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.flops.modelconfig import DEFAULT_SEQ_LEN, ModelConfig, default_seq_len
from sparsetool.util.configfile import load_mapping
from sparsetool.util.wording import plural

# The one table of accepted field names: sparsetool's own name -> the Hugging Face config.json
# names read for it (first found wins). Both kinds of names work in every config file.
FIELD_NAMES: dict[str, tuple[str, ...]] = {
    "name": (),
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_model": ("hidden_size", "n_embd"),
    "n_heads": ("num_attention_heads", "n_head"),
    "d_head": ("head_dim",),
    "d_ff": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "seq_len": (),
    "context": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
    "ffn_matrices": (),
    "n_kv_heads": ("num_key_value_heads",),
    "learned_positions": (),
    "tied_embeddings": ("tie_word_embeddings",),
    "biases": (),
    "nominal_params": (),
    "position_rows": (),
    "window": ("sliding_window",),
    "embed_dim": ("word_embed_proj_dim",),
    "final_norm": (),
    "n_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok",),
    "d_expert": ("moe_intermediate_size",),
    "d_shared": ("shared_expert_intermediate_size",),
    "shared_gate": (),
    "dense_layers": (),
    "router_bias": (),
    "kv_rank": ("kv_lora_rank",),
    "q_rank": ("q_lora_rank",),
    "d_rope": ("qk_rope_head_dim",),
    "d_v": ("v_head_dim",),
}
REQUIRED = ("n_layers", "d_model", "n_heads", "vocab")


# model_type values whose MLP is gated (SwiGLU/GeGLU: three matrices) and that use RoPE, no biases.
_GATED_TYPES = {
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "gemma",
    "gemma2",
    "phi3",
    "olmo",
    "olmo2",
    "internlm2",
    "deepseek",
    "granite",
    "cohere",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "olmoe",
    "gpt_oss",
    "deepseek_v2",
    "deepseek_v3",
}
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt_oss", "deepseek_v2", "deepseek_v3")
"""Hugging Face ``model_type`` values of the mixture-of-experts families read from a config.json
(:func:`from_mapping`); their experts are gated FFNs like their dense relatives'."""
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
"""Hugging Face ``model_type`` values of the multi-head latent attention families read from a
config.json (DeepSeek-V2 and V3: the same attention and experts; V3 adds the router's
score-correction bias)."""
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


def _check_hf_family(d: Mapping[str, Any], name: str) -> None:
    """Refuse a Hugging Face config whose shapes the Appendix-F count does not cover."""
    model_type = str(d.get("model_type", "")).lower()
    if d.get("kv_lora_rank") is not None and model_type not in MLA_TYPES:
        raise ConfigError(
            f"config '{name}' ({model_type or 'unknown model_type'}) uses multi-head latent "
            f"attention (kv_lora_rank {d['kv_lora_rank']}) in a family sparsetool does not read; "
            f"the types it reads are {', '.join(MLA_TYPES)}; write a model file with kv_rank, "
            "q_rank, d_rope and d_v instead (docs/flops.md: multi-head latent attention)"
        )
    experts = next((d[k] for k in _EXPERT_KEYS if d.get(k)), None)
    if experts and model_type not in MOE_TYPES:
        raise ConfigError(
            f"config '{name}' is a mixture-of-experts model of type '{model_type}' "
            f"({experts} experts), which sparsetool does not read; the types it reads are "
            f"{', '.join(MOE_TYPES)}; write a model file with n_experts, top_k and d_expert "
            "instead (docs/flops.md: mixture of experts)"
        )


def _hf_experts(d: Mapping[str, Any], kw: dict[str, Any], model_type: str) -> None:
    """The expert fields of a mixture-of-experts config.json (the keys and defaults of
    transformers' configuration classes of each family)."""
    name = kw["name"]
    if not kw.get("n_experts"):
        raise ConfigError(
            f"config '{name}' of type '{model_type}' gives no expert count "
            f"({' / '.join(FIELD_NAMES['n_experts'])}); add it to the file"
        )
    if kw.get("top_k") is None:
        raise ConfigError(
            f"config '{name}' gives {kw['n_experts']} experts but not how many each "
            "token goes to (num_experts_per_tok); add it to the file"
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        # a layer is sparse unless listed in mlp_only_layers, and only every decoder_sparse_step-th
        step = int(d.get("decoder_sparse_step") or 1)
        only = set(d.get("mlp_only_layers") or ())
        kw["dense_layers"] = tuple(
            i for i in range(int(kw["n_layers"])) if i in only or (i + 1) % step
        )
        kw.setdefault("d_expert", 768 if model_type == "qwen3_moe" else 1408)
    elif model_type in MLA_TYPES:
        _deepseek_experts(d, kw, model_type)
    else:  # Mixtral, OLMoE, gpt-oss: the experts are intermediate_size wide
        kw.pop("d_expert", None)
    if model_type == "qwen2_moe":
        if kw.get("d_shared") is None:
            raise ConfigError(
                f"config '{name}' of type qwen2_moe gives no "
                "shared_expert_intermediate_size; add it to the file"
            )
        kw["shared_gate"] = bool(kw["d_shared"])
    elif model_type not in MLA_TYPES:  # DeepSeek's shared experts: _deepseek_experts
        kw.pop("d_shared", None)
    if model_type == "gpt_oss":
        # biases on q/k/v/o (attention_bias), on every expert matrix and on the router
        kw["biases"] = True
        types = set(d.get("layer_types") or ())
        if "full_attention" in types:  # half its layers attend to every key: all are counted so
            kw.pop("window", None)


def _deepseek_experts(d: Mapping[str, Any], kw: dict[str, Any], model_type: str) -> None:
    """DeepSeek-V2/V3's experts (the keys of DeepSeek's released configuration code): the first
    ``first_k_dense_replace`` layers have a dense FFN of ``intermediate_size``; after them every
    ``moe_layer_freq``-th layer routes to ``moe_intermediate_size``-wide experts, beside
    ``n_shared_experts`` shared experts every token takes (one FFN of their summed width)."""
    name = kw["name"]
    if not kw.get("d_expert"):
        raise ConfigError(
            f"config '{name}' of type '{model_type}' gives no moe_intermediate_size "
            "(the width of one expert); add it to the file"
        )
    first = int(d.get("first_k_dense_replace") or 0)
    freq = int(d.get("moe_layer_freq") or 1)
    kw["dense_layers"] = tuple(i for i in range(int(kw["n_layers"])) if i < first or i % freq)
    kw["d_shared"] = int(d.get("n_shared_experts") or 0) * int(kw["d_expert"])
    kw["router_bias"] = model_type == "deepseek_v3"  # e_score_correction_bias


def _hf_latent_attention(d: Mapping[str, Any], kw: dict[str, Any], model_type: str) -> None:
    """Multi-head latent attention's widths from a DeepSeek-V2/V3 config.json: a query/key head
    is ``qk_nope_head_dim + qk_rope_head_dim`` wide (not ``head_dim``, which DeepSeek-V3's
    configuration sets to the rotary part), a value head ``v_head_dim``."""
    name = kw["name"]
    missing = [
        k for k in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") if d.get(k) is None
    ]
    if missing:
        raise ConfigError(
            f"config '{name}' of type '{model_type}' gives kv_lora_rank but not "
            f"{', '.join(missing)}; add {'it' if len(missing) == 1 else 'them'} to the file"
        )
    biased = [k for k in ("attention_bias", "mlp_bias") if d.get(k)]
    if biased:
        raise ConfigError(
            f"config '{name}' sets {' and '.join(biased)}: sparsetool counts "
            "multi-head latent attention without biases, as DeepSeek's released "
            "models are; write a model file of the shapes instead"
        )
    kw["d_head"] = int(d["qk_nope_head_dim"]) + int(d["qk_rope_head_dim"])
    kw.pop("n_kv_heads", None)  # the latent replaces key/value heads


def _is_hf(d: Mapping[str, Any]) -> bool:
    return "model_type" in d or "architectures" in d


def _gather(d: Mapping[str, Any], name: str, strict: bool) -> dict[str, Any]:
    """Own field name -> value, from own names or their Hugging Face names (FIELD_NAMES)."""
    aliases = {a: own for own, names in FIELD_NAMES.items() for a in names}
    if strict:
        unknown = sorted(k for k in d if k not in FIELD_NAMES and k not in aliases)
        if unknown:
            raise ConfigError(
                f"config '{name}': unknown key(s) {', '.join(unknown)}; accepted keys "
                f"(sparsetool's or Hugging Face's): {', '.join(_accepted())}"
            )
    out: dict[str, Any] = {}
    for own, names in FIELD_NAMES.items():
        given = [(k, d[k]) for k in (own, *names) if d.get(k) is not None]
        if not given:
            continue
        if strict and len({repr(v) for _, v in given}) > 1:
            raise ConfigError(
                f"config '{name}' gives {own} twice with different values: "
                + ", ".join(f"{k} = {v!r}" for k, v in given)
                + "; keep one"
            )
        out[own] = given[0][1]
    return out


def _accepted() -> list[str]:
    return [
        own + (f" ({' / '.join(names)})" if names else "") for own, names in FIELD_NAMES.items()
    ]


def from_mapping(d: Mapping[str, Any], name: str = "model") -> ModelConfig:
    """A ``ModelConfig`` from sparsetool's own field names, Hugging Face ``config.json`` names, or
    both (:data:`FIELD_NAMES`), with one rule for defaults whatever the names:

    - required: ``n_layers``, ``d_model``, ``n_heads``, ``vocab``;
    - ``d_head`` = d_model / n_heads (which must divide evenly); ``d_ff`` = 4 x d_model;
      ``seq_len`` = 2048 (:data:`DEFAULT_SEQ_LEN`), or the model's ``context`` when shorter;
      ``n_kv_heads`` = n_heads (which it must divide);
    - a Hugging Face config (one with ``model_type`` or ``architectures``) takes the rest from its
      family (gated MLP families: SwiGLU, RoPE, no biases, untied head) and ignores keys that do
      not describe shapes; a file of sparsetool's own keys is refused on a key it does not know.

    >>> from_mapping({"n_layers": 2, "d_model": 64, "n_heads": 4, "vocab": 100}).d_ff
    256
    >>> from_mapping({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
    ...               "vocab_size": 50257, "n_positions": 1024}).d_ff
    3072
    """
    if "model" in d and isinstance(d["model"], Mapping):  # a [model] table in TOML/YAML
        d = d["model"]
    hf = _is_hf(d)
    if hf:
        _check_hf_family(d, name)
    kw = _gather(d, name, strict=not hf)
    model_type = str(d.get("model_type", "")).lower()
    if hf and d.get("use_sliding_window") is False:  # Qwen2 states a window it does not use
        kw.pop("window", None)
    kw["name"] = str(kw.get("name", name))
    missing = [
        f + (f" (or {' / '.join(FIELD_NAMES[f])})" if FIELD_NAMES[f] else "")
        for f in REQUIRED
        if f not in kw
    ]
    if missing:
        raise ConfigError(
            f"config '{name}' lacks {', '.join(missing)}; required keys: "
            f"{', '.join(REQUIRED)} (docs/flops.md: accepted field names)"
        )
    if hf:
        gated = model_type in _GATED_TYPES
        if model_type == "opt":  # its position table keeps 2 rows more than its context
            kw.setdefault("position_rows", kw.get("context", DEFAULT_SEQ_LEN) + 2)
            kw.setdefault(
                "final_norm",
                bool(d.get("do_layer_norm_before", True))
                and not d.get("_remove_final_layer_norm", False),
            )
        kw.setdefault("ffn_matrices", 3 if gated else 2)
        kw.setdefault("biases", not gated)
        kw.setdefault("tied_embeddings", not gated)
        kw.setdefault(
            "learned_positions",
            not gated and str(d.get("model_type", "")).lower() not in ("gpt_neox", "gptj", "bloom"),
        )
        if model_type in MLA_TYPES:
            _hf_latent_attention(d, kw, model_type)
        if model_type in MOE_TYPES:
            _hf_experts(d, kw, model_type)
    elif kw.get("kv_rank") is not None:
        kw.setdefault("biases", False)  # counted without biases (see ModelConfig)
    for f in ("n_layers", "d_model", "n_heads", "vocab"):
        ModelConfig.check_positive(kw["name"], f, kw[f])
    d_model, n_heads = kw["d_model"], kw["n_heads"]
    if "d_head" not in kw:
        if d_model % n_heads:
            raise ConfigError(
                f"config '{name}': d_model {d_model} does not split into {plural(n_heads, 'head')} "
                f"({d_model} / {n_heads} = {d_model / n_heads:.4g}); fix hidden size or heads, or "
                f"give the head size (d_head / head_dim) if the model's heads are not d_model wide"
            )
        kw["d_head"] = d_model // n_heads
    kw.setdefault("d_ff", 4 * d_model)
    if "seq_len" in kw:
        kw["seq_len_source"] = "config file"
    else:
        kw["seq_len"], kw["seq_len_source"] = default_seq_len(kw.get("context"))
    if kw.get("embed_dim") == d_model:
        kw["embed_dim"] = None
    if kw.get("n_kv_heads") == n_heads:
        kw["n_kv_heads"] = None
    return ModelConfig(**kw)


def load_config(path: str | Path) -> ModelConfig:
    """Read a model description from a TOML, JSON or YAML file (a HF ``config.json`` works too)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = load_mapping(p, what="config file")
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return from_mapping(data, name=name)
