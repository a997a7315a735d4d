"""The model set against measured kernel times: ``sparsetool simulate --measured BENCH.json``.

A measurement (``sparsetool bench --json``, schema version 1) times, for each layer shape and
mask it holds and each batch (tokens per matmul), the dense product and one or more sparse
kernels, forward only. :func:`compare` runs the same points through a device of the model (the
``"forward"`` pass, ``tokens = batch``, a :class:`~sparsetool.hardware.layers.LayerMask` built from
the layer's shape and non-zero count) and gives, per point, the measured and modelled dense and
sparse times and speedups; :func:`fit` fits a :class:`~sparsetool.hardware.devices.CPU` device's
rates to the times (scipy, the ``bench`` extra).

The summary errors are factors: ``exp(RMS of ln(modelled / measured))`` over the points, so 1.0 is
exact and 1.25 means the model is typically 25% off, either way (a ratio error, fair to times that
span orders of magnitude).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from sparsetool.errors import ConfigError, SparsetoolError, UsageError
from sparsetool.hardware.devices import CPU, Device, Refused
from sparsetool.hardware.layers import LayerMask
from sparsetool.util.configfile import read_text

SCHEMA_VERSION = 1
"""The version of the measurement format this module reads (its ``"bench"`` key)."""

VALUE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
"""Bytes per weight and activation of each dtype a measurement may time."""

INDEX_BYTES = {"scipy-csr": 4.0, "scipy-csr-rows": 4.0, "torch-csr": 8.0}
"""Bytes per CSR index of the kernels whose index width is known (scipy: 32-bit below 2**31
non-zeros; torch: 64-bit); other kernels keep the device's ``index_bytes``."""

FITTED = (
    "dense_flops",
    "bandwidth",
    "launch_s",
    "sparse_mac_rate",
    "sparse_bandwidth",
    "sparse_launch_s",
)
"""The :class:`~sparsetool.hardware.devices.CPU` constants :func:`fit` fits (the byte sizes are
facts of the measurement, not fitted)."""

BENCH_EXTRA = "pip install 'sparsetool[bench]' (or pip install -e '.[bench]' in a source checkout)"


@dataclass(frozen=True)
class Measurement:
    """A checked measurement file: ``path`` and its parsed ``data`` (the bench JSON)."""

    path: Path
    data: dict[str, Any]

    @property
    def device_type(self) -> str:
        """``"cpu"`` or ``"cuda"``."""
        return self.data["device"]["type"]

    @property
    def kernels(self) -> list[str]:
        return list(self.data["kernels"])

    def layer_mask(self, layer: Mapping[str, Any]) -> LayerMask:
        """The cost model's view of a measured layer: its shape and non-zero count (2:4 along K
        when the measurement says so; whether 2:4 holds along M is not recorded)."""
        m, k = layer["shape"]
        return LayerMask(
            layer["name"],
            "other",
            out_features=m,
            in_features=k,
            nnz=layer["nnz"],
            nm_violation_in=0.0 if layer["two_four"] else None,
        )


# --- reading --------------------------------------------------------------------------------


def load_measurement(path: str | Path) -> Measurement:
    """Read and check a measurement file; anything amiss is one :class:`ConfigError` naming the
    file, the place in it and what is wrong."""
    p = Path(path)
    where = f"measurement file '{p}'"
    wrote = "give the JSON `sparsetool bench --json` wrote"
    text = read_text(p, "measurement file", wrote)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{where} is not JSON ({str(e).splitlines()[0]}); {wrote}") from None
    if not isinstance(data, dict) or "bench" not in data:
        raise ConfigError(
            f'{where} is not a `sparsetool bench --json` output (no "bench" key '
            f"at the top); {wrote}"
        )
    if data["bench"] != SCHEMA_VERSION:
        raise ConfigError(
            f"{where} has schema version {data['bench']!r}; this sparsetool reads "
            f"version {SCHEMA_VERSION}: measure again with this version's "
            "`sparsetool bench`"
        )
    _check(data, where)
    return Measurement(p, data)


