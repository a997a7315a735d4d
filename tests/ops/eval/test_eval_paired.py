"""eval of several checkpoints: the perplexity change to the first with its paired interval over
the windows (fixtures/tiny-lm, its 50%-pruned copy, the same checkpoint twice)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sparsetool.ops.eval import evaluate
from sparsetool.ops.paired import loss_ratio
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

import json_schemas as S
from helpers import run

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
LM, TEXT = FIXTURES / "tiny-lm", FIXTURES / "heldout.txt"


@pytest.fixture(scope="module")
def pruned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("p") / "lm-75"
    prune_checkpoint(LM, out, PruneOptions(sparsity=0.75))
    return out


def test_ratio_and_interval_come_from_the_windows(pruned):
    dense, p75, again = evaluate(
        [LM, pruned, LM], text=TEXT, seq=64, max_tokens=4000, device="cpu"
    ).rows
    assert len(dense.window_nll) == len(dense.window_tokens) == math.ceil(4000 / 64)
    assert sum(dense.window_nll) / dense.tokens == pytest.approx(dense.nll)
    assert dense.comparison is None
    c = p75.comparison
    assert c == loss_ratio(dense.window_nll, p75.window_nll, p75.window_tokens).to_json()
    assert c["estimate"] == pytest.approx(p75.perplexity / dense.perplexity)
    assert c["estimate"] - 1 == pytest.approx(p75.change)
    assert c["low"] < c["estimate"] < c["high"] and c["items"] == len(dense.window_nll)
    assert not c["inside_noise"]  # 75% by magnitude costs this model more than noise
    assert again.comparison == {
        "estimate": 1.0,
        "low": 1.0,
        "high": 1.0,
        "items": len(dense.window_nll),
        "inside_noise": True,
    }


def test_table_and_json(pruned):
    args = [LM, pruned, LM, "--text", TEXT, "--seq", "64", "--max-tokens", "4000", "-q"]
    r = run("eval", *args, columns=250)
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[-2:] == ["95%", "interval"]
    assert lines[4].split()[-5:] == ["+0.00%", "~", "+0.00%", "..", "+0.00%"]
    assert "~" not in lines[3]
    assert lines[-1].startswith(
        "95% interval: paired with the first checkpoint over the 63 windows"
    )
    r = run("eval", *args, "--json")
    data = json.loads(r.stdout)
    assert S.problems(data, S.EVAL) == []
    assert data["comparison"]["over"] == "windows" and data["checkpoints"][0]["comparison"] is None
    assert data["checkpoints"][2]["comparison"]["inside_noise"] is True
    # each window's NLL is kept, so runs made apart pair the same way
    first, second = (c["windows"] for c in data["checkpoints"][:2])
    assert len(first["nll"]) == len(first["tokens"]) == 63
    again = loss_ratio(first["nll"], second["nll"], second["tokens"]).to_json()
    assert again == data["checkpoints"][1]["comparison"]


def test_one_checkpoint_table_is_unchanged():
    r = run("eval", LM, "--text", TEXT, "--seq", "64", "--max-tokens", "2000", "-q", columns=250)
    assert r.exit_code == 0 and "interval" not in r.stdout and "~" not in r.stdout
