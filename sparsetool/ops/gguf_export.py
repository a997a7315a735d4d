"""A Hugging Face directory out to a GGUF file (llama.cpp's format): ``sparsetool convert DIR -o
FILE.gguf``.

What is written, for the families of ``ops/gguf_families.py`` (Llama and SmolLM2, Mixtral,
Qwen2, Qwen3, Qwen3-MoE, Gemma-3) with any widths, depth and expert count ``shrink`` writes (an
explicit ``head_dim``, any FFN width, fewer blocks, fewer experts):

- the config as llama.cpp's keys (``{arch}.block_count``, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count[_kv]``, ``attention.key_length`` and
  ``value_length``, RoPE's, the experts', the sliding layers', the norm's epsilon, the context);
- the tokenizer (``ops/gguf_vocab.py``: a byte-level or SentencePiece-style BPE's tokens,
  scores, merges, special tokens, ``add_bos_token`` and chat template);
- every tensor under llama.cpp's name, one at a time (read without torch, converted, written,
  dropped: the largest tensor in memory, never the model; a block's experts are stacked into
  one tensor per projection, so one block's experts of one projection), in ``--type``: ``f32``,
  ``f16``, ``bf16``, or the block formats ``q8_0`` and ``q4_0`` (32 weights a block; a matrix
  whose rows are not a multiple of 32 is written f16, as llama.cpp does, and said). Norms,
  biases and routers stay f32. ``llama``'s query and key rows are reordered for llama.cpp's
  rotary layout (what transformers' reader undoes); the other families rotate as stored.
  Gemma-3's norms are written as the ``1 + w`` they apply.
- sparsetool's provenance (how the model was pruned or shrunk) as ``sparsetool.provenance``.

GGUF holds every matrix dense: a pruned model's zeros are written as zeros, the file as large as
the dense one; ``q8_0``/``q4_0`` keep a zero exactly (each block's scale times 0) but round the
weights beside it.

The file is written beside the output (owner-only until complete) and renamed into place at the
end: an error, Ctrl-C or a full disk leave nothing, and a kill leaves a temporary the next run in
that directory removes. What cannot be mapped (an architecture, a setting llama.cpp would run
otherwise, a tensor, a type that is not floating point, a tokenizer that is not a BPE, byte-level
or with byte fallback, or is longer than the embeddings, a sparse encoding, missing experts) is
one error before anything is written.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sparsetool.checkpoint import Checkpoint, open_checkpoint
from sparsetool.checkpoint.output_files import (
    PRIVATE,
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
from sparsetool.errors import CheckpointError, SparsetoolError, UsageError
from sparsetool.ops.convert import GGUF_PROVENANCE, GGUF_TYPES
from sparsetool.ops.gguf_families import (
    FAMILIES,
    Family,
    expert_count,
    expert_key,
    extra_tensors,
    family_of,
    gguf_name,
    write_config,
)
from sparsetool.ops.gguf_vocab import read_tokenizer, write_tokenizer
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural, some_names

__all__ = ["ARCHITECTURES", "ExportResult", "export_gguf"]

ARCHITECTURES = {model_type: family.arch for model_type, family in FAMILIES.items()}
"""config.json's ``model_type`` -> the GGUF architecture written."""
BLOCK = 32  # weights in a q8_0 / q4_0 block
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # the stored types a GGUF file is written from
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # llama.cpp's general.file_type


@dataclass
class ExportResult:
    """What ``convert DIR -o FILE.gguf`` wrote."""

    source: Path
    output: Path
    architecture: str
    gguf_type: str
    parameters: int = 0
    tensors: dict[str, int] = field(default_factory=dict)  # GGUF type -> tensors written in it
    kept_f16: list[str] = field(default_factory=list)  # block-quantized asked, rows not x32
    bytes: int = 0
    notes: list[str] = field(default_factory=list)
    reclaimed: list[Reclaimed] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "input": str(self.source),
            "output": str(self.output),
            "architecture": self.architecture,
            "type": self.gguf_type,
            "parameters": self.parameters,
            "tensors": dict(self.tensors),
            "kept_f16": list(self.kept_f16),
            "bytes": self.bytes,
            "notes": list(self.notes),
        }


