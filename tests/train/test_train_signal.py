"""sparsetool train on SIGINT / SIGTERM: the first signal finishes the step in progress, saves a
checkpoint at it (as --stop-at does), says how to resume and exits 128 + the signal's number;
--resume then continues bit-identically. A second signal stops at once without saving, and the
last complete checkpoint stays usable. The command-line cases send real signals to a real
`python -m sparsetool train` process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparsetool.errors import SparsetoolError
from sparsetool.train.configkeys import merge
from sparsetool.train.loop import train
from sparsetool.train.trainconfig import TrainConfig

from helpers import run as cli

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

STEPS = 300  # long enough that a signal sent at step 30 lands well before the end
SPARSE = [
    "--algorithm",
    "rigl",
    "--sparsity",
    "0.75",
    "--update-freq",
    "10",
    "--update-stop",
    "250",
    "--grad-accum",
    "2",
]


def _env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    return env


def args(run: Path, data: Path, *extra: str) -> list[str]:
    return [
        "train",
        "-o",
        str(run),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        str(STEPS),
        "--batch-size",
        "4",
        "--warmup",
        "2",
        "--eval-every",
        "25",
        "--save-every",
        "40",
        "--threads",
        "1",
        "--seed",
        "0",
        *extra,
    ]


def records(run: Path) -> list[dict]:
    """log.jsonl's complete lines (a line being written is left for the next look)."""
    path = run / "log.jsonl"
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def train_steps(run: Path) -> list[int]:
    return [r["step"] for r in records(run) if r["kind"] == "train"]


