"""Roles and default targets for every naming sparsetool recognises (one row per real name)."""

import pytest
import torch

from sparsetool.targets import LINEAR_ROLES, ROLES, input_dim, is_floating, is_targeted, role

# (name, shape, role, input dimension); targeted by default iff role is linear and ndim >= 2.
TABLE = [
    # GPT-2 (transformers GPT2LMHeadModel; Conv1D stores (in, out))
    ("transformer.wte.weight", (50257, 768), "embedding", 1),
    ("transformer.wpe.weight", (1024, 768), "position", 1),
    ("transformer.h.0.ln_1.weight", (768,), "norm", 0),
    ("transformer.h.0.ln_1.bias", (768,), "bias", 0),
    ("transformer.h.0.attn.c_attn.weight", (768, 2304), "qkv", 0),
    ("transformer.h.0.attn.c_attn.bias", (2304,), "bias", 0),
    ("transformer.h.0.attn.c_proj.weight", (768, 768), "attn_out", 0),
    ("transformer.h.0.attn.bias", (1, 1, 1024, 1024), "bias", 1),  # causal-mask buffer, old files
    ("transformer.h.0.attn.masked_bias", (), "bias", 0),
    ("transformer.h.0.ln_2.weight", (768,), "norm", 0),
    ("transformer.h.11.mlp.c_fc.weight", (768, 3072), "ffn_in", 0),
    ("transformer.h.11.mlp.c_proj.weight", (3072, 768), "ffn_out", 0),
    ("transformer.ln_f.weight", (768,), "norm", 0),
    ("lm_head.weight", (50257, 768), "head", 1),
    # GPT-2 as saved by GPT2Model (no "transformer." prefix)
    ("wte.weight", (50257, 768), "embedding", 1),
    ("h.0.attn.c_attn.weight", (768, 2304), "qkv", 0),
    ("h.0.attn.c_proj.weight", (768, 768), "attn_out", 0),
    ("h.0.mlp.c_fc.weight", (768, 3072), "ffn_in", 0),
    ("h.0.mlp.c_proj.weight", (3072, 768), "ffn_out", 0),
    ("ln_f.bias", (768,), "bias", 0),
    # GPT-NeoX / Pythia
    ("gpt_neox.embed_in.weight", (50304, 512), "embedding", 1),
    ("gpt_neox.layers.0.input_layernorm.weight", (512,), "norm", 0),
    ("gpt_neox.layers.0.post_attention_layernorm.bias", (512,), "bias", 0),
    ("gpt_neox.layers.0.attention.query_key_value.weight", (1536, 512), "qkv", 1),
    ("gpt_neox.layers.0.attention.dense.weight", (512, 512), "attn_out", 1),
    ("gpt_neox.layers.0.attention.rotary_emb.inv_freq", (16,), "position", 0),
    ("gpt_neox.layers.0.mlp.dense_h_to_4h.weight", (2048, 512), "ffn_in", 1),
    ("gpt_neox.layers.0.mlp.dense_4h_to_h.weight", (512, 2048), "ffn_out", 1),
    ("gpt_neox.final_layer_norm.weight", (512,), "norm", 0),
    ("embed_out.weight", (50304, 512), "head", 1),
    # Llama / Mistral
    ("model.embed_tokens.weight", (32000, 4096), "embedding", 1),
    ("model.layers.0.self_attn.q_proj.weight", (4096, 4096), "qkv", 1),
    ("model.layers.0.self_attn.k_proj.weight", (1024, 4096), "qkv", 1),
    ("model.layers.0.self_attn.v_proj.weight", (1024, 4096), "qkv", 1),
    ("model.layers.0.self_attn.o_proj.weight", (4096, 4096), "attn_out", 1),
    ("model.layers.31.mlp.gate_proj.weight", (14336, 4096), "ffn_in", 1),
    ("model.layers.31.mlp.up_proj.weight", (14336, 4096), "ffn_in", 1),
    ("model.layers.31.mlp.down_proj.weight", (4096, 14336), "ffn_out", 1),
    ("model.layers.0.input_layernorm.weight", (4096,), "norm", 0),
    ("model.layers.0.post_attention_layernorm.weight", (4096,), "norm", 0),
    ("model.layers.0.self_attn.rotary_emb.inv_freq", (64,), "position", 0),
    ("model.norm.weight", (4096,), "norm", 0),
    # Meta's original Llama checkpoint layout
    ("tok_embeddings.weight", (32000, 4096), "embedding", 1),
    ("layers.0.attention.wq.weight", (4096, 4096), "qkv", 1),
    ("layers.0.attention.wo.weight", (4096, 4096), "attn_out", 1),
    ("layers.0.feed_forward.w1.weight", (11008, 4096), "ffn_in", 1),
    ("layers.0.feed_forward.w2.weight", (4096, 11008), "ffn_out", 1),
    ("layers.0.feed_forward.w3.weight", (11008, 4096), "ffn_in", 1),
    ("layers.0.attention_norm.weight", (4096,), "norm", 0),
    ("output.weight", (32000, 4096), "head", 1),
    # Mixtral: experts are FFNs, the router is not
    ("model.layers.0.block_sparse_moe.experts.3.w1.weight", (14336, 4096), "ffn_in", 1),
    ("model.layers.0.block_sparse_moe.experts.3.w2.weight", (4096, 14336), "ffn_out", 1),
    ("model.layers.0.block_sparse_moe.gate.weight", (8, 4096), "router", 1),
    # transformers 5 stacks the experts: (experts, out, in), no ".weight"
    ("model.layers.0.mlp.experts.gate_up_proj", (8, 28672, 4096), "ffn_in", 2),
    ("model.layers.0.mlp.experts.down_proj", (8, 4096, 14336), "ffn_out", 2),
    ("model.layers.0.mlp.gate.weight", (8, 4096), "router", 1),
    # Qwen2/Qwen3-MoE, OLMoE, DeepSeek-V3: per-expert matrices; shared experts are plain FFNs
    ("model.layers.0.mlp.experts.7.gate_proj.weight", (1408, 2048), "ffn_in", 1),
    ("model.layers.0.mlp.experts.7.down_proj.weight", (2048, 1408), "ffn_out", 1),
    ("model.layers.0.mlp.shared_expert.up_proj.weight", (5632, 2048), "ffn_in", 1),
    ("model.layers.0.mlp.shared_experts.down_proj.weight", (2048, 2816), "ffn_out", 1),
    ("model.layers.0.mlp.shared_expert_gate.weight", (1, 2048), "router", 1),
    ("model.layers.0.mlp.gate.e_score_correction_bias", (256,), "bias", 0),
    # DeepSeek-V3's multi-head latent attention: low-rank q and kv factors are attention matrices
    ("model.layers.0.self_attn.q_a_proj.weight", (1536, 7168), "qkv", 1),
    ("model.layers.0.self_attn.q_b_proj.weight", (24576, 1536), "qkv", 1),
    ("model.layers.0.self_attn.kv_a_proj_with_mqa.weight", (576, 7168), "qkv", 1),
    ("model.layers.0.self_attn.kv_b_proj.weight", (32768, 512), "qkv", 1),
    # gpt-oss and Llama 4 routers; Switch Transformers' and DBRX's sit under a "router" module
    ("model.layers.0.mlp.router.weight", (32, 2880), "router", 1),
    ("model.layers.0.mlp.router.bias", (32,), "bias", 0),
    ("language_model.model.layers.0.feed_forward.router.weight", (16, 5120), "router", 1),
    ("encoder.block.1.layer.1.mlp.router.classifier.weight", (8, 768), "router", 1),
    ("transformer.blocks.0.ffn.router.layer.weight", (16, 6144), "router", 1),
    # OPT
    ("model.decoder.embed_tokens.weight", (50272, 768), "embedding", 1),
    ("model.decoder.embed_positions.weight", (2050, 768), "position", 1),
    ("model.decoder.project_in.weight", (1024, 512), "other", 1),
    ("model.decoder.layers.0.self_attn.q_proj.weight", (768, 768), "qkv", 1),
    ("model.decoder.layers.0.self_attn.k_proj.bias", (768,), "bias", 0),
    ("model.decoder.layers.0.self_attn.out_proj.weight", (768, 768), "attn_out", 1),
    ("model.decoder.layers.0.self_attn_layer_norm.weight", (768,), "norm", 0),
    ("model.decoder.layers.0.fc1.weight", (3072, 768), "ffn_in", 1),
    ("model.decoder.layers.0.fc2.weight", (768, 3072), "ffn_out", 1),
    ("model.decoder.layers.0.final_layer_norm.weight", (768,), "norm", 0),
    ("model.decoder.final_layer_norm.weight", (768,), "norm", 0),
    # BERT
    ("bert.embeddings.word_embeddings.weight", (30522, 768), "embedding", 1),
    ("bert.embeddings.position_embeddings.weight", (512, 768), "position", 1),
    ("bert.embeddings.token_type_embeddings.weight", (2, 768), "embedding", 1),
    ("bert.embeddings.LayerNorm.weight", (768,), "norm", 0),
    ("bert.embeddings.LayerNorm.gamma", (768,), "norm", 0),  # TF-era names
    ("bert.embeddings.LayerNorm.beta", (768,), "bias", 0),
    ("bert.encoder.layer.0.attention.self.query.weight", (768, 768), "qkv", 1),
    ("bert.encoder.layer.0.attention.self.key.weight", (768, 768), "qkv", 1),
    ("bert.encoder.layer.0.attention.self.value.weight", (768, 768), "qkv", 1),
    ("bert.encoder.layer.0.attention.output.dense.weight", (768, 768), "attn_out", 1),
    ("bert.encoder.layer.0.attention.output.LayerNorm.weight", (768,), "norm", 0),
    ("bert.encoder.layer.0.intermediate.dense.weight", (3072, 768), "ffn_in", 1),
    ("bert.encoder.layer.0.output.dense.weight", (768, 3072), "ffn_out", 1),
    ("bert.encoder.layer.0.output.LayerNorm.weight", (768,), "norm", 0),
    ("bert.pooler.dense.weight", (768, 768), "other", 1),
    ("cls.predictions.transform.dense.weight", (768, 768), "other", 1),
    ("cls.predictions.decoder.weight", (30522, 768), "head", 1),
    ("cls.predictions.bias", (30522,), "bias", 0),
    # Cerebras Model Zoo GPT
    ("embedding_layer.word_embeddings.weight", (50257, 768), "embedding", 1),
    ("embedding_layer.position_embeddings.weight", (2048, 768), "position", 1),
    ("model.embedding_layer.position_embeddings.embed.weight", (2048, 768), "position", 1),
    ("transformer_decoder.layers.0.self_attn.proj_q_dense_layer.weight", (768, 768), "qkv", 1),
    ("transformer_decoder.layers.0.self_attn.proj_k_dense_layer.weight", (768, 768), "qkv", 1),
    ("transformer_decoder.layers.0.self_attn.proj_v_dense_layer.weight", (768, 768), "qkv", 1),
    (
        "transformer_decoder.layers.0.self_attn.proj_output_dense_layer.weight",
        (768, 768),
        "attn_out",
        1,
    ),
    ("transformer_decoder.layers.0.ffn.ffn.0.linear_layer.weight", (3072, 768), "ffn_in", 1),
    (
        "transformer_decoder.layers.0.ffn.ffn.0.linear_layer_for_glu.weight",
        (3072, 768),
        "ffn_in",
        1,
    ),
    ("transformer_decoder.layers.0.ffn.ffn.1.linear_layer.weight", (768, 3072), "ffn_out", 1),
    ("transformer_decoder.layers.0.norm1.weight", (768,), "norm", 0),
    ("transformer_decoder.layers.0.norm3.bias", (768,), "bias", 0),
    ("transformer_decoder.norm.weight", (768,), "norm", 0),
    ("ln_f.weight", (768,), "norm", 0),
    ("model.lm_head.weight", (50257, 768), "head", 1),
    # sparsetool's own GPT (nn.Linear layout)
    ("tok_emb.weight", (256, 64), "embedding", 1),
    ("pos_emb.weight", (128, 64), "position", 1),
    ("blocks.0.ln1.weight", (64,), "norm", 0),
    ("blocks.0.attn.qkv.weight", (192, 64), "qkv", 1),
    ("blocks.0.attn.proj.weight", (64, 64), "attn_out", 1),
    ("blocks.0.mlp.fc.weight", (256, 64), "ffn_in", 1),
    ("blocks.0.mlp.proj.weight", (64, 256), "ffn_out", 1),
    ("blocks.3.mlp.proj.bias", (64,), "bias", 0),
    ("head.weight", (256, 64), "head", 1),
    # GPT-J, Bloom/Falcon, Phi, T5, DistilBERT, torch.nn.MultiheadAttention
    ("transformer.h.0.attn.q_proj.weight", (4096, 4096), "qkv", 1),
    ("transformer.h.0.attn.out_proj.weight", (4096, 4096), "attn_out", 1),
    ("transformer.h.0.mlp.fc_in.weight", (16384, 4096), "ffn_in", 1),
    ("transformer.h.0.mlp.fc_out.weight", (4096, 16384), "ffn_out", 1),
    ("transformer.word_embeddings.weight", (250880, 1024), "embedding", 1),
    ("transformer.word_embeddings_layernorm.weight", (1024,), "norm", 0),
    ("transformer.h.0.self_attention.query_key_value.weight", (3072, 1024), "qkv", 1),
    ("transformer.h.0.self_attention.dense.weight", (1024, 1024), "attn_out", 1),
    ("transformer.h.0.mlp.dense_h_to_4h.weight", (4096, 1024), "ffn_in", 1),
    ("model.layers.0.self_attn.dense.weight", (2560, 2560), "attn_out", 1),
    ("model.final_layernorm.weight", (2560,), "norm", 0),
    ("encoder.block.0.layer.0.SelfAttention.q.weight", (512, 512), "qkv", 1),
    ("encoder.block.0.layer.0.SelfAttention.o.weight", (512, 512), "attn_out", 1),
    (
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        (32, 8),
        "position",
        1,
    ),
    ("encoder.block.0.layer.1.DenseReluDense.wi.weight", (2048, 512), "ffn_in", 1),
    ("encoder.block.0.layer.1.DenseReluDense.wo.weight", (512, 2048), "ffn_out", 1),
    ("shared.weight", (32128, 512), "embedding", 1),
    ("distilbert.transformer.layer.0.attention.q_lin.weight", (768, 768), "qkv", 1),
    ("distilbert.transformer.layer.0.attention.out_lin.weight", (768, 768), "attn_out", 1),
    ("distilbert.transformer.layer.0.ffn.lin1.weight", (3072, 768), "ffn_in", 1),
    ("distilbert.transformer.layer.0.ffn.lin2.weight", (768, 3072), "ffn_out", 1),
    ("layers.0.self_attn.in_proj_weight", (192, 64), "qkv", 1),
    ("layers.0.self_attn.in_proj_bias", (192,), "bias", 0),
    # wrappers: DDP, torch.compile, PEFT/LoRA (the adapters are not the layer)
    ("module.blocks.0.attn.qkv.weight", (192, 64), "qkv", 1),
    ("_orig_mod.blocks.0.mlp.fc.weight", (256, 64), "ffn_in", 1),
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", (64, 64), "qkv", 1),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", (8, 64), "other", 1),
    # mask side tensors are never roles of their own
    ("blocks.0.attn.qkv.weight_mask", (192, 64), "other", 1),
]


