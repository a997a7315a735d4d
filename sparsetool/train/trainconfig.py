"""Every option of a training run, and how a YAML/TOML config file and CLI flags combine.

Precedence: built-in defaults < config file < flags given on the command line. A config file
holds the same keys as :class:`TrainConfig`, which are the flag names (dashes or underscores;
``stage``, ``sparsity_option`` and ``output`` as well as ``stages``, ``sparsity_options`` and
``out``; sections ``model``, ``optimizer``, ``data``, ``train`` and ``run`` are flattened) plus an
optional Cerebras Model Zoo style ``sparsity:`` block::

    sparsity:
      algorithm: rigl
      sparsity: 0.75
      init_method: random                         # Model Zoo's topk is our magnitude
      param_filter: ["*attn*", "*mlp*"]
      update: {freq: 100, start: 0, stop: 750}    # Model Zoo 2.x also writes this as "schedule"
      drop_fraction: {type: cosine, init: 0.3, half_period: 750}

Every value, from a file, a flag or the Python API, is checked against the type of its
:class:`TrainConfig` field in one place, :mod:`sparsetool.train.configkeys` (which also reads
config files and merges them with flags): a bool is not a number, 3.7 is not a step count, and
text is a number only where a flag would read it as one (YAML reads ``1e-3`` as text; ``--lr
1e-3`` is 0.001, and so is the file's).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from sparsetool.checkpoint.codecs import DEFAULT_ENCODING, ENCODINGS
from sparsetool.checkpoint.config import read_model_config
from sparsetool.errors import ConfigError
from sparsetool.util import options

ALGORITHMS = ("dense", "static", "gmp", "set", "rigl", "granet", "imp")
STRATEGIES = ("ddp", "fsdp")  # --distributed
INIT_METHODS = ("random", "magnitude")
DEFAULT_PRESET = "mini"  # the model of a run without --preset or --init

FILE_ONLY = (
    "dropout",
    "min_lr_ratio",
    "beta1",
    "beta2",
    "eps",
    "eval_sequences",
    "keep_last",
    "log_every",
)
"""Settings a ``--config`` file (or the Python API) gives that have no command-line flag."""

FLAGS = {"stages": "--stage", "sparsity_options": "--sparsity-option", "out": "--output"}
"""Settings whose flag is not ``--`` + the key with dashes."""

KEY_ALIASES = {"stage": "stages", "sparsity_option": "sparsity_options", "output": "out"}
"""Other spellings a config file may use for a key: each flag's own name."""

COMMAND_LINE_ONLY = ("config", "resume", "quiet", "json", "help")
"""Flags of ``train`` that are not settings of the run (a config file cannot give them)."""

VALUE_ALIASES = {"init_method": {"topk": "magnitude"}}
"""Cerebras Model Zoo names of values that mean exactly ours (its ``topk`` init keeps each
tensor's largest-magnitude weights, as ``magnitude`` does)."""


def setting(key: str) -> str:
    """How a message names setting ``key``: its flag, or the file key when it has no flag.

    >>> setting("batch_size"), setting("keep_last"), setting("stages")
    ('--batch-size', "'keep_last' (config file)", '--stage')
    """
    if key in FILE_ONLY:
        return f"'{key}' (config file)"
    return FLAGS.get(key, f"--{key.replace('_', '-')}")


SECTIONS = ("model", "optimizer", "data", "train", "run")
SECTION_EXAMPLE = {
    "model": "preset: tiny",
    "optimizer": "lr: 0.001",
    "data": "data: corpus.txt",
    "train": "steps: 1000",
    "run": "device: cpu",
}


