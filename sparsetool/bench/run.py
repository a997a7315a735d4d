"""A whole ``sparsetool bench`` run: every matrix, batch and kernel timed and checked, then what
the times mean: speed-up per shape and batch, the whole model's speed-up per token, break-even
sparsity where several sparsities were timed, and a one-line verdict.

The result is the JSON ``bench --json`` prints (schema ``"bench": 1``), which ``simulate
--measured`` reads. Speed-up is the dense median over the sparse median: above 1 the sparse kernel
is faster.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sparsetool.bench.kernels import (
    CPU_DENSE,
    CPU_SPARSE,
    CUDA_DENSE,
    CUDA_SPARSE,
    Kernel,
    Unavailable,
    cpu_kernel,
    cuda_kernel,
)
from sparsetool.bench.matrices import Matrix, two_four
from sparsetool.bench.timing import measure
from sparsetool.checkpoint.output_files import ResultDict, check_png
from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.hardware.measured import SCHEMA_VERSION
from sparsetool.util.machine import cpu_name
from sparsetool.util.wording import plural
from sparsetool.util.workers import usable_cores

BATCHES = (1, 8, 64, 512, 2048)
RTOL = {"float32": 1e-4, "bfloat16": 2e-2}
"""A product is correct when ``max |y - y_ref| <= rtol * max |y_ref|``, ``y_ref`` the float32
product of the same (dtype-rounded) values. float32 sums in another order differ by ~1e-6 of the
largest output; a kernel whose output is rounded to bfloat16 by ~4e-3."""


def kernel_names(
    device_type: str, dtype: str, chosen: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """The dense candidates and the sparse kernels to time on this kind of device; ``chosen``
    (``--kernel``) keeps only those sparse kernels."""
    if device_type == "cuda":
        dense, sparse = list(CUDA_DENSE), list(CUDA_SPARSE)
    else:
        dense = [n for n in CPU_DENSE if dtype != "float32" or n != "torch-linear-float32"]
        sparse = list(CPU_SPARSE)
    if chosen:
        wrong = [k for k in chosen if k not in sparse]
        if wrong:
            raise ConfigError(
                f"--kernel {wrong[0]}: the sparse kernels on {device_type} are {', '.join(sparse)}"
            )
        sparse = [k for k in sparse if k in chosen]
    return dense, sparse


def device_info(device: Any, threads: int) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:  # its version only: no need to import it for that
        scipy_version = version("scipy")
    except PackageNotFoundError:
        scipy_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    return {
        "type": device.type,
        "name": name,
        "threads": threads,
        "torch": torch.__version__,
        "scipy": scipy_version,
    }


def _error(y: Any, ref: Any) -> tuple[float, float]:
    """Max absolute error and the largest |reference| output."""
    return float((y - ref).abs().max()), float(ref.abs().max())


def _build(name: str, weight: Any, dtype: Any, device: Any, threads: int, is_24: bool) -> Kernel:
    if device.type == "cuda":
        return cuda_kernel(name, weight, dtype, device, is_24)
    return cpu_kernel(name, weight, dtype, threads)


def time_matrix(
    m: Matrix,
    weight: Any,
    batches: Sequence[int],
    dense_names: Sequence[str],
    sparse_names: Sequence[str],
    *,
    device: Any,
    dtype: str,
    threads: int,
    repeats: int,
    min_time: float,
    seed: int,
    step: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Every batch of one matrix: the fastest dense candidate and each sparse kernel, each
    checked against the float32 product of the same values."""
    import torch

    from sparsetool.models.open import DTYPES

    tdtype = DTYPES[dtype]
    nnz = int(torch.count_nonzero(weight))
    is_24 = weight.shape[1] % 4 == 0 and two_four(weight)
    skipped: dict[str, str] = {}
    kernels: dict[str, Kernel] = {}
    for name in [*dense_names, *sparse_names]:
        try:
            kernels[name] = _build(name, weight, tdtype, device, threads, is_24)
        except Unavailable as e:
            skipped[name] = str(e)
    if not any(n in kernels for n in dense_names):
        why = "; ".join(skipped.values())
        raise SparsetoolError(f"{m.name}: no dense kernel could run ({why})")
    exact = weight.to(tdtype).float()
    rtol = RTOL[dtype]
    runs = []
    for batch in batches:
        g = torch.Generator().manual_seed(seed + batch)
        x = torch.randn(batch, m.shape[1], generator=g)
        ref = torch.nn.functional.linear(x.to(tdtype).float(), exact)
        dense, sparse = None, {}
        for name, k in kernels.items():
            prepared = k.take(x)
            timing, out = measure(
                functools.partial(k.run, prepared), repeats=repeats, min_time=min_time, sync=k.sync
            )
            err, top = _error(k.result(out), ref)
            entry = {**timing.as_dict(), "max_abs_error": err, "ok": err <= rtol * max(top, 1e-30)}
            del out, prepared
            if name in dense_names:  # the fastest correct one (any, if none is)
                if dense is None or (entry["ok"], -entry["median_s"]) > (
                    dense["ok"],
                    -dense["median_s"],
                ):
                    dense = {"kernel": name, **entry}
            else:
                sparse[name] = entry
        if dense is None:  # a dense kernel was built (checked above), so one ran
            raise AssertionError(f"{m.name}: no dense kernel ran")
        for entry in sparse.values():
            entry["speedup"] = dense["median_s"] / entry["median_s"]
        correct = [n for n in sparse if sparse[n]["ok"]]
        best = max(correct, key=lambda n: sparse[n]["speedup"], default=None)
        runs.append(
            {
                "batch": batch,
                "dense": dense,
                "sparse": sparse,
                "best": best,
                "best_speedup": sparse[best]["speedup"] if best else None,
            }
        )
        step()
    numel = m.shape[0] * m.shape[1]
    return {
        "name": m.name,
        "shape": list(m.shape),
        "count": m.count,
        "roles": list(m.roles),
        "nnz": nnz,
        "sparsity": 1.0 - nnz / numel,
        "two_four": is_24,
        "runs": runs,
        "skipped": skipped,
    }


