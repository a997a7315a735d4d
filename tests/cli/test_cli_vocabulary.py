"""One CLI vocabulary: every command spells the shared options the same way and they mean the same.

-o/--output where a command writes, --json that parses, --quiet, exit code 2 for usage errors
(decided before torch is imported), choices listed in --help, examples at the end of --help, and
--sparsity / --tokens / --include / --exclude / --seed parsed by the one sparsetool.util.options.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import ROOT, RUNNER, bench_json, run

COMMANDS = [
    "prune", "shrink", "densify", "convert", "report", "flops", "train", "simulate", "bench",
    "eval", "diff",
]  # fmt: skip
WRITERS = [
    "prune",
    "shrink",
    "densify",
    "convert",
    "train",
]  # the commands whose main product is a file or directory


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    return path


def good_args(command: str, ckpt: Path, tmp: Path, corpus: Path | None = None) -> list[str]:
    """A small invocation of ``command`` that succeeds (real files, a few seconds at most)."""
    return {
        "prune": [ckpt, "-o", tmp / "p.safetensors", "--sparsity", "0.5"],
        "densify": [ckpt, "-o", tmp / "d.safetensors"],
        "convert": [tmp / "gguf" / "tiny-F32.gguf", "-o", tmp / "converted"],
        "shrink": [tmp / "moe", "-o", tmp / "shrunk", "--experts", "0.5", "--criterion", "random"],
        "report": [ckpt],
        "flops": ["--model", "gpt2-small", "--sparsity", "0.5"],
        "simulate": ["--shape", "64x64", "--sparsity", "0.5"],
        "bench": [ckpt, "--batch", "1,2", "--repeats", "1"],
        "train": [
            "-o",
            tmp / "run",
            "--data",
            corpus,
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch-size",
            "2",
            "--eval-every",
            "1",
            "--threads",
            "1",
        ],
        "eval": [tmp / "evalrun", "--text", corpus, "--max-tokens", "300"],
        "diff": [ckpt, ckpt],
    }[command]


def prepare(command: str, ckpt: Path, tmp: Path, corpus: Path) -> None:
    """What a command's good_args need besides the checkpoint: eval scores a trained run, convert
    reads a GGUF file."""
    if command == "convert":
        from gguf_models import tiny_gpt2_gguf

        tiny_gpt2_gguf(tmp / "gguf", "F32")
    if command == "shrink":
        from moe_models import save_moe

        save_moe("mixtral", tmp / "moe", corpus.read_text())
    if command == "eval":
        r = run(
            "train", *good_args("train", ckpt, tmp, corpus)[2:], "-o", tmp / "evalrun", "--json"
        )
        assert r.exit_code == 0, r.output


def help_text(command: str) -> str:
    r = run(command, "--help")
    assert r.exit_code == 0, r.output
    return r.stdout


# ----------------------------------------------------------------------------------------------
# --help: output option, choices, examples


@pytest.mark.parametrize("command", WRITERS)
def test_writers_take_dash_o_output(command):
    assert re.search(r"-o, --output\b", help_text(command))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_json_and_quiet(command):
    text = help_text(command)
    assert "--json" in text and "-q, --quiet" in text


@pytest.mark.parametrize("command", COMMANDS)
def test_choices_are_listed_no_bare_strings(command):
    text = help_text(command)
    assert "<str>" not in text and "TEXT" not in text


@pytest.mark.parametrize(
    "command, option, shown",
    [
        ("prune", "--method", "<magnitude|random|wanda|sparsegpt>"),
        ("prune", "--scope", "<layer|global>"),
        ("prune", "--distribution", "<uniform|erk>"),
        ("prune", "--encoding", "<zeros|mask|nan|bitmask>"),
        ("report", "--format", "<rich|plain|markdown|github>"),
        ("train", "--algorithm", "<dense|static|gmp|set|rigl|granet|imp>"),
        ("train", "--preset", "<tiny|mini|small|base>"),
        ("train", "--distribution", "<uniform|erk>"),
        ("train", "--init-method", "<random|magnitude>"),
        ("train", "--dtype", "<auto|float32|bfloat16>"),
        ("convert", "--dtype", "<float32|bfloat16>"),
        ("train", "--device", "<auto|cpu|cuda|cuda:N>"),
        ("flops", "--model", "<gpt2-small|gpt3-xl|"),
        ("simulate", "--pattern", "<random|rows|cols|2:4>"),
    ],
)
def test_choice_options_show_their_choices(command, option, shown):
    assert re.search(re.escape(option) + r"\s+" + re.escape(shown), help_text(command))


@pytest.mark.parametrize("command", COMMANDS)
def test_help_ends_with_two_or_three_examples(command):
    lines = [ln.strip() for ln in help_text(command).rstrip().splitlines()]
    start = max(i for i, ln in enumerate(lines) if ln == "Examples:")
    examples = [ln for ln in lines[start + 1 :] if ln]
    assert 2 <= len(examples) <= 3, examples
    assert all(ln.startswith(f"sparsetool {command} ") for ln in examples), examples


@pytest.mark.parametrize("command", ["flops", "simulate", "bench"])
def test_examples_run_as_written(command, tmp_path, monkeypatch, gpt2_file):
    from sparsetool.cli import bench, flops, simulate

    module = {"flops": flops, "simulate": simulate, "bench": bench}[command]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench.json").write_text(json.dumps(bench_json()))  # simulate --measured's file
    assert run("prune", gpt2_file, "-o", "pruned.safetensors", "-s", "0.9").exit_code == 0
    for line in module.EXAMPLES:
        if "--plot" in line:
            continue  # simulate: a 9-point sweep of a 12288x12288 mask; bench: 4096x4096 timed
        r = run(*line.split()[1:], "--json", *(["--repeats", "1"] if command == "bench" else []))
        assert r.exit_code == 0, (line, r.output)


def test_choice_names_match_the_library():
    """--encoding offers every codec the writer knows, in the library's order (prune's and
    train's option alike), and --preset the GPT presets."""
    from sparsetool.checkpoint.codecs import CODECS
    from sparsetool.cli import prune, train
    from sparsetool.cli._params import TRAIN_PRESETS
    from sparsetool.models.gpt import PRESETS

    offered = [[e.value for e in module.Encoding] for module in (prune, train)]
    assert offered == [[c.name for c in CODECS.values()]] * 2
    assert tuple(PRESETS) == TRAIN_PRESETS


