"""What ``sparsetool shrink`` is asked to do, checked without torch, and what it did.

:class:`ShrinkOptions` holds the options of the command and of :func:`sparsetool.shrink`, their
defaults and their checks in one place; :func:`plan_experts` turns ``--experts F`` or
``--experts-keep N`` into the number of experts each Mixture-of-Experts layer keeps, refusing a
request the model's router cannot serve before any weight is read. :class:`ShrinkResult` is what
was done (``to_json()`` is ``shrink --json``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import Reclaimed
from sparsetool.errors import ConfigError, UsageError
from sparsetool.ops.calibration import DEFAULT_SAMPLES, check_text_field
from sparsetool.ops.text import DEFAULT_FIELD, TextSource, is_records
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.options import check_count, check_seed, option_error

__all__ = [
    "BLOCK_CRITERIA",
    "CRITERIA",
    "ShrinkOptions",
    "ExpertPlan",
    "ShrinkResult",
    "plan_experts",
]

CRITERIA = ("reap", "frequency", "ean", "random")
"""How the experts of a layer are ranked (docs/shrink.md gives each formula)."""
BLOCK_CRITERIA = ("bi", "angular")
"""How whole blocks are chosen: each block's influence (ShortGPT), or the contiguous run whose
input and output lie closest in angle (Gromov et al.)."""


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # not NaN


def _fraction(x: object) -> bool:
    """Whether ``x`` is a number strictly between 0 and 1."""
    return _number(x) and 0 < x < 1  # type: ignore[operator]


@dataclass(frozen=True)
class ShrinkOptions:
    """The options of ``sparsetool shrink`` (CLI names in the comments)."""

    experts: float | None = None  # --experts F: fraction of each layer's routed experts removed
    experts_keep: int | None = None  # --experts-keep N: routed experts each layer keeps
    criterion: str = "reap"  # --criterion
    blocks: float | None = None  # --blocks N (whole blocks removed) or a fraction of them
    block_criterion: str = "bi"  # --block-criterion
    ffn: float | None = None  # --ffn F: the fraction of each FFN's channels kept
    heads: float | None = None  # --heads F: the fraction of each layer's attention heads kept
    hidden: float | None = None  # --hidden F: the fraction of the embedding channels kept
    reconstruct: bool = True  # --reconstruct/--no-reconstruct: least-squares refits
    merge: bool = False  # --merge: fold each removed expert into its most similar kept one
    calibration: str | Path | None = None  # --calibration FILE|DIR (a TextSource once reading)
    text_field: str = DEFAULT_FIELD  # --text-field NAME: a calibration record's text field
    samples: int = DEFAULT_SAMPLES  # --samples
    seq: int | None = None  # --seq; None: prune's default (512), or the context when shorter
    seed: int = 0  # --seed: the windows picked from the text, and --criterion random
    dtype: str = "float32"  # --dtype: precision of the forward passes
    device: str = "auto"  # --device: auto (a GPU if there is one), cpu, cuda or cuda:N
    max_memory: int | None = None  # --max-memory SIZE (bytes): default, what is available

    @property
    def reads_text(self) -> bool:
        """Whether the calibration text runs through the model (blocks, and every expert
        criterion but random without --merge)."""
        return self.removes != "experts" or self.criterion != "random" or self.merge

    @property
    def removes(self) -> str:
        """What is removed: ``experts``, ``blocks`` or ``widths`` (FFN channels, heads, embedding
        channels)."""
        if self.blocks is not None:
            return "blocks"
        if self.widths:
            return "widths"
        return "experts"

    @property
    def asked(self) -> str:
        """The options that say what is removed, as typed (``--ffn 0.75 --hidden 0.75``)."""
        flags = {"experts": self.experts, "experts-keep": self.experts_keep}
        if self.removes == "blocks":
            flags = {"blocks": self.blocks}
        elif self.removes == "widths":
            flags = {"ffn": self.ffn, "heads": self.heads, "hidden": self.hidden}
        return " ".join(f"--{k} {v:g}" for k, v in flags.items() if v is not None)

    @property
    def widths(self) -> bool:
        """Whether a width is narrowed (``--ffn``, ``--heads``, ``--hidden``)."""
        return any(f is not None for f in (self.ffn, self.heads, self.hidden))

    def reading(self, checkpoint: str | Path) -> ShrinkOptions:
        """The options with ``calibration`` a :class:`~sparsetool.ops.text.TextSource`: its records'
        ``text_field``, and ``checkpoint``'s chat template for chat messages."""
        if self.calibration is None:
            return self
        return replace(self, calibration=TextSource(self.calibration, self.text_field, checkpoint))

    def validate(self) -> None:
        """Raise :class:`~sparsetool.errors.ConfigError` for options that cannot work together,
        before anything is read."""
        widths = self.widths
        asked = [x is not None for x in (self.experts, self.experts_keep, self.blocks)] + [widths]
        if sum(asked) != 1:
            raise ConfigError(
                "say what to remove, one of: --experts F (the fraction of each layer's routed "
                "experts), --experts-keep N (the experts each layer keeps), --blocks N (whole "
                "blocks; a fraction below 1 of them), or --ffn F / --heads F / --hidden F (the "
                "fraction of FFN channels / attention heads / embedding channels kept)"
                + ("; run shrink once for each" if sum(asked) > 1 else "")
            )
        for flag, f in (("--ffn", self.ffn), ("--heads", self.heads), ("--hidden", self.hidden)):
            if f is not None and not _fraction(f):
                problem = "must be strictly between 0 and 1 (the fraction kept)"
                raise option_error(f"{flag} {problem}, got {f!r}", flag, f, problem)
        if widths and self.merge:
            raise ConfigError(
                "--merge merges experts; it does not go with --ffn, --heads or --hidden"
            )
        if self.blocks is not None:
            b = self.blocks
            if not _fraction(b) and not (_number(b) and b >= 1 and float(b).is_integer()):
                problem = (
                    "must be a whole number of blocks (1 or more) or strictly between 0 and 1 "
                    "(the fraction of the blocks removed)"
                )
                raise option_error(f"--blocks {problem}, got {b!r}", "--blocks", b, problem)
            if self.merge:
                raise ConfigError("--merge merges experts; it does not go with --blocks")
        if self.block_criterion not in BLOCK_CRITERIA:
            raise ConfigError(
                f"--block-criterion {self.block_criterion!r}: use {', '.join(BLOCK_CRITERIA)}"
            )
        if self.experts is not None:
            f = self.experts
            if not _fraction(f):
                problem = (
                    "must be strictly between 0 and 1 (the fraction of each layer's routed "
                    "experts removed)"
                )
                raise option_error(
                    f"--experts {problem}, got {f!r}; 0.5 removes half of them",
                    "--experts",
                    f,
                    problem,
                )
        if self.experts_keep is not None:
            check_count(self.experts_keep, "--experts-keep")
        if self.criterion not in CRITERIA:
            raise ConfigError(f"--criterion {self.criterion!r}: use {', '.join(CRITERIA)}")
        check_count(self.samples, "--samples")
        if self.seq is not None:
            check_count(self.seq, "--seq", minimum=2)
        check_seed(self.seed)
        if self.max_memory is not None:
            check_count(self.max_memory, "--max-memory")
        check_text_field(self.text_field, self.calibration)
        if self.text_field != DEFAULT_FIELD and (self.calibration is None or not self.reads_text):
            raise ConfigError(
                "--text-field names the text field of --calibration records; it is read only "
                "with calibration text: drop it or give --calibration"
            )
        if self.reads_text and self.calibration is None:
            if self.blocks is not None:
                raise ConfigError(
                    f"--blocks scores the blocks ({self.block_criterion}) on calibration text: "
                    "give --calibration FILE|DIR"
                )
            if widths:
                raise ConfigError(
                    "--ffn, --heads and --hidden rank channels and heads by their "
                    "activations on calibration text: give --calibration FILE|DIR"
                )
            why = (
                "--merge compares experts' outputs"
                if self.merge
                else f"--criterion {self.criterion} scores experts"
            )
            raise ConfigError(
                f"{why} on calibration text: give --calibration FILE|DIR "
                "(or --criterion random, which needs none)"
            )

    def record(self) -> dict[str, Any]:
        """The options as provenance and ``--json`` record them (the text only when read)."""
        rec = asdict(self)
        rec["calibration"] = str(self.calibration) if self.calibration is not None else None
        if self.calibration is None or (
            self.text_field == DEFAULT_FIELD and not is_records(self.calibration)
        ):
            del rec["text_field"]
        digest = getattr(self.calibration, "digest", None)
        if digest:  # the text as read: the SHA-256 of its UTF-8
            rec["calibration_sha256"] = digest
        for k in ("experts", "experts_keep", "criterion", "merge"):
            if self.removes != "experts":
                del rec[k]
        for k in ("blocks", "block_criterion"):
            if self.removes != "blocks":
                del rec[k]
        for k in ("ffn", "heads", "hidden"):
            if self.removes != "widths":
                del rec[k]
        if self.ffn is None and self.heads is None and self.blocks is None:
            del rec["reconstruct"]  # a cut FFN or attention is refit, removed blocks mapped
        if not self.reads_text:
            for k in ("calibration", "text_field", "samples", "seq", "dtype"):
                rec.pop(k, None)
        del rec["device"], rec["max_memory"]  # where and within what it ran, not what was made
        return rec


