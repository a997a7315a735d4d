"""What eval says beside its figures: one warning about too few tokens, with the way out that fits
(issue 31, item 11)."""

from __future__ import annotations

from pathlib import Path

from helpers import make_text, run


def tokens_of(model: Path, text: Path) -> int:
    from sparsetool.models.open import open_model

    m = open_model(model)
    try:
        return len(m.encode(text.read_text()).ids)
    finally:
        m.close()


def warnings_of(r) -> list[str]:
    assert r.exit_code == 0, r.output
    return [line for line in r.stderr.splitlines() if line.startswith("warning:")]


def two_checkpoints(dense: Path, tmp_path: Path) -> tuple[Path, Path]:
    pruned = tmp_path / "pruned"
    r = run("prune", dense, "-o", pruned, "--sparsity", "0.5")
    assert r.exit_code == 0, r.output
    return dense, pruned


def test_a_short_text_is_warned_about_once_and_told_to_be_longer(hf_dir, tmp_path):
    dense, pruned = two_checkpoints(hf_dir, tmp_path)
    short = tmp_path / "short.txt"
    short.write_text(make_text(3))
    n = tokens_of(dense, short)
    warned = warnings_of(run("eval", dense, pruned, "--text", short, "-q"))
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"warning: {dense}, {pruned}: perplexity from ")
    assert warned[0].endswith(f"(a longer --text: this one is {n:,} tokens)"), warned[0]
    assert "--max-tokens" not in warned[0]


def test_max_tokens_that_cut_a_long_text_are_the_way_out(hf_dir, tmp_path):
    dense, pruned = two_checkpoints(hf_dir, tmp_path)
    long = tmp_path / "long.txt"
    long.write_text(make_text(8000))
    warned = warnings_of(run("eval", dense, pruned, "--text", long, "--max-tokens", "40", "-q"))
    assert len(warned) == 1, warned
    need = int(warned[0].split("score at least ")[1].split(" tokens")[0].replace(",", ""))
    assert 40 < need < tokens_of(dense, long)
    assert warned[0].endswith(f"(--max-tokens {need:,} or more, or drop --max-tokens)"), warned[0]


def test_max_tokens_that_cut_a_text_still_too_short(hf_dir, tmp_path):
    dense, _ = two_checkpoints(hf_dir, tmp_path)
    text = tmp_path / "text.txt"
    text.write_text(make_text(3))
    n = tokens_of(dense, text)
    warned = warnings_of(run("eval", dense, "--text", text, "--max-tokens", n // 2, "-q"))
    assert len(warned) == 1, warned
    assert warned[0].endswith(
        f"(drop --max-tokens and give a longer --text: this one is {n:,} tokens)"
    ), warned[0]


def test_no_warning_when_the_text_is_long_enough(tiny_run, tmp_path):
    long = tmp_path / "long.txt"  # the built-in GPT barely trained: its losses hardly spread
    long.write_text(make_text(400))
    assert warnings_of(run("eval", tiny_run, "--text", long, "-q")) == []
