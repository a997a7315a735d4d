"""A Hugging Face causal-LM directory as a PyTorch model: its config, its tokenizer, its weights.

Shared by the streamed model of eval and calibration pruning (:mod:`sparsetool.models.open`) and
``sparsetool train --init HF_DIR`` (:mod:`sparsetool.train.hfrun`). The model is built from ``config.json`` (never with remote code)
and its weights are decoded by sparsetool, so every encoding (zeros, mask, nan, bitmask) loads
alike. transformers is imported only here, and only when a Hugging Face directory is used.

No code from the checkpoint directory ever runs: the config's ``auto_map`` (classes in ``.py``
files beside the weights) is dropped, transformers is told ``trust_remote_code=False`` (without it,
it asks on the terminal whether to run such code), and no module named in a config is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from sparsetool.checkpoint.config import drop_sparsity_config
from sparsetool.errors import SparsetoolError

__all__ = ["HF_EXTRA", "MAX_DEFAULT_SEQ", "TOKENIZER_FILES", "context_of", "hf_config",
           "import_transformers", "load_tokenizer", "match_names", "match_weights"]

MAX_DEFAULT_SEQ = 2048  # default window for models trained on long contexts (CPU memory, time)
HF_EXTRA = "pip install -e '.[hf]' (source checkout) or pip install 'sparsetool[hf]'"
# Buffers old GPT-2 checkpoints stored; today's transformers computes them.
_LEGACY_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model", "tiktoken.model")


def import_transformers(doing: str = "evaluating"):
    try:
        import transformers
    except ImportError:
        raise SparsetoolError(
            f"{doing} a Hugging Face model needs transformers, which is not installed: {HF_EXTRA}"
        ) from None
    return transformers


def hf_config(path: Path, config: dict | None, transformers, command: str = "eval",
              needs: str | None = None):
    """transformers' config object of a causal LM directory; anything else is refused (``needs``,
    if given, ends that error: what the caller does with the model)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if config is None:
        raise SparsetoolError(f"{path}: no config.json; {command} needs a Hugging Face model directory "
                              "(config.json, weights, tokenizer files) or a checkpoint of sparsetool train")
    # The compressed-tensors block describes how weights are stored, which sparsetool decodes itself.
    config = drop_sparsity_config(config)
    config = {k: v for k, v in config.items() if k != "auto_map"}  # classes in the directory's .py files
    model_type = config.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise SparsetoolError(f"{path}/config.json: model_type {model_type!r} is not a causal language "
                              f"model transformers knows; {needs or _does(command) + ' next-token prediction only'}")
    rest = {k: v for k, v in config.items() if k != "model_type"}
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **rest)
    except Exception as e:  # transformers raises many types for a bad config
        raise SparsetoolError(f"{path}/config.json: transformers cannot read it ({e})") from None
    bidirectional = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(cfg, "is_decoder", False)
    if getattr(cfg, "is_encoder_decoder", False) or bidirectional:
        arch = ", ".join(config.get("architectures") or [model_type])
        raise SparsetoolError(f"{path}: {arch} is not a causal language model (an encoder sees the "
                              f"tokens it should predict); {needs or _does(command) + ' decoder-only models'}")
    return cfg


def _does(command: str) -> str:
    return "eval scores" if command == "eval" else f"{command} trains"


def context_of(cfg) -> int:
    """The longest sequence the model of ``cfg`` takes."""
    for attr in ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_sequence_length"):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return MAX_DEFAULT_SEQ


