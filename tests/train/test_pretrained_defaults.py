"""The defaults of a pretrained student (``train --init HF_DIR``): a lower --lr, a smaller batch
and a warm-up of a tenth of the steps where neither a flag nor the config file gives them; the
built-in GPT keeps its own; the run says which applied and when its steps read the text many
times over."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparsetool.train.configkeys import merge, merge_explained
from sparsetool.train.trainconfig import (
    DEFAULTS,
    PRETRAINED_DEFAULTS,
    passes_note,
    pretrained_defaults,
)

from helpers import run

os.environ["HF_HUB_OFFLINE"] = "1"


def hf_dir(tmp_path: Path, model_type: str = "llama") -> Path:
    """A directory that reads as a Hugging Face model to the settings (only its config.json)."""
    path = tmp_path / model_type
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type}))
    return path


def test_an_hf_student_takes_the_pretrained_defaults(tmp_path):
    cfg, applied = merge_explained({}, {"out": "r", "init": str(hf_dir(tmp_path)), "steps": 30})
    assert (cfg.lr, cfg.batch_size, cfg.warmup) == (
        PRETRAINED_DEFAULTS["lr"],
        PRETRAINED_DEFAULTS["batch_size"],
        3,
    )
    assert applied == {**PRETRAINED_DEFAULTS, "warmup": 3}
    assert cfg.lr < DEFAULTS["lr"] and cfg.batch_size < DEFAULTS["batch_size"]
    # without --steps: a tenth of the default 1000
    assert merge({}, {"out": "r", "init": str(hf_dir(tmp_path / "b"))}).warmup == 100


def test_a_flag_or_the_config_file_wins_over_them(tmp_path):
    init = str(hf_dir(tmp_path))
    cfg, applied = merge_explained(
        {"lr": "1e-3", "warmup": 0}, {"out": "r", "init": init, "batch_size": 16, "steps": 30}
    )
    assert (cfg.lr, cfg.batch_size, cfg.warmup) == (1e-3, 16, 0)
    assert applied == {}


@pytest.mark.parametrize("init", [None, "gpt", "file"])
def test_the_built_in_gpt_keeps_its_defaults(tmp_path, init):
    path = {
        None: None,
        "gpt": str(hf_dir(tmp_path, "sparsetool-gpt")),  # a run's directory of our GPT
        "file": str(tmp_path / "model.safetensors"),
    }[init]
    values = {"out": "r", "steps": 30, "init": path}
    assert pretrained_defaults(values) == {}
    if init != "file":  # the file does not exist; merge only checks settings
        cfg = merge({}, values)
        assert (cfg.lr, cfg.batch_size, cfg.warmup) == (1e-3, 16, 100)


def test_passes_are_noted_above_four():
    assert passes_note(4, 10_000, 10_000) is None
    note = passes_note(2000, 16 * 256, 40_000)
    assert note is not None and "about 205 times over" in note
    assert "bytes" in (passes_note(300, 16 * 64, 10_000, "bytes") or "")
    assert passes_note(10, 10, 0) is None


def test_the_run_says_which_defaults_applied_and_how_many_passes(tmp_path):
    import torch

    from helpers import hf_model, make_text, save_tokenizer

    text = make_text(100)
    (tmp_path / "data.txt").write_text(text)
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(tmp_path / "llama")
    save_tokenizer(tmp_path / "llama", text)
    common = ["--data", tmp_path / "data.txt", "--context", "16", "--eval-every", "0"]
    r = run("train", "-o", tmp_path / "a", "--init", tmp_path / "llama", "--steps", "2", *common)
    assert r.exit_code == 0, r.output
    assert (
        "note: --init HF_DIR (a pretrained model): --lr 0.0002, --batch-size 4, --warmup 0 (10% "
        "of --steps) by default" in r.output
    )
    saved = json.loads((tmp_path / "a" / "run.json").read_text())["config"]
    assert (saved["lr"], saved["batch_size"], saved["warmup"]) == (2e-4, 4, 0)
    r = run(
        "train",
        *("-o", tmp_path / "b", "--init", tmp_path / "llama", "--steps", "60", "--lr", "1e-3"),
        *("--batch-size", "8", "--warmup", "1", *common),
    )
    assert r.exit_code == 0, r.output
    assert "note: --init HF_DIR" not in r.output  # every one of them was given
    assert "times over; a model learns such a text by heart" in r.output
