"""Per-tensor sparsity of a checkpoint: ``sparsetool report``.

Two sparsities are reported because they answer different questions: over the *targeted* tensors
(what the pruning recipe achieved) and over *all* parameters (what the file holds; embeddings and
the head dilute it). Reading is streaming: one tensor at a time.

Mixture-of-experts checkpoints: a tensor of one routed expert (``experts.5.w1``) is a row of its
own with its ``expert`` index; a fused experts tensor (all experts in one 3-D tensor) is one row
whose ``experts`` gives each expert's non-zeros and sparsity and their spread
(:class:`ExpertSpread`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparsetool.checkpoint import open_checkpoint
from sparsetool.checkpoint.counting import count_unpruned_parts
from sparsetool.checkpoint.dtypes import is_floating, torch_name
from sparsetool.checkpoint.output_files import Written, check_png
from sparsetool.checkpoint.provenance import provenance_line, read_provenance
from sparsetool.targets.order import tensor_sort_key
from sparsetool.targets.recorded import plan_checkpoint_targets, targeting_summary
from sparsetool.targets.roles import is_routed_expert
from sparsetool.util.progress import Progress


@dataclass
class ExpertSpread:
    """Each expert's matrix of a fused experts tensor: ``nonzero[e]`` of ``numel`` each."""

    numel: int
    nonzero: list[int]

    @property
    def sparsity(self) -> list[float]:
        return [1.0 - n / self.numel if self.numel else 0.0 for n in self.nonzero]

    def to_json(self) -> dict:
        spread = self.sparsity
        return {
            "count": len(self.nonzero),
            "numel": self.numel,
            "nonzero": list(self.nonzero),
            "sparsity": spread,
            "min_sparsity": min(spread),
            "max_sparsity": max(spread),
        }


