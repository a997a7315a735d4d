"""Invariants over many generated cases (hypothesis).

- The streaming writer's bytes equal safetensors.torch.save_file's for the same tensors and
  metadata (the reference orders ``__metadata__`` keys by a per-process random hash, so with
  two or more keys only the key order may differ; the test then compares the parsed header).
- encode -> write -> read gives back the masked tensor for every encoding and float dtype,
  pruned entries +0.0 (never -0.0).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save, save_file

from sparsetool.checkpoint import (
    ENCODINGS,
    TensorSpec,
    encode,
    encoded_specs,
    open_checkpoint,
    stored_nonzeros,
    write_checkpoint,
)
from sparsetool.checkpoint.dtypes import st_name
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.format import layout
from sparsetool.errors import SparsetoolError

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.complex64,
]
FLOATS = [torch.bfloat16, torch.float16, torch.float32]

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=12).filter(
    lambda s: s != "__metadata__"
)
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0,
        256,
        (int(torch.tensor(shape).prod()) * torch.empty((), dtype=dtype).element_size(),),
        generator=g,
        dtype=torch.uint8,
    )
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)  # arbitrary bit patterns, NaNs and -0.0 included


def _header(raw: bytes) -> tuple[int, dict]:
    (n,) = struct.unpack("<Q", raw[:8])
    return n, json.loads(raw[8 : 8 + n])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        names,
        st.tuples(st.sampled_from(DTYPES), shapes, st.integers(0, 2**16)),
        min_size=0,
        max_size=6,
    ),
    st.one_of(st.none(), st.dictionaries(names, st.text(max_size=6), max_size=3)),
)
def test_writer_bytes_equal_save_file(spec, metadata):
    if not spec and metadata == {}:
        metadata = None  # the reference writes invalid JSON ('{},"__metadata__":{}}') for this case
    tensors = {n: _tensor(dt, shape, seed) for n, (dt, shape, seed) in spec.items()}
    specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    with TemporaryDirectory() as d:
        d = Path(d)
        ref = save(tensors, metadata=metadata)
        src = d / "src.safetensors"
        src.write_bytes(ref)
        ck = open_checkpoint(src)
        if metadata is not None and not metadata:
            # the reader cannot tell "__metadata__": {} from no metadata
            ref = save(tensors)
        with (
            write_checkpoint(ck, d / "out.safetensors") as w,
            w.shard(ck.shards[0], list(reversed(specs))) as sw,
        ):
            for n in reversed(list(tensors)):  # any write order gives the same file
                sw.write(n, tensors[n])
        ours = (d / "out.safetensors").read_bytes()
        ck.close()
    if metadata is None or len(metadata) <= 1:
        assert ours == ref
    else:
        n_ours, h_ours = _header(ours)
        n_ref, h_ref = _header(ref)
        assert n_ours == n_ref and h_ours == h_ref
        assert list(h_ours)[1:] == list(h_ref)[1:]  # tensor order identical
        assert ours[8 + n_ours :] == ref[8 + n_ref :]


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(names, st.tuples(st.sampled_from(DTYPES), shapes), max_size=5),
    st.one_of(st.none(), st.dictionaries(names, st.text(max_size=4), max_size=1)),
)
def test_header_equals_reference_header(spec, metadata):
    if not spec and metadata == {}:
        metadata = None  # the reference writes invalid JSON for no tensors + empty metadata
    tensors = {n: torch.zeros(shape, dtype=dt) for n, (dt, shape) in spec.items()}
    header, _ = layout(
        [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()], metadata
    )
    assert save(tensors, metadata=metadata)[: len(header)] == header


def _masked_case(dtype, rows, cols, seed, density):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g).to(dtype)
    w[torch.rand(rows, cols, generator=g) < 0.15] = -0.0  # signed zeros, kept or pruned
    mask = torch.rand(rows, cols, generator=g) < density
    return w, mask


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(ENCODINGS),
    st.sampled_from(FLOATS),
    st.integers(1, 6),
    st.integers(1, 19),
    st.integers(0, 2**16),
    st.sampled_from([0.0, 0.3, 0.7, 1.0]),
    st.booleans(),
)
def test_encode_write_read_round_trip(encoding, dtype, rows, cols, seed, density, premasked):
    w, mask = _masked_case(dtype, rows, cols, seed, density)
    # masked by the caller (pruned entries may be -0.0: negative weights times 0) or not at all
    dense = w * mask if premasked else w.clone()
    before = dense.clone()
    expected = w.masked_fill(~mask, 0)
    with TemporaryDirectory() as d:
        d = Path(d)
        save_file({"blk.fc.weight": torch.zeros(rows, cols, dtype=dtype)}, d / "in.safetensors")
        ck = open_checkpoint(d / "in.safetensors")
        nnz = stored_nonzeros(dense, mask)
        with (
            write_checkpoint(ck, d / "out.safetensors") as wr,
            wr.shard(
                ck.shards[0], encoded_specs("blk.fc.weight", dtype, (rows, cols), nnz, encoding)
            ) as sw,
        ):
            for name, t in encode("blk.fc.weight", dense, mask, encoding):
                sw.write(name, t)
        assert torch.equal(dense.view(torch.uint8), before.view(torch.uint8))  # input untouched
        out = open_checkpoint(d / "out.safetensors")
        (lt,) = out.logical
        got, got_mask = decode(out, lt)
    assert lt.name == "blk.fc.weight" and lt.shape == (rows, cols) and lt.dtype == dtype
    assert torch.equal(got, expected)
    # pruned entries are +0.0, bit for bit
    assert not torch.signbit(got[~mask]).any()
    if encoding == "zeros":
        assert got_mask is None
        # kept entries keep their exact bits, -0.0 included
        assert torch.equal(
            got.view(torch.int16 if dtype != torch.float32 else torch.int32)[mask],
            w.view(torch.int16 if dtype != torch.float32 else torch.int32)[mask],
        )
    elif encoding == "bitmask":
        assert torch.equal(
            got_mask, mask & (w != 0)
        )  # kept zeros are not stored, as in compressed-tensors
    elif encoding == "nan" and mask.all():
        assert got_mask is None  # nothing pruned: no NaN, so nothing marks it as nan-encoded
    else:
        assert torch.equal(got_mask, mask)


@settings(max_examples=25, deadline=None)
@given(
    st.sampled_from(ENCODINGS),
    st.sampled_from(FLOATS),
    st.integers(1, 4),
    st.integers(1, 9),
    st.integers(0, 999),
)
def test_no_mask_means_nothing_pruned(encoding, dtype, rows, cols, seed):
    w, _ = _masked_case(dtype, rows, cols, seed, 1.0)
    parts = dict(encode("m.weight", w, None, encoding))
    specs = encoded_specs("m.weight", dtype, (rows, cols), stored_nonzeros(w, None), encoding)
    assert [s.name for s in specs] == list(parts)
    for s in specs:
        assert st_name(parts[s.name].dtype) == s.dtype and tuple(parts[s.name].shape) == s.shape
    if encoding in ("zeros", "nan"):
        assert parts["m.weight"] is w or torch.equal(parts["m.weight"], w)
    if encoding == "mask":
        assert parts["m.weight_mask"].all()


def test_nan_encoding_refuses_kept_nan():
    w = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    try:
        encode("x.weight", w, torch.tensor([[True, True], [False, True]]), "nan")
    except SparsetoolError as e:
        assert "x.weight" in str(e) and "NaN" in str(e)
    else:
        raise AssertionError("kept NaN was accepted")
    # a NaN at a pruned position is fine: it is pruned anyway
    ((name, t),) = encode("x.weight", w, torch.tensor([[True, False], [True, True]]), "nan")
    assert torch.isnan(t).tolist() == [[False, True], [False, False]]


def test_unknown_encoding():
    try:
        encode("x.weight", torch.ones(2, 2), None, "zip")
    except SparsetoolError as e:
        assert "zeros, mask, nan, bitmask" in str(e)
    else:
        raise AssertionError("unknown encoding accepted")
