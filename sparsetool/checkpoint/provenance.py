"""The ``sparsetool`` metadata entry: what made a checkpoint, read and written only here.

safetensors metadata values must be strings, so the entry is one JSON object stored as a string
under the key ``"sparsetool"``. Each tool that writes a checkpoint records one step (``command``
or ``producer``, its options, ``version``); the steps recorded by the input are kept, oldest
first, under ``"history"``, so a model shape written by ``train`` survives a later ``prune`` and
``densify``. Imports neither torch nor numpy.

>>> first = provenance_metadata(None, {"command": "prune", "sparsity": 0.5})
>>> second = provenance_metadata(first, {"command": "densify"})
>>> entry = read_provenance(second)
>>> entry["command"], [h["command"] for h in entry["history"]]
('densify', ['prune'])
>>> merged_provenance(second)["sparsity"], merged_provenance(second)["command"]
(0.5, 'densify')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sparsetool.checkpoint.codecs import CODECS, Codec
from sparsetool.util.version import __version__

PROVENANCE_KEY = "sparsetool"


def read_provenance(metadata: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The entry of one shard's metadata as a dict; None when absent or not a JSON object
    (a foreign or damaged entry is ignored, never an error: it only describes the file)."""
    raw = (metadata or {}).get(PROVENANCE_KEY)
    if not raw:
        return None
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def recorded_codec(metadata: Mapping[str, str] | None) -> Codec | None:
    """The codec the entry records the file was written in; None when it records none, ``plain``
    or a name sparsetool does not know."""
    encoding = (read_provenance(metadata) or {}).get("encoding")
    return CODECS.get(encoding) if isinstance(encoding, str) else None


def merged_provenance(metadata: Mapping[str, str] | None) -> dict[str, Any]:
    """Every recorded step folded into one dict, later steps winning (``history`` dropped)."""
    entry = read_provenance(metadata) or {}
    merged: dict[str, Any] = {}
    for older in entry.get("history", []):
        if isinstance(older, dict):
            merged.update(older)
    merged.update({k: v for k, v in entry.items() if k != "history"})
    return merged


def provenance_metadata(
    previous: Mapping[str, str] | None, record: Mapping[str, Any]
) -> dict[str, str]:
    """``{"sparsetool": ...}`` for a new checkpoint: ``record`` plus this tool's version, after
    the steps ``previous`` (the input's metadata, or None for a new model) recorded."""
    old = read_provenance(previous)
    history: list = []
    if old is not None:
        earlier = old.get("history", [])
        history = (list(earlier) if isinstance(earlier, list) else []) + [
            {k: v for k, v in old.items() if k != "history"}
        ]
    entry = {**record, "version": __version__}
    if history:
        entry["history"] = history
    return {PROVENANCE_KEY: json.dumps(entry, sort_keys=True)}
