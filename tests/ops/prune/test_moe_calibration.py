"""Calibration pruning of Mixture-of-Experts checkpoints: each expert's matrices are pruned from
the tokens routed to that expert, weighted by the router as the model weighs them; an expert that
saw too few tokens falls back to magnitude; the output loads in transformers with exact counts."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from moe_models import EXPERTS, save_moe  # noqa: E402
from safetensors import safe_open

from sparsetool.errors import SparsetoolError
from sparsetool.masks.distributions import uniform_keep
from sparsetool.masks.sparsegpt import inverse_hessian_factor, sparsegpt_update
from sparsetool.masks.wanda import wanda_mask
from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from helpers import CALIB, run, tensors

SEED = 3


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory, text):
    return save_moe("mixtral", tmp_path_factory.mktemp("mixtral") / "dense", text)


def _routed_inputs(src, text) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block 0's experts' inputs in the dense model, read by a hook on transformers' own
    experts module: hidden states (tokens, d), chosen experts and their weights (tokens, k)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    seen = {}

    def hook(module, args):
        seen["x"], seen["index"], seen["weights"] = (
            a.detach().double() if a.is_floating_point() else a for a in args[:3]
        )

    handle = model.model.layers[0].mlp.experts.register_forward_pre_hook(hook)
    ids = transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    with torch.no_grad():
        model(input_ids=calibration_windows(ids, CALIB["samples"], CALIB["seq"], SEED, "t"))
    handle.remove()
    return seen["x"], seen["index"], seen["weights"]


def wanda_args(calib_file) -> list:
    return [
        "--method",
        "wanda",
        "--calibration",
        calib_file,
        "--samples",
        CALIB["samples"],
        "--seq",
        CALIB["seq"],
    ]


def _expert(dense: dict, e: int, w: str) -> torch.Tensor:
    return dense[f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"].double()


def test_wanda_prunes_each_expert_from_its_routed_tokens_weighted_by_the_router(
    mixtral, text, calib_file, tmp_path
):
    out = tmp_path / "wanda"
    result = prune_checkpoint(
        mixtral,
        out,
        PruneOptions(sparsity=0.5, method="wanda", calibration=str(calib_file), seed=SEED, **CALIB),
    )
    dense, after = tensors(mixtral), tensors(out)
    x, index, weights = _routed_inputs(mixtral, text)
    for e in range(EXPERTS):
        tokens, slot = (index == e).nonzero(as_tuple=True)
        r = weights[tokens, slot][:, None]
        xe = x[tokens]
        # Mixtral's expert (the paper's SwiGLU): w2(silu(w1 x) * w3 x), its output times r
        h = torch.nn.functional.silu(xe @ _expert(dense, e, "w1").T) * (
            xe @ _expert(dense, e, "w3").T
        )
        for w, inputs in (("w1", xe * r), ("w3", xe * r), ("w2", h * r)):
            name = f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight"
            expect = wanda_mask(
                _expert(dense, e, w).float(), inputs.pow(2).sum(0), keep=dense[name].numel() // 2
            )
            assert torch.equal(after[name] != 0, expect), name
            assert result.experts["routed_tokens"][name] == len(tokens)
    # the router is never targeted; what the routing saw is reported
    for name in (
        "model.layers.0.block_sparse_moe.gate.weight",
        "model.layers.1.block_sparse_moe.gate.weight",
    ):
        assert torch.equal(after[name], dense[name])
    assert (
        sum(
            result.experts["routed_tokens"][
                f"model.layers.0.block_sparse_moe.experts.{e}.w1.weight"
            ]
            for e in range(EXPERTS)
        )
        == 2 * CALIB["samples"] * CALIB["seq"]
    )  # top-2 of every token
    assert result.experts["magnitude"] == [] and result.experts["min_tokens"] == 32


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe", "olmoe", "deepseek_v3"])
@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_every_expert_keeps_its_exact_count_and_transformers_loads_the_output(
    kind, method, text, calib_file, tmp_path
):
    src = save_moe(kind, tmp_path / "dense", text)
    out = tmp_path / "pruned"
    result = prune_checkpoint(
        src,
        out,
        PruneOptions(sparsity=0.75, method=method, calibration=str(calib_file), seed=SEED, **CALIB),
    )
    experts = [t for t in result.tensors if ".experts." in t.name]
    assert len(experts) == 3 * EXPERTS * (
        1 if kind == "deepseek_v3" else 2
    )  # deepseek: block 0 dense
    for t in result.tensors:
        assert t.nonzero == t.numel // 4, t.name
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    gate_up = model.model.layers[1].mlp.experts.gate_up_proj
    for e in range(EXPERTS):
        assert int((gate_up[e] != 0).sum()) == gate_up[e].numel() // 4
    before = tensors(src)
    for name, value in tensors(out).items():
        if name.endswith("mlp.gate.weight") or "layernorm" in name or "embed" in name:
            assert torch.equal(value, before[name]), name
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(2, 30)[None]).logits).all()


def test_an_expert_with_too_few_tokens_falls_back_to_magnitude(mixtral, calib_file, tmp_path):
    """With a minimum above any expert's count, every expert's matrix is pruned by magnitude in
    its method's comparison groups; the attention layers still by their method."""
    dense = tensors(mixtral)
    for method in ("wanda", "sparsegpt"):
        out = tmp_path / method
        result = prune_checkpoint(
            mixtral,
            out,
            PruneOptions(
                sparsity=0.5,
                method=method,
                calibration=str(calib_file),
                seed=SEED,
                expert_min_tokens=10**6,
                **CALIB,
            ),
        )
        after = tensors(out)
        names = [t.name for t in result.tensors if ".experts." in t.name]
        assert sorted(result.experts["magnitude"]) == sorted(names) and len(names) == 6 * EXPERTS
        for name in names:
            w = dense[name]
            if method == "wanda":  # each row's largest weights
                expect = wanda_mask(w, torch.ones(w.shape[1]), keep=w.numel() // 2)
                assert torch.equal(after[name] != 0, expect)
                assert torch.equal(after[name][expect], w[expect])
            else:  # each column block's largest weights, no update
                new, kept = sparsegpt_update(
                    w.clone(),
                    inverse_hessian_factor(torch.eye(w.shape[1]), 0.01),
                    keep=w.numel() // 2,
                )
                assert torch.equal(after[name] != 0, kept) and torch.equal(after[name], w * kept)
        q = "model.layers.0.self_attn.q_proj.weight"
        assert not torch.equal(
            after[q] != 0,
            wanda_mask(dense[q], torch.ones(dense[q].shape[1]), keep=dense[q].numel() // 2),
        )
    # none falls back at 0
    result = prune_checkpoint(
        mixtral,
        tmp_path / "zero",
        PruneOptions(
            sparsity=0.5,
            method="wanda",
            calibration=str(calib_file),
            seed=SEED,
            expert_min_tokens=0,
            **CALIB,
        ),
    )
    assert result.experts["magnitude"] == []


def test_owl_and_dsnot_run_on_experts_with_exact_totals(mixtral, calib_file, tmp_path):
    out = tmp_path / "owl"
    result = prune_checkpoint(
        mixtral,
        out,
        PruneOptions(
            sparsity=0.7,
            method="wanda",
            calibration=str(calib_file),
            seed=SEED,
            allocation="owl",
            refine="dsnot",
            **CALIB,
        ),
    )
    uniform = uniform_keep({t.name: t.numel for t in result.tensors}, 0.7)
    assert sum(t.nonzero for t in result.tensors) == sum(uniform.values())
    assert result.refined["swaps"] > 0 and len(result.allocation) == 2
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert model.model.layers[0].mlp.experts.down_proj.shape[0] == EXPERTS


def test_cli_reports_routed_tokens_and_the_fallback(mixtral, calib_file, tmp_path):
    args = [mixtral, "--sparsity", "0.5", *wanda_args(calib_file)]
    res = run("prune", *args, "-o", tmp_path / "a", "--expert-min-tokens", "100000")
    assert res.exit_code == 0, res.output
    assert "matrices pruned from the tokens routed" not in res.output  # all fell back
    assert (
        "note: 24 expert matrices pruned by magnitude: their expert was routed fewer than 100000"
        in res.output
    )
    res = run("prune", *args, "-o", tmp_path / "b", "--json")
    record = json.loads(res.stdout)
    assert record["options"]["calibration"]["expert_min_tokens"] == 32
    with safe_open(str(tmp_path / "b" / "model.safetensors"), "pt") as f:  # in the provenance too
        provenance = json.loads(f.metadata()["sparsetool"])
    assert provenance["calibration"]["expert_min_tokens"] == 32
    res = run("prune", *args, "-o", tmp_path / "d")
    assert "experts: 24 matrices pruned from the tokens routed to their expert" in res.output
    assert record["experts"]["magnitude"] == [] and len(record["experts"]["routed_tokens"]) == 24
    res = run("prune", *args, "-o", tmp_path / "c", "--expert-min-tokens", "-1")
    assert res.exit_code == 2 and "--expert-min-tokens -1" in res.output


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_experts_fused_on_disk_prune_as_experts_stored_apart(method, text, calib_file, tmp_path):
    """The same Mixtral stored both ways prunes to the same model; gpt-oss, stored fused and
    (experts, in, out), keeps each expert's exact count and loads in transformers."""
    apart = save_moe("mixtral", tmp_path / "apart", text)
    fused = save_moe("mixtral", tmp_path / "fused", text, fused=True)
    opts = PruneOptions(
        sparsity=0.5, method=method, calibration=str(calib_file), seed=SEED, **CALIB
    )
    a = prune_checkpoint(apart, tmp_path / "a", opts)
    f = prune_checkpoint(fused, tmp_path / "f", opts)
    ma = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    mf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "f").state_dict()
    # Wanda compares each row's weights: gate and up apart or concatenated alike. SparseGPT
    # compares a column block's rows together, so there the unit is what is stored (gate and up
    # apart, or both); block 0's down projections are the same unit either way.
    same = list(ma) if method == "wanda" else ["model.layers.0.mlp.experts.down_proj"]
    for name in same:
        assert torch.allclose(ma[name], mf[name], atol=1e-6), name
    for e in range(EXPERTS):
        unit = mf["model.layers.1.mlp.experts.gate_up_proj"][e]
        assert int((unit != 0).sum()) == unit.numel() // 2
    # per expert: w1, w3 and w2 apart, gate_up and down fused; the same tokens routed
    assert set(a.experts["routed_tokens"].values()) == set(f.experts["routed_tokens"].values())
    assert "model.layers.1.mlp.experts.gate_up_proj[3]" in f.experts["routed_tokens"]
    oss = save_moe("gpt_oss", tmp_path / "oss", text)
    result = prune_checkpoint(oss, tmp_path / "o", opts)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "o")
    for i in range(2):
        for p in (
            model.model.layers[i].mlp.experts.gate_up_proj,
            model.model.layers[i].mlp.experts.down_proj,
        ):
            for e in range(EXPERTS):
                assert int((p[e] != 0).sum()) == p[e].numel() // 2
    assert len(result.experts["routed_tokens"]) == 2 * 2 * EXPERTS


