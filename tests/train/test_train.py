"""sparsetool train: seeded golden losses, exact resume, --init/--dense, Variable SPDF, outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sparsetool.train.configkeys import merge
from sparsetool.train.loop import Trainer, train
from sparsetool.train.trainconfig import TrainConfig

from helpers import run as cli

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def base_args(out: Path, data: Path, steps: int = 6) -> list[str]:
    return [
        "train",
        "--out",
        str(out),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        str(steps),
        "--batch-size",
        "4",
        "--warmup",
        "2",
        "--eval-every",
        "3",
        "--seed",
        "0",
        "--json",
    ]


def run_cli(args: list[str]) -> dict:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def losses(run: Path) -> list[float]:
    return [
        r["loss"]
        for r in map(json.loads, (run / "log.jsonl").read_text().splitlines())
        if r["kind"] == "train"
    ]


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


# Computed once with this code (torch 2.13.0 CPU, float32) and pasted: a change to the model,
# the initialisation, the data pipeline, the optimizer or the LR schedule moves them by >1e-3.
GOLDEN_DENSE = [5.524334, 5.488505, 5.430586, 5.359784, 5.315885, 5.231977]
GOLDEN_STATIC_75 = [5.524521, 5.511089, 5.485589, 5.458849, 5.447479, 5.393375]


def test_seeded_dense_run_matches_stored_losses(tmp_path, corpus):
    summary = run_cli(base_args(tmp_path / "run", corpus))
    assert summary["step"] == 6 and summary["finished"]
    assert losses(tmp_path / "run") == pytest.approx(GOLDEN_DENSE, abs=2e-4)


def test_seeded_static_run_matches_stored_losses(tmp_path, corpus):
    run_cli(base_args(tmp_path / "run", corpus) + ["--algorithm", "static", "--sparsity", "0.75"])
    got = losses(tmp_path / "run")
    assert got == pytest.approx(GOLDEN_STATIC_75, abs=2e-4)
    assert got != pytest.approx(GOLDEN_DENSE, abs=2e-4)  # sparsity really changed the model


def test_checkpoint_is_mask_encoded_and_masked_weights_are_positive_zero(tmp_path, corpus):
    run_cli(
        base_args(tmp_path / "run", corpus)
        + ["--algorithm", "rigl", "--sparsity", "0.75", "--update-freq", "2", "--update-stop", "5"]
    )
    path = tmp_path / "run" / "model.safetensors"
    t = load_file(path)
    with safe_open(path, "pt") as f:
        meta = json.loads(f.metadata()["sparsetool"])
    assert meta["encoding"] == "mask" and meta["model"]["n_head"] == 2 and meta["step"] == 6
    targeted = [
        n
        for n in t
        if n.endswith(("qkv.weight", "attn.proj.weight", "fc.weight", "mlp.proj.weight"))
    ]
    assert len(targeted) == 8
    for n in targeted:
        m = t[n + "_mask"]
        assert m.dtype == torch.bool and m.shape == t[n].shape
        assert abs(1 - m.float().mean().item() - 0.75) < 0.01
        pruned = t[n][~m]
        assert torch.all(pruned == 0) and not torch.any(torch.signbit(pruned))  # +0.0, never -0.0
    assert not any(n.endswith("_mask") for n in t if n[:-5] not in targeted and n.endswith("_mask"))
    assert "head.weight" in t and "tok_emb.weight" in t  # untied head: both names stored


def test_resume_equals_uninterrupted_run(tmp_path, corpus):
    args = [
        "--algorithm",
        "rigl",
        "--sparsity",
        "0.8",
        "--update-freq",
        "2",
        "--update-stop",
        "7",
        "--grad-accum",
        "2",
    ]
    full = tmp_path / "full"
    run_cli(base_args(full, corpus, steps=8) + args)
    part = tmp_path / "part"
    first = run_cli(base_args(part, corpus, steps=8) + args + ["--stop-at", "4"])
    assert first["step"] == 4 and not first["finished"]
    state = json.loads((part / "checkpoints" / "step-000004" / "state.json").read_text())
    assert state["step"] == 4 and state["data_position"] == 4 * 4 * 2
    run_cli(["train", "--out", str(part), "--resume", "--json"])
    strip = [
        {k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")}
        for r in records(full)
    ]
    assert [
        {k: v for k, v in r.items() if k not in ("tokens_per_s", "elapsed_s")}
        for r in records(part)
    ] == strip
    a, b = load_file(full / "model.safetensors"), load_file(part / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_changed_option(tmp_path, corpus):
    run_cli(base_args(tmp_path / "run", corpus) + ["--stop-at", "2"])
    result = cli("train", "--out", str(tmp_path / "run"), "--resume", "--lr", "0.5")
    assert result.exit_code == 1 and "--lr" in result.stderr


def test_init_from_mask_checkpoint_keeps_masks(tmp_path, corpus):
    run_cli(base_args(tmp_path / "pre", corpus) + ["--algorithm", "static", "--sparsity", "0.75"])
    pre = load_file(tmp_path / "pre" / "model.safetensors")
    summary = run_cli(
        base_args(tmp_path / "ft", corpus, steps=3)
        + ["--init", str(tmp_path / "pre" / "model.safetensors")]
    )
    assert summary["sparsity"] == pytest.approx(0.75, abs=1e-3)
    ft = load_file(tmp_path / "ft" / "model.safetensors")
    masks = [n for n in pre if n.endswith("_mask")]
    assert masks
    for n in masks:
        assert torch.equal(ft[n], pre[n])
        w = ft[n[: -len("_mask")]]
        assert torch.all(w[~ft[n]] == 0)
        assert not torch.equal(w, pre[n[: -len("_mask")]])  # it trained


@pytest.mark.parametrize("encoding", ["mask", "zeros", "nan", "bitmask"])
def test_init_accepts_a_checkpoint_pruned_by_sparsetool_prune(tmp_path, corpus, encoding):
    run_cli(base_args(tmp_path / "dense", corpus))
    pruned = tmp_path / "pruned.safetensors"
    result = cli(
        "prune",
        str(tmp_path / "dense" / "model.safetensors"),
        "-o",
        str(pruned),
        "--sparsity",
        "0.5",
        "--encoding",
        encoding,
    )
    assert result.exit_code == 0, result.output
    kept = {}
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.encodings import decode

    with open_checkpoint(pruned) as ck:
        for lt in ck.logical:
            dense, mask = decode(ck, lt)
            if lt.name.endswith(("qkv.weight", "attn.proj.weight", "fc.weight", "mlp.proj.weight")):
                kept[lt.name] = mask if mask is not None else dense != 0
    assert len(kept) == 8
    summary = run_cli(base_args(tmp_path / "ft", corpus, steps=2) + ["--init", str(pruned)])
    assert summary["sparsity"] == pytest.approx(0.5, abs=1e-3)
    ft = load_file(tmp_path / "ft" / "model.safetensors")
    for n, m in kept.items():
        assert torch.equal(ft[n + "_mask"], m)


def test_dense_init_revives_pruned_weights_at_zero(tmp_path, corpus):
    run_cli(base_args(tmp_path / "pre", corpus) + ["--algorithm", "static", "--sparsity", "0.75"])
    pre = load_file(tmp_path / "pre" / "model.safetensors")
    cfg = merge(
        {},
        {
            "out": str(tmp_path / "ft"),
            "data": str(corpus),
            "preset": "tiny",
            "steps": 2,
            "batch_size": 4,
            "warmup": 1,
            "init": str(tmp_path / "pre" / "model.safetensors"),
            "dense": True,
        },
    )
    trainer = Trainer(cfg)
    name = "blocks.0.mlp.fc.weight"
    mask = pre[name + "_mask"]
    w0 = dict(trainer.model.named_parameters())[name].detach().clone()
    assert torch.all(w0[~mask] == 0) and torch.equal(w0[mask], pre[name][mask])  # revived at 0
    summary = trainer.run()
    assert summary["sparsity"] == 0.0
    ft = load_file(tmp_path / "ft" / "model.safetensors")
    assert not any(n.endswith("_mask") for n in ft)  # a dense checkpoint
    assert (ft[name][~mask] != 0).float().mean() > 0.9  # the revived weights learn


def test_variable_spdf_stages_switch_from_sparse_to_dense(tmp_path, corpus):
    run_cli(
        base_args(tmp_path / "run", corpus, steps=8) + ["--stage", "0.9:0.5", "--stage", "0:0.5"]
    )
    recs = records(tmp_path / "run")
    sp = {r["step"]: r["sparsity"] for r in recs if r["kind"] == "train"}
    assert all(abs(sp[s] - 0.9) < 1e-3 for s in range(1, 5))
    assert all(sp[s] == 0.0 for s in range(5, 9))
    assert [r["step"] for r in recs if r["kind"] == "stage"] == [4]
    final = load_file(tmp_path / "run" / "model.safetensors")
    assert not any(n.endswith("_mask") for n in final)


def test_stage_switch_is_resumable_at_the_boundary(tmp_path, corpus):
    args = ["--stage", "0.9:0.5", "--stage", "0:0.5"]
    run_cli(base_args(tmp_path / "full", corpus, steps=6) + args)
    run_cli(base_args(tmp_path / "part", corpus, steps=6) + args + ["--stop-at", "3"])
    run_cli(["train", "--out", str(tmp_path / "part"), "--resume", "--json"])
    assert losses(tmp_path / "part") == losses(tmp_path / "full")


def test_log_csv_and_png_are_written(tmp_path, corpus):
    run_cli(base_args(tmp_path / "run", corpus, steps=4))
    run = tmp_path / "run"
    rows = (run / "log.csv").read_text().splitlines()
    assert rows[0].startswith("step,loss,val_loss,lr,sparsity,tokens_per_s")
    assert len(rows) == 5
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    kinds = {r["kind"] for r in records(run)}
    assert kinds == {"train", "eval"}
    assert json.loads((run / "run.json").read_text())["config"]["steps"] == 4


def test_human_output_has_summary(tmp_path, corpus):
    args = [a for a in base_args(tmp_path / "run", corpus, steps=2) if a != "--json"]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert "validation loss" in result.stdout and "tokens/s" in result.stdout


# Usage errors (exit 2; before the one-vocabulary change these exited 1, and --sparsity refused
# 1.0 in train only: now 0 <= S <= 1 everywhere).
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--stage", "0.9:0.5"], "add up to 1"),
        (["--dense"], "--dense needs --init"),
        (["--algorithm", "nope"], "'nope' is not one of"),
        (["--sparsity", "1.5"], "--sparsity must be a number from 0 to 1"),
        (["--preset", "huge"], "'huge' is not one of"),
    ],
)
def test_bad_options_fail_cleanly_without_output(tmp_path, corpus, extra, message):
    out = tmp_path / "run"
    result = cli(*base_args(out, corpus), *extra)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stdout == "" and not out.exists()


def test_existing_run_directory_is_not_overwritten(tmp_path, corpus):
    run_cli(base_args(tmp_path / "run", corpus, steps=2))
    before = (tmp_path / "run" / "model.safetensors").read_bytes()
    result = cli(*base_args(tmp_path / "run", corpus, steps=2))
    assert result.exit_code == 1 and "--resume" in result.stderr
    assert (tmp_path / "run" / "model.safetensors").read_bytes() == before


def test_config_file_with_model_zoo_sparsity_block(tmp_path, corpus):
    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text(
        "preset: tiny\nsteps: 4\nbatch-size: 4\nwarmup: 1\n"
        f"data: {corpus}\n"
        "sparsity:\n  algorithm: rigl\n  sparsity: 0.6\n  init_method: random\n"
        "  update: {freq: 2, start: 2, stop: 3}\n  drop_fraction: 0.25\n"
        "  param_filter: ['*mlp*']\n"
    )
    summary = run_cli(
        [
            "train",
            "--config",
            str(cfg_file),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "3",
            "--json",
        ]
    )
    assert summary["steps"] == 3  # the flag overrides the file
    stored = json.loads((tmp_path / "run" / "run.json").read_text())["config"]
    assert stored["algorithm"] == "rigl" and stored["sparsity"] == 0.6
    assert stored["update_freq"] == 2 and stored["drop_fraction"] == 0.25
    masks = [n for n in load_file(tmp_path / "run" / "model.safetensors") if n.endswith("_mask")]
    assert masks and all(".mlp." in n for n in masks)  # only what param_filter selected


def test_toml_config_file(tmp_path, corpus):
    cfg_file = tmp_path / "run.toml"
    cfg_file.write_text(
        f'preset = "tiny"\nsteps = 2\nbatch_size = 4\ndata = "{corpus}"\n'
        'stages = ["0.5:0.5", "0:0.5"]\n'
    )
    run_cli(["train", "--config", str(cfg_file), "--out", str(tmp_path / "run"), "--json"])
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["stages"] == [
        [0.5, 0.5],
        [0.0, 0.5],
    ]


def test_library_call_returns_summary(tmp_path, corpus):
    cfg = merge(
        {},
        {
            "out": str(tmp_path / "run"),
            "data": str(corpus),
            "preset": "tiny",
            "steps": 2,
            "batch_size": 2,
            "warmup": 1,
        },
    )
    seen = []
    summary = train(cfg, callback=lambda kind, info: seen.append(kind))
    assert seen[0] == "start" and seen[-1] == "end" and seen.count("step") == 2
    assert summary["tokens"] == 2 * 2 * 64
    assert isinstance(TrainConfig().to_dict()["stages"], list)


def test_interrupt_names_the_checkpoint_and_resume_still_matches(tmp_path, corpus):
    from sparsetool.errors import SparsetoolError

    opts = {
        "data": str(corpus),
        "preset": "tiny",
        "steps": 6,
        "batch_size": 4,
        "warmup": 2,
        "save_every": 2,
    }
    full = train(merge({}, {"out": str(tmp_path / "full"), **opts}))

    def interrupt(kind, info):
        if kind == "step" and info["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(
        SparsetoolError, match=r"interrupted during step 3; .*step-000002.*--resume"
    ):
        train(merge({}, {"out": str(tmp_path / "part"), **opts}), callback=interrupt)
    resumed = train(TrainConfig(out=str(tmp_path / "part")), resume=True)
    assert resumed["loss"] == full["loss"] and resumed["val_loss"] == full["val_loss"]
    assert losses(tmp_path / "part") == losses(tmp_path / "full")


def test_init_refuses_a_shape_flag_that_disagrees(tmp_path, corpus):
    run_cli(base_args(tmp_path / "pre", corpus, steps=1))
    result = cli(
        *base_args(tmp_path / "ft", corpus),
        "--init",
        str(tmp_path / "pre" / "model.safetensors"),
        "--d-model",
        "64",
    )
    assert result.exit_code == 1 and "--d-model 64 disagrees" in result.stderr
    assert not (tmp_path / "ft").exists()


def test_missing_out_is_a_usage_error():
    result = cli("train", "--steps", "2")
    assert result.exit_code == 2 and "--out" in result.output


def test_model_zoo_block_spellings_map_to_options(tmp_path):
    from sparsetool.train.configkeys import read_config_file

    f = tmp_path / "c.yaml"
    f.write_text(
        "sparsity:\n  type: gmp\n  init_sparsity: 0.0\n"
        "  sparsity: {type: cubic, init: 0.0, end: 0.8}\n"
        "  schedule: {freq: 10, start: 5, stop: 50}\n  param_name_patterns: '*fc*'\n"
    )
    got = read_config_file(f)
    assert got["algorithm"] == "gmp" and got["initial_sparsity"] == 0.0
    assert got["sparsity"] == {"type": "cubic", "init": 0.0, "end": 0.8}  # a schedule, passed on
    assert (got["update_freq"], got["update_start"], got["update_stop"]) == (10, 5, 50)
    assert got["param_filter"] == ["*fc*"]
    f.write_text("sparsity: 0.5\nmodel: {preset: tiny}\nbogus: 1\n")
    with pytest.raises(Exception, match="unknown key 'bogus'"):
        read_config_file(f)


def test_resume_does_not_need_the_init_checkpoint_any_more(tmp_path, corpus):
    run_cli(
        base_args(tmp_path / "pre", corpus, steps=2)
        + ["--algorithm", "static", "--sparsity", "0.5"]
    )
    init = tmp_path / "pre" / "model.safetensors"
    full = run_cli(base_args(tmp_path / "full", corpus, steps=4) + ["--init", str(init)])
    run_cli(base_args(tmp_path / "part", corpus, steps=4) + ["--init", str(init), "--stop-at", "2"])
    init.rename(tmp_path / "moved.safetensors")
    resumed = run_cli(["train", "--out", str(tmp_path / "part"), "--resume", "--json"])
    assert resumed["loss"] == full["loss"] and resumed["sparsity"] == full["sparsity"]


def test_init_from_a_pruned_file_keeps_the_model_shape(tmp_path, corpus):
    """prune keeps train's metadata under "history"; --init must still find the head count."""
    run_cli(base_args(tmp_path / "pre", corpus, steps=2))
    pruned = tmp_path / "pruned.safetensors"
    result = cli(
        "prune", str(tmp_path / "pre" / "model.safetensors"), "-o", str(pruned), "--sparsity", "0.8"
    )
    assert result.exit_code == 0, result.output
    # no --preset: every shape setting must come from the checkpoint
    run_cli(
        [
            "train",
            "--out",
            str(tmp_path / "ft"),
            "--data",
            str(corpus),
            "--steps",
            "2",
            "--batch-size",
            "4",
            "--warmup",
            "1",
            "--json",
            "--init",
            str(pruned),
        ]
    )
    pre = json.loads((tmp_path / "pre" / "config.json").read_text())
    ft = json.loads((tmp_path / "ft" / "config.json").read_text())
    for key in ("n_layer", "n_head", "d_model", "context"):
        assert ft[key] == pre[key], key


def test_a_run_stopped_before_its_first_checkpoint_can_start_again(tmp_path, corpus):
    from sparsetool.errors import SparsetoolError

    opts = {
        "data": str(corpus),
        "preset": "tiny",
        "steps": 4,
        "batch_size": 4,
        "warmup": 1,
        "save_every": 100,
    }

    def interrupt(kind, info):
        if kind == "step" and info["step"] == 1:
            raise KeyboardInterrupt

    with pytest.raises(SparsetoolError, match="no checkpoint had been written"):
        train(merge({}, {"out": str(tmp_path / "run"), **opts}), callback=interrupt)
    assert (tmp_path / "run" / "run.json").exists()
    summary = train(merge({}, {"out": str(tmp_path / "run"), **opts}))
    assert summary["finished"] and summary["step"] == 4
    with pytest.raises(SparsetoolError, match="already holds a run"):
        train(merge({}, {"out": str(tmp_path / "run"), **opts}))
