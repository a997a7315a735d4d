"""A causal LM whose LM head is its token embedding (tie_word_embeddings): the shared matrix is
never pruned by default, report names it as the head too, eval computes the logits with the
(pruned) stored matrix as transformers does, and --include that reaches it warns; an --include
of the head's usual name explains that it has no tensor of its own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file

from sparsetool.errors import ConfigError
from sparsetool.ops.eval import evaluate, windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint
from sparsetool.targets import plan_targets, tied_embedding

from helpers import hf_model, make_text, run, save_tokenizer

os.environ["HF_HUB_OFFLINE"] = "1"

EMBED = "model.embed_tokens.weight"


@pytest.fixture(scope="module")
def text() -> str:
    return make_text(300)


def _save(kind: str, directory: Path, text: str) -> Path:
    torch.manual_seed(0)
    hf_model(kind).eval().save_pretrained(directory)
    save_tokenizer(directory, text)
    return directory


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory, text) -> Path:
    return _save("llama-tied", tmp_path_factory.mktemp("tied") / "dense", text)


@pytest.fixture(scope="module")
def untied_dir(tmp_path_factory, text) -> Path:
    return _save("llama", tmp_path_factory.mktemp("untied") / "dense", text)


def test_the_tied_embedding_is_found_only_when_the_config_ties_it_and_no_head_is_stored():
    shapes = {
        EMBED: (320, 32),
        "model.layers.0.mlp.up_proj.weight": (64, 32),
        "model.norm.weight": (32,),
    }
    roles = {
        EMBED: "embedding",
        "model.layers.0.mlp.up_proj.weight": "ffn_in",
        "model.norm.weight": "norm",
    }
    assert tied_embedding(shapes, roles, {"tie_word_embeddings": True, "vocab_size": 320}) == EMBED
    assert tied_embedding(shapes, roles, {"vocab_size": 320}) == EMBED  # absent means tied
    assert tied_embedding(shapes, roles, {"text_config": {"tie_word_embeddings": True}}) == EMBED
    assert tied_embedding(shapes, roles, {"tie_word_embeddings": False}) is None
    assert tied_embedding(shapes, roles, None) is None  # a lone file: nothing is claimed
    assert tied_embedding(shapes, roles, {"vocab_size": 999}) is None  # not the vocabulary's matrix
    assert (
        tied_embedding(shapes, roles, {"architectures": ["LlamaModel"]}) is None
    )  # no head at all
    assert tied_embedding(shapes, roles, {"architectures": ["GPT2LMHeadModel"]}) == EMBED
    with_head = {**shapes, "lm_head.weight": (320, 32)}
    assert (
        tied_embedding(with_head, {**roles, "lm_head.weight": "head"}, {"vocab_size": 320}) is None
    )
    plan = plan_targets({k: (v, "F32") for k, v in shapes.items()}, {"tie_word_embeddings": True})
    assert plan.tied_head == EMBED and not plan.is_targeted(EMBED)


def test_default_prune_leaves_the_shared_matrix_alone(tied_dir, tmp_path):
    out = tmp_path / "p"
    res = prune_checkpoint(tied_dir, out, PruneOptions(sparsity=0.5))
    assert EMBED not in {t.name for t in res.tensors} and res.warnings == []
    dense, pruned = (
        load_file(str(tied_dir / "model.safetensors")),
        load_file(str(out / "model.safetensors")),
    )
    assert np.array_equal(dense[EMBED], pruned[EMBED]) and "lm_head.weight" not in pruned


def reference_nll(directory: Path, text: str, seq: int, max_tokens: int) -> float:
    """transformers' loss on the same windows (it ties the head to the stored embedding)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor(
        transformers.AutoTokenizer.from_pretrained(directory)(text)["input_ids"][:max_tokens]
    )
    total, n = 0.0, 0
    with torch.no_grad():
        for w in windows(len(ids), seq):
            x = ids[w.start : w.end][None]
            total += float(model(x, labels=x).loss) * w.scored
            n += w.scored
    return total / n


def test_including_the_tied_embedding_warns_and_eval_uses_the_pruned_matrix(
    tied_dir, tmp_path, text
):
    out = tmp_path / "emb"
    res = prune_checkpoint(tied_dir, out, PruneOptions(sparsity=0.5, include=(EMBED,)))
    assert EMBED in {t.name for t in res.tensors}
    assert [w for w in res.warnings if "also the LM head" in w and EMBED in w] == res.warnings != []
    emb = load_file(str(out / "model.safetensors"))[EMBED]
    assert np.count_nonzero(emb == 0) == emb.size // 2
    blocks = tmp_path / "blocks"
    prune_checkpoint(tied_dir, blocks, PruneOptions(sparsity=0.5))
    rows = evaluate([blocks, out], text=text, seq=32, max_tokens=400).rows
    assert rows[1].nll == pytest.approx(reference_nll(out, text, 32, 400), abs=1e-4)
    assert rows[1].nll != pytest.approx(rows[0].nll, abs=1e-4)  # the pruned head counts


def test_an_untied_embedding_prunes_without_the_warning(untied_dir, tmp_path):
    res = prune_checkpoint(untied_dir, tmp_path / "p", PruneOptions(sparsity=0.5, include=(EMBED,)))
    assert EMBED in {t.name for t in res.tensors} and res.warnings == []


def test_including_the_head_of_a_tied_model_names_the_shared_tensor(tied_dir, untied_dir, tmp_path):
    with pytest.raises(ConfigError, match=rf"ties it to {EMBED}.*--include '{EMBED}'"):
        prune_checkpoint(
            tied_dir, tmp_path / "p", PruneOptions(sparsity=0.5, include=("lm_head.*",))
        )
    with pytest.raises(ConfigError, match="matches no tensor") as e:
        prune_checkpoint(
            tied_dir, tmp_path / "p", PruneOptions(sparsity=0.5, include=("lm_hed.*",))
        )
    assert "ties" not in str(e.value)  # a typo is not explained by the tie
    untied = prune_checkpoint(
        untied_dir, tmp_path / "q", PruneOptions(sparsity=0.5, include=("lm_head.*",))
    )
    assert "lm_head.weight" in {t.name for t in untied.tensors}


def test_report_shows_the_embedding_as_the_head_too(tied_dir, untied_dir):
    table = run("report", str(tied_dir))
    assert table.exit_code == 0, table.output
    line = next(row for row in table.output.splitlines() if row.startswith(EMBED))
    assert "embedding + tied head" in line
    data = json.loads(run("report", str(tied_dir), "--json").output)
    assert data["summary"]["targeting"]["tied_head"] == EMBED
    untied = run("report", str(untied_dir)).output
    assert "tied head" not in untied
    assert (
        json.loads(run("report", str(untied_dir), "--json").output)["summary"]["targeting"][
            "tied_head"
        ]
        is None
    )
