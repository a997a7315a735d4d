"""``sparsetool demo`` in reduced form: the files, the summary's shape and numbers, and that each
number is the one the matching command gives for the same files."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, RUNNER, run

STEPS, FT_STEPS = 4, 2
NAMES = ["dense", "sparse", "finetuned"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    r = run("demo", "-o", out, "--steps", STEPS, "--finetune-steps", FT_STEPS, "--json")
    assert r.exit_code == 0, r.output
    assert r.stderr == ""  # --json: no progress
    return out, json.loads(r.stdout)


def test_every_file_is_written(demo):
    out, _ = demo
    for name in NAMES:
        for f in ("model.safetensors", "config.json", "log.jsonl", "loss.png", "run.json"):
            assert (out / name / f).is_file(), f"{name}/{f}"
    for f in (
        "perplexity.png",
        "angular-distance.png",
        "summary.json",
        "heldout/python.txt",
        "heldout/english.txt",
    ):
        assert (out / f).is_file(), f
    for png in [out / "perplexity.png", out / "angular-distance.png"]:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_summary_json_is_stdout_and_has_the_right_shape(demo):
    out, s = demo
    assert json.loads((out / "summary.json").read_text()) == s
    assert s["producer"] == "sparsetool demo" and s["seconds"] > 0
    assert set(s["phase_seconds"]) == {"dense", "sparse", "finetuned", "eval", "diff"}
    assert [m["name"] for m in s["models"]] == NAMES
    assert s["settings"]["steps"] == STEPS and s["settings"]["finetune_steps"] == FT_STEPS
    assert "standard library" in s["settings"]["pretrain_data"]
    assert "builtin:english" in s["settings"]["finetune_data"]
    context = s["settings"]["model"]["context"]
    for m, steps in zip(s["models"], [STEPS, STEPS, FT_STEPS]):
        assert m["steps"] == steps and m["tokens"] == steps * s["settings"]["batch_size"] * context
        assert set(m["perplexity"]) == set(m["bits_per_byte"]) == {"python", "english"}
        assert all(1 < p < 257 for p in m["perplexity"].values())  # bytes: at most uniform-ish
    assert set(s["diff"]["by_kind"]) == {"Q", "K", "V", "attn_out", "ffn_in", "ffn_out"}


def test_sparsity_counts_are_exact(demo):
    _, s = demo
    dense, sparse, ft = s["models"]
    numel, tensors = sparse["targeted_numel"], sparse["targeted_tensors"]
    assert numel == dense["targeted_numel"] == ft["targeted_numel"] and tensors == 8
    # 25% of every targeted matrix kept: within one weight per tensor of a quarter
    assert abs(sparse["targeted_nonzero"] - numel / 4) <= tensors
    assert dense["targeted_nonzero"] == numel
    # dense fine-tuning revived every pruned weight (at 0) and trained it
    assert ft["targeted_nonzero"] > 0.99 * numel
    assert s["diff"]["revived"] == ft["targeted_nonzero"] - sparse["targeted_nonzero"]
    assert s["diff"]["pruned"] == 0 and s["diff"]["sparsity_a"] == sparse["targeted_sparsity"]


def test_flops_ratios_are_ordered_and_match_the_flops_command(demo):
    out, s = demo
    dense, sparse, ft = s["models"]
    assert dense["train_flops_ratio"] == 1.0
    assert 0 < sparse["train_flops_ratio"] < ft["train_flops_ratio"] < 1
    assert ft["train_flops"] == pytest.approx(sparse["train_flops"] + ft["finetune_flops"])
    context = s["settings"]["model"]["context"]
    r = run(
        "flops",
        "--checkpoint",
        out / "sparse",
        "--seq-len",
        context,
        "--tokens",
        sparse["tokens"],
        "--finetune-tokens",
        ft["tokens"],
        "--json",
    )
    assert r.exit_code == 0, r.output
    f = json.loads(r.stdout)["runs"][0]  # flops --json: one shape, the runs in a list
    assert f["total_train_flops"] == pytest.approx(sparse["train_flops"], rel=1e-12)
    assert f["train_flops_ratio"] == pytest.approx(sparse["train_flops_ratio"], rel=1e-12)
    assert f["dense_total_train_flops"] == pytest.approx(dense["train_flops"], rel=1e-12)
    assert f["end_to_end_ratio"] == pytest.approx(ft["train_flops_ratio"], rel=1e-12)


@pytest.mark.parametrize("text", ["python", "english"])
def test_perplexities_are_those_of_sparsetool_eval(demo, text):
    out, s = demo
    r = run(
        "eval",
        *[out / n for n in NAMES],
        "--text",
        out / "heldout" / f"{text}.txt",
        "--batch",
        32,
        "--json",
    )
    assert r.exit_code == 0, r.output
    got = [row["perplexity"] for row in json.loads(r.stdout)["checkpoints"]]
    assert got == pytest.approx([m["perplexity"][text] for m in s["models"]], rel=1e-9)


def test_angular_distance_is_that_of_sparsetool_diff(demo):
    out, s = demo
    r = run("diff", out / "sparse", out / "finetuned", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["summary"]
    assert d["angular_distance"] == pytest.approx(s["diff"]["angular_distance"], rel=1e-12)
    assert 0 < d["angular_distance"] < 1


def test_an_earlier_demo_output_is_replaced_and_other_files_are_kept(tmp_path):
    out = tmp_path / "out"
    r = run("demo", "-o", out, "--steps", 2, "--finetune-steps", 1, "--quiet")
    assert r.exit_code == 0, r.output
    assert r.stderr == ""
    (out / "notes.txt").write_text("mine")
    r = run("demo", "-o", out, "--steps", 3, "--finetune-steps", 1)
    assert r.exit_code == 0, r.output
    assert (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "summary.json").read_text())["settings"]["steps"] == 3
    # not --quiet: one line per phase on stderr (not a terminal), the table on stdout
    assert [ln.split("]")[0] for ln in r.stderr.splitlines()] == [f"[{i}/5" for i in range(1, 6)]
    assert "pre-train 75% sparse: 3 steps" in r.stderr
    for row in ("dense", "75% sparse", "sparse -> dense fine-tuned", "angular distance"):
        assert row in r.stdout
    assert "perplexity Python" in r.stdout and "train FLOPs vs dense" in r.stdout


def test_a_foreign_non_empty_directory_is_refused_untouched(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "data.txt").write_text("keep")
    r = run("demo", "-o", out, "--steps", 1, "--finetune-steps", 1)
    assert r.exit_code == 1
    assert r.stderr.startswith("error: ") and str(out) in r.stderr and "not empty" in r.stderr
    assert [p.name for p in out.iterdir()] == ["data.txt"] and (
        out / "data.txt"
    ).read_text() == "keep"
    (tmp_path / "file").write_text("x")
    r = run("demo", "-o", tmp_path / "file")
    assert r.exit_code == 1 and "is a file" in r.stderr


def test_an_interrupted_demo_leaves_nothing(tmp_path):
    from sparsetool.demo import run_demo

    def progress(kind, info):
        if kind == "step" and info["phase"] == "sparse":
            raise KeyboardInterrupt

    out = tmp_path / "new" / "demo"
    with pytest.raises(KeyboardInterrupt):
        run_demo(out, steps=2, finetune_steps=1, progress=progress)
    assert list(tmp_path.iterdir()) == []  # the parent it created is gone too
    # an existing empty directory stays, and holds none of the demo's files
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(KeyboardInterrupt):
        run_demo(kept, steps=2, finetune_steps=1, progress=progress)
    assert list(kept.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["--steps", "0"],
        ["--steps", "many"],
        ["--finetune-steps", "-1"],
        ["--seed", "-1"],
        ["--no-such-option"],
    ],
)
def test_bad_values_are_usage_errors_before_torch(args, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", RUNNER, "demo", "-o", str(tmp_path / "d"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.stdout.strip().splitlines()[-1] == "exit=2 torch=False", r.stdout + r.stderr
    assert "error: " in r.stderr and not (tmp_path / "d").exists()
