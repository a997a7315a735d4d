"""The Python API: the CLI's checkpoint commands as functions, with the CLI's parameter names.

>>> import sparsetool
>>> sorted(n for n in sparsetool.__all__ if not n.startswith("_"))
['convert', 'densify', 'diff', 'load', 'prune', 'report', 'shrink', 'simulate']
>>> sparsetool.eval.__name__
'eval'

``eval`` is named after the command but left out of ``__all__``: ``from sparsetool import *``
must not replace Python's builtin ``eval`` in the importing module. Call it as ``sparsetool.eval``.

An option's error names the argument as the caller gave it, where the CLI names its flag:

>>> sparsetool.prune("model.safetensors", "out.safetensors", sparsity=1.5)
Traceback (most recent call last):
...
sparsetool.errors.ConfigError: sparsity=1.5: must be a number from 0 to 1 (the fraction of weights
set to zero)
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # torch stays unimported until a function is called
    from sparsetool.hardware.result import SimulationResult
    from sparsetool.ops.convert import ConvertResult
    from sparsetool.ops.densify import DensifyResult
    from sparsetool.ops.diff import DiffResult
    from sparsetool.ops.eval import EvalResult
    from sparsetool.ops.gguf_export import ExportResult
    from sparsetool.ops.prune import PruneResult
    from sparsetool.ops.report import Report
    from sparsetool.ops.shrink import ShrinkResult
    from sparsetool.ops.tasks import TasksResult

from sparsetool.ops.eval_options import EvalOptions, TasksOptions
from sparsetool.ops.load import load
from sparsetool.ops.prune.options import PruneOptions
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.util.options import named_as_given, parse_globs

__all__ = [
    "load",
    "prune",
    "shrink",
    "convert",
    "densify",
    "report",
    "diff",
    "simulate",
]  # and eval: not exported by *, see above

F = TypeVar("F", bound=Callable[..., Any])


def _as_given(function: F) -> F:
    """``function`` with its option errors worded in its own parameters' terms
    (:func:`sparsetool.util.options.named_as_given`): ``sparsity=1.5: must be ...`` where the
    CLI says ``--sparsity must be ...``."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return function(*args, **kwargs)  # Python's own error for a wrong call
        bound.apply_defaults()
        with named_as_given(bound.arguments):
            return function(*args, **kwargs)

    return call  # type: ignore[return-value]


_PRUNE = PruneOptions.defaults()  # prune's defaults, declared once with the options (no torch)


@_as_given
def prune(
    checkpoint: str | Path,
    output: str | Path | None = None,
    *,
    sparsity: float | None = _PRUNE["sparsity"],
    fraction: float | None = _PRUNE["fraction"],
    nm: str | tuple[int, int] | None = _PRUNE["nm"],
    method: str = _PRUNE["method"],
    scope: str = _PRUNE["scope"],
    distribution: str = _PRUNE["distribution"],
    seed: int = _PRUNE["seed"],
    encoding: str = _PRUNE["encoding"],
    include: Sequence[str] = _PRUNE["include"],
    exclude: Sequence[str] = _PRUNE["exclude"],
    in_place: bool = False,
    calibration: str | Path | None = _PRUNE["calibration"],
    text_field: str = _PRUNE["text_field"],
    samples: int = _PRUNE["samples"],
    seq: int | None = _PRUNE["seq"],
    dampening: float = _PRUNE["dampening"],
    blocksize: int = _PRUNE["blocksize"],
    allocation: str = _PRUNE["allocation"],
    owl_m: float = _PRUNE["owl_m"],
    owl_lambda: float = _PRUNE["owl_lambda"],
    refine: str = _PRUNE["refine"],
    dsnot_iterations: int = _PRUNE["dsnot_iterations"],
    dsnot_threshold: float = _PRUNE["dsnot_threshold"],
    expert_min_tokens: int = _PRUNE["expert_min_tokens"],
    device: str = _PRUNE["device"],
    dtype: str = _PRUNE["dtype"],
    max_memory: int | str | None = _PRUNE["max_memory"],
) -> PruneResult:
    """``sparsetool prune CHECKPOINT -o OUTPUT ...``: exactly one of ``sparsity``, ``fraction``,
    ``nm`` (``"2:4"`` or ``(2, 4)``, N kept of every M). ``output=None`` needs ``in_place=True``.
    ``method="wanda"`` or ``"sparsegpt"`` runs the ``calibration`` text (a file or directory)
    through the model block by block (``samples`` windows of ``seq`` tokens, default 512 or the
    model's context if shorter) on ``device`` in ``dtype``, within ``max_memory`` (bytes or
    ``"12G"``; default: what is available). ``allocation="owl"`` spreads ``sparsity`` over the
    blocks by their outlier ratios (``owl_m``, ``owl_lambda``), ``refine="dsnot"`` refines each
    mask (``dsnot_iterations``, ``dsnot_threshold``); both need ``calibration`` and work with
    magnitude, wanda and sparsegpt. In a Mixture of Experts, an expert routed fewer than
    ``expert_min_tokens`` calibration tokens is pruned by magnitude (``result.experts``). Each
    default is :class:`~sparsetool.ops.prune.options.PruneOptions`' own. ``calibration`` records
    (``.jsonl``, ``.parquet``, ``.arrow``) give each one's ``text_field`` (chat messages go
    through the model's chat template). Raises
    :class:`sparsetool.errors.SparsetoolError` on bad input; nothing is written then."""
    from sparsetool.ops.prune.pipeline import prune_checkpoint

    opts = PruneOptions.from_values(**PruneOptions.pick(locals()))  # the CLI's construction too
    if output is None and not in_place:
        from sparsetool.errors import ConfigError

        raise ConfigError("give an output path (or in_place=True to replace the input)")
    return prune_checkpoint(
        checkpoint, checkpoint if output is None else output, opts, in_place=in_place
    )


