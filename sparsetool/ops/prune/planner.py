"""What decides masks in ``prune``: the planner, in the two kinds the two orders of writing need.

A planner is made from the open checkpoint, its targeted tensors (in file order), the options and
the target plan. Its :meth:`~Planner.prepare` runs before the first byte of the output is written:
checks, and the first passes that something global needs (the threshold of ``--scope global``,
the non-zeros ``--fraction`` counts, the kept counts the ``bitmask`` header holds). Then the
writer asks it for each targeted tensor, in one of two orders:

* file order (:class:`FileOrderPlanner`; :class:`~sparsetool.ops.prune.magnitude.MagnitudePlanner`:
  magnitude or random masks, layer or global scope, N:M): the writer goes shard after shard,
  tensor after tensor, and asks for each targeted tensor when it reaches it. A plain float tensor
  may be :meth:`~FileOrderPlanner.stream`-ed (selected and written chunk by chunk, the fast path);
  any other is :meth:`~FileOrderPlanner.mask`-ed whole and the writer encodes it.
* block order (:class:`BlockOrderPlanner`;
  :class:`~sparsetool.ops.prune.calibrated.CalibratedPlanner`: Wanda, SparseGPT): a tensor's mask
  depends on the pruned blocks before it, so the planner drives: :meth:`~BlockOrderPlanner.run`
  hands each tensor to a :data:`Sink` as its block ends, and the writer, holding every output
  shard open, puts it at its place.

Either way the output's header is fixed before writing: :attr:`~Planner.nonzero_after` holds the
kept count of every tensor whose encoding's size depends on it (all of them in block order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from sparsetool.checkpoint.reader import LogicalTensor
from sparsetool.checkpoint.writer import ShardWriter

if TYPE_CHECKING:
    import torch

__all__ = ["Planner", "FileOrderPlanner", "BlockOrderPlanner", "Sink"]

Sink = Callable[[LogicalTensor, "torch.Tensor", "torch.Tensor"], None]
"""Takes a pruned tensor: (the tensor, its values in the stored dtype, the kept mask), as torch
tensors (the block-order planners compute with torch)."""


class Planner(Protocol):
    """What every planner offers the writer."""

    @property
    def nonzero_after(self) -> Mapping[str, int]:
        """Kept counts known before writing, by tensor name (the header's compressed sizes)."""
        ...

    def prepare(self) -> None:
        """Everything before the first byte is written (nothing, when nothing global is needed)."""
        ...


@runtime_checkable
class FileOrderPlanner(Planner, Protocol):
    """Decides one tensor's mask when the writer reaches it in file order."""

    def stream(self, lt: LogicalTensor, sw: ShardWriter) -> tuple[int, int] | None:
        """Select and write ``lt`` chunk by chunk into ``sw``: (non-zeros before, kept); or None,
        having written nothing, when :meth:`mask` must take it."""
        ...

    def mask(self, lt: LogicalTensor) -> tuple[np.ndarray, np.ndarray, int]:
        """``lt`` whole: (its values as stored (a float's bits), the kept mask, its non-zeros
        before pruning), numpy arrays in the tensor's shape."""
        ...


@runtime_checkable
class BlockOrderPlanner(Planner, Protocol):
    """Decides the masks in the model's block order and hands each over as its block ends."""

    @property
    def nonzero_before(self) -> Mapping[str, int]:
        """Each targeted tensor's non-zeros before pruning, counted by :meth:`prepare`."""
        ...

    @property
    def refined(self) -> dict | None:
        """After :meth:`run`: what refining the masks did (``--refine``), or None."""
        ...

    @property
    def experts(self) -> dict | None:
        """After :meth:`run`: for a Mixture of Experts, the calibration tokens routed to each
        expert's matrices and those pruned by magnitude for too few, or None."""
        ...

    def run(self, sink: Sink) -> None:
        """Prune every targeted tensor, calling ``sink`` once for each."""
        ...