# ----------------------------------------------------------------------------------------------
# running: --json, --quiet, -o/--output


@pytest.mark.parametrize("command", COMMANDS)
def test_json_parses_and_quiet_is_accepted(command, gpt2_file, tmp_path, corpus):
    args = good_args(command, gpt2_file, tmp_path, corpus)
    prepare(command, gpt2_file, tmp_path, corpus)
    r = run(command, *args, "--json")
    assert r.exit_code == 0, r.output
    assert isinstance(json.loads(r.stdout), (dict, list))
    for p in tmp_path.iterdir():  # fresh outputs for the second run
        if p not in (gpt2_file, corpus, tmp_path / "evalrun", tmp_path / "moe", tmp_path / "gguf"):
            subprocess.run(["rm", "-rf", str(p)], check=True)
    r = run(command, *args, "--quiet")
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and r.stdout  # no progress or notes; the result is still printed


@pytest.mark.parametrize("command", ["prune", "densify"])
def test_output_long_and_short_spelling(command, gpt2_file, tmp_path):
    args = good_args(command, gpt2_file, tmp_path)
    out = args[args.index("-o") + 1]
    long_args = [a if a != "-o" else "--output" for a in args]
    assert run(command, *long_args).exit_code == 0
    assert load_file(str(out))


def test_train_output_and_its_hidden_old_spelling(tmp_path, corpus):
    base = good_args("train", Path("unused"), tmp_path, corpus)[2:]  # without "-o RUN"
    r = run("train", "--output", tmp_path / "new", *base, "--json")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "new" / "model.safetensors").exists()
    r = run("train", "--out", tmp_path / "old", *base, "--json")  # the old spelling still works
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["run_dir"].endswith("old")
    assert not re.search(r"^\s+--out\b", help_text("train"), re.M)  # ...but is no longer shown
    r = run("train", "--out", tmp_path / "a", "-o", tmp_path / "b", *base)
    assert r.exit_code == 2 and "once" in r.stderr


# ----------------------------------------------------------------------------------------------
# exit codes: 2 for usage errors, before torch is imported

BAD_VALUE = {
    "prune": ["x.safetensors", "-o", "y.safetensors", "--sparsity", "2"],
    "shrink": ["x", "-o", "y", "--experts", "2"],
    "densify": ["x.safetensors"],  # no -o: densify has no other value to get wrong
    "convert": ["x.gguf", "-o", "y", "--dtype", "float16"],
    "report": ["x.safetensors", "--format", "pretty"],
    "flops": ["--model", "gpt3-xl", "--tokens", "many"],
    "train": ["-o", "run", "--sparsity", "1.5"],
    "simulate": ["--shape", "64x64", "--sparsity", "2"],
    "bench": ["--shape", "64x64", "--sparsity", "0.5", "--batch", "0"],
    "eval": ["x.safetensors", "--dtype", "float16"],
    "diff": ["a.safetensors", "b.safetensors", "--include", ""],
}


@pytest.mark.parametrize("command", COMMANDS)
def test_bad_value_and_unknown_option_exit_2(command):
    r = run(command, *BAD_VALUE[command])
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    r = run(command, *good_args(command, Path("x"), Path("y"), Path("z")), "--no-such-option")
    assert r.exit_code == 2 and r.stderr.startswith("error: no such option: --no-such-option")
    assert r.stderr.endswith(f"(see 'sparsetool {command} -h')\n") and r.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["prune", "report", "flops"])
def test_missing_file_is_a_runtime_error_exit_1(command, tmp_path):
    args = {
        "prune": [tmp_path / "no.safetensors", "-o", tmp_path / "o.safetensors", "-s", "0.5"],
        "report": [tmp_path / "no.safetensors"],
        "flops": ["--checkpoint", tmp_path / "no.safetensors"],
    }[command]
    r = run(command, *args)
    assert r.exit_code == 1 and r.stderr.startswith("error: ")


