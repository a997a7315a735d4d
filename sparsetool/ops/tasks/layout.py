"""The harness's ``(context, continuation)`` requests as the inputs the model runs
(:func:`layout_requests`): each cut to the model's context as the harness's ``hf`` model cuts
it, equal inputs once, the choices of an item packed behind one copy of their context.
Torch-free; :func:`sparsetool.ops.scoring.score_layout` runs a layout."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sparsetool.errors import SparsetoolError

__all__ = ["Layout", "Sequence", "layout_requests", "unpacked"]


@dataclass
class Sequence:
    """One input the model runs: its token ids, and for a packed input (several requests' inputs
    sharing a prefix) each token's position and segment (0: the prefix; None: a plain input);
    ``wants``: each request it scores, as (request, continuation ids, the row predicting each
    continuation token)."""

    ids: tuple[int, ...]
    positions: tuple[int, ...] | None = None
    segments: tuple[int, ...] | None = None
    wants: list[tuple[int, list[int], list[int]]] = field(default_factory=list)


@dataclass
class Layout:
    """The requests as the inputs the model runs (:func:`layout_requests`): ``done`` holds the
    answers known without running (empty continuations); ``cut_contexts`` and ``cut_continuations``
    the requests whose context was cut to the model's window, and whose continuation was."""

    sequences: list[Sequence]
    done: dict[int, tuple[float, bool]]
    cut_contexts: list[int]
    cut_continuations: list[int]
    packed: bool = True  # False once the model turned out to take no mask to pack with

    @property
    def longest(self) -> int:
        return max((len(s.ids) for s in self.sequences), default=1)


def layout_requests(
    pairs: list[tuple[list[int], list[int]]], max_length: int, share: bool = True
) -> Layout:
    """The model's inputs for ``(context ids, continuation ids)`` pairs, as the harness's ``hf``
    model reads them: the input is ``(context + continuation)[-(max_length + 1):][:-1]`` (the
    context cut from the left). Where the hf model stops on an assertion: a continuation longer
    than the model's context is scored on its last ``max_length`` tokens (those before it read as
    context), and an empty continuation scores 0.0 and greedy (log 1, nothing to miss) unrun.

    Equal inputs run once. With ``share``, requests whose inputs share everything but their
    continuation's tokens (the choices of one item) are one packed input: that prefix once, then
    each continuation's tokens but its last (equal ones once), their positions continuing the
    prefix's; as many continuations as fit in ``max_length`` tokens behind one copy of the prefix.
    Without ``share`` every distinct input is its own sequence (the harness's ``hf`` model)."""
    done: dict[int, tuple[float, bool]] = {}
    cut_contexts: list[int] = []
    cut_continuations: list[int] = []
    plain: dict[tuple[int, ...], Sequence] = {}
    groups: dict[tuple[int, ...], dict[tuple[int, ...], list[tuple[int, list[int]]]]] = {}
    for r, (ctx, cont) in enumerate(pairs):
        if not ctx:
            raise SparsetoolError("a request has an empty context after tokenizing")
        if not cont:
            done[r] = (0.0, True)  # nothing to predict: log 1, and greedy
            continue
        if len(cont) > max_length:  # its first tokens become context: the input stays the text
            ctx, cont = ctx + cont[:-max_length], cont[-max_length:]
            cut_continuations.append(r)
        elif len(ctx) + len(cont) > max_length + 1:
            cut_contexts.append(r)
        inp = (ctx + cont)[-(max_length + 1) :][:-1]
        first = len(inp) - len(cont)  # the row predicting the continuation's first token
        if not share:
            seq = plain.setdefault(tuple(inp), Sequence(tuple(inp)))
            seq.wants.append((r, cont, list(range(first, len(inp)))))
            continue
        tails = groups.setdefault(tuple(inp[: first + 1]), {})
        tails.setdefault(tuple(cont[:-1]), []).append((r, cont))
    sequences = list(plain.values())
    for prefix, tails in groups.items():
        sequences += _pack(prefix, tails, max_length)
    return Layout(sequences, done, cut_contexts, cut_continuations)


def _pack(
    prefix: tuple[int, ...],
    tails: dict[tuple[int, ...], list[tuple[int, list[int]]]],
    max_length: int,
) -> list[Sequence]:
    """``prefix`` once, then the continuations' tokens in the model (``tails``), in sequences of
    at most ``max_length`` tokens (a sequence of one tail is a plain input)."""
    out: list[Sequence] = []
    ids, pos, seg = list(prefix), list(range(len(prefix))), [0] * len(prefix)
    wants: list[tuple[int, list[int], list[int]]] = []
    last = len(prefix) - 1
    for tail, requests in tails.items():
        if seg[-1] and len(ids) + len(tail) > max_length:  # full: another copy of the prefix
            out.append(_sequence(ids, pos, seg, wants))
            ids, pos, seg = list(prefix), list(range(len(prefix))), [0] * len(prefix)
            wants = []
        start, k = len(ids), max(seg) + 1
        ids += tail
        pos += range(len(prefix), len(prefix) + len(tail))
        seg += [k] * len(tail)
        rows = [last] + list(range(start, start + len(tail)))
        wants += [(r, cont, rows) for r, cont in requests]
    out.append(_sequence(ids, pos, seg, wants))
    return out


def _sequence(
    ids: list[int], pos: list[int], seg: list[int], wants: list[tuple[int, list[int], list[int]]]
) -> Sequence:
    if max(seg) <= 1:  # the prefix and at most one continuation: a plain input
        return Sequence(tuple(ids), None, None, wants)
    return Sequence(tuple(ids), tuple(pos), tuple(seg), wants)


def unpacked(layout: Layout) -> Layout:
    """``layout`` with every packed sequence's requests run on their own inputs."""
    plain: dict[tuple[int, ...], Sequence] = {}
    sequences = [s for s in layout.sequences if s.positions is None]
    for s in layout.sequences:
        if s.positions is None:
            continue
        for r, cont, rows in s.wants:  # the prefix, then the continuation's own tokens
            inp = s.ids[: rows[0] + 1] + tuple(s.ids[j] for j in rows[1:])
            seq = plain.setdefault(inp, Sequence(inp))
            seq.wants.append((r, cont, list(range(len(inp) - len(cont), len(inp)))))
    return dataclasses.replace(layout, sequences=sequences + list(plain.values()))
