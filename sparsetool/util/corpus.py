"""The built-in text corpora and user text, as train and validation byte streams.

Default corpus: the Python standard library's own ``.py`` source files (present wherever Python
is; ~12 MB without its test suites and the generated ``pydoc_data``). Files are taken in sorted
relative-path order and assigned to train or validation by a hash of that path, so the split is
deterministic, independent of the file system's listing order, and no file contributes to both
sides.

A second built-in corpus, ``--data builtin:english``, is English prose present wherever Python is:
the interactive help topics of ``pydoc_data`` (~465 KB), split by a hash of each topic's name.
SPDF's second step fine-tunes on it, a different domain from the Python source.

Shared by ``sparsetool train`` (:mod:`sparsetool.train.data`), eval's default text (the built-in
corpus's validation split) and ``sparsetool demo``. numpy only: no torch.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import hashlib
import stat
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sparsetool.errors import ConfigError

VAL_FRACTION = 0.1
# pydoc_data holds generated English documentation, not source: kept out so it can serve as a
# different-domain fine-tuning corpus without overlapping the pre-training text.
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "pydoc_data"}
_TEST_DIRS = {"test", "tests", "idle_test"}
ENGLISH = "builtin:english"  # --data name of the English help-topics corpus
TEXT_ADVICE = "give a UTF-8 text file or a directory of them"


@dataclass
class Corpus:
    """Train and validation byte streams (uint8) and where they came from."""

    train: np.ndarray
    val: np.ndarray
    source: str
    train_files: int
    val_files: int
    skipped: list[str] = field(default_factory=list)  # files of a directory that are not text

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "train_bytes": int(self.train.size),
            "val_bytes": int(self.val.size),
            "train_files": self.train_files,
            "val_files": self.val_files,
            "skipped_files": len(self.skipped),
            "skipped_examples": self.skipped[:3],
        }


def is_validation(relpath: str, fraction: float = VAL_FRACTION) -> bool:
    """Deterministic split by a hash of the relative path (POSIX separators).

    >>> is_validation("json/decoder.py"), is_validation("json/encoder.py")
    (False, False)
    >>> sum(is_validation(f"f{i}.py") for i in range(1000))  # about 10%
    98
    """
    h = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big")
    return (h % 10_000) < fraction * 10_000


def stdlib_files(include_tests: bool = False) -> tuple[Path, list[str]]:
    """The standard library root and its ``.py`` files, relative, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in root.rglob("*.py"):
        rel = p.relative_to(root)
        parts = set(rel.parts[:-1])
        if parts & _SKIP_DIRS or (not include_tests and parts & _TEST_DIRS):
            continue
        if p.is_file():
            files.append(rel.as_posix())
    return root, sorted(files)


def not_text(data: bytes) -> str | None:
    """Why ``data`` is not UTF-8 text (an executable, NUL bytes, invalid UTF-8), or None.

    >>> not_text(b"def f():\\n    return 1\\n"), not_text("naïve\\n".encode())
    (None, None)
    >>> not_text(b"\\x7fELF\\x02\\x01"), not_text(b"a\\x00b"), not_text(b"caf\\xe9")
    ('it is an ELF executable', 'it holds NUL bytes', 'it is not UTF-8: byte 0xe9 at offset 3')
    """
    if data.startswith(b"\x7fELF"):
        return "it is an ELF executable"
    if b"\x00" in data:  # binary data, or UTF-16 text
        return "it holds NUL bytes"
    decoder = codecs.getincrementaldecoder("utf-8")()
    chunk = 1 << 20  # no whole-file str: a corpus may be large
    for start in range(0, len(data), chunk):
        part = data[start : start + chunk]
        try:
            decoder.decode(part, final=start + chunk >= len(data))
        except UnicodeDecodeError as e:  # e.object: the bytes held back from before, then part
            offset = start - (len(e.object) - len(part)) + e.start
            return f"it is not UTF-8: byte 0x{e.object[e.start]:02x} at offset {offset}"
    return None


def _what_is(p: Path) -> str:
    """What a path that is neither a regular file nor a directory is."""
    if p.is_symlink() and not p.exists():
        return "is a broken symbolic link"
    if not p.exists():
        return "does not exist"
    mode = p.stat().st_mode
    for test, kind in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return f"is not a regular file ({kind})"
    return "is not a regular file"


