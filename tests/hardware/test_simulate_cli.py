"""`sparsetool simulate` end to end: JSON, human output, sweep, plot, verify, clean errors."""

from __future__ import annotations

import json

import pytest

from helpers import pruned_gpt2, runner_for

run = runner_for("simulate")


def ok_json(*args):
    r = run(*args, "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    assert r.stderr == ""
    return json.loads(r.stdout)


def bad(*args, match: str):
    r = run(*args)
    assert r.exit_code == 1, r.stdout
    assert r.stdout == ""
    assert "error:" in r.stderr and match in r.stderr, r.stderr


def usage_bad(*args, match: str):
    """Options that do not combine: a usage error (exit 2) before any file is read."""
    r = run(*args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.startswith("error: ") and match in " ".join(r.stderr.split()), r.stderr


def test_shape_json_has_every_device_and_the_breakdown():
    res = ok_json("--shape", "1024x768", "--sparsity", "0.9", "--tokens", "512")
    assert res["workload"]["theoretical"] == pytest.approx(10.0, rel=1e-3)
    names = [d["name"] for d in res["devices"]]
    assert names[:3] == ["cs2", "a100", "h100"]
    for d in res["devices"]:
        if d["applicable"]:
            assert set(d["train_step"]["breakdown"]) == {"compute", "memory", "fixed", "imbalance"}
            assert d["forward"]["theoretical"] == res["workload"]["theoretical"]
    cs2 = res["devices"][0]
    assert 1.0 < cs2["forward"]["speedup"] < 10.0
    assert cs2["busiest_over_mean"] >= 1.0


def test_human_output_names_devices_and_imbalance():
    r = run("--shape", "512x512", "--sparsity", "0.75", "--tokens", "256")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    for word in ("cs2", "a100", "h100", "speedup", "imbalance", "busiest core group", "refused"):
        assert word in out


def test_model_json():
    res = ok_json("--model", "gpt3-xl", "--sparsity", "0.75", "--tokens", "4096")
    assert res["workload"]["layers"] == 96
    assert res["workload"]["seq_len"] == 2048
    cs2 = res["devices"][0]
    assert 1.0 < cs2["train_step"]["speedup"] < res["workload"]["theoretical"] < 4.0


def test_checkpoint_json_layer_by_layer(tmp_path):
    path, masks = pruned_gpt2(tmp_path, 0.8, "mask")
    res = ok_json(str(path), "--tokens", "128", "--seq-len", "32")
    assert res["workload"]["source"] == "checkpoint"
    assert {row["name"] for row in res["layers"]} == set(masks)
    for row in res["layers"]:
        assert row["nonzero"] == int(masks[row["name"]].sum()) and row["measured"]
        assert row["sparsity"] == pytest.approx(0.8, abs=1e-3)
        assert set(row["speedup"]) == {d["name"] for d in res["devices"]}
    passes = res["devices"][0]["train_step"]["passes"]
    assert set(passes) == {"forward", "backward_data", "backward_weight"}


def test_checkpoint_human_output_and_verify(tmp_path):
    path, _ = pruned_gpt2(tmp_path, 0.5)
    r = run(str(path), "--tokens", "64", "--verify")
    assert r.exit_code == 0, r.stderr
    assert "verify:" in r.stdout and "equal" in r.stdout


def test_verify_in_json():
    res = ok_json("--shape", "300x200", "--sparsity", "0.8", "--verify")
    v = res["verify"]
    assert v["equal"] and v["axpys_match_tiles"] and v["axpys"] == v["nonzero"] == 12000


def test_a_schedule_that_differs_from_the_dense_matmul_fails_the_run(monkeypatch):
    """--verify's check is the exit code: a schedule whose result differs exits 1 (after its
    output), in the table and in --json, and the API's record says so."""
    import sparsetool
    import sparsetool.hardware.verify as verify

    real = verify.run_schedule

    def differing(*args, **kwargs):
        return {**real(*args, **kwargs), "equal": False}

    monkeypatch.setattr(verify, "run_schedule", differing)
    args = ("--shape", "300x200", "--sparsity", "0.8", "--verify")
    table = run(*args)
    assert table.exit_code == 1 and "NOT equal" in table.stdout, table.stdout
    as_json = run(*args, "--json")
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["verify"]["equal"] is False
    record = sparsetool.simulate(shape="300x200", sparsity=0.8, verify=True)
    assert record.verified is False and record.to_json()["verify"]["equal"] is False
    assert sparsetool.simulate(shape="300x200", sparsity=0.8).verified is None


def test_sweep_and_plot(tmp_path):
    png = tmp_path / "speedup.png"
    res = ok_json("--shape", "512x512", "--sweep", "--tokens", "2048", "--plot", str(png))
    assert [r["sparsity"] for r in res["runs"]][:3] == [0.0, 0.5, 0.6667]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    first = res["runs"][0]["devices"]
    assert all(d["forward_speedup"] == 1.0 for d in first.values())
    for row in res["runs"]:
        for d in row["devices"].values():
            if d["forward_speedup"] is not None:
                assert d["forward_speedup"] <= row["theoretical"] * (1 + 1e-12)
    assert not list(tmp_path.glob(".plot-*"))  # no temporary file left behind


def test_sparsity_list_is_a_sweep_and_plot_needs_one():
    res = ok_json("--model", "gpt2-small", "--sparsity", "0.5,0.9", "--tokens", "1024")
    assert [r["sparsity"] for r in res["runs"]] == [0.5, 0.9]
    usage_bad("--shape", "64x64", "--sparsity", "0.5", "--plot", "x.png", match="sweep")


def test_pattern_24_runs_on_24_cores():
    res = ok_json(
        "--shape", "256x512", "--sparsity", "0.5", "--pattern", "2:4", "--device", "a100-2:4"
    )
    d = res["devices"][0]
    assert d["applicable"] and 1.0 < d["forward"]["speedup"] <= 2.0


def test_random_mask_on_24_cores_is_refused_not_counted():
    res = ok_json("--shape", "256x512", "--sparsity", "0.5", "--device", "a100-2:4")
    d = res["devices"][0]
    assert d["applicable"] is False and d["forward"] is None and "not 2:4" in d["reason"]


def test_hardware_file_overrides_and_adds(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text(
        "[cs2]\nfixed_s = 0.0\ngroups_m = 8\ngroups_k = 8\n\n"
        '[b200]\nbase = "h100"\npeak_flops = 2.25e15\n'
    )
    res = ok_json(
        "--shape",
        "1024x1024",
        "--sparsity",
        "0.5",
        "--hardware",
        str(f),
        "--device",
        "cs2",
        "--device",
        "b200",
        "--device",
        "h100",
    )
    by = {d["name"]: d for d in res["devices"]}
    assert by["b200"]["forward"]["dense_time_s"] < by["h100"]["forward"]["dense_time_s"]
    assert res["layers"][0]["core_groups"] == [8, 8]
    lst = ok_json("--list-hardware", "--hardware", str(f))
    assert lst["cs2"]["constants"]["fixed_s"]["source"].startswith("set in")
    assert lst["b200"]["constants"]["bandwidth"]["value"] == 3.35e12


def test_list_hardware_cites_every_constant():
    lst = ok_json("--list-hardware")
    assert "cs2" in lst and "a100-flash-llm" in lst
    for dev in lst.values():
        for c in dev["constants"].values():
            assert c["source"] and c["source"] != "default"


@pytest.mark.parametrize(
    "args,match",
    [
        (("--shape", "64x64"), "--sparsity"),
        (("--shape", "64x64", "--model", "gpt3-xl", "--sparsity", "0.5"), "exactly one"),
        ((), "exactly one"),
        (("--model", "gpt2-small", "--sparsity", "0.5", "--pattern", "rows"), "--pattern draws"),
        (("--model", "gpt2-small", "--sparsity", "0.5", "--include", "*h.0*"), "give CHECKPOINT"),
        (("--model", "gpt2-small", "--sweep", "--sparsity", "0.5"), "not both"),
    ],
)
def test_options_that_do_not_combine_are_usage_errors(args, match):
    """These exited 1 like a bad file; how options combine is usage (exit 2), as in every
    command."""
    usage_bad(*args, match=match)


@pytest.mark.parametrize(
    "args,match",
    [  # a bad --shape or --device: tests/cli/test_cli_usage.py
        (("--shape", "64x64", "--sparsity", "0.75", "--pattern", "2:4"), "0.5"),
        (("missing.safetensors",), "not found"),
    ],
)
def test_bad_input_is_one_clean_error(args, match):
    bad(*args, match=match)


# A bad option value is a usage error, exit 2, found while parsing (these exited 1 before the
# shared vocabulary).
@pytest.mark.parametrize(
    "args,match",
    [
        (("--shape", "64x64", "--sparsity", "1.5"), "--sparsity must be a number from 0 to 1"),
        (("--model", "gpt9", "--sparsity", "0.5"), "gpt9"),
        (("--shape", "64x64", "--sparsity", "0.5", "--tokens", "0"), "--tokens"),
        (("--shape", "64x64", "--sparsity", "0.5", "--pattern", "zigzag"), "zigzag"),
    ],
)
def test_bad_option_value_is_a_usage_error(args, match):
    r = run(*args)
    assert r.exit_code == 2, r.stdout
    assert r.stdout == "" and r.stderr.startswith("error: ") and match in r.stderr


def test_checkpoint_with_sweep_is_refused(tmp_path):
    path, _ = pruned_gpt2(tmp_path)
    usage_bad(str(path), "--sweep", match="brings its own masks")


@pytest.mark.parametrize(
    "text,match",
    [
        ('{"cs2": {"warp_drive": 1}}', "warp_drive"),
        ('{"cs2": {"cores": -3}}', "cores"),
        ('{"x": {"peak_flops": 1}}', "base"),
        ('{"cs2": 3}', "tables"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_bad_hardware_file_is_one_clean_error(tmp_path, text, match):
    f = tmp_path / "hw.json"
    f.write_text(text)
    bad("--shape", "64x64", "--sparsity", "0.5", "--hardware", str(f), match=match)


def test_bad_plot_directory_writes_nothing(tmp_path):
    bad(
        "--shape",
        "64x64",
        "--sweep",
        "--plot",
        str(tmp_path / "no" / "x.png"),
        match="does not exist",
    )


def test_model_verify_runs_on_a_mask_of_its_first_layer():
    res = ok_json("--model", "gpt2-small", "--sparsity", "0.9", "--tokens", "1024", "--verify")
    assert res["verify"]["equal"] and res["verify"]["block"] == [512, 512]


def test_library_loads_neither_the_cli_nor_torch_nor_matplotlib():
    import subprocess
    import sys

    code = (
        "import sys, sparsetool.hardware; bad = [m for m in ('typer', 'rich', 'sparsetool.cli', "
        "'torch', 'matplotlib') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_yaml_hardware_file(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text(
        "a100:\n  launch_s: 0.0\nmy-spmm:\n  kind: gpu-spmm\n  break_even_sparsity: 0.5\n  "
        "launch_s: 0.0\n"
    )
    res = ok_json(
        "--shape",
        "2048x2048",
        "--sparsity",
        "0.75",
        "--hardware",
        str(f),
        "--device",
        "a100",
        "--device",
        "my-spmm",
    )
    by = {d["name"]: d for d in res["devices"]}
    assert by["a100"]["forward"]["breakdown"]["fixed"] == 0.0
    # break-even at 50%: at 75% sparsity the compute-bound kernel is twice as fast as dense
    assert by["my-spmm"]["forward"]["speedup"] == pytest.approx(2.0, rel=0.05)


def test_hardware_file_with_unknown_suffix(tmp_path):
    f = tmp_path / "hw.txt"
    f.write_text("cs2: {}")
    bad("--shape", "64x64", "--sparsity", "0.5", "--hardware", str(f), match="suffix")


@pytest.mark.parametrize("fallback", [True, False])
def test_weight_streaming_falls_back_to_the_dense_kernel_where_it_is_faster(tmp_path, fallback):
    """At 10% sparsity each streamed non-zero carries a 2-byte index, so the sparse kernel moves
    1.8x the dense weight bytes (0.56x of dense speed): a compiler runs that layer dense."""
    f = tmp_path / "hw.toml"
    f.write_text(f"[cs2]\nweight_streaming = true\ndense_fallback = {str(fallback).lower()}\n")
    low = ok_json(
        "--shape",
        "4096x4096",
        "--sparsity",
        "0.1",
        "--tokens",
        "2048",
        "--hardware",
        str(f),
        "--device",
        "cs2",
    )
    cs2 = low["devices"][0]
    kernel = low["layers"][0]["kernel"]["cs2"]
    if fallback:
        assert kernel == "dense" and cs2["forward"]["speedup"] == pytest.approx(1.0)
        assert any("run the dense kernel" in n for n in cs2["notes"])
    else:
        assert kernel == "sparse" and cs2["forward"]["speedup"] == pytest.approx(0.56, abs=0.01)
        assert not any("dense kernel" in n for n in cs2["notes"])
    # At 90% the sparse kernel wins either way.
    high = ok_json(
        "--shape",
        "4096x4096",
        "--sparsity",
        "0.9",
        "--tokens",
        "2048",
        "--hardware",
        str(f),
        "--device",
        "cs2",
    )
    assert high["layers"][0]["kernel"]["cs2"] == "sparse"
    assert high["devices"][0]["forward"]["speedup"] > 4


def test_more_core_groups_than_cores_is_refused(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text("[cs2]\ngroups_m = 100000\ngroups_k = 32\n")
    bad(
        "--shape",
        "64x64",
        "--sparsity",
        "0.5",
        "--hardware",
        str(f),
        match="3,200,000 core groups but only 850,000 cores",
    )


def test_layers_smaller_than_the_core_group_grid_are_named(tmp_path):
    f = tmp_path / "hw.toml"
    f.write_text("[cs2]\ngroups_m = 128\ngroups_k = 128\n")
    res = ok_json(
        "--shape", "64x4096", "--sparsity", "0.5", "--hardware", str(f), "--device", "cs2"
    )
    assert any(
        "fewer rows or columns than the 128 x 128 core-group grid" in n and "64 x 4096" in n
        for n in res["devices"][0]["notes"]
    )
    res = ok_json("--shape", "4096x4096", "--sparsity", "0.5", "--device", "cs2")
    assert not any("core-group grid" in n for n in res["devices"][0]["notes"])


def test_sweep_plot_draws_the_theoretical_curve_not_segments(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig: kept.append(fig))
    out = tmp_path / "s.png"
    r = run("--shape", "256x256", "--sparsity", "0.5,0.9", "--plot", str(out), "--quiet")
    assert r.exit_code == 0 and out.exists(), r.output
    ax = kept[0].axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "theoretical 1/(1-s)"]
    x, y = line.get_data()
    assert len(x) > 100 and x[0] == 0.0 and x[-1] == pytest.approx(0.9)
    assert y == pytest.approx([1 / (1 - s) for s in x])
    # the legend sits outside the axes, so it cannot cover the dense point at (0, 1x)
    legend = ax.get_legend()
    assert legend is not None and legend.get_bbox_to_anchor().x0 > ax.get_window_extent().x1 - 1
