"""Turn a GGUF file (llama.cpp's format) into a Hugging Face directory: ``sparsetool convert``.

The file's header is read first, without torch (:mod:`sparsetool.checkpoint.gguf_file`: a file
that is not GGUF is refused at once), and the output is checked before the long part: not the
input, not an existing file, not a directory holding anything but a model's files, writable.
Then transformers reads the file (:func:`sparsetool.models.gguf.load_gguf`: config and tokenizer
from its metadata, every weight dequantized to ``dtype``) and ``save_pretrained`` writes
config.json, generation_config.json, model.safetensors and the tokenizer's files into a temporary
directory beside the output, renamed into place only when complete: an error, a full disk or
Ctrl-C leaves nothing behind, and an existing output is replaced whole or not at all. Every file
written gets the GGUF file's permission bits (the directory: those with search allowed), as the
other commands' outputs keep their input's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparsetool.checkpoint.format import add_metadata
from sparsetool.checkpoint.gguf_file import read_header
from sparsetool.checkpoint.layout import CARRIED_NAMES, INDEX_SUFFIX
from sparsetool.checkpoint.output_files import (
    Reclaimed,
    check_room,
    check_writable,
    put_in_place,
    reclaiming,
    remove,
    temp_beside,
    write_error,
)
from sparsetool.checkpoint.provenance import PROVENANCE_KEY
from sparsetool.errors import CheckpointError, UsageError
from sparsetool.util import options
from sparsetool.util.progress import Progress, Steps
from sparsetool.util.wording import some_names

__all__ = [
    "ConvertResult",
    "DTYPES",
    "GGUF_PROVENANCE",
    "GGUF_TYPES",
    "check_output",
    "convert_gguf",
]

GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")
"""The types ``convert DIR -o FILE.gguf --type`` writes matrices in (``ops/gguf_export.py``)."""
GGUF_PROVENANCE = "sparsetool.provenance"
"""The GGUF key sparsetool's provenance is written under (``convert DIR -o FILE.gguf``) and
restored from (``convert FILE.gguf -o DIR``)."""

DTYPES = ("float32", "bfloat16")
"""The types the dequantized weights can be written in (float32: exactly the dequantized values;
bfloat16: half the size, rounded once)."""


@dataclass
class ConvertResult:
    source: Path
    output: Path
    architecture: str
    model_class: str
    dtype: str
    parameters: int
    ggml_types: dict[str, int]  # the file's tensors by ggml type, the most frequent first
    files: list[str] = field(default_factory=list)  # what the output directory holds
    bytes: int = 0  # their size
    reclaimed: list[Reclaimed] = field(default_factory=list)  # stale temporaries removed

    def to_json(self) -> dict:
        return {
            "input": str(self.source),
            "output": str(self.output),
            "architecture": self.architecture,
            "model_class": self.model_class,
            "dtype": self.dtype,
            "parameters": self.parameters,
            "ggml_types": dict(self.ggml_types),
            "files": list(self.files),
            "bytes": self.bytes,
        }


def _model_file(name: str) -> bool:
    """Whether an entry of an existing output directory is one a conversion writes again."""
    return name in CARRIED_NAMES or name.endswith((".safetensors", INDEX_SUFFIX))


def check_output(source: Path, out: Path) -> Path:
    """Refuse, before anything is read, an output that is the input, an existing file, a
    directory holding more than a model's files (replacing it would delete them), or one that
    cannot be written; the output's absolute path (a symlink's target: written through, as cp)."""
    out_abs = Path(os.path.realpath(out) if out.is_symlink() else os.path.abspath(out))
    if out.exists() and out.resolve() == source.resolve():
        raise UsageError(
            f"-o {out} is the input itself; convert writes a new directory: choose another path"
        )
    if out.exists() and not out.is_dir():
        raise CheckpointError(
            f"-o {out} is an existing file; convert writes a directory: choose a new path"
        )
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if not _model_file(p.name))
        if foreign:
            shown = some_names(foreign)
            raise CheckpointError(
                f"-o {out} is an existing directory holding {shown}, which the converted model "
                "would replace; remove them yourself or choose a new path"
            )
    if not out_abs.parent.is_dir():
        raise CheckpointError(f"output directory {out_abs.parent} does not exist; create it first")
    check_writable(out_abs, "-o", shown=out)
    return out_abs


def convert_gguf(
    source: str | Path,
    out: str | Path,
    *,
    dtype: str = "float32",
    progress: Progress | None = None,
) -> ConvertResult:
    """Write the GGUF file ``source`` as a Hugging Face directory ``out``: weights dequantized to
    ``dtype`` (float32 or bfloat16) in model.safetensors, config and tokenizer from the file's
    metadata. ``progress`` sees the stages ``load`` (config, weights, tokenizer) and ``write``
    (weights, tokenizer). The temporaries of killed runs removed beside ``out`` are the result's
    ``reclaimed`` (an error's, if it fails)."""
    source, out = Path(source), Path(out)
    dtype = options.check_choice(dtype, "--dtype", DTYPES)
    header = read_header(source)
    out_abs = check_output(source, out)
    from sparsetool.models.gguf import load_gguf

    def report(stage: str, total: int) -> Steps:
        return Steps(total, (lambda d, t: progress(stage, d, t)) if progress else None)

    if progress:
        progress("load", 0, 3)
    loaded = load_gguf(header, dtype, report("load", 3))
    result = ConvertResult(
        source=source,
        output=out,
        architecture=header.architecture or "",
        model_class=type(loaded.model).__name__,
        dtype=dtype,
        parameters=loaded.parameters,
        ggml_types=header.ggml_types(),
    )
    with reclaiming() as result.reclaimed:
        tmp = temp_beside(out_abs)
        try:
            tmp.mkdir()
            check_room(out_abs.parent, loaded.nbytes, str(out))
            if progress:
                progress("write", 0, 2)
            loaded.save(tmp, report("write", 2))
            provenance = header.metadata.get(GGUF_PROVENANCE)
            if isinstance(provenance, str):  # a file sparsetool wrote: how the model was made
                shards = sorted(tmp.glob("*.safetensors"))  # the first, where it is read from
                check_room(out_abs.parent, shards[0].stat().st_size, str(out))
                add_metadata(shards[0], {PROVENANCE_KEY: provenance})
            result.files = sorted(p.name for p in tmp.iterdir())
            result.bytes = sum(p.stat().st_size for p in tmp.iterdir() if p.is_file())
            put_in_place(tmp, out_abs, like=source)  # every file the GGUF file's mode
        except BaseException as e:
            remove(tmp)
            if isinstance(e, OSError):  # no space, I/O error, permission: one clean line
                raise write_error(e, out) from None
            raise
    return result
