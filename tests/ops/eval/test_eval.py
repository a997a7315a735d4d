"""sparsetool eval: windows, agreement with transformers' own loss for every encoding, the built-in
GPT, bad input, the command. Small random models and a tokenizer trained here (nothing is
downloaded)."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from sparsetool.errors import SparsetoolError
from sparsetool.ops.eval import Window, evaluate, windows
from sparsetool.ops.prune import PruneOptions, prune_checkpoint

from helpers import hf_model, make_text, run, save_tokenizer, tiny_causal_lm

os.environ["HF_HUB_OFFLINE"] = "1"

import transformers  # noqa: E402  (after the offline switches above)

ENCODINGS = ("zeros", "mask", "nan", "bitmask")


# ----------------------------------------------------------------------------- windows
def test_windows_without_stride_do_not_overlap_and_skip_each_first_token():
    assert windows(9, 3) == [Window(0, 3, 1), Window(3, 6, 4), Window(6, 9, 7)]
    # a last window of one token predicts nothing and is left out; of two it scores one token
    assert windows(10, 3) == [Window(0, 3, 1), Window(3, 6, 4), Window(6, 9, 7)]
    assert windows(11, 3)[-1] == Window(9, 11, 10)
    assert windows(2, 8) == [Window(0, 2, 1)]


def test_windows_with_stride_score_tokens_after_the_previous_window():
    # seq 5, stride 2 over 9 tokens: windows [0,5) [2,7) [4,9); the later ones score 2 new tokens
    assert windows(9, 5, stride=2) == [Window(0, 5, 1), Window(2, 7, 5), Window(4, 9, 7)]
    assert [w.scored for w in windows(9, 5, stride=2)] == [4, 2, 2]
    # the last window is cut at the text's end and scores only what is left
    assert windows(8, 5, stride=2) == [Window(0, 5, 1), Window(2, 7, 5), Window(4, 8, 7)]


@pytest.mark.parametrize("n", [2, 3, 7, 16, 33])
@pytest.mark.parametrize("seq,stride", [(2, None), (4, None), (4, 1), (4, 3), (8, 5), (16, 16)])
def test_windows_score_every_token_but_the_first_once_with_a_stride(n, seq, stride):
    wins = windows(n, seq, stride)
    scored = [t for w in wins for t in range(w.first, w.end)]
    for w in wins:
        assert w.end - w.start <= seq and w.start < w.first
    if stride is not None and stride < seq:
        assert scored == list(range(1, n))
        # every scored token but those of the first window sees at least seq - stride tokens
        for w in wins[1:]:
            assert w.first - w.start >= min(seq - stride, w.first)
    else:
        assert scored == [t for t in range(1, n) if t % seq]


def test_windows_refuse_bad_sizes():
    with pytest.raises(SparsetoolError, match="--seq"):
        windows(10, 1)
    with pytest.raises(SparsetoolError, match="--stride"):
        windows(10, 4, stride=5)
    with pytest.raises(SparsetoolError, match="--stride"):
        windows(10, 4, stride=0)


# ----------------------------------------------------------------------------- Hugging Face


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["opt", "gpt_neox"])
def test_opt_and_neox_pruned_to_bitmask_match_transformers(kind, tmp_path, text):
    torch.manual_seed(0)
    src, zeros, bitmask = tmp_path / "src", tmp_path / "zeros", tmp_path / "bitmask"
    tiny_causal_lm(kind).eval().save_pretrained(src)
    save_tokenizer(src, text)
    prune_checkpoint(src, zeros, PruneOptions(sparsity=0.5, encoding="zeros"))
    prune_checkpoint(src, bitmask, PruneOptions(sparsity=0.5, encoding="bitmask"))
    dense, pruned = evaluate([src, bitmask], text=text, seq=48, stride=16, max_tokens=400).rows
    assert dense.nll == pytest.approx(reference_nll(src, text, 48, 16, 400), abs=1e-4)
    assert pruned.nll == pytest.approx(reference_nll(zeros, text, 48, 16, 400), abs=1e-4)


@pytest.fixture(scope="module")
def text() -> str:
    return make_text()


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def hf_dir(request, tmp_path_factory, text) -> Path:
    d = tmp_path_factory.mktemp(request.param) / "dense"
    torch.manual_seed(0)
    hf_model(request.param).eval().save_pretrained(d)
    save_tokenizer(d, text)
    return d


def reference_nll(
    directory: Path, text: str, seq: int, stride: int | None, max_tokens: int
) -> float:
    """transformers' own loss (model(ids, labels=ids)) on the same windows, token-weighted."""
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = transformers.AutoTokenizer.from_pretrained(directory)(text)["input_ids"][:max_tokens]
    ids = torch.tensor(ids)
    total, n = 0.0, 0
    with torch.no_grad():
        for w in windows(len(ids), seq, stride):
            x = ids[w.start : w.end][None]
            labels = x.clone()
            labels[:, : w.first - w.start] = -100  # context only: scored by an earlier window
            loss = model(x, labels=labels).loss
            total += float(loss) * w.scored
            n += w.scored
    return total / n


