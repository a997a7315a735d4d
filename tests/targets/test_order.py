"""Tensors are listed by layer as a number, then role: one key (sparsetool.targets.order)
everywhere."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from safetensors.torch import save_file

from sparsetool.targets import role
from sparsetool.targets.order import layer_index, natural_key, sort_names, tensor_sort_key

from helpers import gpt2_like_state, is_gpt2_target, run


@pytest.fixture
def twelve_layers(tmp_path: Path) -> Path:
    path = tmp_path / "m12.safetensors"
    save_file(gpt2_like_state(n_layer=12, d=8, vocab=16), str(path), metadata={"format": "pt"})
    return path


def _targets_in_order() -> list[str]:
    return [
        f"transformer.h.{i}.{m}.weight"
        for i in range(12)
        for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    ]


def test_sort_key_numbers_as_numbers_roles_in_a_fixed_order():
    llama = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"] + [
        f"model.layers.{i}.{m}.weight"
        for i in range(12)
        for m in (
            "input_layernorm",
            "mlp.down_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "self_attn.k_proj",
            "self_attn.o_proj",
            "self_attn.q_proj",
            "self_attn.v_proj",
        )
    ]
    shuffled = llama[:]
    random.Random(0).shuffle(shuffled)
    got = sort_names(shuffled)
    assert got[0] == "model.embed_tokens.weight" and got[-2:] == [
        "model.norm.weight",
        "lm_head.weight",
    ]
    assert [layer_index(n) for n in got[1:-2]] == [i for i in range(12) for _ in range(8)]
    assert got[1:9] == [
        f"model.layers.0.{m}.weight"
        for m in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
            "input_layernorm",
        )
    ]
    assert sorted(["e.10.w", "e.9.w", "e.1.w"], key=natural_key) == ["e.1.w", "e.9.w", "e.10.w"]
    # the role given and the role computed agree
    name = "transformer.h.3.mlp.c_fc.weight"
    assert tensor_sort_key(name) == tensor_sort_key(name, role(name, ()))


def test_report_lists_layers_in_natural_order(twelve_layers):
    r = run("report", twelve_layers, "--json")
    assert r.exit_code == 0, r.output
    names = [t["name"] for t in json.loads(r.stdout)["tensors"]]
    assert [n for n in names if is_gpt2_target(n)] == _targets_in_order()
    assert names[:2] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert names[-2:] == ["transformer.ln_f.weight", "transformer.ln_f.bias"]  # norm, then bias
    layers = [layer_index(n) for n in names if layer_index(n) is not None]
    assert layers == sorted(layers)
    r = run("report", twelve_layers, "--format", "plain", "--targeted")
    lines = [ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("transformer.")]
    assert lines == _targets_in_order()


def test_simulate_and_prune_list_layers_in_natural_order(twelve_layers, tmp_path):
    out = tmp_path / "p.safetensors"
    r = run("prune", twelve_layers, "-o", out, "-s", "0.5", "--json")
    assert r.exit_code == 0, r.output
    assert [t["name"] for t in json.loads(r.stdout)["tensors"]] == _targets_in_order()
    r = run("simulate", out, "--json")
    assert r.exit_code == 0, r.output
    assert [ly["name"] for ly in json.loads(r.stdout)["layers"]] == _targets_in_order()


def test_diff_uses_the_same_key(twelve_layers, tmp_path):
    out = tmp_path / "p.safetensors"
    assert run("prune", twelve_layers, "-o", out, "-s", "0.5").exit_code == 0
    r = run("diff", twelve_layers, out, "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["tensors"]
    names = list(dict.fromkeys(t["name"] for t in rows))
    assert names == _targets_in_order()
    assert [t["part"] for t in rows[:3]] == ["Q", "K", "V"]  # a fused tensor's parts stay in order
