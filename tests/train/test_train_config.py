"""train --config: keys are the flag names, values are type-checked in one place, and a bad key or
value is one `error:` line that names the file, the key, the value and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparsetool.errors import ConfigError
from sparsetool.train.configkeys import merge, read_config_file

from helpers import ROOT, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n" for i in range(300)))
    return path


def config(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def train_with(tmp_path: Path, cfg: Path, *extra: str):
    return run("train", "--config", str(cfg), "-o", str(tmp_path / "run"), "--json", *extra)


# --- values of the wrong type: one error line, exit 1, nothing written ---------------------------


@pytest.mark.parametrize(
    "line, message",
    [
        ("steps: abc", "steps: 'abc' is not an integer; give a whole number, e.g. steps: 1000"),
        ("steps: 3.7", "steps: 3.7 is not an integer; give a whole number, e.g. steps: 1000"),
        ("steps: true", "steps: true is not an integer; give a whole number, e.g. steps: 1000"),
        ("threads: 1.5", "threads: 1.5 is not an integer; give a whole number, e.g. threads: 1"),
        ("lr: fast", "lr: 'fast' is not a number; give a number, e.g. lr: 0.001"),
        ("lr: .nan", "lr: nan is not a finite number; give a number, e.g. lr: 0.001"),
        (
            "weight-decay: [0.1]",
            "weight-decay: [0.1] is not a number; give a number, e.g. weight-decay: 0.1",
        ),
        ("dense: 1", "dense: 1 is not true or false; give true or false, e.g. dense: true"),
        ("device: 0", "device: 0 is not a string; give text, e.g. device: auto"),
        (
            "steps:",
            "steps has no value; give a whole number, e.g. steps: 1000, or drop the key for "
            "the default",
        ),
        (
            "model: {n_layer: two}",
            "model.n_layer: 'two' is not an integer; give a whole number, e.g. n_layer: 4",
        ),
        (
            "sparsity: {algorithm: rigl, sparsity: 0.5, update: {freq: often}}",
            "sparsity.update.freq: 'often' is not an integer; give a whole number, e.g. freq: 100",
        ),
        (
            "stages: 3",
            "stages: 3 is not a list of SPARSITY:FRACTION stages; give e.g. "
            "stages: ['0.9:0.8', '0:0.2']",
        ),
        (
            "stage: ['0.9']",
            "stage: '0.9' is not SPARSITY:FRACTION, e.g. stage: ['0.9:0.8', '0:0.2']",
        ),
        ("stages: ['0.5:2']", "stages: '0.5:2': the fraction of the run must be in (0, 1], got 2"),
        (
            "sparsity_option: [scope]",
            "sparsity_option: 'scope' is not KEY=VALUE, e.g. "
            "sparsity_option: ['scope=layer'] or sparsity_option: {scope: layer}",
        ),
        ("include: ''", "include: needs a glob over tensor names, e.g. include: '*.mlp.*', got ''"),
        (
            "sparsity: abc",
            "sparsity: must be a number from 0 to 1 (the fraction of weights set to zero), "
            "got 'abc'",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_one_error_naming_file_key_value_and_type(
    tmp_path, corpus, line, message
):
    cfg = config(tmp_path, f"preset: tiny\ndata: {corpus}\n{line}\n")
    r = train_with(tmp_path, cfg)
    assert r.exit_code == 1, r.output
    assert r.stderr == f"error: config file '{cfg}': {message}\n"
    assert r.stdout == "" and not (tmp_path / "run").exists()


def test_a_value_of_the_wrong_type_in_a_toml_file(tmp_path):
    cfg = config(tmp_path, 'steps = "abc"\n[model]\npreset = "tiny"\n', "run.toml")
    with pytest.raises(ConfigError) as e:
        read_config_file(cfg)
    assert str(e.value) == (
        f"config file '{cfg}': steps: 'abc' is not an integer; give a whole "
        "number, e.g. steps: 1000"
    )


def test_numbers_are_read_as_flags_read_them(tmp_path):
    # PyYAML reads 1e-3 (no dot) as a string; --lr 1e-3 is a number, so the file's is too
    got = read_config_file(
        config(
            tmp_path,
            "lr: 1e-3\nsteps: 3.0\nwarmup: '2'\ngrad_clip: 1\nweight_decay: 0\nsparsity: '0.5'\n",
        )
    )
    assert got == {
        "lr": 0.001,
        "steps": 3,
        "warmup": 2,
        "grad_clip": 1.0,
        "weight_decay": 0.0,
        "sparsity": 0.5,
    }
    assert type(got["steps"]) is int and type(got["grad_clip"]) is float


def test_a_yaml_learning_rate_without_a_dot_trains(tmp_path, corpus):
    cfg = config(
        tmp_path, f"preset: tiny\ndata: {corpus}\nlr: 1e-3\nsteps: 1\nwarmup: 1\nbatch-size: 2\n"
    )
    r = train_with(tmp_path, cfg)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["lr"] == 0.001


def test_library_values_are_checked_the_same_way(tmp_path):
    with pytest.raises(ConfigError) as e:
        merge({}, {"out": str(tmp_path / "r"), "steps": "abc"})
    assert str(e.value) == "--steps 'abc' is not an integer; give a whole number, e.g. --steps 1000"
    with pytest.raises(ConfigError, match=r"^--threads 1.5 is not an integer"):
        merge({}, {"out": str(tmp_path / "r"), "threads": 1.5})
    with pytest.raises(
        ConfigError,
        match=r"^'keep_last' \(config file\) 'x' is not an integer; "
        r"give a whole number, e.g. keep_last: 2$",
    ):
        merge({"keep_last": "x"}, {"out": str(tmp_path / "r")})
    cfg = merge({}, {"out": str(tmp_path / "r"), "steps": "7", "lr": "2e-3"})
    assert (cfg.steps, cfg.lr) == (7, 0.002)


# --- keys: the flag names, their aliases, Model Zoo spellings ------------------------------------


def test_keys_are_the_flag_names_with_dashes_or_underscores(tmp_path):
    got = read_config_file(
        config(
            tmp_path,
            (
                "stage: ['0.9:0.5', '0:0.5']\nsparsity-option: {scope: layer}\noutput: runs/x\n"
                "batch-size: 4\ngrad_accum: 2\ninit-method: magnitude\n"
            ),
        )
    )
    assert got == {
        "stages": [(0.9, 0.5), (0.0, 0.5)],
        "sparsity_options": {"scope": "layer"},
        "out": "runs/x",
        "batch_size": 4,
        "grad_accum": 2,
        "init_method": "magnitude",
    }
    # the flag's own form, KEY=VALUE, as well as a mapping
    got = read_config_file(
        config(
            tmp_path, "sparsity_options: ['scope=layer', 'stop_fraction=0.5']\nstages: '0.5:1'\n"
        )
    )
    assert got == {
        "sparsity_options": {"scope": "layer", "stop_fraction": 0.5},
        "stages": [(0.5, 1.0)],
    }


def test_a_stage_key_trains_in_stages(tmp_path, corpus):
    cfg = config(
        tmp_path,
        f"preset: tiny\ndata: {corpus}\nsteps: 2\nwarmup: 1\nbatch_size: 2\n"
        "stage: ['0.5:0.5', '0:0.5']\n",
    )
    r = train_with(tmp_path, cfg)
    assert r.exit_code == 0, r.output
    stored = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert stored["stages"] == [[0.5, 0.5], [0.0, 0.5]]


def test_an_unknown_key_names_the_closest_valid_one(tmp_path, corpus):
    cfg = config(tmp_path, f"preset: tiny\ndata: {corpus}\nstpes: 3\n")
    r = train_with(tmp_path, cfg)
    assert r.exit_code == 1
    line = r.stderr.strip()
    assert "\n" not in line
    assert line.startswith(
        f"error: config file '{cfg}': unknown key 'stpes'; did you mean 'steps'? "
    )
    assert "sparsetool train --help" in line and "docs/train.md" in line
    with pytest.raises(ConfigError, match=r"unknown key 'batch-sise'; did you mean 'batch-size'\?"):
        read_config_file(config(tmp_path, "batch-sise: 4\n"))
    with pytest.raises(
        ConfigError,
        match=r"unknown keys 'model.n_layers' \(did you mean 'n_layer'\?\)"
        r", 'zzz'",
    ):
        read_config_file(config(tmp_path, "model: {n_layers: 2}\nzzz: 1\n"))


def test_a_section_without_keys_says_so(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"'model' is a section: give it keys, e.g. model: "
        r"\{preset: tiny\}$",
    ):
        read_config_file(config(tmp_path, "model: tiny\n"))


def test_a_command_line_only_flag_in_a_file_says_so(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"'resume' is a command-line flag, not a config key; "
        r"give --resume on the command line",
    ):
        read_config_file(config(tmp_path, "resume: true\n"))


def test_a_setting_given_twice_is_refused(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"'stages' is given twice \(as 'stage' and 'stages'\); "
        r"keep one",
    ):
        read_config_file(config(tmp_path, "stage: ['0:1']\nstages: ['0:1']\n"))
    with pytest.raises(
        ConfigError,
        match=r"'algorithm' is given twice \(as 'algorithm' and "
        r"'sparsity.algorithm'\)",
    ):
        read_config_file(
            config(tmp_path, "algorithm: set\nsparsity: {algorithm: rigl, sparsity: 0.5}\n")
        )


def test_model_zoo_topk_is_magnitude(tmp_path):
    got = read_config_file(
        config(tmp_path, "sparsity: {algorithm: rigl, sparsity: 0.5, init_method: topk}\n")
    )
    assert got["init_method"] == "magnitude"
    assert read_config_file(config(tmp_path, "init_method: TopK\n")) == {"init_method": "magnitude"}
    with pytest.raises(
        ConfigError,
        match=r"init_method: 'checkerboard' is not a known init method; "
        r"give random or magnitude \(the Model Zoo's topk\), "
        r"e.g. init_method: magnitude$",
    ):
        read_config_file(config(tmp_path, "init_method: checkerboard\n"))
    with pytest.raises(ConfigError, match=r"^--init-method 'checkerboard' is not a known init"):
        merge({}, {"out": "x", "init_method": "checkerboard"})


def test_model_zoo_update_block_spellings(tmp_path):
    got = read_config_file(
        config(
            tmp_path,
            "sparsity:\n  type: set\n  sparsity: 0.5\n"
            "  schedule: {type: periodic, every: 10, begin: 5, end: 50}\n",
        )
    )
    assert (got["algorithm"], got["update_freq"], got["update_start"], got["update_stop"]) == (
        "set",
        10,
        5,
        50,
    )
    with pytest.raises(
        ConfigError,
        match=r"sparsity.update: unknown key 'frq'; valid: freq, start, "
        r"stop \(or begin, end\)",
    ):
        read_config_file(
            config(tmp_path, "sparsity: {algorithm: set, sparsity: 0.5, update: {frq: 10}}\n")
        )


def test_the_docs_table_lists_every_key_and_alias():
    import dataclasses
    import re

    from sparsetool.train.trainconfig import KEY_ALIASES, TrainConfig

    page = (ROOT / "docs" / "train.md").read_text()
    section = page.split("## `train --config` keys", 1)[1].split("\n## ", 1)[0]
    first_cells = [row.split("|")[1] for row in section.splitlines() if row.startswith("| `")]
    listed = set(re.findall(r"`(\w+)`", " ".join(first_cells)))
    assert {f.name for f in dataclasses.fields(TrainConfig)} | set(KEY_ALIASES) <= listed
