"""shrink on a checkpoint of sparsetool's own GPT (``sparsetool train``): every kind is refused in
one line naming the checkpoint and what to do instead, before any text is read (a calibration
path that does not exist is never reached) and before any output appears."""

from __future__ import annotations

import pytest
from safetensors.torch import save_file

import sparsetool
from sparsetool.errors import SparsetoolError

from helpers import gpt2_like_state, run

KINDS = [
    ["--ffn", "0.5"],
    ["--heads", "0.5"],
    ["--hidden", "0.5"],
    ["--blocks", "1"],
    ["--experts", "0.5"],
    ["--experts", "0.5", "--criterion", "random"],  # reads no text at all
]
SAYS = "a checkpoint of sparsetool's GPT; shrink rewrites Hugging Face model directories only"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: " ".join(k))
@pytest.mark.parametrize("where", ["directory", "file"])
def test_every_kind_refuses_a_train_checkpoint_in_one_line(kind, where, tiny_run, tmp_path):
    src = tiny_run if where == "directory" else tiny_run / "model.safetensors"
    out = tmp_path / "out"
    r = run("shrink", src, "-o", out, *kind, "--calibration", tmp_path / "no-such-text.txt",
            "--samples", "8", "--seq", "64")  # fmt: skip
    assert r.exit_code == 1, r.output
    assert r.output.count("error:") == 1 and "Traceback" not in r.output, r.output
    assert f"error: {src}: {SAYS}" in r.output, r.output
    assert "sparsetool train --n-layer" in r.output and "sparsetool prune" in r.output
    assert not out.exists()


def test_the_python_api_refuses_it_alike(tiny_run, tmp_path):
    with pytest.raises(SparsetoolError, match="sparsetool's GPT"):
        sparsetool.shrink(tiny_run, tmp_path / "out", ffn=0.5, calibration=tmp_path / "none")
    assert not (tmp_path / "out").exists()


def test_widths_without_a_config_say_what_shrink_reads(tmp_path):
    """A file without config.json is refused as --blocks and --experts refuse it, before the text
    is read, without inviting a checkpoint of sparsetool train."""
    src = tmp_path / "model.safetensors"
    save_file(gpt2_like_state(), str(src), metadata={"format": "pt"})
    for kind in (["--ffn", "0.5"], ["--blocks", "1"]):
        r = run("shrink", src, "-o", tmp_path / "out", *kind, "--calibration",
                tmp_path / "no-such-text.txt")  # fmt: skip
        assert r.exit_code == 1 and r.output.count("error:") == 1, r.output
        assert f"{src}: no config.json; shrink needs a Hugging Face model directory" in r.output
        assert "sparsetool train" not in r.output, r.output
