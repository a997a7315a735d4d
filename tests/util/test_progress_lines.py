"""Progress for a log: when stderr is not a terminal (a pipe, a file, CI) every command's progress
callback prints plain throttled lines there (``ProgressLines``), and a model-level run's memory
plan comes with them; ``-q`` silences both. The throttling is tested with an injected clock, the
command line with real subprocesses whose stderr is a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparsetool.util.progress import ProgressLines, duration

ROOT = Path(__file__).resolve().parents[2]
TINY_LM = ROOT / "fixtures" / "tiny-lm"
HELDOUT = ROOT / "fixtures" / "heldout.txt"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _lines(interval: float = 30.0) -> tuple[ProgressLines, list[str], Clock]:
    clock, out = Clock(), []
    return ProgressLines(out.append, interval=interval, clock=clock), out, clock


def test_a_short_command_prints_nothing():
    p, out, clock = _lines()
    for i in range(1, 11):
        clock.now += 2.9  # 29 s in all: below the interval
        p("prune", i, 10)
    assert out == []


def test_at_most_one_line_per_interval_and_one_at_each_stage_end():
    p, out, clock = _lines()
    for i in range(1, 101):  # one unit a second, 100 s
        clock.now += 1.0
        p("calibrate", i, 100)
    middle = [line for line in out if "left" in line]
    assert [line.split(",")[0] for line in middle] == [
        "progress: calibrate 30/100 (30%)",
        "progress: calibrate 60/100 (60%)",
        "progress: calibrate 90/100 (90%)",
    ]
    assert middle[0] == "progress: calibrate 30/100 (30%), 30s elapsed, about 1m10s left"
    assert out[-1] == "progress: calibrate 100/100 done in 1m40s"
    assert len(out) == 4
    # a second stage: its end is printed at once, its elapsed time is its own
    clock.now += 5.0
    p("prune", 1, 2)
    clock.now += 5.0
    p("prune", 2, 2)
    assert out[-1] == "progress: prune 2/2 done in 10s"
    p("prune", 2, 2)  # the end said again: printed once
    assert len(out) == 5


def test_a_stage_reported_from_zero_and_restarted_and_a_resumed_count():
    p, out, clock = _lines(interval=10)
    clock.now += 60
    p("timing", 0, 4)  # the stage begins: no line, its clock starts
    clock.now += 20
    p("timing", 1, 4)
    assert out == ["progress: timing 1/4 (25%), 20s elapsed, about 1m00s left"]
    clock.now += 20
    p("timing", 0, 4)  # the same stage begins again (a second checkpoint, say)
    clock.now += 10
    p("timing", 2, 4)
    assert out[-1] == "progress: timing 2/4 (50%), 10s elapsed, about 10s left"
    # a resumed run reports from step 501: the 500 before are not this process's work
    p2, out2, clock2 = _lines(interval=10)
    clock2.now += 10
    p2("train", 501, 1000, "loss 2.5000")
    clock2.now += 10
    p2("train", 502, 1000, "loss 2.4000")
    assert out2[-1] == (
        "progress: train 502/1,000 (50%), loss 2.4000, 20s elapsed, about 1h23m left"
    )


def test_the_set_up_before_the_first_unit_does_not_stretch_the_time_left():
    p, out, clock = _lines()
    clock.now += 100  # a model loads: 100 s before the first of 10 blocks is done
    p("calibrate", 1, 10)
    assert out == ["progress: calibrate 1/10 (10%), 1m40s elapsed, about 15m00s left"]
    for done in (2, 3, 4):  # then 10 s a block
        clock.now += 10
        p("calibrate", done, 10)
    assert out[-1] == "progress: calibrate 4/10 (40%), 2m10s elapsed, about 1m00s left"


def test_a_held_line_comes_before_the_first_progress_line_or_not_at_all():
    p, out, clock = _lines()
    p.hold("memory plan: 1 GiB")  # in the first 30 s: kept
    clock.now += 29
    p("calibrate", 1, 30)
    assert out == []
    clock.now += 1
    p("calibrate", 2, 30)
    assert out[0] == "memory plan: 1 GiB" and out[1].startswith("progress: calibrate 2/30")
    p.hold("second: memory plan: 2 GiB")  # past the first 30 s: at once
    assert out[-1] == "second: memory plan: 2 GiB"
    short, out, clock = _lines()
    short.hold("memory plan: 1 GiB")
    clock.now += 5
    short("calibrate", 1, 1)
    short.close()  # a run of 5 s: its log gets nothing
    assert out == []
    long, out, clock = _lines()
    long.hold("memory plan: 1 GiB")
    clock.now += 40  # no progress reported, but the run lasted: the plan at its end
    long.close()
    assert out == ["memory plan: 1 GiB"]


def test_an_interval_of_zero_prints_every_report():
    p, out, clock = _lines(interval=0)
    for i in range(1, 4):
        clock.now += 0.1
        p("scan", i, 3)
    assert out[:2] == [
        "progress: scan 1/3 (33%), 0s elapsed, about 0s left",
        "progress: scan 2/3 (67%), 0s elapsed, about 0s left",
    ]
    assert out[2] == "progress: scan 3/3 done in 0s"


def test_durations():
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600, 90000)] == [
        "0s",
        "59s",
        "1m00s",
        "59m59s",
        "1h00m",
        "25h00m",
    ]


# ----------------------------------------------------------------------------- the command line


def _wanda(tmp_path: Path, *extra: str, interval: str | None) -> tuple[int, str]:
    """``prune --method wanda`` on the tiny fixture model, stderr to a file (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if k != "SPARSETOOL_PROGRESS_INTERVAL"}
    if interval is not None:
        env["SPARSETOOL_PROGRESS_INTERVAL"] = interval
    out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
    err = tmp_path / "stderr.txt"
    with err.open("w") as fh:
        code = subprocess.run(
            [sys.executable, "-m", "sparsetool", "prune", str(TINY_LM), "-o", str(out)]
            + ["--method", "wanda", "--sparsity", "0.5", "--calibration", str(HELDOUT)]
            + ["--threads", "1", *extra],
            stdout=subprocess.DEVNULL,
            stderr=fh,
            env=env,
            timeout=300,
        ).returncode
    return code, err.read_text()


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("progress")