@pytest.mark.parametrize("name,shape,expected,dim", TABLE, ids=[row[0] for row in TABLE])
def test_role_target_and_input_dim(name, shape, expected, dim):
    assert role(name, shape) == expected
    assert is_targeted(name, shape, "BF16") == (expected in LINEAR_ROLES and len(shape) >= 2)
    assert input_dim(name, shape) == dim


def test_every_role_is_exercised_by_the_table():
    assert {row[2] for row in TABLE} == set(ROLES)


@pytest.mark.parametrize(
    "dtype,floating",
    [
        ("F32", True),
        ("BF16", True),
        ("F16", True),
        ("F64", True),
        ("F8_E4M3", True),
        ("I64", False),
        ("I8", False),
        ("U8", False),
        ("BOOL", False),
        ("float16", True),
        ("torch.bfloat16", True),
        (torch.float32, True),
        (torch.int32, False),
        (torch.bool, False),
    ],
)
def test_only_floating_tensors_are_targeted(dtype, floating):
    assert is_floating(dtype) == floating
    assert is_targeted("model.layers.0.mlp.up_proj.weight", (16, 8), dtype) == floating
    assert is_targeted("x.weight", (16, 8), dtype, include=["*"]) == floating


def test_include_adds_exclude_removes_and_exclude_wins():
    name = "model.embed_tokens.weight"
    assert not is_targeted(name, (32, 8), "F32")
    assert is_targeted(name, (32, 8), "F32", include=["model.embed_*"])
    assert not is_targeted(name, (32, 8), "F32", include=["model.embed_*"], exclude=["*embed*"])
    q = "model.layers.1.self_attn.q_proj.weight"
    assert not is_targeted(q, (8, 8), "F32", exclude=["*.layers.1.*"])
    assert is_targeted(q, (8, 8), "F32", exclude=["*.layers.2.*", "*k_proj*"])
    # globs are case-sensitive and match the whole name
    assert is_targeted(q, (8, 8), "F32", exclude=["*Q_PROJ*"])
    assert is_targeted(q, (8, 8), "F32", exclude=["q_proj"])


