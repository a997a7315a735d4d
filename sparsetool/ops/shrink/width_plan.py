"""``--ffn``, ``--heads``, ``--hidden``: what each layer keeps, from the model's geometry, checked
before any text runs (none or all kept, a rounding that is not the fraction asked, heads that do
not divide the kept hidden size where transformers refuses that)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparsetool.errors import UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.results import (
    HeadsKept,
    Width,
)
from sparsetool.util.wording import plural


@dataclass(frozen=True)
class Geometry:
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int


def model_geometry(model: BlockModel, cfg, opts: ShrinkOptions) -> Geometry:
    return config_geometry(cfg, model.width, opts)


def config_geometry(cfg, width: int, opts: ShrinkOptions) -> Geometry:
    """The geometry from transformers' config ``cfg`` of a model of hidden size ``width``."""
    heads = int(getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_head", 0) or 0)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or (width // max(heads, 1)))
    ffn = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 0)
    if opts.ffn is not None and not ffn:
        ffn = 4 * width  # GPT-2's default n_inner
    return Geometry(heads, kv, head_dim, ffn)


@dataclass(frozen=True)
class WidthPlan:
    """What ``--ffn`` and ``--heads`` keep per layer, checked before any text runs."""

    keep_ffn: int | None
    mode: str | None  # "groups", "query heads per group", or None: heads kept
    kept_groups: int
    per_group: int
    ffn: Width | None  # --ffn: the channels per layer before and after
    heads: HeadsKept | None  # --heads
    notes: list[str] = field(default_factory=list)  # a kept fraction not the one asked


def _check_kept(flag: str, f: float, kept: int, total: int, what: str, rule: str) -> None:
    """A :class:`UsageError` when ``flag f`` keeps none or all of ``total`` ``what`` (``rule``:
    how ``kept`` was counted, shown in the message)."""
    if 1 <= kept < total:
        return
    if kept < 1:
        raise UsageError(
            f"{flag} {f:g} keeps none of {what} ({rule} = 0); ask for a larger fraction"
        )
    raise UsageError(
        f"{flag} {f:g} keeps all of {what} ({rule} = {kept:,}); ask for a smaller fraction"
    )


def _rounded_away(f: float, kept: int, total: int) -> bool:
    """Whether ``kept`` of ``total`` is not the whole number nearest ``f x total`` (a tie is
    either neighbour): the fraction made is then not the fraction asked.

    >>> _rounded_away(0.5, 6, 9), _rounded_away(0.5, 4, 9), _rounded_away(0.6, 4, 8)
    (True, False, True)
    """
    return abs(kept - f * total) > 0.5 + 1e-9


def plan_widths(g: Geometry, opts: ShrinkOptions, model: str = "the model") -> WidthPlan:
    """The widths ``opts`` asks for on geometry ``g``; a :class:`UsageError` for none or all.

    Heads: whole key/value groups (``round(F x kv-heads)`` of them) when ``F x kv-heads`` is
    whole or every group is one head (plain multi-head attention), else ``round(F x group)``
    query heads of every group; a note when that is not the fraction asked."""
    ffn: Width | None = None
    heads: HeadsKept | None = None
    notes: list[str] = []
    keep_ffn = None
    if opts.ffn is not None:
        keep_ffn = round(opts.ffn * g.ffn)
        _check_kept("--ffn", opts.ffn, keep_ffn, g.ffn, f"{model}'s {g.ffn:,} FFN channels per "
                   "layer", f"round({opts.ffn:g} x {g.ffn:,})")  # fmt: skip
        ffn = Width(g.ffn, keep_ffn)
    mode, kept_groups, per_group = None, g.kv_heads, g.heads // max(g.kv_heads, 1)
    if opts.heads is not None:
        f, group = opts.heads, g.heads // g.kv_heads
        what = f"{model}'s {g.heads} attention heads per layer"
        if g.kv_heads > 1 and (group == 1 or float(f * g.kv_heads).is_integer()):
            mode, kept_groups = "groups", round(f * g.kv_heads)
            rule = f"whole key/value groups: round({f:g} x {g.kv_heads})"
            _check_kept("--heads", f, kept_groups, g.kv_heads, what, rule)
        else:
            mode, per_group = "query heads per group", round(f * group)
            rule = f"heads are kept per key/value group of {group}: round({f:g} x {group})"
            _check_kept("--heads", f, per_group, group, what, rule)
            kept = kept_groups * per_group
            if _rounded_away(f, kept, g.heads):
                notes.append(
                    f"--heads {f:g} keeps {kept} of {plural(g.heads, 'head')} "
                    f"({kept / g.heads:.2f}): "
                    f"heads are kept per key/value group, round({f:g} x {group}) = {per_group} "
                    f"of each group of {group}"
                )
        kept = kept_groups * per_group
        heads = HeadsKept(mode, g.heads, g.kv_heads, kept, kept_groups, g.head_dim)
    return WidthPlan(keep_ffn, mode, kept_groups, per_group, ffn, heads, notes)


def check_divides(
    cfg, plan: WidthPlan, g: Geometry, before: int, keep: int | None, opts: ShrinkOptions
) -> None:
    """A :class:`UsageError` when the kept attention heads do not divide the kept hidden size
    and the model's transformers config refuses that (Llama's and Gemma-3's do, even with
    ``head_dim`` written out; Qwen's do not): the output would load nowhere."""
    if opts.heads is None and opts.hidden is None:
        return
    heads = plan.heads.heads_after if plan.heads is not None else g.heads
    width = before if keep is None else keep
    if not heads or width % heads == 0:
        return
    values = cfg.to_dict()
    try:
        type(cfg).from_dict(values)
    except Exception:  # the config does not round-trip as it is: a changed copy says nothing
        return
    values.update(hidden_size=width, num_attention_heads=heads)
    if "head_dim" in values:
        values["head_dim"] = g.head_dim
    try:
        type(cfg).from_dict(values)
        return
    except Exception as e:  # the config's own validation, quoted
        reason = str(e).strip().splitlines()[-1].strip()
    said = f"transformers refuses such a {type(cfg).__name__} ({reason})"
    if opts.hidden is None:
        raise UsageError(
            f"--heads {opts.heads:g} keeps {plural(heads, 'attention head')}, which do not "
            f"divide the hidden size {width:,}: {said}; ask for another --heads fraction"
        )
    lower = width // heads * heads
    near = [m for m in (lower, lower + heads) if 0 < m < before]
    offers = " or ".join(
        f"--hidden {m / before:.6g} ({m:,}{', a multiple of 32' if m % 32 == 0 else ''})"
        for m in near
    )
    raise UsageError(
        f"--hidden {opts.hidden:g} keeps {width:,} embedding channels, not a multiple of the "
        f"{plural(heads, 'attention head')} kept: {said}; ask for {offers or 'another fraction'}"
    )


def hidden_keep(model: BlockModel, opts: ShrinkOptions) -> int:
    """The embedding channels ``--hidden`` keeps; a :class:`UsageError` for none or all."""
    assert opts.hidden is not None
    keep = round(opts.hidden * model.width)
    _check_kept("--hidden", opts.hidden, keep, model.width,
               f"{model.path}'s {model.width:,} embedding channels",
               f"round({opts.hidden:g} x {model.width:,})")  # fmt: skip
    return keep
