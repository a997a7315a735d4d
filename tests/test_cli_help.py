"""Every command has --help with an example, and is documented in the README."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sparsetool.cli.main import app

COMMANDS = ["prune", "densify", "report", "flops", "train", "simulate", "eval", "diff", "demo"]
README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_zero_and_shows_usage(command):
    result = CliRunner().invoke(app, [command, "--help"])
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
