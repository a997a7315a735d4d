"""Run a workload on every device: time, speedup over the device's own dense run, theoretical
``1 / (1 - s)`` (for a whole model: dense FLOPs over sparse FLOPs), and where the time goes.

A training step is forward + backward-data + backward-weight (backward = 2 x forward FLOPs,
Chinchilla Appendix F). The dense work around the pruned matmuls (attention, logits) is timed at
the device's dense rate and added to both the sparse and the dense run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sparsetool.hardware.devices import PASSES, Cost, Dataflow, Device, Refused
from sparsetool.hardware.workload import Workload
from sparsetool.util.wording import plural


def _ratio(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def _flops(wl: Workload) -> tuple[float, float]:
    dense = sum(2.0 * wl.tokens * ly.numel for ly in wl.layers) + wl.untargeted_flops
    sparse = sum(2.0 * wl.tokens * ly.nnz for ly in wl.layers) + wl.untargeted_flops
    return dense, sparse


def _run(
    dev: Device, wl: Workload, passes: tuple[str, ...], dense: bool
) -> tuple[Cost, dict, list]:
    """Summed cost over layers and passes, per-pass totals, per-layer forward totals."""
    total, per_pass, per_layer = Cost(), {}, []
    untargeted = dev.untargeted_cost(wl.untargeted_flops)
    for p in passes:
        acc = Cost()
        for ly in wl.layers:
            c = dev.dense_cost(ly, wl.tokens, p) if dense else dev.cost(ly, wl.tokens, p)
            acc = acc + c
            if p == "forward":
                per_layer.append(c.total)
        acc = acc + untargeted
        per_pass[p] = acc.total
        total = total + acc
    return total, per_pass, per_layer


def _balanced(dev: Device, wl: Workload, passes: tuple[str, ...]) -> float:
    """Time with the imbalance term removed (every core group as busy as the mean)."""
    t = 0.0
    for p in passes:
        for ly in wl.layers:
            c = dev.cost(ly, wl.tokens, p)
            t += Cost.roofline(c.compute, c.memory, c.fixed).total
        t += dev.untargeted_cost(wl.untargeted_flops).total
    return t


def _summary(sparse: Cost, dense: Cost, theoretical: float | None, untargeted_s: float) -> dict:
    return {
        "time_s": sparse.total,
        "dense_time_s": dense.total,
        "speedup": _ratio(dense.total, sparse.total),
        "theoretical": theoretical,
        "breakdown": {k: v for k, v in sparse.as_dict().items() if k != "total"},
        "untargeted_s": untargeted_s,
    }


def simulate(wl: Workload, devices: Mapping[str, Device] | Iterable[Device]) -> dict[str, Any]:
    """The whole comparison as a JSON-ready dictionary (see docs/simulate.md for the keys)."""
    devs = list(devices.values()) if isinstance(devices, Mapping) else list(devices)
    dense_flops, sparse_flops = _flops(wl)
    theo = _ratio(dense_flops, sparse_flops)
    grid = next((d.grid for d in devs if isinstance(d, Dataflow)), None)
    out_devices, layer_speedups = [], {}
    layer_paths: dict[str, list[str]] = {}
    for dev in devs:
        entry: dict[str, Any] = {
            "name": dev.name,
            "kind": dev.kind,
            "applicable": True,
            "reason": None,
            "notes": [],
            "busiest_over_mean": None,
        }
        try:
            results = {}
            for key, passes in (("forward", ("forward",)), ("train_step", PASSES)):
                sp, per_pass, per_layer = _run(dev, wl, passes, dense=False)
                de, _, dense_layer = _run(dev, wl, passes, dense=True)
                u = dev.untargeted_cost(wl.untargeted_flops).total * len(passes)
                results[key] = _summary(sp, de, theo, u)
                if key == "train_step":
                    results[key]["passes"] = per_pass
                else:
                    layer_speedups[dev.name] = [
                        _ratio(d, s) for d, s in zip(dense_layer, per_layer)
                    ]
                results[key]["speedup_if_balanced"] = (
                    _ratio(de.total, _balanced(dev, wl, passes))
                    if isinstance(dev, Dataflow)
                    else None
                )
            entry.update(results)
            entry["notes"] = dev.notes(wl.layers, PASSES)
            if isinstance(dev, Dataflow):
                paths = [dev.path(ly, wl.tokens, "forward") for ly in wl.layers]
                layer_paths[dev.name] = paths
                sparse_layers = [ly for ly in wl.layers if not ly.is_dense]
                fell_back = sum(
                    1 for ly, p in zip(wl.layers, paths) if not ly.is_dense and p == "dense"
                )
                if fell_back:
                    entry["notes"].append(
                        f"{fell_back} of {plural(len(sparse_layers), 'sparse layer')} run the "
                        "dense kernel, which is "
                        "faster at their sparsity (each non-zero carries an index; set "
                        "dense_fallback = false in a --hardware file to force the sparse kernel)"
                    )
                b = results["forward"]["breakdown"]
                entry["busiest_over_mean"] = (
                    (b["compute"] + b["imbalance"]) / b["compute"] if b["compute"] > 0 else 1.0
                )
        except Refused as e:
            entry.update(applicable=False, reason=str(e), forward=None, train_step=None)
            layer_speedups[dev.name] = [None] * len(wl.layers)
        out_devices.append(entry)
    layers = []
    for i, ly in enumerate(wl.layers):
        row: dict[str, Any] = {
            "name": ly.name,
            "role": ly.role,
            "shape": [ly.out_features, ly.in_features],
            "sparsity": ly.sparsity,
            "nonzero": ly.nnz,
            "nm_violation_in": ly.nm_violation_in,
            "nm_violation_out": ly.nm_violation_out,
            "measured": ly.measured,
        }
        # The same keys with or without a dataflow device (None without one).
        row["busiest_over_mean"] = ly.busiest_over_mean(grid) if grid is not None else None
        row["core_groups"] = list(grid) if grid is not None else None
        row["speedup"] = {name: sp[i] for name, sp in layer_speedups.items()}
        row["kernel"] = (
            {name: paths[i] for name, paths in layer_paths.items()} if layer_paths else None
        )
        layers.append(row)
    return {
        "workload": {
            "label": wl.label,
            "source": wl.source,
            "tokens": wl.tokens,
            "seq_len": wl.seq_len,
            "layers": len(wl.layers),
            "targeted_sparsity": wl.sparsity,
            "forward_flops": {"dense": dense_flops, "sparse": sparse_flops},
            "train_flops": {"dense": 3 * dense_flops, "sparse": 3 * sparse_flops},
            "untargeted_forward_flops": wl.untargeted_flops,
            "theoretical": theo,
            "notes": wl.notes,
            "targeting": wl.targeting or None,
            "moe": wl.moe,
        },
        "devices": out_devices,
        "layers": layers,
    }


APPENDIX_C_TICKS = tuple(round(1 - 1 / n, 4) for n in range(1, 11))
"""0, .5, .6667, .75, .8, .8333, .8571, .875, .8889, .9: the SPDF Appendix C figure's x ticks
(theoretical speedups 1, 2, ..., 10)."""


def run_row(sparsity: float, res: Mapping[str, Any]) -> dict[str, Any]:
    """One point of a sweep from a :func:`simulate` result: the speedups of every device."""
    return {
        "sparsity": sparsity,
        "theoretical": res["workload"]["theoretical"],
        "devices": {
            d["name"]: {
                "kind": d["kind"],
                "forward_speedup": d["forward"]["speedup"] if d["applicable"] else None,
                "train_speedup": d["train_step"]["speedup"] if d["applicable"] else None,
                "forward_time_s": d["forward"]["time_s"] if d["applicable"] else None,
            }
            for d in res["devices"]
        },
    }


def sweep(
    make: Callable[[float], Workload], sparsities: Iterable[float], devices: Mapping[str, Device]
) -> list[dict[str, Any]]:
    """Speedups (forward and training step) at each sparsity, one fresh workload per point."""
    return [run_row(s, simulate(make(s), devices)) for s in sparsities]
