"""sparsetool's model as a model of EleutherAI's lm-evaluation-harness (``lm_eval``).

:class:`SparsetoolLM` is an ``lm_eval.api.model.LM`` (through the harness's ``TemplateLM``, which
turns ``(context, continuation)`` strings into token ids with :meth:`SparsetoolLM.tok_encode`, the
harness's own conventions: trailing spaces of a context move to its continuation, the pair is
encoded whole and split, an empty context is the prefix token). It scores every request of a task
in one streamed pass (:func:`score_requests`): each input sequence is cut to the model's context
from the left as the harness's ``hf`` model does, equal inputs are run once, inputs of every
length pass the blocks together in memory-bounded passes (each block read once per pass; inputs of
equal length ``batch`` per forward call), and the log-probabilities of the continuation tokens and
whether each was the argmax come from the final hidden states a chunk of rows at a time (one head
call for the rows of several inputs). The weights are those sparsetool decodes, so every
encoding (zeros, mask, nan, bitmask) and sparsetool's own GPT score alike.

Imported only once ``lm_eval`` is known to be installed
(:func:`sparsetool.ops.tasks.import_lm_eval`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.eval import LOGITS_BYTES
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Steps

__all__ = ["SparsetoolLM", "score_requests", "GPT_PREFIX"]

GPT_PREFIX = 10  # sparsetool's GPT reads bytes: a newline stands for "start of text"


def score_requests(
    model: BlockModel,
    pairs: list[tuple[list[int], list[int]]],
    max_length: int,
    batch: int = 1,
    held: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[float, bool]]:
    """``(log P(continuation | context), every continuation token the argmax)`` for each
    ``(context ids, continuation ids)``. The model reads ``(context + continuation)[-(max_length
    + 1):][:-1]`` (the harness's left truncation); equal inputs run once, inputs of equal length
    ``batch`` per forward call. ``held`` is how many inputs of the longest length the memory plan
    leaves room for (default all): every length passes the blocks together in passes of at most
    that many tokens, so each block is read once per pass, not once per length."""
    inputs: dict[tuple[int, ...], int] = {}
    wants: list[list[tuple[int, list[int]]]] = []  # per unique input: (request, continuation)
    for r, (ctx, cont) in enumerate(pairs):
        if not ctx or not cont:
            raise SparsetoolError("a request has an empty context or continuation after tokenizing")
        if len(cont) > max_length:
            raise SparsetoolError(
                f"a continuation of {len(cont)} tokens is longer than the model's "
                f"context ({max_length} tokens)"
            )
        key = tuple((ctx + cont)[-(max_length + 1) :][:-1])
        if key not in inputs:
            inputs[key] = len(wants)
            wants.append([])
        wants[inputs[key]].append((r, cont))
    seqs = list(inputs)
    passes = _passes(seqs, batch, held)
    tick = Steps(len(passes) * (len(model.blocks) + 1), progress)
    rows = max(1, LOGITS_BYTES // (4 * model.vocab_size))
    logprob = [0.0] * len(pairs)
    greedy = [True] * len(pairs)

    with torch.inference_mode():
        for batches in passes:
            calls = model.capture(
                [torch.tensor([seqs[u] for u in b], dtype=torch.long) for b in batches]
            )
            calls = model.through_blocks(calls, tick)
            model.load_head()
            finals = model.final_hidden(calls)  # (B, T, d) each, after the final norm; one set-up
            for call in calls:
                call.hidden = None  # type: ignore[assignment]
            for b, hidden in enumerate(finals):
                finals[b] = None  # type: ignore[call-overload]  (freed as the scoring goes on)
                _score_batch(
                    model, hidden, [(seqs[u], wants[u]) for u in batches[b]], rows, logprob, greedy
                )
            model.release_head()
            tick()
    return list(zip(logprob, greedy))


def _passes(seqs: list[tuple[int, ...]], batch: int, held: int | None) -> list[list[list[int]]]:
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
    inputs: list[tuple[tuple[int, ...], list[tuple[int, list[int]]]]],
    rows: int,
    logprob: list[float],
    greedy: list[bool],
) -> None:
    """Add the continuations' log-probabilities (and argmax checks) of one batch's inputs: the
    rows each input scores (hidden at position j predicts token j + 1), cut into spans of at most
    ``rows`` per input as always, and spans of several inputs packed into one logits chunk of
    at most ``rows`` rows: one head, log-softmax and gather per chunk, not per request."""
    n = hidden.shape[1]
    flat = hidden.reshape(-1, hidden.shape[-1])
    spans = []  # (first flat row, row count, position of the first row, the input's wants)
    for b, (_seq, wants) in enumerate(inputs):
        first = n - max(len(cont) for _, cont in wants)
        spans += [(b * n + lo, min(lo + rows, n) - lo, lo, wants) for lo in range(first, n, rows)]
    chunk: list = []
    for span in spans:
        if chunk and sum(s[1] for s in chunk) + span[1] > rows:
            _score_chunk(model, flat, chunk, n, logprob, greedy)
            chunk = []
        chunk.append(span)
    if chunk:
        _score_chunk(model, flat, chunk, n, logprob, greedy)


def _score_chunk(
    model: BlockModel,
    flat: torch.Tensor,
    chunk: list,
    n: int,
    logprob: list[float],
    greedy: list[bool],
) -> None:
    index: list[int] = []
    picks: list[tuple[int, int]] = []  # (chunk row, target token), request by request
    owners: list[tuple[int, int, int]] = []  # (request, first pick, picks)
    for start, count, lo, wants in chunk:
        base = len(index)
        index.extend(range(start, start + count))
        for r, cont in wants:
            begin = max(lo, n - len(cont))
            if begin >= lo + count:
                continue
            owners.append((r, len(picks), lo + count - begin))
            picks.extend(
                (base + j - lo, cont[j - (n - len(cont))]) for j in range(begin, lo + count)
            )
    contiguous = index[-1] - index[0] + 1 == len(index)
    rows = flat[index[0] : index[-1] + 1] if contiguous else flat[index]
    lsm = F.log_softmax(model.logits(rows).float(), dim=-1)
    at = torch.tensor([p[0] for p in picks], dtype=torch.long, device=lsm.device)
    target = torch.tensor([p[1] for p in picks], dtype=torch.long, device=lsm.device)
    picked = lsm[at, target]
    hits = (lsm.argmax(dim=-1)[at] == target).tolist()
    values = picked.tolist()
    for r, first, k in owners:
        # a continuation of several tokens: summed in float32 as one piece, as the harness does
        logprob[r] += values[first] if k == 1 else float(picked[first : first + k].sum())
        greedy[r] = greedy[r] and all(hits[first : first + k])


class SparsetoolLM(TemplateLM):
    """A :class:`BlockModel` as a harness model: log-likelihood requests only.

    ``tokenizer`` is the checkpoint's own (a Hugging Face model) or None (sparsetool's GPT, whose
    tokens are UTF-8 bytes and whose prefix token is a newline). ``plan(n_sequences, longest)``
    returns the memory plan a pass needs (checked by the caller); ``progress(done, total)``
    hears each block of each group.
    """

    def __init__(
        self,
        model: BlockModel,
        tokenizer: Any,
        max_length: int,
        batch: int = 1,
        plan: Callable[[int, int], MemoryPlan] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        super().__init__()
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.batch, self._plan, self._progress = batch, plan, progress
        self.plans: list[MemoryPlan] = []
        self.sequences = 0  # (context, continuation) pairs scored

    # ------------------------------------------------------------------ tokens
    @property
    def eot_token_id(self) -> int:
        return GPT_PREFIX if self.tokenizer is None else self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        if self.tokenizer is None:
            return GPT_PREFIX
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    def tok_encode(
        self,
        string: str,
        add_special_tokens: bool | None = None,
        left_truncate_len: int | None = None,
        **kwargs: Any,
    ) -> list[int]:
        if self.tokenizer is None:
            ids = list(string.encode("utf-8"))
        else:  # as the harness's hf model: the tokenizer's default, but no second BOS
            special = (
                {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
            )
            if (
                add_special_tokens is None
                and self.prefix_token_id is not None
                and string.startswith(self.tokenizer.decode(self.prefix_token_id))
            ):
                special["add_special_tokens"] = False
            ids = list(self.tokenizer.encode(string, **special))
        return ids[-left_truncate_len:] if left_truncate_len else ids

    @property
    def tokenizer_name(self) -> str:
        return str(self.model.path).replace("/", "__")

    # ------------------------------------------------------------------ requests
    def loglikelihood(self, requests, disable_tqdm: bool = False):
        return super().loglikelihood(requests, disable_tqdm=True)  # progress is sparsetool's own

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any):
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        if not pairs:
            return []
        self.sequences += len(pairs)
        held = None
        if self._plan is not None:
            longest = max(min(len(c) + len(t), self.max_length + 1) - 1 for c, t in pairs)
            plan = self._plan(len(pairs), longest)
            self.plans.append(plan)
            held = plan.held
        results = score_requests(
            self.model, pairs, self.max_length, self.batch, held, self._progress
        )
        for (key, _, _), answer in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        pairs, owner = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                pairs.append((None, ctx, cont))
                owner.append(r)
        totals = [0.0] * len(requests)
        for r, (lp, _) in zip(owner, self._loglikelihood_tokens(pairs)):
            totals[r] += lp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        names = sorted({getattr(r, "task_name", None) or "?" for r in requests})
        raise SparsetoolError(
            f"task {', '.join(names)} generates text (generate_until); only "
            "log-likelihood tasks (multiple_choice, loglikelihood, "
            "loglikelihood_rolling) are supported; leave it out of --tasks"
        )
