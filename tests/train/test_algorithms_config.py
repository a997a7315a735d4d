"""build_sparsifier: sparsetool's keys, the Cerebras Model Zoo ``sparsity:`` block, clear errors;
and the deterministic top-k the mask updates are built on."""

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.errors import ConfigError
from sparsetool.train.algorithms import (
    ALGORITHMS,
    GMP,
    IMP,
    SET,
    GraNet,
    RigL,
    Static,
    build_sparsifier,
)
from sparsetool.train.rng import step_generator
from sparsetool.train.schedules import Constant, Cosine, Periodic, Polynomial

# The sparsity block of the Cerebras Model Zoo GPT-3 125M RigL config
# (params_gpt3_125m_rigl75.yaml).
MODEL_ZOO_RIGL = """
sparsity:
    sparsity: 0.75
    init_method: "random"
    algorithm: "rigl"
    drop_fraction:
      type: "cosine" # anneal drop fraction with cosine schedule
      init: 0.3
      half_period: 3584 # set half-period to schedule at 75% of max_steps
    update:
      freq: 100 # update every 100 steps
      stop: 3584 # stop updates at step 3584 (not inclusive)
    param_filter:
      - "*proj_[qkv]_dense_layer.weight"
      - "*proj_output_dense_layer.weight"
      - "*linear_layer.weight"
"""

# The Variable SPDF stage-1 block (no algorithm: static), params_gpt3_6p7b_vspdf_phase1.yaml.
MODEL_ZOO_STATIC = """
sparsity:
    sparsity: 0.90
    init_method: "random"
    param_filter:
      - "*proj_[qkv]_dense_layer.weight"
      - "*proj_output_dense_layer.weight"
      - "*linear_layer.weight"
"""


def zoo_params():
    g = torch.Generator().manual_seed(0)
    names = [
        "gpt2_decoder.layers.0.self_attn.proj_q_dense_layer.weight",
        "gpt2_decoder.layers.0.self_attn.proj_output_dense_layer.weight",
        "gpt2_decoder.layers.0.ffn.ffn.0.linear_layer.weight",
        "gpt2_decoder.layers.0.ffn.ffn.0.linear_layer.bias",
        "embedding_layer.word_embeddings.weight",
    ]
    shapes = [(16, 16), (16, 16), (32, 16), (32,), (50, 16)]
    return {n: torch.nn.Parameter(torch.randn(s, generator=g)) for n, s in zip(names, shapes)}


def test_registry():
    assert {
        "static": Static,
        "gmp": GMP,
        "set": SET,
        "rigl": RigL,
        "granet": GraNet,
        "imp": IMP,
    } == ALGORITHMS


def test_model_zoo_rigl_block():
    sp = build_sparsifier(yaml.safe_load(MODEL_ZOO_RIGL)["sparsity"])
    assert isinstance(sp, RigL)
    params = zoo_params()
    sp.attach(params, None, 4778)
    assert sorted(sp.masks) == sorted(list(params)[:3])  # the bias and the embedding are left dense
    assert sp.schedules.updates == Periodic(100, 100, 3584)
    assert sp.schedules.drop_fraction == Cosine(0.3, 0.0, 0, 3584)
    assert sp.sparsity() == pytest.approx(0.75)


def test_model_zoo_static_block_defaults_to_static():
    sp = build_sparsifier(yaml.safe_load(MODEL_ZOO_STATIC)["sparsity"])
    assert type(sp) is Static
    sp.attach(zoo_params(), None, 100)
    assert [int(m.sum()) for m in sp.masks.values()] == [
        26,
        26,
        51,
    ]  # 256 - round(230.4), 512 - 461


def test_flat_update_keys_and_schedule_alias():
    a = build_sparsifier({"algorithm": "set", "update_freq": 10, "begin": 20, "end": 90})
    b = build_sparsifier({"algorithm": "set", "schedule": {"freq": 10, "start": 20, "stop": 90}})
    for sp in (a, b):
        assert (sp.update_freq, sp.update_start, sp.update_stop) == (10, 20, 90)


