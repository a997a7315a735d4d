"""Defects a newcomer meets first: permissions, pickled files, run directories, disk full, lying
indexes, code in inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import save_file

from sparsetool.ops.densify import densify_checkpoint
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from helpers import gpt2_like_state, run


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def sharded_dir(root: Path, n_layer: int = 2) -> Path:
    """A Hugging Face directory: two shards, an index, config and tokenizer files."""
    root.mkdir()
    state = gpt2_like_state(n_layer=n_layer)
    names = sorted(state)
    half = len(names) // 2
    parts = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    weight_map = {}
    for shard, keys in parts.items():
        save_file({k: state[k] for k in keys}, str(root / shard), metadata={"format": "pt"})
        weight_map |= {k: shard for k in keys}
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
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


# ----------------------------------------------------------------- 7. SIGTERM while the pool starts
_SIGNAL_DURING_THREAD_START = r"""
import os, signal, threading, torch
import sparsetool.masks.chunks as chunks
from sparsetool.cli.main import _interrupt
signal.signal(signal.SIGTERM, _interrupt)
start = threading.Thread.start
def start_then_signal(self):
    start(self)
    if self.name.startswith("sparsetool-worker"):
        os.kill(os.getpid(), signal.SIGTERM)  # lands while submit() has a thread not yet recorded
        threading.Event().wait(0.01)
threading.Thread.start = start_then_signal
torch.set_num_threads(2)
try:
    chunks.map_chunks(lambda a, b: a, 10, step=1)
except KeyboardInterrupt:
    print("interrupted")
"""


def _python(code: str, timeout: float = 60):
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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
        "_run_interruptibly(lambda: atexit.register(late))\n"
    )
    assert (code, out.strip()) == (0, "exit finished"), err
    assert "KeyboardInterrupt" not in err


# ------------------------------------------------------------------ 2. pickled checkpoints
class _Touch:
    """Unpickling this creates ``path``: proof that a file was (not) unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def _pickled_files(root: Path) -> dict[str, Path]:
    import pickle

    import torch

    marker = root / "UNPICKLED"
    weights = {"transformer.h.0.attn.c_attn.weight": torch.randn(4, 4), "x": _Touch(marker)}
    files = {
        "zip": root / "pytorch_model.bin",
        "legacy": root / "model.pt",
        "pickle": root / "m.ckpt",
    }
    torch.save(weights, files["zip"])
    torch.save(weights, files["legacy"], _use_new_zipfile_serialization=False)
    files["pickle"].write_bytes(pickle.dumps(_Touch(marker), protocol=4))
    hf = root / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    for i in (1, 2):
        torch.save(weights, hf / f"pytorch_model-0000{i}-of-00002.bin")
    files["dir"] = hf
    return files


def _commands(path: Path, tmp: Path) -> list[list[object]]:
    return [
        ["report", path],
        ["prune", path, "-o", tmp / "o", "--sparsity", "0.5"],
        ["densify", path, "-o", tmp / "d"],
        ["diff", path, path],
        ["eval", path],
        ["flops", "--checkpoint", path],
        ["simulate", path],
    ]


def test_pickled_checkpoints_are_named_and_never_unpickled(tmp_path):
    files = _pickled_files(tmp_path)
    for kind, path in files.items():
        for args in _commands(path, tmp_path):
            r = run(*args)
            assert r.exit_code == 1, (kind, args, r.output)
            err = " ".join(r.stderr.split())
            assert err.startswith(f"error: {path}") and "safetensors only" in err, (kind, args, err)
            assert "weights_only=True" in err and "save_file(" in err
            assert "header length" not in err
    assert not (tmp_path / "UNPICKLED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["pytorch_model.bin", "model.pt", "m.ckpt", "hf"]
    )


def test_the_conversion_hint_converts(tmp_path):
    import subprocess
    import sys

    import torch

    src = tmp_path / "pytorch_model.bin"
    torch.save({"transformer.h.0.mlp.c_fc.weight": torch.randn(8, 8)}, src)
    err = " ".join(run("report", src).stderr.split())
    hint = err[err.index("python -c ") + len("python -c ") :]
    subprocess.run([sys.executable, "-c", hint.strip().strip('"')], check=True)
    r = run("report", tmp_path / "pytorch_model.safetensors")
    assert r.exit_code == 0 and "c_fc.weight" in r.stdout


def test_a_safetensors_header_of_640_bytes_is_not_taken_for_a_pickle(tmp_path):
    # 640 = 0x280: the length prefix starts with the bytes of a protocol-2 pickle
    src = tmp_path / "m.safetensors"
    for n in range(700):
        save_file(
            {"w": gpt2_like_state()["transformer.wte.weight"]}, str(src), metadata={"pad": "x" * n}
        )
        if src.read_bytes()[:3] == b"\x80\x02\x00":
            break
    else:
        pytest.fail("no padding gives a 640-byte header")
    assert run("report", src).exit_code == 0


