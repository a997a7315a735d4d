"""The calibration pass prune and shrink share, and shrink's memory plan.

- ``BlockPass`` visits the blocks in order with each loaded, runs the ones the caller did not,
  hands a caller's outputs on as the next block's inputs, and its final outputs are those of the
  model's own block-by-block run;
- every kind of shrink that reads text makes the memory plan before any text runs: printed on
  stderr, in ``--json`` and on the result, its statistics those of the refits asked for (none
  with ``--no-reconstruct``);
- ``--max-memory`` below the plan refuses the run in one line naming the figures and what lowers
  them, before any block runs and with nothing written; a size that is not one is a usage error.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers as t

from sparsetool.errors import SparsetoolError
from sparsetool.models.open import open_model
from sparsetool.ops.calibration import BlockPass, calibration_windows, hidden_bytes
from sparsetool.ops.shrink import ShrinkOptions, shrink_checkpoint
from sparsetool.ops.shrink.memory import (
    blocks_held,
    blocks_statistics,
    renorm_bytes,
    widths_statistics,
)

from helpers import CALIB as WINDOWS
from helpers import run, save_tokenizer

# the tiny models' widths (hidden 32, FFN 48, head_dim 4-8) hold few multiples of 32: these
# tests take the exact fractions (test_shrink_multiple_of.py: the rounding)
CALIB = dict(WINDOWS, multiple_of=1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("llama")
    torch.manual_seed(0)
    cfg = t.LlamaConfig(num_hidden_layers=3, hidden_size=32, intermediate_size=48,
                        num_attention_heads=8, num_key_value_heads=4, vocab_size=320,
                        max_position_embeddings=64, bos_token_id=1, eos_token_id=1)  # fmt: skip
    t.LlamaForCausalLM(cfg).eval().save_pretrained(d)
    text = " ".join(f"word{i % 97} and more text {i}" for i in range(3000))
    save_tokenizer(d, text)
    (d.parent / "calib.txt").write_text(text)
    return d


def _model_and_windows(llama):
    model = open_model(llama, "float32", "cpu", needs="a test", attention="eager")
    text = (llama.parent / "calib.txt").read_text()
    windows = calibration_windows(model.encode(text).ids, CALIB["samples"], CALIB["seq"], 0, "t")
    return model, windows


def test_block_pass_runs_each_block_once_and_hands_outputs_on(llama):
    model, windows = _model_and_windows(llama)
    try:
        seen, ticks, ran = [], [], []
        run_block = model.run_block

        def counted(i, call):
            ran.append(i)
            return run_block(i, call)

        model.run_block = counted  # type: ignore[method-assign]
        blocks = BlockPass(model, windows, "x", lambda *a: ticks.append(a), final=True)
        for step in blocks:
            seen.append(step.index)
            assert all(p.device.type != "meta" for p in model.block_list[step.index].parameters())
            if step.index == 0:
                step.run()  # run by the caller: not run again
        assert seen == [0, 1, 2] and ticks == [("x", 1, 3), ("x", 2, 3), ("x", 3, 3)]
        n = len(windows)
        assert ran == [0] * n + [1] * n + [2] * n  # each block once for every window
        ran.clear()
        for _step in BlockPass(model, windows, "x"):  # not final: the last block is not run
            pass
        assert ran == [0] * n + [1] * n
        model.run_block = run_block  # type: ignore[method-assign]
        with torch.no_grad():
            calls = model.through_blocks(model.capture([r.unsqueeze(0) for r in windows]))
        for a, b in zip(blocks.calls, calls):
            assert torch.equal(a.hidden, b.hidden)
        # outputs a caller sets are the next block's inputs; the last block is not run unless final
        doubled = None
        for step in BlockPass(model, windows, "x", last=1):
            if step.index == 0:
                step.outputs = [c.passed(2 * h) for c, h in zip(step.calls, step.hidden)]
                doubled = [c.hidden for c in step.outputs]
            else:
                assert all(torch.equal(c.hidden, d) for c, d in zip(step.calls, doubled))
                assert step.outputs is None
    finally:
        model.close()


def _shrink(llama, out, **kw):
    calib = llama.parent / "calib.txt"
    return shrink_checkpoint(llama, out, ShrinkOptions(calibration=calib, **CALIB, **kw))


def test_the_plan_holds_the_refits_asked_for(llama, tmp_path):
    refit = _shrink(llama, tmp_path / "f", ffn=0.75).memory
    assert refit is not None
    assert refit.statistics == widths_statistics(width=32, ffn=(48, 36), heads=None, bias=False)
    assert refit.statistics >= 48 * 48 * 8  # the down projection's X^T X, float64
    plain = _shrink(llama, tmp_path / "p", ffn=0.75, reconstruct=False).memory
    assert plain is not None and plain.statistics == 0
    heads = _shrink(llama, tmp_path / "h", heads=0.5).memory
    assert heads is not None
    assert heads.statistics == widths_statistics(width=32, ffn=None, heads=(32, 16), bias=False)
    # ReplaceMe: one run's d x d sums whatever the number of runs; only the folds waiting add up
    assert (
        blocks_statistics(width=4096, ffn=11008, runs=8, stored=2)
        - blocks_statistics(width=4096, ffn=11008, runs=1, stored=2)
        == 7 * 11008 * 4096 * 2
    )
    hidden = _shrink(llama, tmp_path / "d", hidden=0.5).memory
    assert hidden is not None and hidden.statistics == renorm_bytes(32, 16, 48)
    assert _shrink(llama, tmp_path / "dp", hidden=0.5, reconstruct=False).memory.statistics == 0
    blocks = _shrink(llama, tmp_path / "b", blocks=1).memory
    assert blocks is not None
    assert blocks.statistics == blocks_statistics(width=32, ffn=48, runs=1, stored=4)
    model, _w = _model_and_windows(llama)
    try:  # ReplaceMe's two sets of hidden states beside the pass's own two
        two = hidden_bytes(model, CALIB["samples"], CALIB["seq"])
    finally:
        model.close()
    assert blocks.activations - plain.activations == blocks_held(1, False, True) * two == 2 * two


def test_the_plan_is_printed_and_in_json(llama, tmp_path):
    calib = llama.parent / "calib.txt"
    args = ("shrink", llama, "-o", tmp_path / "o", "--ffn", "0.75", "--calibration", calib)
    r = run(*args, "--samples", CALIB["samples"], "--seq", CALIB["seq"], "--multiple-of", 1,
            env={"SPARSETOOL_PROGRESS_INTERVAL": "0"})  # fmt: skip  # a log: lines at once
    assert r.exit_code == 0, r.output
    plan = r.stderr.splitlines()[0]
    assert plan.startswith("memory plan: weights") and " statistics " in plan, r.stderr
    r = run(*args[:3], tmp_path / "j", *args[4:], "--samples", CALIB["samples"], "--seq",
            CALIB["seq"], "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    memory = json.loads(r.stdout)["memory"]
    assert memory["statistics"] > 0 and memory["budget_source"] == "available memory"
    assert memory["peak_estimate"] == sum(
        memory[k] for k in ("fixed", "weights", "activations", "statistics")
    )


@pytest.mark.parametrize("kind", [("--ffn", "0.75"), ("--blocks", "1"), ("--heads", "0.5")])
def test_max_memory_below_the_plan_is_refused_before_any_text_runs(llama, tmp_path, kind):
    calib = llama.parent / "calib.txt"
    r = run("shrink", llama, "-o", tmp_path / "o", *kind, "--calibration", calib,
            "--max-memory", "1M", "--samples", CALIB["samples"], "--seq", CALIB["seq"],
            "--multiple-of", 1)  # fmt: skip
    assert r.exit_code == 1
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr
    assert f"shrink {' '.join(kind)} needs about" in lines[0]
    assert "(--max-memory)" in lines[0] and "--no-reconstruct" in lines[0]
    assert not (tmp_path / "o").exists() and list(tmp_path.iterdir()) == []
    stages: list = []
    with pytest.raises(SparsetoolError, match="needs about"):
        shrink_checkpoint(
            llama,
            tmp_path / "api",
            ShrinkOptions(calibration=calib, max_memory=1 << 20, ffn=0.75, **CALIB),
            progress=lambda *a: stages.append(a),
        )
    assert stages == []  # no block ran


def test_an_output_in_a_missing_directory_is_refused_before_any_text_runs(llama, tmp_path):
    calib = llama.parent / "calib.txt"
    stages: list = []
    with pytest.raises(SparsetoolError, match="does not exist; create it first"):
        shrink_checkpoint(
            llama,
            tmp_path / "missing" / "out",
            ShrinkOptions(calibration=calib, ffn=0.75, **CALIB),
            progress=lambda *a: stages.append(a),
        )
    assert stages == [] and list(tmp_path.iterdir()) == []


def test_a_bad_max_memory_is_a_usage_error(llama, tmp_path):
    calib = llama.parent / "calib.txt"
    r = run("shrink", llama, "-o", tmp_path / "o", "--ffn", "0.5", "--calibration", calib,
            "--max-memory", "lots")  # fmt: skip
    assert r.exit_code == 2 and "--max-memory" in r.output
    with pytest.raises(SparsetoolError, match="--max-memory"):
        ShrinkOptions(ffn=0.5, calibration=calib, max_memory=0).validate()
