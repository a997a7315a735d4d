"""prune's output bytes, pinned: every variant's digest in ``prune_digests.json``.

Each variant prunes a checkpoint made here with numpy alone (fixed seeds, bit patterns written
straight into a safetensors file, so no torch conversion sits between the seed and the bytes) and
hashes what prune wrote: the header without the version (every tensor's dtype, shape and offsets in
file order, the metadata with the ``sparsetool`` entry's ``version`` fields dropped) and every
stored tensor's bytes, plus a sharded output's index. The ``--json`` result's per-tensor counts are
recorded beside the hash, so a failure says which tensor moved.

Variants, for every float dtype prune takes (BF16, F16, F32, F64, F8_E4M3, F8_E5M2, F8_E4M3FNUZ,
F8_E5M2FNUZ): sparsity 0.75 in each encoding, global scope (zeros, bitmask), N:M 2:4,
``--fraction``, random, ERK; the mask, nan and bitmask 0.75 outputs pruned again in their encoding
(``--fraction 0.5``, and ``--scope global --fraction 0.3``); a Hugging Face sharded BF16 directory.
The BF16 and F32 inputs hold one tensor above 2**20 entries, so the kernel's chunked paths run.
Inputs hold ties, +0.0 and -0.0, and never NaN or inf.

Regenerate with ``python tests/ops/prune/test_prune_bytes.py --regenerate`` ONLY when a change of
prune's output bytes is intended, and say in the commit which variants changed and why. A rewrite
of prune's engine must leave this file untouched.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

DIGESTS = Path(__file__).with_name("prune_digests.json")

# ----------------------------------------------------------------------------- inputs (numpy only)
DTYPES = ("BF16", "F16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
BIG = ("BF16", "F32")  # these inputs hold one targeted tensor of 1024 x 1200 (> 2**20 keys)
_SIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8} | {dt: 1 for dt in DTYPES if dt.startswith("F8")}
# fp8 patterns that are NaN or inf (the FNUZ types have one NaN, 0x80, where -0.0 would be)
_FP8_BAD = {
    "F8_E4M3": {0x7F, 0xFF},
    "F8_E5M2": set(range(0x7C, 0x80)) | set(range(0xFC, 0x100)),
    "F8_E4M3FNUZ": {0x80},
    "F8_E5M2FNUZ": {0x80},
}
_EXPONENT = {"BF16": 0x7F80, "F16": 0x7C00, "F32": 0x7F800000, "F64": 0x7FF0000000000000}


def write_safetensors(
    path: Path,
    tensors: dict[str, tuple[str, tuple[int, ...], np.ndarray]],
    metadata: dict[str, str] | None = None,
) -> None:
    """A safetensors file from ``name -> (dtype, shape, bits)``, the bits an unsigned integer array
    of the dtype's item size; tensors stored in the given order, offsets contiguous."""
    header: dict = {"__metadata__": metadata} if metadata else {}
    blobs, offset = [], 0
    for name, (dtype, shape, bits) in tensors.items():
        blob = np.ascontiguousarray(bits).astype(bits.dtype.newbyteorder("<"), copy=False).tobytes()
        assert len(blob) == int(np.prod(shape, dtype=np.int64)) * _SIZE[dtype], name
        header[name] = {
            "dtype": dtype,
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def _fp8_bits(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """Random fp8 bytes, never NaN or inf; ~10% +0.0 and a few -0.0 where the type has one (ties
    come by themselves: 256 patterns)."""
    good = np.array([b for b in range(256) if b not in _FP8_BAD[dtype]], dtype=np.uint8)
    bits = good[rng.integers(0, len(good), n)]
    bits[rng.random(n) < 0.10] = 0x00
    if 0x80 not in _FP8_BAD[dtype]:
        bits[rng.choice(n, size=max(1, n // 200), replace=False)] = 0x80
    return bits


def float_bits(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Bit patterns of ``shape`` in ``dtype``: normal * 0.02, a third rounded to a coarse grid
    (ties), ~10% +0.0 and a few -0.0; all finite."""
    n = int(np.prod(shape))
    if dtype.startswith("F8"):
        return _fp8_bits(rng, n, dtype).reshape(shape)
    x = (rng.standard_normal(n) * 0.02).astype(np.float32)
    grid = rng.random(n) < 0.33
    x[grid] = np.round(x[grid] / 0.004).astype(np.float32) * np.float32(0.004)
    x[rng.random(n) < 0.10] = 0.0
    x[rng.choice(n, size=max(1, n // 200), replace=False)] = -0.0
    if dtype == "F32":
        bits = x.view(np.uint32)
    elif dtype == "F64":
        bits = x.astype(np.float64).view(np.uint64)
    elif dtype == "F16":
        bits = x.astype(np.float16).view(np.uint16)
    else:  # BF16: the top 16 bits of the fp32 pattern, rounded to nearest even
        u = x.view(np.uint32).astype(np.uint64)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    exponent = bits.dtype.type(_EXPONENT[dtype])
    assert ((bits & exponent) != exponent).all(), "no NaN or inf in a fresh input"
    return bits.reshape(shape)


def gpt2_tensors(dtype: str, seed: int, *, big: bool = False, d: int = 64, vocab: int = 96):
    """GPT-2-named tensors (Conv1D weights stored (in, out)), two layers, in ``name -> (dtype,
    shape, bits)`` order: embeddings, then per layer norms, weights and biases; with ``big`` a
    third layer whose c_fc weight is 1024 x 1200."""
    rng = np.random.default_rng(seed)
    out: dict = {}

    def add(name, *shape):
        out[name] = (dtype, shape, float_bits(rng, shape, dtype))

    add("transformer.wte.weight", vocab, d)
    add("transformer.wpe.weight", 32, d)
    for i in range(2):
        p = f"transformer.h.{i}."
        add(p + "ln_1.weight", d)
        add(p + "attn.c_attn.weight", d, 3 * d)
        add(p + "attn.c_attn.bias", 3 * d)
        add(p + "attn.c_proj.weight", d, d)
        add(p + "attn.c_proj.bias", d)
        add(p + "ln_2.weight", d)
        add(p + "mlp.c_fc.weight", d, 4 * d)
        add(p + "mlp.c_fc.bias", 4 * d)
        add(p + "mlp.c_proj.weight", 4 * d, d)
        add(p + "mlp.c_proj.bias", d)
    if big:
        add("transformer.h.2.mlp.c_fc.weight", 1024, 1200)
    add("transformer.ln_f.weight", d)
    return out


def make_input(key: str, root: Path) -> Path:
    """The input ``key`` names: one file per dtype, or ``sharded`` (a BF16 directory in 2
    shards)."""
    if key == "sharded":
        path = root / "sharded"
        path.mkdir()
        tensors = gpt2_tensors("BF16", seed=100)
        names = list(tensors)
        half = len(names) // 2
        weight_map = {}
        for k, part in enumerate((names[:half], names[half:]), start=1):
            shard = f"model-{k:05d}-of-00002.safetensors"
            write_safetensors(path / shard, {n: tensors[n] for n in part}, {"format": "pt"})
            weight_map |= dict.fromkeys(part, shard)
        total = sum(int(np.prod(s)) * 2 for _, s, _ in tensors.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        return path
    path = root / f"{key}.safetensors"
    write_safetensors(
        path, gpt2_tensors(key, seed=DTYPES.index(key), big=key in BIG), {"format": "pt"}
    )
    return path


# ----------------------------------------------------------------------------- variants
def _variants() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``id -> (source, prune options)``: the source is an input key or another variant's id."""
    v: dict[str, tuple[str, tuple[str, ...]]] = {}
    for dt in DTYPES:
        for enc in ("zeros", "mask", "nan", "bitmask"):
            v[f"{dt}/s0.75-{enc}"] = (dt, ("--sparsity", "0.75", "--encoding", enc))
        for enc in ("zeros", "bitmask"):
            v[f"{dt}/global-s0.6-{enc}"] = (
                dt,
                ("--scope", "global", "--sparsity", "0.6", "--encoding", enc),
            )
        v[f"{dt}/nm2:4"] = (dt, ("--nm", "2:4"))
        v[f"{dt}/fraction0.5"] = (dt, ("--fraction", "0.5"))
        v[f"{dt}/random-s0.75-seed3"] = (
            dt,
            ("--method", "random", "--sparsity", "0.75", "--seed", "3"),
        )
        v[f"{dt}/erk-s0.7"] = (dt, ("--distribution", "erk", "--sparsity", "0.7"))
        for enc in ("mask", "nan", "bitmask"):
            v[f"{dt}/s0.75-{enc}+fraction0.5"] = (
                f"{dt}/s0.75-{enc}",
                ("--fraction", "0.5", "--encoding", enc),
            )
            v[f"{dt}/s0.75-{enc}+global-fraction0.3"] = (
                f"{dt}/s0.75-{enc}",
                ("--scope", "global", "--fraction", "0.3", "--encoding", enc),
            )
    v["sharded-BF16/s0.5"] = ("sharded", ("--sparsity", "0.5"))
    return v


VARIANTS = _variants()


class Outputs:
    """Every variant's output, made once on first use (a composed variant prunes its source's)."""

    def __init__(self, root: Path):
        self.root = root
        self.inputs: dict[str, Path] = {}
        self.made: dict[str, tuple[Path, dict]] = {}

    def source(self, key: str) -> Path:
        if key in VARIANTS:
            return self.get(key)[0]
        if key not in self.inputs:
            self.inputs[key] = make_input(key, self.root)
        return self.inputs[key]

    def get(self, vid: str) -> tuple[Path, dict]:
        if vid not in self.made:
            from helpers import run

            src_key, opts = VARIANTS[vid]
            src = self.source(src_key)
            name = vid.replace("/", "__").replace(":", "-")
            out = self.root / (name if src.is_dir() else name + ".safetensors")
            r = run("prune", src, "-o", out, *opts, "--json", "-q")
            assert r.exit_code == 0, f"{vid}: {r.output}"
            self.made[vid] = (out, json.loads(r.stdout))
        return self.made[vid]


# ----------------------------------------------------------------------------- digests
def _without_version(entry):
    if isinstance(entry, dict):
        return {k: _without_version(v) for k, v in entry.items() if k != "version"}
    if isinstance(entry, list):
        return [_without_version(v) for v in entry]
    return entry


def _hash_file(h, path: Path) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    meta = dict(header.pop("__metadata__", None) or {})
    if "sparsetool" in meta:
        meta["sparsetool"] = _without_version(json.loads(meta["sparsetool"]))
    h.update(json.dumps(meta, sort_keys=True).encode())
    h.update(json.dumps(list(header.items())).encode())  # file order, dtypes, shapes, offsets
    assert max((e["data_offsets"][1] for e in header.values()), default=0) == len(data), path
    for name in sorted(header):
        e = header[name]
        start, end = e["data_offsets"]
        h.update(json.dumps([name, e["dtype"], e["shape"]]).encode())
        h.update(data[start:end])


def digest(path: Path) -> str:
    """sha256 of what prune wrote at ``path`` (a file or a directory), the version left out."""
    h = hashlib.sha256()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    for f in files:
        h.update(f.name.encode())
        if f.suffix == ".safetensors":
            _hash_file(h, f)
        elif f.name.endswith(".index.json"):
            index = json.loads(f.read_text())
            h.update(
                json.dumps([index.get("metadata"), index["weight_map"]], sort_keys=True).encode()
            )
        else:
            h.update(f.read_bytes())
    return h.hexdigest()


def counts(result: dict) -> dict:
    """The ``--json`` result's per-tensor counts, ``name -> [non-zeros before, after, total]``."""
    return {t["name"]: [t["nonzero_before"], t["nonzero"], t["numel"]] for t in result["tensors"]}


def record(outputs: Outputs, vid: str) -> dict:
    path, result = outputs.get(vid)
    return {"sha256": digest(path), "tensors": counts(result)}


# ----------------------------------------------------------------------------- the test
@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Outputs:
    return Outputs(tmp_path_factory.mktemp("prune-bytes"))


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(DIGESTS.read_text())


def test_the_digest_file_lists_every_variant(expected):
    assert sorted(expected) == sorted(VARIANTS)


@pytest.mark.parametrize("vid", sorted(VARIANTS))
def test_prune_writes_the_recorded_bytes(outputs, expected, vid):
    got = record(outputs, vid)
    assert got["tensors"] == expected[vid]["tensors"], f"{vid}: the counts changed"
    assert got["sha256"] == expected[vid]["sha256"], f"{vid}: the bytes changed"


def regenerate() -> None:
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for helpers
    with tempfile.TemporaryDirectory() as tmp:
        outputs = Outputs(Path(tmp))
        table = {vid: record(outputs, vid) for vid in sorted(VARIANTS)}
    DIGESTS.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(table)} digests to {DIGESTS}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit(f"usage: python {sys.argv[0]} --regenerate  (only for an intended byte change)")
    regenerate()
