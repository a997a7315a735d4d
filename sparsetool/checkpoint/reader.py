"""Open a checkpoint, validate every header up front, and read one logical tensor at a time.

Reading is streaming: each call maps (or reads) exactly one stored tensor's byte range, so peak
memory is a few tensors, never the checkpoint.

Opening and :meth:`Checkpoint.read_array` (the raw values of a stored tensor as a numpy array)
do not import torch: ``prune`` (but its calibration methods), ``report`` and ``densify`` never
load it. ``read_stored`` (a torch tensor) does.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sparsetool.checkpoint import dtypes
from sparsetool.checkpoint.format import Header, StoredTensor, read_header
from sparsetool.checkpoint.layout import Layout, locate
from sparsetool.errors import CheckpointError

if TYPE_CHECKING:
    import torch

MASK_SUFFIX = "_mask"
"""A bool or uint8 tensor ``<name>_mask`` beside ``<name>`` is its mask (the ``mask`` encoding)."""
BITMASK_PARTS = ("shape", "compressed", "bitmask", "row_offsets")
"""The stored tensors ``<module>.<part>`` of one compressed-tensors bitmask group."""


@dataclass
class LogicalTensor:
    """One weight as the user sees it, however it is stored."""

    name: str  # e.g. "h.0.attn.c_attn.weight" (a bitmask group: "<module>.weight")
    st_dtype: str  # safetensors name of the values' type, e.g. "BF16"
    shape: tuple[int, ...]  # the dense shape
    encoding: str  # "plain" | "mask" | "bitmask" (nan is only known from the data)
    shard: str  # shard file name holding it
    stored: tuple[str, ...]  # stored tensors that make it up
    nbytes: int  # bytes those stored tensors take on disk

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the values (imports torch)."""
        return dtypes.to_torch(self.st_dtype)

    @property
    def floating(self) -> bool:
        """A float type with a zero (what prune targets), without importing torch."""
        return dtypes.is_floating(self.st_dtype)

    @property
    def compressed(self) -> bool:
        """Stored as compressed-tensors groups (the bitmask encoding), which config.json
        declares."""
        return self.encoding == "bitmask"