_SHRINK = ShrinkOptions()  # shrink's defaults, declared once with its options (no torch)


@_as_given
def shrink(
    checkpoint: str | Path,
    output: str | Path,
    *,
    experts: float | None = _SHRINK.experts,
    experts_keep: int | None = _SHRINK.experts_keep,
    criterion: str = _SHRINK.criterion,
    blocks: float | None = _SHRINK.blocks,
    block_criterion: str = _SHRINK.block_criterion,
    ffn: float | None = _SHRINK.ffn,
    heads: float | None = _SHRINK.heads,
    hidden: float | None = _SHRINK.hidden,
    multiple_of: int = _SHRINK.multiple_of,
    params: float | int | str | None = _SHRINK.params,
    candidates: int = _SHRINK.candidates,
    reconstruct: bool = _SHRINK.reconstruct,
    merge: bool = _SHRINK.merge,
    calibration: str | Path | None = _SHRINK.calibration,
    text_field: str = _SHRINK.text_field,
    samples: int = _SHRINK.samples,
    seq: int | None = _SHRINK.seq,
    seed: int = _SHRINK.seed,
    dtype: str = _SHRINK.dtype,
    device: str = _SHRINK.device,
    max_memory: int | str | None = _SHRINK.max_memory,
) -> ShrinkResult:
    """``sparsetool shrink CHECKPOINT -o OUTPUT --experts F``: remove that fraction (or keep
    ``experts_keep``) of every Mixture-of-Experts layer's routed experts into a smaller model;
    ``criterion`` reap, frequency, ean (scored on ``calibration`` text) or random. ``blocks=N``
    instead removes N whole blocks (``block_criterion`` bi or angular); ``ffn=F`` / ``heads=F`` /
    ``hidden=F`` keep that fraction of every layer's FFN channels / attention heads / the
    embedding channels, each width written a multiple of ``multiple_of`` (32; 1: the exact
    fraction), the FFN's and attention's output projections refit by least squares unless
    ``reconstruct=False`` (each refit's damping chosen on held-back windows; kept plain where
    none helps); ``blocks`` combines with them. ``params=F`` (or a count, ``"100M"``) asks for
    a size instead: the cuts are chosen by measurement, ``candidates`` mixes beside each kind
    alone (``result.search``). A run whose memory plan does not fit ``max_memory`` (bytes or
    ``"12G"``; default: what is available) is refused before any text runs."""
    from sparsetool.ops.shrink import shrink_checkpoint

    opts = ShrinkOptions.from_values(**ShrinkOptions.pick(locals()))  # the CLI's construction too
    return shrink_checkpoint(checkpoint, output, opts)


