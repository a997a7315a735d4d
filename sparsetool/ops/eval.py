"""What sparsity costs: perplexity of one or more checkpoints on the same text (``sparsetool
eval``).

The text is tokenized once per model with its own tokenizer (bytes for sparsetool's GPT) and cut
into windows of ``seq`` tokens; within a window every token but the first is predicted. With a
stride ``S < seq`` the windows overlap and each scores only its tokens no earlier window scored: the
sliding-window method of the transformers perplexity guide ("Perplexity of fixed-length models"),
which gives every scored token at least ``seq - S`` tokens of context.

Reported per checkpoint: the mean negative log-likelihood per predicted token ``NLL`` (nats),
perplexity ``exp(NLL)`` and bits per byte ``sum(NLL) / ln 2 / bytes``, where bytes are the UTF-8
bytes of the text the scored tokens cover; bits per byte compares models with different tokenizers.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint.output_files import Written, check_png
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.models.hf import MAX_DEFAULT_SEQ
from sparsetool.models.open import open_model
from sparsetool.ops.eval_options import EvalOptions
from sparsetool.ops.scoring import held_windows, score
from sparsetool.ops.text import read_text
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = [
    "Window",
    "windows",
    "EvalRow",
    "EvalResult",
    "evaluate",
    "plot_eval",
    "pruned_by",
    "compare_windows",
]


@dataclass(frozen=True)
class Window:
    """Tokens ``[start, end)`` go into the model; tokens ``[first, end)`` are scored."""

    start: int
    end: int
    first: int

    @property
    def scored(self) -> int:
        return self.end - self.first


def windows(n_tokens: int, seq: int, stride: int | None = None) -> list[Window]:
    """The windows that score a text of ``n_tokens`` tokens, each token at most once.

    Without a stride (or ``stride == seq``) windows do not overlap and the first token of each is
    context only; a last shorter window is scored too (if it predicts anything):

    >>> [(w.start, w.end, w.first) for w in windows(10, 4)]
    [(0, 4, 1), (4, 8, 5), (8, 10, 9)]

    With ``stride < seq`` window ``i`` starts at ``i * stride`` and scores the tokens after the
    previous window's end, so tokens 1..n-1 are each scored once; the last window ends at the text:

    >>> [(w.start, w.end, w.first) for w in windows(10, 4, stride=2)]
    [(0, 4, 1), (2, 6, 4), (4, 8, 6), (6, 10, 8)]
    >>> [(w.start, w.end, w.first) for w in windows(7, 4, stride=3)]
    [(0, 4, 1), (3, 7, 4)]
    """
    if seq < 2:
        raise UsageError(f"--seq {seq}: a window needs at least 2 tokens (one to predict from)")
    if stride is not None and not 1 <= stride <= seq:
        raise UsageError(f"--stride {stride}: must be between 1 and --seq ({seq})")
    if stride is None or stride == seq:
        return [
            Window(s, min(s + seq, n_tokens), s + 1)
            for s in range(0, n_tokens, seq)
            if min(s + seq, n_tokens) - s >= 2
        ]
    out: list[Window] = []
    prev_end = 0
    for begin in range(0, n_tokens, stride):
        end = min(begin + seq, n_tokens)
        first = max(prev_end, begin + 1)
        if end > first:
            out.append(Window(begin, end, first))
        prev_end = end
        if end == n_tokens:
            break
    return out


@dataclass
class EvalRow:
    name: str
    kind: str  # "sparsetool-gpt" | "huggingface"
    targeted_sparsity: float
    params: int
    nonzero_params: int
    nll: float  # mean nats per predicted token
    perplexity: float
    bits_per_byte: float
    tokens: int  # predicted (scored) tokens
    bytes: int  # UTF-8 bytes of the text those tokens cover
    seq: int
    stride: int
    seconds: float
    change: float = 0.0  # perplexity relative to the first checkpoint's, minus 1
    nll_stderr: float = 0.0  # standard error of ``nll``: the perplexity's relative uncertainty
    tokenizer: str = (
        ""  # fingerprint of the text's token ids: equal when the tokenizers agree on it
    )
    memory: dict | None = None  # the memory plan (memory.py), in bytes
    # the perplexity ratio to the first checkpoint with its paired 95% interval over the windows
    # (sparsetool.ops.paired.loss_ratio); None for the first, or when the windows differ
    comparison: dict | None = None
    # each window's summed NLL (nats) and scored tokens, in text order: what comparison pairs
    window_nll: list[float] = field(default_factory=list, repr=False)
    window_tokens: list[int] = field(default_factory=list, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")

    def to_json(self) -> dict:
        out = {**asdict(self), "tokens_per_s": self.tokens_per_s}
        # kept per window, as tasks keep theirs per document: runs apart can still be paired
        out["windows"] = {"nll": out.pop("window_nll"), "tokens": out.pop("window_tokens")}
        return out


@dataclass
class EvalResult:
    text_source: str
    rows: list[EvalRow] = field(default_factory=list)
    # what ``change`` compares: perplexity, or bits per byte when the checkpoints' tokenizers
    # cut the text into different tokens (perplexities per different tokens do not compare)
    compare_by: str = "perplexity"
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        from sparsetool.ops.paired import method

        return {
            "text": self.text_source,
            "checkpoints": [r.to_json() for r in self.rows],
            "compare_by": self.compare_by,
            "comparison": {**method(), "over": "windows", "estimate": "perplexity ratio"},
            "warnings": list(self.warnings),
        }


def compare_windows(rows: Sequence[EvalRow]) -> None:
    """Set each row's ``comparison`` to the first row: the perplexity ratio with its paired
    interval over the windows (:func:`sparsetool.ops.paired.loss_ratio`), when both scored the
    same windows of the same tokens (same tokenizer fingerprint, ``seq`` and ``stride``); else
    None (perplexities over different tokens do not pair)."""
    from sparsetool.ops.paired import loss_ratio

    first = rows[0] if rows else None
    for row in rows[1:]:
        assert first is not None
        same = (row.tokenizer, row.seq, row.stride, row.window_tokens) == (
            first.tokenizer,
            first.seq,
            first.stride,
            first.window_tokens,
        )
        row.comparison = (
            loss_ratio(first.window_nll, row.window_nll, row.window_tokens).to_json()
            if same and row.window_tokens
            else None
        )


def _default_text() -> tuple[str, str]:
    from sparsetool.util.corpus import load_corpus

    corpus = load_corpus(None)
    return (
        corpus.val.tobytes().decode("utf-8", errors="replace"),
        f"held-out split of the built-in corpus, {corpus.source}",
    )


def evaluate(
    paths: Sequence[str | Path],
    options: EvalOptions | None = None,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[str, MemoryPlan], None] | None = None,
    **values: Any,
) -> EvalResult:
    """Score every checkpoint of ``paths`` on the same text; one :class:`EvalRow` each, in order.
    ``options`` is the options record (:class:`~sparsetool.ops.eval_options.EvalOptions`), or
    None to make it from the options given by name (``text=..., seq=512``).

    ``text`` is the text itself (a ``str``), a file or directory to read (a ``Path``), or None for
    the held-out split of the trainer's built-in corpus. ``seq`` defaults to the model's context
    (at most 2048 tokens); ``max_tokens`` keeps the first tokens of the text only. Each model runs
    block by block (:mod:`sparsetool.models.blocks`) on ``device`` in ``dtype``; as many windows
    pass the blocks together as ``max_memory`` bytes (default: the memory available) leave room
    for, and ``on_plan(checkpoint, plan)`` hears the memory plan before the long part.
    ``plot``: the PNG :func:`plot_eval` will draw, refused before any work if it cannot be
    written.
    """
    if options is None:
        options = EvalOptions(**values)
    elif values:
        raise TypeError(f"evaluate: give the options in the record, not by name: {sorted(values)}")
    seq, stride, max_tokens, batch = options.seq, options.stride, options.max_tokens, options.batch
    text = options.text
    if options.plot is not None:
        check_png(options.plot)
    if not paths:
        raise SparsetoolError("give at least one checkpoint to evaluate")
    for opt, value, least in (
        ("--seq", seq, 2),
        ("--stride", stride, 1),
        ("--max-tokens", max_tokens, 2),
        ("--batch", batch, 1),
    ):
        if value is not None and value < least:
            raise UsageError(f"{opt} {value}: must be at least {least}")
    if seq is not None and stride is not None and stride > seq:
        raise UsageError(f"--stride {stride}: must be between 1 and --seq ({seq})")
    if text is None:
        text, source = _default_text()
    elif isinstance(text, Path):
        text, source = read_text(text), str(text)
    else:
        source = "given text"
    result = EvalResult(source)
    text_tokens = []  # each checkpoint's token count of the whole text (before --max-tokens)
    for path in paths:
        model = open_model(path, options.dtype, options.device)
        try:
            row, whole = _evaluate_one(model, str(path), text, options, progress, on_plan)
            result.rows.append(row)
            text_tokens.append(whole)
        finally:
            model.close()
    if len({r.tokenizer for r in result.rows}) > 1:
        result.compare_by = "bits_per_byte"  # perplexities over different tokens do not compare
    first = getattr(result.rows[0], result.compare_by)
    for row in result.rows:
        row.change = getattr(row, result.compare_by) / first - 1.0
    compare_windows(result.rows)
    few = few_tokens_warning(result.rows, text_tokens, max_tokens)
    if few:
        result.warnings.append(few)
    return result


PRECISION = 0.02  # eval warns when a perplexity is known to no better than +-2% (95% interval)


def few_tokens_warning(
    rows: Sequence[EvalRow], text_tokens: Sequence[int] = (), max_tokens: int | None = None
) -> str | None:
    """One warning for the perplexities measured on too few tokens to mean much: a 95% interval
    (``1.96 x`` the standard error of the mean NLL) wider than +-2%, the widest said once for every
    such checkpoint, with the tokens that would do and the way to get them: a higher
    ``--max-tokens`` when the text has them (``text_tokens``: each checkpoint's count of the whole
    text), else a longer text.

    >>> r = EvalRow(
    ...     "m", "huggingface", 0, 1, 1, 3.0, 20.1, 1.0, 50, 200, 64, 64, 0.1, nll_stderr=0.3
    ... )
    >>> few_tokens_warning([r], [51])
    'm: perplexity from 50 scored tokens is known only to +-80% (95% interval); score at least
    43,218 tokens for +-2% (a longer --text: this one is 51 tokens)'
    >>> from dataclasses import replace
    >>> few_tokens_warning([r, replace(r, name="m-50")], [90_000] * 2, max_tokens=51)
    'm, m-50: perplexity from 50 scored tokens is known only to +-80% (95% interval); score at least
    43,218 tokens for +-2% (--max-tokens 43,218 or more, or drop --max-tokens)'
    """
    wide = [
        (r, t)
        for r, t in itertools.zip_longest(rows, text_tokens[: len(rows)])
        if 1.96 * r.nll_stderr > PRECISION
    ]
    if not wide:
        return None
    row, whole = max(wide, key=lambda p: p[0].nll_stderr)
    half = 1.96 * row.nll_stderr
    need = math.ceil(row.tokens * (half / PRECISION) ** 2)
    cut = max_tokens is not None and whole is not None and whole > max_tokens
    if cut and whole > need:
        advice = f"--max-tokens {need:,} or more, or drop --max-tokens"
    elif whole is not None:
        advice = (
            "drop --max-tokens and give a longer --text" if cut else "a longer --text"
        ) + f": this one is {whole:,} tokens"
    else:
        advice = "a longer --text"
    names = ", ".join(r.name for r, _ in wide)
    spread = math.expm1(half)  # one decimal near the 2% it is compared with
    shown = f"{spread:.0%}" if spread >= 0.1 else f"{spread:.1%}"
    return (
        f"{names}: perplexity from {row.tokens:,} scored tokens is known only to +-{shown} "
        f"(95% interval); score at least {need:,} tokens for +-{PRECISION:.0%} ({advice})"
    )


def _evaluate_one(
    model: BlockModel,
    name: str,
    text: str,
    options: EvalOptions,
    progress: Progress | None,
    on_plan: Callable[[str, MemoryPlan], None] | None,
) -> tuple[EvalRow, int]:
    """One checkpoint's row, and the whole text's length in its tokens."""
    seq, stride, max_tokens, batch = options.seq, options.stride, options.max_tokens, options.batch
    enc = model.encode(text)
    ids = enc.ids[:max_tokens] if max_tokens else enc.ids
    if len(ids) < 2:
        raise SparsetoolError(
            f"{name}: the text is {plural(len(ids), 'token')} long for this model's "
            "tokenizer; give a text of at least two tokens"
        )
    n_seq = seq or min(model.context, MAX_DEFAULT_SEQ)
    if n_seq > model.context:
        raise UsageError(
            f"--seq {n_seq}: {name} takes at most {model.context} tokens at once; "
            f"use --seq {model.context} or less"
        )
    wins = windows(len(ids), n_seq, stride)
    plan = held_windows(model, min(n_seq, len(ids)), batch, len(wins), options.max_memory)
    plan.check(
        f"eval of {name}",
        "--batch, --seq, --dtype bfloat16, or --max-memory if more is free than detected",
    )
    if on_plan:
        on_plan(name, plan)
    report = (lambda d, t: progress(name, d, t)) if progress else None
    t0 = time.perf_counter()
    per_window: list[float] = []
    total, squares = score(
        model,
        torch.tensor(ids, dtype=torch.long),
        wins,
        batch,
        held=plan.held,
        progress=report,
        per_window=per_window,
    )
    seconds = time.perf_counter() - t0
    n = sum(w.scored for w in wins)
    nll = total / n
    # The standard error of the mean NLL is the relative standard error of the perplexity.
    stderr = math.sqrt(max(0.0, squares / n - nll * nll) / max(1, n - 1))
    n_bytes = enc.byte_ends(len(ids))
    numel = nonzero = targeted_numel = targeted_nonzero = 0
    for stored, (count, nz) in model.counts.items():
        numel, nonzero = numel + count, nonzero + nz
        if model.plan[stored].targeted:
            targeted_numel, targeted_nonzero = targeted_numel + count, targeted_nonzero + nz
    row = EvalRow(
        name=name,
        kind=model.kind,
        targeted_sparsity=1.0 - targeted_nonzero / targeted_numel if targeted_numel else 0.0,
        params=numel,
        nonzero_params=nonzero,
        nll=nll,
        perplexity=math.exp(nll),
        bits_per_byte=total / math.log(2) / n_bytes if n_bytes else float("nan"),
        tokens=n,
        bytes=n_bytes,
        seq=n_seq,
        stride=stride or n_seq,
        seconds=seconds,
        nll_stderr=stderr,
        tokenizer=hashlib.sha256(str(enc.ids).encode()).hexdigest()[:16],
        memory=plan.to_json(),
        window_nll=per_window,
        window_tokens=[w.scored for w in wins],
    )
    return row, len(enc.ids)


def pruned_by(path: str | Path) -> str | None:
    """The method ``sparsetool prune`` last pruned the checkpoint at ``path`` with (``magnitude``,
    ``wanda``, ``sparsegpt``, ``random``; N:M added: ``magnitude 2:4``), from its metadata; None
    when its last step was not a prune, or it cannot be read."""
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.provenance import read_provenance

    try:
        with open_checkpoint(path) as ckpt:
            record = read_provenance(ckpt.metadata())
    except (SparsetoolError, OSError):
        return None
    if not record or record.get("command") != "prune" or not record.get("method"):
        return None
    return str(record["method"]) + (f" {record['nm']}" if record.get("nm") else "")


MARKERS = "osD^vPX<>h"  # one per pruning method in eval's plot; checkpoints of no method: "*"


def plot_eval(result: EvalResult, out: str | Path) -> Written:
    """Perplexity against targeted sparsity, one labelled point per checkpoint, as a PNG. Each
    pruning method (:func:`pruned_by`) is a series of its own marker, joined by a line when its
    sparsities differ (never a vertical line through checkpoints of one sparsity); the legend
    names the methods. Points are labelled by the shortest path suffix that tells them apart
    (two ``model`` directories become ``ft/model`` and ``dense/model``); the text's name is
    shortened to fit the title."""
    from sparsetool.ops import plots
    from sparsetool.util.plotting import pyplot

    plt = pyplot()
    rows = sorted(result.rows, key=lambda r: r.targeted_sparsity)
    labels = dict(
        zip([r.name for r in result.rows], plots.unique_suffixes([r.name for r in result.rows]))
    )
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series: dict[str | None, list[EvalRow]] = {}
    for r in rows:
        series.setdefault(pruned_by(r.name), []).append(r)
    for i, (method, members) in enumerate(
        sorted(series.items(), key=lambda kv: (kv[0] is None, kv[0] or ""))
    ):
        sx = [100 * r.targeted_sparsity for r in members]
        joined = len(set(sx)) == len(sx)
        ax.plot(
            sx,
            [r.perplexity for r in members],
            linestyle="-" if joined else "none",
            marker="*" if method is None else MARKERS[i % len(MARKERS)],
            markersize=10 if method is None else 7,
            label=method or "no prune record",
        )
    if len(series) > 1:
        ax.legend(fontsize=7, title="pruned with", title_fontsize=7)
    xs = [100 * r.targeted_sparsity for r in rows]
    middle = (min(xs, default=0) + max(xs, default=0)) / 2
    for x, r in zip(xs, rows):
        right = x > middle and len(rows) > 1  # a label on the right half points left: never cut off
        ax.annotate(
            labels[r.name],
            (x, r.perplexity),
            textcoords="offset points",
            xytext=(-5 if right else 5, 4),
            ha="right" if right else "left",
            fontsize=7,
        )
    ax.margins(x=0.08, y=0.12)
    ax.set_xlabel("targeted sparsity (%)")
    ax.set_ylabel("perplexity")
    ax.set_title(
        f"perplexity vs sparsity\ntext: {plots.shorten_path(result.text_source, 70)}", fontsize=9
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return plots.save_png(fig, out, dpi=110)
