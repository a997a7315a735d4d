"""A Hugging Face causal-LM directory as a PyTorch model: its config, its tokenizer, its weights.

Shared by the streamed model of eval and calibration pruning (:mod:`sparsetool.models.open`) and
``sparsetool train --init HF_DIR`` (:mod:`sparsetool.train.hfrun`). The model is built from
``config.json`` (never with remote code) and its weights are decoded by sparsetool, so every
encoding (zeros, mask, nan, bitmask) loads alike. transformers is imported only here, and only when
a Hugging Face directory is used.

No code from the checkpoint directory ever runs: the config's ``auto_map`` (classes in ``.py``
files beside the weights) is dropped, transformers is told ``trust_remote_code=False`` (without it,
it asks on the terminal whether to run such code), and no module named in a config is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from sparsetool.checkpoint.config import drop_sparsity_config
from sparsetool.errors import SparsetoolError

__all__ = [
    "HF_EXTRA",
    "MAX_DEFAULT_SEQ",
    "TOKENIZER_FILES",
    "Piece",
    "context_of",
    "hf_config",
    "import_transformers",
    "load_tokenizer",
    "match_names",
    "match_weights",
]

MAX_DEFAULT_SEQ = 2048  # default window for models trained on long contexts (CPU memory, time)
HF_EXTRA = "pip install -e '.[hf]' (source checkout) or pip install 'sparsetool[hf]'"
# Buffers old GPT-2 checkpoints stored; today's transformers computes them.
_LEGACY_BUFFERS = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)


def import_transformers(doing: str = "evaluating"):
    try:
        import transformers
    except ImportError:
        raise SparsetoolError(
            f"{doing} a Hugging Face model needs transformers, which is not installed: {HF_EXTRA}"
        ) from None
    return transformers


def hf_config(
    path: Path, config: dict | None, transformers, command: str = "eval", needs: str | None = None
):
    """transformers' config object of a causal LM directory; anything else is refused (``needs``,
    if given, ends that error: what the caller does with the model)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if config is None:
        raise SparsetoolError(
            f"{path}: no config.json; {command} needs a Hugging Face model directory "
            "(config.json, weights, tokenizer files) or a checkpoint of sparsetool train"
        )
    # The compressed-tensors block describes how weights are stored, which sparsetool decodes
    # itself.
    config = drop_sparsity_config(config)
    config = {
        k: v for k, v in config.items() if k != "auto_map"
    }  # classes in the directory's .py files
    model_type = config.get("model_type")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise SparsetoolError(
            f"{path}/config.json: model_type {model_type!r} is not a causal language "
            f"model transformers knows; {needs or _does(command) + ' next-token prediction only'}"
        )
    rest = {k: v for k, v in config.items() if k != "model_type"}
    try:
        cfg = transformers.AutoConfig.for_model(model_type, **rest)
    except Exception as e:  # transformers raises many types for a bad config
        raise SparsetoolError(f"{path}/config.json: transformers cannot read it ({e})") from None
    bidirectional = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(
        cfg, "is_decoder", False
    )
    if getattr(cfg, "is_encoder_decoder", False) or bidirectional:
        arch = ", ".join(config.get("architectures") or [model_type])
        raise SparsetoolError(
            f"{path}: {arch} is not a causal language model (an encoder sees the "
            f"tokens it should predict); {needs or _does(command) + ' decoder-only models'}"
        )
    return cfg


def _does(command: str) -> str:
    return "eval scores" if command == "eval" else f"{command} trains"


def context_of(cfg) -> int:
    """The longest sequence the model of ``cfg`` takes."""
    for attr in (
        "max_position_embeddings",
        "n_positions",
        "n_ctx",
        "seq_length",
        "max_sequence_length",
    ):
        value = getattr(cfg, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return MAX_DEFAULT_SEQ


def load_tokenizer(path: Path, transformers):
    """The directory's own tokenizer (local files only)."""

    def refuse(why: str) -> SparsetoolError:
        return SparsetoolError(
            f"{path}: no usable tokenizer ({why}); copy the tokenizer files of the original model "
            "(tokenizer.json or its vocabulary files, tokenizer_config.json) into this directory"
        )

    # transformers 5 builds an empty tokenizer from config.json alone: look for the files first
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise refuse(f"none of {', '.join(TOKENIZER_FILES)}")
    try:
        tok = transformers.AutoTokenizer.from_pretrained(
            str(path), local_files_only=True, trust_remote_code=False
        )
    except Exception as e:  # broken files surface as OSError, ValueError or TypeError by version
        if "custom code" in str(e):
            raise SparsetoolError(
                f"{path}/tokenizer_config.json asks for a tokenizer class from the directory's own "
                "Python files (auto_map), and sparsetool never runs code from a checkpoint; set "
                "its "
                "tokenizer_class to a transformers class (PreTrainedTokenizerFast reads "
                "tokenizer.json)"
            ) from None
        raise refuse(
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'cannot load'}"
        ) from None
    if len(tok) <= len(getattr(tok, "all_special_ids", [])):
        raise refuse("its vocabulary is empty")
    return tok