# ------------------------------------------------------------------ 6. what an output carries
@pytest.fixture
def train_run(tiny_run, tmp_path) -> Path:
    """A copy of conftest's run directory (its checkpoints and optimizer state included), which
    the test adds files to."""
    import shutil

    return Path(shutil.copytree(tiny_run, tmp_path / "input" / "run"))


def test_pruning_a_train_run_leaves_out_checkpoints_and_optimizer_state(train_run, tmp_path):
    (train_run / "README.md").write_text("a model card\n")
    (train_run / "LICENSE").write_text("licence text\n")
    (train_run / "tokenizer.json").write_text("{}")
    step = next((train_run / "checkpoints").iterdir())
    assert (step / "optimizer.pt").is_file()
    for src, expect_out in (
        (train_run, {"checkpoints/", "run.json", "latest"}),
        (step, {"optimizer.pt", "state.json"}),
    ):
        out = tmp_path / src.name
        r = run("prune", src, "-o", out, "--sparsity", "0.75")
        assert r.exit_code == 0, r.output
        note = [line for line in r.stdout.splitlines() if line.startswith("note: left out")]
        assert len(note) == 1
        named = set(note[0].split(": ", 2)[2].split(", "))
        assert expect_out <= named, named
        kept = {p.name for p in out.iterdir()}
        assert not kept & {n.rstrip("/") for n in named}
        assert "checkpoints" not in kept and "optimizer.pt" not in kept
        assert "model.safetensors" in kept and "config.json" in kept
        if src == train_run:
            assert {"README.md", "LICENSE", "tokenizer.json"} <= kept
        j = json.loads(
            run("prune", src, "-o", tmp_path / "j", "--sparsity", "0.75", "--json").stdout
        )
        assert set(j["left_out"]) == named
        d = json.loads(run("densify", out, "-o", tmp_path / "dense", "--json").stdout)
        assert d["left_out"] == []
        for p in (tmp_path / "j", tmp_path / "dense"):
            import shutil

            shutil.rmtree(p)


def test_in_place_keeps_what_it_would_leave_out(tmp_path):
    src = sharded_dir(tmp_path / "m")
    (src / "optimizer.pt").write_bytes(b"state")
    (src / "checkpoints").mkdir()
    res = prune_checkpoint(src, src, PruneOptions(sparsity=0.5), in_place=True)
    assert res.left_out == []
    assert (src / "optimizer.pt").read_bytes() == b"state" and (src / "checkpoints").is_dir()


# ------------------------------------------------------------------ 15. shard indexes that lie
def _index(d: Path) -> dict:
    return json.loads((d / "model.safetensors.index.json").read_text())


def _write_index(d: Path, text: str) -> None:
    (d / "model.safetensors.index.json").write_text(text)


def _refused_everywhere(src: Path, tmp: Path, *needles: str) -> None:
    for args in (
        ["report", src],
        ["prune", src, "-o", tmp / "o", "--sparsity", "0.5"],
        ["densify", src, "-o", tmp / "d"],
    ):
        r = run(*args)
        err = " ".join(r.stderr.split())
        assert r.exit_code == 1 and err.startswith("error: "), (args, r.output)
        assert len(r.stderr.strip().splitlines()) >= 1 and "Traceback" not in r.output
        for needle in needles:
            assert needle in err, (args, err)
    assert not (tmp / "o").exists() and not (tmp / "d").exists()


def test_a_shard_the_index_leaves_out_is_an_error(tmp_path):
    src = sharded_dir(tmp_path / "m")
    idx = _index(src)
    idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v.startswith("model-00001")}
    _write_index(src, json.dumps(idx))
    _refused_everywhere(
        src, tmp_path, "model-00002-of-00002.safetensors", "does not list", "Move it out"
    )


def test_a_tensor_the_index_leaves_out_is_an_error(tmp_path):
    src = sharded_dir(tmp_path / "m")
    idx = _index(src)
    dropped = sorted(idx["weight_map"])[0]
    del idx["weight_map"][dropped]
    _write_index(src, json.dumps(idx))
    _refused_everywhere(src, tmp_path, f"does not list tensor {dropped!r}", "weight_map")


def test_a_missing_shard_is_an_error(tmp_path):
    src = sharded_dir(tmp_path / "m")
    (src / "model-00002-of-00002.safetensors").unlink()
    _refused_everywhere(src, tmp_path, "model-00002-of-00002.safetensors", "missing")


def test_a_tensor_listed_twice_is_named(tmp_path):
    src = sharded_dir(tmp_path / "m")
    idx = _index(src)
    name, shard = next(iter(idx["weight_map"].items()))
    other = next(s for s in set(idx["weight_map"].values()) if s != shard)
    text = json.dumps(idx).replace('"weight_map": {', f'"weight_map": {{"{name}": "{other}", ', 1)
    _write_index(src, text)
    _refused_everywhere(src, tmp_path, f"lists tensor {name!r} twice", other, shard)
    r = run("report", src)
    assert "fix the index" not in r.stderr


