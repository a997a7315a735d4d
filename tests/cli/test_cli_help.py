"""Every command has --help with an example, and is documented in the README."""

import pytest

from helpers import ROOT, run

COMMANDS = [
    "prune",
    "shrink",
    "densify",
    "convert",
    "report",
    "flops",
    "train",
    "simulate",
    "bench",
    "eval",
    "diff",
    "demo",
]
README = (ROOT / "README.md").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_zero_and_shows_usage(command):
    result = run(command, "--help")
    assert result.exit_code == 0, result.output
    assert f"sparsetool {command}" in result.output.replace("\n", " ") or "Usage" in result.output


@pytest.mark.parametrize("command", COMMANDS)
def test_command_is_in_readme(command):
    assert f"sparsetool {command}" in README


def test_library_does_not_import_cli():
    import subprocess
    import sys

    code = (
        "import sys, sparsetool.errors, sparsetool.flops; "
        "bad = [m for m in ('typer', 'rich', 'sparsetool.cli') if m in sys.modules]; "
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_root_help_lines_are_each_commands_own_first_line():
    """`sparsetool --help` lists the commands from cli.main.COMMANDS without importing them."""
    import typer

    from sparsetool.cli.main import COMMANDS as TABLE
    from sparsetool.cli.main import app

    group = typer.main.get_command(app)
    assert list(TABLE) == list(COMMANDS)
    for name, (_, _, summary) in TABLE.items():
        own = " ".join((group.get_command(None, name).help or "").split("\n\n")[0].split())
        assert summary == own, name


def test_root_help_says_train_fine_tunes_hugging_face_models_too():
    """train --init fine-tunes a Hugging Face causal LM; the command list said the built-in GPT
    only."""
    r = run("--help")
    text = " ".join(r.stdout.split())  # the summaries wrap under their column
    assert "train Train the built-in byte-level GPT or fine-tune a Hugging Face model," in text, (
        r.stdout
    )


def test_root_help_imports_no_command_module():
    import subprocess
    import sys

    code = (
        "import sys\nfrom sparsetool.cli.main import app\n"
        "try:\n    app(['--help'], prog_name='sparsetool')\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('sparsetool.cli.')\n"
        "             and m not in ('sparsetool.cli.main', 'sparsetool.cli._click')))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


def test_the_command_runs_numpy_blas_on_one_thread_unless_told(monkeypatch):
    """sparsetool never calls numpy's BLAS; its idle threads only slowed every command down."""
    import os

    import sparsetool.cli.main as cli_main

    seen = []
    monkeypatch.setattr(
        cli_main,
        "_run_interruptibly",
        lambda app: seen.append(os.environ.get("OPENBLAS_NUM_THREADS")),
    )
    monkeypatch.setenv(
        "OPENBLAS_NUM_THREADS", "0"
    )  # recorded, so the test leaves the variable as it found it
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    cli_main.main()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    cli_main.main()
    assert seen == ["1", "4"]
