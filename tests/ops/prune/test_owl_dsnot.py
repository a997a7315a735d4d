"""OWL's per-block sparsity and DSnoT's mask refinement: checked against direct computations from
transformers' own activations, for exact counts, and for never raising a row's expected error."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers
from safetensors import safe_open

from sparsetool.masks.distributions import uniform_keep
from sparsetool.masks.dsnot import dsnot_refine
from sparsetool.masks.owl import owl_keep, owl_sparsities
from sparsetool.masks.wanda import wanda_mask
from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from helpers import CALIB, run, save_tokenizer, tensors

os.environ["HF_HUB_OFFLINE"] = "1"

SEED = 3
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def llama4(tmp_path_factory, text):
    """A 4-block Llama whose block 2 reads a few inputs with much larger weights (outliers)."""
    d = tmp_path_factory.mktemp("llama4") / "dense"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            num_hidden_layers=4,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=320,
            max_position_embeddings=64,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=None,
            tie_word_embeddings=False,
        )
    ).eval()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj"):
            getattr(model.model.layers[2].self_attn, name).weight[:, :3] *= 30
        model.model.layers[1].mlp.down_proj.weight[:, :2] *= 10
    model.save_pretrained(d)
    save_tokenizer(d, text)
    return d


def _windows(src, text):
    ids = transformers.AutoTokenizer.from_pretrained(src)(text)["input_ids"]
    return calibration_windows(ids, CALIB["samples"], CALIB["seq"], SEED, "t")


def _linear_inputs(src, text) -> dict[tuple[int, str], torch.Tensor]:
    """Every targeted Linear's inputs (tokens, in) in the dense model, read by forward hooks."""
    model = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    seen: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, module in layer.named_modules():
            short = name.rpartition(".")[2]
            if short in LINEARS:
                hooks.append(
                    module.register_forward_hook(
                        lambda m, args, out, key=(i, short): seen.__setitem__(
                            key, args[0].reshape(-1, args[0].shape[-1]).double()
                        )
                    )
                )
    with torch.no_grad():
        model(input_ids=_windows(src, text))
    for h in hooks:
        h.remove()
    return seen


def _weight(dense: dict, i: int, short: str) -> torch.Tensor:
    part = "self_attn" if short in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
    return dense[f"model.layers.{i}.{part}.{short}.weight"].double()


