"""sparsetool diff: hand-computed numbers, Q/K/V layouts, encodings, mismatches, the command."""

from __future__ import annotations

import json
import math
from decimal import Decimal, getcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from sparsetool.checkpoint import encode, open_checkpoint
from sparsetool.errors import SparsetoolError
from sparsetool.ops.diff import diff, pair_stats, plot_diff, split_parts

from helpers import gpt2_like_state, is_gpt2_target, run


def save(path: Path, state: dict[str, torch.Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})
    return path


def save_dir(path: Path, state: dict[str, torch.Tensor], config: dict) -> Path:
    path.mkdir()
    save(path / "model.safetensors", state)
    (path / "config.json").write_text(json.dumps(config))
    return path


def rows_by(result, name):
    return {r.part or r.kind: r for r in result.rows if r.name == name}


# --------------------------------------------------------------------------- numbers by hand
PROJ, FC = "blocks.0.attn.proj.weight", "blocks.0.mlp.fc.weight"


@pytest.fixture
def hand_pair(tmp_path):
    # proj: A = (3, 0, 0, 4), B = (3, 1, 0, 0); fc is the same in both.
    fc = torch.tensor([[1.0, 2.0], [0.0, 0.0]])
    a = {PROJ: torch.tensor([[3.0, 0.0], [0.0, 4.0]]), FC: fc, "head.weight": torch.ones(2, 2)}
    b = {
        PROJ: torch.tensor([[3.0, 1.0], [0.0, 0.0]]),
        FC: fc.clone(),
        "head.weight": torch.zeros(2, 2),
    }
    return save(tmp_path / "a.safetensors", a), save(tmp_path / "b.safetensors", b)


def test_hand_computed_tensor_numbers(hand_pair):
    result = diff(*hand_pair)
    assert [r.name for r in result.rows] == [PROJ, FC]  # the head is not targeted
    s = result.rows[0].stats
    assert (s.numel, s.nonzero_a, s.nonzero_b, s.nonzero_both) == (4, 2, 2, 1)
    assert (s.sparsity_a, s.sparsity_b) == (0.5, 0.5)
    assert s.iou == pytest.approx(1 / 3, abs=1e-15)  # {0, 3} vs {0, 1}
    assert (s.revived, s.pruned) == (1, 1)  # index 1 revived, index 3 pruned
    assert s.rel_l2 == pytest.approx(math.sqrt(17) / 5, abs=1e-15)  # B-A = (0, 1, 0, -4)
    assert s.angular_distance == pytest.approx(1 - 9 / (5 * math.sqrt(10)), abs=1e-15)
    same = result.rows[1].stats
    assert (same.iou, same.revived, same.pruned, same.rel_l2, same.angular_distance) == (
        1.0,
        0,
        0,
        0.0,
        0.0,
    )
    assert (result.rows[0].layer, result.rows[0].kind, result.rows[1].kind) == (
        0,
        "attn_out",
        "ffn_in",
    )


def test_summary_pools_sums_not_per_tensor_ratios(hand_pair):
    t = diff(*hand_pair).total
    # A = (3,0,0,4, 1,2,0,0), B = (3,1,0,0, 1,2,0,0): |A|^2 = 30, |B|^2 = 15, A.B = 14, |B-A|^2 = 17
    assert (t.sq_a, t.sq_b, t.dot, t.sq_diff) == (30.0, 15.0, 14.0, 17.0)
    assert t.iou == pytest.approx(3 / 5, abs=1e-15)
    assert (t.revived, t.pruned, t.sparsity_a, t.sparsity_b) == (1, 1, 0.5, 0.5)
    assert t.rel_l2 == pytest.approx(math.sqrt(17 / 30), abs=1e-15)
    assert t.angular_distance == pytest.approx(1 - 14 / math.sqrt(450), abs=1e-15)
    per_tensor_mean = (1 - 9 / (5 * math.sqrt(10)) + 0) / 2
    assert abs(t.angular_distance - per_tensor_mean) > 0.01


def test_zero_vectors_and_opposite_directions():
    z, one = torch.zeros(2, 2), torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    both_zero = pair_stats(z, z)
    assert (both_zero.iou, both_zero.rel_l2, both_zero.angular_distance) == (1.0, 0.0, 0.0)
    a_zero = pair_stats(z, one)
    assert (a_zero.iou, a_zero.revived, a_zero.rel_l2, a_zero.angular_distance) == (
        0.0,
        3,
        math.inf,
        1.0,
    )
    assert a_zero.to_json()["rel_l2"] is None  # JSON has no infinity
    b_zero = pair_stats(one, z)
    assert (b_zero.pruned, b_zero.rel_l2, b_zero.angular_distance) == (3, 1.0, 1.0)
    flipped = pair_stats(one, -one)
    assert (flipped.iou, flipped.rel_l2, flipped.angular_distance) == (1.0, 2.0, 2.0)
    assert pair_stats(one, 3 * one).angular_distance == 0.0  # scaling keeps the direction
    # -0.0 is a zero, pruned or not
    neg = pair_stats(torch.tensor([[-0.0, 1.0]]), torch.tensor([[0.0, 1.0]]))
    assert (neg.nonzero_a, neg.nonzero_b, neg.iou) == (1, 1, 1.0)


