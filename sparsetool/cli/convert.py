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
    json_option,
    output_option,
    quiet_option,
    usage_error,
    value_of,
)
from sparsetool.util.wording import plural

EXAMPLES = (  # the end of --help: each runs as written (given the files named)
    "sparsetool convert SmolLM2-135M-Instruct.Q4_1.gguf -o smollm2/",
    "sparsetool convert model.Q8_0.gguf -o model-bf16/ --dtype bfloat16 --json",
)


def convert(
    gguf: Path = typer.Argument(
        ...,
        metavar="FILE.gguf",
        help="A GGUF file (llama.cpp's format), quantized or not.",
        show_default=False,
    ),
    output: Path | None = output_option("Where to write the Hugging Face directory (a new one)."),
    dtype: ComputeDType = compute_dtype_option(
        "Type of the written weights: float32 holds the dequantized values exactly, bfloat16 in "
        "half the size (rounded once)."
    ),
    quiet: bool = quiet_option(),
    as_json: bool = json_option(),
) -> None:
    """Convert a GGUF file into a Hugging Face directory: weights dequantized, config, tokenizer.

    transformers reads the file (what it cannot map to a model is refused, naming the
    architecture); its config and tokenizer come from the file's metadata. The output holds
    config.json, generation_config.json, model.safetensors and the tokenizer's files, which
    every other command (and transformers' from_pretrained) reads. Needs the convert extra
    (transformers and gguf). The input is never modified; the output appears only when complete.
    """
    if output is None:
        usage_error("give -o OUTPUT, a new directory for the converted model")
        return
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
