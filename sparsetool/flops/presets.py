"""The built-in model presets of FLOP accounting (``--model NAME``), each shape with its source.

Nothing here imports torch (or numpy): ``sparsetool flops`` must start fast.
"""

from __future__ import annotations

from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.flops.modelconfig import ModelConfig


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
