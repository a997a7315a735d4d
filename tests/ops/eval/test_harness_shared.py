"""Shared-context scoring (ops/tasks/layout.py, ops/scoring.py): the choices of an item run behind
one copy of their context, each choice with its own positions and seeing the context and itself
only. Every request scores as it does run alone (the per-sequence path, and the harness's own
``hf`` model): the same log-likelihood to float32 rounding (1e-5 relative; the differences seen
are ~1e-7) and the same greedy flag, for learned positions (GPT-2, sparsetool's GPT), rotary
embeddings (Llama, Qwen3), sliding-window attention (Mistral, Gemma-3 mixing sliding and full
blocks) and mixtures of experts (Qwen3-MoE, Mixtral), with fused (sdpa) and eager attention.
Small random models and a tokenizer trained here."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import transformers as t  # noqa: E402  (after the offline switches above)
from lm_eval.api.instance import Instance  # noqa: E402
from moe_models import build  # noqa: E402

from sparsetool.models.open import open_model  # noqa: E402
from sparsetool.ops.prune import PruneOptions, prune_checkpoint  # noqa: E402
from sparsetool.ops.scoring import score_layout, score_requests  # noqa: E402
from sparsetool.ops.tasks.layout import layout_requests  # noqa: E402
from sparsetool.ops.tasks.model import SparsetoolLM  # noqa: E402

from helpers import hf_model, make_text, save_tokenizer, tiny_causal_lm  # noqa: E402

WINDOW = 64  # every model here: 64 positions
REL = 1e-5  # float32: a packed row sums its attention in another order than a row alone

COMMON = dict(
    num_hidden_layers=2,
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    max_position_embeddings=WINDOW,
    bos_token_id=1,
    eos_token_id=1,
)
MODELS = {
    "gpt2": lambda: hf_model("gpt2"),  # learned positions; its blocks take the mask by position
    "llama": lambda: hf_model("llama"),
    "qwen3": lambda: t.Qwen3ForCausalLM(t.Qwen3Config(head_dim=8, **COMMON)),
    "mistral": lambda: tiny_causal_lm("mistral"),  # a 16-token sliding window
    "gemma3": lambda: t.Gemma3ForCausalLM(
        t.Gemma3TextConfig(
            head_dim=8,
            sliding_window=6,
            layer_types=["sliding_attention", "full_attention"],
            **COMMON,
        )
    ),
    "qwen3_moe": lambda: build("qwen3_moe"),
    "mixtral": lambda: build("mixtral"),
}


@pytest.fixture(scope="module")
def text() -> str:
    return make_text()


def save(kind: str, directory: Path, text: str) -> Path:
    torch.manual_seed(0)
    MODELS[kind]().eval().save_pretrained(directory)
    save_tokenizer(directory, text)
    return directory


def items(seed: int = 0, vocab: int = 320, n: int = 8) -> list[tuple[list[int], list[int]]]:
    """Token pairs as multiple-choice items make them: four choices of 1 to 9 tokens behind each
    context of 3 to 70 tokens (longer than the window: cut from the left per choice), a choice
    twice, and an item whose choices have contexts of their own."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        ctx = [rng.randrange(2, vocab) for _ in range(rng.choice([3, 10, 30, 50, 70]))]
        for _ in range(4):
            cont = [rng.randrange(2, vocab) for _ in range(rng.choice([1, 1, 2, 5, 9]))]
            pairs.append((ctx, cont))
    pairs.append(pairs[1])
    pairs += [([rng.randrange(2, vocab) for _ in range(8 + k)], [7, 8]) for k in range(3)]
    return pairs


def assert_same(shared, alone):
    assert [g for _, g in shared] == [g for _, g in alone]
    assert [lp for lp, _ in shared] == pytest.approx([lp for lp, _ in alone], rel=REL, abs=REL)


def shared_and_alone(model, pairs, **kw):
    layout = layout_requests(pairs, WINDOW, share=True)
    assert any(s.positions is not None for s in layout.sequences)  # something was packed
    shared = score_layout(model, layout, len(pairs), **kw)
    assert layout.packed  # the model took the packed masks (no fall-back)
    return shared, score_requests(model, pairs, WINDOW, share=False)


