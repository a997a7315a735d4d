"""Defects a newcomer meets first: permissions, pickled files, run directories, disk full, lying
indexes, code in inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import save_file
from typer.testing import CliRunner

from sparsetool.cli.main import app
from sparsetool.ops.densify import densify_checkpoint
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from conftest import gpt2_like_state

runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def sharded_dir(root: Path, n_layer: int = 2) -> Path:
    """A Hugging Face directory: two shards, an index, config and tokenizer files."""
    root.mkdir()
    state = gpt2_like_state(n_layer=n_layer)
    names = sorted(state)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half],
             "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for shard, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(root / shard), metadata={"format": "pt"})
        weight_map |= {k: shard for k in keys}
    (root / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": n_layer}))
    (root / "tokenizer.json").write_text("{}")
    return root


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# ------------------------------------------------------------------ 1. permissions
@pytest.mark.parametrize("bits", [0o600, 0o640])
def test_file_outputs_keep_the_input_mode(tmp_path, umask_022, bits):
    src = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(), str(src))
    src.chmod(bits)
    pruned, dense = tmp_path / "p.safetensors", tmp_path / "d.safetensors"
    prune_checkpoint(src, pruned, PruneOptions(sparsity=0.5))
    assert mode(pruned) == bits
    densify_checkpoint(pruned, dense)
    assert mode(dense) == bits
    # replacing an earlier, world-readable output gives it the input's mode too
    pruned.chmod(0o644)
    prune_checkpoint(src, pruned, PruneOptions(sparsity=0.5))
    assert mode(pruned) == bits


@pytest.mark.parametrize("bits", [0o600, 0o640])
def test_directory_outputs_keep_every_input_mode(tmp_path, umask_022, bits):
    src = sharded_dir(tmp_path / "in")
    for p in src.iterdir():
        p.chmod(bits)
    (src / "tokenizer.json").chmod(0o444)  # each file keeps its own mode
    src.chmod(0o750)
    out = tmp_path / "out"
    prune_checkpoint(src, out, PruneOptions(sparsity=0.5))
    back = tmp_path / "back"
    densify_checkpoint(out, back)
    for d in (out, back):
        assert mode(d) == 0o750
        modes = {p.name: mode(p) for p in d.iterdir()}
        assert modes == {p.name: mode(p) for p in src.iterdir()}, d
        assert modes["tokenizer.json"] == 0o444 and modes["config.json"] == bits
        assert modes["model.safetensors.index.json"] == bits


# ------------------------------------------------------------------ 7. SIGTERM while the pool starts
_SIGNAL_DURING_THREAD_START = r"""
import os, signal, threading, torch
import sparsetool.masks.kernel as kernel
from sparsetool.cli.main import _interrupt
signal.signal(signal.SIGTERM, _interrupt)
start = threading.Thread.start
def start_then_signal(self):
    start(self)
    if self.name.startswith("sparsetool-mask"):
        os.kill(os.getpid(), signal.SIGTERM)  # lands while submit() has a thread not yet recorded
        threading.Event().wait(0.01)
threading.Thread.start = start_then_signal
torch.set_num_threads(2)
try:
    kernel._map(lambda a, b: a, 10, step=1)
except KeyboardInterrupt:
    print("interrupted")
"""


def _python(code: str, timeout: float = 60):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the interpreter did not exit within {timeout} s")
    return proc.returncode, out, err


def test_sigterm_while_a_worker_thread_starts_does_not_hang_the_exit():
    code, out, err = _python(_SIGNAL_DURING_THREAD_START)
    assert (code, out.strip()) == (0, "interrupted"), err


def test_a_sigterm_during_exit_keeps_the_exit_code():
    code, out, err = _python(
        "import atexit, os, signal, time\n"
        "from sparsetool.cli.main import _run_interruptibly\n"
        "def late():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    print('exit finished')\n"
        "_run_interruptibly(lambda: atexit.register(late))\n")
    assert (code, out.strip()) == (0, "exit finished"), err
    assert "KeyboardInterrupt" not in err