def test_owl_ratios_and_sparsities_equal_a_direct_computation(llama4, text, calib_file, tmp_path):
    out = tmp_path / "owl"
    result = prune_checkpoint(
        llama4,
        out,
        PruneOptions(
            sparsity=0.7,
            method="wanda",
            calibration=str(calib_file),
            seed=SEED,
            allocation="owl",
            **CALIB,
        ),
    )
    dense, inputs = tensors(llama4), _linear_inputs(llama4, text)
    ratios = []
    for i in range(4):
        scores = torch.cat(
            [
                (_weight(dense, i, s).abs() * inputs[i, s].pow(2).sum(0).sqrt()).flatten()
                for s in LINEARS
            ]
        )
        ratios.append(float((scores > 5 * scores.mean()).double().mean()))
        numel = scores.numel()
    lo, hi = min(ratios), max(ratios)
    scaled = [(r - lo) / (hi - lo) * 0.16 for r in ratios]
    expect = [0.7 - (s - sum(scaled) / 4) for s in scaled]
    plan = result.allocation
    assert [b["block"] for b in plan] == [0, 1, 2, 3]
    for b, r, s in zip(plan, ratios, expect):
        assert b["outlier_ratio"] == pytest.approx(r, abs=2 / numel)
        assert b["sparsity"] == pytest.approx(s, abs=2e-3)
    assert max(b["outlier_ratio"] for b in plan) == plan[2]["outlier_ratio"]  # the scaled block
    spread = [b["sparsity"] for b in plan]
    assert min(spread) == plan[2]["sparsity"]  # the most outliers, the least pruned
    assert max(spread) - min(spread) == pytest.approx(0.16, abs=2e-3)  # 2 x lambda apart
    # exact counts: the output holds each tensor's planned count; the total is the uniform one
    after = tensors(out)
    uniform = uniform_keep({t.name: t.numel for t in result.tensors}, 0.7)
    assert sum(int((after[t.name] != 0).sum()) for t in result.tensors) == sum(uniform.values())
    for t in result.tensors:
        assert int((after[t.name] != 0).sum()) == t.nonzero
    for b in plan:
        kept = sum(
            t.nonzero for t in result.tensors if t.name.startswith(f"model.layers.{b['block']}.")
        )
        assert kept == b["kept"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        record = json.loads(f.metadata()["sparsetool"])
    assert record["allocation"]["method"] == "owl" and record["allocation"]["blocks"] == plan
    assert record["allocation"]["m"] == 5.0 and record["allocation"]["lambda"] == 0.08


def test_owl_counts_are_exact_at_the_extremes():
    blocks = [{f"b{b}.t{t}": 997 + 13 * t for t in range(3)} for b in range(5)]
    sizes = [sum(b.values()) for b in blocks]
    for sparsity in (0.0, 0.03, 0.5, 0.97, 1.0):
        s = owl_sparsities([0.001, 0.04, 0.02, 0.0, 0.011], sizes, sparsity, 0.08)
        keep = owl_keep(blocks, s, sparsity)
        numel = {n: v for b in blocks for n, v in b.items()}
        assert sum(keep.values()) == sum(uniform_keep(numel, sparsity).values())
        assert all(0 <= keep[n] <= numel[n] for n in numel)
    same = owl_sparsities([0.01] * 5, sizes, 0.6, 0.08)
    assert same == [0.6] * 5


def _row_errors(w: torch.Tensor, kept: torch.Tensor, x: torch.Tensor, windows: int) -> torch.Tensor:
    """Each row's error of its output summed over a window, averaged over the windows, as the
    pruned weights leave it: computed from the inputs themselves."""
    return ((w * ~kept) @ x.T).sum(1) / windows


def _squared_errors(w: torch.Tensor, kept: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Each row's squared output error summed over the tokens."""
    return (((w * ~kept) @ x.T) ** 2).sum(1)


def test_dsnot_keeps_row_counts_never_revives_and_never_raises_a_rows_error():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 96, generator=g, dtype=torch.float64)
    x = torch.randn(400, 96, generator=g, dtype=torch.float64) + 2 * torch.randn(
        96, generator=g, dtype=torch.float64
    )
    alive = torch.rand(48, 96, generator=g) < 0.9
    sq = x.pow(2).sum(0)
    kept = wanda_mask(w, sq, keep=48 * 30, existing=alive)
    mean, var = x.mean(0), x.var(0, unbiased=False)
    refine = dict(mean=mean, var=var, sq_norms=sq, window=50)  # 400 tokens: 8 windows of 50
    new, swaps = dsnot_refine(w, kept, alive=alive, **refine)
    assert swaps > 0 and not torch.equal(new, kept)
    assert torch.equal(new.sum(1), kept.sum(1))  # every row keeps as many as before
    assert not (new & ~alive).any()  # nothing dead comes back
    before, after = _row_errors(w, kept, x, 8).abs(), _row_errors(w, new, x, 8).abs()
    assert (after <= before + 1e-9).all()
    assert after.sum() < 0.5 * before.sum()
    sq_before, sq_after = _squared_errors(w, kept, x), _squared_errors(w, new, x)
    assert sq_after.sum() < sq_before.sum()  # independent inputs here: the spread is honest
    again, swaps_again = dsnot_refine(w, kept, alive=alive, **refine)
    assert torch.equal(again, new) and swaps_again == swaps  # deterministic
    unchanged, none = dsnot_refine(w, kept, iterations=0, **refine)
    assert torch.equal(unchanged, kept) and none == 0
    loose, _ = dsnot_refine(w, kept, alive=alive, threshold=float(before.max()) + 1, **refine)
    assert torch.equal(loose, kept)  # every row already within the threshold


def test_dsnot_in_the_block_pass_lowers_block0_errors_on_the_calibration_inputs(
    llama4, text, calib_file, tmp_path
):
    """Block 0's inputs do not depend on pruning, so transformers' dense forward gives them."""
    opts = dict(sparsity=0.7, method="wanda", calibration=str(calib_file), seed=SEED, **CALIB)
    plain = prune_checkpoint(llama4, tmp_path / "w", PruneOptions(**opts))
    refined = prune_checkpoint(llama4, tmp_path / "d", PruneOptions(**opts, refine="dsnot"))
    assert refined.refined["swaps"] > 0 and plain.refined is None
    assert [(t.name, t.nonzero) for t in plain.tensors] == [
        (t.name, t.nonzero) for t in refined.tensors
    ]
    dense, inputs = tensors(llama4), _linear_inputs(llama4, text)
    a, b = tensors(tmp_path / "w"), tensors(tmp_path / "d")
    changed = 0
    for short in LINEARS:
        name = next(n for n in a if n.startswith("model.layers.0.") and f".{short}." in n)
        w, x = _weight(dense, 0, short), inputs[0, short]
        before = _row_errors(w, a[name] != 0, x, CALIB["samples"]).abs()
        after = _row_errors(w, b[name] != 0, x, CALIB["samples"]).abs()
        assert (after <= before + 1e-6 * (1 + before)).all(), name
        assert torch.equal((a[name] != 0).sum(1), (b[name] != 0).sum(1)), name
        changed += int((after < before - 1e-9).sum())
    assert changed > 0


@pytest.mark.parametrize("method", ["magnitude", "sparsegpt"])
def test_dsnot_and_owl_after_every_method_keep_exact_counts_and_load(
    llama4, calib_file, method, tmp_path
):
    opts = dict(sparsity=0.6, method=method, calibration=str(calib_file), allocation="owl", **CALIB)
    one = prune_checkpoint(llama4, tmp_path / "a", PruneOptions(**opts, refine="dsnot"))
    prune_checkpoint(llama4, tmp_path / "b", PruneOptions(**opts, refine="dsnot"))
    owl_only = prune_checkpoint(llama4, tmp_path / "c", PruneOptions(**opts))
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (
        tmp_path / "b" / "model.safetensors"
    ).read_bytes()
    assert [t.nonzero for t in one.tensors] == [t.nonzero for t in owl_only.tensors]
    assert one.allocation == owl_only.allocation and one.refined["swaps"] > 0
    after = tensors(tmp_path / "a")
    assert all(int((after[t.name] != 0).sum()) == t.nonzero for t in one.tensors)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "a").state_dict()
    assert all(torch.equal(loaded[t.name] == 0, after[t.name] == 0) for t in one.tensors)


