"""Which weight matrices ``sparsetool bench`` times, and with which masks.

A model has many targeted matrices of few shapes (a Llama-7B: 224 matrices of 3 shapes), so one
matrix of each distinct ``M x K`` shape is timed and stands for every matrix of that shape:
``count`` says how many a token passes through (the weighting of the whole model's time).

- A checkpoint: its real weights and masks. Of the matrices of one shape, the one whose sparsity
  is the median of theirs is timed (layers pruned to different sparsities, by OWL for instance,
  differ in speed; the median one is the typical). A mixture of experts counts the matrices of
  the ``top_k`` experts a token is routed to, as ``simulate`` does.
- A ``flops`` preset at one or several sparsities: its shapes with seeded random weights and
  uniformly random masks of exact counts.
- One ``M x K`` shape at one or several sparsities, with a seeded mask of a chosen pattern.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sparsetool.errors import CheckpointError
from sparsetool.hardware.layers import synthetic_mask


@dataclass
class Matrix:
    """One matrix to time: its name, shape ``(M, K)``, how many of the model's matrices it stands
    for, its sparsity, how to load its masked float32 weight, and the sparsity asked for
    (``target``: None for a checkpoint's own masks)."""

    name: str
    shape: tuple[int, int]
    count: int
    sparsity: float
    load: Callable[[], torch.Tensor]
    roles: tuple[str, ...] = ()
    target: float | None = None


def _random_weight(
    shape: tuple[int, int], sparsity: float, pattern: str, seed: int
) -> torch.Tensor:
    mask = synthetic_mask(shape, sparsity, pattern, seed)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g, dtype=torch.float32)
    return w.mul_(torch.from_numpy(mask))


def from_shape(
    shape: tuple[int, int], sparsities: Sequence[float], pattern: str = "random", seed: int = 0
) -> list[Matrix]:
    """One matrix per sparsity (the same seeded weights, masks of the ``pattern``)."""
    name = f"{shape[0]}x{shape[1]}"
    return [
        Matrix(
            name, shape, 1, s, functools.partial(_random_weight, shape, s, pattern, seed), target=s
        )
        for s in sparsities
    ]


def from_model(cfg: Any, sparsities: Sequence[float], seed: int = 0) -> list[Matrix]:
    """The distinct shapes of a flops preset (``ModelConfig``), each at every sparsity."""
    from sparsetool.hardware.workload import model_layers

    shapes: dict[tuple[int, ...], list[str]] = {}  # (m, k)
    for _, role, shape in model_layers(cfg):
        shapes.setdefault(tuple(shape), []).append(role)
    return [
        Matrix(
            f"{m}x{k}",
            (m, k),
            len(roles),
            s,
            functools.partial(_random_weight, (m, k), s, "random", seed),
            tuple(dict.fromkeys(roles)),
            target=s,
        )
        for s in sparsities
        for (m, k), roles in shapes.items()
    ]


_EXPERT = re.compile(r"^(.*)\[(\d+)\]$")


def from_checkpoint(
    path: Path,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> tuple[list[Matrix], dict[str, Any]]:
    """One matrix per distinct shape of the checkpoint's targeted matrices, with its real mask,
    and how the tensors were targeted (:func:`sparsetool.targets.recorded.targeting_summary`).

    The masks are counted as ``simulate`` counts them (every targeted matrix is read once); then
    only the matrices chosen are read again, when they are timed."""
    from sparsetool.hardware.workload import checkpoint_layers
    from sparsetool.targets.recorded import targeting_summary

    path = Path(path)
    layers, _, plan, _ = checkpoint_layers(
        path, [], progress, include=include, exclude=exclude, default_targets=default_targets
    )
    if not layers:
        chosen = " (--include/--exclude left none)" if include or exclude else ""
        raise CheckpointError(
            f"'{path}' has no targeted weight matrices to time{chosen}; time a "
            "preset or one shape instead, e.g. --model gpt2-small --sparsity "
            "0.9 or --shape 4096x4096 --sparsity 0.9"
        )
    groups: dict[tuple[int, int], list[Any]] = {}
    for ly in layers:
        groups.setdefault((ly.out_features, ly.in_features), []).append(ly)
    out = []
    for shape, lys in groups.items():
        chosen = sorted(lys, key=lambda ly: (ly.sparsity, ly.name))[(len(lys) - 1) // 2]
        out.append(
            Matrix(
                chosen.name,
                shape,
                len(lys),
                chosen.sparsity,
                functools.partial(
                    _read, path, chosen.name, shape, include, exclude, default_targets
                ),
                tuple(dict.fromkeys(ly.role for ly in lys)),
            )
        )
    return out, targeting_summary(plan)


def _read(
    path: Path,
    name: str,
    shape: tuple[int, int],
    include: Sequence[str],
    exclude: Sequence[str],
    default_targets: bool,
) -> torch.Tensor:
    """The masked weight ``name`` (``tensor[e]``: expert ``e`` of a fused tensor) as ``(M, K)``."""
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.encodings import decode
    from sparsetool.targets.recorded import plan_checkpoint_targets

    hit = _EXPERT.match(name)
    base, expert = (hit.group(1), int(hit.group(2))) if hit else (name, None)
    with open_checkpoint(path) as ck:
        lt = next((t for t in ck.logical if t.name == base), None)
        if lt is None:
            raise CheckpointError(
                f"{path}: tensor '{base}' is gone; was the checkpoint changed "
                "while bench ran? run it again"
            )
        plan = plan_checkpoint_targets(
            ck.logical,
            ck.config,
            ck.metadata(),
            include,
            exclude,
            default_targets=default_targets,
            source=path.name,
        )
        dense, mask = decode(ck, lt)
    w = dense.float() if mask is None else dense.float() * mask
    dim = plan[base].input_dim
    if expert is not None:
        w, dim = w[expert], dim - 1
    if dim == 0:
        w = w.T
    w = w.contiguous()
    if tuple(w.shape) != shape:
        raise CheckpointError(
            f"{path}: tensor '{name}' has shape {list(w.shape)}, expected "
            f"{list(shape)}; was the checkpoint changed while bench ran?"
        )
    return w


def two_four(weight: torch.Tensor) -> bool:
    """Whether every group of 4 consecutive weights along K keeps at most 2 (the 2:4 pattern).

    >>> two_four(torch.tensor([[1.0, 0.0, 2.0, 0.0]]))
    True
    >>> two_four(torch.tensor([[1.0, 1.0, 2.0, 0.0]]))
    False
    """
    from sparsetool.hardware.layers import nm_violation

    return nm_violation(np.ascontiguousarray(weight.numpy() != 0), axis=1) == 0.0
