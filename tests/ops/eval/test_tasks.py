"""sparsetool eval --tasks: lm-evaluation-harness with sparsetool as its model. A small task built
here (a task YAML over a local JSON file: pick the true ending of a line of the test's own text),
small random models and a tokenizer trained here, the built-in GPT trained for a few steps;
nothing is downloaded."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest
import torch

from sparsetool.ops.prune import PruneOptions, prune_checkpoint

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

import lm_eval  # noqa: E402  (after the offline switches above)
import transformers  # noqa: E402  (after the offline switches above)

from sparsetool.ops.tasks import evaluate_tasks  # noqa: E402

from helpers import hf_model, run, save_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("datasets_cache")  # conftest.py

TASK_YAML = """\
task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "{doc_to_text}"
doc_to_target: "{doc_to_target}"
{extra}metadata:
  version: 1.0
"""
CHOICE = dict(
    output_type="multiple_choice",
    doc_to_text="{{context}}",
    doc_to_target="{{label}}",
    extra='doc_to_choice: "{{choices}}"\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n',
)
ROLLING = dict(
    output_type="loglikelihood_rolling",
    doc_to_text="",
    doc_to_target="{{text}}",
    extra="metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n"
    "  - metric: bits_per_byte\n",
)
GENERATE = dict(
    output_type="generate_until",
    doc_to_text="{{context}}",
    doc_to_target="{{text}}",
    extra='generation_kwargs:\n  until: ["\\n"]\nmetric_list:\n  - metric: exact_match\n',
)


NOUNS = [
    "model",
    "weight",
    "mask",
    "layer",
    "token",
    "text",
    "tensor",
    "matrix",
    "head",
    "block",
    "kernel",
    "row",
]
VERBS = [
    "prunes",
    "keeps",
    "drops",
    "reads",
    "writes",
    "masks",
    "scores",
    "sorts",
    "ranks",
    "packs",
    "loads",
    "counts",
]
ADJS = [
    "sparse",
    "dense",
    "small",
    "large",
    "quiet",
    "bright",
    "early",
    "late",
    "empty",
    "full",
    "plain",
    "round",
]


def sentences(lines: int = 1500, seed: int = 0) -> str:
    """Lines drawn from twelve fixed sentences of six words: the second half of a sentence follows
    from its first, which a model that learned the text knows and a mangled one does not."""
    rng = random.Random(seed)
    fixed = [f"the {ADJS[i]} {NOUNS[i]} {VERBS[i]} every {NOUNS[(i + 5) % 12]}" for i in range(12)]
    return "\n".join(rng.choice(fixed) for _ in range(lines))


def ending_items(text: str, n: int, seed: int = 0) -> list[dict]:
    """Lines of ``text`` cut after three words: the true ending against another line's ending, in a
    random order."""
    rng = random.Random(seed)
    lines = [ln.split() for ln in text.splitlines()]
    items = []
    for words in lines[:n]:
        ending = " ".join(words[3:])
        other = ending
        while other == ending:
            other = " ".join(rng.choice(lines)[3:])
        label = rng.randrange(2)
        items.append(
            {
                "context": " ".join(words[:3]),
                "label": label,
                "text": " ".join(words),
                "choices": [other, ending] if label else [ending, other],
            }
        )
    return items


def write_tasks(root: Path, items: list[dict]) -> Path:
    """pick_ending (multiple choice), line_nll (rolling log-likelihood of each line), write_ending
    (generates text), all over ``items``."""
    root.mkdir(parents=True, exist_ok=True)
    data = root / "items.jsonl"
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    for name, kind in (("pick_ending", CHOICE), ("line_nll", ROLLING), ("write_ending", GENERATE)):
        (root / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=data, **kind))
    return root


@pytest.fixture(scope="module")
def text() -> str:
    return sentences()


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, text) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"), ending_items(text, 24))


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, text) -> Path:
    d = tmp_path_factory.mktemp("hf") / "dense"
    torch.manual_seed(0)
    hf_model("gpt2").eval().save_pretrained(d)
    save_tokenizer(d, text)
    return d


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory, text) -> Path:
    """sparsetool's GPT trained on the text long enough to know its sentences."""
    root = tmp_path_factory.mktemp("gpt")
    (root / "corpus.txt").write_text(text)
    r = run(
        "train",
        "--out",
        str(root / "run"),
        "--data",
        str(root / "corpus.txt"),
        "--preset",
        "tiny",
        "--steps",
        "200",
        "--batch-size",
        "8",
        "--warmup",
        "10",
        "--lr",
        "0.01",
        "--seed",
        "0",
        "--json",
    )
    assert r.exit_code == 0, r.output
    return root / "run"


