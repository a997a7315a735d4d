"""Model shapes for FLOP accounting: the ``ModelConfig`` record, the presets, and config files.

Nothing here imports torch (or numpy): ``sparsetool flops`` must start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from sparsetool.configfile import load_mapping
from sparsetool.errors import ConfigError

CHINCHILLA_TOKENS_PER_PARAM = 20.0
"""Compute-optimal tokens per parameter (Hoffmann et al. 2022), as the SPDF paper uses it (Sec. 3)."""


@dataclass(frozen=True)
class ModelConfig:
    """The shapes of a decoder-only transformer that the Chinchilla Appendix-F formula needs.

    ``d_head * n_heads`` need not equal ``d_model`` (Chinchilla writes ``key_size * num_heads``).
    ``ffn_matrices`` is 2 for a GELU MLP (in, out) and 3 for SwiGLU (gate, up, down).
    The fields after ``ffn_matrices`` only matter for parameter counts and token budgets.
    """

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_ff: int
    vocab: int
    seq_len: int
    ffn_matrices: int = 2  # 3 for SwiGLU
    # Grouped-query attention: K and V have n_kv_heads heads; None = as many as queries.
    n_kv_heads: int | None = None
    # GPT-2/GPT-3/Cerebras-GPT learn a (seq_len, d_model) position table; Llama uses RoPE.
    learned_positions: bool = True
    # GPT-2 family shares the LM head with the token embedding; Llama does not.
    tied_embeddings: bool = True
    # GPT-2 family: a bias on every linear and LayerNorm with bias; Llama: no biases, RMSNorm.
    biases: bool = True
    # The size a model is named by. The SPDF paper's Chinchilla budgets are 20 x this
    # (GPT-2 Small "125M" -> 2.5B tokens, GPT-3 XL "1.3B" -> 26B tokens; Sec. 3, App. Table 1).
    nominal_params: float | None = None

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "vocab", "seq_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model '{self.name}': {f} must be a positive integer, got {v!r}")
        if self.ffn_matrices not in (2, 3):
            raise ConfigError(
                f"model '{self.name}': ffn_matrices must be 2 (GELU MLP) or 3 (SwiGLU), "
                f"got {self.ffn_matrices!r}"
            )
        if self.n_kv_heads is not None and not (
            isinstance(self.n_kv_heads, int) and 1 <= self.n_kv_heads <= self.n_heads
        ):
            raise ConfigError(
                f"model '{self.name}': n_kv_heads must be between 1 and n_heads={self.n_heads}, "
                f"got {self.n_kv_heads!r}"
            )

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads


def _gpt(name: str, n_layers: int, d_model: int, n_heads: int, d_ff: int, **kw: Any) -> ModelConfig:
    kw.setdefault("vocab", 50257)
    kw.setdefault("seq_len", 2048)
    return ModelConfig(name, n_layers, d_model, n_heads, d_model // n_heads, d_ff, **kw)


PRESETS: dict[str, ModelConfig] = {
    # SPDF paper (Thangarasa et al., UAI 2023), Appendix A.1 Table 1: 12 layers, d_model 768,
    # 12 heads of 64, d_ff = 4 x d_model, context 2048 (the paper trains GPT-2 Small at 2048,
    # not GPT-2's original 1024; pass --seq-len 1024 for that), GPT-2 vocabulary 50257.
    "gpt2-small": _gpt("gpt2-small", 12, 768, 12, 3072, nominal_params=125e6),
    # SPDF Appendix A.1 Table 1: 24 layers, d_model 2048, 16 heads of 128, d_ff 8192, context 2048.
    # (Brown et al. 2020 Table 2.1 lists 24 heads of 128 for GPT-3 XL; the SPDF FLOP tables only
    # reproduce with k*h = d_model = 2048, i.e. 16 heads.) The iterative-pruning post's GPT-3 1.3B
    # has the same shape.
    "gpt3-xl": _gpt("gpt3-xl", 24, 2048, 16, 8192, nominal_params=1.3e9),
    # Brown et al. 2020 ("Language Models are Few-Shot Learners"), Table 2.1: GPT-3 175B.
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96, 49152, nominal_params=175e9),
    # Cerebras-GPT (Dey et al. 2023, "Cerebras-GPT: Open Compute-Optimal Language Models",
    # Table 1, and the released config.json files): GPT-3-style, learned positions, tied
    # embeddings, vocab 50257, context 2048, d_ff = 4 x d_model.
    "cerebras-gpt-111m": _gpt("cerebras-gpt-111m", 10, 768, 12, 3072),
    "cerebras-gpt-256m": _gpt("cerebras-gpt-256m", 14, 1088, 17, 4352),
    "cerebras-gpt-590m": _gpt("cerebras-gpt-590m", 18, 1536, 12, 6144),
    "cerebras-gpt-1.3b": _gpt("cerebras-gpt-1.3b", 24, 2048, 16, 8192),
    "cerebras-gpt-2.7b": _gpt("cerebras-gpt-2.7b", 32, 2560, 32, 10240),
    "cerebras-gpt-6.7b": _gpt("cerebras-gpt-6.7b", 32, 4096, 32, 16384),
    "cerebras-gpt-13b": _gpt("cerebras-gpt-13b", 40, 5120, 40, 20480),
    # A Llama-style 1.3B: the shape of Sheared-LLaMA-1.3B (Xia et al. 2023, "Sheared LLaMA";
    # its released config.json): 24 layers, hidden 2048, 16 heads of 128, SwiGLU intermediate
    # 5504, vocab 32000, 4096 positions (RoPE), untied LM head, no biases, RMSNorm.
    "llama-1.3b": ModelConfig(
        "llama-1.3b", 24, 2048, 16, 128, 5504, vocab=32000, seq_len=4096, ffn_matrices=3,
        learned_positions=False, tied_embeddings=False, biases=False,
    ),
}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name`` (case-insensitive).

    >>> get_preset("GPT3-XL").d_ff
    8192
    """
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise ConfigError(
            f"unknown model preset '{name}'; known presets: {', '.join(PRESETS)}"
        ) from None


