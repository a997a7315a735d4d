"""What ``sparsetool shrink`` did: :class:`ShrinkResult`, with the record of what each kind removed
(:class:`BlocksRemoved` for ``--blocks``, :class:`WidthsNarrowed` for ``--ffn``, ``--heads`` and
``--hidden``; ``--experts``: the :class:`~sparsetool.ops.shrink.options.ExpertPlan` and each
layer's record). Each ``to_json()`` is its part of ``shrink --json`` (and of the output's
provenance); :meth:`ShrinkResult.summary` is the line the command prints. Per-layer records stay
JSON objects: they are the data the output's provenance records, read by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import Reclaimed
from sparsetool.ops.shrink.options import ExpertPlan, ShrinkOptions
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.wording import plural

__all__ = [
    "BlockMaps",
    "BlocksRemoved",
    "Candidate",
    "ParamsSearch",
    "FoldedMap",
    "HeadsKept",
    "HiddenKept",
    "LeastSquares",
    "ShrinkResult",
    "Width",
    "WidthsNarrowed",
]


@dataclass
class FoldedMap:
    """``--blocks``: ReplaceMe's map of one removed run, folded into the block before it, or not
    (``kept_plain``: no map beat the blocks just removed on the held-back windows). The errors:
    over every calibration window (``error_*``) and over the held-back windows of the map
    fitted without them (``held_*``; None with nothing held back), without the map and with."""

    run: list[int]
    folded_into: int
    error_before: float
    error_after: float
    damping: float | None = None
    held_before: float | None = None
    held_after: float | None = None
    kept_plain: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "folded_into": self.folded_into,
            "error_before": self.error_before,
            "error_after": self.error_after,
            "damping": self.damping,
            "held_before": self.held_before,
            "held_after": self.held_after,
            "kept_plain": self.kept_plain,
        }

    def summary(self) -> str:
        span = f"{self.run[0]}-{self.run[-1]}" if len(self.run) > 1 else str(self.run[0])
        if self.held_before is None:
            return (
                f"blocks {span} removed as they are (one calibration window: none held back to "
                "check a map on)"
            )
        held = f"held-back error {self.held_before:.3g} -> {self.held_after:.3g}"
        if self.kept_plain:
            return f"blocks {span} removed as they are (no map beat that: {held})"
        return (
            f"blocks {span} replaced by a least-squares map folded into block "
            f"{self.folded_into}'s down projection ({held}, damping {self.damping:g}; "
            f"calibration error {self.error_before:.3g} -> {self.error_after:.3g})"
        )


@dataclass
class BlockMaps:
    """``--blocks`` with reconstruction: the maps fitted, and the runs left as removed (why)."""

    method: str
    dampings: list[float]  # chosen from on the held-back windows
    held_back_windows: int
    maps: list[FoldedMap] = field(default_factory=list)
    not_refit: list[dict[str, Any]] = field(default_factory=list)  # {"run": [...], "why": ...}

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "dampings": self.dampings,
            "held_back_windows": self.held_back_windows,
            "maps": [m.to_json() for m in self.maps],
            "not_refit": self.not_refit,
        }


@dataclass
class BlocksRemoved:
    """``--blocks``: the blocks before and after, which went by which criterion, every block's
    influence and every run's angular distance."""

    before: int
    after: int
    criterion: str
    removed: list[int]
    kept: list[int]
    bi: list[float]
    angular: list[float]
    reconstruct: BlockMaps | None = None

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "before": self.before,
            "after": self.after,
            "criterion": self.criterion,
            "removed": self.removed,
            "kept": self.kept,
            "bi": self.bi,
            "angular": self.angular,
        }
        if self.reconstruct is not None:
            rec["reconstruct"] = self.reconstruct.to_json()
        return rec

    def summary(self) -> str:
        maps = self.reconstruct.maps if self.reconstruct is not None else []
        return (
            f"removed {plural(len(self.removed), 'block')} of {self.before} ({self.criterion}): "
            f"{', '.join(map(str, self.removed))}" + "".join(f"; {m.summary()}" for m in maps)
        )