# ----------------------------------------------------------------------------- equality
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_shared_context_scores_as_each_sequence_alone(kind, attention, text, tmp_path):
    """Under fused attention the model passes no mask where its own is plain causal; the packed
    one is made at the tokens' positions instead (and eager's is read at them)."""
    model = open_model(save(kind, tmp_path / kind, text), "float32", "cpu", attention=attention)
    assert model.module.config._attn_implementation == attention
    try:
        shared, alone = shared_and_alone(model, items())
    finally:
        model.close()
    assert_same(shared, alone)


def test_sparsetool_gpt_shared_context_scores_as_alone(tiny_run):
    model = open_model(tiny_run, "float32", "cpu")
    try:
        shared, alone = shared_and_alone(model, items(vocab=256))
    finally:
        model.close()
    assert_same(shared, alone)


@pytest.mark.parametrize("encoding", ["mask", "nan", "bitmask"])
def test_every_encoding_scores_shared_as_zeros_alone(encoding, text, tmp_path):
    dense = save("llama", tmp_path / "dense", text)
    out = {}
    for e in ("zeros", encoding):
        prune_checkpoint(dense, tmp_path / e, PruneOptions(sparsity=0.5, encoding=e))
    pairs = items(n=4)
    for e in ("zeros", encoding):
        model = open_model(tmp_path / e, "float32", "cpu")
        try:
            out[e] = score_requests(model, pairs, WINDOW, share=e == encoding)
        finally:
            model.close()
    assert_same(out[encoding], out["zeros"])


def test_batched_and_in_small_passes_the_scores_stay(text, tmp_path):
    """Packed inputs of equal length share a forward call; a memory plan holding two inputs
    splits the work into passes: the same scores."""
    model = open_model(save("llama", tmp_path / "m", text), "float32", "cpu")
    pairs = items(seed=1)
    try:
        whole = score_requests(model, pairs, WINDOW, share=True)
        passes = score_requests(model, pairs, WINDOW, batch=3, held=3, share=True)
    finally:
        model.close()
    assert_same(passes, whole)


# ----------------------------------------------------------------------------- the layout
def test_choices_run_behind_one_copy_of_their_context():
    ctx = list(range(2, 22))
    pairs = [(ctx, [30]), (ctx, [31]), (ctx, [40, 41, 42]), (ctx, [50, 51]), (ctx, [50, 51])]
    layout = layout_requests(pairs, WINDOW)
    [seq] = layout.sequences
    assert seq.ids == tuple(ctx) + (40, 41, 50)  # one-token choices need no token of their own
    assert seq.positions == tuple(range(20)) + (20, 21, 20)
    assert seq.segments == (0,) * 20 + (1, 1, 2)
    rows = {r: rows for r, _, rows in seq.wants}
    assert rows == {0: [19], 1: [19], 2: [19, 20, 21], 3: [19, 22], 4: [19, 22]}
    # without sharing: the harness hf model's inputs, equal ones once
    plain = layout_requests(pairs, WINDOW, share=False).sequences
    assert [len(s.ids) for s in plain] == [20, 22, 21]


def test_choices_that_share_no_context_run_as_plain_inputs():
    pairs = [([2, 3, 4], [5, 6]), ([2, 3, 9], [5, 6]), ([7], [8])]
    layout = layout_requests(pairs, WINDOW)
    assert [s.ids for s in layout.sequences] == [(2, 3, 4, 5), (2, 3, 9, 5), (7,)]
    assert all(s.positions is None for s in layout.sequences)


def test_a_full_pack_continues_behind_another_copy_of_the_context():
    ctx = list(range(2, 42))  # 40 tokens, then choices of 10 tokens in the model: 2 per copy
    pairs = [(ctx, list(range(100 + 11 * k, 111 + 11 * k))) for k in range(5)]
    layout = layout_requests(pairs, WINDOW)
    assert [len(s.ids) for s in layout.sequences] == [60, 60, 50]
    assert all(len(s.ids) <= WINDOW for s in layout.sequences)


def test_an_empty_continuation_scores_zero_and_greedy_without_a_run(text, tmp_path):
    model = open_model(save("llama", tmp_path / "m", text), "float32", "cpu")
    try:
        got = score_requests(model, [([2, 3], []), ([2, 3], [4])], WINDOW, share=True)
        alone = score_requests(model, [([2, 3], [4])], WINDOW)
    finally:
        model.close()
    assert got[0] == (0.0, True) and got[1] == alone[0]


