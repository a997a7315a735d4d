"""prune --method wanda|sparsegpt --calibration on tiny random GPT-2 / Llama models and the built-in
GPT: exact counts, loadable outputs, agreement with a direct computation, refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers
from safetensors import safe_open

from sparsetool.errors import SparsetoolError
from sparsetool.masks.wanda import wanda_mask
from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.eval import evaluate
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from helpers import (
    CALIB,
    hf_model,
    make_corpus,
    runner_for,
    save_tokenizer,
    tensors,
    tiny_causal_lm,
)

os.environ["HF_HUB_OFFLINE"] = "1"


def targeted(name: str) -> bool:
    return (
        name.endswith((".c_attn.weight", ".c_proj.weight", ".c_fc.weight", "_proj.weight"))
        and "lm_head" not in name
    )


@pytest.mark.parametrize("method", ["wanda", "sparsegpt"])
def test_calibration_pruning_writes_exact_counts_that_transformers_loads(
    model_dir, calib_file, method, tmp_path
):
    out = tmp_path / "out"
    result = prune_checkpoint(
        model_dir,
        out,
        PruneOptions(sparsity=0.5, method=method, calibration=str(calib_file), **CALIB),
    )
    before, after = tensors(model_dir), tensors(out)
    assert sorted(before) == sorted(after)
    names = [n for n in before if targeted(n)]
    assert sorted(t.name for t in result.tensors) == sorted(names) and names
    for name in before:
        if name in names:
            w = after[name]
            assert int((w == 0).sum()) == round(0.5 * w.numel()), name
            kept = w != 0
            if method == "wanda":  # the surviving weights are the input's, bit for bit
                assert torch.equal(w[kept], before[name][kept]), name
        else:
            assert torch.equal(after[name], before[name]), name
    if method == "sparsegpt":  # the surviving weights were updated
        assert any(
            not torch.equal(after[n][after[n] != 0], before[n][after[n] != 0]) for n in names
        )
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    for name in names:
        key = name if name in loaded else name.removeprefix("model.")
        assert torch.equal(loaded[key] == 0, after[name] == 0), name
    with safe_open(str(next(out.glob("*.safetensors"))), "pt") as f:
        record = json.loads(f.metadata()["sparsetool"])
    assert record["method"] == method and record["updates_weights"] is (method == "sparsegpt")
    assert record["calibration"]["samples"] == 6 and record["calibration"]["seq"] == 32
    assert record["calibration"]["text"] == str(calib_file)
    assert ("dampening" in record["calibration"]) is (method == "sparsegpt")
    row = evaluate([out], text=calib_file.read_text(), seq=32, max_tokens=300).rows[0]
    assert row.targeted_sparsity == pytest.approx(0.5) and row.nll == row.nll and row.nll > 0


def test_wanda_masks_equal_a_direct_computation_from_transformers_activations(
    text, calib_file, tmp_path
):
    """For every block, the input of its fused qkv layer (ln_1 of the block's input, which the
    earlier pruned blocks produced) gives Wanda's mask of that layer, computed here directly."""
    src = tmp_path / "g2"
    torch.manual_seed(1)
    hf_model("gpt2").eval().save_pretrained(src)
    save_tokenizer(src, text)
    out = tmp_path / "out"
    prune_checkpoint(
        src,
        out,
        PruneOptions(sparsity=0.6, method="wanda", calibration=str(calib_file), seed=3, **CALIB),
    )
    pruned = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    dense = tensors(src)
    ids = transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    batch = calibration_windows(ids, CALIB["samples"], CALIB["seq"], 3, "t")
    with torch.no_grad():
        hidden = pruned(input_ids=batch, output_hidden_states=True).hidden_states
    for i, block in enumerate(pruned.transformer.h):
        x = block.ln_1(hidden[i]).reshape(-1, 32).double()
        name = f"transformer.h.{i}.attn.c_attn.weight"
        w = dense[name].T  # Conv1D stores (in, out)
        expect = wanda_mask(w, (x**2).sum(0), keep=w.numel() - round(0.6 * w.numel()))
        assert torch.equal(block.attn.c_attn.weight.T != 0, expect), name


