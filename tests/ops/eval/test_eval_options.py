"""eval's options are declared once, in ``EvalOptions`` and ``TasksOptions``: the command line
makes its options from their fields (flag, metavar, help, default), ``sparsetool.eval`` takes its
defaults from them, and both faces make the records with the same checks."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest
import typer

import sparsetool.api as api
from sparsetool.cli.eval import eval_command
from sparsetool.errors import ConfigError
from sparsetool.ops.eval_options import EvalOptions, TasksOptions, eval_options
from sparsetool.util.faces import OptionFace

from helpers import run

RECORDS = (EvalOptions, TasksOptions)
SHARED = {"max_memory"}  # the shared --max-memory of cli/_params.py keeps its own help


def cli_params() -> dict[str, Any]:
    app = typer.Typer()
    app.command()(eval_command)
    return {p.name: p for p in typer.main.get_command(app).params}


def api_defaults() -> dict[str, Any]:
    parameters = inspect.signature(api.eval).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_every_option_has_one_default_in_the_record_and_the_cli(record):
    cli = cli_params()
    for name, default in record.defaults().items():
        assert name in cli, name
        assert cli[name].default == default, (name, cli[name].default, default)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_the_api_takes_every_default_but_plot_from_the_records(record):
    python = api_defaults()
    for name, default in record.defaults().items():
        if name == "plot":  # the command line's only: a result is drawn by plot_eval
            assert name not in python
            continue
        assert python[name] == default, (name, python[name], default)


def test_the_cli_and_the_api_have_no_option_beyond_the_records():
    names = {f.name for r in RECORDS for f in dataclasses.fields(r)}
    # output and process, not recorded; and typer's own completion options
    cli_only = {
        "checkpoints",
        "as_json",
        "quiet",
        "threads",
        "install_completion",
        "show_completion",
    }
    assert set(cli_params()) - names == cli_only
    assert set(api_defaults()) <= names


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_the_cli_takes_each_options_flag_metavar_and_help_from_the_record(record):
    cli = cli_params()
    for f in dataclasses.fields(record):
        face = f.metadata["face"]
        assert isinstance(face, OptionFace) and face.flag.startswith("--"), f.name
        assert cli[f.name].opts == [face.flag], (f.name, cli[f.name].opts)
        if f.name in SHARED:
            continue
        assert face.help and cli[f.name].help == face.help, f.name
        if face.metavar:
            assert cli[f.name].metavar == face.metavar, f.name


@pytest.mark.parametrize("name", ["limit", "num_fewshot"])
def test_the_cli_refuses_a_count_below_the_records_least_value(name):
    least = TasksOptions.face(name)[1].limits["minimum"]
    flag = TasksOptions.face(name)[1].flag
    below = run("eval", "missing", "--tasks", "t", flag, least - 1)
    assert below.exit_code == 2 and flag in below.output, below.output
    at = run("eval", "missing", "--limit", 1, flag, least)  # parsed: refused for no --tasks
    assert at.exit_code == 2 and "applies to task accuracy only" in at.output, at.output


def test_the_records_take_the_values_of_either_face():
    run, asked = eval_options(
        text=Path("t.txt"), seq=64, batch=2, tasks="arc_easy, hellaswag", limit=5, seed=3
    )
    assert run == EvalOptions(text=Path("t.txt"), seq=64, batch=2)
    assert asked == TasksOptions(tasks=("arc_easy", "hellaswag"), limit=5, seed=3)
    assert eval_options(max_memory="2G")[0].checked().max_memory == 2 * 2**30
    assert eval_options()[1] is None


def test_an_option_that_would_be_ignored_is_refused_by_both_faces():
    with pytest.raises(ConfigError, match="--limit applies to task accuracy only"):
        eval_options(limit=3)
    with pytest.raises(ConfigError, match="--tasks and --seq do not go together"):
        eval_options(tasks="arc_easy", seq=64)
    with pytest.raises(ConfigError, match="limit=3: applies to task accuracy only"):
        api.eval("missing", limit=3)
    with pytest.raises(TypeError, match="not an option of eval: samples"):
        eval_options(samples=3)
