"""The disk a training run's checkpoints take, worked out before the run starts: what one
checkpoint holds (the model with its masks, the optimizer and sparsifier state for an exact
resume, the small files), how many are on disk at once (``keep_last``, plus the one being
written), and the run's own copy of the model; checked against the free space of the run
directory's file system (a run that cannot write even one checkpoint is refused at once).

What a checkpoint holds (:mod:`.runfiles`, :mod:`.shardedckpt`)::

    model.safetensors   every state-dict entry in float32 (a tied head twice), 1 byte a
                        targeted weight for its mask when the run is sparse
    optimizer.pt        AdamW's two float32 moments a parameter, the sparsifier's masks again
                        (and, for set, rigl and granet, the weights the last update regrew)
    shards/             instead of optimizer.pt, an FSDP run's: the weights a third time, the
                        moments and the masks, in slices
    the rest            config.json, state.json, a Hugging Face model's tokenizer files

The figures are estimates from the tensors' sizes (the files' headers and torch's archive
records are a few hundred bytes a tensor); ``tests/train/test_train_disk.py`` holds them
against the bytes a run writes.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from sparsetool.errors import SparsetoolError
from sparsetool.util.memory import binary_bytes
from sparsetool.util.wording import plural

__all__ = ["DiskPlan", "checkpoint_steps", "estimate", "free_bytes", "held_at_once"]

REGROWING = ("set", "rigl", "granet")  # algorithms whose state records the weights regrown
_ENTRY = 96  # a safetensors header entry beyond its name (dtype, shape, offsets)
_RECORD = 400  # a tensor in torch.save's archive: its zip records, alignment and pickle
_STATE_JSON = 8_000  # state.json: step, data position and the RNG state (base64)
_METADATA = 4_096  # a checkpoint's provenance metadata beyond the targeted names


@dataclass(frozen=True)
class DiskPlan:
    """Bytes a run's checkpoints take (estimates) and the free bytes where they go."""

    model: int  # a checkpoint's model.safetensors: weights, masks, header
    optimizer: int  # optimizer.pt (or FSDP's shards/ and sparsifier.json)
    masks: int  # of ``model`` and ``optimizer``: every copy of the masks
    other: int  # config.json, state.json, tokenizer files
    final: int  # the run's own model: RUN/model.safetensors, or RUN/model/ (a Hugging Face run)
    saves: int  # checkpoints this run writes
    keep_last: int  # how many the run keeps (0: all)
    free: int  # free bytes on the run directory's file system
    final_name: str = "model.safetensors"

    @property
    def checkpoint(self) -> int:
        """One checkpoint directory."""
        return self.model + self.optimizer + self.other

    @property
    def at_once(self) -> int:
        """Checkpoints on disk at once at most (the newest is written before older ones go)."""
        return held_at_once(self.saves, self.keep_last)

    @property
    def first_save(self) -> int:
        """What the first save needs: one checkpoint and the run's model (written beside a
        previous one, then renamed over it)."""
        return self.checkpoint + self.final

    @property
    def peak(self) -> int:
        """The most the run's checkpoints and model take at once."""
        return self.at_once * self.checkpoint + self.final

    def to_json(self) -> dict:
        return {
            "checkpoint_bytes": self.checkpoint,
            "model_bytes": self.model,
            "optimizer_bytes": self.optimizer,
            "masks_bytes": self.masks,
            "other_bytes": self.other,
            "final_model_bytes": self.final,
            "saves": self.saves,
            "keep_last": self.keep_last,
            "checkpoints_at_once": self.at_once,
            "peak_bytes": self.peak,
            "free_bytes": self.free,
        }

    def describe(self) -> str:
        """One line for the start of the run.

        >>> import textwrap
        >>> plan = DiskPlan(651 * 2**20, 1180 * 2**20, 0, 4 * 2**20, 538 * 2**20, 3, 2, 20 * 2**30,
        ...                 "model/")
        >>> print(textwrap.fill(plan.describe(), 90))
        disk: 1.79 GiB a checkpoint (model 651 MiB + optimizer state 1.15 GiB + 4.00 MiB other); 3
        saves, the last 2 kept (3 on disk while the newest is written) + model/ 538 MiB: up to
        5.90 GiB of 20.0 GiB free (fewer: 'keep_last: 1' in a --config file, or a larger --save-
        every)
        """
        size = binary_bytes
        parts = f"model {size(self.model)} + optimizer state {size(self.optimizer)}"
        if self.masks:
            parts += f" (masks {binary_bytes(self.masks)} of the two)"
        parts += f" + {binary_bytes(self.other)} other"
        fewer = ""
        if self.keep_last == 0 or self.keep_last >= self.saves:
            kept = f"{plural(self.saves, 'save')}, all kept"
        else:
            kept = (
                f"{plural(self.saves, 'save')}, the last {self.keep_last} kept "
                f"({self.at_once} on disk while the newest is written)"
            )
        if self.saves > 1:
            fewer = " (fewer: 'keep_last: 1' in a --config file, or a larger --save-every)"
        return (
            f"disk: {binary_bytes(self.checkpoint)} a checkpoint ({parts}); {kept} + "
            f"{self.final_name} {binary_bytes(self.final)}: up to {binary_bytes(self.peak)} of "
            f"{binary_bytes(self.free)} free{fewer}"
        )

    def check(self, run_dir: Path) -> None:
        """Refuse a run whose first checkpoint cannot fit on the disk (one error line)."""
        if self.first_save > self.free:
            size = binary_bytes
            raise SparsetoolError(
                f"train: one checkpoint of this run takes about {size(self.checkpoint)} (model "
                f"{size(self.model)} + optimizer state {size(self.optimizer)}) and "
                f"{self.final_name} {size(self.final)} more, but the file system of {run_dir} "
                f"has {size(self.free)} free; free some space or give -o/--output on another disk"
            )

    def shortfall(self) -> str | None:
        """The warning for a run whose later checkpoints will not fit (the first does)."""
        if self.peak <= self.free:
            return None
        size = binary_bytes
        return (
            f"the run's checkpoints take up to {size(self.peak)} at once ({self.at_once} of "
            f"{size(self.checkpoint)} and {self.final_name}) but {size(self.free)} is free: a "
            "later save will fail; keep fewer ('keep_last: 1' in a --config file), save less "
            "often (--save-every) or free some space"
        )


