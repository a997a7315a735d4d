"""Every table of every command, rendered without a terminal at 80 and at 40 columns: each number
and each name appears whole (never cut with an ellipsis, never folded across lines), and wide
characters line up (display width, not string length)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console
from safetensors.torch import save_file

from sparsetool.cli import _output

from helpers import run as cli

WIDTHS = (80, 40)
PREFIX = "language_model.model.layers"  # long names, as multimodal checkpoints have


def run(args: list[str], width: int) -> str:
    res = cli(*args, columns=width)
    assert res.exit_code == 0, res.output
    return res.stdout


def as_json(args: list[str]) -> dict | list:
    return json.loads(run([*args, "--json"], 80))


def assert_whole(out: str, figures: list[str]) -> None:
    assert "…" not in out, out
    missing = [f for f in figures if f not in out]
    assert not missing, f"cut or folded: {missing[:5]}\n{out}"


def llama_state(n_layer: int, d: int = 16, ff: int = 32, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    st = {
        "language_model.model.embed_tokens.weight": torch.randn(64, d, generator=g),
        "language_model.model.norm.weight": torch.ones(d),
    }
    for i in range(n_layer):
        p = f"{PREFIX}.{i}."
        for m, shape in (
            ("self_attn.q_proj", (d, d)),
            ("self_attn.k_proj", (d, d)),
            ("self_attn.v_proj", (d, d)),
            ("self_attn.o_proj", (d, d)),
            ("mlp.gate_proj", (ff, d)),
            ("mlp.up_proj", (ff, d)),
            ("mlp.down_proj", (d, ff)),
        ):
            st[p + m + ".weight"] = torch.randn(*shape, generator=g)
        st[p + "input_layernorm.weight"] = torch.ones(d)
    return st


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tables")
    a, b = root / "dense.safetensors", root / "other.safetensors"
    save_file(llama_state(2), str(a), metadata={"format": "pt"})
    save_file(llama_state(2, seed=1), str(b), metadata={"format": "pt"})
    sparse = root / "sparse-75.safetensors"
    res = cli("prune", str(a), "-o", str(sparse), "--sparsity", "0.75", "-q")
    assert res.exit_code == 0, res.output
    return {"dense": a, "other": b, "sparse": sparse, "root": root}


@pytest.mark.parametrize("width", WIDTHS)
def test_flops_tables_keep_every_figure(width):
    one = as_json(["flops", "--model", "gpt3-xl", "--sparsity", "0.75"])["runs"][0]
    out = run(["flops", "--model", "gpt3-xl", "--sparsity", "0.75", "--breakdown"], width)
    # the parameters rows of the issue: "1,315,723…" and "409,753,…" before
    assert_whole(
        out,
        [
            f"{one['params']:,.0f}",
            f"{one['nonzero_params']:,.0f}",
            "1,315,723,264",
            "409,753,600",
            "3 x forward (backward = 2 x forward)",
        ],
    )
    from sparsetool.flops import get_preset, term_formulas

    assert_whole(out, list(term_formulas(get_preset("gpt3-xl")).values()))
    out = run(
        ["flops", "--model", "gpt3-xl", "--sparsity", "0,0.5,0.75", "--finetune-tokens", "64.5M"],
        width,
    )
    rows = as_json(
        ["flops", "--model", "gpt3-xl", "--sparsity", "0,0.5,0.75", "--finetune-tokens", "64.5M"]
    )["runs"]
    from sparsetool.cli._output import si

    assert_whole(out, ["e2e speed-up", *[si(r["train_flops_per_seq"], "FLOP") for r in rows]])
    out = run(["flops", "--model", "gpt3-xl", "--stage", "0.75:0.5", "--stage", "0:0.5"], width)
    assert_whole(out, ["Variable SPDF stages", "1,315,723,264"])
    out = run(["flops", "--list"], width)
    presets = as_json(["flops", "--list"])
    assert_whole(out, [*presets, *[str(c["vocab"]) for c in presets.values()]])


@pytest.mark.parametrize("width", WIDTHS)
def test_simulate_tables_keep_tensor_and_device_names(files, width):
    data = as_json(["simulate", files["sparse"]])
    names = [r["name"] for r in data["layers"]]
    assert names and all(n.startswith(PREFIX) for n in names)
    out = run(["simulate", files["sparse"], "--layers"], width)
    assert_whole(out, names + [d["name"] for d in data["devices"]])
    sweep = as_json(["simulate", "--shape", "4096x4096", "--sweep"])
    out = run(["simulate", "--shape", "4096x4096", "--sweep"], width)
    assert_whole(
        out, list(sweep["runs"][0]["devices"]) + [f"{r['sparsity']:.2f}" for r in sweep["runs"]]
    )
    out = run(["simulate", "--model", "gpt3-xl", "--sparsity", "0.75"], width)
    assert_whole(out, ["where the training step's time goes"])


@pytest.mark.parametrize("width", WIDTHS)
def test_report_diff_prune_densify_keep_names_and_counts(files, width):
    data = as_json(["report", files["sparse"]])
    out = run(["report", files["sparse"]], width)
    assert_whole(
        out,
        [t["name"] for t in data["tensors"]]
        + [f"{t['numel']:,}" for t in data["tensors"]]
        + [f"{t['nonzero']:,}" for t in data["tensors"]],
    )
    data = as_json(["diff", files["dense"], files["other"]])
    out = run(["diff", files["dense"], files["other"]], width)
    assert_whole(
        out, [t["name"] for t in data["tensors"]] + [f"{t['revived']:,}" for t in data["tensors"]]
    )
    target = (
        files["root"] / f"a-rather-long-output-name-for-the-pruned-checkpoint-{width}.safetensors"
    )
    out = run(["prune", files["dense"], "-o", target, "--sparsity", "0.5"], width)
    assert_whole(out, [str(target)])
    dense = (
        files["root"]
        / f"a-rather-long-output-name-for-the-densified-checkpoint-{width}.safetensors"
    )
    out = run(["densify", target, "-o", dense], width)
    assert_whole(out, [str(dense)])


@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory) -> tuple[Path, dict[int, str]]:
    from helpers import make_corpus

    root = tmp_path_factory.mktemp("a-run-directory-with-a-name-long-enough-to-wrap")
    data = make_corpus(root / "corpus", files=4)
    outputs = {}
    for width in WIDTHS:  # the summary table at the end of training
        outputs[width] = run(
            [
                "train",
                "--out",
                root / f"run-{width}",
                "--data",
                data,
                "--preset",
                "tiny",
                "--steps",
                "4",
                "--batch-size",
                "2",
                "--warmup",
                "1",
                "--seed",
                "0",
                "--sparsity",
                "0.5",
                "--algorithm",
                "static",
            ],
            width,
        )
    return root, outputs


@pytest.mark.parametrize("width", WIDTHS)
def test_train_summary_and_eval_keep_paths_and_counts(gpt_run, width):
    root, outputs = gpt_run
    run_dir = root / f"run-{width}"
    assert_whole(
        outputs[width],
        [str(run_dir / "model.safetensors"), str(run_dir / "log.jsonl"), str(run_dir / "loss.png")],
    )
    data = as_json(["eval", run_dir, "--max-tokens", "300"])
    out = run(["eval", run_dir, "--max-tokens", "300"], width)
    row = data["checkpoints"][0]
    assert_whole(out, [row["name"], f"{row['nonzero_params']:,}", f"{row['tokens']:,}"])


def test_wide_characters_line_up(tmp_path):
    """Column positions count display cells: an emoji or a CJK character takes two."""
    path = tmp_path / "wide.safetensors"
    save_file(
        {
            "blocks.0.注意力.weight": torch.zeros(4, 4),
            "blocks.0.🙂.weight": torch.ones(2, 2),
            "blocks.0.plain.weight": torch.ones(3),
        },
        str(path),
    )
    out = run(["report", path], 80)
    lines = out.splitlines()[1:6]  # after the title: header, rule and three rows
    assert sum("blocks.0." in line for line in lines) == 3
    assert len({cell_len(line) for line in lines}) == 1, lines  # the last column is right-aligned


def test_terminal_gets_a_rich_table_only_when_every_cell_fits(monkeypatch):
    header = ["name", "numel"]
    rows = [["transformer.h.11.mlp.c_proj.weight", "2,359,296"], ["wte", "38,597,376"]]
    for width, boxed in ((100, True), (30, False)):
        buf = io.StringIO()
        monkeypatch.setattr(
            _output,
            "console",
            Console(file=buf, force_terminal=True, width=width, color_system=None),
        )
        plain = io.StringIO()
        monkeypatch.setattr(_output.sys, "stdout", plain)
        _output.print_table(header, rows, title="t")
        out = buf.getvalue() + plain.getvalue()
        assert ("┃" in out) is boxed, out
        assert_whole(out, [c for r in rows for c in r])


def test_markdown_and_github_formats(tmp_path, gpt2_file):
    for fmt, rule in (("markdown", ":|"), ("github", "-|")):
        out = run(["report", gpt2_file, "--format", fmt], 40)
        lines = [ln for ln in out.splitlines() if ln.startswith("|")]
        assert lines[1].replace(" ", "").endswith(rule) and len({cell_len(ln) for ln in lines}) == 1
        # The summary after a pipe table is separated by a blank line (else Markdown reads it as a
        # row).
        after = out.splitlines()[out.splitlines().index(lines[-1]) + 1]
        assert after == "", out


def test_json_output_is_strict_json_with_null_for_infinite_figures(capsys):
    """An overflowed perplexity is inf; json.dumps would print `Infinity`, which no strict JSON
    parser reads."""
    import json as _json

    _output.emit_json(
        {"perplexity": float("inf"), "nll": float("nan"), "runs": [1.5, float("-inf")]}
    )
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out
    assert _json.loads(out) == {"perplexity": None, "nll": None, "runs": [1.5, None]}
