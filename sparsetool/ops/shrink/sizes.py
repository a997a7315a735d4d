"""``shrink --params``: the parameter count of every mix of cuts, from the checkpoint's header and
config.json alone (no weight read, no torch), and the mixes that meet a budget.

A :class:`Mix` is what ``--blocks``, ``--ffn``, ``--heads`` and ``--hidden`` would cut together:
whole blocks removed, and the FFN channels, query heads and embedding channels every kept layer
keeps. :class:`SizeModel` counts its parameters exactly for the families shrink narrows (each
tensor scaled by the widths its axes span, found by the names transformers gives them; blocks
counted as the mean block, which they all are in these families) and :func:`mixes` lists every
mix on a grid whose count lies within :data:`TOLERANCE` of the budget: blocks removed, heads and
hidden size stepped through what ``--multiple-of`` allows (a hidden size the kept heads divide, as
Llama's and Gemma's configs ask), the FFN width then the one of those that brings the count
nearest the budget.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsetool.checkpoint import open_checkpoint
from sparsetool.errors import UsageError

__all__ = ["TOLERANCE", "Mix", "SizeModel", "mixes"]

TOLERANCE = 0.01
"""How far a mix's parameter count may lie from the budget (a fraction of the budget)."""
MAX_BLOCKS = 0.5  # the most blocks a mix removes, a fraction of them
MIN_WIDTH = 0.25  # the narrowest FFN and hidden size a mix keeps, a fraction of the width
MIN_HIDDEN = 0.5

_BLOCK = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")
# a tensor's name ending -> the widths its axes span (hidden size, FFN, query heads, kv heads)
_SPANS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("gate_proj.weight", "up_proj.weight", "mlp.c_fc.weight"), ("ffn", "hidden")),
    (("gate_proj.bias", "up_proj.bias", "mlp.c_fc.bias"), ("ffn",)),
    (("down_proj.weight", "mlp.c_proj.weight"), ("ffn", "hidden")),
    (("down_proj.bias", "mlp.c_proj.bias", "o_proj.bias"), ("hidden",)),
    (("q_proj.weight", "o_proj.weight"), ("q", "hidden")),
    (("q_proj.bias",), ("q",)),
    (("k_proj.weight", "v_proj.weight"), ("kv", "hidden")),
    (("k_proj.bias", "v_proj.bias"), ("kv",)),
    (("q_norm.weight", "k_norm.weight"), ()),
)


@dataclass(frozen=True)
class Mix:
    """Cuts made together: ``blocks`` removed, then every kept layer's FFN channels (``ffn``),
    query heads (``heads``) and the hidden size (``hidden``); None keeps that width whole."""

    blocks: int = 0
    ffn: int | None = None
    heads: int | None = None
    hidden: int | None = None

    def options(self, size: SizeModel) -> dict[str, Any]:
        """The shrink options that make this mix (each width as the fraction that keeps it)."""
        out: dict[str, Any] = {}
        if self.blocks:
            out["blocks"] = self.blocks
        for key, whole in (("ffn", size.ffn), ("heads", size.heads), ("hidden", size.width)):
            kept = getattr(self, key)
            if kept is not None:
                out[key] = kept / whole
        return out

    def label(self, size: SizeModel) -> str:
        """The mix as flags: ``--blocks 4 --ffn 0.75`` (each fraction to 4 digits)."""
        return " ".join(f"--{k} {v:.4g}" for k, v in self.options(size).items()) or "(none)"

    def kinds(self) -> list[str]:
        return [k for k in ("blocks", "ffn", "heads", "hidden") if getattr(self, k)]


