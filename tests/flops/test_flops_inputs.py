"""`sparsetool flops`: every input gets a clear answer, one rule for defaults, numbers for
people."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from sparsetool.errors import ConfigError
from sparsetool.flops.modelconfig import ModelConfig
from sparsetool.flops.modelfile import from_mapping, load_config

from helpers import runner_for

run = runner_for("flops", columns=200)


def test_finetune_seq_len_without_finetune_tokens_is_refused():
    r = run("-m", "gpt2-small", "-s", "0.5", "--finetune-seq-len", "512")
    assert r.exit_code == 2 and r.stdout == ""
    assert "--finetune-seq-len 512" in r.stderr and "--finetune-tokens" in r.stderr


def test_a_budget_under_one_sequence_is_warned_about_and_printed_with_units():
    r = run("-m", "gpt2-small", "-s", "0,0.5", "--tokens", "1K")
    assert r.exit_code == 0, r.output
    assert "warning: --tokens 1,000 is less than one sequence of 2,048 tokens" in r.stderr
    assert "970.34 GFLOP" in r.stdout  # the whole 1K-token run, not "0.00" exaFLOPs
    assert " 0.00 " not in r.stdout
    d = json.loads(run("-m", "gpt2-small", "-s", "0.5", "--tokens", "1K", "--json").stdout)
    assert len(d["warnings"]) == 1 and "less than one sequence" in d["warnings"][0]
    assert json.loads(run("-m", "gpt2-small", "-s", "0.5", "--json").stdout)["warnings"] == []


def test_a_huge_budget_prints_short_numbers():
    r = run("-m", "gpt2-small", "-s", "0,0.5", "--tokens", "1e30")
    assert r.exit_code == 0, r.output
    assert "e+18T" not in r.stdout and "1e+30 training tokens" in r.stdout
    table = [line for line in r.stdout.splitlines() if line.strip().startswith(("0.0%", "50.0%"))]
    assert table and all(len(cell) <= 14 for line in table for cell in line.split("  ") if cell)
    assert "9.703e+38 FLOP" in r.stdout


@pytest.mark.parametrize("value", ["0", "-5B", "-1"])
def test_zero_and_negative_token_budgets_get_the_same_answer(value):
    r = run("-m", "gpt2-small", "--tokens", value)
    assert r.exit_code == 2
    assert f"--tokens {value}: give a positive number of tokens" in r.stderr


def test_stage_with_sparsity_names_only_what_was_given():
    r = run("-m", "gpt2-small", "-s", "0.5", "--stage", "0.9:1")
    assert r.exit_code == 2
    assert "--stage replaces --sparsity" in r.stderr and "drop --sparsity 0.5" in r.stderr
    assert "--checkpoint" not in r.stderr


def test_own_and_hugging_face_names_follow_one_rule_for_defaults(tmp_path):
    own = tmp_path / "own.toml"
    own.write_text("n_layers = 12\nd_model = 768\nn_heads = 12\nvocab = 50257\n")
    hf = tmp_path / "hf.json"
    hf.write_text(
        json.dumps(
            {
                "num_hidden_layers": 12,
                "hidden_size": 768,
                "num_attention_heads": 12,
                "vocab_size": 50257,
            }
        )
    )
    a, b = load_config(own), load_config(hf)
    assert (a.d_ff, a.d_head, a.seq_len) == (3072, 64, 2048)
    assert (b.d_ff, b.d_head, b.seq_len) == (3072, 64, 2048)
    r = run("--config", str(own), "-s", "0.5")
    assert r.exit_code == 0, r.output


def test_hugging_face_names_are_accepted_in_our_own_files(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text("n_layer = 2\nd_model = 64\nn_head = 4\nvocab_size = 100\nseq_len = 32\n")
    c = load_config(p)
    assert (c.n_layers, c.n_heads, c.vocab, c.d_ff) == (2, 4, 100, 256)
    with pytest.raises(ConfigError) as e:
        from_mapping({"n_layers": 2, "d_model": 8, "n_heads": 2, "vocab": 10, "layers": 3})
    # every name the message offers is one the reader takes
    assert "unknown key(s) layers" in str(
        e.value
    ) and "n_layers (num_hidden_layers / n_layer" in str(e.value)
    with pytest.raises(
        ConfigError, match="n_layers twice with different values: n_layers = 2, n_layer = 3"
    ):
        from_mapping({"n_layers": 2, "n_layer": 3, "d_model": 8, "n_heads": 2, "vocab": 10})


def test_the_field_table_covers_every_model_field():
    from sparsetool.flops.modelfile import FIELD_NAMES

    assert set(FIELD_NAMES) == {f.name for f in fields(ModelConfig) if f.compare}
