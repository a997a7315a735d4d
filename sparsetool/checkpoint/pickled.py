"""PyTorch's own checkpoint files (``torch.save``: a zip archive or a bare pickle), recognised
from their first bytes or their names, and never unpickled: sparsetool reads safetensors only and
says how to convert. Loading a pickle runs whatever code the file names; sparsetool never does.

Imports neither torch nor numpy.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from sparsetool.errors import CheckpointError

# Names PyTorch checkpoints go by (``pytorch_model.bin``, ``model.pt``, Lightning's ``.ckpt``).
SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_ZIP_MAGIC = b"PK\x03\x04"


def convert_hint(src: str, dst: str) -> str:
    return (
        'python -c "import torch; from safetensors.torch import save_file; '
        f"save_file({{k: v.clone().contiguous() for k, v in torch.load('{src}', "
        f"weights_only=True).items()}}, '{dst}')\""
    )


def kind(path: Path, prefix: bytes) -> str | None:
    """What PyTorch format ``path`` (whose first bytes are ``prefix``) is in, if any.

    Asked only about a file that failed as safetensors: a valid safetensors header length can
    begin with the same byte as a pickle.
    """
    if prefix.startswith(_ZIP_MAGIC):
        try:
            with zipfile.ZipFile(path) as z:  # the listing only; nothing is extracted
                names = z.namelist()
        except (OSError, zipfile.BadZipFile):
            names = []
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "a PyTorch checkpoint (torch.save zip archive)"
        return "a zip archive"
    if len(prefix) >= 2 and prefix[0] == 0x80 and 2 <= prefix[1] <= 5:
        return "a Python pickle (as PyTorch's legacy torch.save writes)"
    if path.suffix.lower() in SUFFIXES:
        return f"named like a PyTorch checkpoint ({path.suffix})"
    return None


def file_error(path: Path, prefix: bytes) -> CheckpointError | None:
    """The error for a file in a PyTorch format, or None when it is not one."""
    what = kind(path, prefix)
    if what is None:
        return None
    out = path.with_suffix(".safetensors").name
    return CheckpointError(
        f"{path}: {what}, not a safetensors file. sparsetool reads safetensors only and never "
        f"unpickles a file (loading a pickle can run code). Convert it once (weights_only=True "
        f"loads tensors only): {convert_hint(str(path), str(path.with_name(out)))}"
    )


def dir_error(path: Path) -> CheckpointError | None:
    """The error for a directory whose weights are PyTorch files only, or None."""
    found = sorted(
        p.name
        for p in path.iterdir()
        if p.is_file() and p.suffix.lower() in SUFFIXES and p.name != "training_args.bin"
    )
    if not found:
        return None
    shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
    hint = convert_hint(
        str(path / found[0]), str(path / Path(found[0]).with_suffix(".safetensors").name)
    )
    return CheckpointError(
        f"{path}: holds PyTorch weight files ({shown}) and no .safetensors file. sparsetool reads "
        "safetensors only and never unpickles a file (loading a pickle can run code). Convert "
        "each file once (weights_only=True loads tensors only), e.g. "
        f"{hint}; a sharded model also needs model.safetensors.index.json (transformers' "
        "save_pretrained writes both)"
    )
