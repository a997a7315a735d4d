"""What ``sparsetool prune`` is asked (:class:`PruneOptions`, with its checks) and what it
answers (:class:`PruneResult`, whose ``to_json()`` is ``prune --json``).

:class:`PruneOptions` is the one declaration of prune's options: each field holds its default and,
in its metadata, how it shows on the command line (an :class:`~sparsetool.util.faces.OptionFace`:
the flag, its help, the metavar and the parse ``sparsetool prune`` runs while reading the command
line). The CLI and ``sparsetool.prune`` take their defaults from here (:meth:`PruneOptions.face`);
``tests/ops/test_option_defaults.py`` checks the three agree."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.codecs import ENCODINGS
from sparsetool.checkpoint.output_files import Reclaimed
from sparsetool.errors import ConfigError
from sparsetool.masks.calibration_defaults import (
    DSNOT_ITERATIONS,
    DSNOT_THRESHOLD,
    EXPERT_MIN_TOKENS,
    OWL_LAMBDA,
    OWL_M,
)
from sparsetool.masks.distributions import DISTRIBUTIONS
from sparsetool.ops.calibration import (
    DEFAULT_SAMPLES,
    DEFAULT_SEQ,
    TEXT_FIELD_HELP,
    check_text_field,
)
from sparsetool.ops.text import DEFAULT_FIELD, TextSource, is_records
from sparsetool.util.faces import OptionsRecord, option
from sparsetool.util.options import (
    ALLOCATIONS,
    CALIBRATION_METHODS,
    COMPUTE_DTYPES,
    METHODS,
    REFINEMENTS,
    SCOPES,
    check_count,
    check_dampening,
    check_device,
    check_fraction,
    check_owl_lambda,
    check_owl_m,
    check_seed,
    check_sparsity,
    check_threshold,
    parse_fraction,
    parse_globs,
    parse_nm,
    parse_size,
    parse_sparsity,
)

__all__ = [
    "PruneOptions",
    "TensorResult",
    "PruneResult",
    "options_record",
]


@dataclass(frozen=True)
class PruneOptions(OptionsRecord):
    """What ``prune`` does; exactly one of ``sparsity``, ``fraction``, ``nm`` sets how much."""

    command = "prune"

    sparsity: float | None = option(
        None,
        "--sparsity",
        "Fraction of zeros wanted in each targeted tensor, from 0 to 1.",
        metavar="S",
        parse=parse_sparsity,
    )
    fraction: float | None = option(
        None,
        "--fraction",
        "Prune this fraction of the REMAINING non-zeros, at least 0 and below 1 (one "
        "iterative-pruning step).",
        metavar="F",
        parse=parse_fraction,
    )
    nm: tuple[int, int] | None = option(
        None,
        "--nm",
        "Structured N:M: keep N of every M consecutive weights along the input dimension, "
        "e.g. 2:4.",
        metavar="N:M",
        parse=parse_nm,
    )
    method: str = option(
        "magnitude",
        "--method",
        "magnitude (keep the largest |w|), random, or with --calibration: wanda (|w| times the "
        "input's norm, per output row) or sparsegpt (OBS reconstruction; updates the kept "
        "weights).",
    )
    scope: str = option(
        "layer",
        "--scope",
        "layer: the same sparsity in every tensor; global: one magnitude threshold across all "
        "targeted tensors.",
    )
    distribution: str = option(
        "uniform",
        "--distribution",
        "uniform or erk (Erdos-Renyi-Kernel per-tensor sparsities, same total non-zeros).",
    )
    seed: int = option(0, "--seed", "Seed for --method random.", parse=check_seed)
    encoding: str = option(
        "zeros",
        "--encoding",
        "How pruned weights are stored: zeros, mask (bool <name>_mask tensors), nan (NaN "
        "sentinels), bitmask (compressed-tensors sparse-bitmask).",
    )
    # the CLI's shared --include/--exclude (cli/_params.py) say what they do
    include: tuple[str, ...] = option((), "--include", metavar="GLOB", parse=parse_globs)
    exclude: tuple[str, ...] = option((), "--exclude", metavar="GLOB", parse=parse_globs)
    # --method wanda/sparsegpt (calibrated.py): the text, how much of it, SparseGPT's knobs
    calibration: str | None = option(
        None,
        "--calibration",
        "UTF-8 text (a file, or every file under a directory), or records (.jsonl, .parquet, "
        ".arrow: see --text-field), run through the model by --method wanda/sparsegpt.",
        metavar="FILE|DIR",
    )
    text_field: str = option(
        DEFAULT_FIELD,
        "--text-field",
        TEXT_FIELD_HELP,
        metavar="NAME",
    )
    samples: int = option(
        DEFAULT_SAMPLES,
        "--samples",
        "Calibration windows (wanda/sparsegpt).",
        metavar="N",
        parse=check_count,
    )
    seq: int | None = option(  # None: DEFAULT_SEQ, or the model's context when that is shorter
        None,
        "--seq",
        f"Tokens per calibration window (wanda/sparsegpt). Default: {DEFAULT_SEQ}, or the "
        "model's context if shorter.",
        metavar="T",
        parse=check_count,
        minimum=2,
    )
    dampening: float = option(
        0.01,
        "--dampening",
        "sparsegpt: add D x the mean diagonal of X^T X to its diagonal.",
        metavar="D",
        parse=check_dampening,
    )
    blocksize: int = option(
        128,
        "--blocksize",
        "sparsegpt: columns per block (lazy updates, one mask choice per block).",
        metavar="B",
        parse=check_count,
    )
    # beyond one sparsity everywhere (with calibration text; magnitude too): OWL's per-block
    # sparsities (masks/owl.py), DSnoT's refinement of each mask (masks/dsnot.py)
    allocation: str = option(
        "uniform",
        "--allocation",
        "How --sparsity is spread over the transformer blocks: uniform, or owl (each block's "
        "sparsity follows its share of outlier Wanda scores, spread over 2 x --owl-lambda around "
        "the target; the total stays exact). Needs --calibration; works with magnitude, wanda "
        "and sparsegpt.",
    )
    owl_m: float = option(
        OWL_M,
        "--owl-m",
        "owl: a score above M times its block's mean is an outlier.",
        metavar="M",
        parse=check_owl_m,
    )
    owl_lambda: float = option(
        OWL_LAMBDA,
        "--owl-lambda",
        "owl: the most and the least pruned block lie 2 x L apart (the paper: 'target +- L').",
        metavar="L",
        parse=check_owl_lambda,
    )
    refine: str = option(
        "none",
        "--refine",
        "dsnot: after the mask is chosen, swap pruned and kept weights row by row while that "
        "lowers the row's expected output error (no training; exact counts). Needs "
        "--calibration; works with magnitude, wanda and sparsegpt.",
    )
    dsnot_iterations: int = option(
        DSNOT_ITERATIONS,
        "--dsnot-iterations",
        "dsnot: at most T swaps per row.",
        metavar="T",
        parse=check_count,
        minimum=0,
    )
    dsnot_threshold: float = option(
        DSNOT_THRESHOLD,
        "--dsnot-threshold",
        "dsnot: a row stops once its expected error (its output summed over a window) is at "
        "most E.",
        metavar="E",
        parse=check_threshold,
    )
    # Mixture of Experts: fewer calibration tokens routed to an expert than this -> magnitude
    expert_min_tokens: int = option(
        EXPERT_MIN_TOKENS,
        "--expert-min-tokens",
        "wanda/sparsegpt on a Mixture of Experts: each expert's matrices are pruned from the "
        "tokens routed to it; one routed fewer than N calibration tokens is pruned by magnitude "
        "instead (counted in the output).",
        metavar="N",
        parse=check_count,
        minimum=0,
    )
    # how the model runs (not recorded: the masks do not depend on them but for --dtype)
    device: str = option(
        "auto",
        "--device",
        "wanda/sparsegpt: where the blocks run: auto (a GPU if there is one), cpu, cuda or cuda:N.",
        parse=check_device,
    )
    dtype: str = option(
        "float32",
        "--dtype",
        "wanda/sparsegpt: precision of the forward passes; statistics and the SparseGPT solve "
        "stay float32.",
    )
    # the CLI's shared --max-memory (cli/_params.py) says what it does
    max_memory: int | None = option(None, "--max-memory", metavar="SIZE", parse=parse_size)

    @classmethod
    def from_values(cls, **values: Any) -> PruneOptions:
        """The options from values in the forms the Python API and the command line take them:
        a choice as its name or an ``Enum`` of it, ``nm`` as ``"2:4"`` or ``(2, 4)``,
        ``include``/``exclude`` one glob or several, ``calibration`` a path, ``max_memory`` bytes
        or ``"12G"``. Not yet checked: :meth:`validate` does that (``prune_checkpoint`` calls
        it)."""
        v = cls.given(values)
        if isinstance(v.get("nm"), str):
            v["nm"] = parse_nm(v["nm"])
        elif v.get("nm") is not None:
            v["nm"] = tuple(v["nm"])
        for key in ("include", "exclude"):
            if key in v:
                v[key] = parse_globs(v[key], f"--{key}")
        if v.get("calibration") is not None:
            v["calibration"] = str(v["calibration"])
        if v.get("max_memory") is not None:  # "12G", or bytes (checked as --max-memory is)
            v["max_memory"] = parse_size(v["max_memory"])
        return cls(**v)

    def reading(self, checkpoint: str | Path) -> PruneOptions:
        """The options with ``calibration`` a :class:`~sparsetool.ops.text.TextSource`: its records'
        ``text_field``, and ``checkpoint``'s chat template for chat messages."""
        if self.calibration is None:
            return self
        return replace(self, calibration=TextSource(self.calibration, self.text_field, checkpoint))

    @property
    def calibrated(self) -> bool:
        """Whether the run takes the model block by block with calibration text: Wanda and
        SparseGPT always, magnitude with OWL's allocation or DSnoT's refinement."""
        return self.method in CALIBRATION_METHODS or (
            self.method == "magnitude" and (self.allocation != "uniform" or self.refine != "none")
        )

    def validate(self) -> None:
        given = [
            o
            for o, v in (
                ("--sparsity", self.sparsity),
                ("--fraction", self.fraction),
                ("--nm", self.nm),
            )
            if v is not None
        ]
        if len(given) != 1:
            raise ConfigError(
                "give exactly one of --sparsity S, --fraction F or --nm N:M "
                f"(got {', '.join(given) if given else 'none'})"
            )
        if self.sparsity is not None:
            check_sparsity(self.sparsity)
        if self.fraction is not None:
            check_fraction(self.fraction)
        check_seed(self.seed)
        for opt, value, allowed in (
            ("--method", self.method, METHODS),
            ("--scope", self.scope, SCOPES),
            ("--distribution", self.distribution, DISTRIBUTIONS),
            ("--encoding", self.encoding, ENCODINGS),
            ("--allocation", self.allocation, ALLOCATIONS),
            ("--refine", self.refine, REFINEMENTS),
        ):
            if value not in allowed:
                raise ConfigError(f"{opt} {value!r} is not one of: {', '.join(allowed)}")
        self._validate_beyond_uniform()
        self._validate_calibration()
        if self.scope == "global" and self.method != "magnitude":
            raise ConfigError("--scope global ranks weights by magnitude: use --method magnitude")
        if self.scope == "global" and self.distribution != "uniform":
            raise ConfigError(
                "--scope global sets each tensor's sparsity itself: "
                "drop --distribution erk or use --scope layer"
            )
        if self.nm is not None:
            n, m = self.nm
            if not (0 < n <= m):
                raise ConfigError(f"--nm {n}:{m}: need 0 < N <= M (keep N of every M weights)")
            if self.scope == "global" or self.distribution != "uniform":
                raise ConfigError(
                    "--nm N:M is a per-tensor pattern: it takes neither "
                    "--scope global nor --distribution erk"
                )
            if self.method == "random":
                raise ConfigError(
                    "--nm N:M keeps the largest N of every M: use --method "
                    "magnitude, wanda or sparsegpt"
                )
        if self.fraction is not None and self.distribution != "uniform":
            raise ConfigError(
                "--fraction prunes a share of each tensor's remaining weights: "
                "it takes no --distribution"
            )

    def _validate_beyond_uniform(self) -> None:
        defaults = PruneOptions()
        owl, dsnot = self.allocation == "owl", self.refine == "dsnot"
        for attr, needs, on in (
            ("owl_m", "--allocation owl", owl),
            ("owl_lambda", "--allocation owl", owl),
            ("dsnot_iterations", "--refine dsnot", dsnot),
            ("dsnot_threshold", "--refine dsnot", dsnot),
        ):
            opt = self.face(attr)[1].flag
            if getattr(self, attr) != getattr(defaults, attr) and not on:
                raise ConfigError(f"{opt} is read by {needs} only: add {needs} or drop {opt}")
        check_owl_m(self.owl_m)
        check_owl_lambda(self.owl_lambda)
        check_count(self.dsnot_iterations, "--dsnot-iterations", minimum=0)
        check_threshold(self.dsnot_threshold)
        check_count(self.expert_min_tokens, "--expert-min-tokens", minimum=0)
        asked = [
            o
            for o, on in (
                (f"--allocation {self.allocation}", self.allocation != "uniform"),
                (f"--refine {self.refine}", self.refine != "none"),
            )
            if on
        ]
        if not asked:
            return
        if self.method not in ("magnitude",) + CALIBRATION_METHODS:
            raise ConfigError(
                f"{asked[0]} works on magnitude, wanda or sparsegpt masks, not "
                f"--method {self.method}"
            )
        if self.sparsity is None:
            raise ConfigError(
                f"{asked[0]} takes --sparsity S (unstructured sparsity; N:M and "
                "--fraction keep their own fixed counts)"
            )
        if self.allocation != "uniform" and (
            self.distribution != "uniform" or self.scope != "layer"
        ):
            raise ConfigError(
                "--allocation owl sets each block's sparsity itself: it takes "
                "neither --distribution erk nor --scope global"
            )
        if self.refine != "none" and self.scope != "layer":
            raise ConfigError(
                "--refine dsnot refines each layer's mask: it takes no --scope global"
            )
        if self.calibration is None:
            raise ConfigError(
                f"{asked[0]} needs calibration text: give --calibration FILE|DIR "
                "(UTF-8 text the model's tokenizer reads)"
            )

    def _validate_calibration(self) -> None:
        defaults = PruneOptions()
        changed = [
            self.face(name)[1].flag
            for name in (
                "calibration",
                "text_field",
                "samples",
                "seq",
                "dampening",
                "blocksize",
                "device",
                "dtype",
                "max_memory",
            )
            if getattr(self, name) != getattr(defaults, name)
        ]
        if not self.calibrated:
            if changed:
                extra = (
                    " (or, for magnitude, with --allocation owl or --refine dsnot)"
                    if self.method == "magnitude"
                    else ""
                )
                raise ConfigError(
                    f"{changed[0]} is read by --method wanda or sparsegpt{extra}, not "
                    f"{self.method} alone: drop it or change the method"
                )
            return
        sgpt_only = [opt for opt in changed if opt in ("--dampening", "--blocksize")]
        if self.method != "sparsegpt" and sgpt_only:
            raise ConfigError(
                f"{sgpt_only[0]} is read by --method sparsegpt only; "
                f"{self.method.capitalize()} changes no weight and has no Hessian: drop it"
            )
        if self.calibration is None:
            raise ConfigError(
                f"--method {self.method} needs calibration text: give "
                "--calibration FILE|DIR (UTF-8 text the model's tokenizer reads)"
            )
        check_text_field(self.text_field, self.calibration)
        if self.scope == "global":
            raise ConfigError(
                f"--method {self.method} prunes each layer against its own "
                "calibration inputs (layer-wise): it takes no --scope global; use "
                "--scope layer, or --method magnitude for one global threshold"
            )
        if self.fraction is not None and self.method in CALIBRATION_METHODS:
            raise ConfigError(
                f"--method {self.method} takes --sparsity S or --nm N:M, not --fraction"
            )
        check_count(self.samples, "--samples")
        if self.seq is not None:
            check_count(self.seq, "--seq", minimum=2)
        check_device(self.device)
        if self.dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"--dtype {self.dtype!r} is not one of: {', '.join(COMPUTE_DTYPES)}")
        check_dampening(self.dampening)
        check_count(self.blocksize, "--blocksize")
        if (
            self.nm is not None
            and self.method == "sparsegpt"
            and self.nm[1] > 0
            and self.blocksize % self.nm[1]
        ):
            raise ConfigError(
                f"--blocksize {self.blocksize} must be a multiple of M in --nm "
                f"{self.nm[0]}:{self.nm[1]} (each N:M group lies inside one block)"
            )


