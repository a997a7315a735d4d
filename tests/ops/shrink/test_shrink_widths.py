"""shrink --ffn / --heads / --hidden: with --no-reconstruct the written model equals the input
narrowed by hand in transformers (the same rows and columns sliced into a model of the new config)
for Llama with grouped-query attention (whole key/value groups, or query heads per group), Qwen2
(attention biases), Qwen3, Gemma-3 and GPT-2's FFN, tied and untied heads; channels and heads
are ranked by their activations; a fused attention, and for --hidden a Mixture of Experts, are
refused. Reconstruction (the default): test_shrink_refit.py."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as t

from sparsetool.errors import SparsetoolError
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

from helpers import CALIB as WINDOWS
from helpers import run, save_tokenizer

# the tiny models' widths (hidden 32, FFN 48, head_dim 4-8) hold few multiples of 32: these
# tests take the exact fractions (test_shrink_multiple_of.py: the rounding)
CALIB = dict(WINDOWS, multiple_of=1)

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":  # 8 query heads in 4 key/value groups of 2
        cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                            num_attention_heads=8, num_key_value_heads=4, **_SMALL)  # fmt: skip
        return t.LlamaForCausalLM(cfg).eval()
    if kind == "llama9":  # SmolLM2-135M's attention: 9 query heads in 3 groups of 3
        cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=36, intermediate_size=48,
                            num_attention_heads=9, num_key_value_heads=3, **_SMALL)  # fmt: skip
        return t.LlamaForCausalLM(cfg).eval()
    if kind == "llama_mha":  # plain multi-head attention: each head its own key/value head
        cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                            num_attention_heads=4, num_key_value_heads=4, **_SMALL)  # fmt: skip
        return t.LlamaForCausalLM(cfg).eval()
    if kind == "qwen3":
        cfg = t.Qwen3Config(num_hidden_layers=2, hidden_size=32, intermediate_size=48, head_dim=8,
                            num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
        return t.Qwen3ForCausalLM(cfg).eval()
    if kind == "qwen2":  # q/k/v biases, untied head
        cfg = t.Qwen2Config(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                            num_attention_heads=4, num_key_value_heads=2,
                            tie_word_embeddings=False, **_SMALL)  # fmt: skip
        return t.Qwen2ForCausalLM(cfg).eval()
    if kind == "gemma3":
        cfg = t.Gemma3TextConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=48,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 sliding_window=8, **_SMALL)  # fmt: skip
        return t.Gemma3ForCausalLM(cfg).eval()
    if kind == "gpt2":
        cfg = t.GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, vocab_size=320,
                           bos_token_id=1, eos_token_id=1)  # fmt: skip
        return t.GPT2LMHeadModel(cfg).eval()
    raise ValueError(kind)


def narrowed_by_hand(model: torch.nn.Module, widths: dict) -> torch.nn.Module:
    """A model of the narrower config holding the input's weights, the kept rows and columns
    sliced in transformers' own orientation."""
    cfg = model.config.to_dict()
    gpt2 = model.config.model_type == "gpt2"
    if "ffn" in widths:
        cfg["n_inner" if gpt2 else "intermediate_size"] = widths["ffn"]["after"]
    if "heads" in widths:
        cfg["num_attention_heads"] = widths["heads"]["after"]["heads"]
        cfg["num_key_value_heads"] = widths["heads"]["after"]["kv_heads"]
        cfg["head_dim"] = widths["heads"]["head_dim"]
    if "hidden" in widths:
        cfg["hidden_size"] = widths["hidden"]["after"]
        cfg["head_dim"] = widths["hidden"]["head_dim"]
    small = type(model)(type(model.config).from_dict(cfg)).eval()
    state = model.state_dict()
    hd = widths.get("heads", {}).get("head_dim", 0)
    if "hidden" in widths:
        state = hidden_sliced(model, state, torch.tensor(widths["hidden"]["kept"]))
    for i, layer in enumerate(widths["layers"]):
        p = f"transformer.h.{i}" if gpt2 else f"model.layers.{i}"
        if "ffn_kept" in layer:
            c = torch.tensor(layer["ffn_kept"])
            if gpt2:
                state[f"{p}.mlp.c_fc.weight"] = state[f"{p}.mlp.c_fc.weight"][:, c]
                state[f"{p}.mlp.c_fc.bias"] = state[f"{p}.mlp.c_fc.bias"][c]
                state[f"{p}.mlp.c_proj.weight"] = state[f"{p}.mlp.c_proj.weight"][c]
            else:
                for n in ("gate_proj", "up_proj"):
                    state[f"{p}.mlp.{n}.weight"] = state[f"{p}.mlp.{n}.weight"][c]
                state[f"{p}.mlp.down_proj.weight"] = state[f"{p}.mlp.down_proj.weight"][:, c]
        if "heads_kept" in layer:
            rows = torch.tensor([h * hd + d for h in layer["heads_kept"] for d in range(hd)])
            kv = torch.tensor([k * hd + d for k in layer["kv_kept"] for d in range(hd)])
            a = f"{p}.self_attn"
            state[f"{a}.q_proj.weight"] = state[f"{a}.q_proj.weight"][rows]
            state[f"{a}.k_proj.weight"] = state[f"{a}.k_proj.weight"][kv]
            state[f"{a}.v_proj.weight"] = state[f"{a}.v_proj.weight"][kv]
            state[f"{a}.o_proj.weight"] = state[f"{a}.o_proj.weight"][:, rows]
    small.load_state_dict(state)
    return small