def model_summary(layers: list[dict[str, Any]], batches: Sequence[int]) -> list[dict[str, Any]]:
    """The whole model's time per token at each batch, for each group of matrices timed together
    (one per sparsity of a preset sweep; one for a checkpoint): dense everywhere, the best sparse
    kernel everywhere, and each shape on the faster of the two (``mixed``)."""
    groups: dict[float | None, list[dict[str, Any]]] = {}
    for ly in layers:
        groups.setdefault(ly["target_sparsity"], []).append(ly)
    out = []
    for target, lys in groups.items():
        numel = sum(ly["count"] * ly["shape"][0] * ly["shape"][1] for ly in lys)
        nnz = sum(ly["count"] * ly["nnz"] for ly in lys)
        rows = []
        for i, batch in enumerate(batches):
            dense = sum(ly["count"] * ly["runs"][i]["dense"]["median_s"] for ly in lys)
            best = [ly["runs"][i]["best"] for ly in lys]
            if any(b is None for b in best):
                sparse = None
            else:
                sparse = sum(
                    ly["count"] * ly["runs"][i]["sparse"][b]["median_s"] for ly, b in zip(lys, best)
                )
            runs = [ly["runs"][i] for ly in lys]
            mixed = sum(
                ly["count"]
                * min(
                    [e["median_s"] for e in r["sparse"].values() if e["ok"]]
                    + [r["dense"]["median_s"]]
                )
                for ly, r in zip(lys, runs)
            )
            rows.append(
                {
                    "batch": batch,
                    "dense_s": dense / batch,
                    "sparse_s": None if sparse is None else sparse / batch,
                    "speedup": None if sparse is None else dense / sparse,
                    "mixed_s": mixed / batch,
                    "mixed_speedup": dense / mixed,
                    "kernels": {ly["name"]: b for ly, b in zip(lys, best)},
                }
            )
        out.append(
            {
                "sparsity": 1.0 - nnz / numel,
                "target_sparsity": target,
                "matrices": sum(ly["count"] for ly in lys),
                "batches": rows,
            }
        )
    return out


def crossing(points: Sequence[tuple[float, float]]) -> tuple[str, float | None]:
    """Where speed-up reaches 1 along increasing sparsity, from ``(sparsity, speedup)`` points.

    Linear in log speed-up between the two points around the first crossing from below 1 to 1 or
    above. ``("crossed", s)``, ``("always", None)`` when even the least sparse point is at least
    1, ``("never", None)`` when no point reaches 1.

    >>> crossing([(0.5, 0.5), (0.9, 2.0)])
    ('crossed', 0.7)
    >>> crossing([(0.5, 1.2), (0.9, 3.0)]), crossing([(0.5, 0.2), (0.9, 0.8)])
    (('always', None), ('never', None))
    """
    pts = sorted(p for p in points if p[1] is not None and p[1] > 0)
    if not pts:
        return "never", None
    if pts[0][1] >= 1:
        return "always", None
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if v0 < 1 <= v1:
            a, b = math.log(v0), math.log(v1)
            return "crossed", s0 + (s1 - s0) * (0 - a) / (b - a)
    return "never", None