def test_a_log_gets_progress_lines_and_the_memory_plan(work):
    code, err = _wanda(work, interval="0")
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("memory plan: weights ") and " available memory" in lines[0]
    progress = [line for line in lines if line.startswith("progress: ")]
    assert "progress: calibrate 2/2 done in" in err, err
    assert any("left" in line for line in progress), err
    assert "\x1b[" not in err  # plain text: no terminal codes


def test_quiet_silences_the_lines_and_the_plan(work):
    code, err = _wanda(work, "-q", interval="0")
    assert code == 0 and err == "", err


def _report(tmp_path: Path, interval: str) -> tuple[int, str]:
    """``report`` (no torch), stderr a pipe."""
    env = {**os.environ, "SPARSETOOL_PROGRESS_INTERVAL": interval}
    r = subprocess.run(
        [sys.executable, "-m", "sparsetool", "report", str(ROOT / "fixtures" / "tiny-gpt2")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    return r.returncode, r.stderr


def test_every_command_gets_the_lines_and_a_bad_interval_is_a_warning(work):
    code, err = _report(work, "0")
    assert code == 0, err
    assert err.splitlines()[-1].startswith("progress: report 28/28 done in "), err
    code, err = _report(work, "soon")
    assert code == 0, err
    # the default then: 30 s between lines and none in the first 30 s, so nothing more here
    assert err == (
        "warning: SPARSETOOL_PROGRESS_INTERVAL='soon' is not a number of seconds >= 0; "
        "progress lines come every 30 s\n"
    )
