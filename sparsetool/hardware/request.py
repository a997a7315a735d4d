"""One simulation request, from a command's inputs to the result ``sparsetool simulate`` renders.

:func:`run_simulation` takes what the command takes (a checkpoint, ``shape`` or ``model``; one
sparsity, a list or the Appendix C sweep; tokens, pattern, seed, devices, a hardware file), builds
the :class:`~sparsetool.hardware.workload.Workload`, runs it on every device and returns plain
JSON-ready data. :func:`hardware_constants` is ``--list-hardware``'s table. Bad input raises
:class:`~sparsetool.errors.ConfigError` naming the option. torch is imported only to read a
checkpoint, matplotlib only to plot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from sparsetool.checkpoint.output_files import ResultDict, check_png, reclaiming
from sparsetool.errors import ConfigError
from sparsetool.hardware import compare, presets
from sparsetool.hardware import workload as wlmod
from sparsetool.hardware.compare import APPENDIX_C_TICKS
from sparsetool.hardware.devices import Device
from sparsetool.hardware.layers import synthetic_mask
from sparsetool.hardware.workload import Workload
from sparsetool.util import options
from sparsetool.util.progress import Progress
from sparsetool.util.wording import did_you_mean

Sparsities = str | float | Sequence[float] | None


def select_devices(
    hardware: Path | None = None, only: Sequence[str] = ()
) -> tuple[dict[str, Device], dict[str, dict[str, str]]]:
    """The presets with ``hardware``'s overrides, kept to the names in ``only`` (all if empty),
    and every constant's source."""
    devices, sources = presets.load_devices(hardware)
    if only:
        check_devices(devices, only)
        devices = {d: devices[d] for d in only}
    return devices, sources


def check_devices(devices: Mapping[str, Any], only: Sequence[str]) -> None:
    """Refuse a name in ``only`` that is not one of ``devices`` (the CLI: a usage error)."""
    unknown = [d for d in only if d not in devices]
    if unknown:
        hint = did_you_mean(unknown[0], list(devices))
        raise ConfigError(
            f"unknown --device {', '.join(unknown)}{hint}; known: {', '.join(devices)} "
            "(sparsetool simulate --list-hardware lists them)"
        )


def hardware_constants(
    hardware: Path | None = None, devices: Sequence[str] = ()
) -> dict[str, dict[str, Any]]:
    """``{device: {"kind", "constants": {name: {"value", "unit", "source"}}}}``
    (``--list-hardware``; ``unit`` from :data:`sparsetool.hardware.presets.UNITS`).

    >>> hardware_constants(devices=["cs2"])["cs2"]["kind"]
    'dataflow'
    """
    chosen, sources = select_devices(hardware, devices)
    return {
        name: {
            "kind": d.kind,
            "constants": {
                f.name: {
                    "value": getattr(d, f.name),
                    "unit": presets.UNITS.get(f.name),
                    "source": sources[name].get(f.name, "default"),
                }
                for f in fields(d)
                if f.name != "name"
            },
        }
        for name, d in chosen.items()
    }


def parse_sparsities(sparsity: Sparsities, sweep: bool = False) -> list[float]:
    """The sparsities to run: the Appendix C ticks for ``sweep``, else ``sparsity`` as one value,
    a sequence or a comma list (``"0.5,0.9"``); each a fraction of zeros in [0, 1].

    >>> parse_sparsities("0.5,0.9")
    [0.5, 0.9]
    >>> parse_sparsities(None, sweep=True)[:3]
    [0.0, 0.5, 0.6667]
    """
    if sweep:
        if sparsity is not None:
            given = (
                sparsity
                if isinstance(sparsity, str)
                else ",".join(
                    f"{x:g}"
                    for x in ([sparsity] if isinstance(sparsity, (int, float)) else sparsity)
                )
            )
            raise ConfigError(
                f"give either --sweep (the Appendix C sparsities) or --sparsity {given}, "
                "not both: drop one"
            )
        return list(APPENDIX_C_TICKS)
    if sparsity is None:
        return []
    # one rule for every command: sparsetool.util.options
    if isinstance(sparsity, str):
        return options.parse_sparsities(sparsity)
    values = [sparsity] if isinstance(sparsity, (int, float)) else list(sparsity)
    return [options.check_sparsity(v) for v in values]


