"""train's edge cases: each is refused with the reason (the run could not be what was asked) or
warned about with the reason (the run is legal but probably not what was meant)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from sparsetool.cli.main import app
from sparsetool.train.config import merge
from test_train import make_corpus


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def train(out: Path, data: Path | str, *extra: str):
    return CliRunner().invoke(app, ["train", "-o", str(out), "--data", str(data), "--steps", "2",
                                    "--batch-size", "2", "--warmup", "1", "--eval-every", "0",
                                    "--json", *extra])


# --- --warmup >= --steps: a warning, with the reason; the run goes on ----------------------------

@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_a_warm_up_as_long_as_the_run_is_warned_about(tmp_path, corpus, flag):
    r = CliRunner().invoke(app, ["train", "-o", str(tmp_path / "run"), "--data", str(corpus),
                                 "--preset", "tiny", "--steps", "2", "--warmup", "5",
                                 "--batch-size", "2", "--eval-every", "0", flag])
    assert r.exit_code == 0, r.output
    assert r.stderr == ("warning: --warmup 5 >= --steps 2: the whole run is warm-up, so the learning "
                        "rate ends at 40% of --lr and never decays; give a --warmup below --steps\n")


def test_the_warm_up_caveat_is_there_for_library_callers_too(tmp_path):
    from sparsetool.train.config import caveats

    cfg = merge({}, {"out": str(tmp_path / "r"), "steps": 50})  # the default warm-up is 100 steps
    assert caveats(cfg) == ["--warmup 100 >= --steps 50: the whole run is warm-up, so the learning "
                            "rate ends at 50% of --lr and never decays; give a --warmup below --steps"]
    cfg = merge({}, {"out": str(tmp_path / "r"), "steps": 10, "warmup": 10})
    assert "reaches --lr only at the last step and never decays" in caveats(cfg)[0]
    assert caveats(merge({}, {"out": str(tmp_path / "r"), "steps": 11, "warmup": 10})) == []


# --- --init CHECKPOINT: the shape comes from the checkpoint, --preset included -------------------

@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("pre") / "run"
    r = train(out, corpus, "--preset", "tiny")
    assert r.exit_code == 0, r.output
    return out / "model.safetensors"


def test_init_refuses_a_preset_of_another_shape_like_a_width(tmp_path, corpus, tiny_checkpoint):
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--preset", "mini")
    assert r.exit_code == 1
    assert r.stderr == (f"error: --preset mini disagrees with --init {tiny_checkpoint} (n_layer 2, "
                        "n_head 2, d_model 32, context 64; mini has 4, 4, 128, 128); the model's "
                        "shape comes from the checkpoint\n")
    assert not (tmp_path / "ft").exists()
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--d-model", "64")
    assert r.exit_code == 1 and r.stderr.startswith("error: --d-model 64 disagrees with --init ")


def test_init_accepts_the_preset_the_checkpoint_has(tmp_path, corpus, tiny_checkpoint):
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--preset", "tiny")
    assert r.exit_code == 0, r.output
    stored = json.loads((tmp_path / "ft" / "run.json").read_text())["config"]
    assert stored["preset"] == "tiny"


def test_without_init_the_preset_defaults_to_mini_and_with_init_to_none(tmp_path):
    assert merge({}, {"out": str(tmp_path / "r")}).preset == "mini"
    assert merge({}, {"out": str(tmp_path / "r"), "init": "x.safetensors"}).preset is None