@dataclass
class _Tensor:
    stored: tuple[str, ...]  # its name in the checkpoint (a block's experts: each one's, in order)
    name: str  # its GGUF name
    shape: tuple[int, ...]  # as written (experts stacked first)
    qtype: str  # what it is written as
    permute_heads: int = 0  # llama's q/k: reordered for the rotary layout, in this many heads
    shift: float = 0.0  # added to every weight (Gemma's norms, applied as 1 + w)
    values: np.ndarray | None = None  # computed here, not stored (Llama 3.1's rope_freqs)

    @property
    def label(self) -> str:
        """The checkpoint's name for it (a block's experts: with ``*`` for the expert)."""
        if len(self.stored) <= 1:
            return self.stored[0] if self.stored else self.name
        first = self.stored[0].split(".")
        i = next(i for i in range(len(first)) if self.stored[1].split(".")[i] != first[i])
        return ".".join([*first[:i], "*", *first[i + 1 :]])


def check_export_output(source: Path, out: Path) -> Path:
    """Refuse an output that is the input, an existing file or directory, or cannot be written
    (before anything is read); its absolute path."""
    out_abs = Path(os.path.abspath(out))
    if out.exists() and out.resolve() == source.resolve():
        raise UsageError(f"-o {out} is the input itself; choose a new file for the GGUF model")
    if out.is_dir():
        raise UsageError(f"-o {out} is a directory; give a file path such as {out / 'model.gguf'}")
    if out.exists():
        raise UsageError(f"-o {out} exists; remove it or choose a new path (it is not replaced)")
    if not out_abs.parent.is_dir():
        raise CheckpointError(f"output directory {out_abs.parent} does not exist; create it first")
    check_writable(out_abs, "-o", shown=out)
    return out_abs


def export_gguf(
    source: str | Path,
    out: str | Path,
    *,
    gguf_type: str = "f16",
    progress: Progress | None = None,
) -> ExportResult:
    """Write the Hugging Face directory ``source`` as the GGUF file ``out`` in ``gguf_type``;
    see the module docstring. ``progress`` sees ``write`` (tensors)."""
    import gguf

    source, out = Path(source), Path(out)
    if gguf_type not in GGUF_TYPES:
        raise UsageError(f"--type {gguf_type!r}: use one of {', '.join(GGUF_TYPES)}")
    out_abs = check_export_output(source, out)
    with open_checkpoint(source) as ckpt:
        config = ckpt.config
        if config is None:
            raise CheckpointError(
                f"{source}: no config.json; convert writes a GGUF file from a Hugging Face "
                "model directory (config.json, weights, tokenizer.json)"
            )
        family = family_of(config, source)
        arch = family.arch
        if not config.get("vocab_size"):
            raise CheckpointError(f"{source}: config.json has no vocab_size")
        tokenizer = read_tokenizer(source, int(config["vocab_size"]), config)
        plan = _plan(ckpt, config, family, gguf_type)
        result = ExportResult(source, out, arch, gguf_type)
        result.kept_f16 = [t.label for t in plan if t.qtype == "f16" and gguf_type[0] == "q"]
        if result.kept_f16:
            result.notes.append(
                f"{plural(len(result.kept_f16), 'matrix', 'matrices')} with rows not a multiple "
                f"of {BLOCK} written f16, not {gguf_type}: {some_names(result.kept_f16)}"
            )
        if tokenizer.get("pre") is None:
            result.notes.append(
                "the tokenizer's pre-tokenizer is not one llama.cpp names: tokenizer.ggml.pre "
                "is left out, and llama.cpp splits text its default way (it warns)"
            )
        provenance = (ckpt.metadata() or {}).get(PROVENANCE_KEY)
        with reclaiming() as result.reclaimed:
            tmp = temp_beside(out_abs)
            writer = None
            try:
                needed = sum(_nbytes(t.shape, t.qtype) for t in plan)
                check_room(out_abs.parent, needed, str(out))
                # owner-only until complete: the writer's open("wb") keeps the mode made here
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE))
                writer = gguf.GGUFWriter(tmp, arch)
                writer.add_name(source.resolve().name)
                writer.add_file_type(FILE_TYPES[gguf_type])
                writer.add_quantization_version(2)
                write_config(writer, config, family)
                write_tokenizer(writer, tokenizer)
                if provenance:
                    writer.add_string(GGUF_PROVENANCE, provenance)
                for t in plan:
                    raw = _gguf_type(t.qtype)
                    writer.add_tensor_info(
                        t.name, _logical(t.shape, t.qtype), _np_dtype(t.qtype),
                        _nbytes(t.shape, t.qtype), raw_dtype=raw,
                    )  # fmt: skip
                writer.write_header_to_file()
                writer.write_kv_data_to_file()
                writer.write_ti_data_to_file()
                for i, t in enumerate(plan):
                    writer.write_tensor_data(_converted(ckpt, t))
                    if progress:
                        progress("write", i + 1, len(plan))
                writer.close()
                put_in_place(tmp, out_abs, like=_weights_file(ckpt))
            except BaseException as e:
                if writer is not None:
                    with contextlib.suppress(Exception):  # its file handle, before the file
                        writer.close()
                remove(tmp)
                if isinstance(e, OSError):
                    raise write_error(e, out) from None
                raise
        for t in plan:
            result.tensors[t.qtype] = result.tensors.get(t.qtype, 0) + 1
            if t.values is None:  # stored, not computed here
                result.parameters += int(np.prod(t.shape))
        result.bytes = out_abs.stat().st_size
    return result


