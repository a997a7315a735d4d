"""The safetensors file format: header parsing with full validation, header building.

Imports neither torch nor numpy (dtypes come from ``checkpoint.dtypes``; a torch dtype is looked
up only when a caller asks an entry for it), so ``sparsetool flops`` can list a checkpoint cheaply.

A safetensors file is ``u64 little-endian header length N`` + ``N bytes of JSON`` + a data
section. The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [start, end]}``
(offsets relative to the data section) and may hold ``"__metadata__"`` (str -> str).

The header we *write* reproduces the reference serializer byte for byte: tensors ordered by
descending dtype rank, then by name; ``__metadata__`` first; compact JSON; the header padded with
spaces to a multiple of 8 bytes so every tensor starts 8-aligned.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparsetool.checkpoint import dtypes, gguf_file, pickled
from sparsetool.errors import CheckpointError

if TYPE_CHECKING:
    import torch

# Types a file may hold: those torch can address (F4/F6 rank but cannot be read).
_READABLE = {d.st for d in dtypes.BY_ST.values() if d.torch_name}

# The reference reader refuses headers above 100 MB; so do we (a corrupt length field would
# otherwise make us allocate gigabytes).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class TensorSpec:
    """What the writer needs to know about a stored tensor before any data is written."""

    name: str
    dtype: torch.dtype | str  # a torch dtype or a safetensors name ("BF16")
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtypes.itemsize(self.dtype)


@dataclass(frozen=True)
class StoredTensor:
    """One entry of a safetensors header: where a stored tensor's bytes are."""

    name: str
    st_dtype: str  # safetensors name, e.g. "BF16"
    shape: tuple[int, ...]
    shard: str
    start: int  # absolute file offset of the first byte
    end: int  # absolute file offset one past the last byte

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype (imports torch; header validation made sure it exists)."""
        return dtypes.to_torch(self.st_dtype)

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class Header:
    metadata: dict[str, str]
    tensors: list[StoredTensor]  # in file (offset) order
    data_start: int
    file_size: int


def st_dtype_name(dtype: torch.dtype | str) -> str:
    """safetensors name of a torch dtype, e.g. ``torch.bfloat16 -> "BF16"``."""
    try:
        return dtypes.st_name(dtype)
    except KeyError:
        raise CheckpointError(f"dtype {dtype} cannot be stored in safetensors") from None


def read_header(path: Path, shard: str | None = None) -> Header:
    """Parse and validate the header of one safetensors file; CheckpointError naming the file.

    Checks: the length prefix, UTF-8 JSON object, each entry's dtype/shape/offsets, offsets that
    tile the data section exactly (no overlap, no hole, nothing past or short of the file end),
    and ``end - start == numel * itemsize``.
    """
    shard = shard if shard is not None else path.name
    where = str(path)
    size, prefix, n, raw = _read_raw_header(path)
    obj = _header_object(path, prefix, raw)
    metadata = _metadata(where, obj)
    data_start = 8 + n
    entries = [_entry(where, name, info) for name, info in obj.items()]
    tensors = _tile(where, entries, shard, data_start, size)
    return Header(metadata, tensors, data_start, size)


_Entry = tuple[int, int, str, str, tuple[int, ...]]
"""One header entry as read: (start, end) in the data section, name, dtype, shape."""


def _read_raw_header(path: Path) -> tuple[int, bytes, int, bytes]:
    """The file's size, its first 8 bytes, the header's length and its bytes, the length
    prefix checked (a GGUF or PyTorch file named as such)."""
    where = str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            gguf = gguf_file.file_error(path, prefix)  # never a valid safetensors start
            if gguf is not None:
                raise gguf
            if len(prefix) < 8:
                raise pickled.file_error(path, prefix) or CheckpointError(
                    f"{where}: not a safetensors file (only {size} bytes; a safetensors file "
                    "starts with an 8-byte header length). Is the file truncated?"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > size - 8:
                raise pickled.file_error(path, prefix) or CheckpointError(
                    f"{where}: header length {n} exceeds the file size {size}: the file is "
                    "truncated or not a safetensors file"
                )
            if n > MAX_HEADER_BYTES:
                raise pickled.file_error(path, prefix) or CheckpointError(
                    f"{where}: header of {n} bytes is larger than 100 MB: not a safetensors file"
                )
            raw = f.read(n)
    except OSError as e:
        raise CheckpointError(f"{where}: cannot read ({e.strerror or e})") from None
    return size, prefix, n, raw


def _header_object(path: Path, prefix: bytes, raw: bytes) -> dict:
    """The header's bytes as a JSON object (UTF-8 text starting with '{')."""
    where = str(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise pickled.file_error(path, prefix) or CheckpointError(
            f"{where}: header is not UTF-8 text: not a safetensors file"
        ) from None
    if not text.startswith("{"):
        raise pickled.file_error(path, prefix) or CheckpointError(
            f"{where}: header does not start with '{{': not a safetensors file"
        )
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"{where}: header is not valid JSON ({e.msg} at byte {e.pos}): the file is corrupt"
        ) from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: header is not a JSON object: the file is corrupt")
    return obj


def _metadata(where: str, obj: dict) -> dict[str, str]:
    """``__metadata__`` taken out of the header object (str -> str; empty without one)."""
    metadata: dict[str, str] = {}
    raw_meta = obj.pop("__metadata__", None)
    if raw_meta is not None:
        if not isinstance(raw_meta, dict) or not all(isinstance(v, str) for v in raw_meta.values()):
            raise CheckpointError(f"{where}: __metadata__ must map strings to strings")
        metadata = dict(raw_meta)
    return metadata


def _entry(where: str, name: str, info: object) -> _Entry:
    """One tensor's entry checked: its dtype, shape and offsets, and a size that fits them."""
    if not isinstance(info, dict):
        raise CheckpointError(f"{where}: header entry for tensor {name!r} is not an object")
    dt = info.get("dtype")
    shape = info.get("shape")
    offs = info.get("data_offsets")
    if not isinstance(dt, str):
        raise CheckpointError(f"{where}: tensor {name!r} has no dtype")
    if dt not in _READABLE:
        known = ", ".join(sorted(_READABLE))
        raise CheckpointError(
            f"{where}: tensor {name!r} has unknown or unsupported dtype {dt!r} (known: {known})"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise CheckpointError(f"{where}: tensor {name!r} has an invalid shape {shape!r}")
    if (
        not isinstance(offs, list)
        or len(offs) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)
        or offs[1] < offs[0]
    ):
        raise CheckpointError(f"{where}: tensor {name!r} has invalid data_offsets {offs!r}")
    expect = math.prod(shape) * dtypes.BY_ST[dt].itemsize
    if offs[1] - offs[0] != expect:
        raise CheckpointError(
            f"{where}: tensor {name!r} ({dt} {shape}) should take {expect} bytes but its "
            f"data_offsets {offs} give {offs[1] - offs[0]}: the header lies about sizes"
        )
    return (offs[0], offs[1], name, dt, tuple(shape))


def _tile(
    where: str, entries: list[_Entry], shard: str, data_start: int, size: int
) -> list[StoredTensor]:
    """The entries in file order, checked to tile the data section exactly (no overlap, no hole,
    nothing past or short of the file end)."""
    entries.sort(key=lambda e: (e[0], e[1]))
    pos = 0
    tensors: list[StoredTensor] = []
    for s, end, name, dtype, shape in entries:
        if s < pos:
            raise CheckpointError(
                f"{where}: tensor {name!r} overlaps the previous tensor (starts at {s}, previous "
                f"ends at {pos}): corrupt header"
            )
        if s > pos:
            raise CheckpointError(
                f"{where}: hole of {s - pos} bytes before tensor {name!r} in the data section: "
                "corrupt header"
            )
        pos = end
        tensors.append(StoredTensor(name, dtype, shape, shard, data_start + s, data_start + end))
    data_len = size - data_start
    if pos > data_len:
        raise CheckpointError(
            f"{where}: header says the data section has {pos} bytes but the file holds only "
            f"{data_len}: the file is truncated"
        )
    if pos < data_len:
        raise CheckpointError(
            f"{where}: {data_len - pos} bytes after the last tensor are not described by the "
            "header: corrupt file"
        )
    return tensors


def layout(
    specs: list[TensorSpec], metadata: dict[str, str] | None
) -> tuple[bytes, dict[str, int]]:
    """The header bytes (length prefix included) and each tensor's offset in the data section.

    Same bytes as the reference serializer: sort by (descending dtype rank, name), compact JSON
    with ``__metadata__`` first, space padding to a multiple of 8.

    >>> import torch
    >>> h, offs = layout(
    ...     [TensorSpec("b", torch.float32, (2,)), TensorSpec("a", torch.bool, (3,))], None
    ... )
    >>> header = h[8:].decode()
    >>> header[:54], header[54:]
    ('{"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},',
     '"a":{"dtype":"BOOL","shape":[3],"data_offsets":[8,11]}}      ')
    >>> offs
    {'b': 0, 'a': 8}
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise CheckpointError(f"tensor names written twice to one shard: {', '.join(dup)}")
    ordered = sorted(specs, key=lambda s: (-dtypes.RANK[st_dtype_name(s.dtype)], s.name))
    parts = []
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise CheckpointError(f"safetensors metadata must be strings: {k!r}: {v!r}")
        parts.append('"__metadata__":' + _dumps(metadata))
    offsets: dict[str, int] = {}
    pos = 0
    for s in ordered:
        n = s.nbytes
        offsets[s.name] = pos
        shape = "[" + ",".join(str(int(d)) for d in s.shape) + "]"
        parts.append(
            f'{_dumps(s.name)}:{{"dtype":"{st_dtype_name(s.dtype)}","shape":{shape},'
            f'"data_offsets":[{pos},{pos + n}]}}'
        )
        pos += n
    body = ("{" + ",".join(parts) + "}").encode("utf-8")
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, offsets


def _dumps(obj: object) -> str:
    # Escapes exactly what serde_json escapes: '"', '\\' and control characters below 0x20
    # (short forms \b \t \n \f \r, else \u00xx lower-case); everything else stays raw UTF-8.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def add_metadata(path: Path, extra: dict[str, str]) -> None:
    """Rewrite the safetensors file ``path`` with ``extra`` added to its ``__metadata__`` (the
    tensors' bytes copied as they are, the header rebuilt and padded to 8 bytes): into a file
    beside it, then renamed over it. For a file the caller has just written and owns."""
    import os
    import shutil

    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        header["__metadata__"] = {**(header.get("__metadata__") or {}), **extra}
        meta = header.pop("__metadata__")
        body = _dumps({"__metadata__": meta, **header}).encode("utf-8")
        body += b" " * (-len(body) % 8)
        tmp = path.with_name(path.name + ".metadata")
        with open(tmp, "wb") as out:
            out.write(struct.pack("<Q", len(body)) + body)
            shutil.copyfileobj(f, out, 1 << 24)
    os.replace(tmp, path)
