"""``train --init STUDENT --distill-from TEACHER``: recovery by knowledge distillation.

The student (a Hugging Face directory: a shrunk, pruned or smaller model) learns the teacher's
next-token distribution. At each micro-batch the teacher, in eval mode and without gradients,
runs forward on the same token ids, and the loss is

    alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE(student, y)

averaged over tokens (``T``: ``--distill-temperature``, Hinton et al.'s ``T^2`` keeps the
gradient's scale across temperatures; ``alpha``: ``--distill-alpha``, 1 by default: the
distillation loss alone, and the next-token loss is then not computed). The validation loss stays
the plain next-token loss, comparable with any other run. A sparse student keeps its masks: the
sparsifier masks weights and gradients whatever the loss. Each process holds a whole teacher
(also under ``--distributed fsdp``, where only the student is sharded); the memory plan counts it.

The logits dominate the memory of a step: ``batch x context x vocabulary`` floats each (16 x 256
x 49,152 are 768 MiB). The KL divergence is computed a few rows of tokens at a time
(:func:`distillation_loss`), so a step holds the student's logits, the teacher's and the
gradient of the student's, not the half-dozen temporaries of that size autograd would keep.

Student and teacher must share the tokenizer (the same vocabulary and special tokens) and the
logits' width; anything else is refused in one line before a weight is read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from sparsetool.errors import ConfigError
from sparsetool.models.hf import hf_config, import_transformers, load_tokenizer
from sparsetool.train.runfiles import read_init_checkpoint
from sparsetool.util.wording import plural

__all__ = ["CHUNK", "Teacher", "check_teacher", "distillation_loss", "distilling", "describe"]

Forward = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


CHUNK = 1 << 22
"""Logits (floats) the KL divergence works on at a time: a few rows of tokens, 16 MiB a
temporary in float32."""


def distillation_loss(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``T^2 * KL(p_teacher || p_student)`` at temperature ``T``, the mean over tokens of logits
    ``(..., V)`` (in float32), differentiable in ``student``.

    Computed over rows of tokens :data:`CHUNK` logits at a time, forward and backward alike: the
    gradient, ``T (p_student - p_teacher) / tokens`` for each token, is the one tensor of the
    logits' size it makes; it keeps only references to the two inputs."""
    return _ChunkedKL.apply(student, teacher.detach(), float(temperature))


