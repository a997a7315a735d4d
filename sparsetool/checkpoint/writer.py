"""Streaming, atomic checkpoint writing.

Each shard's header is computed from the specs before any data, then tensors are written one
by one at their final offsets (``pwrite``), so nothing is buffered beyond the tensor in hand.
The bytes equal what the reference ``safetensors.torch.save_file`` writes for the same tensors
and metadata (see ``format.layout``).

``write_tensors`` writes a new single-file checkpoint from tensors held in memory through the
same shard writer and the same codec registry (``encodings.encode``).

Everything goes to a temporary path beside ``out`` (same filesystem) and is renamed into place
only when the ``with`` block ends normally; any exception, Ctrl-C included, removes it and
leaves ``out`` (and the input) untouched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sparsetool.checkpoint import dtypes
from sparsetool.checkpoint.format import TensorSpec, layout
from sparsetool.checkpoint.layout import rebuilt_index
from sparsetool.checkpoint.output_files import (
    ORDINARY,
    PRIVATE,
    PRIVATE_DIR,
    check_room,
    check_writable,
    copy_mode,
    mode_of,
    put_in_place,
    remove,
    temp_beside,
    write_error,
)
from sparsetool.checkpoint.reader import Checkpoint
from sparsetool.errors import CheckpointError
from sparsetool.util.wording import plural

if TYPE_CHECKING:
    import torch

COPY_CHUNK = 16 * 1024 * 1024  # bytes per raw-copy step: bounded memory, few syscalls


WRITE_PIECE = 256 * 1024
"""Bytes per ``pwrite``. The kernel's copy into the page cache runs 4-8x slower per byte from
1-2 MiB buffers than from 256 KiB ones on the machines measured (2.6 GB written in 1.8-6 s
against 0.45 s: ``benchmarks/RESULTS.md``); a piece that stays in the CPU's cache is copied at
the speed of ``cp``."""


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    done = 0
    total = len(data)
    while done < total:
        n = os.pwrite(fd, data[done : done + WRITE_PIECE], offset + done)
        if n <= 0:
            raise OSError("short write")
        done += n


class ShardWriter:
    """Writes one safetensors file whose header is fixed by ``specs``; tensors in any order."""

    def __init__(
        self,
        path: Path,
        shard: str,
        specs: list[TensorSpec],
        metadata: dict[str, str] | None,
        mode: int | None = None,
        label: str | None = None,
    ):
        self.path = path
        self.shard = shard
        self.specs = {s.name: s for s in specs}
        header, offsets = layout(list(specs), metadata)
        self._data_start = len(header)
        self._offsets = offsets
        self._written: set[str] = set()
        self._put_lock = threading.Lock()
        self.total_size = sum(s.nbytes for s in specs)  # tensor bytes, for the index
        check_room(path.parent, self._data_start + self.total_size, label or shard)
        # With ``mode`` (an input's permission bits) the file is created owner-only and given
        # exactly that mode, whatever the umask; without, it is an ordinary new file (0o666 less
        # the umask, as open() makes it).
        self._fd: int | None = os.open(
            path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ORDINARY if mode is None else PRIVATE
        )
        if mode is not None:
            os.fchmod(self._fd, mode)
        _pwrite_all(self._fd, memoryview(header), 0)
        # Fix the final size now: a tensor written out of order never leaves the file short.
        os.ftruncate(self._fd, self._data_start + self.total_size)

    def _claim(self, name: str) -> tuple[TensorSpec, int]:
        """The spec of tensor ``name``, not written yet, and the open file to write it into."""
        fd = self._fd
        if fd is None:
            raise CheckpointError(f"{self.shard}: shard writer is closed")
        spec = self.specs.get(name)
        if spec is None:
            raise CheckpointError(f"{self.shard}: tensor {name!r} was not declared for this shard")
        if name in self._written:
            raise CheckpointError(f"{self.shard}: tensor {name!r} written twice")
        return spec, fd

    def write_array(self, name: str, values: np.ndarray) -> None:
        """Write one tensor, given as a numpy array of its stored values (a float's bits), at its
        place; its item size and shape must match its spec."""
        spec, fd = self._claim(name)
        if values.itemsize != dtypes.itemsize(spec.dtype) or tuple(values.shape) != spec.shape:
            raise CheckpointError(
                f"{self.shard}: tensor {name!r} is {values.dtype} {list(values.shape)} but was "
                f"declared {spec.dtype} {list(spec.shape)}"
            )
        if spec.nbytes:
            raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
            # .data is memoryview(raw), which numpy's stubs allow only from Python 3.12 on
            _pwrite_all(fd, raw.data.cast("B"), self._data_start + self._offsets[name])
        self._written.add(name)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Write one torch tensor at its place; dtype and shape must match its spec."""
        import torch

        spec, fd = self._claim(name)
        if not _same_dtype(tensor.dtype, spec.dtype) or tuple(tensor.shape) != spec.shape:
            raise CheckpointError(
                f"{self.shard}: tensor {name!r} is {tensor.dtype} {list(tensor.shape)} but was "
                f"declared {spec.dtype} {list(spec.shape)}"
            )
        if spec.nbytes:
            t = tensor.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            t = t.resolve_conj().resolve_neg().contiguous()
            # A uint8 view of the tensor's own memory: no copy between torch and the file.
            raw = t.reshape(-1).view(torch.uint8).numpy()
            # .data is memoryview(raw), which numpy's stubs allow only from Python 3.12 on
            _pwrite_all(fd, raw.data.cast("B"), self._data_start + self._offsets[name])
        self._written.add(name)

    @contextlib.contextmanager
    def parts(self, *names: str) -> Iterator[Callable[[int, int, memoryview], None]]:
        """Write the tensors ``names`` piece by piece: ``put(i, byte_offset, data)`` writes
        ``data`` into tensor ``names[i]`` at that offset. ``put`` may be called from several
        threads at once (each piece is one ``pwrite`` at its own place). The tensors count as
        written when the block ends without an error; the caller writes every byte of them.
        """
        specs = [self._claim(name)[0] for name in names]
        starts = [self._data_start + self._offsets[name] for name in names]
        fd = self._fd

        def put(i: int, offset: int, data: memoryview) -> None:
            if offset < 0 or offset + len(data) > specs[i].nbytes:
                raise CheckpointError(
                    f"{self.shard}: a piece of {names[i]!r} at byte {offset} ({len(data)} bytes) "
                    f"lies outside its {specs[i].nbytes} bytes"
                )
            # One write at a time: the filesystem serialises writes to a file anyway (ext4 takes
            # the inode lock), and a thread waiting here sleeps instead of spinning on that lock,
            # so the other core keeps computing the next piece.
            if fd is None:  # a closed writer claims nothing: there is no specs[i]
                raise AssertionError("parts() of a closed shard writer")
            with self._put_lock:
                _pwrite_all(fd, data, starts[i] + offset)

        yield put
        self._written.update(names)

    def copy_stored(self, name: str, src: Checkpoint, stored_name: str) -> None:
        """Copy a stored tensor's bytes from ``src`` unchanged, chunk by chunk (never loaded as a
        tensor)."""
        spec, fd = self._claim(name)
        st = src.entry(stored_name)
        if not _same_dtype(st.st_dtype, spec.dtype) or st.shape != spec.shape:
            raise CheckpointError(
                f"{self.shard}: cannot copy {stored_name!r} ({st.dtype} {list(st.shape)}) into "
                f"{name!r} declared {spec.dtype} {list(spec.shape)}"
            )
        src_fd = src.shard_fd(st.shard)
        _copy_range(src_fd, st.start, fd, self._data_start + self._offsets[name], st.nbytes)
        self._written.add(name)

    def close(self, ok: bool) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.close(fd)
        if ok:
            missing = sorted(set(self.specs) - self._written)
            if missing:
                shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                raise CheckpointError(
                    f"{self.shard}: {plural(len(missing), 'declared tensor')} never written: "
                    f"{shown}"
                )

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)


