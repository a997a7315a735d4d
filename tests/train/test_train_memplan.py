"""The memory plan of a distillation run (train/memplan.py): its logits term is the count of
tensors of batch x context x vocabulary floats the step holds, derived and measured, and the whole
plan stays within 1.5x above the peak RSS measured for these configurations (figures below; the
plan's ``fixed`` part, the process as it stood, is replaced by the measured run's)."""

from __future__ import annotations

import pytest
import torch

from sparsetool.train.memplan import run_plan
from sparsetool.train.trainconfig import TrainConfig

MiB = 2**20

# Peak RSS (/usr/bin/time -f %M, KiB) of `sparsetool train --init S --distill-from T --steps 2
# --context 256 --threads 2` on a 2-core x86-64 CPU, torch 2.13 CPU: S and T are Llamas of
# SmolLM2-135M's widths (576, 9 heads, 3 key/value heads, 1536, vocabulary 49,152, tied head);
# "fixed" is what the run's own plan said the process held when it was made.
MEASURED = [
    # (student blocks, params, teacher params, batch, alpha, fixed MiB, peak KiB)
    (2, 35_392_320, 42_472_512, 16, 1.0, 357, 4_280_804),  # teacher 4 blocks
    (2, 35_392_320, 42_472_512, 16, 0.5, 403, 5_753_588),
    (26, 120_354_624, 134_515_008, 4, 1.0, 448, 4_779_160),  # SmolLM2-135M itself the teacher
    (26, 120_354_624, 134_515_008, 16, 1.0, 432, 10_789_204),  # the 16 x 256
]


def plan(blocks: int, params: int, teacher: int, batch: int, alpha: float):
    cfg = TrainConfig(init="student", distill_from="teacher", batch_size=batch, distill_alpha=alpha)
    return run_plan(
        cfg,
        torch.device("cpu"),
        params=params,
        n_layer=blocks,
        d_model=576,
        n_head=9,
        context=256,
        vocab=49_152,
        teacher_params=teacher,
        attention_scores=False,  # transformers runs Llama's attention in sdpa
    )


@pytest.mark.parametrize("alpha,copies", [(1.0, 4), (0.5, 6)])
def test_the_logits_term_is_its_count_of_batch_context_vocabulary_floats(alpha, copies):
    p = plan(2, 35_392_320, 42_472_512, 16, alpha)
    one = 16 * 256 * 49_152 * 4  # the student's logits in float32: 768 MiB
    assert p.logits == copies * one
    # the rest of the activations: 2 blocks of 68 s b h bytes in float32, no attention scores
    assert p.activations == 2 * 2 * 34 * 256 * 16 * 576 + copies * one
    assert p.weights == 8 * 35_392_320 + 4 * 42_472_512  # read and copied in; the teacher
    assert (
        f"(the logits {copies * 768 / 1024:.2f} GiB of it: {copies} x 16 x 256 x 49,152 floats: "
        "the student's and the teacher's for the KL"
    ) in p.describe()


@pytest.mark.parametrize("blocks,params,teacher,batch,alpha,fixed,peak", MEASURED)
def test_the_plan_is_within_one_and_a_half_times_the_measured_peak(
    blocks, params, teacher, batch, alpha, fixed, peak
):
    p = plan(blocks, params, teacher, batch, alpha)
    estimate = p.peak - p.fixed + fixed * MiB
    assert 1.0 <= estimate / (peak * 1024) <= 1.5, (estimate, peak * 1024)


def test_a_plain_run_names_its_three_tensors_of_logits():
    cfg = TrainConfig(init="student", batch_size=4)
    p = run_plan(cfg, torch.device("cpu"), params=10**6, n_layer=2, d_model=64, n_head=4,
                 context=32, vocab=1000)  # fmt: skip
    assert p.logits == 3 * 4 * 32 * 1000 * 4
    assert "3 x 4 x 32 x 1,000 floats: the logits, their log-probabilities" in p.describe()
    # eager attention (the default here) keeps its scores: 5 a s^2 b bytes a layer, x2 in float32
    assert p.activations == 2 * 2 * (34 * 32 * 4 * 64 + 5 * 4 * 32 * 32 * 4) + p.logits