@pytest.mark.parametrize("command", COMMANDS)
def test_usage_errors_do_not_import_torch(command, tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", RUNNER, command, *BAD_VALUE[command]],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.stdout.strip().splitlines()[-1] == "exit=2 torch=False", r.stdout + r.stderr
    # Only the command that runs is imported (startup time does not grow with the command count).
    assert r.stdout.strip().splitlines()[-2] == "loaded=" + ",".join(sorted(["main", command])), (
        r.stdout + r.stderr
    )


def test_a_mistyped_command_suggests_the_real_one():
    r = run("prun", "x.safetensors")
    assert r.exit_code == 2
    assert r.stderr == "error: no such command 'prun' (did you mean prune?) (see 'sparsetool -h')\n"


# ----------------------------------------------------------------------------------------------
# the shared options mean the same in every command


def test_sparsity_one_is_accepted_everywhere(gpt2_file, tmp_path, corpus):
    r = run("prune", gpt2_file, "-o", tmp_path / "p.safetensors", "--sparsity", "1.0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"]["targeted_sparsity"] == 1.0
    r = run("flops", "--model", "gpt2-small", "--sparsity", "1.0", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["runs"][0]["sparsity"] == 1.0
    r = run("simulate", "--shape", "64x64", "--sparsity", "1.0", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["workload"]["targeted_sparsity"] == 1.0
    # train refused 1.0 before the options were unified; every algorithm now trains at it
    r = run(
        "train",
        *good_args("train", gpt2_file, tmp_path, corpus),
        "--algorithm",
        "static",
        "--sparsity",
        "1.0",
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["sparsity"] == 1.0


@pytest.mark.parametrize(
    "command, args",
    [
        ("prune", ["x", "-o", "y"]),
        ("flops", ["--model", "gpt2-small"]),
        ("simulate", ["--shape", "64x64"]),
        ("train", ["-o", "run"]),
    ],
)
@pytest.mark.parametrize("bad", ["1.01", "-0.1", "nan", "half"])
def test_sparsity_out_of_range_is_refused_the_same_way(command, args, bad):
    r = run(command, *args, "--sparsity", bad)
    assert r.exit_code == 2, r.output
    assert "--sparsity" in r.stderr
    if bad != "half":
        assert "must be a number from 0 to 1" in r.stderr


@pytest.mark.parametrize(
    "command, args, key",
    [
        ("flops", ["--model", "gpt2-small", "--sparsity", "0.5"], lambda d: d["runs"][0]["tokens"]),
        ("simulate", ["--shape", "64x64", "--sparsity", "0.5"], lambda d: d["workload"]["tokens"]),
    ],
)
def test_tokens_spellings_mean_the_same(command, args, key):
    got = []
    for spelling in ("2.6e10", "26B", "26_000_000_000", "26,000,000,000"):
        r = run(command, *args, "--tokens", spelling, "--json")
        assert r.exit_code == 0, r.output
        got.append(key(json.loads(r.stdout)))
    assert got == [26_000_000_000] * 4
    r = run(command, *args, "--tokens", "1.5")
    assert r.exit_code == 2 and "whole number" in r.stderr


@pytest.mark.parametrize("command", ["prune", "report", "flops", "simulate", "diff", "train"])
def test_include_exclude_are_checked_the_same_way(command, gpt2_file, tmp_path, corpus):
    args = {
        "prune": [gpt2_file, "-o", tmp_path / "p.safetensors", "-s", "0.5"],
        "report": [gpt2_file],
        "flops": ["--checkpoint", gpt2_file],
        "simulate": [gpt2_file],
        "diff": [gpt2_file, gpt2_file],
        "train": good_args("train", gpt2_file, tmp_path, corpus),
    }[command]
    for option in ("--include", "--exclude"):
        r = run(command, *args, option, "")
        assert r.exit_code == 2 and f"{option} needs a glob" in r.stderr
    glob = "*.mlp.c_fc.weight" if command != "train" else "*.mlp.*"
    r = run(command, *args, "--exclude", glob, "--json")
    assert r.exit_code == 0, r.output
    if command == "diff":
        return  # diff's --include widens what it compares; it does not select for pruning
    if command == "train":
        args[args.index("-o") + 1] = tmp_path / "run2"
    # a glob that matches no tensor is an error naming it (exit 1: only the checkpoint tells)
    r = run(command, *args, "--include", "no.such.*")
    assert r.exit_code == 1 and "no.such.*" in r.stderr


@pytest.mark.parametrize(
    "command, args",
    [
        ("prune", ["x", "-o", "y", "-s", "0.5", "--method", "random"]),
        ("simulate", ["--shape", "64x64", "-s", "0.5"]),
        ("train", ["-o", "run"]),
    ],
)
def test_seed_is_checked_the_same_way(command, args):
    r = run(command, *args, "--seed", "-1")
    assert r.exit_code == 2 and "--seed must be a whole number" in r.stderr
