"""eval --tasks with several checkpoints: each document's metrics kept, the difference to the first
checkpoint with its paired interval (tasks, their mean, perplexity over windows), the noise mark
in the table. Real lm-evaluation-harness on the small task test_tasks.py builds; nothing is
downloaded."""

from __future__ import annotations

import json
import os

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from test_tasks import ending_items, sentences, write_tasks  # noqa: E402

from sparsetool.ops.paired import mean_difference  # noqa: E402
from sparsetool.ops.prune import PruneOptions, prune_checkpoint  # noqa: E402
from sparsetool.ops.tasks import evaluate_tasks  # noqa: E402

import json_schemas as S  # noqa: E402
from helpers import hf_model, run, save_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_cache")  # conftest.py


@pytest.fixture(scope="module")
def text() -> str:
    return sentences()


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, text):
    return write_tasks(tmp_path_factory.mktemp("tasks"), ending_items(text, 16))


@pytest.fixture(scope="module")
def models(tmp_path_factory, text):
    """A small random GPT-2 and its copy pruned to 90% at random."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    hf_model("gpt2").eval().save_pretrained(root / "dense")
    save_tokenizer(root / "dense", text)
    prune_checkpoint(
        root / "dense", root / "p90", PruneOptions(sparsity=0.9, method="random", encoding="zeros")
    )
    return root / "dense", root / "p90"


@pytest.fixture(scope="module")
def result(models, task_dir, text, tmp_path_factory):
    heldout = tmp_path_factory.mktemp("text") / "heldout.txt"
    heldout.write_text(text[:4000])
    dense, p90 = models
    return evaluate_tasks(
        [dense, p90, dense],
        ["pick_ending", "line_nll"],
        include_path=task_dir,
        device="cpu",
        text=heldout,
        seq=64,
    )


def test_each_document_metrics_are_kept_and_agree_with_the_task_accuracy(result):
    for row in result.rows:
        items = row.items["pick_ending"]
        assert [i["doc_id"] for i in items] == list(range(16))
        assert all(i["acc"] in (0.0, 1.0) and i["acc_norm"] in (0.0, 1.0) for i in items)
        assert sum(i["acc"] for i in items) / 16 == row.metric("pick_ending", "acc")
        assert sum(i["acc_norm"] for i in items) / 16 == row.metric("pick_ending", "acc_norm")
        # a rolling log-likelihood task's documents: [log-likelihood, words] and the like
        assert len(row.items["line_nll"]) == 16
        assert isinstance(row.items["line_nll"][0]["word_perplexity"], list)


def test_differences_to_the_first_checkpoint_with_paired_intervals(result):
    dense, p90, again = result.rows
    assert dense.comparison is None
    c = p90.comparison
    acc = c["tasks"]["pick_ending"]["acc"]
    a = [i["acc"] for i in dense.items["pick_ending"]]
    b = [i["acc"] for i in p90.items["pick_ending"]]
    assert acc == mean_difference(a, b).to_json()
    assert acc["estimate"] == pytest.approx(
        p90.metric("pick_ending", "acc") - dense.metric("pick_ending", "acc")
    )
    assert acc["low"] <= acc["estimate"] <= acc["high"] and acc["items"] == 16
    # line_nll reports no per-document number: no interval for it, and no mean over one task
    assert "line_nll" not in c["tasks"] and c["mean"] is None
    # the same checkpoint again: every difference exactly 0 inside a degenerate interval
    same = again.comparison
    for interval in [*same["tasks"]["pick_ending"].values(), same["perplexity"]]:
        assert interval["low"] == interval["high"] and interval["inside_noise"]
    assert same["perplexity"]["estimate"] == 1.0
    ppl = c["perplexity"]
    assert ppl["estimate"] == pytest.approx(p90.perplexity / dense.perplexity)
    assert ppl["low"] <= ppl["estimate"] <= ppl["high"] and ppl["items"] > 10


def test_json_holds_items_comparison_and_method(models, task_dir):
    dense, p90 = models
    r = run(
        "eval",
        dense,
        p90,
        "--tasks",
        "pick_ending",
        "--include-path",
        task_dir,
        "--limit",
        "8",
        "--json",
        "--device",
        "cpu",
    )
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert S.problems(data, S.TASKS) == []
    assert data["comparison"]["method"] == "paired percentile bootstrap"
    assert data["comparison"]["resamples"] == 10_000 and data["comparison"]["seed"] == 0
    first, second = data["checkpoints"]
    assert first["comparison"] is None and len(first["items"]["pick_ending"]) == 8
    interval = second["comparison"]["tasks"]["pick_ending"]["acc"]
    assert set(interval) == {"estimate", "low", "high", "items", "inside_noise"}


def test_table_marks_differences_inside_the_noise(models, task_dir):
    dense, p90 = models
    r = run(
        "eval",
        dense,
        p90,
        dense,
        "--tasks",
        "pick_ending,pick_ending_too",
        "--include-path",
        task_dir,
        "--limit",
        "8",
        "--device",
        "cpu",
        columns=250,
    )
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "mean acc" in lines[0]
    start = next(i for i, line in enumerate(lines) if line.startswith("difference to "))
    table = lines[start : start + 4]
    assert "pick_ending acc" in table[0] and "mean acc" in table[0]
    # the dense model against itself: +0.0000 [+0.0000, +0.0000] ~ in every column
    assert table[3].count("+0.0000 [+0.0000, +0.0000] ~") == 5
    assert lines[start + 4].startswith("95% interval: paired with the first checkpoint")
    assert "~ marks a difference inside the noise" in lines[start + 4]


@pytest.fixture(scope="module", autouse=True)
def second_task(task_dir):
    """pick_ending again under another name: a mean over two tasks."""
    yaml = (task_dir / "pick_ending.yaml").read_text()
    (task_dir / "pick_ending_too.yaml").write_text(
        yaml.replace("task: pick_ending", "task: pick_ending_too")
    )


# ----------------------------------------------------------------------------- --log-samples
def test_log_samples_writes_one_file_per_checkpoint_and_task(models, task_dir, tmp_path):
    dense, p90 = models
    out = tmp_path / "samples"
    r = run(
        "eval",
        dense,
        p90,
        "--tasks",
        "pick_ending,line_nll",
        "--include-path",
        task_dir,
        "--limit",
        "6",
        "--log-samples",
        out,
        "--json",
        "--device",
        "cpu",
    )
    assert r.exit_code == 0, r.stderr
    data = json.loads(r.stdout)
    assert S.problems(data, S.TASKS) == []
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "dense",
        "dense/line_nll.jsonl",
        "dense/pick_ending.jsonl",
        "p90",
        "p90/line_nll.jsonl",
        "p90/pick_ending.jsonl",
    ]  # no temporaries left behind
    for row in data["checkpoints"]:
        name = "dense" if row["name"] == str(dense) else "p90"
        assert row["logged"]["pick_ending"] == str(out / name / "pick_ending.jsonl")
        lines = [json.loads(x) for x in (out / name / "pick_ending.jsonl").read_text().splitlines()]
        assert [x["doc_id"] for x in lines] == list(range(6))
        for x, item in zip(lines, row["items"]["pick_ending"]):
            doc = x["doc"]
            assert x["target"] == doc["label"]
            assert [a[1].strip() for a in x["arguments"]] == doc["choices"]
            assert all(a[0] == doc["context"] for a in x["arguments"])
            assert len(x["loglikelihoods"]) == 2 and all(ll < 0 for ll in x["loglikelihoods"])
            best = max(range(2), key=lambda k: x["loglikelihoods"][k])
            assert x["metrics"]["acc"] == float(best == x["target"]) == item["acc"]
            assert x["metrics"]["acc_norm"] == item["acc_norm"]
        rolling = [json.loads(x) for x in (out / name / "line_nll.jsonl").read_text().splitlines()]
        assert len(rolling) == 6 and rolling[0]["is_greedy"] == [None]


def test_log_samples_misused(models, task_dir, tmp_path):
    dense, _ = models
    r = run("eval", dense, "--log-samples", tmp_path / "s")
    assert r.exit_code == 2 and "--log-samples applies to task accuracy only" in r.stderr
    (tmp_path / "file").write_text("x")
    r = run(
        "eval",
        dense,
        "--tasks",
        "pick_ending",
        "--include-path",
        task_dir,
        "--log-samples",
        tmp_path / "file",
    )
    assert r.exit_code == 1
    assert r.stderr.startswith("error: writing ") and "--log-samples" in r.stderr
    assert (tmp_path / "file").read_text() == "x"
