"""A GGUF file (llama.cpp's format) as a plain transformers model and its tokenizer.

transformers reads the file itself (``from_pretrained(..., gguf_file=...)``): the config and the
tokenizer from the file's metadata, every tensor dequantized. What it cannot map is refused in one
error naming the file and its architecture. The weights are then moved into a model built from
the same config without the GGUF quantization config (transformers refuses to save a model that
carries it), on the meta device first so the weights are held once, not twice.

transformers comes through :func:`sparsetool.models.hf.import_transformers`; its GGUF modules are
only looked up once its own loading has imported them (the list of architectures it maps, for the
error). Its logging, progress bars and warnings are silenced while it reads: the command shows its
own progress.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint.gguf_file import GGUFHeader
from sparsetool.errors import SparsetoolError
from sparsetool.models.hf import import_transformers

__all__ = ["CONVERT_EXTRA", "DTYPES", "GGUFModel", "load_gguf", "mapped_architectures"]

CONVERT_EXTRA = "pip install -e '.[convert]' (source checkout) or pip install 'sparsetool[convert]'"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""The types the dequantized weights can be written in."""

# Keys of the config transformers builds from a GGUF file that describe the file, not the model.
_FILE_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")
# Top-level keys of transformers' GGUF config mapping that are not architectures.
_NOT_ARCHITECTURES = {"general", "tokenizer"}


class GGUFModel:
    """What :func:`load_gguf` read: the config, the plain model (its weights dequantized) and the
    tokenizer, all as transformers objects."""

    def __init__(self, transformers: Any, config: Any, model: Any, tokenizer: Any) -> None:
        self.transformers = transformers
        self.config, self.model, self.tokenizer = config, model, tokenizer

    @property
    def parameters(self) -> int:
        """Parameters of the model, a tied head counted once."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (what model.safetensors holds, its header aside)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def save(self, directory: Path, step: Callable[[], None] | None = None) -> None:
        """Write the model (config.json, generation_config.json, model.safetensors) and then the
        tokenizer's files into the existing ``directory``; ``step`` after each."""
        tick = step or (lambda: None)
        try:
            with _silenced(self.transformers):
                self.model.save_pretrained(directory)
        except Exception as e:  # safetensors' writer reports the system's error as its own
            code = re.search(r"\(os error (\d+)\)", str(e))
            if code is None or isinstance(e, OSError):
                raise
            raise OSError(int(code[1]), os.strerror(int(code[1]))) from None
        tick()
        with _silenced(self.transformers):
            self.tokenizer.save_pretrained(directory)
        tick()


# What transformers needs to read a GGUF file (the convert extra); gguf and accelerate are
# imported by transformers only.
_PACKAGES = ("transformers", "gguf", "accelerate")


def _installed(name: str) -> bool:
    if name in sys.modules:  # None there: a blocked import
        return sys.modules[name] is not None
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _needs_packages() -> Any:
    """transformers, or the error saying which extra installs what converting needs."""
    missing = [name for name in _PACKAGES if not _installed(name)]
    if missing:
        named = " and ".join([", ".join(missing[:-1]), missing[-1]] if missing[1:] else missing)
        raise SparsetoolError(
            f"converting a GGUF file needs {named}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {CONVERT_EXTRA}"
        )
    return import_transformers("converting a GGUF file into")


@contextlib.contextmanager
def _silenced(transformers: Any) -> Iterator[None]:
    """transformers' info and warning lines, progress bars (its own and tqdm's) and Python
    warnings kept off stderr while it reads the file; everything is restored after."""
    log = transformers.utils.logging
    verbosity, bars = log.get_verbosity(), log.is_progress_bar_enabled()
    log.set_verbosity_error()
    log.disable_progress_bar()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        log.set_verbosity(verbosity)
        if bars:
            log.enable_progress_bar()


