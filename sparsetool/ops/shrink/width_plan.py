"""``--ffn``, ``--heads``, ``--hidden``: what each layer keeps, from the model's geometry, checked
before any text runs (none or all kept, a rounding that is not the fraction asked, heads that do
not divide the kept hidden size where transformers refuses that).

Every width written is a multiple of ``--multiple-of N`` (llama.cpp quantizes a matrix in blocks
of 32 or 256 of its input): the FFN channels and the hidden size kept are the multiple of ``N``
nearest ``F x width`` (a tie: the larger), at least ``N`` and below the full width; the heads
kept are the count (of whole key/value groups, or of query heads per group) nearest the fraction
asked whose heads x ``head_dim`` is a multiple of ``N``. ``round(F x width)`` (``round(F x
count)``) is kept whenever it is one, so ``--multiple-of 1`` keeps it always; a note says when
the multiple moved the width, a :class:`UsageError` when no width between none and all is one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

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


def _nearest(x: float, exact: int, valid: Sequence[int]) -> int | None:
    """``exact`` (``round(x)``) when it is one of ``valid``, else the one of ``valid`` nearest
    ``x``, a tie the larger; None when ``valid`` is empty.

    >>> _nearest(432.0, 432, range(32, 576, 32)), _nearest(14.4, 14, range(1, 48))
    (448, 14)
    >>> _nearest(570.0, 570, range(32, 576, 32)), _nearest(16.0, 16, range(32, 32, 32))
    (544, None)
    """
    if exact in valid:
        return exact
    if not valid:
        return None
    return min(valid, key=lambda m: (abs(m - x), -m))


def _amount(x: float) -> str:
    """``F x width`` as a note shows it: ``432``, ``14.4``, ``1,152``."""
    return f"{x:,.10g}"


def _smaller_multiple(n: int, width: int) -> str:
    """The ``--multiple-of`` to offer when ``n`` leaves no width: the largest divisor of ``n``
    that ``width`` (what ``--multiple-of 1`` keeps) is a multiple of, and 1.

    >>> _smaller_multiple(32, 16), _smaller_multiple(32, 24), _smaller_multiple(32, 7)
    ('--multiple-of 16 or 1', '--multiple-of 8 or 1', '--multiple-of 1')
    """
    d = math.gcd(n, width)
    return f"--multiple-of {d} or 1" if d > 1 else "--multiple-of 1"


def _kept_width(
    flag: str, f: float, total: int, n: int, what: str, noun: str, rule: str
) -> tuple[int, list[str]]:
    """The channels ``flag f`` keeps of ``total`` under ``--multiple-of n``: the multiple of
    ``n`` nearest ``f x total`` (a tie: the larger) between none and all, ``round(f x total)``
    when it is one; a note when it is not. A :class:`UsageError` when ``round(f x total)`` keeps
    none or all (``what``, ``rule``: as :func:`_check_kept` says it) or no multiple of ``n`` lies
    between (``noun``: the channels without the model's name)."""
    x, exact = f * total, round(f * total)
    _check_kept(flag, f, exact, total, what, rule)
    kept = _nearest(x, exact, range(n, total, n))
    if kept is None:
        raise UsageError(
            f"{flag} {f:g} keeps {exact:,} of {what} ({rule}), not a multiple of {n} "
            f"(--multiple-of {n}), and no multiple of {n} lies between none and all of them; "
            f"give {_smaller_multiple(n, exact)}"
        )
    if kept == exact:
        return kept, []
    nearest = math.floor(x / n + 0.5) * n  # the multiple nearest x, were none and all allowed
    beyond = f" below {total:,}" if nearest >= total else " above 0" if nearest < n else ""
    return kept, [
        f"{flag} {f:g} keeps {kept:,} of {total:,} {noun} ({kept / total:.2f}), the multiple of "
        f"{n} nearest {_amount(x)}{beyond} (--multiple-of {n}; 1 keeps {exact:,})"
    ]


def _kept_count(
    f: float, count: int, width: int, n: int, what: str, rule: str, how: str
) -> tuple[int, int]:
    """The key/value groups, or query heads per group, ``--heads f`` keeps of ``count`` when
    each kept one is ``width`` channels of the attention's output: ``round(f x count)`` when
    that many are a multiple of ``n`` channels, else the count nearest ``f x count`` that is (a
    tie: the larger); and ``round(f x count)``. A :class:`UsageError` for none or all (``what``,
    ``rule``), or no count between that is a multiple (``how``: what a count counts)."""
    exact = round(f * count)
    _check_kept("--heads", f, exact, count, what, rule)
    kept = _nearest(f * count, exact, [k for k in range(1, count) if k * width % n == 0])
    if kept is None:
        raise UsageError(
            f"--heads {f:g} keeps {exact} x {width:,} = {exact * width:,} channels of attention "
            f"output per layer ({rule} = {exact}), not a multiple of {n} (--multiple-of {n}), "
            f"and no count of {how} between none and all {count} keeps one; "
            f"give {_smaller_multiple(n, exact * width)}"
        )
    return kept, exact


def _rounded_away(f: float, kept: int, total: int) -> bool:
    """Whether ``kept`` of ``total`` is not the whole number nearest ``f x total`` (a tie is
    either neighbour): the fraction made is then not the fraction asked.

    >>> _rounded_away(0.5, 6, 9), _rounded_away(0.5, 4, 9), _rounded_away(0.6, 4, 8)
    (True, False, True)
    """
    return abs(kept - f * total) > 0.5 + 1e-9


def plan_widths(g: Geometry, opts: ShrinkOptions, model: str = "the model") -> WidthPlan:
    """The widths ``opts`` asks for on geometry ``g``, multiples of ``opts.multiple_of`` (see
    the module docstring); a :class:`UsageError` for none, all, or no multiple between.

    Heads: whole key/value groups (``round(F x kv-heads)`` of them) when ``F x kv-heads`` is
    whole or every group is one head (plain multi-head attention), else ``round(F x group)``
    query heads of every group; a note when that is not the fraction asked, or when the
    multiple moved the count."""
    ffn: Width | None = None
    heads: HeadsKept | None = None
    notes: list[str] = []
    n = opts.multiple_of
    keep_ffn = None
    if opts.ffn is not None:
        keep_ffn, said = _kept_width(
            "--ffn", opts.ffn, g.ffn, n, f"{model}'s {g.ffn:,} FFN channels per layer",
            "FFN channels per layer", f"round({opts.ffn:g} x {g.ffn:,})",
        )  # fmt: skip
        notes += said
        ffn = Width(g.ffn, keep_ffn)
    mode, kept_groups, per_group = None, g.kv_heads, g.heads // max(g.kv_heads, 1)
    if opts.heads is not None:
        f, group = opts.heads, g.heads // g.kv_heads
        what = f"{model}'s {g.heads} attention heads per layer"
        if g.kv_heads > 1 and (group == 1 or float(f * g.kv_heads).is_integer()):
            mode, count = "groups", g.kv_heads
            rule = f"whole key/value groups: round({f:g} x {g.kv_heads})"
            kept_groups, exact = _kept_count(
                f, count, group * g.head_dim, n, what, rule, "whole key/value groups"
            )
            how = f"{kept_groups} of {g.kv_heads} whole key/value groups"
            exact_heads = exact * group
        else:
            mode, count = "query heads per group", group
            rule = f"heads are kept per key/value group of {group}: round({f:g} x {group})"
            per_group, exact = _kept_count(
                f, count, g.kv_heads * g.head_dim, n, what, rule, "query heads of each group"
            )
            how = f"{per_group} of each key/value group of {group}"
            exact_heads = kept_groups * exact
        kept = kept_groups * per_group
        if kept != exact_heads:  # the multiple moved the count
            notes.append(
                f"--heads {f:g} keeps {kept} of {plural(g.heads, 'head')} "
                f"({kept / g.heads:.2f}): {how}, the count nearest {f:g} x {count} whose heads' "
                f"width, {kept} x {g.head_dim} = {kept * g.head_dim:,}, is a multiple of {n} "
                f"(--multiple-of {n}; 1 keeps {exact_heads})"
            )
        elif mode == "query heads per group" and _rounded_away(f, kept, g.heads):
            notes.append(
                f"--heads {f:g} keeps {kept} of {plural(g.heads, 'head')} "
                f"({kept / g.heads:.2f}): "
                f"heads are kept per key/value group, round({f:g} x {group}) = {per_group} "
                f"of each group of {group}"
            )
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
    n = opts.multiple_of  # the widths offered are multiples of the heads and of n
    step = math.lcm(heads, n)
    lower = width // step * step
    near = [m for m in (lower, lower + step) if 0 < m < before]
    offers = " or ".join(
        f"--hidden {m / before:.6g} ({m:,}{', a multiple of 32' if n == 1 and m % 32 == 0 else ''})"
        for m in near
    )
    if n > 1:  # or the largest smaller --multiple-of under which the fraction asked loads
        if offers:
            offers += f", {'a multiple' if len(near) == 1 else 'multiples'} of {heads} and of {n}"
        smaller = _divided_under(opts, g, before)
        if smaller is not None:
            offers += (", or " if offers else "") + f"--multiple-of {smaller[0]} ({smaller[1]:,})"
        offers = offers or f"another fraction, or a --multiple-of below {n}"
    raise UsageError(
        f"--hidden {opts.hidden:g} keeps {width:,} embedding channels, not a multiple of the "
        f"{plural(heads, 'attention head')} kept: {said}; ask for {offers or 'another fraction'}"
    )


def _divided_under(opts: ShrinkOptions, g: Geometry, before: int) -> tuple[int, int] | None:
    """The largest ``--multiple-of`` below ``opts.multiple_of`` (one of its divisors) under which
    ``opts.hidden`` keeps a hidden size the heads kept divide, and that size; None: none does."""
    assert opts.hidden is not None
    n = opts.multiple_of
    for d in sorted((d for d in range(1, n) if n % d == 0), reverse=True):
        asked = replace(opts, multiple_of=d)
        try:
            plan = plan_widths(g, asked)
            width, _ = _kept_width("--hidden", opts.hidden, before, d, "", "", "")
        except UsageError:
            continue
        heads = plan.heads.heads_after if plan.heads is not None else g.heads
        if width % heads == 0:
            return d, width
    return None


def hidden_keep(model: BlockModel, opts: ShrinkOptions) -> tuple[int, list[str]]:
    """The embedding channels ``--hidden`` keeps, a multiple of ``opts.multiple_of``, and a note
    when that is not ``round(F x hidden)``; a :class:`UsageError` for none, all, or no multiple
    between."""
    assert opts.hidden is not None
    return _kept_width(
        "--hidden", opts.hidden, model.width, opts.multiple_of,
        f"{model.path}'s {model.width:,} embedding channels", "embedding channels",
        f"round({opts.hidden:g} x {model.width:,})",
    )  # fmt: skip
