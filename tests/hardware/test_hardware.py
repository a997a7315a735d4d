"""The hardware cost model: every "Must hold" rule of the design, the fitted constants, the
masks."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sparsetool.errors import ConfigError
from sparsetool.hardware import (
    APPENDIX_C_TICKS,
    builtin_devices,
    fits,
    from_model,
    from_shape,
    simulate,
    stats_from_mask,
    synthetic_mask,
)
from sparsetool.hardware.devices import Dataflow, DenseGPU, Sparse24GPU
from sparsetool.hardware.layers import LayerMask, nm_violation, sampled_random, tile_counts
from sparsetool.hardware.presets import PRESETS, dataflow_grids, sources
from sparsetool.hardware.workload import Workload

DEVICES = builtin_devices()
GRIDS = dataflow_grids(list(DEVICES.values()))
GRID = GRIDS[0]


def speedups(res, key="forward"):
    return {d["name"]: (d[key]["speedup"] if d["applicable"] else None) for d in res["devices"]}


# --- Must hold: speedup at sparsity 0 is exactly 1 ---------------------------------------------


@pytest.mark.parametrize("shape,tokens", [((64, 48), 16), ((768, 3072), 2048), ((1000, 999), 7)])
def test_speedup_at_sparsity_zero_is_exactly_one(shape, tokens):
    wl, _ = from_shape(shape, 0.0, tokens, GRIDS)
    res = simulate(wl, DEVICES)
    for d in res["devices"]:
        assert d["applicable"], d
        assert d["forward"]["speedup"] == 1.0
        assert d["train_step"]["speedup"] == 1.0
    assert res["workload"]["theoretical"] == 1.0


def test_whole_model_at_sparsity_zero_is_exactly_one():
    from sparsetool.flops import get_preset

    res = simulate(from_model(get_preset("gpt2-small"), 0.0, 4096, GRIDS), DEVICES)
    assert all(v == 1.0 for v in speedups(res, "train_step").values())


# --- Must hold: never above the theoretical 1 / (1 - s) -----------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 96),
    k=st.integers(1, 96),
    s=st.floats(0.0, 0.99),
    tokens=st.sampled_from([1, 3, 64, 2048, 1e6]),
    pattern=st.sampled_from(["random", "rows", "cols"]),
    seed=st.integers(0, 2**16),
)
def test_never_above_theoretical(m, k, s, tokens, pattern, seed):
    wl, _ = from_shape((m, k), s, tokens, GRIDS, pattern, seed)
    res = simulate(wl, DEVICES)
    theo = res["workload"]["theoretical"]
    if wl.sparsity == 1.0:  # nothing left: no finite theoretical speedup
        assert theo is None
        return
    assert theo == pytest.approx(1 / (1 - wl.sparsity))
    for d in res["devices"]:
        if d["applicable"]:
            assert d["forward"]["speedup"] <= theo * (1 + 1e-12), d["name"]
            assert d["train_step"]["speedup"] <= theo * (1 + 1e-12), d["name"]


@pytest.mark.parametrize("s", [0.5, 0.9, 0.99])
def test_whole_model_never_above_its_flop_ratio(s):
    from sparsetool.flops import get_preset

    res = simulate(from_model(get_preset("gpt3-xl"), s, 2048, GRIDS), DEVICES)
    theo = res["workload"]["theoretical"]
    assert theo < 1 / (1 - s)  # attention and logits stay dense
    for d in res["devices"]:
        if d["applicable"]:
            assert d["train_step"]["speedup"] <= theo * (1 + 1e-12)


# --- Must hold: dense GPU is exactly 1.0 for any unstructured mask ------------------------------


@pytest.mark.parametrize("pattern", ["random", "rows", "cols"])
@pytest.mark.parametrize("s", [0.1, 0.5, 0.9, 0.999])
def test_dense_gpu_speedup_is_one_for_unstructured_masks(pattern, s):
    wl, _ = from_shape((256, 512), s, 512, GRIDS, pattern)
    sp = speedups(simulate(wl, DEVICES))
    assert sp["a100"] == 1.0 and sp["h100"] == 1.0


# --- Must hold: 2:4 never above 2; refused (never silently counted) on other masks --------------


@pytest.mark.parametrize("tokens", [1, 16, 2048, 65536])
def test_24_on_a_24_mask_is_between_one_and_two(tokens):
    wl, mask = from_shape((512, 1024), 0.5, tokens, GRIDS, "2:4")
    assert nm_violation(mask, axis=1) == 0.0
    res = simulate(wl, DEVICES)
    for name in ("a100-2:4", "h100-2:4"):
        d = next(x for x in res["devices"] if x["name"] == name)
        assert d["applicable"]
        assert 1.0 < d["forward"]["speedup"] <= 2.0
        assert d["train_step"]["speedup"] <= 2.0


def test_24_even_at_the_hardware_limit_never_exceeds_two():
    gpu = replace(DEVICES["a100-2:4"], math_speedup=2.0, launch_s=0.0)
    wl, _ = from_shape((4096, 4096), 0.5, 1e6, GRIDS, "2:4")
    sp = simulate(wl, [gpu])["devices"][0]["forward"]["speedup"]
    assert 1.9 < sp <= 2.0


def test_24_math_speedup_above_two_is_a_config_error(tmp_path):
    from sparsetool.hardware.presets import load_devices

    f = tmp_path / "hw.json"
    f.write_text('{"a100-2:4": {"math_speedup": 2.5}}')
    with pytest.raises(ConfigError, match="math_speedup"):
        load_devices(f)


def test_24_on_a_random_mask_is_refused_with_the_violation_fraction():
    wl, mask = from_shape((256, 256), 0.5, 64, GRIDS, "random")
    res = simulate(wl, DEVICES)
    d = next(x for x in res["devices"] if x["name"] == "a100-2:4")
    assert d["applicable"] is False and d["forward"] is None
    v = nm_violation(mask, axis=1)
    assert v > 0
    assert f"{v:.1%}" in d["reason"]
    assert res["layers"][0]["speedup"]["a100-2:4"] is None


def test_24_backward_data_runs_dense_and_says_so():
    # 2:4 along K (rows of 4 inputs) is not 2:4 along M for a random choice of patterns
    wl, mask = from_shape((64, 64), 0.5, 64, GRIDS, "2:4")
    assert nm_violation(mask, axis=0) > 0
    d = next(x for x in simulate(wl, DEVICES)["devices"] if x["name"] == "a100-2:4")
    assert any("backward-data runs dense" in n for n in d["notes"])
    assert any("backward-weight runs dense" in n for n in d["notes"])


def test_24_on_a_mask_whose_inputs_are_not_a_multiple_of_four():
    wl, _ = from_shape((8, 6), 0.5, 4, GRIDS)
    d = next(x for x in simulate(wl, DEVICES)["devices"] if x["name"] == "h100-2:4")
    assert not d["applicable"] and "multiple of 4" in d["reason"]


# --- Must hold: the dataflow curve of the GPT-3 12k x 12k matmul (SPDF Appendix C) --------------


def _appendix_c(df: Dataflow, s: float):
    layer = fits.appendix_c_layer(s, df.grid)
    wl = Workload("12k", "shape", fits.APPENDIX_C_TOKENS, [layer])
    return simulate(wl, [df])["devices"][0]["forward"]


def test_dataflow_follows_the_theoretical_line_through_ninety_percent():
    # SPDF paper (Thangarasa et al. 2023) Appendix C, Figure 1: measured close to theoretical at
    # these ticks (theoretical 1x ... 10x).
    df = DEVICES["cs2"]
    last = 0.0
    for s in APPENDIX_C_TICKS:
        r = _appendix_c(df, s)
        theo = 1 / (1 - s)
        assert r["speedup"] > last  # rises at every tick
        last = r["speedup"]
        eff = r["speedup"] / theo
        assert eff >= (0.9 if s <= 0.8 else 0.84), (s, r["speedup"])
        assert eff <= 1.0


def test_dataflow_gap_is_the_fixed_and_imbalance_terms():
    df = DEVICES["cs2"]
    r = _appendix_c(df, 0.9)
    assert r["speedup"] == pytest.approx(8.5, rel=0.01)
    balanced = r["speedup_if_balanced"]
    assert r["speedup"] < balanced < 10
    # with the fitted overhead removed as well, only the partial-sum reduction is left in the gap:
    # balanced speedup = (dense compute + reduction) / (sparse compute + reduction), dense = 10 x
    # sparse
    free = _appendix_c(replace(df, fixed_s=0.0), 0.9)
    c, red = free["breakdown"]["compute"], free["breakdown"]["fixed"]
    assert red < 0.02 * c
    assert free["speedup_if_balanced"] == pytest.approx((10 * c + red) / (c + red), rel=1e-6)


@pytest.mark.slow
def test_appendix_c_with_a_real_144m_entry_mask_matches_the_sampled_counts():
    df = DEVICES["cs2"]
    wl, _ = from_shape(fits.APPENDIX_C_SHAPE, 0.9, fits.APPENDIX_C_TOKENS, [df.grid])
    real = simulate(wl, [df])["devices"][0]
    assert real["forward"]["speedup"] == pytest.approx(_appendix_c(df, 0.9)["speedup"], rel=0.01)
    assert 1.0 < real["busiest_over_mean"] < 1.05  # random mask, 147k-entry tiles: little imbalance


# --- Must hold: imbalance from the real mask ----------------------------------------------------


@pytest.mark.parametrize("pattern", ["rows", "cols"])
def test_concentrated_pruning_shows_imbalance_and_lower_speedup_than_random(pattern):
    shape, s = (2048, 2048), 0.75
    rnd, _ = from_shape(shape, s, 2048, GRIDS, "random")
    conc, _ = from_shape(shape, s, 2048, GRIDS, pattern)
    assert rnd.sparsity == conc.sparsity
    r_rnd, r_conc = simulate(rnd, DEVICES), simulate(conc, DEVICES)
    imb_rnd = r_rnd["layers"][0]["busiest_over_mean"]
    imb_conc = r_conc["layers"][0]["busiest_over_mean"]
    assert imb_rnd < 1.15  # 64 x 64 tiles at density 0.25: a few standard deviations
    assert imb_conc > 3.0  # some groups keep every weight: density 1 against 0.25
    # the busiest groups keep every weight, so the layer is no faster than dense
    assert speedups(r_conc)["cs2"] == pytest.approx(1.0, abs=0.01)
    assert speedups(r_conc)["cs2"] < 0.6 * speedups(r_rnd)["cs2"]
    df = next(d for d in r_conc["devices"] if d["name"] == "cs2")
    assert df["train_step"]["breakdown"]["imbalance"] > df["train_step"]["breakdown"]["compute"]


def test_random_mask_imbalance_grows_as_tiles_shrink():
    mask = synthetic_mask((1024, 1024), 0.9, seed=3)
    coarse = stats_from_mask("x", "other", mask, [(4, 4)]).busiest_over_mean((4, 4))
    fine = stats_from_mask("x", "other", mask, [(128, 128)]).busiest_over_mean((128, 128))
    assert 1.0 <= coarse < 1.05 < fine


def test_imbalance_equals_busiest_tile_over_mean_by_hand():
    mask = np.zeros((4, 4), dtype=bool)
    mask[:2, :2] = True  # all four non-zeros in one tile of a 2x2 grid
    ly = stats_from_mask("x", "other", mask, [(2, 2)])
    assert ly.tiles[(2, 2)].tolist() == [[4, 0], [0, 0]]
    assert ly.busiest_over_mean((2, 2)) == 4.0


# --- Published figures the GPU models reproduce -------------------------------------------------


def test_24_reproduces_the_pytorch_gemm_timings():
    # PyTorch blog (2024): 13008x4096x1024 on A100, 538 us dense, 387 us 2:4.
    m, n, k = fits.PT24_SHAPE
    dense = LayerMask("g", "other", n, k, n * k)
    sparse = replace(dense, nnz=n * k // 2, nm_violation_in=0.0, nm_violation_out=0.0)
    gpu = DEVICES["a100-2:4"]
    t_dense = gpu.cost(dense, m, "forward").total
    t_sparse = gpu.cost(sparse, m, "forward").total
    assert t_dense == pytest.approx(538e-6, rel=0.005)
    assert t_sparse == pytest.approx(387e-6, rel=0.005)


@pytest.mark.parametrize("s,published", fits.FLASH_LLM_POINTS)
def test_flash_llm_reproduces_its_skinny_speedups(s, published):
    wl, _ = from_shape((12288, 12288), s, 16, GRIDS)
    assert speedups(simulate(wl, DEVICES))["a100-flash-llm"] == pytest.approx(published, rel=0.05)


def test_flash_llm_gains_nothing_when_compute_bound():
    wl, _ = from_shape((4096, 4096), 0.9, 8192, GRIDS)
    assert speedups(simulate(wl, DEVICES))["a100-flash-llm"] <= 1.0


@pytest.mark.parametrize("name,break_even", [("a100-sputnik", 0.90), ("a100-cusparse", 0.98)])
def test_spmm_breaks_even_at_the_published_sparsity(name, break_even):
    dev = replace(DEVICES[name], launch_s=0.0)
    layer = sampled_random("x", "other", (8192, 8192), break_even, GRIDS, np.random.default_rng(0))
    wl = Workload("x", "model", 8192, [layer])
    assert simulate(wl, [dev])["devices"][0]["forward"]["speedup"] == pytest.approx(1.0, rel=0.02)
    lower = sampled_random(
        "x", "other", (8192, 8192), break_even - 0.1, GRIDS, np.random.default_rng(0)
    )
    assert (
        simulate(Workload("x", "model", 8192, [lower]), [dev])["devices"][0]["forward"]["speedup"]
        < 0.9
    )


# --- Fitted constants agree with their fits; every constant has a source -----------------------


def test_fitted_constants_match_their_fits():
    assert DEVICES["a100"].eta == pytest.approx(fits.fit_gpu_eta(DEVICES["a100"]), rel=0.005)
    assert DEVICES["a100-2:4"].math_speedup == pytest.approx(
        fits.fit_24_speedup(DEVICES["a100-2:4"]), rel=0.005
    )
    floor, slope = fits.fit_flash_llm()
    assert DEVICES["a100-flash-llm"].floor == pytest.approx(floor, rel=0.005)
    assert DEVICES["a100-flash-llm"].slope == pytest.approx(slope, rel=0.005)
    assert DEVICES["cs2"].fixed_s == pytest.approx(
        fits.fit_dataflow_fixed(DEVICES["cs2"]), rel=0.01
    )


def test_every_constant_is_cited_fitted_or_assumed():
    from dataclasses import fields

    for name in PRESETS:
        dev, src = DEVICES[name], sources(name)
        for f in fields(dev):
            if f.name == "name":
                continue
            assert src.get(f.name, "").strip(), f"{name}.{f.name} has no source"
        for key, text in src.items():
            if "fitted" in key or text.startswith("fitted"):
                assert "fitted" in text


def test_cs2_preset_peak_is_the_published_seven_and_a_half_petaflops():
    df = DEVICES["cs2"]
    assert 2 * df.fmac_rate == pytest.approx(7.5e15, rel=0.01)


# --- Whole model: targeted layers plus the dense Appendix-F work --------------------------------


def test_model_workload_uses_the_flops_split():
    from sparsetool.flops import forward_terms, get_preset

    cfg = get_preset("gpt3-xl")
    wl = from_model(cfg, 0.75, 4096, GRIDS)
    terms = forward_terms(cfg, sparsity=0.75)
    per_seq = 4096 / cfg.seq_len
    targeted = sum(2.0 * wl.tokens * ly.nnz for ly in wl.layers)
    assert targeted == pytest.approx(
        (terms["qkv"] + terms["attn_out"] + terms["ffn"]) * per_seq, rel=1e-6
    )
    dense_rest = terms["attn_logits"] + terms["softmax"] + terms["attn_values"] + terms["logits"]
    assert wl.untargeted_flops == pytest.approx(dense_rest * per_seq)
    res = simulate(wl, DEVICES)
    assert res["workload"]["theoretical"] == pytest.approx(
        sum(forward_terms(cfg).values()) / sum(terms.values())
    )


def test_dense_work_dilutes_the_dataflow_speedup():
    from sparsetool.flops import get_preset

    cfg = get_preset("gpt3-xl")
    res = simulate(from_model(cfg, 0.75, 8192, GRIDS), DEVICES)
    cs2 = next(d for d in res["devices"] if d["name"] == "cs2")
    assert cs2["train_step"]["untargeted_s"] > 0
    assert 1.5 < cs2["train_step"]["speedup"] < res["workload"]["theoretical"] < 4


def test_training_step_is_three_passes():
    wl, _ = from_shape((512, 512), 0.8, 1024, GRIDS)
    res = simulate(wl, DEVICES)
    for d in res["devices"]:
        if not d["applicable"]:
            continue
        passes = d["train_step"]["passes"]
        assert set(passes) == {"forward", "backward_data", "backward_weight"}
        assert sum(passes.values()) == pytest.approx(d["train_step"]["time_s"])


# --- Mask statistics ---------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    k=st.integers(1, 40),
    gm=st.integers(1, 9),
    gk=st.integers(1, 9),
    seed=st.integers(0, 1000),
)
def test_tile_counts_match_a_loop(m, k, gm, gk, seed):
    mask = np.random.default_rng(seed).random((m, k)) < 0.3
    got = tile_counts(mask, (gm, gk))
    e0 = [(i * m) // min(gm, m) for i in range(min(gm, m) + 1)]
    e1 = [(j * k) // min(gk, k) for j in range(min(gk, k) + 1)]
    for i in range(len(e0) - 1):
        for j in range(len(e1) - 1):
            assert got[i, j] == mask[e0[i] : e0[i + 1], e1[j] : e1[j + 1]].sum()


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 12), groups=st.integers(1, 12), seed=st.integers(0, 1000))
def test_nm_violation_matches_a_loop(rows, groups, seed):
    mask = np.random.default_rng(seed).random((rows, 4 * groups)) < 0.5
    bad = sum(mask[r, 4 * g : 4 * g + 4].sum() > 2 for r in range(rows) for g in range(groups))
    assert nm_violation(mask, axis=1) == bad / (rows * groups)
    t = np.ascontiguousarray(mask.T)
    assert nm_violation(t, axis=0) == bad / (rows * groups)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 60),
    k=st.integers(1, 60),
    s=st.floats(0, 1),
    pattern=st.sampled_from(["random", "rows", "cols"]),
    seed=st.integers(0, 10_000),
)
@example(m=45, k=18, s=0.35, pattern="random", seed=0)
def test_synthetic_masks_have_exact_counts(m, k, s, pattern, seed):
    mask = synthetic_mask((m, k), s, pattern, seed)
    assert mask.shape == (m, k) and mask.dtype == np.bool_
    # round(s * (m * k)), as prune counts; round(s * m * k) differs where s * m rounds (0.35 * 45 *
    # 18)
    assert int((~mask).sum()) == round(s * (m * k))
    assert np.array_equal(mask, synthetic_mask((m, k), s, pattern, seed))  # seeded


def test_large_random_mask_exact_count_at_extremes():
    for s in (0.003, 0.5, 0.993):
        mask = synthetic_mask((1000, 3000), s, seed=1)
        assert int((~mask).sum()) == round(s * 3_000_000)


def test_conv1d_layout_gives_the_same_statistics():
    mask = synthetic_mask((48, 64), 0.7, seed=2)  # (M, K)
    a = stats_from_mask("a", "other", mask, [(4, 8)], input_dim=1)
    b = stats_from_mask("b", "other", np.ascontiguousarray(mask.T), [(4, 8)], input_dim=0)
    assert (a.out_features, a.in_features, a.nnz) == (b.out_features, b.in_features, b.nnz)
    assert np.array_equal(a.tiles[(4, 8)], b.tiles[(4, 8)])
    assert a.nm_violation_in == b.nm_violation_in and a.nm_violation_out == b.nm_violation_out


def test_sampled_counts_are_consistent():
    ly = sampled_random("x", "other", (1000, 3000), 0.8, [(32, 32)], np.random.default_rng(0))
    assert ly.tiles[(32, 32)].sum() == ly.nnz == 600_000
    assert not ly.measured
    assert 1.0 < ly.busiest_over_mean((32, 32)) < 1.25  # ~2900-entry tiles at density 0.2


def test_bad_sparsity_and_pattern_are_config_errors():
    with pytest.raises(ConfigError):
        synthetic_mask((4, 4), 1.5)
    with pytest.raises(ConfigError):
        synthetic_mask((4, 4), 0.5, "blocks")
    with pytest.raises(ConfigError, match="0.5"):
        synthetic_mask((4, 8), 0.75, "2:4")


def test_sparsity_one_has_no_theoretical_and_finite_times():
    wl, _ = from_shape((64, 64), 1.0, 64, GRIDS)
    res = simulate(wl, DEVICES)
    assert res["workload"]["theoretical"] is None
    for d in res["devices"]:
        if d["applicable"]:
            assert math.isfinite(d["forward"]["time_s"]) and d["forward"]["speedup"] >= 1.0


def test_dataflow_weight_streaming_is_bound_by_the_stream():
    df = replace(DEVICES["cs2"], weight_streaming=True)
    wl, _ = from_shape((2048, 2048), 0.5, 2048, GRIDS)
    cost = simulate(wl, [df])["devices"][0]["forward"]
    assert cost["breakdown"]["memory"] > cost["breakdown"]["compute"]
    # 2 bytes of value + 2 of index per non-zero at half density: no gain over dense streaming
    assert cost["speedup"] == pytest.approx(1.0, rel=0.01)


def test_dense_gpu_is_memory_bound_for_one_token():
    gpu: DenseGPU = DEVICES["a100"]
    layer = LayerMask("x", "other", 4096, 4096, 4096 * 4096)
    c = gpu.cost(layer, 1, "forward")
    assert c.memory > c.compute and c.total == pytest.approx(c.memory + c.fixed)


def test_sparse24_type():
    assert isinstance(DEVICES["a100-2:4"], Sparse24GPU)


def test_dataflow_says_when_resident_weights_do_not_fit_on_chip():
    from sparsetool.flops import get_preset

    big = simulate(from_model(get_preset("gpt3-175b"), 0.5, 2048, GRIDS), [DEVICES["cs2"]])[
        "devices"
    ][0]
    assert any("do not fit" in n for n in big["notes"])  # 87.5B non-zeros x 4 bytes > 40 GB
    small = simulate(from_model(get_preset("gpt3-xl"), 0.5, 2048, GRIDS), [DEVICES["cs2"]])[
        "devices"
    ][0]
    assert small["notes"] == []
    streamed = replace(DEVICES["cs2"], weight_streaming=True)
    assert (
        simulate(from_model(get_preset("gpt3-175b"), 0.5, 2048, GRIDS), [streamed])["devices"][0][
            "notes"
        ]
        == []
    )
