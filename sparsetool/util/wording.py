"""Small wording helpers shared by the library's messages and the CLI's output (no imports but
difflib)."""

from __future__ import annotations

from collections.abc import Sequence
from difflib import get_close_matches


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


def did_you_mean(value: str, names: Sequence[str]) -> str:
    """`` (did you mean X?)`` naming the names closest to a misspelt ``value``, or nothing.

    >>> did_you_mean("gpt3xl", ["gpt2-small", "gpt3-xl"]), did_you_mean("zzz", ["cs2"])
    (' (did you mean gpt3-xl?)', '')
    """
    lowered = {name.lower(): name for name in names}
    close = [lowered[m] for m in get_close_matches(value.lower(), list(lowered), n=2)]
    return f" (did you mean {either(close)}?)" if close else ""


def either(names: Sequence[str]) -> str:
    """``"a"``, ``"a or b"``, ``"a, b or c"``.

    >>> either(["--seq", "--seed", "--json"])
    '--seq, --seed or --json'
    """
    return " or ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


__all__ = ["did_you_mean", "either", "plural", "some_names"]
