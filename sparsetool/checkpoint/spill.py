"""Tensors that wait on disk until the writer needs them (``shrink``'s refit weights): one
temporary directory beside the output, named as
:func:`~sparsetool.checkpoint.output_files.temp_beside` names temporaries (so a killed run's is
reclaimed), one safetensors file per tensor, one tensor in memory at a time; the directory goes
when the spill is closed, also on an error."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import temp_beside

__all__ = ["TensorSpill"]


class TensorSpill:
    """``with TensorSpill(out) as spill: spill.put(name, t); ...; spill.get(name)``."""

    def __init__(self, out: str | Path):
        self.directory = temp_beside(Path(out))
        self.directory.mkdir()
        self._files: dict[str, Path] = {}

    def put(self, name: str, tensor: Any) -> None:
        from safetensors.torch import save_file

        path = self.directory / f"{len(self._files)}.safetensors"
        save_file({name: tensor.contiguous()}, str(path))
        self._files[name] = path

    def get(self, name: str) -> Any:
        from safetensors.torch import load_file

        return load_file(str(self._files[name]))[name]

    def __contains__(self, name: object) -> bool:
        return name in self._files

    def close(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> TensorSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