@dataclass
class Width:
    """A width before and after (``--ffn``: the FFN channels per layer)."""

    before: int
    after: int

    def to_json(self) -> dict[str, Any]:
        return {"before": self.before, "after": self.after}


@dataclass
class HeadsKept:
    """``--heads``: the attention heads and key/value heads per layer before and after, and how
    they were kept (``groups`` or ``query heads per group``)."""

    mode: str
    heads_before: int
    kv_before: int
    heads_after: int
    kv_after: int
    head_dim: int

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "before": {"heads": self.heads_before, "kv_heads": self.kv_before},
            "after": {"heads": self.heads_after, "kv_heads": self.kv_after},
            "head_dim": self.head_dim,
        }


@dataclass
class LeastSquares:
    """A least-squares refit summed up: what was refit (``names``: the projections, or the
    readers of the narrower norms), how, and the calibration error before and after (the mean
    over layers). ``extra``: the rest of its record, as recorded (a refit checked on held-back
    windows: their count, the dampings, the layers refit and kept plain, the mean held-back
    errors). ``dampening``: the one damping, or None where each layer chose its own."""

    names: list[str]
    method: str
    dampening: float | None
    error_before: float
    error_after: float
    key: str = "projections"  # the names' key in the record
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of_readers(cls, found: dict[str, Any]) -> LeastSquares:
        """``--hidden``'s refit of the norms' readers, from its record."""
        rest = {
            k: v
            for k, v in found.items()
            if k not in ("readers", "method", "dampening", "error_before", "error_after")
        }
        return cls(
            list(found["readers"]),
            found["method"],
            found["dampening"],
            found["error_before"],
            found["error_after"],
            key="readers",
            extra=rest,
        )

    @property
    def not_refit(self) -> list[str]:
        return list(self.extra.get("not_refit", []))

    def to_json(self) -> dict[str, Any]:
        return {
            self.key: self.names,
            "method": self.method,
            "dampening": self.dampening,
            "error_before": self.error_before,
            "error_after": self.error_after,
            **self.extra,
        }

    def errors(self) -> str:
        calibration = f"calibration error {self.error_before:.3g} -> {self.error_after:.3g}"
        x = self.extra
        if "held_back_windows" not in x:
            return f"({calibration}, mean over layers)"
        if not x["held_back_windows"]:
            return (
                "(every layer kept plain: one calibration window, none held back to check a "
                "refit on; give --samples 2 or more)"
            )
        kept = x["layers_kept_plain"]
        layers = kept + x["layers_refit"]
        return (
            f"(held-back error {x['held_before']:.3g} -> {x['held_after']:.3g}, {calibration}, "
            f"mean over layers; {kept} of {plural(layers, 'projection')} kept plain)"
        )


@dataclass
class HiddenKept:
    """``--hidden``: the embedding channels before and after, which were kept, the head width
    written out, and the refit of the norms' readers (with reconstruction)."""

    before: int
    after: int
    kept: list[int]
    head_dim: int
    refit: LeastSquares | None = None

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {
            "before": self.before,
            "after": self.after,
            "kept": self.kept,
            "head_dim": self.head_dim,
        }
        if self.refit is not None:
            rec["refit"] = self.refit.to_json()
        return rec


