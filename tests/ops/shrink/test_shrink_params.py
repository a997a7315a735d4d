"""shrink --params F|N: the parameter count of every mix is exact (the models shrink makes have
it), the model written meets the budget within 1% and is the candidate of least measured loss,
its cuts the ones recorded; the search is said (plan, table), recorded in --json and the
provenance; bad requests are usage errors before any weight is read, and nothing is left beside
the output, also when a candidate fails."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as t
from safetensors import safe_open

from sparsetool.errors import SparsetoolError
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint
from sparsetool.ops.shrink.inputs import model_config
from sparsetool.ops.shrink.options import parse_params
from sparsetool.ops.shrink.sizes import TOLERANCE, Mix, SizeModel, mixes

from helpers import run, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)
CALIB = dict(samples=6, seq=32, multiple_of=4)


@pytest.fixture
def llama(tmp_path, text):
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    return tmp_path / "in"


def _size(path) -> SizeModel:
    config, cfg = model_config(path, "a model")
    return SizeModel.of(path, config, cfg)


@pytest.mark.parametrize(
    "mix",
    [Mix(ffn=40), Mix(blocks=1), Mix(heads=2), Mix(hidden=24), Mix(blocks=1, ffn=48, hidden=24)],
)
def test_the_size_model_counts_what_shrink_makes(llama, tmp_path, calib_file, mix):
    size = _size(llama)
    opts = ShrinkOptions(calibration=calib_file, **CALIB, **mix.options(size))
    result = shrink_checkpoint(llama, tmp_path / "out", opts)
    assert size.count(mix) == result.parameters_after
    assert size.count(Mix()) == size.total == result.parameters_before


def test_every_listed_mix_meets_the_budget_on_the_grid(llama):
    size = _size(llama)
    target = round(0.7 * size.total)
    found = mixes(size, target, 4, {"blocks", "ffn", "heads", "hidden"})
    assert len(found) >= 4 and len(set(found)) == len(found)
    for m in found:
        assert abs(size.count(m) - target) <= TOLERANCE * target
        assert all(w is None or w % 4 == 0 for w in (m.ffn, m.hidden))
    assert {k for m in found for k in m.kinds()} == {"blocks", "ffn", "heads", "hidden"}
    assert mixes(size, target, 4, {"ffn"}) == [m for m in found if m.kinds() == ["ffn"]]
    assert len(mixes(size, target, 1, {"blocks", "ffn", "heads", "hidden"})) > len(found)


def test_params_writes_the_measured_best_within_one_percent(llama, tmp_path, calib_file):
    opts = ShrinkOptions(params=0.7, candidates=2, calibration=calib_file, **CALIB)
    said = []
    result = shrink_checkpoint(llama, tmp_path / "out", opts, on_search=said.append)
    search = result.search
    assert said == [search] and search.dense_loss > 0 and search.windows >= 1
    total = result.parameters_before
    assert abs(result.parameters_after - 0.7 * total) <= 0.01 * 0.7 * total
    made = search.candidates
    roles = [c.role for c in made]
    assert roles[: len(search.kinds)] == [f"{k} alone" for k in search.kinds]
    assert 1 <= roles.count("mix") <= 2
    eligible = [c for c in made if c.eligible]
    best = min(eligible, key=lambda c: c.measured)
    assert search.chosen == best.label
    assert all((c.predicted is None) == (c.role != "mix") for c in made)  # the kinds: measured
    # the written model is that candidate: its parameters and its cuts
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert sum(p.numel() for p in out.parameters()) == best.params == result.parameters_after
    cuts = best.mix
    assert out.config.num_hidden_layers == 4 - cuts.blocks
    assert out.config.intermediate_size == (cuts.ffn or 64)
    assert out.config.hidden_size == (cuts.hidden or 32)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # no candidate left
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["params"] == 0.7 and prov["search"]["chosen"] == best.label
    assert [c["cuts"] for c in prov["search"]["candidates"]] == [c.label for c in made]
    assert prov["history"][-1]["command"] == "shrink"  # the steps that made the candidate


def test_params_is_said_and_in_json(llama, tmp_path, calib_file):
    calib = ["--calibration", calib_file, "--samples", "6", "--seq", "32", "--multiple-of", "4"]
    r = run("shrink", llama, "-o", tmp_path / "out", "--params", "0.7", "--candidates", "1",
            *calib)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "--params: " in r.output and "measured first, each kind alone: " in r.output
    assert "candidate (* chosen)" in r.output and "predicted loss" in r.output
    assert "chose --" in r.output and " candidates by loss on held-out calibration text" in r.output
    r = run("shrink", llama, "-o", tmp_path / "j", "--params", "0.7", "--candidates", "1",
            *calib, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["options"]["params"] == 0.7 and got["search"]["target"] == round(0.7 * got[
        "parameters"]["before"])  # fmt: skip
    assert got["search"]["chosen"] in [c["cuts"] for c in got["search"]["candidates"]]
    assert set(got["search"]["sensitivity"]) == set(got["search"]["kinds"])


def test_a_count_of_parameters(llama, tmp_path, calib_file):
    total = _size(llama).total
    want = round(0.8 * total)
    result = shrink_checkpoint(llama, tmp_path / "out", ShrinkOptions(
        params=want, candidates=1, calibration=calib_file, **CALIB))  # fmt: skip
    assert abs(result.parameters_after - want) <= 0.01 * want
    assert parse_params("100M") == 100_000_000 and parse_params("0.5") == 0.5


@pytest.mark.parametrize(
    "args, says",
    [
        (["--params", "1"], "give a fraction strictly between 0 and 1"),
        (["--params", "2"], "give a fraction strictly between 0 and 1"),
        (["--params", "0.75", "--ffn", "0.5"], "say what to remove"),
        (["--params", "0.75", "--experts", "0.5"], "say what to remove"),
        (["--params", "1G"], "ask for fewer"),
        (["--params", "0.01"], "comes within 1% of"),
        (["--params", "0.75", "--candidates", "0"], "--candidates"),
    ],
)
def test_bad_requests_are_usage_errors_before_any_weight(llama, tmp_path, calib_file, args,
                                                         says):  # fmt: skip
    r = run("shrink", llama, "-o", tmp_path / "out", *args, "--calibration", calib_file,
            "--samples", "6", "--seq", "32", "--multiple-of", "4")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert says in r.output and r.output.count("error:") == 1, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_params_needs_calibration_text(llama, tmp_path):
    r = run("shrink", llama, "-o", tmp_path / "out", "--params", "0.75")
    assert r.exit_code == 2 and "--params measures each cut on calibration text" in r.output


def test_a_failing_candidate_leaves_nothing_beside_the_output(llama, tmp_path, calib_file,
                                                              monkeypatch):  # fmt: skip
    from sparsetool.ops.shrink import search

    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise SparsetoolError("the second candidate fails")
        return real(*args, **kwargs)

    real = search.shrink_widths
    monkeypatch.setattr(search, "shrink_widths", failing)
    monkeypatch.setattr(search, "shrink_blocks", failing)
    with pytest.raises(SparsetoolError, match="second candidate"):
        shrink_checkpoint(llama, tmp_path / "out", ShrinkOptions(params=0.7,
                          calibration=calib_file, **CALIB))  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


def test_widths_the_heads_do_not_divide_are_never_tried(tmp_path, text, calib_file):
    """9 heads in 3 groups (as SmolLM2's): no hidden size on the grid is a multiple of 9 and of
    --multiple-of 4 alone, so --hidden is not a kind alone (its middling cut would be refused by
    transformers after the long part); mixes keep one the kept heads divide."""
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=4, hidden_size=36, intermediate_size=64,
                        num_attention_heads=9, num_key_value_heads=3, head_dim=4,
                        **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "nine")
    save_tokenizer(tmp_path / "nine", text)
    size = _size(tmp_path / "nine")
    assert size.hidden_choices(4) == [] and size.hidden_choices(4, 6) == [24]
    found = mixes(size, round(0.7 * size.total), 4, {"blocks", "ffn", "heads", "hidden"})
    assert all(m.hidden is None or m.hidden % (m.heads or 9) == 0 for m in found)
    result = shrink_checkpoint(tmp_path / "nine", tmp_path / "out", ShrinkOptions(
        params=0.7, candidates=2, calibration=calib_file, **CALIB))  # fmt: skip
    assert "hidden alone" not in [c.role for c in result.search.candidates]
    assert "hidden" not in result.search.kinds
