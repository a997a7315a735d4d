"""The text a command reads (``eval --text``, ``prune --calibration``, ``shrink --calibration``):
a UTF-8 file, a file of records, or the files under a directory.

A file named ``*.jsonl`` (JSON lines), ``*.parquet`` or ``*.arrow`` (Arrow IPC, file or stream, as
``datasets`` saves) holds records, and each record's text field (``text``, or the
:class:`TextSource`'s ``text_field``) is one document. A field holding a list of chat messages
(``[{"role": ..., "content": ...}, ...]``) is rendered by the chat template of the checkpoint's
tokenizer (``apply_chat_template(..., tokenize=False)``). Documents are joined as a directory's
files are, by a newline: records holding the lines of a text file read as that file. Parquet and
Arrow are read with pyarrow (``datasets`` brings it), imported only for them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparsetool.errors import SparsetoolError

__all__ = ["RECORD_SUFFIXES", "TextSource", "is_records", "read_text"]

RECORD_SUFFIXES = (".jsonl", ".parquet", ".arrow")
DEFAULT_FIELD = "text"


class TextSource(str):
    """A path of text to read (the string itself) and how to read its records: ``text_field``,
    the field of each record that is its document, and ``checkpoint``, whose tokenizer's chat
    template renders a field of chat messages. Anywhere a path string goes, it goes.

    >>> s = TextSource("calib.jsonl", "messages", "model/")
    >>> s, s.text_field, s.checkpoint, f"{s}"
    ('calib.jsonl', 'messages', 'model/', 'calib.jsonl')
    """

    text_field: str
    checkpoint: str | None
    digest: str | None  # the SHA-256 of the text as last read (:func:`read_text`), in hex

    def __new__(
        cls, path: str | Path, text_field: str = DEFAULT_FIELD, checkpoint: str | Path | None = None
    ) -> TextSource:
        self = super().__new__(cls, str(path))
        self.text_field = text_field
        self.checkpoint = None if checkpoint is None else str(checkpoint)
        self.digest = None
        return self


def is_records(path: str | Path) -> bool:
    """Whether ``path`` names a file of records (by its suffix).

    >>> is_records("a/calib.JSONL"), is_records("b.parquet"), is_records("c.txt")
    (True, True, False)
    """
    return Path(path).suffix.lower() in RECORD_SUFFIXES


def read_text(path: str | Path, option: str = "--text") -> str:
    """A UTF-8 file, a file of records (see the module docstring), or every non-hidden file under
    a directory (sorted, each read by its own suffix), joined by a newline. ``path`` may be a
    :class:`TextSource` saying which field of a record is its text and whose chat template
    renders chat messages; its ``digest`` becomes the text's SHA-256."""
    text_field = getattr(path, "text_field", DEFAULT_FIELD)
    checkpoint = getattr(path, "checkpoint", None)
    p = Path(path)
    if p.is_file():
        files = [p]
    elif p.is_dir():
        files = sorted(
            q
            for q in p.rglob("*")
            if q.is_file() and not any(s.startswith(".") for s in q.relative_to(p).parts)
        )
        if not files:
            raise SparsetoolError(f"{option} {p}: directory holds no files; point it at text files")
    else:
        raise SparsetoolError(f"{option} {p}: no such file or directory")
    parts: list[str] = []
    chat = _ChatTemplate(checkpoint, option)
    for f in files:
        if is_records(f):
            for value in _field_values(f, text_field, option):
                parts.append(_document(value, f, text_field, option, chat))
            continue
        try:
            parts.append(f.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SparsetoolError(
                f"{option} {f}: not UTF-8 text (byte {e.start}); convert it or leave it out"
            ) from None
        except OSError as e:
            raise SparsetoolError(f"{option} {f}: cannot read ({e.strerror})") from None
    text = "\n".join(parts)
    if isinstance(path, TextSource):  # what was read, for the output's provenance
        path.digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text


# ---------------------------------------------------------------------------- records
def _missing(f: Path, field: str, option: str, has: list[str]) -> SparsetoolError:
    return SparsetoolError(
        f"{option} {f}: no field {field!r} (it has: {', '.join(has) or 'none'}); "
        "name the field holding the text with --text-field NAME"
    )


def _field_values(f: Path, field: str, option: str) -> Iterator[Any]:
    """The ``field`` of each record of ``f``, in file order."""
    if f.suffix.lower() == ".jsonl":
        yield from _jsonl_values(f, field, option)
        return
    table = _arrow_table(f, option)
    if field not in table.column_names:
        raise _missing(f, field, option, list(table.column_names))
    yield from table.column(field).to_pylist()


def _jsonl_values(f: Path, field: str, option: str) -> Iterator[Any]:
    try:
        lines = f.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise SparsetoolError(f"{option} {f}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SparsetoolError(f"{option} {f}: cannot read ({e.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise SparsetoolError(
                f"{option} {f}: line {n} is not JSON ({e.msg}); a .jsonl file holds one JSON "
                "object per line"
            ) from None
        if not isinstance(record, dict):
            raise SparsetoolError(
                f"{option} {f}: line {n} is a JSON {type(record).__name__}, not an object; a "
                ".jsonl file holds one JSON object per line"
            )
        if field not in record:
            raise _missing(f, field, option, list(record))
        yield record[field]


def _arrow_table(f: Path, option: str) -> Any:
    """The table of a Parquet or Arrow IPC (file or stream) file."""
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        raise SparsetoolError(
            f"{option} {f}: reading a {f.suffix.lower()} file needs pyarrow, which is not "
            "installed: pip install 'sparsetool[records]' (or pip install -e '.[records]' in a "
            "source checkout)"
        ) from None
    try:
        if f.suffix.lower() == ".parquet":
            return pq.read_table(f)
        with pa.memory_map(str(f)) as source:
            try:
                return pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:  # not the file format: the stream format datasets writes
                source.seek(0)
                return pa.ipc.open_stream(source).read_all()
    except OSError as e:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSError
        raise SparsetoolError(f"{option} {f}: cannot read ({e})") from None
    except (ValueError, pa.ArrowException) as e:
        kind = "Parquet" if f.suffix.lower() == ".parquet" else "Arrow IPC"
        raise SparsetoolError(
            f"{option} {f}: not a {kind} file ({str(e).splitlines()[0]})"
        ) from None


def _document(value: Any, f: Path, field: str, option: str, chat: _ChatTemplate) -> str:
    """One record's document: a string as it is, a list of chat messages rendered."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_message(m) for m in value):
        return chat.render(value, f, field)
    what = "null" if value is None else type(value).__name__
    raise SparsetoolError(
        f"{option} {f}: field {field!r} holds a {what}, not text or a list of chat messages "
        '([{"role": ..., "content": ...}]); name the text field with --text-field NAME'
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m


class _ChatTemplate:
    """The checkpoint's tokenizer, loaded at the first chat record."""

    def __init__(self, checkpoint: str | None, option: str):
        self.checkpoint, self.option = checkpoint, option
        self.tokenizer: Any = None

    def render(self, messages: list[dict], f: Path, field: str) -> str:
        if self.tokenizer is None:
            self.tokenizer = self._load(f, field)
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False))

    def _load(self, f: Path, field: str) -> Any:
        where = f"{self.option} {f}: field {field!r} holds chat messages"
        if self.checkpoint is None:
            raise SparsetoolError(
                f"{where}, which only a model's chat template turns into text; give a field "
                "of plain text"
            )
        from sparsetool.models.hf import TOKENIZER_FILES, import_transformers, load_tokenizer

        d = Path(self.checkpoint)
        d = d if d.is_dir() else d.parent
        if not any((d / name).is_file() for name in TOKENIZER_FILES):
            tokenizer = None
        else:
            tokenizer = load_tokenizer(d, import_transformers("reading chat messages of"))
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise SparsetoolError(
                f"{where}, but the tokenizer of {self.checkpoint} has no chat template to "
                "render them (chat_template in tokenizer_config.json, or chat_template.jinja); "
                "use an instruct model's tokenizer files or give a field of plain text "
                "(--text-field NAME)"
            )
        return tokenizer
