"""What a training run says and checks before it starts, and what it does without the optional
parts: the disk its checkpoints take (estimated, held here against the bytes a run writes; a disk
that cannot hold one checkpoint refuses the run), fatal checks before any warning, plain progress
lines when the output is not a terminal, and no loss.png (a note, not an error) without
matplotlib."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsetool.errors import SparsetoolError
from sparsetool.train.diskplan import DiskPlan, checkpoint_steps, estimate
from sparsetool.train.loop import train
from sparsetool.train.trainconfig import TrainConfig

from helpers import run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[2]
HELDOUT = ROOT / "fixtures" / "heldout.txt"
TINY_LM = ROOT / "fixtures" / "tiny-lm"  # a Hugging Face GPT-2 with its tokenizer, tied head


def _bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _start_info(cfg: TrainConfig) -> tuple[dict, dict]:
    seen: dict = {}

    def callback(kind: str, info: dict) -> None:
        if kind == "start":
            seen.update(info)

    return seen, train(cfg, callback=callback)


FAST = dict(steps=6, warmup=1, batch_size=2, eval_every=0, data=str(HELDOUT), save_every=2)


def test_the_estimate_is_the_bytes_a_sparse_run_writes(tmp_path):
    cfg = TrainConfig(
        out=str(tmp_path / "run"),
        preset="tiny",
        algorithm="rigl",
        sparsity=0.5,
        update_freq=2,
        **FAST,
    )
    info, summary = _start_info(cfg)
    disk = info["disk"]
    run_dir = Path(summary["run_dir"])
    kept = sorted((run_dir / "checkpoints").iterdir())
    assert [p.name for p in kept] == ["step-000004", "step-000006"]  # keep_last 2 of 3 saves
    assert disk["saves"] == 3 and disk["checkpoints_at_once"] == 3 and disk["keep_last"] == 2
    for checkpoint in kept:
        written = _bytes(checkpoint)
        assert abs(disk["checkpoint_bytes"] - written) < 0.03 * written, (disk, written)
    model = (run_dir / "model.safetensors").stat().st_size
    assert abs(disk["final_model_bytes"] - model) < 0.03 * model
    assert disk["masks_bytes"] > 0 and info["disk_plan"].startswith("disk: ")


def test_the_estimate_of_a_hugging_face_run_and_its_model_directory(tmp_path):
    cfg = TrainConfig(out=str(tmp_path / "run"), init=str(TINY_LM), context=32, **FAST)
    cfg.steps, cfg.save_every = 2, 0
    info, summary = _start_info(cfg)
    disk, run_dir = info["disk"], Path(summary["run_dir"])
    (checkpoint,) = (run_dir / "checkpoints").iterdir()
    written = _bytes(checkpoint)
    assert abs(disk["checkpoint_bytes"] - written) < 0.03 * written, (disk, written)
    exported = _bytes(run_dir / "model")
    assert abs(disk["final_model_bytes"] - exported) < 0.03 * exported, (disk, exported)
    # a tied head is written twice in a checkpoint (every state-dict entry), once in model/
    assert disk["model_bytes"] > disk["final_model_bytes"] - disk["other_bytes"]


def test_a_disk_that_cannot_hold_one_checkpoint_refuses_the_run(tmp_path):
    plan = estimate(
        entries=[("w", 10**6)],
        params=[10**6],
        targeted=[("w", 10**6)],
        sparse=False,
        algorithm=None,
        sharded=False,
        other=0,
        final=None,
        final_name="model.safetensors",
        saves=3,
        keep_last=2,
        free=10**6,
    )
    with pytest.raises(SparsetoolError) as e:
        plan.check(tmp_path / "run")
    text = str(e.value)
    assert text.startswith(
        "train: one checkpoint of this run takes about 11.5 MiB (model 3.82 MiB + optimizer "
        "state 7.63 MiB) and model.safetensors 3.82 MiB more"
    ), text
    assert f"the file system of {tmp_path / 'run'} has 977 KiB free" in text and "\n" not in text
    roomy = DiskPlan(**{**plan.__dict__, "free": plan.first_save})
    roomy.check(tmp_path)  # the first save fits: the run starts...
    assert "a later save will fail" in (roomy.shortfall() or "")  # ...warned
    assert DiskPlan(**{**plan.__dict__, "free": plan.peak}).shortfall() is None


def test_saves_counted_as_the_loop_saves():
    assert [checkpoint_steps(0, 10, every) for every in (0, 1, 2, 3, 4, 10, 20)] == [
        1,
        10,
        5,
        4,
        3,
        1,
        1,
    ]
    assert checkpoint_steps(6, 10, 2) == 2  # a resume from step 6: steps 8 and 10


# ----------------------------------------------------------------------------- the command line


def test_a_bad_init_fails_before_any_warning(tmp_path):
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    (no_config / "model.safetensors").write_bytes(
        (ROOT / "fixtures" / "tiny-gpt2" / "model.safetensors").read_bytes()
    )
    for init in (no_config, tmp_path / "missing"):
        # --steps 1 with the default --warmup 100 would be warned about: not before the error
        r = run("train", "--init", init, "-o", tmp_path / "run", "--steps", "1")
        assert r.exit_code == 1, r.output
        assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
        assert not (tmp_path / "run").exists()


TINY_RUN = ["--preset", "tiny", "--steps", "3", "--warmup", "1", "--batch-size", "2"]
TINY_RUN += ["--eval-every", "0", "--data", str(HELDOUT)]


def test_progress_lines_when_the_output_is_not_a_terminal_and_quiet_silences_them(tmp_path):
    env = {"SPARSETOOL_PROGRESS_INTERVAL": "0"}
    r = run("train", "-o", tmp_path / "a", *TINY_RUN, env=env)
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("progress: ")]
    assert lines[0].startswith("progress: train 1/3 (33%), loss ") and "left" in lines[0]
    assert lines[-1].startswith("progress: train 3/3 done in ")
    assert "disk: " in r.stdout and "a checkpoint (model " in r.stdout
    r = run("train", "-o", tmp_path / "b", *TINY_RUN, "-q", env=env)
    assert r.exit_code == 0 and r.stderr == "", r.stderr


def test_a_hugging_face_run_says_its_memory_plan_and_its_disk_before_it_starts(tmp_path):
    r = run("train", "--init", TINY_LM, "-o", tmp_path / "run", *TINY_RUN[2:], "--context", "32")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].startswith("memory plan: weights ") and lines[2].startswith("disk: "), lines


def test_without_matplotlib_the_run_writes_no_picture_and_says_so_once(tmp_path):
    """The run's results never depend on the optional picture: a note line, then the same run
    (a second one with --json, in the same process: no note, the summary's plot is null)."""
    code = f"""
import sys
sys.modules["matplotlib"] = None  # every import of it raises ImportError
from sparsetool.cli.main import main
for out, extra in (("run", []), ("run2", ["--json"])):
    sys.argv[1:] = ["train", "-o", out, *{TINY_RUN!r}, *extra]
    try:
        main()
    except SystemExit as e:
        assert not e.code, e.code
    print("=====")
"""
    env = {k: v for k, v in os.environ.items() if k != "SPARSETOOL_PROGRESS_INTERVAL"}
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("note: matplotlib is not installed: the run writes no loss.png")
    assert r.stderr.count("\n") == 1 and "pip install 'sparsetool[plot]'" in r.stderr
    table, summary, _ = r.stdout.split("=====\n")
    assert "none (matplotlib is not installed)" in table
    assert json.loads(summary)["plot"] is None
    for name in ("run", "run2"):
        run_dir = tmp_path / name
        assert not (run_dir / "loss.png").exists() and (run_dir / "log.csv").exists()
        assert (run_dir / "model.safetensors").exists()