def test_defaults_follow_rigl_paper():
    # dT = 100, T_end = 75% of training, alpha = 0.3 cosine-decayed (Evci et al. 2020)
    sp = build_sparsifier({"algorithm": "rigl", "sparsity": 0.9})
    sp.attach(zoo_params(), None, 10_000)
    assert sp.schedules.updates == Periodic(100, 100, 7500)
    assert sp.schedules.drop_fraction == Cosine(0.3, 0.0, 0, 7500)
    s = build_sparsifier({"algorithm": "set", "sparsity": 0.9})
    s.attach(zoo_params(), None, 10_000)
    assert s.schedules.drop_fraction == Constant(0.3)  # SET's zeta


def test_runs_under_400_steps_update_every_quarter_of_training():
    sp = build_sparsifier({"algorithm": "rigl", "sparsity": 0.9})
    sp.attach(zoo_params(), None, 60)
    assert sp.schedules.updates == Periodic(15, 15, 45)


def test_gmp_and_granet_schedules():
    g = build_sparsifier(
        {"algorithm": "gmp", "sparsity": 0.8, "update": {"freq": 10, "start": 0, "stop": 100}}
    )
    g.attach(zoo_params(), None, 200)
    assert g.schedules.sparsity == Polynomial(0.0, 0.8, 0, 100, 3)
    gr = build_sparsifier(
        {
            "algorithm": "granet",
            "init_sparsity": 0.5,
            "sparsity": 0.8,
            "update": {"freq": 10, "stop": 100},
        }
    )
    gr.attach(zoo_params(), None, 200)
    assert gr.schedules.sparsity == Polynomial(0.5, 0.8, 10, 100, 3)
    assert gr.sparsity() == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"algorithm": "lottery"},
            "unknown algorithm 'lottery'; valid: static, gmp, set, rigl, granet, imp",
        ),
        (
            {"algorithm": "static", "drop_fraction": 0.3},
            "key 'drop_fraction' is not used by algorithm 'static'; valid keys: algorithm, "
            "distribution, init_method, param_filter, seed, sparsity",
        ),
        ({"algorithm": "static", "update": {"freq": 3}}, "static has no mask updates"),
        (
            {"algorithm": "rigl", "update": {"every_other": 3}},
            "unknown key 'every_other' in 'update'",
        ),
        (
            {"algorithm": "rigl", "sparsity": 1.5},
            "sparsity must be a number from 0 to 1",
        ),  # 1.0 now allowed
        (
            {"algorithm": "rigl", "init_method": "snip"},
            "init_method 'snip' is not known; valid: magnitude, random",
        ),
        ({"algorithm": "rigl", "distribution": "dense"}, "valid: erk, uniform"),
        ({"algorithm": "rigl", "drop_fraction": 2}, r"drop_fraction must be in \[0, 1\]"),
        ({"algorithm": "rigl", "seed": "x"}, "seed must be an integer"),
        ({"algorithm": "rigl", "param_filter": 3}, "param_filter must be a glob"),
        ({"algorithm": "rigl", "freq": 5, "update_freq": 6}, "given twice"),
        ({"algorithm": "imp"}, "give a target sparsity or a number of rounds"),
        ({"algorithm": "imp", "sparsity": 0.5, "fraction": 1.0}, r"fraction must be in \(0, 1\)"),
        (
            {"algorithm": "gmp", "initial_sparsity": -0.1},
            "initial_sparsity must be a number from 0 to 1",
        ),
        ({"algorithm": "rigl", "update": {"freq": 0}}, "freq must be >= 1"),
    ],
)
def test_config_errors_name_the_key_and_the_valid_choices(config, message):
    with pytest.raises(ConfigError, match=message):
        build_sparsifier(config)


def test_attach_errors():
    with pytest.raises(ConfigError, match="no parameter matches param_filter"):
        build_sparsifier({"param_filter": ["*nothing*"]}).attach(zoo_params(), None, 10)
    with pytest.raises(ConfigError, match="below initial_sparsity"):
        build_sparsifier({"algorithm": "gmp", "initial_sparsity": 0.5, "sparsity": 0.3}).attach(
            zoo_params(), None, 1000
        )
    with pytest.raises(ConfigError, match="must be after start"):
        build_sparsifier({"algorithm": "rigl", "update": {"freq": 100}}).attach(
            zoo_params(), None, 50
        )  # default stop 37 < start 100


