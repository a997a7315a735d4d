"""GGUF files (llama.cpp's format): told from their first four bytes, and their header read
without the gguf package, numpy or torch.

A GGUF file given where a safetensors checkpoint is expected is named as one, with the command
that converts it (:func:`file_error`, :func:`dir_error`), instead of failing as a corrupt
safetensors file; ``sparsetool convert`` reads the header (:func:`read_header`: the architecture,
the tensors and their ggml types) before anything heavy is imported.

The layout, all little-endian: ``b"GGUF"``, u32 version (2 or 3), u64 tensor count, u64 key count;
then each key (u64 length + UTF-8), its u32 value type and the value (a string is u64 length +
bytes, an array is u32 element type + u64 count + the elements); then each tensor's name, u32
dimension count, u64 dimensions (innermost first), u32 ggml type and u64 data offset. The tensor
data follows, from the next multiple of ``general.alignment`` (default 32); each offset counts from
there, and each type's size is fixed by its blocks (:data:`GGML_BLOCKS`), so the header alone says
how long the file must be: a file cut inside its tensor data is refused before any is read.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from sparsetool.errors import CheckpointError
from sparsetool.util.wording import plural, some_names

MAGIC = b"GGUF"
SUFFIX = ".gguf"
VERSIONS = (2, 3)  # version 1 (2023) used 32-bit counts; nothing current writes it

# value type -> struct format of the fixed-size ones (8: string, 9: array)
_SCALARS = {
    **{0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?"},
    **{10: "Q", 11: "q", 12: "d"},
}
_STRING, _ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32  # where the tensor data starts when the file names no general.alignment

# ggml tensor types by number (the ones files are found in; another is shown as its number)
GGML_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    16: "IQ2_XXS",
    17: "IQ2_XS",
    18: "IQ3_XXS",
    19: "IQ1_S",
    20: "IQ4_NL",
    21: "IQ3_S",
    22: "IQ2_S",
    23: "IQ4_XS",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    29: "IQ1_M",
    30: "BF16",
    34: "TQ1_0",
    35: "TQ2_0",
    39: "MXFP4",
}

# ggml type -> (values per block, bytes per block): what a tensor of that type occupies
GGML_BLOCKS = {
    **{"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "F64": (1, 8)},
    **{"I8": (1, 1), "I16": (1, 2), "I32": (1, 4), "I64": (1, 8)},
    **{"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24)},
    **{"Q8_0": (32, 34), "Q8_1": (32, 40), "IQ4_NL": (32, 18), "MXFP4": (32, 17)},
    **{"Q2_K": (256, 84), "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176)},
    **{"Q6_K": (256, 210), "Q8_K": (256, 292), "IQ2_XXS": (256, 66), "IQ2_XS": (256, 74)},
    **{"IQ3_XXS": (256, 98), "IQ1_S": (256, 50), "IQ3_S": (256, 110), "IQ2_S": (256, 82)},
    **{"IQ4_XS": (256, 136), "IQ1_M": (256, 56), "TQ1_0": (256, 54), "TQ2_0": (256, 66)},
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # as stored: innermost dimension first
    ggml_type: str
    offset: int = 0  # where its data starts, from the start of the file's tensor data

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int | None:
        """Bytes of its data (None: a ggml type whose block size is not known here)."""
        block = GGML_BLOCKS.get(self.ggml_type)
        return None if block is None else -(-self.numel // block[0]) * block[1]


@dataclass
class GGUFHeader:
    """What a GGUF file says about itself. ``metadata`` holds the scalar and string values; an
    array (the vocabulary, its merges) is there as its length only."""

    path: Path
    version: int
    metadata: dict[str, object] = field(default_factory=dict)
    tensors: list[GGUFTensor] = field(default_factory=list)
    data_start: int = 0  # the byte where the tensor data begins

    @property
    def data_end(self) -> int:
        """The byte where the last tensor's data ends: the least size of the whole file (its
        tensors of unknown ggml types aside)."""
        ends = [self.data_start + t.offset + (t.nbytes or 0) for t in self.tensors]
        return max(ends, default=self.data_start)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def name(self) -> str | None:
        name = self.metadata.get("general.name")
        return name if isinstance(name, str) else None

    @property
    def parameters(self) -> int:
        return sum(t.numel for t in self.tensors)

    def ggml_types(self) -> dict[str, int]:
        """ggml type -> how many tensors are stored in it, the most frequent first."""
        counts: dict[str, int] = {}
        for t in self.tensors:
            counts[t.ggml_type] = counts.get(t.ggml_type, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def is_gguf(prefix: bytes) -> bool:
    """Whether a file's first bytes are GGUF's. A safetensors file cannot start so: its header
    length would be above 1 GB, which no reader accepts.

    >>> is_gguf(b"GGUF\\x03\\x00\\x00\\x00"), is_gguf(b"\\x80\\x02")
    (True, False)
    """
    return prefix[:4] == MAGIC


def convert_command(path: Path) -> str:
    """The command that turns the GGUF file ``path`` into a Hugging Face directory beside it.

    >>> convert_command(Path("models/SmolLM2.Q4_1.gguf"))
    'sparsetool convert models/SmolLM2.Q4_1.gguf -o models/SmolLM2.Q4_1'
    """
    out = (
        path.with_suffix("") if path.suffix.lower() == SUFFIX else path.with_name(path.name + "-hf")
    )
    return f"sparsetool convert {path} -o {out}"


def file_error(path: Path, prefix: bytes) -> CheckpointError | None:
    """The error for a GGUF file read as a safetensors checkpoint, or None when it is not one."""
    if not is_gguf(prefix):
        return None
    return CheckpointError(
        f"{path}: a GGUF file (llama.cpp's format), not a safetensors checkpoint; convert it once "
        f"into a Hugging Face directory: {convert_command(path)}"
    )


def dir_error(path: Path) -> CheckpointError | None:
    """The error for a directory whose only weights are GGUF files, or None."""
    found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() == SUFFIX)
    if not found:
        return None
    shown = some_names([p.name for p in found])
    return CheckpointError(
        f"{path}: holds GGUF files ({shown}) and no .safetensors file; convert one into a Hugging "
        f"Face directory: {convert_command(found[0])}"
    )


def read_header(path: str | Path) -> GGUFHeader:
    """The header of the GGUF file ``path``; CheckpointError naming the file when it is not one
    (a directory, another format, a version this reader does not know, a truncated header) or
    when it is shorter than its header says (cut inside the tensor data: a download that
    stopped), before any tensor is read."""
    path = Path(path)
    if path.is_dir():
        ggufs = sorted(p.name for p in path.iterdir() if p.suffix.lower() == SUFFIX)
        hint = f"; it holds {', '.join(ggufs[:3])}" if ggufs else ""
        raise CheckpointError(f"{path}: a directory; give the .gguf file itself{hint}")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
            if not is_gguf(magic):
                raise CheckpointError(
                    f"{path}: not a GGUF file (a GGUF file starts with the bytes 'GGUF'); "
                    "convert reads llama.cpp's GGUF files: a safetensors checkpoint or a Hugging "
                    "Face directory is read by every command as it is"
                )
            header = _parse(path, f)
            size = os.fstat(f.fileno()).st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror or e})") from None
    except (struct.error, UnicodeDecodeError, EOFError, ValueError):
        raise CheckpointError(
            f"{path}: the GGUF header is truncated or corrupt; download the file again"
        ) from None
    if size < header.data_end:
        raise CheckpointError(
            f"{path}: truncated: {size:,} of {header.data_end:,} bytes (the header places the "
            f"data of {plural(len(header.tensors), 'tensor')} up to byte {header.data_end:,}); "
            "download the file again"
        )
    return header


def _parse(path: Path, f: BinaryIO) -> GGUFHeader:
    (version,) = _unpack(f, "I")
    if version not in VERSIONS:
        raise CheckpointError(
            f"{path}: GGUF version {version}; only versions {' and '.join(map(str, VERSIONS))} "
            "are read (re-export the model with a current llama.cpp)"
        )
    n_tensors, n_keys = _unpack(f, "QQ")
    header = GGUFHeader(path, version)
    for _ in range(n_keys):
        key = _string(f)
        (kind,) = _unpack(f, "I")
        header.metadata[key] = _value(f, kind, top=True)
    for _ in range(n_tensors):
        name = _string(f)
        (dims,) = _unpack(f, "I")
        shape = _unpack(f, "Q" * dims) if dims else ()
        ggml, offset = _unpack(f, "IQ")
        header.tensors.append(
            GGUFTensor(name, tuple(shape), GGML_TYPES.get(ggml, str(ggml)), offset)
        )
    alignment = header.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"general.alignment {alignment!r}")
    header.data_start = -(-f.tell() // alignment) * alignment
    return header


def _unpack(f: BinaryIO, fmt: str) -> tuple:
    size = struct.calcsize("<" + fmt)
    data = f.read(size)
    if len(data) < size:
        raise EOFError
    return struct.unpack("<" + fmt, data)


def _string(f: BinaryIO) -> str:
    (n,) = _unpack(f, "Q")
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data.decode("utf-8")


def _value(f: BinaryIO, kind: int, top: bool = False) -> object:
    if kind in _SCALARS:
        return _unpack(f, _SCALARS[kind])[0]
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY and top:
        inner, count = _unpack(f, "IQ")
        if inner in _SCALARS:
            f.seek(struct.calcsize("<" + _SCALARS[inner]) * count, 1)
        else:
            for _ in range(count):
                _skip(f, inner)
        return count
    raise ValueError(f"unknown GGUF value type {kind}")


def _skip(f: BinaryIO, kind: int) -> None:
    if kind in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[kind]), 1)
    elif kind == _STRING:
        (n,) = _unpack(f, "Q")
        f.seek(n, 1)
    elif kind == _ARRAY:
        inner, count = _unpack(f, "IQ")
        for _ in range(count):
            _skip(f, inner)
    else:
        raise ValueError(f"unknown GGUF value type {kind}")
