"""sparsetool's model as a model of EleutherAI's lm-evaluation-harness (``lm_eval``).

:class:`SparsetoolLM` is an ``lm_eval.api.model.LM`` (through the harness's ``TemplateLM``, which
turns ``(context, continuation)`` strings into token ids with :meth:`SparsetoolLM.tok_encode`, the
harness's own conventions: trailing spaces of a context move to its continuation, the pair is
encoded whole and split, an empty context is the prefix token). It scores every request of a task
in one streamed pass (:func:`score_requests`): each input sequence is cut to the model's context
from the left as the harness's ``hf`` model does, equal inputs are run once, the choices of an
item run behind one copy of their shared context (packed: the context, then each choice's tokens
with its own positions, seeing the context and itself only; :func:`layout_requests`, and
:mod:`sparsetool.models.blocks` for the masks), inputs of every
length pass the blocks together in memory-bounded passes (each block read once per pass; inputs of
equal length ``batch`` per forward call), and the log-probabilities of the continuation tokens and
whether each was the argmax come from the final hidden states a chunk of rows at a time (one head
call for the rows of several inputs). The weights are those sparsetool decodes, so every
encoding (zeros, mask, nan, bitmask) and sparsetool's own GPT score alike.

Imported only once ``lm_eval`` is known to be installed
(:func:`sparsetool.ops.tasks.import_lm_eval`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel, Unpackable
from sparsetool.ops.eval import LOGITS_BYTES
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Steps
from sparsetool.util.wording import plural

__all__ = [
    "SparsetoolLM",
    "Layout",
    "Sequence",
    "layout_requests",
    "score_layout",
    "score_requests",
    "GPT_PREFIX",
]

GPT_PREFIX = 10  # sparsetool's GPT reads bytes: a newline stands for "start of text"


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
    passes = _passes([s.ids for s in seqs], batch, held)
    tick = Steps(len(passes) * (len(model.blocks) + 1), progress)
    rows = max(1, LOGITS_BYTES // (4 * model.vocab_size))
    logprob = [0.0] * n_requests
    greedy = [True] * n_requests
    for r, (lp, g) in layout.done.items():
        logprob[r], greedy[r] = lp, g

    with torch.inference_mode():
        for batches in passes:
            layouts = [_batch_layout([seqs[u] for u in b]) for b in batches]
            try:
                calls = model.capture(
                    [torch.tensor([seqs[u].ids for u in b], dtype=torch.long) for b in batches],
                    layouts,
                )
            except Unpackable:
                layout.packed = False
                return score_layout(model, _unpacked(layout), n_requests, batch, held, progress)
            calls = model.through_blocks(calls, tick)
            model.load_head()
            finals = model.final_hidden(calls)  # (B, T, d) each, after the final norm; one set-up
            for call in calls:
                call.hidden = None  # type: ignore[assignment]
            for b, hidden in enumerate(finals):
                finals[b] = None  # type: ignore[call-overload]  (freed as the scoring goes on)
                _score_batch(model, hidden, [seqs[u] for u in batches[b]], rows, logprob, greedy)
            model.release_head()
            tick()
    return list(zip(logprob, greedy))


def _batch_layout(batch: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The position and segment ids of a batch holding a packed sequence (None: all plain)."""
    if all(s.positions is None for s in batch):
        return None
    n = len(batch[0].ids)
    pos = [s.positions or tuple(range(n)) for s in batch]
    seg = [s.segments or (0,) * n for s in batch]
    return torch.tensor(pos, dtype=torch.long), torch.tensor(seg, dtype=torch.long)


def _unpacked(layout: Layout) -> Layout:
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
    seqs: list[Sequence],
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
    for r, first, k in owners:
        # a continuation of several tokens: summed in float32 as one piece, as the harness does
        logprob[r] = float(values[first]) if k == 1 else float(values[first : first + k].sum())
        greedy[r] = all(hit[first : first + k])


def _python_warning(message: str) -> None:
    warnings.warn(message, UserWarning, stacklevel=3)


