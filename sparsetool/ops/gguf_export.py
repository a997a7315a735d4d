"""A Hugging Face directory out to a GGUF file (llama.cpp's format): ``sparsetool convert DIR -o
FILE.gguf``.

What is written, for the ``llama`` (Llama, SmolLM2; RoPE without scaling), ``qwen2``
(attention biases) and ``qwen3`` (q/k norms) architectures, with any widths and depth
``shrink`` writes (an explicit ``head_dim``, any FFN width, fewer blocks):

- the config as llama.cpp's keys (``{arch}.block_count``, ``embedding_length``,
  ``feed_forward_length``, ``attention.head_count[_kv]``, ``attention.key_length`` and
  ``value_length``, ``rope.dimension_count`` and ``freq_base``, the norm's epsilon, the context);
- the tokenizer (a byte-level BPE's ``tokenizer.json``: tokens in id order with their types,
  merges, the special tokens' ids, ``add_bos_token``, the chat template; ``tokenizer.ggml.pre``
  named from its pre-tokenizer when it is one llama.cpp knows, else left out, which llama.cpp
  reads as its default split and says so);
- every tensor under llama.cpp's name, one at a time (read without torch, converted, written,
  dropped: the largest tensor in memory, never the model), in ``--type``: ``f32``, ``f16``,
  ``bf16``, or the block formats ``q8_0`` and ``q4_0`` (32 weights a block; a matrix whose rows
  are not a multiple of 32 is written f16, as llama.cpp does, and said). Norms and biases stay
  f32. ``llama``'s query and key rows are reordered for llama.cpp's rotary layout (what
  transformers' reader undoes); ``qwen2``/``qwen3`` rotate as stored.
- sparsetool's provenance (how the model was pruned or shrunk) as ``sparsetool.provenance``.

GGUF holds every matrix dense: a pruned model's zeros are written as zeros, the file as large as
the dense one; ``q8_0``/``q4_0`` keep a zero exactly (each block's scale times 0) but round the
weights beside it.

The file is written beside the output (owner-only until complete) and renamed into place at the
end: an error, Ctrl-C or a full disk leave nothing, and a kill leaves a temporary the next run in
that directory removes. What cannot be mapped (an architecture, RoPE scaling, a tensor, a type
that is not floating point, a tokenizer that is not a byte-level BPE or is longer than the
embeddings, a sparse encoding) is one error before anything is written.
"""

from __future__ import annotations

import contextlib
import json
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
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural, some_names

__all__ = ["ARCHITECTURES", "ExportResult", "export_gguf"]

ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
"""config.json's ``model_type`` -> the GGUF architecture written."""
BLOCK = 32  # weights in a q8_0 / q4_0 block
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # the stored types a GGUF file is written from
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # llama.cpp's general.file_type

_BLOCK_NAMES = {  # a block's tensor, after "model.layers.N.", -> llama.cpp's, after "blk.N."
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_OUTER_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
# pre-tokenizer regexes llama.cpp names (tokenizer.json's Split pattern -> tokenizer.ggml.pre)
_GPT2_SPLIT = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
_QWEN2_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_LLAMA3_SPLIT = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)


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
    stored: str  # its name in the checkpoint
    name: str  # its GGUF name
    shape: tuple[int, ...]
    qtype: str  # what it is written as
    permute_heads: int = 0  # llama's q/k: reordered for the rotary layout, in this many heads


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
        arch = ARCHITECTURES.get(str(config.get("model_type")))
        if arch is None:
            raise CheckpointError(
                f"{source}: model_type {config.get('model_type')!r} is not one convert writes "
                f"as GGUF yet; it writes {', '.join(sorted(ARCHITECTURES))}"
            )
        rope = config.get("rope_scaling") or config.get("rope_parameters") or {}
        scaling = rope.get("rope_type") or rope.get("type") or "default"
        if scaling != "default":
            raise CheckpointError(
                f"{source}: RoPE scaling {scaling!r} (config.json), which convert does not write "
                "into GGUF yet (llama.cpp would run the model without it)"
            )
        if not config.get("vocab_size"):
            raise CheckpointError(f"{source}: config.json has no vocab_size")
        tokenizer = _tokenizer(source, int(config["vocab_size"]), config)
        plan = _plan(ckpt, config, arch, gguf_type)
        result = ExportResult(source, out, arch, gguf_type)
        result.kept_f16 = [t.stored for t in plan if t.qtype == "f16" and gguf_type[0] == "q"]
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
                _metadata(writer, config, arch, gguf_type, source.resolve().name)
                _tokenizer_metadata(writer, tokenizer)
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
            result.parameters += int(np.prod(t.shape))
        result.bytes = out_abs.stat().st_size
    return result


