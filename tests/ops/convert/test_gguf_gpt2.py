"""A second architecture through GGUF: a small random GPT-2 (Conv1D layout, fused q/k/v, biases,
LayerNorm, a tied head) written as a Q4_1 GGUF file, read back by transformers, converted to a
Hugging Face directory as the real SmolLM2 is, then reported, pruned (magnitude, N:M along the
input, Wanda, SparseGPT) and evaluated by sparsetool."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from gguf_models import convert_gguf, write_gpt2_gguf
from safetensors.numpy import load_file

from sparsetool.ops.eval import evaluate, windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint
from sparsetool.ops.report import summarize

from helpers import CALIB, make_text, save_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory) -> tuple[Path, Path]:
    """(the folder holding tiny.gguf, its conversion to a Hugging Face directory)."""
    root = tmp_path_factory.mktemp("gguf")
    save_tokenizer(root / "tok", make_text(400))
    vocab = len(json.loads((root / "tok" / "tokenizer.json").read_text())["model"]["vocab"])
    torch.manual_seed(0)
    # n_positions 1024: transformers reads GPT-2's context_length as n_ctx only, so a file of
    # another position count fails to load (its position embedding does not fit the default)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            n_layer=2,
            n_embd=64,
            n_head=4,
            vocab_size=vocab,
            n_positions=1024,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).eval()
    write_gpt2_gguf(model, root / "tok", root / "tiny.gguf", "Q4_1")
    return root, convert_gguf(root / "tiny.gguf", root / "hf")


def test_the_conversion_is_the_gguf_model_and_keeps_its_4_bit_groups(gguf_dir):
    root, hf = gguf_dir
    rep = summarize(hf)
    assert rep.targeting["tied_head"] == "transformer.wte.weight"
    targeted = [t.name for t in rep.tensors if t.targeted]
    assert len(targeted) == 8 and all("transformer.h." in n for n in targeted)
    w = load_file(str(hf / "model.safetensors"))[
        "transformer.h.0.mlp.c_fc.weight"
    ]  # Conv1D (in, out)
    groups = np.abs(w.T.reshape(-1, 32))  # the file's groups of 32 run along the input
    assert max(np.unique(g).size for g in groups) <= 16
    text = make_text(200, 3)
    ids = torch.tensor(transformers.AutoTokenizer.from_pretrained(hf)(text)["input_ids"][:300])
    gguf_model = transformers.AutoModelForCausalLM.from_pretrained(
        root, gguf_file="tiny.gguf"
    ).eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for win in windows(len(ids), 32):
            x = ids[win.start : win.end][None]
            total += float(gguf_model(x, labels=x).loss) * win.scored
            n += win.scored
    row = evaluate([hf], text=text, seq=32, max_tokens=300).rows[0]
    assert row.nll == pytest.approx(total / n, abs=1e-4)


@pytest.mark.parametrize(
    "method,nm",
    [
        ("magnitude", None),
        ("magnitude", (2, 4)),
        ("wanda", None),
        ("sparsegpt", None),
        ("wanda", (2, 4)),
    ],
)
def test_every_method_prunes_and_evaluates_the_converted_gpt2(gguf_dir, tmp_path, method, nm):
    _, hf = gguf_dir
    calib = tmp_path / "calib.txt"
    calib.write_text(make_text(400, 1))
    extra = {} if method == "magnitude" else dict(calibration=str(calib), **CALIB)
    opts = PruneOptions(sparsity=None if nm else 0.5, nm=nm, method=method, **extra)
    res = prune_checkpoint(hf, tmp_path / "out", opts)
    assert res.targeted_sparsity == pytest.approx(0.5, abs=1e-3) and res.warnings == []
    out = load_file(str(tmp_path / "out" / "model.safetensors"))
    if nm:  # 2 of every 4 along the input: dim 0 of a Conv1D weight
        w = out["transformer.h.1.mlp.c_fc.weight"]
        assert ((w.reshape(-1, 4, w.shape[1]) != 0).sum(1) <= 2).all()
    rows = evaluate([hf, tmp_path / "out"], text=make_text(200, 2), seq=32, max_tokens=300).rows
    assert np.isfinite(rows[1].nll) and rows[1].targeted_sparsity == pytest.approx(0.5, abs=1e-3)
