"""The harness's logged documents: one record per document with its metrics (what the paired
comparison reads, :func:`per_document`), and ``--log-samples``' JSON-lines files
(:func:`write_samples`, under one directory per checkpoint: :func:`sample_dirs`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparsetool.ops.tasks.results import shown_name

__all__ = ["doc_order", "per_document", "plain", "sample_dirs", "sample_record", "write_samples"]


def plain(value: Any) -> Any:
    """A per-document metric as JSON has it (a rolling log-likelihood's tuple as a list)."""
    if isinstance(value, tuple):
        return [plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def per_document(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The harness's logged samples of one task as one record per document, in id order: its
    ``doc_id`` and the metrics the task reported for it (0 or 1 for acc and exact_match), named
    as :func:`shown_name` does (the harness logs a document once per filter)."""
    filters = {str(e.get("filter", "none")) for e in examples}
    records: dict[Any, dict[str, Any]] = {}
    for e in examples:
        record = records.setdefault(doc_key(e["doc_id"]), {"doc_id": e["doc_id"]})
        for m in e.get("metrics", []):
            if m in e:
                record[shown_name(m, str(e.get("filter", "none")), filters)] = plain(e[m])
    return sorted(records.values(), key=doc_order)


def doc_key(doc_id: Any) -> Any:
    return doc_id if isinstance(doc_id, (int, str)) else str(doc_id)


def doc_order(record: dict[str, Any]) -> tuple[int, Any]:
    """Documents in id order: whole numbers by value, any other ids after them as text."""
    d = record["doc_id"]
    return (0, d) if isinstance(d, int) else (1, str(d))


def sample_dirs(names: Sequence[str]) -> list[str]:
    """Each checkpoint's directory name under ``--log-samples``: its path's last parts that tell
    it from the others, joined by ``__`` (``runs/a/model`` and ``runs/b/model``: ``a__model``,
    ``b__model``); a checkpoint given twice gets ``-2``.

    >>> sample_dirs(["runs/a/model", "runs/b/model", "/x/p50/", "runs/a/model"])
    ['a__model', 'b__model', 'p50', 'a__model-2']
    """
    parts = [[q for q in n.replace("\\", "/").split("/") if q not in ("", ".")] for n in names]
    out: list[str] = []
    for i, mine in enumerate(parts):
        mine = mine or ["checkpoint"]
        others = [o for j, o in enumerate(parts) if j != i and o != mine]
        k = 1
        while k < len(mine) and any(o[-k:] == mine[-k:] for o in others):
            k += 1
        label = "__".join(q.replace("..", "_") for q in mine[-k:])
        out.append(label if label not in out else f"{label}-{out.count(label) + 1}")
    return out


def sample_record(example: dict[str, Any]) -> dict[str, Any]:
    """One logged document of the harness as a line of a samples file: its id, the document, the
    target, each request's arguments (context, continuation; a generation's context and
    settings), the log-likelihood of each request (a multiple-choice document: one per choice)
    and whether it was the greedy continuation, or the text generated (after the task's
    filter), and the metrics the task reported for it."""
    lls: list[Any] = []
    greedy: list[bool | None] = []
    generated: list[str] = []
    responses = example.get("filtered_resps", [])
    for r in responses if isinstance(responses, list) else [responses]:
        if isinstance(r, str):
            generated.append(r)
        elif isinstance(r, (tuple, list)) and len(r) == 2 and not isinstance(r[0], str):
            lls.append(plain(r[0]))
            greedy.append(bool(r[1]))
        elif isinstance(r, (tuple, list)):
            generated += [str(t) for t in r]
        else:
            lls.append(plain(r))
            greedy.append(None)
    return {
        "doc_id": example["doc_id"],
        "doc": example.get("doc"),
        "target": example.get("target"),
        "arguments": [plain(tuple(a)) for a in example.get("arguments", [])],
        "loglikelihoods": lls,
        "is_greedy": greedy,
        **({"generated": generated} if generated else {}),
        "metrics": {m: plain(example[m]) for m in example.get("metrics", []) if m in example},
        "filter": example.get("filter"),
    }


def write_samples(out: Path, examples: list[dict[str, Any]]) -> Path:
    """The documents of one task (the harness's logged samples) as JSON lines at ``out``, in id
    order, written to a temporary file beside it and renamed into place; one clean error if the
    disk refuses."""
    import json

    from sparsetool.checkpoint.output_files import put_in_place, temp_beside, write_error

    records = sorted((sample_record(e) for e in examples), key=doc_order)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(out)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
            put_in_place(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    except OSError as e:
        raise write_error(e, out, "--log-samples") from None
    return out