def _get(obj: Any, key: str, kind: str, at: str, where: str) -> Any:
    """``obj[key]``, of ``kind``: str, int (> 0), count (>= 0), seconds (> 0), bool, list, dict."""
    if not isinstance(obj, dict) or key not in obj:
        raise ConfigError(
            f'{where}: {at or "the top"} has no "{key}"; is it a complete '
            "`sparsetool bench --json` output?"
        )
    v = obj[key]
    name = f"{at}.{key}" if at else key
    whole = isinstance(v, int) and not isinstance(v, bool)
    number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = {
        "str": isinstance(v, str),
        "int": whole and v > 0,
        "count": whole and v >= 0,
        "seconds": number and v > 0,
        "bool": isinstance(v, bool),
        "list": isinstance(v, list),
        "dict": isinstance(v, dict),
    }[kind]
    if not ok:
        want = {
            "int": "a positive whole number",
            "count": "a whole number >= 0",
            "seconds": "a positive number of seconds",
            "str": "a string",
            "bool": "true or false",
            "list": "a list",
            "dict": "an object",
        }[kind]
        raise ConfigError(f"{where}: {name} must be {want}, got {json.dumps(v)[:60]}")
    return v


def _check(data: dict[str, Any], where: str) -> None:
    device = _get(data, "device", "dict", "", where)
    if device.get("type") not in ("cpu", "cuda"):
        raise ConfigError(
            f'{where}: device.type must be "cpu" or "cuda", got {json.dumps(device.get("type"))}'
        )
    dtype = _get(data, "dtype", "str", "", where)
    if dtype not in VALUE_BYTES:
        raise ConfigError(f"{where}: dtype must be one of {', '.join(VALUE_BYTES)}, got {dtype!r}")
    kernels = _get(data, "kernels", "list", "", where)
    if not kernels or not all(isinstance(k, str) for k in kernels):
        raise ConfigError(f"{where}: kernels must be a non-empty list of kernel names")
    layers = _get(data, "layers", "list", "", where)
    if not layers:
        raise ConfigError(f"{where}: layers is empty; nothing was measured")
    for i, layer in enumerate(layers):
        at = f"layers[{i}]"
        _get(layer, "name", "str", at, where)
        shape = _get(layer, "shape", "list", at, where)
        if len(shape) != 2 or not all(type(n) is int and n > 0 for n in shape):
            raise ConfigError(
                f"{where}: {at}.shape must be [M, K], two positive whole numbers, "
                f"got {json.dumps(shape)}"
            )
        nnz = _get(layer, "nnz", "count", at, where)
        if nnz > shape[0] * shape[1]:
            raise ConfigError(
                f"{where}: {at}.nnz is {nnz}, more than the {shape[0]} x {shape[1]} entries"
            )
        _get(layer, "two_four", "bool", at, where)
        runs = _get(layer, "runs", "list", at, where)
        for j, run in enumerate(runs):
            rat = f"{at}.runs[{j}]"
            _get(run, "batch", "int", rat, where)
            dense = _get(run, "dense", "dict", rat, where)
            _get(dense, "median_s", "seconds", f"{rat}.dense", where)
            for name, timing in _get(run, "sparse", "dict", rat, where).items():
                _get(timing, "median_s", "seconds", f"{rat}.sparse.{name}", where)
                _get(timing, "ok", "bool", f"{rat}.sparse.{name}", where)


# --- the device and kernel to compare with ----------------------------------------------------


def _fits_kind(m: Measurement, dev: Device) -> bool:
    return dev.kind == "cpu" if m.device_type == "cpu" else dev.kind.startswith("gpu-")


