"""Every command's ``--json`` keeps one shape whatever its input (README "JSON output"): each input
form below is checked against the command's schema in json_schemas.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import save_file

import json_schemas as S
from helpers import gpt2_like_state, run


def as_json(*args: str) -> object:
    r = run(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def conforms(value: object, schema: object) -> None:
    found = S.problems(value, schema)
    assert not found, "\n".join(found[:20])


def test_the_checker_finds_what_differs():
    schema = S.obj(a=S.INT, b=S.arr(S.obj(c=S.OPT_NUM)), d=S.nullable(S.mapping(S.STR)))
    assert S.problems({"a": 1, "b": [{"c": None}, {"c": 2.5}], "d": None}, schema) == []
    assert S.problems([{"a": 1}], schema) == ["$: expected an object, got list"]
    found = S.problems({"a": True, "b": [{"c": "x"}], "d": {"k": 3}, "e": 0}, schema)
    assert found == [
        "$: unexpected key 'e'",
        "$.a: expected int, got True",
        "$.b[0].c: expected num or null, got 'x'",
        "$.d.k: expected str, got 3",
    ]
    assert S.problems({"b": []}, schema) == ["$: missing key 'a'", "$: missing key 'd'"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    dense = root / "dense.safetensors"
    save_file(gpt2_like_state(), str(dense), metadata={"format": "pt"})
    pruned = root / "pruned.safetensors"
    as_json("prune", str(dense), "-o", str(pruned), "--sparsity", "0.5")
    return {"dense": dense, "pruned": pruned, "root": root}


# --- flops: one sparsity, several, none given, stages, a config file, a checkpoint -------------
@pytest.mark.parametrize(
    "args,runs",
    [
        (("-m", "gpt2-small", "-s", "0.5"), 1),
        (("-m", "gpt2-small", "-s", "0,0.5,0.75"), 3),
        (("-m", "gpt2-small"), 3),  # no --sparsity: the default three
        (("-m", "cerebras-gpt-256m", "--stage", "0.9:0.8333", "--stage", "0:0.1667"), 1),
        (
            (
                "-m",
                "gpt3-xl",
                "-s",
                "0.75",
                "--finetune-tokens",
                "64.512M",
                "--finetune-seq-len",
                "512",
            ),
            1,
        ),
        (
            ("-m", "llama-1.3b", "-s", "0.5", "--embeddings"),
            1,
        ),  # --breakdown: the terms are always there
        (("-m", "mixtral-8x7b", "-s", "0,0.5"), 2),  # a mixture of experts: "moe" and active_params
    ],
)
def test_flops_json_has_one_shape(args, runs):
    d = as_json("flops", *args)
    conforms(d, S.FLOPS)
    assert len(d["runs"]) == runs and d["targeted_sparsity"] is None


def test_flops_json_from_a_config_file_and_a_checkpoint(files, tmp_path):
    p = tmp_path / "m.toml"
    p.write_text("n_layers = 2\nd_model = 64\nn_heads = 4\nd_ff = 256\nvocab = 100\nseq_len = 32\n")
    conforms(as_json("flops", "--config", str(p), "-s", "0.5"), S.FLOPS)
    d = as_json("flops", "--checkpoint", str(files["pruned"]))
    conforms(d, S.FLOPS)
    assert d["targeted_sparsity"] == pytest.approx(0.5) and d["targeting"]["rule"]
    assert len(d["runs"]) == 1


def test_flops_list_json():
    conforms(as_json("flops", "--list"), S.FLOPS_LIST)


# --- simulate: one sparsity, a list, --sweep, a preset, a checkpoint, --verify, --plot --------
@pytest.mark.parametrize(
    "args,runs",
    [
        (("--shape", "64x64", "-s", "0.5", "--tokens", "64"), 1),
        (("--shape", "64x64", "-s", "0.5,0.9", "--tokens", "64"), 2),
        (("--shape", "64x64", "--sweep", "--tokens", "64"), 10),
        (("--shape", "64x64", "-s", "0.5", "--pattern", "2:4", "--tokens", "64", "--verify"), 1),
        (("--model", "gpt2-small", "-s", "0.75", "--tokens", "2048"), 1),
        (
            ("--model", "mixtral-8x7b", "-s", "0.5", "--tokens", "1"),
            1,
        ),  # a mixture of experts: "moe"
        (
            ("--shape", "64x64", "-s", "0.5", "--device", "a100", "--tokens", "64"),
            1,
        ),  # no dataflow device
    ],
)
def test_simulate_json_has_one_shape(args, runs):
    d = as_json("simulate", *args)
    conforms(d, S.SIMULATE)
    assert len(d["runs"]) == runs
    assert d["runs"][-1]["theoretical"] == d["workload"]["theoretical"]  # detail = the last run


def test_simulate_json_from_a_checkpoint_and_with_a_plot(files, tmp_path):
    d = as_json("simulate", str(files["pruned"]), "--tokens", "64", "--seq-len", "32", "--verify")
    conforms(d, S.SIMULATE)
    assert len(d["runs"]) == 1 and d["runs"][0]["sparsity"] == d["workload"]["targeted_sparsity"]
    png = tmp_path / "s.png"
    d = as_json(
        "simulate", "--shape", "64x64", "-s", "0.5,0.9", "--tokens", "64", "--plot", str(png)
    )
    conforms(d, S.SIMULATE)
    assert d["plot"] == str(png) and png.is_file()


def test_simulate_list_hardware_json():
    conforms(as_json("simulate", "--list-hardware"), S.SIMULATE_LIST)


# --- bench: one shape, a sweep, a preset, a checkpoint -------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["--shape", "16x32", "-s", "0.5"],
        ["--shape", "16x32", "-s", "0.5,0.9", "--dtype", "bfloat16"],
        ["--model", "gpt2-small", "-s", "0.9", "--kernel", "scipy-csr"],
    ],
)
def test_bench_json_has_one_shape(args):
    conforms(as_json("bench", *args, "--batch", "1,3", "-r", "1"), S.BENCH)


def test_bench_json_from_a_checkpoint(files):
    d = as_json("bench", str(files["pruned"]), "--batch", "2", "-r", "1")
    conforms(d, S.BENCH)
    assert len(d["model"]) == 1


# --- prune, densify, report, diff ---------------------------------------------------------------
def test_checkpoint_commands_keep_one_shape(files, tmp_path):
    dense, pruned = str(files["dense"]), str(files["pruned"])
    for extra in (
        ("--sparsity", "0.5"),
        ("--nm", "2:4", "--encoding", "mask"),
        ("--fraction", "0.2", "--scope", "global", "--include", "*wte*"),
    ):
        out = tmp_path / f"p{len(list(tmp_path.iterdir()))}.safetensors"
        conforms(as_json("prune", dense, "-o", str(out), *extra), S.PRUNE)
    conforms(as_json("densify", pruned, "-o", str(tmp_path / "d.safetensors")), S.DENSIFY)
    conforms(as_json("report", dense), S.REPORT)
    conforms(as_json("report", pruned, "--exclude", "*c_fc*"), S.REPORT)
    conforms(as_json("diff", dense, pruned), S.DIFF)
    conforms(as_json("diff", pruned, pruned), S.DIFF)


# --- train and eval (one tiny run) --------------------------------------------------------------
def test_train_and_eval_keep_one_shape(tmp_path):
    from helpers import make_corpus

    data = make_corpus(tmp_path / "corpus")
    base = [
        "train",
        "--data",
        str(data),
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
    ]
    conforms(as_json(*base, "-o", str(tmp_path / "a")), S.TRAIN)
    conforms(
        as_json(*base, "-o", str(tmp_path / "b"), "--sparsity", "0.5", "--algorithm", "static"),
        S.TRAIN,
    )
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 20)
    one = as_json("eval", str(tmp_path / "a"), "--text", str(text), "--max-tokens", "200")
    conforms(one, S.EVAL)
    two = as_json(
        "eval", str(tmp_path / "a"), str(tmp_path / "b"), "--text", str(text), "--max-tokens", "200"
    )
    conforms(two, S.EVAL)
    assert len(two["checkpoints"]) == 2