def _same_dtype(a: object, b: object) -> bool:
    """Do two dtypes, each a torch dtype or a safetensors name, name the same stored type?"""
    return dtypes.lookup(a) is dtypes.lookup(b) is not None or a == b


def _copy_range(src_fd: int, src_off: int, dst_fd: int, dst_off: int, count: int) -> None:
    done = 0
    use_cfr = hasattr(os, "copy_file_range")
    while done < count:
        step = min(COPY_CHUNK, count - done)
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, step, src_off + done, dst_off + done)
                if n <= 0:
                    raise OSError("copy_file_range made no progress")
                done += n
                continue
            except OSError:
                use_cfr = False  # e.g. across filesystems on old kernels: fall back to read/write
        buf = os.pread(src_fd, step, src_off + done)
        if not buf:
            raise CheckpointError("source file shrank while copying")
        _pwrite_all(dst_fd, memoryview(buf), dst_off + done)
        done += len(buf)


class CheckpointWriter:
    """Hands out one ShardWriter per output shard (same shard file names as the input)."""

    def __init__(
        self,
        src: Checkpoint,
        root: Path,
        metadata_extra: dict[str, str] | None,
        out: Path | None = None,
    ):
        self.src = src
        self._out = out  # the final path, for messages
        self._root = root  # temp file (single-file checkpoint) or temp directory
        self._extra = dict(metadata_extra or {})
        for k, v in self._extra.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise CheckpointError(f"safetensors metadata values must be strings: {k!r}: {v!r}")
        self.done: dict[str, ShardWriter] = {}
        self._open: list[ShardWriter] = []
        self.left_out: list[str] = []  # entries of the input directory the output leaves out

    def shard(self, shard: str, specs: list[TensorSpec]) -> ShardWriter:
        if shard not in self.src.shards:
            raise CheckpointError(f"output shard {shard!r} is not a shard of {self.src.path}")
        if shard in self.done:
            raise CheckpointError(f"output shard {shard!r} opened twice")
        meta = self.src.metadata(shard)
        meta.update(self._extra)
        path = self._root / shard if self.src.is_dir else self._root
        label = (
            None if self._out is None else str(self._out / shard if self.src.is_dir else self._out)
        )
        sw = ShardWriter(
            path, shard, specs, meta or None, mode=mode_of(self.src.shard_path(shard)), label=label
        )
        self.done[shard] = sw
        self._open.append(sw)
        return sw

    def _abort(self) -> None:
        for sw in self._open:
            with contextlib.suppress(Exception):
                sw.close(ok=False)

    def _finish(self) -> None:
        open_ones = [sw.shard for sw in self._open if sw._fd is not None]
        if open_ones:
            raise CheckpointError(
                f"shard(s) still open at the end of writing: {', '.join(open_ones)}"
            )
        missing = [s for s in self.src.shards if s not in self.done]
        if missing:
            raise CheckpointError(f"output shard(s) never written: {', '.join(missing)}")


