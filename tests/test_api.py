"""The Python API: sparsetool.load decodes every encoding to the same dense tensors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import sparsetool
from sparsetool.ops.prune import PruneOptions, prune_checkpoint


@pytest.fixture
def dense_file(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "h.0.attn.c_attn.weight": torch.randn(8, 24, generator=gen),
        "h.0.mlp.c_fc.weight": torch.randn(8, 32, generator=gen),
        "h.0.ln_1.weight": torch.ones(8),
        "wte.weight": torch.randn(16, 8, generator=gen),
    }
    path = tmp_path / "dense.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("encoding", ["zeros", "mask", "nan", "bitmask"])
def test_load_decodes_every_encoding_to_the_same_dense_tensors(tmp_path, dense_file, encoding):
    path, tensors = dense_file
    reference = tmp_path / "zeros.safetensors"
    prune_checkpoint(path, reference, PruneOptions(sparsity=0.5))
    out = tmp_path / f"{encoding}.safetensors"
    prune_checkpoint(path, out, PruneOptions(sparsity=0.5, encoding=encoding))
    want = sparsetool.load(reference)
    got = sparsetool.load(out)
    assert sorted(got) == sorted(tensors)  # no _mask or bitmask part names leak out
    for name, t in got.items():
        assert t.dtype == tensors[name].dtype and t.shape == tensors[name].shape
        assert not torch.isnan(t).any()
        assert torch.equal(t, want[name]), name
    attn = got["h.0.attn.c_attn.weight"]
    assert int((attn == 0).sum()) == attn.numel() // 2
    # pruned entries are +0.0, never -0.0
    assert not torch.signbit(attn[attn == 0]).any()
    # untargeted tensors come back untouched
    assert torch.equal(got["wte.weight"], tensors["wte.weight"])


def test_import_sparsetool_does_not_import_torch():
    code = "import sys, sparsetool; sparsetool.__version__; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_prune_report_densify_api_match_the_cli(tmp_path, dense_file):
    path, tensors = dense_file
    pruned = tmp_path / "p.safetensors"
    result = sparsetool.prune(path, pruned, sparsity=0.75, encoding="mask")
    assert result.targeted_sparsity == 0.75
    rep = sparsetool.report(pruned)
    summary = rep.to_json()["summary"]
    assert summary["targeted_sparsity"] == 0.75
    assert summary["targeted_tensors"] == 2
    cli = subprocess.run(
        [sys.executable, "-m", "sparsetool", "report", str(pruned), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    import json

    assert json.loads(cli.stdout)["summary"] == summary
    dense = tmp_path / "d.safetensors"
    sparsetool.densify(pruned, dense)
    from safetensors import safe_open

    with safe_open(str(dense), "pt") as f:
        assert not any(k.endswith("_mask") for k in f.keys())
    assert all(
        torch.equal(a, b)
        for a, b in zip(sparsetool.load(dense).values(), sparsetool.load(pruned).values())
    )
    nm = sparsetool.prune(path, tmp_path / "nm.safetensors", nm="2:4")
    assert nm.targeted_sparsity == 0.5


def test_api_refuses_bad_input_with_sparsetool_error(tmp_path, dense_file):
    from sparsetool.errors import SparsetoolError

    path, _ = dense_file
    with pytest.raises(SparsetoolError, match="sparsity"):
        sparsetool.prune(path, tmp_path / "x.safetensors", sparsity=1.5)
    with pytest.raises(SparsetoolError, match="output"):
        sparsetool.prune(path, sparsity=0.5)
    assert not (tmp_path / "x.safetensors").exists()


def test_eval_and_diff_api(tmp_path):
    from sparsetool.models.gpt import GPT, GPTConfig
    from sparsetool.train.runfiles import save_model

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, context=32)
    save_model(tmp_path / "gpt.safetensors", GPT(cfg), {}, {"model": cfg.to_dict()})
    pruned = tmp_path / "gpt-50.safetensors"
    sparsetool.prune(tmp_path / "gpt.safetensors", pruned, sparsity=0.5, include="blocks.*.weight")
    res = sparsetool.eval([tmp_path / "gpt.safetensors", pruned], text="hello sparse world " * 20)
    assert len(res.rows) == 2 and res.rows[1].targeted_sparsity > res.rows[0].targeted_sparsity
    d = sparsetool.diff(tmp_path / "gpt.safetensors", pruned)
    assert d.summary["pruned"] > 0 and d.summary["revived"] == 0


def test_eval_reads_a_str_naming_a_file_as_the_cli_reads_text(tmp_path, monkeypatch):
    """sparsetool.eval(..., text="heldout.txt") scores the file, not the 11 characters of its
    name; a file name that names nothing is refused; other strings are the text (issue 31, item 3).
    """
    from pathlib import Path

    from sparsetool.errors import SparsetoolError
    from sparsetool.models.gpt import GPT, GPTConfig
    from sparsetool.train.runfiles import save_model

    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, context=32)
    model = tmp_path / "gpt.safetensors"
    save_model(model, GPT(cfg), {}, {"model": cfg.to_dict()})
    body = "held-out text, long enough to score a few windows of it. " * 10
    (tmp_path / "heldout.txt").write_text(body)
    monkeypatch.chdir(tmp_path)
    by_name = sparsetool.eval(model, text="heldout.txt")
    by_path = sparsetool.eval(model, text=Path("heldout.txt"))
    as_text = sparsetool.eval(model, text=body)
    assert by_name.rows[0].tokens == by_path.rows[0].tokens == as_text.rows[0].tokens > 500
    assert by_name.rows[0].nll == by_path.rows[0].nll and by_name.text_source == "heldout.txt"
    for missing in ("held-out.txt", "data/heldout"):
        with pytest.raises(
            SparsetoolError,
            match=f"text='{missing}' looks like a file name, but there is no such file",
        ):
            sparsetool.eval(model, text=missing)
    assert sparsetool.eval(model, text="just words").rows[0].tokens == len("just words") - 1


def test_simulate_is_a_function_with_the_cli_parameter_names(tmp_path):
    """sparsetool.simulate returns a SimulationResult whose to_json() is what `simulate --json`
    prints (issue 31, item 4)."""
    import json

    from helpers import ROOT, run

    r = run(
        "simulate",
        "--model",
        "gpt2-small",
        "--sparsity",
        "0.5,0.9",
        "--device",
        "cs2",
        "--tokens",
        "4K",
        "--json",
    )
    assert r.exit_code == 0, r.output
    got = sparsetool.simulate(model="gpt2-small", sparsity="0.5,0.9", device="cs2", tokens="4K")
    assert json.loads(json.dumps(got.to_json())) == json.loads(r.stdout)
    assert got.sweep and got.verified is None and got.reclaimed == []
    assert [
        x["sparsity"] for x in sparsetool.simulate(model="gpt2-small", sparsity=[0.5, 0.9]).runs
    ] == [0.5, 0.9]
    tiny = ROOT / "fixtures" / "tiny-gpt2"
    pruned = tmp_path / "p"
    sparsetool.prune(tiny, pruned, sparsity=0.5)
    one = sparsetool.simulate(pruned, device=["cs2"])
    assert not one.sweep and abs(one.runs[0]["sparsity"] - 0.5) < 1e-9
    assert [d["name"] for d in one.devices] == ["cs2"] and one.workload["source"] == "checkpoint"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    import re
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    block = re.search(r"## Python API.*?```python\n(.*?)```", readme, re.S).group(1)
    shutil.copytree(root / "fixtures" / "tiny-gpt2", tmp_path / "fixtures" / "tiny-gpt2")
    monkeypatch.chdir(tmp_path)
    printed = []
    exec(
        compile(block, "README.md", "exec"),
        {"print": lambda *a: printed.append(" ".join(map(str, a)))},
    )
    assert printed[0] == "75.00%"
    assert printed[1].startswith("8 ")
    assert printed[2] == "torch.Size([64, 192]) " + str(round(0.75 * 64 * 192))
    assert 0 < float(printed[3]) < 1


TASK = """\
task: tail_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
metadata:
  version: 1.0
