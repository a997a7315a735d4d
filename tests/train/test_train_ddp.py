"""sparsetool train under torchrun: 2 CPU processes (gloo) give the masks and losses of one process
with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import make_corpus

ARGS = [
    "--preset",
    "tiny",
    "--steps",
    "6",
    "--warmup",
    "2",
    "--eval-every",
    "3",
    "--algorithm",
    "rigl",
    "--sparsity",
    "0.75",
    "--update-freq",
    "2",
    "--update-stop",
    "5",
    "--json",
]


def _env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks on a small machine: no oversubscription
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


@pytest.mark.slow
def test_two_processes_match_one_process_with_the_same_global_batch(tmp_path):
    data = make_corpus(tmp_path / "corpus")
    two, one = tmp_path / "two", tmp_path / "one"
    ddp = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "sparsetool",
            "train",
            "--out",
            str(two),
            "--data",
            str(data),
            "--batch-size",
            "2",
            *ARGS,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    summary = json.loads(ddp.stdout)  # only rank 0 prints
    assert summary["world_size"] == 2
    assert summary["masks_identical_across_ranks"] is True
    assert summary["mask_updates_that_diverged"] == 0
    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparsetool",
            "train",
            "--out",
            str(one),
            "--data",
            str(data),
            "--batch-size",
            "4",
            *ARGS,
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-3000:]

    def log(run: Path) -> list[dict]:
        return [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]

    a, b = log(two), log(one)
    assert [r["kind"] for r in a] == [r["kind"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("loss", "val_loss", "sparsity", "lr"):
            if key in ra:
                assert ra[key] == pytest.approx(rb[key], abs=1e-4), (ra, rb)
    ta, tb = load_file(two / "model.safetensors"), load_file(one / "model.safetensors")
    masks = [n for n in ta if n.endswith("_mask")]
    assert len(masks) == 8
    # Identical on every rank is exact (the digests above). Against one process, RigL ranks
    # gradients that were summed in a different order (all-reduce of two halves vs one batch), so
    # a near-tie may flip: allow a few swapped positions in 24,576, no more.
    differ = sum(int((ta[n] != tb[n]).sum()) for n in masks)
    total = sum(ta[n].numel() for n in masks)
    assert differ <= 0.001 * total, f"{differ} of {total} mask positions differ"
    assert all(int(ta[n].sum()) == int(tb[n].sum()) for n in masks)
    # the data position advanced by the global batch, as one process with batch 4
    state = json.loads(next((two / "checkpoints").iterdir()).joinpath("state.json").read_text())
    assert state["data_position"] == 6 * 4 and state["world_size"] == 2