def measured_device(
    m: Measurement, devices: Mapping[str, Device], name: str | None = None
) -> Device:
    """The device ``m`` is compared with: ``name`` (``--device``), else the ``cpu`` preset for a
    CPU measurement. A GPU measurement needs a name; a device of the other kind is refused
    (:class:`UsageError`, naming the devices that fit)."""
    fitting = [n for n, d in devices.items() if _fits_kind(m, d)]
    what = f"{'a CPU' if m.device_type == 'cpu' else 'a GPU'} ({m.data['device'].get('name', '?')})"
    if name is None:
        if m.device_type == "cpu" and "cpu" in devices:
            return devices["cpu"]
        raise UsageError(
            f"{m.path} was measured on {what}: name the device to compare it with, "
            f"--device NAME; those that fit: {', '.join(fitting) or 'none'}"
        )
    dev = devices[name]
    if not _fits_kind(m, dev):
        raise UsageError(
            f"{m.path} was measured on {what}, and --device {name} is a {dev.kind} "
            f"device: compare it with one that fits: {', '.join(fitting) or 'none'}"
        )
    return dev


def choose_kernel(m: Measurement, kernel: str | None = None) -> str:
    """``kernel`` if ``m`` timed it (else a :class:`UsageError` listing those it did), or else the
    kernel fastest at the most points (ties: the first in ``m``'s ``kernels``)."""
    if kernel is not None:
        if kernel not in m.kernels:
            raise UsageError(
                f"--kernel {kernel}: {m.path} timed {', '.join(m.kernels)}; name one of them"
            )
        return kernel
    wins = Counter(run.get("best") for layer in m.data["layers"] for run in layer["runs"])
    return max(m.kernels, key=lambda k: (wins.get(k, 0), -m.kernels.index(k)))


D = TypeVar("D", bound=Device)


def sized_for(m: Measurement, dev: D, kernel: str) -> D:
    """``dev`` with the byte sizes of the measurement: the dtype's value size and, for a kernel of
    :data:`INDEX_BYTES`, its index size. Those (the CPU's CSR kernels) hold float32 values
    whatever the dtype, so their values count 4 bytes; the CPU device has one value size, so the
    dense product's then count 4 too (an approximation where it ran in bfloat16)."""
    names = {f.name for f in fields(dev)}
    # Any: replace() cannot tell these keys from the device's other fields (its name)
    sizes: dict[str, Any] = {"value_bytes": VALUE_BYTES[m.data["dtype"]]}
    if kernel in INDEX_BYTES:
        sizes["index_bytes"] = INDEX_BYTES[kernel]
        sizes["value_bytes"] = 4.0
    return replace(dev, **{k: v for k, v in sizes.items() if k in names})


# --- the comparison -------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _points(m: Measurement) -> list[tuple[dict, LayerMask, dict]]:
    return [
        (layer, m.layer_mask(layer), run) for layer in m.data["layers"] for run in layer["runs"]
    ]


def _modelled(dev: Device, ly: LayerMask, batch: int) -> tuple[float, float | None, str | None]:
    dense = dev.dense_cost(ly, batch, "forward").total
    try:
        return dense, dev.cost(ly, batch, "forward").total, None
    except Refused:
        return dense, None, f"{dev.name} refuses this mask (not 2:4 along K)"


def rows(m: Measurement, dev: Device, kernel: str) -> list[dict[str, Any]]:
    """One row per measured layer and batch: measured and modelled times and speedups."""
    out = []
    for layer, ly, run in _points(m):
        timing = run["sparse"].get(kernel)
        ok = timing is not None and timing["ok"]
        meas_dense = run["dense"]["median_s"]
        meas_sparse = timing["median_s"] if ok else None
        mod_dense, mod_sparse, note = _modelled(dev, ly, run["batch"])
        if timing is None:
            note = f"{kernel} was not timed here"
        elif not timing["ok"]:
            note = f"{kernel} gave a wrong product here (left out of the errors)"
        out.append(
            {
                "layer": layer["name"],
                "shape": list(layer["shape"]),
                "sparsity": ly.sparsity,
                "nnz": ly.nnz,
                "batch": run["batch"],
                "measured": {
                    "dense_s": meas_dense,
                    "sparse_s": meas_sparse,
                    "speedup": _ratio(meas_dense, meas_sparse),
                },
                "modelled": {
                    "dense_s": mod_dense,
                    "sparse_s": mod_sparse,
                    "speedup": _ratio(mod_dense, mod_sparse),
                },
                "note": note,
            }
        )
    return out


