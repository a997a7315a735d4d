"""Integer and bool tensors: report counts them apart, prune says they were skipped for their
dtype."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers import run


def _quantized(tmp_path: Path, float_attn: bool = False) -> Path:
    g = torch.Generator().manual_seed(0)
    state = {}
    for i in range(2):
        p = f"h.{i}."
        state[p + "attn.c_attn.weight"] = (
            torch.randn(8, 24, generator=g)
            if float_attn
            else torch.randint(-3, 3, (8, 24), generator=g).to(torch.int8)
        )
        state[p + "attn.c_proj.weight"] = torch.randint(-3, 3, (8, 8), generator=g)  # int64
        state[p + "mlp.c_fc.weight"] = torch.randint(0, 3, (8, 32), generator=g).to(torch.uint8)
        state[p + "mlp.c_proj.weight"] = torch.randint(0, 2, (32, 8), generator=g).bool()
    path = tmp_path / "q.safetensors"
    save_file(state, str(path))
    return path


def test_report_counts_integer_and_bool_parameters_in_the_summary(tmp_path):
    src = _quantized(tmp_path)
    tensors = load_file(src)
    numel = sum(t.numel() for t in tensors.values())
    nonzero = sum(int(torch.count_nonzero(t)) for t in tensors.values())
    r = run("report", src, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)["summary"]
    assert (s["numel"], s["non_float_numel"], s["non_float_nonzero"], s["non_float_tensors"]) == (
        0,
        numel,
        nonzero,
        8,
    )
    assert s["non_float_dtypes"] == ["bool", "int64", "int8", "uint8"]
    r = run("report", src, "--format", "plain")
    assert (
        f"non-float parameters: {numel:,} in 8 tensors (bool, int64, int8, uint8), never "
        "pruned and not in the sparsities above"
    ) in r.stdout
    # a floating checkpoint has no such line
    f = tmp_path / "f.safetensors"
    save_file({"h.0.mlp.c_fc.weight": torch.ones(4, 4)}, str(f))
    r = run("report", f, "--format", "plain")
    assert r.exit_code == 0 and "non-float" not in r.stdout
    assert json.loads(run("report", f, "--json").stdout)["summary"]["non_float_tensors"] == 0


def test_prune_names_the_dtype_when_nothing_is_targeted(tmp_path):
    src = _quantized(tmp_path)
    out = tmp_path / "o.safetensors"
    r = run("prune", src, "-o", out, "-s", "0.5")
    assert r.exit_code == 1
    assert r.stderr.startswith(
        f"error: {src}: no tensor is targeted: 8 tensors that would be (h.0.attn.c_attn.weight, "
        "h.0.attn.c_proj.weight, h.0.mlp.c_fc.weight and 5 more) are bool/int64/int8/uint8, not "
        "floating-point"
    )
    assert not out.exists()


def test_prune_says_which_tensors_it_skipped_for_their_dtype(tmp_path):
    src = _quantized(tmp_path, float_attn=True)
    out = tmp_path / "o.safetensors"
    r = run("prune", src, "-o", out, "-s", "0.5")
    assert r.exit_code == 0, r.output
    note = (
        "note: 6 tensors left unpruned for their bool/int64/uint8 dtype (only floating-point "
        "weights are pruned): h.0.attn.c_proj.weight, h.0.mlp.c_fc.weight, h.0.mlp.c_proj.weight "
        "and 3 more"
    )
    assert note in r.stdout.replace("\n", " ")
    r = run("prune", src, "-o", tmp_path / "o2.safetensors", "-s", "0.5", "--json")
    assert json.loads(r.stdout)["notes"] == [note.removeprefix("note: ")]
    assert (
        "note:"
        not in run("prune", src, "-o", tmp_path / "o3.safetensors", "-s", "0.5", "-q").stdout
    )
