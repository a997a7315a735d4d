"""The checkpoints of an FSDP run (``train --distributed fsdp``), saved and restored by every rank
together.

A checkpoint directory holds what a run on one process holds -- ``model.safetensors`` (the whole
model in the ``mask`` encoding, streamed from the shards by :mod:`.consolidate`, so ``--init``,
``eval`` and the other commands read it as any checkpoint), ``config.json`` and ``state.json`` --
but in place of ``optimizer.pt``:

- ``shards/``: each rank's slices of the weights, the AdamW moments and the masks, written by
  ``torch.distributed.checkpoint`` (one file per rank and a metadata file). Loading reshards them,
  so a run continues on another number of processes; on the same number every slice comes back
  bit for bit;
- ``sparsifier.json``: the sparsifier's other state (algorithm, seed, update count, ...), the
  mapping it was built from and the names of the masks in ``shards/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from sparsetool.checkpoint.provenance import provenance_metadata
from sparsetool.errors import CheckpointError
from sparsetool.train import runfiles
from sparsetool.train.consolidate import write_model
from sparsetool.train.sharding import zeros_like_layout

__all__ = ["SHARDS", "SPARSIFIER", "restore", "save"]

SHARDS = "shards"
SPARSIFIER = "sparsifier.json"
_MASK_SETS = ("masks", "grown_before")  # the sparsifier state's tensors, saved in shards/


def save(
    run_dir: Path,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    sparsifier,
    sparsifier_config: dict | None,
    meta: dict,
    model_cfg: dict,
    state: dict,
    keep_last: int,
    master: bool,
    write_files=None,
) -> None:
    """The checkpoint at ``step``, written by every rank together (a collective): rank 0 makes
    the temporary directory and renames it when every rank has written its part."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = (
        runfiles.begin_checkpoint(run_dir, step)
        if master
        else runfiles.checkpoint_temp(run_dir, step)
    )
    dist.barrier()  # the directory exists for every rank
    masks = dict(sparsifier.masks) if sparsifier is not None else {}
    write_model(
        tmp / "model.safetensors",
        list(model.state_dict().items()),
        masks,
        encoding="mask",
        metadata={"format": "pt", **provenance_metadata(None, meta)},
        write=master,
    )
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tensors: dict = {"model": model_sd, "optimizer": optim_sd}
    scalars = None
    if sparsifier is not None:
        scalars = sparsifier.state_dict()
        for key in _MASK_SETS:
            if key in scalars:
                tensors[key] = scalars.pop(key)
    try:
        dcp_save(tensors, checkpoint_id=str(tmp / SHARDS))
    except Exception as e:  # a full disk on any rank: the OSError, for the run's one error line
        raise _os_error(e) or e from None
    if master:
        runfiles.write_json(
            tmp / SPARSIFIER,
            {
                "state": scalars,
                "config": sparsifier_config,
                "tensors": {key: sorted(tensors[key]) for key in _MASK_SETS if key in tensors},
            },
        )
        runfiles.finish_checkpoint(run_dir, step, model_cfg, state, keep_last, write_files)
    dist.barrier()  # the checkpoint is in place before any rank goes on (or stops)


def restore(
    checkpoint: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    params: dict[str, torch.nn.Parameter],
) -> dict:
    """Load a checkpoint's slices into ``model`` and ``optimizer`` (resharded to this number of
    processes; a collective); the resume mapping: ``sparsifier`` (its state, masks laid out like
    ``params``) and ``sparsifier_config``, both None for a dense stage."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = checkpoint / SPARSIFIER
    if not (checkpoint / SHARDS).is_dir() or not path.is_file():
        raise CheckpointError(
            f"{checkpoint} has no {SHARDS}/ and {SPARSIFIER}: it was not saved "
            "by a --distributed fsdp run; resume it with the options it was "
            "trained with"
        )
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} cannot be read ({e}); resume from an earlier checkpoint"
        ) from None
    model_sd, optim_sd = get_state_dict(model, optimizer)  # also makes AdamW's state to load into
    tensors: dict = {"model": model_sd, "optimizer": optim_sd}
    for key, names in saved.get("tensors", {}).items():
        unknown = [n for n in names if n not in params]
        if unknown:
            raise CheckpointError(
                f"{checkpoint / SPARSIFIER}: masks of {unknown[:3]} name no "
                "parameter of this model; resume with the model it was "
                "trained on"
            )
        tensors[key] = {n: zeros_like_layout(params[n], torch.bool) for n in names}
    try:
        dcp_load(tensors, checkpoint_id=str(checkpoint / SHARDS))
    except Exception as e:  # a missing or truncated shard, on any rank
        raise CheckpointError(
            f"{checkpoint / SHARDS} cannot be read ({_first_line(e)}); resume "
            "from an earlier checkpoint"
        ) from None
    set_state_dict(
        model, optimizer, model_state_dict=tensors["model"], optim_state_dict=tensors["optimizer"]
    )
    state = saved.get("state")
    if state is not None:
        state = {**state, **{key: tensors[key] for key in _MASK_SETS if key in tensors}}
    config = saved.get("config")
    return {"sparsifier": state, "sparsifier_config": json.dumps(config) if config else None}


def _os_error(e: BaseException) -> OSError | None:
    """The OSError behind a failed ``torch.distributed.checkpoint`` call (it wraps each rank's
    failure in a ``CheckpointException``), or None."""
    if isinstance(e, OSError):
        return e
    for failure in getattr(e, "failures", {}).values():
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, OSError):
            return cause
    return None


def _first_line(e: BaseException) -> str:
    """A failure in a few words: the first line of its message, or of the first rank's."""
    for failure in getattr(e, "failures", {}).values():
        e = failure[0] if isinstance(failure, tuple) else failure
        break
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
