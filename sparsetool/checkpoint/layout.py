"""Where the tensors of a checkpoint live: one file, or a Hugging Face directory.

A directory holds either ``model.safetensors`` (or any single ``*.safetensors``), or shards
listed by ``<prefix>.safetensors.index.json`` (``{"metadata": {"total_size": ...},
"weight_map": {tensor: shard file}}``). The other files a model directory needs (config,
generation config, tokenizer files, README and licence files) are carried over to an output as
they are; anything else (a training run's ``checkpoints/``, ``optimizer.pt``, logs) is left out
and named, except when the output replaces the input (``--in-place``), which keeps everything.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sparsetool.checkpoint import gguf_file, pickled
from sparsetool.errors import CheckpointError

INDEX_SUFFIX = ".safetensors.index.json"
# Our own temporary outputs ("<name>.sparsetool-tmp-*") are never carried over.
TMP_MARK = ".sparsetool-tmp-"
# Files of a model directory besides its weights: what loaders read, and what its licence needs.
CARRIED_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tiktoken.model",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
    }
)
CARRIED_STEMS = ("readme", "license", "licence", "copying", "notice", "use_policy")  # any extension


@dataclass
class Layout:
    path: Path
    is_dir: bool
    shards: list[str]
    index_name: str | None = None
    index: dict | None = None
    other_files: list[Path] = field(default_factory=list)  # carried to an output
    left_out: list[Path] = field(default_factory=list)  # not part of a model directory


def locate(path: Path) -> Layout:
    """Find the shards of ``path`` (file or directory) or raise CheckpointError saying what was
    expected."""
    if not path.exists():
        raise CheckpointError(
            f"{path}: no such file or directory (expected a .safetensors file or a directory "
            "with model.safetensors or model.safetensors.index.json)"
        )
    if path.is_file():
        return Layout(path, False, [path.name])
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a regular file or directory")

    indexes = sorted(
        p.name for p in path.iterdir() if p.name.endswith(INDEX_SUFFIX) and p.is_file()
    )
    if len(indexes) > 1:
        preferred = "model" + INDEX_SUFFIX
        if preferred not in indexes:
            raise CheckpointError(f"{path}: several index files ({', '.join(indexes)}); keep one")
        indexes = [preferred]
    if indexes:
        index_name = indexes[0]
        index = _read_index(path / index_name)
        weight_map = index["weight_map"]
        shards = sorted(set(weight_map.values()))
        for s in shards:
            if not (path / s).is_file():
                raise CheckpointError(
                    f"{path / index_name}: names shard {s!r}, which is missing from {path}; "
                    "put the shard back, or download the model again"
                )
        unlisted = sorted(
            p.name
            for p in path.iterdir()
            if p.name.endswith(".safetensors") and p.name not in shards and TMP_MARK not in p.name
        )
        if unlisted:
            raise CheckpointError(
                f"{path / unlisted[0]}: a .safetensors file that {index_name} does not list; "
                "loaders ignore its tensors and sparsetool would leave them unpruned. Move it "
                f"out of {path} if it is not part of the model, or list its tensors in the index's "
                "weight_map"
            )
        taken = set(shards) | {index_name}
        return Layout(path, True, shards, index_name, index, *_others(path, taken))

    if (path / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        found = sorted(
            p.name for p in path.iterdir() if p.name.endswith(".safetensors") and p.is_file()
        )
        if not found:
            raise (
                pickled.dir_error(path)
                or gguf_file.dir_error(path)
                or CheckpointError(
                    f"{path}: no model.safetensors, no *.safetensors file and no "
                    "model.safetensors.index.json in this directory (expected a Hugging Face model "
                    "directory or a .safetensors file)"
                )
            )
        if len(found) > 1:
            raise CheckpointError(
                f"{path}: {len(found)} .safetensors files but no model.safetensors.index.json to "
                "say which belong to the model; add the index or pass one file"
            )
        shards = found
    return Layout(path, True, shards, None, None, *_others(path, set(shards)))


def is_carried(p: Path) -> bool:
    """Whether ``p``, found beside the weights, belongs in a model directory."""
    if not p.is_file():
        return False
    return p.name in CARRIED_NAMES or p.name.lower().startswith(CARRIED_STEMS)


def _others(path: Path, taken: set[str]) -> tuple[list[Path], list[Path]]:
    """(files carried to an output, entries left out), relative to ``path``."""
    rest = sorted(
        (p for p in path.iterdir() if p.name not in taken and TMP_MARK not in p.name),
        key=lambda p: p.name,
    )
    carried = [Path(p.name) for p in rest if is_carried(p)]
    return carried, [Path(p.name) for p in rest if not is_carried(p)]


def _read_index(index_path: Path) -> dict:
    duplicates: list[tuple[str, object, object]] = []

    def unique(pairs: list[tuple[str, object]]) -> dict:
        obj: dict = {}
        for k, v in pairs:
            if k in obj:
                duplicates.append((k, obj[k], v))
            obj[k] = v
        return obj

    try:
        index = json.loads(index_path.read_text(encoding="utf-8"), object_pairs_hook=unique)
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{index_path}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{index_path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if duplicates:
        key, first, second = duplicates[0]
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if isinstance(wm, dict) and key in wm and isinstance(first, str):
            raise CheckpointError(
                f"{index_path}: weight_map lists tensor {key!r} twice (in {first}, then in "
                f"{second}); "
                "keep only the entry naming the shard that holds it"
            )
        raise CheckpointError(
            f"{index_path}: key {key!r} appears twice in one object; keep one of them"
        )
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in wm.items()
    ):
        raise CheckpointError(
            f'{index_path}: no "weight_map" object mapping tensor names to shard files'
        )
    for v in set(wm.values()):
        if "/" in v or "\\" in v or v in ("", ".", ".."):
            raise CheckpointError(f"{index_path}: shard name {v!r} is not a plain file name")
    return index


def rebuilt_index(old: dict, weight_map: dict[str, str], total_size: int) -> str:
    """Index JSON text with a new weight_map and total_size; other keys kept (sorted, like
    transformers)."""
    new = dict(old)
    meta = dict(new.get("metadata") or {})
    meta["total_size"] = total_size
    new["metadata"] = meta
    new["weight_map"] = dict(sorted(weight_map.items()))
    return json.dumps(new, indent=2, sort_keys=True) + "\n"
