"""``report --plot``: bars for small models, a layer x matrix heatmap (shared with ``diff --plot``)
past a few dozen tensors, honest legends, ``--all/--targeted`` honoured, empty files said so."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import sparsetool.ops.plots as plots
from sparsetool.ops.diff import diff, plot_diff
from sparsetool.ops.report import (
    BARS_UP_TO,
    DENSE,
    UNTOUCHED,
    ZERO_INPUT,
    layer_cells,
    plot_report,
    summarize,
)

from helpers import gpt2_like_state, run

MATRICES = {
    "self_attn.q_proj": (16, 16),
    "self_attn.k_proj": (8, 16),
    "self_attn.v_proj": (8, 16),
    "self_attn.o_proj": (16, 16),
    "mlp.gate_proj": (32, 16),
    "mlp.up_proj": (32, 16),
    "mlp.down_proj": (16, 32),
}


def seven_b_shaped(path: Path, n_layer: int = 32) -> Path:
    """Llama-7B names and layout (32 layers x 7 matrices = 224 targeted tensors) at tiny widths.
    Layer i keeps every weight of its q_proj but zeroes the first i of 32 rows of gate_proj, so the
    sparsities differ along both axes and are known exactly."""
    g = torch.Generator().manual_seed(0)
    st = {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g),
        "model.norm.weight": torch.ones(16),
        "lm_head.weight": torch.randn(64, 16, generator=g),
    }
    for i in range(n_layer):
        for m, shape in MATRICES.items():
            w = torch.randn(*shape, generator=g) + 10.0  # no accidental zeros
            if m == "mlp.gate_proj":
                w[:i] = 0.0
            st[f"model.layers.{i}.{m}.weight"] = w
        st[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(16)
        st[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(16)
    save_file(st, str(path), metadata={"format": "pt"})
    return path


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def legend_labels(fig) -> list[str]:
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(
        fig.legends
    )
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def test_32_layer_model_draws_a_readable_heatmap(tmp_path, figures):
    rep = summarize(seven_b_shaped(tmp_path / "l32.safetensors"))
    assert sum(t.targeted for t in rep.tensors) == 224 > BARS_UP_TO
    out = plot_report(rep, tmp_path / "t.png", all_tensors=False).path
    w, h = png_size(out)
    assert w > h and h < 800 and w <= 18 * 120  # not a 1080 x 5018 strip of labels
    ax = figures[-1].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "Q",
        "K",
        "V",
        "attention out",
        "FFN in",
        "FFN out",
    ]
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(32)]
    cells, outside = layer_cells([t for t in rep.tensors if t.targeted])
    assert outside == (0, 0, 0)
    for i in (0, 5, 31):  # gate (32 rows, i of them zero) pools with up (none zero): i of 64 rows
        assert cells[(i, "ffn_in")] == pytest.approx(100 * i / 64)
        assert cells[(i, "Q")] == 0.0
    # --all adds the norms as a row and names what lies outside the layers
    plot_report(rep, tmp_path / "a.png")
    ax = figures[-1].axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "norms"
    assert "3 tensors outside the layers" in ax.get_title()


def test_2_layer_model_keeps_the_bar_chart_and_honours_all(tmp_path, figures):
    path = tmp_path / "g2.safetensors"
    save_file(gpt2_like_state(n_layer=2), str(path))
    rep = summarize(path)
    targeted = plot_report(rep, tmp_path / "t.png", all_tensors=False).path
    every = plot_report(rep, tmp_path / "a.png", all_tensors=True).path
    assert (
        len(figures[0].axes[0].patches) == 8
        and len(figures[1].axes[0].patches) == len(rep.tensors) == 28
    )
    assert png_size(every)[1] > png_size(targeted)[1]
    assert legend_labels(figures[0]) == ["qkv", "attn_out", "ffn_in", "ffn_out", DENSE]
    assert legend_labels(figures[1]) == [
        "qkv",
        "attn_out",
        "ffn_in",
        "ffn_out",
        "bias, embedding, norm, position",
        ZERO_INPUT,
        DENSE,
    ]


def test_dense_tensors_get_a_marker_and_zero_biases_their_own_hatched_bar(tmp_path, figures):
    """A 0% tensor is marked (not a missing bar); an untargeted all-zero tensor (the LayerNorm
    biases here) is drawn apart with its own legend entry, not as a bias pruning zeroed."""
    path, pruned = tmp_path / "g2.safetensors", tmp_path / "p.safetensors"
    save_file(gpt2_like_state(n_layer=2), str(path))
    res = run("prune", str(path), "-o", str(pruned), "--sparsity", "0.5", "-q")
    assert res.exit_code == 0, res.output
    rep = summarize(pruned)
    plot_report(rep, tmp_path / "a.png")
    ax = figures[-1].axes[0]
    bars = ax.patches
    assert len(bars) == 28
    zero = [t.name for t in rep.tensors if t.nonzero == 0]
    assert sorted(zero) == sorted(
        f"transformer.h.{i}.ln_{j}.bias" for i in (0, 1) for j in (1, 2)
    ) + ["transformer.ln_f.bias"]
    hatched = [t.name for t, b in zip(rep.tensors, bars) if b.get_hatch()]
    assert hatched == [t.name for t in rep.tensors if t.nonzero == 0]
    dense = [t for t in rep.tensors if t.nonzero == t.numel]
    markers = [c for c in ax.collections if c.get_gid() == "dense-markers"]
    assert len(markers) == 1 and len(markers[0].get_offsets()) == len(dense) == 28 - 8 - 5
    assert sum(t.get_text() == "0%" for t in ax.texts) == len(dense)
    assert legend_labels(figures[-1])[-2:] == [ZERO_INPUT, DENSE]
    # past the bar chart: the untargeted rows of the heatmap are hatched, with their legend entry
    save_file(gpt2_like_state(n_layer=12), str(path))
    rep = summarize(path)
    plot_report(rep, tmp_path / "h.png")
    fig = figures[-1]
    rows = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert rows[-2:] == ["norms", "biases"]
    assert sum(p.get_gid() == "hatched" for p in fig.axes[0].patches) == 2 * 12
    assert legend_labels(fig) == [UNTOUCHED]


def test_legend_names_only_the_roles_drawn(tmp_path, figures):
    path = tmp_path / "bias.safetensors"
    save_file(
        {"h.0.attn.c_attn.bias": torch.zeros(6), "h.0.mlp.c_fc.bias": torch.ones(8)}, str(path)
    )
    plot_report(summarize(path), tmp_path / "b.png")
    assert legend_labels(figures[-1]) == ["bias", ZERO_INPUT, DENSE]  # the grey bar has its entry


def test_empty_checkpoint_plot_says_so(tmp_path, figures):
    path = tmp_path / "empty.safetensors"
    save_file({}, str(path))
    res = run("report", str(path), "--plot", str(tmp_path / "e.png"))
    assert res.exit_code == 0, res.output
    assert "no tensor to draw" in res.stdout and png_size(tmp_path / "e.png")
    fig = figures[-1]
    assert not fig.axes and not legend_labels(fig)
    assert any("no tensors" in t.get_text() for t in fig.texts)
    # --targeted on a file with no targeted tensor: the same, and it says how to see the rest
    path = tmp_path / "head.safetensors"
    save_file({"lm_head.weight": torch.ones(4, 4)}, str(path))
    res = run("report", str(path), "--targeted", "--plot", str(tmp_path / "h.png"))
    assert res.exit_code == 0 and any("--all" in t.get_text() for t in figures[-1].texts)


def test_report_and_diff_draw_through_one_heatmap(tmp_path, monkeypatch):
    calls = []

    def record(values, out, **kw):
        calls.append((dict(values), kw["colour_label"]))
        return Path(out)

    monkeypatch.setattr(plots, "layer_heatmap", record)
    a = seven_b_shaped(tmp_path / "a.safetensors", n_layer=8)
    plot_report(summarize(a), tmp_path / "r.png", all_tensors=False)
    plot_diff(diff(a, a), tmp_path / "d.png")
    assert [label for _, label in calls] == ["sparsity (% zeros)", "angular distance 1 - cos(A, B)"]
    assert set(calls[0][0]) == set(calls[1][0])  # the same (layer, matrix) cells


def test_cli_plot_follows_the_table_flag(tmp_path):
    path = seven_b_shaped(tmp_path / "l32.safetensors")
    for flag in ("--all", "--targeted"):
        png = tmp_path / f"{flag[2:]}.png"
        res = run("report", str(path), flag, "--plot", str(png), "-q")
        assert res.exit_code == 0, res.output
    assert (
        png_size(tmp_path / "all.png")[1] > png_size(tmp_path / "targeted.png")[1]
    )  # one more row: norms
    assert not list(tmp_path.glob(".*sparsetool-tmp-*"))  # no temporary left behind
