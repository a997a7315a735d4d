"""The one log-likelihood engine of ``sparsetool eval``, torch only (no lm_eval): a model run
block by block over many inputs at once, each block read once per pass, the head applied a
chunk of rows at a time, for perplexity's rolling windows (:func:`score`) and the task
requests' layouts (:func:`score_layout`); :func:`held_windows`, the one memory plan of both."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F

from sparsetool.models.blocks import BlockModel, Call, Unpackable
from sparsetool.ops.tasks.layout import Layout, layout_requests, unpacked
from sparsetool.ops.tasks.layout import Sequence as Input
from sparsetool.util.memory import MemoryPlan, budget, process_memory
from sparsetool.util.progress import Steps

__all__ = [
    "LOGITS_BYTES",
    "Span",
    "Work",
    "held_windows",
    "model_pass",
    "passes",
    "score",
    "score_layout",
    "score_requests",
]


class Span(Protocol):
    """A window of a text's tokens (:class:`sparsetool.ops.eval.Window`): tokens ``[start, end)``
    go into the model, tokens ``[first, end)`` are scored."""

    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def first(self) -> int: ...


LOGITS_BYTES = 256 * 2**20  # one chunk of float32 logits: never a full tokens x vocabulary tensor


class Work:
    """Scoring's progress in tokens through the model: ``progress(done, total)`` after each pass
    (a block, then the head) over a group of windows, ``total`` the tokens of every window, a pass
    worth its group's tokens times its share of the work per token (a block's weights, the head's
    vocabulary x width; a mixture of experts' blocks count every expert). A group of other
    windows (the text's short last one) or the head then moves the count as much as the time it
    takes, so the time left said from the pace so far holds: counted in passes, the short last
    window's passes were worth as many as the full windows' and the estimate was a whole pass
    over the text too long just before the end. ``0`` is reported first, when scoring starts
    (the model's loading is not in its pace)."""

    def __init__(
        self, model: BlockModel, tokens: Sequence[int], report: Callable[[int, int], None] | None
    ) -> None:
        costs = [model.numel(b) for b in model.blocks] + [model.vocab_size * model.width]
        whole = sum(costs) or 1
        self.shares = [c / whole for c in itertools.accumulate(costs)]
        self.tokens, self.report = list(tokens), report
        self.total = sum(self.tokens)
        self.group = self.passes = self.before = 0
        if report:  # 0 first: the pace is measured from here, not from the first pass's count
            report(0, self.total)

    def __call__(self) -> None:
        self.passes += 1
        if self.passes == len(self.shares):  # the head: the group is done
            self.before += self.tokens[self.group]
            self.group, self.passes = self.group + 1, 0
            done = self.before
        else:
            done = self.before + round(self.tokens[self.group] * self.shares[self.passes - 1])
        if self.report:
            self.report(done, self.total)


def model_pass(
    model: BlockModel,
    inputs: list[torch.Tensor],
    step: Callable[[], None],
    layouts: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    *,
    together: bool = False,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One pass of the engine over the batches ``inputs`` (token ids; ``layouts``: each one's
    positions and segments where it is packed): every block run once for all of them, ``step()``
    after each, then the head loaded. Returns each batch's ids and final hidden states (after the
    final norm), in order, each dropped from the pass as it is handed on; once the last is taken
    the head is released and ``step()`` called for it. ``together``: the model's tail set up once
    for every batch (the task requests), else batch by batch (the windows). A packed layout the
    model's blocks take no mask for raises :class:`~sparsetool.models.blocks.Unpackable` here,
    before any block runs."""
    calls = model.through_blocks(model.capture(inputs, layouts), step)
    model.load_head()
    return _final_states(model, calls, step, together)


def _final_states(
    model: BlockModel, calls: list[Call], step: Callable[[], None], together: bool
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if together:
        finals: list[torch.Tensor | None] = list(model.final_hidden(calls))
        for call in calls:
            call.hidden = None  # type: ignore[assignment]
        for b, call in enumerate(calls):
            hidden, finals[b] = finals[b], None  # freed as the scoring goes on
            assert hidden is not None
            yield call.ids, hidden
    else:
        for call in calls:
            hidden = model.final_hidden([call])[0]
            call.hidden = None  # type: ignore[assignment]
            yield call.ids, hidden
    model.release_head()
    step()


def score(
    model: BlockModel,
    ids: torch.Tensor,
    wins: Sequence[Span],
    batch: int = 1,
    held: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    per_window: list[float] | None = None,
) -> tuple[float, float]:
    """Sum of the NLL (nats) of every scored token, and the sum of their squares; ``per_window``
    (a list) receives each window's sum, in the order of ``wins``; ``progress(done, total)``
    counts tokens through the model, each pass weighted by its work (:class:`Work`). Windows of
    equal length run ``batch`` at a time; ``held`` windows (a multiple of ``batch``; default all)
    pass the blocks together, so each block is read once per ``held`` windows. Logits are made a
    chunk of rows at a time."""
    by_length: dict[int, list[Span]] = {}
    for w in wins:
        by_length.setdefault(w.end - w.start, []).append(w)
    sums: dict[int, float] = {}  # id of a window -> its NLL sum (equal windows are one object)
    groups = [
        group[i : i + (held or len(group))]
        for group in by_length.values()
        for i in range(0, len(group), held or len(group))
    ]
    tick = Work(model, [sum(w.end - w.start for w in group) for group in groups], progress)
    rows = max(1, LOGITS_BYTES // (4 * model.vocab_size))
    total = squares = 0.0

    with torch.inference_mode():
        for group in groups:
            batches = [group[i : i + batch] for i in range(0, len(group), batch)]
            inputs = [torch.stack([ids[w.start : w.end] for w in b]) for b in batches]
            # the pass first: taking past its last batch releases the head
            for (x, hidden), chunk in zip(model_pass(model, inputs, tick), batches):
                for b, w in enumerate(chunk):
                    window = 0.0
                    # hidden at position j predicts token j + 1
                    for lo in range(w.first - w.start, w.end - w.start, rows):
                        hi = min(lo + rows, w.end - w.start)
                        logits = model.logits(hidden[b, lo - 1 : hi - 1]).float()
                        nll = F.cross_entropy(logits, x[b, lo:hi], reduction="none")
                        window += float(nll.sum())
                        squares += float(nll.double().pow(2).sum())
                    total += window
                    sums[id(w)] = window
    if per_window is not None:
        per_window.extend(sums[id(w)] for w in wins)
    return total, squares


def held_windows(
    model: BlockModel, seq: int, batch: int, n_windows: int, max_memory: int | None
) -> MemoryPlan:
    """The memory plan of scoring ``n_windows`` windows: as many windows as the budget leaves
    room for pass the blocks together (``held``, a multiple of ``batch``, at least one batch)."""
    total, source = budget(max_memory)
    per_window = 2 * seq * model.width * model.dtype.itemsize  # a block's input and output
    rows = min(seq, max(1, LOGITS_BYTES // (4 * model.vocab_size)))
    work = model.block_work_bytes(batch, seq) + 2 * rows * model.vocab_size * 4
    weights = max(model.largest_block_bytes, model.bytes_of(model.outer + model.head))
    fixed = process_memory()
    room = total - fixed - weights - work
    held = min(n_windows, max(batch, room // per_window // batch * batch))
    return MemoryPlan(
        fixed=fixed,
        weights=weights,
        activations=held * per_window + work,
        statistics=0,
        budget=total,
        budget_source=source,
        held=held,
    )


def score_requests(
    model: BlockModel,
    pairs: list[tuple[list[int], list[int]]],
    max_length: int,
    batch: int = 1,
    held: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    share: bool = False,
) -> list[tuple[float, bool]]:
    """``(log P(continuation | context), every continuation token the argmax)`` for each
    ``(context ids, continuation ids)``: :func:`layout_requests` (``share``: the choices of an
    item behind one copy of their context), then :func:`score_layout`."""
    layout = layout_requests(pairs, max_length, share)
    return score_layout(model, layout, len(pairs), batch, held, progress)


def score_layout(
    model: BlockModel,
    layout: Layout,
    n_requests: int,
    batch: int = 1,
    held: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, bool]]:
    """Run ``layout``'s sequences and score its ``n_requests`` requests. Sequences of equal length
    ``batch`` per forward call; ``held`` is how many sequences of the longest length the memory
    plan leaves room for (default all): every length passes the blocks together in passes of at
    most that many tokens, so each block is read once per pass, not once per length. A model
    whose blocks take no mask to pack with (:class:`~sparsetool.models.blocks.Unpackable`) runs
    each request's own input instead."""
    seqs = layout.sequences
    groups = passes([s.ids for s in seqs], batch, held)
    tick = Steps(len(groups) * (len(model.blocks) + 1), progress)
    rows = max(1, LOGITS_BYTES // (4 * model.vocab_size))
    logprob = [0.0] * n_requests
    greedy = [True] * n_requests
    for r, (lp, g) in layout.done.items():
        logprob[r], greedy[r] = lp, g

    with torch.inference_mode():
        for batches in groups:
            inputs = [torch.tensor([seqs[u].ids for u in b], dtype=torch.long) for b in batches]
            layouts = [_batch_layout([seqs[u] for u in b]) for b in batches]
            try:
                finals = model_pass(model, inputs, tick, layouts, together=True)
            except Unpackable:
                layout.packed = False
                return score_layout(model, unpacked(layout), n_requests, batch, held, progress)
            for b, (_, hidden) in enumerate(finals):
                _score_batch(model, hidden, [seqs[u] for u in batches[b]], rows, logprob, greedy)
    return list(zip(logprob, greedy))


def _batch_layout(batch: list[Input]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The position and segment ids of a batch holding a packed sequence (None: all plain)."""
    if all(s.positions is None for s in batch):
        return None
    n = len(batch[0].ids)
    pos = [s.positions or tuple(range(n)) for s in batch]
    seg = [s.segments or (0,) * n for s in batch]
    return torch.tensor(pos, dtype=torch.long), torch.tensor(seg, dtype=torch.long)


def passes(seqs: list[tuple[int, ...]], batch: int, held: int | None) -> list[list[list[int]]]:
    """The inputs (indices into ``seqs``) as passes of batches: a batch is up to ``batch`` inputs of
    one length (in the order they came); a pass is consecutive batches of at most ``held`` x the
    longest input's tokens (everything in one pass without ``held``)."""
    by_length: dict[int, list[int]] = {}
    for u, s in enumerate(seqs):
        by_length.setdefault(len(s), []).append(u)
    batches = [g[i : i + batch] for g in by_length.values() for i in range(0, len(g), batch)]
    room = None if held is None else held * max(by_length, default=1)
    passes: list[list[list[int]]] = []
    tokens = 0
    for b in batches:
        size = len(b) * len(seqs[b[0]])
        if not passes or (room is not None and tokens + size > room):
            passes.append([])
            tokens = 0
        passes[-1].append(b)
        tokens += size
    return passes


def _score_batch(
    model: BlockModel,
    hidden: torch.Tensor,
    seqs: list[Input],
    limit: int,
    logprob: list[float],
    greedy: list[bool],
) -> None:
    """Set the log-probabilities (and argmax checks) of the requests one batch scores: the rows
    they read (hidden at a row predicts the token after it; a row several requests read is run
    once), at most ``limit`` rows per head call, log-softmax and gather."""
    n = hidden.shape[1]
    flat = hidden.reshape(-1, hidden.shape[-1])
    slot: dict[int, int] = {}  # flat row -> its place among the rows run
    at: list[int] = []
    target: list[int] = []
    owners: list[tuple[int, int, int]] = []  # (request, first pick, picks)
    for b, seq in enumerate(seqs):
        for r, cont, rows in seq.wants:
            owners.append((r, len(at), len(cont)))
            at.extend(slot.setdefault(b * n + row, len(slot)) for row in rows)
            target.extend(cont)
    order = list(slot)
    at_t = torch.tensor(at, dtype=torch.long, device=flat.device)
    target_t = torch.tensor(target, dtype=torch.long, device=flat.device)
    values = torch.empty(len(at), dtype=torch.float32, device=flat.device)
    hits = torch.empty(len(at), dtype=torch.bool, device=flat.device)
    for lo in range(0, len(order), limit):
        index = order[lo : lo + limit]
        contiguous = index[-1] - index[0] + 1 == len(index)
        chunk = flat[index[0] : index[-1] + 1] if contiguous else flat[index]
        lsm = F.log_softmax(model.logits(chunk).float(), dim=-1)
        mine = (at_t >= lo) & (at_t < lo + len(index))
        k, t = at_t[mine] - lo, target_t[mine]
        values[mine] = lsm[k, t]
        hits[mine] = lsm.argmax(dim=-1)[k] == t
    hit = hits.tolist()
    for r, first, picks in owners:
        # a continuation of several tokens: summed in float32 as one piece, as the harness does
        logprob[r] = (
            float(values[first]) if picks == 1 else float(values[first : first + picks].sum())
        )
        greedy[r] = all(hit[first : first + picks])
