"""Tiny random Mixture-of-Experts causal LMs of every family transformers 5 ships that sparsetool
supports, saved as checkpoints in either storage layout: one tensor per expert (what
``save_pretrained`` writes for Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3) or the fused 3-D tensors
transformers runs (``mlp.experts.gate_up_proj``; what gpt-oss stores)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import save_tokenizer

FAMILIES = ("mixtral", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss")
EXPERTS = 4
_COMMON = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1,
               pad_token_id=None)


def tiny_moe(kind: str):
    """A random model of ``kind``: 2 blocks, width 32, 4 experts, 2 of them per token."""
    import transformers as t

    c = dict(_COMMON, num_experts_per_tok=2)
    if kind == "mixtral":
        return t.MixtralForCausalLM(t.MixtralConfig(
            intermediate_size=48, num_local_experts=EXPERTS, **c))
    if kind == "qwen3_moe":
        return t.Qwen3MoeForCausalLM(t.Qwen3MoeConfig(
            intermediate_size=64, moe_intermediate_size=24, num_experts=EXPERTS, head_dim=8, **c))
    if kind == "olmoe":
        return t.OlmoeForCausalLM(t.OlmoeConfig(intermediate_size=24, num_experts=EXPERTS, **c))
    if kind == "deepseek_v3":  # block 0 dense, block 1 routed experts and a shared one; MLA
        c["num_key_value_heads"] = 4
        return t.DeepseekV3ForCausalLM(t.DeepseekV3Config(
            intermediate_size=64, moe_intermediate_size=24, n_routed_experts=EXPERTS,
            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, kv_lora_rank=16,
            q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, **c))
    if kind == "gpt_oss":
        return t.GptOssForCausalLM(t.GptOssConfig(
            intermediate_size=24, num_local_experts=EXPERTS, head_dim=8, sliding_window=16,
            layer_types=["sliding_attention", "full_attention"], **c))
    raise ValueError(f"no tiny MoE of kind {kind!r}")


def save_moe(kind: str, directory: Path, text: str, fused: bool = False, seed: int = 0) -> Path:
    """``tiny_moe(kind)`` saved with a tokenizer trained on ``text``; ``fused`` writes the 3-D
    expert tensors the model runs instead of one tensor per expert (gpt-oss stores them so
    either way)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = tiny_moe(kind).eval()
    model.save_pretrained(directory)
    if fused:
        state = {k: v.contiguous() for k, v in model.state_dict().items()
                 if k != "lm_head.weight" or not model.config.tie_word_embeddings}
        (directory / "model.safetensors").unlink()
        save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    save_tokenizer(directory, text)
    assert json.loads((directory / "config.json").read_text())["model_type"] == kind
    return directory
