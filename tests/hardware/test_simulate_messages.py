"""`sparsetool simulate`: every suggestion an error makes runs as written, and --list-hardware
prints units, cites each publication once per device and wraps under its own column."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from helpers import pruned_gpt2, runner_for

run = runner_for("simulate", columns=80)


def suggestions(message: str) -> list[list[str]]:
    """The commands an error offers after "e.g.", each as simulate's arguments."""
    found = re.search(r"e\.g\. (.*)$", " ".join(message.split()))
    assert found, message
    out = []
    for piece in re.split(r", | or ", found.group(1)):
        words = shlex.split(piece)
        if words[:2] == ["sparsetool", "simulate"]:
            words = words[2:]
        elif not words or not words[0].startswith("--"):
            continue
        out.append(words)
    return out


@pytest.fixture
def ckpt(tmp_path):
    return pruned_gpt2(tmp_path, 0.5)[0]


@pytest.mark.parametrize("extra", [("--plot", "x.png"), ("--sweep",), ("--sparsity", "0.5,0.9")])
def test_a_checkpoint_with_a_sweep_or_plot_offers_a_command_that_runs(
    ckpt, extra, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    r = run(ckpt, *extra)
    assert r.exit_code == 2 and r.stdout == ""  # a usage error: how the options combine
    assert "add --sweep" not in r.stderr  # it used to say so, then refuse --sweep
    assert f"drop {extra[0]}" in r.stderr
    offered = suggestions(r.stderr)
    assert offered
    for args in offered:
        ok = run(*args, "--quiet")
        assert ok.exit_code == 0, (args, ok.output)
    assert (tmp_path / "speedup.png").is_file()
    assert run(ckpt, "--tokens", "64").exit_code == 0  # and dropping the option works too


@pytest.mark.parametrize(
    "args",
    [
        (),  # no source
        ("--shape", "64x64"),  # no sparsity
        ("--model", "gpt2-small", "--sparsity", "0.5", "--pattern", "rows"),
        ("--shape", "64x64", "--sparsity", "0.5", "--plot", "x.png"),
        ("--shape", "64x64", "--sparsity", "0.5,0.75", "--pattern", "2:4"),
    ],
)
def test_every_suggestion_runs_as_written(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(*args)
    assert r.exit_code == 2, r.output  # options that do not combine: a usage error
    offered = suggestions(r.stderr)
    assert offered, r.stderr
    for words in offered:
        if words and words[0] == "model.safetensors":
            words = [str(pruned_gpt2(tmp_path, 0.5)[0]), *words[1:]]
        if words[0].startswith("--") and not any(w in words for w in ("--shape", "--model")):
            words = [*args, *words]  # a fragment to add to the command given
        ok = run(*words, "--quiet", "--json")
        assert ok.exit_code == 0, (words, ok.output)


def test_sweep_and_a_list_name_the_list_given():
    r = run("--shape", "64x64", "--sparsity", "0.5,0.9", "--sweep")
    assert r.exit_code == 2
    assert (
        "--sweep (the Appendix C sparsities) or --sparsity 0.5,0.9, not both: drop one" in r.stderr
    )
    assert run("--shape", "64x64", "--sparsity", "0.5,0.9").exit_code == 0
    assert run("--shape", "64x64", "--sweep", "--tokens", "64").exit_code == 0


def test_list_hardware_prints_units_and_cites_once():
    from sparsetool.hardware.presets import CITATIONS, PRESETS

    r = run("--list-hardware")
    assert r.exit_code == 0, r.output
    out = r.stdout
    for text in (
        "1.100 GHz",
        "312.00 TFLOP/s",
        "989.00 TFLOP/s",
        "2.039 TB/s",
        "20.00 PB/s",
        "40.00 GB",
        "1.280 us",
        "850,000",
        "0.25 B",
        "120.00 GFLOP/s",
        "2.500 GMAC/s",
    ):
        assert text in out, text
    for raw in ("1100000000.0", "312000000000000.0", "clock_hz = "):
        assert raw not in out
    blocks = out.strip().split("\n\n")
    assert len(blocks) == len(PRESETS)
    for block in blocks:
        text = " ".join(block.split())  # wrapped lines joined again
        for cite in CITATIONS:
            assert text.count(" ".join(cite.split())) <= 1, (block.splitlines()[0], cite)
        header, *lines = block.splitlines()
        assert all(line.startswith("  ") for line in lines)  # nothing wraps back to column 0
        assert all(len(line) <= 80 for line in lines)
    cs2 = blocks[0]
    assert "[1] Cerebras CS-2 (Lie, Hot Chips 34, 2022; CS-2 datasheet)" in cs2
    assert "850,000 AI-optimised cores [1]" in cs2


def test_list_hardware_json_has_units():
    d = json.loads(run("--list-hardware", "--json").stdout)
    cs2 = d["cs2"]["constants"]
    assert cs2["clock_hz"] == {"value": 1.1e9, "unit": "Hz", "source": cs2["clock_hz"]["source"]}
    assert d["a100"]["constants"]["peak_flops"]["unit"] == "FLOP/s"
