"""Plots that read at a glance, tested on what is drawn (lines, markers, labels, legends), not on
pixels: eval's labels and title, simulate's overlapping devices, train's smoothed loss."""

from __future__ import annotations

import json

from sparsetool.hardware.plot import sweep_figure
from sparsetool.ops.eval import EvalResult, EvalRow, plot_eval
from sparsetool.train.runfiles import Log, smoothed
from sparsetool.util.plotting import pyplot

from helpers import run


def row(name: str, sparsity: float, ppl: float) -> EvalRow:
    return EvalRow(name, "huggingface", sparsity, 100, 50, 1.0, ppl, 1.0, 10, 10, 8, 8, 1.0)


def test_eval_points_are_told_apart_and_the_title_keeps_the_file_name(tmp_path, figures):
    text = (
        "/data/corpora/wikitext-103-raw-v1/validation/wiki.valid.raw.shuffled.sample-2024-01-15.txt"
    )
    result = EvalResult(
        text,
        [
            row("runs/dense/model.safetensors", 0.0, 5.7),
            row("runs/sparse-0.5/model.safetensors", 0.5, 7.3),
            row("pruned-0.75.safetensors", 0.75, 19.8),
        ],
    )
    plot_eval(result, tmp_path / "ppl.png")
    ax = figures[-1].axes[0]
    assert sorted(t.get_text() for t in ax.texts) == [
        "dense/model.safetensors",
        "pruned-0.75.safetensors",
        "sparse-0.5/model.safetensors",
    ]
    title = ax.get_title().splitlines()
    assert title[0] == "perplexity vs sparsity"
    assert (
        title[1].endswith("/wiki.valid.raw.shuffled.sample-2024-01-15.txt") and len(title[1]) <= 80
    )
    assert (tmp_path / "ppl.png").exists()


def test_eval_draws_each_pruning_method_apart_never_a_vertical_line(tmp_path, figures):
    """Magnitude and random at 50% are two markers of two series, not one line up through 50%;
    a checkpoint without a prune record is a star; the legend names the methods (issue 31, item 10).
    """
    from helpers import ROOT

    tiny = ROOT / "fixtures" / "tiny-gpt2"
    made = {}
    for name, args in {
        "mag-50": ("--sparsity", "0.5"),
        "rand-50": ("--sparsity", "0.5", "--method", "random"),
        "mag-75": ("--sparsity", "0.75"),
        "nm-24": ("--nm", "2:4"),
    }.items():
        made[name] = tmp_path / name
        r = run("prune", str(tiny), "-o", str(made[name]), *args, "-q")
        assert r.exit_code == 0, r.output
    result = EvalResult(
        "t.txt",
        [
            row(str(tiny), 0.0, 5.0),
            row(str(made["mag-50"]), 0.5, 6.0),
            row(str(made["rand-50"]), 0.5, 9.0),
            row(str(made["mag-75"]), 0.75, 8.0),
            row(str(made["nm-24"]), 0.5, 7.0),
        ],
    )
    plot_eval(result, tmp_path / "ppl.png")
    ax = figures[-1].axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"magnitude", "magnitude 2:4", "random", "no prune record"}
    assert (
        list(lines["magnitude"].get_xdata()) == [50, 75]
        and lines["magnitude"].get_linestyle() == "-"
    )
    for ln in lines.values():
        xs = list(ln.get_xdata())
        assert len(set(xs)) == len(xs), ln.get_label()  # no line joins points of one sparsity
    assert len({ln.get_marker() for ln in lines.values()}) == 4
    assert lines["no prune record"].get_marker() == "*"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "magnitude",
        "magnitude 2:4",
        "random",
        "no prune record",
    ]


def test_run_directories_named_model_are_told_apart_in_eval_and_diff(tmp_path, figures):
    from helpers import ROOT

    tiny = ROOT / "fixtures" / "tiny-gpt2"
    a, b = tmp_path / "dense" / "model", tmp_path / "pruned" / "model"
    for out, sparsity in ((a, "0"), (b, "0.5")):
        out.parent.mkdir()
        r = run("prune", str(tiny), "-o", str(out), "--sparsity", sparsity, "-q")
        assert r.exit_code == 0, r.output
    plot_eval(
        EvalResult("t.txt", [row(str(a), 0.0, 5.0), row(str(b), 0.5, 6.0)]), tmp_path / "ppl.png"
    )
    assert sorted(t.get_text() for t in figures[-1].axes[0].texts) == [
        "dense/model",
        "pruned/model",
    ]
    r = run("diff", str(a), str(b), "--plot", str(tmp_path / "d.png"), "-q")
    assert r.exit_code == 0, r.output
    assert figures[-1].axes[0].get_title().splitlines()[0] == "dense/model -> pruned/model"


def test_simulate_sweep_keeps_every_device_visible(tmp_path):
    res = run("simulate", "--shape", "4096x4096", "--sweep", "--tokens", "2048", "--json")
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    fig = sweep_figure(result["runs"], "t", "forward_speedup", result.get("nm_point"))
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    devices = [n for n in lines if not n.startswith(("theoretical", "sparsity 0"))]
    styles = [
        (
            lines[n].get_marker(),
            str(lines[n].get_linestyle()),
            lines[n].get_markersize(),
            lines[n].get_markerfacecolor(),
        )
        for n in devices
    ]
    assert len(set(styles)) == len(devices)  # no two devices drawn alike
    one_x = [
        n
        for n in devices
        if "(on a 2:4 mask)" not in n and all(abs(y - 1.0) < 0.02 for y in lines[n].get_ydata())
    ]
    assert len(one_x) >= 2  # the dense GPUs sit at 1x together...
    xs = [tuple(lines[n].get_xdata()) for n in one_x]
    assert len(set(xs)) == len(xs)  # ...each moved a little apart, not drawn over one another
    nm = [n for n in devices if "(on a 2:4 mask)" in n]
    assert len(nm) == 2 and lines[nm[0]].get_xdata()[0] != lines[nm[1]].get_xdata()[0]
    assert all(lines[n].get_alpha() < 1 for n in devices)
    pyplot().close(fig)


def test_loss_curve_has_a_smoothed_line_over_the_faint_raw_one(tmp_path):
    log = Log(tmp_path, None)
    log.records = [
        {"kind": "train", "step": i, "loss": 5.0 - 0.01 * i + (0.3 if i % 2 else -0.3)}
        for i in range(1, 201)
    ] + [{"kind": "eval", "step": 100, "val_loss": 4.0}]
    fig = log.loss_figure("t")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "train (each step)",
        "train, smoothed (EMA 0.85, forward and back)",
        "validation",
    ]
    raw, smooth = ax.get_lines()[:2]
    assert raw.get_alpha() < 0.5 and smooth.get_linewidth() > raw.get_linewidth()
    ys = list(smooth.get_ydata())
    assert (
        max(abs(a - b) for a, b in zip(ys[10:-10], smoothed(list(raw.get_ydata()), 0.85)[10:-10]))
        == 0
    )
    assert max(abs(y - (5.0 - 0.01 * i)) for i, y in zip(range(1, 201), ys) if 20 < i < 180) < 0.05
    pyplot().close(fig)