def _weights_file(ckpt: Checkpoint) -> Path:
    return ckpt.path / ckpt.shards[0] if ckpt.is_dir else ckpt.path


def _plan(ckpt: Checkpoint, config: dict, family: Family, gguf_type: str) -> list[_Tensor]:
    """Every tensor's GGUF name, shape and type, in the checkpoint's order (a block's experts
    where its first expert is); anything unmapped (or stored in a sparse encoding, or experts
    missing) refused, naming it."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    plan: list[_Tensor] = []
    stacks: dict[str, dict[int, str]] = {}  # a stacked GGUF name -> expert -> stored name
    unknown: list[str] = []
    for lt in ckpt.logical:
        if len(lt.stored) != 1 or lt.stored[0] != lt.name:
            raise CheckpointError(
                f"tensor {lt.name!r} is stored in a sparse encoding ({', '.join(lt.stored)}); "
                "GGUF holds dense tensors: run sparsetool densify on the model first"
            )
        name, expert = gguf_name(family, lt.name)
        if name is None:
            unknown.append(lt.name)
            continue
        st_dtype = ckpt.entry(lt.name).st_dtype
        if st_dtype not in FLOAT_TYPES:
            raise CheckpointError(
                f"tensor {lt.name!r} is {st_dtype}; a GGUF file is written from floating-point "
                "weights"
            )
        shape = tuple(int(d) for d in lt.shape)
        if expert is not None:
            if name not in stacks:
                stacks[name] = {}
                plan.append(_Tensor((), name, shape, ""))  # placed here, filled in below
            stacks[name][expert] = lt.name
            continue
        permute = 0
        if family.rotary_rows and name.endswith(("attn_q.weight", "attn_k.weight")):
            permute = heads if name.endswith("attn_q.weight") else kv
        shift = family.norm_shift if lt.name.endswith("norm.weight") else 0.0
        qtype = "f32" if len(shape) == 1 or name.endswith("ffn_gate_inp.weight") else gguf_type
        plan.append(_Tensor((lt.name,), name, shape, _fitted(qtype, shape), permute, shift))
    if unknown:
        raise CheckpointError(
            f"{ckpt.path}: {plural(len(unknown), 'tensor')} convert cannot map to GGUF "
            f"({some_names(unknown)}); nothing was written"
        )
    for t in plan:
        if not t.stored:
            t.stored = _experts(ckpt, config, family, stacks[t.name], t.name)
            t.shape = (len(t.stored), *t.shape)
            t.qtype = _fitted(gguf_type, t.shape)
    for name, values in extra_tensors(config, family).items():
        plan.append(_Tensor((), name, values.shape, "f32", values=values))
    return plan


def _fitted(qtype: str, shape: tuple[int, ...]) -> str:
    """``qtype``, or f16 for a block format where the rows are not a multiple of the block."""
    return "f16" if qtype in ("q8_0", "q4_0") and shape[-1] % BLOCK else qtype


def _experts(
    ckpt: Checkpoint, config: dict, family: Family, found: dict[int, str], name: str
) -> tuple[str, ...]:
    """A block's experts' tensors of one projection, in expert order: all of config.json's
    count, of one shape, else refused."""
    count = expert_count(config, family)
    key = expert_key(config, family)
    if sorted(found) != list(range(count)):
        raise CheckpointError(
            f"{ckpt.path}: {plural(len(found), 'expert')} stored for {name} (experts "
            f"{some_names([str(e) for e in sorted(found)])}), where config.json's "
            f"{key} is {count}; llama.cpp reads each block's experts 0 to "
            f"{count - 1}"
        )
    stored = tuple(found[e] for e in range(count))
    shapes = {tuple(ckpt.entry(n).shape) for n in stored}
    if len(shapes) != 1:
        raise CheckpointError(
            f"{ckpt.path}: the experts of {name} differ in shape "
            f"({', '.join(map(str, sorted(shapes)))}); GGUF stacks a block's experts in one tensor"
        )
    return stored


def _gguf_type(qtype: str) -> Any:
    import gguf

    return {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
    }[qtype]


def _np_dtype(qtype: str) -> np.dtype:
    return np.dtype({"f32": np.float32, "f16": np.float16}.get(qtype, np.uint8))


def _nbytes(shape: tuple[int, ...], qtype: str) -> int:
    n = int(np.prod(shape))
    if qtype == "f32":
        return 4 * n
    if qtype in ("f16", "bf16"):
        return 2 * n
    per_block = 34 if qtype == "q8_0" else 18  # a float16 scale and 32 int8 (or 32 4-bit)
    return n // BLOCK * per_block


def _logical(shape: tuple[int, ...], qtype: str) -> tuple[int, ...]:
    """The shape ``add_tensor_info`` takes: the numpy shape of the data written (a byte shape
    for bf16 and the block formats)."""
    if qtype in ("f32", "f16"):
        return shape
    *rows, cols = shape
    return (*rows, _nbytes((cols,), qtype))


def _converted(ckpt: Checkpoint, t: _Tensor) -> np.ndarray:
    """One tensor as written (a block's experts stacked, each converted on its own)."""
    if t.values is not None:
        return t.values
    if len(t.stored) == 1:
        return _converted_one(ckpt, t.stored[0], t)
    first = _converted_one(ckpt, t.stored[0], t)
    out = np.empty((len(t.stored), *first.shape), dtype=first.dtype)
    out[0] = first
    del first
    for i, stored in enumerate(t.stored[1:], 1):
        out[i] = _converted_one(ckpt, stored, t)
    return out


def _converted_one(ckpt: Checkpoint, stored: str, t: _Tensor) -> np.ndarray:
    """One stored tensor as written: read (numpy, no torch), in float32, reordered for llama's
    rotary layout, shifted (Gemma's norms), converted; a bf16 tensor written bf16 keeps its
    stored bits."""
    import gguf

    st = ckpt.entry(stored)
    raw = ckpt.read_array(stored).reshape(st.shape)  # the stored bit patterns
    if t.qtype == "bf16" and st.st_dtype == "BF16" and not t.shift:  # as stored, bit for bit
        data = raw.view(np.uint8).reshape(*st.shape[:-1], -1)
        if t.permute_heads:
            data = _rotary_order(data, t.permute_heads)
        return np.ascontiguousarray(data)
    w = _float32(raw, st.st_dtype, stored)
    if t.permute_heads:
        w = _rotary_order(w, t.permute_heads)
    if t.shift:
        w = w + np.float32(t.shift)
    if t.qtype == "f32":
        return np.ascontiguousarray(w, dtype=np.float32)
    if t.qtype == "f16":
        return np.ascontiguousarray(w.astype(np.float16))
    try:
        return gguf.quants.quantize(np.ascontiguousarray(w), _gguf_type(t.qtype))
    except Exception as e:  # the quantizer's own complaint, named
        raise SparsetoolError(f"tensor {stored!r}: {t.qtype}: {e}") from None


def _float32(raw: np.ndarray, st_dtype: str, name: str) -> np.ndarray:
    """Stored bit patterns (``raw``, signed integers of the type's width) as float32 values."""
    if st_dtype == "F32":
        return raw.view(np.float32)
    if st_dtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    if st_dtype == "BF16":  # the upper half of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if st_dtype == "F64":
        return raw.view(np.float64).astype(np.float32)
    raise CheckpointError(
        f"tensor {name!r} is {st_dtype}; a GGUF file is written from floating-point weights"
    )


def _rotary_order(w: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection's rows, per head, from transformers' rotary layout (the first
    half of a head's dimensions paired with the second) to llama.cpp's (pairs side by side)."""
    rows = w.shape[0]
    head_dim = rows // heads
    return (
        w.reshape(heads, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(rows, *w.shape[1:])
    )