@dataclass
class TrainConfig:
    out: str = "runs/train"
    # model: a preset, optionally with individual sizes overridden
    preset: str | None = None  # None: DEFAULT_PRESET, or with init the checkpoint's shape
    n_layer: int | None = None
    n_head: int | None = None
    d_model: int | None = None
    context: int | None = None
    dropout: float = 0.0
    # optimisation (AdamW; betas and weight decay as the Cerebras sparsity-library post)
    steps: int = 1000
    batch_size: int = 16  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step per process
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to 10% of peak (SPDF paper, Appendix A.1)
    warmup: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global norm; 0 disables
    seed: int = 0
    data: str | None = None  # None: the built-in Python standard-library corpus
    # sparsity
    algorithm: str | None = None  # None: static if a sparsity is given, dense otherwise
    sparsity: Any = None  # float, or a schedule mapping passed to the sparsifier
    distribution: str | None = None
    init_method: str | None = None
    update_freq: int | None = None
    update_start: int | None = None
    update_stop: int | None = None
    drop_fraction: Any = None
    initial_sparsity: float | None = None  # GraNet/GMP: the sparsity the ramp starts from
    param_filter: list[str] | None = None  # globs over parameter names; default: block matrices
    # globs as prune's --include/--exclude (sparsetool.targets.plan_targets): add to / remove from
    # the targeted matrices; exclude wins, and a glob that matches no parameter is an error
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    sparsity_options: dict = field(default_factory=dict)  # passed through to the sparsifier
    # workflows
    init: str | None = None  # start from this checkpoint (its masks unless --dense)
    dense: bool = False  # with init: revive every pruned weight at 0 and train densely (SPDF)
    stages: list[tuple[float, float]] = field(default_factory=list)  # (sparsity, fraction)
    encoding: str = DEFAULT_ENCODING  # how RUN/model/ of a --init HF_DIR run stores pruned weights
    # knowledge distillation (train/distill.py): a Hugging Face teacher with the student's tokenizer
    distill_from: str | None = None
    distill_temperature: float = 1.0  # T: both distributions at softmax(logits / T); loss x T^2
    distill_alpha: float = 1.0  # weight of the distillation loss; 1 - alpha: the next-token loss
    # bookkeeping
    eval_every: int = 100
    eval_sequences: int = 64
    save_every: int = 0  # 0: only at the end (and at --stop-at)
    keep_last: int = 2
    log_every: int = 1
    stop_at: int | None = None  # stop (with a checkpoint) after this many steps; resume later
    device: str = "auto"
    threads: int | None = (
        None  # CPU threads for torch; None: sparsetool.util.threads decides (the command line)
    )
    dtype: str = "auto"  # auto: bf16 autocast on a GPU that has it, float32 otherwise
    distributed: str = "ddp"  # under torchrun: ddp (a whole copy per rank) or fsdp (sharded, FSDP2)
    offload: bool = False  # fsdp on a GPU: parameter slices, gradients and AdamW in CPU memory

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["stages"] = [list(s) for s in self.stages]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in known})
        # the JSON's [sparsity, fraction] lists become pairs again
        cfg.stages = cast("list[tuple[float, float]]", [tuple(s) for s in cfg.stages])
        cfg.include, cfg.exclude = _globs("include", cfg.include), _globs("exclude", cfg.exclude)
        return cfg


FIELDS = tuple(f.name for f in dataclasses.fields(TrainConfig))
DEFAULTS = {
    f.name: f.default
    for f in dataclasses.fields(TrainConfig)
    if f.default is not dataclasses.MISSING
}


PRETRAINED_DEFAULTS = {"lr": 2e-4, "batch_size": 4}
"""The defaults of a run whose ``--init`` is a Hugging Face directory (a pretrained student,
fine-tuned or distilled), where a setting was given neither as a flag nor in the config file:
the built-in GPT's ``lr`` 1e-3 and ``batch_size`` 16 suit training from random weights, not a
pretrained model on a CPU (``--context`` already defaults to 256 tokens there)."""
PRETRAINED_WARMUP = 0.1
"""With ``--init HF_DIR`` and no ``--warmup``: this fraction of ``--steps`` (rounded down), not the
built-in GPT's 100 steps, which would be a short heal's whole run."""
PASSES_NOTE = 4.0
"""A run that reads its training text more than this many times over gets a note saying so."""


def is_pretrained(init: Any) -> bool:
    """Whether ``--init`` names a Hugging Face directory (a ``config.json`` of another model than
    sparsetool's GPT), read without torch; :func:`sparsetool.train.hfrun.is_hf_dir` decides
    the same for the run."""
    if init is None or not Path(init).is_dir():
        return False
    config = read_model_config(init)
    return config is not None and config.get("model_type") != "sparsetool-gpt"