def test_nm_with_other_encodings_keeps_the_pattern_and_the_shards(text, calib_file, tmp_path):
    src = tmp_path / "llama"
    torch.manual_seed(0)
    hf_model("llama").eval().save_pretrained(src, max_shard_size="20KB")
    save_tokenizer(src, text)
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) > 1
    for method, encoding in (("wanda", "mask"), ("sparsegpt", "bitmask")):
        out = tmp_path / f"{method}-{encoding}"
        result = prune_checkpoint(
            src,
            out,
            PruneOptions(
                nm=(2, 4), method=method, encoding=encoding, calibration=str(calib_file), **CALIB
            ),
        )
        assert sorted(p.name for p in out.glob("*.safetensors")) == shards
        assert (out / "model.safetensors.index.json").is_file()
        from sparsetool import load

        weights = load(out)
        for t in result.tensors:
            w = weights[t.name]
            assert t.nonzero == w.numel() // 2
            assert bool(((w != 0).view(w.shape[0], -1, 4).sum(2) == 2).all()), t.name


def test_same_seed_same_output_and_the_seed_picks_the_windows(model_dir, calib_file, tmp_path):
    opts = dict(sparsity=0.5, method="wanda", calibration=str(calib_file), **CALIB)
    a, b, c = (tmp_path / n for n in "abc")
    prune_checkpoint(model_dir, a, PruneOptions(seed=1, **opts))
    prune_checkpoint(model_dir, b, PruneOptions(seed=1, **opts))
    prune_checkpoint(model_dir, c, PruneOptions(seed=2, **opts))
    ta, tb, tc = tensors(a), tensors(b), tensors(c)
    assert all(torch.equal(ta[n], tb[n]) for n in ta)
    assert any(not torch.equal(ta[n], tc[n]) for n in ta)


def test_builtin_gpt_is_pruned_block_by_block(tmp_path, calib_file):
    data = make_corpus(tmp_path / "corpus")
    r = runner_for("train")(
        "--out",
        str(tmp_path / "run"),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        "4",
        "--batch-size",
        "4",
        "--warmup",
        "1",
        "--seed",
        "0",
        "--json",
    )
    assert r.exit_code == 0, r.output
    for method in ("wanda", "sparsegpt"):
        out = tmp_path / f"gpt-{method}"
        r = run(
            str(tmp_path / "run"),
            "-o",
            str(out),
            "--method",
            method,  # run: prune
            "--sparsity",
            "0.7",
            "--calibration",
            str(calib_file),
            "--samples",
            "4",
            "--seq",
            "64",
            "--json",
        )
        assert r.exit_code == 0, r.output
        for t in json.loads(r.stdout)["tensors"]:
            assert t["numel"] - t["nonzero"] == round(0.7 * t["numel"]), t["name"]
        row = evaluate([out], text=calib_file.read_text(), seq=64, max_tokens=500).rows[0]
        assert row.kind == "sparsetool-gpt" and row.targeted_sparsity == pytest.approx(
            0.7, abs=1e-3
        )


# ------------------------------------------------------------------------------------ refusals
run = runner_for("prune")


def test_usage_errors_exit_2(model_dir, calib_file, tmp_path):
    out = tmp_path / "o"
    r = run(
        model_dir,
        "-o",
        out,
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--calibration",
        calib_file,
        "--scope",
        "global",
    )
    assert r.exit_code == 2 and "layer-wise" in r.output and "--scope global" in r.output
    r = run(model_dir, "-o", out, "--method", "sparsegpt", "--sparsity", "0.5")
    assert r.exit_code == 2 and "--calibration" in r.output
    r = run(model_dir, "-o", out, "--sparsity", "0.5", "--calibration", calib_file)
    assert r.exit_code == 2 and "--calibration is read by --method wanda or sparsegpt" in r.output
    r = run(
        model_dir, "-o", out, "--method", "wanda", "--fraction", "0.5", "--calibration", calib_file
    )
    assert r.exit_code == 2 and "not --fraction" in r.output
    r = run(model_dir, "-o", out, "--sparsity", "0.5", "--samples", "64")
    assert r.exit_code == 2 and "--samples is read by --method wanda or sparsegpt" in r.output
    r = run(
        model_dir,
        "-o",
        out,
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--calibration",
        calib_file,
        "--blocksize",
        "64",
    )
    assert r.exit_code == 2 and "--blocksize is read by --method sparsegpt only" in r.output
    for opt, value in (
        ("--samples", "0"),
        ("--seq", "1"),
        ("--dampening", "0"),
        ("--blocksize", "-1"),
    ):
        r = run(
            model_dir,
            "-o",
            out,
            "--method",
            "sparsegpt",
            "--sparsity",
            "0.5",
            "--calibration",
            calib_file,
            opt,
            value,
        )
        assert r.exit_code == 2 and opt in r.output, opt
    assert not out.exists()