@dataclass
class WidthsNarrowed:
    """``--ffn``, ``--heads``, ``--hidden``: the widths before and after, each layer's kept
    channels and heads (``layers``: one record per block), and the refits."""

    ffn: Width | None = None
    heads: HeadsKept | None = None
    layers: list[dict[str, Any]] = field(default_factory=list)
    refit: LeastSquares | None = None  # --ffn/--heads with reconstruction
    hidden: HiddenKept | None = None

    def to_json(self) -> dict[str, Any]:
        rec: dict[str, Any] = {}
        if self.ffn is not None:
            rec["ffn"] = self.ffn.to_json()
        if self.heads is not None:
            rec["heads"] = self.heads.to_json()
        rec["layers"] = self.layers
        if self.refit is not None:
            rec["refit"] = self.refit.to_json()
        if self.hidden is not None:
            rec["hidden"] = self.hidden.to_json()
        return rec

    def summary(self) -> str:
        done = []
        if self.ffn is not None:
            done.append(f"FFN channels {self.ffn.before:,} -> {self.ffn.after:,}")
        if self.heads is not None:
            h = self.heads
            done.append(
                f"attention heads {h.heads_before} -> {h.heads_after} (key/value "
                f"heads {h.kv_before} -> {h.kv_after}; {h.mode})"
            )
        if self.hidden is not None:
            done.append(f"hidden size {self.hidden.before:,} -> {self.hidden.after:,}")
        if self.refit is not None:
            done.append(
                f"refit by least squares: {', '.join(self.refit.names)} {self.refit.errors()}"
            )
        if self.hidden is not None and self.hidden.refit is not None:
            r = self.hidden.refit
            done.append(f"readers of the narrower norms refit: {', '.join(r.names)} {r.errors()}")
        return f"narrowed {plural(len(self.layers), 'layer')}: {'; '.join(done)}"


@dataclass
class Candidate:
    """``--params``: one model made and scored: its cuts (``mix``, a
    :class:`~sparsetool.ops.shrink.sizes.Mix`; ``label``, as flags), why it was made (``role``:
    a kind alone, or a mix predicted well), its parameters, the held-out loss predicted and
    measured (mean NLL per token, nats), whether it meets the budget, and the seconds it took."""

    mix: Any
    label: str
    role: str
    params: int
    predicted: float | None
    measured: float
    eligible: bool
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "cuts": self.label,
            "role": self.role,
            "params": self.params,
            "predicted_loss": None if self.predicted is None else round(self.predicted, 5),
            "loss": round(self.measured, 5),
            "meets_budget": self.eligible,
            "seconds": self.seconds,
        }


@dataclass
class ParamsSearch:
    """``--params``: the budget (``target`` of ``total`` parameters), the kinds of cut tried, how
    many mixes met the budget on the grid, the scoring windows and the input's loss on them, each
    kind's sensitivity (loss increase per squared fraction cut), every candidate and the one
    chosen."""

    target: int
    total: int
    kinds: list[str]
    mixes: int
    planned: list[str] = field(default_factory=list)  # the kinds alone, made first
    windows: int = 0
    seq: int = 0
    dense_loss: float = 0.0
    sensitivity: dict[str, float] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    chosen: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "total": self.total,
            "kinds": self.kinds,
            "mixes_in_budget": self.mixes,
            "scored_on": {"windows": self.windows, "seq": self.seq},
            "input_loss": round(self.dense_loss, 5),
            "sensitivity": self.sensitivity,
            "candidates": [c.to_json() for c in self.candidates],
            "chosen": self.chosen,
        }

    def plan_lines(self) -> list[str]:
        """What the search will do, said before it starts."""
        return [
            f"--params: {self.target:,} of {plural(self.total, 'parameter')} "
            f"({self.target / self.total:.3f}x, within 1%); "
            f"{plural(self.mixes, 'mix', 'mixes')} of {', '.join(self.kinds)} meet it",
            f"measured first, each kind alone: {'; '.join(self.planned)}; then the mixes "
            "predicted best",
            f"scored on {self.windows} windows of {self.seq} tokens of the calibration text "
            f"(the input: {self.dense_loss:.4f} nats/token)",
        ]

    def rows(self) -> list[list[str]]:
        """The candidates' table: cuts, why made, parameters, loss predicted and measured."""
        return [
            [
                ("* " if c.label == self.chosen else "  ") + c.label,
                c.role,
                f"{c.params:,} ({c.params / self.total:.3f}x)" + ("" if c.eligible else " !"),
                "" if c.predicted is None else f"{c.predicted:.4f}",
                f"{c.measured:.4f}",
                f"{c.seconds:.0f}",
            ]
            for c in self.candidates
        ]