@dataclass
class TensorResult:
    name: str
    shape: tuple[int, ...]
    numel: int
    nonzero_before: int
    nonzero: int

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nonzero / self.numel if self.numel else 0.0


@dataclass
class PruneResult:
    output: Path
    options: PruneOptions
    tensors: list[TensorResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what will not load the output correctly
    notes: list[str] = field(default_factory=list)  # e.g. tensors left alone for their dtype
    left_out: list[str] = field(default_factory=list)  # input entries not part of a model directory
    memory: dict | None = None  # calibration methods: the memory plan (util/memory.py), in bytes
    allocation: list[dict] | None = None  # --allocation owl: per block, outlier ratio and sparsity
    refined: dict | None = None  # --refine dsnot: its settings and the swaps made
    experts: dict | None = None  # a Mixture of Experts: tokens routed to each expert's matrices
    reclaimed: list[Reclaimed] = field(default_factory=list)  # stale temporaries removed
    # an output directory no model loader reads (no config.json): why, and what to do
    not_a_model: str | None = None

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)

    @property
    def nonzero(self) -> int:
        return sum(t.nonzero for t in self.tensors)

    @property
    def targeted_sparsity(self) -> float:
        return 1.0 - self.nonzero / self.numel if self.numel else 0.0

    def to_json(self) -> dict:
        return {
            "output": str(self.output),
            "options": options_record(self.options, self.allocation, self.experts is not None),
            "tensors": [
                {
                    "name": t.name,
                    "shape": list(t.shape),
                    "numel": t.numel,
                    "nonzero_before": t.nonzero_before,
                    "nonzero": t.nonzero,
                    "sparsity": t.sparsity,
                }
                for t in self.tensors
            ],
            "summary": {
                "targeted_tensors": len(self.tensors),
                "targeted_numel": self.numel,
                "targeted_nonzero": self.nonzero,
                "targeted_sparsity": self.targeted_sparsity,
            },
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "left_out": list(self.left_out),
            **({"memory": self.memory} if self.memory is not None else {}),
            **({"refined": self.refined} if self.refined is not None else {}),
            **({"experts": self.experts} if self.experts is not None else {}),
        }


