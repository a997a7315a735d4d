"""Tiny random mixture-of-experts models of every naming family sparsetool reads, saved as real
checkpoints: Mixtral, Qwen3-MoE, OLMoE and DeepSeek-V3 (one 2-D tensor per expert on disk, as
``save_pretrained`` writes them), gpt-oss (the experts fused on disk, (experts, in, out)) and a
Mixtral whose in-memory state dict is written as it is (the experts fused, (experts, out, in),
``mlp.experts.gate_up_proj``) with its ``config.json``. Any family can be saved fused
(``fused=True``), and with a tokenizer trained on a text (``text``).

Each has 2 layers, hidden size 32, 4 experts, 2 of them per token; ``EXPERT_FFN`` is each
family's expert width. DeepSeek-V3: block 0 dense, block 1 routed experts and a shared one.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as t
from safetensors.torch import save_file

from helpers import save_tokenizer

__all__ = ["FAMILIES", "STORED", "HIDDEN", "EXPERTS", "EXPERT_FFN", "build", "save_moe"]

FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "mixtral_fused")
STORED = FAMILIES[:5]  # each family in the layout it is saved in
HIDDEN, EXPERTS = 32, 4
EXPERT_FFN = {
    "mixtral": 48,
    "mixtral_fused": 48,
    "qwen3_moe": 24,
    "olmoe": 24,
    "deepseek_v3": 24,
    "gpt_oss": 24,
}
_COMMON = dict(
    num_hidden_layers=2,
    hidden_size=HIDDEN,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    max_position_embeddings=64,
    bos_token_id=1,
    eos_token_id=1,
    pad_token_id=None,
)


def build(kind: str) -> torch.nn.Module:
    """A random model of family ``kind`` (seeded: the same weights every time)."""
    torch.manual_seed(0)
    if kind in ("mixtral", "mixtral_fused"):
        config = t.MixtralConfig(
            intermediate_size=48, num_local_experts=EXPERTS, num_experts_per_tok=2, **_COMMON
        )
        return t.MixtralForCausalLM(config).eval()
    if kind == "qwen3_moe":
        return t.Qwen3MoeForCausalLM(
            t.Qwen3MoeConfig(
                intermediate_size=64,
                moe_intermediate_size=24,
                num_experts=EXPERTS,
                num_experts_per_tok=2,
                head_dim=8,
                **_COMMON,
            )
        ).eval()
    if kind == "qwen2_moe":  # a shared expert beside the routed ones, with its own gate
        return t.Qwen2MoeForCausalLM(
            t.Qwen2MoeConfig(
                intermediate_size=64,
                moe_intermediate_size=24,
                shared_expert_intermediate_size=32,
                num_experts=EXPERTS,
                num_experts_per_tok=2,
                **_COMMON,
            )
        ).eval()
    if kind == "llama4":  # experts fused (experts, in, out), called with tokens already routed
        return t.Llama4ForCausalLM(
            t.Llama4TextConfig(
                intermediate_size=24,
                intermediate_size_mlp=48,
                num_local_experts=EXPERTS,
                num_experts_per_tok=1,
                head_dim=8,
                **_COMMON,
            )
        ).eval()
    if kind == "olmoe":
        return t.OlmoeForCausalLM(
            t.OlmoeConfig(
                intermediate_size=24, num_experts=EXPERTS, num_experts_per_tok=2, **_COMMON
            )
        ).eval()
    if kind == "deepseek_v3":  # latent attention: as many key/value heads as query heads
        return t.DeepseekV3ForCausalLM(
            t.DeepseekV3Config(
                intermediate_size=64,
                moe_intermediate_size=24,
                n_routed_experts=EXPERTS,
                num_experts_per_tok=2,
                n_shared_experts=1,
                first_k_dense_replace=1,
                n_group=2,
                topk_group=1,
                kv_lora_rank=16,
                q_lora_rank=16,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=8,
                **{**_COMMON, "num_key_value_heads": 4},
            )
        ).eval()
    if kind == "gpt_oss":
        return t.GptOssForCausalLM(
            t.GptOssConfig(
                intermediate_size=24,
                num_local_experts=EXPERTS,
                num_experts_per_tok=2,
                head_dim=8,
                sliding_window=16,
                layer_types=["sliding_attention", "full_attention"],
                **_COMMON,
            )
        ).eval()
    raise ValueError(kind)


def save_moe(
    kind: str,
    directory: Path,
    text: str | None = None,
    fused: bool = False,
    model: torch.nn.Module | None = None,
) -> Path:
    """Save a model of family ``kind`` (``model``, or ``build(kind)``) into ``directory``
    (``config.json``, ``model.safetensors``, and a tokenizer trained on ``text`` when given);
    ``fused`` (or kind ``mixtral_fused``) writes the in-memory state dict as it is: the experts
    fused."""
    model = build(kind) if model is None else model
    if fused or kind == "mixtral_fused":
        directory.mkdir(parents=True, exist_ok=True)
        model.config.save_pretrained(directory)
        state = {
            k: v.contiguous()
            for k, v in model.state_dict().items()
            if k != "lm_head.weight" or not model.config.tie_word_embeddings
        }
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        model.save_pretrained(directory)
    if text is not None:
        save_tokenizer(directory, text)
    return directory