def test_too_short_text_is_one_error_line_and_no_output(model_dir, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("the sparse model " * 10)
    out = tmp_path / "o"
    r = run(
        model_dir,
        "-o",
        out,
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--calibration",
        short,
        "--samples",
        "128",
        "--seq",
        "32",
    )
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --calibration ")
    assert "--samples 128 x --seq 32 needs 4,096" in lines[0]
    assert not out.exists() and not list(tmp_path.glob(".*o*"))


def test_seq_longer_than_the_context_is_refused(model_dir, calib_file, tmp_path):
    r = run(
        model_dir,
        "-o",
        tmp_path / "o",
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--calibration",
        calib_file,
        "--seq",
        "65",
        "--samples",
        "1",
    )
    assert r.exit_code == 1 and "--seq 65" in r.output and "at most 64" in r.output


def test_a_model_that_is_not_a_causal_lm_is_refused(tmp_path, text, calib_file):
    t = transformers
    d = tmp_path / "bert"
    t.BertForMaskedLM(
        t.BertConfig(
            num_hidden_layers=1,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            vocab_size=320,
        )
    ).save_pretrained(d)
    save_tokenizer(d, text)
    r = run(
        d,
        "-o",
        tmp_path / "o",
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--calibration",
        calib_file,
    )
    assert r.exit_code == 1 and "not a causal language model" in r.output
    assert "runs causal language models only" in r.output and not (tmp_path / "o").exists()


def test_a_bare_safetensors_file_has_no_model_to_run(gpt2_file, calib_file, tmp_path):
    with pytest.raises(SparsetoolError, match="no config.json, so no model to run"):
        prune_checkpoint(
            gpt2_file,
            tmp_path / "o.safetensors",
            PruneOptions(sparsity=0.5, method="wanda", calibration=str(calib_file)),
        )


def test_a_target_outside_the_blocks_is_refused(model_dir, calib_file, tmp_path):
    head = "lm_head.weight" if "llama" in str(model_dir) else "transformer.wte.weight"
    with pytest.raises(SparsetoolError, match="outside the transformer blocks|not a parameter"):
        prune_checkpoint(
            model_dir,
            tmp_path / "o",
            PruneOptions(
                sparsity=0.5, method="wanda", calibration=str(calib_file), include=(head,), **CALIB
            ),
        )
    assert not (tmp_path / "o").exists()


def test_python_api_and_cli_write_the_same_checkpoint(model_dir, calib_file, tmp_path):
    import sparsetool

    api, cli = tmp_path / "api", tmp_path / "cli"
    result = sparsetool.prune(
        model_dir,
        api,
        nm="2:4",
        method="sparsegpt",
        calibration=calib_file,
        samples=4,
        seq=32,
        dampening=0.05,
        blocksize=8,
    )
    assert result.options.dampening == 0.05 and result.options.blocksize == 8
    r = run(
        model_dir,
        "-o",
        cli,
        "--nm",
        "2:4",
        "--method",
        "sparsegpt",
        "--calibration",
        calib_file,
        "--samples",
        "4",
        "--seq",
        "32",
        "--dampening",
        "0.05",
        "--blocksize",
        "8",
        "--quiet",
    )
    assert r.exit_code == 0, r.output
    a, c = tensors(api), tensors(cli)
    assert sorted(a) == sorted(c) and all(torch.equal(a[n], c[n]) for n in a)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["opt", "gpt_neox", "mistral"])