def _factor(logs: list[float]) -> float | None:
    return math.exp(math.sqrt(sum(x * x for x in logs) / len(logs))) if logs else None


def errors(table: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of :func:`rows`: ``exp(RMS of ln(modelled / measured))`` for the dense times,
    the sparse times, both together (``time``) and the speedups; ``points``: the rows with both a
    measured and a modelled sparse time (None where there are none)."""

    def logs(part: str) -> list[float]:
        return [
            math.log(r["modelled"][part] / r["measured"][part])
            for r in table
            if r["modelled"][part] is not None and r["measured"][part] is not None
        ]

    dense, sparse, speedup = logs("dense_s"), logs("sparse_s"), logs("speedup")
    return {
        "points": len(speedup),
        "dense": _factor(dense),
        "sparse": _factor(sparse),
        "time": _factor(dense + sparse),
        "speedup": _factor(speedup),
    }


def compare(m: Measurement, device: Device, kernel: str | None = None) -> dict[str, Any]:
    """``m`` against ``device`` for ``kernel`` (default :func:`choose_kernel`'s):
    ``{"device": {"name", "kind"}, "kernel", "rows": rows(...), "error": errors(...)}``.
    The device's byte sizes are the measurement's (:func:`sized_for`)."""
    kernel = choose_kernel(m, kernel)
    dev = sized_for(m, device, kernel)
    table = rows(m, dev, kernel)
    return {
        "device": {"name": dev.name, "kind": dev.kind},
        "kernel": kernel,
        "rows": table,
        "error": errors(table),
    }


# --- the fit --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    """A fitted CPU device: its ``constants`` before (``start``) and after, the points' ``before``
    and ``after`` errors (:func:`errors`), the constants the measurement does not constrain (left
    at their start: their times never set the pace), and each constant's ``sources`` text."""

    device: CPU
    kernel: str
    start: dict[str, float]
    constants: dict[str, float]
    before: dict[str, Any]
    after: dict[str, Any]
    unconstrained: list[str]
    sources: dict[str, str]
    warnings: list[str]


def fit(
    m: Measurement,
    device: Device,
    kernel: str | None = None,
    start_sources: Mapping[str, str] | None = None,
) -> Fit:
    """Fit ``device``'s (a CPU) :data:`FITTED` rates to ``m``'s dense and ``kernel``'s sparse
    times: ``scipy.optimize.least_squares`` on the residuals ``ln(modelled / measured)``, the
    parameters in log space (positive, scale-free) and started from ``device``. The dense times
    set the dense constants and the sparse times the sparse ones. ``start_sources``: where the
    starting constants come from (kept for those not fitted)."""
    if not isinstance(device, CPU):
        raise UsageError(
            f"--fit fits the constants of a cpu device, and {device.name} is a "
            f"{device.kind} device; compare {m.path} with it without --fit"
        )
    try:
        import numpy as np
        from scipy.optimize import least_squares
    except ImportError:
        raise SparsetoolError(f"--fit needs scipy, which is not installed: {BENCH_EXTRA}") from None
    kernel = choose_kernel(m, kernel)
    dev0 = sized_for(m, device, kernel)
    points = [
        (ly, run["batch"], run["dense"]["median_s"], (run["sparse"].get(kernel) or {}))
        for _, ly, run in _points(m)
    ]
    dense_pts = [(ly, b, t) for ly, b, t, _ in points]
    sparse_pts = [(ly, b, s["median_s"]) for ly, b, _, s in points if s.get("ok")]
    if not sparse_pts:
        raise ConfigError(f"measurement file '{m.path}' has no correct {kernel} times to fit")
    x0 = np.log([getattr(dev0, k) for k in FITTED])

    def residuals(x: np.ndarray) -> np.ndarray:
        dev = replace(dev0, **dict(zip(FITTED, np.exp(x).tolist())))
        res = [math.log(dev.dense_cost(ly, b, "forward").total / t) for ly, b, t in dense_pts]
        res += [math.log(dev.sparse_cost(ly, b, "forward").total / t) for ly, b, t in sparse_pts]
        return np.array(res)

    # A roofline's max() has kinks, so least squares can stop in a local minimum: it starts from
    # the device and from the measurement's own bounds (a rate is at least the work over the time
    # of every point; an overhead at most a tenth of the shortest time), and keeps the better.
    starts = [x0, np.clip(np.log(_bounds(dev0, dense_pts, sparse_pts)), x0 - 29.0, x0 + 29.0)]
    sol = min(
        (
            least_squares(residuals, x, bounds=(x0 - 30.0, x0 + 30.0), x_scale=1.0, diff_step=1e-6)
            for x in starts
        ),
        key=lambda r: r.cost,
    )
    # Any for replace(), as in sized_for
    fitted: dict[str, Any] = {k: float(v) for k, v in zip(FITTED, np.exp(sol.x))}
    jac = np.abs(sol.jac).sum(axis=0)
    unconstrained = [k for k, j in zip(FITTED, jac) if j == 0.0]
    # No gradient: the term never sets the pace at the fitted point, and any rate at least as
    # large fits as well. The smallest such rate is kept (what least_squares left may be huge);
    # an overhead with no gradient is negligible and stays as fitted.
    dev = replace(dev0, **fitted)
    for k, v in _least_rates(dev, dense_pts, sparse_pts).items():
        if k in unconstrained:
            fitted[k] = min(fitted[k], v)
    dev = replace(dev0, **fitted)
    before, after = errors(rows(m, dev0, kernel)), errors(rows(m, dev, kernel))
    srcs = dict(start_sources or {})
    note = (
        f"fitted: least squares on ln(modelled/measured) of {len(dense_pts)} dense and "
        f"{len(sparse_pts)} {kernel} times in {m.path} ({m.data['device'].get('name', '?')}, "
        f"{m.data['dtype']}); time error x{after['time']:.3g} (x{before['time']:.3g} before)"
    )
    for k in FITTED:
        srcs[k] = (
            f"not constrained by {m.path} (it never sets the pace there): any value at "
            "least this large fits as well; " + note
            if k in unconstrained
            else note
        )
    srcs["value_bytes"] = f"{m.data['dtype']} in {m.path}, {dev.value_bytes:g} bytes"
    if kernel in INDEX_BYTES:
        srcs["index_bytes"] = f"{kernel}'s {int(dev.index_bytes * 8)}-bit indices"
    return Fit(
        device=dev,
        kernel=kernel,
        start={k: float(getattr(dev0, k)) for k in FITTED},
        constants=fitted,
        before=before,
        after=after,
        unconstrained=unconstrained,
        sources=srcs,
        warnings=_fit_warnings(m, len(dense_pts) + len(sparse_pts)),
    )


def _fit_warnings(m: Measurement, points: int) -> list[str]:
    """Why the fitted constants may not carry over: too few times, one shape."""
    out = []
    if points < 2 * len(FITTED):
        out.append(
            f"{points} times for {len(FITTED)} constants: the fit can match them all and "
            "still say little about other shapes and batches; time more batches and "
            "sparsities"
        )
    shapes = {tuple(layer["shape"]) for layer in m.data["layers"]}
    if len(shapes) == 1:
        (shape,) = shapes
        out.append(
            f"one shape measured ({shape[0]}x{shape[1]}): the rates are this shape's, other "
            "shapes may run at others; bench a checkpoint or a preset to fit several"
        )
    return out


def _least_rates(dev: CPU, dense_pts: list, sparse_pts: list) -> dict[str, float]:
    """The smallest bandwidths with which the memory terms still never set the pace (the rate
    at which memory time equals compute time at the point where that takes most), x1.01."""
    d = [(dev.dense_cost(ly, b, "forward"), dev.bandwidth) for ly, b, _ in dense_pts]
    s = [(dev.sparse_cost(ly, b, "forward"), dev.sparse_bandwidth) for ly, b, _ in sparse_pts]
    return {
        "bandwidth": 1.01 * max(c.memory * bw / c.compute for c, bw in d),
        "sparse_bandwidth": 1.01 * max(c.memory * bw / c.compute for c, bw in s),
    }


def _bounds(dev: CPU, dense_pts: list, sparse_pts: list) -> list[float]:
    """:data:`FITTED` as the measured times bound them: each rate the largest work-over-time of
    any point (the time of a point is at least each of its roofline terms), each overhead a tenth
    of the shortest time."""
    unit = replace(
        dev,
        dense_flops=1.0,
        bandwidth=1.0,
        launch_s=0.0,
        sparse_mac_rate=1.0,
        sparse_bandwidth=1.0,
        sparse_launch_s=0.0,
    )
    dense = [(unit.dense_cost(ly, b, "forward"), t) for ly, b, t in dense_pts]
    sparse = [(unit.sparse_cost(ly, b, "forward"), t) for ly, b, t in sparse_pts]
    return [
        max(c.compute / t for c, t in dense),
        max(c.memory / t for c, t in dense),
        min(t for _, t in dense) / 10,
        max(c.compute / t for c, t in sparse),
        max(c.memory / t for c, t in sparse),
        min(t for _, t in sparse) / 10,
    ]


def run_measured(
    path: str | Path,
    *,
    hardware: Path | None = None,
    device: str | None = None,
    kernel: str | None = None,
    fit_it: bool = False,
    output: Path | None = None,
) -> dict[str, Any]:
    """``sparsetool simulate --measured PATH``: the measurement against ``device`` (a preset, or
    one of ``hardware``'s; default :func:`measured_device`'s), and with ``fit_it`` the fitted CPU
    device, written to ``output`` (TOML, for ``--hardware``) when given. JSON-ready:
    ``{"measurement", "device", "kernel", "rows", "error", "fit"}`` (see docs/simulate.md); its
    ``reclaimed`` (not a key): the temporaries of killed runs removed beside ``output``, which is
    checked before the measurement is read (an error carries them too)."""
    from sparsetool.checkpoint.output_files import ResultDict, check_writable, reclaiming
    from sparsetool.hardware.presets import load_devices, write_hardware_file

    if output is not None:
        check_writable(output)

    devices, srcs = load_devices(hardware)
    m = load_measurement(path)
    dev = measured_device(m, devices, device)
    out = compare(m, dev, kernel)
    info = m.data["device"]
    out = {
        "measurement": {
            "file": str(m.path),
            "device": {
                "type": info["type"],
                "name": info.get("name"),
                "threads": info.get("threads"),
            },
            "dtype": m.data["dtype"],
            "label": m.data.get("label"),
            "kernels": m.kernels,
        },
        **out,
        "fit": None,
    }
    if fit_it:
        f = fit(m, dev, out["kernel"], srcs.get(dev.name))
        out["fit"] = {
            "constants": f.constants,
            "start": f.start,
            "unconstrained": f.unconstrained,
            "error_before": f.before,
            "error_after": f.after,
            "warnings": f.warnings,
            "rows": rows(m, f.device, f.kernel),
            "output": None,
        }
        if output is not None:
            with reclaiming() as reclaimed:
                write_hardware_file(
                    Path(output),
                    f.device,
                    f.sources,
                    comment=(
                        f"{dev.name} fitted to {m.path} ({f.kernel}) by sparsetool simulate "
                        f"--measured --fit;\nuse it with sparsetool simulate --hardware "
                        f"{Path(output).name}"
                    ),
                )
            out["fit"]["output"] = str(output)
            return ResultDict(out, reclaimed)
    return ResultDict(out, [])


__all__ = [
    "BENCH_EXTRA",
    "FITTED",
    "INDEX_BYTES",
    "SCHEMA_VERSION",
    "VALUE_BYTES",
    "Fit",
    "Measurement",
    "choose_kernel",
    "compare",
    "errors",
    "fit",
    "load_measurement",
    "measured_device",
    "rows",
    "run_measured",
    "sized_for",
]
