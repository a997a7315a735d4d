"""The cpu device, and the model set against measured kernel times (`simulate --measured`, `--fit`).

The measurements are bench JSON files built here by hand, following the schema of
``sparsetool bench --json``; where their times come from a cpu device with known constants, a
fit must find those constants again.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from sparsetool.errors import ConfigError, UsageError
from sparsetool.hardware import builtin_devices, from_shape, simulate
from sparsetool.hardware.devices import CPU, PASSES
from sparsetool.hardware.layers import LayerMask
from sparsetool.hardware.measured import (
    FITTED,
    choose_kernel,
    compare,
    fit,
    load_measurement,
    measured_device,
)
from sparsetool.hardware.presets import load_devices

import json_schemas as S
from helpers import TRUE_CPU, bench_json, runner_for

run = runner_for("simulate")
DEVICES = builtin_devices()


def write(tmp_path, data, name="bench.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


# --- the cpu device ----------------------------------------------------------------------------


@pytest.mark.parametrize("shape,tokens", [((64, 48), 1), ((768, 3072), 2048), ((1000, 999), 7)])
def test_cpu_speedup_at_sparsity_zero_is_exactly_one(shape, tokens):
    wl, _ = from_shape(shape, 0.0, tokens, [(32, 32)])
    for dev in (DEVICES["cpu"], TRUE_CPU):
        d = simulate(wl, [dev])["devices"][0]
        assert d["forward"]["speedup"] == 1.0 and d["train_step"]["speedup"] == 1.0


@pytest.mark.parametrize("pass_", ["forward", "backward_data"])
@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_cpu_sparse_cost_falls_as_non_zeros_fall(pass_, tokens):
    cpu = DEVICES["cpu"]
    costs = [
        cpu.cost(LayerMask("x", "other", 1024, 4096, nnz), tokens, pass_).total
        for nnz in (4_000_000, 2_000_000, 400_000, 40_000, 0)
    ]
    assert all(a > b for a, b in zip(costs, costs[1:])), costs


def test_cpu_costs_follow_the_documented_rooflines():
    cpu, (m, k, nnz, t) = TRUE_CPU, (300, 500, 12_345, 40)
    ly = LayerMask("x", "other", m, k, nnz)
    dense = max(2 * t * m * k / 80e9, (m * k + t * (k + m)) * 4 / 12e9) + 8e-6
    sparse = max(t * nnz / 1.5e9, (nnz * 8 + (m + 1) * 4 + t * (k + m) * 4) / 6e9) + 25e-6
    back = max(t * nnz / 1.5e9, (nnz * 8 + (k + 1) * 4 + t * (k + m) * 4) / 6e9) + 25e-6
    assert cpu.cost(ly, t, "forward").total == pytest.approx(sparse, rel=1e-12)
    assert cpu.cost(ly, t, "backward_data").total == pytest.approx(back, rel=1e-12)
    assert cpu.cost(ly, t, "backward_weight").total == pytest.approx(dense, rel=1e-12)
    assert cpu.dense_cost(ly, t, "forward").total == pytest.approx(dense, rel=1e-12)


def test_cpu_backward_weight_runs_dense_and_says_so():
    wl, _ = from_shape((2048, 2048), 0.9, 1, [(32, 32)])  # one token: the kernels stream weights
    d = simulate(wl, [DEVICES["cpu"]])["devices"][0]
    assert d["notes"] == ["backward-weight runs dense (the weight gradient is a dense product)"]
    assert d["forward"]["speedup"] > d["train_step"]["speedup"] > 1.0


def test_cpu_is_a_kind_a_hardware_file_can_start_from(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text('[laptop]\nkind = "cpu"\ndense_flops = 5e11\n')
    devices, srcs = load_devices(f)
    assert devices["laptop"] == CPU(name="laptop", dense_flops=5e11)
    assert srcs["laptop"] == {"dense_flops": f"set in {f}"}


def test_a_hardware_file_gives_sources_only_for_settings_it_sets(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text('[cpu]\nlaunch_s = 1e-6\n[cpu.sources]\nlaunch_s = "measured by hand"\n')
    assert load_devices(f)[1]["cpu"]["launch_s"] == "measured by hand"
    f.write_text('[cpu]\nlaunch_s = 1e-6\n[cpu.sources]\nbandwidth = "x"\n')
    with pytest.raises(ConfigError, match="'cpu'.sources names bandwidth, which the table does"):
        load_devices(f)


# --- compare -----------------------------------------------------------------------------------


def test_compare_gives_each_point_measured_and_modelled(tmp_path):
    data = bench_json(shapes=((512, 512), (64, 64)), batches=(1, 64))
    m = load_measurement(write(tmp_path, data))
    cpu = DEVICES["cpu"]
    res = compare(m, cpu)
    assert res["device"] == {"name": "cpu", "kind": "cpu"} and res["kernel"] == "scipy-csr"
    assert len(res["rows"]) == 2 * 2 * 2
    logs = {"dense_s": [], "sparse_s": [], "speedup": []}
    points = [(ly, r) for ly in m.data["layers"] for r in ly["runs"]]
    for row, (layer, run_) in zip(res["rows"], points):
        ly = LayerMask("x", "other", *layer["shape"], layer["nnz"])
        assert row["batch"] == run_["batch"] and row["nnz"] == layer["nnz"]
        assert row["measured"]["dense_s"] == run_["dense"]["median_s"]
        assert row["measured"]["sparse_s"] == run_["sparse"]["scipy-csr"]["median_s"]
        assert row["modelled"]["dense_s"] == cpu.dense_cost(ly, run_["batch"], "forward").total
        assert row["modelled"]["sparse_s"] == cpu.cost(ly, run_["batch"], "forward").total
        mod = row["modelled"]
        assert mod["speedup"] == mod["dense_s"] / mod["sparse_s"]
        for key in logs:
            logs[key].append(math.log(row["modelled"][key] / row["measured"][key]))
    rms = {k: math.exp(math.sqrt(np.mean(np.square(v)))) for k, v in logs.items()}
    assert res["error"]["dense"] == pytest.approx(rms["dense_s"])
    assert res["error"]["sparse"] == pytest.approx(rms["sparse_s"])
    assert res["error"]["speedup"] == pytest.approx(rms["speedup"])
    assert res["error"]["time"] == pytest.approx(
        math.exp(math.sqrt(np.mean(np.square(logs["dense_s"] + logs["sparse_s"]))))
    )
    assert res["error"]["points"] == 8 and res["error"]["time"] > 1.1  # the preset is not TRUE_CPU


def test_compare_against_the_device_that_made_the_times_is_exact(tmp_path):
    m = load_measurement(write(tmp_path, bench_json()))
    e = compare(m, TRUE_CPU)["error"]
    assert e["dense"] == pytest.approx(1.0) and e["sparse"] == pytest.approx(1.0)
    assert e["speedup"] == pytest.approx(1.0)


def test_the_default_kernel_is_the_fastest_at_most_points_and_one_may_be_named(tmp_path):
    data = bench_json(kernels=("torch-csr", "scipy-csr"), slower={"torch-csr": 1.5})
    m = load_measurement(write(tmp_path, data))
    assert choose_kernel(m) == "scipy-csr"
    assert compare(m, TRUE_CPU)["error"]["sparse"] == pytest.approx(1.0)
    named = compare(m, TRUE_CPU, "torch-csr")
    assert named["kernel"] == "torch-csr" and named["error"]["sparse"] > 1.4  # 64-bit indices, 1.5x
    with pytest.raises(UsageError, match="--kernel mkl: .* timed torch-csr, scipy-csr"):
        choose_kernel(m, "mkl")


def test_compare_takes_the_byte_sizes_from_the_measurement(tmp_path):
    m = load_measurement(
        write(
            tmp_path,
            bench_json(
                dtype="bfloat16", kernels=("torch-csr",), shapes=((2048, 2048),), batches=(1,)
            ),
        )
    )
    row = compare(m, TRUE_CPU)["rows"][0]
    ly = LayerMask("x", "other", 2048, 2048, row["nnz"])
    # torch's CSR holds 64-bit indices, and float32 values even for a bfloat16 run
    sized = replace(TRUE_CPU, value_bytes=4.0, index_bytes=8.0)
    assert row["modelled"]["sparse_s"] == sized.cost(ly, 1, "forward").total
    assert row["modelled"]["sparse_s"] != TRUE_CPU.cost(ly, 1, "forward").total


def test_a_wrong_sparse_product_is_left_out_of_the_errors(tmp_path):
    data = bench_json(shapes=((512, 512),), sparsities=(0.9,), batches=(1, 8))
    data["layers"][0]["runs"][1]["sparse"]["scipy-csr"].update(ok=False, median_s=1e3)
    res = compare(load_measurement(write(tmp_path, data)), TRUE_CPU)
    assert res["rows"][1]["measured"]["sparse_s"] is None
    assert "wrong product" in res["rows"][1]["note"]
    assert res["error"]["points"] == 1 and res["error"]["sparse"] == pytest.approx(1.0)


def test_a_gpu_measurement_needs_a_gpu_device_and_a_cpu_one_a_cpu_device(tmp_path):
    data = bench_json(device_type="cuda", kernels=("cusparse-csr",))
    gpu = load_measurement(write(tmp_path, data))
    with pytest.raises(
        UsageError,
        match="name the device to compare it with, --device NAME; "
        "those that fit: a100, h100, a100-2:4",
    ):
        measured_device(gpu, DEVICES)
    with pytest.raises(UsageError, match="--device cpu is a cpu device"):
        measured_device(gpu, DEVICES, "cpu")
    assert measured_device(gpu, DEVICES, "a100-sputnik").name == "a100-sputnik"
    cpu = load_measurement(write(tmp_path, bench_json()))
    assert measured_device(cpu, DEVICES) is DEVICES["cpu"]
    with pytest.raises(UsageError, match="--device a100 is a gpu-dense device: .* fits: cpu$"):
        measured_device(cpu, DEVICES, "a100")


def test_2_4_cores_refuse_a_mask_that_is_not_2_4_and_model_one_that_is(tmp_path):
    for two_four in (False, True):
        data = bench_json(
            device_type="cuda",
            kernels=("semi-structured-2:4",),
            sparsities=(0.5,),
            shapes=((1024, 1024),),
            batches=(64,),
            two_four=two_four,
        )
        row = compare(load_measurement(write(tmp_path, data)), DEVICES["a100-2:4"])["rows"][0]
        if two_four:
            assert 1.0 < row["modelled"]["speedup"] < 2.0 and row["note"] is None
        else:
            assert row["modelled"]["sparse_s"] is None and "not 2:4" in row["note"]


# --- fit ---------------------------------------------------------------------------------------


def test_fit_recovers_the_constants_that_made_the_times(tmp_path):
    m = load_measurement(write(tmp_path, bench_json()))
    f = fit(m, DEVICES["cpu"])
    assert f.unconstrained == []
    for k in FITTED:
        assert f.constants[k] == pytest.approx(getattr(TRUE_CPU, k), rel=1e-4), k
        assert f.start[k] == getattr(DEVICES["cpu"], k)
    assert f.after["time"] == pytest.approx(1.0, abs=1e-6)
    assert f.before["time"] > 1.1
    assert f.device == replace(DEVICES["cpu"], **f.constants)


@pytest.mark.parametrize("seed", [0, 1])
def test_fit_with_noisy_times_comes_close_and_never_does_worse(tmp_path, seed):
    m = load_measurement(write(tmp_path, bench_json(noise=0.05, seed=seed)))
    f = fit(m, DEVICES["cpu"])
    for k in FITTED:
        assert f.constants[k] == pytest.approx(getattr(TRUE_CPU, k), rel=0.15), k
    assert f.after["time"] <= f.before["time"]
    assert f.after["time"] < 1.1  # the noise alone is a factor of exp(0.05)
    # the true constants fit the noisy times no better than the fitted ones
    assert f.after["time"] <= compare(m, TRUE_CPU)["error"]["time"] * (1 + 1e-9)


def test_fit_keeps_what_the_measurement_does_not_constrain(tmp_path):
    # only large batches: the sparse kernel is never memory-bound, so its bandwidth is not seen
    m = load_measurement(write(tmp_path, bench_json(shapes=((2048, 2048),), batches=(512, 2048))))
    f = fit(m, DEVICES["cpu"])
    assert "sparse_bandwidth" in f.unconstrained
    assert f.sources["sparse_bandwidth"].startswith("not constrained by")
    # the smallest bandwidth that never sets the pace: any larger one models the same times, a
    # smaller one (by more than the 1% margin) slower ones
    same = compare(m, replace(f.device, sparse_bandwidth=f.device.sparse_bandwidth * 100))
    slower = compare(m, replace(f.device, sparse_bandwidth=f.device.sparse_bandwidth / 1.1))
    assert same["rows"] == compare(m, f.device)["rows"]
    assert slower["error"]["sparse"] > f.after["sparse"]
    assert f.constants["sparse_mac_rate"] == pytest.approx(TRUE_CPU.sparse_mac_rate, rel=1e-3)


def test_fit_refuses_a_gpu_device(tmp_path):
    data = bench_json(device_type="cuda", kernels=("cusparse-csr",))
    gpu = load_measurement(write(tmp_path, data))
    with pytest.raises(
        UsageError, match="--fit fits the constants of a cpu device, and a100-sputnik"
    ):
        fit(gpu, DEVICES["a100-sputnik"])


def test_fit_without_scipy_names_the_extra(tmp_path):
    p = write(tmp_path, bench_json(shapes=((64, 64),), batches=(1,)))
    code = (
        "import sys; sys.modules['scipy'] = None\n"  # what an install without scipy sees
        "from sparsetool.hardware.measured import fit, load_measurement\n"
        "from sparsetool.hardware import builtin_devices\n"
        f"fit(load_measurement({str(p)!r}), builtin_devices()['cpu'])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 1
    assert (
        "SparsetoolError: --fit needs scipy, which is not installed: pip install "
        "'sparsetool[bench]'"
    ) in r.stderr


# --- the command -------------------------------------------------------------------------------


def one_error(r, code: int, *words: str) -> str:
    assert r.exit_code == code, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    text = lines[0]
    for w in words:
        assert w in text, text
    return text


def test_measured_table_and_summary(tmp_path):
    p = write(tmp_path, bench_json(shapes=((512, 512),), sparsities=(0.9,), batches=(1, 64)))
    r = run("--measured", p)
    assert r.exit_code == 0, r.stderr
    head = "Test CPU @ 2.5GHz (cpu, float32), against cpu (cpu), sparse kernel scipy-csr"
    assert head in r.stdout
    res = compare(load_measurement(p), DEVICES["cpu"])
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith("512x512")]
    assert [row[:3] for row in rows] == [["512x512", "0.900", "1"], ["512x512", "0.900", "64"]]
    assert rows[0][-2:] == [
        f"{res['rows'][0]['measured']['speedup']:.2f}x",
        f"{res['rows'][0]['modelled']['speedup']:.2f}x",
    ]
    e = res["error"]
    assert f"over 2 points: dense x{e['dense']:.2f}, sparse x{e['sparse']:.2f}" in r.stdout


def test_measured_json_is_the_comparison(tmp_path):
    p = write(tmp_path, bench_json(shapes=((512, 512),), batches=(1, 64)))
    r = run("--measured", p, "--json")
    assert r.exit_code == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    assert not S.problems(out, S.SIMULATE_MEASURED), S.problems(out, S.SIMULATE_MEASURED)
    res = compare(load_measurement(p), DEVICES["cpu"])
    assert out["rows"] == res["rows"] and out["error"] == res["error"] and out["fit"] is None
    assert out["measurement"]["file"] == str(p) and out["measurement"]["kernels"] == ["scipy-csr"]


def test_fit_json_and_output_round_trip_through_hardware(tmp_path):
    p = write(tmp_path, bench_json(noise=0.03))
    out = tmp_path / "fitted.toml"
    r = run("--measured", p, "--fit", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    res = json.loads(r.stdout)
    assert not S.problems(res, S.SIMULATE_MEASURED), S.problems(res, S.SIMULATE_MEASURED)
    f = res["fit"]
    assert f["output"] == str(out) and f["error_after"]["time"] <= f["error_before"]["time"]
    assert f["error_before"] == res["error"]
    # read back: the same device, the same errors, and every fitted constant says so
    devices, srcs = load_devices(out)
    assert devices["cpu"] == replace(DEVICES["cpu"], **f["constants"])
    again = json.loads(run("--measured", p, "--hardware", out, "--json").stdout)
    assert again["error"] == pytest.approx(f["error_after"])
    assert again["rows"] == f["rows"]
    for k in FITTED:
        assert srcs["cpu"][k].startswith("fitted: ") and str(p) in srcs["cpu"][k]
    listed = json.loads(run("--list-hardware", "--hardware", out, "-d", "cpu", "--json").stdout)
    assert listed["cpu"]["constants"]["dense_flops"]["source"] == srcs["cpu"]["dense_flops"]


def test_fit_prints_the_constants_and_the_errors_before_and_after(tmp_path):
    p = write(tmp_path, bench_json())
    out = tmp_path / "cpu.toml"
    r = run("--measured", p, "--fit", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert "fitted: least squares on ln(modelled / measured)" in r.stdout
    assert "80.00 GFLOP/s" in r.stdout and "1.500 GMAC/s" in r.stdout  # TRUE_CPU's, found again
    assert "measured vs modelled after the fit" in r.stdout
    assert "after the fit: time x1.00 (before x" in r.stdout
    assert f"fitted device written to {out}" in " ".join(r.stdout.split())


SMALL = bench_json(batches=(1,))


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", ["is not JSON"]),
        (
            json.dumps({"devices": []}),
            ['is not a `sparsetool bench --json` output (no "bench" key'],
        ),
        (
            json.dumps({**SMALL, "bench": 2}),
            ["has schema version 2; this sparsetool reads version 1"],
        ),
        (
            json.dumps({k: v for k, v in SMALL.items() if k != "layers"}),
            ['the top has no "layers"'],
        ),
        (json.dumps({**SMALL, "dtype": "int8"}), ["dtype must be one of float32, bfloat16"]),
    ],
)
def test_a_bad_measurement_file_is_one_error(tmp_path, content, words):
    p = write(tmp_path, content)
    one_error(run("--measured", p), 1, f"measurement file '{p}'", *words)


def test_a_missing_timing_names_its_place(tmp_path):
    data = bench_json(batches=(1, 8))
    del data["layers"][1]["runs"][1]["dense"]["median_s"]
    p = write(tmp_path, data)
    one_error(
        run("--measured", p, "--fit"),
        1,
        f"measurement file '{p}': layers[1].runs[1].dense has no \"median_s\"",
    )
    one_error(run("--measured", tmp_path / "absent.json"), 1, "not found")


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["--measured", "b.json", "--shape", "64x64"],
            ["--measured and --shape do not go together"],
        ),
        (["--measured", "b.json", "--model", "gpt2-small"], ["--measured and --model do not go"]),
        (["--measured", "b.json", "--sweep"], ["--measured and --sweep do not go together"]),
        (["ckpt.safetensors", "--measured", "b.json"], ["--measured and CHECKPOINT do not go"]),
        (["--measured", "b.json", "--list-hardware"], ["--list-hardware and --measured do not go"]),
        (["--fit"], ["--fit goes with --measured BENCH.json"]),
        (
            ["--shape", "64x64", "-s", "0.5", "--kernel", "torch-csr"],
            ["--kernel torch-csr goes with"],
        ),
        (["--measured", "b.json", "-o", "x.toml"], ["-o x.toml writes the device --fit fits"]),
        (["--measured", "b.json", "--fit", "-o", "x.yaml"], ["ending in .toml, e.g. -o x.toml"]),
        (["--measured", "b.json", "-d", "cpu", "-d", "a100"], ["--measured compares one device"]),
    ],
)
def test_options_that_do_not_combine_are_usage_errors_before_any_file_is_read(args, words):
    one_error(run(*args), 2, *words)  # b.json does not exist: nothing was read


def test_usage_errors_found_in_the_measurement(tmp_path):
    p = write(tmp_path, bench_json(batches=(1,)))
    one_error(run("--measured", p, "--kernel", "mkl"), 2, "--kernel mkl:", "timed scipy-csr")
    one_error(run("--measured", p, "--device", "a100"), 2, "--device a100 is a gpu-dense device")
    gpu = bench_json(batches=(1,), device_type="cuda", kernels=("cusparse-csr",))
    g = write(tmp_path, gpu, "g.json")
    one_error(run("--measured", g), 2, "name the device to compare it with, --device NAME")
    one_error(run("--measured", g, "-d", "a100", "--fit"), 2, "--fit fits the constants of a cpu")
    r = run("--measured", g, "--device", "a100-sputnik", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["device"]["kind"] == "gpu-spmm"


def test_the_cpu_preset_is_listed_and_simulated_by_default():
    res = json.loads(run("--shape", "2048x2048", "-s", "0.9", "--tokens", "1", "--json").stdout)
    cpu = next(d for d in res["devices"] if d["name"] == "cpu")
    assert cpu["kind"] == "cpu" and 1.0 < cpu["forward"]["speedup"] < 10.0
    assert set(PASSES) == set(cpu["train_step"]["passes"])
