"""Mixture-of-experts checkpoints pruned by magnitude, at random and N:M, at layer and global
scope: every expert's matrix is a unit of its own, stored apart (Mixtral, Qwen3-MoE, OLMoE,
DeepSeek-V3) or fused in one 3-D tensor ((experts, in, out) for gpt-oss, (experts, out, in) for a
Mixtral saved as transformers holds it); routers are left alone; transformers loads the output
with the expected zeros; ``report`` lists experts.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from moe_models import EXPERT_FFN, EXPERTS, FAMILIES, HIDDEN, save_moe
from safetensors.torch import load_file, save_file

from sparsetool.ops.prune import PruneOptions, prune_checkpoint
from sparsetool.ops.report import expert_spread, layer_cells, summarize
from sparsetool.targets import plan_targets

import json_schemas as S
from helpers import gpt2_like_state, run

FUSED = {"gpt_oss": "stacked_t", "mixtral_fused": "stacked"}


def _moe_layers(kind: str) -> int:
    return 1 if kind == "deepseek_v3" else 2  # DeepSeek's first layer is a dense FFN


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moe")
    return {kind: save_moe(kind, root / kind) for kind in FAMILIES}


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def _plan(path: Path):
    state = load_file(str(path / "model.safetensors"))
    shapes = {k: (tuple(v.shape), "F32") for k, v in state.items()}
    return plan_targets(shapes, _config(path)), state


def _units(plan, state) -> dict[str, torch.Tensor]:
    """Every expert matrix (and every other targeted matrix) as a 2-D tensor: a fused tensor's
    experts one by one, as (out, in)."""
    out = {}
    for name in plan.targeted:
        entry, w = plan[name], state[name]
        if entry.experts:
            for e in range(entry.experts):
                out[f"{name}[{e}]"] = w[e] if entry.layout == "stacked" else w[e].T
        else:
            out[name] = w
    return out


def _input_width(name: str, kind: str) -> int:
    """The input width of an expert matrix or FFN matrix by its meaning: the hidden size for
    gate/up/w1/w3, the expert's FFN width for down/w2."""
    down = "down_proj" in name or ".w2." in name
    return EXPERT_FFN[kind] if down else HIDDEN


@pytest.mark.parametrize("kind", FAMILIES)
def test_plan_routers_experts_and_orientation(saved, kind):
    plan, state = _plan(saved[kind])
    routers = [n for n in state if plan[n].role == "router"]
    assert len(routers) == _moe_layers(kind) and not any(plan[n].targeted for n in routers)
    experts = [n for n in plan.targeted if ".experts." in n]
    assert experts
    for name in experts:
        entry = plan[name]
        if kind in FUSED:
            assert entry.layout == FUSED[kind] and entry.experts == EXPERTS and entry.expert is None
            assert entry.input_dim == (1 if kind == "gpt_oss" else 2)
            assert entry.shape[entry.input_dim] == _input_width(name, kind)
        else:
            assert entry.layout == "linear" and entry.experts == 0
            assert entry.expert in range(EXPERTS)
            assert entry.shape[entry.input_dim] == _input_width(name, kind)
    if kind == "deepseek_v3":
        mla = [n for n in plan.targeted if "_a_proj" in n or "_b_proj" in n]
        assert len(mla) == 4 * 2 and all(plan[n].role == "qkv" for n in mla)
        shared = [n for n in plan.targeted if "shared_experts" in n]
        assert shared and all(plan[n].expert is None for n in shared)
    shapes = {k: (tuple(v.shape), "F32") for k, v in state.items()}
    included = plan_targets(shapes, _config(saved[kind]), include=[routers[0]])
    assert included[routers[0]].targeted and included[routers[0]].role == "router"