# ------------------------------------------------------------------ 11. disk full
class _FakeStatvfs:
    def __init__(self, free: int):
        self.f_bavail, self.f_frsize = free // 4096, 4096


@pytest.mark.parametrize("layout", ["file", "dir"])
def test_no_room_is_refused_before_the_first_byte(tmp_path, monkeypatch, layout):
    if layout == "file":
        src = tmp_path / "m.safetensors"
        save_file(gpt2_like_state(), str(src))
        out = tmp_path / "o.safetensors"
    else:
        src, out = sharded_dir(tmp_path / "m"), tmp_path / "o"
    before = sorted(p.name for p in tmp_path.iterdir())
    wrote = []
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "statvfs", lambda _path: _FakeStatvfs(8192))
    monkeypatch.setattr(os, "pwrite", lambda *a: wrote.append(1) or real_pwrite(*a))
    r = run("prune", src, "-o", out, "--sparsity", "0.5")
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no room for "), r.stderr
    assert (
        "8,192 are free on that disk" in lines[0]
        and "bytes" in lines[0]
        and "choose another -o" in lines[0]
    )
    needed = int(lines[0].split("it needs ")[1].split(" bytes")[0].replace(",", ""))
    assert needed > 8192
    assert not wrote  # refused before the first byte
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    "code, words",
    [
        ("ENOSPC", "No space left on device [ENOSPC]"),
        ("EIO", "Input/output error [EIO]"),
        ("EACCES", "Permission denied [EACCES]"),
    ],
)
@pytest.mark.parametrize("command", ["prune", "densify"])
def test_write_errors_are_one_line_and_leave_nothing(tmp_path, monkeypatch, code, words, command):
    import errno

    src = sharded_dir(tmp_path / "m")
    calls = []

    def failing_pwrite(fd, data, offset):
        calls.append(offset)
        if len(calls) > 2:  # fail part-way, after the first shard's header and a tensor
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        return _real_pwrite(fd, data, offset)

    _real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    monkeypatch.setattr(
        os,
        "copy_file_range",
        lambda *a: (_ for _ in ()).throw(OSError(errno.EXDEV, "x")),
        raising=False,
    )  # copies go through pwrite too
    extra = ["--sparsity", "0.5"] if command == "prune" else []
    r = run(command, src, "-o", tmp_path / "o", *extra)
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"error: writing {tmp_path / 'o'} failed: {words}"
    ), r.stderr
    assert "nothing was written" in lines[0] and "Traceback" not in r.output
    assert len(calls) > 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ------------------------------------------------------------------ 10. no code from inputs runs
def _code_dir(root: Path) -> tuple[Path, Path]:
    """A Llama directory whose config and tokenizer config name classes in its own .py files."""
    import torch

    from helpers import hf_model, make_text, save_tokenizer

    d, marker = root / "remote", root / "MARKER"
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(d)  # a type transformers has no tokenizer mapping for
    save_tokenizer(d, make_text())
    for module in ("evil_config", "evil_model", "evil_tok", "evil_format"):
        (d / f"{module}.py").write_text(
            "from pathlib import Path\n"
            f"Path({str(marker)!r}).write_text(__name__)\n"
            "class Evil:\n    pass\nEvilConfig = EvilModel = EvilTok = Evil\n"
        )
    cfg = json.loads((d / "config.json").read_text())
    cfg["auto_map"] = {
        "AutoConfig": "evil_config.EvilConfig",
        "AutoModelForCausalLM": "evil_model.EvilModel",
    }
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "evil_format",
        "sparsity_config": {"format": "evil_format"},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    tc |= {"tokenizer_class": "EvilTok", "auto_map": {"AutoTokenizer": ["evil_tok.EvilTok", None]}}
    (d / "tokenizer_config.json").write_text(json.dumps(tc))
    return d, marker


def _cli(cwd: Path, *args: object):
    """The real command in a fresh process, run from the model directory (so a module a config
    names would be importable), answering 'y' to any question on stdin."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "sparsetool", *map(str, args)],
        cwd=cwd,
        input="y\n",
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_no_command_runs_code_named_by_a_checkpoint_directory(tmp_path):
    d, marker = _code_dir(tmp_path)
    text = tmp_path / "text.txt"
    text.write_text("some words to score, " * 40)
    r = _cli(d, "eval", ".", "--text", text)
    assert not marker.exists(), r.stdout + r.stderr
    assert r.returncode == 1 and "never runs code from a checkpoint" in r.stderr, r.stderr
    for args in (
        ["report", "."],
        ["prune", ".", "-o", tmp_path / "p", "--sparsity", "0.5"],
        ["densify", ".", "-o", tmp_path / "dd"],
        ["diff", ".", "."],
        ["flops", "--checkpoint", "."],
        ["simulate", "."],
    ):
        r = _cli(d, *args)
        assert r.returncode == 0, (args, r.stderr)
        assert not marker.exists(), args
    # with a tokenizer class of transformers' own, eval scores; the config's auto_map stays unused
    tc = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(
        json.dumps(tc | {"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    r = _cli(d, "eval", ".", "--text", text)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
