"""shrink --blocks with --ffn/--heads/--hidden in one command: the same model, bit for bit, as the
two commands one after the other (blocks first), one result and ``--json`` with both records, the
provenance of both steps, nothing left beside the output; usage errors of either step before any
weight is read."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as t
from safetensors import safe_open

from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint

from helpers import CALIB, run, save_tokenizer

_SMALL = dict(vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1)


@pytest.fixture
def llama(tmp_path, text):
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64,
                        num_attention_heads=4, num_key_value_heads=2, **_SMALL)  # fmt: skip
    t.LlamaForCausalLM(cfg).eval().save_pretrained(tmp_path / "in")
    save_tokenizer(tmp_path / "in", text)
    return tmp_path / "in"


def _tensors(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_blocks_then_widths_in_one_command_is_the_two_commands(llama, tmp_path, calib_file):
    asked = dict(ffn=0.5, heads=0.5, calibration=calib_file, multiple_of=1, **CALIB)
    first = shrink_checkpoint(llama, tmp_path / "b", ShrinkOptions(blocks=1, **{
        k: v for k, v in asked.items() if k not in ("ffn", "heads")}))  # fmt: skip
    second = shrink_checkpoint(tmp_path / "b", tmp_path / "bw", ShrinkOptions(**asked))
    both = shrink_checkpoint(llama, tmp_path / "one", ShrinkOptions(blocks=1, **asked))
    want, got = _tensors(tmp_path / "bw"), _tensors(tmp_path / "one")
    assert sorted(want) == sorted(got)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert both.blocks is not None and both.blocks.removed == first.blocks.removed
    assert both.widths is not None and both.widths.layers == second.widths.layers
    assert both.parameters_before == first.parameters_before
    assert both.parameters_after == second.parameters_after
    assert both.tokens == first.tokens + second.tokens
    summary = both.summary()
    assert (
        summary.startswith("removed 1 block of 4 (bi): ")
        and "; then narrowed 3 layers: " in summary
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "bw", "in", "one"]  # no temporary
    out = t.AutoModelForCausalLM.from_pretrained(tmp_path / "one")
    assert out.config.num_hidden_layers == 3 and out.config.intermediate_size == 32


def test_the_mix_is_recorded_in_json_and_provenance(llama, tmp_path, calib_file):
    r = run("shrink", llama, "-o", tmp_path / "out", "--blocks", "1", "--ffn", "0.5",
            "--calibration", calib_file, "--samples", "6", "--seq", "32", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["options"]["blocks"] == 1 and got["options"]["ffn"] == 0.5
    assert got["blocks"]["after"] == 3 and got["widths"]["ffn"] == {"before": 64, "after": 32}
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        prov = json.loads(f.metadata()["sparsetool"])
    assert prov["command"] == "shrink" and prov["ffn"] == 0.5 and "blocks" not in prov
    assert (
        prov["history"][-1]["command"] == "shrink" and prov["history"][-1]["blocks"]["after"] == 3
    )


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--ffn", "0.001"], "--ffn 0.001 keeps none of"),
        (["--blocks", "4"], "removes all of"),
        (["--experts", "0.5"], "say what to remove"),
    ],
)
def test_either_steps_usage_errors_come_before_any_weight(llama, tmp_path, calib_file, extra,
                                                          says):  # fmt: skip
    args = ["--blocks", "1", "--ffn", "0.5"]
    for flag in extra[::2]:  # the one asked here replaces the default's
        if flag in args:
            i = args.index(flag)
            del args[i : i + 2]
    r = run("shrink", llama, "-o", tmp_path / "out", *args, *extra, "--calibration", calib_file,
            "--samples", "6", "--seq", "32")  # fmt: skip
    assert r.exit_code == 2, r.output
    assert says in r.output, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
