"""A task that generates text is refused before any data set or model is read, offline or not, in
one line naming it and the kinds that run (the harness's own gsm8k; a group and a tag of the
user's own that hold one)."""

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
    "error: task {} generates text (generate_until); only log-likelihood tasks (multiple_choice, "
    "loglikelihood, loglikelihood_rolling) are supported; leave it out of --tasks"
)


@pytest.mark.parametrize("offline", [True, False])
def test_gsm8k_is_refused_before_any_model_or_data_is_read(offline, tmp_path):
    """The checkpoint does not even exist: the refusal comes first. Without --offline the data set
    is never asked for (this process is offline: a fetch would fail with another message)."""
    args = ["eval", tmp_path / "no-such-model", "--tasks", "arc_easy,gsm8k"]
    r = run(*args, *(["--offline"] if offline else []), columns=400)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [REFUSED.format("gsm8k")]
    assert not (tmp_path / "no-such-model").exists()


def test_a_group_or_tag_holding_a_generating_task_is_refused_by_its_member(tmp_path):
    tasks = write_tasks(tmp_path / "tasks", ending_items(sentences(60), 4))
    (tasks / "mixed.yaml").write_text("group: mixed\ntask:\n  - pick_ending\n  - write_ending\n")
    text = (tasks / "write_ending.yaml").read_text()
    (tasks / "write_ending.yaml").write_text(text.replace("metadata:", "tag: writers\nmetadata:"))
    for name in ("mixed", "writers"):
        with pytest.raises(ConfigError) as e:
            check_tasks([name], tmp_path / "work", include_path=tasks)
        assert str(e.value) == REFUSED.format("write_ending").removeprefix("error: ")
    manager, names, _ = check_tasks(["pick_ending", "line_nll"], tmp_path / "w", tasks)
    assert names == ["pick_ending", "line_nll"]


def test_the_kinds_that_run_are_said_in_one_place():
    assert RUNS == ("multiple_choice", "loglikelihood", "loglikelihood_rolling")
    for kind in (*RUNS, None):
        check_runs("t", kind)
    with pytest.raises(ConfigError, match="task t is not scored by log-likelihood"):
        check_runs("t", "something_else")