def pretrained_defaults(given: dict[str, Any]) -> dict[str, Any]:
    """The settings :data:`PRETRAINED_DEFAULTS` and :data:`PRETRAINED_WARMUP` add to ``given``
    (the values of the config file and the flags, by key) when its ``init`` is a Hugging Face
    directory: only those it does not hold; nothing for the built-in GPT.

    >>> pretrained_defaults({"init": None})
    {}
    """
    if not is_pretrained(given.get("init")):
        return {}
    out = {k: v for k, v in PRETRAINED_DEFAULTS.items() if k not in given}
    if "warmup" not in given:
        out["warmup"] = int(int(given.get("steps", DEFAULTS["steps"])) * PRETRAINED_WARMUP)
    return out


def passes_note(steps: int, per_step: int, train_size: int, unit: str = "tokens") -> str | None:
    """One sentence when ``steps`` of ``per_step`` tokens (the built-in GPT: bytes) read the
    ``train_size`` of the training text more than :data:`PASSES_NOTE` times over (a small text is
    learnt by heart long before the end), else None.

    >>> passes_note(30, 4 * 256, 40_000) is None
    True
    >>> passes_note(2000, 16 * 256, 40_000)[:68]
    '2000 steps of 4,096 tokens read the 40,000 training tokens about 205'
    """
    if train_size <= 0:
        return None
    passes = steps * per_step / train_size
    if passes <= PASSES_NOTE:
        return None
    return (
        f"{steps} steps of {per_step:,} {unit} read the {train_size:,} training {unit} about "
        f"{passes:,.0f} times over; a model learns such a text by heart long before the end "
        "(fewer --steps, or more --data)"
    )


def _globs(option: str, value: Any) -> tuple[str, ...]:
    """A glob or a list of globs (JSON and config files give lists) -> tuple."""
    return options.parse_globs(value, f"--{option}")


# Options that may differ when a run is resumed; any other change would break exact resumption.
RESUMABLE_OVERRIDES = {
    "stop_at",
    "save_every",
    "eval_every",
    "keep_last",
    "log_every",
    "device",
    "threads",
}
# May differ on a resume when the global batch (--batch-size x --grad-accum x processes) stays
# the same: an FSDP run continues on another number of processes (runstate.restore checks it).
REBATCHABLE = {"batch_size", "grad_accum"}


