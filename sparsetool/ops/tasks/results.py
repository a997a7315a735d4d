"""What ``eval --tasks`` answers: a :class:`TaskRow` per checkpoint in a :class:`TasksResult`
(``to_json()`` is ``--json``), the metrics a table shows of a task (:func:`shown_metrics`,
:func:`mean_metric`), and each checkpoint's paired comparison with the first over the
documents (:func:`compare_rows`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sparsetool.ops.tasks.data import TaskSource

__all__ = [
    "TaskRow",
    "TasksResult",
    "SHOWN",
    "compare_rows",
    "group_items",
    "mean_metric",
    "metric_key",
    "shown_metrics",
    "shown_name",
    "shown_tasks",
]


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


def shown_tasks(
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
