"""report, simulate and flops --checkpoint target what prune targeted (its recorded globs), and
every command taking --include/--exclude refuses a glob that matches nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.errors import ConfigError
from sparsetool.targets.recorded import plan_checkpoint_targets, recorded_globs

from helpers import gpt2_like_state, run

GLOBS = ["--include", "*wte*", "--exclude", "*.h.1.*"]
NOTE = "note: targets as recorded by prune: --include '*wte*' --exclude '*.h.1.*'"


@pytest.fixture
def pruned(tmp_path: Path) -> tuple[Path, dict]:
    src = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(n_layer=2, d=16, vocab=64), str(src), metadata={"format": "pt"})
    out = tmp_path / "p.safetensors"
    r = run("prune", src, "-o", out, "-s", "0.5", *GLOBS, "--json")
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout)


def _targeted(report_json: dict) -> list[str]:
    return [t["name"] for t in report_json["tensors"] if t["targeted"]]


def test_report_uses_the_recorded_targeting_by_default(pruned):
    out, prune_json = pruned
    r = run("report", out, "--json")
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert _targeted(rep) == [t["name"] for t in prune_json["tensors"]]
    assert rep["summary"]["targeted_sparsity"] == prune_json["summary"]["targeted_sparsity"] == 0.5
    assert rep["summary"]["targeting"]["rule"] == "recorded by prune"
    assert r.stderr.count(NOTE) == 1  # one line says where the rule came from
    # --default-targets: the built-in roles (layer 1 is dense, so a lower targeted sparsity)
    r = run("report", out, "--json", "--default-targets")
    rep = json.loads(r.stdout)
    assert "transformer.wte.weight" not in _targeted(rep) and len(_targeted(rep)) == 8
    assert rep["summary"]["targeted_sparsity"] == 0.25
    assert rep["summary"]["targeting"]["rule"] == "default" and "recorded" not in r.stderr
    # globs on the command line win over the record, and nothing is said about the record
    r = run("report", out, "--json", "--include", "*wpe*")
    rep = json.loads(r.stdout)
    assert "transformer.wpe.weight" in _targeted(rep) and "transformer.wte.weight" not in _targeted(
        rep
    )
    assert rep["summary"]["targeting"]["rule"] == "given" and "recorded" not in r.stderr
    # --quiet drops the line, the plain table keeps the same numbers
    r = run("report", out, "--format", "plain", "--quiet")
    assert "targeted sparsity: 50.00% of 4,096 weights in 5 tensors" in r.stdout and not r.stderr


def test_simulate_and_flops_use_the_recorded_targeting(pruned):
    out, prune_json = pruned
    pruned_names = [t["name"] for t in prune_json["tensors"]]
    r = run("simulate", out, "--json")
    assert r.exit_code == 0, r.output
    sim = json.loads(r.stdout)
    assert [ly["name"] for ly in sim["layers"]] == pruned_names
    assert sim["workload"]["targeted_sparsity"] == 0.5
    assert sim["workload"]["targeting"]["rule"] == "recorded by prune" and NOTE in r.stderr
    r = run("simulate", out, "--json", "--default-targets")
    sim = json.loads(r.stdout)
    assert len(sim["layers"]) == 8 and sim["workload"]["targeted_sparsity"] == 0.25

    r = run("flops", "--checkpoint", out, "--json")
    assert r.exit_code == 0, r.output
    fl = json.loads(r.stdout)
    assert fl["targeted_sparsity"] == 0.5 and fl["targeting"]["include"] == ["*wte*"]
    assert NOTE in r.stderr
    r = run("flops", "--checkpoint", out, "--json", "--default-targets")
    assert json.loads(r.stdout)["targeted_sparsity"] == 0.25
    r = run("flops", "--model", "gpt2-small", "--default-targets")
    assert r.exit_code == 2 and "only apply with --checkpoint" in r.stderr


def test_the_newest_prune_step_is_the_record_and_densify_keeps_it(pruned, tmp_path):
    out, _ = pruned
    dense = tmp_path / "d.safetensors"
    assert run("densify", out, "-o", dense).exit_code == 0
    r = run("report", dense, "--json")
    assert json.loads(r.stdout)["summary"]["targeting"]["include"] == ["*wte*"]
    # a later prune with the built-in roles replaces the record
    again = tmp_path / "again.safetensors"
    assert run("prune", out, "-o", again, "-s", "0.6").exit_code == 0
    r = run("report", again, "--json")
    assert json.loads(r.stdout)["summary"]["targeting"]["rule"] == "default"
    md = provenance_metadata(
        provenance_metadata(None, {"command": "prune", "include": [], "exclude": ["a*"]}),
        {"command": "densify"},
    )
    assert recorded_globs(md) == ("prune", (), ("a*",))
    assert recorded_globs({"sparsetool": "not json"}) is None and recorded_globs(None) is None


def test_a_recorded_glob_that_no_longer_fits_is_an_error_naming_the_record(pruned, tmp_path):
    out, _ = pruned
    renamed = tmp_path / "renamed.safetensors"
    with open(out, "rb"):
        tensors = load_file(out)
    from safetensors import safe_open

    with safe_open(str(out), "pt") as f:
        metadata = f.metadata()
    save_file(
        {k.replace("wte", "embed"): v for k, v in tensors.items()}, str(renamed), metadata=metadata
    )
    r = run("report", renamed)
    assert r.exit_code == 1
    assert (
        "error: the targeting prune recorded in renamed.safetensors no longer fits it: "
        "--include '*wte*' matches no tensor"
    ) in r.stderr
    assert "--default-targets" in r.stderr
    assert run("report", renamed, "--default-targets").exit_code == 0
    with pytest.raises(ConfigError, match="the targeting prune recorded"):
        plan_checkpoint_targets({"x.weight": ((4, 4), "F32")}, None, metadata)


@pytest.mark.parametrize("command", ["prune", "report", "flops", "simulate", "train"])
@pytest.mark.parametrize("option", ["--include", "--exclude"])
def test_every_command_refuses_a_glob_that_matches_nothing(command, option, tmp_path):
    src = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(), str(src), metadata={"format": "pt"})
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(300)))
    args = {
        "prune": [src, "-o", tmp_path / "p.safetensors", "-s", "0.5"],
        "report": [src],
        "flops": ["--checkpoint", src],
        "simulate": [src],
        "train": [
            "-o",
            tmp_path / "run",
            "--data",
            corpus,
            "--preset",
            "tiny",
            "--steps",
            "1",
            "--batch-size",
            "2",
            "--threads",
            "1",
            "--sparsity",
            "0.5",
        ],
    }[command]
    r = run(command, *args, option, "no.such.*")
    assert r.exit_code == 1, r.output
    assert f"error: {option} 'no.such.*' matches no tensor in " in r.stderr
    assert not (tmp_path / "p.safetensors").exists()