def test_angular_distance_keeps_its_digits_for_tiny_changes():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g, dtype=torch.float64)
    b = a + 1e-9 * torch.randn(4, 4, generator=g, dtype=torch.float64)
    getcontext().prec = 60
    xa, xb = [Decimal(v) for v in a.flatten().tolist()], [Decimal(v) for v in b.flatten().tolist()]
    dot = sum(x * y for x, y in zip(xa, xb))
    exact = 1 - dot / (sum(x * x for x in xa).sqrt() * sum(y * y for y in xb).sqrt())
    got = pair_stats(a, b).angular_distance
    assert 0 < float(exact) < 1e-16  # where 1 - cos in float64 would give 0 or noise
    assert got == pytest.approx(float(exact), rel=1e-6)


def test_float64_accumulation_of_bf16_weights():
    a = torch.full((512, 512), 1.0, dtype=torch.bfloat16)
    s = pair_stats(a, a * 2)
    assert (s.sq_a, s.sq_b, s.dot) == (262144.0, 4 * 262144.0, 2 * 262144.0)
    assert s.rel_l2 == 1.0 and s.angular_distance == 0.0


# --------------------------------------------------------------------------- Q/K/V layouts
def test_gpt2_conv1d_c_attn_splits_columns(tmp_path):
    d, name = 4, "transformer.h.0.attn.c_attn.weight"
    g = torch.Generator().manual_seed(1)
    a = torch.randn(d, 3 * d, generator=g)  # Conv1D (in, out): output columns are q | k | v
    b = a.clone()
    b[:, d : 2 * d] += torch.randn(d, d, generator=g)  # only K moves
    b[0, 2 * d] = 0.0  # one V weight pruned
    src, dst = (
        save(tmp_path / "a.safetensors", {name: a}),
        save(tmp_path / "b.safetensors", {name: b}),
    )
    rows = rows_by(diff(src, dst), name)
    assert [rows[k].kind for k in "QKV"] == ["Q", "K", "V"]
    assert all(rows[k].shape == (d, d) for k in "QKV")
    assert rows["Q"].stats.angular_distance == 0.0 and rows["Q"].stats.rel_l2 == 0.0
    assert rows["K"].stats == pair_stats(a[:, d : 2 * d], b[:, d : 2 * d])
    assert rows["K"].stats.angular_distance > 0
    assert (rows["V"].stats.pruned, rows["K"].stats.pruned, rows["Q"].stats.pruned) == (1, 0, 0)


def test_gpt2_config_decides_conv1d_or_linear(tmp_path):
    # transformers' GPT-2 with config model_type gpt2 (Conv1D) and a GPT-BigCode-like Linear c_attn
    d, name = 4, "transformer.h.0.attn.c_attn.weight"
    a = torch.arange(3.0 * d * d).reshape(d, 3 * d) + 1
    b = a.clone()
    b[:, 0:d] *= -1  # Conv1D Q columns flipped
    gpt2 = diff(
        save_dir(tmp_path / "a", {name: a}, {"model_type": "gpt2"}),
        save_dir(tmp_path / "b", {name: b}, {"model_type": "gpt2"}),
    )
    rows = rows_by(gpt2, name)
    assert rows["Q"].stats.angular_distance == pytest.approx(2.0, abs=1e-15)
    assert rows["K"].stats.angular_distance == 0.0
    lin_a, lin_b = a.T.contiguous(), b.T.contiguous()  # Linear (3d, d): Q rows flipped
    big = diff(
        save_dir(tmp_path / "c", {name: lin_a}, {"model_type": "gpt_bigcode"}),
        save_dir(tmp_path / "e", {name: lin_b}, {"model_type": "gpt_bigcode"}),
    )
    rows = rows_by(big, name)
    assert (rows["Q"].shape, rows["V"].stats.angular_distance) == ((d, d), 0.0)
    assert rows["Q"].stats.angular_distance == pytest.approx(2.0, abs=1e-15)


