"""The one skeleton every kind of shrink runs (experts, blocks, widths): the options validated once,
the request checked against ``config.json`` alone, the output checked, the calibration text read,
the model opened, then the kind's own part (score block by block and choose: a :class:`Shrinking`),
the output written with its provenance, the sizes recorded, and everything closed.

A kind is a :class:`ShrinkKind`: its ``key`` in the provenance, what it ``needs`` (said when the
model cannot be opened), :meth:`~ShrinkKind.plan` (usage errors before any weight) and
:meth:`~ShrinkKind.choose`. The skeleton opens the model the same way for every kind: block by
block, with eager attention (calibration's), in ``--dtype`` on ``--device``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.checkpoint.writer import CheckpointWriter, write_checkpoint
from sparsetool.models.blocks import BlockModel
from sparsetool.models.open import open_model
from sparsetool.ops.shrink.inputs import check_output, model_config, record_sizes
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.results import ShrinkResult
from sparsetool.ops.text import read_text
from sparsetool.util.memory import MemoryPlan
from sparsetool.util.progress import Progress

__all__ = ["Shrinking", "ShrinkKind", "run_kind"]


@dataclass
class Shrinking:
    """What a kind has chosen, for the skeleton to write: its ``record`` (the provenance's entry
    under the kind's key), ``config`` (config.json's new values), ``write`` (every shard, into
    the checkpoint writer) and ``removed`` (the parameters gone, asked once written)."""

    record: dict[str, Any]
    config: Callable[[dict[str, Any]], dict[str, Any]]
    write: Callable[[CheckpointWriter], None]
    removed: Callable[[], int]


class ShrinkKind(Protocol):
    """One kind of shrink, made for one run's options."""

    key: str  # what it removed, in the provenance: "experts", "blocks" or "widths"
    needs: str  # what the model must be, said when it is not

    def plan(self, path: Path, config: dict[str, Any], cfg: Any) -> None:
        """Check the request against ``config.json`` (``cfg``: transformers' config of it)."""

    def choose(
        self,
        model: BlockModel,
        text: str | None,
        result: ShrinkResult,
        held: contextlib.ExitStack,
        progress: Progress | None,
        on_plan: Callable[[MemoryPlan], None] | None,
    ) -> Shrinking:
        """Score on ``text`` and choose what goes; ``held`` closes what it keeps open after the
        model."""
        ...


def run_kind(
    kind: ShrinkKind,
    path: str | Path,
    out: str | Path,
    opts: ShrinkOptions,
    *,
    progress: Progress | None = None,
    on_plan: Callable[[MemoryPlan], None] | None = None,
) -> ShrinkResult:
    """Run ``kind`` on the model at ``path`` into ``out`` (see the module docstring)."""
    opts.validate()
    path, out = Path(path), Path(out)
    config, cfg = model_config(path, kind.needs)
    kind.plan(path, config, cfg)  # every usage error the config shows, before a weight is read
    check_output(path, out)  # a locked or full output is refused before the long part
    text = None
    if opts.reads_text:
        assert opts.calibration is not None, "validate() asks for it"
        text = read_text(opts.calibration, "--calibration")
    model = open_model(path, opts.dtype, opts.device, needs=kind.needs, attention="eager")
    result = ShrinkResult(output=out, options=opts)
    with contextlib.ExitStack() as held:  # closed after the model
        try:
            made = kind.choose(model, text, result, held, progress, on_plan)
            metadata = provenance_metadata(
                model.ckpt.metadata(), {"command": "shrink", **opts.record(), kind.key: made.record}
            )
            with write_checkpoint(
                model.ckpt, out, metadata_extra=metadata, config_transform=made.config
            ) as cw:
                result.left_out = list(cw.left_out)
                made.write(cw)
            record_sizes(result, model.ckpt, out, made.removed())
        finally:
            model.close()
    return result
