"""``train --init SPARSE --sparsity S``: the same S keeps the checkpoint's masks, a higher S
prunes further from them (never reviving a weight), a lower S is an error that names the way out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparsetool.errors import ConfigError
from sparsetool.train.configkeys import merge
from sparsetool.train.loop import Trainer

from helpers import run as cli

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

TARGETED = ("qkv.weight", "attn.proj.weight", "fc.weight", "mlp.proj.weight")


def args(out: Path, data: Path, steps: int) -> list[str]:
    return [
        "train",
        "--out",
        str(out),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        str(steps),
        "--batch-size",
        "4",
        "--warmup",
        "1",
        "--eval-every",
        "0",
        "--seed",
        "0",
        "--json",
    ]


def run_cli(argv: list[str]) -> dict:
    result = cli(*argv)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def half_sparse(tmp_path_factory, corpus) -> Path:
    """A checkpoint trained with static masks at sparsity 0.5."""
    run = tmp_path_factory.mktemp("pre") / "run"
    run_cli(args(run, corpus, 2) + ["--algorithm", "static", "--sparsity", "0.5"])
    return run / "model.safetensors"


def masks_of(path: Path) -> dict[str, torch.Tensor]:
    t = load_file(path)
    return {n[: -len("_mask")]: m for n, m in t.items() if n.endswith("_mask")}


def test_higher_sparsity_prunes_further_and_never_revives(tmp_path, corpus, half_sparse):
    before = masks_of(half_sparse)
    assert len(before) == 8
    summary = run_cli(
        args(tmp_path / "ft", corpus, 2) + ["--init", str(half_sparse), "--sparsity", "0.75"]
    )
    assert summary["sparsity"] == pytest.approx(0.75, abs=1e-3)
    after = masks_of(tmp_path / "ft" / "model.safetensors")
    assert after.keys() == before.keys()
    for name, m in after.items():
        assert not torch.any(m & ~before[name]), name  # kept now => kept in the checkpoint
        assert 1 - m.float().mean().item() == pytest.approx(0.75, abs=0.01)


def test_higher_sparsity_keeps_the_largest_loaded_weights(tmp_path, corpus, half_sparse):
    cfg = merge(
        {},
        {
            "out": str(tmp_path / "ft"),
            "data": str(corpus),
            "preset": "tiny",
            "steps": 1,
            "batch_size": 4,
            "warmup": 1,
            "eval_every": 0,
            "init": str(half_sparse),
            "sparsity": 0.75,
        },
    )
    trainer = Trainer(cfg)
    sp = trainer._build_sparsifier(0, None)
    loaded = load_file(half_sparse)
    for name, m in sp.masks.items():
        w = loaded[name].abs()
        dropped = loaded[name + "_mask"] & ~m
        assert dropped.any() and w[m].min() >= w[dropped].max()


def test_the_checkpoints_own_sparsity_keeps_its_masks_exactly(tmp_path, corpus, half_sparse):
    run_cli(args(tmp_path / "ft", corpus, 2) + ["--init", str(half_sparse), "--sparsity", "0.5"])
    after, before = masks_of(tmp_path / "ft" / "model.safetensors"), masks_of(half_sparse)
    assert all(torch.equal(after[n], before[n]) for n in before)


@pytest.mark.parametrize("algorithm", ["static", "rigl", "gmp"])
def test_lower_sparsity_is_an_error_that_names_the_way_out(
    tmp_path, corpus, half_sparse, algorithm
):
    out = tmp_path / "ft"
    result = cli(
        *args(out, corpus, 2),
        "--init",
        str(half_sparse),
        "--sparsity",
        "0.25",
        "--algorithm",
        algorithm,
    )
    assert result.exit_code in (1, 2), result.output
    message = result.stderr
    assert "--sparsity 0.25 is below the sparsity of --init" in message
    assert "--dense" in message and "--sparsity 0.5" in message
    assert not out.exists()  # refused before anything was written


def test_lower_sparsity_from_the_library_raises_config_error(tmp_path, corpus, half_sparse):
    cfg = merge(
        {},
        {
            "out": str(tmp_path / "ft"),
            "data": str(corpus),
            "preset": "tiny",
            "steps": 1,
            "init": str(half_sparse),
            "sparsity": 0.3,
        },
    )
    with pytest.raises(ConfigError, match="would revive pruned weights"):
        Trainer(cfg)


def test_dense_still_revives_every_weight(tmp_path, corpus, half_sparse):
    summary = run_cli(args(tmp_path / "ft", corpus, 1) + ["--init", str(half_sparse), "--dense"])
    assert summary["sparsity"] == 0.0


def printed(argv: list[str]) -> str:
    result = cli(*[a for a in argv if a != "--json"])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_start_of_the_run_says_the_masks_come_from_init(tmp_path, corpus, half_sparse):
    """Not "random initial mask": the checkpoint's masks are kept (or pruned further), and a
    resume of such a run says the same."""
    out = printed(
        args(tmp_path / "ft", corpus, 2)
        + ["--init", str(half_sparse), "--stop-at", "1", "--save-every", "1"]
    )
    assert f"initial mask from --init {half_sparse} (its stored masks), kept" in out
    assert "random initial mask" not in out
    run = json.loads((tmp_path / "ft" / "run.json").read_text())
    assert run["sparse_training"]["1"]["initial_mask"].endswith("(its stored masks), kept")
    resumed = printed(["train", "--out", str(tmp_path / "ft"), "--resume"])
    assert f"initial mask from --init {half_sparse} (its stored masks), kept" in resumed
    further = printed(
        args(tmp_path / "ft2", corpus, 1) + ["--init", str(half_sparse), "--sparsity", "0.75"]
    )
    assert "(its stored masks), pruned further" in further and "random initial mask" not in further
