"""train --distributed fsdp: two CPU processes (gloo) under torchrun, parameters, gradients, AdamW
moments and masks sharded by FSDP2. Every algorithm gives the run of one process with the same
global batch (losses, weights, identical masks) after 20 steps with mask updates; a stopped run
resumes bit for bit on two processes and on one; a Hugging Face model's RUN/model/ loads in
transformers with its sparsity. One torchrun launch runs every job (tests/train/fsdp_runs.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sparsetool.errors import ConfigError
from sparsetool.train.loop import train
from sparsetool.train.memplan import fine_tuning_plan
from sparsetool.train.trainconfig import TrainConfig, validate

from helpers import hf_model, make_corpus, make_text, run, save_tokenizer

COMMON = dict(preset="tiny", steps=20, warmup=2, eval_every=10, save_every=10, lr=3e-3, seed=0)
SPARSE = dict(sparsity=0.75, update_freq=5, update_stop=16)
ALGORITHMS = {  # job name -> its settings beyond COMMON
    "static": dict(algorithm="static", sparsity=0.75),
    "gmp": dict(algorithm="gmp", **SPARSE),
    "set": dict(algorithm="set", **SPARSE),
    "rigl": dict(algorithm="rigl", **SPARSE),
    "granet": dict(algorithm="granet", initial_sparsity=0.5, **SPARSE),
    "imp": dict(algorithm="imp", sparsity=0.75, sparsity_options={"rounds": 2}),
    "spdf": dict(dense=True),  # init: the pre-trained sparse checkpoint, set below
    "vspdf": dict(stages=[(0.75, 0.5), (0.0, 0.5)], init_method="magnitude"),
}
HF = dict(
    steps=12,
    warmup=2,
    eval_every=6,
    save_every=6,
    lr=3e-3,
    seed=0,
    context=32,
    algorithm="rigl",
    sparsity=0.5,
    update_freq=4,
    update_stop=10,
)
PER_RANK, WORLD = 2, 2


def _env() -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"  # two ranks on a small machine: no oversubscription
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _log(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """Every FSDP job on two processes, and what it is compared with on one process."""
    root = tmp_path_factory.mktemp("fsdp")
    data = str(make_corpus(root / "corpus"))
    # the sparse checkpoint SPDF densifies: a short static run on one process
    train(
        validate(
            TrainConfig(
                out=str(root / "pre"),
                data=data,
                algorithm="static",
                sparsity=0.75,
                **{**COMMON, "steps": 4, "eval_every": 4},
            )
        )
    )
    init = str(root / "pre" / "model.safetensors")
    text = make_text(600)
    (root / "text.txt").write_text(text)
    torch.manual_seed(0)
    hf_model("llama").save_pretrained(root / "llama")
    save_tokenizer(root / "llama", text)

    def job(name: str, world: int, **kw) -> dict:
        settings = {**COMMON, "data": data, **ALGORITHMS.get(name, {}), **kw}
        if name == "spdf":
            settings["init"] = init
        return {
            **settings,
            "out": str(root / f"{name}-{world}"),
            "batch_size": PER_RANK * WORLD // world,
        }

    hf_job = {**HF, "data": str(root / "text.txt"), "init": str(root / "llama")}
    jobs = [dict(job(name, WORLD), distributed="fsdp") for name in ALGORITHMS]
    jobs += [
        dict(job("rigl", WORLD), distributed="fsdp", stop_at=7, out=str(root / f"stop-{x}"))
        for x in ("a", "b", "c")
    ]
    jobs += [{"out": str(root / "stop-a"), "resume": True}]
    jobs += [
        dict(
            job("static", WORLD),
            distributed="fsdp",
            dtype="bfloat16",
            steps=6,
            eval_every=6,
            save_every=0,
            out=str(root / "bf16"),
        )
    ]
    jobs += [{**hf_job, "distributed": "fsdp", "batch_size": PER_RANK, "out": str(root / "hf-2")}]
    spec = root / "jobs.json"
    spec.write_text(json.dumps(jobs))
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(WORLD),
            str(Path(__file__).with_name("fsdp_runs.py")),
            str(spec),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert launched.returncode == 0, launched.stderr[-4000:]
    summaries = json.loads(Path(str(spec) + ".out").read_text())
    for name in ALGORITHMS:  # the same global batch on one process
        train(validate(TrainConfig.from_dict(job(name, 1))))
    train(
        validate(
            TrainConfig.from_dict(
                {**hf_job, "batch_size": PER_RANK * WORLD, "out": str(root / "hf-1")}
            )
        )
    )
    return {"root": root, "summaries": summaries}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_each_algorithm_equals_one_process(runs, name):
    root, summary = runs["root"], runs["summaries"][str(runs["root"] / f"{name}-2")]
    assert summary["world_size"] == 2 and summary["finished"]
    dense_at_end = name in ("spdf", "vspdf")  # no masks left to compare across ranks
    assert summary["masks_identical_across_ranks"] is (None if dense_at_end else True)
    assert summary["mask_updates_that_diverged"] == 0
    two, one = _log(root / f"{name}-2"), _log(root / f"{name}-1")
    assert [r["kind"] for r in two] == [r["kind"] for r in one]
    if name not in ("static", "spdf"):
        assert any(r["kind"] in ("mask_update", "stage") for r in two), "no mask update or stage"
    for a, b in zip(two, one):
        for key in ("loss", "val_loss", "sparsity"):
            if key in a:  # the log rounds to 6 decimals: 1e-6 apart, plus half a unit each
                assert abs(a[key] - b[key]) <= 2e-6, (key, a, b)
    ta = load_file(root / f"{name}-2" / "model.safetensors")
    tb = load_file(root / f"{name}-1" / "model.safetensors")
    assert sorted(ta) == sorted(tb)
    for n in ta:
        if n.endswith("_mask"):
            assert torch.equal(ta[n], tb[n]), f"{name}: mask {n} differs from one process's"
        else:  # AdamW divides by sqrt(v): a gradient near 0 (a weight revived at 0) magnifies
            # the rounding of the two reductions' different sums, still far below any update
            assert (ta[n] - tb[n]).abs().max() <= 1e-5, (name, n)
    masks = [n for n in ta if n.endswith("_mask")]
    assert bool(masks) == (not dense_at_end)
    shards = root / f"{name}-2" / "checkpoints" / "step-000020" / "shards"
    files = [p.name for p in shards.iterdir()]  # a metadata file and one file per process
    assert ".metadata" in files and len(files) == 3


@pytest.mark.slow
def test_a_stopped_run_resumes_bit_for_bit_on_two_processes_and_closely_on_one(runs):
    root = runs["root"]
    whole = load_file(root / "rigl-2" / "model.safetensors")
    resumed = load_file(root / "stop-a" / "model.safetensors")
    assert all(torch.equal(whole[n], resumed[n]) for n in whole)
    assert [r["loss"] for r in _log(root / "stop-a") if r["kind"] == "train"] == [
        r["loss"] for r in _log(root / "rigl-2") if r["kind"] == "train"
    ]
    # the same run continued on one process: the global batch kept by --batch-size 4
    summary = train(
        validate(TrainConfig(out=str(root / "stop-b"))),
        resume=True,
        flag_overrides={"batch_size": 4},
    )
    assert summary["step"] == 20 and summary["world_size"] == 1
    one = load_file(root / "stop-b" / "model.safetensors")
    for n in whole:
        if n.endswith("_mask"):
            assert torch.equal(whole[n], one[n]), n
        else:
            assert (whole[n] - one[n]).abs().max() <= 1e-6, n


@pytest.mark.slow
def test_a_resume_with_another_global_batch_or_a_damaged_checkpoint_is_refused(runs, tmp_path):
    stopped = tmp_path / "stopped"
    shutil.copytree(runs["root"] / "stop-c", stopped)  # a stopped run no other test resumes
    with pytest.raises(ConfigError, match="global batch of 4 sequences, now 2"):
        train(
            validate(TrainConfig(out=str(stopped))), resume=True, flag_overrides={"batch_size": 2}
        )
    assert not torch.distributed.is_initialized()  # the refused run left no process group
    saved = stopped / "checkpoints" / "step-000007" / "sparsifier.json"
    saved.write_text(saved.read_text()[:40])
    r = run("train", "-o", str(stopped), "--resume", "--batch-size", "4")
    assert r.exit_code == 1
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]  # one line
    assert r.stderr.startswith(f"error: {saved} cannot be read")
    assert "earlier checkpoint" in r.stderr


@pytest.mark.slow
def test_bf16_parameters_train_close_to_float32(runs):
    root = runs["root"]
    bf16 = [r["loss"] for r in _log(root / "bf16") if r["kind"] == "train"]
    fp32 = [r["loss"] for r in _log(root / "static-2") if r["kind"] == "train"][:6]
    assert len(bf16) == 6 and bf16 != fp32  # computed in bf16 ...
    assert all(abs(a - b) < 0.03 * b for a, b in zip(bf16, fp32))  # ... to within 3%
    weights = load_file(root / "bf16" / "model.safetensors")  # kept and saved in float32
    assert {t.dtype for n, t in weights.items() if not n.endswith("_mask")} == {torch.float32}


@pytest.mark.slow
def test_a_hugging_face_model_is_written_whole_and_loads_in_transformers(runs):
    import transformers

    root = runs["root"]
    model = transformers.AutoModelForCausalLM.from_pretrained(root / "hf-2" / "model")
    ref = transformers.AutoModelForCausalLM.from_pretrained(root / "hf-1" / "model")
    weights, expected = dict(model.named_parameters()), dict(ref.named_parameters())
    targeted = [n for n in weights if n.endswith("proj.weight")]
    assert len(targeted) == 14  # 7 matrices in each of 2 layers
    for n in targeted:
        assert float((weights[n] == 0).float().mean()) == pytest.approx(0.5, abs=0.01), n
        assert torch.equal(weights[n] == 0, expected[n] == 0), n
    for n in weights:
        assert (weights[n] - expected[n]).abs().max() <= 1e-5, n


def test_offload_and_the_strategy_are_checked_as_usage(tmp_path):
    r = run("train", "-o", str(tmp_path / "a"), "--offload", "--steps", "1")
    assert r.exit_code == 2 and "--offload" in r.output and "--distributed fsdp" in r.output
    r = run(
        "train", "-o", str(tmp_path / "b"), "--offload", "--distributed", "fsdp", "--device", "cpu"
    )
    assert r.exit_code == 2 and "--device cuda" in r.output
    r = run("train", "-o", str(tmp_path / "c"), "--distributed", "zero3")
    assert r.exit_code == 2 and "fsdp" in r.output


def test_a_model_that_cannot_fit_is_refused_with_the_plan(tmp_path):
    r = run(
        "train",
        "-o",
        str(tmp_path / "big"),
        "--distributed",
        "fsdp",
        "--preset",
        "base",
        "--d-model",
        "8192",
        "--n-layer",
        "48",
        "--n-head",
        "64",
        "--steps",
        "1",
    )
    assert r.exit_code == 1
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("error: train needs about") and "gradients and Adam moments" in line
    assert "--nproc_per_node" in line and not (tmp_path / "big" / "checkpoints").exists()


# docs/train.md's per-process arithmetic (bf16, batch 1, every parameter targeted), written out
# here rather than taken from train/memplan.py: P parameters, L blocks, width h, heads a, vocabulary
# V, context s, N processes.
def _activations(L, h, a, V, s):
    return L * (34 * s * h + 5 * a * s * s) + 12 * s * V  # Korthikanti eq. 1 (16-bit), logits


def _per_process(P, L, h, a, V, s, N):
    if N == 1:  # one process: weights 4P + the checkpoint while copied in 4P, 16P, masks P
        return 4 * P + 4 * P + 16 * P + P + _activations(L, h, a, V, s)
    # fsdp: 4P/N + two gathered blocks (2 x P/L x 2 bytes), 16P/N, masks P/N + 13P/3L
    return (
        4 * P / N + 4 * P / L + 16 * P / N + P / N + 13 * P / (3 * L) + _activations(L, h, a, V, s)
    )


def _fewest(P, L, h, a, V, s, gib):
    fits = [
        N for N in (1, 2, 4, 8, 16, 32, 64, 128) if _per_process(P, L, h, a, V, s, N) <= gib * 2**30
    ]
    return str(fits[0]) if fits else "--"


def test_the_docs_table_of_gpus_follows_the_arithmetic_it_states():
    """docs/train.md's "fewest GPUs that fit" table, every cell from the formulas above. E.g. 7B
    (P 6.74e9, L 32, h 4096, a 32, V 32000) on 80 GiB (85.9e9 bytes) at context 2048: activations
    32 x (34 x 2048 x 4096 + 5 x 32 x 2048^2) + 12 x 2048 x 32000 = 31.4e9; N = 2: 21P/2 = 70.8e9
    + 4P/L 0.84e9 + 13P/3L 0.91e9 + 31.4e9 = 103.9e9 does not fit; N = 4: 35.4e9 + 0.84e9 +
    0.91e9 + 31.4e9 = 68.5e9 fits, so the cell is 4."""
    P, L, h, a, V = 6.74e9, 32, 4096, 32, 32000
    assert round(_activations(L, h, a, V, 2048) / 1e9, 1) == 31.4
    assert round(_per_process(P, L, h, a, V, 2048, 2) / 1e9, 1) == 103.9
    assert round(_per_process(P, L, h, a, V, 2048, 4) / 1e9, 1) == 68.5
    assert _per_process(P, L, h, a, V, 2048, 2) > 80 * 2**30 >= _per_process(P, L, h, a, V, 2048, 4)
    page = (Path(__file__).parents[2] / "docs" / "train.md").read_text()
    table = page.split("| model: parameters, blocks, width, heads, vocabulary |", 1)[1]
    header, rows = table.splitlines()[0], table.splitlines()[2:]
    columns = [
        (int(re.search(r"(\d+) GiB", c).group(1)), int(re.search(r"(\d+)$", c.strip()).group(1)))
        for c in header.strip(" |").split("|")
    ]
    assert columns == [(24, 512), (40, 512), (80, 512), (80, 2048)]
    rows = rows[: rows.index("")]
    assert len(rows) == 4
    for row in rows:
        model, *cells = [c.strip() for c in row.strip("|").split("|")]
        P, L, h, a, V = (float(x) for x in model.split(":")[1].split(","))
        expected = [_fewest(P, L, h, a, V, s, gib) for gib, s in columns]
        assert cells == expected, model


@pytest.mark.parametrize("N", [1, 4, 32])
def test_the_plan_counts_what_the_docs_state(N):
    """train/memplan.fine_tuning_plan, for 13B on N processes at context 2048, equals the formulas
    above (up to its whole-byte rounding)."""
    P, L, h, a, V = 13_000_000_000, 40, 5120, 40, 32000
    plan = fine_tuning_plan(
        P,
        batch=1,
        context=2048,
        d_model=h,
        n_layer=L,
        n_head=a,
        vocab=V,
        targeted=P,
        strategy="fsdp" if N > 1 else "ddp",
        world=N,
        bf16=True,
        device_memory=80 * 2**30,
    )
    assert plan.peak == pytest.approx(_per_process(P, L, h, a, V, 2048, N), abs=16)