def _check_loaded(out: Path, kind: str, check) -> None:
    """Load the pruned output with transformers and hand each layer's in-memory experts tensors
    (fused: (experts, out, in), gpt-oss (experts, in, out)) to
    ``check(name, tensor, input_axis)``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    found = 0
    for name, w in model.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            width = _input_width(name, kind)
            axis = next(a for a in (1, 2) if w.shape[a] == width)
            check(name, w, axis)
            found += 1
    assert found == 2 * _moe_layers(kind)


@pytest.mark.parametrize("kind", FAMILIES)
def test_layer_scope_keeps_an_exact_count_in_every_expert(saved, kind, tmp_path):
    out = tmp_path / "out"
    prune_checkpoint(saved[kind], out, PruneOptions(sparsity=0.5))
    plan, before = _plan(saved[kind])
    after = load_file(str(out / "model.safetensors"))
    for name, w in before.items():  # routers and everything untargeted: byte for byte
        if not plan[name].targeted:
            assert torch.equal(after[name], w), name
    units_before, units_after = _units(plan, before), _units(plan, after)
    for unit, w in units_after.items():
        assert int((w != 0).sum()) == w.numel() - round(0.5 * w.numel()), unit
        kept = units_before[unit].abs()[w != 0]
        dropped = units_before[unit].abs()[w == 0]
        assert kept.min() >= dropped.max(), unit  # the largest of this expert's own weights

    def check(name, w, axis):
        per_expert = (w != 0).reshape(EXPERTS, -1).sum(1)
        assert per_expert.tolist() == [w[0].numel() // 2] * EXPERTS, name

    _check_loaded(out, kind, check)


@pytest.mark.parametrize("kind", FAMILIES)
def test_nm_groups_run_along_each_experts_input(saved, kind, tmp_path):
    out = tmp_path / "out"
    prune_checkpoint(saved[kind], out, PruneOptions(nm=(2, 4)))
    plan, _ = _plan(saved[kind])
    after = load_file(str(out / "model.safetensors"))
    for unit, w in _units(plan, after).items():  # (out, in): groups of 4 along the input
        assert ((w.reshape(w.shape[0], -1, 4) != 0).sum(-1) == 2).all(), unit

    def check(name, w, axis):
        groups = (w.movedim(axis, -1) != 0).reshape(EXPERTS, -1, 4).sum(-1)
        assert (groups == 2).all(), name

    _check_loaded(out, kind, check)


@pytest.mark.parametrize("kind", ["gpt_oss", "mixtral_fused", "qwen3_moe"])
def test_global_scope_pools_every_expert(saved, kind, tmp_path):
    out = tmp_path / "out"
    prune_checkpoint(saved[kind], out, PruneOptions(sparsity=0.6, scope="global"))
    plan, before = _plan(saved[kind])
    after = load_file(str(out / "model.safetensors"))
    numel = sum(before[n].numel() for n in plan.targeted)
    kept = sum(int((after[n] != 0).sum()) for n in plan.targeted)
    assert kept == numel - round(0.6 * numel)
    kept_min = min(float(before[n].abs()[after[n] != 0].min()) for n in plan.targeted)
    dropped_max = max(float(before[n].abs()[after[n] == 0].max()) for n in plan.targeted)
    assert kept_min >= dropped_max  # one threshold for every tensor and expert
    spread = [int((w != 0).sum()) for w in _units(plan, after).values()]
    assert len(set(spread)) > 1  # experts are not held to one count
    for name in before:
        if plan[name].role == "router":
            assert torch.equal(after[name], before[name])


@pytest.mark.parametrize("kind", ["gpt_oss", "mixtral_fused"])
@pytest.mark.parametrize("how", [dict(method="random"), dict(distribution="erk")])
def test_random_and_erk_count_per_expert(saved, kind, how, tmp_path):
    out = tmp_path / "out"
    prune_checkpoint(saved[kind], out, PruneOptions(sparsity=0.7, **how))
    plan, _ = _plan(saved[kind])
    after = load_file(str(out / "model.safetensors"))
    for name in plan.targeted:
        entry = plan[name]
        if entry.experts:
            counts = (after[name] != 0).reshape(EXPERTS, -1).sum(1).tolist()
            if how.get("method") == "random":
                size = after[name][0].numel()
                assert counts == [size - round(0.7 * size)] * EXPERTS, name
            else:  # ERK: each expert's matrix is an (out, in) layer; equal shapes, equal densities
                assert max(counts) - min(counts) <= 1, (name, counts)


def test_fused_experts_from_an_already_pruned_input_compose(saved, tmp_path):
    """The general path (a mask-encoded input) keeps the same weights per expert as the fast
    path on the dense input: the top half of each expert's top 70%."""
    src = saved["gpt_oss"]
    prune_checkpoint(src, tmp_path / "a", PruneOptions(sparsity=0.3, encoding="mask"))
    prune_checkpoint(tmp_path / "a", tmp_path / "b", PruneOptions(sparsity=0.5))
    prune_checkpoint(src, tmp_path / "c", PruneOptions(sparsity=0.5))
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    c = load_file(str(tmp_path / "c" / "model.safetensors"))
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        assert torch.equal(b[name] != 0, c[name] != 0), name