def break_even(
    layers: list[dict[str, Any]], batches: Sequence[int], kernels: Sequence[str]
) -> list[dict[str, Any]]:
    """Break-even sparsity per shape, batch and kernel (and ``best``: the fastest kernel at each
    sparsity), wherever a shape was timed at two sparsities or more."""
    shapes: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for ly in layers:
        shapes.setdefault(tuple(ly["shape"]), []).append(ly)
    out = []
    for shape, lys in shapes.items():
        if len({round(ly["sparsity"], 9) for ly in lys}) < 2:
            continue
        for i, batch in enumerate(batches):
            for k in [*kernels, "best"]:
                pts = []
                for ly in lys:
                    run = ly["runs"][i]
                    v = (
                        run["best_speedup"]
                        if k == "best"
                        else run["sparse"].get(k, {}).get("speedup")
                    )
                    pts.append((ly["sparsity"], v))
                if all(v is None for _, v in pts):
                    continue
                status, s = crossing(pts)
                best = max((v for _, v in pts if v is not None), default=None)
                out.append(
                    {
                        "shape": list(shape),
                        "batch": batch,
                        "kernel": k,
                        "status": status,
                        "sparsity": s,
                        "best_speedup": best,
                    }
                )
    return out


EVEN = 0.05
"""A speed-up within 5% of 1 is called even: this much moves between runs on a busy machine."""


def _listed(batches: list[int]) -> str:
    """>>> _listed([1]), _listed([1, 64]), _listed([1, 8, 64])
    ('1', '1 and 64', '1, 8 and 64')
    """
    words = [str(b) for b in batches]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def verdict(result: dict[str, Any]) -> str:
    """One line: does sparsity pay on this device, at which batches, from which sparsity."""
    where = "this GPU" if result["device"]["type"] == "cuda" else "this CPU"
    what = "this matrix" if result["source"] == "shape" else "the model's targeted matrices"
    models = result["model"]
    if not models:
        return "nothing timed"
    batches = result["batches"]
    if len(models) > 1:  # a sweep: where the whole (a shape's) time per token breaks even
        parts = []
        for i, b in enumerate(batches):
            pts = [(m["sparsity"], m["batches"][i]["speedup"]) for m in models]
            status, s = crossing(pts)
            best = max((v for _, v in pts if v is not None), default=None)
            parts.append(
                f"from {s:.0%} sparsity at batch {b}"
                if status == "crossed"
                else f"at every sparsity timed at batch {b}"
                if status == "always"
                else f"at no sparsity timed at batch {b}"
                + ("" if best is None else f" (best {best:.2f}x)")
            )
        return f"on {where} the fastest sparse kernels beat dense for {what} " + "; ".join(parts)
    rows = [(r["batch"], r["speedup"]) for r in models[0]["batches"]]
    if all(v is None for _, v in rows):
        return "no sparse kernel gave a correct product: nothing to conclude"
    span = ", ".join(f"{v:.2f}x at batch {b}" for b, v in rows if v is not None)
    fast = [b for b, v in rows if v is not None and v > 1 + EVEN]
    slow = [b for b, v in rows if v is not None and v < 1 - EVEN]
    even = [b for b, v in rows if v is not None and b not in fast and b not in slow]
    if not fast:
        tail = f"; about even at batch {_listed(even)}" if even else ""
        return (
            f"sparsity does not pay on {where}: the fastest sparse kernels are not faster for "
            f"{what} at any batch timed ({span}){tail}; use dense kernels here"
        )
    if not slow and not even:
        return f"sparsity pays on {where} at every batch timed: {what} ({span})"
    said = [f"sparsity pays on {where} at batch {_listed(fast)}"]
    if slow:
        said.append(f"not at batch {_listed(slow)}")
    if even:
        said.append(f"about even at batch {_listed(even)}")
    advice = ""
    if slow and max(fast) < min(slow):
        advice = ": sparse kernels for few tokens (decoding), dense for many"
    elif slow and min(fast) > max(slow):
        advice = ": sparse kernels for many tokens, dense for few"
    elif slow:
        advice = ": choose the kernel per batch"
    return "; ".join(said) + f" ({span}){advice}"


