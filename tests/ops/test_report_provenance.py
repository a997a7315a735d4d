"""report shows how a checkpoint was made: a "made by" line from its provenance (method, how
much, the calibration text's digest, windows and seed, OWL and DSnoT, the tool's version) and a
"provenance" object in --json; nothing (null) for a checkpoint that records none."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from sparsetool.util.version import __version__

from helpers import hf_model, make_text, run, save_tokenizer


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A tiny Llama (no provenance), its calibration text, and what prune and shrink make of it."""
    root = tmp_path_factory.mktemp("made")
    torch.manual_seed(0)
    hf_model("llama").eval().save_pretrained(root / "dense")
    text = make_text(400)
    save_tokenizer(root / "dense", text)
    (root / "calib.txt").write_text(text)
    calib = ("--calibration", root / "calib.txt", "--samples", 6, "--seq", 32, "-q")
    for args in (
        ("wanda", "--sparsity", 0.5, "--method", "wanda", *calib),
        ("owl", "--sparsity", 0.5, "--allocation", "owl", "--refine", "dsnot", *calib),
        ("nm", "--nm", "2:4"),
    ):
        r = run("prune", root / "dense", "-o", root / args[0], *args[1:])
        assert r.exit_code == 0, r.output
    r = run("shrink", root / "dense", "-o", root / "shrunk", "--blocks", 1, *calib)
    assert r.exit_code == 0, r.output
    return root, hashlib.sha256(text.encode()).hexdigest()


def report(path, *args):
    r = run("report", path, *args, columns=200)
    assert r.exit_code == 0, r.output
    return r.stdout


def test_a_calibrated_prune_is_shown_with_its_text_digest_and_windows(made):
    root, digest = made
    out = report(root / "wanda")
    assert out.splitlines()[0] == (
        f"made by: prune --method wanda --sparsity 0.5; calibration calib.txt (sha256 "
        f"{digest[:12]}, 6 x 32 tokens, seed 0); sparsetool {__version__}"
    )
    data = json.loads(report(root / "wanda", "--json"))
    p = data["provenance"]
    assert p["command"] == "prune" and p["method"] == "wanda" and p["version"] == __version__
    assert p["calibration"]["sha256"] == digest and p["calibration"]["samples"] == 6


def test_owl_dsnot_and_a_pattern_are_shown(made):
    root, digest = made
    first = report(root / "owl").splitlines()[0]
    assert first.startswith("made by: prune --method magnitude --sparsity 0.5; calibration")
    assert f"sha256 {digest[:12]}" in first and "; allocation owl; refinement dsnot;" in first
    assert report(root / "nm").splitlines()[0] == (
        f"made by: prune --method magnitude --nm 2:4; sparsetool {__version__}"
    )


def test_a_shrunk_checkpoint_shows_its_own_record(made):
    root, digest = made
    first = report(root / "shrunk").splitlines()[0]
    assert first.startswith("made by: shrink --block-criterion bi (blocks 2 -> 1); calibration")
    assert f"(sha256 {digest[:12]}, 6 x 32 tokens, seed 0)" in first
    p = json.loads(report(root / "shrunk", "--json"))["provenance"]
    assert p["command"] == "shrink" and p["blocks"]["removed"] and p["calibration_sha256"] == digest


def test_a_later_step_names_the_earlier_ones(made, tmp_path):
    root, _ = made
    r = run("prune", root / "nm", "-o", tmp_path / "again", "--sparsity", 0.6, "-q")
    assert r.exit_code == 0, r.output
    first = report(tmp_path / "again").splitlines()[0]
    assert first == (
        f"made by: prune --method magnitude --sparsity 0.6; after prune; sparsetool {__version__}"
    )


def test_a_checkpoint_without_provenance_has_no_line_and_null(made):
    root, _ = made
    assert "made by" not in report(root / "dense")
    assert json.loads(report(root / "dense", "--json"))["provenance"] is None