@dataclass(frozen=True)
class ExpertPlan:
    """How many routed experts each Mixture-of-Experts layer keeps, per router group."""

    experts: int  # routed experts per layer in the input
    keep: int  # routed experts per layer in the output
    top_k: int  # experts each token is routed to
    groups: int = 1  # router groups (DeepSeek-V3's n_group): each loses as many experts
    topk_group: int = 1  # groups a token may choose from

    @property
    def removed(self) -> int:
        return self.experts - self.keep

    @property
    def keep_per_group(self) -> int:
        return self.keep // self.groups


def plan_experts(
    opts: ShrinkOptions,
    experts: int,
    top_k: int,
    *,
    groups: int = 1,
    topk_group: int = 1,
    group_top: int = 0,
    model: str = "the model",
) -> ExpertPlan:
    """The experts each layer keeps, from ``--experts F`` (rounded to the nearest whole number of
    experts per group) or ``--experts-keep N``; a :class:`~sparsetool.errors.UsageError` when
    that removes none, or leaves fewer experts a token can reach than it is routed to.

    ``groups``/``topk_group``: a group-limited router (each token chooses among the experts of
    its ``topk_group`` best groups) loses the same number in every group. ``group_top``: experts
    a group must keep because the router ranks groups by the sum of their best ``group_top``.

    >>> plan_experts(ShrinkOptions(experts=0.5), 8, 2).keep
    4
    >>> plan_experts(ShrinkOptions(experts=0.25), 8, 2, groups=2, topk_group=1).keep_per_group
    3
    >>> plan_experts(ShrinkOptions(experts_keep=1), 8, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sparsetool.errors.UsageError: --experts-keep 1 leaves 1 routed expert per layer, ...
    """
    per_group = experts // groups
    if opts.experts_keep is not None:
        keep = opts.experts_keep
        asked = f"--experts-keep {keep}"
        if keep % groups:
            raise UsageError(
                f"{asked}: {model}'s router has {groups} expert groups, which keep alike; "
                f"give a multiple of {groups}"
            )
        if keep >= experts:
            said = (
                f"{asked}: {model} has only {experts} routed experts per layer"
                if keep > experts
                else f"{asked} keeps all of {model}'s {experts} routed experts per layer"
            )
            raise UsageError(f"{said}; keep at most {experts - groups}")
    else:
        assert opts.experts is not None
        removed_per_group = round(opts.experts * per_group)
        keep = (per_group - removed_per_group) * groups
        asked = f"--experts {opts.experts:g}"
        if keep >= experts:
            rule = f"round({opts.experts:g} x {per_group}) = 0"
            raise UsageError(
                f"{asked} removes none of {model}'s {experts} routed experts per layer ("
                + (f"{groups} groups of {per_group}: {rule} of each" if groups > 1 else rule)
                + "); ask for a larger fraction"
            )
    reachable = keep if groups == 1 else (keep // groups) * topk_group
    if reachable < top_k:
        where = (
            f"leaves {keep} routed expert{'s' if keep != 1 else ''} per layer"
            if groups == 1
            else f"leaves {keep // groups} per group, {reachable} within the {topk_group} "
            f"group{'s' if topk_group != 1 else ''} a token chooses from"
        )
        least = top_k if groups == 1 else -(-top_k // topk_group) * groups
        raise UsageError(
            f"{asked} {where}, but {model} routes each token to {top_k}; keep at least {least}"
        )
    if groups > 1 and keep // groups < group_top:
        raise UsageError(
            f"{asked} leaves {keep // groups} experts per group, but {model}'s router ranks "
            f"its groups by their best {group_top}; keep at least {group_top * groups}"
        )
    return ExpertPlan(experts, keep, top_k, groups, topk_group)


@dataclass
class ShrinkResult:
    """What ``shrink`` did: per Mixture-of-Experts layer, the experts kept (their indices in the
    input, in their new order) with every expert's saliency, and the sizes before and after."""

    output: Path
    options: ShrinkOptions
    plan: ExpertPlan | None = None  # --experts
    layers: list[dict] = field(default_factory=list)
    blocks: dict | None = None  # --blocks: before, after, removed, scores
    widths: dict | None = None  # --ffn, --heads, --hidden: before, after, kept per layer
    parameters_before: int = 0
    parameters_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    tokens: int = 0  # calibration tokens run through the model
    memory: MemoryPlan | None = None  # the plan checked before the calibration text ran
    notes: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    reclaimed: list[Reclaimed] = field(default_factory=list)  # stale temporaries removed

    def to_json(self) -> dict[str, Any]:
        removed: dict[str, Any] = {}
        if self.plan is not None:
            removed["experts"] = {
                "before": self.plan.experts,
                "after": self.plan.keep,
                "top_k": self.plan.top_k,
                "groups": self.plan.groups,
            }
        if self.blocks is not None:
            removed["blocks"] = self.blocks
        if self.widths is not None:
            removed["widths"] = self.widths
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
