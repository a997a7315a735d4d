"""train --init STUDENT --distill-from TEACHER: a student shrunk from the teacher and pruned
moves toward the teacher's next-token distribution with its masks kept; the loss is the
temperature-scaled KL divergence of torch's own kl_div; alpha 0 is plain training bit for bit;
a resume is bit-identical; two processes (DDP, FSDP) match one; a teacher with another tokenizer or
vocabulary is refused in one line before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers as t
from safetensors.torch import load_file

from sparsetool.train import distill
from sparsetool.train.distill import distillation_loss

from helpers import ROOT, hf_model, make_text, save_tokenizer
from helpers import run as cli

os.environ["HF_HUB_OFFLINE"] = "1"

FAST = ["--steps", "12", "--batch-size", "4", "--context", "32", "--warmup", "2", "--lr", "3e-3",
        "--eval-every", "6", "--seed", "0"]  # fmt: skip


def ok(*args) -> dict:
    r = cli("train", *FAST, *args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A teacher (Llama, 2 blocks), a student shrunk to 1 block and pruned to 50%, the text."""
    root = tmp_path_factory.mktemp("distill")
    text = make_text(600)
    (root / "data.txt").write_text(text)
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(root / "teacher")
    save_tokenizer(root / "teacher", text)
    for args in (
        ["shrink", root / "teacher", "-o", root / "shrunk", "--blocks", "1",
         "--calibration", root / "data.txt", "--samples", "4", "--seq", "32"],
        ["prune", root / "shrunk", "-o", root / "student", "--sparsity", "0.5"],
    ):  # fmt: skip
        r = cli(*args)
        assert r.exit_code == 0, r.output
    return root


def kl_to_teacher(root: Path, student: Path) -> float:
    """The mean KL(teacher || student) per token over held-out windows, in transformers."""
    tok = t.AutoTokenizer.from_pretrained(root / "teacher")
    ids = torch.tensor(tok(make_text(80, seed=9))["input_ids"][: 8 * 32]).view(8, 32)
    teacher = t.AutoModelForCausalLM.from_pretrained(root / "teacher").eval()
    model = t.AutoModelForCausalLM.from_pretrained(student).eval()
    with torch.no_grad():
        return float(distillation_loss(model(ids).logits, teacher(ids).logits, 1.0))


@pytest.mark.parametrize("chunk", [distill.CHUNK, 3 * 11])  # one chunk; 3 rows at a time
def test_the_loss_and_its_gradient_are_those_of_torchs_kl_divergence(monkeypatch, chunk):
    monkeypatch.setattr(distill, "CHUNK", chunk)
    g = torch.Generator().manual_seed(0)
    s, te = torch.randn(2, 5, 11, generator=g), torch.randn(2, 5, 11, generator=g)
    for temp in (1.0, 2.0):
        s1, s2 = s.clone().requires_grad_(), s.clone().requires_grad_()
        want = F.kl_div(
            F.log_softmax(s1.view(-1, 11) / temp, -1),
            F.log_softmax(te.view(-1, 11) / temp, -1),
            log_target=True,
            reduction="batchmean",
        ) * (temp * temp)
        got = distillation_loss(s2, te, temp)
        torch.testing.assert_close(got, want)
        (3 * want).backward()
        (3 * got).backward()
        torch.testing.assert_close(s2.grad, s1.grad)
    assert float(distillation_loss(te, te, 2.0)) == pytest.approx(0.0, abs=1e-6)


def test_the_student_moves_toward_the_teacher_and_keeps_its_masks(models, tmp_path):
    out = tmp_path / "run"
    got = ok("-o", out, "--init", models / "student", "--distill-from", models / "teacher",
             "--data", models / "data.txt", "--distill-temperature", "2")  # fmt: skip
    assert got["finished"]
    before = kl_to_teacher(models, models / "student")
    after = kl_to_teacher(models, out / "model")
    assert after < 0.8 * before, (before, after)
    start = load_file(str(models / "student" / "model.safetensors"))
    end = load_file(str(out / "model" / "model.safetensors"))
    for name, w in start.items():
        if w.ndim == 2 and "layers" in name:
            assert torch.equal(end[name][w == 0], torch.zeros_like(end[name][w == 0])), name
    teacher = load_file(str(models / "teacher" / "model.safetensors"))
    assert "model.layers.1.mlp.up_proj.weight" in teacher  # the teacher's files are untouched