@dataclass(frozen=True)
class Piece:
    """Where one checkpoint tensor lands in a model parameter: ``parameter[index]``, the whole
    parameter when ``index`` is empty.

    transformers 5 runs a Mixture of Experts' experts as one 3-D parameter per projection
    (``mlp.experts.gate_up_proj``: experts x (gate; up) x in), merged on loading from the one
    tensor per expert (and per gate or up half) that most checkpoints store; each of those is a
    piece: ``(expert, slice of rows)``.
    """

    stored: str
    index: tuple = ()


class _Conversions:
    """transformers' own checkpoint -> model renames (GPT-NeoX ``embed_out`` -> ``lm_head``...)
    and merges (one tensor per expert stacked into a 3-D parameter).

    A merge is understood when it stacks a list of tensors (``MergeModulelist``), then perhaps
    concatenates the stacks (``Concatenate``): each stored tensor then has a place of its own in
    the merged parameter (:class:`Piece`). Any other conversion (a transpose, a permutation) is
    refused: tensors are loaded as they are stored.
    """

    def __init__(self, model: torch.nn.Module, path: Path, command: str):
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        transforms = get_model_conversion_mapping(model)
        self.renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        self.converters = [t for t in transforms if not isinstance(t, WeightRenaming)]
        self.path, self.command = path, command
        # merged parameter -> its converter and (source pattern, expert, stored name, shape)
        self.merged: dict[str, tuple[object, list[tuple[int, int, str, tuple[int, ...]]]]] = {}

    def rename(self, name: str, shape: tuple[int, ...]) -> str | None:
        """The model's name for stored tensor ``name``; None when it is one piece of a merged
        parameter (collected for :meth:`pieces`)."""
        from transformers.core_model_loading import apply_converters, apply_renamings

        new = apply_renamings(name, self.renamings)
        target, pattern = apply_converters(new, self.converters)
        if pattern is None:
            return new
        converter = next(c for c in self.converters if pattern in c.source_patterns)
        ops = [type(op).__name__ for op in converter.operations]
        found = re.search(re.escape(pattern).replace(r"\*", r"(\d+)"), new)
        if ops not in (["MergeModulelist"], ["MergeModulelist", "Concatenate"]) or found is None:
            raise SparsetoolError(
                f"{self.path}: tensor {name!r} is stored in a layout transformers converts on "
                f"loading ({' then '.join(ops) or type(converter).__name__}); {self.command} "
                "does not support this model's checkpoints yet"
            )
        members = self.merged.setdefault(target, (converter, []))[1]
        members.append((converter.source_patterns.index(pattern), int(found.group(1)), name, shape))
        return None

    def pieces(self, target: str, shape: tuple[int, ...]) -> list[Piece]:
        """The stored tensors merged into parameter ``target`` of ``shape``, each at its place;
        every place must be filled exactly once, by a tensor of the place's shape."""
        converter, members = self.merged[target]
        stack = converter.operations[0].dim
        concat = converter.operations[1].dim if len(converter.operations) > 1 else None
        along = None if concat is None else (concat if concat < stack else concat - 1)  # stored dim
        sizes: dict[int, int] = {}
        for j, _e, _name, stored_shape in members:
            sizes.setdefault(j, 1 if along is None else stored_shape[along])
        offsets, at = {}, 0
        for j in sorted(sizes):
            offsets[j], at = at, at + sizes[j]
        pieces, places = [], set()
        for j, e, name, stored_shape in sorted(members, key=lambda m: (m[1], m[0])):
            index: list = [slice(None)] * len(shape)
            if e >= shape[stack]:
                raise SparsetoolError(
                    f"{self.path}: tensor {name!r} is expert {e}, but config.json describes "
                    f"{shape[stack]} experts; the weights and config.json disagree"
                )
            index[stack] = e
            if concat is not None:
                index[concat] = slice(offsets[j], offsets[j] + sizes[j])
            place = [n for k, n in enumerate(shape) if k != stack]
            if concat is not None:
                place[along] = sizes[j]
            if list(stored_shape) != place or (concat is not None and at != shape[concat]):
                raise SparsetoolError(
                    f"{self.path}: tensor {name!r} has shape {list(stored_shape)}, but its place "
                    f"in {target!r} {list(shape)} (config.json) is {place}; the weights and "
                    "config.json disagree"
                )
            places.add((j, e))
            pieces.append(Piece(name, tuple(index)))
        missing = [
            (j, e)
            for e in range(shape[stack])
            for j in range(len(converter.source_patterns))
            if (j, e) not in places
        ]
        if missing:
            j, e = missing[0]
            raise SparsetoolError(
                f"{self.path}: no tensor {converter.source_patterns[j].replace('*', str(e))!r} for "
                f"{target!r}; the checkpoint lacks weights the model of config.json needs"
            )
        return pieces


