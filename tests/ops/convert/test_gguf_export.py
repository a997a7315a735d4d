"""convert DIR -o FILE.gguf: a Hugging Face directory out to llama.cpp's format, read back by
transformers' own GGUF reader (``from_pretrained(DIR, gguf_file=...)``).

- Llama (grouped-query attention: the query and key rows reordered for llama.cpp's rotary
  layout), Qwen2 (attention biases) and Qwen3 (q/k norms) load with the
  source's logits: f32 to float rounding, f16 and bf16 within their rounding, q8_0 and q4_0
  within stated tolerances and top-1 agreement;
- a shrunk model (narrower FFN, fewer heads with head_dim written out, fewer blocks) does too;
- the tokenizer encodes as the source's; bf16 weights come back bit for bit; the provenance is
  carried in the metadata;
- what cannot be written is one line, and nothing is left behind.
"""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch
import transformers as t
from gguf_models import load_gguf_model, logits_of, sample_ids

from sparsetool.checkpoint.layout import TMP_MARK
from sparsetool.ops.gguf_export import export_gguf
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

from helpers import CALIB, make_text, run, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)
_WIDTHS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2)


def _config(kind: str):
    if kind == "llama":
        return t.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **_WIDTHS, **_SMALL)
    if kind == "qwen2":
        return t.Qwen2Config(num_attention_heads=4, num_key_value_heads=2, **_WIDTHS, **_SMALL)
    # transformers' GGUF reader does not read a qwen3 head's width (llama.cpp reads
    # attention.key_length): it takes Qwen3's default, 128, which this model has
    return t.Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=128, **_WIDTHS,
                         **_SMALL)  # fmt: skip


def _save(kind: str, directory, text, dtype=torch.float32):
    torch.manual_seed(0)
    model = t.AutoModelForCausalLM.from_config(_config(kind)).eval()
    with torch.no_grad():  # norms that are not all ones, so their mapping is checked
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    model.to(dtype).save_pretrained(directory)
    save_tokenizer(directory, text)
    return model.float()


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_each_family_loads_with_the_sources_logits(kind, tmp_path, text):
    model = _save(kind, tmp_path / "in", text)
    ids = sample_ids(tmp_path / "in")
    want = logits_of(model, ids)
    for gguf_type, atol in (("f32", 1e-4), ("f16", 2e-2), ("bf16", 1e-1)):
        out = tmp_path / f"m.{gguf_type}.gguf"
        export_gguf(tmp_path / "in", out, gguf_type=gguf_type)
        got = logits_of(load_gguf_model(out), ids)
        assert torch.allclose(got, want, atol=atol), (gguf_type, float((got - want).abs().max()))
    scale = float(want.abs().max())
    for gguf_type, worst, agree in (("q8_0", 0.05, 0.95), ("q4_0", 0.5, 0.5)):
        out = tmp_path / f"m.{gguf_type}.gguf"
        result = export_gguf(tmp_path / "in", out, gguf_type=gguf_type)
        assert result.tensors[gguf_type] > 0 and result.kept_f16 == []
        got = logits_of(load_gguf_model(out), ids)
        assert float((got - want).abs().max()) < worst * scale, gguf_type
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= agree, gguf_type
    sizes = {ty: (tmp_path / f"m.{ty}.gguf").stat().st_size for ty in ("f16", "q8_0")}
    assert sizes["q8_0"] < 0.6 * sizes["f16"]


def test_the_tokenizer_encodes_as_the_sources(tmp_path, text):
    _save("llama", tmp_path / "in", text)
    out = tmp_path / "m.gguf"
    export_gguf(tmp_path / "in", out, gguf_type="f32")
    src = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    got = t.AutoTokenizer.from_pretrained(tmp_path, gguf_file=out.name)
    sample = make_text(20, seed=11) + " <s> 12345 e=mc^2\n\tend"
    assert got(sample)["input_ids"] == src(sample)["input_ids"]
    reader = gguf.GGUFReader(out)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 320 and tokens[:300] == src.convert_ids_to_tokens(list(range(300)))
    assert reader.fields["tokenizer.ggml.bos_token_id"].contents() == 1
    assert reader.fields["tokenizer.ggml.pre"].contents() == "gpt-2"
    adds_bos = src("word")["input_ids"][0] == src.bos_token_id
    assert reader.fields["tokenizer.ggml.add_bos_token"].contents() is adds_bos


