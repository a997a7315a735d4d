"""Counts agree with their nouns: "1 tensor", "2 tensors", "1 head"."""

from __future__ import annotations

import json
import re

import torch
from safetensors.torch import save_file

from sparsetool.util.wording import plural

from helpers import ROOT, run

SRC = ROOT / "sparsetool"


def test_plural():
    assert [plural(n, "tensor") for n in (0, 1, 2, 1234)] == [
        "0 tensors",
        "1 tensor",
        "2 tensors",
        "1,234 tensors",
    ]
    assert (
        plural(1, "matrix", "matrices") == "1 matrix"
        and plural(3, "matrix", "matrices") == "3 matrices"
    )


def test_no_count_is_printed_before_a_fixed_plural():
    """f"{n} tensors" prints "1 tensors"; every such count goes through plural()."""
    fixed = re.compile(
        r"\{[^}]*\} (tensors|heads|layers|shards|files|matrices|weights|parameters)\b"
    )
    found = [
        f"{p.relative_to(SRC)}:{i}: {line.strip()}"
        for p in sorted(SRC.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if fixed.search(line)
    ]
    assert not found, "\n".join(found)
    also = re.compile(r"\} (tensor|token|process|value|shard|file)\(e?s\)")
    found = [
        f"{p.relative_to(SRC)}:{i}"
        for p in sorted(SRC.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if also.search(line)
    ]
    assert not found, found


def test_one_of_everything_reads_singular(tmp_path):
    """A one-layer, one-head model with one targeted matrix: prune, report, densify, diff,
    flops and simulate all say "1 tensor", "1 layer", "1 head", "1 matrix"."""
    g = torch.Generator().manual_seed(0)
    src = tmp_path / "one.safetensors"
    save_file(
        {
            "wte.weight": torch.randn(32, 16, generator=g),
            "h.0.attn.c_attn.weight": torch.randn(16, 48, generator=g),
            "h.0.mlp.c_proj.weight": torch.randn(64, 16, generator=g),
        },
        str(src),
    )
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 1}))
    out = tmp_path / "p.safetensors"
    r = run("prune", src, "-o", out, "-s", "0.5", "--exclude", "*c_proj*")
    assert r.exit_code == 0, r.output
    assert "pruned 1 tensor (768 weights)" in r.stdout
    r = run("report", out, "--format", "plain", "--exclude", "*c_proj*")
    assert "targeted sparsity: 50.00% of 768 weights in 1 tensor\n" in r.stdout
    r = run("densify", out, "-o", tmp_path / "d.safetensors")
    assert r.exit_code == 0 and "densified 3 tensors" in r.stdout
    r = run("diff", src, out, "--exclude", "*c_proj*")
    assert "(3 matrices)" in r.stdout  # q, k and v of the one fused tensor
    r = run("flops", "--checkpoint", out, "--default-targets")
    assert r.exit_code == 0, r.output
    assert "1 layer, d_model 16, 1 head x 16" in r.stdout
    r = run("simulate", out, "--exclude", "*c_proj*")
    assert r.exit_code == 0, r.output
    assert "(1 pruned matrix, real masks)" in r.stdout
