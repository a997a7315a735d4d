"""`sparsetool train`: the built-in byte-level GPT trainer with sparse-training algorithms."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sparsetool.cli._params import (
    ENCODING_NAMES,
    TRAIN_PRESETS,
    checked,
    choice_option,
    choices,
    exclude_option,
    include_option,
    json_option,
    output_option,
    quiet_option,
    seed_option,
    sparsity_option,
    stage_option,
    threads_option,
    usage_error,
    usage_errors,
    use_threads,
    value_of,
)
from sparsetool.masks.distributions import DISTRIBUTIONS
from sparsetool.train.trainconfig import ALGORITHMS, STRATEGIES, setting
from sparsetool.util import options
from sparsetool.util.wording import plural

if TYPE_CHECKING:
    from sparsetool.train.trainconfig import TrainConfig

EXAMPLES = (  # the end of --help: each runs as written (given the directories and text named;
    # the built-in GPT's corpus is Python's own source)
    "sparsetool train -o runs/rigl --steps 500 --algorithm rigl --sparsity 0.75",
    "sparsetool train -o runs/llama-ft --init llama/ --data text.txt --steps 100",
    "sparsetool train -o runs/heal --init llama-minus-4/ --distill-from llama/ --data text.txt "
    "--steps 30",
)

Preset = choices("Preset", TRAIN_PRESETS)
Algorithm = choices("Algorithm", ALGORITHMS)
Distribution = choices("Distribution", DISTRIBUTIONS)
InitMethod = choices("InitMethod", ("random", "magnitude"))
DType = choices("DType", ("auto", "float32", "bfloat16"))
Strategy = choices("Strategy", STRATEGIES)
Encoding = choices("Encoding", ENCODING_NAMES)


OPTION: dict[str, Any] = {
    "output": output_option(
        "Run directory to create, or to continue with --resume; required (unless the --config "
        "file gives 'out'). Holds checkpoints, logs, loss.png."
    ),
    "out": typer.Option(None, "--out", hidden=True, help="Old spelling of -o/--output."),
    "config": typer.Option(
        None,
        "--config",
        help="YAML/TOML file whose keys are these options' names (batch-size or batch_size; "
        "flags override); accepts a Model Zoo 'sparsity:' block (default: none).",
    ),
    "resume": typer.Option(
        False,
        "--resume",
        help="Continue the run in -o/--output from its latest checkpoint, exactly.",
    ),
    "preset": choice_option(
        Preset,
        None,
        "--preset",
        help="Model size: tiny, mini (default, 0.9M), small (4.9M), base (10M); with --init, the "
        "checkpoint's shape (a preset must agree with it).",
    ),
    "n_layer": typer.Option(
        None, "--n-layer", help="Override the preset's layer count (default: the preset's)."
    ),
    "n_head": typer.Option(
        None, "--n-head", help="Override the preset's head count (default: the preset's)."
    ),
    "d_model": typer.Option(
        None, "--d-model", help="Override the preset's width (default: the preset's)."
    ),
    "context": typer.Option(
        None,
        "--context",
        help="Override the preset's context: bytes per sequence (default: the preset's; with "
        "--init HF_DIR tokens, default 256).",
    ),
    "steps": typer.Option(None, "--steps", help="Optimizer steps (default 1000)."),
    "batch_size": typer.Option(
        None,
        "--batch-size",
        help="Sequences per micro-batch per process (default 16; with --init HF_DIR 4).",
    ),
    "grad_accum": typer.Option(
        None, "--grad-accum", help="Micro-batches per step per process (default 1)."
    ),
    "lr": typer.Option(
        None, "--lr", help="Peak learning rate (default 1e-3; with --init HF_DIR 2e-4)."
    ),
    "warmup": typer.Option(
        None,
        "--warmup",
        help="Linear warm-up steps (default 100; with --init HF_DIR 10% of --steps), then "
        "cosine to 10%; a warning if that is the whole run (>= --steps).",
    ),
    "weight_decay": typer.Option(
        None, "--weight-decay", help="AdamW decay of linear matrices (default 0.1)."
    ),
    "grad_clip": typer.Option(
        None, "--grad-clip", help="Global gradient-norm clip (default 1.0; 0 = off)."
    ),
    "seed": seed_option("Seed for weights, masks and data order (default 0).", default=None),
    "data": typer.Option(
        None,
        "--data",
        metavar="PATH",
        help="UTF-8 text file or directory (files that are not text are skipped), or "
        "builtin:english (Python's help topics). Default: the Python standard library.",
    ),
    "algorithm": choice_option(
        Algorithm,
        None,
        "--algorithm",
        "-a",
        help="Sparse training algorithm (default: static with --sparsity, else dense).",
    ),
    "sparsity": sparsity_option(
        "Target sparsity (fraction of zeros, from 0 to 1) of the targeted matrices (default: "
        "none, dense; with --init, the checkpoint's)."
    ),
    "distribution": choice_option(
        Distribution, None, "--distribution", help="Per-layer sparsity (default uniform)."
    ),
    "init_method": choice_option(
        InitMethod, None, "--init-method", help="Initial mask (default random)."
    ),
    "update_freq": typer.Option(
        None,
        "--update-freq",
        help="Steps between mask updates of gmp, set, rigl, granet (default 100; a quarter of "
        "--steps under 400 steps).",
    ),
    "update_start": typer.Option(
        None,
        "--update-start",
        help="First mask update / pruning step (default: the end of --warmup or one interval, "
        "whichever is later; one interval if that leaves no update).",
    ),
    "update_stop": typer.Option(
        None,
        "--update-stop",
        help="Mask updates stop before this step; gmp/granet's ramp ends here (default: 75% of "
        "--steps; set: all of them; granet keeps regrowing to the end).",
    ),
    "drop_fraction": typer.Option(
        None,
        "--drop-fraction",
        help="Fraction of each tensor's kept weights dropped and regrown per update (default "
        "0.3; rigl: cosine-decayed to 0 at the update stop, granet: at the end of the "
        "run).",
    ),
    "initial_sparsity": typer.Option(
        None,
        "--initial-sparsity",
        metavar="S",
        callback=checked(options.parse_sparsity),
        help="GraNet/GMP: sparsity the cubic ramp starts from, e.g. 0.5 for 50%->75% (default 0: "
        "dense start).",
    ),
    "sparsity_option": typer.Option(
        [],
        "--sparsity-option",
        metavar="KEY=VALUE",
        help="KEY=VALUE passed to the algorithm (repeatable; default: none), e.g. scope=layer "
        "(granet's per-layer pruning), stop_fraction=0.75 (set stops at 75%).",
    ),
    "include": include_option(
        "Also sparsify parameters matching this glob (repeatable; default: none)."
    ),
    "exclude": exclude_option(
        "Never sparsify parameters matching this glob (repeatable; wins over --include; default: "
        "none)."
    ),
    "param_filter": typer.Option(
        [],
        "--param-filter",
        metavar="GLOB",
        help="Glob of parameter names to sparsify (repeatable; default: the block matrices).",
    ),
    "init": typer.Option(
        None,
        "--init",
        help="Start from this checkpoint (any sparsetool encoding) or a Hugging Face causal-LM "
        "directory (fine-tuned with its own tokenizer); keeps its masks (default: random "
        "initial weights).",
    ),
    "encoding": choice_option(
        Encoding,
        None,
        "--encoding",
        help="With --init HF_DIR: how RUN/model/ stores pruned weights (default zeros, which "
        "transformers loads; mask, nan, bitmask).",
    ),
    "dense": typer.Option(
        False,
        "--dense",
        help="With --init: revive pruned weights at 0 and train densely (SPDF fine-tuning).",
    ),
    "distill_from": typer.Option(
        None,
        "--distill-from",
        metavar="TEACHER_DIR",
        help="With --init STUDENT_DIR: learn this Hugging Face model's next-token distribution "
        "(KL divergence; same tokenizer required). The teacher runs forward only, frozen.",
    ),
    "distill_temperature": typer.Option(
        None,
        "--distill-temperature",
        metavar="T",
        help="Softmax temperature of both distributions (default 1; the loss is scaled by T^2).",
    ),
    "distill_alpha": typer.Option(
        None,
        "--distill-alpha",
        metavar="A",
        help="Weight of the distillation loss; 1 - A goes to the next-token loss (default 1).",
    ),
    "stage": stage_option(
        "SPARSITY:FRACTION of the steps (repeatable): Variable SPDF, e.g. 0.9:0.8 then 0:0.2 "
        "(default: one stage)."
    ),
    "eval_every": typer.Option(
        None, "--eval-every", help="Validation every N steps (default 100) and at the end."
    ),
    "save_every": typer.Option(
        None, "--save-every", help="Checkpoint every N steps (default: only at the end)."
    ),
    "stop_at": typer.Option(
        None,
        "--stop-at",
        help="Stop after this step with a checkpoint; continue later with --resume (default: run "
        "all --steps).",
    ),
    "threads": threads_option(),
    "device": typer.Option(
        None,
        "--device",
        metavar="<auto|cpu|cuda|cuda:N>",
        callback=checked(options.check_device),
        help="Where to train (default auto).",
    ),
    "dtype": choice_option(
        DType,
        None,
        "--dtype",
        help="auto (default: bf16 autocast on capable GPUs), float32 or bfloat16 (with "
        "--distributed fsdp: bf16 parameters, float32 gradient reduction).",
    ),
    "distributed": choice_option(
        Strategy,
        None,
        "--distributed",
        help="Under torchrun: ddp (default; a whole model, its gradients and AdamW on every "
        "process) or fsdp (each process holds 1/N of them, masks too).",
    ),
    "offload": typer.Option(
        False,
        "--offload",
        help="With --distributed fsdp on GPUs: keep parameter shards, gradients and AdamW in CPU "
        "memory.",
    ),
    "quiet": quiet_option(),
    "as_json": json_option("Print the final summary as JSON (no progress bar)."),
}
"""Each option of the command, made once, in --help's order."""


