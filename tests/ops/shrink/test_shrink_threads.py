"""shrink writes the same bytes at any --threads (as prune does): the refits' solves, ReplaceMe's
maps, --hidden's refit of the norms' readers and every whole-tensor sum the records keep run on one
thread, whose order does not depend on --threads. On a model wide enough that LAPACK and torch's
reductions split their work by thread count (a tiny one never does)."""

from __future__ import annotations

import hashlib

import pytest
import torch
import transformers as t

from helpers import run, save_tokenizer


@pytest.fixture(scope="module")
def wide(tmp_path_factory, text):
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=4, hidden_size=128, intermediate_size=512,
                        num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                        max_position_embeddings=128, bos_token_id=1, eos_token_id=1)  # fmt: skip
    path = tmp_path_factory.mktemp("wide") / "in"
    t.LlamaForCausalLM(cfg).eval().save_pretrained(path)
    save_tokenizer(path, text)
    return path


def _digest(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "cut",
    [
        ["--ffn", "0.5", "--heads", "0.5"],  # least-squares refits, damping chosen
        ["--blocks", "2"],  # block influence, ReplaceMe's maps
        ["--hidden", "0.5"],  # the norms' readers refit
    ],
    ids=["widths", "blocks", "hidden"],
)
def test_the_same_bytes_at_one_and_two_threads(wide, tmp_path, calib_file, cut):
    calib = ["--calibration", calib_file, "--samples", "8", "--seq", "96"]
    digests = []
    for threads in ("1", "2", "2"):
        out = tmp_path / f"out-{len(digests)}"
        r = run("shrink", wide, "-o", out, *cut, *calib, "--threads", threads, "-q")
        assert r.exit_code == 0, r.output
        digests.append(_digest(out))
    assert digests[0] == digests[1] == digests[2]
