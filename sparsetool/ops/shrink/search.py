"""``shrink --params F|N``: the smaller model of the size asked for (within 1%), its cuts chosen by
measurement.

1. The mixes: every combination of blocks removed, query heads, hidden size and FFN width on the
   grid :func:`~sparsetool.ops.shrink.sizes.mixes` lists, whose exact parameter count lies within
   1% of the budget (config.json and the header alone).
2. Each kind alone, measured: for blocks, FFN, heads and hidden size (those the model has), one
   cut of that kind alone is made (as ``shrink --blocks``/``--ffn``/... make it, refit and all)
   and scored: the one meeting the budget where that kind alone can, else a middling cut. Its
   loss increase over the input, ``dL_k``, at the fraction ``u_k`` of that width (or of the
   blocks) it removed gives the kind's sensitivity ``a_k = dL_k / u_k^2``.
3. The prediction: a mix's loss increase is taken as ``sum_k a_k u_k^2`` (each kind as measured
   alone, growing with the square of its cut, the kinds adding up); the ``--candidates`` mixes
   predicted least are made and scored too.
4. The choice: of every model made that meets the budget, the one of least loss is written.

The loss is the mean negative log-likelihood per token on windows of the calibration text that
the calibration never ran (:func:`~sparsetool.ops.calibration.unpicked_windows`; the held-back
calibration windows when the text holds no more, said in a note), the same windows for every
candidate and for the input. Candidates are made one at a time beside the output; only the best so
far is kept on disk. The chosen one is copied into the output with its provenance: the steps that
made it (its history) and this search's record (:class:`~.results.ParamsSearch`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.output_files import temp_beside
from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.checkpoint.writer import write_checkpoint
from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.open import open_model
from sparsetool.ops.calibration import calibration_windows, unpicked_windows, window_length
from sparsetool.ops.scoring import held_windows, score
from sparsetool.ops.shrink.blocks import shrink_blocks, write_renamed
from sparsetool.ops.shrink.inputs import check_output, model_config
from sparsetool.ops.shrink.mix import shrink_mix
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.refit import is_held
from sparsetool.ops.shrink.results import Candidate, ParamsSearch, ShrinkResult
from sparsetool.ops.shrink.sizes import TOLERANCE, Mix, SizeModel, mixes
from sparsetool.ops.shrink.widths import shrink_widths
from sparsetool.ops.text import read_text
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = ["SCORE_WINDOWS", "shrink_to_params"]

NEEDS = "shrink --params shrinks causal language models (Hugging Face directories)"
SCORE_WINDOWS = 16
"""Windows of calibration text every candidate is scored on."""


class _Window:
    """A window of the scoring text: tokens ``[start, end)`` in, ``[first, end)`` scored."""

    def __init__(self, start: int, end: int):
        self.start, self.end, self.first = start, end, start + 1


def shrink_to_params(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
    on_search: Callable[[ParamsSearch], None] | None = None,
) -> ShrinkResult:
    """Write the model of ``opts.params`` parameters at least loss to ``out``; see the module
    docstring. ``on_search`` hears the search's plan before the first candidate is made."""
    opts.validate()
    path, out = Path(path), Path(out)
    config, cfg = model_config(path, NEEDS)
    size = SizeModel.of(path, config, cfg)
    assert opts.params is not None
    target = round(opts.params * size.total) if isinstance(opts.params, float) else opts.params
    if not 0 < target < size.total:
        raise UsageError(
            f"--params {opts.params:g}: {path} has {plural(size.total, 'parameter')}; ask for "
            "fewer (a fraction below 1, or a count below that)"
        )
    kinds = _kinds(size, opts.multiple_of)
    found = mixes(size, target, opts.multiple_of, kinds)
    if not found:
        raise UsageError(
            f"--params {opts.params:g}: no cut of {path}'s blocks, FFN, heads or hidden size "
            f"({', '.join(sorted(kinds))}; widths multiples of {opts.multiple_of}) comes within "
            f"1% of {plural(target, 'parameter')}; ask for another size"
            + (", or give a smaller --multiple-of" if opts.multiple_of > 1 else "")
        )
    check_output(path, out)
    assert opts.calibration is not None
    text = read_text(opts.calibration, "--calibration")
    search = ParamsSearch(target=target, total=size.total, kinds=sorted(kinds), mixes=len(found))
    refs = {k: _reference(size, k, found, target, opts.multiple_of) for k in sorted(kinds)}
    search.planned = [m.label(size) for m in refs.values()]
    dense = open_model(path, opts.dtype, opts.device, needs=NEEDS)
    try:
        ids, note = _scoring_ids(dense, text, opts)
        search.windows, search.seq = ids.shape[0], ids.shape[1]
        if note:
            search.notes.append(note)
        search.dense_loss = _loss(dense, ids, opts)
    finally:
        dense.close()
    if on_search is not None:
        on_search(search)
    runs = _Runs(size, path, out, opts, ids, search, progress)
    try:
        for kind, mix in refs.items():
            runs.make(mix, f"{kind} alone", on_plan=on_plan if not runs.made else None)
        rises = {k: max(runs.made[m].measured - search.dense_loss, 0.0) for k, m in refs.items()}
        sensitivity = {k: rises[k] / max(_cut(size, m, k), 1e-9) ** 2 for k, m in refs.items()}
        search.sensitivity = {k: round(v, 6) for k, v in sensitivity.items()}
        ranked = sorted(found, key=lambda m: _predict(size, m, sensitivity))
        for mix in [m for m in ranked if m not in runs.made][: opts.candidates]:
            runs.make(mix, "mix", predicted=search.dense_loss + _predict(size, mix, sensitivity))
        if runs.best is None:  # the counts are exact: a model whose layout they do not know
            raise SparsetoolError(
                f"--params {opts.params:g}: no model made came within 1% of {target:,} "
                f"parameters ({', '.join(c.label for c in search.candidates)}); shrink "
                "cannot count this model's parameters: give the cuts (--blocks, --ffn, ...)"
            )
        chosen, where, result = runs.best
        search.chosen = chosen.label
        _write_chosen(where, out, opts, search)
    finally:
        runs.close()
    result.output, result.options, result.search = out, opts, search
    result.notes = [*search.notes, *result.notes]
    result.bytes_after = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return result