def train(
    output: Path | None = OPTION["output"],
    out: Path | None = OPTION["out"],
    config: Path | None = OPTION["config"],
    resume: bool = OPTION["resume"],
    preset: Preset | None = OPTION["preset"],
    n_layer: int | None = OPTION["n_layer"],
    n_head: int | None = OPTION["n_head"],
    d_model: int | None = OPTION["d_model"],
    context: int | None = OPTION["context"],
    steps: int | None = OPTION["steps"],
    batch_size: int | None = OPTION["batch_size"],
    grad_accum: int | None = OPTION["grad_accum"],
    lr: float | None = OPTION["lr"],
    warmup: int | None = OPTION["warmup"],
    weight_decay: float | None = OPTION["weight_decay"],
    grad_clip: float | None = OPTION["grad_clip"],
    seed: int | None = OPTION["seed"],
    data: str | None = OPTION["data"],
    algorithm: Algorithm | None = OPTION["algorithm"],
    sparsity: str | None = OPTION["sparsity"],
    distribution: Distribution | None = OPTION["distribution"],
    init_method: InitMethod | None = OPTION["init_method"],
    update_freq: int | None = OPTION["update_freq"],
    update_start: int | None = OPTION["update_start"],
    update_stop: int | None = OPTION["update_stop"],
    drop_fraction: float | None = OPTION["drop_fraction"],
    initial_sparsity: str | None = OPTION["initial_sparsity"],
    sparsity_option: list[str] = OPTION["sparsity_option"],
    include: list[str] = OPTION["include"],
    exclude: list[str] = OPTION["exclude"],
    param_filter: list[str] = OPTION["param_filter"],
    init: Path | None = OPTION["init"],
    encoding: Encoding | None = OPTION["encoding"],
    dense: bool = OPTION["dense"],
    distill_from: Path | None = OPTION["distill_from"],
    distill_temperature: float | None = OPTION["distill_temperature"],
    distill_alpha: float | None = OPTION["distill_alpha"],
    stage: list[str] = OPTION["stage"],
    eval_every: int | None = OPTION["eval_every"],
    save_every: int | None = OPTION["save_every"],
    stop_at: int | None = OPTION["stop_at"],
    threads: int | None = OPTION["threads"],
    device: str | None = OPTION["device"],
    dtype: DType | None = OPTION["dtype"],
    distributed: Strategy | None = OPTION["distributed"],
    offload: bool = OPTION["offload"],
    quiet: bool = OPTION["quiet"],
    as_json: bool = OPTION["as_json"],
) -> None:
    """Train the built-in byte-level GPT or fine-tune a Hugging Face model, dense or sparse.

    Writes checkpoints (safetensors, mask encoding), a JSONL/CSV log and loss.png into the run
    directory -o/--output. Without --data the corpus is the Python standard library's own source.
    --init HF_DIR fine-tunes a Hugging Face causal LM with its own tokenizer instead and writes
    RUN/model/, a Hugging Face directory (--encoding); --distill-from TEACHER_DIR trains it on
    a teacher's next-token distribution (a shrunk or pruned model healed by its dense parent).
    The defaults below are the built-in GPT's, trained from random weights; with --init HF_DIR
    (a pretrained model) --lr, --batch-size and --warmup default to 2e-4, 4 and 10% of --steps,
    --context to 256 tokens, and the run says which of them it took.

    SPDF: sparse pre-training, then dense fine-tuning (--init CHECKPOINT --dense; revived weights
    start at 0). Variable SPDF: --stage SPARSITY:FRACTION, repeated. --resume continues an
    interrupted run exactly; under torchrun (python -m sparsetool train ...) it runs on several
    processes.

    Mask-update defaults for a run of N steps: every 100 steps (N/4 when N < 400), the first at
    the end of --warmup or after one interval, whichever is later, the last before 0.75 N (set:
    N; granet: the ramp ends at 0.75 N, drop-and-grow goes on to N). E.g. 600 steps with the
    default 100-step warm-up: rigl updates at steps 100, 200, 300 and 400. The start of a run
    prints the resolved values; run.json records them.
    """
    from sparsetool.cli._output import failing_cleanly, note_reclaimed

    output = _run_dir(output, out)
    with failing_cleanly():
        cfg, flags, applied, caveat_lines = _settings(locals(), output)
        # a run's recorded --threads (resume, --config) is applied by the trainer
        use_threads(threads)
        summary = _run(cfg, resume, flags, _printer(caveat_lines, applied, as_json, quiet))
        note_reclaimed(summary.reclaimed)
        if summary["interrupted"]:
            from sparsetool.train.signals import signal_number

            raise typer.Exit(128 + signal_number(summary["interrupted"]))