def test_alpha_zero_is_plain_training_bit_for_bit(models, tmp_path):
    common = ["--init", models / "student", "--data", models / "data.txt"]
    ok("-o", tmp_path / "plain", *common)
    ok("-o", tmp_path / "a0", *common, "--distill-from", models / "teacher", "--distill-alpha", "0")
    a = load_file(str(tmp_path / "plain" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "a0" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_distillation_is_bit_identical(models, tmp_path):
    common = ["--init", models / "student", "--data", models / "data.txt", "--save-every", "6",
              "--distill-from", models / "teacher", "--distill-alpha", "0.5"]  # fmt: skip
    ok("-o", tmp_path / "whole", *common)
    assert not ok("-o", tmp_path / "parts", *common, "--stop-at", "6")["finished"]
    r = cli("train", "-o", tmp_path / "parts", "--resume", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["finished"], r.output
    a = load_file(str(tmp_path / "whole" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "parts" / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_distill_as_one(models, tmp_path, strategy):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["OMP_NUM_THREADS"] = "1"
    common = ["--init", str(models / "student"), "--data", str(models / "data.txt"),
              "--distill-from", str(models / "teacher"), *FAST, "--batch-size", "2",
              "--threads", "1", "--json"]  # fmt: skip
    two = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         "-m", "sparsetool", "train", "-o", str(tmp_path / "two"), "--distributed", strategy,
         *common],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert two.returncode == 0, two.stderr[-2000:]
    one = cli("train", "-o", tmp_path / "one", *common[:-3], "--batch-size", "4", "--threads",
              "1", "--json")  # fmt: skip
    assert one.exit_code == 0, one.output
    a = load_file(str(tmp_path / "one" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)


def test_another_tokenizer_or_vocabulary_is_refused_in_one_line(models, tmp_path):
    other = tmp_path / "other"
    torch.manual_seed(1)
    hf_model("llama").save_pretrained(other)
    save_tokenizer(other, make_text(600, seed=3))  # the same model, a tokenizer trained apart
    r = cli("train", *FAST, "-o", tmp_path / "r", "--init", models / "student",
            "--data", models / "data.txt", "--distill-from", other)  # fmt: skip
    assert r.exit_code == 1 and r.stderr.count("error:") == 1, r.output
    assert "tokenizer differs from the student's" in r.stderr
    r = cli("train", *FAST, "-o", tmp_path / "s", "--data", models / "data.txt",
            "--distill-from", models / "teacher")  # fmt: skip
    assert r.exit_code in (1, 2) and "--init STUDENT_DIR" in r.stderr


def test_the_start_names_the_teacher_the_temperature_and_alpha(models, tmp_path):
    r = cli("train", *FAST, "--steps", "2", "-o", tmp_path / "run", "--init", models / "student",
            "--data", models / "data.txt", "--distill-from", models / "teacher",
            "--distill-temperature", "2", "--distill-alpha", "0.5")  # fmt: skip
    assert r.exit_code == 0, r.output
    params = sum(
        t.numel() for t in load_file(str(models / "teacher" / "model.safetensors")).values()
    )
    assert (
        f"distillation: teacher {models / 'teacher'} ({params:,} parameters), temperature 2, "
        "alpha 0.5: 0.5 x T^2 KL to the teacher + 0.5 x next-token loss"
    ) in r.stdout.splitlines()


def test_a_teacher_without_a_tokenizer_is_refused_in_one_line_of_its_own(models, tmp_path):
    """fixtures/tiny-gpt2 has no tokenizer files, and a config transformers warns about: the
    refusal comes before transformers reads that config, so it is all stderr holds."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    teacher = ROOT / "fixtures" / "tiny-gpt2"
    r = subprocess.run(
        [sys.executable, "-m", "sparsetool", "train", *FAST, "-o", str(tmp_path / "run"),
         "--init", str(models / "student"), "--data", str(models / "data.txt"),
         "--distill-from", str(teacher)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        f"error: {teacher}: no usable tokenizer (none of tokenizer.json, tokenizer.model, "
        "vocab.json, vocab.txt, spiece.model, sentencepiece.bpe.model, tiktoken.model); copy the "
        "tokenizer files of the original model (tokenizer.json or its vocabulary files, "
        "tokenizer_config.json) into this directory"
    ]
    assert not (tmp_path / "run").exists()
