"""Chinchilla Appendix-F forward FLOPs, term by term, with weight sparsity on the targeted matmuls.

Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models"), Appendix F, for one
sequence of length ``s``, width ``d``, ``h`` heads of size ``k``, FFN width ``f``, vocabulary
``V``::

    embeddings      2*s*V*d                      (excluded by default, as in the SPDF tables)
    per layer:
      qkv           2*3*s*d*(k*h)                (GQA: 2*s*d*k*(h + 2*h_kv))
      attn_logits   2*s*s*(k*h)
      softmax       3*h*s*s
      attn_values   2*s*s*(k*h)
      attn_out      2*s*(k*h)*d
      ffn           2*s*2*d*f                    (SwiGLU: 2*s*3*d*f)
    logits          2*s*d*V
    forward = embeddings + L * (per layer) + logits;  backward = 2 x forward

Mixture of experts (Shazeer et al. 2017; Mixtral, Jiang et al. 2024): a token goes through the
``top_k`` experts its router picks, so in an MoE layer the ffn term counts ``top_k`` experts of
width ``f_e`` (plus a shared expert of width ``f_s`` every token takes) and the router's matmul is
a term of its own::

      ffn           2*s*3*d*(top_k*f_e + f_s)    (2 matrices instead of 3 for a GELU MLP)
      router        2*s*d*E                      (+ 2*s*d for Qwen2-MoE's shared-expert gate)

The experts' matrices are targeted like any FFN matrix; the router never is.

Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1; DeepSeek-V3, arXiv
2412.19437): q, k and v come from low-rank latents. With query rank ``r_q``, key/value rank
``r_kv``, heads of ``k = k_nope + k_rope`` for queries and keys and ``k_v`` for values, the qkv term
is 2*s x the weights of its four matrices (each token's keys and values expanded from its latent,
as transformers computes them), and values and the output projection are ``k_v*h`` wide::

      qkv           2*s*(d*r_q + r_q*h*k + d*(r_kv + k_rope) + r_kv*h*(k_nope + k_v))
                                                 (no query latent: d*h*k instead of d*r_q + r_q*h*k)
      attn_logits   2*s*s*(k*h)
      attn_values   2*s*s*(k_v*h)
      attn_out      2*s*(k_v*h)*d

Unstructured weight sparsity removes the multiplies by zero weights, so it scales only the
weight matmuls that are pruned: qkv, attn_out and ffn (the SPDF paper, App. A.1, and the
iterative-pruning post, footnote 1). Attention logits/values, softmax and the LM-head logits
stay dense.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparsetool.errors import ConfigError
from sparsetool.flops.modelconfig import ModelConfig
from sparsetool.util.options import parse_sparsity
from sparsetool.util.wording import plural

TERMS = (
    "qkv",
    "attn_logits",
    "softmax",
    "attn_values",
    "attn_out",
    "ffn",
    "router",
    "logits",
    "embeddings",
)
"""Keys of :func:`forward_terms`, in the order Appendix F lists them (embeddings last: optional)."""
TARGETED_TERMS = ("qkv", "attn_out", "ffn")
"""The terms weight sparsity scales; everything else is dense work."""
ROLES = ("qkv", "attn_out", "ffn_in", "ffn_out")
"""Per-layer sparsity roles (``ffn_in`` covers up and gate of a SwiGLU MLP)."""

LayerSparsity = Sequence[Mapping[str, float]]


def _given(value: int | None, field: str) -> int:
    """``value``, a field the model's kind implies (experts of a mixture of experts, the latent
    of multi-head latent attention): :class:`ModelConfig` refused a model without it."""
    if value is None:
        raise AssertionError(f"{field} is not set")
    return value


def _check_sparsity(v: float, where: str) -> float:
    return parse_sparsity(v, f"{where}: sparsity")


def layer_sparsities(cfg: ModelConfig, sparsity: float | LayerSparsity) -> list[dict[str, float]]:
    """Normalise ``sparsity`` to one ``{role: sparsity}`` per layer; a missing role is dense (0).

    >>> layer_sparsities(ModelConfig("t", 2, 8, 2, 4, 32, 10, 4), 0.5)[1]["ffn_out"]
    0.5
    """
    if isinstance(sparsity, (int, float)) and not isinstance(sparsity, bool):
        s = _check_sparsity(sparsity, "sparsity")
        return [dict.fromkeys(ROLES, s) for _ in range(cfg.n_layers)]
    if isinstance(sparsity, (str, bytes, Mapping)) or not isinstance(sparsity, Sequence):
        raise ConfigError("sparsity must be one number or one {role: sparsity} mapping per layer")
    if len(sparsity) != cfg.n_layers:
        raise ConfigError(
            f"per-layer sparsity has {len(sparsity)} entries but model '{cfg.name}' has "
            f"{plural(cfg.n_layers, 'layer')}"
        )
    out = []
    for i, m in enumerate(sparsity):
        unknown = set(m) - set(ROLES)
        if unknown:
            raise ConfigError(
                f"layer {i}: unknown role(s) {sorted(unknown)}; roles: {', '.join(ROLES)}"
            )
        out.append({r: _check_sparsity(m.get(r, 0.0), f"layer {i} {r}") for r in ROLES})
    return out


def forward_terms(
    cfg: ModelConfig,
    *,
    seq_len: int | None = None,
    sparsity: float | LayerSparsity = 0.0,
    embeddings: bool = False,
) -> dict[str, float]:
    """Forward FLOPs of ONE sequence, term by term (Chinchilla App. F), summed over layers.

    ``sparsity``: one fraction of zeros for every targeted matmul, or per layer a mapping
    role -> sparsity with roles ``qkv``, ``attn_out``, ``ffn_in``, ``ffn_out``.

    GPT-3 XL at 2048 tokens, dense: 3 x this sum is the SPDF appendix Table 2's 1.86e13 FLOPs
    per sequence.

    >>> from sparsetool.flops.presets import get_preset
    >>> t = forward_terms(get_preset("gpt3-xl"))
    >>> f"{3 * sum(t.values()):.3g}", t["embeddings"]
    ('1.86e+13', 0.0)
    """
    s = int(cfg.seq_len if seq_len is None else seq_len)
    if s < 1:
        raise ConfigError(f"sequence length must be a positive integer, got {seq_len!r}")
    d, h, k, V = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.vocab
    kh, vh = k * h, cfg.value_head * h
    per_layer = layer_sparsities(cfg, sparsity)

    # = 2*3*s*d*(k*h) without GQA or MLA
    qkv_dense = 2.0 * s * sum(m * n for _, (m, n) in qkv_matrices(cfg))
    out_dense = 2.0 * s * vh * d
    qkv = attn_out = ffn = router = 0.0
    for i, ls in enumerate(per_layer):
        qkv += qkv_dense * (1.0 - ls["qkv"])
        attn_out += out_dense * (1.0 - ls["attn_out"])
        # the FFN widths one token goes through: up (and gate for SwiGLU), then down
        width = active_ffn_width(cfg, i)
        ffn += (
            2.0
            * s
            * d
            * width
            * ((cfg.ffn_matrices - 1) * (1.0 - ls["ffn_in"]) + (1.0 - ls["ffn_out"]))
        )
        if cfg.is_moe_layer(i):
            router += (
                2.0 * s * d * (_given(cfg.n_experts, "n_experts") + (1 if cfg.shared_gate else 0))
            )
    L = cfg.n_layers
    keys = keys_per_query(cfg, s)
    e = cfg.embed_dim or d
    proj = 2.0 * s * d * e if e != d else 0.0  # OPT's project_out (before the head), project_in
    return {
        "qkv": qkv,
        "attn_logits": L * 2.0 * s * keys * kh,
        "softmax": L * 3.0 * h * s * keys,
        "attn_values": L * 2.0 * s * keys * vh,
        "attn_out": attn_out,
        "ffn": ffn,
        "router": router,
        "logits": 2.0 * s * e * V + proj,
        "embeddings": 2.0 * s * V * e + proj if embeddings else 0.0,
    }


def qkv_matrices(cfg: ModelConfig) -> list[tuple[str, tuple[int, int]]]:
    """The ``qkv`` matrices of one layer as ``(name, (out, in))``: q, k and v fused in one
    (``d_head * (n_heads + 2 * kv_heads)`` by ``d_model``), or multi-head latent attention's four
    (``q_a``/``q_b``, or ``q`` without a query latent; ``kv_a``, ``kv_b``).

    >>> from sparsetool.flops.presets import get_preset
    >>> qkv_matrices(get_preset("gpt2-small"))
    [('qkv', (2304, 768))]
    >>> [n for n, _ in qkv_matrices(get_preset("deepseek-v3"))]
    ['q_a', 'q_b', 'kv_a', 'kv_b']
    """
    d, h, k = cfg.d_model, cfg.n_heads, cfg.d_head
    if not cfg.is_mla:
        return [("qkv", (k * (h + 2 * cfg.kv_heads), d))]
    q = (
        [("q_a", (cfg.q_rank, d)), ("q_b", (h * k, cfg.q_rank))]
        if cfg.q_rank
        else [("q", (h * k, d))]
    )
    nope = k - cfg.d_rope
    kv_rank = _given(cfg.kv_rank, "kv_rank")
    return q + [
        ("kv_a", (kv_rank + cfg.d_rope, d)),
        ("kv_b", (h * (nope + cfg.value_head), kv_rank)),
    ]


def active_ffn_width(cfg: ModelConfig, layer: int) -> int:
    """The FFN width one token of ``layer`` goes through: ``d_ff`` in a dense layer; in an MoE
    layer ``top_k`` experts of ``d_expert`` plus the shared expert's ``d_shared``."""
    if not cfg.is_moe_layer(layer):
        return cfg.d_ff
    return _given(cfg.top_k, "top_k") * cfg.expert_width + cfg.d_shared


