"""Usage errors as a newcomer meets them: options that contradict each other are refused (never
one silently ignored), choice errors list the choices and the closest, bad --shape/--device/--plot
values exit 2, each a single ``error:`` line; ``sparsetool --help`` shows every summary whole."""

from __future__ import annotations

import json

import pytest

from sparsetool.cli.main import COMMANDS

from helpers import run


def refused(r, message: str) -> None:
    """Exit 2, nothing on stdout, exactly one line on stderr: ``error: MESSAGE``."""
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr == f"error: {message}\n"


# ----------------------------------------------------------------------------------------------
# options that contradict each other

CONFLICTS = [  # (arguments, where {ckpt} and {out} are filled in, the exact message)
    (
        ["prune", "{ckpt}", "-o", "{out}", "--in-place", "--sparsity", "0.5"],
        "-o {out} and --in-place do not go together: --in-place replaces {ckpt} itself; drop -o "
        "{out}, or drop --in-place to write {out} and leave {ckpt} as it is",
    ),
    (
        ["densify", "{ckpt}", "-o", "{out}", "--in-place"],
        "-o {out} and --in-place do not go together: --in-place replaces {ckpt} itself; drop -o "
        "{out}, or drop --in-place to write {out} and leave {ckpt} as it is",
    ),
    (
        ["report", "{ckpt}", "--json", "--format", "plain"],
        "--json and --format plain do not go together: --json prints no table; drop --format, or "
        "drop --json to print the table",
    ),
    (
        ["report", "{ckpt}", "--json", "--format", "rich"],  # the default, but asked for
        "--json and --format rich do not go together: --json prints no table; drop --format, or "
        "drop --json to print the table",
    ),
    (
        ["report", "{ckpt}", "--json", "--targeted"],
        '--json and --targeted do not go together: --json lists every tensor, each with "targeted" '
        "(--targeted filters the table and the plot); drop --targeted, or drop --json to print the "
        "targeted ones",
    ),
    (
        ["flops", "--list", "--model", "gpt3-xl"],
        "--list and --model do not go together: --list prints the presets and counts nothing; drop "
        "--model, or drop --list to count FLOPs",
    ),
    (
        ["flops", "--list", "--tokens", "26B"],
        "--list and --tokens do not go together: --list prints the presets and counts nothing; "
        "drop --tokens, or drop --list to count FLOPs",
    ),
    (
        ["flops", "--model", "gpt3-xl", "--json", "--breakdown"],
        "--json and --breakdown do not go together: --json always holds every term "
        '("forward_terms", "dense_forward_terms" of each run); drop --breakdown, or drop --json '
        "for the table of terms with their formulas",
    ),
    (
        ["simulate", "--list-hardware", "--shape", "64x64"],
        "--list-hardware and --shape do not go together: --list-hardware lists the devices and "
        "simulates nothing; drop --shape, or drop --list-hardware to simulate",
    ),
    (
        ["simulate", "{ckpt}", "--list-hardware"],
        "--list-hardware and CHECKPOINT do not go together: --list-hardware lists the devices and "
        "simulates nothing; drop CHECKPOINT, or drop --list-hardware to simulate",
    ),
    (
        ["simulate", "--shape", "64x64", "--sparsity", "0.5", "--seq-len", "128"],
        "--shape 64x64 and --seq-len 128 do not go together: one --shape layer has no attention "
        "work for a sequence length to set; drop --seq-len, or simulate a model, e.g. --model "
        "gpt2-small --seq-len 128 --sparsity 0.5",
    ),
    (
        ["simulate", "--model", "gpt2-small", "--sparsity", "0.5", "--json", "--layers"],
        '--json and --layers do not go together: --json lists every layer ("layers"); drop '
        "--layers, or drop --json for the table",
    ),
    (
        ["simulate", "--shape", "64x64", "--sparsity", "0.5", "--layers"],
        "--shape 64x64 and --layers do not go together: one --shape layer has no table of layers; "
        "drop --layers",
    ),
    (
        ["simulate", "--model", "gpt2-small", "--sparsity", "0.5,0.9", "--layers"],
        "--sparsity 0.5,0.9 and --layers do not go together: a sweep prints one speedup per "
        "sparsity, not each layer; drop --layers, or give one --sparsity",
    ),
    (
        ["simulate", "--model", "gpt2-small", "--sweep", "--layers"],
        "--sweep and --layers do not go together: a sweep prints one speedup per sparsity, not "
        "each layer; drop --layers, or give one --sparsity",
    ),
]


