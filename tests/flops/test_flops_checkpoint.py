"""`sparsetool flops --checkpoint`: shapes and measured sparsity from real safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sparsetool.flops import ModelConfig, forward_terms

from helpers import runner_for, whole_json

run = runner_for("flops", columns=200)


def zero_first(t, fraction):
    """Set exactly round(fraction * numel) entries to zero (the first ones, flat order)."""
    flat = t.flatten().clone()
    flat[: round(fraction * flat.numel())] = 0
    return flat.reshape(t.shape)


def write_gpt2(path: Path, L=2, d=64, V=100, s=32, sparsity=0.75, n_head=4, config=True) -> dict:
    g = torch.Generator().manual_seed(0)
    st = {
        "transformer.wte.weight": torch.randn(V, d, generator=g),
        "transformer.wpe.weight": torch.randn(s, d, generator=g),
        "transformer.ln_f.weight": torch.ones(d),
        "transformer.ln_f.bias": torch.zeros(d) + 0.1,
    }
    for i in range(L):
        p = f"transformer.h.{i}."
        for name, shape in (
            ("attn.c_attn", (d, 3 * d)),
            ("attn.c_proj", (d, d)),
            ("mlp.c_fc", (d, 4 * d)),
            ("mlp.c_proj", (4 * d, d)),
        ):
            st[p + name + ".weight"] = zero_first(torch.randn(*shape, generator=g), sparsity)
            st[p + name + ".bias"] = torch.randn(shape[1], generator=g)
        for ln in ("ln_1", "ln_2"):
            st[p + ln + ".weight"], st[p + ln + ".bias"] = torch.ones(d), torch.zeros(d) + 0.1
    path.mkdir(parents=True, exist_ok=True)
    save_file(st, str(path / "model.safetensors"), metadata={"format": "pt"})
    if config:
        (path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": n_head}))
    return st


def test_checkpoint_uses_measured_sparsity(tmp_path):
    st = write_gpt2(tmp_path / "m75")
    whole = whole_json("--checkpoint", str(tmp_path / "m75"))
    d, c = whole["runs"][0], whole["config"]
    assert (
        c["n_layers"],
        c["d_model"],
        c["n_heads"],
        c["d_head"],
        c["d_ff"],
        c["vocab"],
        c["context"],
    ) == (2, 64, 4, 16, 256, 100, 32)
    assert (c["seq_len"], c["seq_len_source"]) == (32, "the model's context")  # shorter than 2048
    assert whole["targeted_sparsity"] == pytest.approx(0.75)
    assert d["params"] == sum(t.numel() for t in st.values())
    assert d["nonzero_params"] == sum(int(torch.count_nonzero(t)) for t in st.values())
    cfg = ModelConfig(**c)
    assert d["forward_flops_per_seq"] == pytest.approx(
        sum(forward_terms(cfg, sparsity=0.75).values())
    )
    assert whole["notes"] == []
    r = run("--checkpoint", str(tmp_path / "m75"))
    assert r.exit_code == 0 and "measured 75.0%" in r.stdout


def test_checkpoint_file_without_config_json_says_what_it_assumed(tmp_path):
    write_gpt2(tmp_path / "m", config=False)
    d = whole_json("--checkpoint", str(tmp_path / "m" / "model.safetensors"))
    assert d["config"]["n_heads"] == 1 and d["config"]["d_head"] == 64
    assert any("assumed d_head=64" in n for n in d["notes"])
    r = run("--checkpoint", str(tmp_path / "m" / "model.safetensors"))
    assert r.exit_code == 0 and "note:" in r.stdout


def test_checkpoint_exclude_counts_those_matrices_dense(tmp_path):
    write_gpt2(tmp_path / "m75")
    d = whole_json("--checkpoint", str(tmp_path / "m75"), "--exclude", "*.mlp.*")["runs"][0]
    assert d["forward_terms"]["ffn"] == d["dense_forward_terms"]["ffn"]
    assert d["forward_terms"]["qkv"] == pytest.approx(d["dense_forward_terms"]["qkv"] / 4)


def test_corrupt_checkpoint_is_a_clean_error_and_untouched(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    before = p.read_bytes()
    r = run("--checkpoint", str(p))
    assert r.exit_code == 1 and r.stderr.startswith("error: ") and r.stdout == ""
    assert p.read_bytes() == before


def test_checkpoint_conflicts_with_sparsity(tmp_path):
    write_gpt2(tmp_path / "m")
    r = run("--checkpoint", str(tmp_path / "m"), "-s", "0.5")
    assert r.exit_code == 2 and "measured sparsity" in r.stderr  # a usage error (was exit 1)


def test_llama_directory_with_gqa_and_swiglu(tmp_path):
    d, heads, kv, k, f, V, L = 64, 4, 2, 16, 96, 50, 2
    g = torch.Generator().manual_seed(1)
    st = {
        "model.embed_tokens.weight": torch.randn(V, d, generator=g),
        "lm_head.weight": torch.randn(V, d, generator=g),
        "model.norm.weight": torch.ones(d),
    }
    shapes = {
        "self_attn.q_proj": (heads * k, d),
        "self_attn.k_proj": (kv * k, d),
        "self_attn.v_proj": (kv * k, d),
        "self_attn.o_proj": (d, heads * k),
        "mlp.gate_proj": (f, d),
        "mlp.up_proj": (f, d),
        "mlp.down_proj": (d, f),
    }
    for i in range(L):
        for name, shape in shapes.items():
            frac = 0.5 if name.startswith("mlp") else 0.25
            st[f"model.layers.{i}.{name}.weight"] = zero_first(
                torch.randn(*shape, generator=g), frac
            )
        st[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(d)
        st[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(d)
    out = tmp_path / "llama"
    out.mkdir()
    save_file(st, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_attention_heads": heads,
                "num_key_value_heads": kv,
                "max_position_embeddings": 256,
            }
        )
    )
    whole = whole_json("--checkpoint", str(out), "--seq-len", "256")
    dj, c = whole["runs"][0], whole["config"]
    assert (
        c["n_layers"],
        c["d_model"],
        c["n_heads"],
        c["n_kv_heads"],
        c["d_head"],
        c["d_ff"],
        c["ffn_matrices"],
        c["vocab"],
        c["seq_len"],
    ) == (L, d, heads, kv, k, f, 3, V, 256)
    cfg = ModelConfig(**c)
    layer = {"qkv": 0.25, "attn_out": 0.25, "ffn_in": 0.5, "ffn_out": 0.5}
    ref = forward_terms(cfg, sparsity=[layer] * L)
    assert dj["forward_terms"] == pytest.approx(ref)
    assert dj["forward_terms"]["qkv"] == pytest.approx(
        0.75 * 2 * 256 * d * k * (heads + 2 * kv) * L
    )


def test_a_model_with_a_short_context_is_counted_at_its_context(tmp_path):
    """flops --config and --checkpoint of a model that takes 64 tokens count 64-token sequences,
    not 2048 (issue 31, item 9); --seq-len still says otherwise."""
    from helpers import ROOT, run

    tiny = ROOT / "fixtures" / "tiny-gpt2"  # n_positions 64
    for args in (("--checkpoint", tiny), ("--config", tiny / "config.json")):
        r = run("flops", *args, columns=200)
        assert r.exit_code == 0, r.output
        assert "seq 64 (the model's context)" in r.stdout.splitlines()[0], r.stdout
        r = run("flops", *args, "--json")
        assert json.loads(r.stdout)["config"]["seq_len"] == 64
        r = run("flops", *args, "--seq-len", "32", "--json")
        assert json.loads(r.stdout)["config"]["seq_len"] == 32