def test_dense_nll_equals_transformers_loss(hf_dir, text):
    for stride in (None, 12):
        row = evaluate([hf_dir], text=text, seq=32, stride=stride, max_tokens=600).rows[0]
        assert row.kind == "huggingface"
        assert row.nll == pytest.approx(reference_nll(hf_dir, text, 32, stride, 600), abs=1e-4)
        assert row.perplexity == pytest.approx(math.exp(row.nll))
        assert row.targeted_sparsity == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_pruned_nll_equals_transformers_loss_for_every_encoding(hf_dir, text, encoding, tmp_path):
    zeros = tmp_path / "zeros"  # the encoding transformers itself loads correctly
    prune_checkpoint(hf_dir, zeros, PruneOptions(sparsity=0.5, encoding="zeros"))
    out = tmp_path / encoding
    if encoding != "zeros":
        prune_checkpoint(hf_dir, out, PruneOptions(sparsity=0.5, encoding=encoding))
    else:
        out = zeros
    res = evaluate([hf_dir, out], text=text, seq=32, stride=20, max_tokens=500, batch=3)
    dense, pruned = res.rows
    assert pruned.nll == pytest.approx(reference_nll(zeros, text, 32, 20, 500), abs=1e-4)
    assert pruned.targeted_sparsity == pytest.approx(0.5, abs=1e-3)
    assert pruned.nonzero_params < dense.nonzero_params and pruned.params == dense.params
    assert pruned.nll != pytest.approx(dense.nll, abs=1e-6)  # pruning really changed the model
    assert pruned.change == pytest.approx(pruned.perplexity / dense.perplexity - 1)


def test_bits_per_byte_counts_the_bytes_the_scored_tokens_cover(hf_dir, text):
    full = evaluate([hf_dir], text=text, seq=32).rows[0]
    assert full.bytes == len(text.encode("utf-8"))
    assert full.bits_per_byte == pytest.approx(full.nll * full.tokens / math.log(2) / full.bytes)
    part = evaluate([hf_dir], text=text, seq=32, max_tokens=100).rows[0]
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    covered = tok.decode(tok(text)["input_ids"][:100])
    assert text.startswith(covered) and part.bytes == len(covered.encode("utf-8"))


def test_bfloat16_is_close_to_float32(hf_dir, text):
    f32 = evaluate([hf_dir], text=text, seq=32, max_tokens=300).rows[0]
    bf16 = evaluate([hf_dir], text=text, seq=32, max_tokens=300, dtype="bfloat16").rows[0]
    assert bf16.nll == pytest.approx(f32.nll, rel=0.02)


