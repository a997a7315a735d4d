"""The shared checkpoint pieces: dtype table, provenance entry, writing from memory, counting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from sparsetool.checkpoint import ENCODINGS, dtypes, open_checkpoint, write_tensors
from sparsetool.checkpoint.counting import count_unpruned as count_nonzero
from sparsetool.checkpoint.counting import tensor_counts
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.format import read_header
from sparsetool.checkpoint.provenance import merged_provenance, provenance_metadata, read_provenance
from sparsetool.errors import CheckpointError, SparsetoolError


# ----------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("row", [d for d in dtypes.BY_ST.values() if d.torch_name])
def test_dtype_table_agrees_with_torch(row):
    t = getattr(torch, row.torch_name, None)
    if t is None:
        pytest.skip(f"no {row.torch_name} in this torch")
    assert dtypes.to_torch(row.st) is t
    assert dtypes.st_name(t) == row.st
    assert dtypes.itemsize(row.st) == torch.empty((), dtype=t).element_size()
    # floating = a float type with a zero (E8M0 is a scale format without one)
    assert row.floating == (t.is_floating_point and row.st != "F8_E8M0")
    view = dtypes.int_view(row.itemsize)
    assert not view.is_floating_point and view.is_signed


def test_dtype_table_matches_header_of_reference_writer(tmp_path):
    tensors = {
        n: torch.zeros(2, dtype=getattr(torch, n))
        for n in (
            "bool",
            "uint8",
            "int8",
            "float16",
            "bfloat16",
            "int32",
            "float32",
            "float64",
            "int64",
        )
    }
    save_file(tensors, str(tmp_path / "a.st"))
    header = json.loads((tmp_path / "a.st").read_bytes()[8:].split(b"}}")[0] + b"}}")
    for name, info in header.items():
        assert dtypes.st_name(tensors[name].dtype) == info["dtype"]
        assert dtypes.torch_name(tensors[name].dtype) == name


def test_format_and_dtypes_load_without_torch_or_numpy():
    code = (
        "import sys, sparsetool.checkpoint.format, sparsetool.checkpoint.provenance, "
        "sparsetool.checkpoint.config, sparsetool.targets; "
        "sys.exit(1 if {'torch', 'numpy'} & set(sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_header_entries_give_torch_dtypes(tmp_path):
    save_file({"a": torch.ones(3, dtype=torch.bfloat16)}, str(tmp_path / "a.st"))
    (entry,) = read_header(tmp_path / "a.st").tensors
    assert (entry.st_dtype, entry.dtype, entry.shape, entry.nbytes) == (
        "BF16",
        torch.bfloat16,
        (3,),
        6,
    )


# ----------------------------------------------------------------------------- provenance
def test_provenance_keeps_history_oldest_first():
    a = provenance_metadata(None, {"producer": "sparsetool train", "model": {"n_head": 2}})
    b = provenance_metadata(a, {"command": "prune", "sparsity": 0.5})
    c = provenance_metadata({"format": "pt", **b}, {"command": "densify"})
    entry = read_provenance(c)
    assert entry["command"] == "densify" and "version" in entry
    assert [h.get("command", h.get("producer")) for h in entry["history"]] == [
        "sparsetool train",
        "prune",
    ]
    assert merged_provenance(c)["model"] == {"n_head": 2}
    assert list(c) == ["sparsetool"] and isinstance(c["sparsetool"], str)


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", "", "3"])
def test_foreign_provenance_is_ignored(raw):
    assert read_provenance({"sparsetool": raw}) is None
    assert merged_provenance({"sparsetool": raw}) == {}
    assert "history" not in read_provenance(
        provenance_metadata({"sparsetool": raw}, {"command": "prune"})
    )


# ----------------------------------------------------------------------------- write_tensors
def _tensors():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4, 16, generator=g)
    w[0, 0] = -0.0
    return {"l.weight": w, "l.bias": torch.randn(4, generator=g), "step": torch.tensor([3])}


def test_write_tensors_plain_equals_save_file(tmp_path):
    t = _tensors()
    meta = {"format": "pt"}  # one key: the reference writer orders several keys by hash
    write_tensors(tmp_path / "ours.st", t, metadata=meta)
    save_file(t, str(tmp_path / "ref.st"), metadata=meta)
    assert (tmp_path / "ours.st").read_bytes() == (tmp_path / "ref.st").read_bytes()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_write_tensors_encodes_masked_tensors_through_the_codec(tmp_path, encoding):
    t = _tensors()
    mask = torch.rand(4, 16, generator=torch.Generator().manual_seed(1)) > 0.5
    mask[0, 0] = False
    out = write_tensors(tmp_path / "m.st", t, encoding=encoding, masks={"l.weight": mask})
    with open_checkpoint(out) as ck:
        by_name = {lt.name: lt for lt in ck.logical}
        assert set(by_name) == set(t)
        dense, got = decode(ck, by_name["l.weight"])
        assert torch.equal(dense, torch.where(mask, t["l.weight"], torch.zeros(())))
        assert not torch.signbit(dense[~mask]).any()  # pruned -0.0 written as +0.0
        if encoding in ("mask", "bitmask", "nan"):
            assert torch.equal(got, mask & (t["l.weight"] != 0) if encoding == "bitmask" else mask)
        assert torch.equal(decode(ck, by_name["l.bias"])[0], t["l.bias"])
        assert count_nonzero(ck, by_name["l.weight"]) == int((mask & (t["l.weight"] != 0)).sum())


def test_mask_encoding_stores_bool_mask_beside_weight(tmp_path):
    t = _tensors()
    mask = t["l.weight"] > 0
    write_tensors(
        tmp_path / "m.st", t, encoding="mask", masks={"l.weight": mask}, metadata={"a": "b"}
    )
    back = load_file(tmp_path / "m.st")
    assert set(back) == {"l.weight", "l.weight_mask", "l.bias", "step"}
    assert torch.equal(back["l.weight_mask"], mask)
    with safe_open(tmp_path / "m.st", "pt") as f:
        assert f.metadata() == {"a": "b"}


def test_write_tensors_is_atomic_and_checks_its_input(tmp_path):
    out = tmp_path / "m.st"
    out.write_bytes(b"old")
    with pytest.raises(CheckpointError, match="not written"):
        write_tensors(out, _tensors(), masks={"other.weight": torch.ones(2, dtype=torch.bool)})
    with pytest.raises(Exception, match="metadata"):
        write_tensors(out, _tensors(), metadata={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(SparsetoolError, match="bitmask"):
        write_tensors(
            out, _tensors(), encoding="bitmask", masks={"l.bias": torch.ones(4, dtype=torch.bool)}
        )
    assert out.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.st"]
    with pytest.raises(CheckpointError, match="directory"):
        write_tensors(tmp_path, _tensors())


def test_tensor_counts_reads_every_encoding(tmp_path):
    w = torch.tensor([[1.0, -0.0, 0.0, 2.0], [3.0, 4.0, -5.0, 0.0]])
    keep = torch.tensor([[True, True, False, False], [True, True, True, True]])
    write_tensors(
        tmp_path / "c.st",
        {"x.weight": w, "y.weight": w.clone(), "z": torch.tensor([0, 7])},
        encoding="nan",
        masks={"x.weight": keep},
    )
    rows = {r.name: r for r in tensor_counts(tmp_path / "c.st")}
    assert (rows["x.weight"].nonzero, rows["x.weight"].numel, rows["x.weight"].dtype) == (
        4,
        8,
        "float32",
    )
    assert rows["y.weight"].nonzero == 5  # -0.0 is zero
    assert (rows["z"].nonzero, rows["z"].dtype, rows["z"].encoding) == (1, "int64", "plain")