class _Runs:
    """The candidates made one after the other beside the output, the best eligible one kept on
    disk (``best``: its record, where it is, its shrink's result)."""

    def __init__(
        self,
        size: SizeModel,
        path: Path,
        out: Path,
        opts: ShrinkOptions,
        ids: torch.Tensor,
        search: ParamsSearch,
        progress: Progress | None,
    ):
        self.size, self.path, self.out, self.opts = size, path, out, opts
        self.ids, self.search, self.progress = ids, search, progress
        self.made: dict[Mix, Candidate] = {}
        self.best: tuple[Candidate, Path, ShrinkResult] | None = None

    def make(
        self,
        mix: Mix,
        role: str,
        *,
        predicted: float | None = None,
        on_plan: Callable[[MemoryPlan], None] | None = None,
    ) -> None:
        """Make and score ``mix`` beside the output; keep it if it is the best eligible yet."""
        size, opts, search = self.size, self.opts, self.search
        n, label = len(self.made) + 1, mix.label(size)
        report = None
        if self.progress is not None:
            progress = self.progress

            def report(stage: str, done: int, total: int) -> None:
                progress(f"candidate {n} ({label}): {stage}", done, total)

        where = temp_beside(self.out)
        t0 = time.perf_counter()
        step = replace(opts, params=None, **mix.options(size))
        run = {"blocks": shrink_blocks, "widths": shrink_widths}.get(step.removes, shrink_mix)
        try:
            result = run(self.path, where, step, progress=report, on_plan=on_plan)
            model = open_model(where, opts.dtype, opts.device, needs=NEEDS)
            try:
                loss = _loss(model, self.ids, opts)
            finally:
                model.close()
        except BaseException:
            shutil.rmtree(where, ignore_errors=True)
            raise
        params = result.parameters_after
        cand = Candidate(
            mix=mix,
            label=label,
            role=role,
            params=params,
            predicted=predicted,
            measured=loss,
            eligible=abs(params - search.target) <= TOLERANCE * search.target,
            seconds=round(time.perf_counter() - t0, 1),
        )
        self.made[mix] = cand
        search.candidates.append(cand)
        if cand.eligible and (self.best is None or loss < self.best[0].measured):
            if self.best is not None:
                shutil.rmtree(self.best[1], ignore_errors=True)
            self.best = (cand, where, result)
        else:
            shutil.rmtree(where, ignore_errors=True)

    def close(self) -> None:
        if self.best is not None:
            shutil.rmtree(self.best[1], ignore_errors=True)


