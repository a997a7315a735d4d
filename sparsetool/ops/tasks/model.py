"""sparsetool's model as a model of EleutherAI's lm-evaluation-harness (``lm_eval``).

:class:`SparsetoolLM` is an ``lm_eval.api.model.LM`` (through the harness's ``TemplateLM``, which
turns ``(context, continuation)`` strings into token ids with :meth:`SparsetoolLM.tok_encode`, the
harness's own conventions: trailing spaces of a context move to its continuation, the pair is
encoded whole and split, an empty context is the prefix token). It scores every request of a task in
one streamed pass (:func:`sparsetool.ops.scoring.score_layout`): each input sequence is cut to the
model's context from the left as the harness's ``hf`` model does, equal inputs are run once, the
choices of an item run behind one copy of their shared context (packed: the context, then each
choice's tokens with its own positions, seeing the context and itself only;
:func:`sparsetool.ops.tasks.layout.layout_requests`, and :mod:`sparsetool.models.blocks` for the
masks), inputs of every length pass the blocks together in memory-bounded passes (each block read
once per pass; inputs of equal length ``batch`` per forward call), and the log-probabilities of the
continuation tokens and whether each was the argmax come from the final hidden states a chunk of
rows at a time (one head call for the rows of several inputs). The weights are those sparsetool
decodes, so every encoding (zeros, mask, nan, bitmask) and sparsetool's own GPT score alike.

Imported only once ``lm_eval`` is known to be installed
(:func:`sparsetool.ops.tasks.names.import_lm_eval`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.scoring import score_layout
from sparsetool.ops.tasks.layout import Layout, layout_requests
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.wording import plural

__all__ = ["GPT_PREFIX", "SparsetoolLM"]


GPT_PREFIX = 10  # sparsetool's GPT reads bytes: a newline stands for "start of text"


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

                got = cast(Any, module).generate(  # a transformers model
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
