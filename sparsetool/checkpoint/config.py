"""config.json surgery for compressed-tensors checkpoints.

compressed-tensors records its sparsity compression in ``config.json`` as
``quantization_config.sparsity_config`` (older releases: ``compression_config.sparsity_config``),
next to ``version``, ``quant_method`` and an often empty ``transform_config``. A loader that sees a
sparsity config expects compressed tensors; after densifying it must go, or transformers
re-initialises the (now plain) weights it cannot find.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError

_BLOCKS = ("quantization_config", "compression_config")
# Keys that carry no meaning once sparsity_config is gone (bookkeeping of compressed-tensors).
_BOOKKEEPING = {
    "version",
    "quant_method",
    "format",
    "quantization_status",
    "global_compression_ratio",
}


def _meaningless(block: dict) -> bool:
    return all(k in _BOOKKEEPING or v in (None, {}, [], "") for k, v in block.items())


def drop_sparsity_config(config: dict) -> dict:
    """A copy of ``config`` without any compressed-tensors ``sparsity_config``.

    A containing block left with only bookkeeping keys (or empty values) is dropped too; a block
    that still describes quantization is kept.

    >>> cfg = {
    ...     "model_type": "gpt2",
    ...     "quantization_config": {
    ...         "quant_method": "compressed-tensors",
    ...         "version": "0.14.0.1",
    ...         "sparsity_config": {"format": "sparse-bitmask"},
    ...         "transform_config": {},
    ...     },
    ... }
    >>> drop_sparsity_config(cfg)
    {'model_type': 'gpt2'}
    >>> q = {
    ...     "quantization_config": {
    ...         "quant_method": "compressed-tensors",
    ...         "config_groups": {"g": {}},
    ...         "sparsity_config": {"format": "sparse-bitmask"},
    ...     }
    ... }
    >>> drop_sparsity_config(q)
    {'quantization_config': {'quant_method': 'compressed-tensors', 'config_groups': {'g': {}}}}
    """
    out = copy.deepcopy(config)
    out.pop("sparsity_config", None)
    for key in _BLOCKS:
        block = out.get(key)
        if isinstance(block, dict) and "sparsity_config" in block:
            del block["sparsity_config"]
            if _meaningless(block):
                del out[key]
    return out


# What compressed-tensors 0.14.0.1 writes into config.json after saving a sparse-bitmask model
# (ModelCompressor.update_config: the sparsity config's pydantic dump, an empty transform config).
COMPRESSED_TENSORS_VERSION = "0.14.0.1"


def bitmask_sparsity_config(config: dict, modules: list[str], global_sparsity: float) -> dict:
    """A copy of ``config`` announcing sparse-bitmask compression of ``modules`` to loaders.

    ``modules`` are the module names whose ``.weight`` is stored as a bitmask group (used as
    compressed-tensors ``targets``); ``global_sparsity`` is the fraction of zeros over them.
    An existing sparsity config is replaced; a quantization config is kept.

    >>> cfg = bitmask_sparsity_config({"model_type": "gpt2"}, ["h.0.mlp.c_fc"], 0.5)
    >>> (
    ...     cfg["quantization_config"]["sparsity_config"]["format"],
    ...     cfg["quantization_config"]["quant_method"],
    ... )
    ('sparse-bitmask', 'compressed-tensors')
    >>> drop_sparsity_config(cfg)
    {'model_type': 'gpt2'}
    """
    out = drop_sparsity_config(config)
    block = out.setdefault("quantization_config", {})
    block.setdefault("quant_method", "compressed-tensors")
    block.setdefault("version", COMPRESSED_TENSORS_VERSION)
    block.setdefault("transform_config", {})
    block["sparsity_config"] = {
        "format": "sparse-bitmask",
        "global_sparsity": float(global_sparsity),
        "ignore": None,
        "registry_requires_subclass": False,
        "sparsity_structure": "unstructured",
        "targets": sorted(modules),
    }
    return out


def read_model_config(path: str | Path) -> dict[str, Any] | None:
    """The ``config.json`` beside a checkpoint file, or inside a checkpoint directory, if any."""
    p = Path(path)
    cfg = (p if p.is_dir() else p.parent) / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read '{cfg}': {e}; fix or remove it") from None
    return data if isinstance(data, dict) else None