def _kinds(size: SizeModel, multiple_of: int) -> set[str]:
    """The kinds of cut the model takes: blocks (more than one), the FFN, and heads and the hidden
    size where the attention has separate q/k/v/o projections; each where the grid (widths
    multiples of ``multiple_of``) holds a cut of it."""
    spans = set(size.inside)
    kinds = {"ffn"} if any("ffn" in s for s in spans) and size.ffn_choices(multiple_of) else set()
    if size.layers > 1:
        kinds.add("blocks")
    if any("q" in s for s in spans):
        if size.hidden_choices(multiple_of):
            kinds.add("hidden")
        if size.head_choices(multiple_of):
            kinds.add("heads")
    return kinds


def _reference(size: SizeModel, kind: str, found: list[Mix], target: int, multiple_of: int) -> Mix:
    """The cut of ``kind`` alone measured for its sensitivity: the one meeting the budget
    (``target`` parameters), or a middling one on the grid where that kind alone cannot."""
    alone = [m for m in found if m.kinds() == [kind]]
    if alone:
        return min(alone, key=lambda m: abs(size.count(m) - target))
    if kind == "blocks":
        return Mix(blocks=max(1, size.layers // 4))
    choices = {
        "heads": size.head_choices(multiple_of),
        "ffn": size.ffn_choices(multiple_of),
        "hidden": size.hidden_choices(multiple_of),
    }[kind]
    whole = {"heads": size.heads, "ffn": size.ffn, "hidden": size.width}[kind]
    kept = min(choices, key=lambda c: (abs(c - 0.75 * whole), c))
    return Mix(**{kind: kept})


def _cut(size: SizeModel, mix: Mix, kind: str) -> float:
    """The fraction of ``kind`` (the blocks, or that width) ``mix`` removes."""
    if kind == "blocks":
        return mix.blocks / size.layers
    whole = {"ffn": size.ffn, "heads": size.heads, "hidden": size.width}[kind]
    kept = getattr(mix, kind)
    return 0.0 if kept is None else 1 - kept / whole


def _predict(size: SizeModel, mix: Mix, sensitivity: dict[str, float]) -> float:
    return sum(a * _cut(size, mix, k) ** 2 for k, a in sensitivity.items())


def _scoring_ids(model, text: str, opts: ShrinkOptions) -> tuple[torch.Tensor, str | None]:
    """The windows every candidate is scored on, and a note when they are calibration's own."""
    seq, _note = window_length(opts.seq, model.context, model.path)
    ids = model.encode(text).ids
    picked = calibration_windows(ids, opts.samples, seq, opts.seed, str(opts.calibration))
    more = unpicked_windows(ids, opts.samples, seq, opts.seed, SCORE_WINDOWS)
    if len(more):
        return more, None
    held = [i for i in range(len(picked)) if is_held(i, len(picked))] or list(range(len(picked)))
    note = (
        f"--params: the calibration text holds no window beyond the {opts.samples} calibrated on; "
        f"the candidates are scored on {len(held)} of those (give more text for a fair score)"
    )
    return picked[held], note


def _loss(model, ids: torch.Tensor, opts: ShrinkOptions) -> float:
    """The mean NLL per scored token of ``model`` on the windows ``ids`` (rows)."""
    n, seq = ids.shape
    wins = [_Window(i * seq, (i + 1) * seq) for i in range(n)]
    plan = held_windows(model, seq, 1, n, opts.max_memory)
    total, _ = score(model, ids.reshape(-1), wins, 1, held=plan.held)
    return total / (n * (seq - 1))


def _write_chosen(where: Path, out: Path, opts: ShrinkOptions, search: ParamsSearch) -> None:
    """The chosen candidate copied byte for byte into ``out``, its provenance the steps that made
    it followed by this search."""
    with open_checkpoint(where) as ckpt:
        record = {"command": "shrink", **opts.record(), "search": search.to_json()}
        metadata = provenance_metadata(ckpt.metadata(), record)
        with write_checkpoint(ckpt, out, metadata_extra=metadata) as cw:
            write_renamed(ckpt, cw, {})
