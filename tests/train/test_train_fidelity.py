"""Sparse-training fidelity: default mask-update windows, mask-update log events, resolved
settings in run.json, GraNet's global pruning and regrowth to the end, visible defaults."""

from __future__ import annotations

import csv
import json
import random
import re
from pathlib import Path

import pytest
import torch

from sparsetool.cli.main import app
from sparsetool.masks.global_magnitude import global_magnitude_masks
from sparsetool.train.algorithms import build_sparsifier
from sparsetool.train.schedules import Periodic

from helpers import run as cli

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

SHAPES = {
    "blocks.0.mlp.fc.weight": (32, 16),
    "blocks.0.mlp.proj.weight": (16, 32),
    "blocks.1.mlp.fc.weight": (48, 16),
    "blocks.1.mlp.proj.weight": (16, 48),
}


def params(seed: int = 0, spread: bool = False) -> dict[str, torch.nn.Parameter]:
    """Sparse-target-shaped weights; with ``spread`` each tensor has its own scale, so a global
    magnitude threshold prunes them to different sparsities."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for i, (name, shape) in enumerate(SHAPES.items()):
        scale = (i + 1.0) if spread else 1.0
        out[name] = torch.nn.Parameter(torch.randn(shape, generator=gen) * scale)
    return out


def fake_step(ps: dict, sp, step: int, gen: torch.Generator) -> None:
    """A gradient and a small update, with the sparsifier's hooks around the optimizer step."""
    for p in ps.values():
        p.grad = torch.randn(p.shape, generator=gen)
    sp.before_step(step)
    with torch.no_grad():
        for p in ps.values():
            p -= 0.05 * p.grad
    sp.after_step(step)


# ---------------------------------------------------------------- default update windows


def test_default_interval_is_100_steps_and_first_update_follows_the_warmup():
    # Before: every 600 // 20 = 30 steps, the first at step 30, inside the 100-step warm-up.
    sp = build_sparsifier({"algorithm": "rigl", "sparsity": 0.75})
    sp.attach(params(), None, 600, warmup=100)
    assert sp.schedules.updates == Periodic(100, 100, 450)
    steps = [t for t in range(600) if sp.is_update_step(t)]
    assert steps == [100, 200, 300, 400]
    sp = build_sparsifier({"algorithm": "rigl", "sparsity": 0.75})
    sp.attach(params(), None, 1000, warmup=250)
    assert sp.schedules.updates == Periodic(100, 250, 750)


def test_set_updates_to_the_end_and_stop_fraction_keeps_rigls_stop():
    s = build_sparsifier({"algorithm": "set", "sparsity": 0.75})
    s.attach(params(), None, 600, warmup=100)
    assert s.schedules.updates == Periodic(100, 100, 600)
    s75 = build_sparsifier({"algorithm": "set", "sparsity": 0.75, "stop_fraction": 0.75})
    s75.attach(params(), None, 600, warmup=100)
    assert s75.schedules.updates == Periodic(100, 100, 450)


def test_resolved_settings_have_no_missing_defaults():
    sp = build_sparsifier({"algorithm": "rigl", "sparsity": 0.75})
    sp.attach(params(), None, 600, warmup=100)
    got = sp.resolved()
    assert got == {
        "algorithm": "rigl",
        "distribution": "uniform",
        "init_method": "random",
        "sparsity": 0.75,
        "update_freq": 100,
        "update_start": 100,
        "update_stop": 450,
        "drop_fraction": 0.3,
        "drop_decay": "cosine to 0 at step 450",
    }


# ---------------------------------------------------------------- mask-update events


def test_update_event_counts_drops_grows_and_survivors():
    ps = params()
    sp = build_sparsifier(
        {
            "algorithm": "rigl",
            "sparsity": 0.75,
            "drop_fraction": 0.4,
            "update": {"freq": 2, "start": 2, "stop": 9},
        }
    )
    sp.attach(ps, None, 10)
    gen = torch.Generator().manual_seed(1)
    events, grown_at = [], {}
    for step in range(10):
        before = {n: m.clone() for n, m in sp.masks.items()}
        fake_step(ps, sp, step, gen)
        if sp.is_update_step(step):
            ev = dict(sp.last_event)
            grown = {n: sp.masks[n] & ~before[n] for n in before}
            dropped = sum(int((before[n] & ~sp.masks[n]).sum()) for n in before)
            assert ev["dropped"] == dropped and ev["grown"] == sum(
                int(g.sum()) for g in grown.values()
            )
            assert ev["grown"] > 0 and ev["algorithm"] == "rigl"
            assert ev["drop_fraction"] == pytest.approx(sp.drop_fraction_at(step), abs=1e-6)
            if grown_at:
                kept = sum(int((g & sp.masks[n]).sum()) for n, g in grown_at.items())
                total = sum(int(g.sum()) for g in grown_at.values())
                assert ev["grown_survived"] == pytest.approx(kept / total, abs=1e-6)
            else:
                assert ev["grown_survived"] is None
            grown_at = grown
            events.append(ev)
    assert len(events) == 4  # steps 2, 4, 6, 8


