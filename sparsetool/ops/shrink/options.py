"""What ``sparsetool shrink`` is asked to do, checked without torch, and what it did.

:class:`ShrinkOptions` holds the options of the command and of :func:`sparsetool.shrink`, their
defaults and their checks in one place; :func:`plan_experts` turns ``--experts F`` or
``--experts-keep N`` into the number of experts each Mixture-of-Experts layer keeps, refusing a
request the model's router cannot serve before any weight is read. What was done is a
:class:`~sparsetool.ops.shrink.results.ShrinkResult`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError, UsageError
from sparsetool.ops.calibration import (
    DEFAULT_SAMPLES,
    DEFAULT_SEQ,
    TEXT_FIELD_HELP,
    check_text_field,
)
from sparsetool.ops.text import DEFAULT_FIELD, TextSource, is_records
from sparsetool.util.faces import OptionsRecord, option
from sparsetool.util.options import (
    check_count,
    check_device,
    check_seed,
    option_error,
    parse_size,
    parse_tokens,
)

__all__ = [
    "BLOCK_CRITERIA",
    "CRITERIA",
    "ShrinkOptions",
    "ExpertPlan",
    "plan_experts",
]

CRITERIA = ("reap", "frequency", "ean", "random")
"""How the experts of a layer are ranked (docs/shrink.md gives each formula)."""
BLOCK_CRITERIA = ("bi", "angular")
"""How whole blocks are chosen: each block's influence (ShortGPT), or the contiguous run whose
input and output lie closest in angle (Gromov et al.)."""


def parse_params(text: str | float | int, option: str = "--params") -> float | int:
    """``--params``: a fraction of the input's parameters strictly between 0 and 1 (``0.75``), or a
    count of them (``100M``, ``1.5B``, ``90_000_000``; K, M, B are powers of 1000).

    >>> parse_params("0.75"), parse_params("100M"), parse_params(0.5), parse_params("1.5B")
    (0.75, 100000000, 0.5, 1500000000)
    >>> parse_params("1")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --params 1: give a fraction strictly between 0 and 1 (0.75) or
    a count of parameters (100M)
    """
    problem = "give a fraction strictly between 0 and 1 (0.75) or a count of parameters (100M)"
    if isinstance(text, bool):
        raise option_error(f"{option} {text!r}: {problem}", option, text, problem)
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = None
    if value is not None and 0 < value < 1:
        return value
    try:
        count = parse_tokens(text, option)
    except ConfigError:
        count = 0
    if count < 1000:  # "--params 2" is a slip for a fraction, not a 2-parameter model
        raise option_error(f"{option} {text}: {problem}", option, text, problem)
    return count


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # not NaN


def _fraction(x: object) -> bool:
    """Whether ``x`` is a number strictly between 0 and 1."""
    return _number(x) and 0 < x < 1  # type: ignore[operator]


@dataclass(frozen=True)
class ShrinkOptions(OptionsRecord):
    """The options of ``sparsetool shrink``: each field's default and, in its metadata, how it
    shows on the command line (an :class:`~sparsetool.util.faces.OptionFace`), declared once for
    the CLI, ``sparsetool.shrink`` and the provenance."""

    command = "shrink"

    experts: float | None = option(
        None,
        "--experts",
        "Remove this fraction of each Mixture-of-Experts layer's routed experts (0.5: half).",
        metavar="F",
    )
    experts_keep: int | None = option(
        None,
        "--experts-keep",
        "Instead of --experts: the routed experts each layer keeps.",
        metavar="N",
    )
    criterion: str = option(
        "reap",
        "--criterion",
        "How experts are ranked on the calibration tokens (the lowest go): reap (mean of "
        "routing weight x output norm over the tokens routed to it), frequency (tokens routed), "
        "ean (summed output norm), or random (seeded; needs no text).",
    )
    blocks: float | None = option(  # whole blocks removed, or a fraction of them
        None,
        "--blocks",
        "Instead: remove N whole transformer blocks (a fraction below 1: of the blocks); with "
        "--ffn/--heads/--hidden, the blocks go first, then the rest is narrowed.",
        metavar="N",
    )
    block_criterion: str = option(
        "bi",
        "--block-criterion",
        "Which blocks --blocks removes: bi (the N of least influence, 1 - mean cosine of "
        "each block's input and output) or angular (the run of N consecutive blocks whose input "
        "and output lie closest in angle).",
    )
    ffn: float | None = option(
        None,
        "--ffn",
        "Keep this fraction of every FFN's channels (ranked by mean |activation|), "
        "the multiple of --multiple-of nearest F x d_ff (round(F x d_ff) with --multiple-of 1).",
        metavar="F",
    )
    heads: float | None = option(
        None,
        "--heads",
        "Keep this fraction of every layer's attention heads (ranked by their output "
        "norm): round(F x kv-heads) whole key/value groups when F x kv-heads is whole or each "
        "group is one head, else round(F x group size) query heads of every group (a note says "
        "when that is not F of the heads: 0.5 of 9 heads in groups of 3 keeps 6); of the counts "
        "whose kept heads x head_dim is a multiple of --multiple-of, the one nearest.",
        metavar="F",
    )
    hidden: float | None = option(
        None,
        "--hidden",
        "Keep this fraction of the embedding channels (ranked by mean |activation| after every "
        "norm), the multiple of --multiple-of nearest F x hidden size (round(F x hidden size) "
        "with --multiple-of 1): embeddings, norms, head and every projection's side.",
        metavar="F",
    )
    multiple_of: int = option(
        32,
        "--multiple-of",
        "--ffn/--heads/--hidden/--params: every width written (FFN channels, hidden size, kept "
        "heads x head width) is a multiple of N, the one nearest F x width (a tie: the larger) "
        "from N to below the full width, with a note when it is not round(F x width). 32 suits "
        "llama.cpp's q8_0/q4_0, 256 its k-quants; 1 keeps round(F x width) exactly.",
        metavar="N",
        parse=check_count,
    )
    params: float | int | None = option(
        None,
        "--params",
        "Instead: a model of F of the input's parameters (0.75), or of N (100M), within 1%: "
        "shrink chooses the blocks, FFN, heads and hidden widths to cut, by measurement (each "
        "kind alone, then the mixes predicted best; the one of least loss on calibration text "
        "it never ran is written). --multiple-of, --reconstruct and the calibration options "
        "apply to every cut.",
        metavar="F|N",
        parse=parse_params,
    )
    candidates: int = option(
        3,
        "--candidates",
        "--params: how many mixes, of those predicted best, are made and measured beside each "
        "kind of cut alone.",
        metavar="N",
        parse=check_count,
    )
    reconstruct: bool = option(  # least-squares refits
        True,
        "--reconstruct/--no-reconstruct",
        "--ffn/--heads: refit the projection that reads the kept channels or heads (the "
        "FFN's down projection, attention's output projection) by least squares on the "
        "calibration activations, block after block on what the shrunk blocks before feed it; "
        "--hidden: refit what reads each RMS norm (q/k/v, gate/up) to the kept channels as the "
        "narrower norm gives them; "
        "--blocks: replace each removed run by a least-squares linear map folded into the down "
        "projection of the block before it (ReplaceMe). --no-reconstruct writes the plain "
        "slices and removals.",
    )
    merge: bool = option(
        False,
        "--merge",
        "Fold each removed expert into the kept expert of most similar output (a "
        "routed-frequency-weighted average of their weights) instead of dropping it.",
    )
    calibration: str | Path | None = option(  # a TextSource once reading
        None,
        "--calibration",
        "UTF-8 text (a file, or every file under a directory), or records (.jsonl, "
        ".parquet, .arrow: see --text-field), the model is scored on.",
        metavar="FILE|DIR",
    )
    text_field: str = option(DEFAULT_FIELD, "--text-field", TEXT_FIELD_HELP, metavar="NAME")
    samples: int = option(
        DEFAULT_SAMPLES, "--samples", "Calibration windows.", metavar="N", parse=check_count
    )
    seq: int | None = option(  # None: DEFAULT_SEQ, or the model's context when that is shorter
        None,
        "--seq",
        f"Tokens per calibration window. Default: {DEFAULT_SEQ}, or the model's context if "
        "shorter.",
        metavar="T",
        parse=check_count,
        minimum=2,
    )
    seed: int = option(
        0,
        "--seed",
        "Seed of the windows picked from the text and of --criterion random.",
        parse=check_seed,
    )
    dtype: str = option(
        "float32", "--dtype", "Precision of the forward passes (the statistics stay float64)."
    )
    device: str = option(
        "auto",
        "--device",
        "Where the blocks run: auto (a GPU if there is one), cpu, cuda or cuda:N.",
        parse=check_device,
    )
    # the CLI's shared --max-memory (cli/_params.py) says what it does; here in bytes
    max_memory: int | None = option(None, "--max-memory", metavar="SIZE", parse=parse_size)

    @classmethod
    def from_values(cls, **values: Any) -> ShrinkOptions:
        """The options from values in the forms the Python API and the command line take them:
        a choice as its name or an ``Enum`` of it, ``calibration`` a path, ``max_memory`` bytes or
        ``"12G"``. Not yet checked: :meth:`validate` does that."""
        v = cls.given(values)
        if v.get("calibration") is not None:
            v["calibration"] = Path(v["calibration"])
        if v.get("params") is not None:  # "0.75", "100M" or a number
            v["params"] = parse_params(v["params"])
        if v.get("max_memory") is not None:  # "12G", or bytes (checked as --max-memory is)
            v["max_memory"] = parse_size(v["max_memory"])
        return cls(**v)

    @property
    def reads_text(self) -> bool:
        """Whether the calibration text runs through the model (blocks, and every expert
        criterion but random without --merge)."""
        return self.removes != "experts" or self.criterion != "random" or self.merge

    @property
    def removes(self) -> str:
        """What is removed: ``experts``, ``blocks``, ``widths`` (FFN channels, heads, embedding
        channels), ``blocks and widths`` (the blocks first) or ``params`` (chosen for a size)."""
        if self.params is not None:
            return "params"
        if self.blocks is not None:
            return "blocks and widths" if self.widths else "blocks"
        if self.widths:
            return "widths"
        return "experts"

    @property
    def asked(self) -> str:
        """The options that say what is removed, as typed (``--ffn 0.75 --hidden 0.75``)."""
        flags = {"experts": self.experts, "experts-keep": self.experts_keep}
        if self.removes == "params":
            return f"--params {self.params:g}"
        if self.removes != "experts":
            flags = {"blocks": self.blocks, "ffn": self.ffn, "heads": self.heads}
            flags["hidden"] = self.hidden
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
        asked = [x is not None for x in (self.experts, self.experts_keep, self.params)]
        asked.append(self.blocks is not None or widths)  # these combine: blocks first
        if sum(asked) != 1:
            raise ConfigError(
                "say what to remove, one of: --experts F (the fraction of each layer's routed "
                "experts), --experts-keep N (the experts each layer keeps), --params F|N (a size, "
                "the cuts chosen for it), or --blocks N (whole blocks; a fraction below 1 of "
                "them) and/or --ffn F / --heads F / --hidden F (the fraction of FFN channels / "
                "attention heads / embedding channels kept)"
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
        if self.params is not None:
            parse_params(self.params)
            if self.merge:
                raise ConfigError("--merge merges experts; it does not go with --params")
        check_count(self.candidates, "--candidates")
        if self.criterion not in CRITERIA:
            raise ConfigError(f"--criterion {self.criterion!r}: use {', '.join(CRITERIA)}")
        check_count(self.multiple_of, "--multiple-of")
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
        _check_text(self)

    def record(self) -> dict[str, Any]:
        """The options as provenance and ``--json`` record them (the text only when read)."""
        return _record(self)


def _check_text(opts: ShrinkOptions) -> None:
    """A usage error when the run reads calibration text and none was given."""
    if opts.reads_text and opts.calibration is None:
        if opts.params is not None:
            raise ConfigError(
                "--params measures each cut on calibration text: give --calibration FILE|DIR"
            )
        if opts.blocks is not None:
            raise ConfigError(
                f"--blocks scores the blocks ({opts.block_criterion}) on calibration text: "
                "give --calibration FILE|DIR"
            )
        if opts.widths:
            raise ConfigError(
                "--ffn, --heads and --hidden rank channels and heads by their "
                "activations on calibration text: give --calibration FILE|DIR"
            )
        why = (
            "--merge compares experts' outputs"
            if opts.merge
            else f"--criterion {opts.criterion} scores experts"
        )
        raise ConfigError(
            f"{why} on calibration text: give --calibration FILE|DIR "
            "(or --criterion random, which needs none)"
        )


def _record(opts: ShrinkOptions) -> dict[str, Any]:
    """:meth:`ShrinkOptions.record`."""
    rec = asdict(opts)
    rec["calibration"] = str(opts.calibration) if opts.calibration is not None else None
    if opts.calibration is None or (
        opts.text_field == DEFAULT_FIELD and not is_records(opts.calibration)
    ):
        del rec["text_field"]
    digest = getattr(opts.calibration, "digest", None)
    if digest:  # the text as read: the SHA-256 of its UTF-8
        rec["calibration_sha256"] = digest
    for k in ("experts", "experts_keep", "criterion", "merge"):
        if opts.removes != "experts":
            del rec[k]
    if opts.blocks is None:
        del rec["blocks"]
        if opts.params is None:  # --params may remove blocks
            del rec["block_criterion"]
    for k in ("ffn", "heads", "hidden"):
        if not opts.widths:
            del rec[k]
    if not opts.widths and opts.params is None:
        del rec["multiple_of"]
    for k in ("params", "candidates"):
        if opts.params is None:
            del rec[k]
    if opts.ffn is None and opts.heads is None and opts.blocks is None and not opts.params:
        del rec["reconstruct"]  # a cut FFN or attention is refit, removed blocks mapped
    if not opts.reads_text:
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
