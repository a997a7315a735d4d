"""The hardware model on real safetensors checkpoints, and the executed zero-skipping schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from sparsetool.errors import CheckpointError
from sparsetool.hardware import builtin_devices, from_checkpoint, simulate, synthetic_mask
from sparsetool.hardware.layers import tile_counts
from sparsetool.hardware.presets import dataflow_grids
from sparsetool.hardware.verify import run_schedule

from helpers import gpt2_like_state, is_gpt2_target, pruned_gpt2

DEVICES = builtin_devices()
GRIDS = dataflow_grids(list(DEVICES.values()))


@pytest.mark.parametrize("encoding", ["zeros", "mask"])
def test_checkpoint_layers_come_from_the_real_masks(tmp_path, encoding):
    path, masks = pruned_gpt2(tmp_path, 0.75, encoding)
    wl = from_checkpoint(path, 256, GRIDS, seq_len=64)
    assert wl.source == "checkpoint"
    assert {ly.name for ly in wl.layers} == set(masks)
    for ly in wl.layers:
        m = masks[ly.name].numpy()  # (in, out): Conv1D
        assert (ly.in_features, ly.out_features) == m.shape
        assert ly.nnz == int(m.sum())
        assert ly.measured
        assert np.array_equal(ly.tiles[GRIDS[0]], tile_counts(np.ascontiguousarray(m.T), GRIDS[0]))
    assert wl.sparsity == pytest.approx(0.75, abs=1e-9)


def test_checkpoint_whole_step_adds_the_dense_appendix_f_work(tmp_path):
    from sparsetool.flops import ModelConfig, forward_terms

    path, _ = pruned_gpt2(tmp_path, 0.5, n_layer=2, d=32)
    wl = from_checkpoint(path, 256, GRIDS, seq_len=64)
    cfg = ModelConfig(
        "t", n_layers=2, d_model=32, n_heads=1, d_head=32, d_ff=128, vocab=96, seq_len=64
    )
    terms = forward_terms(cfg)
    # heads only enter the softmax term 3*h*s*s; the checkpoint has no config.json, so compare
    # the head-independent part exactly and the whole within the softmax term
    no_softmax = (terms["attn_logits"] + terms["attn_values"] + terms["logits"]) * 256 / 64
    softmax_one_head = terms["softmax"] * 256 / 64
    assert no_softmax < wl.untargeted_flops < no_softmax + 32 * softmax_one_head
    res = simulate(wl, DEVICES)
    dense, sparse = (
        res["workload"]["forward_flops"]["dense"],
        res["workload"]["forward_flops"]["sparse"],
    )
    assert res["workload"]["theoretical"] == pytest.approx(dense / sparse)
    assert (
        1.0 < res["workload"]["theoretical"] < 2.0
    )  # dense attention dilutes the 2x of the matmuls
    assert len(res["layers"]) == 8


def test_checkpoint_with_config_json_uses_its_heads(tmp_path):
    import json

    d = tmp_path / "ckpt"
    d.mkdir()
    pruned_gpt2(d, 0.5)
    (d / "config.json").write_text(
        json.dumps({"n_head": 4, "n_positions": 64, "n_embd": 32, "n_layer": 2, "vocab_size": 96})
    )
    from sparsetool.flops import ModelConfig, forward_terms

    wl = from_checkpoint(d, 128, GRIDS)
    # the sequence length is the learned position table's (32 rows), as `flops --checkpoint` reads
    # it
    cfg = ModelConfig("t", 2, 32, 4, 8, 128, 96, 32)
    terms = forward_terms(cfg)
    want = (
        (terms["attn_logits"] + terms["softmax"] + terms["attn_values"] + terms["logits"])
        * 128
        / 32
    )
    assert wl.untargeted_flops == pytest.approx(want)
    assert wl.seq_len == 32


def test_checkpoint_is_not_modified(tmp_path):
    path, _ = pruned_gpt2(tmp_path)
    before = path.read_bytes()
    simulate(from_checkpoint(path, 64, GRIDS, seq_len=32), DEVICES)
    assert path.read_bytes() == before


def test_missing_checkpoint_is_a_clean_error(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        from_checkpoint(tmp_path / "nope.safetensors", 64, GRIDS)


def test_checkpoint_without_targets_is_a_clean_error(tmp_path):
    path = tmp_path / "emb.safetensors"
    save_file({"wte.weight": torch.randn(10, 4)}, str(path))
    with pytest.raises(CheckpointError, match="no attention or feed-forward"):
        from_checkpoint(path, 64, GRIDS)


# --- the zero-skipping schedule, executed -------------------------------------------------------


@pytest.mark.parametrize(
    "shape,s,grid,pattern",
    [
        ((64, 48), 0.9, (4, 4), "random"),
        ((100, 77), 0.5, (8, 3), "random"),
        ((128, 128), 0.75, (32, 32), "rows"),
        ((16, 32), 0.5, (2, 2), "2:4"),
        ((700, 600), 0.95, (32, 32), "random"),  # larger than one block: the leading 512 x 512 runs
    ],
)
def test_schedule_equals_the_dense_masked_matmul(shape, s, grid, pattern):
    mask = synthetic_mask(shape, s, pattern, seed=5)
    r = run_schedule(mask, grid, tokens=6)
    block = mask[:512, :512]
    assert r["block"] == list(block.shape)
    assert r["axpys"] == r["nonzero"] == int(block.sum())  # one AXPY per non-zero, none for zeros
    assert r["axpys_match_tiles"]
    assert r["equal"] and r["max_abs_error"] < 1e-9


def test_schedule_check_detects_a_wrong_product(monkeypatch):
    # the comparison can fail: make the reference disagree by dropping one weight from the mask
    mask = synthetic_mask((32, 32), 0.5, seed=1)
    from sparsetool.hardware import verify

    real_nonzero = np.nonzero

    def skip_first(a):
        rows, cols = real_nonzero(a)
        return rows[1:], cols[1:]

    monkeypatch.setattr(verify.np, "nonzero", skip_first)
    r = run_schedule(mask, (1, 1), tokens=4)
    assert not r["equal"] and not r["axpys_match_tiles"]


def test_checkpoint_pruned_24_along_inputs_runs_on_24_cores(tmp_path):
    state = gpt2_like_state(n_layer=2, d=64, vocab=96)
    for i, (name, w) in enumerate(sorted(state.items())):
        if is_gpt2_target(name):  # Conv1D stores (in, out): 2:4 along the inputs is along axis 0
            m = synthetic_mask((w.shape[1], w.shape[0]), 0.5, "2:4", seed=i).T
            state[name] = w * torch.from_numpy(np.ascontiguousarray(m))
    path = tmp_path / "nm.safetensors"
    save_file(state, str(path))
    wl = from_checkpoint(path, 4096, GRIDS, seq_len=32)
    assert all(ly.nm_violation_in == 0.0 for ly in wl.layers)
    res = simulate(wl, DEVICES)
    d = next(x for x in res["devices"] if x["name"] == "a100-2:4")
    assert d["applicable"]
    assert 1.0 < d["forward"]["speedup"] <= 2.0 and d["train_step"]["speedup"] <= 2.0
