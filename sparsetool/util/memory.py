"""How much memory a model-level command (``eval``, ``prune --method wanda|sparsegpt``) needs, and
whether this machine has it, decided before the long part.

Both hold one transformer block at a time (:mod:`sparsetool.models.blocks`), so the peak is the sum
of

- ``fixed``: the process as it stands when the plan is made (interpreter, torch, transformers, the
  tokenized text), measured;
- ``weights``: the largest block in compute precision, or the outer weights (embeddings, final
  norm, head) when the first and last passes run, whichever is larger;
- ``activations``: the hidden states of every window held (a block's input and output), plus what
  one forward pass through a block makes for one batch (attention scores, the feed-forward layer's
  hidden units) and, for eval, one chunk of logits;
- ``statistics``: calibration pruning only: the input statistics of one block, one set per
  distinct input (layers that read the same tensor, such as q/k/v, share it; Wanda: one float64 per
  input feature; SparseGPT: the in x in ``X^T X`` in float32, which becomes its inverse factor in
  place), all held while the windows run through the block, then fewer as the layers of each input
  are pruned, with one layer's solve beside them (its weight in float32, updated in place, and a
  few masks and copies of its size): the larger of the two moments.

The figures are estimates (within some tens of percent of the measured peak RSS, see
``benchmarks/RESULTS.md``); they exist to refuse at once a run that cannot fit instead of being
killed for memory after minutes or hours.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

from sparsetool.errors import SparsetoolError

__all__ = [
    "MemoryPlan",
    "available_memory",
    "budget",
    "process_memory",
    "binary_bytes",
    "release_freed_memory",
]


def binary_bytes(n: float) -> str:
    """Bytes in powers of 1024, three significant digits.

    >>> binary_bytes(1536), binary_bytes(13.5 * 2**30), binary_bytes(800)
    ('1.50 KiB', '13.5 GiB', '800 B')
    """
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            v = n / size
            return (
                f"{v:.0f} {unit}"
                if v >= 100
                else f"{v:.1f} {unit}"
                if v >= 10
                else f"{v:.2f} {unit}"
            )
    return f"{int(n)} B"


def process_memory() -> int:
    """This process's resident memory now (bytes); 0 where /proc is not there."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def _cgroup_room() -> int | None:
    """Bytes the memory cgroup still allows (v2 or v1), None without a limit."""
    for limit, used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            text = Path(limit).read_text().strip()
            if text == "max" or int(text) >= 2**60:
                return None
            return max(0, int(text) - int(Path(used).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None


def available_memory() -> int:
    """Memory this process may use in all: what it holds now plus what the system (and its memory
    cgroup, if any) can still give it (``MemAvailable``)."""
    room = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    if room is None:
        room = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = min(room, cgroup)
    return process_memory() + room


@dataclass
class MemoryPlan:
    """Estimated peak of a model-level run (bytes), and what it may use."""

    fixed: int
    weights: int
    activations: int
    statistics: int
    budget: int
    budget_source: str  # "--max-memory" or "available memory"
    held: int | None = None  # eval: windows passing the blocks together
    optimizer: int = 0  # train: gradients and Adam moments
    masks: int = 0  # train: the sparsifier's masks and a mask update's whole tensors
    per: str = ""  # "per process" when each process of a torchrun group needs this much

    @property
    def peak(self) -> int:
        return (
            self.fixed
            + self.weights
            + self.activations
            + self.statistics
            + self.optimizer
            + self.masks
        )

    def to_json(self) -> dict[str, object]:
        return {
            "peak_estimate": self.peak,
            "fixed": self.fixed,
            "weights": self.weights,
            "activations": self.activations,
            "statistics": self.statistics,
            **({"optimizer": self.optimizer} if self.optimizer else {}),
            **({"masks": self.masks} if self.masks else {}),
            "budget": self.budget,
            "budget_source": self.budget_source,
            **({"windows_held": self.held} if self.held is not None else {}),
        }

    def _parts(self) -> list[tuple[str, int]]:
        parts = [
            ("weights", self.weights),
            ("activations", self.activations),
            ("statistics", self.statistics),
            ("gradients and Adam moments", self.optimizer),
            ("masks and a mask update", self.masks),
            ("fixed", self.fixed),
        ]
        return [(k, v) for k, v in parts if v or k in ("weights", "activations", "fixed")]

    def describe(self) -> str:
        per = f" {self.per}" if self.per else ""
        return (
            f"memory plan{per}: {' + '.join(f'{k} {binary_bytes(v)}' for k, v in self._parts())} = "
            f"{binary_bytes(self.peak)} of {binary_bytes(self.budget)} {self.budget_source}"
        )

    def check(self, what: str, lower: str) -> None:
        """Refuse a plan that does not fit: one line with the figures and the options that lower
        it."""
        if self.peak > self.budget:
            raise SparsetoolError(
                f"{what} needs about {binary_bytes(self.peak)} of "
                f"memory{' ' + self.per if self.per else ''} "
                f"({', '.join(f'{k} {binary_bytes(v)}' for k, v in self._parts())}) but has "
                f"{binary_bytes(self.budget)} ({self.budget_source}); lower it with "
                f"{lower}"
            )


def budget(max_memory: int | None) -> tuple[int, str]:
    """What a run may use: ``--max-memory`` if given, else what the machine has available."""
    if max_memory is not None:
        return max_memory, "--max-memory"
    return available_memory(), "available memory"


def release_freed_memory() -> None:
    """Hand the memory the process has freed back to the system, between two passes.

    glibc keeps freed blocks in its heap for reuse, and a pass that frees many tensors of
    varied sizes leaves a heap the next pass does not fill again: OWL's statistics pass, then the
    pruning pass, held about 125 MB more at their peak on SmolLM2-135M than the pruning pass
    alone, and 28 MB more after this call (``malloc_trim``). Nothing happens where the C library
    has no ``malloc_trim``."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return
    trim(0)