@dataclass
class SizeModel:
    """A model's widths and, per tensor, its parameters and the widths its axes span."""

    layers: int
    width: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    outside: dict[tuple[str, ...], int]  # outside the blocks: the widths spanned -> parameters
    inside: dict[tuple[str, ...], int]  # every block's tensors alike
    total: int

    @classmethod
    def of(cls, path: Path, config: dict[str, Any], cfg: Any) -> SizeModel:
        """The size model of the checkpoint at ``path`` (``cfg``: transformers' config of its
        ``config.json``)."""
        layers = int(getattr(cfg, "num_hidden_layers", 0) or getattr(cfg, "n_layer", 0) or 0)
        width = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0) or 0)
        heads = int(getattr(cfg, "num_attention_heads", 0) or getattr(cfg, "n_head", 0) or 0)
        kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(cfg, "head_dim", None) or width // max(heads, 1))
        ffn = int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 0)
        ffn = ffn or 4 * width
        outside: dict[tuple[str, ...], int] = {}
        inside: dict[tuple[str, ...], int] = {}
        with open_checkpoint(path) as ckpt:
            for lt in ckpt.logical:
                if "expert" in lt.name:
                    raise UsageError(
                        f"--params: {path} is a Mixture of Experts ({lt.name}); --params "
                        "chooses blocks and widths of dense models: use --experts F there"
                    )
                spans = _spans(lt.name, lt.shape, width)
                into = inside if _BLOCK.search(lt.name) else outside
                into[spans] = into.get(spans, 0) + lt.numel
        total = sum(outside.values()) + sum(inside.values())
        return cls(
            layers=layers, width=width, ffn=ffn, heads=heads, kv_heads=kv, head_dim=head_dim,
            outside=outside, inside=inside, total=total,
        )  # fmt: skip

    def count(self, mix: Mix) -> int:
        """The parameters of the model ``mix`` makes."""
        scale = {
            "hidden": (mix.hidden or self.width) / self.width,
            "ffn": (mix.ffn or self.ffn) / self.ffn,
            "q": (mix.heads or self.heads) / self.heads,
            "kv": self.kv_kept(mix) / self.kv_heads,
        }
        outer = sum(n * math.prod(scale[s] for s in spans) for spans, n in self.outside.items())
        blocks = sum(n * math.prod(scale[s] for s in spans) for spans, n in self.inside.items())
        return round(outer + blocks * (self.layers - mix.blocks) / self.layers)

    def kv_kept(self, mix: Mix) -> int:
        """The key/value heads a mix keeps: whole groups go with their query heads."""
        if mix.heads is None:
            return self.kv_heads
        return mix.heads * self.kv_heads // self.heads

    def head_choices(self, multiple_of: int) -> list[int]:
        """The query heads a mix may keep, fewest first (whole key/value groups, so that the
        fraction is one ``--heads`` keeps exactly; each a multiple of ``multiple_of`` wide)."""
        if self.kv_heads < 2 and self.heads < 2:
            return []
        group = self.heads // max(self.kv_heads, 1)
        return [
            g * group
            for g in range(1, self.kv_heads)
            if (g * group * self.head_dim) % multiple_of == 0
        ]

    def hidden_choices(self, multiple_of: int, heads: int | None = None) -> list[int]:
        """The hidden sizes a mix may keep (from :data:`MIN_HIDDEN` of it, below it): multiples
        of ``multiple_of`` that the query heads kept (``heads``; None: all) divide."""
        divides = heads or self.heads
        return [d for d in _widths(self.width, MIN_HIDDEN, multiple_of) if d % divides == 0]

    def ffn_choices(self, multiple_of: int) -> list[int]:
        """The FFN widths a mix may keep (from :data:`MIN_WIDTH` of it): multiples of
        ``multiple_of``."""
        return _widths(self.ffn, MIN_WIDTH, multiple_of)


def _spans(name: str, shape: tuple[int, ...], width: int) -> tuple[str, ...]:
    for ends, spans in _SPANS:
        if name.endswith(ends):
            return spans
    if len(shape) >= 1 and width in shape:  # embeddings, norms, the head, positions
        return ("hidden",)
    return ()


def _widths(whole: int, least: float, multiple_of: int) -> list[int]:
    """Widths a mix may keep, below ``whole`` and from ``least`` of it: multiples of
    ``multiple_of``."""
    step = max(multiple_of, 1)
    lo = max(step, math.ceil(least * whole / step) * step)
    return list(range(lo, whole, step))


def mixes(size: SizeModel, target: int, multiple_of: int, kinds: set[str]) -> list[Mix]:
    """Every mix of the allowed ``kinds`` (a subset of blocks, ffn, heads, hidden) on the grid
    whose parameters lie within :data:`TOLERANCE` of ``target``."""
    most = max(1, math.floor(size.layers * MAX_BLOCKS))
    blocks = range(0, most + 1) if "blocks" in kinds else range(1)
    heads: list[int | None] = [None] + (size.head_choices(multiple_of) if "heads" in kinds else [])
    ffns: list[int | None] = [None]
    if "ffn" in kinds:
        ffns += size.ffn_choices(multiple_of)
    found: list[Mix] = []
    for n in blocks:
        if n >= size.layers:
            continue
        for h in heads:
            hiddens: list[int | None] = [None]
            if "hidden" in kinds:  # the kept heads must divide it: most configs refuse it else
                hiddens += size.hidden_choices(multiple_of, h)
            for d in hiddens:
                best = min(
                    (Mix(n, f, h, d) for f in ffns),
                    key=lambda m: abs(size.count(m) - target),
                )
                if abs(size.count(best) - target) <= TOLERANCE * target and best.kinds():
                    found.append(best)
    return found
