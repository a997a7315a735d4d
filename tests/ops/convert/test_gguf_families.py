"""convert DIR -o FILE.gguf for the families beyond Llama and Qwen2/3: Gemma-3 (four norms a
block written as the ``1 + w`` they apply, sliding and full layers) and Qwen3-MoE (experts
stacked per block) load in transformers' own GGUF reader with the source's logits; Mixtral, which
transformers' reader does not map (llama.cpp holds it as ``llama`` with experts), is checked
tensor by tensor against the layout llama.cpp reads; shrunk ones (fewer experts, fewer blocks)
carry their counts and pattern; a SentencePiece-style tokenizer (Gemma's, Llama 2's) is written
as llama.cpp's ``llama`` tokenizer and encodes as the source's; what llama.cpp would run
otherwise is refused before writing.

llama.cpp itself on these families is measured in benchmarks/bench_llamacpp.py (RESULTS.md).
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest
import torch
import transformers as t
from gguf_models import load_gguf_model, logits_of, sample_ids
from safetensors import safe_open

from sparsetool.checkpoint.layout import TMP_MARK
from sparsetool.ops.gguf_export import export_gguf
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

from helpers import CALIB, make_text, run, save_sentencepiece_tokenizer, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def _config(kind: str, **changes):
    if kind == "gemma3":
        # transformers' GGUF reader takes query_pre_attn_scalar's default (256), which llama.cpp
        # reads as the head's width: a head of 256 keeps the two alike. Six blocks: the default
        # pattern makes the sixth full, the others sliding (a window of 16 in 64 tokens).
        kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                  query_pre_attn_scalar=256, sliding_window=16)  # fmt: skip
        return t.Gemma3TextConfig(**{**kw, **changes}, **_SMALL)
    if kind == "qwen3_moe":
        # the reader takes moe_intermediate_size's default (768) and Qwen3's head of 128
        kw = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=768,
                  num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=128)  # fmt: skip
        return t.Qwen3MoeConfig(**{**kw, **changes}, **_SMALL)
    kw = dict(hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    return t.MixtralConfig(**{**kw, **changes}, **_SMALL)


def _save(kind: str, directory, text, **changes):
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(_config(kind, **changes)).eval()
    with torch.no_grad():  # norms that are not all zeros or ones, so their mapping is checked
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(-0.5, 0.5)
    model.save_pretrained(directory)
    save_tokenizer(directory, text)
    return model


def _tensors(path) -> dict[str, np.ndarray]:
    return {r.name: np.asarray(r.data) for r in gguf.GGUFReader(path).tensors}


@pytest.mark.parametrize("kind", ["gemma3", "qwen3_moe"])
def test_gemma3_and_qwen3_moe_load_with_the_sources_logits(kind, tmp_path, text):
    model = _save(kind, tmp_path / "in", text)
    ids = sample_ids(tmp_path / "in")
    want = logits_of(model, ids)
    scale = float(want.abs().max())
    for gguf_type, worst, agree in (("f32", 1e-4, 1.0), ("f16", 0.02, 0.95), ("q8_0", 0.1, 0.9)):
        out = tmp_path / f"m.{gguf_type}.gguf"
        result = export_gguf(tmp_path / "in", out, gguf_type=gguf_type)
        assert result.kept_f16 == []
        got = logits_of(load_gguf_model(out), ids)
        assert float((got - want).abs().max()) < worst * scale, (gguf_type, got - want)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= agree, gguf_type
    fields = gguf.GGUFReader(tmp_path / "m.f32.gguf").fields
    if kind == "qwen3_moe":
        assert fields["qwen3moe.expert_count"].contents() == 4
        assert fields["qwen3moe.expert_feed_forward_length"].contents() == 768
        assert _tensors(tmp_path / "m.f32.gguf")["blk.1.ffn_down_exps.weight"].shape == (4, 64, 768)
    else:
        pattern = fields["gemma3.attention.sliding_window_pattern"].contents()
        assert pattern == [True] * 5 + [False]
        assert fields["gemma3.attention.sliding_window"].contents() == 16


def test_gemma3_writes_its_norms_as_applied_and_each_blocks_kind(tmp_path, text):
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}  # fmt: skip
    _save("gemma3", tmp_path / "in", text, num_hidden_layers=4, layer_types=kinds,
          rope_parameters=rope)  # fmt: skip
    export_gguf(tmp_path / "in", tmp_path / "m.gguf", gguf_type="f16")
    got = _tensors(tmp_path / "m.gguf")
    with safe_open(str(tmp_path / "in" / "model.safetensors"), "np") as f:
        for name, mapped in (
            ("model.layers.1.post_attention_layernorm.weight", "blk.1.post_attention_norm.weight"),
            ("model.layers.1.pre_feedforward_layernorm.weight", "blk.1.ffn_norm.weight"),
            ("model.layers.1.post_feedforward_layernorm.weight", "blk.1.post_ffw_norm.weight"),
            ("model.layers.2.self_attn.k_norm.weight", "blk.2.attn_k_norm.weight"),
            ("model.norm.weight", "output_norm.weight"),
        ):
            assert got[mapped].dtype == np.float32
            np.testing.assert_allclose(got[mapped], f.get_tensor(name) + 1, rtol=0, atol=1e-7)
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")  # as stored: no reordering
        np.testing.assert_array_equal(got["blk.0.attn_q.weight"], q.astype(np.float16))
    assert "output.weight" not in got  # the head is the embedding
    fields = gguf.GGUFReader(tmp_path / "m.gguf").fields
    assert fields["gemma3.attention.sliding_window_pattern"].contents() == [True, False] * 2
    assert fields["gemma3.rope.freq_base"].contents() == 1e6
    assert fields["gemma3.rope.freq_base_swa"].contents() == 1e4
    assert fields["gemma3.rope.scaling.type"].contents() == "linear"
    assert fields["gemma3.rope.scaling.factor"].contents() == 8.0


def test_gemma3_with_fewer_blocks_keeps_each_blocks_kind(tmp_path, text, calib_file):
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    _save("gemma3", tmp_path / "in", text, num_hidden_layers=4, layer_types=kinds)
    opts = ShrinkOptions(blocks=1, calibration=calib_file, **CALIB)
    shrink_checkpoint(tmp_path / "in", tmp_path / "shallow", opts)
    kept = json.loads((tmp_path / "shallow" / "config.json").read_text())["layer_types"]
    assert len(kept) == 3
    export_gguf(tmp_path / "shallow", tmp_path / "m.gguf", gguf_type="f32")
    fields = gguf.GGUFReader(tmp_path / "m.gguf").fields
    assert fields["gemma3.block_count"].contents() == 3
    pattern = fields["gemma3.attention.sliding_window_pattern"].contents()
    assert pattern == [k == "sliding_attention" for k in kept]


def test_mixtral_experts_are_stacked_as_llama_cpp_reads_them(tmp_path, text, calib_file):
    _save("mixtral", tmp_path / "in", text)
    opts = ShrinkOptions(experts=0.5, calibration=calib_file, **CALIB)
    shrink_checkpoint(tmp_path / "in", tmp_path / "fewer", opts)
    for directory, count in ((tmp_path / "in", 4), (tmp_path / "fewer", 2)):
        out = directory.with_suffix(".gguf")
        export_gguf(directory, out, gguf_type="f32")
        fields = gguf.GGUFReader(out).fields
        assert fields["general.architecture"].contents() == "llama"
        assert fields["llama.expert_count"].contents() == count
        assert fields["llama.expert_used_count"].contents() == 2
        assert fields["llama.feed_forward_length"].contents() == 64
        got = _tensors(out)
        with safe_open(str(directory / "model.safetensors"), "np") as f:
            for block in (0, 1):
                prefix = f"model.layers.{block}.block_sparse_moe"
                for w, mapped in (("w1", "gate"), ("w3", "up"), ("w2", "down")):
                    want = np.stack(
                        [f.get_tensor(f"{prefix}.experts.{e}.{w}.weight") for e in range(count)]
                    )
                    np.testing.assert_array_equal(
                        got[f"blk.{block}.ffn_{mapped}_exps.weight"], want
                    )
                router = f.get_tensor(f"{prefix}.gate.weight")
                np.testing.assert_array_equal(got[f"blk.{block}.ffn_gate_inp.weight"], router)
    q8 = export_gguf(tmp_path / "in", tmp_path / "q8.gguf", gguf_type="q8_0")
    kinds = {r.name: r.tensor_type.name for r in gguf.GGUFReader(tmp_path / "q8.gguf").tensors}
    assert (
        kinds["blk.0.ffn_up_exps.weight"] == "Q8_0" and kinds["blk.0.ffn_gate_inp.weight"] == "F32"
    )
    assert q8.parameters == sum(
        p.numel() for p in t.AutoModelForCausalLM.from_pretrained(tmp_path / "in").parameters()
    )


def _edited(tmp_path, source, name, **config):
    """A copy of ``source`` with config.json's keys changed."""
    copy = tmp_path / name
    shutil.copytree(source, copy)
    data = json.loads((copy / "config.json").read_text())
    data.update(config)
    (copy / "config.json").write_text(json.dumps(data))
    return copy