def validate(cfg: TrainConfig) -> TrainConfig:
    from sparsetool.models.gpt import PRESETS

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise ConfigError(msg)

    if cfg.preset is None and cfg.init is None:
        cfg.preset = DEFAULT_PRESET  # with --init the checkpoint has the shape
    need(
        cfg.preset is None or cfg.preset in PRESETS,
        f"unknown --preset {cfg.preset!r}; choose one of {', '.join(PRESETS)}",
    )
    for name in ("steps", "batch_size", "grad_accum", "eval_sequences", "log_every"):
        need(int(getattr(cfg, name)) >= 1, f"{setting(name)} must be >= 1")
    for name in ("warmup", "eval_every", "save_every", "keep_last"):
        need(int(getattr(cfg, name)) >= 0, f"{setting(name)} must be >= 0")
    need(cfg.lr > 0, f"--lr must be > 0, got {cfg.lr}")
    need(0 <= cfg.min_lr_ratio <= 1, f"{setting('min_lr_ratio')} must be in [0, 1]")
    need(cfg.weight_decay >= 0, "--weight-decay must be >= 0")
    need(cfg.grad_clip >= 0, "--grad-clip must be >= 0 (0 disables clipping)")
    need(0 <= cfg.dropout < 1, f"{setting('dropout')} must be in [0, 1)")
    for name in ("beta1", "beta2"):
        need(0 <= getattr(cfg, name) < 1, f"{setting(name)} must be in [0, 1) (an AdamW beta)")
    need(cfg.eps > 0, f"{setting('eps')} must be > 0")
    need(
        cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"),
        f"--device {cfg.device!r}: use cpu, cuda or auto",
    )
    need(cfg.dtype in ("auto", "float32", "bfloat16"), "--dtype must be auto, float32 or bfloat16")
    need(cfg.distributed in STRATEGIES, f"--distributed {cfg.distributed!r}: choose ddp or fsdp")
    need(
        not cfg.offload or cfg.distributed == "fsdp",
        "--offload moves FSDP's shards to CPU memory; add --distributed fsdp",
    )
    need(
        not cfg.offload or cfg.device.startswith("cuda"),
        "--offload keeps a GPU run's shards in CPU memory; it needs --device cuda (a CPU run "
        "holds them there already)",
    )
    if cfg.algorithm is not None:
        cfg.algorithm = str(cfg.algorithm).lower()
        need(
            cfg.algorithm in ALGORITHMS,
            f"unknown --algorithm {cfg.algorithm!r}; choose one of {', '.join(ALGORITHMS)}",
        )
    if cfg.distribution is not None:
        from sparsetool.masks.distributions import DISTRIBUTIONS

        need(
            cfg.distribution in DISTRIBUTIONS,
            f"--distribution {cfg.distribution!r}: choose one of {', '.join(DISTRIBUTIONS)}",
        )
    if isinstance(cfg.sparsity, (int, float)) and not isinstance(cfg.sparsity, bool):
        cfg.sparsity = options.check_sparsity(cfg.sparsity)
    if cfg.initial_sparsity is not None:
        cfg.initial_sparsity = options.check_sparsity(cfg.initial_sparsity, "--initial-sparsity")
    cfg.seed = options.check_seed(cfg.seed)
    if cfg.stages:
        need(cfg.init is None or not cfg.dense, "--stage and --dense cannot be combined")
        cfg.stages = [options.parse_stage(f"{s}:{f}") for s, f in cfg.stages]
        total = sum(f for _, f in cfg.stages)
        need(
            abs(total - 1.0) < 1e-6,
            f"--stage fractions must add up to 1 (they add up to {total:g}), e.g. "
            "--stage 0.9:0.8 --stage 0:0.2",
        )
        need(cfg.sparsity is None, "give either --sparsity or --stage, not both")
    if cfg.dense:
        need(cfg.init is not None, "--dense needs --init CHECKPOINT (it densifies that checkpoint)")
        need(
            cfg.algorithm in (None, "dense") and cfg.sparsity is None,
            "--dense trains every weight; drop --algorithm/--sparsity",
        )
    if cfg.algorithm == "dense":
        need(
            cfg.sparsity in (None, 0, 0.0) and not cfg.stages,
            "--algorithm dense takes no --sparsity or --stage",
        )
    if cfg.algorithm not in (None, "dense") and cfg.sparsity is None and not cfg.stages:
        need(
            cfg.init is not None or "sparsity" in cfg.sparsity_options,
            f"--algorithm {cfg.algorithm} needs --sparsity (e.g. --sparsity 0.75)",
        )
    need(
        cfg.distill_temperature > 0,
        f"--distill-temperature must be > 0, got {cfg.distill_temperature}",
    )
    need(
        0 <= cfg.distill_alpha <= 1,
        f"--distill-alpha must be in [0, 1] (the distillation loss's weight), got "
        f"{cfg.distill_alpha}",
    )
    need(
        cfg.distill_from is None or cfg.init is not None,
        "--distill-from TEACHER trains a student: give it with --init STUDENT_DIR (a Hugging "
        "Face directory with the teacher's tokenizer)",
    )
    need(
        cfg.encoding in ENCODINGS,
        f"--encoding {cfg.encoding!r}: choose one of {', '.join(ENCODINGS)}",
    )
    if cfg.threads is not None:
        need(int(cfg.threads) >= 1, "--threads must be >= 1")
    if cfg.stop_at is not None:
        need(1 <= cfg.stop_at <= cfg.steps, f"--stop-at must be in [1, --steps={cfg.steps}]")
    json.dumps(cfg.to_dict())  # the run directory stores it; fail now rather than mid-run
    return cfg


def caveats(cfg: TrainConfig) -> list[str]:
    """What ``cfg`` asks for that is legal but probably not meant, one sentence each with the
    reason (``train`` prints each as a ``warning:`` line and runs; what cannot be run as asked is
    an error instead).

    >>> caveats(TrainConfig(steps=300, warmup=400))
    ['--warmup 400 >= --steps 300: the whole run is warm-up, so the learning rate ends at 75% of
    --lr and never decays; give a --warmup below --steps']
    """
    out = []
    if cfg.warmup >= cfg.steps:
        end = (
            "reaches --lr only at the last step"
            if cfg.warmup == cfg.steps
            else f"ends at {math.floor(100 * cfg.steps / cfg.warmup)}% of --lr"
        )
        out.append(
            f"--warmup {cfg.warmup} >= --steps {cfg.steps}: the whole run is warm-up, so the "
            f"learning rate {end} and never decays; give a --warmup below --steps"
        )
    return out
