"""Small wording helpers shared by the library's messages and the CLI's output (no imports)."""

from __future__ import annotations

from collections.abc import Sequence


def plural(n: int, noun: str, many: str | None = None) -> str:
    """A count with its noun agreeing: ``"1 tensor"``, ``"2 tensors"``, ``"1,024 heads"``.

    >>> plural(1, "tensor"), plural(0, "head"), plural(12_288, "matrix", "matrices")
    ('1 tensor', '0 heads', '12,288 matrices')
    """
    return f"{n:,} {noun if n == 1 else (many or noun + 's')}"


def some_names(names: Sequence[str], limit: int = 3) -> str:
    """Up to ``limit`` names, then how many more: ``"a, b, c and 5 more"``.

    >>> some_names(["a", "b"]), some_names(list("abcde"))
    ('a, b', 'a, b, c and 2 more')
    """
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


__all__ = ["plural", "some_names"]
