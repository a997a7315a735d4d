"""Real-client round trip: transformers writes, sparsetool prunes, transformers loads back.

Small random configs only (nothing is downloaded). One model is saved sharded, so the
``model.safetensors.index.json`` path is exercised too.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from sparsetool.targets import is_targeted  # noqa: E402

from helpers import run  # noqa: E402


def _models():
    t = transformers
    return {
        "gpt2": (
            t.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64),
            t.GPT2LMHeadModel,
        ),
        "llama": (
            t.LlamaConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=128,
                max_position_embeddings=64,
            ),
            t.LlamaForCausalLM,
        ),
        "bert": (
            t.BertConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                vocab_size=128,
                max_position_embeddings=64,
            ),
            t.BertForMaskedLM,
        ),
        "opt": (
            t.OPTConfig(
                num_hidden_layers=2,
                hidden_size=32,
                ffn_dim=64,
                num_attention_heads=4,
                vocab_size=128,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
            ),
            t.OPTForCausalLM,
        ),
        "gpt_neox": (
            t.GPTNeoXConfig(
                num_hidden_layers=2,
                hidden_size=32,
                intermediate_size=64,
                num_attention_heads=4,
                vocab_size=128,
                max_position_embeddings=64,
            ),
            t.GPTNeoXForCausalLM,
        ),
    }


EXPECTED_TARGETS = {"gpt2": 8, "llama": 14, "bert": 12, "opt": 12, "gpt_neox": 8}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(EXPECTED_TARGETS))
def test_save_pretrained_prune_from_pretrained(kind, tmp_path):
    config, cls = _models()[kind]
    torch.manual_seed(0)
    model = cls(config).eval()
    src, out = tmp_path / "src", tmp_path / "pruned"
    sharded = kind == "llama"
    model.save_pretrained(src, max_shard_size="40KB" if sharded else "10GB")
    if sharded:
        index = json.loads((src / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1
    src_files = {p.name: p.read_bytes() for p in src.iterdir()}

    r = run("prune", str(src), "-o", str(out), "--sparsity", "0.75")
    assert r.exit_code == 0, r.output
    assert {p.name: p.read_bytes() for p in src.iterdir()} == src_files  # input untouched
    assert sorted(p.name for p in out.iterdir()) == sorted(src_files)  # layout kept

    loaded, info = cls.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    original = dict(model.named_parameters())
    targeted = 0
    for name, p in loaded.named_parameters():
        if is_targeted(name, tuple(p.shape), p.dtype):
            targeted += 1
            assert int((p == 0).sum()) == round(0.75 * p.numel()), name
            kept = p != 0
            assert torch.equal(p[kept], original[name][kept])
        else:
            assert torch.equal(p, original[name]), name
    assert targeted == EXPECTED_TARGETS[kind]