@_as_given
def convert(
    source: str | Path,
    output: str | Path,
    *,
    dtype: str = "float32",
    gguf_type: str | None = None,
) -> ConvertResult | ExportResult:
    """``sparsetool convert SOURCE -o OUTPUT``: a GGUF file into a Hugging Face directory, its
    weights dequantized to ``dtype`` (float32 or bfloat16) -> ``ConvertResult``; or a directory
    into a GGUF file whose matrices are ``gguf_type`` (``--type``: f32, f16 (the default),
    bf16, q8_0 or q4_0) -> ``ExportResult``. The direction follows ``source``."""
    from sparsetool.errors import ConfigError

    if Path(source).is_dir():
        if dtype != "float32":
            raise ConfigError("dtype is for a GGUF file in; a directory into GGUF takes gguf_type")
        from sparsetool.ops.gguf_export import export_gguf

        return export_gguf(source, output, gguf_type=gguf_type or "f16")
    if gguf_type is not None:
        raise ConfigError("gguf_type is for a directory into GGUF; a GGUF file in takes dtype")
    from sparsetool.ops.convert import convert_gguf

    return convert_gguf(source, output, dtype=dtype)


@_as_given
def densify(
    checkpoint: str | Path, output: str | Path | None = None, *, in_place: bool = False
) -> DensifyResult:
    """``sparsetool densify CHECKPOINT -o OUTPUT``: every encoding back to plain dense tensors."""
    from sparsetool.errors import ConfigError
    from sparsetool.ops.densify import densify_checkpoint

    if output is None and not in_place:
        raise ConfigError("give an output path (or in_place=True to replace the input)")
    return densify_checkpoint(
        checkpoint, checkpoint if output is None else output, in_place=in_place
    )


@_as_given
def report(
    checkpoint: str | Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
) -> Report:
    """``sparsetool report CHECKPOINT``: per-tensor sparsity; ``.to_json()`` gives the CLI's JSON.
    Without globs, a checkpoint pruned with ``include``/``exclude`` uses the recorded ones unless
    ``default_targets``."""
    from sparsetool.ops.report import summarize

    return summarize(
        checkpoint,
        include=parse_globs(include, "--include"),
        exclude=parse_globs(exclude, "--exclude"),
        default_targets=default_targets,
    )


# eval's defaults, declared once with its options (no torch)
_EVAL, _TASKS = EvalOptions.defaults(), TasksOptions.defaults()


@_as_given
def eval(
    checkpoints: str | Path | Sequence[str | Path],
    *,
    text: str | Path | None = _EVAL["text"],
    seq: int | None = _EVAL["seq"],
    stride: int | None = _EVAL["stride"],
    max_tokens: int | None = _EVAL["max_tokens"],
    batch: int = _EVAL["batch"],
    dtype: str = _EVAL["dtype"],
    device: str = _EVAL["device"],
    max_memory: int | str | None = _EVAL["max_memory"],
    tasks: str | Sequence[str] | None = _TASKS["tasks"],
    include_path: str | Path | None = _TASKS["include_path"],
    limit: int | None = _TASKS["limit"],
    num_fewshot: int | None = _TASKS["num_fewshot"],
    seed: int | None = _TASKS["seed"],
    offline: bool = _TASKS["offline"],
    log_samples: str | Path | None = _TASKS["log_samples"],
) -> EvalResult | TasksResult:
    """``sparsetool eval CKPT [CKPT ...]``: NLL, perplexity and bits per byte on held-out text.
    ``text`` is a file or directory (a ``Path``, or a ``str`` naming one that exists: read as
    ``--text`` reads it), the text itself (any other ``str``), or None for the held-out split of the
    built-in corpus; a one-word ``str`` that looks like a file name but names none is refused.
    Models run block by block on ``device`` in ``dtype``, holding as many windows as
    ``max_memory`` (bytes or ``"12G"``; default: what is available) leaves room for. Returns an
    :class:`~sparsetool.ops.eval.EvalResult`.

    With ``tasks`` (``"arc_easy,hellaswag"`` or a list; ``"zeroshot7"``) it is ``eval --tasks``:
    task accuracy through lm-evaluation-harness (the eval extra), with ``include_path``,
    ``limit``, ``num_fewshot``, ``seed``, ``offline`` and ``log_samples`` as the CLI's
    ``--include-path``, ``--limit``, ``--num-fewshot``, ``--seed``, ``--offline`` and
    ``--log-samples``, and perplexity on ``text`` only when ``text`` is given. Returns a
    :class:`~sparsetool.ops.tasks.TasksResult` (``.rows``: per checkpoint its metrics, each
    document's ``items`` and the ``comparison`` with the first; ``.to_json()`` = ``--json``)."""
    from dataclasses import replace

    from sparsetool.ops.eval_options import eval_options

    paths = [checkpoints] if isinstance(checkpoints, (str, Path)) else list(checkpoints)
    values = {**EvalOptions.pick(locals()), **TasksOptions.pick(locals())}
    options, asked = eval_options(**values)  # the CLI's construction too
    if isinstance(options.text, str):
        options = replace(options, text=_text_or_file(options.text))
    if asked is not None:
        from sparsetool.ops.tasks import evaluate_tasks

        return evaluate_tasks(paths, asked.checked(), options.checked())
    from sparsetool.ops.eval import evaluate

    return evaluate(paths, options.checked())


