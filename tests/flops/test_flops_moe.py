"""Mixture-of-experts FLOPs and parameters: by-hand counts of Mixtral-8x7B and Qwen3-30B-A3B from
their config.json numbers, checked against the published totals and against transformers' own
count of each family's model built on the meta device; real MoE checkpoints (one matrix per
expert, and transformers' 3-D stacked experts) read end to end through the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import transformers
from moe_models import EXPERT_FFN, build  # noqa: E402
from safetensors.torch import save_file

from sparsetool.errors import ConfigError, ShapeError
from sparsetool.flops import (
    account,
    forward_terms,
    from_checkpoint,
    from_mapping,
    get_preset,
    param_counts,
    term_formulas,
)

import json_schemas as S
from helpers import runner_for

run = runner_for("flops", columns=240)

# The released config.json numbers (shapes only).
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "architectures": ["MixtralForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
    "sliding_window": None,
}
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "use_sliding_window": False,
    "sliding_window": None,
}


def test_mixtral_8x7b_by_hand_lands_on_the_published_totals():
    cfg = from_mapping(MIXTRAL_8X7B, name="Mixtral-8x7B")
    assert replace(cfg, name="mixtral-8x7b") == get_preset(
        "mixtral-8x7b"
    )  # the preset is this file
    d, L, V, f, E, k = 4096, 32, 32000, 14336, 8, 2
    attention = d * 4096 + 2 * d * 1024 + 4096 * d  # q, k, v (8 kv heads of 128), o: 41,943,040
    expert = 3 * d * f  # gate, up, down: 176,160,768
    router = d * E  # 32,768
    norms = 2 * d  # RMSNorm before attention and before the experts
    per_layer = attention + E * expert + router + norms
    total = L * per_layer + 2 * V * d + d  # embedding, untied LM head, final norm
    active = total - L * (E - k) * expert
    assert (attention, expert, total, active) == (
        41_943_040,
        176_160_768,
        46_702_792_704,
        12_879_925_248,
    )
    p = param_counts(cfg)
    assert (p["total"], p["active"]) == (total, active)
    # Mistral AI, "Mixtral of experts" (Dec 2023): 46.7B total parameters, 12.9B used per token.
    assert total == pytest.approx(46.7e9, rel=0.005) and active == pytest.approx(12.9e9, rel=0.005)
    # one token's forward FLOPs: 2 x the active matrices, plus the router's matmul
    s = cfg.seq_len
    t = forward_terms(cfg)
    assert t["ffn"] == L * 2 * s * k * expert
    assert t["router"] == L * 2 * s * d * E
    assert t["qkv"] + t["attn_out"] == L * 2 * s * attention


def test_qwen3_30b_a3b_by_hand_lands_on_the_published_totals():
    cfg = from_mapping(QWEN3_30B_A3B, name="Qwen3-30B-A3B")
    assert (cfg.n_experts, cfg.top_k, cfg.expert_width, cfg.dense_layers) == (128, 8, 768, ())
    d, L, V, fe, E, k = 2048, 48, 151936, 768, 128, 8
    attention = d * (32 * 128) + 2 * d * (4 * 128) + (32 * 128) * d  # 18,874,368
    expert = 3 * d * fe  # 4,718,592
    per_layer = attention + E * expert + d * E + 2 * d
    total = L * per_layer + 2 * V * d + d
    active = total - L * (E - k) * expert
    assert (attention, expert) == (18_874_368, 4_718_592)
    p = param_counts(cfg)
    assert (p["total"], p["active"]) == (total, active)
    assert param_counts(get_preset("qwen3-30b-a3b"))["total"] == total
    # Qwen3-30B-A3B model card: 30.5B parameters in total, 3.3B activated. (Our count leaves out
    # the 2 x 128 q/k-norm weights per layer; see the transformers check below.)
    assert total == pytest.approx(30.5e9, rel=0.005) and active == pytest.approx(3.3e9, rel=0.02)
    t = forward_terms(cfg)
    assert (
        t["ffn"] == L * 2 * cfg.seq_len * k * expert and t["router"] == L * 2 * cfg.seq_len * d * E
    )


# transformers' count of the model built on the meta device, and the weights our count leaves out
# (or adds), named: q/k norms (Qwen3-MoE: head_dim each; OLMoE: the q and k widths), Qwen2-MoE's
# q/k/v biases, gpt-oss's attention sinks (one per head) less the norm biases it does not have.
FAMILIES = {
    "mixtral": (
        "MixtralConfig",
        {k: v for k, v in MIXTRAL_8X7B.items() if k not in ("model_type", "architectures")},
        lambda c: 0,
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {k: v for k, v in QWEN3_30B_A3B.items() if k not in ("model_type", "architectures")},
        lambda c: c.num_hidden_layers * 2 * c.head_dim,
    ),
    # Qwen1.5-MoE-A2.7B's shapes: 60 experts of 1408, top 4, a shared expert of 5632
    "qwen2_moe": (
        "Qwen2MoeConfig",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5632,
            moe_intermediate_size=1408,
            shared_expert_intermediate_size=5632,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=60,
            num_experts_per_tok=4,
        ),
        lambda c: c.num_hidden_layers * 3 * c.hidden_size,
    ),
    # OLMoE-1B-7B's shapes
    "olmoe": (
        "OlmoeConfig",
        dict(
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
        ),
        lambda c: c.num_hidden_layers * 2 * c.hidden_size,
    ),
    # gpt-oss-20b's shapes
    "gpt_oss": (
        "GptOssConfig",
        dict(
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=24,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            num_local_experts=32,
            num_experts_per_tok=4,
        ),
        lambda c: (
            c.num_hidden_layers * c.num_attention_heads
            - (2 * c.num_hidden_layers + 1) * c.hidden_size
        ),
    ),
}


def meta_params(cfg) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameter_counts_match_transformers(family):
    cls, kw, left_out = FAMILIES[family]
    hf = getattr(transformers, cls)(**kw)
    ours = from_mapping(hf.to_dict(), name=family)
    assert ours.is_moe and ours.ffn_matrices == 3
    assert param_counts(ours)["total"] + left_out(hf) == meta_params(hf)


def test_qwen2_moe_shared_expert_gate_and_dense_layers():
    d = {
        "model_type": "qwen2_moe",
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 48,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "vocab_size": 100,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "max_position_embeddings": 32,
    }
    cfg = from_mapping(d, name="q2")
    # layer i is sparse when (i + 1) % 2 == 0 and i not in mlp_only_layers: only layer 1
    assert (cfg.dense_layers, cfg.moe_layers, cfg.d_shared, cfg.shared_gate) == (
        (0, 2, 3),
        1,
        48,
        True,
    )
    s, D = 32, 64
    t = forward_terms(cfg)
    assert t["ffn"] == 3 * 2 * s * 3 * D * 96 + 2 * s * 3 * D * (2 * 16 + 48)
    assert t["router"] == 2 * s * D * (6 + 1)  # the router and the shared expert's gate
    assert eval(term_formulas(cfg)["ffn"], {"__builtins__": {}}) == t["ffn"]  # noqa: S307
    assert eval(term_formulas(cfg)["router"], {"__builtins__": {}}) == t["router"]  # noqa: S307
    p = param_counts(cfg)
    assert p["total"] - p["active"] == (6 - 2) * 3 * D * 16  # 4 idle experts of the one MoE layer
    hf = transformers.Qwen2MoeConfig(
        **{k: v for k, v in d.items() if k != "model_type"}, qkv_bias=False
    )
    assert p["total"] == meta_params(hf)


def test_sparsity_scales_the_experts_never_the_router():
    cfg = get_preset("mixtral-8x7b")
    dense, sparse = forward_terms(cfg), forward_terms(cfg, sparsity=0.75)
    assert sparse["ffn"] == dense["ffn"] * 0.25 and sparse["router"] == dense["router"] > 0
    p = param_counts(cfg, 0.75)
    d, f, L = 4096, 14336, 32
    idle = L * 6 * 3 * d * f  # the 6 experts a token skips in each layer
    assert p["total"] - p["active"] == idle
    assert p["nonzero"] - p["active_nonzero"] == idle * 0.25
    r = account(cfg, sparsity=0.75)
    assert (r["params"], r["active_params"], r["active_nonzero_params"]) == (
        p["total"],
        p["active"],
        p["active_nonzero"],
    )
    assert r["inference_flops_per_token"] == sum(sparse.values()) / cfg.seq_len


def test_dense_models_have_no_router_and_all_parameters_active():
    p = param_counts(get_preset("llama-1.3b"), 0.5)
    assert (p["active"], p["active_nonzero"]) == (p["total"], p["nonzero"])
    assert forward_terms(get_preset("llama-1.3b"))["router"] == 0.0


def test_unknown_families_are_refused_clearly():
    # DeepSeek-V2/V3 are counted: tests/flops/test_flops_mla.py
    with pytest.raises(ConfigError, match=r"type 'dbrx' \(16 experts\).*mixtral, qwen2_moe"):
        from_mapping({"model_type": "dbrx", "num_experts": 16, "hidden_size": 64}, name="dbrx")


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(top_k=2), "give n_experts too"),
        (dict(n_experts=4, top_k=5), "top_k 5 is more than its 4 experts"),
        (dict(n_experts=4, top_k=1, dense_layers=[7]), r"dense_layers \[7\]"),
    ],
)
def test_own_model_files_with_experts_are_checked(fields, match):
    with pytest.raises(ConfigError, match=match):
        from_mapping({"n_layers": 2, "d_model": 16, "n_heads": 2, "vocab": 50, **fields})


def tiny_moe_config(path, **kw) -> dict:
    d = {
        "model_type": "mixtral",
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "vocab_size": 64,
        "max_position_embeddings": 16,
        "tie_word_embeddings": False,
        **kw,
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(d))
    return d


def test_a_tiny_moe_config_through_the_cli(tmp_path):
    tiny_moe_config(tmp_path / "tiny-moe")
    r = run("--config", tmp_path / "tiny-moe", "-s", "0.5")
    assert r.exit_code == 0, r.output
    assert "4 experts of d_ff 48 (SwiGLU), 2 per token" in r.stdout
    d, L, V, f = 32, 2, 64, 48
    total = L * (d * 32 + 2 * d * 16 + 32 * d + 4 * 3 * d * f + d * 4 + 2 * d) + 2 * V * d + d
    active = total - L * 2 * 3 * d * f
    rows = {line[:26].strip(): line[26:].split() for line in r.stdout.splitlines()}
    assert rows["total parameters"][:2] == [f"{total:,}", f"{total:,}"]
    assert rows["active parameters / token"][:2] == [f"{active:,}", f"{active:,}"]
    assert (total, active) == (
        47_520,
        29_088,
    )  # 2 x (3,072 attention + 4 x 4,608 experts + 128 + 64) + ...
    assert (
        "total parameters 47.52K hold every expert, active parameters 29.09K are one token's share"
        in r.stdout
    )
    out = json.loads(run("--config", tmp_path / "tiny-moe", "-s", "0.5", "--json").stdout)
    assert S.problems(out, S.FLOPS) == []
    assert out["moe"] == {
        "experts": 4,
        "top_k": 2,
        "expert_width": 48,
        "shared_width": 0,
        "moe_layers": 2,
        "dense_layers": [],
    }
    assert (out["runs"][0]["params"], out["runs"][0]["active_params"]) == (total, active)
    assert out["runs"][0]["forward_terms"]["router"] == L * 2 * 16 * d * 4


def zero_half(t: torch.Tensor) -> torch.Tensor:
    flat = t.flatten().clone()
    flat[: flat.numel() // 2] = 0
    return flat.reshape(t.shape)


def write_per_expert(path, d=32, f=48, E=4, L=2, V=64, kv=16):
    """A Mixtral checkpoint in the original naming: one w1/w2/w3 matrix per expert."""
    g = torch.Generator().manual_seed(0)
    st = {
        "model.embed_tokens.weight": torch.randn(V, d, generator=g),
        "lm_head.weight": torch.randn(V, d, generator=g),
        "model.norm.weight": torch.ones(d),
    }
    for i in range(L):
        p = f"model.layers.{i}."
        for n, shape in (
            ("self_attn.q_proj", (32, d)),
            ("self_attn.k_proj", (kv, d)),
            ("self_attn.v_proj", (kv, d)),
            ("self_attn.o_proj", (d, 32)),
            ("block_sparse_moe.gate", (E, d)),
        ):
            st[p + n + ".weight"] = torch.randn(*shape, generator=g)
        for e in range(E):
            for n, shape in (("w1", (f, d)), ("w2", (d, f)), ("w3", (f, d))):
                st[f"{p}block_sparse_moe.experts.{e}.{n}.weight"] = zero_half(
                    torch.randn(*shape, generator=g)
                )
        st[p + "input_layernorm.weight"] = st[p + "post_attention_layernorm.weight"] = torch.ones(d)
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous().clone() for k, v in st.items()},
        str(path / "model.safetensors"),
        metadata={"format": "pt"},
    )
    return sum(v.numel() for v in st.values())


def test_per_expert_matrices_are_counted_as_experts(tmp_path):
    d = tiny_moe_config(tmp_path / "per-expert")
    numel = write_per_expert(tmp_path / "per-expert")
    m = from_checkpoint(tmp_path / "per-expert")
    c = m.config
    assert (c.n_experts, c.top_k, c.expert_width, c.d_ff, c.ffn_matrices) == (4, 2, 48, 48, 3)
    assert m.params["total"] == numel
    assert m.layer_sparsity[0]["ffn_in"] == 0.5 and m.layer_sparsity[0]["qkv"] == 0.0
    expected = from_mapping(d, name="x")
    assert forward_terms(c) == forward_terms(expected)  # 2 experts of 48 a token, not 4
    assert param_counts(c)["total"] == param_counts(expected)["total"] == numel


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_stacked_experts_of_a_real_transformers_model(tmp_path, kind):
    """transformers 5 keeps each layer's experts in 3-D tensors: Mixtral's gate_up_proj is
    (experts, 2 x ffn, hidden), gpt-oss's (experts, hidden, 2 x ffn) with biases."""
    model = build(kind)
    w = EXPERT_FFN[kind]
    model.save_pretrained(tmp_path / kind)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert shapes["model.layers.0.mlp.experts.gate_up_proj"] == (
        (4, 2 * w, 32) if kind == "mixtral" else (4, 32, 2 * w)
    )
    r = run("--checkpoint", tmp_path / kind, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert S.problems(out, S.FLOPS) == []
    assert (
        out["moe"]["experts"] == 4 and out["moe"]["top_k"] == 2 and out["moe"]["expert_width"] == w
    )
    run0 = out["runs"][0]
    assert run0["params"] == sum(p.numel() for p in model.parameters())
    # the experts a token skips: 2 of 4 in both layers, gate_up and down (and gpt-oss's biases)
    idle = 2 * 2 * (3 * 32 * w + ((2 * w + 32) if kind == "gpt_oss" else 0))
    assert run0["params"] - run0["active_params"] == idle
    s = model.config.max_position_embeddings  # the sequence counted: the model's context
    assert run0["forward_terms"]["ffn"] == 2 * 2 * s * 3 * 32 * (2 * w)  # L 2 s 3 d (top_k f)
    assert any("mixture of experts: 4 experts per layer, 2 per token" in n for n in out["notes"])


def test_a_checkpoint_of_experts_without_top_k_is_refused(tmp_path):
    tiny_moe_config(tmp_path / "no-topk", num_experts_per_tok=None)
    write_per_expert(tmp_path / "no-topk")
    with pytest.raises(
        ShapeError, match=r"4 experts per layer, but no config.json.*num_experts_per_tok"
    ):
        from_checkpoint(tmp_path / "no-topk")
    r = run("--checkpoint", tmp_path / "no-topk")
    assert r.exit_code != 0 and "error:" in r.output and "num_experts_per_tok" in r.output