def test_builtin_gpt_qkv_splits_rows(tmp_path):
    d, name = 4, "blocks.1.attn.qkv.weight"
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3 * d, d, generator=g)  # nn.Linear (3d, d): rows q | k | v
    b = a.clone()
    b[2 * d :] = 0.0  # V pruned away entirely
    rows = rows_by(
        diff(
            save(tmp_path / "a.safetensors", {name: a}), save(tmp_path / "b.safetensors", {name: b})
        ),
        name,
    )
    assert (rows["V"].layer, rows["V"].stats.sparsity_b, rows["V"].stats.angular_distance) == (
        1,
        1.0,
        1.0,
    )
    assert rows["V"].stats.pruned == d * d
    assert rows["Q"].stats.angular_distance == rows["K"].stats.angular_distance == 0.0


def test_neox_query_key_value_is_interleaved_per_head(tmp_path):
    heads, hd, name = 2, 2, "gpt_neox.layers.0.attention.query_key_value.weight"
    d = heads * hd
    g = torch.Generator().manual_seed(3)
    a = torch.randn(3 * d, d, generator=g)  # rows: head0 (q q k k v v), head1 (q q k k v v)
    b = a.clone()
    k_rows = [2, 3, 8, 9]
    b[k_rows] += torch.randn(len(k_rows), d, generator=g)
    cfg = {"model_type": "gpt_neox", "num_attention_heads": heads}
    result = diff(
        save_dir(tmp_path / "a", {name: a}, cfg), save_dir(tmp_path / "b", {name: b}, cfg)
    )
    rows = rows_by(result, name)
    assert rows["Q"].stats.angular_distance == rows["V"].stats.angular_distance == 0.0
    assert rows["K"].stats == pair_stats(a[k_rows], b[k_rows])
    assert rows["K"].shape == (d, d) and not result.notes
    # without the head count the tensor is compared whole, and the user is told why
    bare = diff(
        save(tmp_path / "a.safetensors", {name: a}), save(tmp_path / "b.safetensors", {name: b})
    )
    assert [(r.kind, r.part) for r in bare.rows] == [("QKV", None)]
    assert "num_attention_heads" in bare.notes[0]


def test_separate_projections_and_gate_up(tmp_path):
    names = [f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkvo"] + [
        f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")
    ]
    g = torch.Generator().manual_seed(4)
    a = {n: torch.randn(4, 4, generator=g) for n in names}
    b = {n: t * (2 if "gate" in n else 1) for n, t in a.items()}
    b[names[-2]] = -a[names[-2]]  # up flipped
    result = diff(save(tmp_path / "a.safetensors", a), save(tmp_path / "b.safetensors", b))
    assert [r.kind for r in result.rows] == [
        "Q",
        "K",
        "V",
        "attn_out",
        "ffn_in",
        "ffn_in",
        "ffn_out",
    ]
    assert all(r.part is None for r in result.rows)
    cell = result.cells()[(0, "ffn_in")]  # gate (same direction) and up (flipped) pooled
    assert cell == result.rows[4].stats + result.rows[5].stats
    assert 0.0 < cell.angular_distance < 2.0


def test_split_parts_documents_what_it_cannot_split():
    parts, note = split_parts("model.layers.0.self_attn.qkv_proj.weight", (5, 4))  # 5 - 4 is odd
    assert [k for k, _, _ in parts] == ["QKV"] and "do not split" in note
    parts, note = split_parts("model.layers.0.attention.wqkv.weight", (12, 4))
    assert [k for k, _, _ in parts] == ["QKV"] and "not known" in note
    gqa, note = split_parts("model.layers.0.self_attn.qkv_proj.weight", (8, 4))  # q 4, k 2, v 2
    t = torch.arange(8.0)[:, None].expand(8, 4)
    assert [take(t)[:, 0].tolist() for _, _, take in gqa] == [[0, 1, 2, 3], [4, 5], [6, 7]]


# --------------------------------------------------------------------------- encodings, errors
def encoded(state: dict[str, torch.Tensor], encoding: str) -> dict[str, torch.Tensor]:
    if encoding == "zeros":
        return state
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if is_gpt2_target(name):
            out.update(dict(encode(name, t, t != 0, encoding)))
        else:
            out[name] = t
    return out


