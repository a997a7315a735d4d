"""sparsetool bench: every kernel computes what dense does, the timing and the summaries are put
together right, the matrices come from the checkpoint as it stores them, and the command's
options and output. Timing is tested for structure, never for speed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from sparsetool.bench import kernels, matrices
from sparsetool.bench.run import crossing, kernel_names, model_summary, run_bench
from sparsetool.bench.timing import measure, summarise
from sparsetool.errors import ConfigError

from helpers import ROOT, run


def masked(shape, sparsity, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    return w * (torch.rand(shape, generator=g) >= sparsity)


def product(k, x):
    return k.result(k.run(k.take(x)))


# --- every kernel equals the dense product -----------------------------------------------------


@pytest.mark.parametrize("name", [*kernels.CPU_DENSE, *kernels.CPU_SPARSE])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("batch", [1, 7])
def test_each_cpu_kernel_equals_the_float32_product(name, dtype, batch):
    w = masked((37, 24), 0.7)  # odd row count: the row bands are uneven
    x = torch.randn(batch, 24, generator=torch.Generator().manual_seed(1))
    k = kernels.cpu_kernel(name, w, dtype, threads=3)
    y = product(k, x)
    ref = torch.nn.functional.linear(x.to(dtype).float(), w.to(dtype).float())
    assert y.shape == (batch, 37) and y.dtype == torch.float32
    # bfloat16 products are rounded to bfloat16 by the dense kernel only
    tol = 2e-2 if (dtype == torch.bfloat16 and name == "torch-linear") else 1e-5
    torch.testing.assert_close(y, ref, rtol=tol, atol=tol * float(ref.abs().max()))
    if name in kernels.CPU_SPARSE:  # the sparse kernels hold exactly the dtype's values
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


def test_an_empty_matrix_and_an_empty_row_band_still_multiply():
    w = torch.zeros(9, 8)
    w[0, 3] = 2.0  # every non-zero in the first row: later bands are empty rows
    k = kernels.cpu_kernel("scipy-csr-rows", w, torch.float32, threads=4)
    y = product(k, torch.ones(2, 8))
    assert y[:, 0].tolist() == [2.0, 2.0] and not y[:, 1:].any()


@pytest.mark.parametrize("name", kernels.CUDA_DENSE + kernels.CUDA_SPARSE)
def test_each_cuda_kernel_equals_the_float32_product(name):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine: the CUDA kernels cannot run")
    dev = torch.device("cuda")
    w = masked((128, 128), 0.5)
    if name == "semi-structured-2:4":  # keep the two largest of every four along K
        groups = w.abs().reshape(128, 32, 4)
        top = groups.topk(2, dim=2).indices
        keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(2, top, True)
        w = torch.randn(128, 128) * keep.reshape(128, 128)
    k = kernels.cuda_kernel(name, w, torch.bfloat16, dev, matrices.two_four(w))
    x = torch.randn(64, 128)
    ref = torch.nn.functional.linear(x.bfloat16().float(), w.bfloat16().float())
    torch.testing.assert_close(product(k, x), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


def test_row_bands_cover_every_row_once_with_about_equal_nonzeros():
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 50, size=101)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    for parts in (1, 2, 3, 7):
        bands = kernels.row_bands(indptr, parts)
        assert bands[0][0] == 0 and bands[-1][1] == 101
        assert all(a[1] == b[0] for a, b in zip(bands, bands[1:]))
        load = [int(indptr[b] - indptr[a]) for a, b in bands]
        assert len(bands) <= parts and max(load) <= indptr[-1] / parts + counts.max()


def test_two_four_reads_the_pattern_along_the_input_dimension():
    w = torch.tensor([[1.0, 0.0, 0.0, 3.0, 0.0, 2.0, 1.0, 0.0]])
    assert matrices.two_four(w)
    # the same rows read along the other axis: each column [1, 0], [0, 2], ... groups of 4 rows
    assert matrices.two_four(w.reshape(2, 4)) and not matrices.two_four(torch.ones(4, 4).tril())
    assert not matrices.two_four(torch.ones(1, 8))


# --- timing: structure, not speed --------------------------------------------------------------


def test_measure_warms_up_then_times_at_least_repeats_calls_and_reports_the_median():
    ticks = iter(range(0, 10_000, 1))  # a clock that advances one second per reading
    calls, syncs = [], []
    timing, out = measure(
        lambda: calls.append(1) or len(calls),
        repeats=4,
        min_time=0.0,
        sync=lambda: syncs.append(1),
        clock=lambda: next(ticks),
    )
    assert out == 1  # the warm-up call's result
    assert timing.repeats == 4 and len(calls) == 5
    assert timing.median_s == timing.low_s == timing.high_s == 1.0
    assert len(syncs) == 2 + 4  # around the warm-up, then after each timed call


def test_measure_repeats_short_calls_until_min_time_but_at_most_ten_times_repeats():
    t = [0.0]

    def clock():
        t[0] += 0.001
        return t[0]

    timing, _ = measure(lambda: None, repeats=3, min_time=10.0, clock=clock)
    assert timing.repeats == 30
    timing, _ = measure(lambda: None, repeats=3, min_time=0.005, clock=clock)
    assert timing.repeats == 5  # 5 calls of 1 ms reach 5 ms
    with pytest.raises(ValueError):
        measure(lambda: None, repeats=0)


def test_summarise_gives_median_and_quartiles():
    t = summarise([5.0, 1.0, 3.0])
    assert (t.median_s, t.low_s, t.high_s, t.repeats) == (3.0, 2.0, 4.0, 3)


# --- what the times mean -----------------------------------------------------------------------


def test_crossing_interpolates_log_speedup_between_the_points_around_one():
    status, s = crossing([(0.9, 4.0), (0.5, 0.25), (0.7, 0.5)])  # unsorted on purpose
    assert status == "crossed" and s == pytest.approx(0.7 + 0.2 * np.log(2) / np.log(8))
    assert crossing([(0.5, 1.0)]) == ("always", None)
    assert crossing([(0.5, 0.9), (0.9, 0.99)]) == ("never", None)


def _layer(name, shape, count, nnz, dense, sparse, target=None):
    runs = [
        {
            "batch": b,
            "dense": {"median_s": d, "ok": True},
            "sparse": {"k": {"median_s": s, "ok": True}},
            "best": "k",
        }
        for b, d, s in zip((1, 8), dense, sparse)
    ]
    return {
        "name": name,
        "shape": shape,
        "count": count,
        "nnz": nnz,
        "runs": runs,
        "target_sparsity": target,
    }


def test_model_summary_weighs_each_shape_by_its_count_per_token():
    lys = [
        _layer("a", [4, 4], 3, 8, dense=(1.0, 8.0), sparse=(0.5, 16.0)),
        _layer("b", [2, 4], 1, 2, dense=(2.0, 4.0), sparse=(4.0, 2.0)),
    ]
    (m,) = model_summary(lys, [1, 8])
    assert m["matrices"] == 4 and m["sparsity"] == pytest.approx(1 - (3 * 8 + 2) / (3 * 16 + 8))
    b1, b8 = m["batches"]
    assert b1["dense_s"] == 5.0 and b1["sparse_s"] == 5.5
    assert b1["speedup"] == pytest.approx(5 / 5.5)
    assert b1["mixed_s"] == 3 * 0.5 + 2.0
    assert b8["dense_s"] == (24 + 4) / 8 and b8["sparse_s"] == (48 + 2) / 8
    assert b8["mixed_s"] == (24 + 2) / 8


def test_a_wrong_sparse_product_is_never_the_faster_of_the_two():
    ly = _layer("a", [4, 4], 1, 8, dense=(1.0, 8.0), sparse=(0.5, 4.0))
    ly["runs"][0]["sparse"]["k"]["ok"] = False
    (m,) = model_summary([ly], [1, 8])
    assert m["batches"][0]["mixed_s"] == 1.0 and m["batches"][1]["mixed_s"] == 4.0 / 8


def _result(speedups, source="shape"):
    """A bench result whose one model group has these speed-ups per batch."""
    batches = list(speedups)
    return {
        "device": {"type": "cpu"},
        "source": source,
        "batches": batches,
        "model": [
            {"sparsity": 0.9, "batches": [{"batch": b, "speedup": v} for b, v in speedups.items()]}
        ],
    }


@pytest.mark.parametrize(
    "speedups, says",
    [
        (
            {1: 2.0, 8: 1.5, 64: 0.5},
            "at batch 1 and 8; not at batch 64 (2.00x at batch 1, 1.50x at "
            "batch 8, 0.50x at batch 64): sparse kernels for few tokens",
        ),
        (
            {1: 0.5, 8: 1.5, 64: 3.0},
            "at batch 8 and 64; not at batch 1 (0.50x at batch 1, 1.50x at "
            "batch 8, 3.00x at batch 64): sparse kernels for many tokens",
        ),
        ({1: 2.0, 8: 0.5, 64: 2.0}, "choose the kernel per batch"),
        ({1: 1.02, 8: 3.0}, "at batch 8; about even at batch 1"),
        ({1: 0.5, 8: 0.98}, "does not pay on this CPU"),
        ({1: 1.5, 8: 2.0}, "pays on this CPU at every batch timed"),
    ],
)
def test_the_verdict_names_the_batches_where_sparsity_pays(speedups, says):
    from sparsetool.bench.run import verdict

    assert says in verdict(_result(speedups))


def test_over_a_sweep_the_verdict_gives_the_whole_models_break_even_per_batch():
    from sparsetool.bench.run import verdict

    res = _result({1: 0.5, 8: 2.0}, source="model")
    res["model"].append(
        {"sparsity": 0.5, "batches": [{"batch": 1, "speedup": 0.25}, {"batch": 8, "speedup": 1.5}]}
    )
    res["model"][0]["batches"][0]["speedup"] = 4.0  # at 0.9: 4x at batch 1
    line = verdict(res)
    assert "from 70% sparsity at batch 1" in line and "at every sparsity timed at batch 8" in line


def test_kernel_names_follow_the_device_and_dtype():
    assert kernel_names("cpu", "float32") == (["torch-linear"], list(kernels.CPU_SPARSE))
    dense, sparse = kernel_names("cpu", "bfloat16", ["torch-csr"])
    assert dense == ["torch-linear", "torch-linear-float32"] and sparse == ["torch-csr"]
    assert kernel_names("cuda", "bfloat16")[1] == list(kernels.CUDA_SPARSE)
    with pytest.raises(ConfigError, match="cusparse-csr"):
        kernel_names("cpu", "float32", ["cusparse-csr"])


def test_a_sweep_times_every_point_checks_it_and_finds_break_even():
    mats = matrices.from_shape((48, 64), [0.5, 0.95], "random", seed=3)
    res = run_bench(
        mats, source="shape", label="48x64", batches=[1, 4], repeats=2, min_time=0.0, threads=2
    )
    assert res["bench"] == 1 and res["kernels"] == list(kernels.CPU_SPARSE)
    assert [ly["sparsity"] for ly in res["layers"]] == pytest.approx([0.5, 0.95], abs=1e-3)
    assert res["failed"] == []
    for ly in res["layers"]:
        assert [r["batch"] for r in ly["runs"]] == [1, 4]
        for r in ly["runs"]:
            assert r["dense"]["ok"] and r["dense"]["kernel"] == "torch-linear"
            for e in r["sparse"].values():
                assert e["ok"] and e["repeats"] >= 2 and e["low_s"] <= e["median_s"] <= e["high_s"]
                assert e["speedup"] == pytest.approx(r["dense"]["median_s"] / e["median_s"])
            assert r["best"] == max(r["sparse"], key=lambda n: r["sparse"][n]["speedup"])
    be = res["break_even"]
    assert {(r["batch"], r["kernel"]) for r in be} == {
        (b, k) for b in (1, 4) for k in [*kernels.CPU_SPARSE, "best"]
    }
    for r in be:
        assert r["status"] in ("crossed", "always", "never")
        assert (r["sparsity"] is not None) == (r["status"] == "crossed")
    assert [m["target_sparsity"] for m in res["model"]] == [0.5, 0.95]
    assert res["verdict"].startswith("on this CPU")


def test_a_preset_counts_its_matrices_per_shape():
    from sparsetool.flops.presets import get_preset

    cfg = get_preset("gpt2-small")
    mats = matrices.from_model(cfg, [0.5])
    counts = {m.shape: m.count for m in mats}
    assert counts == {(2304, 768): 12, (768, 768): 12, (3072, 768): 12, (768, 3072): 12}
    w = mats[1].load()
    assert w.shape == mats[1].shape
    assert float((w == 0).float().mean()) == pytest.approx(0.5, abs=1e-6)


def _pruned(tmp_path, sparsity="0.8"):
    out = tmp_path / "p"
    r = run("prune", ROOT / "fixtures" / "tiny-gpt2", "-o", out, "--sparsity", sparsity, "-q")
    assert r.exit_code == 0, r.output
    return out


def test_a_checkpoint_gives_one_matrix_per_shape_as_y_equals_x_w_transposed(tmp_path):
    out = _pruned(tmp_path)
    mats, targeting = matrices.from_checkpoint(out)
    stored = load_file(out / "model.safetensors")
    assert sum(m.count for m in mats) == 8 and targeting
    for m in mats:
        w = m.load()
        assert tuple(w.shape) == m.shape and m.target is None
        # GPT-2's Conv1D stores (in, out): the matrix timed is its transpose
        assert torch.equal(w, stored[m.name].float().T)
        assert float((w == 0).float().mean()) == pytest.approx(m.sparsity)


def test_a_fused_mixture_of_experts_times_one_expert_per_shape(tmp_path):
    from moe_models import save_moe

    src = save_moe("qwen3_moe", tmp_path / "moe", fused=True)
    out = tmp_path / "pruned"
    assert run("prune", src, "-o", out, "--sparsity", "0.5", "-q").exit_code == 0
    mats, _ = matrices.from_checkpoint(out)
    experts = [m for m in mats if m.name.endswith("]")]
    assert experts
    stored = load_file(out / "model.safetensors")
    for m in experts:
        base, e = m.name[:-1].split("[")
        w = m.load()
        assert tuple(w.shape) == m.shape
        t = stored[base][int(e)].float()
        assert torch.equal(w, t) or torch.equal(w, t.T)


# --- the command -------------------------------------------------------------------------------


def test_bench_a_checkpoint_json_model_summary_and_plot(tmp_path):
    out = _pruned(tmp_path, "0.9")
    png = tmp_path / "b.png"
    r = run(
        "bench", out, "--batch", "1,16", "--repeats", "2", "--threads", "2", "--json", "--plot", png
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["source"] == "checkpoint" and d["batches"] == [1, 16]
    assert d["device"]["type"] == "cpu" and d["device"]["threads"] == 2
    (m,) = d["model"]
    assert m["matrices"] == 8 and m["sparsity"] == pytest.approx(0.9, abs=1e-3)
    assert [b["batch"] for b in m["batches"]] == [1, 16]
    assert d["break_even"] == [] and d["failed"] == [] and d["plot"] == str(png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_prints_a_table_per_matrix_and_a_verdict(tmp_path):
    r = run(
        "bench",
        "--shape",
        "32x64",
        "--sparsity",
        "0.9",
        "--batch",
        "1,2",
        "-r",
        "1",
        "--kernel",
        "scipy-csr",
        columns=160,
    )
    assert r.exit_code == 0, r.output
    assert "32x64" in r.stdout and "scipy-csr" in r.stdout and "torch-csr" not in r.stdout
    assert "verdict:" in r.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "give a CHECKPOINT"),
        (["--shape", "8x8", "--model", "gpt2-small", "-s", "0.5"], "give one"),
        (["--shape", "8x8"], "needs --sparsity"),
        (["{ckpt}", "--sparsity", "0.5"], "its own masks"),
        (["--model", "gpt2-small", "-s", "0.5", "--pattern", "2:4"], "--shape only"),
        (["--shape", "8x8", "-s", "0.5", "--include", "*"], "a checkpoint's tensors"),
        (["--shape", "8x8", "-s", "0.5", "--kernel", "fast"], "choose from"),
        (["--shape", "8x8", "-s", "0.5", "--kernel", "cusparse-csr", "--device", "cpu"], "on cpu"),
        (["--shape", "8x8", "-s", "0.5", "--batch", "1,0"], "at least 1"),
        (["--shape", "8x8", "-s", "0.5", "--batch", "4,4"], "twice"),
    ],
)
def test_bench_usage_errors_exit_2_with_one_line(args, says, tmp_path):
    args = [str(tmp_path) if a == "{ckpt}" else a for a in args]
    r = run("bench", *args, columns=200)
    assert r.exit_code == 2, r.output
    assert says in r.output


def test_bench_cuda_without_cuda_is_a_usage_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = run("bench", "--shape", "8x8", "-s", "0.5", "--device", "cuda", columns=200)
    assert r.exit_code == 2 and "no CUDA device" in r.output


def test_bench_a_missing_checkpoint_is_one_error_line(tmp_path):
    r = run("bench", tmp_path / "nope", columns=200)
    assert r.exit_code == 1 and r.output.count("error:") == 1 and "not found" in r.output


def test_a_product_that_fails_its_check_is_one_error_line_after_the_output(monkeypatch):
    from sparsetool.bench import run as bench_run

    monkeypatch.setitem(bench_run.RTOL, "float32", -1.0)  # no product can pass: every check fails
    r = run(
        "bench", "--shape", "16x32", "-s", "0.9", "--batch", "1", "-r", "1", "--json", columns=200
    )
    assert r.exit_code == 1
    d = json.loads(r.stdout)
    assert len(d["failed"]) == 1 + len(d["kernels"]) and d["layers"][0]["runs"][0]["best"] is None
    assert r.stderr.count("error:") == 1 and "does not equal the float32 product" in r.stderr
    assert d["failed"][0]["kernel"] == "torch-linear" and "nothing to conclude" in d["verdict"]