def test_survival_counts_carry_over_a_state_dict_round_trip():
    ps = params()
    config = {"algorithm": "set", "sparsity": 0.75, "update": {"freq": 2, "start": 2, "stop": 9}}
    sp = build_sparsifier(config)
    sp.attach(ps, None, 10)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        fake_step(ps, sp, step, gen)
    sp2 = build_sparsifier(config)
    sp2.load_state_dict(sp.state_dict())
    ps2 = {n: torch.nn.Parameter(p.detach().clone()) for n, p in ps.items()}
    sp2.attach(ps2, None, 10)
    state = gen.get_state()
    fake_step(ps, sp, 4, gen)
    gen.set_state(state)
    fake_step(ps2, sp2, 4, gen)
    assert sp2.last_event == sp.last_event and sp.last_event["grown_survived"] is not None


# ---------------------------------------------------------------- GraNet


def test_granet_prunes_with_one_global_magnitude_threshold():
    ps = params(spread=True)
    sp = build_sparsifier(
        {
            "algorithm": "granet",
            "sparsity": 0.8,
            "drop_fraction": 0.0,
            "update": {"freq": 2, "start": 2, "stop": 8},
        }
    )
    sp.attach(ps, None, 12)
    gen = torch.Generator().manual_seed(3)
    checked = 0
    for step in range(9):
        for p in ps.values():
            p.grad = torch.randn(p.shape, generator=gen)
        if sp.is_update_step(step):
            names = list(ps)
            before = [sp.masks[n].clone() for n in names]
            target = sum(sp.keep_counts(sp.sparsity_at(step)).values())
            expected = global_magnitude_masks(
                [ps[n].detach() for n in names], keep=target, existing=before
            )
            sp.before_step(step)
            assert all(torch.equal(sp.masks[n], e) for n, e in zip(names, expected))
            checked += 1
        else:
            sp.before_step(step)
        with torch.no_grad():
            for p in ps.values():
                p -= 0.01 * p.grad
        sp.after_step(step)
    assert checked == 4  # 2, 4, 6 and the ramp's end at 8
    layer = sp.layer_sparsity()
    assert sp.sparsity() == pytest.approx(0.8, abs=1e-3)
    # the smallest-scale tensor loses most: not each tensor at 80%, as per-layer pruning gives
    assert max(layer.values()) - min(layer.values()) > 0.3


def test_granet_layer_scope_prunes_each_tensor_to_its_own_count():
    ps = params(spread=True)
    sp = build_sparsifier(
        {
            "algorithm": "granet",
            "sparsity": 0.8,
            "scope": "layer",
            "update": {"freq": 2, "start": 2, "stop": 8},
        }
    )
    sp.attach(ps, None, 12)
    gen = torch.Generator().manual_seed(3)
    for step in range(9):
        fake_step(ps, sp, step, gen)
    assert all(s == pytest.approx(0.8, abs=0.01) for s in sp.layer_sparsity().values())


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_granet_keeps_regrowing_after_the_ramp(scope):
    ps = params()
    sp = build_sparsifier(
        {
            "algorithm": "granet",
            "sparsity": 0.8,
            "scope": scope,
            "update": {"freq": 2, "start": 2, "stop": 8},
        }
    )
    sp.attach(ps, None, 16)
    gen = torch.Generator().manual_seed(3)
    late = []
    for step in range(16):
        fake_step(ps, sp, step, gen)
        if step > 8 and sp.is_update_step(step):
            late.append((step, sp.last_event["grown"], sp.last_event["drop_fraction"]))
    assert [s for s, _, _ in late] == [10, 12, 14]
    assert all(g > 0 and 0 < f < 0.3 for _, g, f in late)
    assert sp.drop_fraction_at(15) < sp.drop_fraction_at(10)  # decays over the whole run
    assert sp.sparsity() == pytest.approx(0.8, abs=1e-3)


def test_granet_refuses_an_unknown_scope():
    from sparsetool.errors import ConfigError

    with pytest.raises(ConfigError, match="scope 'tensor' is not known; valid: global, layer"):
        build_sparsifier({"algorithm": "granet", "scope": "tensor"})


# ---------------------------------------------------------------- whole runs


def make_corpus(root: Path) -> Path:
    rng = random.Random(0)
    words = [
        "def",
        "class",
        "return",
        "import",
        "self",
        "value",
        "sparse",
        "dense",
        "mask",
        "weight",
        "layer",
    ]
    root.mkdir(parents=True)
    for f in range(8):
        lines = [" ".join(rng.choice(words) for _ in range(6)) for _ in range(60)]
        (root / f"m{f}.py").write_text("\n".join(lines) + "\n")
    return root


def train_args(out: Path, data: Path, steps: int, *extra: str) -> list[str]:
    return [
        "train",
        "-o",
        str(out),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        str(steps),
        "--batch-size",
        "2",
        "--warmup",
        "2",
        "--eval-every",
        "100",
        "--seed",
        "0",
        *extra,
    ]


