"""FLOP accounting: the SPDF paper's tables, the Cerebras posts' figures, and the formula itself.

Paper numbers are copied as printed, with their source. "Within rounding" means the computed value
rounds to the printed digits: |value - printed| <= half a unit of the last printed digit.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.errors import ConfigError
from sparsetool.flops import (
    PRESETS,
    ModelConfig,
    Stage,
    account,
    forward_terms,
    get_preset,
    load_config,
    param_counts,
    parse_count,
    parse_sparsities,
    parse_stage,
    term_formulas,
)

TERMS = [
    "qkv",
    "attn_logits",
    "softmax",
    "attn_values",
    "attn_out",
    "ffn",
    "router",
    "logits",
    "embeddings",
]


def half_unit(printed: str) -> float:
    """Half a unit of the last digit of a printed number: "1.86e13" -> 0.005e13."""
    exp = Decimal(printed).as_tuple().exponent
    return 0.5 * 10.0**exp


def assert_printed(value: float, printed: str, slack: float = 1e-9) -> None:
    target = float(printed)
    tol = half_unit(printed) * (1 + slack)
    assert abs(value - target) <= tol, f"{value!r} does not round to the printed {printed}"


def round_sig(x: float, digits: int) -> float:
    return float(f"{x:.{digits - 1}e}")


# ---------------------------------------------------------------------------------------------
# SPDF (Thangarasa et al., UAI 2023), Appendix A.4, Table 2: pre-training FLOPs.
# Columns: total sequences, total FLOPs/seq (forward + backward), total FLOPs, exaFLOPs, reduction.
# Token budgets from Sec. 3 / App. Table 1: GPT-2 Small 2.5B, GPT-3 XL 26B; context 2048 (App. A.1).
APPENDIX_TABLE_2 = {
    ("gpt2-small", 0.00): ("1.22e6", "1.99e12", "2.43e18", "2.43", "1"),
    ("gpt2-small", 0.50): ("1.22e6", "1.47e12", "1.79e18", "1.79", "0.737"),
    ("gpt2-small", 0.75): ("1.22e6", "1.20e12", "1.46e18", "1.46", "0.601"),
    ("gpt3-xl", 0.00): ("1.27e7", "1.86e13", "2.36e20", "236.10", "1"),
    ("gpt3-xl", 0.50): ("1.27e7", "1.12e13", "1.42e20", "141.87", "0.601"),
    ("gpt3-xl", 0.75): ("1.27e7", "7.46e12", "9.48e19", "94.76", "0.401"),
}
TOKENS = {"gpt2-small": 2.5e9, "gpt3-xl": 26e9}


@pytest.mark.parametrize("model,sparsity", list(APPENDIX_TABLE_2))
def test_spdf_appendix_table2_per_sequence_and_sequences(model, sparsity):
    seqs, per_seq, *_ = APPENDIX_TABLE_2[(model, sparsity)]
    r = account(get_preset(model), sparsity=sparsity)
    assert r["tokens"] == TOKENS[model]  # Chinchilla 20 x the nominal 125M / 1.3B
    assert_printed(r["sequences"], seqs)
    assert_printed(r["train_flops_per_seq"], per_seq)


# Rows where our unrounded arithmetic reproduces every printed total and reduction.
EXACT_TOTAL_ROWS = [("gpt2-small", 0.0), ("gpt2-small", 0.5), ("gpt3-xl", 0.5), ("gpt3-xl", 0.75)]


@pytest.mark.parametrize("model,sparsity", EXACT_TOTAL_ROWS)
def test_spdf_appendix_table2_totals_and_reduction(model, sparsity):
    _, _, total, exa, reduction = APPENDIX_TABLE_2[(model, sparsity)]
    r = account(get_preset(model), sparsity=sparsity)
    assert_printed(r["total_train_flops"], total)
    assert_printed(r["total_train_flops"] / 1e18, exa)
    assert_printed(r["train_flops_ratio"], reduction)


def test_spdf_appendix_table2_gpt2_small_75_was_computed_from_rounded_columns():
    # The paper prints 1.46 exaFLOPs and 0.601x for GPT-2 Small at 75%. The unrounded product is
    # 1.470e18 (0.606x): the paper multiplied its own rounded columns, 1.20e12 x 1.22e6 = 1.464e18,
    # and divided rounded totals, 1.46 / 2.43 = 0.601. Its Table 2 (main text) then uses the
    # unrounded 1.47: 1.47 + 0.052 (E2E) = 1.52 as printed there, not 1.51.
    r = account(get_preset("gpt2-small"), sparsity=0.75)
    dense = account(get_preset("gpt2-small"), sparsity=0.0)
    assert_printed(r["total_train_flops"] / 1e18, "1.47")
    assert_printed(r["train_flops_ratio"], "0.606")
    rounded = round_sig(r["train_flops_per_seq"], 3) * round_sig(r["sequences"], 3)
    assert_printed(rounded / 1e18, "1.46")
    rounded_dense = round_sig(dense["train_flops_per_seq"], 3) * round_sig(dense["sequences"], 3)
    assert_printed(round(rounded / 1e18, 2) / round(rounded_dense / 1e18, 2), "0.601")


def test_spdf_appendix_table2_gpt3_xl_dense_total():
    # Printed 236.10 exaFLOPs; the formula gives 236.089 (2.36e20 in the same row matches). The
    # 50% and 75% rows (141.87, 94.76) match to the last digit, so no shared assumption (vocab,
    # tokens, sequence length) explains the extra 0.011 (0.005%): a slip in that one cell.
    r = account(get_preset("gpt3-xl"), sparsity=0.0)
    assert_printed(r["total_train_flops"], "2.36e20")
    assert abs(r["total_train_flops"] / 1e18 - 236.10) < 0.015
    assert_printed(r["total_train_flops"] / 1e18, "236.09")
    # And 9.48e19 for 75% is consistent with 94.76 only within its own rounding: 9.476e19.
    assert_printed(account(get_preset("gpt3-xl"), sparsity=0.75)["total_train_flops"], "9.48e19")


# ---------------------------------------------------------------------------------------------
# SPDF Appendix A.4, Table 3: dense fine-tuning at sequence length 512. Its "Total FLOPs/Seq" column
# is the FORWARD pass (1.36e11 for GPT-2 Small); the totals are 3 x that x sequences.
APPENDIX_TABLE_3 = {  # dataset: (sequences, {model: (FLOPs/seq, total FLOPs, exaFLOPs)})
    # E2E / GPT-3 XL prints 5.27e17 but 0.524 exaFLOPs, DART's figure: 5.27e17 is 0.527, and
    # SPDF Table 2's 95.29 (= 94.758 + 0.527; 94.758 + 0.524 = 95.28) confirms 0.527 was used.
    "E2E": (
        "1.26e5",
        {"gpt2-small": ("1.36e11", "5.15e16", "0.052"), "gpt3-xl": ("1.39e12", "5.27e17", "0.527")},
    ),
    "WebNLG": (
        "0.54e5",
        {"gpt2-small": ("1.36e11", "2.21e16", "0.022"), "gpt3-xl": ("1.39e12", "2.26e17", "0.226")},
    ),
    "DART": (
        "1.25e5",
        {"gpt2-small": ("1.36e11", "5.12e16", "0.051"), "gpt3-xl": ("1.39e12", "5.24e17", "0.524")},
    ),
    "Curation": (
        "0.34e5",
        {"gpt2-small": ("1.36e11", "1.38e16", "0.014"), "gpt3-xl": ("1.39e12", "1.41e17", "0.141")},
    ),
}


def finetune_fwd(model: str) -> float:
    return account(get_preset(model), finetune_tokens=512, finetune_seq_len=512)[
        "finetune_forward_flops_per_seq"
    ]


def sequence_interval(
    dataset: str, extra: list[tuple[float, str, float]] = ()
) -> tuple[float, float]:
    """The fine-tuning sequence counts consistent with every printed figure of ``dataset``.

    The paper prints the count rounded (1.25e5) but computed totals from the exact one, so each
    printed total bounds it: total in [T - u/2, T + u/2] => n in that / (3 x forward FLOPs/seq).
    ``extra``: (offset, printed, scale) constraints of the form offset + n * scale ~ printed.
    """
    seqs, per_model = APPENDIX_TABLE_3[dataset]
    lo, hi = float(seqs) - half_unit(seqs), float(seqs) + half_unit(seqs)
    for model, (_, total, exa) in per_model.items():
        train_per_seq = 3 * finetune_fwd(model)
        for printed, scale in ((total, 1.0), (exa, 1e18)):
            lo = max(lo, (float(printed) - half_unit(printed)) * scale / train_per_seq)
            hi = min(hi, (float(printed) + half_unit(printed)) * scale / train_per_seq)
    for offset, printed, scale in extra:
        lo = max(lo, (float(printed) - half_unit(printed) - offset) / scale)
        hi = min(hi, (float(printed) + half_unit(printed) - offset) / scale)
    return lo, hi


@pytest.mark.parametrize("dataset", list(APPENDIX_TABLE_3))
def test_spdf_appendix_table3_finetuning(dataset):
    seqs, per_model = APPENDIX_TABLE_3[dataset]
    for model, (per_seq, _, _) in per_model.items():
        assert_printed(finetune_fwd(model), per_seq)  # forward FLOPs of one 512-token sequence
    lo, hi = sequence_interval(dataset)
    assert lo <= hi, f"no sequence count reproduces every {dataset} figure: [{lo}, {hi}]"
    n = (lo + hi) / 2
    for model, (_, total, exa) in per_model.items():
        r = account(get_preset(model), finetune_tokens=n * 512, finetune_seq_len=512)
        assert_printed(r["finetune_flops"], total)
        assert_printed(r["finetune_flops"] / 1e18, exa)


def test_spdf_appendix_table3_e2e_gpt3_xl_exaflops_cell_is_dart_s():
    r = account(get_preset("gpt3-xl"), finetune_tokens=1.26e5 * 512, finetune_seq_len=512)
    assert_printed(r["finetune_flops"], "5.27e17")
    assert not abs(r["finetune_flops"] / 1e18 - 0.524) <= half_unit("0.524")  # the printed cell


def test_spdf_appendix_table3_e2e_at_the_printed_count():
    # With the printed 1.26e5 E2E sequences the totals already round to the table.
    for model, (_, total, exa) in APPENDIX_TABLE_3["E2E"][1].items():
        r = account(get_preset(model), finetune_tokens=1.26e5 * 512, finetune_seq_len=512)
        assert_printed(r["finetune_flops"], total)
        assert_printed(r["finetune_flops"] / 1e18, exa)


# SPDF Table 2 (Sec. 3.5): pre-training + dense fine-tuning, GPT-3 XL, E2E column.
SPDF_TABLE_2_XL_E2E = {0.0: ("236.62", "1.00"), 0.5: ("142.40", "1.66"), 0.75: ("95.29", "2.48")}


def test_spdf_table2_end_to_end_gpt3_xl_e2e():
    # The E2E count must satisfy Table 3 AND these totals: 94.758 + 3*fwd*n >= 95.285 needs
    # n >= 1.2602e5 while Table 3's 5.27e17 needs n <= 1.2612e5; the interval is non-empty.
    cfg = get_preset("gpt3-xl")
    train_ft = 3 * finetune_fwd("gpt3-xl")
    extra = [
        (account(cfg, sparsity=s)["total_train_flops"], printed, train_ft / 1.0)
        for s, (printed, _) in SPDF_TABLE_2_XL_E2E.items()
    ]
    extra = [(off / 1e18, p, sc / 1e18) for off, p, sc in extra]
    lo, hi = sequence_interval("E2E", extra)
    assert lo <= hi
    n = (lo + hi) / 2
    for s, (total, speedup) in SPDF_TABLE_2_XL_E2E.items():
        r = account(cfg, sparsity=s, finetune_tokens=n * 512, finetune_seq_len=512)
        assert_printed(r["end_to_end_flops"] / 1e18, total)
        assert_printed(1 / r["end_to_end_ratio"], speedup)
        assert r["dense_end_to_end_flops"] == pytest.approx(
            r["dense_total_train_flops"] + r["finetune_flops"]
        )
    # The headline: "GPT-3 XL 75% SPDF provides ~2.5x FLOP reduction" (Table 2 caption).
    r = account(cfg, sparsity=0.75, finetune_tokens=1.26e5 * 512, finetune_seq_len=512)
    assert f"{1 / r['end_to_end_ratio']:.2f}" == "2.48"


def test_spdf_section_3_5_flop_shares():
    # Sec. 3.5: in GPT-3 XL attention (QK logits + attention over values) and the vocabulary
    # logits are ~13.3% and 6.8% of the FLOPs. For GPT-2 Small it says ~13.3% and 27%: the 27%
    # holds only at GPT-2's original 1024 context (23.9% at 2048), where attention is 13.2%
    # (13.4% with the softmax), "approximately 13.3%"; yet its "~1.65x at 75%" needs 2048.
    def shares(cfg, seq_len=None):
        t = forward_terms(cfg, seq_len=seq_len)
        total = sum(t.values())
        return (t["attn_logits"] + t["attn_values"]) / total, t["logits"] / total

    att, logits = shares(get_preset("gpt3-xl"))
    assert_printed(100 * att, "13.3")
    assert_printed(100 * logits, "6.8")
    att, logits = shares(get_preset("gpt2-small"), seq_len=1024)
    assert abs(100 * att - 13.3) < 0.1
    assert_printed(100 * logits, "27")
    assert not abs(100 * shares(get_preset("gpt2-small"))[1] - 27) <= 0.5
    r = account(get_preset("gpt2-small"), sparsity=0.75)
    assert_printed(1 / r["train_flops_ratio"], "1.65")


# ---------------------------------------------------------------------------------------------
# Cerebras iterative-pruning post (GPT-3 1.3B, 24 layers, 16 heads, 2048 hidden, 8192 filter):
# "an 83.8% sparse model with 3x reduction in inference FLOPs, 4.3x reduction in parameters";
# FLOPs per footnote 1: Chinchilla Appendix F, embeddings excluded, sparsity per layer.
@pytest.mark.parametrize("vocab", [50257, 50267])  # the post says 50,267; GPT-2's is 50,257
def test_iterative_pruning_post_gpt3_xl_at_83_8(vocab):
    cfg = replace(get_preset("gpt3-xl"), vocab=vocab)
    r = account(cfg, sparsity=0.838)
    assert_printed(1 / r["inference_flops_ratio"], "3.0")
    assert_printed(r["params"] / r["nonzero_params"], "4.3")
    p = param_counts(cfg, 0.838)
    # "the dense model has ~6.2x more trainable parameters in projections and feed forward layers"
    assert_printed(p["targeted"] / (p["targeted"] - (p["total"] - p["nonzero"])), "6.2")


# ---------------------------------------------------------------------------------------------
# Kaplan et al. 2020 / Chinchilla App. F: C ~ 6 N D is close for large models (Appendix F's
# Table A4 compares the two), the attention s*s and logits terms matter for small ones.
def test_six_n_d_rule_of_thumb():
    def ratio(name):
        cfg = get_preset(name)
        r = account(cfg, tokens=1e9)
        return r["total_train_flops"] / (6 * param_counts(cfg)["total"] * 1e9)

    assert abs(ratio("gpt3-175b") - 1) < 0.03
    assert abs(ratio("cerebras-gpt-13b") - 1) < 0.07
    family = [n for n in PRESETS if n.startswith("cerebras-gpt-")]
    ratios = [ratio(n) for n in family]
    assert ratios == sorted(ratios, reverse=True)  # closer to 6ND as models grow
    assert ratios[0] > 1.2  # and far off for the 111M model: not a tautology


# ---------------------------------------------------------------------------------------------
# The formula itself, on a model small enough to check by hand.
TINY = ModelConfig("tiny", n_layers=2, d_model=8, n_heads=2, d_head=4, d_ff=32, vocab=10, seq_len=4)


def test_forward_terms_by_hand():
    t = forward_terms(TINY)
    assert list(t) == TERMS
    s, d, h, k, f, V, L = 4, 8, 2, 4, 32, 10, 2
    assert t == {
        "qkv": L * 2 * 3 * s * d * (k * h),  # 3072
        "attn_logits": L * 2 * s * s * (k * h),
        "softmax": L * 3 * h * s * s,
        "attn_values": L * 2 * s * s * (k * h),
        "attn_out": L * 2 * s * (k * h) * d,
        "ffn": L * 2 * s * 2 * d * f,
        "router": 0.0,  # no experts
        "logits": 2 * s * d * V,
        "embeddings": 0.0,
    }
    assert t["qkv"] == 3072 and t["ffn"] == 8192 and t["softmax"] == 192
    assert forward_terms(TINY, embeddings=True)["embeddings"] == 2 * s * V * d
    assert forward_terms(TINY, seq_len=8)["attn_logits"] == 4 * t["attn_logits"]  # s*s


def test_sparsity_scales_only_targeted_terms():
    dense, sparse = forward_terms(TINY), forward_terms(TINY, sparsity=0.75, embeddings=False)
    for term in ("qkv", "attn_out", "ffn"):
        assert sparse[term] == dense[term] * 0.25
    for term in ("attn_logits", "softmax", "attn_values", "router", "logits", "embeddings"):
        assert sparse[term] == dense[term]


def test_per_layer_role_sparsity():
    layers = [{"qkv": 0.5, "attn_out": 0.0, "ffn_in": 1.0, "ffn_out": 0.25}, {}]
    t, dense = forward_terms(TINY, sparsity=layers), forward_terms(TINY)
    per_layer = {k: v / 2 for k, v in dense.items()}
    assert t["qkv"] == per_layer["qkv"] * 0.5 + per_layer["qkv"]
    assert t["attn_out"] == dense["attn_out"]
    # ffn_in and ffn_out are one matrix each (2*s*d*f): layer 0 keeps only 0.75 of ffn_out
    assert t["ffn"] == per_layer["ffn"] / 2 * 0.75 + per_layer["ffn"]
    with pytest.raises(ConfigError, match="layers"):
        forward_terms(TINY, sparsity=[{}])
    with pytest.raises(ConfigError, match="unknown role"):
        forward_terms(TINY, sparsity=[{"mlp": 0.5}, {}])
    # the one sparsity check (sparsetool.util.options) words its range "from 0 to 1"
    with pytest.raises(ConfigError, match="layer 0 qkv: sparsity must be a number from 0 to 1"):
        forward_terms(TINY, sparsity=[{"qkv": 1.5}, {}])


def test_swiglu_has_three_ffn_matrices_and_ffn_in_covers_gate_and_up():
    cfg = replace(TINY, ffn_matrices=3)
    t = forward_terms(cfg)
    assert t["ffn"] == 2 * 2 * 4 * 3 * 8 * 32
    half = forward_terms(cfg, sparsity=[{"ffn_in": 1.0}] * 2)
    assert half["ffn"] == t["ffn"] / 3  # only down remains
    llama = get_preset("llama-1.3b")
    assert llama.ffn_matrices == 3 and llama.vocab == 32000 and not llama.tied_embeddings


def test_grouped_query_attention_shrinks_k_and_v():
    gqa = replace(TINY, n_kv_heads=1)
    assert forward_terms(gqa)["qkv"] == 2 * 2 * 4 * 8 * 4 * (2 + 2 * 1)
    assert forward_terms(gqa)["attn_logits"] == forward_terms(TINY)["attn_logits"]
    assert (
        "4+2*1" in term_formulas(gqa)["qkv"].replace(" ", "")
        or "(2+2*1)" in term_formulas(gqa)["qkv"]
    )


def test_term_formulas_evaluate_to_the_terms():
    cfg = get_preset("gpt3-xl")
    t, formulas = forward_terms(cfg, embeddings=True), term_formulas(cfg)
    for name in TERMS:
        assert eval(formulas[name], {"__builtins__": {}}) == t[name], name  # noqa: S307


# ---------------------------------------------------------------------------------------------
# Presets and config files.
CEREBRAS = {  # the table, from Dey et al. 2023 (Cerebras-GPT), Table 1
    "cerebras-gpt-111m": (10, 768, 12, 3072),
    "cerebras-gpt-256m": (14, 1088, 17, 4352),
    "cerebras-gpt-590m": (18, 1536, 12, 6144),
    "cerebras-gpt-1.3b": (24, 2048, 16, 8192),
    "cerebras-gpt-2.7b": (32, 2560, 32, 10240),
    "cerebras-gpt-6.7b": (32, 4096, 32, 16384),
    "cerebras-gpt-13b": (40, 5120, 40, 20480),
}


@pytest.mark.parametrize("name", list(CEREBRAS))
def test_cerebras_gpt_presets_and_their_names(name):
    c = get_preset(name)
    assert (c.n_layers, c.d_model, c.n_heads, c.d_ff) == CEREBRAS[name]
    assert (c.vocab, c.seq_len, c.d_head * c.n_heads) == (50257, 2048, c.d_model)
    # Counting embeddings, positions, biases and norms gives the size in the model's name.
    size = name.rsplit("-", 1)[1]  # "111m", "2.7b": rounded to the digits shown
    unit = 1e6 if size.endswith("m") else 1e9
    assert_printed(param_counts(c)["total"] / unit, size[:-1])


def test_unknown_preset_lists_names():
    with pytest.raises(ConfigError, match="gpt3-xl.*cerebras-gpt-13b"):
        get_preset("gpt-5")


def test_chinchilla_default_tokens_use_counted_params_without_a_nominal_size():
    c = get_preset("cerebras-gpt-6.7b")
    assert account(c)["tokens"] == 20 * param_counts(c)["total"]  # 133.2B (Cerebras-GPT: 133B)


@pytest.mark.parametrize("suffix", ["toml", "json", "yaml"])
def test_config_files_in_three_formats(tmp_path, suffix):
    body = {
        "toml": 'name = "mine"\nn_layers = 2\nd_model = 8\nn_heads = 2\nd_ff = 32\nvocab = '
        "10\nseq_len = 4\n",
        "json": json.dumps(
            {
                "name": "mine",
                "n_layers": 2,
                "d_model": 8,
                "n_heads": 2,
                "d_ff": 32,
                "vocab": 10,
                "seq_len": 4,
            }
        ),
        "yaml": "name: mine\nn_layers: 2\nd_model: 8\nn_heads: 2\nd_ff: 32\nvocab: 10\nseq_len: "
        "4\n",
    }[suffix]
    p = tmp_path / f"m.{suffix}"
    p.write_text(body)
    assert load_config(p) == replace(TINY, name="mine")


def test_hugging_face_config_json(tmp_path):
    d = tmp_path / "my-llama"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 2048,
                "intermediate_size": 5504,
                "num_attention_heads": 16,
                "num_hidden_layers": 24,
                "num_key_value_heads": 4,
                "vocab_size": 32000,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": False,
            }
        )
    )
    c = load_config(d / "config.json")
    assert (c.name, c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_ff) == (
        "my-llama",
        24,
        2048,
        16,
        128,
        5504,
    )
    # counted at 2048 tokens like every source (it used to be the 4096-token context)
    assert (c.ffn_matrices, c.n_kv_heads, c.seq_len, c.context, c.learned_positions) == (
        3,
        4,
        2048,
        4096,
        False,
    )
    gpt2 = {
        "model_type": "gpt2",
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "n_inner": None,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    c = load_config(tmp_path / "config.json")
    # GPT-2 takes 1024 tokens: counted at its context, not at a 2048 it cannot take
    assert (c.d_ff, c.seq_len, c.context, c.ffn_matrices, c.n_kv_heads) == (
        3072,
        1024,
        1024,
        2,
        None,
    )


@pytest.mark.parametrize(
    "body,match",
    [
        ('{"n_layers": 2}', "required keys"),
        (
            '{"n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 32, "vocab": 10, "seq_len": 4, '
            '"x": 1}',
            "unknown key",
        ),
        (
            '{"n_layers": 0, "d_model": 8, "n_heads": 2, "d_ff": 32, "vocab": 10, "seq_len": 4}',
            "positive integer",
        ),
        ("{not json", "not valid"),
        ("[1, 2]", "mapping"),
        ('{"model_type": "gpt2", "n_embd": 8}', "lacks"),
        (
            '{"model_type": "dbrx", "hidden_size": 8, "num_experts": 8}',
            "mixture-of-experts model of type 'dbrx'",
        ),
        (
            '{"model_type": "kimi_k2", "kv_lora_rank": 512}',
            "latent attention.*deepseek_v2, deepseek_v3",
        ),
        (
            '{"model_type": "deepseek_v3", "num_hidden_layers": 2, "hidden_size": 64, '
            '"num_attention_heads": 4, "vocab_size": 100, "kv_lora_rank": 16, '
            '"qk_rope_head_dim": 8}',
            "gives kv_lora_rank but not qk_nope_head_dim, v_head_dim",
        ),
        (
            '{"model_type": "mixtral", "hidden_size": 8, "num_hidden_layers": 2, '
            '"num_attention_heads": 2, "vocab_size": 10, "num_local_experts": 8}',
            "not how many each token goes to",
        ),
    ],
)
def test_bad_config_files(tmp_path, body, match):
    p = tmp_path / "bad.json"
    p.write_text(body)
    with pytest.raises(ConfigError, match=match):
        load_config(p)
    assert p.read_text() == body  # input untouched


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


# ---------------------------------------------------------------------------------------------
# Stages, fine-tuning, parsing.
def test_variable_spdf_stages():
    # Variable SPDF post: 90% sparse for Stage-1 then dense, "effective weight sparsity 75%".
    cfg = get_preset("cerebras-gpt-256m")
    r = account(cfg, stages=[parse_stage("0.9:0.8333"), parse_stage("0:0.1667")])
    assert r["effective_sparsity"] == pytest.approx(0.75, abs=1e-4)
    assert [s["fraction"] for s in r["stages"]] == pytest.approx([0.8333, 0.1667])
    assert sum(s["train_flops"] for s in r["stages"]) == pytest.approx(r["total_train_flops"])
    # FLOPs are affine in sparsity: the staged run costs what a plain run at 75% costs...
    plain = account(cfg, sparsity=0.75)
    assert r["total_train_flops"] == pytest.approx(plain["total_train_flops"], rel=1e-4)
    # ...but it ends dense, so inference and non-zero parameters are the dense model's.
    assert r["inference_flops_ratio"] == 1.0 and r["nonzero_params"] == r["params"]


def test_variable_spdf_6p7b_against_the_posts_64_percent():
    # Variable SPDF post, Figure 5 and Table 3: Cerebras-GPT 6.7B at "effective 75% sparsity"
    # (90% for Stage-1, then dense) "uses 64% fewer FLOPs" in pre-training. Appendix F as the SPDF
    # tables count it (no embedding term) gives 67.2% fewer, the same as a plain 75% run; the
    # embedding term brings it to 65.3%; 90% for 80% of the tokens (72% effective) gives 64.5%.
    # The post does not list the terms it counts, so the gap is documented in docs/flops.md, not
    # fitted.
    cfg = get_preset("cerebras-gpt-6.7b")
    vspdf = [parse_stage("0.9:0.8333"), parse_stage("0:0.1667")]
    saved = 1 - account(cfg, stages=vspdf)["train_flops_ratio"]
    assert saved == pytest.approx(0.672, abs=5e-4)
    assert 1 - account(cfg, stages=vspdf, embeddings=True)["train_flops_ratio"] == pytest.approx(
        0.653, abs=5e-4
    )
    shorter = [parse_stage("0.9:0.8"), parse_stage("0:0.2")]
    assert 1 - account(cfg, stages=shorter)["train_flops_ratio"] == pytest.approx(0.645, abs=5e-4)


@pytest.mark.parametrize(
    "stages,match",
    [
        (["0.9:0.5"], "sum to 0.5"),
        (["0.9:0.5", "0:0.6"], "sum to 1.1"),
        (["1.2:1"], "sparsity must be a number from 0 to 1"),  # the one sparsity check's words
        (["0.5"], "SPARSITY:FRACTION"),
        (["a:b"], "SPARSITY:FRACTION"),
        (["0.5:0"], r"\(0, 1\]"),
    ],
)
def test_bad_stages(stages, match):
    with pytest.raises(ConfigError, match=match):
        account(get_preset("gpt2-small"), stages=[parse_stage(s) for s in stages])


def test_finetuning_adds_the_same_dense_flops_to_both_runs():
    r = account(get_preset("gpt2-small"), sparsity=0.5, finetune_tokens=1e6, finetune_seq_len=512)
    fwd512 = sum(forward_terms(get_preset("gpt2-small"), seq_len=512).values())
    assert r["finetune_flops"] == pytest.approx(3 * fwd512 * 1e6 / 512)
    assert r["end_to_end_flops"] - r["total_train_flops"] == pytest.approx(r["finetune_flops"])
    assert r["dense_end_to_end_flops"] - r["dense_total_train_flops"] == pytest.approx(
        r["finetune_flops"]
    )
    assert r["train_flops_ratio"] < r["end_to_end_ratio"] < 1


def test_parsers():
    assert parse_count("26B") == 26e9 and parse_count("64.512M") == pytest.approx(64.512e6)
    assert parse_sparsities("0,0.5,0.75") == [0.0, 0.5, 0.75]
    with pytest.raises(ConfigError, match="75% as 0.75"):
        parse_sparsities("75")
    with pytest.raises(ConfigError, match="not a number"):
        parse_count("lots")
    with pytest.raises(ConfigError, match="positive"):
        account(TINY, tokens=-5)


def test_no_torch_on_import():
    import subprocess
    import sys

    code = (
        "import sys, sparsetool.flops; "
        "sys.exit(1 if {'torch', 'numpy', 'typer', 'rich'} & set(sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---------------------------------------------------------------------------------------------
# Properties.
configs = st.builds(
    lambda L, d_head, h, mult, V, s, m: ModelConfig(
        "p", L, d_head * h, h, d_head, mult * d_head * h, V, s, ffn_matrices=m
    ),
    st.integers(1, 8),
    st.sampled_from([4, 8, 64]),
    st.integers(1, 8),
    st.integers(1, 6),
    st.integers(2, 60000),
    st.integers(1, 4096),
    st.sampled_from([2, 3]),
)
fractions = st.floats(0, 1, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(configs, fractions, fractions)
def test_flops_fall_monotonically_with_sparsity(cfg, a, b):
    lo, hi = sorted((a, b))
    r_lo, r_hi = account(cfg, sparsity=lo, tokens=1e6), account(cfg, sparsity=hi, tokens=1e6)
    assert r_hi["total_train_flops"] <= r_lo["total_train_flops"]
    assert r_hi["inference_flops_per_token"] <= r_lo["inference_flops_per_token"]
    assert r_hi["nonzero_params"] <= r_lo["nonzero_params"]
    if hi - lo > 1e-9:
        assert r_hi["total_train_flops"] < r_lo["total_train_flops"]


@settings(max_examples=60, deadline=None)
@given(configs, fractions, st.floats(1e3, 1e12))
def test_one_stage_equals_the_plain_run(cfg, s, tokens):
    staged = account(cfg, stages=[Stage(s, 1.0)], tokens=tokens)
    plain = account(cfg, sparsity=s, tokens=tokens)
    for key in (
        "total_train_flops",
        "train_flops_per_seq",
        "inference_flops_per_token",
        "nonzero_params",
        "effective_sparsity",
    ):
        assert staged[key] == pytest.approx(plain[key], rel=1e-12), key


@settings(max_examples=40, deadline=None)
@given(configs, fractions)
def test_uniform_mapping_equals_the_float(cfg, s):
    per_layer = [dict.fromkeys(("qkv", "attn_out", "ffn_in", "ffn_out"), s)] * cfg.n_layers
    a, b = forward_terms(cfg, sparsity=s), forward_terms(cfg, sparsity=per_layer)
    assert all(math.isclose(a[k], b[k], rel_tol=1e-12) for k in TERMS)