def _run_dir(output: Path | None, out: Path | None) -> Path | None:
    """The run directory: -o/--output, or --out (its old spelling); both only if the same."""
    if out is None:
        return output
    if output is not None and output != out:
        usage_error("give the run directory once: -o/--output (--out is its old spelling)")
    return out


def _settings(
    given: dict[str, Any], output: Path | None
) -> tuple[TrainConfig, dict, dict[str, Any], list[str]]:
    """The run's settings from the --config file and the flags (``given``, the command's
    parameters): its TrainConfig, the flags by TrainConfig's names, the pretrained student's
    defaults it took, and the caveats to print when it starts. Refuses (exit 2) a missing run
    directory and options that do not fit together; --resume takes the run's recorded
    settings (the flags given override them in the trainer)."""
    from sparsetool.train.configkeys import (
        merge_explained,
        parse_sparsity_options,
        read_config_file,
    )
    from sparsetool.train.trainconfig import caveats

    file_values = read_config_file(given["config"]) if given["config"] else {}
    with usage_errors():
        sparsity_options = parse_sparsity_options(given["sparsity_option"])
    flags = _flags(given, output, sparsity_options)
    if "out" not in file_values and output is None:
        usage_error("give -o/--output RUN_DIR: a run directory to create or resume is required")
    if given["resume"]:
        from sparsetool.train.trainconfig import TrainConfig

        return TrainConfig(out=str(output) if output else file_values["out"]), flags, {}, []
    with usage_errors():  # options that do not fit together: exit 2, as a bad value
        cfg, applied = merge_explained(file_values, flags)
    # legal, but probably not what was meant: said when the run starts, after every check
    # that can refuse it (--init, the run directory, memory, disk), never before an error
    return cfg, flags, applied, caveats(cfg)