def test_opt_neox_and_mistral_are_pruned_block_by_block(kind, text, calib_file, tmp_path):
    src = tmp_path / kind
    torch.manual_seed(0)
    tiny_causal_lm(kind).eval().save_pretrained(src)
    save_tokenizer(src, text)
    for method in ("wanda", "sparsegpt"):
        out = tmp_path / f"{kind}-{method}"
        result = prune_checkpoint(
            src,
            out,
            PruneOptions(sparsity=0.5, method=method, calibration=str(calib_file), **CALIB),
        )
        assert len(result.tensors) >= 8
        after = tensors(out)
        for tr in result.tensors:
            w = after[tr.name]
            assert int((w == 0).sum()) == round(0.5 * w.numel()) == tr.numel - tr.nonzero, tr.name
        loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            assert torch.isfinite(loaded(input_ids=torch.tensor([[1, 5, 9, 30]])).logits).all()


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_sparsegpt_makes_one_hessian_per_distinct_input_and_drops_it_after_its_layers(
    kind, text, calib_file, tmp_path, monkeypatch
):
    """Llama's q/k/v read one tensor and its gate/up another: one X^T X (and one inverse factor)
    each, so 4 per block where there are 7 layers; GPT-2's 4 layers each read their own. Each
    factor is gone once the layers of its input are pruned (none is alive when the next is made)."""
    import weakref

    from sparsetool.masks import sparsegpt
    from sparsetool.ops.prune import calibrated, plan_prune, write_pruned

    src = tmp_path / "dense"
    torch.manual_seed(0)
    hf_model(kind).eval().save_pretrained(src)
    save_tokenizer(src, text)
    made: list[tuple[int, int]] = []  # (size, factors of earlier inputs still alive)
    alive: list[weakref.ref] = []
    real = sparsegpt.inverse_hessian_factor

    def counting(h, *args, **kwargs):
        made.append((h.shape[0], sum(r() is not None for r in alive)))
        out = real(h, *args, **kwargs)
        alive.append(weakref.ref(out))
        return out

    monkeypatch.setattr(sparsegpt, "inverse_hessian_factor", counting)
    monkeypatch.setattr(calibrated, "inverse_hessian_factor", counting, raising=False)
    plan = plan_prune(
        src, PruneOptions(sparsity=0.5, method="sparsegpt", calibration=str(calib_file), **CALIB)
    )
    result = write_pruned(plan, tmp_path / "out")
    per_block = {"llama": [32, 32, 32, 64], "gpt2": [32, 32, 32, 128]}[kind]  # smallest solve first
    assert len(result.tensors) == {"llama": 14, "gpt2": 8}[kind]
    assert made == [(n, 0) for n in per_block * 2]
    shared = plan.planner.shared
    if kind == "llama":
        p = "model.layers.0."
        assert sorted(map(sorted, shared[0])) == sorted(
            [
                [p + f"self_attn.{x}_proj.weight" for x in "kqv"],
                [p + "self_attn.o_proj.weight"],
                [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
                [p + "mlp.down_proj.weight"],
            ]
        )
    else:
        assert all(len(group) == 1 for groups in shared.values() for group in groups)
    # the memory plan's guess, made before anything runs, is the sharing seen
    assert {i: sorted(map(sorted, plan.planner.expected_inputs(i))) for i in shared} == {
        i: sorted(map(sorted, groups)) for i, groups in shared.items()
    }


def test_block_statistics_share_an_input_read_by_several_layers_bit_for_bit():
    """Two layers reading one tensor share one X^T X, equal to each layer's own sum; a layer
    reading another tensor (of the same size) has its own; the statistics go with the last layer."""
    from sparsetool.ops.prune.statistics import BlockStatistics

    torch.manual_seed(0)
    a, b, c = (torch.nn.Linear(8, 8) for _ in range(3))
    stats = BlockStatistics(
        {"a.weight": 8, "b.weight": 8, "c.weight": 8}, True, torch.device("cpu")
    )
    hooks = [m.register_forward_hook(stats.hook(f"{n}.weight")) for n, m in zip("abc", (a, b, c))]
    xs = [torch.randn(2, 5, 8) for _ in range(3)]
    for x in xs:
        a(x), b(x), c(x + 1)
        stats.window_done()
    for h in hooks:
        h.remove()
    assert stats.groups() == [["a.weight", "b.weight"], ["c.weight"]]
    own = torch.zeros(8, 8)
    for x in xs:
        own += x.reshape(-1, 8).T @ x.reshape(-1, 8)
    assert torch.equal(stats.of("a.weight").h, own) and stats.of("b.weight") is stats.of("a.weight")
    order = stats.solve_order(lambda name: {"a.weight": 1, "b.weight": 1, "c.weight": 0}[name])
    assert order == ["c.weight", "a.weight", "b.weight"]
    shared = stats.of("a.weight")
    stats.release("a.weight")
    assert shared.h is not None
    stats.release("b.weight")
    assert shared.h is None and stats.groups() == [["c.weight"]]
