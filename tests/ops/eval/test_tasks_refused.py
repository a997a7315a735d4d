"""What eval --tasks still refuses, before any model is read, in one line: a task of a kind
sparsetool's harness model does not run (before any data set is read; also as a member of a group
or tag of the user's own), a task that samples its generations, and offline a task whose data is
not bundled (the harness's own gsm8k)."""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

from test_tasks import ending_items, sentences, write_tasks  # noqa: E402

from sparsetool.errors import ConfigError  # noqa: E402
from sparsetool.ops.tasks import RUNS, check_runs, check_tasks  # noqa: E402

from helpers import run  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_cache")  # conftest.py

REFUSED = (
    "error: task {} is of kind rank_choices, which sparsetool's harness model does not run (it "
    "runs multiple_choice, loglikelihood, loglikelihood_rolling, generate_until); leave it out of "
    "--tasks"
)


@pytest.fixture
def tasks(tmp_path):
    """The test's own tasks (test_tasks.write_tasks), and rank_choices, a kind the harness
    model does not run, over a data file that does not exist (never read)."""
    root = write_tasks(tmp_path / "tasks", ending_items(sentences(60), 4))
    text = (root / "pick_ending.yaml").read_text()
    text = text.replace("pick_ending", "rank_ending").replace("multiple_choice", "rank_choices")
    (root / "rank_ending.yaml").write_text(text.replace("items.jsonl", "missing.jsonl"))
    return root


def test_gsm8k_offline_is_refused_as_not_bundled_before_any_model_is_read(tmp_path):
    """The checkpoint does not even exist: the refusal comes first."""
    r = run("eval", tmp_path / "no-such-model", "--tasks", "arc_easy,gsm8k", "--offline")
    assert r.exit_code == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(
        "error: --tasks gsm8k: the harness could not read the harness's cache (--offline)"
    )
    assert "; its data is not bundled (bundled: arc_easy, " in line and "nq_open, triviaqa" in line
    assert "mmlu, " in line and line.endswith("--include-path DIR")
    assert not (tmp_path / "no-such-model").exists()


def test_a_kind_not_run_is_refused_before_its_data_or_the_model(tasks, tmp_path):
    args = ["eval", tmp_path / "no-such-model", "--tasks", "pick_ending,rank_ending"]
    r = run(*args, "--include-path", tasks, columns=400)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [REFUSED.format("rank_ending")]


def test_a_group_or_tag_holding_a_kind_not_run_is_refused_by_its_member(tasks, tmp_path):
    (tasks / "mixed.yaml").write_text("group: mixed\ntask:\n  - pick_ending\n  - rank_ending\n")
    text = (tasks / "rank_ending.yaml").read_text()
    (tasks / "rank_ending.yaml").write_text(text.replace("metadata:", "tag: rankers\nmetadata:"))
    for name in ("mixed", "rankers"):
        with pytest.raises(ConfigError) as e:
            check_tasks([name], tmp_path / "work", include_path=tasks)
        assert str(e.value) == REFUSED.format("rank_ending").removeprefix("error: ")
    manager, names, _ = check_tasks(["pick_ending", "write_ending"], tmp_path / "w", tasks)
    assert names == ["pick_ending", "write_ending"]  # generating text runs


def test_a_task_that_samples_its_generations_is_refused_before_the_model(tasks, tmp_path):
    text = (tasks / "write_ending.yaml").read_text()
    (tasks / "write_ending.yaml").write_text(
        text.replace("generation_kwargs:", "generation_kwargs:\n  do_sample: true")
    )
    r = run("eval", tmp_path / "no-such-model", "--tasks", "write_ending", "--include-path", tasks)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [
        "error: task write_ending samples its generations (do_sample: true); only greedy "
        "generation runs; leave it out of --tasks"
    ]


def test_the_kinds_that_run_are_said_in_one_place():
    assert RUNS == ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")
    for kind in (*RUNS, None):
        check_runs("t", kind)
    with pytest.raises(ConfigError, match="task t is of kind something_else, which"):
        check_runs("t", "something_else")