def checkpoint_steps(start: int, stop: int, save_every: int) -> int:
    """How many checkpoints a run from step ``start`` to ``stop`` writes: every ``save_every``
    steps (0: none) and at the stop.

    >>> checkpoint_steps(0, 10, 0), checkpoint_steps(0, 10, 5), checkpoint_steps(0, 10, 3)
    (1, 2, 4)
    """
    every = len(range(save_every, stop + 1, save_every)) if save_every else 0
    before = start // save_every if save_every else 0
    at_stop = 0 if save_every and stop % save_every == 0 else 1
    return every - before + at_stop


def held_at_once(saves: int, keep_last: int) -> int:
    """Checkpoints on disk at once: all of them (``keep_last`` 0), or ``keep_last`` and the newest
    while it is written.

    >>> held_at_once(1, 2), held_at_once(5, 2), held_at_once(5, 0), held_at_once(2, 2)
    (1, 3, 5, 2)
    """
    if keep_last <= 0:
        return saves
    return min(saves, keep_last + 1)


def free_bytes(path: Path) -> int:
    """Free bytes for an unprivileged writer on the file system ``path`` is (or would be) on."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def estimate(
    *,
    entries: list[tuple[str, int]],
    params: list[int],
    targeted: list[tuple[str, int]],
    sparse: bool,
    algorithm: str | None,
    sharded: bool,
    other: int,
    final: int | None,
    final_name: str,
    saves: int,
    keep_last: int,
    free: int,
) -> DiskPlan:
    """The plan from the model's sizes: ``entries`` (name, numel) of its state dict (a tied head
    under each of its names), ``params`` the numel of each distinct parameter (what AdamW holds
    moments for), ``targeted`` (name, numel) of the sparsified weights; ``sparse`` whether
    checkpoints carry masks; ``other`` the small files' bytes; ``final`` the run's own model
    (None: a copy of the checkpoint's model.safetensors).

    >>> p = estimate(entries=[("w", 1000), ("b", 10)], params=[1000, 10], targeted=[("w", 1000)],
    ...              sparse=True, algorithm="rigl", sharded=False, other=500, final=4100,
    ...              final_name="model.safetensors", saves=1, keep_last=2, free=10**9)
    >>> p.masks, p.model > 4040 + 1000, p.optimizer > 8080 + 2000
    (3000, True, True)
    """
    weights = sum(4 * n for _, n in entries)
    mask = sum(n for _, n in targeted) if sparse else 0
    header = sum(len(name) + _ENTRY for name, _ in entries) + _METADATA
    header += sum(2 * len(name) + _ENTRY for name, _ in targeted) if sparse else 0
    model = weights + mask + header
    copies = (2 if algorithm in REGROWING else 1) if sparse else 0  # masks, regrown weights
    optimizer = sum(8 * n for n in params) + 3 * _RECORD * len(params)
    optimizer += copies * (mask + _RECORD * len(targeted))
    if sharded:  # the weights' slices too, beside the whole model.safetensors
        optimizer += sum(4 * n for n in params) + _RECORD * len(params)
    return DiskPlan(
        model=model,
        optimizer=optimizer,
        masks=mask * (1 + copies),
        other=other + _STATE_JSON,
        final=model if final is None else final,
        saves=saves,
        keep_last=keep_last,
        free=free,
        final_name=final_name,
    )