def _weights_file(ckpt: Checkpoint) -> Path:
    return ckpt.path / ckpt.shards[0] if ckpt.is_dir else ckpt.path


def _plan(ckpt: Checkpoint, config: dict, arch: str, gguf_type: str) -> list[_Tensor]:
    """Every tensor's GGUF name, shape and type, in the checkpoint's order; anything unmapped
    (or stored in a sparse encoding) refused, naming it."""
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    plan: list[_Tensor] = []
    unknown: list[str] = []
    for lt in ckpt.logical:
        if len(lt.stored) != 1 or lt.stored[0] != lt.name:
            raise CheckpointError(
                f"tensor {lt.name!r} is stored in a sparse encoding ({', '.join(lt.stored)}); "
                "GGUF holds dense tensors: run sparsetool densify on the model first"
            )
        name = _OUTER_NAMES.get(lt.name)
        parts = lt.name.split(".")
        if name is None and lt.name.startswith("model.layers.") and parts[2].isdigit():
            inner = _BLOCK_NAMES.get(".".join(parts[3:]))
            name = f"blk.{parts[2]}.{inner}" if inner else None
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
        qtype = "f32" if len(shape) == 1 else gguf_type
        if qtype in ("q8_0", "q4_0") and shape[-1] % BLOCK:
            qtype = "f16"
        permute = 0
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            permute = heads if name.endswith("attn_q.weight") else kv
        plan.append(_Tensor(lt.name, name, shape, qtype, permute))
    if unknown:
        raise CheckpointError(
            f"{ckpt.path}: {plural(len(unknown), 'tensor')} convert cannot map to GGUF "
            f"({some_names(unknown)}); nothing was written"
        )
    return plan


