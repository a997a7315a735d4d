"""prune refuses NaN and inf weights in a targeted tensor, naming it; a nan-encoded input's NaN
still means "pruned"."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers import gpt2_like_state, run

BAD = "transformer.h.1.mlp.c_fc.weight"


def _write(tmp_path: Path, nan: int = 0, inf: int = 0) -> Path:
    state = gpt2_like_state()
    flat = state[BAD].view(-1)
    flat[:nan] = float("nan")
    flat[nan : nan + inf] = float("inf")
    if inf > 1:
        flat[nan + inf - 1] = -float("inf")
    path = tmp_path / "bad.safetensors"
    save_file(state, str(path), metadata={"format": "pt"})
    return path


@pytest.mark.parametrize(
    "how",
    [
        ["-s", "0.5"],
        ["-s", "0.5", "--scope", "global"],
        ["--nm", "2:4"],
        ["--fraction", "0.5"],
        ["-s", "0.5", "--method", "random"],
        ["-s", "0.5", "--encoding", "mask"],
    ],
)
@pytest.mark.parametrize(
    "nan, inf, said",
    [
        (3, 0, "3 NaN values"),
        (0, 1, "1 infinite value"),
        (1, 2, "1 NaN value and 2 infinite values"),
    ],
)
def test_prune_refuses_nonfinite_weights_naming_the_tensor(tmp_path, how, nan, inf, said):
    src = _write(tmp_path, nan, inf)
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    out = tmp_path / "out.safetensors"
    r = run("prune", src, "-o", out, *how)
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith(f"error: {src}: tensor '{BAD}' holds {said}; prune refuses them")
    assert "--exclude" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and hashlib.sha256(src.read_bytes()).hexdigest() == before


def test_the_tensor_can_be_left_out(tmp_path):
    src = _write(tmp_path, 1, 1)
    out = tmp_path / "out.safetensors"
    r = run("prune", src, "-o", out, "-s", "0.5", "--exclude", BAD)
    assert r.exit_code == 0, r.output
    t = load_file(out)[BAD]
    assert torch.isnan(t).sum() == 1 and torch.isinf(t).sum() == 1  # copied byte for byte


def test_nan_in_a_nan_encoded_input_still_means_pruned(tmp_path):
    src = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(), str(src), metadata={"format": "pt"})
    nan50, more = tmp_path / "nan50.safetensors", tmp_path / "more.safetensors"
    assert run("prune", src, "-o", nan50, "-s", "0.5", "--encoding", "nan").exit_code == 0
    assert torch.isnan(load_file(nan50)[BAD]).sum() == BAD_NUMEL // 2
    r = run("prune", nan50, "-o", more, "-s", "0.75")
    assert r.exit_code == 0, r.output
    t = load_file(more)[BAD]
    assert not torch.isnan(t).any() and int((t == 0).sum()) == BAD_NUMEL * 3 // 4


BAD_NUMEL = 16 * 64


def test_inf_in_fp8_is_found_too(tmp_path):
    if not hasattr(torch, "float8_e5m2"):
        pytest.skip("no float8_e5m2 in this torch")
    name = "model.layers.0.mlp.down_proj.weight"
    w = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    w[3, 3] = float("inf")
    src = tmp_path / "f8.safetensors"
    save_file({name: w.to(torch.float8_e5m2)}, str(src))
    r = run("prune", src, "-o", tmp_path / "o.safetensors", "-s", "0.5")
    assert r.exit_code == 1 and f"tensor '{name}' holds 1 infinite value" in r.stderr
