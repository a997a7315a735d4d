"""Multi-head latent attention (DeepSeek-V2/V3): DeepSeek-V3's parameters and FLOPs by hand from
its config.json numbers, checked against the published totals and against transformers' count of
the model built on the meta device; tiny real DeepSeek-V3 checkpoints (experts stored apart and
fused) read end to end by ``flops --checkpoint``."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import transformers
from moe_models import build, save_moe  # noqa: E402 (needs transformers)
from safetensors.torch import load_file, save_file

from sparsetool.errors import ConfigError
from sparsetool.flops import (
    forward_terms,
    from_checkpoint,
    from_mapping,
    get_preset,
    load_config,
    param_counts,
    qkv_matrices,
    term_formulas,
)
from sparsetool.hardware import builtin_devices
from sparsetool.hardware import from_checkpoint as workload_from_checkpoint
from sparsetool.hardware.presets import dataflow_grids

import json_schemas as S
from helpers import run, runner_for

flops = runner_for("flops", columns=240)

# DeepSeek-V3's released config.json (shapes only).
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 4,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def deepseek_v3_by_hand() -> dict[str, int]:
    d, L, V, h = 7168, 61, 129280, 128
    nope, rope, v, r_q, r_kv = 128, 64, 128, 1536, 512
    fe, E, k, f_dense, dense = 2048, 256, 8, 18432, 3
    q = d * r_q + r_q * h * (nope + rope)  # q_a_proj, q_b_proj
    kv = d * (r_kv + rope) + r_kv * h * (nope + v)  # kv_a_proj_with_mqa, kv_b_proj
    o = h * v * d
    attention = q + kv + o + r_q + r_kv  # + q_a_layernorm, kv_a_layernorm
    expert = 3 * d * fe  # gate, up, down
    router = E * d + E  # gate weight, e_score_correction_bias
    moe_layer = attention + E * expert + expert + router + 2 * d  # routed, one shared, 2 norms
    dense_layer = attention + 3 * d * f_dense + 2 * d
    total = dense * dense_layer + (L - dense) * moe_layer + 2 * V * d + d  # embed, head, norm
    active = total - (L - dense) * (E - k) * expert
    return dict(q=q, kv=kv, o=o, expert=expert, total=total, active=active)


def test_deepseek_v3_by_hand_lands_on_the_published_totals():
    cfg = from_mapping(DEEPSEEK_V3, name="DeepSeek-V3")
    assert replace(cfg, name="deepseek-v3") == get_preset("deepseek-v3")  # the preset is this file
    assert (cfg.d_head, cfg.d_rope, cfg.value_head) == (192, 64, 128)  # head_dim is not read
    assert (cfg.q_rank, cfg.kv_rank, cfg.n_kv_heads) == (1536, 512, None)
    assert (cfg.dense_layers, cfg.d_shared, cfg.router_bias) == ((0, 1, 2), 2048, True)
    n = deepseek_v3_by_hand()
    assert (n["q"], n["kv"], n["o"]) == (48_758_784, 20_905_984, 117_440_512)
    assert (n["total"], n["active"]) == (671_026_419_200, 37_552_297_472)
    p = param_counts(cfg)
    assert (p["total"], p["active"]) == (n["total"], n["active"])
    # DeepSeek-V3 technical report (arXiv 2412.19437, abstract and Sec. 4.2): 671B total
    # parameters, 37B activated per token, the 14B multi-token-prediction module not included.
    assert n["total"] == pytest.approx(671e9, rel=0.001)
    assert n["active"] == pytest.approx(37e9, rel=0.02)


def test_deepseek_v3_forward_flops_term_by_term():
    cfg = get_preset("deepseek-v3")
    n, s, L, h = deepseek_v3_by_hand(), 2048, 61, 128
    t = forward_terms(cfg)
    assert t["qkv"] == L * 2 * s * (n["q"] + n["kv"])
    assert t["attn_out"] == L * 2 * s * n["o"]
    assert t["attn_logits"] == L * 2 * s * s * h * (128 + 64)  # queries and keys: nope + rope
    assert t["attn_values"] == L * 2 * s * s * h * 128  # values: v_head_dim
    assert t["ffn"] == 58 * 2 * s * (8 + 1) * n["expert"] + 3 * 2 * s * 3 * 7168 * 18432
    assert t["router"] == 58 * 2 * s * 7168 * 256
    for term, formula in term_formulas(cfg).items():
        if term == "embeddings":  # excluded by default
            continue
        assert eval(formula, {"__builtins__": {}}) == t[term], term  # noqa: S307
    # weight sparsity scales the four latent projections (qkv) and o_proj, never the attention
    half = forward_terms(cfg, sparsity=[{"qkv": 0.5, "attn_out": 0.75}] * L)
    assert half["qkv"] == t["qkv"] / 2 and half["attn_out"] == t["attn_out"] / 4
    assert (half["attn_logits"], half["attn_values"], half["ffn"]) == (
        t["attn_logits"],
        t["attn_values"],
        t["ffn"],
    )
    p = param_counts(cfg, [{"qkv": 0.5}] * L)
    assert p["total"] - p["nonzero"] == L * (n["q"] + n["kv"]) / 2


# DeepSeek-V2-Lite's shapes: no query latent (a plain q_proj), two shared experts, one dense layer.
DEEPSEEK_V2_LITE = dict(
    vocab_size=102400,
    hidden_size=2048,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=27,
    num_attention_heads=16,
    num_key_value_heads=16,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=64,
    n_shared_experts=2,
    num_experts_per_tok=6,
    first_k_dense_replace=1,
    max_position_embeddings=163840,
)
# a small DeepSeek-V3 without a query latent, two shared experts, two dense layers
SMALL_V3 = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=16,
    num_hidden_layers=4,
    num_attention_heads=4,
    q_lora_rank=None,
    kv_lora_rank=24,
    qk_nope_head_dim=12,
    qk_rope_head_dim=4,
    v_head_dim=10,
    n_routed_experts=8,
    n_shared_experts=2,
    num_experts_per_tok=3,
    n_group=2,
    topk_group=1,
    first_k_dense_replace=2,
    max_position_embeddings=128,
)


def meta_model(hf):
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(hf)


@pytest.mark.parametrize(
    "family,kw",
    [
        (
            "deepseek_v3",
            {
                k: v
                for k, v in DEEPSEEK_V3.items()
                if k not in ("model_type", "architectures", "moe_layer_freq")
            },
        ),
        ("deepseek_v3", SMALL_V3),
        ("deepseek_v2", DEEPSEEK_V2_LITE),
    ],
)
def test_parameter_counts_match_transformers(family, kw):
    hf = transformers.AutoConfig.for_model(family, **kw)
    ours = from_mapping(hf.to_dict(), name=family)
    assert ours.is_mla and ours.is_moe and ours.q_rank == kw["q_lora_rank"]
    model = meta_model(hf)
    parameters = sum(p.numel() for p in model.parameters())
    stored = sum(t.numel() for t in model.state_dict().values())  # what save_pretrained writes
    # DeepSeek-V3's e_score_correction_bias is a buffer, stored but not a parameter; V2 has none
    correction = ours.moe_layers * ours.n_experts if family == "deepseek_v3" else 0
    assert stored - parameters == correction
    assert param_counts(ours)["total"] == stored


def test_deepseek_v2_lands_on_its_published_totals():
    # DeepSeek-V2 report (arXiv 2405.04434, Sec. 3.1.1): 60 layers, hidden 5120, 128 heads of 128
    # (+ 64 rotary), key/value rank 512, query rank 1536, every FFN but the first an MoE layer of
    # 2 shared and 160 routed experts of 1536, 6 routed per token; 236B parameters, 21B activated.
    hf = transformers.DeepseekV2Config(
        vocab_size=102400,
        hidden_size=5120,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=60,
        num_attention_heads=128,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=160,
        n_shared_experts=2,
        num_experts_per_tok=6,
        first_k_dense_replace=1,
    )
    cfg = from_mapping(hf.to_dict(), name="DeepSeek-V2")
    assert not cfg.router_bias  # V3's score-correction bias is new in V3
    p = param_counts(cfg)
    assert p["total"] == pytest.approx(236e9, rel=0.002)
    assert p["active"] == pytest.approx(21e9, rel=0.02)


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(q_rank=16), "give kv_rank too"),
        (dict(kv_rank=16, d_rope=8, d_head=16, biases=True), "without biases"),
        (dict(kv_rank=16, d_rope=8, d_head=16, n_kv_heads=1), "drop n_kv_heads"),
        (dict(kv_rank=16, d_rope=8, d_head=8), "d_rope .* must be 0 to 7, got 8"),
    ],
)
def test_own_model_files_with_latent_attention_are_checked(fields, match):
    with pytest.raises(ConfigError, match=match):
        from_mapping({"n_layers": 2, "d_model": 16, "n_heads": 2, "vocab": 50, **fields})


def test_an_own_model_file_counts_latent_attention_like_the_config_json(tmp_path):
    hf = transformers.DeepseekV3Config(**SMALL_V3)
    own = {
        "n_layers": 4,
        "d_model": 64,
        "n_heads": 4,
        "d_head": 16,
        "d_ff": 96,
        "vocab": 300,
        "context": 128,
        "ffn_matrices": 3,
        "learned_positions": False,
        "tied_embeddings": False,
        "n_experts": 8,
        "top_k": 3,
        "d_expert": 16,
        "d_shared": 32,
        "dense_layers": [0, 1],
        "router_bias": True,
        "kv_rank": 24,
        "d_rope": 4,
        "d_v": 10,
    }
    (tmp_path / "small.json").write_text(json.dumps(own))
    cfg = load_config(tmp_path / "small.json")
    assert not cfg.biases  # the default with latent attention
    assert replace(cfg, name="x") == replace(from_mapping(hf.to_dict()), name="x")
    assert [n for n, _ in qkv_matrices(cfg)] == ["q", "kv_a", "kv_b"]


@pytest.mark.parametrize("fused", [False, True])
def test_a_tiny_deepseek_v3_checkpoint(tmp_path, fused):
    path = save_moe("deepseek_v3", tmp_path / "ds3", fused=fused)
    model = build("deepseek_v3")
    stored = sum(t.numel() for t in model.state_dict().values())
    m = from_checkpoint(path)
    expected = load_config(path)  # the same shapes from config.json alone
    assert replace(m.config, name="x") == replace(expected, name="x")
    assert m.config.q_rank == 16 and m.config.kv_rank == 16 and m.config.dense_layers == (0,)
    assert m.params["total"] == param_counts(m.config)["total"] == stored
    r = flops("--checkpoint", path, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert S.problems(out, S.FLOPS) == []
    run0 = out["runs"][0]
    assert run0["params"] == stored
    assert run0["params"] - run0["active_params"] == 2 * 3 * 32 * 24  # 2 idle experts of layer 1
    assert out["config"]["kv_rank"] == 16 and out["moe"]["shared_width"] == 24
    r = flops("--checkpoint", path, "--breakdown")
    assert r.exit_code == 0, r.output
    assert "4 heads x 16 (latent attention: q rank 16, kv rank 16, rotary 8, values 8)" in r.stdout
    assert "qkv = latent attention's q_a, q_b, kv_a, kv_b matrices" in r.stdout


def test_a_pruned_deepseek_v3_checkpoint_without_heads_in_its_config(tmp_path):
    path = save_moe("deepseek_v3", tmp_path / "ds3")
    r = run("prune", path, "-o", tmp_path / "half", "--sparsity", "0.5", "--exclude", "*mlp*")
    assert r.exit_code == 0, r.output
    config = json.loads((tmp_path / "half" / "config.json").read_text())
    del config["num_attention_heads"], config["head_dim"]
    (tmp_path / "half" / "config.json").write_text(json.dumps(config))
    m = from_checkpoint(tmp_path / "half")
    # the heads from the widths: queries 4 x (8 + 8), keys and values 4 x (8 + 8), rotary key 8
    c = m.config
    assert (c.n_heads, c.d_head, c.d_rope, c.value_head) == (4, 16, 8, 8)
    assert m.layer_sparsity[1]["qkv"] == m.layer_sparsity[1]["attn_out"] == 0.5
    assert m.layer_sparsity[1]["ffn_in"] == 0.0
    dense = forward_terms(m.config)
    sparse = forward_terms(m.config, sparsity=m.layer_sparsity)
    assert sparse["qkv"] == dense["qkv"] / 2 and sparse["ffn"] == dense["ffn"]


def test_a_multi_token_prediction_layer_past_num_hidden_layers_is_left_out(tmp_path):
    """DeepSeek-V3's released checkpoint stores its multi-token prediction module as one layer
    more than config.json's num_hidden_layers (model.layers.61 of 61): its parameters are the
    checkpoint's, its layer is not the model's."""
    path = save_moe("deepseek_v3", tmp_path / "mtp")
    state = load_file(str(path / "model.safetensors"))
    extra = {
        k.replace("layers.1.", "layers.2."): v.clone()
        for k, v in state.items()
        if k.startswith("model.layers.1.")
    }
    extra["model.layers.2.eh_proj.weight"] = torch.zeros(32, 64)
    save_file({**state, **extra}, str(path / "model.safetensors"), metadata={"format": "pt"})
    m = from_checkpoint(path)
    assert m.config.n_layers == 2
    assert m.params["total"] == sum(t.numel() for t in {**state, **extra}.values())
    note = "1 layer past config.json's num_hidden_layers (2: DeepSeek-V3's"
    assert any(note in n for n in m.notes)
    assert forward_terms(m.config) == forward_terms(load_config(path))
    wl = workload_from_checkpoint(path, 8, dataflow_grids(list(builtin_devices().values())))
    assert not any(".layers.2." in ly.name for ly in wl.layers) and len(wl.layers) == 22
