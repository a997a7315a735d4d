"""shrink's typed records give back the JSON objects ``shrink --json`` and the provenance hold (the
same keys in the same order) and the line the command prints; the runs themselves are checked in
the other test files of this folder."""

from __future__ import annotations

import json

from sparsetool.ops.shrink.options import ExpertPlan, ShrinkOptions
from sparsetool.ops.shrink.results import (
    BlockMaps,
    BlocksRemoved,
    FoldedMap,
    HeadsKept,
    HiddenKept,
    LeastSquares,
    ShrinkResult,
    Width,
    WidthsNarrowed,
)


def test_the_hidden_refit_record_comes_back_as_it_was_read():
    found = {
        "readers": ["q_proj", "gate_proj"],
        "method": "least squares",
        "dampening": 0.01,
        "error_before": 0.5,
        "error_after": 0.25,
        "not_refit": ["attention_norm"],
        "layers": [{"block": 0}],
    }
    refit = LeastSquares.of_readers(found)
    assert json.dumps(refit.to_json()) == json.dumps(found)  # the keys in their order too
    assert refit.names == ["q_proj", "gate_proj"] and refit.not_refit == ["attention_norm"]


def test_widths_record_and_its_line():
    widths = WidthsNarrowed(
        ffn=Width(48, 24),
        heads=HeadsKept("groups", 8, 4, 4, 2, 4),
        layers=[{"block": 0}, {"block": 1}],
        refit=LeastSquares(["down_proj", "o_proj"], "least squares", 0.01, 0.123456, 0.0456),
        hidden=HiddenKept(32, 24, list(range(24)), 4),
    )
    rec = widths.to_json()
    assert list(rec) == ["ffn", "heads", "layers", "refit", "hidden"]
    assert rec["heads"] == {"mode": "groups", "before": {"heads": 8, "kv_heads": 4},
                            "after": {"heads": 4, "kv_heads": 2}, "head_dim": 4}  # fmt: skip
    assert list(rec["refit"]) == [
        "projections", "method", "dampening", "error_before", "error_after"
    ]  # fmt: skip
    assert "refit" not in rec["hidden"] and rec["hidden"]["head_dim"] == 4
    assert widths.summary() == (
        "narrowed 2 layers: FFN channels 48 -> 24; attention heads 8 -> 4 (key/value heads 4 -> "
        "2; groups); hidden size 32 -> 24; refit by least squares: down_proj, o_proj "
        "(calibration error 0.123 -> 0.0456, mean over layers)"
    )
    assert list(WidthsNarrowed(ffn=Width(48, 24)).to_json()) == ["ffn", "layers"]
    checked = {"held_back_windows": 2, "dampings": [0.1], "layers_refit": 3,
               "layers_kept_plain": 1, "held_before": 0.2, "held_after": 0.15}  # fmt: skip
    widths.refit = LeastSquares(["down_proj"], "least squares", None, 0.1, 0.05, extra=checked)
    assert widths.summary().endswith(
        "refit by least squares: down_proj (held-back error 0.2 -> 0.15, calibration error 0.1 "
        "-> 0.05, mean over layers; 1 of 4 projections kept plain)"
    )


def test_blocks_record_and_its_line():
    blocks = BlocksRemoved(4, 2, "bi", [1, 2], [0, 3], [0.5, 0.1, 0.2, 0.4], [])
    assert "reconstruct" not in blocks.to_json()
    assert blocks.summary() == "removed 2 blocks of 4 (bi): 1, 2"
    folded = FoldedMap([1, 2], 0, 0.5, 0.125, 0.1, 0.5, 0.25)
    blocks.reconstruct = BlockMaps("ReplaceMe", [0.1, 1.0], 2, [folded])
    rec = blocks.to_json()
    assert list(rec["reconstruct"]) == ["method", "dampings", "held_back_windows", "maps",
                                        "not_refit"]  # fmt: skip
    assert list(rec)[-1] == "reconstruct" and rec["reconstruct"]["maps"] == [
        {"run": [1, 2], "folded_into": 0, "error_before": 0.5, "error_after": 0.125,
         "damping": 0.1, "held_before": 0.5, "held_after": 0.25, "kept_plain": False}
    ]  # fmt: skip
    assert blocks.summary().endswith(
        "; blocks 1-2 replaced by a least-squares map folded into block 0's down projection "
        "(held-back error 0.5 -> 0.25, damping 0.1; calibration error 0.5 -> 0.125)"
    )
    blocks.reconstruct.maps = [FoldedMap([1, 2], 0, 0.5, 0.5, None, 0.5, 0.5, kept_plain=True)]
    assert blocks.summary().endswith(
        "; blocks 1-2 removed as they are (no map beat that: held-back error 0.5 -> 0.5)"
    )


def test_an_experts_result_prints_its_layers_and_its_line(tmp_path):
    opts = ShrinkOptions(experts=0.5, criterion="random")
    result = ShrinkResult(tmp_path, opts, plan=ExpertPlan(4, 2, 2), parameters_before=1000,
                          parameters_after=600)  # fmt: skip
    result.layers = [{"block": 1, "kept": [0, 3], "removed": [1, 2],
                      "scores": [0.9, 0.1, 0.2, 0.5]}]  # fmt: skip
    assert result.summary() == (
        "shrank 1 layer: 4 -> 2 routed experts each (random); parameters 1,000 -> 600"
    )
    assert result.expert_rows() == [["1", "1, 2", "0.5", "0.2"]]
    rec = result.to_json()
    assert rec["experts"] == {"before": 4, "after": 2, "top_k": 2, "groups": 1}
    assert list(rec)[-3:] == ["layers", "notes", "left_out"]