def harness_hf(directory: Path, task_dir: Path, tasks: list[str]) -> dict:
    """The harness's own ``hf`` model on ``directory``: float32, the model's default attention
    (sdpa), as sparsetool eval runs it."""
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(
        model="hf",
        model_args={
            "pretrained": str(directory),
            "dtype": "float32",
        },
        tasks=tasks,
        device="cpu",
        log_samples=False,
        task_manager=TaskManager(include_path=str(task_dir), include_defaults=False),
    )
    return out["results"]


def run_cli(*args: str) -> tuple[int, str, str]:
    r = run("eval", *args)
    return r.exit_code, r.stdout, r.stderr


# ----------------------------------------------------------------------------- agreement
@pytest.mark.slow
def test_accuracies_equal_the_harness_own_hf_model(gpt2_dir, task_dir):
    ours = evaluate_tasks(
        [gpt2_dir], ["pick_ending", "line_nll"], include_path=task_dir, device="cpu"
    ).rows[0]
    theirs = harness_hf(gpt2_dir, task_dir, ["pick_ending", "line_nll"])
    for metric in ("acc", "acc_norm", "acc_stderr", "acc_norm_stderr"):
        assert ours.metric("pick_ending", metric) == theirs["pick_ending"][f"{metric},none"]
    assert 0.0 < ours.metric("pick_ending", "acc") < 1.0  # not a task every model gets right
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert ours.metric("line_nll", metric) == pytest.approx(
            theirs["line_nll"][f"{metric},none"], rel=1e-5
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3_moe", "gpt_oss"])
def test_mixture_of_experts_accuracies_equal_the_harness_own_hf_model(
    kind, task_dir, text, tmp_path
):
    """Experts stored apart (Qwen3-MoE) and fused on disk beside mixed attention (gpt-oss)."""
    from moe_models import save_moe

    directory = save_moe(kind, tmp_path / kind, text)
    ours = evaluate_tasks([directory], ["pick_ending"], include_path=task_dir, device="cpu").rows[0]
    theirs = harness_hf(directory, task_dir, ["pick_ending"])
    for metric in ("acc", "acc_norm"):
        assert ours.metric("pick_ending", metric) == theirs["pick_ending"][f"{metric},none"]


def test_accuracy_by_hand_from_the_model_log_probabilities(gpt2_dir, tmp_path, text):
    """Two items, scored by transformers' own forward pass: the choice of higher log-probability."""
    items = ending_items(text, 2)
    task_dir = write_tasks(tmp_path / "two", items)
    tok = transformers.AutoTokenizer.from_pretrained(gpt2_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    right = right_norm = 0
    for item in items:
        scores = []
        for choice in item["choices"]:
            ctx = tok.encode(item["context"])
            whole = tok.encode(item["context"] + " " + choice)
            with torch.no_grad():
                lsm = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
            scores.append(sum(float(lsm[j - 1, whole[j]]) for j in range(len(ctx), len(whole))))
        right += max(range(2), key=lambda k: scores[k]) == item["label"]
        norm = [s / len((" " + c).encode()) for s, c in zip(scores, item["choices"])]
        right_norm += max(range(2), key=lambda k: norm[k]) == item["label"]
    row = evaluate_tasks([gpt2_dir], ["pick_ending"], include_path=task_dir, device="cpu").rows[0]
    assert row.samples["pick_ending"] == 2
    assert row.metric("pick_ending", "acc") == right / 2
    assert row.metric("pick_ending", "acc_norm") == right_norm / 2


def test_every_length_passes_the_blocks_together_each_block_read_once(gpt2_dir):
    """Inputs of several lengths share one pass when memory allows: every block's tensors read
    once and the final pass set up once (not once per length), with the log-probabilities of
    scoring each request on its own."""
    from sparsetool.models.open import open_model
    from sparsetool.ops.scoring import passes, score_requests

    pairs = [
        ([5, 6, 7], [8]),
        ([5, 6, 7], [9]),
        ([5, 6], [9, 10]),
        ([1] * 10, [2]),
        ([3, 4], [7, 7, 7]),
        ([2] * 30, [4]),
        ([8, 9, 10, 11], [12]),
    ]
    model = open_model(gpt2_dir, "float32", "cpu")
    reads, finals = [], []
    read, final_hidden = model.read, model.final_hidden
    model.read = lambda stored: (reads.append(stored), read(stored))[1]
    model.final_hidden = lambda calls: (finals.append(len(calls)), final_hidden(calls))[1]
    try:
        together = score_requests(model, pairs, 64, batch=2)
        block = [p.stored for names in model.blocks for n in names for p in model.sources[n]]
        assert sorted(r for r in reads if r in block) == sorted(block) and finals == [
            4
        ]  # 4 batches
        alone = [score_requests(model, [p], 64)[0] for p in pairs]
    finally:
        model.close()
    assert [g for _, g in together] == [g for _, g in alone]
    assert [lp for lp, _ in together] == pytest.approx([lp for lp, _ in alone], rel=1e-6)
    # with room for two inputs of the longest length (10 tokens): passes of at most 10 tokens
    seqs = [(0,) * n for n in (5, 5, 3, 3, 3, 2)]
    assert passes(seqs, 2, 2) == [[[0, 1]], [[2, 3], [4]], [[5]]]
    assert passes(seqs, 2, None) == [[[0, 1], [2, 3], [4], [5]]]


# --------------------------------------------------------------------- sparsity, encodings, the GPT
@pytest.mark.slow
def test_dense_gpt_beats_its_90_percent_random_pruned_copy(gpt_run, task_dir, tmp_path):
    pruned = tmp_path / "p90"
    prune_checkpoint(gpt_run, pruned, PruneOptions(sparsity=0.9, method="random", encoding="zeros"))
    code, out, err = run_cli(
        str(gpt_run),
        str(pruned),
        "--tasks",
        "pick_ending",
        "--include-path",
        str(task_dir),
        "--json",
        "--batch",
        "4",
    )
    assert code == 0, err
    dense, sparse = json.loads(out)["checkpoints"]
    assert dense["kind"] == "sparsetool-gpt" and sparse["targeted_sparsity"] == pytest.approx(
        0.9, abs=0.01
    )
    acc = [r["metrics"]["pick_ending"]["acc,none"] for r in (dense, sparse)]
    assert acc[0] >= 0.8 and acc[0] > acc[1] + 0.15


@pytest.mark.slow
def test_nan_and_bitmask_outputs_score_like_zeros(gpt2_dir, task_dir, tmp_path):
    outs = {}
    for encoding in ("zeros", "nan", "bitmask"):
        prune_checkpoint(
            gpt2_dir, tmp_path / encoding, PruneOptions(sparsity=0.5, encoding=encoding)
        )
    rows = evaluate_tasks(
        [tmp_path / e for e in ("zeros", "nan", "bitmask")],
        ["pick_ending", "line_nll"],
        include_path=task_dir,
        device="cpu",
    ).rows
    for row in rows:
        outs[row.name] = row.metrics
        assert row.targeted_sparsity == pytest.approx(0.5, abs=0.01)
    zeros, nan, bitmask = outs.values()
    assert zeros == nan == bitmask


# ----------------------------------------------------------------------------- the command
def test_cli_table_with_perplexity_and_json_versions(gpt_run, task_dir, text, tmp_path):
    (tmp_path / "t.txt").write_text(text[:3000])
    code, out, err = run_cli(
        str(gpt_run),
        "--tasks",
        "pick_ending",
        "--include-path",
        str(task_dir),
        "--limit",
        "6",
        "--text",
        str(tmp_path / "t.txt"),
        "--seed",
        "3",
    )
    assert code == 0, err
    header, _, row, footer = out.splitlines()[:4]
    for col in (
        "checkpoint",
        "targeted sparsity",
        "perplexity",
        "pick_ending acc",
        "pick_ending acc_norm",
    ):
        assert col in header
    assert "±" in row and str(gpt_run) in row
    assert f"lm-evaluation-harness {lm_eval_version()}" in footer and "pick_ending v1.0" in footer
    assert "6 documents" in footer
    code, out, err = run_cli(
        str(gpt_run),
        "--tasks",
        "pick_ending",
        "--include-path",
        str(task_dir),
        "--limit",
        "6",
        "--json",
    )
    data = json.loads(out)
    assert data["harness"] == {"name": "lm-evaluation-harness", "version": lm_eval_version()}
    assert data["tasks"]["pick_ending"] == {"version": 1.0, "n_shot": 0}
    assert "acc,none" in data["checkpoints"][0]["metrics"]["pick_ending"]
    assert "[Task" not in err and "Tokenizing" not in err  # the harness's logging and its own bars


def lm_eval_version() -> str:
    from importlib.metadata import version

    return version("lm_eval")


def test_unknown_task_names_the_closest(gpt_run, task_dir):
    code, _, err = run_cli(str(gpt_run), "--tasks", "pick_endin", "--include-path", str(task_dir))
    assert code == 1 and "did you mean pick_ending?" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["--limit", "3"], "--limit applies to task accuracy only"),
        (["--include-path", "."], "--include-path applies to task accuracy only"),
        (["--tasks", "x", "--seq", "8"], "--tasks and --seq do not go together"),
        (["--tasks", "x", "--plot", "p.png"], "--tasks and --plot do not go together"),
        (["--tasks", " , "], "--tasks: give at least one task name"),
    ],
)
def test_task_options_misused_are_usage_errors(args, message, gpt_run):
    code, _, err = run_cli(str(gpt_run), *args)
    assert code == 2 and message in err


def test_without_the_harness_the_error_names_the_extra(gpt_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    code, _, err = run_cli(str(gpt_run), "--tasks", "arc_easy")
    assert code == 1
    assert err.strip() == (
        "error: --tasks runs EleutherAI's lm-evaluation-harness (lm-eval), which is not "
        "installed: pip install 'sparsetool[eval]' (or pip install -e '.[eval]' in a "
        "source checkout)"
    )
