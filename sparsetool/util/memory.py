"""How much memory a model-level command (``eval``, ``prune --method wanda|sparsegpt``) needs, and
whether this machine has it, decided before the long part.

Both hold one transformer block at a time (:mod:`sparsetool.models.blocks`), so the peak is the sum of

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
    "fine_tuning_plan",
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

    def to_json(self) -> dict:
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
        """Refuse a plan that does not fit: one line with the figures and the options that lower it."""
        if self.peak > self.budget:
            raise SparsetoolError(
                f"{what} needs about {binary_bytes(self.peak)} of memory{' ' + self.per if self.per else ''} "
                f"({', '.join(f'{k} {binary_bytes(v)}' for k, v in self._parts())}) "
                f"but has {binary_bytes(self.budget)} ({self.budget_source}); lower it with {lower}"
            )


def budget(max_memory: int | None) -> tuple[int, str]:
    """What a run may use: ``--max-memory`` if given, else what the machine has available."""
    if max_memory is not None:
        return max_memory, "--max-memory"
    return available_memory(), "available memory"


def fine_tuning_plan(
    params: int,
    *,
    batch: int,
    context: int,
    d_model: int,
    n_layer: int,
    n_head: int,
    vocab: int,
    max_memory: int | None = None,
    targeted: int = 0,
    strategy: str = "ddp",
    world: int = 1,
    local_world: int = 1,
    bf16: bool = False,
    offload: bool = False,
    device_memory: int | None = None,
    reading: bool = True,
) -> MemoryPlan:
    """The peak of one process fine-tuning a whole model with AdamW (``train --init HF_DIR``), or
    of each process of a torchrun group of ``world`` (``local_world`` of them on this machine):

    - activations kept for the backward pass: per layer ``34 s b h + 5 a s^2 b`` bytes in 16-bit
      (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
      eq. 1), twice that in float32 (without ``bf16``), plus the logits and their gradient
      (``b s V``, float32, 3x);
    - one process, or ``strategy`` ddp (a whole copy per process): weights 4 bytes a parameter and,
      when ``reading`` a checkpoint, its tensors while they are copied into the model (4 more);
      gradients, Adam's two moments and the temporary of its step 16 bytes a parameter (DDP: 4
      more for its gradient buckets); masks 1 byte a targeted weight;
    - ``strategy`` fsdp: weights, gradients, moments and masks divided by ``world``; the blocks
      whose whole weights are gathered at a time (the one computing and the next, about
      ``2 P / n_layer`` weights, 2 bytes each with ``bf16``); a mask update's whole tensor with its
      gradient and scores (about ``13 P / (3 n_layer)`` bytes); and, unless ``reading`` (then each
      process reads only its slices), the whole model built from random weights before it is
      sharded (4 bytes a parameter, counted when it exceeds the steady state).
      ``offload`` (a GPU run) keeps the slices in CPU memory: the GPU holds the rest.

    ``device_memory`` (a GPU's) is the budget of a GPU run; else it is this machine's available
    memory divided among its ``local_world`` processes.

    >>> p = fine_tuning_plan(10**9, batch=1, context=512, d_model=2048, n_layer=24, n_head=16,
    ...                      vocab=32000, max_memory=64 * 2**30)
    >>> p.weights, p.optimizer
    (8000000000, 16000000000)
    >>> f = fine_tuning_plan(10**9, batch=1, context=512, d_model=2048, n_layer=24, n_head=16,
    ...                      vocab=32000, strategy="fsdp", world=8, device_memory=80 * 2**30)
    >>> f.optimizer, f.weights - 500_000_000, f.budget_source
    (2000000000, 333333328, 'GPU memory')
    """
    per_layer = (1 if bf16 else 2) * (
        34 * context * batch * d_model + 5 * n_head * context * context * batch
    )
    logits = 3 * batch * context * vocab * 4
    if max_memory is not None:
        total, source = max_memory, "--max-memory"
    elif device_memory is not None:
        total, source = device_memory, "GPU memory"
    else:
        total, source = available_memory() // max(1, local_world), "available memory"
        if local_world > 1:
            source = f"available memory / {local_world} processes"
    sharded = strategy == "fsdp"
    ways = world if sharded else 1
    # gradients 4, AdamW's two moments 8, and the temporary its step makes (one tensor the size of
    # the weights: torch's foreach AdamW takes sqrt(v) out of place) 4 bytes a parameter
    weights, optimizer = 4 * params // ways, 16 * params // ways
    masks = targeted // ways
    if sharded:
        unit = params // max(1, n_layer)
        weights += 2 * unit * (2 if bf16 else 4)
        masks += 13 * unit // 3
        if offload:  # the slices live in CPU memory between uses
            weights, optimizer = weights - 4 * params // ways, 0
        # from random weights the whole model exists before it is sharded (CPU memory); from a
        # checkpoint the parameters are made empty and each process reads only its slices
        building = 0 if reading else 4 * params
        if device_memory is None:
            weights = max(weights, building - optimizer - masks)
    else:
        if reading:
            weights += 4 * params  # the checkpoint's tensors while copied into the model
        if world > 1:
            optimizer += 4 * params  # DDP's gradient buckets
    fixed = process_memory() if device_memory is None else 0
    return MemoryPlan(
        fixed=fixed,
        weights=weights,
        optimizer=optimizer,
        activations=n_layer * per_layer + logits,
        statistics=0,
        budget=total,
        budget_source=source,
        masks=masks,
        per="per process" if world > 1 else "",
    )


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