def _rows(logits: torch.Tensor) -> int:
    return max(1, CHUNK // max(1, logits.size(-1)))


class _ChunkedKL(torch.autograd.Function):
    """:func:`distillation_loss` and its gradient, a chunk of rows at a time."""

    @staticmethod
    def forward(ctx, student: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
        s2, t2 = student.reshape(-1, student.size(-1)), teacher.reshape(-1, teacher.size(-1))
        total = torch.zeros((), dtype=torch.float32, device=student.device)
        step = _rows(s2)
        for i in range(0, s2.size(0), step):
            s_log = F.log_softmax(s2[i : i + step].float() / t, dim=-1)
            t_log = F.log_softmax(t2[i : i + step].float() / t, dim=-1)
            total += (t_log.exp() * (t_log - s_log)).sum()
        ctx.save_for_backward(student, teacher)
        ctx.t = t
        return total / max(1, s2.size(0)) * (t * t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        student, teacher = ctx.saved_tensors
        t = ctx.t
        s2, t2 = student.reshape(-1, student.size(-1)), teacher.reshape(-1, teacher.size(-1))
        out = torch.empty_like(s2)
        scale = grad.float() * (t / max(1, s2.size(0)))
        step = _rows(s2)
        for i in range(0, s2.size(0), step):
            p_s = F.softmax(s2[i : i + step].float() / t, dim=-1)
            p_t = F.softmax(t2[i : i + step].float() / t, dim=-1)
            out[i : i + step] = ((p_s - p_t) * scale).to(out.dtype)
        return out.view_as(student), None, None


def check_teacher(path: str | Path, student_tokenizer, vocab_size: int):
    """transformers' config of the ``--distill-from`` directory, once everything sparsetool
    checks holds (config.json, a tokenizer equal to the student's, logits of the student's width);
    anything else is one error. Cheap checks first, and the tokenizer before transformers reads
    the config: what it would warn of in a directory that is refused anyway never prints before
    the error."""
    path = Path(path)
    transformers = import_transformers("distilling from")
    from sparsetool.checkpoint import open_checkpoint

    if not (path / "config.json").is_file():
        raise ConfigError(
            f"--distill-from {path}: not a Hugging Face model directory (config.json, "
            "weights, tokenizer files); the teacher must be one"
        )
    with open_checkpoint(path) as ckpt:
        config = ckpt.config
    tok = load_tokenizer(path, transformers)
    if tok.get_vocab() != student_tokenizer.get_vocab() or sorted(tok.all_special_tokens) != sorted(
        student_tokenizer.all_special_tokens
    ):
        raise ConfigError(
            f"--distill-from {path}: its tokenizer differs from the student's (another "
            "vocabulary or special tokens); distillation compares next-token distributions "
            "over one vocabulary: give a teacher with the student's tokenizer"
        )
    raw = (config or {}).get("vocab_size")
    if isinstance(raw, int) and raw != vocab_size:
        _refuse_vocab(path, raw, vocab_size)
    cfg = hf_config(path, config, transformers, "train --distill-from")
    if int(cfg.vocab_size) != vocab_size:
        _refuse_vocab(path, int(cfg.vocab_size), vocab_size)
    return cfg


def _refuse_vocab(path: Path, teacher: int, student: int):
    raise ConfigError(
        f"--distill-from {path}: its logits have {teacher} entries, the student's {student}; "
        "give a teacher whose vocab_size is the student's"
    )


class Teacher:
    """The teacher model of a run: read once (any encoding sparsetool reads), frozen, in eval
    mode, on the run's device; ``config`` is :func:`check_teacher`'s."""

    def __init__(self, path: str | Path, config, device) -> None:
        from sparsetool.models.hf import match_weights

        self.path = Path(path)
        transformers = import_transformers("distilling from")
        model = transformers.AutoModelForCausalLM.from_config(config, trust_remote_code=False)
        weights = read_init_checkpoint(self.path)[0]
        matched = match_weights(self.path, model, weights, "train --distill-from")
        model.load_state_dict(matched, strict=False)
        self.model = model.float().to(device).eval().requires_grad_(False)
        self.numel = sum(p.numel() for p in self.model.parameters())

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=x, use_cache=False).logits


def distilling(
    forward: Forward,
    teacher: Teacher,
    temperature: float,
    alpha: float,
    logits: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None,
) -> Forward:
    """``forward`` (student logits and next-token loss) with its loss replaced by the mix of the
    distillation loss and the next-token loss (see the module docstring); with ``alpha`` 1 and
    ``logits`` (the student's logits alone) the next-token loss is not computed: its
    log-probabilities would be one more tensor of the logits' size."""

    def distilled(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor):
        if alpha >= 1 and logits is not None:
            out = logits(model, x)
            return out, distillation_loss(out, teacher.logits(x), temperature)
        out, lm = forward(model, x, y)
        kd = distillation_loss(out, teacher.logits(x), temperature)
        if alpha >= 1:
            return out, kd
        return out, alpha * kd + (1 - alpha) * lm

    return distilled


def describe(teacher: Teacher, temperature: float, alpha: float) -> str:
    """The line the start of a run prints: the teacher, the temperature and alpha, and the loss
    they make.

    >>> class T:
    ...     path, numel = "smollm2", 134_515_008
    >>> describe(T(), 1.0, 1.0)
    'distillation: teacher smollm2 (134,515,008 parameters), temperature 1, alpha 1: the KL
    divergence to the teacher alone'
    >>> describe(T(), 2.0, 0.5)[-62:]
    'alpha 0.5: 0.5 x T^2 KL to the teacher + 0.5 x next-token loss'
    """
    if alpha >= 1:
        loss = "the KL divergence to the teacher alone"
    elif alpha <= 0:
        loss = "the next-token loss alone (the teacher runs, unused)"
    else:
        loss = f"{alpha:g} x T^2 KL to the teacher + {1 - alpha:g} x next-token loss"
    return (
        f"distillation: teacher {teacher.path} ({plural(teacher.numel, 'parameter')}), "
        f"temperature {temperature:g}, alpha {alpha:g}: {loss}"
    )