def test_include_never_targets_1d_integer_or_mask_tensors():
    assert not is_targeted("model.norm.weight", (8,), "F32", include=["*"])
    assert not is_targeted("blocks.0.attn.qkv.weight_mask", (8, 8), "BOOL", include=["*"])
    assert not is_targeted("blocks.0.attn.qkv.weight_mask", (8, 8), "F32", include=["*"])
    assert not is_targeted("ids", (8, 8), "I64", include=["*"])


@pytest.mark.parametrize(
    "name,shape,dim",
    [
        # GPT-2 Conv1D (in, out)
        ("transformer.h.0.attn.c_attn.weight", (2048, 6144), 0),
        ("transformer.h.0.mlp.c_fc.weight", (2048, 8192), 0),
        ("transformer.h.0.mlp.c_proj.weight", (8192, 2048), 0),
        ("transformer.h.0.attn.c_proj.weight", (2048, 2048), 0),
        ("transformer.h.0.mlp.c_fc.weight", (64, 64), 0),  # n_inner = n_embd: GPT-2's reading
        # Qwen-1: nn.Linear (3*in, in)
        ("transformer.h.0.attn.c_attn.weight", (6144, 2048), 1),
        # GPT-BigCode / StarCoder: nn.Linear, multi-query c_attn (in + 2*kv, in)
        ("transformer.h.0.attn.c_attn.weight", (6400, 6144), 1),
        ("transformer.h.0.mlp.c_fc.weight", (24576, 6144), 1),
        ("transformer.h.0.mlp.c_proj.weight", (6144, 24576), 1),
    ],
)
def test_same_names_different_layouts_are_read_from_the_shape(name, shape, dim):
    assert input_dim(name, shape) == dim


