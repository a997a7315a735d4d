"""``prune`` end to end: :func:`prune_checkpoint` is plan (``plan.py``), then write
(``write.py``); the package's docstring tells the whole pipeline."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparsetool.checkpoint.output_files import check_writable, reclaiming
from sparsetool.ops.prune.options import PruneOptions, PruneResult
from sparsetool.ops.prune.plan import plan_prune
from sparsetool.ops.prune.write import write_pruned
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["prune_checkpoint", "not_a_model"]

GPT_EMB, GPT_POS = "tok_emb.weight", "pos_emb.weight"  # sparsetool's GPT: no config.json needed


def prune_checkpoint(
    src: str | Path,
    out: str | Path,
    opts: PruneOptions,
    *,
    in_place: bool = False,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> PruneResult:
    """Prune the targeted tensors of checkpoint ``src`` into ``out`` (same layout), streaming.

    With a calibration method, ``on_plan`` is called with the memory plan once it is made,
    before the long part (a plan that cannot fit raises instead). The temporaries of killed runs
    removed beside ``out`` are the result's ``reclaimed`` (an error's, if it fails)."""
    with reclaiming() as reclaimed:
        check_writable(out, "-o")  # before the plan, which may load a model and calibration text
        # calibration records: their text field, and src's chat template for chat messages
        plan = plan_prune(src, opts.reading(src), progress=progress, on_plan=on_plan)
        result = write_pruned(plan, out, in_place=in_place, progress=progress)
    result.reclaimed = reclaimed
    result.not_a_model = not_a_model(src, result.output, {t.name for t in plan.ckpt.logical})
    return result


def not_a_model(src: str | Path, out: str | Path, names: set[str]) -> str | None:
    """Why the directory ``out`` pruned from the directory ``src`` is no model that ``eval`` or
    transformers loads (it has no ``config.json``), with what to do; None when it is one (or a
    checkpoint of sparsetool's GPT, which needs none, or a file)."""
    src, out = Path(src), Path(out)
    if not src.is_dir() or (out / "config.json").is_file() or {GPT_EMB, GPT_POS} <= names:
        return None
    return (
        f"{out} has no config.json ({src} had none), so eval, transformers and the other model "
        "loaders cannot load it; copy the original model's config.json and tokenizer files "
        f"into {out}, or prune the model's own directory"
    )