def test_experts_called_with_routed_tokens_are_refused_in_one_line(text, calib_file, tmp_path):
    """Llama 4's experts module takes tokens sorted per expert, not the routing: no statistics
    per expert can be told from its call; magnitude still prunes its experts."""
    src = save_moe("llama4", tmp_path / "l4", text)
    res = run("prune", src, "-o", tmp_path / "out", "--sparsity", "0.5", *wanda_args(calib_file))
    assert res.exit_code == 1
    assert (
        "the experts of Llama4TextExperts are not called with each token's chosen experts"
        in res.output
    )
    assert not (tmp_path / "out").exists()
    assert run("prune", src, "-o", tmp_path / "mag", "--sparsity", "0.5").exit_code == 0


def test_statistics_that_do_not_fit_at_once_are_gathered_in_passes(
    mixtral, calib_file, tmp_path, monkeypatch
):
    """SparseGPT holds an in x in matrix per expert and input; when a block's do not fit in the
    budget, the block is calibrated in passes, each holding some of them."""
    from sparsetool.ops import calibration

    monkeypatch.setattr(calibration, "process_memory", lambda: 0)  # the budget, to the byte
    opts = dict(sparsity=0.5, method="sparsegpt", calibration=str(calib_file), seed=SEED, **CALIB)
    one = prune_checkpoint(mixtral, tmp_path / "one", PruneOptions(max_memory=1 << 40, **opts))
    memory = one.memory
    assert not any("passes" in note for note in one.notes)
    tight = memory["weights"] + memory["activations"] + memory["statistics"] - 1
    several = prune_checkpoint(
        mixtral, tmp_path / "several", PruneOptions(max_memory=tight, **opts)
    )
    assert several.memory["statistics"] < memory["statistics"]
    assert any("calibrated in up to" in note and "passes" in note for note in several.notes)
    for t in several.tensors:
        assert t.nonzero == t.numel // 2, t.name
    before, after = tensors(tmp_path / "one"), tensors(tmp_path / "several")
    # block 0's first pass (attention, then experts as they fit) starts from the same block
    q = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(before[q], after[q])
    assert any(not torch.equal(before[n], after[n]) for n in before if ".experts." in n)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "several")
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(2, 30)[None]).logits).all()
    with pytest.raises(SparsetoolError, match="lower it with"):  # not even one input fits
        prune_checkpoint(
            mixtral,
            tmp_path / "none",
            PruneOptions(max_memory=memory["weights"] + memory["activations"] + 1000, **opts),
        )


