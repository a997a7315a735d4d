"""The memory plan of a training run, per process, made before the model is built: what the
weights, gradients, AdamW moments, masks and activations take as the run divides them (one
process, DDP's whole copy on every process, or FSDP's 1/N slices), against what each process
has; a run that cannot fit is refused with the figures and the options that lower them
(:func:`fine_tuning_plan` does the arithmetic)."""

from __future__ import annotations

import dataclasses
import os

import torch

from sparsetool.errors import SparsetoolError
from sparsetool.util import memory
from sparsetool.util.memory import MemoryPlan, binary_bytes, process_memory

__all__ = [
    "LOWER",
    "TrainingPlan",
    "check_plan",
    "distillation_logits",
    "fine_tuning_plan",
    "run_plan",
]

LOWER = (
    "more processes (torchrun --nproc_per_node N, on one machine or several) with "
    "--distributed fsdp, which divides weights, gradients, AdamW and masks among them; "
    "--offload (GPUs); --dtype bfloat16; a smaller --batch-size or --context"
)
"""What lowers a training run's memory per process, as a refusal names it."""


@dataclasses.dataclass
class TrainingPlan(MemoryPlan):
    """A training run's :class:`~sparsetool.util.memory.MemoryPlan`, whose description also
    names what the logits take of its activations (``logits`` bytes, ``logits_what`` says which
    tensors of ``batch x context x vocabulary`` floats): with a large vocabulary, and above all
    when distilling, they are most of it."""

    logits: int = 0
    logits_what: str = ""

    def describe(self) -> str:
        line = super().describe()
        if not self.logits_what:
            return line
        return line.replace(
            f"activations {binary_bytes(self.activations)}",
            f"activations {binary_bytes(self.activations)} (the logits {binary_bytes(self.logits)}"
            f" of it: {self.logits_what})",
            1,
        )


def distillation_logits(alpha: float) -> tuple[int, str]:
    """How many tensors of the logits' size a distillation step holds at its peak, and what they
    are. The KL divergence is computed a chunk of rows at a time
    (:func:`sparsetool.train.distill.distillation_loss`): the student's logits, the teacher's and
    the gradient of the student's, and what the loss's temporaries and the allocator keep beside
    them, measured at 0.3 more (counted as one); with ``alpha`` below 1 the next-token loss adds
    its log-probabilities and two gradients (5.2 measured, counted as 6). Measured as the peak
    RSS of distilling a 2-block Llama of SmolLM2-135M's widths and vocabulary at 16 x 256 tokens,
    less the rest of the plan (docs/train.md)."""
    if alpha >= 1:
        return 4, "the student's and the teacher's for the KL, their gradient and temporaries"
    return 6, (
        "the student's and the teacher's for the KL, the next-token loss's log-probabilities, "
        "the gradients and temporaries"
    )


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
    teacher_params: int = 0,
    attention_scores: bool = True,
) -> TrainingPlan:
    """The plan of ``cfg``'s run of a model of ``params`` parameters on ``device`` (the one the
    run resolved), for each process of the torchrun group this process belongs to (WORLD_SIZE,
    LOCAL_WORLD_SIZE); the weights are read from a checkpoint with ``--init`` or when
    ``resumed``. On a GPU the budget is the GPU's memory, and a sharded run from random weights
    also needs this machine's memory to hold the whole model each of its processes builds
    before it is sharded (refused here). ``teacher_params``: the parameters of a
    ``--distill-from`` teacher, which every process holds whole in float32, with the logits of
    :func:`distillation_logits` in place of a plain run's. ``attention_scores``: whether the
    model's attention keeps its ``a s^2 b`` scores (eager attention), not a fused kernel's
    (sdpa, which transformers runs by default)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    reading = bool(cfg.init) or resumed
    device_memory = None
    if device.type == "cuda":
        device_memory = torch.cuda.get_device_properties(device.index or 0).total_memory
        # from random weights each process builds the whole model in CPU memory first (from a
        # checkpoint it reads only its slices)
        building = 0 if reading or cfg.distributed != "fsdp" else 4 * params * local_world
        room = memory.available_memory()  # looked up at call: one reading of the machine
        if building > room:
            raise SparsetoolError(
                f"train: each of the {local_world} processes on this machine builds the whole "
                f"model in CPU memory before it is sharded, {binary_bytes(building)} in all, but "
                f"the machine has {binary_bytes(room)} available; run fewer processes per machine "
                "(torchrun --nproc_per_node) over more machines"
            )
    plan = fine_tuning_plan(
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
        attention_scores=attention_scores,
    )
    if teacher_params:  # --distill-from: a whole float32 teacher per process, and the logits
        copies, what = distillation_logits(cfg.distill_alpha)
        logits = copies * 4 * cfg.batch_size * context * vocab
        plan = dataclasses.replace(
            plan,
            weights=plan.weights + 4 * teacher_params,
            activations=plan.activations - plan.logits + logits,
            logits=logits,
        )
    else:
        copies, what = 3, "the logits, their log-probabilities and their gradient"
    plan.logits_what = f"{copies} x {cfg.batch_size} x {context} x {vocab:,} floats: {what}"
    return plan


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
    attention_scores: bool = True,
) -> TrainingPlan:
    """The peak of one process fine-tuning a whole model with AdamW (``train --init HF_DIR``), or
    of each process of a torchrun group of ``world`` (``local_world`` of them on this machine):

    - activations kept for the backward pass: per layer ``34 s b h + 5 a s^2 b`` bytes in 16-bit
      (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
      eq. 1), twice that in float32 (without ``bf16``), the attention scores ``5 a s^2 b`` left
      out without ``attention_scores`` (a fused kernel keeps none: a Llama of SmolLM2's widths
      measured 0.81 x ``68 s b h`` a layer in float32 on a CPU), plus the logits, their
      log-probabilities and gradient (``b s V``, float32, 3x);
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
    scores = 5 * n_head * context * context * batch if attention_scores else 0
    per_layer = (1 if bf16 else 2) * (34 * context * batch * d_model + scores)
    logits = 3 * batch * context * vocab * 4
    if max_memory is not None:
        total, source = max_memory, "--max-memory"
    elif device_memory is not None:
        total, source = device_memory, "GPU memory"
    else:
        total, source = memory.available_memory() // max(1, local_world), "available memory"
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
    return TrainingPlan(
        fixed=fixed,
        weights=weights,
        optimizer=optimizer,
        activations=n_layer * per_layer + logits,
        statistics=0,
        budget=total,
        budget_source=source,
        masks=masks,
        per="per process" if world > 1 else "",
        logits=logits,
    )


def check_plan(plan: TrainingPlan, what: str) -> TrainingPlan:
    """``plan``, or the refusal of a run that cannot fit (:data:`LOWER` names the way out)."""
    plan.check(what, LOWER)
    return plan