@pytest.mark.parametrize(
    "enc_a,enc_b",
    [
        ("zeros", "mask"),
        ("zeros", "nan"),
        ("zeros", "bitmask"),
        ("bitmask", "nan"),
        ("mask", "bitmask"),
    ],
)
def test_encodings_give_the_same_numbers_as_zeros(tmp_path, enc_a, enc_b):
    dense = gpt2_like_state(seed=5)
    a, b = {}, {}
    for name, t in dense.items():
        g = torch.Generator().manual_seed(len(name))
        a[name] = t * (torch.rand(t.shape, generator=g) > 0.5) if t.dim() == 2 else t
        b[name] = t * (torch.rand(t.shape, generator=g) > 0.7) if t.dim() == 2 else t
    reference = diff(
        save(tmp_path / "za.safetensors", a), save(tmp_path / "zb.safetensors", b)
    ).to_json()
    ea = save(tmp_path / f"a-{enc_a}.safetensors", encoded(a, enc_a))
    eb = save(tmp_path / f"b-{enc_b}.safetensors", encoded(b, enc_b))
    for path, enc in ((ea, enc_a), (eb, enc_b)):  # the files really hold these encodings
        with open_checkpoint(path) as ckpt:
            stored = {lt.encoding for lt in ckpt.logical if is_gpt2_target(lt.name)}
            assert stored == {{"zeros": "plain", "nan": "plain"}.get(enc, enc)}
            if enc == "nan":
                assert ckpt.read_stored("transformer.h.0.mlp.c_fc.weight").isnan().any()
    got = diff(ea, eb).to_json()
    assert got["tensors"] == reference["tensors"]
    assert reference["summary"]["revived"] > 0 and reference["summary"]["pruned"] > 0


def test_mismatched_checkpoints_name_the_first_differing_tensor(tmp_path):
    state = gpt2_like_state(n_layer=1)
    a = save(tmp_path / "a.safetensors", state)
    wrong = dict(state)
    wrong["transformer.h.0.mlp.c_fc.weight"] = torch.zeros(16, 32)
    with pytest.raises(SparsetoolError, match=r"h\.0\.mlp\.c_fc\.weight.*\[16, 64\].*\[16, 32\]"):
        diff(a, save(tmp_path / "b.safetensors", wrong))
    fewer = {k: v for k, v in state.items() if k != "transformer.h.0.attn.c_proj.weight"}
    with pytest.raises(
        SparsetoolError,
        match=r"'transformer\.h\.0\.attn\.c_proj\.weight' is in .*a\.safetensors but not in",
    ):
        diff(a, save(tmp_path / "c.safetensors", fewer))
    more = {**state, "extra.weight": torch.zeros(2, 2)}
    with pytest.raises(SparsetoolError, match=r"'extra\.weight' is in .*d\.safetensors but not in"):
        diff(a, save(tmp_path / "d.safetensors", more))


def test_no_targeted_tensor_is_an_error(tmp_path):
    a = save(tmp_path / "a.safetensors", {"lm_head.weight": torch.ones(2, 2)})
    with pytest.raises(SparsetoolError, match="--include"):
        diff(a, a)
    assert diff(a, a, include=["lm_head.*"]).rows[0].kind == "other"


# --------------------------------------------------------------------------- plot and command
def test_plot_for_many_layers(tmp_path):
    a = save(tmp_path / "a.safetensors", gpt2_like_state(n_layer=24, d=8, seed=6))
    b = save(tmp_path / "b.safetensors", gpt2_like_state(n_layer=24, d=8, seed=7))
    out = plot_diff(diff(a, b), tmp_path / "p.png").path
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SparsetoolError, match="nothing to plot"):
        lm = save(tmp_path / "h.safetensors", {"lm_head.weight": torch.ones(2, 2)})
        plot_diff(diff(lm, lm, include=["lm_head.*"]), tmp_path / "q.png")


def test_cli(tmp_path, hand_pair):
    a, b = (str(p) for p in hand_pair)
    res = run("diff", a, b)
    assert res.exit_code == 0, res.output
    assert PROJ in res.stdout and "angular distance" in res.stdout.splitlines()[-1]
    res = run("diff", a, b, "--json")
    data = json.loads(res.stdout)
    assert set(data) == {"tensors", "summary"} and len(data["tensors"]) == 2
    assert data["summary"]["angular_distance"] == pytest.approx(1 - 14 / math.sqrt(450))
    res = run("diff", a, b, "--exclude", "*fc*", "--json")
    assert [t["name"] for t in json.loads(res.stdout)["tensors"]] == [PROJ]
    png = tmp_path / "heat.png"
    res = run("diff", a, b, "--plot", str(png), "--quiet")
    assert res.exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    assert res.stdout.splitlines()[0].startswith("all 8 targeted weights (2 matrices)")
    res = run("diff", a, str(tmp_path / "missing.safetensors"))
    assert res.exit_code == 1 and res.stderr.startswith("error:") and not res.stdout
    res = run("diff", a, b, "--plot", str(tmp_path / "heat.jpg"))
    assert res.exit_code == 2 and ".png" in res.stderr  # a usage error
    help_text = run("diff", "--help").stdout
    assert help_text.count("sparsetool diff ") >= 3