def check_request(
    checkpoint: Path | None = None,
    *,
    shape: str | None = None,
    model: str | None = None,
    sparsity: Sparsities = None,
    sweep: bool = False,
    pattern: str = "random",
    plot: Path | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
) -> list[float]:
    """How the options of a request combine, checked before any file is read (the CLI turns a
    :class:`ConfigError` here into a usage error). Returns the sparsities to run.

    >>> check_request(shape="64x64", sparsity="0.5,0.9")
    [0.5, 0.9]
    """
    if sum(x is not None for x in (checkpoint, shape, model)) != 1:
        raise ConfigError(
            "give exactly one of CHECKPOINT, --shape MxK or --model NAME, e.g. sparsetool "
            "simulate model.safetensors, sparsetool simulate --shape 4096x4096 --sparsity 0.9 "
            "or sparsetool simulate --model gpt2-small --sparsity 0.75"
        )
    if pattern != "random" and shape is None:
        raise ConfigError(
            "--pattern draws the synthetic mask of --shape only: drop --pattern, or "
            f"simulate one layer, e.g. --shape 4096x4096 --sparsity 0.5 --pattern {pattern}"
        )
    if (include or exclude or default_targets) and checkpoint is None:
        raise ConfigError(
            "--include/--exclude/--default-targets select a checkpoint's tensors: give CHECKPOINT"
        )
    if checkpoint is not None and (sweep or plot is not None or sparsity is not None):
        given = [
            o
            for o, v in (
                ("--sparsity", sparsity is not None),
                ("--sweep", sweep),
                ("--plot", plot is not None),
            )
            if v
        ]
        raise ConfigError(
            f"a checkpoint brings its own masks, at one sparsity: drop {'/'.join(given)} to "
            "simulate them, or sweep synthetic masks of a preset instead, e.g. sparsetool "
            "simulate --model gpt2-small --sweep --plot speedup.png"
        )
    sps = parse_sparsities(sparsity, sweep or (plot is not None and sparsity is None))
    if checkpoint is None and not sps:
        raise ConfigError(
            "--shape and --model need a sparsity: add one, a list or --sweep, e.g. "
            "--sparsity 0.9, --sparsity 0.5,0.75,0.9 or --sweep"
        )
    if pattern == "2:4" and shape is not None and len(sps) > 1:
        raise ConfigError(
            "--pattern 2:4 keeps exactly half the weights, so it takes one sparsity, "
            f"e.g. --shape {shape} --sparsity 0.5 --pattern 2:4"
        )
    if plot is not None and len(sps) == 1:
        raise ConfigError(
            f"--plot draws speedup against sparsity, and --sparsity gives one: "
            f"replace --sparsity {sps[0]:g} with --sweep, or give several, e.g. "
            f"--sparsity 0.5,0.75,0.9"
        )
    return sps


