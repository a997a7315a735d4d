"""Per-tensor keep counts for a target sparsity: uniform and Erdos-Renyi-Kernel (ERK).

Every distribution has one signature, ``f(shapes, sparsity) -> {name: keep}``, and is found by name
in :data:`DISTRIBUTIONS` (:func:`keep_counts`). A tensor that holds several matrices along its first
dimension (the experts of a mixture-of-experts layer, fused) gets a count per matrix
(:func:`part_keep_counts`). Counts are integers and exact: the ERK total equals
the uniform total, ``sum(numel - round(sparsity * numel))``. No torch needed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from sparsetool.errors import ConfigError
from sparsetool.util.options import check_sparsity

__all__ = [
    "uniform_keep",
    "erk_keep",
    "keep_counts",
    "part_keep_counts",
    "largest_remainder",
    "DISTRIBUTIONS",
]


def uniform_keep(numels: Mapping[str, int], sparsity: float) -> dict[str, int]:
    """The same sparsity in every tensor: keep ``numel - round(sparsity * numel)`` of each.

    >>> uniform_keep({"a": 10, "b": 3}, 0.5)
    {'a': 5, 'b': 1}
    """
    s = check_sparsity(sparsity, "sparsity")
    return {name: int(n) - round(s * int(n)) for name, n in numels.items()}


def erk_keep(
    shapes: Mapping[str, tuple[int, ...]], sparsity: float, *, power_scale: float = 1.0
) -> dict[str, int]:
    """Erdos-Renyi-Kernel keep counts (Evci et al. 2020, "Rigging the Lottery", Section 3 and
    Appendix; the Erdos-Renyi form is Mocanu et al. 2018, SET).

    The density of tensor l is ``d_l = eps * (sum(shape_l) / prod(shape_l)) ** power_scale``
    (for a linear layer (out, in): ``eps * (1/in + 1/out)``, so small layers are denser), with the
    one ``eps`` that makes ``sum_l d_l * numel_l`` equal the uniform total kept
    ``K = sum_l (numel_l - round(sparsity * numel_l))``. A tensor whose density would pass 1 is
    made dense and ``eps`` is solved again over the rest, until none passes 1 (RigL's procedure).
    The real-valued counts ``d_l * numel_l`` are rounded by largest remainder (ties to the earlier
    tensor), so the total is exactly ``K``. ``power_scale`` 0 gives uniform densities.

    >>> erk_keep({"small": (4, 4), "big": (64, 64)}, 0.9)
    {'small': 16, 'big': 396}
    >>> sum(erk_keep({"a": (8, 32), "b": (32, 8), "c": (32, 32)}, 0.8).values())
    307
    """
    s = check_sparsity(sparsity, "sparsity")
    numel = {name: math.prod(int(x) for x in shape) for name, shape in shapes.items()}
    target = sum(uniform_keep(numel, s).values())
    raw: dict[str, float] = {}
    for name, shape in shapes.items():
        if numel[name] == 0:
            raw[name] = 0.0
        else:
            raw[name] = (sum(int(x) for x in shape) / numel[name]) ** power_scale
    dense: set[str] = set()
    real: dict[str, float] = {}
    while True:
        free = [n for n in shapes if n not in dense and numel[n] > 0]
        budget = target - sum(numel[n] for n in dense)
        divisor = sum(raw[n] * numel[n] for n in free)
        eps = budget / divisor if divisor > 0 else 0.0
        over = [n for n in free if eps * raw[n] > 1.0]
        if not over:
            break
        top = max(raw[n] for n in over)  # RigL densifies the layers with the largest raw density
        dense.update(n for n in over if raw[n] == top)
    for name in shapes:
        if name in dense:
            real[name] = float(numel[name])
        else:
            real[name] = min(eps * raw[name] * numel[name], float(numel[name]))
    return largest_remainder(real, numel, target)


def largest_remainder(
    real: Mapping[str, float], cap: Mapping[str, int], target: int
) -> dict[str, int]:
    """Integers near ``real`` summing to ``target``, each within [0, cap]."""
    out = {n: min(cap[n], max(0, math.floor(v))) for n, v in real.items()}
    short = target - sum(out.values())
    order = sorted(real, key=lambda n: -(real[n] - math.floor(real[n])))  # stable: earlier first
    while short != 0:
        moved = False
        for n in order if short > 0 else reversed(order):
            if short > 0 and out[n] < cap[n]:
                out[n] += 1
                short -= 1
                moved = True
            elif short < 0 and out[n] > 0:
                out[n] -= 1
                short += 1
                moved = True
            if short == 0:
                break
        if not moved:
            raise AssertionError("cannot reach the target count")  # target <= sum(cap) always
    return out


def _uniform_from_shapes(shapes: Mapping[str, tuple[int, ...]], sparsity: float) -> dict[str, int]:
    return uniform_keep({n: math.prod(int(x) for x in s) for n, s in shapes.items()}, sparsity)


DISTRIBUTIONS: dict[str, Callable[[Mapping[str, tuple[int, ...]], float], dict[str, int]]] = {
    "uniform": _uniform_from_shapes,
    "erk": erk_keep,
}
"""Name -> ``f(shapes, sparsity) -> {name: keep}``."""


def keep_counts(
    shapes: Mapping[str, tuple[int, ...]], sparsity: float, distribution: str = "uniform"
) -> dict[str, int]:
    """Keep counts of each tensor under the named distribution (``uniform`` or ``erk``).

    >>> keep_counts({"a": (2, 5)}, 0.5, "uniform")
    {'a': 5}
    >>> keep_counts({"a": (2, 5)}, 0.5, "dense")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: unknown distribution 'dense'; choose one of: uniform, erk
    """
    try:
        f = DISTRIBUTIONS[distribution]
    except KeyError:
        raise ConfigError(
            f"unknown distribution {distribution!r}; choose one of: {', '.join(DISTRIBUTIONS)}"
        ) from None
    return f(shapes, sparsity)


def part_keep_counts(
    shapes: Mapping[str, tuple[int, ...]],
    parts: Mapping[str, int],
    sparsity: float,
    distribution: str = "uniform",
) -> dict[str, list[int]]:
    """Keep counts per part: tensor ``name`` is ``parts[name]`` matrices of shape ``shape[1:]``
    stacked along its first dimension (1, or absent: the tensor is one unit), and each matrix is a
    unit of the distribution on its own, as if it were stored apart. So a uniform sparsity keeps
    ``size - round(sparsity * size)`` of each matrix and ERK gives each matrix the density of an
    (out, in) layer, not of the 3-D whole; the counts of one tensor's matrices sum to its count.

    >>> part_keep_counts({"experts": (4, 32, 48), "q": (32, 32)}, {"experts": 4}, 0.5)
    {'experts': [768, 768, 768, 768], 'q': [512]}
    """
    units: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        p = parts.get(name, 1)
        if p == 1:
            units[name] = tuple(shape)
            continue
        if not shape or shape[0] != p:
            raise ValueError(
                f"{name}: shape {tuple(shape)} is not {p} parts along its first dimension"
            )
        units.update({f"{name}[{e}]": tuple(shape[1:]) for e in range(p)})
    keep = keep_counts(units, sparsity, distribution)
    return {
        name: [keep[name]]
        if parts.get(name, 1) == 1
        else [keep[f"{name}[{e}]"] for e in range(parts[name])]
        for name in shapes
    }
