"""train --init MODEL whose zero weights are its only masks (none stored): a model converted or
shrunk from a dense one (a few exact zeros, as dequantizing a 4-bit GGUF leaves, and no prune in
its provenance) trains densely and the start of the run says so in one line; its zeros stay
masks when the run asks for sparse training, when sparsetool pruned it (even below 10%), or when
at least 10% of its targeted weights are 0 (a prune made elsewhere)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsetool.targets import plan_targets

from helpers import hf_model, make_text, save_tokenizer
from helpers import run as cli

os.environ["HF_HUB_OFFLINE"] = "1"

FAST = ["--steps", "6", "--batch-size", "4", "--context", "32", "--warmup", "1", "--lr", "3e-3",
        "--eval-every", "3", "--seed", "0"]  # fmt: skip


def targeted(weights: dict[str, torch.Tensor]) -> list[str]:
    return list(plan_targets([(n, tuple(t.shape), t.dtype) for n, t in weights.items()]).targeted)


def zeroed(src: Path, dst: Path, share: float) -> None:
    """``src`` with ``share`` of each targeted weight set to exactly 0 at random (no provenance:
    what a conversion of a quantized file or another tool writes)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    w = load_file(str(src / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    for name in targeted(w):
        w[name] = w[name].masked_fill(torch.rand(w[name].shape, generator=g) < share, 0.0)
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A dense Llama, its copy with 1% zeros (dequantized), that copy shrunk by one block, and a
    copy with 30% zeros; the text."""
    root = tmp_path_factory.mktemp("zeros")
    text = make_text(600)
    (root / "data.txt").write_text(text)
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(root / "dense")
    save_tokenizer(root / "dense", text)
    zeroed(root / "dense", root / "dequantized", 0.01)
    zeroed(root / "dense", root / "thirty", 0.30)
    r = cli("shrink", root / "dequantized", "-o", root / "shrunk", "--blocks", "1",
            "--calibration", root / "data.txt", "--samples", "4", "--seq", "32")  # fmt: skip
    assert r.exit_code == 0, r.output
    return root


def train(out: Path, init: Path, data: Path, *extra) -> tuple[dict, str]:
    """The run's run.json and its console (stdout and stderr)."""
    r = cli("train", *FAST, "-o", out, "--init", init, "--data", data, *extra)
    assert r.exit_code == 0, r.output
    return json.loads((out / "run.json").read_text()), r.stdout + r.stderr


def zeros_of(path: Path) -> dict[str, torch.Tensor]:
    w = load_file(str(path / "model.safetensors"))
    return {n: w[n] == 0 for n in targeted(w)}


def stored_masks(run: Path) -> list[str]:
    latest = run / "checkpoints" / (run / "latest").read_text().strip()
    return [n for n in load_file(str(latest / "model.safetensors")) if "mask" in n]


def test_a_shrunk_dequantized_model_trains_densely_and_says_so(root, tmp_path):
    before = zeros_of(root / "shrunk")
    share = sum(int(z.sum()) for z in before.values()) / sum(z.numel() for z in before.values())
    assert 0.005 < share < 0.015
    run, console = train(tmp_path / "run", root / "shrunk", root / "data.txt")
    assert not run.get("sparse_training"), run.get("sparse_training")
    assert "sparse training:" not in console
    line = [s for s in console.splitlines() if "trained densely" in s]
    assert line == [
        f"note: --init {root / 'shrunk'}: trained densely: {share:.2%} of its targeted weights are "
        "exactly 0 and no prune made it (its zeros count as masks from 10%, or after sparsetool "
        "prune); to keep them at 0 as masks, add --algorithm static"
    ]
    assert stored_masks(tmp_path / "run") == []  # no masks in the checkpoints
    after = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    for name, zero in before.items():
        assert bool((after[name][zero] != 0).any()), name  # its zeros train like any weight


def test_asking_for_sparse_training_keeps_the_zeros_as_masks(root, tmp_path):
    run, console = train(tmp_path / "run", root / "shrunk", root / "data.txt", "--algorithm",
                         "static")  # fmt: skip
    origin = run["sparse_training"]["1"]["initial_mask"]
    assert origin == f"from --init {root / 'shrunk'} (its zero weights), kept"
    assert "trained densely" not in console
    before = zeros_of(root / "shrunk")
    after = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    for name, zero in before.items():
        assert bool((after[name][zero] == 0).all()), name
    assert stored_masks(tmp_path / "run")


def test_a_sparsetool_prune_keeps_its_masks_below_ten_percent(root, tmp_path):
    pruned = tmp_path / "pruned"
    r = cli("prune", root / "dense", "-o", pruned, "--sparsity", "0.05", "--encoding", "zeros")
    assert r.exit_code == 0, r.output
    run, console = train(tmp_path / "run", pruned, root / "data.txt")
    origin = run["sparse_training"]["1"]["initial_mask"]
    assert origin == (
        f"from --init {pruned} (its zero weights: a sparsetool prune; --dense revives them), kept"
    )
    assert "trained densely" not in console
    after = load_file(str(tmp_path / "run" / "model" / "model.safetensors"))
    for name, zero in zeros_of(pruned).items():
        assert bool((after[name][zero] == 0).all()), name


def test_many_zeros_without_a_prune_are_taken_for_one(root, tmp_path):
    before = zeros_of(root / "thirty")
    share = sum(int(z.sum()) for z in before.values()) / sum(z.numel() for z in before.values())
    run, _ = train(tmp_path / "run", root / "thirty", root / "data.txt")
    assert run["sparse_training"]["1"]["initial_mask"] == (
        f"from --init {root / 'thirty'} (its zero weights: {share:.2%} of the targeted weights; "
        "--dense revives them), kept"
    )
    assert run["sparse_training"]["1"]["sparsity"] == pytest.approx(share)