def test_default_targets_with_a_ddp_prefix():
    g = torch.Generator().manual_seed(0)
    names = [
        "module.blocks.0.attn.qkv.weight",
        "module.blocks.0.attn.proj.weight",
        "module.blocks.0.mlp.fc.weight",
        "module.blocks.0.mlp.proj.weight",
        "module.blocks.0.mlp.fc.bias",
        "module.wte.weight",
        "module.lm_head.weight",
    ]
    params = {
        n: torch.nn.Parameter(
            torch.randn(8, 8, generator=g) if n.endswith("weight") else torch.randn(8, generator=g)
        )
        for n in names
    }
    sp = build_sparsifier({"sparsity": 0.5})
    sp.attach(params, None, 10)
    assert sorted(sp.masks) == sorted(names[:4])


def test_step_generator_depends_on_all_three():
    draws = {
        (s, t, i): torch.rand(4, generator=step_generator(s, t, i)).tolist()
        for s in (0, 1)
        for t in (0, 1)
        for i in (0, 1)
    }
    assert len({tuple(v) for v in draws.values()}) == 8
    assert torch.rand(4, generator=step_generator(1, 1, 1)).tolist() == draws[(1, 1, 1)]


def _fake_model(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for i, shape in enumerate(shapes):
        p = torch.nn.Parameter(torch.randn(shape, generator=g))
        p.grad = torch.randn(shape, generator=g)
        params[f"blocks.{i}.mlp.fc.weight"] = p
    return params


@settings(max_examples=40, deadline=None)
@given(
    algo=st.sampled_from(["set", "rigl"]),
    shapes=st.lists(st.tuples(st.integers(1, 12), st.integers(1, 12)), min_size=1, max_size=3),
    sparsity=st.floats(0.0, 0.95),
    drop=st.floats(0.0, 1.0),
    seed=st.integers(0, 3),
)
def test_drop_and_grow_invariants(algo, shapes, sparsity, drop, seed):
    params = _fake_model(shapes, seed)
    sp = build_sparsifier(
        {
            "algorithm": algo,
            "sparsity": sparsity,
            "seed": seed,
            "drop_fraction": {"type": "constant", "value": drop},
            "update": {"freq": 1, "start": 0, "stop": 10},
        }
    )
    sp.attach(params, None, 10)
    old = {n: m.clone() for n, m in sp.masks.items()}
    sp.before_step(0)
    for n, m in sp.masks.items():
        k = int(old[n].sum())
        assert int(m.sum()) == k  # the non-zero count of every tensor is kept exactly
        grown, dropped = m & ~old[n], old[n] & ~m
        expected = min(round(drop * k), m.numel() - k)  # capped by the pruned positions there are
        assert int(grown.sum()) == int(dropped.sum()) == expected
        w = params[n].detach()
        assert not w[~m].any() and not w[grown].any()
        assert not params[n].grad[~m | grown].any()


def test_equal_magnitudes_drop_the_higher_indices():
    w = torch.nn.Parameter(torch.ones(4, 4))
    w.grad = torch.zeros(4, 4)
    mask = torch.zeros(4, 4, dtype=torch.bool)
    mask[:2] = True  # 8 kept, all |w| = 1
    sp = build_sparsifier(
        {
            "algorithm": "rigl",
            "sparsity": 0.5,
            "drop_fraction": 0.25,
            "update": {"freq": 1, "start": 0, "stop": 10},
        }
    )
    sp.masks = {"blocks.0.mlp.fc.weight": mask}
    sp.attach({"blocks.0.mlp.fc.weight": w}, None, 10)
    sp.before_step(
        0
    )  # drop round(0.25 * 1.0 * 8) = 2: flat 6 and 7; grow the two lowest pruned: 8, 9
    assert torch.nonzero(sp.masks["blocks.0.mlp.fc.weight"].flatten()).flatten().tolist() == [
        0,
        1,
        2,
        3,
        4,
        5,
        8,
        9,
    ]