def _printer(
    caveat_lines: list[str], applied: dict[str, Any], as_json: bool, quiet: bool
) -> Callable[[str, dict], None]:
    """The run's callback, printing what rank 0 prints: at the start the warnings (the
    configuration's caveats, the --data files skipped, the trainer's) and notes, then the
    progress (:class:`_Progress`; --json and --quiet: only the summary at the end)."""
    from rich.markup import escape

    from sparsetool.cli._output import console

    progress = _Progress(console, escape, "json" if as_json else "quiet" if quiet else None)

    def callback(kind: str, info: dict) -> None:
        if kind == "start" and _is_master():
            for text in caveat_lines + _data_caveats(info["data"]) + info["warnings"]:
                _warn(text)
            info = {**info, "notes": [*info.get("notes", []), *_start_notes(info, applied)]}
        progress(kind, info)

    return callback


def _run(cfg: TrainConfig, resume: bool, flags: dict, callback: Callable[[str, dict], None]) -> Any:
    """The training run (the trainer's summary); with --resume the flags given override the
    run's recorded settings."""
    from sparsetool.train.loop import train as run_training

    overrides = {k: v for k, v in flags.items() if v is not None} if resume else None
    # Ctrl-C / SIGTERM: the step in progress ends, is saved, and the run stops (exit 130/143).
    # Everything rank 0 prints is printed from the callback, before the run returns.
    return run_training(
        cfg, resume=resume, callback=callback, flag_overrides=overrides, stop_on_signal=True
    )


