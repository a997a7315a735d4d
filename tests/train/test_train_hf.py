"""sparsetool train --init HF_DIR: fine-tuning tiny random GPT-2 and Llama models saved with
save_pretrained, with a tokenizer trained here (nothing is downloaded). Loss goes down, static
masks hold, --dense revives, RigL keeps the exact count, --resume is bit-identical, and the
output directory loads in transformers and in sparsetool eval."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from sparsetool.ops.load import load
from sparsetool.targets import plan_targets

from helpers import hf_model, make_text, save_tokenizer  # noqa: E402
from helpers import run as cli  # noqa: E402

os.environ["HF_HUB_OFFLINE"] = "1"

FAST = [
    "--steps",
    "20",
    "--batch-size",
    "8",
    "--context",
    "32",
    "--warmup",
    "2",
    "--lr",
    "3e-3",
    "--eval-every",
    "10",
    "--seed",
    "0",
]


def run(*args: str) -> dict:
    r = cli(*args)
    assert r.exit_code == 0, r.output
    return r


def train_json(*args) -> dict:
    r = run("train", *FAST, *args, "--json")  # a flag given again in args wins
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    text = make_text(600)
    (root / "data.txt").write_text(text)
    for kind in ("gpt2", "llama"):
        torch.manual_seed(0)
        hf_model(kind).save_pretrained(root / kind)
        save_tokenizer(root / kind, text)
    return root


def targeted(weights: dict[str, torch.Tensor]) -> list[str]:
    return list(plan_targets([(n, tuple(t.shape), t.dtype) for n, t in weights.items()]).targeted)


def losses(run_dir: Path, kind: str = "train") -> list[float]:
    key = "loss" if kind == "train" else "val_loss"
    return [
        r[key]
        for r in map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
        if r["kind"] == kind
    ]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_loss_goes_down_and_the_output_is_a_hugging_face_directory(root, kind, tmp_path):
    out = tmp_path / "run"
    summary = train_json(
        "-o", out, "--init", root / kind, "--data", root / "data.txt", "--steps", "30"
    )
    train = losses(out)
    assert len(train) == 30
    # random weights start near ln(320) = 5.77 nats; 30 steps on a small text learn a lot of it
    assert sum(train[:3]) / 3 > sum(train[-3:]) / 3 + 1.0
    val = losses(out, "eval")
    assert val[-1] < val[0] and summary["val_loss"] == pytest.approx(val[-1])
    assert summary["huggingface"] and summary["checkpoint"] == str(out / "model")
    names = {p.name for p in (out / "model").iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    # transformers loads it as the fine-tuned model: its own loss agrees with the run's weights
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "model").eval()
    weights = load(out / "model")
    for name, p in model.state_dict().items():
        if name in weights:
            assert torch.equal(p, weights[name]), name
    tok = transformers.AutoTokenizer.from_pretrained(out / "model")
    ids = torch.tensor(
        [tok((root / "data.txt").read_text()[:400], add_special_tokens=False)["input_ids"][:32]]
    )
    with torch.no_grad():
        trained = float(model(ids, labels=ids).loss)
        start = float(
            transformers.AutoModelForCausalLM.from_pretrained(root / kind)(ids, labels=ids).loss
        )
    assert trained < start - 1.0


@pytest.mark.parametrize("kind,encoding", [("gpt2", "bitmask"), ("llama", "zeros")])
def test_static_masks_of_a_pruned_directory_hold(root, kind, encoding, tmp_path):
    pruned = tmp_path / "pruned"
    run("prune", root / kind, "-o", pruned, "--sparsity", "0.5", "--encoding", encoding)
    out = tmp_path / "run"
    summary = train_json("-o", out, "--init", pruned, "--data", root / "data.txt")
    assert summary["sparsity"] == pytest.approx(0.5)
    # the start of the run says where the mask came from (not "random initial mask")
    origin = json.loads((out / "run.json").read_text())["sparse_training"]["1"]["initial_mask"]
    assert origin.startswith(f"from --init {pruned} (its ") and origin.endswith("), kept")
    before, after = load(pruned), load(out / "model")
    names = targeted(before)
    assert names
    for name in names:
        zero = before[name] == 0
        assert 0.45 < float(zero.float().mean()) < 0.55
        assert bool((after[name][zero] == 0).all()), name  # pruned weights stay at zero
        assert not torch.equal(after[name][~zero], before[name][~zero]), name  # the rest trained
    # the default zeros encoding loads in transformers with its zeros intact
    model = transformers.AutoModelForCausalLM.from_pretrained(out / "model")
    own = model.state_dict()
    for name in names:
        assert torch.equal(own[name] == 0, before[name] == 0), name
    r = run(
        "eval", pruned, out / "model", "--text", root / "data.txt", "--max-tokens", "2000", "--json"
    )
    rows = json.loads(r.stdout)["checkpoints"]
    assert rows[0]["targeted_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert rows[1]["targeted_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert rows[1]["nll"] < rows[0]["nll"]  # fine-tuning on this text lowers its loss


def test_dense_revives_pruned_weights(root, tmp_path):
    pruned = tmp_path / "pruned"
    run("prune", root / "llama", "-o", pruned, "--sparsity", "0.5", "--encoding", "mask")
    out = tmp_path / "run"
    summary = train_json("-o", out, "--init", pruned, "--data", root / "data.txt", "--dense")
    assert summary["sparsity"] == 0.0
    before, after = load(pruned), load(out / "model")
    revived = 0
    for name in targeted(before):
        zero = before[name] == 0
        revived += int((after[name][zero] != 0).sum())
    total = sum(int((before[n] == 0).sum()) for n in targeted(before))
    assert revived > 0.9 * total  # SPDF: every pruned weight trains, from 0


def test_rigl_keeps_the_exact_count_while_masks_move(root, tmp_path):
    cfg = tmp_path / "keep.yaml"
    cfg.write_text("keep_last: 0\n")  # keep every checkpoint
    out = tmp_path / "run"
    train_json(
        "-o",
        out,
        "--init",
        root / "gpt2",
        "--data",
        root / "data.txt",
        "--algorithm",
        "rigl",
        "--sparsity",
        "0.7",
        "--update-freq",
        "4",
        "--save-every",
        "4",
        "--config",
        cfg,
        "--encoding",
        "mask",
    )
    from sparsetool.masks.distributions import keep_counts
    from sparsetool.train.runfiles import read_init_checkpoint

    steps = sorted((out / "checkpoints").iterdir())
    assert len(steps) == 5
    masks = [read_init_checkpoint(s / "model.safetensors")[1] for s in steps]
    weights = load(out / "model")
    expect = keep_counts({n: tuple(weights[n].shape) for n in targeted(weights)}, 0.7, "uniform")
    assert set(masks[0]) == set(expect)
    for m in masks:
        assert {n: int(v.sum()) for n, v in m.items()} == {n: int(k) for n, k in expect.items()}
    for name, k in expect.items():
        assert int((weights[name] != 0).sum()) <= int(k)
    moved = sum(int((masks[0][n] != masks[-1][n]).sum()) for n in expect)
    assert moved > 0  # drop-and-grow happened on the Hugging Face names
    # --encoding mask: RUN/model stores each final mask beside its weight
    raw = load_file(str(out / "model" / "model.safetensors"))
    for name in expect:
        assert torch.equal(raw[name + "_mask"], masks[-1][name]), name


def test_resume_is_bit_identical(root, tmp_path):
    common = (
        "--init",
        root / "llama",
        "--data",
        root / "data.txt",
        "--algorithm",
        "rigl",
        "--sparsity",
        "0.5",
        "--update-freq",
        "3",
        "--save-every",
        "6",
    )
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    train_json("-o", whole, *common)
    first = train_json("-o", parts, *common, "--stop-at", "9")
    assert not first["finished"]
    r = run("train", "-o", parts, "--resume", "--json")
    assert json.loads(r.stdout)["finished"]
    a = load_file(str(whole / "model" / "model.safetensors"))
    b = load_file(str(parts / "model" / "model.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert losses(whole) == losses(parts)


def test_bad_input_is_one_error_line(root, tmp_path):
    # a shape flag, a longer context, --encoding without a model directory: usage errors (exit 2)
    r = cli(
        "train", "-o", str(tmp_path / "a"), "--init", str(root / "gpt2"), "--n-layer", "4", *FAST
    )
    assert r.exit_code == 2 and "--n-layer cannot change a Hugging Face model" in r.output
    r = cli(
        "train", "-o", str(tmp_path / "a"), "--init", str(root / "gpt2"), "--preset", "tiny", *FAST
    )
    assert r.exit_code == 2 and r.stderr == (
        "error: --preset cannot change a Hugging Face model; its "
        f"shape comes from {root / 'gpt2' / 'config.json'}\n"
    )
    r = cli(
        "train",
        "-o",
        str(tmp_path / "b"),
        "--init",
        str(root / "gpt2"),
        "--data",
        str(root / "data.txt"),
        "--context",
        "100",
        *FAST[:2],
    )
    assert r.exit_code == 2 and "--context 100 is longer than the 64 positions" in r.output
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bare / f).write_bytes((root / "gpt2" / f).read_bytes())
    r = cli("train", "-o", str(tmp_path / "c"), "--init", str(bare), *FAST)
    assert r.exit_code == 1 and "no usable tokenizer" in r.output
    assert not (tmp_path / "c").exists()
    r = cli(
        "train",
        "-o",
        str(tmp_path / "e"),
        "--init",
        str(root / "gpt2" / "model.safetensors"),
        *FAST,
    )
    assert r.exit_code == 1 and "give the directory" in r.output
    r = cli("train", "-o", str(tmp_path / "d"), "--preset", "tiny", "--encoding", "bitmask", *FAST)
    assert (
        r.exit_code == 2 and "--encoding bitmask applies to the Hugging Face directory" in r.output
    )


@pytest.mark.parametrize("encoding", ["bitmask", "nan", "zeros"])
def test_an_encoding_transformers_cannot_load_is_warned_of(root, tmp_path, encoding):
    """As `prune --encoding bitmask` does: RUN/model in bitmask (or nan) is read by sparsetool,
    not by transformers' from_pretrained; the run says so before it starts (issue 31, item 5)."""
    out = tmp_path / "run"
    r = cli(
        "train",
        "-o",
        str(out),
        "--init",
        str(root / "gpt2"),
        "--data",
        str(root / "data.txt"),
        "--sparsity",
        "0.5",
        "--encoding",
        encoding,
        *FAST,
        "--steps",
        "3",
        "--json",
    )
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    if encoding == "zeros":
        assert warnings == []
        return
    said = "cannot load the bitmask encoding" if encoding == "bitmask" else "loads the nan encoding"
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: transformers' from_pretrained {said}"
    ), r.stderr
    assert warnings[0].endswith(
        f"For transformers run `sparsetool densify {out / 'model'} -o DENSE_DIR`, "
        "or train with --encoding zeros or mask"
    )
    assert json.loads(r.stdout)["finished"]