@pytest.mark.parametrize(
    "args, message", CONFLICTS, ids=lambda x: " ".join(x) if isinstance(x, list) else ""
)
def test_contradicting_options_are_refused(gpt2_file, tmp_path, args, message):
    out = tmp_path / "out.safetensors"
    before = gpt2_file.read_bytes()
    fill = {"ckpt": str(gpt2_file), "out": str(out)}
    r = run(*[a.format(**fill) for a in args])
    refused(r, message.format(**fill))
    assert not out.exists() and gpt2_file.read_bytes() == before


@pytest.mark.parametrize(
    "args",
    [
        ["prune", "{ckpt}", "-o", "{ckpt}", "--in-place", "--sparsity", "0.5", "--json", "-q"],
        ["densify", "{ckpt}", "-o", "{ckpt}", "--in-place", "--json"],
        [
            "report",
            "{ckpt}",
            "--json",
            "--targeted",
            "--plot",
            "{png}",
            "--quiet",
        ],  # --targeted: the plot
        ["flops", "--list", "--json", "--quiet"],
        ["simulate", "--list-hardware", "--device", "a100", "--json"],
        ["simulate", "--model", "gpt2-small", "--sparsity", "0.5", "--layers", "--seed", "3"],
    ],
)
def test_options_that_do_combine_still_run(gpt2_file, tmp_path, args):
    fill = {"ckpt": str(gpt2_file), "png": str(tmp_path / "p.png")}
    r = run(*[a.format(**fill) for a in args])
    assert r.exit_code == 0, r.stderr
    if "--json" in args:
        json.loads(r.stdout)


# ----------------------------------------------------------------------------------------------
# choices


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["simulate", "--model", "gpt3xl", "--sparsity", "0.5"],
            "--model 'gpt3xl' is not one of: gpt2-small, gpt3-xl, gpt3-175b, cerebras-gpt-111m, "
            "cerebras-gpt-256m, cerebras-gpt-590m, cerebras-gpt-1.3b, cerebras-gpt-2.7b, "
            "cerebras-gpt-6.7b, cerebras-gpt-13b, llama-1.3b, mixtral-8x7b, qwen3-30b-a3b, "
            "deepseek-v3 (did you mean gpt3-xl?)",
        ),
        (
            ["flops", "-m", "gpt3xl"],
            "--model 'gpt3xl' is not one of: gpt2-small, gpt3-xl, gpt3-175b, cerebras-gpt-111m, "
            "cerebras-gpt-256m, cerebras-gpt-590m, cerebras-gpt-1.3b, cerebras-gpt-2.7b, "
            "cerebras-gpt-6.7b, cerebras-gpt-13b, llama-1.3b, mixtral-8x7b, qwen3-30b-a3b, "
            "deepseek-v3 (did you mean gpt3-xl?)",
        ),
        (
            ["prune", "x.safetensors", "-o", "y.safetensors", "-s", "0.5", "--method", "magnitud"],
            "--method 'magnitud' is not one of: magnitude, random, wanda, sparsegpt (did you "
            "mean magnitude?)",
        ),
        (
            [
                "prune",
                "x.safetensors",
                "-o",
                "y.safetensors",
                "-s",
                "0.5",
                "--encoding",
                "sparse24",
            ],
            "--encoding 'sparse24' is not one of: zeros, mask, nan, bitmask",
        ),
        (
            ["prune", "x.safetensors", "-o", "y.safetensors", "-s", "0.5", "--scope", "globl"],
            "--scope 'globl' is not one of: layer, global (did you mean global?)",
        ),
        (
            ["prune", "x.safetensors", "-o", "y.safetensors", "-s", "0.5", "--distribution", "ERK"],
            "--distribution 'ERK' is not one of: uniform, erk (did you mean erk?)",
        ),
        (
            ["report", "x.safetensors", "--format", "markdow"],
            "--format 'markdow' is not one of: rich, plain, markdown, github (did you mean "
            "markdown?)",
        ),
        (
            ["simulate", "--shape", "64x64", "--sparsity", "0.5", "--pattern", "rowz"],
            "--pattern 'rowz' is not one of: random, rows, cols, 2:4 (did you mean rows?)",
        ),
        (
            ["eval", "x.safetensors", "--dtype", "bf16"],
            "--dtype 'bf16' is not one of: float32, bfloat16 (did you mean bfloat16?)",
        ),
        (
            ["train", "-o", "run", "--algorithm", "rigll"],
            "--algorithm 'rigll' is not one of: dense, static, gmp, set, rigl, granet, imp (did "
            "you mean rigl?)",
        ),
        (
            ["train", "-o", "run", "--preset", "huge"],
            "--preset 'huge' is not one of: tiny, mini, small, base",
        ),
    ],
)
def test_a_bad_choice_lists_the_choices_and_the_closest(args, message):
    r = run(*args)
    refused(r, message)
    assert "Value error" not in r.stderr


