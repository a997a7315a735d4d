"""``sparsetool convert``: a GGUF file into a Hugging Face directory the other commands read."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from sparsetool.cli._output import (
    console,
    decimal_bytes,
    emit_json,
    failing_cleanly,
    note_reclaimed,
    progress_bar,
)
from sparsetool.cli._params import (
    ComputeDType,
    compute_dtype_option,
    given,
    json_option,
    output_option,
    quiet_option,
    usage_error,
    value_of,
)
from sparsetool.ops.convert import GGUF_TYPES
from sparsetool.util.wording import plural

EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool convert SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2/",
    "sparsetool convert model.Q8_0.gguf -o model-bf16/ --dtype bfloat16 --json",
    "sparsetool convert smollm2-narrow/ -o smollm2-narrow.q8_0.gguf --type q8_0",
)


def convert(
    gguf: Path = typer.Argument(
        ...,
        metavar="FILE.gguf|DIR",
        help="A GGUF file (llama.cpp's format), quantized or not; or a Hugging Face directory "
        "to write as one.",
        show_default=False,
    ),
    output: Path | None = output_option(
        "Where to write: a new directory (from a GGUF file) or a new .gguf file (from a directory)."
    ),
    dtype: ComputeDType = compute_dtype_option(
        "Type of the written weights: float32 holds the dequantized values exactly, bfloat16 in "
        "half the size (rounded once)."
    ),
    gguf_type: str | None = typer.Option(
        None,
        "--type",
        metavar="|".join(GGUF_TYPES),
        help="A directory into GGUF: the matrices' type (default f16; q8_0 and q4_0 are "
        "llama.cpp's 32-weight blocks, a matrix whose rows are not a multiple of 32 stays f16; "
        "norms and biases stay f32).",
    ),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Convert a GGUF file into a Hugging Face directory, or a directory into a GGUF file.

    transformers reads the file (what it cannot map to a model is refused, naming the
    architecture); its config and tokenizer come from the file's metadata. The output holds
    config.json, generation_config.json, model.safetensors and the tokenizer's files, which
    every other command (and transformers' from_pretrained) reads.

    A directory in (Llama, SmolLM2, Qwen2, Qwen3, Qwen3-MoE, Mixtral, Gemma-3, with whatever
    shrink made of them) makes a GGUF file llama.cpp runs: config, tokenizer (a BPE's)
    and provenance in its metadata, every tensor streamed in --type. GGUF stores pruned weights
    dense (zeros as zeros). Needs the convert extra (transformers and gguf). The input is never
    modified; the output appears only when complete.
    """
    if output is None:
        usage_error("give -o OUTPUT: a new directory (from a GGUF file) or a new .gguf file")
        return
    if gguf.is_dir():
        if given("dtype"):
            usage_error("--dtype is for a GGUF file in; a directory into GGUF takes --type")
        if gguf_type is not None and gguf_type not in GGUF_TYPES:
            usage_error(f"--type {gguf_type!r}: use one of {', '.join(GGUF_TYPES)}")
        _export(gguf, output, gguf_type or "f16", quiet, as_json)
        return
    if gguf_type is not None:
        usage_error("--type is for a directory into GGUF; a GGUF file in takes --dtype")
    from sparsetool.ops.convert import convert_gguf

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = convert_gguf(gguf, output, dtype=value_of(dtype), progress=progress)
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
        return
    types = ", ".join(f"{n} {t}" for t, n in result.ggml_types.items())
    console.print(
        f"converted {escape(result.source.name)} ({result.architecture}; {types}) into "
        f"{result.model_class}: {plural(result.parameters, 'parameter')} in {result.dtype}, "
        f"{decimal_bytes(result.bytes)}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)


def _export(source: Path, output: Path, gguf_type: str, quiet: bool, as_json: bool) -> None:
    from sparsetool.ops.gguf_export import export_gguf

    with failing_cleanly(), progress_bar(not (as_json or quiet)) as progress:
        result = export_gguf(source, output, gguf_type=gguf_type, progress=progress)
    note_reclaimed(result.reclaimed)
    if as_json:
        emit_json(result.to_json())
        return
    types = ", ".join(f"{n} {t}" for t, n in result.tensors.items())
    console.print(
        f"converted {escape(str(source))} ({result.architecture}) into GGUF: "
        f"{plural(result.parameters, 'parameter')} ({types}), {decimal_bytes(result.bytes)}",
        highlight=False,
        soft_wrap=True,
    )
    if not quiet:
        for note in result.notes:
            console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"wrote {escape(str(result.output))}", highlight=False, soft_wrap=True)
