"""The model-shape record of FLOP accounting, :class:`ModelConfig`, and its checks; the sequence
length counted when none is given (:func:`default_seq_len`) and what ``--seq-len`` / ``--vocab``
change (:func:`with_overrides`).

Nothing here imports torch (or numpy): ``sparsetool flops`` must start fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from sparsetool.errors import ConfigError

CHINCHILLA_TOKENS_PER_PARAM = 20.0
"""Compute-optimal tokens per parameter (Hoffmann et al. 2022), as the SPDF paper uses it
(Sec. 3)."""


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
        if self.top_k is None:  # check_positive refused it
            raise AssertionError("top_k was not checked")
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