def _metadata(writer: Any, config: dict, arch: str, gguf_type: str, name: str) -> None:
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    rope = config.get("rope_parameters") or {}
    theta = config.get("rope_theta") or rope.get("rope_theta") or 10000.0
    writer.add_name(name)
    writer.add_file_type(FILE_TYPES[gguf_type])
    writer.add_quantization_version(2)
    writer.add_context_length(int(config.get("max_position_embeddings") or 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps") or 1e-6))
    writer.add_vocab_size(int(config["vocab_size"]))  # checked before


def _tokenizer(source: Path, rows: int, config: dict) -> dict:
    """The tokenizer's tokens (id order, padded with unused ones to the embedding's ``rows``),
    types, merges, special ids, flags and chat template, from ``tokenizer.json`` and
    ``tokenizer_config.json``; a tokenizer that is not a byte-level BPE refused."""
    path = source / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(
            f"{source}: no tokenizer.json; a GGUF file carries the tokenizer, and convert reads "
            "it from tokenizer.json (save the model's tokenizer with transformers first)"
        )
    data = json.loads(path.read_text())
    model = data.get("model") or {}
    if model.get("type") != "BPE" or not _byte_level(data):
        raise CheckpointError(
            f"{path}: a {model.get('type')} tokenizer; convert writes byte-level BPE tokenizers "
            "(GPT-2's kind: Llama 3, SmolLM2, Qwen) into GGUF"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    added = {a["content"]: a for a in data.get("added_tokens", [])}
    for content, a in added.items():
        vocab[content] = a["id"]
    if max(vocab.values()) + 1 > rows:
        raise CheckpointError(
            f"{path}: {plural(max(vocab.values()) + 1, 'token')}, more than the "
            f"{rows:,} rows of the embeddings (config.json's vocab_size); llama.cpp would refuse "
            "the file"
        )
    size = rows
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size  # unused
    for token, i in vocab.items():
        tokens[i] = token
        a = added.get(token)
        types[i] = 1 if a is None else (3 if a.get("special") else 4)  # normal, control, user
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    cfg_path = source / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    template = cfg.get("chat_template")
    jinja = source / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text()

    def token_id(key: str) -> int | None:
        value = cfg.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str) and value in vocab:
            return vocab[value]
        fallback = config.get(f"{key}_id")  # config.json's bos_token_id, eos_token_id, ...
        return fallback if isinstance(fallback, int) else None

    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "pre": _pre_name(data.get("pre_tokenizer")),
        "bos": token_id("bos_token"),
        "eos": token_id("eos_token"),
        "unk": token_id("unk_token"),
        "pad": token_id("pad_token"),
        "add_bos": _adds_bos(cfg, data, token_id("bos_token"), vocab),
        "template": template if isinstance(template, str) else None,
    }


def _adds_bos(cfg: dict, data: dict, bos: int | None, vocab: dict[str, int]) -> bool:
    """Whether encoding puts the BOS token first: tokenizer_config.json's ``add_bos_token``, else
    whether tokenizer.json's post-processor template starts a text with it (so llama.cpp, which
    reads ``tokenizer.ggml.add_bos_token``, does as transformers does)."""
    if isinstance(cfg.get("add_bos_token"), bool):
        return bool(cfg["add_bos_token"])
    post = data.get("post_processor") or {}
    steps = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for step in steps:
        single = step.get("single") if step.get("type") == "TemplateProcessing" else None
        first = (single or [{}])[0].get("SpecialToken", {}).get("id")
        if first is not None and bos is not None and vocab.get(first) == bos:
            return True
    return False


def _byte_level(data: dict) -> bool:
    """Whether the tokenizer maps bytes to characters as GPT-2 does (its pre-tokenizer or decoder
    is ByteLevel)."""

    def has(node: Any) -> bool:
        if isinstance(node, dict):
            return node.get("type") == "ByteLevel" or any(has(v) for v in node.values())
        if isinstance(node, list):
            return any(has(v) for v in node)
        return False

    return has(data.get("pre_tokenizer")) or has(data.get("decoder"))


def _pre_name(pre: Any) -> str | None:
    """llama.cpp's name for the pre-tokenizer (how text is split before the merges), or None."""
    if not isinstance(pre, dict):
        return None
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return None if pre.get("add_prefix_space") else "gpt-2"
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps:
        return None
    kinds = [s.get("type") for s in steps]
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm" if steps[1].get("use_regex", True) else None
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        pattern = (steps[0].get("pattern") or {}).get("Regex")
        return {_QWEN2_SPLIT: "qwen2", _LLAMA3_SPLIT: "llama-bpe", _GPT2_SPLIT: "gpt-2"}.get(
            pattern or ""
        )
    return None


def _tokenizer_metadata(writer: Any, tok: dict) -> None:
    writer.add_tokenizer_model("gpt2")
    if tok["pre"]:
        writer.add_tokenizer_pre(tok["pre"])
    writer.add_token_list(tok["tokens"])
    writer.add_token_types(tok["types"])
    writer.add_token_merges(tok["merges"])
    for key, add in (
        ("bos", writer.add_bos_token_id),
        ("eos", writer.add_eos_token_id),
        ("unk", writer.add_unk_token_id),
        ("pad", writer.add_pad_token_id),
    ):
        if tok[key] is not None:
            add(tok[key])
    writer.add_add_bos_token(bool(tok["add_bos"]))
    if tok["template"]:
        writer.add_chat_template(tok["template"])


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
    """One tensor as written: read (numpy, no torch), in float32, reordered for llama's rotary
    layout, converted; a bf16 tensor written bf16 keeps its stored bits."""
    import gguf

    st = ckpt.entry(t.stored)
    raw = ckpt.read_array(t.stored).reshape(st.shape)  # the stored bit patterns
    if t.qtype == "bf16" and st.st_dtype == "BF16":  # as stored, bit for bit
        data = raw.view(np.uint8).reshape(*st.shape[:-1], -1)
        if t.permute_heads:
            data = _rotary_order(data, t.permute_heads)
        return np.ascontiguousarray(data)
    w = _float32(raw, st.st_dtype, t.stored)
    if t.permute_heads:
        w = _rotary_order(w, t.permute_heads)
    if t.qtype == "f32":
        return np.ascontiguousarray(w, dtype=np.float32)
    if t.qtype == "f16":
        return np.ascontiguousarray(w.astype(np.float16))
    try:
        return gguf.quants.quantize(np.ascontiguousarray(w), _gguf_type(t.qtype))
    except Exception as e:  # the quantizer's own complaint, named
        raise SparsetoolError(f"tensor {t.stored!r}: {t.qtype}: {e}") from None


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