# ----------------------------------------------------------------------------- the harness's hf
def instances(pairs_text: list[tuple[str, str]], task: str = "pick") -> list[Instance]:
    return [
        Instance("loglikelihood", {}, (c, x), i, (task, i // 2, 1))
        for i, (c, x) in enumerate(pairs_text)
    ]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_loglikelihoods_equal_the_harness_hf_model(kind, text, tmp_path):
    """Request by request against lm-eval's hf model: items of two choices, one context cut to
    the window, one with an empty context (the prefix token)."""
    from lm_eval.models.huggingface import HFLM

    directory = save(kind, tmp_path / kind, text)
    lines = text.splitlines()
    long = " ".join(lines[:40])  # far beyond 64 tokens
    base = [(" ".join(ln.split()[:3]), " " + " ".join(ln.split()[3:])) for ln in lines[:6]]
    texts = [p for k in range(6) for p in (base[k], (base[k][0], base[(k + 1) % 6][1]))]
    texts += [(long, " the model"), (long, " a mask"), ("", "the model"), ("", "a mask")]
    hf = HFLM(pretrained=str(directory), dtype="float32", attn_implementation="eager", device="cpu")
    theirs = hf.loglikelihood(instances(texts), disable_tqdm=True)
    model = open_model(directory, "float32", "cpu")
    try:
        lm = SparsetoolLM(model, hf.tokenizer, hf.max_length, warn=lambda m: None)
        ours = lm.loglikelihood(instances(texts))
        assert lm.warnings == [
            "task pick (1 document): 2 requests longer than the model's context (64 tokens): "
            "their context cut from the left, as the harness's hf model does"
        ]
    finally:
        model.close()
    assert_same(ours, theirs)


def test_rolling_loglikelihood_equals_the_harness_hf_model(text, tmp_path):
    """Rolling windows (a wikitext-like task) share no context: unchanged, as the hf model."""
    from lm_eval.models.huggingface import HFLM

    directory = save("llama", tmp_path / "m", text)
    docs = ["\n".join(text.splitlines()[:30]), "the model", text.splitlines()[40]]
    reqs = [Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(docs)]
    hf = HFLM(pretrained=str(directory), dtype="float32", attn_implementation="eager", device="cpu")
    theirs = hf.loglikelihood_rolling(reqs, disable_tqdm=True)
    model = open_model(directory, "float32", "cpu")
    try:
        ours = SparsetoolLM(model, hf.tokenizer, hf.max_length).loglikelihood_rolling(reqs)
    finally:
        model.close()
    assert ours == pytest.approx(theirs, rel=REL)


def test_a_continuation_longer_than_the_context_is_cut_and_said_once(text, tmp_path):
    """Scored on its last 64 tokens (as the hf model scores that continuation), one warning
    naming the tasks and how many documents."""
    directory = save("llama", tmp_path / "m", text)
    tok = t.AutoTokenizer.from_pretrained(directory)
    words = text.split()
    longer = " " + " ".join(words[:120])
    reqs = [
        Instance("loglikelihood", {}, ("the model", longer), 0, ("pick", 0, 1)),
        Instance("loglikelihood", {}, ("a mask", longer), 1, ("pick", 1, 1)),
        Instance("loglikelihood", {}, ("a mask", " the"), 2, ("pick", 1, 1)),
        Instance("loglikelihood", {}, ("the layer", longer), 3, ("other", 0, 1)),
    ]
    said: list[str] = []
    model = open_model(directory, "float32", "cpu")
    try:
        lm = SparsetoolLM(model, tok, WINDOW, warn=said.append)
        got = lm.loglikelihood(reqs)
        ids = lm.tok_encode("the model" + longer)
        cont = ids[-WINDOW:]  # the last 64 tokens, behind the token before them
        want = score_requests(model, [(ids[:-WINDOW], cont)], WINDOW)[0]
    finally:
        model.close()
    assert len(ids) > WINDOW + 1
    assert (
        said
        == lm.warnings
        == [
            "task pick (2 documents), other (1 document): 3 requests whose continuation is longer "
            "than the model's context (64 tokens): each scored on its last 64 tokens"
        ]
    )
    assert got[0][0] == pytest.approx(want[0], rel=REL)