def notes(result: dict[str, Any], usable: int) -> list[str]:
    """What the reader should know before trusting the figures."""
    out = []
    dev = result["device"]
    if dev["type"] == "cpu" and dev["threads"] < usable:
        out.append(
            f"timed on {plural(dev['threads'], 'thread')} of the {usable} usable cores (the "
            f"others are busy); --threads {usable} to use them all"
        )
    dense = [ly["name"] for ly in result["layers"] if ly["nnz"] == ly["shape"][0] * ly["shape"][1]]
    if dense:
        more = "" if len(dense) == 1 else f" (and {len(dense) - 1} more)"
        out.append(
            f"{dense[0]} has no zeros{more}: the sparse kernels run it as a dense matrix "
            "in sparse storage"
        )
    if any(ly["nnz"] == 0 for ly in result["layers"]):
        out.append(
            "a matrix with no non-zero at all is timed: its sparse product only writes zeros"
        )
    return out


def _check_room(m: Matrix, batch: int, kernels: int) -> None:
    """Refuse, before anything is allocated, a matrix whose copies would not fit in memory: the
    float32 weight and its reference copy, each kernel's storage (at most 12 bytes per entry for
    CSR: value, index and row pointers), and a kernel's inputs and outputs."""
    from sparsetool.util.memory import available_memory, binary_bytes

    rows, cols = m.shape
    need = rows * cols * (8 + 12 * kernels) + batch * (rows + cols) * 4 * 4
    room = available_memory()
    if need > room:
        raise SparsetoolError(
            f"{m.name}: timing a {rows} x {cols} matrix at batch {batch} needs "
            f"about {binary_bytes(need)} and {binary_bytes(room)} is available; "
            "time a smaller --shape or fewer kernels (--kernel)"
        )


def run_bench(
    matrices: list[Matrix],
    *,
    source: str,
    label: str,
    batches: Sequence[int] = BATCHES,
    device: str = "cpu",
    dtype: str = "float32",
    kernels: Sequence[str] = (),
    repeats: int = 5,
    min_time: float = 0.2,
    threads: int = 1,
    seed: int = 0,
    plot: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> ResultDict:
    """Time ``matrices`` (:mod:`sparsetool.bench.matrices`) and return the bench JSON (its
    ``reclaimed``: the temporaries of killed runs removed beside ``plot``, a PNG checked before
    the timing and drawn after it)."""
    from sparsetool.models.open import resolve_device

    if plot is not None:
        check_png(plot)

    dev = resolve_device(device)
    dense_names, sparse_names = kernel_names(dev.type, dtype, kernels)
    total, done = len(matrices) * len(batches), 0
    layers: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}

    def step() -> None:
        nonlocal done
        done += 1
        if progress:
            progress("timing", done, total)

    if progress:
        progress("timing", 0, total)
    for m in matrices:
        _check_room(m, max(batches), len(dense_names) + len(sparse_names))
        weight = m.load()
        ly = time_matrix(
            m,
            weight,
            batches,
            dense_names,
            sparse_names,
            device=dev,
            dtype=dtype,
            threads=threads,
            repeats=repeats,
            min_time=min_time,
            seed=seed,
            step=step,
        )
        del weight
        ly["target_sparsity"] = m.target
        for k, why in ly.pop("skipped").items():
            skipped.setdefault(k, why)
        layers.append(ly)
    timed = [k for k in sparse_names if k not in skipped]
    result: dict[str, Any] = {
        "bench": SCHEMA_VERSION,
        "device": device_info(dev, threads),
        "dtype": dtype,
        "source": source,
        "label": label,
        "batches": list(batches),
        "kernels": timed,
        "dense_kernels": [k for k in dense_names if k not in skipped],
        "skipped": {k: v for k, v in skipped.items() if k in sparse_names},
        "options": {"repeats": repeats, "min_time_s": min_time, "seed": seed},
        "layers": layers,
        "model": model_summary(layers, batches),
        "break_even": break_even(layers, batches, timed),
        "failed": [
            {"name": ly["name"], "batch": r["batch"], "kernel": k}
            for ly in layers
            for r in ly["runs"]
            for k, e in [(r["dense"]["kernel"], r["dense"]), *r["sparse"].items()]
            if not e["ok"]
        ],
    }
    result["verdict"] = verdict(result)
    result["notes"] = notes(result, usable_cores())
    result["plot"] = None
    reclaimed = []
    if plot is not None:
        from sparsetool.bench.plot import plot_bench

        reclaimed = plot_bench(result, plot).reclaimed
        result["plot"] = str(plot)
    return ResultDict(result, reclaimed)