def load_tokenizer(path: Path, transformers):
    """The directory's own tokenizer (local files only)."""
    def refuse(why: str) -> SparsetoolError:
        return SparsetoolError(
            f"{path}: no usable tokenizer ({why}); copy the tokenizer files of the original model "
            "(tokenizer.json or its vocabulary files, tokenizer_config.json) into this directory")

    # transformers 5 builds an empty tokenizer from config.json alone: look for the files first
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise refuse(f"none of {', '.join(TOKENIZER_FILES)}")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                                         trust_remote_code=False)
    except Exception as e:  # broken files surface as OSError, ValueError or TypeError by version
        if "custom code" in str(e):
            raise SparsetoolError(
                f"{path}/tokenizer_config.json asks for a tokenizer class from the directory's own "
                "Python files (auto_map), and sparsetool never runs code from a checkpoint; set its "
                "tokenizer_class to a transformers class (PreTrainedTokenizerFast reads tokenizer.json)"
            ) from None
        raise refuse(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cannot load'}") from None
    if len(tok) <= len(getattr(tok, "all_special_ids", [])):
        raise refuse("its vocabulary is empty")
    return tok


def _renamer(model: torch.nn.Module, command: str) -> Callable[[Path, str], str]:
    """transformers' own checkpoint -> model renames (GPT-NeoX ``embed_out`` -> ``lm_head``...).

    Conversions that merge several tensors into one (per-expert weights stacked) are refused:
    tensors are loaded one to one.
    """
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_converters, apply_renamings

    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if not isinstance(t, WeightRenaming)]

    def rename(path: Path, name: str) -> str:
        new = apply_renamings(name, renamings)
        if apply_converters(new, converters)[1] is not None:
            raise SparsetoolError(f"{path}: tensor {name!r} is stored in a layout transformers converts "
                                  f"on loading (several tensors merged into one); {command} does not "
                                  "support this model's checkpoints yet")
        return new

    return rename


def match_names(path: Path, model: torch.nn.Module, shapes: dict[str, tuple[int, ...]],
                command: str = "eval") -> dict[str, str]:
    """Each parameter or buffer of ``model`` -> the checkpoint tensor it is loaded from, given the
    checkpoint's tensor shapes (``shapes``, read from its headers); shapes are checked against
    config.json, and every parameter of the model must be there (a tied one once, all its names
    reading that tensor)."""
    origin = _match(path, model, shapes, command)
    by_storage: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_storage.setdefault(id(p), []).append(name)
    for names in by_storage.values():
        stored = next(origin[n] for n in names if n in origin)
        for n in names:
            origin.setdefault(n, stored)
    return origin


def match_weights(path: Path, model: torch.nn.Module, weights: dict[str, torch.Tensor],
                  command: str = "eval") -> dict[str, torch.Tensor]:
    """``weights`` (a checkpoint's dense tensors) under the model's own names, checked as
    :func:`match_names` does; a tied parameter appears once."""
    origin = _match(path, model, {k: tuple(t.shape) for k, t in weights.items()}, command)
    return {name: weights[stored] for name, stored in origin.items()}


def _match(path: Path, model: torch.nn.Module, shapes: dict[str, tuple[int, ...]],
           command: str) -> dict[str, str]:
    own = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    rename = _renamer(model, command)
    origin: dict[str, str] = {}
    for stored, shape in shapes.items():
        name = rename(path, stored)
        if name not in own and prefix:
            # Saved from the bare model (no LM-head wrapper) or the reverse.
            if f"{prefix}.{name}" in own:
                name = f"{prefix}.{name}"
            elif name.startswith(prefix + ".") and name[len(prefix) + 1:] in own:
                name = name[len(prefix) + 1:]
        if name not in own:
            if name.endswith(_LEGACY_BUFFERS):
                continue
            raise SparsetoolError(f"{path}: tensor {name!r} is not part of the {type(model).__name__} "
                                  "that config.json describes; the weights and config.json disagree")
        if tuple(shape) != tuple(own[name].shape):
            raise SparsetoolError(
                f"{path}: tensor {name!r} has shape {list(shape)} but config.json describes "
                f"{list(own[name].shape)}; the weights and config.json disagree"
            )
        origin[name] = stored
    # Parameters shared with a loaded one (a head tied to the embedding) need no tensor of their own.
    by_storage: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_storage.setdefault(id(p), []).append(name)
    for names in by_storage.values():
        if not any(n in origin for n in names):
            raise SparsetoolError(f"{path}: no tensor {names[0]!r}; the checkpoint lacks weights "
                                  "the model of config.json needs")
    return origin