def test_bf16_comes_back_bit_for_bit_with_its_provenance(tmp_path, text, calib_file):
    _save("llama", tmp_path / "dense", text, dtype=torch.bfloat16)
    opts = ShrinkOptions(ffn=0.5, calibration=calib_file, **CALIB)
    shrink_checkpoint(tmp_path / "dense", tmp_path / "in", opts)
    out = tmp_path / "m.bf16.gguf"
    export_gguf(tmp_path / "in", out, gguf_type="bf16")
    src = t.AutoModelForCausalLM.from_pretrained(tmp_path / "in", dtype=torch.bfloat16)
    back = t.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=out.name,
                                                  dtype=torch.bfloat16)  # fmt: skip
    want, got = src.state_dict(), back.state_dict()
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    from safetensors import safe_open

    with safe_open(str(tmp_path / "in" / "model.safetensors"), "pt") as f:
        provenance = f.metadata()["sparsetool"]
    assert gguf.GGUFReader(out).fields["sparsetool.provenance"].contents() == provenance
    r = run("convert", out, "-o", tmp_path / "back", "--dtype", "bfloat16")  # and back again
    assert r.exit_code == 0, r.output
    with safe_open(str(tmp_path / "back" / "model.safetensors"), "pt") as f:
        assert f.metadata()["sparsetool"] == provenance
        for name in want:
            assert torch.equal(f.get_tensor(name), want[name]), name


def test_shrunk_models_load_with_their_logits(tmp_path, text, calib_file):
    _save("llama", tmp_path / "dense", text)
    for name, asked in (
        ("narrow", dict(ffn=0.5, heads=0.5)),  # 2 of 4 heads, head_dim written out, FFN 64
        ("shallow", dict(blocks=1)),
    ):
        opts = ShrinkOptions(calibration=calib_file, **asked, **CALIB)
        shrink_checkpoint(tmp_path / "dense", tmp_path / name, opts)
        shrunk = t.AutoModelForCausalLM.from_pretrained(tmp_path / name).eval()
        out = tmp_path / f"{name}.gguf"
        export_gguf(tmp_path / name, out, gguf_type="f32")
        ids = sample_ids(tmp_path / name)
        got, want = logits_of(load_gguf_model(out), ids), logits_of(shrunk, ids)
        assert torch.allclose(got, want, atol=1e-4), name


def test_rows_not_a_multiple_of_the_block_stay_f16(tmp_path, text):
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, hidden_size=48,
                        intermediate_size=96, num_hidden_layers=1, **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    r = run("convert", tmp_path / "in", "-o", tmp_path / "m.gguf", "--type", "q8_0", "--json")
    assert r.exit_code == 0, r.output
    import json

    got = json.loads(r.stdout)
    # rows of 48 (q/k/v/o, gate/up, the embeddings) stay f16; the down projection's 96 is x32
    assert (
        got["tensors"]["q8_0"] == 1
        and "model.layers.0.mlp.down_proj.weight" not in (got["kept_f16"])
    )
    assert "model.embed_tokens.weight" in got["kept_f16"]
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    kinds = {tensor.name: tensor.tensor_type.name for tensor in reader.tensors}
    assert kinds["blk.0.ffn_down.weight"] == "Q8_0" and kinds["blk.0.attn_q.weight"] == "F16"
    assert kinds["blk.0.attn_norm.weight"] == "F32"