@pytest.mark.parametrize("kind", ["gpt_oss", "olmoe"])
def test_report_rows_json_and_heatmap_cells(saved, kind, tmp_path):
    out = tmp_path / "out"
    prune_checkpoint(saved[kind], out, PruneOptions(sparsity=0.6, scope="global"))
    rep = summarize(out)
    rows = {t.name: t for t in rep.tensors}
    plan, _ = _plan(saved[kind])
    after = load_file(str(out / "model.safetensors"))
    assert set(rows) == set(after)  # one row per stored tensor: per expert, or per fused tensor
    routers = [n for n in rows if n.endswith(("router.weight", "gate.weight"))]
    assert {rows[n].role for n in routers} == {"router"}
    data = json.loads(run("report", out, "--json").stdout)
    assert not S.problems(data, S.REPORT_EXPERTS)
    summary = {
        (s["layer"], s["kind"]): (s["min_sparsity"], s["max_sparsity"])
        for s in data["summary"]["experts"]
    }
    assert set(summary) == {(0, "in"), (0, "out"), (1, "in"), (1, "out")}
    by_name = {t["name"]: t for t in data["tensors"]}
    for name, w in after.items():
        entry = plan[name]
        if entry.experts:
            counts = (w != 0).reshape(EXPERTS, -1).sum(1).tolist()
            spread = by_name[name]["experts"]
            assert spread["nonzero"] == counts and spread["count"] == EXPERTS
            assert spread["min_sparsity"] == min(spread["sparsity"]) < spread["max_sparsity"]
            assert by_name[name]["nonzero"] == sum(counts) and by_name[name]["expert"] is None
        else:
            assert by_name[name]["experts"] is None
            assert by_name[name]["expert"] == entry.expert
    cells, _ = layer_cells(rep.tensors)
    spread = expert_spread(rep.tensors)
    for layer in (0, 1):
        for kind_ in ("experts_in", "experts_out"):
            low, high = spread[(layer, kind_)]
            assert low <= cells[(layer, kind_)] <= high and low < high
            got = summary[layer, kind_.removeprefix("experts_")]
            assert got == pytest.approx((low / 100, high / 100))
    assert (0, "ffn_in") not in cells  # routed experts have rows of their own
    table = run("report", out, "--format", "plain", columns=250).stdout
    header = next(line for line in table.splitlines() if line.startswith("name "))
    assert "expert" in header and "router" in table  # (a "made by:" line may come first)
    png = tmp_path / "moe.png"
    assert run("report", out, "--plot", png, "-q").exit_code == 0 and png.stat().st_size > 0


def test_report_of_a_dense_model_has_no_expert_column(tmp_path):
    src = tmp_path / "m.safetensors"
    save_file(gpt2_like_state(), str(src))
    header = run("report", src, "--format", "plain", columns=250).stdout.splitlines()[1]
    assert "role" in header and "expert" not in header
    assert np.all(
        [
            t["expert"] is None and t["experts"] is None
            for t in json.loads(run("report", src, "--json").stdout)["tensors"]
        ]
    )


def test_a_nan_in_one_fused_expert_is_refused_before_anything_is_written(tmp_path):
    name = "model.layers.0.mlp.experts.gate_up_proj"
    w = torch.randn(4, 8, 16)
    w[2, 3, 5] = float("nan")  # the fast path scans every expert before writing any
    save_file(
        {name: w, "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 16)},
        str(tmp_path / "m.safetensors"),
    )
    r = run("prune", tmp_path / "m.safetensors", "-o", tmp_path / "o.safetensors", "-s", "0.5")
    assert r.exit_code == 1 and name in r.stderr and "NaN" in r.stderr
    assert not (tmp_path / "o.safetensors").exists()
