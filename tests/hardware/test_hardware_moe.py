"""simulate on a mixture of experts: a step holds the matrices of the experts a token goes
through (top_k per MoE layer, the first top_k of a checkpoint with their real masks), not all
of them, and says so; DeepSeek-V3's step holds its latent-attention matrices."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers
from moe_models import build, save_moe  # noqa: E402
from safetensors.torch import load_file

from sparsetool.flops import forward_terms, get_preset, load_config, param_counts
from sparsetool.hardware import builtin_devices, from_checkpoint
from sparsetool.hardware.presets import dataflow_grids
from sparsetool.hardware.workload import from_model, model_layers

import json_schemas as S
from helpers import run

GRIDS = dataflow_grids(list(builtin_devices().values()))


def test_a_preset_holds_the_active_experts_only():
    cfg = get_preset("mixtral-8x7b")
    layers = model_layers(cfg)
    per_layer = [n for n, _, _ in layers if n.startswith("layers.0.")]
    assert per_layer == [
        "layers.0.qkv",
        "layers.0.attn_out",
        *[f"layers.0.experts.{e}.{m}" for e in (0, 1) for m in ("ffn_in0", "ffn_in1", "ffn_out")],
    ]
    d, f, L = 4096, 14336, 32
    attention = d * (4096 + 2 * 1024) + 4096 * d
    assert sum(m * k for _, _, (m, k) in layers) == L * (attention + 2 * 3 * d * f)
    p = param_counts(cfg)
    router_norms_embeddings = p["other"]
    assert sum(m * k for _, _, (m, k) in layers) == p["active"] - router_norms_embeddings
    wl = from_model(cfg, 0.5, 2048, GRIDS)
    t = forward_terms(cfg)
    assert wl.untargeted_flops == pytest.approx(
        t["attn_logits"] + t["softmax"] + t["attn_values"] + t["router"] + t["logits"]
    )
    assert wl.moe["experts"] == 8 and wl.moe["top_k"] == 2
    assert any("2 of 8 experts active per token" in n for n in wl.notes)


def tiny_mixtral(tmp_path, per_expert: bool):
    """A real transformers Mixtral with half of each expert's weights zeroed, saved as
    transformers 5 stores it (3-D stacked experts) or with one w1/w2/w3 matrix per expert."""
    model = build("mixtral")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".experts." in name:
                p.view(-1)[: p.numel() // 2] = 0
    out = save_moe(
        "mixtral",
        tmp_path / ("per-expert" if per_expert else "stacked"),
        fused=not per_expert,
        model=model,
    )
    return out, load_file(str(out / "model.safetensors"))


@pytest.mark.parametrize("per_expert", [True, False])
def test_a_checkpoint_step_reads_the_first_top_k_experts_real_masks(tmp_path, per_expert):
    path, state = tiny_mixtral(tmp_path, per_expert)
    wl = from_checkpoint(path, 1, GRIDS)
    ffn = [ly for ly in wl.layers if ly.role in ("ffn_in", "ffn_out")]
    # 2 layers x 2 active experts x (gate, up, down) as matrices, or x (gate_up, down) stacked
    assert len(ffn) == 2 * 2 * (3 if per_expert else 2)
    assert sum(ly.numel for ly in ffn) == 2 * 2 * 3 * 32 * 48
    if not per_expert:
        names = sorted(ly.name for ly in ffn if ".layers.0." in ly.name)
        assert names == [
            "model.layers.0.mlp.experts.down_proj[0]",
            "model.layers.0.mlp.experts.down_proj[1]",
            "model.layers.0.mlp.experts.gate_up_proj[0]",
            "model.layers.0.mlp.experts.gate_up_proj[1]",
        ]
        gate_up = next(ly for ly in ffn if ly.name.endswith("gate_up_proj[1]"))
        assert (gate_up.out_features, gate_up.in_features) == (96, 32)
        assert gate_up.nnz == int(
            np.count_nonzero(state["model.layers.0.mlp.experts.gate_up_proj"][1].numpy())
        )
    assert wl.moe == {
        "experts": 4,
        "top_k": 2,
        "expert_width": 48,
        "shared_width": 0,
        "moe_layers": 2,
        "dense_layers": [],
    }
    assert any(
        "2 of 4 experts active per token" in n and "first 2 of each layer" in n for n in wl.notes
    )


def test_simulate_cli_says_it_is_a_mixture_of_experts(tmp_path):
    path, _ = tiny_mixtral(tmp_path, False)
    r = run("simulate", path, "--tokens", "1", "--device", "a100")
    assert r.exit_code == 0, r.output
    assert (
        "note: mixture of experts: 2 of 4 experts active per token in each of 2 MoE layers"
        in r.stdout
    )
    r = run("simulate", path, "--tokens", "1", "--json")
    out = json.loads(r.stdout)
    assert S.problems(out, S.SIMULATE) == []
    assert out["workload"]["moe"]["top_k"] == 2
    # the step's FLOPs: 2 per weight of the active experts and attention, plus the dense work
    dense = out["workload"]["forward_flops"]["dense"]
    attention = 32 * 32 + 2 * 32 * 16 + 32 * 32
    assert dense == pytest.approx(
        2 * 2 * (attention + 2 * 3 * 32 * 48) + out["workload"]["untargeted_forward_flops"]
    )


def test_square_experts_stored_in_out_keep_their_n_m_axis(tmp_path):
    """gpt-oss-20b's experts are square in down_proj (ffn == hidden == 2880) and stored
    (experts, in, out): 2:4 along each expert's input must read as kept, whatever the shape."""
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    hf = transformers.GptOssConfig(
        intermediate_size=32,
        hidden_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention"],
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        max_position_embeddings=16,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(hf).save_pretrained(tmp_path / "dense")
    prune_checkpoint(tmp_path / "dense", tmp_path / "nm", PruneOptions(nm=(2, 4)))
    layers = from_checkpoint(tmp_path / "nm", 1, GRIDS).layers
    experts = [ly for ly in layers if "experts" in ly.name]
    assert {ly.name.rsplit(".", 1)[1] for ly in experts} == {
        "gate_up_proj[0]",
        "gate_up_proj[1]",
        "down_proj[0]",
        "down_proj[1]",
    }
    for ly in experts:
        assert ly.nm_violation_in == 0.0, ly.name  # 2:4 holds along the input
        assert ly.nm_violation_out > 0.0, ly.name  # and not along the output


def test_a_deepseek_v3_preset_holds_its_latent_attention_matrices():
    cfg = get_preset("deepseek-v3")
    layers = model_layers(cfg)
    shapes = {n: s for n, _, s in layers if n.startswith("layers.3.")}
    assert list(shapes)[:5] == [
        "layers.3.q_a",
        "layers.3.q_b",
        "layers.3.kv_a",
        "layers.3.kv_b",
        "layers.3.attn_out",
    ]
    assert shapes["layers.3.kv_a"] == (512 + 64, 7168)
    assert shapes["layers.3.attn_out"] == (7168, 128 * 128)  # 128 value heads of 128
    assert len([n for n in shapes if ".experts." in n]) == 8 * 3  # 8 active experts, 3 matrices
    p = param_counts(cfg)  # "other": routers, norms (the latents' too), embedding and head
    assert sum(m * k for _, _, (m, k) in layers) == p["active"] - p["other"]


def test_simulate_a_tiny_deepseek_v3_checkpoint(tmp_path):
    from moe_models import save_moe

    path = save_moe("deepseek_v3", tmp_path / "ds3")
    r = run("prune", path, "-o", tmp_path / "half", "--sparsity", "0.5")
    assert r.exit_code == 0, r.output
    wl = from_checkpoint(tmp_path / "half", 64, GRIDS)
    names = [ly.name for ly in wl.layers]
    # layer 0 dense: 4 latent projections, o_proj, gate/up/down; layer 1: the same attention,
    # the first 2 of 4 experts and the shared expert, 3 matrices each
    assert len(names) == 8 + 5 + 3 * 3
    assert "model.layers.1.self_attn.kv_b_proj.weight" in names
    assert not any(".experts.2." in n or ".experts.3." in n for n in names)
    assert wl.moe["shared_width"] == 24 and wl.moe["dense_layers"] == [0]
    targeted = sum(ly.numel for ly in wl.layers)
    attention = 16 * 32 + 64 * 16 + 24 * 32 + 64 * 16 + 32 * 32
    assert targeted == 2 * attention + 3 * 32 * 64 + 3 * 3 * 32 * 24
    assert sum(ly.nnz for ly in wl.layers) == targeted // 2
    r = run("simulate", tmp_path / "half", "--tokens", "64", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert S.problems(out, S.SIMULATE) == []
    assert out["workload"]["forward_flops"]["dense"] == pytest.approx(
        2 * 64 * targeted + out["workload"]["untargeted_forward_flops"]
    )
    t = forward_terms(load_config(path), seq_len=64)  # attention over 64 keys, values 8 wide
    assert out["workload"]["untargeted_forward_flops"] == pytest.approx(
        t["attn_logits"] + t["softmax"] + t["attn_values"] + t["router"] + t["logits"]
    )
