"""Options that do not fit the input they come with are usage errors (exit 2, one ``error:`` line)
even when only reading the input shows it: a shape flag with ``train --init HF_DIR``, an eval
window the model cannot take."""

from __future__ import annotations

import pytest

from helpers import run


def one_usage_error(r, *words: str) -> str:
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    "flag", [("--n-layer", "4"), ("--n-head", "2"), ("--d-model", "64"), ("--preset", "tiny")]
)
def test_a_shape_flag_with_a_hugging_face_init(hf_dir, tmp_path, flag):
    r = run(
        "train", "-o", tmp_path / "run", "--init", hf_dir, *flag, "--steps", "1", "--warmup", "0"
    )
    one_usage_error(r, f"{flag[0]} cannot change a Hugging Face model", str(hf_dir / "config.json"))
    assert not (tmp_path / "run").exists()


def test_a_context_longer_than_the_hugging_face_model(hf_dir, tmp_path):
    r = run(
        "train",
        "-o",
        tmp_path / "run",
        "--init",
        hf_dir,
        "--context",
        "100000",
        "--steps",
        "1",
        "--warmup",
        "0",
    )
    one_usage_error(r, "--context 100000 is longer than")


def test_bitmask_encoding_without_a_hugging_face_init(tiny_run, tmp_path):
    r = run(
        "train",
        "-o",
        tmp_path / "run",
        "--init",
        tiny_run,
        "--encoding",
        "bitmask",
        "--steps",
        "1",
        "--warmup",
        "0",
    )
    one_usage_error(r, "--encoding bitmask applies to the Hugging Face directory")


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ("--stride", "300"),
            "--stride 300: must be between 1 and --seq (64)",
        ),  # the model's window
        (("--seq", "32", "--stride", "40"), "--stride 40: must be between 1 and --seq (32)"),
        (("--seq", "300"), "--seq 300: "),  # longer than the model's context
        (("--seq", "1"), "--seq 1: "),
    ],
)
def test_an_eval_window_the_model_cannot_take(tiny_run, args, words):
    one_usage_error(run("eval", tiny_run, "--max-tokens", "200", *args), words)


# ----------------------------------------------------------------------------- item 7 of issue 31
@pytest.mark.parametrize("layout", ["dir", "file"])
def test_train_init_without_config_json_says_so(tmp_path, layout):
    """A checkpoint that is neither sparsetool's GPT nor a Hugging Face directory: train says
    there is no config.json, as eval and prune do, not that a GPT tensor is missing."""
    from helpers import ROOT

    src = ROOT / "fixtures" / "tiny-gpt2" / "model.safetensors"
    if layout == "dir":
        init = tmp_path / "weights"
        init.mkdir()
        (init / "model.safetensors").write_bytes(src.read_bytes())
    else:  # a lone file (one inside a Hugging Face directory is refused for that)
        init = tmp_path / "weights.safetensors"
        init.write_bytes(src.read_bytes())
    r = run("train", "-o", tmp_path / "run", "--init", init, "--steps", "1", "--warmup", "0")
    assert r.exit_code == 1, r.output
    assert r.stderr == (
        f"error: {init}: no config.json; train --init needs a Hugging Face model directory "
        "(config.json, weights, tokenizer files) or a checkpoint of sparsetool train\n"
    )
    assert not (tmp_path / "run").exists()