def test_a_mixture_of_experts_keeps_each_experts_mask_and_trains_its_router(root, tmp_path):
    """Mixtral, one tensor per expert on disk, fine-tuned with static masks: each expert's
    matrix keeps its zeros and its count; the router (never pruned) trains like a dense weight."""
    from moe_models import EXPERTS, save_moe

    src = save_moe("mixtral", tmp_path / "mixtral", (root / "data.txt").read_text())
    pruned = tmp_path / "pruned"
    run("prune", src, "-o", pruned, "--sparsity", "0.6")
    out = tmp_path / "run"
    summary = train_json("-o", out, "--init", pruned, "--data", root / "data.txt")
    assert summary["sparsity"] == pytest.approx(0.6, abs=1e-3)
    before = transformers.AutoModelForCausalLM.from_pretrained(pruned).state_dict()
    after = transformers.AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    for i in range(2):
        for part in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{i}.mlp.experts.{part}"
            for e in range(EXPERTS):
                zero = before[name][e] == 0
                for half in zero.chunk(2 if part == "gate_up_proj" else 1):  # w1; w3 | w2
                    assert int(half.sum()) == round(0.6 * half.numel()), (name, e)
                assert torch.equal(after[name][e] == 0, zero), (name, e)
            assert not torch.equal(after[name], before[name])  # the kept weights trained
        router = f"model.layers.{i}.mlp.gate.weight"
        assert bool((before[router] != 0).all()) and not torch.equal(after[router], before[router])