_CALIBRATION_FIELDS = ("calibration", "samples", "seq", "dtype", "dampening", "blocksize")


def options_record(
    opts: PruneOptions, allocation: list[dict] | None = None, experts: bool = False
) -> dict:
    """The options as recorded in provenance and ``--json``; calibration settings only for the
    methods that read them (SparseGPT's with ``updates_weights``: it changes the kept weights);
    OWL's settings with each block's plan (``allocation``), DSnoT's settings; with ``experts``
    (a mixture of experts' matrices pruned from calibration statistics) ``--expert-min-tokens``."""
    rec = asdict(opts)
    rec["nm"] = f"{opts.nm[0]}:{opts.nm[1]}" if opts.nm else None
    rec["include"], rec["exclude"] = list(opts.include), list(opts.exclude)
    del rec["device"], rec["max_memory"]
    calib = {k: rec.pop(k) for k in _CALIBRATION_FIELDS if k != "calibration"}
    del rec["calibration"]
    calib["text"] = None if opts.calibration is None else str(opts.calibration)
    text_field = rec.pop("text_field")
    if opts.calibration is not None and (is_records(opts.calibration) or text_field != "text"):
        calib["text_field"] = text_field
    digest = getattr(opts.calibration, "digest", None)
    if digest:  # the text as read: the SHA-256 of its UTF-8
        calib["sha256"] = digest
    del rec["allocation"], rec["refine"]  # recorded below as what was done, when it was asked
    owl = {k: rec.pop(k) for k in ("owl_m", "owl_lambda")}
    dsnot = {k.removeprefix("dsnot_"): rec.pop(k) for k in ("dsnot_iterations", "dsnot_threshold")}
    min_tokens = rec.pop("expert_min_tokens")
    if experts and opts.method in CALIBRATION_METHODS:
        calib["expert_min_tokens"] = min_tokens
    if opts.calibrated:
        if opts.method != "sparsegpt":
            del calib["dampening"], calib["blocksize"]
        rec["calibration"] = calib
        rec["updates_weights"] = opts.method == "sparsegpt"
    if opts.allocation == "owl":
        rec["allocation"] = {
            "method": "owl",
            "m": owl["owl_m"],
            "lambda": owl["owl_lambda"],
            "blocks": list(allocation or []),
        }
    if opts.refine == "dsnot":
        rec["refine"] = {"method": "dsnot", **dsnot}
    return rec