def start(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sparsetool", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )


def wait_for_step(proc: subprocess.Popen, run: Path, step: int, timeout: float = 60.0) -> None:
    """Poll the log until the run has logged ``step`` (the trainer is then inside its loop)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if max(train_steps(run), default=0) >= step:
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"the run ended (exit {proc.returncode}) before step {step}:\n{err[-3000:]}"
            )
        time.sleep(0.01)
    proc.kill()
    pytest.fail(f"no step {step} in {run / 'log.jsonl'} after {timeout} s")


def comparable(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")}
        for r in records(run)
        if r["kind"] != "interrupt"
    ]


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def checkpoint_step(run: Path) -> int:
    name = (run / "latest").read_text().strip()
    state = json.loads((run / "checkpoints" / name / "state.json").read_text())
    assert name == f"step-{state['step']:06d}"
    return state["step"]


# ---------------------------------------------------------------- the command line, real signals
def test_sigint_saves_the_step_and_resume_matches_an_uninterrupted_run(tmp_path, corpus):
    part = tmp_path / "part"
    proc = start(args(part, corpus, *SPARSE, "--json"))
    wait_for_step(proc, part, 30)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    summary = json.loads(out)
    at = summary["step"]
    assert 30 <= at < STEPS and summary["interrupted"] == "SIGINT" and not summary["finished"]
    assert (
        f"interrupted by SIGINT at step {at} of {STEPS}: saved a checkpoint "
        f"({part / 'checkpoints' / f'step-{at:06d}'}); continue with: sparsetool train -o {part} "
        "--resume"
    ) in err
    # the step it reached is saved exactly as --stop-at saves it, and the log says why it stopped
    assert checkpoint_step(part) == at
    state = json.loads((part / "checkpoints" / f"step-{at:06d}" / "state.json").read_text())
    assert state["data_position"] == at * 4 * 2 and state["tokens"] == at * 4 * 2 * 64
    assert max(train_steps(part)) == at
    assert records(part)[-1] == {
        "kind": "interrupt",
        "step": at,
        "signal": "SIGINT",
        "checkpoint": f"step-{at:06d}",
    }

    resumed = cli("train", "-o", str(part), "--resume", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["interrupted"] is None
    full = tmp_path / "full"
    done = cli(*args(full, corpus, *SPARSE, "--json"))
    assert done.exit_code == 0, done.output
    assert comparable(part) == comparable(full)  # losses, evals, mask updates, LR: bit for bit
    assert same_weights(part, full)


def test_sigterm_saves_the_step_and_exits_143(tmp_path, corpus):
    run = tmp_path / "run"
    proc = start(args(run, corpus))  # the human output: a summary table, then the message
    wait_for_step(proc, run, 30)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    at = checkpoint_step(run)
    assert at >= 30 and max(train_steps(run)) == at
    assert f"{at} / {STEPS} (stopped; --resume continues)" in out
    assert f"interrupted by SIGTERM at step {at} of {STEPS}: saved a checkpoint" in err
    assert "Traceback" not in err


def test_a_second_signal_stops_at_once_and_the_last_checkpoint_stays_usable(tmp_path, corpus):
    run = tmp_path / "run"
    proc = start(args(run, corpus, "--save-every", "10", "--json"))
    wait_for_step(proc, run, 30)
    # Two different signals held while the process is stopped arrive together when it continues
    # (two SIGINTs would merge into one), so the second one lands inside the step the first
    # one asked to finish: no race with the trainer.
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGCONT)
    out, err = proc.communicate(timeout=60)
    seconds = time.monotonic() - t0
    assert proc.returncode in (130, 143), err[-3000:]  # 128 + the first signal's number
    first, second = ("SIGINT", "SIGTERM") if proc.returncode == 130 else ("SIGTERM", "SIGINT")
    assert f"error: stopped at once by {second} after {first} during step" in err
    assert out == "" and "Traceback" not in err
    assert seconds < 10, seconds  # the interpreter's exit included
    # the checkpoint `latest` names is complete (a save cut short never replaces it) and resumes
    at = checkpoint_step(run)
    assert f"the last checkpoint (step-{at:06d}) is in {run}; continue with: " in err
    assert at >= 20 and at % 10 == 0  # step 30's save may have been the one cut short
    resumed = cli("train", "-o", str(run), "--resume", "--stop-at", str(at + 2), "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["step"] == at + 2
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.endswith(".tmp")]


BACKWARD_MARKED = """
import sys, torch
from sparsetool.cli.main import main
marks, backward = sys.argv.pop(1), torch.Tensor.backward
def marked(self, *args, **kwargs):  # a line just before each backward pass enters torch
    with open(marks, "a") as f:
        f.write("backward\\n")
    return backward(self, *args, **kwargs)
torch.Tensor.backward = marked
sys.argv[0] = "sparsetool"
main()
"""


def test_a_second_sigterm_inside_one_backward_pass_ends_the_process_at_once(tmp_path, corpus):
    """Two SIGTERMs within one backward pass (one call into torch, where Python runs no handler,
    and where two signals of one kind merge into one run of it): the second still ends the
    process there, with its error line and exit 143, and no checkpoint of the step. The run marks
    in a file when each backward pass starts (torch's own ``Tensor.backward``, wrapped), so both
    signals land inside the second one."""
    run, marks = tmp_path / "run", tmp_path / "marks"
    proc = subprocess.Popen(
        [sys.executable, "-c", BACKWARD_MARKED, str(marks), "train", "-o", str(run), "--data",
         str(corpus), "--preset", "small", "--batch-size", "8", "--steps", "200", "--warmup", "1",
         "--eval-every", "1000", "--threads", "1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    end = time.monotonic() + 300
    while not (marks.exists() and marks.read_text().count("\n") >= 2):
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()[1][-3000:]
        time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)  # step 2's backward pass has just begun: a second or so
    time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=120)
    seconds = time.monotonic() - t0
    assert proc.returncode == 143, err[-3000:]
    assert err.splitlines()[-2:] == [
        "SIGTERM: finishing the step in progress and saving a checkpoint (a second signal stops "
        "at once, without it)",
        "error: stopped at once by a second SIGTERM during step 2; no checkpoint had been written "
        "yet; the same command starts the run again",
    ], err[-3000:]
    assert out == "" and "Traceback" not in err
    assert seconds < 5, seconds
    assert train_steps(run) == [1] and not (run / "latest").exists()


# ---------------------------------------------------------------- the library, real signals
OPTS = {
    "preset": "tiny",
    "steps": 6,
    "batch_size": 4,
    "warmup": 2,
    "save_every": 2,
    "seed": 0,
    "algorithm": "rigl",
    "sparsity": 0.75,
    "update_freq": 2,
    "update_stop": 5,
}


def _raise(signum: int, times: int, at: int):
    def callback(kind: str, info: dict) -> None:
        if kind == "step" and info["step"] == at:
            for _ in range(times):
                signal.raise_signal(signum)  # delivered (and handled) before it returns

    return callback


def test_library_signal_stops_with_a_checkpoint_and_restores_the_handlers(tmp_path, corpus):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    full = train(merge({}, {"out": str(tmp_path / "full"), "data": str(corpus), **OPTS}))
    part = tmp_path / "part"
    # raised once step 2's loss is in (its eval and save still to come): step 3 is the one in
    # progress when the loop next looks
    summary = train(
        merge({}, {"out": str(part), "data": str(corpus), **OPTS}),
        callback=_raise(signal.SIGINT, 1, 2),
        stop_on_signal=True,
    )
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert summary["interrupted"] == "SIGINT" and summary["step"] == 3 and not summary["finished"]
    assert checkpoint_step(part) == 3  # save_every 2: step 3 saved for the signal alone
    resumed = train(TrainConfig(out=str(part)), resume=True)
    assert resumed["loss"] == full["loss"] and resumed["val_loss"] == full["val_loss"]
    assert comparable(part) == comparable(tmp_path / "full")
    assert same_weights(part, tmp_path / "full")


def test_library_second_signal_raises_with_the_exit_code(tmp_path, corpus):
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(
        SparsetoolError,
        match=r"stopped at once by a second SIGINT during step 3; the last "
        r"checkpoint \(step-000002\)",
    ) as e:
        train(
            merge({}, {"out": str(tmp_path / "run"), "data": str(corpus), **OPTS}),
            callback=_raise(signal.SIGINT, 2, 3),
            stop_on_signal=True,
        )
    assert e.value.exit_code == 130
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert checkpoint_step(tmp_path / "run") == 2


def test_library_default_leaves_signals_alone(tmp_path, corpus):
    """Without stop_on_signal (the demo, scripts) Ctrl-C interrupts as Python does."""
    with pytest.raises(
        SparsetoolError,
        match=r"interrupted during step 3; the last checkpoint "
        r"\(step-000002\)",
    ) as e:
        train(
            merge({}, {"out": str(tmp_path / "run"), "data": str(corpus), **OPTS}),
            callback=_raise(signal.SIGINT, 1, 3),
        )
    assert e.value.exit_code == 130


# -------------------------------------------------------------- torchrun: every rank stops together
DDP = [
    "--preset",
    "tiny",
    "--steps",
    "100",
    "--batch-size",
    "2",
    "--warmup",
    "2",
    "--eval-every",
    "25",
    "--save-every",
    "40",
    "--threads",
    "1",
    "--seed",
    "0",
    "--algorithm",
    "rigl",
    "--sparsity",
    "0.75",
    "--update-freq",
    "10",
    "--update-stop",
    "80",
    "--json",
]


def torchrun(*cmd: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "sparsetool",
        *cmd,
    ]


def rank_pid(agent: subprocess.Popen, rank: int) -> int:
    """The pid of the worker with RANK=rank among the torchrun agent's children."""
    for child in Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split():
        env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return int(child)
    raise AssertionError(f"no rank {rank} under torchrun {agent.pid}")


@pytest.mark.slow
def test_torchrun_ctrl_c_stops_every_rank_after_one_step_and_resumes_exactly(tmp_path, corpus):
    """Ctrl-C reaches torchrun, which passes SIGINT on to each rank (maybe in different steps)."""
    part, whole = tmp_path / "part", tmp_path / "whole"
    # the uninterrupted run to compare with, alongside (its start-up is most of its time)
    full = subprocess.Popen(
        torchrun("train", "-o", str(whole), "--data", str(corpus), *DDP),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    proc = subprocess.Popen(
        torchrun("train", "-o", str(part), "--data", str(corpus), *DDP),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    wait_for_step(proc, part, 20, timeout=120)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    summary = json.loads(out)  # rank 0's; torchrun itself exits 1 after a signal
    at = summary["step"]
    assert summary["interrupted"] == "SIGINT" and 20 <= at < 100, err[-3000:]
    assert (
        f"continue with: torchrun --nproc_per_node 2 -m sparsetool train -o {part} --resume" in err
    )
    assert checkpoint_step(part) == at and max(train_steps(part)) == at
    state = json.loads((part / "checkpoints" / f"step-{at:06d}" / "state.json").read_text())
    assert state["world_size"] == 2 and state["data_position"] == at * 4
    resumed = subprocess.run(
        torchrun("train", "-o", str(part), "--resume", "--json"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    if resumed.returncode != 0 and "terminate called without an active exception" in resumed.stderr:
        # Seen once in about ten runs, only inside the full suite on a loaded machine: rank 0 of
        # the resumed run aborted in C++ (SIGABRT) and torchrun exited 1; not reproduced alone.
        # Resuming again from whatever checkpoint it left must still end equal to the whole run.
        resumed = subprocess.run(
            torchrun("train", "-o", str(part), "--resume", "--json"),
            capture_output=True,
            text=True,
            env=_env(),
            timeout=300,
        )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    full_err = full.communicate(timeout=300)[1]
    assert full.returncode == 0, full_err[-3000:]
    assert comparable(part) == comparable(whole)
    assert same_weights(part, whole)


@pytest.mark.slow
def test_torchrun_a_signal_to_one_rank_stops_them_all_at_the_same_step(tmp_path, corpus):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        torchrun("train", "-o", str(run), "--data", str(corpus), *DDP),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    wait_for_step(proc, run, 20, timeout=120)
    os.kill(rank_pid(proc, 1), signal.SIGTERM)  # rank 0 never sees a signal
    out, err = proc.communicate(timeout=120)
    summary = json.loads(out)
    at = summary["step"]
    assert summary["interrupted"] == "SIGTERM" and at >= 20, err[-3000:]
    assert summary["masks_identical_across_ranks"] is True
    assert checkpoint_step(run) == at and max(train_steps(run)) == at
    # both ranks left with the code of a SIGTERM stop; neither was killed by torchrun
    assert err.count("exitcode  : 143") == 2, err[-3000:]


# ---------------------------------------------------------------- --init HF_DIR runs
def test_hugging_face_run_stops_with_its_model_directory_and_resumes_exactly(tmp_path):
    from helpers import hf_model, make_text, save_tokenizer

    text = make_text(600)
    (tmp_path / "data.txt").write_text(text)
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(tmp_path / "llama")
    save_tokenizer(tmp_path / "llama", text)
    opts = {
        "init": str(tmp_path / "llama"),
        "data": str(tmp_path / "data.txt"),
        "steps": 8,
        "batch_size": 8,
        "context": 32,
        "warmup": 2,
        "lr": 3e-3,
        "eval_every": 4,
        "seed": 0,
        "algorithm": "rigl",
        "sparsity": 0.5,
        "update_freq": 3,
        "save_every": 3,
    }
    whole, part = tmp_path / "whole", tmp_path / "part"
    train(merge({}, {"out": str(whole), **opts}))
    summary = train(
        merge({}, {"out": str(part), **opts}),
        callback=_raise(signal.SIGTERM, 1, 4),
        stop_on_signal=True,
    )
    assert summary["interrupted"] == "SIGTERM" and summary["step"] == 5
    assert checkpoint_step(part) == 5 and (part / "model" / "model.safetensors").exists()
    assert not (part / ".model.tmp").exists() and not (part / ".model.old").exists()
    train(TrainConfig(out=str(part)), resume=True)
    a = load_file(str(whole / "model" / "model.safetensors"))
    b = load_file(str(part / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert comparable(part) == comparable(whole)


def test_an_ignored_signal_stays_ignored(tmp_path, corpus):
    """A run started with SIGINT ignored (nohup, `cmd &` in a script) keeps ignoring it."""
    seen = []

    def callback(kind: str, info: dict) -> None:
        seen.append(signal.getsignal(signal.SIGINT))
        if kind == "step" and info["step"] == 1:
            signal.raise_signal(signal.SIGINT)

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        summary = train(
            merge({}, {"out": str(tmp_path / "run"), "data": str(corpus), **OPTS, "steps": 3}),
            callback=callback,
            stop_on_signal=True,
        )
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
    assert set(seen) == {signal.SIG_IGN}
    assert summary["finished"] and summary["interrupted"] is None


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_second_signal_swallowed_in_a_finalizer_still_stops_at_the_next_step():
    """Python swallows an exception raised inside __del__ ("Exception ignored in ..."): the
    second signal's KeyboardInterrupt must then come back when the loop next reads the request,
    not let the run finish its step and save as after one signal."""
    from sparsetool.train.signals import StopRequest

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs here, inside __del__

    with StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.pending() == signal.SIGINT
        Finalized()  # collected at once: its KeyboardInterrupt is swallowed
        assert stop.second == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            stop.pending()


def test_two_signals_counted_during_one_call_into_torch_raise_once():
    """SIGINT and SIGTERM sent while the main thread is inside one long torch call: the counting
    thread sees both, so the handler's first run (SIGINT's) already raises the second signal's
    KeyboardInterrupt; SIGTERM's run, still due, must not reach the handler put back afterwards
    (the command line's raised a KeyboardInterrupt of its own over the run's error)."""
    import threading

    from sparsetool.train.signals import StopRequest

    outside: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: outside.append(signum))
    a = torch.randn(1500, 1500)
    try:
        with StopRequest() as stop:

            def send() -> None:
                time.sleep(0.05)  # the main thread is inside the products by then
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGTERM)

            sender = threading.Thread(target=send)
            sender.start()
            with pytest.raises(KeyboardInterrupt):
                for _ in range(40):  # one call into torch after another, a second or more
                    a = torch.tanh(a @ a)
            sender.join()
            for _ in range(1000):  # Python instructions: a signal still due runs its handler
                pass
            assert stop.second is not None
        assert outside == []
        assert signal.getsignal(signal.SIGTERM) is not None  # put back when the block ended
    finally:
        signal.signal(signal.SIGTERM, before)