def _tiny_models():
    import transformers

    small = dict(vocab_size=16)
    return {
        "gpt2": transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                n_layer=2, n_embd=8, n_head=2, n_inner=16, n_positions=8, **small
            )
        ),
        "gpt_neox": transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                intermediate_size=16,
                max_position_embeddings=8,
                **small,
            )
        ),
        "llama": transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=16,
                **small,
            )
        ),
        "mistral": transformers.MistralForCausalLM(
            transformers.MistralConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=16,
                **small,
            )
        ),
        "opt": transformers.OPTForCausalLM(
            transformers.OPTConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                ffn_dim=16,
                max_position_embeddings=8,
                word_embed_proj_dim=8,
                **small,
            )
        ),
        "mixtral": transformers.MixtralForCausalLM(
            transformers.MixtralConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=16,
                num_local_experts=2,
                **small,
            )
        ),
        "bert": transformers.BertForMaskedLM(
            transformers.BertConfig(
                num_hidden_layers=2,
                hidden_size=8,
                num_attention_heads=2,
                intermediate_size=16,
                max_position_embeddings=8,
                **small,
            )
        ),
    }


# Per layer: qkv, attn_out, ffn_in, ffn_out weight counts of each architecture.
PER_LAYER = {
    "gpt2": {"qkv": 1, "attn_out": 1, "ffn_in": 1, "ffn_out": 1},
    "gpt_neox": {"qkv": 1, "attn_out": 1, "ffn_in": 1, "ffn_out": 1},
    "llama": {"qkv": 3, "attn_out": 1, "ffn_in": 2, "ffn_out": 1},
    "mistral": {"qkv": 3, "attn_out": 1, "ffn_in": 2, "ffn_out": 1},
    "opt": {"qkv": 3, "attn_out": 1, "ffn_in": 1, "ffn_out": 1},
    "bert": {"qkv": 3, "attn_out": 1, "ffn_in": 1, "ffn_out": 1},
    "mixtral": {
        "qkv": 3,
        "attn_out": 1,
        "ffn_in": 1,
        "ffn_out": 1,
    },  # experts stacked in one tensor
}