def _foreign_entries(d: Path, src: Checkpoint) -> list[str]:
    """Entries of an existing output directory that the new output would not hold again.

    Replacing the directory would delete them, so the writer refuses while there are any.
    """
    ours = set(src.shards) | {Path(rel).parts[0] for rel in src.other_files}
    ours.add(src.index_name or "model.safetensors.index.json")
    return sorted(p.name for p in d.iterdir() if p.name not in ours)


@contextlib.contextmanager
def write_checkpoint(
    src: Checkpoint,
    out: str | os.PathLike,
    *,
    in_place: bool = False,
    metadata_extra: dict[str, str] | None = None,
    config_transform: Callable[[dict], dict] | None = None,
) -> Iterator[CheckpointWriter]:
    """Write a checkpoint with ``src``'s layout at ``out``, atomically; see the module docstring."""
    out_arg = os.fspath(out)
    out = Path(out)
    # Write through a symlink, as cp does: the link stays and its target gets the new checkpoint.
    out_abs = Path(os.path.realpath(out) if out.is_symlink() else os.path.abspath(out))
    same = out.exists() and out.resolve() == src.path.resolve()
    if same and not in_place:
        raise CheckpointError(
            f"output {out} is the input checkpoint; choose another output path or pass --in-place"
        )
    if out.exists() and not same:
        if src.is_dir and not out.is_dir():
            raise CheckpointError(
                f"output {out} is an existing file but the input {src.path} is a directory; give "
                "a directory path"
            )
        if not src.is_dir and out.is_dir():
            raise CheckpointError(
                f"output {out} is an existing directory but the input {src.path} is a single "
                f"file; give a file path such as {out / src.path.name}"
            )
        foreign = _foreign_entries(out, src) if out.is_dir() else []
        if foreign:
            shown = ", ".join(foreign[:3]) + (
                f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            )
            raise CheckpointError(
                f"output {out} is an existing directory holding {shown}, which the new checkpoint "
                "would replace; remove them yourself or choose a new path"
            )
    if src.is_dir and out.suffix == ".safetensors" and not out.is_dir():
        raise CheckpointError(
            f"output {out} looks like a file name but the input {src.path} is a directory "
            "(a Hugging Face layout is written as a directory); give a directory path"
        )
    if not src.is_dir and str(out_arg).endswith(os.sep) and not out.exists():
        raise CheckpointError(
            f"output {out_arg} looks like a directory but the input {src.path} is a single file; "
            f"give a file path such as {out / src.path.name}"
        )
    check_writable(out_abs, "-o", shown=out)  # a read-only disk, a path through a file, ...
    parent = out_abs.parent
    if not parent.is_dir():
        raise CheckpointError(f"output directory {parent} does not exist; create it first")
    tmp = temp_beside(out_abs)
    writer: CheckpointWriter | None = None
    try:
        if src.is_dir:
            tmp.mkdir(mode=PRIVATE_DIR)
        writer = CheckpointWriter(src, tmp, metadata_extra, out)
        writer.left_out = (
            []
            if same
            else [f"{rel}/" if (src.path / rel).is_dir() else str(rel) for rel in src.left_out]
        )
        yield writer
        writer._finish()
        if src.is_dir:
            _carry_over(src, tmp, writer, config_transform, everything=same)
            copy_mode(src.path, tmp)
        # Each shard already has its input shard's mode (cp -p): a private model stays private.
        put_in_place(tmp, out_abs)
    except BaseException as e:
        if writer is not None:
            writer._abort()
        remove(tmp)
        if isinstance(e, OSError):  # no space, I/O error, permission: one clean line
            raise write_error(e, out) from None
        raise