@_as_given
def diff(
    a: str | Path, b: str | Path, *, include: Sequence[str] = (), exclude: Sequence[str] = ()
) -> DiffResult:
    """``sparsetool diff A B``: per-matrix mask overlap, revived weights, L2 and angular change."""
    from sparsetool.ops.diff import diff as diff_checkpoints

    return diff_checkpoints(
        a, b, include=parse_globs(include, "--include"), exclude=parse_globs(exclude, "--exclude")
    )


@_as_given
def simulate(
    checkpoint: str | Path | None = None,
    *,
    shape: str | None = None,
    model: str | None = None,
    sparsity: float | str | Sequence[float] | None = None,
    sweep: bool = False,
    tokens: int | str = 2048,
    pattern: str = "random",
    seed: int = 0,
    hardware: str | Path | None = None,
    device: str | Sequence[str] = (),
    seq_len: int | None = None,
    verify: bool = False,
    plot: str | Path | None = None,
    include: str | Sequence[str] = (),
    exclude: str | Sequence[str] = (),
    default_targets: bool = False,
) -> SimulationResult:
    """``sparsetool simulate``: modelled time and speed-up of exactly one of ``checkpoint`` (its
    real masks), ``shape`` (``"MxK"``, a seeded ``pattern`` mask) or ``model`` (a flops preset) at
    ``sparsity`` (a number, a list or ``"0.5,0.9"``: a sweep; or ``sweep=True``) on each
    ``device`` (default: all). Returns a :class:`~sparsetool.hardware.result.SimulationResult`
    (``.runs``, ``.devices``, ``.layers``, ``.workload``, ...); ``.to_json()`` is what ``simulate
    --json`` prints."""
    from sparsetool.hardware.request import run_simulation
    from sparsetool.hardware.result import SimulationResult
    from sparsetool.util.options import parse_tokens

    result = run_simulation(
        None if checkpoint is None else Path(checkpoint),
        shape=shape,
        model=model,
        sparsity=sparsity,
        sweep=sweep,
        tokens=parse_tokens(tokens),
        pattern=pattern,
        seed=seed,
        hardware=None if hardware is None else Path(hardware),
        devices=(device,) if isinstance(device, str) else tuple(device),
        seq_len=seq_len,
        verify=verify,
        plot=None if plot is None else Path(plot),
        include=parse_globs(include, "--include"),
        exclude=parse_globs(exclude, "--exclude"),
        default_targets=default_targets,
    )
    return SimulationResult.from_result(result)


def _text_or_file(text: str) -> str | Path:
    """``eval``'s ``text`` given as a ``str``: a file or directory that exists is read, as
    ``--text`` reads it; a one-word string that looks like a file name (a suffix such as ``.txt``,
    or a path separator) but names nothing is refused; anything else is the text itself."""
    import os

    from sparsetool.errors import SparsetoolError

    if "\n" not in text and len(text) < 4096 and os.path.exists(text):
        return Path(text)
    word = text.strip()
    if (
        word
        and not any(c.isspace() for c in word)
        and (os.sep in word or Path(word).suffix[1:].isalpha())
    ):
        raise SparsetoolError(
            f"text={text!r} looks like a file name, but there is no such file or "
            "directory; give a file that exists (a str naming one, or a Path), or "
            "the text itself"
        )
    return text