def test_what_llama_cpp_would_run_otherwise_is_refused(tmp_path, text):
    from safetensors.torch import load_file, save_file

    _save("qwen3_moe", tmp_path / "moe", text)
    _save("gemma3", tmp_path / "gemma", text)
    _save("mixtral", tmp_path / "mixtral", text)
    missing = tmp_path / "missing"  # an expert's tensors gone from one block
    shutil.copytree(tmp_path / "mixtral", missing)
    tensors = load_file(missing / "model.safetensors")
    for w in ("w1", "w2", "w3"):
        del tensors[f"model.layers.1.block_sparse_moe.experts.3.{w}.weight"]
    save_file(tensors, missing / "model.safetensors", metadata={"format": "pt"})
    from tokenizers import Tokenizer, models

    words = tmp_path / "words"  # a word-level tokenizer: neither kind of BPE
    shutil.copytree(tmp_path / "mixtral", words)
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(sorted(set(text.split())))}}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(words / "tokenizer.json"))
    cases = {
        words: "a WordLevel tokenizer; convert writes BPE tokenizers",
        _edited(tmp_path, tmp_path / "moe", "topk", norm_topk_prob=False): "norm_topk_prob",
        _edited(tmp_path, tmp_path / "moe", "dense", mlp_only_layers=[1]): "mlp_only_layers",
        _edited(tmp_path, tmp_path / "moe", "routed", num_experts_per_tok=None):
            "num_experts_per_tok missing",
        _edited(tmp_path, tmp_path / "gemma", "scalar", query_pre_attn_scalar=144):
            "query_pre_attn_scalar 144",
        _edited(tmp_path, tmp_path / "gemma", "cap", attn_logit_softcapping=50.0):
            "attn_logit_softcapping",
        _edited(tmp_path, tmp_path / "gemma", "act", hidden_activation="gelu"): "act 'gelu'",
        _edited(tmp_path, tmp_path / "mixtral", "window", sliding_window=16): "sliding_window 16",
        _edited(tmp_path, tmp_path / "gemma", "vision", model_type="gemma3"): "its text model",
        missing: "3 experts stored for blk.1.ffn_gate_exps.weight",
    }  # fmt: skip
    for source, said in cases.items():
        r = run("convert", source, "-o", tmp_path / "o.gguf")
        assert r.exit_code == 1 and said in r.output, (source, r.output)
        assert len([x for x in r.output.splitlines() if x.startswith("error:")]) == 1
        assert not (tmp_path / "o.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if TMP_MARK in p.name]


@pytest.mark.parametrize("kind", ["gemma", "llama"])
def test_a_sentencepiece_tokenizer_encodes_as_the_sources(kind, tmp_path, text):
    """Gemma's and Llama 2's kind: spaces as ▁, unknown characters as byte tokens. transformers'
    reader rebuilds it from the merges; llama.cpp merges by the scores written (checked in
    llama.cpp itself by benchmarks/bench_llamacpp.py)."""
    size = save_sentencepiece_tokenizer(tmp_path / "in", text, kind)
    torch.manual_seed(0)
    small = dict(_SMALL, vocab_size=size + 4)
    if kind == "gemma":
        cfg = t.Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                                 **small)  # fmt: skip
    else:
        cfg = t.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, **small)  # fmt: skip
    t.AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "in")
    out = tmp_path / "m.gguf"
    export_gguf(tmp_path / "in", out, gguf_type="f32")
    src = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    got = t.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    sample = make_text(20, seed=11) + "  12345 e=mc^2\n\tend \u00e9 \u6f22\u5b57"
    want = src(sample)["input_ids"]
    assert got(sample)["input_ids"] == want
    assert any(tok.startswith("<0x") for tok in src.convert_ids_to_tokens(want))  # byte fallback
    fields = gguf.GGUFReader(out).fields
    assert fields["tokenizer.ggml.model"].contents() == "llama"
    assert fields["tokenizer.ggml.add_space_prefix"].contents() is (kind == "llama")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    scores = fields["tokenizer.ggml.scores"].contents()
    assert len(tokens) == len(types) == len(scores) == size + 4
    assert types[tokens.index("<0x41>")] == 6 and types[tokens.index("<unk>")] == 2
    merges = fields["tokenizer.ggml.merges"].contents()
    first = merges[0].replace(" ", "")  # the first merge's token scores highest of the merged
    assert scores[tokens.index(first)] == -1.0 and max(scores) == 0.0
    assert sorted(scores)[0] >= -len(merges)