@pytest.mark.parametrize(
    "algorithm", [["gmp"], ["rigl"], ["imp"], ["granet", "--sparsity-option", "scope=layer"]]
)
def test_moving_masks_keep_each_experts_count(root, tmp_path, algorithm):
    """A mixture of experts' merged experts: each expert's matrix is a unit of its own when
    masks move, exactly as in prune (counts per expert, not per merged tensor)."""
    from moe_models import EXPERTS, save_moe

    src = save_moe("mixtral", tmp_path / "mixtral", (root / "data.txt").read_text())
    out = tmp_path / "run"
    summary = train_json(
        "-o",
        out,
        "--init",
        src,
        "--data",
        root / "data.txt",
        "--algorithm",
        *algorithm,
        "--sparsity",
        "0.75",
        "--update-freq",
        "4",
    )
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "mask_update" for r in log)
    reached = summary["sparsity"] == pytest.approx(0.75, abs=1e-3)
    assert reached or algorithm == ["imp"]  # IMP's rounds go on past 20 steps
    after = transformers.AutoModelForCausalLM.from_pretrained(out / "model").state_dict()
    for i in range(2):
        for part in ("gate_up_proj", "down_proj"):
            w = after[f"model.layers.{i}.mlp.experts.{part}"]
            kept = [int((w[e] != 0).sum()) for e in range(EXPERTS)]
            assert len(set(kept)) == 1, (i, part, kept)  # every expert pruned as a unit alike
            assert kept[0] == w[0].numel() // 4 or not reached, (i, part, kept)
            assert kept[0] < 0.5 * w[0].numel()


