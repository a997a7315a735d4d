"""Each option's default is declared once: prune's in the fields of ``PruneOptions``, which the
command line and ``sparsetool.prune`` both read; the other commands with a CLI and a Python face
(``api.py``) must give their shared parameters the same defaults."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import pytest
import typer

import sparsetool.api as api
from sparsetool.cli.main import COMMANDS
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.util.faces import OptionFace

BOTH_FACES = ["prune", "shrink", "densify", "convert", "report", "diff", "eval", "simulate"]


def cli_params(name: str) -> dict[str, Any]:
    """The command's click parameters by Python name, as ``sparsetool NAME`` parses them."""
    module, function, _ = COMMANDS[name]
    app = typer.Typer()
    app.command()(getattr(importlib.import_module(f"sparsetool.cli.{module}"), function))
    return {p.name: p for p in typer.main.get_command(app).params}


def api_defaults(name: str) -> dict[str, Any]:
    """The keyword defaults of ``sparsetool.NAME``."""
    parameters = inspect.signature(getattr(api, name)).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def same(cli: Any, other: Any) -> bool:
    """Whether a CLI default equals a Python one: a repeatable option's list is a tuple, and a
    number the CLI takes as text (to check it itself) is that number."""
    if isinstance(cli, list):
        cli = tuple(cli)
    if isinstance(cli, str) and isinstance(other, (int, float)) and not isinstance(other, bool):
        return float(cli) == other
    return cli == other


def test_every_prune_option_has_one_default_in_the_record_the_cli_and_the_api():
    record = PruneOptions.defaults()
    cli, python = cli_params("prune"), api_defaults("prune")
    assert set(record) <= set(cli) and set(record) <= set(python)
    for name, default in record.items():
        assert same(cli[name].default, default), (name, cli[name].default, default)
        assert python[name] == default, (name, python[name], default)


def test_the_cli_takes_each_options_flag_metavar_and_help_from_the_record():
    cli = cli_params("prune")
    shared = {"include", "exclude", "max_memory"}  # the shared options of cli/_params.py
    for f in dataclasses.fields(PruneOptions):
        face = f.metadata["face"]
        assert isinstance(face, OptionFace) and face.flag.startswith("--"), f.name
        assert face.flag in cli[f.name].opts, (f.name, cli[f.name].opts)
        if f.name in shared:
            continue
        assert face.help and cli[f.name].help == face.help, f.name
        if face.metavar:
            assert cli[f.name].metavar == face.metavar, f.name


def test_a_cli_option_is_made_from_its_record_field():
    """The CLI reads the record's field when it makes an option; a name the record lacks fails."""
    from sparsetool.cli import prune as cli_prune

    value, face = PruneOptions.face("samples")
    option = cli_prune.record_option("samples")
    assert option.default == value and option.help == face.help
    with pytest.raises(KeyError, match="not an option of prune"):
        PruneOptions.face("samples_per_window")


@pytest.mark.parametrize("name", BOTH_FACES)
def test_the_cli_and_the_api_agree_on_every_default_they_share(name):
    cli, python = cli_params(name), api_defaults(name)
    shared = sorted(set(cli) & set(python))
    assert shared, name
    differ = {k: (cli[k].default, python[k]) for k in shared if not same(cli[k].default, python[k])}
    assert not differ, differ


def test_shrink_takes_every_default_from_its_options_record():
    record = dataclasses.asdict(ShrinkOptions())
    cli, python = cli_params("shrink"), api_defaults("shrink")
    for name, default in record.items():
        assert python[name] == default, name
        assert same(cli[name].default, default), (name, cli[name].default, default)


def test_options_given_with_their_defaults_are_the_defaults():
    """Every default passes the record's own checks as the one option it is (a dataclass
    default, from_values and the parse the CLI runs agree)."""
    defaults = PruneOptions.defaults()
    assert PruneOptions.from_values(**defaults) == PruneOptions()
    for name, value in defaults.items():
        face = PruneOptions.face(name)[1]
        if face.parse is not None and value not in (None, ()):
            assert face.parse(value, face.flag, **face.limits) == value, name