def hidden_sliced(model: torch.nn.Module, state: dict, c: torch.Tensor) -> dict:
    """``state`` with the embedding channels ``c`` kept: embedding and head columns, q/k/v and
    gate/up columns, o and down rows, and every norm over the hidden size (not q_norm/k_norm)."""
    d = model.config.hidden_size
    out = {}
    for name, w in state.items():
        leaf = name.rsplit(".", 2)[-2] if name.count(".") >= 1 else name
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            w = w[:, c]
        elif leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            w = w[:, c] if name.endswith("weight") else w
        elif leaf in ("o_proj", "down_proj"):
            w = w[c]
        elif "norm" in leaf and leaf not in ("q_norm", "k_norm"):
            assert w.shape == (d,), name
            w = w[c]
        out[name] = w
    return out


def save(kind, directory, text) -> torch.nn.Module:
    model = build(kind)
    model.save_pretrained(directory)
    save_tokenizer(directory, text)
    return model


CASES = [
    ("llama", dict(ffn=0.5, heads=0.5), "groups"),
    ("llama", dict(heads=0.6), "query heads per group"),  # 4 x 0.6 is no whole number of groups
    ("llama9", dict(heads=0.5), "query heads per group"),  # round(0.5 x 3) = 2 of each group
    ("llama_mha", dict(heads=0.6), "groups"),  # round(0.6 x 4) = 2 heads, not 1 of each of 4
    ("qwen3", dict(ffn=0.75, heads=0.5), "groups"),
    ("gemma3", dict(ffn=0.5, heads=0.5), "groups"),
    ("gpt2", dict(ffn=0.25), None),
    ("llama", dict(hidden=0.75), None),  # untied head
    ("llama", dict(ffn=0.5, heads=0.5, hidden=0.5), "groups"),  # q/k/v/o cut on both axes
    ("qwen2", dict(hidden=0.5), None),
    ("qwen3", dict(hidden=0.5, heads=0.6), "query heads per group"),
    ("gemma3", dict(hidden=0.75), None),  # tied head, its embedding scale follows the config
]