def _read_file(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read training file {p}: {e.strerror}") from None


def _user_file(p: Path) -> Corpus:
    data = _read_file(p)
    if not data:
        raise ConfigError(f"--data '{p}' is empty; {TEXT_ADVICE}")
    reason = not_text(data)
    if reason:
        raise ConfigError(f"--data '{p}' is not a text file ({reason}); {TEXT_ADVICE}")
    return _split_tail(np.frombuffer(data, dtype=np.uint8), str(p), 1)


def _user_directory(p: Path) -> Corpus:
    """The text files under ``p`` (hidden ones left out), split by file as the built-in corpus;
    files that are not text are skipped and listed in :attr:`Corpus.skipped`."""
    rels = sorted(
        q.relative_to(p).as_posix()
        for q in p.rglob("*")
        if q.is_file() and not any(s.startswith(".") for s in q.relative_to(p).parts)
    )
    if not rels:
        raise ConfigError(f"--data '{p}' holds no files; {TEXT_ADVICE}")
    texts: dict[str, bytes] = {}
    skipped: list[tuple[str, str]] = []
    for rel in rels:
        data = _read_file(p / rel)
        reason = not_text(data)
        if reason:
            skipped.append((rel, reason))
        else:
            texts[rel] = data
    if not texts:
        rel, reason = skipped[0]
        more = f"; and {len(skipped) - 1} more" if len(skipped) > 1 else ""
        raise ConfigError(
            f"--data '{p}' holds no text files: {len(skipped)} "
            f"{'file is' if len(skipped) == 1 else 'files are'} not UTF-8 text "
            f"({rel}: {reason}{more}); {TEXT_ADVICE}"
        )
    corpus = _split_files(texts, str(p))
    corpus.skipped = [rel for rel, _ in skipped]
    return corpus


def _join(texts: list[bytes]) -> np.ndarray:
    # texts (files, topics) are separated by a blank line in the byte stream
    return np.frombuffer(b"".join(t + b"\n" for t in texts), dtype=np.uint8)


def english_topics() -> list[tuple[str, bytes]]:
    """The help topics of ``pydoc_data`` as (name, UTF-8 text), sorted by name."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise ConfigError(
            f"--data {ENGLISH}: this Python installation lacks pydoc_data (its "
            "English help topics); give --data PATH with text files instead"
        ) from None
    return [(name, topics[name].encode("utf-8")) for name in sorted(topics)]


def load_corpus(path: str | Path | None = None, min_bytes: int = 0) -> Corpus:
    """Load the built-in corpus (``path`` None), the built-in English one (``path`` is
    :data:`ENGLISH`) or text files from ``path`` (a file or a directory).

    A directory is split by file (hashed path, as the built-in corpus); if that leaves one side
    empty, or for a single file, the last 10% of bytes become validation. ``min_bytes`` is the
    least each side must hold (one training sequence plus its target byte).

    User data must be UTF-8 text (:func:`not_text`): a file that is not is an error, and so is
    a path that is empty, missing or not a regular file, each saying which; a directory skips
    the files that are not text (:attr:`Corpus.skipped`) and is an error only if none is left.
    """
    if path is None:
        corpus = dataclasses.replace(_stdlib_corpus())
    elif str(path) == ENGLISH:
        named = english_topics()
        val = [text for name, text in named if is_validation(name)]
        train = [text for name, text in named if not is_validation(name)]
        source = f"Python {sysconfig.get_python_version()} help topics ({ENGLISH})"
        corpus = Corpus(_join(train), _join(val), source, len(train), len(val))
    else:
        p = Path(path)
        if p.is_file():
            corpus = _user_file(p)
        elif p.is_dir():
            corpus = _user_directory(p)
        else:
            raise ConfigError(f"--data '{p}' {_what_is(p)}; {TEXT_ADVICE}")
    for side in ("train", "val"):
        n = getattr(corpus, side).size
        if n < min_bytes:
            raise ConfigError(
                f"the {side} split of {corpus.source} has {n} bytes, fewer than the {min_bytes} "
                "one sequence needs; use more text or a smaller --context"
            )
    return corpus


@functools.lru_cache(maxsize=1)
def _stdlib_corpus() -> Corpus:
    """The built-in corpus, read once per process (``sparsetool demo`` trains on it twice and
    evaluates on it); its byte arrays are read-only, so sharing them is safe."""
    root, rels = stdlib_files()
    source = f"Python {sysconfig.get_python_version()} standard library ({root})"
    return _split_files({rel: _read_file(root / rel) for rel in rels}, source)


def _split_files(texts: dict[str, bytes], source: str) -> Corpus:
    """Files (relative path -> bytes) split by a hash of each path; if that leaves one side
    empty, the last 10% of all bytes become validation."""
    val = [r for r in texts if is_validation(r)]
    train = [r for r in texts if not is_validation(r)]
    if not val or not train:
        return _split_tail(_join(list(texts.values())), source, len(texts))
    return Corpus(
        _join([texts[r] for r in train]),
        _join([texts[r] for r in val]),
        source,
        len(train),
        len(val),
    )


def _split_tail(data: np.ndarray, source: str, files: int) -> Corpus:
    cut = int(round(data.size * (1 - VAL_FRACTION)))
    return Corpus(data[:cut], data[cut:], source, files, 0)
