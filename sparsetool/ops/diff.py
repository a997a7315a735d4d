"""Compare two checkpoints weight by weight: ``sparsetool diff A B``.

For every targeted weight matrix (fused Q/K/V split into Q, K and V), how the sparsity pattern moved
(mask IoU, weights revived and newly pruned) and how the values moved: relative L2 change
``||B - A|| / ||A||`` and the angular distance ``1 - cos(A, B)`` that SPDF (Thangarasa et al. 2023,
Figures 3-4) plots per layer and matrix between sparse pre-trained and dense fine-tuned weights.

Every number comes from sums accumulated in float64 (dot product, squared norms, squared
difference, counts), so a group of weights (a layer's FFN, the whole model) is compared as one long
vector, never by averaging per-tensor ratios. Reading streams one tensor pair at a time, in chunks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.output_files import Written, check_png
from sparsetool.errors import SparsetoolError
from sparsetool.targets import (
    LINEAR_ROLES,
    conv1d_layout,
    input_dim,
    is_floating,
    plan_targets,
    role,
)
from sparsetool.targets.order import SEPARATE_QKV, layer_index, tensor_sort_key
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = [
    "KINDS",
    "Stats",
    "DiffRow",
    "DiffResult",
    "diff",
    "split_parts",
    "matrix_kind",
    "plot_diff",
]


KINDS = ("Q", "K", "V", "QKV", "attn_out", "ffn_in", "ffn_out", "other")
"""Matrix kinds, in plot order. ``QKV`` is a fused tensor whose layout is not known well enough to
split; ``other`` a tensor targeted through ``include`` that is none of the linear roles."""

_CHUNK = 1 << 22  # elements per float64 chunk: 32 MiB per operand

# Separate projections: leaf module name -> kind (the same table orders listings).
_SEPARATE = SEPARATE_QKV
# Fused projections stored as [Q; K; V] along the output dimension.
_CONCATENATED = {"c_attn", "qkv", "qkv_proj", "w_pack", "in_proj"}
# GPT-NeoX and Bloom store query_key_value per head: rows are (heads, [q, k, v], head_dim).
_INTERLEAVED_TYPES = {"gpt_neox", "gpt_neox_japanese", "bloom"}


@dataclass
class Stats:
    """Sums over a set of weight pairs (a, b), from which every reported number follows."""

    numel: int = 0
    nonzero_a: int = 0
    nonzero_b: int = 0
    nonzero_both: int = 0
    dot: float = 0.0  # sum a*b
    sq_a: float = 0.0  # sum a^2
    sq_b: float = 0.0  # sum b^2
    sq_diff: float = 0.0  # sum (b - a)^2, accumulated directly: exact for tiny changes

    def __add__(self, o: Stats) -> Stats:
        return Stats(*(getattr(self, f) + getattr(o, f) for f in self.__dataclass_fields__))

    @property
    def sparsity_a(self) -> float:
        return 1.0 - self.nonzero_a / self.numel if self.numel else 0.0

    @property
    def sparsity_b(self) -> float:
        return 1.0 - self.nonzero_b / self.numel if self.numel else 0.0

    @property
    def revived(self) -> int:
        """Zero in A, non-zero in B."""
        return self.nonzero_b - self.nonzero_both

    @property
    def pruned(self) -> int:
        """Non-zero in A, zero in B."""
        return self.nonzero_a - self.nonzero_both

    @property
    def iou(self) -> float:
        """Jaccard index |nz(A) & nz(B)| / |nz(A) | nz(B)| of the non-zero sets; 1.0 if both are
        empty.

        >>> Stats(numel=4, nonzero_a=2, nonzero_b=2, nonzero_both=1).iou
        0.3333333333333333
        """
        union = self.nonzero_a + self.nonzero_b - self.nonzero_both
        return self.nonzero_both / union if union else 1.0

    @property
    def rel_l2(self) -> float:
        """||B - A|| / ||A||: 0.0 when both are zero, ``inf`` when only A is."""
        if self.sq_a == 0.0:
            return 0.0 if self.sq_diff == 0.0 else math.inf
        return math.sqrt(self.sq_diff / self.sq_a)

    @property
    def angular_distance(self) -> float:
        """1 - cos(A, B), in [0, 2]. Both zero: 0.0 (the same vector); one zero: 1.0 (cos taken
        as 0, no direction in common).

        Computed as ``(||B-A||^2 - (||A|| - ||B||)^2) / (2 ||A|| ||B||)``, the same quantity by
        the law of cosines, because ``1 - dot/(|A||B|)`` loses all digits when B is close to A.

        >>> round(Stats(numel=2, dot=0.0, sq_a=1.0, sq_b=1.0, sq_diff=2.0).angular_distance, 12)
        1.0
        """
        if self.sq_diff == 0.0:
            return 0.0
        if self.sq_a == 0.0 or self.sq_b == 0.0:
            return 1.0
        na, nb = math.sqrt(self.sq_a), math.sqrt(self.sq_b)
        gap = (self.sq_a - self.sq_b) / (na + nb)  # na - nb without cancellation
        return min(2.0, max(0.0, (self.sq_diff - gap * gap) / (2.0 * na * nb)))

    def to_json(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for p in (
            "sparsity_a",
            "sparsity_b",
            "iou",
            "revived",
            "pruned",
            "rel_l2",
            "angular_distance",
        ):
            d[p] = getattr(self, p)
        d["rel_l2"] = d["rel_l2"] if math.isfinite(d["rel_l2"]) else None  # JSON has no inf
        return d


@dataclass
class DiffRow:
    """One matrix: a whole tensor, or the Q, K or V part of a fused one."""

    name: str  # tensor name
    part: str | None  # "Q"/"K"/"V" for a part of a fused tensor, else None
    layer: int | None  # first all-digit name component (h.3, layers.3), None outside blocks
    kind: str  # one of KINDS
    shape: tuple[int, ...]  # of the part
    stats: Stats

    @property
    def label(self) -> str:
        return f"{self.name}[{self.part}]" if self.part else self.name

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "part": self.part,
            "layer": self.layer,
            "kind": self.kind,
            "shape": list(self.shape),
            **self.stats.to_json(),
        }


@dataclass
class DiffResult:
    a: Path
    b: Path
    rows: list[DiffRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. fused tensors left unsplit, and why

    @property
    def total(self) -> Stats:
        """All targeted weights pooled as one vector."""
        out = Stats()
        for r in self.rows:
            out = out + r.stats
        return out

    def cells(self) -> dict[tuple[int, str], Stats]:
        """(layer, kind) -> pooled stats (gate and up are both ``ffn_in``; MoE experts pool too)."""
        out: dict[tuple[int, str], Stats] = {}
        for r in self.rows:
            if r.layer is not None and r.kind != "other":
                key = (r.layer, r.kind)
                out[key] = out.get(key, Stats()) + r.stats
        return out

    @property
    def summary(self) -> dict[str, Any]:
        return {
            "a": str(self.a),
            "b": str(self.b),
            "tensors": len({r.name for r in self.rows}),
            "matrices": len(self.rows),
            **self.total.to_json(),
            "notes": list(self.notes),
        }

    def to_json(self) -> dict[str, Any]:
        return {"tensors": [r.to_json() for r in self.rows], "summary": self.summary}


def _leaf(name: str) -> str:
    if name.endswith("in_proj_weight"):
        return "in_proj"
    return name.split(".")[-2] if name.count(".") else name


def matrix_kind(name: str, shape: Sequence[int]) -> str:
    """What a whole tensor is in the layer x matrix picture: ``Q``, ``K`` or ``V`` for a separate
    projection, ``QKV`` for a fused one, else its role (``attn_out``, ``ffn_in``, ``norm``...).

    >>> (
    ...     matrix_kind("model.layers.0.self_attn.k_proj.weight", (8, 32)),
    ...     matrix_kind("h.0.attn.c_attn.weight", (4, 12)),
    ... )
    ('K', 'QKV')
    """
    r = role(name, tuple(shape))
    return _SEPARATE.get(_leaf(name).lower(), "QKV") if r == "qkv" else r


Take = Callable[[torch.Tensor], torch.Tensor]


def split_parts(
    name: str, shape: Sequence[int], config: Mapping | None = None
) -> tuple[list[tuple[str, str | None, Take]], str | None]:
    """How to cut tensor ``name`` into matrices: ([(kind, part, take)], note or None).

    ``take`` maps the full tensor to the part. Fused Q/K/V layouts: GPT-2 ``c_attn`` Conv1D
    (in, out) is split by columns (``config.json``'s ``model_type`` tells Conv1D from
    ``nn.Linear``, as in :func:`sparsetool.targets.conv1d_layout`); ``nn.Linear`` ``[Q; K; V]``
    (sparsetool's ``attn.qkv``, ``qkv_proj``, ``W_pack``, ``in_proj_weight``) by rows, Q as wide as
    the input and K, V sharing the rest (grouped-query attention included); GPT-NeoX and Bloom
    ``query_key_value`` by rows read as (heads, [q, k, v], head_dim), which needs the head count
    from ``config.json``. A fused tensor that cannot be split stays one ``QKV`` matrix, with a note.

    >>> [(k, p) for k, p, _ in split_parts("blocks.0.attn.qkv.weight", (96, 32))[0]]
    [('Q', 'Q'), ('K', 'K'), ('V', 'V')]
    >>> parts, note = split_parts("h.0.attn.c_attn.weight", (2, 6))
    >>> [take(torch.arange(12.0).reshape(2, 6)).tolist() for _, _, take in parts][1]
    [[2.0, 3.0], [8.0, 9.0]]
    """
    shape = tuple(shape)
    r = role(name, shape)
    whole: list[tuple[str, str | None, Take]] = [
        (r if r in LINEAR_ROLES else "other", None, lambda t: t)
    ]
    if r != "qkv":
        return whole, None
    leaf = _leaf(name)
    low = leaf.lower()
    if low in _SEPARATE:
        return [(_SEPARATE[low], None, lambda t: t)], None
    fused: list[tuple[str, str | None, Take]] = [("QKV", None, lambda t: t)]
    if len(shape) != 2:
        return fused, f"{name}: a {len(shape)}-D fused Q/K/V tensor is compared whole"
    model_type = (config or {}).get("model_type")
    if low == "query_key_value":
        heads = (config or {}).get("num_attention_heads") or (config or {}).get("n_head")
        if model_type not in _INTERLEAVED_TYPES or not heads:
            why = (
                f"model_type {model_type!r} has no known query_key_value layout"
                if model_type
                else "no config.json num_attention_heads to split it by"
            )
            return fused, f"{name}: not split into Q, K, V ({why})"
        rows, cols = shape
        if rows % (3 * heads):
            return (
                fused,
                f"{name}: {plural(rows, 'row')} do not split into {plural(heads, 'head')} of q, "
                "k, v",
            )
        hd = rows // (3 * heads)

        def head_part(i: int) -> Take:  # the i-th of q, k, v of every head
            return lambda t: t.reshape(heads, 3, hd, cols)[:, i].reshape(heads * hd, cols)

        return [(k, k, head_part(i)) for i, k in enumerate("QKV")], None
    if low not in _CONCATENATED:
        return fused, f"{name}: layout of fused {leaf!r} not known; not split into Q, K, V"
    dim_in = input_dim(name, shape, conv1d=conv1d_layout(config))
    dim_out = 1 - dim_in
    d, f = shape[dim_in], shape[dim_out]
    if f <= d or (f - d) % 2:
        return fused, f"{name}: {f} outputs do not split as Q ({d}) plus equal K and V"
    kv = (f - d) // 2
    bounds = {"Q": (0, d), "K": (d, d + kv), "V": (d + kv, f)}

    def rows_part(lo: int, hi: int) -> Take:  # outputs lo to hi
        return lambda t: t.narrow(dim_out, lo, hi - lo)

    return [(k, k, rows_part(lo, hi)) for k, (lo, hi) in bounds.items()], None


def pair_stats(a: torch.Tensor, b: torch.Tensor) -> Stats:
    """Sums over two same-shape tensors, in float64 chunks of rows (pruned entries are zeros).

    >>> s = pair_stats(
    ...     torch.tensor([[1.0, 0.0], [2.0, 0.0]]), torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    ... )
    >>> s.nonzero_a, s.nonzero_b, s.nonzero_both, s.revived, s.pruned, s.dot, s.sq_diff
    (2, 2, 1, 1, 1, 1.0, 13.0)
    """
    s = Stats(numel=a.numel())
    if a.numel() == 0:
        return s
    a2, b2 = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    step = max(1, _CHUNK // a2.shape[1])
    for i in range(0, a2.shape[0], step):
        x, y = a2[i : i + step].to(torch.float64), b2[i : i + step].to(torch.float64)
        nx, ny = x != 0, y != 0  # -0.0 is a zero too
        s.nonzero_a += int(nx.sum())
        s.nonzero_b += int(ny.sum())
        s.nonzero_both += int((nx & ny).sum())
        s.dot += float(torch.dot(x.flatten(), y.flatten()))
        s.sq_a += float(torch.dot(x.flatten(), x.flatten()))
        s.sq_b += float(torch.dot(y.flatten(), y.flatten()))
        d = (y - x).flatten()
        s.sq_diff += float(torch.dot(d, d))
    return s


def diff(
    a: str | Path,
    b: str | Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    progress: Progress | None = None,
    plot: str | Path | None = None,
) -> DiffResult:
    """Compare every targeted weight of checkpoint ``a`` with the same weight of ``b``.

    Both are ``.safetensors`` files or Hugging Face directories in any encoding, with the same
    tensor names and shapes. Targets are chosen on ``a`` by :func:`sparsetool.targets.plan_targets`
    with ``include``/``exclude`` globs; the Q/K/V layout comes from ``a``'s ``config.json`` (or
    ``b``'s). One tensor pair is in memory at a time. ``plot``: the PNG :func:`plot_diff` will
    draw, refused before any work if it cannot be written.
    """
    if plot is not None:
        check_png(plot)
    ca, cb = open_checkpoint(a), open_checkpoint(b)
    with ca, cb:
        _check_same(ca, cb)
        config = ca.config if ca.config is not None else cb.config
        bmap = {lt.name: lt for lt in cb.logical}
        plan = plan_targets(ca.logical, config, include, exclude, source=Path(a).name)
        todo = [lt for lt in ca.logical if plan[lt.name].targeted]
        if not todo:
            raise SparsetoolError(
                f"{a}: no tensor is targeted; name the weights to compare with --include GLOB"
            )
        result = DiffResult(Path(a), Path(b))
        for i, lt in enumerate(todo):
            parts, note = split_parts(lt.name, lt.shape, config)
            if note:
                result.notes.append(note)
            ta, _ = decode(ca, lt)
            tb, _ = decode(cb, bmap[lt.name])
            for kind, part, take in parts:
                pa, pb = take(ta), take(tb)
                result.rows.append(
                    DiffRow(
                        lt.name,
                        part,
                        layer_index(lt.name),
                        kind,
                        tuple(pa.shape),
                        pair_stats(pa, pb),
                    )
                )
            del ta, tb
            if progress:
                progress("diff", i + 1, len(todo))
    # files keep tensors in name or dtype order; the table reads better by layer, then role (the one
    # listing order, sparsetool.targets.order); a fused tensor's Q, K, V parts keep their order
    result.rows.sort(key=lambda r: tensor_sort_key(r.name, plan[r.name].role))
    return result


def _check_same(ca, cb) -> None:
    bmap = {lt.name: lt for lt in cb.logical}
    for lt in ca.logical:
        other = bmap.get(lt.name)
        if other is None:
            raise SparsetoolError(
                f"tensor {lt.name!r} is in {ca.path} but not in {cb.path}; "
                "diff compares two checkpoints with the same tensor names"
            )
        if tuple(other.shape) != tuple(lt.shape):
            raise SparsetoolError(
                f"tensor {lt.name!r} has shape {list(lt.shape)} in {ca.path} but "
                f"{list(other.shape)} in {cb.path}; diff needs the same shapes"
            )
        if is_floating(lt.dtype) != is_floating(other.dtype):
            raise SparsetoolError(
                f"tensor {lt.name!r} is {lt.dtype} in {ca.path} but {other.dtype} "
                f"in {cb.path}; diff needs floating weights on both sides"
            )
    names = {lt.name for lt in ca.logical}
    extra = next((lt.name for lt in cb.logical if lt.name not in names), None)
    if extra is not None:
        raise SparsetoolError(
            f"tensor {extra!r} is in {cb.path} but not in {ca.path}; "
            "diff compares two checkpoints with the same tensor names"
        )


def plot_diff(result: DiffResult, out: str | Path, title: str | None = None) -> Written:
    """SPDF-style heatmap (Figures 3-4): layers across, matrices down, angular distance as
    colour."""
    cells = result.cells()
    if not cells:
        raise SparsetoolError("nothing to plot: no targeted weight has a layer index in its name")
    from sparsetool.ops.plots import layer_heatmap, unique_suffixes

    t = result.total
    a, b = unique_suffixes([str(result.a), str(result.b)])  # two run/model directories told apart
    return layer_heatmap(
        {key: s.angular_distance for key, s in cells.items()},
        out,
        title=title
        or f"{a} -> {b}\nangular distance {t.angular_distance:.4g} over all targeted weights",
        colour_label="angular distance 1 - cos(A, B)",
    )