@dataclass
class TensorRow:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    targeted: bool
    numel: int
    nonzero: int
    encoding: str
    bytes: int
    expert: int | None = None  # the routed expert of a per-expert tensor (TargetEntry.expert)
    experts: ExpertSpread | None = None  # a fused experts tensor: each expert's figures

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nonzero / self.numel if self.numel else 0.0

    def to_json(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        d["sparsity"] = self.sparsity
        d["experts"] = None if self.experts is None else self.experts.to_json()
        return d


@dataclass
class Report:
    path: Path
    tensors: list[TensorRow] = field(default_factory=list)
    bytes_on_disk: int = 0
    targeting: dict = field(default_factory=dict)  # targets.recorded.targeting_summary
    beyond_uniform: dict = field(default_factory=dict)  # the last prune's OWL plan, DSnoT settings
    provenance: dict | None = None  # what made it, as recorded (checkpoint.provenance), or None

    @property
    def made_by(self) -> str | None:
        """How the checkpoint was made, in one line (None when it records nothing)."""
        return provenance_line(self.provenance)

    def _sum(self, attr: str, targeted_only: bool) -> int:
        return sum(
            getattr(t, attr)
            for t in self.tensors
            if is_floating(t.dtype) and (t.targeted or not targeted_only)
        )

    @property
    def summary(self) -> dict:
        """Sparsities over the floating-point tensors (the only ones prune targets); integer and
        bool tensors (quantized weights, index buffers) are counted apart as ``non_float_*``. A
        mixture of experts adds ``experts``: per layer and kind (``in``: gate and up pooled,
        ``out``: down), the lowest and highest sparsity of one expert's matrices there."""
        spread = expert_spread(self.tensors)
        experts = (
            {
                "experts": [
                    {
                        "layer": layer,
                        "kind": kind.removeprefix("experts_"),
                        "min_sparsity": lo / 100,
                        "max_sparsity": hi / 100,
                    }
                    for (layer, kind), (lo, hi) in sorted(spread.items())
                ]
            }
            if spread
            else {}
        )
        numel, nonzero = self._sum("numel", False), self._sum("nonzero", False)
        other = [t for t in self.tensors if not is_floating(t.dtype)]
        t_numel, t_nonzero = self._sum("numel", True), self._sum("nonzero", True)
        return {
            "targeted_sparsity": 1.0 - t_nonzero / t_numel if t_numel else 0.0,
            "overall_sparsity": 1.0 - nonzero / numel if numel else 0.0,
            "numel": numel,
            "nonzero": nonzero,
            "targeted_numel": t_numel,
            "targeted_nonzero": t_nonzero,
            "targeted_tensors": sum(1 for t in self.tensors if t.targeted),
            "tensors": len(self.tensors),
            "bytes": self.bytes_on_disk,
            "targeting": dict(self.targeting),
            "non_float_numel": sum(t.numel for t in other),
            "non_float_nonzero": sum(t.nonzero for t in other),
            "non_float_tensors": len(other),
            "non_float_dtypes": sorted({t.dtype for t in other}),
            **experts,
            **self.beyond_uniform,
        }

    def to_json(self) -> dict:
        return {
            "tensors": [t.to_json() for t in self.tensors],
            "summary": self.summary,
            "provenance": self.provenance,
        }


def summarize(
    path: str | Path,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    default_targets: bool = False,
    progress: Progress | None = None,
    plot: str | Path | None = None,
) -> Report:
    """Read every tensor of the checkpoint at ``path`` once and count its non-zeros.

    ``include``/``exclude`` change which tensors count as targeted, as for ``prune`` (see
    :func:`sparsetool.targets.plan_targets`); a glob matching no tensor name is an error. Without
    them, a checkpoint pruned with globs counts the tensors prune targeted, unless
    ``default_targets`` (see :func:`sparsetool.targets.recorded.plan_checkpoint_targets`).
    ``plot``: the PNG :func:`plot_report` will draw, refused before any work if it cannot be
    written.
    """
    if plot is not None:
        check_png(plot)
    ckpt = open_checkpoint(path)
    plan = plan_checkpoint_targets(
        ckpt.logical,
        ckpt.config,
        ckpt.metadata(),
        include,
        exclude,
        default_targets=default_targets,
        source=ckpt.path.name,
    )
    report = Report(
        path=Path(path),
        bytes_on_disk=ckpt.nbytes_on_disk,
        targeting=targeting_summary(plan),
        beyond_uniform=recorded_refinements(ckpt.metadata()),
        provenance=read_provenance(ckpt.metadata()),
    )
    total = len(ckpt.logical)
    for i, lt in enumerate(ckpt.logical):
        entry = plan[lt.name]
        counts = count_unpruned_parts(ckpt, lt, entry.experts)
        report.tensors.append(
            TensorRow(
                name=lt.name,
                shape=entry.shape,
                dtype=torch_name(lt.st_dtype),
                role=entry.role,
                targeted=entry.targeted,
                numel=lt.numel,
                nonzero=sum(counts),
                encoding=lt.encoding,
                bytes=lt.nbytes,
                expert=entry.expert,
                experts=ExpertSpread(lt.numel // len(counts), counts) if entry.experts else None,
            )
        )
        if progress:
            progress("report", i + 1, total)
    # listed by layer as a number, then role (files keep names in lexicographic order)
    report.tensors.sort(key=lambda t: tensor_sort_key(t.name, t.role))
    return report


def recorded_refinements(metadata) -> dict:
    """What the checkpoint's last step, if a prune, recorded beyond one sparsity everywhere:
    ``allocation`` (OWL's settings and each block's plan) and ``refine`` (DSnoT's settings)."""
    entry = read_provenance(metadata) or {}
    if entry.get("command") != "prune":
        return {}
    return {k: entry[k] for k in ("allocation", "refine") if isinstance(entry.get(k), dict)}


BARS_UP_TO = 40
"""``report --plot`` draws one bar per tensor up to this many tensors, a layer x matrix heatmap
past it."""

_ROLE_COLOURS = {
    "qkv": "tab:blue",
    "attn_out": "tab:cyan",
    "ffn_in": "tab:orange",
    "ffn_out": "tab:red",
}
EXPERT_ROWS = {"experts_in": "experts in (gate/up)", "experts_out": "experts out (down)"}
"""Heatmap rows of the routed experts (every expert of the layer pooled), below the dense FFN's."""
_LAYER_ROWS = {
    "router": "routers",
    "norm": "norms",
    "bias": "biases",
    "position": "positions",
    "embedding": "embeddings",
    "head": "heads",
    "other": "other",
}


def plot_report(report: Report, out: str | Path, *, all_tensors: bool = True) -> Written:
    """Draw the sparsity of the tensors the table lists (every tensor, or with ``all_tensors``
    False the targeted ones) into the PNG ``out``.

    Up to :data:`BARS_UP_TO` tensors: one bar each, coloured by role, with a legend of the roles
    drawn. More: a heatmap with layers across and matrices down (the axes of ``diff --plot``),
    each cell the pooled sparsity of its tensors (gate and up are both FFN in; a layer's routed
    experts pool into rows of their own, their cells printing the lowest to highest expert's
    sparsity when those differ); tensors outside the layers are summed up in the title. No
    tensor: a figure that says so.
    """
    from sparsetool.ops.plots import message_figure

    rows = [t for t in report.tensors if all_tensors or t.targeted]
    s = report.summary
    title = (
        f"{report.path.name}: targeted {100 * s['targeted_sparsity']:.2f}%, "
        f"overall {100 * s['overall_sparsity']:.2f}%"
    )
    if not rows:
        what = (
            "no tensors" if not report.tensors else "no targeted tensors (--all draws every tensor)"
        )
        return message_figure(f"{report.path.name}: {what}", out)
    if len(rows) > BARS_UP_TO:
        drawn = _heatmap(rows, out, title)
        if drawn is not None:
            return drawn
    return _bars(rows, out, title)


ZERO_INPUT = "all zero, untouched by prune"
"""Legend entry of a tensor prune does not target that holds only zeros (a zero bias): its zeros
are the input's own, not pruning's."""
UNTOUCHED = "not targeted: prune leaves them as they are (their zeros are the input's own)"
"""Legend entry of the heatmap's hatched cells."""
DENSE = "0% (no zeros)"
"""Legend entry of the marker a 0%-sparse tensor gets in place of a bar of length 0."""


def _bars(rows: list[TensorRow], out: str | Path, title: str) -> Written:
    from sparsetool.ops.plots import save_png
    from sparsetool.util.plotting import pyplot

    plt = pyplot()
    from matplotlib.lines import Line2D

    fig, ax = plt.subplots(figsize=(10, max(3.0, 0.18 * len(rows) + 1.5)))
    colour = [_ROLE_COLOURS.get(t.role, "tab:gray") for t in rows]
    bars = ax.barh(range(len(rows)), [100 * t.sparsity for t in rows], color=colour)
    zero_input = [not t.targeted and t.numel > 0 and t.nonzero == 0 for t in rows]
    for bar, zero in zip(bars, zero_input):
        if zero:  # not "pruning zeroed my biases": a pale hatched bar of its own
            bar.set(facecolor="0.93", edgecolor="0.45", hatch="////", linewidth=0.6)
    dense = [i for i, t in enumerate(rows) if t.numel and t.nonzero == t.numel]
    if dense:  # a bar of length 0 looks missing: a short tick at 0 in the role's colour
        ax.scatter(
            [0.7] * len(dense),
            dense,
            marker="|",
            s=60,
            linewidths=2.5,
            zorder=3,
            c=[colour[i] for i in dense],
            gid="dense-markers",
        )
        for i in dense:
            ax.text(1.5, i, "0%", va="center", fontsize=6, color="0.3")
    ax.set_yticks(range(len(rows)), [t.name for t in rows], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("sparsity (% zeros)")
    ax.set_title(title)
    present = {t.role for t, z in zip(rows, zero_input) if not z}
    legend = [(r, c) for r, c in _ROLE_COLOURS.items() if r in present]
    grey = sorted(present - set(_ROLE_COLOURS))
    if grey:
        legend.append((", ".join(grey), "tab:gray"))
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c in legend]
    labels = [r for r, _ in legend]
    if any(zero_input):
        handles.append(
            plt.Rectangle((0, 0), 1, 1, facecolor="0.93", edgecolor="0.45", hatch="////")
        )
        labels.append(ZERO_INPUT)
    if dense:
        handles.append(Line2D([], [], marker="|", ls="none", ms=8, mew=2.5, color="0.3"))
        labels.append(DENSE)
    ax.legend(
        handles,
        labels,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=7,
        title="role",
        title_fontsize=7,
    )
    fig.tight_layout()
    return save_png(fig, out)


def layer_kind(t: TensorRow) -> str:
    """A row's matrix kind in the heatmap: ``experts_in``/``experts_out`` for a routed expert's
    FFN matrix (one expert's or all experts' fused), else :func:`sparsetool.ops.diff.matrix_kind`.
    """
    from sparsetool.ops.diff import matrix_kind  # torch: for the heatmap only

    return _expert_kind(t) or matrix_kind(t.name, t.shape)


def _expert_kind(t: TensorRow) -> str | None:
    """``experts_in``/``experts_out`` for a routed expert's FFN matrix, else None."""
    if t.role in ("ffn_in", "ffn_out") and is_routed_expert(t.name):
        return "experts_in" if t.role == "ffn_in" else "experts_out"
    return None


def layer_cells(
    rows: Sequence[TensorRow],
) -> tuple[dict[tuple[int, str], float], tuple[int, int, int]]:
    """((layer, matrix kind) -> pooled sparsity in %, (tensors, numel, non-zeros) outside the
    layers).

    Kinds are those of :func:`layer_kind`: Q, K, V, QKV (fused), attn_out, ffn_in (gate and up
    pool into one cell), ffn_out, experts_in, experts_out, or a tensor's role (norm, bias...).
    """
    from sparsetool.targets.order import layer_index

    pooled: dict[tuple[int, str], list[int]] = {}
    outside = [0, 0, 0]
    for t in rows:
        layer = layer_index(t.name)
        if layer is None:
            outside = [outside[0] + 1, outside[1] + t.numel, outside[2] + t.nonzero]
            continue
        cell = pooled.setdefault((layer, layer_kind(t)), [0, 0])
        cell[0] += t.numel
        cell[1] += t.nonzero
    cells = {key: 100.0 * (1 - nz / n) if n else 0.0 for key, (n, nz) in pooled.items()}
    return cells, (outside[0], outside[1], outside[2])


def expert_spread(rows: Sequence[TensorRow]) -> dict[tuple[int, str], tuple[float, float]]:
    """(layer, experts kind) -> (lowest, highest) sparsity in % of one expert's matrices of that
    kind (its gate and up pooled; from per-expert tensors or a fused tensor's experts)."""
    from sparsetool.targets.order import layer_index

    pooled: dict[tuple[int, str], dict[int, list[int]]] = {}
    for t in rows:
        layer, kind = layer_index(t.name), _expert_kind(t)
        if layer is None or kind is None:
            continue
        experts = pooled.setdefault((layer, kind), {})
        parts = (
            [(t.expert, t.numel, t.nonzero)]
            if t.experts is None
            else [(e, t.experts.numel, n) for e, n in enumerate(t.experts.nonzero)]
        )
        for e, numel, nonzero in parts:
            if e is None:
                continue
            cell = experts.setdefault(e, [0, 0])
            cell[0] += numel
            cell[1] += nonzero
    out = {}
    for key, experts in pooled.items():
        spread = [100.0 * (1 - nz / n) if n else 0.0 for n, nz in experts.values()]
        if spread:
            out[key] = (min(spread), max(spread))
    return out


def _heatmap(rows: list[TensorRow], out: str | Path, title: str) -> Written | None:
    """The layer x matrix heatmap, or None when no tensor has a layer index."""
    from sparsetool.ops.plots import MATRIX_LABELS, layer_heatmap

    cells, (n, numel, nonzero) = layer_cells(rows)
    if not cells:
        return None
    if n:
        title += (
            f"\n{n} tensor{'s' if n != 1 else ''} outside the layers, not drawn: "
            f"{100 * (1 - nonzero / numel) if numel else 0.0:.2f}% sparse"
        )
    from sparsetool.targets.order import layer_index

    pruned = {(layer_index(t.name), layer_kind(t)) for t in rows if t.targeted}
    texts = {
        key: f"{lo:.0f}-{hi:.0f}"
        for key, (lo, hi) in expert_spread(rows).items()
        if hi - lo >= 0.05
    }  # the experts differ: the range, not the pooled value
    return layer_heatmap(
        cells,
        out,
        title=title,
        colour_label="sparsity (% zeros)",
        labels={**MATRIX_LABELS, **EXPERT_ROWS, **_LAYER_ROWS},
        vmin=0.0,
        vmax=100.0,
        cell_text=lambda v: f"{v:.1f}",
        hatched=set(cells) - pruned,
        hatch_label=UNTOUCHED,
        cell_texts=texts,
    )