_AS_GIVEN = (
    "n_layer",
    "n_head",
    "d_model",
    "context",
    "steps",
    "batch_size",
    "grad_accum",
    "lr",
    "warmup",
    "weight_decay",
    "grad_clip",
    "seed",
    "data",
    "sparsity",
    "update_freq",
    "update_start",
    "update_stop",
    "drop_fraction",
    "initial_sparsity",
    "eval_every",
    "save_every",
    "stop_at",
    "device",
    "threads",
    "distill_temperature",
    "distill_alpha",
)
_CHOICES = (
    "preset",
    "algorithm",
    "distribution",
    "init_method",
    "encoding",
    "dtype",
    "distributed",
)


def _flags(given: dict, output: Path | None, sparsity_options: dict) -> dict:
    """The command line's settings by TrainConfig's names, None where a flag was not given (a
    --config file's value or the default stands then)."""
    flags = {name: given[name] for name in _AS_GIVEN}
    flags.update({name: value_of(given[name]) for name in _CHOICES})
    flags.update(
        {
            "out": str(output) if output else None,
            "init": str(given["init"]) if given["init"] else None,
            "distill_from": str(given["distill_from"]) if given["distill_from"] else None,
            "param_filter": list(given["param_filter"]) or None,
            "include": tuple(given["include"]) or None,
            "exclude": tuple(given["exclude"]) or None,
            "dense": given["dense"] or None,
            "offload": given["offload"] or None,
            "stages": list(given["stage"]),
            "sparsity_options": sparsity_options,
        }
    )
    return flags


def _start_notes(info: dict, applied: dict[str, Any]) -> list[str]:
    """The ``note:`` lines a run starts with: the defaults of a pretrained student it took
    (``--init HF_DIR``), and how many times over its steps read the training text when that is
    many."""
    from sparsetool.train.trainconfig import DEFAULTS, PRETRAINED_WARMUP, passes_note

    out = []
    if applied:
        shown = [
            f"{setting(k)} {v:g}"
            + (f" ({PRETRAINED_WARMUP:.0%} of --steps)" if k == "warmup" else "")
            for k, v in applied.items()
        ]
        builtin = ", ".join(f"{setting(k)} {DEFAULTS[k]:g}" for k in applied)
        out.append(
            f"--init HF_DIR (a pretrained model): {', '.join(shown)} by default; the built-in "
            f"GPT's ({builtin}) suit random weights"
        )
    data = info["data"]
    unit = "tokens" if "train_tokens" in data else "bytes"
    passes = passes_note(info["steps"], info["tokens_per_step"], data.get(f"train_{unit}", 0), unit)
    return out if passes is None else [*out, passes]


