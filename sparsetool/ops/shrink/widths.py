"""``shrink --ffn F``, ``--heads F`` and ``--hidden F``: narrower feed-forward layers, fewer
attention heads and fewer embedding channels, ranked by their activations on calibration text
(Minitron's criterion), every layer to the same width so the config holds it.

The calibration windows run through the model block by block (one block in memory). In each
block a hook on the FFN's down projection reads its input, one value per channel and token, and
a hook on the attention's output projection reads its input, one ``head_dim`` slice per query
head:

- a channel's score is ``mean_t |a_c(t)|``; each layer keeps its best, ``round(F x d_ff)`` or
  the multiple of ``--multiple-of`` nearest ``F x d_ff`` (:mod:`~sparsetool.ops.shrink.width_plan`
  says how every width is counted);
- a query head's score is ``mean_t ||o_h(t)||_2``. Under grouped-query attention (several query
  heads share a key/value head) whole key/value groups go, ``round(F x n_kv_heads)`` of them,
  when ``F x n_kv_heads`` is a whole number (a group scores the sum of its heads) or each group
  is one head (plain multi-head attention), else the same number of query heads in every group
  (``round(F x heads per group)``): both are what ``num_attention_heads`` /
  ``num_key_value_heads`` express, and the result says which was done, with a note when the
  heads kept are not the whole number nearest ``F x heads`` (0.5 of 9 heads in 3 groups: 6),
  the count moved to the nearest whose heads x ``head_dim`` is a multiple of ``--multiple-of``;
- an embedding channel (one dimension of the hidden size, which every block reads and adds to)
  scores ``sum_n mean_t |y_n,c(t)|`` over the outputs ``y_n`` of every norm the hidden size runs
  through (each block's and the final one); the model keeps its best (counted as the FFN's), the
  same channels everywhere.

The output keeps the input's layout: gate/up rows (and biases) and down columns of the kept
channels; q rows, k/v rows of the kept groups and o columns of the kept heads; ``config.json``'s
``intermediate_size`` (GPT-2: ``n_inner``), ``num_attention_heads``, ``num_key_value_heads``
lowered and ``head_dim`` written out. ``--hidden``: the embedding's and the head's columns, the
columns of every projection that reads the hidden states (q/k/v, gate/up), the rows (and biases)
of those that write them (o, down) and the norms' entries of the kept channels, ``hidden_size``
lowered; a tensor whose use of the hidden size is not one of these is refused before anything is
written. Everything else is copied byte for byte.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.spill import TensorSpill
from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.shrink.kind import Shrinking, run_kind
from sparsetool.ops.shrink.memory import renorm_bytes
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.renorm import refit_readers
from sparsetool.ops.shrink.results import (
    LeastSquares,
    ShrinkResult,
)
from sparsetool.ops.shrink.width_cuts import (
    choose_widths,
    cut_hidden,
    hidden_axes,
    removed_params,
    widths_config,
    write_widths,
)
from sparsetool.ops.shrink.width_plan import (
    check_divides,
    hidden_keep,
    model_geometry,
    plan_widths,
)
from sparsetool.ops.shrink.width_refit import Refitter, refit_statistics, refits
from sparsetool.ops.shrink.width_scores import (
    Hidden,
    find_layer,
    score_widths,
)
from sparsetool.ops.shrink.windows import shrink_windows
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

NEEDS = "shrink narrows causal language models (Hugging Face directories)"


def shrink_widths(
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Narrow the FFNs (``opts.ffn``), the attention (``opts.heads``) and/or the embedding
    channels (``opts.hidden``) of the model at ``path`` into ``out``; see the module docstring."""
    return run_kind(WidthsKind(opts), path, out, opts, progress=progress, on_plan=on_plan)


class WidthsKind:
    """``--ffn``, ``--heads``, ``--hidden`` as a :class:`~sparsetool.ops.shrink.kind.ShrinkKind`:
    every check needs the opened model (its blocks and widths)."""

    key = "widths"
    needs = NEEDS

    def __init__(self, opts: ShrinkOptions):
        self.opts = opts

    def plan(self, path: Path, config: dict[str, Any], cfg: Any) -> None:
        """Nothing before the model opens (sparsetool's GPT, a file without config.json: refused
        by the skeleton's read of the config)."""

    def choose(
        self,
        model: BlockModel,
        text: str | None,
        result: ShrinkResult,
        held: contextlib.ExitStack,
        progress: Progress | None,
        on_plan: Callable[[MemoryPlan], None] | None,
    ) -> Shrinking:
        opts = self.opts
        assert text is not None
        cfg = model.module.config
        layers = [find_layer(model, i, opts) for i in range(len(model.blocks))]
        geometry = model_geometry(model, cfg, opts)
        plan = plan_widths(geometry, opts, str(model.path))  # none or all: refused before any text
        result.notes += plan.notes
        hidden = Hidden() if opts.hidden is not None else None
        if hidden is not None:  # refuse what --hidden cannot narrow before any text is run
            hidden.axes = hidden_axes(model)
            hidden.keep, said = hidden_keep(model, opts)
            result.notes += said
        check_divides(cfg, plan, geometry, model.width, hidden.keep if hidden else None, opts)
        if hidden is not None and not any(layer.norms for layer in layers):
            raise SparsetoolError(
                f"{model.path}: its blocks have no norm with weights over the hidden size "
                "(as OLMo's, without weights), whose outputs --hidden ranks channels by"
            )
        renorm = opts.reconstruct and opts.hidden is not None
        spill: TensorSpill | None = None
        if refits(opts) or renorm:  # the refit tensors wait on disk beside the output
            spill = TensorSpill(result.output)
            held.callback(spill.close)
        refit = None  # --ffn/--heads refit in the scoring pass; --hidden's readers after it
        if refits(opts) and spill is not None:
            refit = Refitter(model, layers, geometry, plan, spill, opts.samples)
        statistics = refit_statistics(model, layers, geometry, plan) if refit is not None else 0
        if renorm and hidden is not None:  # its own pass, after the first
            widest = max(geometry.ffn, geometry.heads * geometry.head_dim)
            statistics = max(statistics, renorm_bytes(model.width, hidden.keep, widest))
        windows = shrink_windows(model, opts, text, result, statistics=statistics, on_plan=on_plan)
        score_widths(model, layers, windows, progress, hidden, refit)
        if refit is None:
            cuts, record = choose_widths(model, layers, geometry, plan)
        else:
            cuts, record = refit.cuts, refit.record()
        values: dict[str, int | None] = refit.values if refit is not None else {}
        if hidden is not None:
            # head_dim written out: the config's default, hidden size / heads, no longer holds
            record.hidden = cut_hidden(model, hidden, geometry.head_dim, cuts, result)
            if renorm and spill is not None:
                found = refit_readers(model, windows, record.hidden.kept, spill, values, progress)
                record.hidden.refit = LeastSquares.of_readers(found)
                result.notes.append(
                    "--hidden: the residual stream's removed channels are sliced out of the "
                    "embeddings, the head and the rows of what writes them (no least-squares "
                    "answer brings them back); what reads each RMS norm is refit"
                    + (
                        f" (not: {', '.join(found['not_refit'])}, not RMS norms)"
                        if found["not_refit"]
                        else ""
                    )  # fmt: skip
                )
        result.widths = record
        ckpt = model.ckpt
        return Shrinking(
            record=record.to_json(),
            config=lambda config: widths_config(config, cfg, record),
            write=lambda cw: write_widths(ckpt, cw, cuts, values, spill),
            removed=lambda: sum(removed_params(ckpt, n, cut) for n, cut in cuts.items()),
        )
