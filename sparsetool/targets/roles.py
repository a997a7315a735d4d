"""What each tensor of a checkpoint is (its *role*), read from its name and shape.

A role is read from the tensor's full name (and, where the name is not enough, its shape). The
default targets are the weight matrices of the attention projections and the feed-forward layers
inside the transformer blocks, as in the SPDF paper (Thangarasa et al. 2023, Appendix A, "Sparsity
Setup": the two MLP matrices and the query, key, value and attention-output matrices are sparse; "we
keep the embeddings (implemented as sparse lookups), LayerNorm, and biases dense") and the Cerebras
sparse-training posts, which also keep the output layer dense. Namings recognised: GPT-2,
GPT-BigCode/StarCoder, GPT-J, GPT-NeoX/Pythia, Bloom/Falcon, Llama/Mistral/Qwen2/Gemma, Mixtral
(also the stacked experts of transformers 5), OPT, BERT/RoBERTa, DistilBERT, T5, Phi, Cerebras Model
Zoo GPT and sparsetool's own GPT (``sparsetool train``: ``blocks.N.attn.qkv``, ``attn.proj``,
``mlp.fc``, ``mlp.proj``).

This module does not import torch: ``dtype`` may be a safetensors dtype string (``"BF16"``), a
torch-style name (``"bfloat16"``, ``"torch.bfloat16"``) or a ``torch.dtype``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ROLES",
    "LINEAR_ROLES",
    "EXPERTS_IN_OUT_TYPES",
    "role",
    "input_dim",
    "conv1d_layout",
    "experts_in_out",
    "expert_index",
    "is_routed_expert",
]

ROLES = (
    "qkv",
    "attn_out",
    "ffn_in",
    "ffn_out",
    "router",
    "embedding",
    "position",
    "norm",
    "bias",
    "head",
    "other",
)
"""Every value :func:`role` returns."""

LINEAR_ROLES = ("qkv", "attn_out", "ffn_in", "ffn_out")
"""The roles pruned by default."""

# Trailing components that name a parameter of a module rather than the module itself.
_PARAM_NAMES = {
    "weight",
    "bias",
    "gamma",
    "beta",
    "g",
    "b",
    "scale",
    "kernel",
    "embedding",
    "in_proj_weight",
    "in_proj_bias",
    "weight_orig",
    # compressed-tensors "sparse-bitmask" parts: the role is the module's
    "compressed",
    "bitmask",
    "shape",
    "row_offsets",
}
_BIAS_PARAMS = {"bias", "beta", "b", "in_proj_bias"}

_POSITION = {
    "wpe",
    "pos_emb",
    "pos_embed",
    "pos_embedding",
    "embed_positions",
    "position_embeddings",
    "position_embedding",
    "rotary_emb",
    "rotary_embedding",
    "relative_attention_bias",
    "embed_pos",
    "positional_embedding",
}
_EMBEDDING = {
    "wte",
    "tok_emb",
    "tok_embeddings",
    "token_embedding",
    "embed_tokens",
    "word_embeddings",
    "token_type_embeddings",
    "embed_in",
    "embeddings",
    "embedding",
    "shared",
    "embedding_layer",
    "word_embedding",
}
_HEAD = {"lm_head", "embed_out", "head", "classifier", "score", "qa_outputs", "output_layer"}

# Leaf module names whose role does not depend on where they sit.
_LEAF_ROLES = {
    # fused or separate query/key/value
    **dict.fromkeys(
        [
            "q_proj",
            "k_proj",
            "v_proj",
            "query",
            "key",
            "value",
            "query_key_value",
            "c_attn",
            "qkv",
            "qkv_proj",
            "wqkv",
            "w_pack",
            "wq",
            "wk",
            "wv",
            "q_lin",
            "k_lin",
            "v_lin",
            "proj_q_dense_layer",
            "proj_k_dense_layer",
            "proj_v_dense_layer",
            "q",
            "k",
            "v",
            "q_attn",
            "in_proj",
            # DeepSeek-V2/V3 multi-head latent attention: the low-rank query and key/value factors
            "q_a_proj",
            "q_b_proj",
            "kv_a_proj_with_mqa",
            "kv_b_proj",
        ],
        "qkv",
    ),
    # attention output
    **dict.fromkeys(["o_proj", "out_proj", "out_lin", "o", "proj_output_dense_layer"], "attn_out"),
    # feed-forward in (up, gate, fc1)
    **dict.fromkeys(
        [
            "gate_proj",
            "up_proj",
            "gate_up_proj",
            "c_fc",
            "c_fc2",
            "fc1",
            "fc_in",
            "dense_h_to_4h",
            "w1",
            "w3",
            "wi",
            "wi_0",
            "wi_1",
            "lin1",
            "linear_layer_for_glu",
            "fc",
        ],
        "ffn_in",
    ),
    # feed-forward out (down, fc2)
    **dict.fromkeys(["down_proj", "fc2", "fc_out", "dense_4h_to_h", "w2", "lin2"], "ffn_out"),
}
# Mixture-of-experts routers (expert scores per token): Mixtral's ``block_sparse_moe.gate``,
# Qwen-MoE/OLMoE/DeepSeek's ``mlp.gate``, gpt-oss's and Llama 4's ``router``, Qwen2-MoE's
# ``shared_expert_gate`` (one score gating the shared expert). Any module under a ``router``
# (Switch Transformers' ``router.classifier``, DBRX's ``router.layer``) is one too.
_ROUTERS = {"gate", "router", "shared_expert_gate"}
# The module that holds the routed experts (``experts.E.w1``, ``experts.gate_up_proj``).
_EXPERTS = "experts"

# Leaf names that are the attention output inside attention and the FFN output elsewhere.
_CONTEXTUAL_OUT = {"c_proj", "proj", "dense", "wo"}

# sparsetool's own GPT (models/gpt.py): exact names, so its contract does not rest on context rules.
_OWN_GPT_RE = re.compile(r"^blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.weight$")
_OWN_GPT_ROLES = {
    "attn.qkv": "qkv",
    "attn.proj": "attn_out",
    "mlp.fc": "ffn_in",
    "mlp.proj": "ffn_out",
}

_ATTN_RE = re.compile(r"attn|attention", re.IGNORECASE)
_NORM_RE = re.compile(r"norm|^ln(_?[0-9a-z]*)?$", re.IGNORECASE)
# GPT-2 (and its descendants that kept transformers.pytorch_utils.Conv1D) store (in, out).
_CONV1D_RE = re.compile(
    r"(^|\.)h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj|"
    r"crossattention\.c_attn|crossattention\.q_attn|crossattention\.c_proj)\.weight$"
)


def _split(name: str) -> tuple[list[str], str | None]:
    """(module components, parameter name or None)."""
    parts = name.split(".")
    if len(parts) > 1 and parts[-1] in _PARAM_NAMES:
        return parts[:-1], parts[-1]
    return parts, None


def _in_block(modules: list[str]) -> bool:
    """True if the path has a layer index (``h.3``, ``layers.3``, ``blocks.3``, ``layer.3``)."""
    return any(p.isdigit() for p in modules)


def role(name: str, shape: tuple[int, ...] | Sequence[int] = ()) -> str:
    """The role of tensor ``name``: one of :data:`ROLES`.

    Rules, first match wins: a ``_mask`` side tensor is ``other``; a bias (``.bias``, ``.beta``,
    ``masked_bias``...) is ``bias``; a module named like a norm (``ln_1``, ``ln_f``, ``norm1``,
    ``LayerNorm``, ``input_layernorm``...) is ``norm``; position tables (``wpe``, ``pos_emb``,
    ``embed_positions``, ``position_embeddings``, ``rotary_emb``...) are ``position``; token
    embeddings (``wte``, ``embed_tokens``, ``word_embeddings``, ``embed_in``...) are ``embedding``;
    a mixture-of-experts router inside a block (``block_sparse_moe.gate``, ``mlp.gate``,
    ``mlp.router``, ``shared_expert_gate``, anything under a ``router`` module) is ``router``;
    the output layer (``lm_head``, ``embed_out``, ``head``, ``cls.predictions.decoder``) is
    ``head``. Linear roles need a layer index in the name (``h.0``, ``layers.0``, ``layer.0``,
    ``blocks.0``), so a BERT pooler or a stray projection is ``other``. Names that mean different
    things in different places are read in context: ``c_proj``/``proj``/``dense``/``wo`` are
    ``attn_out`` under an attention module and ``ffn_out`` elsewhere; BERT's ``intermediate.dense``
    is ``ffn_in``; the Cerebras Model Zoo ``ffn.ffn.0.linear_layer`` is ``ffn_in`` and
    ``ffn.ffn.K.linear_layer`` (K > 0) is ``ffn_out``. A linear role on a tensor with fewer than two
    dimensions (a per-channel scale, say) is ``other``.

    >>> role("transformer.h.0.attn.c_attn.weight", (768, 2304))
    'qkv'
    >>> role("bert.encoder.layer.3.attention.output.dense.weight", (768, 768))
    'attn_out'
    >>> role("bert.encoder.layer.3.output.dense.weight", (768, 3072))
    'ffn_out'
    >>> role("model.embed_tokens.weight", (32000, 4096))
    'embedding'
    >>> role("blocks.1.mlp.proj.weight", (32, 128))  # sparsetool's own GPT
    'ffn_out'
    >>> role("model.layers.0.block_sparse_moe.gate.weight", (8, 4096))  # Mixtral's router
    'router'
    """
    shape = tuple(shape)
    own = _OWN_GPT_RE.match(name)
    if own and len(shape) != 1:
        return _OWN_GPT_ROLES[own.group(1)]
    modules, param = _split(name)
    leaf = modules[-1]
    if leaf.endswith("_mask") or (param is None and name.endswith("_mask")):
        return "other"
    if (
        param in _BIAS_PARAMS or (param is None and (leaf == "bias" or leaf.endswith("_bias")))
    ) and leaf != "relative_attention_bias":
        return "bias"
    if _NORM_RE.search(leaf):
        return "norm"
    lower = [p.lower() for p in modules]
    if any(p in _POSITION for p in lower):
        return "position"
    if any(p in _EMBEDDING for p in lower):
        return "embedding"
    if _in_block(modules) and (lower[-1] in _ROUTERS or "router" in lower[:-1]) and len(shape) != 1:
        return "router"
    if (
        any(p in _HEAD for p in lower)
        or ".".join(lower).endswith("cls.predictions.decoder")
        or lower == ["output"]  # Meta's original Llama checkpoints
    ):
        return "head"
    found = _linear_role(modules, param)
    if found is None or not _in_block(modules):
        return "other"
    if len(shape) == 1 or (shape == () and param in ("scale", "g")):
        return "other"
    return found


def _linear_role(modules: list[str], param: str | None) -> str | None:
    if len(modules) > 1 and modules[-1] == "base_layer":  # PEFT/LoRA wraps the original layer
        modules = modules[:-1]
    leaf = modules[-1].lower()
    parent = modules[-2].lower() if len(modules) > 1 else ""
    in_attention = any(_ATTN_RE.search(p) for p in modules[:-1]) or bool(_ATTN_RE.search(leaf))
    if param == "in_proj_weight":  # torch.nn.MultiheadAttention keeps q, k, v in one parameter
        return "qkv"
    if leaf == "linear_layer" and parent.isdigit():  # Cerebras Model Zoo FeedForwardNetwork
        return "ffn_in" if parent == "0" else "ffn_out"
    if leaf in _LEAF_ROLES:
        return _LEAF_ROLES[leaf]
    if leaf == "dense" and parent == "intermediate":  # BERT
        return "ffn_in"
    if leaf in _CONTEXTUAL_OUT:
        return "attn_out" if in_attention else "ffn_out"
    return None


def input_dim(
    name: str,
    shape: tuple[int, ...] | Sequence[int],
    *,
    conv1d: bool | None = None,
    known_role: str | None = None,
    experts_transposed: bool = False,
) -> int:
    """The dimension of ``shape`` that indexes input features (the one N:M groups run along).

    ``nn.Linear`` stores (out, in), so 1; GPT-2's ``Conv1D`` (``h.N.attn.c_attn``,
    ``h.N.attn.c_proj``, ``h.N.mlp.c_fc``, ``h.N.mlp.c_proj`` weights) stores (in, out), so 0.
    The same names hold ``nn.Linear`` weights in GPT-BigCode/StarCoder and Qwen-1; the shape tells
    them apart, given that q/k/v and the FFN are at least as wide as the model: a ``c_attn`` or
    ``c_fc`` whose first dimension is the larger, or an ``mlp.c_proj`` whose second is, is
    ``nn.Linear``. The square ``attn.c_proj`` cannot be told apart and is read as GPT-2's unless the
    caller knows better: ``conv1d=False`` (say, from a ``config.json`` whose ``model_type`` is not
    ``gpt2``) reads these names as ``nn.Linear``, ``conv1d=True`` as Conv1D. A stack of linear
    weights with a linear role, such as the mixture-of-experts tensors of transformers 5
    (``mlp.experts.gate_up_proj``, (experts, out, in)), gives its last dimension, or 1 with
    ``experts_transposed`` (checkpoints that store them (experts, in, out), gpt-oss and Llama 4:
    :func:`experts_in_out`). Other tensors with more than two dimensions are read as convolution
    kernels (out, in, ...) and give 1; 1-D tensors give 0. ``known_role`` is the tensor's
    :func:`role`, when the caller has it already.

    >>> input_dim("transformer.h.0.mlp.c_fc.weight", (768, 3072))
    0
    >>> input_dim("model.layers.0.mlp.up_proj.weight", (11008, 4096))
    1
    >>> input_dim("transformer.h.0.attn.c_proj.weight", (768, 768), conv1d=False)
    1
    """
    shape = tuple(shape)
    if len(shape) < 2:
        return 0
    if _CONV1D_RE.search(name) and conv1d is not False:
        if conv1d:
            return 0
        widening = name.endswith(("c_attn.weight", "c_fc.weight"))
        narrowing = name.endswith("mlp.c_proj.weight")
        if (widening and shape[0] > shape[1]) or (narrowing and shape[0] < shape[1]):
            return 1
        return 0
    if len(shape) > 2 and (known_role or role(name, shape)) in LINEAR_ROLES:
        return 1 if experts_transposed and len(shape) == 3 else len(shape) - 1
    return 1


def conv1d_layout(config: Mapping[str, Any] | None) -> bool | None:
    """Whether GPT-2 style names hold Conv1D (in, out) weights, from a ``config.json``.

    GPT-2 stores them as Conv1D; GPT-BigCode and Qwen-1 reuse the names on ``nn.Linear``. Without
    a config the names decide (None), which is right for GPT-2 itself.

    >>> (
    ...     conv1d_layout({"model_type": "gpt2"}),
    ...     conv1d_layout({"model_type": "gpt_bigcode"}),
    ...     conv1d_layout(None),
    ... )
    (True, False, None)
    """
    model_type = (config or {}).get("model_type")
    return None if model_type is None else model_type == "gpt2"


EXPERTS_IN_OUT_TYPES = ("gpt_oss", "llama4", "llama4_text")
"""``config.json`` model types whose checkpoints store fused expert weights (experts, in, out)."""


def experts_in_out(config: Mapping[str, Any] | None) -> bool:
    """Whether the checkpoint stores its fused (3-D) expert weights (experts, in, out), from a
    ``config.json``: gpt-oss (``mlp.experts.gate_up_proj`` [experts, hidden, 2 * ffn]) and Llama 4
    do; transformers 5's in-memory layout, and any checkpoint saved from it, is (experts, out, in).
    The model type is read at the top level or under ``text_config``; without a config, False.

    >>> (
    ...     experts_in_out({"model_type": "gpt_oss"}),
    ...     experts_in_out({"model_type": "mixtral"}),
    ...     experts_in_out(None),
    ... )
    (True, False, False)
    """
    config = config or {}
    text = config.get("text_config")
    types = {
        config.get("model_type"),
        text.get("model_type") if isinstance(text, Mapping) else None,
    }
    return any(t in EXPERTS_IN_OUT_TYPES for t in types)


def expert_index(name: str) -> int | None:
    """The routed expert a per-expert tensor belongs to (the number after ``experts``), or None.

    >>> expert_index("model.layers.3.block_sparse_moe.experts.5.w1.weight")
    5
    >>> expert_index("model.layers.3.mlp.experts.gate_up_proj") is None  # all experts fused
    True
    >>> expert_index("model.layers.3.mlp.shared_experts.up_proj.weight") is None  # not routed
    True
    """
    parts = name.split(".")
    for a, b in zip(parts, parts[1:]):
        if a == _EXPERTS and b.isdigit():
            return int(b)
    return None


def is_routed_expert(name: str) -> bool:
    """Whether ``name`` is a routed expert's weight: one expert's (``experts.E.``) or every
    expert's fused (``experts.gate_up_proj``); a shared expert (``shared_expert``,
    ``shared_experts``) is an ordinary FFN.

    >>> (
    ...     is_routed_expert("model.layers.0.mlp.experts.down_proj"),
    ...     is_routed_expert("model.layers.0.mlp.down_proj.weight"),
    ... )
    (True, False)
    """
    return _EXPERTS in name.split(".")[:-1]
