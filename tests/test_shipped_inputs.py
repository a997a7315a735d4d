"""The inputs the clone ships, so that every docs example runs from it (issue 31, item 12): a small
Hugging Face model with a tokenizer and a text it was not trained on (fixtures/), the example
tasks (examples/tasks/), and examples/tiny_llama.py making the text it needs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from helpers import ROOT, run

LM = ROOT / "fixtures" / "tiny-lm"
HELDOUT = ROOT / "fixtures" / "heldout.txt"


def _module(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_small_model_is_small_and_has_a_tokenizer_of_one_token_per_byte():
    from tokenizers import Tokenizer

    assert sum(p.stat().st_size for p in LM.iterdir()) < 1_000_000
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in LM.iterdir()
    }
    text = "Sparse héllo\n"
    assert Tokenizer.from_file(str(LM / "tokenizer.json")).encode(text).ids == list(text.encode())
    made = _module(ROOT / "fixtures" / "make_tiny_lm.py").tokenizer()  # the script's, unsaved
    assert made(text).input_ids == list(text.encode())
    assert json.loads((LM / "config.json").read_text())["vocab_size"] == 257


def test_eval_and_calibration_pruning_run_on_it(tmp_path):
    wanda = tmp_path / "lm-wanda-50"
    r = run(
        "prune",
        LM,
        "-o",
        wanda,
        "--sparsity",
        "0.5",
        "--method",
        "wanda",
        "--calibration",
        HELDOUT,
        "--samples",
        "4",
        "-q",
    )
    assert r.exit_code == 0, r.output
    r = run("eval", LM, wanda, "--text", HELDOUT, "--max-tokens", "3000", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["checkpoints"]
    assert rows[0]["perplexity"] < 20  # trained: far below the 257 of a random guess
    assert rows[1]["targeted_sparsity"] == pytest.approx(0.5, abs=1e-3)


def test_the_example_tasks_run_from_the_clone(tmp_path, monkeypatch):
    tasks = ROOT / "examples" / "tasks"
    lines = (tasks / "items.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == _module(tasks / "make_items.py").items()  # regenerable
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)  # the YAML files name their data from the directory holding examples/
    r = run(
        "eval",
        "fixtures/tiny-lm",
        "--tasks",
        "pick_ending,line_nll",
        "--include-path",
        "examples/tasks",
        "--limit",
        "4",
        "--offline",
        "--json",
        "-q",
    )
    assert r.exit_code == 0, r.output
    assert "pick_ending" in r.stdout and "line_nll" in r.stdout


def test_tiny_llama_makes_the_text_it_needs(tmp_path):
    r = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "tiny_llama.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote topics.txt" in r.stderr
    assert (tmp_path / "topics.txt").stat().st_size > 100_000
    assert (tmp_path / "tiny-llama" / "tokenizer.json").exists()
