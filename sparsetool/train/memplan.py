"""The memory plan of a training run, per process, made before the model is built: what the
weights, gradients, AdamW moments, masks and activations take as the run divides them (one
process, DDP's whole copy on every process, or FSDP's 1/N slices), against what each process
has; a run that cannot fit is refused with the figures and the options that lower them
(:func:`sparsetool.util.memory.fine_tuning_plan` does the arithmetic)."""

from __future__ import annotations

import os

import torch

from sparsetool.errors import SparsetoolError
from sparsetool.util.memory import MemoryPlan, available_memory, binary_bytes, fine_tuning_plan

__all__ = ["LOWER", "check_plan", "run_plan"]

LOWER = (
    "more processes (torchrun --nproc_per_node N, on one machine or several) with "
    "--distributed fsdp, which divides weights, gradients, AdamW and masks among them; "
    "--offload (GPUs); --dtype bfloat16; a smaller --batch-size or --context"
)
"""What lowers a training run's memory per process, as a refusal names it."""


def run_plan(
    cfg,
    device: torch.device,
    *,
    params: int,
    n_layer: int,
    d_model: int,
    n_head: int,
    context: int,
    vocab: int,
    resumed: bool = False,
) -> MemoryPlan:
    """The plan of ``cfg``'s run of a model of ``params`` parameters on ``device`` (the one the
    run resolved), for each process of the torchrun group this process belongs to (WORLD_SIZE,
    LOCAL_WORLD_SIZE); the weights are read from a checkpoint with ``--init`` or when
    ``resumed``. On a GPU the budget is the GPU's memory, and a sharded run from random weights
    also needs this machine's memory to hold the whole model each of its processes builds
    before it is sharded (refused here)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    reading = bool(cfg.init) or resumed
    device_memory = None
    if device.type == "cuda":
        device_memory = torch.cuda.get_device_properties(device.index or 0).total_memory
        # from random weights each process builds the whole model in CPU memory first (from a
        # checkpoint it reads only its slices)
        building = 0 if reading or cfg.distributed != "fsdp" else 4 * params * local_world
        room = available_memory()
        if building > room:
            raise SparsetoolError(
                f"train: each of the {local_world} processes on this machine builds the whole "
                f"model in CPU memory before it is sharded, {binary_bytes(building)} in all, but "
                f"the machine has {binary_bytes(room)} available; run fewer processes per machine "
                "(torchrun --nproc_per_node) over more machines"
            )
    return fine_tuning_plan(
        params,
        batch=cfg.batch_size,
        context=context,
        d_model=d_model,
        n_layer=n_layer,
        n_head=n_head,
        vocab=vocab,
        targeted=params,
        strategy=cfg.distributed,
        world=world,
        local_world=local_world,
        bf16=cfg.dtype == "bfloat16" or (cfg.dtype == "auto" and device.type == "cuda"),
        offload=cfg.offload,
        device_memory=device_memory,
        reading=reading,
    )


def check_plan(plan: MemoryPlan, what: str) -> MemoryPlan:
    """``plan``, or the refusal of a run that cannot fit (:data:`LOWER` names the way out)."""
    plan.check(what, LOWER)
    return plan
