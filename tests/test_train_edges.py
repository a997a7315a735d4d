"""train's edge cases: each is refused with the reason (the run could not be what was asked) or
warned about with the reason (the run is legal but probably not what was meant)."""

from __future__ import annotations

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