def run_simulation(
    checkpoint: Path | None = None,
    *,
    shape: str | None = None,
    model: str | None = None,
    sparsity: Sparsities = None,
    sweep: bool = False,
    tokens: float = 2048,
    pattern: str = "random",
    seed: int = 0,
    hardware: Path | None = None,
    devices: Sequence[str] = (),
    seq_len: int | None = None,
    verify: bool = False,
    plot: Path | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Simulate exactly one of ``checkpoint`` (its real masks), ``shape`` (``"MxK"``, a seeded
    ``pattern`` mask) or ``model`` (a flops preset, random masks) on ``devices``.

    The result always has the keys :data:`RESULT_KEYS`: ``runs``, one row per sparsity (several
    with a list, ``sweep``, or ``plot`` without sparsities); ``workload``, ``devices`` and
    ``layers`` of the last run (see :func:`sparsetool.hardware.compare.simulate`); ``nm_point``
    (the 2:4 cores on a 2:4 mask of a random ``shape`` in a sweep) and ``plot`` (the PNG written),
    else None. ``verify`` adds ``"verify"``: the
    zero-skipping schedule executed on one mask (the checkpoint's smallest pruned matrix, else
    the last point's) and compared with the dense masked matmul (else None). ``include``/``exclude``
    are the tensor globs of :func:`sparsetool.targets.plan_targets`, for a checkpoint only; without
    them a checkpoint pruned with globs is simulated on the tensors prune targeted, unless
    ``default_targets``. With a checkpoint the workload holds ``"targeting"``
    (:func:`sparsetool.targets.recorded.targeting_summary`). The result's ``reclaimed`` (not a key):
    the temporaries of killed runs removed beside ``plot``, which is checked before the work (an
    error carries them too).
    """
    chosen, _ = select_devices(hardware, devices)
    sps = check_request(
        checkpoint,
        shape=shape,
        model=model,
        sparsity=sparsity,
        sweep=sweep,
        pattern=pattern,
        plot=plot,
        include=include,
        exclude=exclude,
        default_targets=default_targets,
    )
    if plot is not None:
        check_png(plot)
    grids = presets.dataflow_grids(list(chosen.values()))

    if checkpoint is not None:
        wl = _from_checkpoint(
            Path(checkpoint), tokens, grids, seq_len, include, exclude, default_targets, progress
        )
        make = None
        verify_mask = _checkpoint_mask(Path(checkpoint), wl) if verify else None
    else:
        mk = options.parse_shape(shape) if shape is not None else None
        make = _synthetic(mk, model, sps, tokens, grids, pattern, seed, seq_len)
        wl, mask = make(sps[-1])
        verify_mask = None
        if verify:
            verify_mask = (
                mask
                if mask is not None
                else synthetic_mask(
                    (wl.layers[0].out_features, wl.layers[0].in_features), sps[-1], "random", seed
                )
            )

    reclaimed = []
    if len(sps) > 1:
        with reclaiming() as reclaimed:
            result = _sweep(
                wl=wl,
                make=make,
                sps=sps,
                devices=chosen,
                grids=grids,
                shape=shape,
                pattern=pattern,
                tokens=tokens,
                seed=seed,
                plot=plot,
            )
    else:
        result = compare.simulate(wl, chosen)
        result["runs"] = [compare.run_row(sps[0] if sps else wl.sparsity, result)]
    if verify:
        from sparsetool.hardware.verify import run_schedule

        if verify_mask is None:  # made above whenever verify is asked
            raise AssertionError("no mask to verify")
        result["verify"] = run_schedule(verify_mask, grids[0])
    return ResultDict({key: result.get(key) for key in RESULT_KEYS}, reclaimed)


RESULT_KEYS = ("workload", "runs", "devices", "layers", "nm_point", "plot", "verify")
"""Every :func:`run_simulation` result has these keys, whatever was asked (absent parts are None):
``runs`` holds one row per sparsity; ``workload``'s per-sparsity figures, ``devices`` and
``layers`` describe the last run."""


Maker = Callable[[float], tuple]
"""``sparsity -> (workload, mask or None)``."""


def _synthetic(
    mk: tuple[int, int] | None,
    model: str | None,
    sps: list[float],
    tokens: float,
    grids: list[tuple[int, int]],
    pattern: str,
    seed: int,
    seq_len: int | None,
) -> Maker:
    """The :data:`Maker` of the ``mk`` = (M, K) layer, or else of ``model``."""
    if mk is not None:
        return lambda s: wlmod.from_shape(mk, s, tokens, grids, pattern, seed)
    from sparsetool.flops import get_preset, with_overrides

    if model is None:  # check_request asks for one of the checkpoint, the shape or the model
        raise AssertionError("neither a shape nor a model")
    cfg = get_preset(model)
    if seq_len is not None:
        cfg = with_overrides(cfg, seq_len=seq_len)
    return lambda s: (wlmod.from_model(cfg, s, tokens, grids, seed), None)


def _sweep(
    wl: Workload,
    make: Maker | None,
    sps: list[float],
    devices: dict[str, Device],
    grids: list[tuple[int, int]],
    shape: str | None,
    pattern: str,
    tokens: float,
    seed: int,
    plot: Path | None,
) -> dict[str, Any]:
    if make is None:  # check_request takes a checkpoint at its one sparsity only
        raise AssertionError("a sweep of a checkpoint")
    # The last point is built already (do not draw its mask twice); it is the one shown in detail.
    result = compare.simulate(wl, devices)
    rows = compare.sweep(lambda s: make(s)[0], sps[:-1], devices)
    result["runs"] = [*rows, compare.run_row(sps[-1], result)]
    result["workload"]["label"] = wl.label.replace(f" at sparsity {sps[-1]:g}", "")
    if shape is not None and pattern == "random":
        mk = options.parse_shape(shape)
        nm_devices = {n: d for n, d in devices.items() if d.kind == "gpu-2:4"}
        if mk[1] % 4 == 0 and nm_devices:  # where 2:4 cores do apply: the same shape, a 2:4 mask
            nm_wl, _ = wlmod.from_shape(mk, 0.5, tokens, grids, "2:4", seed)
            result["nm_point"] = compare.sweep(lambda s: nm_wl, [0.5], nm_devices)[0]
            result["nm_point"]["mask"] = "2:4"
    if plot is not None:
        from sparsetool.hardware.plot import plot_sweep

        key = "forward_speedup" if shape is not None else "train_speedup"
        what = "one matmul, forward" if shape is not None else "training step"
        title = f"{wl.label.split(' at ')[0]}: {what}, {tokens:g} tokens"
        plot_sweep(result["runs"], plot, title, key, result.get("nm_point"))
        result["plot"] = str(plot)
    return result


def _from_checkpoint(
    path: Path,
    tokens: float,
    grids: list[tuple[int, int]],
    seq_len: int | None,
    include: Sequence[str],
    exclude: Sequence[str],
    default_targets: bool,
    progress: Progress | None,
) -> Workload:
    report = (
        None if progress is None else (lambda done, total, name: progress("masks", done, total))
    )
    return wlmod.from_checkpoint(
        path,
        tokens,
        grids,
        seq_len=seq_len,
        progress=report,
        include=tuple(include),
        exclude=tuple(exclude),
        default_targets=default_targets,
    )


def _checkpoint_mask(path: Path, wl: Workload) -> np.ndarray:
    """The mask of the checkpoint's smallest pruned matrix, as (M, K), for ``verify``."""
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.encodings import decode
    from sparsetool.targets import plan_targets

    target = min(wl.layers, key=lambda ly: ly.numel).name
    with open_checkpoint(path) as ck:
        lt = next(lt for lt in ck.logical if lt.name == target)
        dense, mask = decode(ck, lt)
        mask = (dense != 0) if mask is None else mask
        m = mask.numpy()
        return m if plan_targets([lt], ck.config)[lt.name].input_dim == 1 else m.T


__all__ = [
    "RESULT_KEYS",
    "hardware_constants",
    "parse_sparsities",
    "run_simulation",
    "select_devices",
]