def test_real_transformers_models_are_read_right():
    """Instantiate tiny models and check every state-dict name, so real naming is covered."""
    for arch, model in _tiny_models().items():
        roles: dict[str, int] = {}
        for name, t in model.state_dict().items():
            r = role(name, tuple(t.shape))
            roles[r] = roles.get(r, 0) + 1
            targeted = is_targeted(name, tuple(t.shape), t.dtype)
            assert targeted == (r in LINEAR_ROLES), (arch, name)
            if targeted:
                assert ".0." in name or ".1." in name, (arch, name)
                # the input dimension is the model's hidden size for q/k/v/out/ffn_in, 16 for
                # ffn_out
                width = 16 if r == "ffn_out" else 8
                assert t.shape[input_dim(name, tuple(t.shape))] == width, (arch, name)
            elif t.ndim >= 2:
                assert r in ("embedding", "position", "head", "router", "other"), (arch, name)
            else:
                assert r in ("norm", "bias", "position"), (arch, name)
        for r, per_layer in PER_LAYER[arch].items():
            assert roles.get(r) == 2 * per_layer, (arch, r, roles)
        assert roles.get("embedding", 0) >= 1 and roles.get("head", 0) <= 1, (arch, roles)


def test_the_caller_can_say_which_layout_gpt2_names_hold():
    square = "transformer.h.0.attn.c_proj.weight"
    assert input_dim(square, (16, 16)) == 0
    assert input_dim(square, (16, 16), conv1d=False) == 1
    assert input_dim("transformer.h.0.attn.c_attn.weight", (32, 16), conv1d=True) == 0
    assert (
        input_dim("model.layers.0.mlp.up_proj.weight", (64, 16), conv1d=True) == 1
    )  # not a GPT-2 name


def test_docstring_examples():
    """The examples in the docstrings run and print what they say (CI collects tests/ only)."""
    import doctest

    import sparsetool.targets
    import sparsetool.targets.roles

    for module in (sparsetool.targets, sparsetool.targets.roles):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__
