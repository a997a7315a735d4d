"""The targeting plan: one per checkpoint, the same for prune, report, flops, simulate and train."""

from pathlib import Path

import pytest
from safetensors.torch import save_file

from sparsetool.errors import ConfigError
from sparsetool.targets import LINEAR_ROLES, TargetPlan, plan_targets

from helpers import gpt2_like_state

# One block of each naming family: name -> (shape, expected role); the four linear roles are
# targeted, the rest are not.
FAMILIES = {
    "gpt2": {
        "transformer.wte.weight": ((64, 16), "embedding"),
        "transformer.h.0.ln_1.weight": ((16,), "norm"),
        "transformer.h.0.attn.c_attn.weight": ((16, 48), "qkv"),
        "transformer.h.0.attn.c_attn.bias": ((48,), "bias"),
        "transformer.h.0.attn.c_proj.weight": ((16, 16), "attn_out"),
        "transformer.h.0.mlp.c_fc.weight": ((16, 64), "ffn_in"),
        "transformer.h.0.mlp.c_proj.weight": ((64, 16), "ffn_out"),
        "lm_head.weight": ((64, 16), "head"),
    },
    "neox": {
        "gpt_neox.embed_in.weight": ((64, 16), "embedding"),
        "gpt_neox.layers.0.attention.query_key_value.weight": ((48, 16), "qkv"),
        "gpt_neox.layers.0.attention.dense.weight": ((16, 16), "attn_out"),
        "gpt_neox.layers.0.mlp.dense_h_to_4h.weight": ((64, 16), "ffn_in"),
        "gpt_neox.layers.0.mlp.dense_4h_to_h.weight": ((16, 64), "ffn_out"),
        "embed_out.weight": ((64, 16), "head"),
    },
    "llama": {
        "model.embed_tokens.weight": ((64, 16), "embedding"),
        "model.layers.0.self_attn.q_proj.weight": ((16, 16), "qkv"),
        "model.layers.0.self_attn.k_proj.weight": ((8, 16), "qkv"),
        "model.layers.0.self_attn.v_proj.weight": ((8, 16), "qkv"),
        "model.layers.0.self_attn.o_proj.weight": ((16, 16), "attn_out"),
        "model.layers.0.mlp.gate_proj.weight": ((64, 16), "ffn_in"),
        "model.layers.0.mlp.up_proj.weight": ((64, 16), "ffn_in"),
        "model.layers.0.mlp.down_proj.weight": ((16, 64), "ffn_out"),
        "model.norm.weight": ((16,), "norm"),
    },
    "opt": {
        "model.decoder.embed_tokens.weight": ((64, 16), "embedding"),
        "model.decoder.embed_positions.weight": ((34, 16), "position"),
        "model.decoder.layers.0.self_attn.q_proj.weight": ((16, 16), "qkv"),
        "model.decoder.layers.0.self_attn.out_proj.weight": ((16, 16), "attn_out"),
        "model.decoder.layers.0.fc1.weight": ((64, 16), "ffn_in"),
        "model.decoder.layers.0.fc2.weight": ((16, 64), "ffn_out"),
    },
    "bert": {
        "bert.embeddings.word_embeddings.weight": ((64, 16), "embedding"),
        "bert.encoder.layer.0.attention.self.query.weight": ((16, 16), "qkv"),
        "bert.encoder.layer.0.attention.output.dense.weight": ((16, 16), "attn_out"),
        "bert.encoder.layer.0.intermediate.dense.weight": ((64, 16), "ffn_in"),
        "bert.encoder.layer.0.output.dense.weight": ((16, 64), "ffn_out"),
        "bert.pooler.dense.weight": ((16, 16), "other"),
    },
    "model_zoo": {
        "embedding_layer.word_embeddings.weight": ((64, 16), "embedding"),
        "transformer_decoder.layers.0.self_attn.proj_q_dense_layer.weight": ((16, 16), "qkv"),
        "transformer_decoder.layers.0.self_attn.proj_output_dense_layer.weight": (
            (16, 16),
            "attn_out",
        ),
        "transformer_decoder.layers.0.ffn.ffn.0.linear_layer.weight": ((64, 16), "ffn_in"),
        "transformer_decoder.layers.0.ffn.ffn.1.linear_layer.weight": ((16, 64), "ffn_out"),
    },
    "sparsetool_gpt": {
        "tok_emb.weight": ((256, 16), "embedding"),
        "pos_emb.weight": ((64, 16), "position"),
        "blocks.0.ln1.weight": ((16,), "norm"),
        "blocks.0.attn.qkv.weight": ((48, 16), "qkv"),
        "blocks.0.attn.proj.weight": ((16, 16), "attn_out"),
        "blocks.0.mlp.fc.weight": ((64, 16), "ffn_in"),
        "blocks.0.mlp.proj.weight": ((16, 64), "ffn_out"),
        "head.weight": ((256, 16), "head"),
    },
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_plan_gives_role_target_reason_and_layout_per_family(family):
    table = FAMILIES[family]
    plan = plan_targets({n: (shape, "F32") for n, (shape, _) in table.items()})
    assert isinstance(plan, TargetPlan) and len(plan) == len(table)
    assert [e.name for e in plan] == list(table)  # the given order
    want = [n for n, (_, r) in table.items() if r in LINEAR_ROLES]
    assert plan.targeted == want and len(want) >= 4
    for name, (shape, expected) in table.items():
        entry = plan[name]
        assert (entry.role, entry.shape, entry.dtype) == (expected, shape, "F32")
        assert entry.targeted == (expected in LINEAR_ROLES) == plan.is_targeted(name)
        assert entry.reason == (
            f"role {expected}"
            if entry.targeted
            else "fewer than 2 dimensions"
            if len(shape) < 2
            else f"role {expected} is not an attention/FFN matrix"
        )
        if entry.targeted:  # the input dimension holds d_model (16), or d_ff (64) for ffn_out
            assert shape[entry.input_dim] == (64 if expected == "ffn_out" else 16), name
            conv1d = family == "gpt2"
            assert entry.layout == ("conv1d" if conv1d else "linear")
            assert entry.input_dim == (0 if conv1d else 1)


def test_plan_agrees_with_the_built_in_gpt_and_the_trainer():
    from sparsetool.models.gpt import GPT, PRESETS

    model = GPT(PRESETS["tiny"])
    plan = plan_targets((n, tuple(p.shape), p.dtype) for n, p in model.named_parameters())
    suffixes = ("attn.qkv.weight", "attn.proj.weight", "mlp.fc.weight", "mlp.proj.weight")
    assert plan.targeted == [
        n for n, _ in model.named_parameters() if n.startswith("blocks.") and n.endswith(suffixes)
    ]
    assert len(plan.targeted) == 4 * PRESETS["tiny"].n_layer
    assert list(model.targeted_parameters()) == plan.targeted
    assert plan["blocks.1.attn.qkv.weight"].dtype == "float32"
    assert [
        plan[f"blocks.0.{m}.weight"].role for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")
    ] == ["qkv", "attn_out", "ffn_in", "ffn_out"]


def test_plan_reasons_for_dtype_mask_include_and_exclude():
    tensors = [
        ("model.layers.0.mlp.up_proj.weight", (8, 4), "I8"),
        ("model.layers.0.mlp.up_proj.weight_mask", (8, 4), "BOOL"),
        ("model.layers.0.mlp.down_proj.weight", (4, 8), "BF16"),
        ("model.layers.1.mlp.down_proj.weight", (4, 8), "BF16"),
        ("model.embed_tokens.weight", (32, 4), "BF16"),
    ]
    plan = plan_targets(tensors, include=["model.embed_*", "*up_proj*"], exclude=["*.layers.1.*"])
    assert plan.targeted == ["model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"]
    assert [e.reason for e in plan] == [
        "dtype I8 is not floating-point",
        "a _mask side tensor",
        "role ffn_out",
        "--exclude '*.layers.1.*'",
        "--include 'model.embed_*'",
    ]
    # exclude wins over include; a single glob given as a string is one glob, not its letters
    plan = plan_targets(tensors, include="model.embed_*", exclude=("*embed*",))
    assert plan.include == ("model.embed_*",) and plan.exclude == ("*embed*",)
    assert plan.targeted == [
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
    ]


def test_plan_reads_the_config_for_gpt2_names_on_linear_weights():
    shapes = {"transformer.h.0.attn.c_proj.weight": ((16, 16), "F16")}
    assert plan_targets(shapes)["transformer.h.0.attn.c_proj.weight"].layout == "conv1d"
    plan = plan_targets(shapes, {"model_type": "gpt_bigcode"})
    assert plan.conv1d is False
    assert (
        plan["transformer.h.0.attn.c_proj.weight"].input_dim,
        plan["transformer.h.0.attn.c_proj.weight"].layout,
    ) == (1, "linear")
    stacked = plan_targets({"model.layers.0.mlp.experts.down_proj": ((2, 16, 64), "BF16")})
    assert (
        stacked["model.layers.0.mlp.experts.down_proj"].layout,
        stacked["model.layers.0.mlp.experts.down_proj"].input_dim,
    ) == ("stacked", 2)


@pytest.mark.parametrize(
    "config,layout,dim",
    [
        (None, "stacked", 2),
        ({"model_type": "mixtral"}, "stacked", 2),
        ({"model_type": "gpt_oss"}, "stacked_t", 1),
        ({"model_type": "llama4", "text_config": {"model_type": "llama4_text"}}, "stacked_t", 1),
        ({"model_type": "llama4_text"}, "stacked_t", 1),
    ],
)
def test_fused_experts_orientation_comes_from_the_config(config, layout, dim):
    names = {
        "model.layers.0.mlp.experts.gate_up_proj": ((4, 16, 64), "BF16"),
        "model.layers.0.mlp.experts.5.down_proj.weight": ((16, 32), "BF16"),
        "model.layers.0.mlp.router.weight": ((4, 16), "BF16"),
        "model.layers.0.conv.weight": ((4, 8, 3, 3), "BF16"),
    }
    plan = plan_targets(names, config, include=["*.conv.*"])
    fused = plan["model.layers.0.mlp.experts.gate_up_proj"]
    assert (fused.layout, fused.input_dim, fused.experts, fused.expert) == (layout, dim, 4, None)
    assert plan.experts_in_out == (layout == "stacked_t")
    one = plan["model.layers.0.mlp.experts.5.down_proj.weight"]
    assert (one.layout, one.input_dim, one.experts, one.expert) == ("linear", 1, 0, 5)
    router = plan["model.layers.0.mlp.router.weight"]
    assert (router.role, router.targeted, router.reason) == (
        "router",
        False,
        "role router is not an attention/FFN matrix",
    )
    kernel = plan["model.layers.0.conv.weight"]  # not an expert stack, whatever the config
    assert (kernel.layout, kernel.input_dim, kernel.experts) == ("kernel", 1, 0)


def test_select_replaces_the_default_roles_like_param_filter():
    table = FAMILIES["sparsetool_gpt"]
    tensors = {n: (shape, "F32") for n, (shape, _) in table.items()}
    plan = plan_targets(tensors, select=["*mlp*", "*ln1*"], exclude=["*proj*"])
    assert plan.targeted == ["blocks.0.mlp.fc.weight"]  # ln1 is 1-D, proj is excluded
    assert plan["blocks.0.attn.qkv.weight"].reason == "no param_filter glob matches"
    assert plan["blocks.0.mlp.fc.weight"].reason == "param_filter '*mlp*'"


@pytest.mark.parametrize("option", ["include", "exclude"])
def test_a_glob_that_matches_no_tensor_is_an_error_with_example_names(option):
    gpt2 = {
        n.removeprefix("transformer."): (shape, "F32") for n, (shape, _) in FAMILIES["gpt2"].items()
    }
    with pytest.raises(ConfigError) as e:
        plan_targets(gpt2, **{option: ["h.0.*", "nomatch*"]}, source="model.safetensors")
    assert str(e.value) == (
        f"--{option} 'nomatch*' matches no tensor in model.safetensors; tensor names look like: "
        "h.0.attn.c_attn.weight, h.0.mlp.c_fc.weight, wte.weight"
    )
    # a glob that names tensors which can never be pruned is not "no match": prune reports that
    assert plan_targets(gpt2, **{option: ["*ln_1*"]}).targeted


def _gpt2_files(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(gpt2_like_state(), str(path), metadata={"format": "pt"})
    return path


def test_every_checkpoint_reader_refuses_a_glob_that_matches_nothing(tmp_path):
    """prune, report, flops --checkpoint and simulate's workload all plan with the same rule."""
    from sparsetool.flops import from_checkpoint as flops_from_checkpoint
    from sparsetool.hardware.workload import from_checkpoint as workload_from_checkpoint
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint
    from sparsetool.ops.report import summarize

    src = _gpt2_files(tmp_path)
    calls = {
        "prune": lambda **kw: prune_checkpoint(
            src, tmp_path / "o.st", PruneOptions(sparsity=0.5, **kw)
        ),
        "report": lambda **kw: summarize(src, **kw),
        "flops": lambda **kw: flops_from_checkpoint(src, **kw),
        "simulate": lambda **kw: workload_from_checkpoint(src, 1e3, [(1, 1)], **kw),
    }
    for what, call in calls.items():
        for option in ("include", "exclude"):
            with pytest.raises(
                ConfigError,
                match=rf"^--{option} 'nomatch\*' matches no tensor in "
                r"model\.safetensors; tensor names look like: "
                r"transformer\.h\.0\.attn\.c_attn\.weight, ",
            ):
                call(**{option: ("nomatch*",)})
        assert not (tmp_path / "o.st").exists(), what
    # and the same globs select the same tensors everywhere
    kw = dict(include=("*wte*",), exclude=("*.h.1.*",))
    pruned = prune_checkpoint(src, tmp_path / "o.st", PruneOptions(sparsity=0.5, **kw))
    reported = [t.name for t in summarize(src, **kw).tensors if t.targeted]
    simulated = [ly.name for ly in workload_from_checkpoint(src, 1e3, [(1, 1)], **kw).layers]
    assert (
        [t.name for t in pruned.tensors]
        == reported
        == simulated
        == [  # listing order
            "transformer.wte.weight",
            "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.attn.c_proj.weight",
            "transformer.h.0.mlp.c_fc.weight",
            "transformer.h.0.mlp.c_proj.weight",
        ]
    )


@pytest.mark.parametrize(
    "opts",
    [
        dict(sparsity=0.5),
        dict(fraction=0.5),
        dict(nm=(2, 4)),
        dict(sparsity=0.5, scope="global"),
        dict(sparsity=0.5, encoding="bitmask"),
        dict(sparsity=0.5, distribution="erk"),
    ],
)
def test_prune_plans_the_targeting_once_per_checkpoint(tmp_path, monkeypatch, opts):
    """One plan per checkpoint: each tensor's role is read once, whatever the passes."""
    import sparsetool.ops.prune.plan as prune_mod
    import sparsetool.targets as targets
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    src = _gpt2_files(tmp_path)
    plans, roles = [], []
    real_plan, real_role = prune_mod.plan_targets, targets.role

    def counting_plan(*args, **kwargs):
        plans.append(1)
        return real_plan(*args, **kwargs)

    def counting_role(name, shape=()):
        roles.append(name)
        return real_role(name, shape)

    monkeypatch.setattr(prune_mod, "plan_targets", counting_plan)
    monkeypatch.setattr(targets, "role", counting_role)
    result = prune_checkpoint(src, tmp_path / "o.st", PruneOptions(**opts))
    assert len(result.tensors) == 8
    assert len(plans) == 1
    assert sorted(roles) == sorted(gpt2_like_state())  # once per tensor, not once per pass


def _corpus(root: Path) -> Path:
    root.mkdir(parents=True)
    for i in range(6):
        (root / f"m{i}.py").write_text(
            "".join(f"def f{j}(x):\n    return x + {i * j}\n" for j in range(40))
        )
    return root


def test_train_include_exclude_choose_the_sparse_matrices(tmp_path, one_thread):
    from safetensors.torch import load_file

    from sparsetool.train.configkeys import merge
    from sparsetool.train.loop import Trainer

    base = {
        "data": str(_corpus(tmp_path / "data")),
        "preset": "tiny",
        "steps": 2,
        "batch_size": 2,
        "warmup": 1,
        "eval_sequences": 2,
    }
    cfg = merge(
        {"include": ["head.*"]},
        {
            **base,
            "out": str(tmp_path / "run"),
            "sparsity": 0.5,
            "exclude": ("blocks.1.*",),
            "include": (),
        },
    )
    assert cfg.include == ("head.*",) and cfg.exclude == ("blocks.1.*",)
    trainer = Trainer(cfg)
    want = [
        "blocks.0.attn.qkv.weight",
        "blocks.0.attn.proj.weight",
        "blocks.0.mlp.fc.weight",
        "blocks.0.mlp.proj.weight",
        "head.weight",
    ]
    assert list(trainer.targets) == trainer.target_plan.targeted == want
    trainer.run()
    saved = load_file(tmp_path / "run" / "model.safetensors")
    assert sorted(n.removesuffix("_mask") for n in saved if n.endswith("_mask")) == sorted(want)
    for name in want:
        assert saved[name + "_mask"].float().mean().item() == 0.5

    with pytest.raises(
        ConfigError,
        match=r"^--exclude 'blocks\.9\.\*' matches no tensor in the "
        r"model; tensor names look like: blocks\.0\.attn\.qkv",
    ):
        Trainer(merge({}, {**base, "out": str(tmp_path / "bad"), "exclude": ("blocks.9.*",)}))
    with pytest.raises(ConfigError, match="--include takes a glob or a list of globs"):
        merge({}, {**base, "out": str(tmp_path / "bad2"), "include": [3]})


def test_targets_import_no_torch():
    """flops plans checkpoints without torch, so the targeting must not pull it in."""
    import subprocess
    import sys

    code = (
        "import sys, sparsetool.targets; "
        "sys.exit(1 if {'torch', 'numpy', 'typer', 'rich'} & set(sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