def test_what_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, text):
    _save("llama", tmp_path / "in", text)
    gpt2 = tmp_path / "gpt2"
    t.GPT2LMHeadModel(t.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=320)).save_pretrained(
        gpt2
    )
    save_tokenizer(gpt2, text)
    cases = [
        (("convert", gpt2, "-o", tmp_path / "o.gguf"), 1, "model_type 'gpt2'"),
        (("convert", tmp_path / "in", "-o", tmp_path / "in"), 2, "is the input itself"),
        (("convert", tmp_path / "in", "-o", tmp_path / "in" / "config.json"), 2, "exists"),
        (
            ("convert", tmp_path / "in", "-o", tmp_path / "o.gguf", "--dtype", "bfloat16"),
            2,
            "--dtype is for a GGUF file",
        ),  # fmt: skip
        (("convert", tmp_path / "in", "-o", tmp_path / "o.gguf", "--type", "q2_k"), 2, "q2_k"),
        (("convert", tmp_path / "in", "-o", tmp_path / "no" / "o.gguf"), 1, "does not exist"),
    ]
    (tmp_path / "empty").mkdir()
    cases.append((("convert", tmp_path / "empty", "-o", tmp_path / "o.gguf"), 1, "safetensors"))
    (tmp_path / "bare").mkdir()  # weights without config.json
    (tmp_path / "bare" / "model.safetensors").write_bytes(
        (tmp_path / "in" / "model.safetensors").read_bytes()
    )
    cases.append((("convert", tmp_path / "bare", "-o", tmp_path / "o.gguf"), 1, "no config.json"))
    notok = tmp_path / "notok"
    notok.mkdir()
    for f in (tmp_path / "in").iterdir():
        if not f.name.startswith("tokenizer"):
            (notok / f.name).write_bytes(f.read_bytes())
    cases.append((("convert", notok, "-o", tmp_path / "o.gguf"), 1, "no tokenizer.json"))
    before = sorted(p.name for p in tmp_path.iterdir())
    for args, code, said in cases:
        r = run(*args)
        assert r.exit_code == code, (args, r.output)
        errors = [line for line in r.output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and said in r.output, (args, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not [p for p in tmp_path.rglob("*") if TMP_MARK in p.name]
    r = run("convert", tmp_path / "m.gguf", "-o", tmp_path / "x", "--type", "f16")
    assert r.exit_code == 2 and "--type is for a directory" in r.output
    np.testing.assert_equal(sorted(p.name for p in tmp_path.iterdir()), before)


def test_pruned_zeros_are_written_as_zeros_and_an_encoding_is_refused(tmp_path, text):
    from safetensors import safe_open

    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    _save("llama", tmp_path / "in", text)
    prune_checkpoint(tmp_path / "in", tmp_path / "zeros", PruneOptions(sparsity=0.5))
    export_gguf(tmp_path / "zeros", tmp_path / "z.gguf", gguf_type="q8_0")
    back = load_gguf_model(tmp_path / "z.gguf").state_dict()
    with safe_open(str(tmp_path / "zeros" / "model.safetensors"), "pt") as f:
        for name in (
            "model.layers.0.mlp.down_proj.weight",
            "model.layers.1.self_attn.v_proj.weight",
        ):
            zeros = f.get_tensor(name) == 0
            assert zeros.float().mean() > 0.4 and bool((back[name][zeros] == 0).all()), name
    prune_checkpoint(tmp_path / "in", tmp_path / "bits",
                     PruneOptions(sparsity=0.5, encoding="bitmask"))  # fmt: skip
    r = run("convert", tmp_path / "bits", "-o", tmp_path / "b.gguf")
    assert r.exit_code == 1 and "sparsetool densify" in r.output
    assert not (tmp_path / "b.gguf").exists()


def test_the_python_function_converts_both_ways(tmp_path, text):
    import sparsetool
    from sparsetool.errors import SparsetoolError

    _save("llama", tmp_path / "in", text)
    out = sparsetool.convert(tmp_path / "in", tmp_path / "m.gguf", gguf_type="q8_0")
    assert out.tensors["q8_0"] > 0 and out.to_json()["type"] == "q8_0"
    back = sparsetool.convert(tmp_path / "m.gguf", tmp_path / "back")
    assert back.dtype == "float32" and (tmp_path / "back" / "model.safetensors").is_file()
    with pytest.raises(SparsetoolError, match="gguf_type is for a directory"):
        sparsetool.convert(tmp_path / "m.gguf", tmp_path / "x", gguf_type="f16")
    with pytest.raises(SparsetoolError, match="dtype is for a GGUF file"):
        sparsetool.convert(tmp_path / "in", tmp_path / "y.gguf", dtype="bfloat16")


def test_a_failure_mid_write_leaves_nothing_and_the_temporary_is_owner_only(
    tmp_path, text, monkeypatch
):
    import os
    import stat

    import sparsetool.ops.gguf_export as export

    _save("llama", tmp_path / "in", text)
    convert, seen = export._converted, []

    def failing(ckpt, t):
        temps = [p for p in tmp_path.iterdir() if TMP_MARK in p.name]
        seen.append(stat.S_IMODE(os.stat(temps[0]).st_mode))
        if len(seen) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the tensors
        return convert(ckpt, t)

    monkeypatch.setattr(export, "_converted", failing)
    with pytest.raises(KeyboardInterrupt):
        export_gguf(tmp_path / "in", tmp_path / "m.gguf")
    assert seen == [0o600] * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_what_llama_cpp_would_misread_is_refused_before_writing(tmp_path, text):
    import json

    from safetensors.torch import load_file, save_file

    _save("llama", tmp_path / "in", text)
    cases = {}
    scaled = tmp_path / "scaled"  # YaRN's RoPE scaling
    shutil.copytree(tmp_path / "in", scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 8.0}
    (scaled / "config.json").write_text(json.dumps(config))
    cases[scaled] = "RoPE scaling 'yarn'"
    small = tmp_path / "small"  # more tokens than embedding rows
    shutil.copytree(tmp_path / "in", small)
    config = json.loads((small / "config.json").read_text())
    config["vocab_size"] = 200
    (small / "config.json").write_text(json.dumps(config))
    cases[small] = "more than the 200 rows"
    ints = tmp_path / "ints"  # a weight stored as integers
    shutil.copytree(tmp_path / "in", ints)
    tensors = load_file(ints / "model.safetensors")
    tensors["model.norm.weight"] = tensors["model.norm.weight"].to(torch.int32)
    save_file(tensors, ints / "model.safetensors", metadata={"format": "pt"})
    cases[ints] = "is I32"
    for source, said in cases.items():
        r = run("convert", source, "-o", tmp_path / "o.gguf")
        assert r.exit_code == 1 and said in r.output, (source, r.output)
        assert not (tmp_path / "o.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if TMP_MARK in p.name]


def test_add_bos_follows_the_tokenizers_template(tmp_path, text):
    from tokenizers import processors

    _save("llama", tmp_path / "in", text)
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.bos_token_id)]
    )
    tok.save_pretrained(tmp_path / "in")
    assert tok("word")["input_ids"][0] == tok.bos_token_id
    export_gguf(tmp_path / "in", tmp_path / "m.gguf", gguf_type="f32")
    reader = gguf.GGUFReader(tmp_path / "m.gguf")
    assert reader.fields["tokenizer.ggml.add_bos_token"].contents() is True


def test_llama_3_1_rope_scaling_is_written_as_llama_cpps_rope_freqs(tmp_path, text):
    """llama.cpp divides each rotary frequency by ``rope_freqs.weight``: the ratio of the plain
    frequencies to the ones transformers' own ``llama3`` RoPE computes."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32, "rope_theta": 500000.0}  # fmt: skip
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_attention_heads=2, num_key_value_heads=1, rope_parameters=rope,
                        **_WIDTHS, **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    result = export_gguf(tmp_path / "in", tmp_path / "m.gguf", gguf_type="f16")
    got = {r.name: np.asarray(r.data) for r in gguf.GGUFReader(tmp_path / "m.gguf").tensors}
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](t.LlamaConfig.from_pretrained(tmp_path / "in"), "cpu")
    dim = 32  # 64 / 2 heads
    plain = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    want = (plain / scaled).numpy()
    assert got["rope_freqs.weight"].dtype == np.float32
    np.testing.assert_allclose(got["rope_freqs.weight"], want, rtol=1e-5)
    assert want.min() == 1.0 and want.max() == 8.0 and len(set(want.round(4))) > 2  # all 3 kinds
    assert result.parameters == sum(p.numel() for p in t.LlamaForCausalLM(cfg).parameters())
