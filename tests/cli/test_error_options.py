"""Every `--option` an error message names exists in the command that printed it.

Two checks: error cases run through each command, whose stderr is parsed for `--option` mentions;
and the library's own message strings, whose mentions must exist in every command that can reach
them (a library error must not send a simulate user to flops' --config).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
import typer.main
from safetensors.torch import save_file

from sparsetool.cli.main import app

from helpers import ROOT, gpt2_like_state, run

SRC = ROOT / "sparsetool"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")  # two letters at least: "--s" is a line style


def options_of(command: str) -> set[str]:
    cmd = typer.main.get_command(app).get_command(None, command)  # commands load lazily
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} | {
        "--help"
    }


TORCHRUN = re.compile(r"\btorchrun(?: --[\w-]+(?:[ =](?!-)\S+)?)*")  # the launcher's own options
PIP = re.compile(r"\bpip install(?: --[\w-]+)+")  # pip's own options (--no-deps)


def mentions(text: str) -> set[str]:
    return set(OPTION.findall(PIP.sub("pip install", TORCHRUN.sub("torchrun", text))))


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, Path] = {}

    def save(name: str, state: dict, **kw) -> None:
        out[name] = tmp_path / f"{name}.safetensors"
        save_file(state, str(out[name]), **kw)

    save("gpt2", gpt2_like_state(), metadata={"format": "pt"})
    save(
        "noshape",
        {
            "h.0.attn.c_attn.weight": torch.randn(8, 24, generator=g),
            "h.0.mlp.c_fc.weight": torch.randn(8, 32, generator=g),
        },
    )
    novocab = {}
    for i in range(2):
        novocab |= {
            f"h.{i}.attn.c_attn.weight": torch.randn(16, 48, generator=g),
            f"h.{i}.attn.c_proj.weight": torch.randn(16, 16, generator=g),
            f"h.{i}.mlp.c_fc.weight": torch.randn(16, 64, generator=g),
            f"h.{i}.mlp.c_proj.weight": torch.randn(64, 16, generator=g),
        }
    save("novocab", novocab)
    save("ints", {"h.0.mlp.c_fc.weight": torch.ones(8, 8, dtype=torch.int8)})
    save("norms", {"ln_f.weight": torch.ones(8), "wte.weight": torch.ones(16, 8)})
    nan = gpt2_like_state()
    nan["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")
    save("nan", nan)
    other = gpt2_like_state(n_layer=1)
    save("other", other)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(300)))
    out["corpus"] = corpus
    bad_lr = tmp_path / "bad_lr.yaml"
    bad_lr.write_text(f"preset: tiny\nsteps: 1\nmin_lr_ratio: 2\ndata: {corpus}\n")
    out["bad_lr"] = bad_lr
    keep = tmp_path / "keep.yaml"
    keep.write_text(f"preset: tiny\nsteps: 1\nkeep_last: -1\neval_sequences: 0\ndata: {corpus}\n")
    out["keep"] = keep
    (tmp_path / "moe").mkdir()
    moe = tmp_path / "moe" / "config.json"
    moe.write_text(
        json.dumps(
            {
                "model_type": "mixtral",
                "num_hidden_layers": 2,
                "hidden_size": 8,
                "num_attention_heads": 2,
                "vocab_size": 10,
                "num_local_experts": 4,
            }
        )
    )
    out["moe"] = moe
    out["tmp"] = tmp_path
    return out


def error_cases(f: dict[str, Path]) -> list[tuple[str, list]]:
    t = f["tmp"]
    return [
        ("prune", [f["ints"], "-o", t / "o1", "-s", "0.5"]),
        ("prune", [f["norms"], "-o", t / "o2", "-s", "0.5"]),
        ("prune", [f["norms"], "-o", t / "o2", "-s", "0.5", "--include", "ln_f*"]),
        ("prune", [f["nan"], "-o", t / "o3", "-s", "0.5"]),
        ("prune", [f["gpt2"], "-o", f["gpt2"], "-s", "0.5"]),
        ("prune", [f["gpt2"], "-o", t / "o4", "--nm", "2:4", "--scope", "global"]),
        ("prune", [f["gpt2"], "-o", t / "o5", "--fraction", "0.5", "--distribution", "erk"]),
        ("prune", [f["gpt2"], "-o", t / "o6", "-s", "0.5", "--include", "nope*"]),
        ("densify", [f["gpt2"], "-o", f["gpt2"]]),
        ("densify", [t / "missing.safetensors", "-o", t / "d"]),
        ("report", [t / "missing.safetensors"]),
        ("report", [f["gpt2"], "--exclude", "nope*"]),
        ("report", [f["gpt2"], "--plot", t / "x.jpg"]),
        ("flops", ["--checkpoint", f["noshape"]]),
        ("flops", ["--checkpoint", f["novocab"]]),
        ("flops", ["--checkpoint", f["norms"]]),
        ("flops", ["--config", f["moe"]]),
        ("flops", ["--model", "gpt2-small", "--stage", "0.5:0.5"]),
        ("simulate", [f["noshape"]]),
        ("simulate", [f["novocab"]]),
        ("simulate", [f["norms"]]),
        ("simulate", [f["ints"]]),
        ("simulate", [f["gpt2"], "--sparsity", "0.5"]),
        ("simulate", ["--model", "gpt2-small"]),
        ("simulate", ["--shape", "64x64", "-s", "0.5", "--plot", t / "p.png"]),
        ("simulate", ["--shape", "64x64", "-s", "0.5,0.6", "--pattern", "2:4"]),
        ("simulate", ["--shape", "64x64", "-s", "0.5", "--device", "nope"]),
        ("simulate", ["--shape", "999999x999999", "-s", "0.5"]),
        ("simulate", ["--model", "gpt2-small", "-s", "0.5", "--include", "x*"]),
        ("train", ["--config", f["bad_lr"], "-o", t / "r1"]),
        ("train", ["--config", f["keep"], "-o", t / "r2"]),
        ("train", ["-o", t / "r3", "--data", f["corpus"], "--preset", "tiny", "--dense"]),
        (
            "train",
            ["-o", t / "r4", "--data", f["corpus"], "--preset", "tiny", "--algorithm", "rigl"],
        ),
        (
            "train",
            ["-o", t / "r5", "--data", f["corpus"], "--preset", "tiny", "--stage", "0.5:0.5"],
        ),
        (
            "train",
            [
                "-o",
                t / "r6",
                "--data",
                f["corpus"],
                "--preset",
                "tiny",
                "--steps",
                "1",
                "--sparsity",
                "0.5",
                "--exclude",
                "nope*",
            ],
        ),
        ("train", ["-o", t / "r7", "--resume"]),
        ("eval", [t / "missing"]),
        ("eval", [f["norms"], "--text", f["corpus"]]),
        ("diff", [f["gpt2"], f["other"]]),
        ("diff", [f["norms"], f["norms"]]),
    ]


def test_error_messages_name_only_options_their_command_has(files):
    seen = 0
    for command, args in error_cases(files):
        r = run(command, *args)
        assert r.exit_code in (1, 2), (command, args, r.output)
        unknown = mentions(r.stderr) - options_of(command)
        assert not unknown, f"sparsetool {command}: {r.stderr.strip()} names {sorted(unknown)}"
        seen += bool(mentions(r.stderr))
    assert seen >= 15  # the cases do exercise messages that name options


def test_shape_errors_get_each_commands_own_way_out(files):
    r = run("simulate", files["noshape"])
    assert r.exit_code == 1 and "--config" not in r.stderr
    assert r.stderr.strip().endswith(
        "simulate a preset or one layer instead, e.g. --model gpt2-small "
        "--sparsity 0.5 or --shape 4096x4096 --sparsity 0.5"
    )
    r = run("flops", "--checkpoint", files["noshape"])
    assert r.stderr.strip().endswith(
        "describe the model with --config FILE instead of --checkpoint"
    )
    r = run("simulate", files["novocab"])
    assert "--vocab" not in r.stderr and "add a config.json with vocab_size beside it" in r.stderr
    r = run("flops", "--checkpoint", files["novocab"])
    assert r.stderr.strip().endswith("; pass --vocab V")
    r = run("train", "--config", files["keep"], "-o", files["tmp"] / "r")
    assert "'eval_sequences' (config file) must be >= 1" in r.stderr


def test_an_unknown_preset_names_no_option_of_another_command():
    from sparsetool.errors import ConfigError
    from sparsetool.hardware.request import run_simulation

    with pytest.raises(ConfigError) as e:
        run_simulation(model="nope", sparsity=0.5)
    assert str(e.value).startswith("unknown model preset 'nope'; known presets: gpt2-small")
    assert not mentions(str(e.value))


# --- the library's message strings ---------------------------------------------------------------

COMMANDS = (
    "prune",
    "shrink",
    "densify",
    "convert",
    "report",
    "flops",
    "train",
    "simulate",
    "eval",
    "diff",
    "demo",
)
# library modules shared by several commands: every option they name must exist in all of them
SHARED = {
    "flops/shapes.py": ("flops", "simulate"),
    "flops/modelconfig.py": ("flops", "simulate"),
    "flops/presets.py": ("flops", "simulate"),
    "flops/modelfile.py": ("flops", "simulate"),
    "flops/formula.py": ("flops", "simulate"),
    "targets/__init__.py": ("prune", "report", "flops", "simulate", "train", "diff"),
    "targets/roles.py": ("prune", "report", "flops", "simulate", "train", "diff"),
    "targets/order.py": ("prune", "report", "simulate", "diff"),
    "targets/recorded.py": ("report", "flops", "simulate"),
}


def message_strings(path: Path) -> list[str]:
    """String constants of a module, docstrings left out (they document, they are not printed)."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_library_messages_name_existing_options():
    every = set().union(*(options_of(c) for c in COMMANDS))
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("cli/"):
            continue
        named = set().union(set(), *(mentions(s) for s in message_strings(path)))
        assert named <= every, f"{rel} names options no command has: {sorted(named - every)}"
        if rel in SHARED:
            common = set.intersection(*(options_of(c) for c in SHARED[rel]))
            assert named <= common, (
                f"{rel} is reached by {', '.join(SHARED[rel])} but names {sorted(named - common)}"
            )
