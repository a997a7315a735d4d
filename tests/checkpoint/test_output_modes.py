"""Output permission bits where no input file gives them: a new checkpoint written from memory
(``write_tensors``: a training run's) is an ordinary new file, 0o666 less the umask, the mode
``open()`` gives the config.json beside it; ``put_in_place(like=...)`` gives a directory written
by another library its input file's bits, the directories search where reading is allowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sparsetool.checkpoint.output_files import put_in_place
from sparsetool.checkpoint.writer import write_tensors


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def umask():
    """``os.umask`` for one test; the umask it found is set again after."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_a_checkpoint_from_memory_has_the_mode_open_gives(tmp_path, umask, mask):
    umask(mask)
    out = write_tensors(tmp_path / "model.safetensors", {"w": torch.ones(2, 2)})
    (tmp_path / "config.json").write_text("{}")
    assert mode(out) == 0o666 & ~mask == mode(tmp_path / "config.json")


def test_put_in_place_gives_every_file_the_input_files_mode(tmp_path, umask):
    umask(0o077)  # what the files were made with does not matter
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    source.chmod(0o640)
    tmp = tmp_path / "tmp"
    (tmp / "sub").mkdir(parents=True)
    for name in ("model.safetensors", "config.json", "sub/merges.txt"):
        (tmp / name).write_text("x")
    put_in_place(tmp, tmp_path / "out", like=source)
    out = tmp_path / "out"
    assert not tmp.exists()
    assert [mode(out), mode(out / "sub")] == [0o750, 0o750]
    assert {mode(out / n) for n in ("model.safetensors", "config.json", "sub/merges.txt")} == {
        0o640
    }
    assert mode(source) == 0o640