class SparsetoolLM(TemplateLM):
    """A :class:`BlockModel` as a harness model: log-likelihood requests only.

    ``tokenizer`` is the checkpoint's own (a Hugging Face model) or None (sparsetool's GPT, whose
    tokens are UTF-8 bytes and whose prefix token is a newline). ``plan(n_sequences, longest)``
    returns the memory plan a pass needs (checked by the caller); ``progress(done, total)``
    hears each block of each group. ``share``: the choices of an item run behind one copy of
    their context (:func:`layout_requests`); without it every request runs its whole input, as
    the harness's ``hf`` model does. ``warn(message)`` hears what was cut to the model's
    context, once per kind and call (default: a Python warning). ``max_memory``: the budget text
    generation (the whole model resident) must fit in (default: the memory available).
    """

    def __init__(
        self,
        model: BlockModel,
        tokenizer: Any,
        max_length: int,
        batch: int = 1,
        plan: Callable[[int, int], MemoryPlan] | None = None,
        progress: Callable[[int, int], None] | None = None,
        share: bool = True,
        warn: Callable[[str], None] | None = None,
        max_memory: int | None = None,
    ):
        super().__init__()
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.batch, self._plan, self._progress = batch, plan, progress
        self.share, self._warn, self._max_memory = share, warn, max_memory
        self.plans: list[MemoryPlan] = []
        self.sequences = 0  # (context, continuation) pairs scored
        self.warnings: list[str] = []  # said once each (``warn``; a Python warning without it)
        self._instances: list[Any] = []

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
        self._instances = list(requests)  # their task names and documents, for the warnings
        try:
            return super().loglikelihood(requests, disable_tqdm=True)  # progress is our own
        finally:
            self._instances = []

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs: Any):
        pairs = [(ctx, cont) for _, ctx, cont in requests]
        if not pairs:
            return []
        self.sequences += len(pairs)
        layout = layout_requests(pairs, self.max_length, self.share)
        self._warn_cut(layout)
        held = None
        if self._plan is not None and layout.sequences:
            plan = self._plan(len(layout.sequences), layout.longest)
            self.plans.append(plan)
            held = plan.held
        results = score_layout(self.model, layout, len(pairs), self.batch, held, self._progress)
        for (key, _, _), answer in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return results

    def _warn_cut(self, layout: Layout) -> None:
        """One warning for the requests whose continuation was cut to the model's context (the
        harness's ``hf`` model refuses them), one for those whose context was (it cuts those
        the same way, warning once per request)."""
        n = self.max_length
        for cut, what in (
            (
                layout.cut_continuations,
                f"whose continuation is longer than the model's context ({n} tokens): each "
                f"scored on its last {n} tokens",
            ),
            (
                layout.cut_contexts,
                f"longer than the model's context ({n} tokens): their context cut from the "
                "left, as the harness's hf model does",
            ),
        ):
            if not cut:
                continue
            docs: dict[str, set] = {}
            for r in cut:
                inst = self._instances[r] if r < len(self._instances) else None
                name = getattr(inst, "task_name", None) or "?"
                docs.setdefault(name, set()).add(getattr(inst, "doc_id", r))
            where = ", ".join(f"{name} ({plural(len(d), 'document')})" for name, d in docs.items())
            message = f"task {where}: {plural(len(cut), 'request')} {what}"
            self.warnings.append(message)
            (self._warn or _python_warning)(message)

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
        """Greedy text until a stop sequence (``until``, and the end-of-text token's text) or
        ``max_gen_toks`` tokens, as the harness's ``hf`` model at batch size 1: the context cut
        from the left to the model's context less ``max_gen_toks``, the text decoded without
        special tokens and cut at the first stop sequence. The whole model is read once and stays
        resident with a key/value cache; refused in one line where the memory would not hold it."""
        from lm_eval.models.utils import (
            handle_stop_sequences,
            normalize_gen_kwargs,
            postprocess_generated_text,
        )

        if not requests:
            return []
        names = sorted({getattr(r, "task_name", None) or "?" for r in requests})
        settings = []
        for req in requests:
            context, gen_kwargs = req.args
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), 256)
            if kwargs.get("do_sample"):
                raise SparsetoolError(
                    f"task {', '.join(names)} samples its generations (do_sample); only greedy "
                    "generation is supported; leave it out of --tasks"
                )
            until = handle_stop_sequences(kwargs.pop("until", None), eos=self._eot_text())
            settings.append((context, until, int(kwargs.pop("max_gen_toks"))))
        longest = max(m for _, _, m in settings)
        if longest >= self.max_length:
            raise SparsetoolError(
                f"task {', '.join(names)}: {longest} tokens to generate, the model's context is "
                f"{self.max_length} tokens, which leaves no room for the prompt; leave it out "
                "of --tasks"
            )
        everything = [n for block in self.model.blocks for n in block] + self.model.outer
        everything += self.model.head
        self._check_resident(names, everything)
        self.model.load(everything)
        self.sequences += len(requests)
        out = []
        try:
            for done, (context, until, max_gen) in enumerate(settings):
                ids = self.tok_encode(context)[-(self.max_length - max_gen) :]
                tokens = self._greedy(ids, until, max_gen)
                text = (
                    bytes(tokens).decode("utf-8", errors="replace")
                    if self.tokenizer is None
                    else self.tokenizer.decode(tokens, skip_special_tokens=True)
                )
                out.append(postprocess_generated_text(text, until, None))
                self.cache_hook.add_partial("generate_until", requests[done].args, out[-1])
                if self._progress:
                    self._progress(done + 1, len(settings))
        finally:
            self.model.release(everything)
        return out

    def _eot_text(self) -> str:
        if self.tokenizer is None:
            return chr(GPT_PREFIX)
        return self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)

    def _greedy(self, ids: list[int], until: list[str], max_gen: int) -> list[int]:
        """The greedy continuation of ``ids`` (every block resident), stopped once its text
        holds a stop sequence or after ``max_gen`` tokens."""
        x = torch.tensor([ids], dtype=torch.long, device=self.model.device)
        module = self.model.module
        with torch.inference_mode():
            if self.tokenizer is not None:  # the model's own generate, with its key/value cache
                from lm_eval.models.utils_hf import stop_sequences_criteria

                got = module.generate(
                    input_ids=x,
                    attention_mask=torch.ones_like(x),
                    max_length=x.shape[1] + max_gen,
                    stopping_criteria=stop_sequences_criteria(self.tokenizer, until, x.shape[1], 1),
                    pad_token_id=self.tokenizer.pad_token_id,
                    do_sample=False,
                    use_cache=True,
                )
                return got[0, x.shape[1] :].tolist()
            new: list[int] = []  # sparsetool's GPT: no cache, its context at a time
            for _ in range(max_gen):
                logits, _ = module(x[:, -self.model.context :])
                token = int(logits[0, -1].float().argmax())
                new.append(token)
                x = torch.cat([x, x.new_tensor([[token]])], dim=1)
                text = bytes(new).decode("utf-8", errors="replace")
                if any(stop and stop in text for stop in until):
                    break
            return new

    def _check_resident(self, names: list[str], everything: list[str]) -> None:
        """Refuse generation (one line, naming the memory) where the whole model and a
        key/value cache over its context would not fit in the memory budget."""
        from sparsetool.util.memory import binary_bytes, budget, process_memory

        model = self.model
        weights = model.bytes_of(everything)
        cache = 2 * len(model.blocks) * self.max_length * model.kv_width * model.dtype.itemsize
        work = model.block_work_bytes(1, self.max_length)
        fixed = process_memory()
        need = fixed + weights + cache + work
        total, source = budget(self._max_memory)
        if need > total:
            raise SparsetoolError(
                f"task {', '.join(names)} generates text, which needs the whole model resident: "
                f"{binary_bytes(weights)} of weights, {binary_bytes(cache + work)} of cache and "
                f"work and the process's {binary_bytes(fixed)}, {binary_bytes(need)} in all, more "
                f"than the {binary_bytes(total)} of {source}; leave it out of --tasks or give "
                "more --max-memory"
            )
