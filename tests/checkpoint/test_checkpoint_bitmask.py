"""The sparse-bitmask encoding against golden files written by compressed-tensors itself.

fixtures/bitmask/golden.safetensors was written by compressed-tensors 0.14.0.1 and
golden-0.8.1.safetensors by 0.8.1 (older naming) from dense.safetensors; see
fixtures/bitmask/make_golden.py. Neither golden file has ``__metadata__`` (the reference helper
saves without it), and sparsetool adds none when the input has none, so the bytes compare as is.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsetool.checkpoint import (
    TensorSpec,
    encode,
    encoded_specs,
    open_checkpoint,
    stored_nonzeros,
    write_checkpoint,
)
from sparsetool.checkpoint import bitmask as bm
from sparsetool.checkpoint.encodings import decode
from sparsetool.errors import CheckpointError, SparsetoolError

from helpers import ROOT

HERE = ROOT / "fixtures" / "bitmask"
DENSE = HERE / "dense.safetensors"


def compress_like_reference(src_path: Path, out: Path) -> None:
    """Every 2-D ``.weight`` to bitmask (what save_compressed does), everything else copied raw."""
    ck = open_checkpoint(src_path)
    with write_checkpoint(ck, out) as w:
        for shard in ck.shards:
            plan = []
            for lt in ck.logical_in(shard):
                if lt.name.endswith(".weight") and len(lt.shape) == 2:
                    dense, mask = decode(ck, lt)
                    plan.append(
                        (
                            lt,
                            encode(lt.name, dense, mask, "bitmask"),
                            encoded_specs(
                                lt.name, lt.dtype, lt.shape, stored_nonzeros(dense, mask), "bitmask"
                            ),
                        )
                    )
                else:
                    plan.append((lt, None, [TensorSpec(lt.name, lt.dtype, lt.shape)]))
            with w.shard(shard, [s for _, _, specs in plan for s in specs]) as sw:
                for lt, parts, _ in plan:
                    if parts is None:
                        sw.copy_stored(lt.name, ck, lt.stored[0])
                    else:
                        for name, t in parts:
                            sw.write(name, t)


def test_writes_exactly_the_reference_bytes(tmp_path):
    compress_like_reference(DENSE, tmp_path / "out.safetensors")
    assert (tmp_path / "out.safetensors").read_bytes() == (HERE / "golden.safetensors").read_bytes()


@pytest.mark.parametrize("golden", ["golden.safetensors", "golden-0.8.1.safetensors"])
def test_reads_reference_files_back_to_dense(golden):
    dense = load_file(DENSE)
    ck = open_checkpoint(HERE / golden)
    by_name = {lt.name: lt for lt in ck.logical}
    assert set(by_name) == set(dense)
    for name, want in dense.items():
        lt = by_name[name]
        got, mask = decode(ck, lt)
        assert got.dtype == want.dtype and lt.shape == tuple(want.shape)
        if lt.encoding == "plain":  # the 1-D bias, left alone by 0.14
            assert golden == "golden.safetensors" and mask is None
            assert torch.equal(got, want)
            continue
        assert lt.encoding == "bitmask"
        assert torch.equal(mask, want != 0)
        assert torch.equal(got, want)  # -0.0 == 0.0 here; sign is checked next
        assert not torch.signbit(got[~mask]).any()


def test_reference_layout_by_hand():
    # rows of 10 columns pack into 2 bytes each, least-significant bit first
    w = torch.zeros(2, 10)
    w[0, 0] = 1.0
    w[0, 9] = 2.0
    w[1, 3] = 3.0
    w[1, 8] = -0.0  # not stored
    parts = dict(encode("blk.fc.weight", w, None, "bitmask"))
    assert parts["blk.fc.shape"].tolist() == [2, 10]
    assert parts["blk.fc.compressed"].tolist() == [1.0, 2.0, 3.0]
    assert parts["blk.fc.bitmask"].dtype == torch.uint8
    assert parts["blk.fc.bitmask"].tolist() == [[0b00000001, 0b00000010], [0b00001000, 0]]
    assert parts["blk.fc.row_offsets"].tolist() == [0, 2]


def test_mask_applies_before_compression():
    w = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.bfloat16)
    m = torch.tensor([[True, False, True]])
    parts = dict(encode("a.weight", w, m, "bitmask"))
    assert parts["a.compressed"].tolist() == [1.0, 3.0]
    assert stored_nonzeros(w, m) == 2


def test_bitmask_refuses_non_2d_and_non_weight():
    with pytest.raises(SparsetoolError, match="2-D.*use --encoding"):
        encode("a.weight", torch.ones(2, 2, 2), None, "bitmask")
    with pytest.raises(SparsetoolError, match="'<module>.weight'"):
        encoded_specs("a.bias", torch.float32, (4, 4), 3, "bitmask")


def test_corrupt_bitmask_group(tmp_path):
    parts = dict(encode("a.weight", torch.tensor([[1.0, 0.0, 2.0]]), None, "bitmask"))
    bad = dict(parts, **{"a.compressed": torch.tensor([1.0])})  # bitmask says 2 values
    save_file(bad, tmp_path / "b.safetensors")
    ck = open_checkpoint(tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match="marks 2 non-zeros"):
        decode(ck, ck.logical[0])
    bad = dict(
        parts, **{"a.bitmask": torch.zeros(1, 2, dtype=torch.uint8)}
    )  # 3 columns need 1 byte
    save_file(bad, tmp_path / "c.safetensors")
    with pytest.raises(CheckpointError, match="c.safetensors.*a.bitmask"):
        open_checkpoint(tmp_path / "c.safetensors")


def test_pack_unpack_inverse():
    g = np.random.default_rng(3)
    for cols in (1, 7, 8, 9, 17):
        keep = g.random((3, cols)) < 0.5
        values, bits, _ = bm.compress(keep.astype(np.float32).view(np.int32), floating=True)
        assert bits.shape == (3, (cols + 7) // 8)
        assert np.array_equal(bm.unpack(bits, [3, cols]), keep)
        assert np.array_equal(
            bm.unpack(bits.reshape(-1), [3, cols]), keep
        )  # as a file maps it: flat


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int32]
)
def test_stored_values_are_the_nonzeros_of_a_float_comparison(dtype):
    t = (
        torch.tensor([[0.0, -0.0, 1.0, -2.0], [float("nan"), 0.5, 0.0, -0.0]]).to(dtype)
        if dtype.is_floating_point
        else torch.tensor([[0, 3, -1, 0]], dtype=dtype)
    )
    bits = t.view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()]).numpy()
    values, packed, offsets = bm.compress(bits, floating=dtype.is_floating_point)
    assert np.array_equal(bm.unpack(packed, list(t.shape)), (t != 0).numpy())
    assert values.dtype == bits.dtype and values.size == int((t != 0).sum())
    assert offsets.dtype == np.int64


def test_plain_and_bitmask_forms_of_one_weight_conflict(tmp_path):
    parts = dict(encode("a.weight", torch.tensor([[1.0, 0.0, 2.0]]), None, "bitmask"))
    save_file(parts | {"a.weight": torch.ones(1, 3)}, tmp_path / "both.safetensors")
    with pytest.raises(CheckpointError, match="two stored forms of 'a.weight'"):
        open_checkpoint(tmp_path / "both.safetensors")


def test_bitmask_sparsity_config_matches_reference_shape():
    from sparsetool.checkpoint import bitmask_sparsity_config, drop_sparsity_config

    quant = {
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": {"g": {}}}
    }
    cfg = bitmask_sparsity_config(quant, ["b.fc", "a.fc"], 0.75)
    block = cfg["quantization_config"]
    # keys and values as compressed-tensors 0.14.0.1's update_config writes them (model_dump of
    # its sparse-bitmask config, checked against that release)
    assert block["sparsity_config"] == {
        "format": "sparse-bitmask",
        "global_sparsity": 0.75,
        "ignore": None,
        "registry_requires_subclass": False,
        "sparsity_structure": "unstructured",
        "targets": ["a.fc", "b.fc"],
    }
    assert block["config_groups"] == {"g": {}} and block["version"] == "0.14.0.1"
    assert "config_groups" in drop_sparsity_config(cfg)["quantization_config"]
    assert "sparsity_config" not in quant["quantization_config"]  # input untouched


@pytest.mark.parametrize("shape", [(4, 0), (0, 0), (0, 5), (3, 1)])
def test_empty_rows_and_columns_pack_and_unpack(shape):
    values = np.zeros(shape, dtype=np.int16)
    stored, packed, offsets = bm.compress(values, floating=True)
    assert packed.shape == (shape[0], (shape[1] + 7) // 8) and offsets.shape == (shape[0],)
    for bits in (packed, packed.reshape(-1)):  # as encoded, and flat as a file maps it
        assert bm.unpack(bits, list(shape)).shape == shape


def test_zero_dimensional_tensors_keep_their_shape():
    from sparsetool.masks import magnitude_mask, top_k_mask

    for encoding in ("zeros", "mask", "nan"):
        parts = encode("x", torch.tensor(1.5), torch.tensor(True), encoding)
        assert [tuple(t.shape) for _, t in parts] == [()] * len(parts)
    assert (
        top_k_mask(torch.tensor(1.5), 1).shape == ()
        and magnitude_mask(torch.tensor(1.5), keep=1).shape == ()
    )
