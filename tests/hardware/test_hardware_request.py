"""sparsetool.hardware.request called directly (no CLI): the same results the command prints."""

from __future__ import annotations

import json

import pytest

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.hardware import hardware_constants, run_simulation
from sparsetool.hardware.request import parse_sparsities

from helpers import pruned_gpt2, run


def cli_json(*args):
    r = run("simulate", *args, "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    return json.loads(r.stdout)


def as_json(result):
    """What the command prints for ``result`` (numpy values become lists and numbers)."""
    return json.loads(json.dumps(result, default=lambda o: o.tolist()))


def test_shape_request_matches_the_command():
    res = run_simulation(shape="300x200", sparsity=0.8, tokens=512, verify=True)
    assert res["workload"]["source"] == "shape"
    assert res["workload"]["theoretical"] == pytest.approx(5.0, rel=1e-9)  # 1 / (1 - 0.8)
    assert res["verify"]["equal"] and res["verify"]["nonzero"] == 12000  # 300 * 200 * 0.2
    assert res["layers"][0]["nonzero"] == 12000
    assert as_json(res) == cli_json(
        "--shape", "300x200", "--sparsity", "0.8", "--tokens", "512", "--verify"
    )


def test_model_request_matches_the_command():
    res = run_simulation(model="gpt2-small", sparsity="0.5", tokens=1024, devices=["cs2", "a100"])
    assert res["workload"]["layers"] == 48  # 12 blocks x (qkv, attn_out, ffn_in, ffn_out)
    assert [d["name"] for d in res["devices"]] == ["cs2", "a100"]
    cs2 = res["devices"][0]
    assert 1.0 < cs2["train_step"]["speedup"] < res["workload"]["theoretical"] < 2.0
    assert as_json(res) == cli_json(
        "--model",
        "gpt2-small",
        "--sparsity",
        "0.5",
        "--tokens",
        "1024",
        "--device",
        "cs2",
        "--device",
        "a100",
    )


def test_checkpoint_request_matches_the_command_and_reports_progress(tmp_path):
    path, masks = pruned_gpt2(tmp_path, 0.8, "mask")
    calls = []
    res = run_simulation(
        path,
        tokens=128,
        seq_len=32,
        verify=True,
        progress=lambda stage, done, total: calls.append((stage, done, total)),
    )
    n = len(masks)
    assert calls[0] == ("masks", 0, n) and calls[-1] == ("masks", n, n)
    assert {row["name"]: row["nonzero"] for row in res["layers"]} == {
        name: int(m.sum()) for name, m in masks.items()
    }
    assert res["verify"]["equal"] and res["verify"]["axpys_match_tiles"]
    assert as_json(res) == cli_json(str(path), "--tokens", "128", "--seq-len", "32", "--verify")


def test_sweep_request_has_one_row_per_sparsity_and_the_24_point():
    res = run_simulation(shape="256x512", sparsity=[0.5, 0.75], tokens=256)
    assert [r["sparsity"] for r in res["runs"]] == [0.5, 0.75]
    assert [r["theoretical"] for r in res["runs"]] == pytest.approx([2.0, 4.0])
    assert res["nm_point"]["mask"] == "2:4" and "a100-2:4" in res["nm_point"]["devices"]
    # the workload's per-sparsity figures, devices and layers describe the last run
    assert res["workload"]["theoretical"] == res["runs"][-1]["theoretical"]
    assert res["layers"][0]["sparsity"] == pytest.approx(0.75, abs=0.01)


def test_hardware_constants_is_the_list_hardware_table():
    table = hardware_constants(devices=["cs2", "h100"])
    assert list(table) == ["cs2", "h100"]
    assert table == cli_json("--list-hardware", "--device", "cs2", "--device", "h100")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(), "exactly one"),
        (dict(shape="64x64", model="gpt2-small", sparsity=0.5), "exactly one"),
        (dict(shape="64x64"), "--sparsity"),
        (dict(shape="64x64", sparsity=1.5), "from 0 to 1"),  # the one rule: sparsetool.util.options
        (dict(shape="64x64", sparsity="0.5,x"), "'x' is not a number"),
        (dict(shape="64x64", sparsity=0.5, sweep=True), "not both"),
        (dict(shape="64x64", sparsity=0.5, devices=["tpu"]), "tpu"),
        (dict(model="gpt2-small", sparsity=0.5, pattern="2:4"), "--shape only"),
        (dict(shape="64x64", sparsity=0.5, include=["*.c_fc.*"]), "CHECKPOINT"),
    ],
)
def test_bad_requests_raise_one_clean_error(kwargs, match):
    with pytest.raises(SparsetoolError, match=match.replace("[", r"\[").replace("]", r"\]")):
        run_simulation(**kwargs)


def test_checkpoint_refuses_synthetic_sparsities(tmp_path):
    path, _ = pruned_gpt2(tmp_path)
    with pytest.raises(ConfigError, match="brings its own masks"):
        run_simulation(path, sparsity=0.5)


def test_parse_sparsities_takes_text_numbers_and_sequences():
    assert parse_sparsities("0.5") == parse_sparsities(0.5) == parse_sparsities([0.5]) == [0.5]
    assert parse_sparsities(None) == []
    assert parse_sparsities(None, sweep=True)[-1] == 0.9


def test_checkpoint_request_takes_include_and_exclude(tmp_path):
    path, masks = pruned_gpt2(tmp_path, 0.8, "mask")
    every = {row["name"] for row in run_simulation(path, tokens=128, seq_len=32)["layers"]}
    some = run_simulation(path, tokens=128, seq_len=32, exclude=["*.mlp.*"])
    names = {row["name"] for row in some["layers"]}
    assert names == {n for n in every if ".mlp." not in n} and names < every
    with pytest.raises(SparsetoolError, match="nomatch"):
        run_simulation(path, tokens=128, seq_len=32, include=["nomatch*"])