@pytest.mark.parametrize("kind, asked, mode", CASES)
def test_without_reconstruction_the_model_is_the_input_narrowed_by_hand(
    kind, asked, mode, tmp_path, text, calib_file
):
    model = save(kind, tmp_path / "in", text)
    opts = ShrinkOptions(calibration=calib_file, reconstruct=False, **asked, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    widths = result.widths.to_json()
    if mode:
        assert widths["heads"]["mode"] == mode
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(2, 300, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = narrowed_by_hand(model, widths)(ids, use_cache=False).logits
        got = out(ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert result.parameters_after == sum(p.numel() for p in out.parameters())
    assert result.parameters_after < result.parameters_before
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    if "ffn" in asked:
        assert cfg["n_inner" if kind == "gpt2" else "intermediate_size"] == widths["ffn"]["after"]
    if "hidden" in asked:
        d = model.config.hidden_size
        assert (widths["hidden"]["before"], widths["hidden"]["after"]) == (
            d,
            round(asked["hidden"] * d),
        )
        assert cfg["hidden_size"] == widths["hidden"]["after"] == len(widths["hidden"]["kept"])
        assert ("sqrt" in " ".join(result.notes)) == (kind == "gemma3")


def test_channels_are_ranked_by_mean_absolute_activation(tmp_path, text, calib_file):
    """The kept FFN channels are those whose down-projection inputs, hooked in transformers on the
    same windows, have the largest mean |a| (without reconstruction every block is scored on the
    original model)."""
    from sparsetool.ops.calibration import calibration_windows

    model = save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(ffn=0.5, calibration=calib_file, reconstruct=False, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    sums = [torch.zeros(48, dtype=torch.float64) for _ in range(2)]

    def hook(i: int):
        def see(module, args) -> None:  # a pre-hook that returns nothing leaves the input alone
            sums[i].add_(args[0].reshape(-1, 48).abs().double().sum(0))

        return see

    handles = [
        layer.mlp.down_proj.register_forward_pre_hook(hook(i))
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    for h in handles:
        h.remove()
    for i in range(2):
        want = sorted(sorted(range(48), key=lambda c: (-float(sums[i][c]), c))[:24])
        assert result.widths.layers[i]["ffn_kept"] == want


def test_fused_attention_and_bad_fractions_are_refused(tmp_path, text, calib_file):
    save("gpt2", tmp_path / "in", text)
    with pytest.raises(SparsetoolError, match="fused projection"):
        shrink_checkpoint(tmp_path / "in", tmp_path / "out",
                          ShrinkOptions(heads=0.5, calibration=calib_file, **CALIB))  # fmt: skip
    assert not (tmp_path / "out").exists()
    for args, says in [
        (["--ffn", "1"], "--ffn must be strictly between 0 and 1 (the fraction kept), got 1.0"),
        (["--ffn", "0.5", "--experts", "0.5"], "one of"),
        (["--heads", "0.5"], "give --calibration"),
    ]:
        r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", *args)
        assert r.exit_code == 2 and says in r.output and r.output.count("error:") == 1, r.output


def test_flops_and_eval_read_the_narrowed_model(tmp_path, text, calib_file):
    save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(ffn=0.5, heads=0.5, hidden=0.75, calibration=calib_file, **CALIB)
    shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    r = run("flops", "--config", tmp_path / "out" / "config.json", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["config"]
    assert (got["d_model"], got["d_ff"], got["n_heads"], got["n_kv_heads"], got["d_head"]) == (
        24, 24, 4, 2, 4)  # fmt: skip
    r = run("eval", tmp_path / "in", tmp_path / "out", "--text", calib_file, "--seq", "16",
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["checkpoints"]
    assert rows[1]["params"] < rows[0]["params"] and rows[1]["perplexity"] > 1
    r = run("prune", tmp_path / "out", "-o", tmp_path / "pruned", "--method", "wanda", "-s",
            "0.5", "--calibration", calib_file, "--samples", "2", "--seq", "16")  # fmt: skip
    assert r.exit_code == 0, r.output
    pruned = t.AutoModelForCausalLM.from_pretrained(tmp_path / "pruned")
    q = pruned.model.layers[0].self_attn.q_proj.weight
    assert q.shape == (16, 24) and float((q == 0).float().mean()) == 0.5


def test_embedding_channels_are_ranked_by_every_norm_output(tmp_path, text, calib_file):
    """--hidden keeps the channels of largest summed mean |y| over the outputs of every norm over
    the hidden size (each block's two and the final one), hooked in transformers on the same
    windows."""
    from sparsetool.ops.calibration import calibration_windows

    model = save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(hidden=0.5, calibration=calib_file, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    sums = torch.zeros(32, dtype=torch.float64)

    def see(module, args, output) -> None:
        sums.add_(output.reshape(-1, 32).abs().double().sum(0))

    norms = [m for n, m in model.named_modules() if n.endswith("norm")]
    assert len(norms) == 5  # two per block, the final one
    handles = [m.register_forward_hook(see) for m in norms]
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    for h in handles:
        h.remove()
    want = sorted(sorted(range(32), key=lambda c: (-float(sums[c]), c))[:16])
    assert result.widths.hidden.kept == want


def test_hidden_refuses_fused_attention_experts_and_empty_widths(tmp_path, text, calib_file):
    from moe_models import save_moe

    save("gpt2", tmp_path / "gpt2", text)
    save_moe("qwen3_moe", tmp_path / "moe", text)
    for src, says in [(tmp_path / "gpt2", "--hidden cannot narrow it"),
                      (tmp_path / "moe", "Mixture-of-Experts")]:  # fmt: skip
        with pytest.raises(SparsetoolError, match=says):
            opts = ShrinkOptions(hidden=0.5, calibration=calib_file, **CALIB)
            shrink_checkpoint(src, tmp_path / "out", opts)
        assert not (tmp_path / "out").exists()
    save("llama", tmp_path / "in", text)
    src = tmp_path / "in"
    for flag, says in [
        ("--hidden", f"--hidden 0.01 keeps none of {src}'s 32 embedding channels "
                     "(round(0.01 x 32) = 0); ask for a larger fraction"),
        ("--ffn", f"--ffn 0.01 keeps none of {src}'s 48 FFN channels per layer "
                  "(round(0.01 x 48) = 0); ask for a larger fraction"),
        ("--heads", f"--heads 0.01 keeps none of {src}'s 8 attention heads per layer (heads are "
                    "kept per key/value group of 2: round(0.01 x 2) = 0); ask for a larger "
                    "fraction"),
    ]:  # fmt: skip
        r = run("shrink", src, "-o", tmp_path / "out", flag, "0.01",
                "--calibration", calib_file, "--samples", "2", "--seq", "16")  # fmt: skip
        assert r.exit_code == 2 and says in r.output, r.output
        assert r.output.count("error:") == 1 and not (tmp_path / "out").exists()
    r = run("shrink", src, "-o", tmp_path / "out", "--ffn", "0.999",
            "--calibration", calib_file)  # fmt: skip
    assert r.exit_code == 2, r.output
    assert "--ffn 0.999 keeps all of" in r.output and "ask for a smaller fraction" in r.output
    r = run("shrink", src, "-o", tmp_path / "out", "--hidden", "1")
    assert r.exit_code == 2, r.output
    assert "--hidden must be strictly between 0 and 1 (the fraction kept), got 1.0" in r.output


def test_heads_rounded_per_group_say_so_in_a_note(tmp_path, text, calib_file):
    """SmolLM2's case: 0.5 of 9 heads in groups of 3 keeps 2 of each, 6 of 9, which the result
    says in a note (printed and in --json); a fraction kept as asked gets none."""
    save("llama9", tmp_path / "in", text)
    calib = ["--calibration", calib_file, "--samples", "2", "--seq", "16", "--multiple-of", "1"]
    note = ("--heads 0.5 keeps 6 of 9 heads (0.67): heads are kept per key/value group, "
            "round(0.5 x 3) = 2 of each group of 3")  # fmt: skip
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--heads", "0.5", *calib,
            columns=300)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert f"note: {note}" in r.output, r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "json", "--heads", "0.5", *calib,
            "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert note in got["notes"] and got["widths"]["heads"]["after"]["heads"] == 6
    for asked in (["--heads", "0.6667"], ["--ffn", "0.3"]):  # 6 of 9 heads; 14 of 48 channels
        r = run("shrink", tmp_path / "in", "-o", tmp_path / asked[1], *asked, *calib, "--json")
        assert r.exit_code == 0, r.output
        assert json.loads(r.stdout)["notes"] == [], r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "all", "--heads", "0.9", *calib)
    assert r.exit_code == 2, r.output
    assert "(heads are kept per key/value group of 3: round(0.9 x 3) = 3); ask for a smaller " \
        "fraction" in r.output, r.output  # fmt: skip


def test_the_help_gives_the_rounding_rules():
    r = run("shrink", "--help", columns=400)
    assert r.exit_code == 0
    flat = " ".join(r.output.split())
    assert "round(F x kv-heads) whole key/value groups" in flat
    assert "round(F x group size) query heads of every group" in flat
    assert "round(F x d_ff)" in flat and "round(F x hidden size)" in flat


def test_hidden_not_divided_by_the_heads_is_refused_where_transformers_refuses_it(
    tmp_path, text, calib_file
):
    """Llama's config (as Gemma-3's) refuses a hidden size its heads do not divide, even with
    head_dim written out: refused before any text, naming the nearest widths that load; Qwen3's
    config takes it, and the shrunk model loads."""
    calib = ["--calibration", calib_file, "--samples", "2", "--seq", "16", "--multiple-of", "1"]
    save("llama9", tmp_path / "llama", text)  # hidden 36, 9 heads: 0.6 keeps 22
    r = run("shrink", tmp_path / "llama", "-o", tmp_path / "out", "--hidden", "0.6", *calib,
            columns=400)  # fmt: skip
    assert r.exit_code == 2 and r.output.count("error:") == 1, r.output
    assert "--hidden 0.6 keeps 22 embedding channels, not a multiple of the 9 attention heads" in (
        r.output
    )
    assert "ask for --hidden 0.5 (18) or --hidden 0.75 (27)" in r.output
    assert not (tmp_path / "out").exists()
    r = run("shrink", tmp_path / "llama", "-o", tmp_path / "out", "--hidden", "0.75", *calib)
    assert r.exit_code == 0, r.output
    assert t.AutoConfig.from_pretrained(tmp_path / "out").hidden_size == 27
    save("qwen3", tmp_path / "qwen", text)  # hidden 32, 4 heads of 8: 0.6 keeps 19
    r = run("shrink", tmp_path / "qwen", "-o", tmp_path / "q", "--hidden", "0.6", *calib)
    assert r.exit_code == 0, r.output
    assert t.AutoModelForCausalLM.from_pretrained(tmp_path / "q").config.hidden_size == 19