def _carry_over(
    src: Checkpoint,
    tmp: Path,
    writer: CheckpointWriter,
    config_transform: Callable[[dict], dict] | None,
    everything: bool = False,
) -> None:
    """Copy the non-tensor files (with ``everything``, those left out too: the output replaces the
    input), transform config.json, rebuild the shard index."""
    for rel in src.other_files + (src.left_out if everything else []):
        s, d = src.path / rel, tmp / rel
        if rel == Path("config.json") and config_transform is not None and src.config is not None:
            cfg = config_transform(json.loads(json.dumps(src.config)))
            d.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            copy_mode(s, d)
        elif s.is_dir():
            shutil.copytree(s, d, symlinks=True)
        else:
            shutil.copy2(s, d)  # mode and times, as cp -p
    if src.index_name is not None:
        weight_map = {name: shard for shard, sw in writer.done.items() for name in sw.specs}
        total = sum(sw.total_size for sw in writer.done.values())
        (tmp / src.index_name).write_text(
            rebuilt_index(src.index or {}, weight_map, total), encoding="utf-8"
        )
        copy_mode(src.path / src.index_name, tmp / src.index_name)


def write_tensors(
    out: str | os.PathLike,
    tensors: Mapping[str, torch.Tensor],
    *,
    metadata: Mapping[str, str] | None = None,
    encoding: str = "zeros",
    masks: Mapping[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``tensors`` (name -> tensor, any device) as one new safetensors file at ``out``.

    Each tensor with an entry in ``masks`` (True = kept) is stored in ``encoding`` (``zeros``,
    ``mask``, ``nan`` or ``bitmask``), its pruned entries overwritten as that encoding says; the
    others are stored as they are. Same bytes as ``save_file`` for the stored tensors; atomic
    like ``write_checkpoint`` (a temporary file beside ``out``, renamed into place).
    """
    masks = dict(masks or {})
    unknown = sorted(set(masks) - set(tensors))
    if unknown:
        raise CheckpointError(
            f"masks given for tensors that are not written: {', '.join(unknown[:5])}"
        )
    from sparsetool.checkpoint.encodings import encode

    stored: list[tuple[str, torch.Tensor]] = []
    for name, t in tensors.items():
        t = t.detach().cpu()
        mask = masks.get(name)
        stored += (
            encode(name, t, mask.detach().cpu(), encoding) if mask is not None else [(name, t)]
        )
    out_abs = Path(os.path.abspath(out))
    if out_abs.is_dir():
        raise CheckpointError(
            f"output {out} is an existing directory; give a file path such as "
            f"{out_abs / 'model.safetensors'}"
        )
    parent = out_abs.parent
    if not parent.is_dir():
        raise CheckpointError(f"output directory {parent} does not exist; create it first")
    tmp = temp_beside(out_abs)
    specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in stored]
    try:
        with ShardWriter(
            tmp, out_abs.name, specs, dict(metadata) if metadata is not None else None
        ) as sw:
            for n, t in stored:
                sw.write(n, t)
        os.replace(tmp, out_abs)
    except BaseException as e:
        remove(tmp)
        if isinstance(e, OSError):
            raise write_error(e, out) from None
        raise
    return out_abs