def keys_per_query(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Keys each query attends to in Appendix F's count: the sequence length, or the sliding
    window when the model has a shorter one (Mistral)."""
    s = int(cfg.seq_len if seq_len is None else seq_len)
    return min(s, cfg.window) if cfg.window else s


def forward_flops(cfg: ModelConfig, **kw) -> float:
    """Sum of :func:`forward_terms` (same arguments)."""
    return sum(forward_terms(cfg, **kw).values())


def term_formulas(cfg: ModelConfig, seq_len: int | None = None) -> dict[str, str]:
    """Each dense term's formula with this model's numbers filled in, for checking by hand."""
    s = cfg.seq_len if seq_len is None else seq_len
    d, h, k, V, L = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.vocab, cfg.n_layers
    w = keys_per_query(cfg, s)  # = s without a shorter sliding window
    e = cfg.embed_dim or d
    proj = f" + 2*{s}*{d}*{e}" if e != d else ""
    kv = cfg.value_head
    if cfg.is_mla:
        qkv = f"{L}*2*{s}*(" + " + ".join(f"{m}*{n}" for _, (m, n) in qkv_matrices(cfg)) + ")"
    elif cfg.n_kv_heads is None:
        qkv = f"{L}*2*3*{s}*{d}*({k}*{h})"
    else:
        qkv = f"{L}*2*{s}*{d}*{k}*({h}+2*{cfg.n_kv_heads})"
    return {
        "qkv": qkv,
        "attn_logits": f"{L}*2*{s}*{w}*({k}*{h})",
        "softmax": f"{L}*3*{h}*{s}*{w}",
        "attn_values": f"{L}*2*{s}*{w}*({kv}*{h})",
        "attn_out": f"{L}*2*{s}*({kv}*{h})*{d}",
        "ffn": _ffn_formula(cfg, s),
        "router": _router_formula(cfg, s),
        "logits": f"2*{s}*{e}*{V}{proj}",
        "embeddings": f"2*{s}*{V}*{e}{proj}",
    }


def _ffn_formula(cfg: ModelConfig, s: int) -> str:
    m, d, L = cfg.ffn_matrices, cfg.d_model, cfg.n_layers
    if not cfg.is_moe:
        return f"{L}*2*{s}*{m}*{d}*{cfg.d_ff}"
    shared = f"+{cfg.d_shared}" if cfg.d_shared else ""
    text = f"{cfg.moe_layers}*2*{s}*{m}*{d}*({cfg.top_k}*{cfg.expert_width}{shared})"
    dense = L - cfg.moe_layers
    return text + (f" + {dense}*2*{s}*{m}*{d}*{cfg.d_ff}" if dense else "")


def _router_formula(cfg: ModelConfig, s: int) -> str:
    if not cfg.is_moe:
        return "0"  # no experts
    e = f"({cfg.n_experts}+1)" if cfg.shared_gate else str(cfg.n_experts)
    return f"{cfg.moe_layers}*2*{s}*{cfg.d_model}*{e}"


def param_counts(cfg: ModelConfig, sparsity: float | LayerSparsity = 0.0) -> dict[str, float]:
    """Parameters of the model: ``targeted`` (the pruned matrices), ``other`` and their
    ``total``, plus ``nonzero`` = total minus the pruned weights.

    Embeddings, positions, norms, biases, routers and an untied LM head are counted but never
    pruned, as in the SPDF paper (App. A.1) and the iterative-pruning post. Multi-head latent
    attention's four projections are ``qkv`` (:func:`qkv_matrices`), its latents' norms other.

    ``active`` and ``active_nonzero`` are what one token uses: a mixture of experts' total minus
    the experts its router does not pick (``n_experts - top_k`` per MoE layer; the non-zeros of
    those experts at their layer's sparsity). A dense model's are its total and non-zeros.

    >>> from sparsetool.flops.presets import get_preset
    >>> round(param_counts(get_preset("cerebras-gpt-111m"))["total"] / 1e6)
    111
    >>> p = param_counts(get_preset("mixtral-8x7b"))
    >>> round(p["total"] / 1e9, 2), round(p["active"] / 1e9, 2)
    (46.7, 12.88)
    """
    d, k, V, m = cfg.d_model, cfg.d_head, cfg.vocab, cfg.ffn_matrices
    kh, kv = k * cfg.n_heads, k * cfg.kv_heads
    qkv_w = sum(a * b for _, (a, b) in qkv_matrices(cfg))
    out_w = cfg.value_head * cfg.n_heads * d
    norm = 2 * d if cfg.biases else d  # LayerNorm has a bias, RMSNorm does not
    # multi-head latent attention's RMSNorms on its latents (q_a_layernorm, kv_a_layernorm)
    latent_norms = (cfg.q_rank or 0) + _given(cfg.kv_rank, "kv_rank") if cfg.is_mla else 0
    targeted = other = pruned = inactive = inactive_nonzero = 0.0
    for i, ls in enumerate(layer_sparsities(cfg, sparsity)):
        in_keep, out_keep = 1.0 - ls["ffn_in"], 1.0 - ls["ffn_out"]
        targeted += qkv_w + out_w
        pruned += qkv_w * ls["qkv"] + out_w * ls["attn_out"]
        other += 2 * norm + latent_norms
        if cfg.biases:
            other += (kh + 2 * kv) + d
        # FFN widths held by the layer: a dense FFN, else every routed expert plus the shared one
        if cfg.is_moe_layer(i):
            fe, E = cfg.expert_width, _given(cfg.n_experts, "n_experts")
            width = E * fe + cfg.d_shared
            other += d * E + (d if cfg.shared_gate else 0)  # the router (and shared-expert gate)
            if cfg.router_bias:
                other += E  # DeepSeek-V3's score-correction bias
            expert_biases = (m - 1) * fe + d if cfg.biases else 0
            if cfg.biases:
                other += E * expert_biases + E  # every expert's biases and the router's
            idle = E - _given(cfg.top_k, "top_k")
            inactive += idle * (m * d * fe + expert_biases)
            inactive_nonzero += idle * (
                (m - 1) * d * fe * in_keep + fe * d * out_keep + expert_biases
            )
        else:
            width = cfg.d_ff
            if cfg.biases:
                other += (m - 1) * width + d
        targeted += m * d * width
        pruned += (m - 1) * d * width * ls["ffn_in"] + width * d * ls["ffn_out"]
    e = cfg.embed_dim or d
    other += V * e  # token embedding
    if cfg.final_norm:
        other += norm
    if e != d:
        other += 2 * d * e  # OPT's project_in and project_out (no biases)
    if cfg.learned_positions:
        other += (cfg.position_rows or cfg.context or cfg.seq_len) * d
    if not cfg.tied_embeddings:
        other += V * e
    total = float(targeted + other)
    nonzero = total - pruned
    return {
        "targeted": float(targeted),
        "other": float(other),
        "total": total,
        "nonzero": nonzero,
        "active": total - inactive,
        "active_nonzero": nonzero - inactive_nonzero,
    }
