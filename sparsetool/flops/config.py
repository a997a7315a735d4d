"""Model shapes for FLOP accounting: the ``ModelConfig`` record, the presets, and config files.

Nothing here imports torch (or numpy): ``sparsetool flops`` must start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from sparsetool.errors import ConfigError
from sparsetool.util.configfile import load_mapping
from sparsetool.util.wording import plural

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
    # The longest sequence the model takes (HF max_position_embeddings). None = seq_len.
    # Counting uses seq_len (default 2048, or this when shorter), which need not equal it.
    context: int | None = None
    # Rows of a learned position table; None = context (else seq_len). OPT's has context + 2.
    position_rows: int | None = None
    # Sliding-window attention (Mistral): each query attends to at most this many keys.
    window: int | None = None
    # Width of the token embedding and LM head when it differs from d_model (OPT-350m's
    # word_embed_proj_dim): project_in/project_out matrices map between the two.
    embed_dim: int | None = None
    # A norm after the last layer (OPT without do_layer_norm_before has none).
    final_norm: bool = True
    # Mixture of experts (Mixtral, Qwen-MoE, OLMoE, gpt-oss): in each MoE layer a router matrix
    # (d_model x n_experts) sends each token to top_k of n_experts feed-forward experts, each an
    # FFN of width d_expert with ffn_matrices matrices (None = d_ff). None = a dense model.
    n_experts: int | None = None
    top_k: int | None = None
    d_expert: int | None = None
    # Width of the shared expert every token also goes through (Qwen2-MoE's
    # shared_expert_intermediate_size); 0 = none. shared_gate: its d_model x 1 sigmoid gate.
    d_shared: int = 0
    shared_gate: bool = False
    # Layers whose FFN is a dense one of width d_ff instead of experts (Qwen-MoE's
    # mlp_only_layers and decoder_sparse_step).
    dense_layers: tuple[int, ...] = ()
    # DeepSeek-V3's router adds a score-correction bias of n_experts per MoE layer (stored beside
    # the router; it only shifts which experts are picked).
    router_bias: bool = False
    # Multi-head latent attention (DeepSeek-V2/V3, MLA; DeepSeek-V2 report, arXiv 2405.04434):
    # keys and values come from a kv_rank-wide latent (kv_lora_rank) plus a d_rope-wide rotary key
    # shared by all heads (qk_rope_head_dim); queries from a q_rank-wide latent (q_lora_rank; None:
    # one d_model x heads*d_head matrix). d_head is a query/key head (qk_nope + qk_rope head dims),
    # d_v a value head (v_head_dim; None = d_head). kv_rank None = ordinary attention.
    kv_rank: int | None = None
    q_rank: int | None = None
    d_rope: int = 0
    d_v: int | None = None
    # Where seq_len came from, for the output (not part of the shape).
    seq_len_source: str = field(default="preset", compare=False)

    @staticmethod
    def check_positive(name: str, field: str, v: Any) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"model '{name}': {field} must be a positive integer, got {v!r}")

    def __post_init__(self) -> None:
        for f in ("n_layers", "d_model", "n_heads", "d_head", "d_ff", "vocab", "seq_len"):
            self.check_positive(self.name, f, getattr(self, f))
        for f in ("context", "position_rows", "window", "embed_dim"):
            if getattr(self, f) is not None:
                self.check_positive(self.name, f, getattr(self, f))
        if self.ffn_matrices not in (2, 3):
            raise ConfigError(
                f"model '{self.name}': ffn_matrices must be 2 (GELU MLP) or 3 (SwiGLU), "
                f"got {self.ffn_matrices!r}"
            )
        if not isinstance(self.dense_layers, tuple):  # a list from a config file
            object.__setattr__(self, "dense_layers", tuple(self.dense_layers))
        self._check_experts()
        self._check_latent_attention()
        if self.n_kv_heads is not None and not (
            isinstance(self.n_kv_heads, int)
            and 1 <= self.n_kv_heads <= self.n_heads
            and self.n_heads % self.n_kv_heads == 0
        ):
            raise ConfigError(
                f"model '{self.name}': {self.n_heads} query heads cannot share {self.n_kv_heads!r} "
                f"key/value heads: n_kv_heads must divide n_heads (e.g. "
                f"{', '.join(str(k) for k in range(1, self.n_heads + 1) if self.n_heads % k == 0)})"
            )

    def _check_experts(self) -> None:
        if self.n_experts is None:
            if (
                self.top_k is not None
                or self.d_expert is not None
                or self.d_shared
                or self.shared_gate
                or self.dense_layers
            ):
                raise ConfigError(
                    f"model '{self.name}': top_k, d_expert, d_shared, shared_gate and "
                    "dense_layers describe experts: give n_experts too, or drop them"
                )
            return
        self.check_positive(self.name, "n_experts", self.n_experts)
        self.check_positive(self.name, "top_k", self.top_k)
        if self.top_k > self.n_experts:
            raise ConfigError(
                f"model '{self.name}': top_k {self.top_k} is more than its "
                f"{self.n_experts} experts; each token goes to at most all of them"
            )
        if self.d_expert is not None:
            self.check_positive(self.name, "d_expert", self.d_expert)
        if (
            isinstance(self.d_shared, bool)
            or not isinstance(self.d_shared, int)
            or self.d_shared < 0
        ):
            raise ConfigError(
                f"model '{self.name}': d_shared must be 0 (no shared expert) or a "
                f"positive integer, got {self.d_shared!r}"
            )
        bad = [
            i
            for i in self.dense_layers
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.n_layers
        ]
        if bad:
            raise ConfigError(
                f"model '{self.name}': dense_layers {bad} are not layer indices 0 to "
                f"{self.n_layers - 1}"
            )
        if self.shared_gate and not self.d_shared:
            raise ConfigError(
                f"model '{self.name}': shared_gate gates a shared expert: give d_shared"
            )

    def _check_latent_attention(self) -> None:
        if self.kv_rank is None:
            if self.q_rank is not None or self.d_rope or self.d_v is not None:
                raise ConfigError(
                    f"model '{self.name}': q_rank, d_rope and d_v describe multi-head "
                    "latent attention: give kv_rank too, or drop them"
                )
            return
        self.check_positive(self.name, "kv_rank", self.kv_rank)
        for f in ("q_rank", "d_v"):
            if getattr(self, f) is not None:
                self.check_positive(self.name, f, getattr(self, f))
        if (
            isinstance(self.d_rope, bool)
            or not isinstance(self.d_rope, int)
            or not 0 <= self.d_rope < self.d_head
        ):
            raise ConfigError(
                f"model '{self.name}': d_rope (the rotary part of each {self.d_head}-wide "
                f"query/key head) must be 0 to {self.d_head - 1}, got {self.d_rope!r}"
            )
        if self.biases:
            raise ConfigError(
                f"model '{self.name}': multi-head latent attention is counted without "
                "biases (DeepSeek's attention_bias and mlp_bias are false): set biases "
                "to false"
            )
        if self.n_kv_heads is not None:
            raise ConfigError(
                f"model '{self.name}': multi-head latent attention has no key/value "
                "heads of its own (kv_rank is their latent): drop n_kv_heads"
            )

    @property
    def is_mla(self) -> bool:
        """True for multi-head latent attention (``kv_rank`` given)."""
        return self.kv_rank is not None

    @property
    def value_head(self) -> int:
        """The width of one value head (``d_v``, else ``d_head``)."""
        return self.d_v or self.d_head

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def is_moe(self) -> bool:
        """True for a mixture-of-experts model (``n_experts`` given)."""
        return self.n_experts is not None

    @property
    def expert_width(self) -> int:
        """The FFN width of one routed expert (``d_expert``, else ``d_ff``)."""
        return self.d_expert or self.d_ff

    @property
    def moe_layers(self) -> int:
        """How many layers route to experts (0 for a dense model)."""
        return self.n_layers - len(set(self.dense_layers)) if self.is_moe else 0

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index not in self.dense_layers


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
    # 5504, vocab 32000, 4096 positions (RoPE; counted at 2048 like the others), untied LM head,
    # no biases, RMSNorm.
    "llama-1.3b": ModelConfig(
        "llama-1.3b",
        24,
        2048,
        16,
        128,
        5504,
        vocab=32000,
        seq_len=2048,
        context=4096,
        ffn_matrices=3,
        learned_positions=False,
        tied_embeddings=False,
        biases=False,
    ),
    # Mixture of experts. Mixtral-8x7B (Jiang et al. 2024, "Mixtral of Experts"; its released
    # config.json): 32 layers, hidden 4096, 32 heads of 128 with 8 kv heads, 8 SwiGLU experts of
    # intermediate 14336 per layer, 2 per token, vocab 32000, 32768 positions (RoPE), untied head.
    "mixtral-8x7b": ModelConfig(
        "mixtral-8x7b",
        32,
        4096,
        32,
        128,
        14336,
        vocab=32000,
        seq_len=2048,
        context=32768,
        ffn_matrices=3,
        n_kv_heads=8,
        learned_positions=False,
        tied_embeddings=False,
        biases=False,
        n_experts=8,
        top_k=2,
    ),
    # Qwen3-30B-A3B (Qwen3 technical report, Yang et al. 2025; its released config.json):
    # 48 layers, hidden 2048, 32 heads of 128 with 4 kv heads, 128 SwiGLU experts of
    # moe_intermediate 768, 8 per token, no shared expert, vocab 151936, 40960 positions, untied.
    "qwen3-30b-a3b": ModelConfig(
        "qwen3-30b-a3b",
        48,
        2048,
        32,
        128,
        6144,
        vocab=151936,
        seq_len=2048,
        context=40960,
        ffn_matrices=3,
        n_kv_heads=4,
        learned_positions=False,
        tied_embeddings=False,
        biases=False,
        n_experts=128,
        top_k=8,
        d_expert=768,
    ),
    # DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, Sec. 4.2;
    # its released config.json): 61 layers, hidden 7168, multi-head latent attention with 128
    # heads (query/key heads of 128 + 64 rotary, value heads of 128, query rank 1536, key/value
    # rank 512), the first 3 layers dense (SwiGLU 18432), then 256 routed experts of 2048, 8 per
    # token, and one shared expert; vocab 129280, 163840 positions (RoPE with YaRN), untied head.
    # Without the multi-token-prediction module (the report's 671B leaves it out too).
    "deepseek-v3": ModelConfig(
        "deepseek-v3",
        61,
        7168,
        128,
        192,
        18432,
        vocab=129280,
        seq_len=2048,
        context=163840,
        ffn_matrices=3,
        learned_positions=False,
        tied_embeddings=False,
        biases=False,
        n_experts=256,
        top_k=8,
        d_expert=2048,
        d_shared=2048,
        dense_layers=(0, 1, 2),
        router_bias=True,
        kv_rank=512,
        q_rank=1536,
        d_rope=64,
        d_v=128,
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
DEFAULT_SEQ_LEN = 2048
"""The sequence length counted when none is given: the SPDF paper's and Chinchilla's (or the
model's context, when that is shorter: :func:`default_seq_len`)."""


def default_seq_len(context: int | None) -> tuple[int, str]:
    """The sequence length counted when none is given, and where it came from: 2048
    (:data:`DEFAULT_SEQ_LEN`), or the model's context when that is shorter, since the model takes
    no longer sequence.

    >>> default_seq_len(64), default_seq_len(131_072), default_seq_len(None)
    ((64, "the model's context"), (2048, 'default'), (2048, 'default'))
    """
    if context is not None and 0 < context < DEFAULT_SEQ_LEN:
        return int(context), "the model's context"
    return DEFAULT_SEQ_LEN, "default"


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
            f"config '{name}' ({model_type or 'unknown model_type'}) uses multi-head latent attention "
            f"(kv_lora_rank {d['kv_lora_rank']}) in a family sparsetool does not read; the types it "
            f"reads are {', '.join(MLA_TYPES)}; write a model file with kv_rank, q_rank, d_rope and "
            "d_v instead (docs/flops.md: multi-head latent attention)"
        )
    experts = next((d[k] for k in _EXPERT_KEYS if d.get(k)), None)
    if experts and model_type not in MOE_TYPES:
        raise ConfigError(
            f"config '{name}' is a mixture-of-experts model of type '{model_type}' ({experts} experts), "
            f"which sparsetool does not read; the types it reads are {', '.join(MOE_TYPES)}; write a "
            "model file with n_experts, top_k and d_expert instead (docs/flops.md: mixture of experts)"
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
                f"config '{name}': unknown key(s) {', '.join(unknown)}; accepted keys (sparsetool's "
                f"or Hugging Face's): {', '.join(_accepted())}"
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


def seq_len_note(cfg: ModelConfig) -> str:
    """Which sequence length is counted and where it came from, and the model's own context
    when that differs: ``"seq 2048 (default; the model's context is 131,072)"``."""
    text = f"seq {cfg.seq_len:,} ({cfg.seq_len_source}"
    if cfg.context is not None and cfg.context != cfg.seq_len:
        text += f"; the model's context is {cfg.context:,}"
    if cfg.window is not None:
        text += f"; attention window {cfg.window:,}"
    return text + ")"


def with_overrides(
    cfg: ModelConfig, *, seq_len: int | None = None, vocab: int | None = None
) -> ModelConfig:
    """``cfg`` with ``--seq-len`` / ``--vocab`` applied."""
    kw: dict[str, Any] = {}
    if seq_len is not None:
        kw["seq_len"], kw["seq_len_source"] = seq_len, "--seq-len"
    if vocab is not None:
        kw["vocab"] = vocab
    return replace(cfg, **kw) if kw else cfg