def test_a_run_logs_every_mask_update_and_records_resolved_settings(tmp_path):
    data = make_corpus(tmp_path / "data")
    run = tmp_path / "run"
    result = cli(*train_args(run, data, 12, "--algorithm", "rigl", "--sparsity", "0.75", "--json"))
    assert result.exit_code == 0, result.output
    recs = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    events = [r for r in recs if r["kind"] == "mask_update"]
    # 12 steps: interval 12 // 4 = 3, after the 2-step warm-up, until 75% (step 9)
    assert [e["step"] for e in events] == [4, 7]  # 0-based update steps 3 and 6, logged 1-based
    assert set(events[0]) == {
        "kind",
        "step",
        "algorithm",
        "dropped",
        "grown",
        "drop_fraction",
        "grown_survived",
        "sparsity",
    }
    assert events[0]["grown_survived"] is None and 0 <= events[1]["grown_survived"] <= 1
    assert all(e["dropped"] == e["grown"] > 0 for e in events)
    with (run / "log.csv").open() as fh:
        rows = {int(r["step"]): r for r in csv.DictReader(fh)}
    assert int(rows[4]["mask_grown"]) == events[0]["grown"] and rows[5]["mask_grown"] == ""
    assert float(rows[7]["grown_survived"]) == events[1]["grown_survived"]
    saved = json.loads((run / "run.json").read_text())["sparse_training"]["1"]
    assert {
        k: saved[k] for k in ("update_freq", "update_start", "update_stop", "drop_fraction")
    } == {"update_freq": 3, "update_start": 3, "update_stop": 9, "drop_fraction": 0.3}
    assert None not in saved.values()


def test_the_start_of_a_run_prints_the_resolved_settings(tmp_path):
    data = make_corpus(tmp_path / "data")
    result = cli(
        *train_args(tmp_path / "run", data, 8, "--algorithm", "granet", "--sparsity", "0.5")
    )
    assert result.exit_code == 0, result.output
    assert (
        "sparse training: granet, sparsity 0% -> 50% (uniform, global pruning), random initial mask"
        in result.stdout
    )
    assert (
        "mask updates: every 2 steps from step 2 until step 6, then drop-and-grow until step 8; "
        "drop fraction 0.3, cosine to 0 at step 8" in result.stdout
    )


def test_stage_numbers_agree_between_log_console_and_plot(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    data = make_corpus(tmp_path / "data")
    run = tmp_path / "rigl"
    result = cli(
        *train_args(run, data, 8, "--algorithm", "rigl", "--stage", "0.75:0.5", "--stage", "0:0.5")
    )
    assert result.exit_code == 0, result.output
    stage = [
        json.loads(line)
        for line in (run / "log.jsonl").read_text().splitlines()
        if '"stage"' in line
    ]
    assert [r["stage"] for r in stage] == [2]
    assert "step 4: stage 2, sparsity now 0.0%" in result.stdout
    ax = figures[-1].axes[0]
    assert [t.get_text() for t in ax.texts] == ["stage 2: 0% sparse"]
    assert ax.get_title().startswith("stages 0.75:0.5 -> 0:0.5, ")
    assert ax.get_title().endswith(", 8 steps (run rigl)")


def test_title_names_the_algorithm_once_with_its_sparsity():
    from sparsetool.train.runstate import title
    from sparsetool.train.trainconfig import TrainConfig

    got = title(
        TrainConfig(algorithm="rigl", sparsity=0.75, steps=600), Path("runs/rigl"), 4, 128, True
    )
    assert got == "rigl, sparsity 75%, 4L d128, 600 steps (run rigl)"


def test_every_train_option_states_its_default_or_that_it_is_required():
    import typer.main

    command = typer.main.get_command(app).get_command(None, "train")  # loads lazily
    missing = []
    for param in command.params:
        if param.hidden or getattr(param, "is_flag", False) or param.name == "help":
            continue
        text = param.help or ""
        if not re.search(r"\bdefault\b|\brequired\b", text, re.IGNORECASE):
            missing.append(param.opts[-1])
    assert missing == []
    out = re.sub(r"\s+", " ", cli("train", "--help").stdout)
    assert "required (unless the --config file gives 'out')" in out
    assert "rigl updates at steps 100, 200, 300 and 400" in out


def test_a_resumed_run_logs_the_same_mask_updates(tmp_path):
    data = make_corpus(tmp_path / "data")
    sparse = ("--algorithm", "set", "--sparsity", "0.75", "--update-freq", "2", "--json")
    for name, extra in (("full", ()), ("part", ("--stop-at", "5"))):
        result = cli(*train_args(tmp_path / name, data, 12, *sparse, *extra))
        assert result.exit_code == 0, result.output
    result = cli("train", "-o", str(tmp_path / "part"), "--resume", "--json")
    assert result.exit_code == 0, result.output

    def events(run):
        return [
            json.loads(line)
            for line in (run / "log.jsonl").read_text().splitlines()
            if '"mask_update"' in line
        ]

    full = events(tmp_path / "full")
    assert [e["step"] for e in full] == [3, 5, 7, 9, 11]  # set updates until the end
    assert events(tmp_path / "part") == full and full[-1]["grown_survived"] is not None
    saved = json.loads((tmp_path / "part" / "run.json").read_text())["sparse_training"]
    assert saved["1"]["update_stop"] == 12