def test_a_choice_still_parses_and_model_ignores_case():
    r = run("flops", "--model", "GPT3-XL", "--sparsity", "0.5", "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["model"] == "gpt3-xl"


# ----------------------------------------------------------------------------------------------
# bad values exit 2, as the README says usage errors do


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["simulate", "--shape", "12288", "--sparsity", "0.5"],
            "--shape must look like MxK (e.g. 12288x12288), got '12288'",
        ),
        (
            ["simulate", "--shape", "0x8", "--sparsity", "0.5"],
            "--shape needs positive sizes, got '0x8'",
        ),
        (
            ["simulate", "--shape", "64x64", "--sparsity", "0.5", "--device", "a10"],
            "unknown --device a10 (did you mean a100?); known: cs2, a100, h100, a100-2:4, "
            "h100-2:4, a100-sputnik, a100-cusparse, a100-flash-llm, cpu (sparsetool simulate "
            "--list-hardware lists them)",
        ),
        (
            ["simulate", "--list-hardware", "--device", "tpu"],
            "unknown --device tpu (did you mean cpu?); known: cs2, a100, h100, a100-2:4, "
            "h100-2:4, a100-sputnik, a100-cusparse, a100-flash-llm, cpu (sparsetool simulate "
            "--list-hardware lists them)",
        ),
        (
            ["report", "{ckpt}", "--plot", "out.jpg"],
            "--plot out.jpg: plots are written as PNG: give a file name ending in .png, e.g. "
            "--plot out.png",
        ),
        (
            ["diff", "{ckpt}", "{ckpt}", "--plot", "angular.svg"],
            "--plot angular.svg: plots are written as PNG: give a file name ending in .png, e.g. "
            "--plot angular.png",
        ),
        (
            ["eval", "{ckpt}", "--plot", "ppl"],
            "--plot ppl: plots are written as PNG: give a file name ending in .png, e.g. --plot "
            "ppl.png",
        ),
        (
            ["simulate", "--shape", "64x64", "--sweep", "--plot", "speedup.jpg"],
            "--plot speedup.jpg: plots are written as PNG: give a file name ending in .png, e.g. "
            "--plot speedup.png",
        ),
    ],
)
def test_bad_values_are_usage_errors(gpt2_file, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    r = run(*[a.format(ckpt=gpt2_file) for a in args])
    refused(r, message)
    assert not list(tmp_path.glob("*.jpg")) and not list(tmp_path.glob("*.svg"))


def test_a_device_a_hardware_file_adds_is_known(tmp_path):
    hw = tmp_path / "hw.toml"
    hw.write_text('[a100-big]\nbase = "a100"\n')
    r = run(
        "simulate",
        "--shape",
        "64x64",
        "--sparsity",
        "0.5",
        "--hardware",
        hw,
        "--device",
        "a100-big",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    assert [d["name"] for d in json.loads(r.stdout)["devices"]] == ["a100-big"]
    r = run(
        "simulate",
        "--shape",
        "64x64",
        "--sparsity",
        "0.5",
        "--hardware",
        tmp_path / "no.toml",
        "--device",
        "a100",
    )
    assert r.exit_code == 1 and r.stderr.startswith("error: hardware file")  # a bad file: exit 1


# ----------------------------------------------------------------------------------------------
# click's own usage errors read the same way


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["prune", "x.safetensors", "--sparsty", "0.5"],
            "no such option: --sparsty (did you mean --sparsity?) (see 'sparsetool prune -h')",
        ),
        (["report"], "missing argument 'CHECKPOINT' (see 'sparsetool report -h')"),
        (["prun"], "no such command 'prun' (did you mean prune?) (see 'sparsetool -h')"),
    ],
)
def test_click_usage_errors_are_one_line(args, message):
    refused(run(*args), message)


def test_root_help_shows_every_summary_whole():
    r = run("--help", terminal_width=80)
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    assert "..." not in r.stdout.split("Commands:")[1]
    for name, (_, _, summary) in COMMANDS.items():
        assert f"{name} {summary}" in text, summary
