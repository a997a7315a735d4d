"""A run killed with SIGKILL mid-write leaves its temporary output beside the output; the next
command writing into that directory (any command, any output name) removes the temporaries of dead
processes there, never a live one's nor anything not ours, and says how much it freed: the library
returns it on its result (``reclaimed``), or on the error that stopped the work (Ctrl-C too), and
the command prints it from there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import save_file

import sparsetool
from sparsetool.checkpoint.output_files import reclaiming, remove_stale_temps, temp_beside
from sparsetool.errors import CheckpointError

from helpers import ROOT, gpt2_like_state, run

# A writer as the checkpoint writer makes one: a temporary from temp_beside, written in part, then
# the process waits (to be killed, or to stay alive). A directory temporary stands for a sharded
# output.
WRITER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from sparsetool.checkpoint.output_files import temp_beside
    tmp = temp_beside(Path(sys.argv[1]))
    if sys.argv[2] == "dir":
        tmp.mkdir()
        for i in range(2):
            (tmp / f"model-0000{i}.safetensors").write_bytes(os.urandom(1 << 20))
    else:
        with open(tmp, "wb") as f:
            f.write(os.urandom(3 << 20))
            f.flush()
            os.fsync(f.fileno())
            print(tmp, flush=True)
            time.sleep(600)
    print(tmp, flush=True)
    time.sleep(600)
""")


def start_writer(out: Path, kind: str = "file") -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(out), kind], stdout=subprocess.PIPE, text=True, env=env
    )
    tmp = Path(proc.stdout.readline().strip())
    assert tmp.exists(), tmp
    return proc, tmp


def kill(proc: subprocess.Popen, tmp: Path) -> Path:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL and tmp.exists()
    return tmp


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    src = tmp_path / "in" / "model.safetensors"
    src.parent.mkdir()
    save_file(gpt2_like_state(), str(src), metadata={"format": "pt"})
    return src


def test_the_next_prune_into_the_directory_removes_what_killed_runs_left(tmp_path, checkpoint):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    live, live_tmp = start_writer(out_dir / "running.safetensors")  # a run still writing
    try:
        # both start before either dies (a writer starting later would remove the first itself)
        big, sharded = (
            start_writer(out_dir / "big.safetensors"),
            start_writer(out_dir / "sharded", "dir"),
        )
        file_tmp, dir_tmp = kill(*big), kill(*sharded)  # other names than the next run's output
        # not ours, or not decidable here: names we never make, another machine's temporary
        dead_pid = int(file_tmp.name.split("sparsetool-tmp-")[1].split("-")[0])
        keep = [
            out_dir / "notes.txt",
            out_dir / ".notes.sparsetool-tmp-draft",
            out_dir / f"x.sparsetool-tmp-{dead_pid}-abcd1234",
            out_dir / f".y.safetensors.sparsetool-tmp-{dead_pid}-abcd1234-othermachine",
        ]
        for p in keep:
            p.write_text("mine")
        res = run(
            "prune",
            str(checkpoint),
            "-o",
            str(out_dir / "p.safetensors"),
            "--sparsity",
            "0.5",
            "-q",
        )
        assert res.exit_code == 0, res.output
        assert not file_tmp.exists() and not dir_tmp.exists()
        assert live_tmp.exists() and all(p.exists() for p in keep)
        freed = (3 << 20) + (2 << 20)
        notes = [line for line in res.stderr.splitlines() if line.startswith("note: removed")]
        assert notes == [
            f"note: removed 2 stale temporary files of killed runs in {out_dir} "
            f"({freed / 1e6:.2f} MB)"
        ], res.stderr
        assert (out_dir / "p.safetensors").exists()
    finally:
        live.kill()
        live.wait()
    # the live run's temporary is removed by the next write once that run is gone
    again = run("report", str(out_dir / "p.safetensors"), "--plot", str(out_dir / "r.png"), "-q")
    assert again.exit_code == 0, again.output
    assert not live_tmp.exists() and (out_dir / "r.png").exists()
    assert "note: removed 1 stale temporary file of killed runs" in again.stderr


def dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def stale(directory: Path, size: int = 10000) -> Path:
    """A temporary a killed run left in ``directory`` (its process is gone)."""
    p = directory / f".o.safetensors.sparsetool-tmp-{dead_pid()}-abcd1234"
    p.write_bytes(b"x" * size)
    return p


def test_the_library_returns_what_it_freed_and_keeps_live_temporaries(tmp_path):
    mine = temp_beside(tmp_path / "q.safetensors")  # this process's own
    mine.write_bytes(b"writing")
    old = stale(tmp_path)
    alive = tmp_path / f".o.safetensors.sparsetool-tmp-{os.getppid()}-beefbeef"
    alive.write_bytes(b"in progress")
    with reclaiming() as outer, reclaiming() as inner:
        done = remove_stale_temps(tmp_path)
    assert done is not None and done.files == 1 and done.bytes >= 10000
    assert done.directory == tmp_path
    assert not old.exists() and alive.exists() and mine.exists()
    assert inner == outer == [done]  # a block gets what the blocks inside it collected
    assert remove_stale_temps(tmp_path) is None  # nothing left to free
    stale(tmp_path)
    assert remove_stale_temps(tmp_path) is not None and outer == [done]  # closed: not collected


@pytest.mark.parametrize("error", [CheckpointError("disk trouble"), KeyboardInterrupt()])
def test_an_error_leaving_the_block_carries_what_was_freed(tmp_path, error):
    stale(tmp_path)
    with pytest.raises(type(error)) as raised, reclaiming():
        remove_stale_temps(tmp_path)
        raise error
    [done] = raised.value.reclaimed
    assert done.directory == tmp_path and done.files == 1


def test_a_result_says_what_was_freed_beside_its_output(tmp_path, checkpoint):
    out = tmp_path / "out"
    out.mkdir()
    old = stale(out, 5000)
    result = sparsetool.prune(checkpoint, out / "p.safetensors", sparsity=0.5)
    [done] = result.reclaimed
    assert (done.directory, done.files) == (out, 1) and done.bytes >= 5000 and not old.exists()
    assert sparsetool.prune(checkpoint, out / "q.safetensors", sparsity=0.5).reclaimed == []


def test_a_failed_command_still_says_what_it_freed(tmp_path):
    src = tmp_path / "nan.safetensors"
    state = gpt2_like_state()
    state["transformer.h.0.mlp.c_fc.weight"][0, 0] = float(
        "nan"
    )  # refused as the tensor is written
    save_file(state, str(src), metadata={"format": "pt"})
    out = tmp_path / "out"
    out.mkdir()
    old = stale(out)
    res = run("prune", src, "-o", out / "p.safetensors", "--sparsity", "0.5", "-q")
    assert res.exit_code == 1 and not old.exists(), res.output
    lines = res.stderr.splitlines()
    assert lines[0].startswith("note: removed 1 stale temporary file of killed runs in ")
    assert lines[1].startswith("error: ") and len(lines) == 2, res.stderr
    assert os.listdir(out) == []


def test_ctrl_c_still_says_what_was_freed(tmp_path, checkpoint, monkeypatch):
    from sparsetool.checkpoint import writer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(writer.ShardWriter, "__enter__", interrupted)
    out = tmp_path / "out"
    out.mkdir()
    stale(out)
    res = run("densify", checkpoint, "-o", out / "d.safetensors")
    assert res.exit_code == 130, res.output
    note, error = res.stderr.splitlines()
    assert note.startswith(f"note: removed 1 stale temporary file of killed runs in {out} (")
    assert error == "error: interrupted; no output was written"
    assert os.listdir(out) == []
