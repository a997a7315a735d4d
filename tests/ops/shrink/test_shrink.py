"""shrink --experts: the written model is the input with the removed experts' router logits at
-inf (the definition of removal), for every Mixture-of-Experts family and both storage layouts;
each layer is scored on what the already-shrunk earlier blocks feed it; --merge writes the
routed-frequency-weighted averages it records; usage errors come before any weight is read."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
import transformers as t
from moe_models import build, save_moe
from safetensors import safe_open

from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.shrink import ShrinkOptions, plan_experts, shrink_experts

from helpers import CALIB, run, save_tokenizer

FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "mixtral_fused")


def _deepseek() -> torch.nn.Module:
    """DeepSeek-V3 with 8 routed experts in 2 groups (a token chooses 1 group, 2 experts): the
    tiny model of moe_models has too few per group to lose any."""
    torch.manual_seed(0)
    return t.DeepseekV3ForCausalLM(
        t.DeepseekV3Config(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
            vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1,
            pad_token_id=None, intermediate_size=64, moe_intermediate_size=24,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
            first_k_dense_replace=1, n_group=2, topk_group=1, kv_lora_rank=16, q_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
        )
    ).eval()  # fmt: skip


def _model(kind: str) -> torch.nn.Module:
    model = _deepseek() if kind == "deepseek_v3" else build(kind)
    torch.manual_seed(1)  # routers of random models barely differ: spread their rows
    with torch.no_grad():
        for m in model.modules():
            if "router" in type(m).__name__.lower():
                m.weight.normal_(0, 1.0)
                if kind == "deepseek_v3":
                    m.e_score_correction_bias.uniform_(-0.05, 0.05)
    return model


@contextlib.contextmanager
def logits_removed(model: torch.nn.Module, removed: dict[int, list[int]]):
    """``model`` with the router logits of ``removed`` (block -> experts) set to -inf (and
    DeepSeek-V3's correction bias, which enters the choice beside them)."""
    handles, linear = [], torch.nn.functional.linear
    for name, m in model.named_modules():
        if "router" not in type(m).__name__.lower():
            continue
        block = int(name.split(".")[2])
        if block not in removed:
            continue
        mask = torch.zeros(m.weight.shape[0])
        mask[removed[block]] = float("-inf")

        def patch(module, args, mask=mask):
            torch.nn.functional.linear = lambda *a: linear(*a) + mask

        def unpatch(module, args, output):
            torch.nn.functional.linear = linear

        handles += [m.register_forward_pre_hook(patch), m.register_forward_hook(unpatch)]
        if hasattr(m, "e_score_correction_bias"):
            m.e_score_correction_bias[removed[block]] = float("-inf")
    try:
        yield model
    finally:
        torch.nn.functional.linear = linear
        for h in handles:
            h.remove()


def _numel(f, key: str) -> int:
    n = 1
    for d in f.get_slice(key).get_shape():
        n *= d
    return n


def _removed(result) -> dict[int, list[int]]:
    return {layer["block"]: layer["removed"] for layer in result.layers}


@pytest.fixture(scope="module")
def ids(text) -> torch.Tensor:
    return torch.randint(2, 300, (2, 24), generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("kind", FAMILIES)
def test_the_written_model_is_the_input_with_removed_logits_at_minus_inf(
    kind, tmp_path, text, calib_file, ids
):
    model = _model(kind)
    src = save_moe(kind, tmp_path / "in", text, model=model)
    fraction = 0.25 if kind == "deepseek_v3" else 0.5
    opts = ShrinkOptions(experts=fraction, calibration=calib_file, **CALIB)
    result = shrink_experts(src, tmp_path / "out", opts)
    removed = _removed(result)
    experts = result.plan.experts
    assert result.plan.keep == experts - round(fraction * experts)
    assert all(len(r) == experts - result.plan.keep for r in removed.values())
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad(), logits_removed(model, removed):
        want = model(ids).logits
    with torch.no_grad():
        got = out(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the experts really are gone from the files, and the config says so
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert result.plan.keep in [
        cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")
    ]
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        stored = sum(_numel(f, k) for k in f.keys())
    assert stored == result.parameters_after < result.parameters_before
    assert result.bytes_after < result.bytes_before
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_each_block_is_scored_on_the_shrunk_earlier_blocks(tmp_path, text, calib_file):
    """Block 1's routed-token counts are those of the original model whose block 0 lost its
    removed experts, on the same calibration windows."""
    model = _model("qwen3_moe")
    src = save_moe("qwen3_moe", tmp_path / "in", text, model=model)
    opts = ShrinkOptions(experts=0.5, criterion="frequency", calibration=calib_file, **CALIB)
    result = shrink_experts(src, tmp_path / "out", opts)
    tok = t.AutoTokenizer.from_pretrained(src)
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    counts = torch.zeros(result.plan.experts)

    def hook(module, args):
        counts.add_(torch.bincount(args[1].reshape(-1), minlength=counts.numel()).float())

    handle = model.model.layers[1].mlp.experts.register_forward_pre_hook(hook)
    with torch.no_grad(), logits_removed(model, {0: _removed(result)[0]}):
        for row in windows:
            model(row.unsqueeze(0))
    handle.remove()
    assert counts.tolist() == result.layers[1]["routed_tokens"]
    # frequency keeps the most routed; the scores are those counts
    assert result.layers[1]["scores"] == result.layers[1]["routed_tokens"]
    top = sorted(range(len(counts)), key=lambda e: (-counts[e], e))[: result.plan.keep]
    assert result.layers[1]["kept"] == sorted(top)


@pytest.mark.parametrize("kind", ["mixtral", "gpt_oss"])
def test_merge_writes_the_recorded_frequency_weighted_averages(kind, tmp_path, text, calib_file):
    model = _model(kind)
    src = save_moe(kind, tmp_path / "in", text, model=model)
    opts = ShrinkOptions(experts=0.5, merge=True, calibration=calib_file, **CALIB)
    result = shrink_experts(src, tmp_path / "out", opts)
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    merged_any = False
    for layer in result.layers:
        i, kept = layer["block"], layer["kept"]
        assert set(layer["merged"]) <= {str(k) for k in kept}
        members = sorted(j for group in layer["merged"].values() for j, _ in group)
        assert members == sorted(set(members)), "each expert in one cluster at most"
        before = model.model.layers[i].mlp.experts
        after = out.model.layers[i].mlp.experts
        for n, k in enumerate(kept):
            group = layer["merged"].get(str(k), [[k, 1.0]])
            counts = [layer["routed_tokens"][j] for j, _ in group]
            total = sum(counts)
            assert [w for _, w in group] == pytest.approx(
                [c / total for c in counts] if total else [1 / len(group)] * len(group), abs=1e-6
            )
            merged_any |= len(group) > 1
            for name in ("gate_up_proj", "down_proj"):
                want = sum(w * getattr(before, name)[j] for j, w in group)
                torch.testing.assert_close(getattr(after, name)[n], want, rtol=1e-5, atol=1e-6)
    assert merged_any
    # provenance carries the choice
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        record = json.loads(f.metadata()["sparsetool"])
    assert record["command"] == "shrink" and record["merge"] is True
    assert [x["kept"] for x in record["experts"]["layers"]] == [x["kept"] for x in result.layers]


def test_random_needs_no_text_and_is_seeded(tmp_path, text):
    src = save_moe("olmoe", tmp_path / "in", text)
    a = shrink_experts(src, tmp_path / "a", ShrinkOptions(experts_keep=2, criterion="random"))
    b = shrink_experts(src, tmp_path / "b", ShrinkOptions(experts_keep=2, criterion="random"))
    c = shrink_experts(
        src, tmp_path / "c", ShrinkOptions(experts_keep=2, criterion="random", seed=7)
    )
    assert [x["kept"] for x in a.layers] == [x["kept"] for x in b.layers]
    assert a.tokens == 0 and all("routed_tokens" not in x for x in a.layers)
    assert len({tuple(x["kept"]) for x in a.layers + c.layers}) > 1


def test_group_limited_routers_lose_alike_per_group():
    opts = ShrinkOptions(experts=0.5)
    plan = plan_experts(opts, 16, 2, groups=4, topk_group=2, group_top=2)
    assert (plan.keep, plan.keep_per_group) == (8, 2)
    with pytest.raises(UsageError, match="multiple of 4"):
        plan_experts(ShrinkOptions(experts_keep=6), 16, 2, groups=4, topk_group=2)
    with pytest.raises(UsageError, match="routes each token to 4"):
        plan_experts(ShrinkOptions(experts=0.75), 16, 4, groups=4, topk_group=1)
    with pytest.raises(UsageError, match="best 2"):
        plan_experts(ShrinkOptions(experts=0.75), 16, 1, groups=4, topk_group=4, group_top=2)


def test_usage_errors_before_the_text_or_weights_are_read(tmp_path, text):
    """Each request the model's router cannot serve is exit 2, one line, even with a calibration
    path that does not exist (read only after these checks)."""
    src = save_moe("mixtral", tmp_path / "in", text)
    missing = tmp_path / "no-such-text.txt"
    for args, says in [
        (
            ["--experts", "0.1"],
            f"--experts 0.1 removes none of {src}'s 4 routed experts per "
            "layer (round(0.1 x 4) = 0); ask for a larger fraction",
        ),
        (["--experts-keep", "1"], "routes each token to 2"),
        (
            ["--experts-keep", "4"],
            f"--experts-keep 4 keeps all of {src}'s 4 routed experts per layer; keep at most 3",
        ),
        (
            ["--experts-keep", "5"],
            f"--experts-keep 5: {src} has only 4 routed experts per layer; keep at most 3",
        ),
        (
            ["--experts", "1.5"],
            "--experts must be strictly between 0 and 1 (the fraction of "
            "each layer's routed experts removed), got 1.5",
        ),
        (["--experts", "0.5", "--experts-keep", "2"], "--experts F"),
        ([], "--experts F"),
    ]:
        r = run("shrink", src, "-o", tmp_path / "out", "--calibration", missing, *args)
        assert r.exit_code == 2, r.output
        assert says in r.output and r.output.count("error:") == 1, r.output
    r = run("shrink", src, "-o", tmp_path / "out", "--experts", "0.5")
    assert r.exit_code == 2 and "give --calibration" in r.output
    r = run("shrink", src, "-o", tmp_path / "out", "--experts", "0.5", "--calibration", missing)
    assert r.exit_code == 1 and "no such file" in r.output
    assert not (tmp_path / "out").exists()


def test_a_dense_model_is_refused_naming_it(tmp_path, text):
    src = tmp_path / "llama"
    torch.manual_seed(0)
    t.LlamaForCausalLM(
        t.LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=320)
    ).save_pretrained(src)  # fmt: skip
    save_tokenizer(src, text)
    r = run("shrink", src, "-o", tmp_path / "out", "--experts", "0.5", "--criterion", "random")
    assert r.exit_code == 2 and "has no routed experts" in r.output and str(src) in r.output


def test_llama4_is_refused_as_prune_refuses_it(tmp_path, text):
    src = save_moe("llama4", tmp_path / "in", text)
    with pytest.raises(SparsetoolError, match="sorted per expert"):
        shrink_experts(src, tmp_path / "out", ShrinkOptions(experts=0.5, criterion="random"))
    assert not (tmp_path / "out").exists()


def test_output_equal_to_input_is_refused(tmp_path, text):
    src = save_moe("mixtral", tmp_path / "in", text)
    r = run("shrink", src, "-o", src, "--experts", "0.5", "--criterion", "random")
    assert r.exit_code == 2 and "is the input itself" in r.output


def test_the_cli_prints_what_it_kept_and_json_holds_it(tmp_path, text, calib_file):
    src = save_moe("qwen3_moe", tmp_path / "in", text)
    r = run("shrink", src, "-o", tmp_path / "out", "--experts", "0.5",
            "--calibration", calib_file, "--samples", "4", "--seq", "16", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["experts"] == {"before": 4, "after": 2, "top_k": 2, "groups": 1}
    assert [len(x["kept"]) for x in got["layers"]] == [2, 2]
    r = run("shrink", src, "-o", tmp_path / "out2", "--experts", "0.5",
            "--calibration", calib_file, "--samples", "4", "--seq", "16")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "4 -> 2 routed experts" in r.output and "wrote" in r.output


def test_the_output_composes_with_prune_flops_and_eval(tmp_path, text, calib_file):
    src = save_moe("olmoe", tmp_path / "in", text)
    out = tmp_path / "half"
    shrink_experts(src, out, ShrinkOptions(experts=0.5, calibration=calib_file, **CALIB))
    calib = ["--calibration", calib_file, "--samples", "4", "--seq", "16"]
    r = run("prune", out, "-o", tmp_path / "pruned", "--method", "wanda", "--sparsity", "0.5",
            *calib, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"]["targeted_sparsity"] == pytest.approx(0.5, abs=0.01)
    flops = {}
    for name, path in (("in", src), ("half", out)):
        r = run("flops", "--checkpoint", path, "--json")
        assert r.exit_code == 0, r.output
        flops[name] = json.loads(r.stdout)["config"]
    assert (flops["in"]["n_experts"], flops["half"]["n_experts"]) == (4, 2)
    assert flops["in"]["top_k"] == flops["half"]["top_k"] == 2
    r = run("eval", src, out, tmp_path / "pruned", "--text", calib_file, "--seq", "16", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["checkpoints"]
    assert got[0]["params"] > got[1]["params"] == got[2]["params"]


def test_the_python_api_takes_the_cli_names(tmp_path, text, calib_file):
    import sparsetool

    src = save_moe("mixtral", tmp_path / "in", text)
    got = sparsetool.shrink(src, tmp_path / "out", experts_keep=3, calibration=str(calib_file),
                            samples=4, seq=16, criterion="ean")  # fmt: skip
    assert got.plan.keep == 3 and got.to_json()["options"]["criterion"] == "ean"
    with pytest.raises(SparsetoolError, match="experts=F"):
        sparsetool.shrink(src, tmp_path / "other", criterion="random")
    assert not (tmp_path / "other").exists()
