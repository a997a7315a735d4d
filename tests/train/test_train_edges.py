"""train's edge cases: each is refused with the reason (the run could not be what was asked) or
warned about with the reason (the run is legal but probably not what was meant)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from sparsetool.errors import ConfigError
from sparsetool.train.configkeys import merge
from sparsetool.util.corpus import load_corpus

from helpers import make_corpus, run

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

TEXT_ADVICE = "give a UTF-8 text file or a directory of them"


def train(out: Path, data: Path | str, *extra: str):
    return run(
        "train",
        "-o",
        str(out),
        "--data",
        str(data),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--warmup",
        "1",
        "--eval-every",
        "0",
        "--json",
        *extra,
    )


# --- --warmup >= --steps: a warning, with the reason; the run goes on ----------------------------


@pytest.mark.parametrize("flag", ["--json", "--quiet"])
def test_a_warm_up_as_long_as_the_run_is_warned_about(tmp_path, corpus, flag):
    r = run(
        "train",
        "-o",
        str(tmp_path / "run"),
        "--data",
        str(corpus),
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "5",
        "--batch-size",
        "2",
        "--eval-every",
        "0",
        flag,
    )
    assert r.exit_code == 0, r.output
    assert r.stderr == (
        "warning: --warmup 5 >= --steps 2: the whole run is warm-up, so the learning "
        "rate ends at 40% of --lr and never decays; give a --warmup below --steps\n"
    )


def test_the_warm_up_caveat_is_there_for_library_callers_too(tmp_path):
    from sparsetool.train.trainconfig import caveats

    cfg = merge({}, {"out": str(tmp_path / "r"), "steps": 50})  # the default warm-up is 100 steps
    assert caveats(cfg) == [
        "--warmup 100 >= --steps 50: the whole run is warm-up, so the learning "
        "rate ends at 50% of --lr and never decays; give a --warmup below --steps"
    ]
    cfg = merge({}, {"out": str(tmp_path / "r"), "steps": 10, "warmup": 10})
    assert "reaches --lr only at the last step and never decays" in caveats(cfg)[0]
    assert caveats(merge({}, {"out": str(tmp_path / "r"), "steps": 11, "warmup": 10})) == []


# --- --init CHECKPOINT: the shape comes from the checkpoint, --preset included -------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, corpus) -> Path:
    out = tmp_path_factory.mktemp("pre") / "run"
    r = train(out, corpus, "--preset", "tiny")
    assert r.exit_code == 0, r.output
    return out / "model.safetensors"


def test_init_refuses_a_preset_of_another_shape_like_a_width(tmp_path, corpus, tiny_checkpoint):
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--preset", "mini")
    assert r.exit_code == 1
    assert r.stderr == (
        f"error: --preset mini disagrees with --init {tiny_checkpoint} (n_layer 2, "
        "n_head 2, d_model 32, context 64; mini has 4, 4, 128, 128); the model's "
        "shape comes from the checkpoint\n"
    )
    assert not (tmp_path / "ft").exists()
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--d-model", "64")
    assert r.exit_code == 1 and r.stderr.startswith("error: --d-model 64 disagrees with --init ")


def test_init_accepts_the_preset_the_checkpoint_has(tmp_path, corpus, tiny_checkpoint):
    r = train(tmp_path / "ft", corpus, "--init", str(tiny_checkpoint), "--preset", "tiny")
    assert r.exit_code == 0, r.output
    stored = json.loads((tmp_path / "ft" / "run.json").read_text())["config"]
    assert stored["preset"] == "tiny"


def test_without_init_the_preset_defaults_to_mini_and_with_init_to_none(tmp_path):
    assert merge({}, {"out": str(tmp_path / "r")}).preset == "mini"
    assert merge({}, {"out": str(tmp_path / "r"), "init": "x.safetensors"}).preset is None


# --- --data: text only, and each refusal says what the path is -----------------------------------


def test_binary_data_files_are_refused_with_the_reason(tmp_path):
    blob = tmp_path / "x.bin"
    blob.write_bytes(random.Random(0).randbytes(4096))
    elf = tmp_path / "prog"
    elf.write_bytes(b"\x7fELF\x02\x01\x01" + b"text-looking bytes\n" * 50)
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9 au lait\n" * 50)
    for path, reason in [
        (blob, "it holds NUL bytes"),
        (elf, "it is an ELF executable"),
        (latin, "it is not UTF-8: byte 0xe9 at offset 3"),
    ]:
        with pytest.raises(ConfigError) as e:
            load_corpus(path)
        assert str(e.value) == f"--data '{path}' is not a text file ({reason}); {TEXT_ADVICE}"


def test_data_that_is_empty_or_not_a_file_says_what_it_is(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        (empty, "is empty"),
        (Path("/dev/null"), "is not a regular file (a character device)"),
        (tmp_path / "missing.txt", "does not exist"),
    ]
    for path, what in cases:
        with pytest.raises(ConfigError) as e:
            load_corpus(path)
        assert str(e.value) == f"--data '{path}' {what}; {TEXT_ADVICE}"


def test_binary_data_through_the_cli_is_one_error_line(tmp_path):
    blob = tmp_path / "x.bin"
    blob.write_bytes(random.Random(1).randbytes(4096))
    for data, what in [
        (blob, "is not a text file (it holds NUL bytes)"),
        ("/dev/null", "is not a regular file (a character device)"),
    ]:
        r = train(tmp_path / "run", data, "--preset", "tiny")
        assert r.exit_code == 1
        assert r.stderr == f"error: --data '{data}' {what}; {TEXT_ADVICE}\n"
        assert not (tmp_path / "run").exists()


def test_a_directory_skips_binary_files_and_says_how_many(tmp_path):
    data = make_corpus(tmp_path / "data")
    (data / "blob.bin").write_bytes(random.Random(0).randbytes(4096))
    (data / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    c = load_corpus(data)
    assert c.train_files + c.val_files == 24 and c.skipped == ["blob.bin", "img.png"]
    assert c.describe()["skipped_files"] == 2
    r = train(tmp_path / "run", data, "--preset", "tiny")
    assert r.exit_code == 0, r.output
    assert r.stderr == (
        f"warning: --data '{data}': skipped 2 files that are not UTF-8 text "
        "(blob.bin, img.png); training on the other 24\n"
    )


def test_a_directory_of_binary_files_only_is_refused(tmp_path):
    data = tmp_path / "bins"
    data.mkdir()
    (data / "a.bin").write_bytes(b"\x00" * 100)
    (data / "b.bin").write_bytes(b"\x01\x00" * 100)
    with pytest.raises(ConfigError) as e:
        load_corpus(data)
    assert str(e.value) == (
        f"--data '{data}' holds no text files: 2 files are not UTF-8 text "
        f"(a.bin: it holds NUL bytes; and 1 more); {TEXT_ADVICE}"
    )
