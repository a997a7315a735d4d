"""Mixture-of-Experts checkpoints run block by block (eval, and the model calibration pruning
runs): both storage layouts, every family, equal to transformers' own forward pass."""

from __future__ import annotations

import pytest
import torch  # noqa: E402
import transformers
from moe_models import EXPERTS, STORED, save_moe  # noqa: E402
from safetensors import safe_open  # noqa: E402
from test_eval import reference_nll  # noqa: E402

from sparsetool.errors import SparsetoolError  # noqa: E402
from sparsetool.models.open import open_model  # noqa: E402
from sparsetool.ops.eval import evaluate  # noqa: E402

from helpers import make_text  # noqa: E402


@pytest.fixture(scope="module")
def text() -> str:
    return make_text()


@pytest.mark.parametrize("kind", STORED + ("qwen2_moe", "llama4"))
def test_eval_equals_transformers_in_either_layout(kind, tmp_path, text):
    per_expert = save_moe(kind, tmp_path / "per-expert", text)
    fused = save_moe(kind, tmp_path / "fused", text, fused=True)
    with safe_open(fused / "model.safetensors", "pt") as f:
        assert any(k.endswith("experts.gate_up_proj") for k in f.keys())
    with safe_open(per_expert / "model.safetensors", "pt") as f:  # gpt-oss stores them fused
        assert any(".experts.3." in k for k in f.keys()) == (kind not in ("gpt_oss", "llama4"))
    rows = evaluate([per_expert, fused], text=text, seq=32, stride=None, max_tokens=400).rows
    reference = reference_nll(per_expert, text, 32, None, 400)
    assert rows[0].nll == pytest.approx(reference, abs=1e-4)
    assert rows[1].nll == pytest.approx(reference, abs=1e-4)


def test_per_expert_tensors_land_at_their_place_in_the_merged_parameter(tmp_path, text):
    directory = save_moe("mixtral", tmp_path / "m", text)
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory).state_dict()
    model = open_model(directory)
    try:
        name = "model.layers.1.mlp.experts.gate_up_proj"
        pieces = model.sources[name]
        assert len(pieces) == 2 * EXPERTS
        owner, piece = model.piece_of("model.layers.1.block_sparse_moe.experts.2.w3.weight")
        assert owner == name and piece.index[0] == 2
        model.load_block(1)
        assert torch.equal(model.module.get_parameter(name), reference[name])
        down = "model.layers.1.mlp.experts.down_proj"
        assert torch.equal(model.module.get_parameter(down), reference[down])
    finally:
        model.close()


def test_a_missing_expert_is_one_clear_error(tmp_path, text):
    from safetensors.torch import load_file, save_file

    directory = save_moe("qwen3_moe", tmp_path / "q", text)
    state = load_file(directory / "model.safetensors")
    del state["model.layers.1.mlp.experts.3.up_proj.weight"]
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        SparsetoolError,
        match=r"no tensor 'mlp\.experts\.3\.up_proj\.weight' for "
        r"'model\.layers\.1\.mlp\.experts\.gate_up_proj'",
    ):
        open_model(directory)
