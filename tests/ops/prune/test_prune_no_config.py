"""prune of a directory without config.json: its output is no model anything loads, and a note on
stderr says so and what to do (silenced by -q)."""

from __future__ import annotations

import json

import pytest
import torch

from sparsetool.ops.prune.pipeline import not_a_model

from helpers import hf_model, run


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A GPT-2 model directory, and a copy of its weights alone."""
    root = tmp_path_factory.mktemp("noconfig")
    torch.manual_seed(0)
    hf_model("gpt2").save_pretrained(root / "model")
    (root / "weights").mkdir()
    for f in (root / "model").glob("*.safetensors"):
        (root / "weights" / f.name).write_bytes(f.read_bytes())
    return root


def test_a_directory_without_config_gets_a_note_on_stderr(dirs, tmp_path):
    out = tmp_path / "out"
    r = run("prune", dirs / "weights", "-o", out, "--sparsity", 0.5, "--json")
    assert r.exit_code == 0, r.output
    json.loads(r.stdout)  # the JSON stays whole
    assert f"note: {out} has no config.json ({dirs / 'weights'} had none)" in r.stderr
    assert "copy the original model's config.json and tokenizer files" in r.stderr
    assert "prune the model's own directory" in r.stderr
    assert not (out / "config.json").exists()
    r = run("prune", dirs / "weights", "-o", tmp_path / "q", "--sparsity", 0.5, "-q")
    assert r.exit_code == 0 and "config.json" not in r.stderr


def test_a_model_directory_gets_no_note(dirs, tmp_path):
    r = run("prune", dirs / "model", "-o", tmp_path / "out", "--sparsity", 0.5)
    assert r.exit_code == 0 and "config.json" not in r.stderr, r.stderr


def test_files_and_sparsetools_own_model_need_no_config(dirs, tmp_path):
    weights = next((dirs / "weights").glob("*.safetensors"))
    assert not_a_model(weights, tmp_path / "x.safetensors", set()) is None
    gpt = {"tok_emb.weight", "pos_emb.weight", "blocks.0.ln1.weight"}
    assert not_a_model(dirs / "weights", tmp_path, gpt) is None
    assert "has no config.json" in str(not_a_model(dirs / "weights", tmp_path, {"w"}))