class Checkpoint:
    """A safetensors file or Hugging Face directory, opened and validated."""

    def __init__(self, lay: Layout, headers: dict[str, Header], config: dict | None):
        self.path = lay.path
        self.is_dir = lay.is_dir
        self.shards = list(lay.shards)
        self.other_files = list(lay.other_files)
        self.left_out = list(lay.left_out)
        self.config = config
        self.index_name = lay.index_name
        self.index = lay.index
        self._headers = headers
        self._entries: dict[str, StoredTensor] = {}
        for shard in self.shards:
            for st in headers[shard].tensors:
                if st.name in self._entries:
                    raise CheckpointError(
                        f"{self.path}: tensor {st.name!r} is stored in both "
                        f"{self._entries[st.name].shard} and {shard}"
                    )
                self._entries[st.name] = st
        if lay.index is not None:
            self._check_index(lay, lay.index)
        self._fds: dict[str, int] = {}
        self.logical: list[LogicalTensor] = self._group()

    # ----------------------------------------------------------------- introspection
    def shard_path(self, shard: str) -> Path:
        return self.path / shard if self.is_dir else self.path

    def metadata(self, shard: str | None = None) -> dict[str, str]:
        """The ``__metadata__`` of one shard (default: the first, where provenance is read)."""
        if shard is None:
            if not self.shards:
                return {}
            shard = self.shards[0]
        return dict(self._headers[shard].metadata)

    def entries(self, shard: str | None = None) -> list[StoredTensor]:
        """Stored tensors (header entries) of one shard, or all, in file order."""
        shards = [shard] if shard is not None else self.shards
        return [st for s in shards for st in self._headers[s].tensors]

    def entry(self, name: str) -> StoredTensor:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no stored tensor named {name!r}") from None

    def logical_in(self, shard: str) -> list[LogicalTensor]:
        return [lt for lt in self.logical if lt.shard == shard]

    @property
    def nbytes_on_disk(self) -> int:
        return sum(self._headers[s].file_size for s in self.shards)

    # ----------------------------------------------------------------- reading
    def read_stored(self, name: str) -> torch.Tensor:
        """One stored tensor exactly as on disk: a writable CPU tensor of its own.

        The bytes are mapped copy-on-write from the page cache (:meth:`read_array` with
        ``writable``: no copy until someone writes to the tensor, and unmapped when the tensor is
        freed); where mapping is impossible they are read with ``preadv``.
        """
        import torch

        st = self.entry(name)
        if st.nbytes == 0:
            return torch.empty(st.shape, dtype=st.dtype)
        return (
            torch.from_numpy(self.read_array(name, writable=True)).view(st.dtype).reshape(st.shape)
        )

    def read_array(self, name: str, *, writable: bool = False) -> np.ndarray:
        """One stored tensor's bytes as a flat numpy array, without torch: floats as signed
        integers of their width (their bit patterns), bool as uint8, other integers as
        themselves. Mapped from the page cache, read-only; ``writable`` maps it copy-on-write
        instead (a page is copied only when written). A copy only where mapping is impossible."""
        st = self.entry(name)
        kind = np.dtype(
            _NUMPY_VIEW.get(st.st_dtype) or dtypes.INT_VIEW[dtypes.itemsize(st.st_dtype)]
        )
        if st.nbytes == 0:
            return np.empty(0, dtype=kind)
        fd = self.shard_fd(st.shard)
        start = st.start - st.start % mmap.ALLOCATIONGRANULARITY
        flags, prot = (
            (mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
            if writable
            else (mmap.MAP_SHARED, mmap.PROT_READ)
        )
        try:
            mm = mmap.mmap(fd, st.end - start, flags=flags, prot=prot, offset=start)
        except (OSError, ValueError):
            data = bytearray(st.nbytes)
            view = memoryview(data)
            got = 0
            while got < st.nbytes:
                n = os.preadv(fd, [view[got:]], st.start + got)
                if n <= 0:
                    raise CheckpointError(
                        f"{self.shard_path(st.shard)}: file shrank while reading tensor {name!r}"
                    ) from None
                got += n
            array = np.frombuffer(data, dtype=kind)
            if not writable:
                array.flags.writeable = False
            return array
        return np.frombuffer(mm, dtype=kind, count=st.numel, offset=st.start - start)

    def shard_fd(self, shard: str) -> int:
        """The read-only file descriptor of ``shard``, opened on first use and kept until
        :meth:`close` (one per shard, whichever thread asks first): for ``pread`` and
        ``copy_file_range``, e.g. a writer copying stored bytes unchanged. The caller must not
        close it."""
        fd = self._fds.get(shard)
        if fd is None:
            try:
                fd = os.open(self.shard_path(shard), os.O_RDONLY)
            except OSError as e:
                raise CheckpointError(
                    f"{self.shard_path(shard)}: cannot open ({e.strerror})"
                ) from None
            kept = self._fds.setdefault(shard, fd)  # another thread may have opened it meanwhile
            if kept != fd:
                os.close(fd)
            fd = kept
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    def _check_index(self, lay: Layout, index: dict) -> None:
        index_path = self.path / (lay.index_name or "")
        for name, shard in index["weight_map"].items():
            st = self._entries.get(name)
            if st is None:
                raise CheckpointError(
                    f"{index_path}: names tensor {name!r} in {shard}, but {shard} does not hold "
                    "it; fix the index"
                )
            if st.shard != shard:
                raise CheckpointError(
                    f"{index_path}: says tensor {name!r} is in {shard}, but it is in {st.shard}"
                )
        unlisted = [st for st in self._entries.values() if st.name not in index["weight_map"]]
        if unlisted:
            st = unlisted[0]
            more = f" (and {len(unlisted) - 1} more)" if len(unlisted) > 1 else ""
            raise CheckpointError(
                f"{index_path}: does not list tensor {st.name!r}{more}, which {st.shard} holds; "
                "loaders would skip it. Add it to the index's weight_map, or drop it from "
                f"{st.shard}"
            )

    def _group(self) -> list[LogicalTensor]:
        """Group stored tensors into logical ones: plain, weight + ``_mask``, bitmask groups."""
        e = self._entries
        member_of: dict[str, str] = {}  # stored name -> owning logical key
        groups: dict[str, LogicalTensor] = {}
        for name in e:
            if name.endswith(".compressed"):
                prefix = name[: -len(".compressed")]
                parts = [f"{prefix}.{p}" for p in BITMASK_PARTS]
                if all(p in e for p in parts):
                    groups[name] = self._bitmask_lt(prefix, parts)
                    for p in parts:
                        member_of[p] = name
        for name, st in e.items():
            if name in member_of or not name.endswith(MASK_SUFFIX):
                continue
            base = name[: -len(MASK_SUFFIX)]
            if base in e and base not in member_of and st.st_dtype in ("BOOL", "U8"):
                w = e[base]
                groups[base] = LogicalTensor(
                    base, w.st_dtype, w.shape, "mask", w.shard, (base, name), w.nbytes + st.nbytes
                )
                member_of[base] = base
                member_of[name] = base
        pos = {
            st.name: (si, i)
            for si, sh in enumerate(self.shards)
            for i, st in enumerate(self._headers[sh].tensors)
        }

        def anchor(lt: LogicalTensor) -> tuple[int, int]:
            # file position of the group's first member inside the group's own shard
            return min(pos[n] for n in lt.stored if e[n].shard == lt.shard)

        out = list(groups.values())
        for name, st in e.items():
            if name not in member_of:
                out.append(
                    LogicalTensor(
                        name, st.st_dtype, st.shape, "plain", st.shard, (name,), st.nbytes
                    )
                )
        out.sort(key=anchor)
        seen: dict[str, LogicalTensor] = {}
        for lt in out:
            if lt.name in seen:
                a, b = seen[lt.name], lt
                raise CheckpointError(
                    f"{self.path}: two stored forms of {lt.name!r}: {', '.join(a.stored)} and "
                    f"{', '.join(b.stored)}; keep one of them"
                )
            seen[lt.name] = lt
        return out

    def _bitmask_lt(self, prefix: str, parts: list[str]) -> LogicalTensor:
        from sparsetool.checkpoint import bitmask as bm

        e = self._entries
        shape_st, comp, bits, offs = (e[p] for p in parts)
        where = str(self.shard_path(comp.shard))
        if shape_st.st_dtype not in ("I64", "I32") or len(shape_st.shape) != 1:
            raise CheckpointError(f"{where}: {prefix}.shape must be a 1-D integer tensor")
        shape = [int(x) for x in self.read_array(shape_st.name).tolist()]
        if any(d < 0 for d in shape):
            raise CheckpointError(f"{where}: {prefix}.shape holds a negative size {shape}")
        bm.check_parts(prefix, shape, comp.shape, bits.shape, where)
        if bits.st_dtype != "U8":
            raise CheckpointError(f"{where}: {prefix}.bitmask must be uint8, got {bits.dtype}")
        last = prefix.rsplit(".", 1)[-1]
        # Older compressed-tensors named the parts after the whole parameter
        # ("x.weight.compressed").
        name = prefix if last in ("weight", "bias") else prefix + ".weight"
        nbytes = sum(e[p].nbytes for p in parts)
        return LogicalTensor(
            name, comp.st_dtype, tuple(shape), "bitmask", comp.shard, tuple(parts), nbytes
        )


_NUMPY_VIEW = {
    "BOOL": "uint8",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "U16": "uint16",
    "I32": "int32",
    "U32": "uint32",
    "I64": "int64",
    "U64": "uint64",
}


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Open a ``.safetensors`` file or a Hugging Face directory; every header is validated now."""
    lay = locate(Path(path))
    headers = {s: read_header(lay.path / s if lay.is_dir else lay.path, s) for s in lay.shards}
    config = None
    if lay.is_dir and (lay.path / "config.json").is_file():
        cfg_path = lay.path / "config.json"
        try:
            config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{cfg_path}: not valid JSON ({e}); fix or remove it") from None
    return Checkpoint(lay, headers, config)
