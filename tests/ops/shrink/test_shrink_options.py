"""shrink's options are declared once, in the fields of ``ShrinkOptions``: the command line builds
each typer option from its field (flag, metavar, help, default) and ``sparsetool.shrink`` takes
the same defaults; both make their options with ``ShrinkOptions.from_values``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import typer

import sparsetool.api as api
from sparsetool.cli.main import COMMANDS
from sparsetool.errors import ConfigError
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.util.faces import OptionFace

SHARED = {"max_memory"}  # cli/_params.py's shared option says what it does itself


def cli_params() -> dict[str, Any]:
    """``sparsetool shrink``'s click parameters by Python name."""
    module, function, _ = COMMANDS["shrink"]
    app = typer.Typer()
    app.command()(getattr(importlib.import_module(f"sparsetool.cli.{module}"), function))
    return {p.name: p for p in typer.main.get_command(app).params}


def api_defaults() -> dict[str, Any]:
    parameters = inspect.signature(api.shrink).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


def test_every_option_has_one_default_in_the_record_the_cli_and_the_api():
    record = ShrinkOptions.defaults()
    assert record == dataclasses.asdict(ShrinkOptions())
    cli, python = cli_params(), api_defaults()
    assert set(record) <= set(cli) and set(record) == set(python)
    for name, default in record.items():
        got = cli[name].default
        assert getattr(got, "value", got) == default, (name, got, default)  # an Enum: its value
        assert python[name] == default, (name, python[name], default)


def test_the_cli_takes_each_flag_metavar_and_help_from_the_record():
    cli = cli_params()
    for f in dataclasses.fields(ShrinkOptions):
        face = f.metadata["face"]
        assert isinstance(face, OptionFace) and face.flag.startswith("--"), f.name
        flags = face.flag.split("/")  # --reconstruct/--no-reconstruct: a flag and its negation
        assert flags[0] in cli[f.name].opts, (f.name, cli[f.name].opts)
        assert flags[1:] == list(cli[f.name].secondary_opts), f.name
        if f.name in SHARED:
            continue
        assert face.help and cli[f.name].help == face.help, f.name
        if face.metavar:
            assert cli[f.name].metavar == face.metavar, f.name


def test_a_field_the_record_lacks_is_refused():
    with pytest.raises(KeyError, match="not an option of shrink"):
        ShrinkOptions.face("expert_fraction")
    with pytest.raises(TypeError, match="not an option of shrink: expert_fraction"):
        ShrinkOptions.from_values(expert_fraction=0.5)


def test_the_cli_and_the_api_make_the_same_options(monkeypatch, tmp_path):
    """The options ``sparsetool shrink`` and ``sparsetool.shrink`` hand the library, for the same
    request (a size as text, a path as a string)."""
    import sparsetool.ops.shrink as ops_shrink

    from helpers import run

    seen: list[ShrinkOptions] = []

    def fake(path, out, opts, **kw):
        seen.append(opts)
        raise ConfigError("stopped here")

    monkeypatch.setattr(ops_shrink, "shrink_checkpoint", fake)
    calib = tmp_path / "text.txt"
    calib.write_text("some text")
    args = dict(ffn=0.5, calibration=str(calib), samples=4, seq=16, max_memory="2G", seed=3)
    with pytest.raises(ConfigError, match="stopped here"):
        api.shrink(tmp_path / "in", tmp_path / "out", **args)
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--ffn", "0.5",
            "--calibration", calib, "--samples", "4", "--seq", "16", "--max-memory", "2G",
            "--seed", "3", "--device", "cpu")  # fmt: skip
    assert r.exit_code != 0 and "stopped here" in r.output, r.output
    from_api, from_cli = seen
    assert from_api == dataclasses.replace(from_cli, device="auto")
    assert from_api.max_memory == 2 * 1024**3 and from_api.calibration == Path(calib)
    assert from_api == ShrinkOptions.from_values(**args)


def test_max_memory_in_bytes_is_checked_as_the_command_checks_it():
    """A byte count (an int, or a float as 8e9) is read as --max-memory reads one: too small is
    refused before anything opens, a whole float is bytes."""
    assert ShrinkOptions.from_values(max_memory=8e9).max_memory == 8 * 10**9
    assert ShrinkOptions.from_values(max_memory=2**21).max_memory == 2**21
    with pytest.raises(ConfigError, match="at least 1M"):
        ShrinkOptions.from_values(max_memory=2**19)


def test_each_default_passes_the_check_the_cli_runs_on_it():
    for name, value in ShrinkOptions.defaults().items():
        face = ShrinkOptions.face(name)[1]
        if face.parse is not None and value is not None:
            assert face.parse(value, face.flag, **face.limits) == value, name
    ShrinkOptions(experts=0.5, criterion="random").validate()  # the defaults and a removal: valid
