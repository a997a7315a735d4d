"""Which loaders read each encoding correctly: the evidence behind README's loader table.

A small random GPT-2 is saved with transformers' save_pretrained, pruned by sparsetool into each
encoding, and loaded back with sparsetool.load and with transformers' from_pretrained (the version
installed; 5.23.0 is the one the README names). Nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch
import transformers

import sparsetool

from helpers import run

ENCODINGS = ("zeros", "mask", "nan", "bitmask")


@pytest.fixture(scope="module")
def pruned(tmp_path_factory):
    root = tmp_path_factory.mktemp("loaders")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    model.save_pretrained(root / "src")
    for enc in ENCODINGS:
        sparsetool.prune(root / "src", root / enc, sparsity=0.5, encoding=enc)
    reference = sparsetool.load(root / "zeros")
    return root, reference


def _attn(model):
    return model.transformer.h[0].attn.c_attn.weight.detach()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_sparsetool_load_reads_every_encoding(pruned, encoding):
    root, reference = pruned
    got = sparsetool.load(root / encoding)
    assert sorted(got) == sorted(reference)
    assert all(torch.equal(got[k], reference[k]) for k in reference)


def test_transformers_reads_zeros_correctly(pruned):
    root, reference = pruned
    model, info = transformers.GPT2LMHeadModel.from_pretrained(
        root / "zeros", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert torch.equal(_attn(model), reference["transformer.h.0.attn.c_attn.weight"])


def test_transformers_reads_mask_weights_and_ignores_the_masks(pruned):
    root, reference = pruned
    model, info = transformers.GPT2LMHeadModel.from_pretrained(
        root / "mask", output_loading_info=True
    )
    assert not info["missing_keys"]
    assert info["unexpected_keys"] and all(k.endswith("_mask") for k in info["unexpected_keys"])
    assert torch.equal(_attn(model), reference["transformer.h.0.attn.c_attn.weight"])


def test_transformers_loads_nan_encoding_as_a_broken_model(pruned):
    root, _ = pruned
    model = transformers.GPT2LMHeadModel.from_pretrained(root / "nan")
    assert torch.isnan(_attn(model)).any()  # loads without a word, but the weights are NaN


def test_transformers_cannot_load_bitmask_without_compressed_tensors(pruned):
    root, _ = pruned
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="compressed-tensors"):
            transformers.GPT2LMHeadModel.from_pretrained(root / "bitmask")
    else:
        pytest.skip("compressed-tensors is installed: this test covers its absence")


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_prune_warns_when_a_hf_directory_will_not_load_in_transformers(pruned, tmp_path, encoding):
    root, _ = pruned
    result = sparsetool.prune(root / "src", tmp_path / "out", sparsity=0.5, encoding=encoding)
    if encoding in ("nan", "bitmask"):
        assert len(result.warnings) == 1
        assert "from_pretrained" in result.warnings[0] and "densify" in result.warnings[0]
    else:
        assert result.warnings == []
    # a single file is not a model directory: nothing to warn about
    single = sparsetool.prune(
        root / "src" / "model.safetensors",
        tmp_path / "x.safetensors",
        sparsity=0.5,
        encoding=encoding,
    )
    assert single.warnings == []


def test_prune_command_prints_one_warning_line_for_a_misleading_encoding(pruned, tmp_path):
    root, _ = pruned
    r = run(
        "prune",
        str(root / "src"),
        "-o",
        str(tmp_path / "nan"),
        "--sparsity",
        "0.5",
        "--encoding",
        "nan",
        "--json",
    )
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "densify" in r.stderr
    import json

    assert json.loads(r.stdout)["warnings"]  # stdout stays plain JSON
