"""A run killed with SIGKILL mid-write leaves its temporary output beside the output; the next
command writing into that directory (any command, any output name) removes the temporaries of dead
processes there, never a live one's nor anything not ours, and says how much it freed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import save_file

from sparsetool.checkpoint.output_files import remove_stale_temps, take_reclaimed, temp_beside

from helpers import ROOT, gpt2_like_state, run

# A writer as the checkpoint writer makes one: a temporary from temp_beside, written in part, then
# the process waits (to be killed, or to stay alive). A directory temporary stands for a sharded output.
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
    take_reclaimed()
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


def test_the_library_returns_what_it_freed_and_keeps_live_temporaries(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    mine = temp_beside(tmp_path / "q.safetensors")  # this process's own
    mine.write_bytes(b"writing")
    stale = tmp_path / f".o.safetensors.sparsetool-tmp-{int(dead.stdout)}-abcd1234"
    stale.write_bytes(b"x" * 10000)
    alive = tmp_path / f".o.safetensors.sparsetool-tmp-{os.getppid()}-beefbeef"
    alive.write_bytes(b"in progress")
    take_reclaimed()
    done = remove_stale_temps(tmp_path)
    assert done is not None and done.files == 1 and done.bytes >= 10000
    assert done.directory == tmp_path
    assert not stale.exists() and alive.exists() and mine.exists()
    assert take_reclaimed() == [done] and take_reclaimed() == []
    assert remove_stale_temps(tmp_path) is None  # nothing left to free