def test_gpt_oss_experts_stored_in_out_are_pruned_from_their_routed_tokens(
    text, calib_file, tmp_path
):
    """gpt-oss stores every expert in one tensor (experts, in, out), with biases and its own
    clamped SwiGLU; each expert's Wanda mask comes from its routed tokens, scaled by the router."""
    src = save_moe("gpt_oss", tmp_path / "oss", text)
    out = tmp_path / "out"
    prune_checkpoint(
        src,
        out,
        PruneOptions(sparsity=0.5, method="wanda", calibration=str(calib_file), seed=SEED, **CALIB),
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    experts = model.model.layers[0].mlp.experts
    seen = {}

    def hook(module, args, kwargs):
        seen["x"], seen["index"], seen["weights"] = (list(args) + list(kwargs.values()))[:3]

    handle = experts.register_forward_pre_hook(hook, with_kwargs=True)
    ids = transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    with torch.no_grad():
        model(input_ids=calibration_windows(ids, CALIB["samples"], CALIB["seq"], SEED, "t"))
    handle.remove()
    x, index, weights = seen["x"].double(), seen["index"], seen["weights"].double()
    dense, after = tensors(src), tensors(out)
    gate_up = "model.layers.0.mlp.experts.gate_up_proj"
    down = "model.layers.0.mlp.experts.down_proj"
    limit, alpha = model.config.swiglu_limit, 1.702  # gpt-oss's SwiGLU: clamp, x sigmoid(1.702 x)
    for e in range(EXPERTS):
        tokens, slot = (index == e).nonzero(as_tuple=True)
        r = weights[tokens, slot][:, None]
        xe = x[tokens]
        z = xe @ dense[gate_up][e].double() + dense[gate_up + "_bias"][e].double()
        gate, up = z[:, ::2].clamp(max=limit), z[:, 1::2].clamp(-limit, limit)
        h = (up + 1) * gate * torch.sigmoid(alpha * gate)
        for name, inputs in ((gate_up, xe * r), (down, h * r)):
            w = dense[name][e].T  # (out, in)
            expect = wanda_mask(w, inputs.pow(2).sum(0), keep=w.numel() // 2)
            assert torch.equal(after[name][e].T != 0, expect), (name, e)