def mapped_architectures() -> list[str]:
    """The GGUF architectures the transformers in use maps to a model, once its GGUF loading has
    been imported (else an empty list)."""
    found: set[str] = set()
    legacy = sys.modules.get("transformers.modeling_gguf_pytorch_utils")
    found |= set(getattr(legacy, "GGUF_SUPPORTED_ARCHITECTURES", ()))
    fast = sys.modules.get("transformers.integrations.gguf.gguf_conversion_mapping")
    found |= set(getattr(fast, "GGUF_ARCHS", ()))
    return sorted(found - _NOT_ARCHITECTURES)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def load_gguf(
    header: GGUFHeader, dtype: str = "float32", step: Callable[[], None] | None = None
) -> GGUFModel:
    """The GGUF file of ``header`` as a plain transformers causal LM with weights of ``dtype``
    (a key of :data:`DTYPES`) and its tokenizer. ``step`` is called after each of the three reads
    (config, weights, tokenizer)."""
    transformers = _needs_packages()
    path = header.path
    arch = header.architecture
    if arch is None:
        raise SparsetoolError(
            f"{path}: the GGUF file names no architecture (no general.architecture key); "
            "re-export it with a current llama.cpp"
        )
    folder, name = str(path.parent.resolve()), path.name
    where = dict(gguf_file=name, local_files_only=True)
    tick = step or (lambda: None)
    try:
        with _silenced(transformers):
            config = transformers.AutoConfig.from_pretrained(folder, **where)
    except Exception as e:  # transformers raises ValueError, KeyError, ... by architecture
        known = mapped_architectures()
        if arch not in known and (not known or "not supported" in str(e)):
            listed = f" (it maps {', '.join(known)})" if known else ""
            raise SparsetoolError(
                f"{path}: GGUF architecture {arch!r} is not one transformers "
                f"{transformers.__version__} can map to a model{listed}; convert reads only "
                "what transformers can load"
            ) from None
        raise SparsetoolError(
            f"{path}: transformers cannot read the GGUF metadata of this {arch!r} file "
            f"({_first_line(e)})"
        ) from None
    tick()  # outside the silenced blocks: the progress goes to stderr
    causal = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if config.model_type not in causal:
        raise SparsetoolError(
            f"{path}: GGUF architecture {arch!r} is transformers' {config.model_type!r}, not "
            "a causal language model; sparsetool works on causal (decoder-only) models only"
        )
    gguf_config = getattr(transformers, "GgufConfig", None)
    # the config read once: parsing a large vocabulary's metadata takes seconds
    options: dict[str, Any] = dict(where, config=copy.deepcopy(config), dtype=DTYPES[dtype])
    if gguf_config is not None:  # every weight unpacked, whatever kernels are installed
        options["quantization_config"] = gguf_config(dequantize=True)
    try:
        with _silenced(transformers):
            quantized = transformers.AutoModelForCausalLM.from_pretrained(folder, **options)
    except Exception as e:
        raise SparsetoolError(
            f"{path}: transformers cannot load the weights of this {arch!r} file (ggml types "
            f"{', '.join(header.ggml_types())}; {_first_line(e)})"
        ) from None
    tick()
    try:
        with _silenced(transformers):
            tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **where)
    except Exception as e:
        model = header.metadata.get("tokenizer.ggml.model")
        raise SparsetoolError(
            f"{path}: transformers cannot build the tokenizer from the file's metadata "
            f"(tokenizer.ggml.model {model!r}; {_first_line(e)})"
        ) from None
    tick()
    plain_config = copy.deepcopy(config)
    for key in _FILE_KEYS:
        if hasattr(plain_config, key):
            delattr(plain_config, key)
    with torch.device("meta"):  # no weights allocated: the loaded ones are moved in
        plain = transformers.AutoModelForCausalLM.from_config(plain_config)
    plain.load_state_dict(quantized.state_dict(), assign=True)
    if getattr(plain_config, "tie_word_embeddings", False):
        plain.tie_weights()  # one tensor again for the embedding and the head
    del quantized
    return GGUFModel(transformers, plain_config, plain, tokenizer)
