"""torch's threads: the default policy (sparsetool/threads.py), the shared --threads option of
train, eval, prune, diff and demo, and OpenMP's idle workers sleeping in the command."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sparsetool.errors import SparsetoolError
from sparsetool.util import threads

from helpers import ROOT, run


@pytest.mark.parametrize(
    "usable, busy, expected",
    [
        (2, 0.0, 2),  # a quiet machine: every core
        (2, 1.0, 1),  # one other CPU-bound process: the core it leaves
        (2, 3.0, 1),  # more busy than there are cores: still one thread
        (1, 0.0, 1),
        (8, 2.6, 5),  # free cores rounded to the nearest whole one
        (8, 2.4, 6),
        (4, -1.0, 4),  # never more than the usable cores
        (0, 0.0, 1),
    ],
)
def test_default_threads_are_the_free_usable_cores(usable, busy, expected):
    assert threads.default_threads(usable, busy) == expected


def test_busy_elsewhere_counts_the_other_running_tasks(tmp_path, monkeypatch):
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("3.50 2.10 1.00 3/120 4242\n")
    monkeypatch.setattr(threads, "_LOADAVG", str(loadavg))
    assert threads.busy_elsewhere() == 2.0  # this process is one of the 3
    loadavg.write_text("0.00 0.00 0.00 1/80 4242\n")
    assert threads.busy_elsewhere() == 0.0
    monkeypatch.setattr(threads, "_LOADAVG", str(tmp_path / "missing"))
    assert threads.busy_elsewhere() == 0.0


def test_a_task_that_ran_for_a_moment_is_not_a_busy_core(tmp_path, monkeypatch):
    loadavg = tmp_path / "loadavg"
    readings = iter(["2/120", "3/120"])  # what the file says after each pause
    loadavg.write_text("1.00 1.00 1.00 3/120 4242\n")
    monkeypatch.setattr(threads, "_LOADAVG", str(loadavg))
    monkeypatch.setattr(
        threads.time,
        "sleep",
        lambda s: loadavg.write_text(f"1.00 1.00 1.00 {next(readings)} 4242\n"),
    )
    assert threads.busy_elsewhere() == 1.0  # 3, 2, 3 runnable: the fewest, less this process


# each command, and the library function it computes in (replaced by a spy that records the
# threads torch runs on and stops the command)
COMMANDS = {
    "train": (
        ["train", "-o", "{tmp}/run", "--preset", "tiny", "--steps", "2"],
        "sparsetool.train.loop",
        "train",
    ),
    "eval": (["eval", "{tmp}/a.safetensors"], "sparsetool.ops.eval", "evaluate"),
    # only the calibration methods compute with torch (magnitude prune never imports it)
    "prune": (
        [
            "prune",
            "{tmp}/a.safetensors",
            "-o",
            "{tmp}/b.safetensors",
            "--sparsity",
            "0.5",
            "--method",
            "wanda",
            "--calibration",
            "{tmp}/a.safetensors",
        ],
        "sparsetool.ops.prune.pipeline",  # where the command imports it from
        "prune_checkpoint",
    ),
    "diff": (["diff", "{tmp}/a.safetensors", "{tmp}/b.safetensors"], "sparsetool.ops.diff", "diff"),
    "demo": (["demo", "-o", "{tmp}/demo"], "sparsetool.demo", "run_demo"),
}


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def run_recording(command: str, extra: list[str], tmp_path: Path, monkeypatch) -> int:
    import importlib

    argv, module, name = COMMANDS[command]
    seen: list[int] = []

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise SparsetoolError("stopped by the test")

    monkeypatch.setattr(importlib.import_module(module), name, spy)
    torch.set_num_threads(2)
    res = run(*(a.format(tmp=tmp_path) for a in argv), *extra)
    assert res.exit_code == 1 and "stopped by the test" in res.output, res.output
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_computes_on_the_threads_asked(command, tmp_path, monkeypatch, two_threads):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: 1.0)  # a second process on the cores
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert run_recording(command, ["--threads", "1"], tmp_path, monkeypatch) == 1
    assert run_recording(command, ["--threads", "2"], tmp_path, monkeypatch) == 2
    assert (
        run_recording(command, [], tmp_path, monkeypatch) == 1
    )  # the default leaves the busy core
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: 0.0)
    assert run_recording(command, [], tmp_path, monkeypatch) == 2  # a quiet machine: both cores


@pytest.mark.parametrize("command", list(COMMANDS))
def test_omp_num_threads_in_the_environment_stands(command, tmp_path, monkeypatch, two_threads):
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: 1.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # e.g. set by the user, or by torchrun
    assert run_recording(command, [], tmp_path, monkeypatch) == 2


def test_the_default_never_raises_what_the_process_runs_on(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "busy_elsewhere", lambda: 0.0)
    try:
        torch.set_num_threads(1)
        assert threads.use_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5"])
def test_bad_thread_counts_are_usage_errors(command, value, tmp_path):
    argv, _, _ = COMMANDS[command]
    res = run(*(a.format(tmp=tmp_path) for a in argv), "--threads", value)
    assert res.exit_code == 2, res.output
    assert "--threads" in res.output


def test_every_command_has_the_same_threads_help():
    helps = set()
    for command in COMMANDS:
        out = run(command, "--help", terminal_width=200).output
        line = next(row for row in out.splitlines() if "--threads" in row)
        # a command that uses torch only sometimes says when (prune: its calibration methods)
        helps.add(
            re.sub(
                r"CPU threads for torch, with [^(]*\(",
                "CPU threads for torch (",
                " ".join(line.split()),
            )
        )
    assert len(helps) == 1, helps


def test_demo_trains_on_the_threads_asked(tmp_path, monkeypatch):
    import sparsetool.train.loop as loop
    from sparsetool.demo import run_demo

    seen = []

    def spy(cfg, **kwargs):
        seen.append(cfg.threads)
        raise SparsetoolError("stopped by the test")

    monkeypatch.setattr(loop, "train", spy)
    for asked, expected in ((None, 1), (2, 2)):
        with pytest.raises(SparsetoolError, match="stopped by the test"):
            run_demo(tmp_path / "demo", threads=asked)
        assert seen.pop() == expected
        assert not (tmp_path / "demo").exists()


PROBE = """
import os, sys
sys.argv = ["sparsetool", "--version"]
from sparsetool.cli.main import main
try:
    main()
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
"""


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_the_command_makes_idle_openmp_workers_sleep_before_torch_loads(given, expected):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = str(ROOT)
    if given:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert out[-1].split() == [
        expected,
        "False",
    ]  # set before torch was imported: OpenMP reads it on load