"""


def test_eval_with_tasks_is_eval_tasks_of_the_cli(tmp_path, monkeypatch):
    """sparsetool.eval(..., tasks=[...]) returns what `eval --tasks ... --json` prints, with the
    CLI's task options under their parameter names (real lm-evaluation-harness, a task over a
    local JSON file, fixtures/tiny-lm)."""
    import json

    from helpers import ROOT, run

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    lines = (ROOT / "fixtures" / "heldout.txt").read_text().split()
    items = [
        {
            "context": " ".join(lines[i : i + 6]),
            "label": i % 2,
            "choices": [lines[i + 6], lines[i + 40]][:: 1 if i % 2 == 0 else -1],
        }
        for i in range(0, 400, 20)
    ]
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "tail_choice.yaml").write_text(TASK.format(data=tmp_path / "items.jsonl"))
    lm = ROOT / "fixtures" / "tiny-lm"
    pruned = tmp_path / "lm-75"
    sparsetool.prune(lm, pruned, sparsity=0.75)
    got = sparsetool.eval(
        [lm, pruned],
        tasks=["tail_choice"],
        include_path=tasks,
        limit=12,
        seed=3,
        device="cpu",
        log_samples=tmp_path / "samples",
    )
    r = run(
        "eval",
        lm,
        pruned,
        "--tasks",
        "tail_choice",
        "--include-path",
        tasks,
        "--limit",
        "12",
        "--seed",
        "3",
        "--device",
        "cpu",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    cli, api = json.loads(r.stdout), json.loads(json.dumps(got.to_json()))
    for row in cli["checkpoints"] + api["checkpoints"]:
        del row["seconds"], row["memory"], row["logged"]
    assert api == cli
    assert got.rows[1].comparison["tasks"]["tail_choice"]["acc"]["items"] == 12
    logged = (tmp_path / "samples" / "lm-75" / "tail_choice.jsonl").read_text()
    assert len(logged.splitlines()) == 12
    with_text = sparsetool.eval(
        lm, tasks="tail_choice", include_path=tasks, limit=2, text=" ".join(lines[:300]), seq=32
    )
    assert with_text.rows[0].perplexity > 1 and with_text.text_source == "given text"