# Hugging Face config.json keys, first match wins (GPT-2/Cerebras-GPT, GPT-NeoX, Llama/Mistral, OPT).
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "n_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "d_model": ("hidden_size", "n_embd", "d_model"),
    "n_heads": ("num_attention_heads", "n_head"),
    "d_ff": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "seq_len": ("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
}
# model_type values whose MLP is gated (SwiGLU/GeGLU: three matrices) and that use RoPE, no biases.
_GATED_TYPES = {"llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo",
                "olmo2", "internlm2", "deepseek", "granite", "cohere"}


def _first(d: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return None


def from_hf_config(d: Mapping[str, Any], name: str = "hf-model") -> ModelConfig:
    """Shapes from a Hugging Face ``config.json`` dictionary.

    ``d_ff`` defaults to 4 x hidden (GPT-2's ``n_inner: null``); gated MLP families (Llama,
    Mistral, Qwen2, ...) get three FFN matrices, RoPE, no biases; ``head_dim`` is honoured.

    >>> from_hf_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
    ...                 "vocab_size": 50257, "n_positions": 1024}).d_ff
    3072
    """
    if d.get("num_local_experts") or d.get("num_experts"):
        raise ConfigError(f"config '{name}' is a mixture-of-experts model; Appendix F covers dense "
                          "FFNs only; describe the FFN active per token in a model file of sparsetool's own keys")
    vals = {f: _first(d, keys) for f, keys in _HF_KEYS.items()}
    missing = [f"{f} ({' / '.join(_HF_KEYS[f])})" for f in ("n_layers", "d_model", "n_heads", "vocab")
               if vals[f] is None]
    if missing:
        raise ConfigError(f"config '{name}' lacks {', '.join(missing)}; add them or use a preset")
    d_model, n_heads = int(vals["d_model"]), int(vals["n_heads"])
    model_type = str(d.get("model_type", "")).lower()
    gated = model_type in _GATED_TYPES
    d_head = d.get("head_dim") or d_model // max(n_heads, 1)
    kv = d.get("num_key_value_heads")
    return ModelConfig(
        name=name,
        n_layers=int(vals["n_layers"]),
        d_model=d_model,
        n_heads=n_heads,
        d_head=int(d_head),
        d_ff=int(vals["d_ff"] if vals["d_ff"] is not None else 4 * d_model),
        vocab=int(vals["vocab"]),
        seq_len=int(vals["seq_len"] if vals["seq_len"] is not None else 2048),
        ffn_matrices=3 if gated else 2,
        n_kv_heads=int(kv) if kv is not None and int(kv) != n_heads else None,
        learned_positions=not gated and model_type not in ("gpt_neox", "gptj", "bloom"),
        tied_embeddings=bool(d.get("tie_word_embeddings", not gated)),
        biases=not gated,
    )


_OWN_FIELDS = {f.name for f in fields(ModelConfig)}


def from_mapping(d: Mapping[str, Any], name: str = "model") -> ModelConfig:
    """A ``ModelConfig`` from sparsetool's own keys (the field names), or from HF keys.

    >>> from_mapping({"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "vocab": 100,
    ...               "seq_len": 32}).d_head
    16
    """
    if "model" in d and isinstance(d["model"], Mapping):  # a [model] table in TOML/YAML
        d = d["model"]
    if not (set(d) & {"n_layers", "d_model"}) or "model_type" in d or "architectures" in d:
        return from_hf_config(d, name=str(d.get("name", name)))
    unknown = sorted(set(d) - _OWN_FIELDS)
    if unknown:
        raise ConfigError(
            f"config '{name}': unknown key(s) {', '.join(unknown)}; "
            f"known keys: {', '.join(sorted(_OWN_FIELDS))}"
        )
    required = ("n_layers", "d_model", "n_heads", "d_ff", "vocab", "seq_len")
    missing = [k for k in required if k not in d]
    if missing:
        raise ConfigError(f"config '{name}' lacks {', '.join(missing)}; required keys: "
                          f"{', '.join(required)}")
    kw = dict(d)
    kw.setdefault("name", name)
    if "d_head" not in kw and isinstance(kw["d_model"], int) and isinstance(kw["n_heads"], int) \
            and kw["n_heads"] > 0:
        kw["d_head"] = kw["d_model"] // kw["n_heads"]
    kw.setdefault("d_head", None)  # n_heads is bad then, and __post_init__ says so first
    return ModelConfig(**kw)


def load_config(path: str | Path) -> ModelConfig:
    """Read a model description from a TOML, JSON or YAML file (a HF ``config.json`` works too)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    data = load_mapping(p, what="config file")
    name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return from_mapping(data, name=name)


def with_overrides(cfg: ModelConfig, *, seq_len: int | None = None,
                   vocab: int | None = None) -> ModelConfig:
    """``cfg`` with ``--seq-len`` / ``--vocab`` applied."""
    kw: dict[str, Any] = {}
    if seq_len is not None:
        kw["seq_len"] = seq_len
    if vocab is not None:
        kw["vocab"] = vocab
    return replace(cfg, **kw) if kw else cfg