def test_the_routers_balancing_loss_is_trained_when_the_config_asks_for_it():
    """A mixture of experts whose config sets ``output_router_logits`` trains on the next-token
    loss plus ``router_aux_loss_coef`` times its routers' load-balancing loss, as transformers
    trains it; the validation loss and a config without it are the next-token loss alone."""
    from moe_models import build

    from sparsetool.train import hfrun

    model = build("mixtral").train()
    model.config.output_router_logits, model.config.router_aux_loss_coef = True, 0.5
    torch.manual_seed(1)
    x, y = torch.randint(0, 320, (2, 16)), torch.randint(0, 320, (2, 16))
    _, trained = hfrun.forward(model, x, y)
    _, plain = hfrun.next_token_forward(model, x, y)
    aux = model(input_ids=x, use_cache=False).aux_loss.detach()
    assert float(aux) > 0
    assert float((trained - plain).detach()) == pytest.approx(0.5 * float(aux), rel=1e-5)
    (trained - plain).backward()  # the balancing term alone reaches the routers
    assert float(model.model.layers[0].mlp.gate.weight.grad.abs().sum()) > 0
    model.config.output_router_logits = False
    with torch.no_grad():
        assert float(hfrun.forward(model, x, y)[1]) == pytest.approx(float(plain), rel=1e-6)
