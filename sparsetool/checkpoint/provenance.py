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


def provenance_line(entry: Mapping[str, Any] | None) -> str | None:
    """How the checkpoint of ``entry`` (:func:`read_provenance`) was made, in one line: the last
    step's command, method and how much it pruned or removed, the calibration text (file, its
    digest, windows and seed), OWL's allocation and DSnoT's refinement, the steps before it and
    the tool's version; None without an entry.

    >>> line = provenance_line({"command": "prune", "method": "wanda", "sparsity": 0.5,
    ...     "seed": 0, "calibration": {"text": "data/c.txt", "samples": 128, "seq": 512,
    ...     "sha256": "0123456789abcdef" * 4}, "version": "1.0", "history": [{"command": "train"}]})
    >>> print(line.replace("; ", chr(10)))
    prune --method wanda --sparsity 0.5
    calibration c.txt (sha256 0123456789ab, 128 x 512 tokens, seed 0)
    after train
    sparsetool 1.0
    >>> provenance_line({"command": "prune", "method": "magnitude", "nm": "2:4", "version": "1.0"})
    'prune --method magnitude --nm 2:4; sparsetool 1.0'
    """
    if not entry:
        return None
    command = str(entry.get("command") or entry.get("producer") or "unknown")
    parts = [" ".join([command, *_flags(entry)])]
    calibration = _calibration(entry)
    if calibration:
        parts.append(calibration)
    for key, name in (("allocation", "allocation"), ("refine", "refinement")):
        step = entry.get(key)
        if isinstance(step, dict) and step.get("method"):
            parts.append(f"{name} {step['method']}")
    history = entry.get("history")
    if isinstance(history, list) and history:
        steps = [str(h.get("command") or h.get("producer")) for h in history if isinstance(h, dict)]
        parts.append(f"after {', '.join(steps)}")
    if entry.get("version"):
        parts.append(f"sparsetool {entry['version']}")
    return "; ".join(parts)


def _flags(entry: Mapping[str, Any]) -> list[str]:
    """The options that say what a step did, as its command line gives them; shrink's counts
    before and after (``(blocks 32 -> 28)``)."""
    flags: list[str] = []
    counts: list[str] = []
    for key in (
        "method", "sparsity", "fraction", "nm", "scope", "distribution",  # prune
        "experts", "experts_keep", "criterion", "blocks", "block_criterion", "ffn", "heads",
    ):  # fmt: skip
        value = entry.get(key)
        if isinstance(value, dict):  # shrink's record of what it removed: the counts
            if "before" in value and "after" in value:
                counts.append(f"{key} {value['before']} -> {value['after']}")
            continue
        if value is None or value is False or isinstance(value, list) or (key, value) in _DEFAULTS:
            continue
        flag = "--" + key.replace("_", "-")
        flags.append(flag if value is True else f"{flag} {value:g}" if _is_number(value) else
                     f"{flag} {value}")  # fmt: skip
    if entry.get("merge") is True:
        flags.append("--merge")
    return flags + ([f"({', '.join(counts)})"] if counts else [])


_DEFAULTS = {("scope", "layer"), ("distribution", "uniform")}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _calibration(entry: Mapping[str, Any]) -> str | None:
    """The calibration text, digest, windows and seed: prune's nested record or shrink's flat
    one."""
    calib = entry.get("calibration")
    if isinstance(calib, dict):  # prune
        text, digest = calib.get("text"), calib.get("sha256")
        samples, seq, field = calib.get("samples"), calib.get("seq"), calib.get("text_field")
    elif isinstance(calib, str):  # shrink
        text, digest = calib, entry.get("calibration_sha256")
        samples, seq, field = entry.get("samples"), entry.get("seq"), entry.get("text_field")
    else:
        return None
    name = str(text).replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] if text else "?"
    about = []
    if digest:
        about.append(f"sha256 {str(digest)[:12]}")
    if samples is not None:
        about.append(f"{samples} x {seq} tokens" if seq else f"{samples} windows")
    if entry.get("seed") is not None:
        about.append(f"seed {entry['seed']}")
    shown = f"calibration {name}" + (f" field {field}" if field else "")
    return shown + (f" ({', '.join(about)})" if about else "")