def match_names(
    path: Path, model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], command: str = "eval"
) -> dict[str, list[Piece]]:
    """Each parameter or buffer of ``model`` -> the checkpoint tensors it is loaded from (one
    :class:`Piece` holding the whole parameter, or the pieces of a merged one), given the
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


def match_weights(
    path: Path, model: torch.nn.Module, weights: dict[str, torch.Tensor], command: str = "eval"
) -> dict[str, torch.Tensor]:
    """``weights`` (a checkpoint's dense tensors) under the model's own names, checked as
    :func:`match_names` does, merged parameters assembled from their pieces; a tied parameter
    appears once."""
    origin = _match(path, model, {k: tuple(t.shape) for k, t in weights.items()}, command)
    own = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for name, pieces in origin.items():
        if len(pieces) == 1 and not pieces[0].index:
            out[name] = weights[pieces[0].stored]
            continue
        first = weights[pieces[0].stored]
        merged = torch.empty(own[name].shape, dtype=first.dtype)
        for piece in pieces:
            merged[piece.index] = weights[piece.stored]
        out[name] = merged
    return out


def _match(
    path: Path, model: torch.nn.Module, shapes: dict[str, tuple[int, ...]], command: str
) -> dict[str, list[Piece]]:
    own = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or ""
    conversions = _Conversions(model, path, command)
    origin: dict[str, list[Piece]] = {}
    for stored, shape in shapes.items():
        name = conversions.rename(stored, tuple(shape))
        if name is None:
            continue  # a piece of a merged parameter
        name = _with_prefix(name, own, prefix)
        if name not in own:
            if name.endswith(_LEGACY_BUFFERS):
                continue
            raise SparsetoolError(
                f"{path}: tensor {name!r} is not part of the {type(model).__name__} "
                "that config.json describes; the weights and config.json disagree"
            )
        if tuple(shape) != tuple(own[name].shape):
            raise SparsetoolError(
                f"{path}: tensor {name!r} has shape {list(shape)} but config.json describes "
                f"{list(own[name].shape)}; the weights and config.json disagree"
            )
        origin[name] = [Piece(stored)]
    for target in conversions.merged:
        name = _with_prefix(target, own, prefix)
        if name not in own:
            raise SparsetoolError(
                f"{path}: tensors merged into {name!r} are not part of the "
                f"{type(model).__name__} that config.json describes; the weights "
                "and config.json disagree"
            )
        origin[name] = conversions.pieces(target, tuple(own[name].shape))
    # Parameters shared with a loaded one (a head tied to the embedding) need no tensor of their
    # own.
    by_storage: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_storage.setdefault(id(p), []).append(name)
    for names in by_storage.values():
        if not any(n in origin for n in names):
            raise SparsetoolError(
                f"{path}: no tensor {names[0]!r}; the checkpoint lacks weights "
                "the model of config.json needs"
            )
    return origin


def _with_prefix(name: str, own: dict, prefix: str) -> str:
    """``name`` as the model has it: saved from the bare model (no LM-head wrapper) or the
    reverse."""
    if name not in own and prefix:
        if f"{prefix}.{name}" in own:
            return f"{prefix}.{name}"
        if name.startswith(prefix + ".") and name[len(prefix) + 1 :] in own:
            return name[len(prefix) + 1 :]
    return name
