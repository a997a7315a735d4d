"""shrink --multiple-of N (default 32): every width --ffn, --heads and --hidden write is a multiple
of N (llama.cpp's q8_0/q4_0 quantize a matrix's input in blocks of 32): the FFN width and the
hidden size kept are the multiple of N nearest F x width (a tie: the larger), at least N and below
the full width, with a note when that is not round(F x width); the heads kept are the count
nearest the fraction whose heads x head_dim is a multiple of N. --multiple-of 1 keeps today's
round(F x width). No width between none and all: one usage error before any text runs. Real
small transformers models, as test_shrink_widths.py builds them, with widths that hold multiples
of 32."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as t
from safetensors import safe_open

from sparsetool.errors import ConfigError, UsageError
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint
from sparsetool.ops.shrink.width_plan import Geometry, plan_widths

from helpers import CALIB, run, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def save(directory, text, **config) -> None:
    """A Llama of 2 blocks, hidden 128, FFN 160, 8 query heads of 16 in 4 key/value groups of 2
    (``config`` changes any of these)."""
    torch.manual_seed(0)
    values = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=160,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=16)  # fmt: skip
    cfg = t.LlamaConfig(**{**values, **config}, **_SMALL)
    t.LlamaForCausalLM(cfg).eval().save_pretrained(directory)
    save_tokenizer(directory, text)


@pytest.fixture(scope="module")
def llama(tmp_path_factory, text):
    directory = tmp_path_factory.mktemp("multiple") / "in"
    save(directory, text)
    return directory


def calib_args(calib_file) -> list:
    return ["--calibration", calib_file, "--samples", CALIB["samples"], "--seq", CALIB["seq"]]


def shrunk(llama, out, calib_file, *args):
    """``sparsetool shrink --json`` on ``llama``: its result, and the written config."""
    r = run("shrink", llama, "-o", out, *args, *calib_args(calib_file), "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), json.loads((out / "config.json").read_text())


def test_the_default_rounds_to_a_multiple_of_32_with_a_note(llama, tmp_path, calib_file):
    """--ffn 0.5 of 160 is 80, halfway between 64 and 96: the larger; --hidden 0.6 of 128 is 76.8,
    nearest 64. The model loads with those widths, and the notes say what was kept and why."""
    got, cfg = shrunk(llama, tmp_path / "out", calib_file, "--ffn", "0.5", "--hidden", "0.6")
    assert got["widths"]["ffn"] == {"before": 160, "after": 96}
    assert (got["widths"]["hidden"]["before"], got["widths"]["hidden"]["after"]) == (128, 64)
    assert (cfg["intermediate_size"], cfg["hidden_size"]) == (96, 64)
    assert got["notes"][:2] == [
        "--ffn 0.5 keeps 96 of 160 FFN channels per layer (0.60), the multiple of 32 nearest 80 "
        "(--multiple-of 32; 1 keeps 80)",
        "--hidden 0.6 keeps 64 of 128 embedding channels (0.50), the multiple of 32 nearest 76.8 "
        "(--multiple-of 32; 1 keeps 77)",
    ]
    model = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    layer = model.model.layers[0]
    assert layer.mlp.down_proj.weight.shape == (64, 96)
    assert layer.self_attn.q_proj.weight.shape == (128, 64)  # heads x head_dim stays 8 x 16
    r = run("shrink", llama, "-o", tmp_path / "printed", "--ffn", "0.5",
            *calib_args(calib_file), columns=300)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "note: --ffn 0.5 keeps 96 of 160 FFN channels per layer (0.60)" in r.output
    assert "FFN channels 160 -> 96" in r.output


def test_a_width_that_is_a_multiple_already_gets_no_note(llama, tmp_path, calib_file):
    got, cfg = shrunk(llama, tmp_path / "out", calib_file, "--hidden", "0.75")  # 96 = 3 x 32
    assert got["widths"]["hidden"]["after"] == cfg["hidden_size"] == 96
    assert not any("--multiple-of" in n for n in got["notes"]), got["notes"]


def test_multiple_of_1_keeps_round_f_x_width(llama, tmp_path, calib_file):
    got, cfg = shrunk(llama, tmp_path / "out", calib_file, "--ffn", "0.5", "--hidden", "0.625",
                      "--multiple-of", "1")  # fmt: skip
    assert (cfg["intermediate_size"], cfg["hidden_size"]) == (80, 80)
    assert not any("--multiple-of" in n for n in got["notes"]), got["notes"]


@pytest.mark.parametrize("f", [0.01, 0.1, 0.25, 0.3, 0.3333, 0.5, 0.6, 0.75, 0.9, 0.95])
@pytest.mark.parametrize(
    "g", [Geometry(9, 3, 64, 1536), Geometry(8, 4, 4, 48), Geometry(12, 2, 8, 100)]
)
def test_multiple_of_1_plans_what_round_plans(f, g):
    """The plan under --multiple-of 1 is round(F x width) and today's heads rule, its notes none
    but the per-group one."""
    try:
        plan = plan_widths(g, ShrinkOptions(ffn=f, multiple_of=1))
    except UsageError as e:
        assert round(f * g.ffn) in (0, g.ffn), e
    else:
        assert plan.keep_ffn == round(f * g.ffn) and plan.notes == []
    try:
        plan = plan_widths(g, ShrinkOptions(heads=f, multiple_of=1))
    except UsageError as e:
        assert "keeps none" in str(e) or "keeps all" in str(e), e
        return
    group = g.heads // g.kv_heads
    if plan.mode == "groups":
        assert (plan.kept_groups, plan.per_group) == (round(f * g.kv_heads), group)
    else:
        assert (plan.kept_groups, plan.per_group) == (g.kv_heads, round(f * group))
    assert all("--multiple-of" not in n for n in plan.notes)


def test_the_rule_nearest_ties_larger_at_least_n_below_all():
    smol = Geometry(9, 3, 64, 1536)  # SmolLM2-135M's FFN: 1,536

    def ffn(f, n=32):
        return plan_widths(smol, ShrinkOptions(ffn=f, multiple_of=n))

    assert ffn(0.75).keep_ffn == 1152 and ffn(0.75).notes == []  # a multiple already
    assert ffn(0.3).keep_ffn == 448  # 460.8: 448 is 12.8 away, 480 19.2
    assert ffn(0.3).notes == [
        "--ffn 0.3 keeps 448 of 1,536 FFN channels per layer (0.29), the multiple of 32 nearest "
        "460.8 (--multiple-of 32; 1 keeps 461)"
    ]
    tie = plan_widths(Geometry(8, 4, 16, 160), ShrinkOptions(ffn=0.5))  # 80: 64 or 96
    assert tie.keep_ffn == 96
    assert ffn(0.01).keep_ffn == 32  # 15.36: at least N
    assert "nearest 15.36 above 0" in ffn(0.01).notes[0]
    assert ffn(0.99).keep_ffn == 1504  # 1,520.64: below all
    assert "nearest 1,520.64 below 1,536" in ffn(0.99).notes[0]
    assert ffn(0.3, 256).keep_ffn == 512 and ffn(0.3, 1).keep_ffn == 461


def test_no_width_between_none_and_all_is_one_usage_error_before_any_text(
    tmp_path, text, calib_file
):
    """hidden 32 and --hidden 0.5: 16 is no multiple of 32, and 0 and 32 are none and all."""
    save(tmp_path / "in", text, hidden_size=32, intermediate_size=48, head_dim=4)
    src = tmp_path / "in"
    for args, says in [
        (["--hidden", "0.5"], f"--hidden 0.5 keeps 16 of {src}'s 32 embedding channels "
         "(round(0.5 x 32)), not a multiple of 32 (--multiple-of 32), and no multiple of 32 lies "
         "between none and all of them; give --multiple-of 16 or 1"),
        (["--ffn", "0.75", "--multiple-of", "64"], f"--ffn 0.75 keeps 36 of {src}'s 48 FFN "
         "channels per layer (round(0.75 x 48)), not a multiple of 64 (--multiple-of 64), and no "
         "multiple of 64 lies between none and all of them; give --multiple-of 4 or 1"),
        (["--heads", "0.5"], "--heads 0.5 keeps 2 x 8 = 16 channels of attention output per layer "
         "(whole key/value groups: round(0.5 x 4) = 2), not a multiple of 32 (--multiple-of 32), "
         "and no count of whole key/value groups between none and all 4 keeps one; give "
         "--multiple-of 16 or 1"),
    ]:  # fmt: skip
        r = run("shrink", src, "-o", tmp_path / "out", *args, *calib_args(calib_file),
                columns=400)  # fmt: skip
        assert r.exit_code == 2 and r.output.count("error:") == 1, r.output
        assert says in " ".join(r.output.split()), r.output
        assert not (tmp_path / "out").exists()
    stages: list = []
    with pytest.raises(UsageError, match="give --multiple-of 16 or 1"):
        shrink_checkpoint(src, tmp_path / "api", ShrinkOptions(hidden=0.5, calibration=calib_file,
                          **CALIB), progress=lambda *a: stages.append(a))  # fmt: skip
    assert stages == [] and not (tmp_path / "api").exists()  # no block ran
    r = run("shrink", src, "-o", tmp_path / "out", "--hidden", "0.5", "--multiple-of", "16",
            *calib_args(calib_file), "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["widths"]["hidden"]["after"] == 16


def test_heads_keep_a_count_whose_width_is_a_multiple(llama, tmp_path, calib_file):
    """--heads 0.25 of 4 groups of 2 heads of 16 keeps 1 group, 32 channels; under
    --multiple-of 64 the nearest count that is a multiple of 64 channels, 2 groups (4 heads)."""
    got, cfg = shrunk(llama, tmp_path / "plain", calib_file, "--heads", "0.25")
    assert got["widths"]["heads"]["after"] == {"heads": 2, "kv_heads": 1} and got["notes"] == []
    got, cfg = shrunk(llama, tmp_path / "out", calib_file, "--heads", "0.25",
                      "--multiple-of", "64")  # fmt: skip
    assert got["widths"]["heads"]["mode"] == "groups"
    assert got["widths"]["heads"]["after"] == {"heads": 4, "kv_heads": 2}
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (4, 2)
    assert got["notes"] == [
        "--heads 0.25 keeps 4 of 8 heads (0.50): 2 of 4 whole key/value groups, the count nearest "
        "0.25 x 4 whose heads' width, 4 x 16 = 64, is a multiple of 64 (--multiple-of 64; 1 keeps "
        "2)"
    ]
    model = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.model.layers[0].self_attn.o_proj.weight.shape == (128, 64)


def test_query_heads_per_group_keep_a_count_whose_width_is_a_multiple():
    """12 heads in 2 groups of 6, head_dim 8: --heads 0.3333 keeps round(0.3333 x 6) = 2 of each
    group, 4 x 8 = 32 channels; under --multiple-of 64, 4 of each (64), the only count that is."""
    g = Geometry(12, 2, 8, 100)
    plan = plan_widths(g, ShrinkOptions(heads=0.3333))
    assert (plan.mode, plan.per_group, plan.notes) == ("query heads per group", 2, [])
    plan = plan_widths(g, ShrinkOptions(heads=0.3333, multiple_of=64))
    assert plan.per_group == 4 and plan.heads is not None and plan.heads.heads_after == 8
    assert plan.notes == [
        "--heads 0.3333 keeps 8 of 12 heads (0.67): 4 of each key/value group of 6, the count "
        "nearest 0.3333 x 6 whose heads' width, 8 x 8 = 64, is a multiple of 64 (--multiple-of 64; "
        "1 keeps 4)"
    ]


def test_the_hidden_size_offered_for_the_heads_is_a_multiple_too(tmp_path, text, calib_file):
    """SmolLM2-135M's attention, 9 heads of 64 over a hidden size of 576: --hidden 0.75 keeps 448
    under --multiple-of 32, which 9 heads do not divide (Llama's config refuses it); the offers
    are multiples of 9 and 32, or --multiple-of 16, under which 0.75 keeps 432."""
    save(tmp_path / "in", text, num_hidden_layers=1, hidden_size=576, intermediate_size=64,
         num_attention_heads=9, num_key_value_heads=3, head_dim=64)  # fmt: skip
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--hidden", "0.75",
            *calib_args(calib_file), columns=400)  # fmt: skip
    assert r.exit_code == 2 and r.output.count("error:") == 1, r.output
    said = " ".join(r.output.split())
    assert (
        "--hidden 0.75 keeps 448 embedding channels, not a multiple of the 9 attention heads"
        in (said)
    )
    assert "ask for --hidden 0.5 (288), a multiple of 9 and of 32, or --multiple-of 16 (432)" in (
        said
    )
    assert not (tmp_path / "out").exists()
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--hidden", "0.75",
            "--multiple-of", "16", *calib_args(calib_file), "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert t.AutoConfig.from_pretrained(tmp_path / "out").hidden_size == 432


def test_the_record_provenance_and_json_hold_multiple_of(llama, tmp_path, calib_file):
    got, _ = shrunk(llama, tmp_path / "out", calib_file, "--ffn", "0.5", "--multiple-of", "16")
    assert got["options"]["multiple_of"] == 16
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["multiple_of"] == 16 and prov["widths"]["ffn"]["after"] == 80  # a multiple of 16
    assert ShrinkOptions(ffn=0.5, calibration="x").record()["multiple_of"] == 32
    for other in (dict(blocks=1, calibration="x"), dict(experts=0.5, calibration="x")):
        assert "multiple_of" not in ShrinkOptions(**other).record()  # no width narrowed


@pytest.mark.parametrize("bad", [0, -32, 1.5, True, "32"])
def test_validate_refuses_a_multiple_of_not_a_positive_whole_number(bad):
    with pytest.raises(ConfigError, match=f"--multiple-of {bad}: must be a whole number of at"):
        ShrinkOptions(ffn=0.5, calibration="x", multiple_of=bad).validate()


def test_the_command_line_refuses_a_bad_multiple_of(llama, tmp_path, calib_file):
    for bad in ("0", "-1", "abc"):
        r = run("shrink", llama, "-o", tmp_path / "out", "--ffn", "0.5", "--multiple-of", bad,
                *calib_args(calib_file))  # fmt: skip
        assert r.exit_code == 2 and "--multiple-of" in r.output, r.output
        assert not (tmp_path / "out").exists()
