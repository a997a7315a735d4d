"""shrink --blocks: with --no-reconstruct the written model equals the input with the same blocks
removed by hand in transformers (Llama, Qwen3, Gemma-3 with its sliding and full attention,
GPT-2); the block influence is each block's 1 - mean cosine of its input and output, measured in
transformers; the angular criterion removes the run whose ends lie closest; usage errors come
first. ReplaceMe's maps (the default): test_shrink_refit.py."""

from __future__ import annotations

import json
import math

import pytest
import torch
import transformers as t

from sparsetool.ops.calibration import calibration_windows
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

from helpers import CALIB, run, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


def build(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "llama":
        cfg = t.LlamaConfig(num_hidden_layers=5, hidden_size=32, intermediate_size=64,
                            num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
        return t.LlamaForCausalLM(cfg).eval()
    if kind == "qwen3":
        cfg = t.Qwen3Config(num_hidden_layers=5, hidden_size=32, intermediate_size=64, head_dim=8,
                            num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
        return t.Qwen3ForCausalLM(cfg).eval()
    if kind == "gemma3":  # every third block full attention, the others sliding windows of 8
        cfg = t.Gemma3TextConfig(num_hidden_layers=6, hidden_size=32, intermediate_size=64,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 sliding_window=8,
                                 layer_types=["sliding_attention", "sliding_attention",
                                              "full_attention"] * 2,
                                 **_SMALL)  # fmt: skip
        return t.Gemma3ForCausalLM(cfg).eval()
    if kind == "gpt2":
        cfg = t.GPT2Config(n_layer=5, n_embd=32, n_head=4, n_positions=64, vocab_size=320,
                           bos_token_id=1, eos_token_id=1)  # fmt: skip
        return t.GPT2LMHeadModel(cfg).eval()
    raise ValueError(kind)


def layers_of(model: torch.nn.Module) -> torch.nn.ModuleList:
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def removed_by_hand(model: torch.nn.Module, removed: list[int]) -> torch.nn.Module:
    """``model`` with blocks ``removed`` taken out of its list, as a user would in transformers."""
    layers = layers_of(model)
    keep = torch.nn.ModuleList(m for i, m in enumerate(layers) if i not in removed)
    if hasattr(model, "transformer"):
        model.transformer.h = keep
        model.config.n_layer = len(keep)
    else:
        model.model.layers = keep
        model.config.num_hidden_layers = len(keep)
        if getattr(model.config, "layer_types", None):
            model.config.layer_types = [
                x for i, x in enumerate(model.config.layer_types) if i not in removed
            ]
    return model


def save(kind: str, directory, text) -> torch.nn.Module:
    model = build(kind)
    model.save_pretrained(directory)
    save_tokenizer(directory, text)
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gemma3", "gpt2"])
@pytest.mark.parametrize("criterion", ["bi", "angular"])
def test_the_written_model_is_the_input_with_those_blocks_removed(
    kind, criterion, tmp_path, text, calib_file
):
    model = save(kind, tmp_path / "in", text)
    opts = ShrinkOptions(blocks=2, block_criterion=criterion, calibration=calib_file,
                         reconstruct=False, **CALIB)  # fmt: skip
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    removed = result.blocks.removed
    assert result.blocks.reconstruct is None
    assert len(removed) == 2 and result.blocks.after == result.blocks.before - 2
    if criterion == "angular":
        assert removed[1] == removed[0] + 1
        assert result.blocks.angular[removed[0]] == min(result.blocks.angular)
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    ids = torch.randint(2, 300, (2, 24), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = removed_by_hand(model, removed)(ids, use_cache=False).logits
        got = out(ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg.get("num_hidden_layers", cfg.get("n_layer")) == result.blocks.after
    if kind == "gemma3":
        assert cfg["layer_types"] == model.config.layer_types
    assert result.parameters_after == sum(p.numel() for p in out.parameters())


def test_block_influence_is_measured_as_transformers_runs_the_blocks(tmp_path, text, calib_file):
    model = save("llama", tmp_path / "in", text)
    opts = ShrinkOptions(blocks=1, calibration=calib_file, **CALIB)
    result = shrink_checkpoint(tmp_path / "in", tmp_path / "out", opts)
    tok = t.AutoTokenizer.from_pretrained(tmp_path / "in")
    windows = calibration_windows(tok(text)["input_ids"], CALIB["samples"], CALIB["seq"], 0, "x")
    sums = [0.0] * 5
    handles = []
    for i, layer in enumerate(layers_of(model)):

        def hook(module, args, kwargs, output, i=i):
            x = args[0] if args else kwargs["hidden_states"]
            y = output[0] if isinstance(output, tuple) else output
            cos = torch.nn.functional.cosine_similarity(x[0], y[0], dim=-1)
            sums[i] += float(cos.double().sum())

        handles.append(layer.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        for row in windows:
            model(row.unsqueeze(0), use_cache=False)
    for h in handles:
        h.remove()
    want = [1 - s / windows.numel() for s in sums]
    assert result.blocks.bi == pytest.approx(want, abs=1e-5)
    assert result.blocks.removed == [min(range(5), key=lambda i: want[i])]
    assert all(0 <= a <= 1 for a in result.blocks.angular or [0])
    assert math.isclose(sum(result.blocks.bi), sum(want), abs_tol=1e-4)


def test_blocks_usage_errors(tmp_path, text, calib_file):
    save("llama", tmp_path / "in", text)
    src = tmp_path / "in"
    for args, says in [
        (["--blocks", "6"], f"--blocks 6: {src} has only 5 blocks; remove at most 4"),
        (["--blocks", "5"], f"--blocks 5 removes all of {src}'s 5 blocks; remove at most 4"),
        (
            ["--blocks", "0.95"],
            f"removes all of {src}'s 5 blocks (round(0.95 x 5) = 5); remove at most 4",
        ),  # fmt: skip
        (
            ["--blocks", "0.05"],
            f"--blocks 0.05 removes none of {src}'s 5 blocks "
            "(round(0.05 x 5) = 0); remove at least 1 (--blocks 1)",
        ),
        (
            ["--blocks", "1.5"],
            "--blocks must be a whole number of blocks (1 or more) or "
            "strictly between 0 and 1 (the fraction of the blocks removed), "
            "got 1.5",
        ),  # fmt: skip
        (["--blocks", "1", "--experts", "0.5"], "one of"),
        (["--blocks", "1", "--merge"], "does not go with --blocks"),
    ]:
        r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--calibration", calib_file,
                *args)  # fmt: skip
        assert r.exit_code == 2 and says in r.output and r.output.count("error:") == 1, r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--blocks", "1")
    assert r.exit_code == 2 and "give --calibration" in r.output
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--blocks", "0.4",
            "--calibration", calib_file, "--samples", "4", "--seq", "16")  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "removed 2 blocks of 5 (bi)" in r.output


def test_more_blocks_than_a_two_block_model_has(tmp_path, text, calib_file):
    """The report's case: --blocks 3 of a 2-block model says how many it has and may lose."""
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    r = run("shrink", tmp_path / "in", "-o", tmp_path / "out", "--blocks", "3",
            "--calibration", calib_file)  # fmt: skip
    assert r.exit_code == 2 and r.output.count("error:") == 1, r.output
    assert f"error: --blocks 3: {tmp_path / 'in'} has only 2 blocks; remove at most 1" in r.output
    assert not (tmp_path / "out").exists()