def test_progress_counts_tokens_so_a_short_last_window_is_a_small_part(gpt2_dir, text):
    """Four windows of 32 tokens and a last one of 10: progress counts tokens through the
    model, each block and the head a share of a window's tokens, so the four full windows' end
    is 128 of 138 (93%). Counted in passes it was half, and the time left said there was the
    time the first half took, although only the short window remained."""
    seen: list[tuple[str, int, int]] = []
    row = evaluate(
        [gpt2_dir],
        text=text,
        seq=32,
        max_tokens=4 * 32 + 10,
        progress=lambda *report: seen.append(report),
    ).rows[0]
    assert row.tokens == 138 - 5  # every token but each window's first
    assert {(name, total) for name, _, total in seen} == {(str(gpt2_dir), 138)}
    done = [d for _, d, _ in seen]
    assert done[0] == 0  # when scoring starts: a log's pace is measured from there
    done = done[1:]
    assert done == sorted(done) and done[-1] == 138 and 4 * 32 in done
    assert len(done) == 2 * (2 + 1)  # two groups (the full windows, the short one) x 3 passes
    # two equal blocks move the count alike; the head its vocabulary x width's share
    assert 0 < done[0] < done[1] < 128 and abs(done[1] - 2 * done[0]) <= 1


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, text) -> Path:
    d = tmp_path_factory.mktemp("g2") / "gpt2"
    torch.manual_seed(0)
    hf_model("gpt2").save_pretrained(d)
    save_tokenizer(d, text)
    return d


def _copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.name not in skip:
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_missing_tokenizer_is_one_clear_error(gpt2_dir, tmp_path):
    d = _copy(gpt2_dir, tmp_path / "notok", skip=("tokenizer.json", "tokenizer_config.json"))
    with pytest.raises(SparsetoolError, match="no usable tokenizer.*tokenizer files"):
        evaluate([d], text="some text here")


def test_text_shorter_than_two_tokens_is_refused(gpt2_dir):
    with pytest.raises(SparsetoolError, match="at least two tokens"):
        evaluate([gpt2_dir], text="a")


def test_encoder_model_is_not_a_causal_lm(tmp_path, text):
    t = transformers
    d = tmp_path / "bert"
    t.BertForMaskedLM(
        t.BertConfig(
            num_hidden_layers=1,
            hidden_size=32,
            intermediate_size=64,
            num_attention_heads=4,
            vocab_size=320,
        )
    ).save_pretrained(d)
    save_tokenizer(d, text)
    with pytest.raises(SparsetoolError, match="not a causal language model"):
        evaluate([d], text=text)


def test_shape_mismatch_with_config_is_one_clear_error(gpt2_dir, tmp_path):
    d = _copy(gpt2_dir, tmp_path / "bad")
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = 64
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SparsetoolError, match="shape .* config.json"):
        evaluate([d], text="some text")


def test_seq_longer_than_the_context_is_refused(gpt2_dir):
    with pytest.raises(SparsetoolError, match="at most 64 tokens"):
        evaluate([gpt2_dir], text=make_text(20), seq=65)