def _warn(text: str) -> None:
    """A ``warning:`` line on stderr, printed even with --quiet and --json: the run goes on, but
    probably not as meant."""
    from sparsetool.cli._output import warn

    if _is_master():
        warn(text)


def _data_caveats(data: dict) -> list[str]:
    """Files of a --data directory that were left out because they are not text."""
    skipped = data.get("skipped_files") or 0
    if not skipped:
        return []
    shown = list(data.get("skipped_examples", []))
    more = f" and {skipped - len(shown):,} more" if skipped > len(shown) else ""
    kept = data.get("train_files", 0) + data.get("val_files", 0)
    return [
        f"--data '{data['source']}': skipped {plural(skipped, 'file')} that "
        f"{'is' if skipped == 1 else 'are'} not UTF-8 text ({', '.join(shown)}{more}); "
        f"training on the other {kept:,}"
    ]


def _is_master() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"


class _Progress:
    """Rich progress bar with loss and tokens/s, or plain progress lines on stderr when stdout is
    not a terminal (:class:`~sparsetool.util.progress.ProgressLines`); one summary table at the end
    (rank 0 only).

    ``only_end`` "json" or "quiet": nothing while training (but the line a signal prints), then the
    summary as JSON or as the table."""

    def __init__(self, console, escape, only_end: str | None = None) -> None:
        self.console = console
        self.escape = escape
        self.only_end = only_end
        self.bar = None
        self.task = None
        self.lines: Any = None  # a log's progress lines (stdout not a terminal)
        self.stop = 0
        self.master = _is_master()

    def __call__(self, kind: str, info: dict) -> None:
        if not self.master or (self.only_end and kind not in ("signal", "end")):
            return
        getattr(self, "_" + kind)(info)

    def _start(self, info: dict) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        m, per = info["model"], "tokens" if "model_type" in info["model"] else "bytes"
        sp = f", sparsity {info['sparsity']:.1%}" if info["sparsity"] else ""
        self.console.print(
            f"{m.get('model_type', 'GPT')} {m['n_layer']}L d{m['d_model']} h{m['n_head']} ctx "
            f"{m['context']}: "
            f"{plural(info['params'], 'parameter')}{sp}; "
            f"{plural(info['world_size'], 'process', 'processes')}"
            f"{' (' + info['distributed'] + ')' if info.get('distributed') else ''}, global batch "
            f"{info['global_batch']} x {m['context']} {per}; {info['device']} {info['precision']}",
            highlight=False,
            soft_wrap=True,
        )
        if (info.get("distributed") or "model_type" in m) and info.get("memory_plan"):
            # a Hugging Face model or several processes: the figures that decide what fits
            self.console.print(info["memory_plan"], highlight=False, soft_wrap=True)
        for note in info.get("notes", []):
            from sparsetool.cli._output import log_line

            log_line(f"note: {note}")
        if info.get("disk_plan"):
            self.console.print(self.escape(info["disk_plan"]), highlight=False, soft_wrap=True)
        d, unit = info["data"], "tokens" if "train_tokens" in info["data"] else "bytes"
        self.console.print(
            f"data: {self.escape(d['source'])} ({d['train_' + unit]:,} train / "
            f"{d['val_' + unit]:,} validation {unit})",
            highlight=False,
            soft_wrap=True,
        )
        if info.get("sparse_training"):
            from sparsetool.train.algorithms.settings import describe

            for line in describe(info["sparse_training"]):
                self.console.print(self.escape(line), highlight=False, soft_wrap=True)
        if info.get("distillation"):  # the teacher, T and alpha
            self.console.print(self.escape(info["distillation"]), highlight=False, soft_wrap=True)
        if not self.console.is_terminal:
            # piped: no bar (its one final line would be cut to the width) but plain progress
            # lines on stderr, throttled as every command's; the summary follows
            from sparsetool.cli._output import log_line, progress_interval
            from sparsetool.util.progress import ProgressLines

            self.lines = ProgressLines(log_line, progress_interval())
            self.stop = info["stop"]
            return
        self.bar = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "loss {task.fields[loss]}  val {task.fields[val]}  sparsity {task.fields[sp]}"
                "  {task.fields[tps]} tok/s"
            ),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.bar.start()
        self.task = self.bar.add_task(
            "train",
            total=info["stop"],
            completed=info["start_step"],
            loss="-",
            val="-",
            sp="-",
            tps="-",
        )

    def _step(self, r: dict) -> None:
        if self.lines is not None:
            self.lines("train", r["step"], self.stop, f"loss {r['loss']:.4f}")
        if self.bar is None:
            return
        self.bar.update(
            self.task,
            completed=r["step"],
            loss=f"{r['loss']:.4f}",
            sp=f"{r['sparsity']:.1%}",
            tps=f"{r['tokens_per_s']:,.0f}",
        )

    def _eval(self, r: dict) -> None:
        if self.bar is None:
            return
        self.bar.update(self.task, val=f"{r['val_loss']:.4f}")

    def _signal(self, r: dict) -> None:
        """The line the first SIGINT/SIGTERM prints at once (the step may take a while), or,
        with ``error``, the error line of a second one that ends the process during a step.

        Called from the signal handler or the thread that counts signals: written straight to
        the file descriptor, not through a stream whose write the signal may have interrupted;
        under a progress bar, on a line of its own below the bar's."""
        import contextlib
        import os

        lead = "\n" if self.bar is not None else ""
        again = "Ctrl-C again" if r["signal"] == "SIGINT" else "a second signal"
        text = (
            f"error: {r['error']}"
            if r.get("error")
            else f"{r['signal']}: finishing the step in progress and saving a checkpoint "
            f"({again} stops at once, without it)"
        )
        with contextlib.suppress(OSError):  # stderr closed: the run still stops as asked
            os.write(2, f"{lead}{text}\n".encode())

    def _stage(self, r: dict) -> None:
        self.console.print(
            f"step {r['step']}: stage {r['stage']}, sparsity now {r['sparsity']:.1%}",
            highlight=False,
            soft_wrap=True,
        )

    def _end(self, s: dict) -> None:
        if self.bar is not None:
            self.bar.stop()
        if self.only_end == "json":
            from sparsetool.cli._output import emit_json

            emit_json(s)
        else:
            self._summary(s)
        if s["interrupted"]:
            from sparsetool.cli._output import err_console
            from sparsetool.train.runstate import stopped_by_signal

            err_console.print(self.escape(stopped_by_signal(s)), highlight=False, soft_wrap=True)

    def _summary(self, s: dict) -> None:
        from sparsetool.cli._output import print_table

        val = "-" if s["val_loss"] is None else f"{s['val_loss']:.4f}"
        rows = [
            (
                "steps",
                f"{s['step']} / {s['steps']}"
                + ("" if s["finished"] else " (stopped; --resume continues)"),
            ),
            ("train loss", f"{s['loss']:.4f}"),
            ("validation loss", val),
            ("sparsity", f"{s['sparsity']:.1%}"),
            ("tokens", f"{s['tokens']:,}"),
            ("throughput", f"{s['tokens_per_s']:,.0f} tokens/s" if s["tokens_per_s"] else "-"),
            (
                "model" if s.get("huggingface") else "checkpoint",
                s["checkpoint"] + (" (Hugging Face directory)" if s.get("huggingface") else ""),
            ),
            ("log", s["log"]),
            ("loss curve", s["plot"] or "none (matplotlib is not installed)"),
        ]
        print_table(None, rows, align="ll")
