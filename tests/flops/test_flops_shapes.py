"""Shapes and measured sparsity from a checkpoint's tensor rows (pure, synthetic rows)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sparsetool.errors import CheckpointError
from sparsetool.flops import account, forward_terms, infer_model


@dataclass
class Row:  # the attributes sparsetool.ops.report rows carry
    name: str
    shape: tuple
    dtype: str
    role: str
    targeted: bool
    numel: int
    nonzero: int


def row(name, shape, role, sparsity=0.0, targeted=None, dtype="float32"):
    numel = 1
    for x in shape:
        numel *= x
    if targeted is None:
        targeted = role in ("qkv", "attn_out", "ffn_in", "ffn_out") and len(shape) == 2
    return Row(name, tuple(shape), dtype, role, targeted, numel, numel - round(sparsity * numel))


def gpt2_rows(L=3, d=16, f=64, V=50, s=32, sparsity=(0.5, 0.25, 0.75, 0.0)):
    """Conv1D layout (in, out), fused c_attn, tied head, learned positions, biases."""
    rows = [
        row("transformer.wte.weight", (V, d), "embedding"),
        row("transformer.wpe.weight", (s, d), "position"),
    ]
    for i in range(L):
        p = f"transformer.h.{i}."
        rows += [
            row(p + "ln_1.weight", (d,), "norm"),
            row(p + "ln_1.bias", (d,), "bias"),
            row(p + "attn.c_attn.weight", (d, 3 * d), "qkv", sparsity[0]),
            row(p + "attn.c_attn.bias", (3 * d,), "bias"),
            row(p + "attn.c_proj.weight", (d, d), "attn_out", sparsity[1]),
            row(p + "mlp.c_fc.weight", (d, f), "ffn_in", sparsity[2]),
            row(p + "mlp.c_proj.weight", (f, d), "ffn_out", sparsity[3]),
        ]
    return rows + [row("transformer.ln_f.weight", (d,), "norm")]


def llama_rows(L=2, d=32, heads=4, kv=2, f=48, V=40, sparsity=0.5, fused=False):
    """nn.Linear layout (out, in), separate q/k/v with GQA, SwiGLU, untied head, no biases."""
    k = d // heads
    rows = [
        row("model.embed_tokens.weight", (V, d), "embedding"),
        row("lm_head.weight", (V, d), "head"),
        row("model.norm.weight", (d,), "norm"),
    ]
    for i in range(L):
        p = f"model.layers.{i}."
        rows += [
            row(p + "self_attn.q_proj.weight", (heads * k, d), "qkv", sparsity),
            row(p + "self_attn.k_proj.weight", (kv * k, d), "qkv", sparsity),
            row(p + "self_attn.v_proj.weight", (kv * k, d), "qkv", sparsity),
            row(p + "self_attn.o_proj.weight", (d, heads * k), "attn_out", sparsity),
            row(p + "mlp.down_proj.weight", (d, f), "ffn_out", sparsity),
            row(p + "input_layernorm.weight", (d,), "norm"),
        ]
        if fused:
            rows.append(row(p + "mlp.gate_up_proj.weight", (2 * f, d), "ffn_in", sparsity))
        else:
            rows += [
                row(p + "mlp.gate_proj.weight", (f, d), "ffn_in", sparsity),
                row(p + "mlp.up_proj.weight", (f, d), "ffn_in", sparsity),
            ]
    return rows


def test_gpt2_layout_with_config_json_heads():
    m = infer_model(gpt2_rows(), name="g", hf_config={"n_head": 4})
    c = m.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_head, c.d_ff, c.vocab, c.context) == (
        3,
        16,
        4,
        4,
        64,
        50,
        32,
    )
    # counted at the model's context, shorter than the 2048 of other sources (issue 31, item 9)
    assert (c.seq_len, c.seq_len_source) == (32, "the model's context")
    assert (c.ffn_matrices, c.n_kv_heads, c.learned_positions, c.tied_embeddings, c.biases) == (
        2,
        None,
        True,
        True,
        True,
    )
    assert m.notes == []
    assert m.layer_sparsity == [{"qkv": 0.5, "attn_out": 0.25, "ffn_in": 0.75, "ffn_out": 0.0}] * 3
    # numel-weighted over the targeted matrices: (768*.5 + 256*.25 + 1024*.75) / 3072
    assert m.targeted_sparsity == pytest.approx((768 * 0.5 + 256 * 0.25 + 1024 * 0.75) / 3072)
    rows = gpt2_rows()
    assert m.params == {
        "total": sum(r.numel for r in rows),
        "nonzero": sum(r.nonzero for r in rows),
    }
    # The per-layer sparsities scale each term as prune made them.
    t, dense = forward_terms(c, sparsity=m.layer_sparsity), forward_terms(c)
    assert t["qkv"] == dense["qkv"] * 0.5 and t["attn_out"] == dense["attn_out"] * 0.75
    assert t["ffn"] == dense["ffn"] / 2 * 0.25 + dense["ffn"] / 2


def test_heads_assumed_without_config_json_and_said_so():
    m = infer_model(gpt2_rows(d=256, f=1024), name="g")
    assert (m.config.d_head, m.config.n_heads) == (64, 4)
    assert any("assumed d_head=64" in n for n in m.notes)
    m = infer_model(gpt2_rows(d=2048, f=8192, L=1), name="g")
    assert (m.config.d_head, m.config.n_heads) == (128, 16)  # GPT-3 XL's heads


def test_llama_layout_gqa_swiglu_and_measured_params():
    m = infer_model(
        llama_rows(),
        name="l",
        hf_config={
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 128,
        },
    )
    c = m.config
    assert (c.n_layers, c.d_model, c.n_heads, c.d_head, c.n_kv_heads, c.d_ff) == (
        2,
        32,
        4,
        8,
        2,
        48,
    )
    assert (
        c.ffn_matrices,
        c.vocab,
        c.context,
        c.learned_positions,
        c.tied_embeddings,
        c.biases,
    ) == (3, 40, 128, False, False, False)
    assert m.targeted_sparsity == pytest.approx(0.5)
    r = account(c, sparsity=m.layer_sparsity, params=m.params)
    assert r["nonzero_params"] == m.params["nonzero"]


def test_gqa_inferred_from_widths_when_config_lacks_kv_heads():
    m = infer_model(llama_rows(), name="l", hf_config={"num_attention_heads": 4})
    assert m.config.n_kv_heads == 2


def test_fused_gate_up_is_swiglu():
    m = infer_model(llama_rows(fused=True), name="l", hf_config={"num_attention_heads": 4})
    assert (m.config.ffn_matrices, m.config.d_ff) == (3, 48)


def test_untargeted_matrix_counts_dense_and_masks_and_ints_are_ignored():
    rows = gpt2_rows(sparsity=(0.5, 0.5, 0.5, 0.5))
    for r in rows:
        if r.name.endswith("h.1.mlp.c_proj.weight"):
            r.targeted = False  # say --exclude '*h.1.mlp*'
    rows.append(row("transformer.h.0.attn.c_attn.weight_mask", (16, 48), "other", dtype="bool"))
    rows.append(row("transformer.h.0.attn.bias", (1, 1, 32, 32), "bias", dtype="uint8"))
    m = infer_model(rows, name="g", hf_config={"n_head": 4})
    assert m.layer_sparsity[1]["ffn_out"] == 0.0 and m.layer_sparsity[0]["ffn_out"] == 0.5
    assert m.params["total"] == sum(r.numel for r in gpt2_rows())


def test_plain_dicts_and_seq_len_vocab_overrides():
    rows = [vars(r) for r in gpt2_rows()]
    m = infer_model(rows, name="g", hf_config={"n_head": 4}, seq_len=8, vocab=99)
    assert (m.config.seq_len, m.config.vocab) == (8, 99)


def test_sequence_length_defaults_with_a_note():
    rows = [r for r in gpt2_rows() if r.role != "position"]
    m = infer_model(rows, name="g", hf_config={"n_head": 4})
    assert m.config.seq_len == 2048 and any("assumed 2048" in n for n in m.notes)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (
            lambda rows: [
                r for r in rows if r.role not in ("qkv", "attn_out", "ffn_in", "ffn_out")
            ],
            "no attention or feed-forward",
        ),
        (
            lambda rows: [r for r in rows if not r.name.endswith("h.2.mlp.c_proj.weight")],
            "no ffn_out",
        ),
        (
            lambda rows: (
                rows
                + [row(f"transformer.h.{i}.mlp.c_fc2.weight", (16, 32), "ffn_in") for i in range(3)]
            ),
            "1x or 2x",
        ),
        (
            lambda rows: [
                r if not r.name.endswith("h.0.mlp.c_fc.weight") else row(r.name, (17, 64), "ffn_in")
                for r in rows
            ],
            "neither side",
        ),
        (lambda rows: rows[:0] + [row("x", (3,), "other", dtype="int64")], "no floating"),
    ],
)
def test_unusable_rows_raise_clear_errors(mutate, match):
    with pytest.raises(CheckpointError, match=match):
        infer_model(mutate(gpt2_rows()), name="g", hf_config={"n_head": 4})


def test_layers_of_different_shapes_are_refused():
    rows = gpt2_rows()
    rows = [
        r if not r.name.endswith("h.2.mlp.c_fc.weight") else row(r.name, (16, 32), "ffn_in")
        for r in rows
    ]
    rows = [
        r if not r.name.endswith("h.2.mlp.c_proj.weight") else row(r.name, (32, 16), "ffn_out")
        for r in rows
    ]
    with pytest.raises(CheckpointError, match="differ in shape"):
        infer_model(rows, name="g", hf_config={"n_head": 4})
