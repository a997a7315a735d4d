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
from sparsetool.train.algorithms.sharding import zeros_like_layout
from sparsetool.train.consolidate import write_model

__all__ = ["SHARDS", "SPARSIFIER", "restore", "save"]

SHARDS = "shards"
SPARSIFIER = "sparsifier.json"
_MASK_SETS = ("masks", "grown_before")  # the sparsifier state's tensors, saved in shards/


def save(run_dir: Path, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         sparsifier, sparsifier_config: dict | None, meta: dict, model_cfg: dict, state: dict,
         keep_last: int, master: bool, write_files=None) -> None:
    """The checkpoint at ``step``, written by every rank together (a collective): rank 0 makes
    the temporary directory and renames it when every rank has written its part."""
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = (runfiles.begin_checkpoint(run_dir, step) if master
           else runfiles.checkpoint_temp(run_dir, step))
    dist.barrier()  # the directory exists for every rank
    masks = dict(sparsifier.masks) if sparsifier is not None else {}
    write_model(tmp / "model.safetensors", list(model.state_dict().items()), masks, encoding="mask",
                metadata={"format": "pt", **provenance_metadata(None, meta)}, write=master)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    tensors: dict = {"model": model_sd, "optimizer": optim_sd}
    scalars = None
    if sparsifier is not None:
        scalars = sparsifier.state_dict()
        for key in _MASK_SETS:
            if key in scalars:
                tensors[key] = scalars.pop(key)
    dcp_save(tensors, checkpoint_id=str(tmp / SHARDS))
    if master:
        runfiles.write_json(tmp / SPARSIFIER, {
            "state": scalars, "config": sparsifier_config,
            "tensors": {key: sorted(tensors[key]) for key in _MASK_SETS if key in tensors}})
        runfiles.finish_checkpoint(run_dir, step, model_cfg, state, keep_last, write_files)
    dist.barrier()  # the checkpoint is in place before any rank goes on (or stops)


def restore(checkpoint: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
            params: dict[str, torch.nn.Parameter]) -> dict:
    """Load a checkpoint's slices into ``model`` and ``optimizer`` (resharded to this number of
    processes; a collective); the resume mapping: ``sparsifier`` (its state, masks laid out like
    ``params``) and ``sparsifier_config``, both None for a dense stage."""
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = checkpoint / SPARSIFIER
    if not (checkpoint / SHARDS).is_dir() or not path.is_file():
        raise CheckpointError(f"{checkpoint} has no {SHARDS}/ and {SPARSIFIER}: it was not saved "
                              "by a --distributed fsdp run; resume it with the options it was "
                              "trained with")
    saved = json.loads(path.read_text())
    model_sd, optim_sd = get_state_dict(model, optimizer)  # also makes AdamW's state to load into
    tensors: dict = {"model": model_sd, "optimizer": optim_sd}
    for key, names in saved.get("tensors", {}).items():
        unknown = [n for n in names if n not in params]
        if unknown:
            raise CheckpointError(f"{checkpoint / SPARSIFIER}: masks of {unknown[:3]} name no "
                                  "parameter of this model; resume with the model it was "
                                  "trained on")
        tensors[key] = {n: zeros_like_layout(params[n], torch.bool) for n in names}
    dcp_load(tensors, checkpoint_id=str(checkpoint / SHARDS))
    set_state_dict(model, optimizer, model_state_dict=tensors["model"],
                   optim_state_dict=tensors["optimizer"])
    state = saved.get("state")
    if state is not None:
        state = {**state, **{key: tensors[key] for key in _MASK_SETS if key in tensors}}
    config = saved.get("config")
    return {"sparsifier": state, "sparsifier_config": json.dumps(config) if config else None}
