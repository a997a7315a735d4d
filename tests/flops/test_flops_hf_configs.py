"""FLOPs on real Hugging Face configs: the published numbers of six models, built as transformers
configs here (nothing is downloaded); parameter counts checked against transformers' own count of
the model built on the meta device."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from sparsetool.errors import ConfigError
from sparsetool.flops import forward_terms, from_mapping, param_counts

from helpers import run

# The published config.json numbers of each model (shapes only; everything else is the default).
PUBLISHED = {
    "gpt2": (
        "GPT2Config",
        dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
    ),
    "opt-350m": (
        "OPTConfig",
        dict(
            vocab_size=50272,
            hidden_size=1024,
            num_hidden_layers=24,
            ffn_dim=4096,
            num_attention_heads=16,
            max_position_embeddings=2048,
            word_embed_proj_dim=512,
            do_layer_norm_before=False,
            enable_bias=True,
        ),
    ),
    "llama-3.2-1b": (
        "LlamaConfig",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            max_position_embeddings=131072,
            tie_word_embeddings=True,
        ),
    ),
    "mistral-7b": (
        "MistralConfig",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=32768,
            sliding_window=4096,
            tie_word_embeddings=False,
        ),
    ),
    "pythia-410m": (
        "GPTNeoXConfig",
        dict(
            vocab_size=50304,
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            max_position_embeddings=2048,
            rotary_pct=0.25,
            tie_word_embeddings=False,
        ),
    ),
}
# transformers' own counts of these models (also asserted from the meta-device build below)
PARAMS = {
    "gpt2": 124_439_808,
    "opt-350m": 331_196_416,
    "llama-3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "pythia-410m": 405_334_016,
}


def hf_config(name: str):
    cls, kw = PUBLISHED[name]
    return getattr(transformers, cls)(**kw)


def meta_params(cfg) -> int:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_parameter_counts_match_transformers(name):
    cfg = hf_config(name)
    built = meta_params(cfg)
    assert built == PARAMS[name]
    ours = from_mapping(cfg.to_dict(), name=name)
    assert param_counts(ours)["total"] == built


def test_sequence_length_defaults_to_2048_and_says_where_it_came_from(tmp_path):
    d = tmp_path / "llama-3.2-1b"
    hf_config("llama-3.2-1b").save_pretrained(d)
    r = run("flops", "--config", str(d), "-s", "0.5", columns=200)
    assert r.exit_code == 0, r.output
    assert "seq 2,048 (default; the model's context is 131,072)" in r.stdout
    r = run("flops", "--config", str(d), "-s", "0.5", "--json")
    out = json.loads(r.stdout)
    assert out["runs"][0]["seq_len"] == 2048 and out["config"]["context"] == 131072
    assert out["config"]["seq_len_source"] == "default"
    r = run("flops", "--config", str(d), "-s", "0.5", "--seq-len", "4096", columns=200)
    assert "seq 4,096 (--seq-len; the model's context is 131,072)" in r.stdout


def test_sliding_window_limits_the_keys_per_query():
    mistral = from_mapping(hf_config("mistral-7b").to_dict(), name="mistral")
    assert mistral.window == 4096
    long = forward_terms(mistral, seq_len=8192)
    h, k, L = 32, 128, 32
    assert long["attn_logits"] == L * 2 * 8192 * 4096 * (k * h)  # 4096 keys, not 8192
    assert long["softmax"] == L * 3 * h * 8192 * 4096
    short = forward_terms(mistral, seq_len=2048)
    assert short["attn_logits"] == L * 2 * 2048 * 2048 * (k * h)  # the window is longer: no effect


def test_breakdown_says_when_the_window_applies(tmp_path):
    d = tmp_path / "mistral"
    hf_config("mistral-7b").save_pretrained(d)
    args = ["flops", "--config", str(d), "-s", "0.5", "--breakdown"]
    r = run(*args, "--seq-len", "8192", columns=250)
    assert r.exit_code == 0, r.output
    assert "32*2*8192*4096*(128*32)" in r.stdout
    assert "attention terms count 4,096 keys per query, not 8,192" in r.stdout
    r = run(*args, columns=250)
    assert "no shorter than the sequence" in r.stdout


def test_opt_embedding_projection_is_counted():
    opt = from_mapping(hf_config("opt-350m").to_dict(), name="opt")
    assert (opt.embed_dim, opt.final_norm, opt.position_rows) == (512, False, 2050)
    t = forward_terms(opt)
    assert t["logits"] == 2 * 2048 * 512 * 50272 + 2 * 2048 * 1024 * 512


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(hidden_size=770), r"d_model 770 does not split into 12 heads \(770 / 12 = 64\.17\)"),
        (
            dict(num_key_value_heads=5),
            r"12 query heads cannot share 5 key/value heads.*1, 2, 3, 4, 6, 12",
        ),
    ],
)
def test_inconsistent_shapes_are_refused_with_the_numbers(change, match):
    d = {
        "model_type": "llama",
        "hidden_size": 768,
        "num_attention_heads": 12,
        "num_hidden_layers": 2,
        "vocab_size": 100,
        **change,
    }
    with pytest.raises(ConfigError, match=match):
        from_mapping(d)
    fixed = from_mapping({**d, "hidden_size": 768, "num_key_value_heads": 4})
    assert (fixed.d_head, fixed.n_kv_heads) == (64, 4)