def test_cli_prints_and_records_the_plan_and_report_shows_it(llama4, calib_file, tmp_path):
    out = tmp_path / "o"
    r = run(
        "prune",
        llama4,
        "-o",
        out,
        "--sparsity",
        "0.7",
        "--method",
        "wanda",
        "--calibration",
        calib_file,
        "--samples",
        "6",
        "--seq",
        "32",
        "--allocation",
        "owl",
        "--refine",
        "dsnot",
        "--json",
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert [b["block"] for b in data["options"]["allocation"]["blocks"]] == [0, 1, 2, 3]
    assert data["refined"]["method"] == "dsnot" and data["refined"]["swaps"] > 0
    r = run(
        "prune",
        llama4,
        "-o",
        tmp_path / "p",
        "--sparsity",
        "0.7",
        "--method",
        "wanda",
        "--calibration",
        calib_file,
        "--samples",
        "6",
        "--seq",
        "32",
        "--allocation",
        "owl",
        columns=120,
    )
    assert r.exit_code == 0, r.output
    block2 = data["options"]["allocation"]["blocks"][2]
    assert "OWL allocation" in r.stdout
    assert (
        f"{100 * block2['sparsity']:.2f}%  {block2['kept']:,} of {block2['targeted']:,}" in r.stdout
    )
    r = run("report", out, "--targeted", columns=200)
    assert r.exit_code == 0, r.output
    assert "allocation: OWL (M 5, lambda 0.08): block sparsities" in r.stdout
    assert "refinement: DSnoT" in r.stdout
    summary = json.loads(run("report", out, "--json").stdout)["summary"]
    assert summary["allocation"]["blocks"] == data["options"]["allocation"]["blocks"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sparsity", "0.7", "--refine", "dsnot"], "--refine dsnot needs calibration text"),
        (
            ["--nm", "2:4", "--method", "wanda", "--allocation", "owl", "--calibration", "C"],
            "--allocation owl takes --sparsity",
        ),
        (["--sparsity", "0.5", "--owl-m", "3"], "--owl-m is read by --allocation owl only"),
        (
            ["--sparsity", "0.5", "--dsnot-iterations", "3"],
            "--dsnot-iterations is read by --refine dsnot only",
        ),
        (
            [
                "--sparsity",
                "0.5",
                "--method",
                "random",
                "--allocation",
                "owl",
                "--calibration",
                "C",
            ],
            "not --method random",
        ),
        (
            [
                "--sparsity",
                "0.5",
                "--allocation",
                "owl",
                "--distribution",
                "erk",
                "--calibration",
                "C",
            ],
            "neither --distribution erk",
        ),
        (
            ["--sparsity", "0.5", "--allocation", "owl", "--owl-lambda", "0.7"],
            "--owl-lambda 0.7: must be",
        ),
        (["--sparsity", "0.5", "--method", "magnitude", "--calibration", "C"], "magnitude alone"),
    ],
)
def test_usage_errors_exit_2_before_anything_runs(llama4, calib_file, tmp_path, args, message):
    args = [calib_file if a == "C" else a for a in args]
    r = run("prune", llama4, "-o", tmp_path / "x", *args, columns=300)
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "x").exists()
