"""Checkpoint reading, validation, streaming writes, directories and atomicity (real files)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsetool.checkpoint import (
    TensorSpec,
    drop_sparsity_config,
    encode,
    encoded_specs,
    open_checkpoint,
    write_checkpoint,
)
from sparsetool.checkpoint.encodings import decode
from sparsetool.errors import CheckpointError

from helpers import ROOT

FIXTURES = ROOT / "fixtures"


def specs_of(tensors: dict[str, torch.Tensor]) -> list[TensorSpec]:
    return [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]


def copy_all(src, out, **kw):
    """Rewrite every shard of ``src`` at ``out`` through ShardWriter.write (the streaming path)."""
    with write_checkpoint(src, out, **kw) as w:
        for shard in src.shards:
            entries = src.entries(shard)
            with w.shard(shard, [TensorSpec(e.name, e.dtype, e.shape) for e in entries]) as sw:
                for e in entries:
                    sw.write(e.name, src.read_stored(e.name))


def small_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "h.0.attn.weight": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "h.0.attn.bias": torch.randn(6, generator=g),
        "h.0.ln.weight": torch.ones(6, dtype=torch.float16),
        "ids": torch.arange(5, dtype=torch.int64),
    }


# ---------------------------------------------------------------- reading


def test_read_plain_tensors_exactly(tmp_path):
    ts = small_tensors()
    save_file(ts, tmp_path / "m.safetensors", metadata={"format": "pt"})
    ck = open_checkpoint(tmp_path / "m.safetensors")
    assert not ck.is_dir and ck.shards == ["m.safetensors"]
    assert ck.metadata("m.safetensors") == {"format": "pt"}
    assert {lt.name for lt in ck.logical} == set(ts)
    for lt in ck.logical:
        dense, mask = decode(ck, lt)
        assert mask is None and lt.encoding == "plain"
        assert dense.dtype == ts[lt.name].dtype and torch.equal(dense, ts[lt.name])
        assert lt.nbytes == ts[lt.name].numel() * ts[lt.name].element_size()
    assert ck.nbytes_on_disk == (tmp_path / "m.safetensors").stat().st_size


def test_logical_order_is_file_order(tmp_path):
    # save_file stores by descending dtype size then name: int64, f32, bf16, f16
    save_file(small_tensors(), tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    assert [lt.name for lt in ck.logical] == [
        "ids",
        "h.0.attn.bias",
        "h.0.attn.weight",
        "h.0.ln.weight",
    ]


def test_nan_sentinel_read_as_pruned(tmp_path):
    w = torch.tensor([[1.0, float("nan")], [-0.0, float("nan")]], dtype=torch.float16)
    save_file({"l.weight": w}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    dense, mask = decode(ck, ck.logical[0])
    assert mask.tolist() == [[True, False], [True, False]]
    assert dense.tolist() == [[1.0, 0.0], [-0.0, 0.0]]
    # NaN sentinels become +0.0, not -0.0 (sign bit clear)
    assert not torch.signbit(dense[~mask]).any()


def test_mask_encoding_read(tmp_path):
    w = torch.tensor([[1.0, -0.0, 3.0]])
    m = torch.tensor([[True, False, False]])
    save_file({"l.weight": w, "l.weight_mask": m}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    (lt,) = ck.logical
    assert lt.encoding == "mask" and lt.stored == ("l.weight", "l.weight_mask")
    assert lt.nbytes == 12 + 3
    dense, mask = decode(ck, lt)
    assert dense.tolist() == [[1.0, 0.0, 0.0]] and mask.tolist() == [[True, False, False]]
    assert not torch.signbit(dense).any()


def test_mask_shape_mismatch_names_both_tensors(tmp_path):
    save_file(
        {"l.weight": torch.ones(2, 3), "l.weight_mask": torch.ones(3, 2, dtype=torch.bool)},
        tmp_path / "m.safetensors",
    )
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match=r"l\.weight_mask.*\[3, 2\].*l\.weight.*\[2, 3\]"):
        decode(ck, ck.logical[0])


def test_lone_mask_like_name_is_plain(tmp_path):
    save_file({"attention_mask": torch.ones(3, dtype=torch.bool)}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    assert [(lt.name, lt.encoding) for lt in ck.logical] == [("attention_mask", "plain")]


# ---------------------------------------------------------------- corrupt input


def _header_file(
    path: Path, header: dict | bytes, data: bytes = b"", length: int | None = None
) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


CORRUPT = {
    "empty": lambda p: p.write_bytes(b""),
    "short": lambda p: p.write_bytes(b"\x01\x02\x03"),
    "not safetensors": lambda p: p.write_bytes(b"PK\x03\x04 this is a zip file, not tensors" * 4),
    "header too long": lambda p: _header_file(
        p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, length=10_000
    ),
    "invalid json": lambda p: _header_file(p, b'{"a": {"dtype": "F32", "shape": [1], "data_of'),
    "unknown dtype": lambda p: _header_file(
        p, {"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
    ),
    "size mismatch": lambda p: _header_file(
        p, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4
    ),
    "overlap": lambda p: _header_file(
        p,
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
        },
        b"\0" * 8,
    ),
    "hole": lambda p: _header_file(
        p,
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
        },
        b"\0" * 12,
    ),
    "exceeds file": lambda p: _header_file(
        p, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8
    ),
    "trailing bytes": lambda p: _header_file(
        p, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9
    ),
    "negative shape": lambda p: _header_file(
        p, {"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}
    ),
    "bad metadata": lambda p: _header_file(p, {"__metadata__": {"k": 1}}),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_gives_checkpoint_error_naming_it(tmp_path, case):
    p = tmp_path / f"bad-{case.replace(' ', '_')}.safetensors"
    CORRUPT[case](p)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(p)
    assert str(p) in str(info.value)


def test_truncated_real_file(tmp_path):
    save_file(small_tensors(), tmp_path / "m.safetensors")
    raw = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "t.safetensors").write_bytes(raw[:-10])
    with pytest.raises(CheckpointError, match="truncated"):
        open_checkpoint(tmp_path / "t.safetensors")


def test_missing_path_says_what_was_expected(tmp_path):
    with pytest.raises(CheckpointError, match="expected a .safetensors file or a directory"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        open_checkpoint(tmp_path / "empty")


def test_index_naming_missing_shard_or_tensor(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    save_file({"a": torch.ones(2)}, d / "model-00001-of-00002.safetensors")
    index = {
        "metadata": {"total_size": 8},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        },
    }
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*missing"):
        open_checkpoint(d)
    index["weight_map"]["b"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"index.json.*'b'"):
        open_checkpoint(d)
    (d / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="index.json.*not valid JSON"):
        open_checkpoint(d)


# ---------------------------------------------------------------- writing


def test_rewrite_is_byte_identical(tmp_path):
    save_file(small_tensors(), tmp_path / "m.safetensors", metadata={"format": "pt"})
    ck = open_checkpoint(tmp_path / "m.safetensors")
    copy_all(ck, tmp_path / "o.safetensors")
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()


def test_copy_stored_raw_and_metadata_extra(tmp_path):
    ts = small_tensors()
    save_file(ts, tmp_path / "m.safetensors", metadata={"format": "pt"})
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with (
        write_checkpoint(ck, tmp_path / "o.safetensors", metadata_extra={"sparsetool": "x"}) as w,
        w.shard(ck.shards[0], specs_of(ts)) as sw,
    ):
        for name in ["ids", "h.0.ln.weight"]:  # int tensor and 1-D tensor: raw copies
            sw.copy_stored(name, ck, name)
        for name in ["h.0.attn.bias", "h.0.attn.weight"]:
            sw.write(name, ts[name])
    out = open_checkpoint(tmp_path / "o.safetensors")
    assert out.metadata(out.shards[0]) == {"format": "pt", "sparsetool": "x"}
    got = load_file(tmp_path / "o.safetensors")
    assert all(torch.equal(got[n], ts[n]) for n in ts)
    # the data section is the input's, byte for byte
    a, b = (tmp_path / "m.safetensors").read_bytes(), (tmp_path / "o.safetensors").read_bytes()
    assert (
        a[-sum(t.numel() * t.element_size() for t in ts.values()) :]
        == b[-sum(t.numel() * t.element_size() for t in ts.values()) :]
    )


def test_writer_checks_dtype_shape_and_completeness(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with (
        pytest.raises(CheckpointError, match="declared"),
        write_checkpoint(ck, tmp_path / "o.safetensors") as w,
        w.shard(ck.shards[0], [TensorSpec("a", torch.float32, (2,))]) as sw,
    ):
        sw.write("a", torch.ones(3))
    with (
        pytest.raises(CheckpointError, match="never written: b"),
        write_checkpoint(ck, tmp_path / "o.safetensors") as w,
        w.shard(
            ck.shards[0],
            [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.float32, (1,))],
        ) as sw,
    ):
        sw.write("a", torch.ones(2))
    with (
        pytest.raises(CheckpointError, match="not declared"),
        write_checkpoint(ck, tmp_path / "o.safetensors") as w,
        w.shard(ck.shards[0], [TensorSpec("a", torch.float32, (2,))]) as sw,
    ):
        sw.write("zz", torch.ones(2))
    assert os.listdir(tmp_path) == ["m.safetensors"]


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_failure_inside_with_leaves_nothing(tmp_path, exc):
    save_file(small_tensors(), tmp_path / "m.safetensors")
    before = (tmp_path / "m.safetensors").read_bytes()
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with (
        pytest.raises(exc),
        write_checkpoint(ck, tmp_path / "o.safetensors") as w,
        w.shard(ck.shards[0], [TensorSpec(e.name, e.dtype, e.shape) for e in ck.entries()]) as sw,
    ):
        sw.write("ids", torch.arange(5))
        raise exc()
    assert os.listdir(tmp_path) == ["m.safetensors"]
    assert (tmp_path / "m.safetensors").read_bytes() == before


def test_failure_keeps_existing_output(tmp_path):
    save_file(small_tensors(), tmp_path / "m.safetensors")
    (tmp_path / "o.safetensors").write_bytes(b"old output")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with pytest.raises(KeyboardInterrupt), write_checkpoint(ck, tmp_path / "o.safetensors"):
        raise KeyboardInterrupt
    assert (tmp_path / "o.safetensors").read_bytes() == b"old output"
    assert sorted(os.listdir(tmp_path)) == ["m.safetensors", "o.safetensors"]
    copy_all(ck, tmp_path / "o.safetensors")  # replaces an existing file like cp
    assert (tmp_path / "o.safetensors").read_bytes() == (tmp_path / "m.safetensors").read_bytes()


def test_out_equal_to_in_needs_in_place(tmp_path):
    ts = small_tensors()
    save_file(ts, tmp_path / "m.safetensors")
    before = (tmp_path / "m.safetensors").read_bytes()
    ck = open_checkpoint(tmp_path / "m.safetensors")
    with (
        pytest.raises(CheckpointError, match="--in-place"),
        write_checkpoint(ck, tmp_path / "." / "m.safetensors"),
    ):
        pass
    assert (tmp_path / "m.safetensors").read_bytes() == before
    # in place: zero the bf16 weight, everything else copied from the file being replaced
    with (
        write_checkpoint(ck, tmp_path / "m.safetensors", in_place=True) as w,
        w.shard(ck.shards[0], specs_of(ts)) as sw,
    ):
        for n in ts:
            if n == "h.0.attn.weight":
                sw.write(n, torch.zeros_like(ts[n]))
            else:
                sw.copy_stored(n, ck, n)
    got = load_file(tmp_path / "m.safetensors")
    assert torch.equal(got["h.0.attn.weight"], torch.zeros(4, 6, dtype=torch.bfloat16))
    assert torch.equal(got["h.0.attn.bias"], ts["h.0.attn.bias"])
    assert os.listdir(tmp_path) == ["m.safetensors"]


def test_file_vs_directory_output_clash(tmp_path):
    save_file({"a": torch.ones(2)}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    (tmp_path / "adir").mkdir()
    with (
        pytest.raises(CheckpointError, match="existing directory"),
        write_checkpoint(ck, tmp_path / "adir"),
    ):
        pass
    with (
        pytest.raises(CheckpointError, match="does not exist"),
        write_checkpoint(ck, tmp_path / "no" / "o.safetensors"),
    ):
        pass


def _sharded_dir(d: Path) -> dict[str, torch.Tensor]:
    d.mkdir()
    g = torch.Generator().manual_seed(1)
    s1 = {
        "h.0.mlp.weight": torch.randn(8, 5, generator=g),
        "wte.weight": torch.randn(10, 4, generator=g),
    }
    s2 = {
        "h.1.mlp.weight": torch.randn(8, 5, generator=g),
        "h.1.mlp.bias": torch.randn(8, generator=g),
    }
    save_file(s1, d / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file(s2, d / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    wm = {n: "model-00001-of-00002.safetensors" for n in s1} | {
        n: "model-00002-of-00002.safetensors" for n in s2
    }
    total = sum(t.numel() * 4 for t in (s1 | s2).values())
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total, "note": "kept"}, "weight_map": wm})
    )
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "gpt2",
                "n_layer": 2,
                "quantization_config": {
                    "quant_method": "compressed-tensors",
                    "version": "0.14.0.1",
                    "sparsity_config": {"format": "sparse-bitmask"},
                    "transform_config": {},
                },
            }
        )
    )
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    (d / "sub").mkdir()
    (d / "sub" / "notes.txt").write_text("carried")
    return s1 | s2


def test_sharded_directory_round_trip(tmp_path):
    ts = _sharded_dir(tmp_path / "in")
    ck = open_checkpoint(tmp_path / "in")
    assert ck.is_dir and ck.shards == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert ck.other_files == [Path("config.json"), Path("tokenizer.json")]
    assert ck.left_out == [Path("sub")]  # not part of a model directory
    assert ck.config["model_type"] == "gpt2"
    assert [lt.shard for lt in ck.logical] == [ck.shards[0]] * 2 + [ck.shards[1]] * 2
    # prune the mlp weights to mask encoding, drop the sparsity config from config.json
    with write_checkpoint(
        ck, tmp_path / "out", config_transform=drop_sparsity_config, metadata_extra={"k": "v"}
    ) as w:
        for shard in ck.shards:
            plan = []
            for lt in ck.logical_in(shard):
                dense, _ = decode(ck, lt)
                if lt.name.endswith("mlp.weight"):
                    mask = dense.abs() > 0.5
                    plan.append((lt, "mask", dense * mask, mask))
                else:
                    plan.append((lt, None, None, None))
            specs = []
            for lt, enc, _dense, _mask in plan:
                specs += (
                    encoded_specs(lt.name, lt.dtype, lt.shape, 0, enc)
                    if enc
                    else [TensorSpec(lt.name, lt.dtype, lt.shape)]
                )
            with w.shard(shard, specs) as sw:
                for lt, enc, dense, mask in plan:
                    if enc:
                        for name, t in encode(lt.name, dense, mask, enc):
                            sw.write(name, t)
                    else:
                        sw.copy_stored(lt.name, ck, lt.stored[0])
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == sorted(set(os.listdir(tmp_path / "in")) - {"sub"})
    assert (out / "tokenizer.json").read_text() == '{"version": "1.0"}'
    assert json.loads((out / "config.json").read_text()) == {"model_type": "gpt2", "n_layer": 2}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["note"] == "kept"
    assert index["weight_map"]["h.1.mlp.weight_mask"] == "model-00002-of-00002.safetensors"
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in ts.values()) + 2 * 40
    o = open_checkpoint(out)
    assert o.metadata(o.shards[1]) == {"format": "pt", "k": "v"}
    for lt in o.logical:
        dense, mask = decode(o, lt)
        if lt.name.endswith("mlp.weight"):
            assert lt.encoding == "mask"
            assert torch.equal(dense, ts[lt.name] * (ts[lt.name].abs() > 0.5))
        else:
            assert mask is None and torch.equal(dense, ts[lt.name])
    assert not [p for p in os.listdir(tmp_path) if p not in ("in", "out")]


def test_directory_in_place_and_interrupt(tmp_path):
    _sharded_dir(tmp_path / "in")
    snapshot = {
        p: (tmp_path / "in" / p).read_bytes() for p in os.listdir(tmp_path / "in") if p != "sub"
    }
    ck = open_checkpoint(tmp_path / "in")
    with (
        pytest.raises(KeyboardInterrupt),
        write_checkpoint(ck, tmp_path / "in", in_place=True) as w,
    ):
        with w.shard(ck.shards[0], []):
            pass
        raise KeyboardInterrupt
    assert {p: (tmp_path / "in" / p).read_bytes() for p in snapshot} == snapshot
    assert os.listdir(tmp_path) == ["in"]
    copy_all(ck, tmp_path / "in", in_place=True)
    assert os.listdir(tmp_path) == ["in"]
    after = {p: (tmp_path / "in" / p).read_bytes() for p in snapshot}
    for p in snapshot:
        if p.endswith(".safetensors"):
            assert after[p] == snapshot[p]
    assert (
        json.loads(after["model.safetensors.index.json"])["weight_map"]
        == json.loads(snapshot["model.safetensors.index.json"])["weight_map"]
    )


def test_unwritten_shard_is_an_error(tmp_path):
    _sharded_dir(tmp_path / "in")
    ck = open_checkpoint(tmp_path / "in")
    with (
        pytest.raises(CheckpointError, match="never written: model-00002"),
        write_checkpoint(ck, tmp_path / "out") as w,
        w.shard(ck.shards[0], []),
    ):
        pass
    assert os.listdir(tmp_path) == ["in"]


def test_tiny_gpt2_fixture():
    ck = open_checkpoint(FIXTURES / "tiny-gpt2")
    assert ck.config["n_layer"] == 2 and ck.config["n_embd"] == 64
    names = {lt.name for lt in ck.logical}
    assert "transformer.h.1.mlp.c_fc.weight" in names and "transformer.wte.weight" in names
    lt = next(lt for lt in ck.logical if lt.name == "transformer.h.0.attn.c_attn.weight")
    assert lt.shape == (64, 192) and lt.dtype == torch.float32
    assert sum(p.stat().st_size for p in (FIXTURES / "tiny-gpt2").iterdir()) < 1_000_000


def test_drop_sparsity_config_variants():
    assert drop_sparsity_config({"a": 1}) == {"a": 1}
    old = {
        "compression_config": {"sparsity_config": {"format": "sparse-bitmask"}, "version": "0.4.0"}
    }
    assert drop_sparsity_config(old) == {}
    top = {"sparsity_config": {"format": "x"}, "b": 2}
    assert drop_sparsity_config(top) == {"b": 2}
    keep = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"targets": ["Linear"]}},
            "sparsity_config": {"format": "sparse-bitmask"},
        }
    }
    assert "config_groups" in drop_sparsity_config(keep)["quantization_config"]
    assert "sparsity_config" in keep["quantization_config"]  # input not modified


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_nan_detection_is_exact_for_infinities_and_overflow(tmp_path, dtype):
    big = torch.full((4, 4), 60000.0, dtype=dtype)  # the fp16 sum overflows to inf: no NaN though
    infs = torch.tensor([[float("inf"), -float("inf")], [1.0, 2.0]], dtype=dtype)  # sum is NaN
    one_nan = torch.tensor([[float("inf"), float("nan")], [1.0, -float("inf")]], dtype=dtype)
    save_file({"big": big, "infs": infs, "one_nan": one_nan}, tmp_path / "m.safetensors")
    ck = open_checkpoint(tmp_path / "m.safetensors")
    got = {lt.name: decode(ck, lt) for lt in ck.logical}
    assert got["big"][1] is None and torch.equal(got["big"][0], big)
    assert got["infs"][1] is None and torch.equal(got["infs"][0], infs)
    assert got["one_nan"][1].tolist() == [[True, False], [True, True]]


def test_existing_output_directory_is_replaced_only_if_nothing_else_would_go(tmp_path):
    _sharded_dir(tmp_path / "in")
    ck = open_checkpoint(tmp_path / "in")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("precious")
    with pytest.raises(CheckpointError, match="thesis.tex"):
        copy_all(ck, tmp_path / "home")
    assert (tmp_path / "home" / "thesis.tex").read_text() == "precious"
    # an earlier output plus a file of the user's: still refused, nothing lost
    (tmp_path / "old").mkdir()
    output_names = set(os.listdir(tmp_path / "in")) - {"sub"}  # sub/ is left out of outputs
    for name in output_names:
        (tmp_path / "old" / name).write_bytes(b"stale")
    (tmp_path / "old" / "NOTES.md").write_text("mine")
    with pytest.raises(CheckpointError, match="NOTES.md"):
        copy_all(ck, tmp_path / "old")
    assert (tmp_path / "old" / "NOTES.md").read_text() == "mine"
    # an earlier output alone is replaced
    (tmp_path / "old" / "NOTES.md").unlink()
    copy_all(ck, tmp_path / "old")
    assert sorted(os.listdir(tmp_path / "old")) == sorted(output_names)
    assert sorted(os.listdir(tmp_path)) == ["home", "in", "old"]


def test_output_path_must_match_the_input_layout(tmp_path):
    _sharded_dir(tmp_path / "in")
    with pytest.raises(CheckpointError, match="looks like a file name"):
        copy_all(open_checkpoint(tmp_path / "in"), tmp_path / "out.safetensors")
    save_file({"w": torch.ones(2, 2)}, str(tmp_path / "one.safetensors"))
    with pytest.raises(CheckpointError, match="looks like a directory"):
        copy_all(open_checkpoint(tmp_path / "one.safetensors"), str(tmp_path / "newdir") + os.sep)
    assert sorted(os.listdir(tmp_path)) == ["in", "one.safetensors"]


def test_mask_in_another_shard_than_its_weight(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    w = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    m = torch.tensor([[True, False], [False, True]])
    save_file({"l.weight": w}, d / "a.safetensors")
    save_file({"l.weight_mask": m, "z": torch.ones(1)}, d / "b.safetensors")
    wm = {"l.weight": "a.safetensors", "l.weight_mask": "b.safetensors", "z": "b.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    ck = open_checkpoint(d)
    assert [(lt.name, lt.shard, lt.encoding) for lt in ck.logical] == [
        ("l.weight", "a.safetensors", "mask"),
        ("z", "b.safetensors", "plain"),
    ]
    assert [lt.name for lt in ck.logical_in("b.safetensors")] == ["z"]
    dense, mask = decode(ck, ck.logical[0])
    assert dense.tolist() == [[1.0, 0.0], [0.0, -4.0]] and torch.equal(mask, m)


def test_directory_layout_errors(tmp_path):
    d = tmp_path / "two"
    d.mkdir()
    save_file({"a": torch.ones(1)}, d / "x.safetensors")
    save_file({"b": torch.ones(1)}, d / "y.safetensors")
    with pytest.raises(
        CheckpointError, match="2 .safetensors files but no model.safetensors.index.json"
    ):
        open_checkpoint(d)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "../x.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="not a plain file name"):
        open_checkpoint(d)
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "x.safetensors", "b": "x.safetensors"}})
    )
    with pytest.raises(
        CheckpointError,
        match="y.safetensors: a .safetensors file that model.safetensors.index.json does not list",
    ):
        open_checkpoint(d)
    (d / "y.safetensors").rename(tmp_path / "y.safetensors")
    with pytest.raises(
        CheckpointError,
        match="names tensor 'b' in x.safetensors, but x.safetensors does not hold it",
    ):
        open_checkpoint(d)
    (tmp_path / "y.safetensors").rename(d / "y.safetensors")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "x.safetensors", "b": "y.safetensors"}})
    )
    assert open_checkpoint(d).shards == ["x.safetensors", "y.safetensors"]
    (d / "config.json").write_text("{broken")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        open_checkpoint(d)


def test_single_non_standard_file_in_directory(tmp_path):
    d = tmp_path / "adapter"
    d.mkdir()
    save_file({"a": torch.ones(2)}, d / "adapter_model.safetensors")
    (d / "README.md").write_text("hi")
    ck = open_checkpoint(d)
    assert ck.shards == ["adapter_model.safetensors"] and ck.other_files == [Path("README.md")]
    copy_all(ck, tmp_path / "out")
    assert sorted(os.listdir(tmp_path / "out")) == ["README.md", "adapter_model.safetensors"]


def test_huge_header_length_is_refused_without_reading_it(tmp_path):
    p = tmp_path / "big.safetensors"
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", 200_000_000))
        f.truncate(200_000_100)  # sparse: a real header would not be this large
    with pytest.raises(CheckpointError, match="larger than 100 MB"):
        open_checkpoint(p)


def test_stale_temp_of_a_killed_run_is_removed(tmp_path):
    import subprocess
    import sys

    save_file({"a": torch.ones(2)}, tmp_path / "m.safetensors")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = tmp_path / f".o.safetensors.sparsetool-tmp-{int(dead.stdout)}-abcd"
    stale.write_bytes(b"half written")
    alive = tmp_path / f".o.safetensors.sparsetool-tmp-{os.getppid()}-beef"  # a running process
    alive.write_bytes(b"in progress")
    copy_all(open_checkpoint(tmp_path / "m.safetensors"), tmp_path / "o.safetensors")
    assert not stale.exists() and alive.exists()