def test_without_transformers_the_error_names_the_extra(gpt2_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(SparsetoolError, match=r"pip install -e '\.\[hf\]'.*sparsetool\[hf\]"):
        evaluate([gpt2_dir], text="some text")


# ----------------------------------------------------------------------------- built-in GPT
@pytest.fixture(scope="module")
def gpt_run(tmp_path_factory) -> Path:
    from helpers import make_corpus

    root = tmp_path_factory.mktemp("gpt")
    data = make_corpus(root / "corpus")
    r = run(
        "train",
        "--out",
        str(root / "run"),
        "--data",
        str(data),
        "--preset",
        "tiny",
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--warmup",
        "2",
        "--seed",
        "0",
        "--sparsity",
        "0.5",
        "--algorithm",
        "static",
        "--json",
    )
    assert r.exit_code == 0, r.output
    return root / "run"


def test_builtin_gpt_nll_equals_its_own_loss(gpt_run, text):
    from sparsetool.models.gpt import GPT, infer_config
    from sparsetool.train.runfiles import read_init_checkpoint

    row = evaluate([gpt_run], text=text, stride=40).rows[0]
    weights, _, meta = read_init_checkpoint(gpt_run)
    model = GPT(
        infer_config({k: tuple(v.shape) for k, v in weights.items()}, meta["model"]["n_head"])
    )
    model.load_state_dict(weights)
    model.eval()
    ids = torch.tensor(list(text.encode()))
    total = 0.0
    with torch.no_grad():
        for w in windows(len(ids), 64, 40):
            x = ids[w.start : w.end]
            lo = w.first - w.start
            logits, _ = model(x[None, :-1])
            total += float(
                torch.nn.functional.cross_entropy(logits[0, lo - 1 :], x[lo:], reduction="sum")
            )
    n = len(ids) - 1
    assert row.kind == "sparsetool-gpt" and row.tokens == n and row.seq == 64
    assert row.nll == pytest.approx(total / n, abs=1e-5)
    assert row.bits_per_byte == pytest.approx(total / math.log(2) / len(ids))
    assert row.targeted_sparsity == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_builtin_gpt_pruned_with_any_encoding_scores_alike(gpt_run, text, encoding, tmp_path):
    out = tmp_path / f"{encoding}.safetensors"
    prune_checkpoint(
        gpt_run / "model.safetensors", out, PruneOptions(sparsity=0.75, encoding=encoding)
    )
    rows = evaluate([gpt_run, out], text=text, max_tokens=2000).rows
    ref = tmp_path / "ref.safetensors"
    prune_checkpoint(
        gpt_run / "model.safetensors", ref, PruneOptions(sparsity=0.75, encoding="mask")
    )
    assert rows[1].nll == pytest.approx(
        evaluate([ref], text=text, max_tokens=2000).rows[0].nll, abs=1e-6
    )
    assert rows[1].targeted_sparsity == pytest.approx(0.75, abs=1e-3)
    assert rows[1].nll > rows[0].nll


def test_default_text_is_the_held_out_builtin_corpus(gpt_run):
    row = evaluate([gpt_run], max_tokens=500).rows[0]
    assert (
        row.tokens == sum(w.scored for w in windows(500, 64))
        and "held-out" in evaluate([gpt_run], max_tokens=100).text_source
    )


# ----------------------------------------------------------------------------- command
def test_cli_table_json_and_plot(gpt_run, gpt2_dir, tmp_path, text):
    f = tmp_path / "text.txt"
    f.write_text(text)
    png = tmp_path / "ppl.png"
    r = run(
        "eval",
        str(gpt_run),
        str(gpt2_dir),
        "--text",
        str(f),
        "--seq",
        "32",
        "--max-tokens",
        "400",
        "--plot",
        str(png),
    )
    assert r.exit_code == 0, r.output
    assert "perplexity" in r.stdout and "baseline" in r.stdout and "bits/byte" in r.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the speed beside the figures: tokens/s after the token count, a whole number in each row
    header, _, *rows = r.stdout.splitlines()[:4]
    assert header.split()[header.split().index("tokens") + 1] == "tokens/s"
    edge = header.index("tokens/s") + len("tokens/s")  # right-aligned: the cell ends there
    speeds = [row[:edge].split()[-1] for row in rows]
    assert all(int(s.replace(",", "")) > 0 for s in speeds), speeds
    r = run("eval", str(gpt_run), "--text", str(f), "--max-tokens", "400", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["text"] == str(f) and out["checkpoints"][0]["tokens"] > 0


def test_cli_bad_input_is_one_error_line(gpt2_dir, tmp_path):
    f = tmp_path / "one.txt"
    f.write_text("a")
    r = run("eval", str(gpt2_dir), "--text", str(f))
    assert r.exit_code == 1
    assert (
        r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1 and not r.stdout
    )
    r = run("eval", str(gpt2_dir), "--dtype", "float16")
    assert r.exit_code == 2


def test_cli_help_shows_choices_and_examples():
    r = run("eval", "--help")
    assert r.exit_code == 0
    # choices are listed as the option's metavar, as in every command's --help
    assert (
        "--dtype <float32|bfloat16>" in r.output
        and "sparsetool eval runs/dense runs/static75" in r.output
    )