@dataclass
class ShrinkResult:
    """What ``shrink`` did: per Mixture-of-Experts layer, the experts kept (their indices in the
    input, in their new order) with every expert's saliency (``plan``, ``layers``); or the blocks
    removed (``blocks``); or the widths narrowed (``widths``); and the sizes before and after."""

    output: Path
    options: ShrinkOptions
    plan: ExpertPlan | None = None  # --experts
    layers: list[dict[str, Any]] = field(default_factory=list)  # --experts: one per layer
    blocks: BlocksRemoved | None = None  # --blocks
    widths: WidthsNarrowed | None = None  # --ffn, --heads, --hidden
    search: ParamsSearch | None = None  # --params: the candidates and the choice
    parameters_before: int = 0
    parameters_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    tokens: int = 0  # calibration tokens run through the model
    memory: MemoryPlan | None = None  # the plan checked before the calibration text ran
    notes: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    reclaimed: list[Reclaimed] = field(default_factory=list)  # stale temporaries removed

    def experts_json(self) -> dict[str, Any]:
        """``--experts``: the routed experts per layer before and after (``shrink --json``'s
        ``experts``)."""
        assert self.plan is not None
        return {
            "before": self.plan.experts,
            "after": self.plan.keep,
            "top_k": self.plan.top_k,
            "groups": self.plan.groups,
        }

    def to_json(self) -> dict[str, Any]:
        removed: dict[str, Any] = {}
        if self.plan is not None:
            removed["experts"] = self.experts_json()
        if self.blocks is not None:
            removed["blocks"] = self.blocks.to_json()
        if self.widths is not None:
            removed["widths"] = self.widths.to_json()
        if self.search is not None:
            removed["search"] = self.search.to_json()
        return {
            "output": str(self.output),
            "options": self.options.record(),
            **removed,
            "calibration_tokens": self.tokens,
            **({"memory": self.memory.to_json()} if self.memory is not None else {}),
            "parameters": {"before": self.parameters_before, "after": self.parameters_after},
            "bytes": {"before": self.bytes_before, "after": self.bytes_after},
            **({"layers": self.layers} if self.plan is not None else {}),
            "notes": list(self.notes),
            "left_out": list(self.left_out),
        }

    def summary(self) -> str:
        """What was removed and the parameters before and after, in one line."""
        if self.widths is not None or self.blocks is not None:
            done = "; then ".join(r.summary() for r in (self.blocks, self.widths) if r is not None)
        else:
            assert self.plan is not None
            o = self.options
            done = (
                f"shrank {plural(len(self.layers), 'layer')}: {self.plan.experts} -> "
                f"{self.plan.keep} routed experts each ({o.criterion}"
                f"{', merged' if o.merge else ''})"
            )
        if self.search is not None:
            done = (
                f"chose {self.search.chosen} of {len(self.search.candidates)} candidates by "
                f"loss on held-out calibration text: {done}"
            )
        return f"{done}; parameters {self.parameters_before:,} -> {self.parameters_after:,}"

    def expert_rows(self) -> list[list[str]]:
        """``--experts``, per layer: its block, the experts removed (the first 8) and the
        saliencies on either side of the cut (the lowest kept, the highest removed)."""
        rows = []
        for layer in self.layers:
            scores = layer["scores"]
            kept_low = min(scores[e] for e in layer["kept"])
            removed_high = max(scores[e] for e in layer["removed"])
            shown = ", ".join(str(e) for e in layer["removed"][:8])
            more = len(layer["removed"]) - 8
            rows.append(
                [
                    str(layer["block"]),
                    shown + (f" (+{more})" if more > 0 else ""),
                    f"{kept_low:.4g}",
                    f"{removed_high:.4g}",
                ]
            )
        return rows
