"""Text generation (``generate_until``) by sparsetool's harness model: greedy, the harness's stop
sequences and ``max_gen_toks``, the whole model resident; the same texts as lm-eval's own ``hf``
model on a small random model with a tokenizer trained here, and one refusal line where the
memory would not hold the model."""

from __future__ import annotations

import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from lm_eval.api.instance import Instance  # noqa: E402

from sparsetool.errors import SparsetoolError  # noqa: E402
from sparsetool.models.open import open_model  # noqa: E402
from sparsetool.ops.tasks.model import SparsetoolLM  # noqa: E402

from helpers import hf_model, make_text, save_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gen") / "llama"
    torch.manual_seed(0)
    hf_model("llama").eval().save_pretrained(d)
    save_tokenizer(d, make_text())
    return d


def requests(text: str) -> list[Instance]:
    lines = text.splitlines()
    settings = [
        {"until": ["\n"], "max_gen_toks": 12, "do_sample": False},
        {"until": [" the", "."], "max_gen_toks": 20},
        {"max_gen_toks": 5},
        {"until": "mask", "max_gen_toks": 30, "temperature": 0.0},
    ]
    return [
        Instance("generate_until", {}, (" ".join(lines[k].split()[:4]), settings[k % 4]), k)
        for k in range(8)
    ] + [Instance("generate_until", {}, (" ".join(lines[:30]), settings[0]), 8)]


def test_generated_texts_equal_the_harness_hf_model(llama_dir):
    from lm_eval.models.huggingface import HFLM

    reqs = requests(make_text())
    hf = HFLM(pretrained=str(llama_dir), dtype="float32", device="cpu")
    theirs = hf.generate_until(reqs, disable_tqdm=True)
    model = open_model(llama_dir, "float32", "cpu")
    try:
        ours = SparsetoolLM(model, hf.tokenizer, hf.max_length).generate_until(reqs)
        assert not model._loaded  # the weights are dropped afterwards
    finally:
        model.close()
    assert ours == theirs
    assert len({len(t) for t in ours}) > 1  # stopped at different places


def test_generation_that_the_memory_cannot_hold_is_refused_in_one_line(llama_dir):
    model = open_model(llama_dir, "float32", "cpu")
    try:
        lm = SparsetoolLM(model, None, 64, max_memory=1 << 20)
        with pytest.raises(SparsetoolError) as e:
            lm.generate_until(requests(make_text())[:1])
    finally:
        model.close()
    message = str(e.value)
    assert "\n" not in message and "needs the whole model resident" in message
    assert "more than the 1.00 MiB of --max-memory" in message


def test_sparsetool_gpt_generates_greedily_until_a_stop(tiny_run):
    model = open_model(tiny_run, "float32", "cpu")
    try:
        lm = SparsetoolLM(model, None, model.context)
        reqs = [
            Instance("generate_until", {}, ("the sparse model", {"max_gen_toks": 6}), 0),
            Instance("generate_until", {}, ("the sparse model", {"max_gen_toks": 6}), 1),
        ]
        first, second = lm.generate_until(reqs)
        with torch.inference_mode():  # greedy by hand: the argmax, one byte at a time
            model.load_head()
            model.load([n for block in model.blocks for n in block])
            x = torch.tensor([list(b"the sparse model")])
            for _ in range(6):
                x = torch.cat([x, model.module(x)[0][:, -1:].argmax(-1)], dim=1)
    finally:
        model.close()
    want = bytes(x[0, 16:].tolist()).decode("utf-8", errors="replace").split("\n")[0]
    assert first == second == want


def test_the_key_value_cache_is_sized_by_the_key_value_heads(llama_dir):
    """Grouped-query attention (the test Llama: 4 heads, 2 of keys and values) keeps fewer
    numbers per token than the model's width: the cache generation plans for is sized by the
    key/value heads."""
    model = open_model(llama_dir, "float32", "cpu")
    try:
        cfg = model.module.config
        assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (4, 2)
        assert model.kv_width == 2 * (cfg.hidden_size // 4) == model.width // 2
    finally:
        model.close()
