"""Uniform and ERK keep counts: hand-computed cases and invariants."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.masks.distributions import (
    DISTRIBUTIONS,
    erk_keep,
    keep_counts,
    part_keep_counts,
    uniform_keep,
)


def test_uniform_hand_computed():
    assert uniform_keep({"a": 10, "b": 3, "c": 0}, 0.5) == {
        "a": 5,
        "b": 1,
        "c": 0,
    }  # round(1.5) = 2
    assert uniform_keep({"a": 10}, 0.0) == {"a": 10}
    assert uniform_keep({"a": 10}, 1.0) == {"a": 0}


def test_erk_hand_computed_without_dense_layers():
    # sum/prod: a = 20/100 = 0.2, b = 40/400 = 0.1; uniform total 50 + 200 = 250
    # eps = 250 / (0.2*100 + 0.1*400) = 25/6; real counts 83.33 and 166.67 -> 83 + 167
    assert erk_keep({"a": (10, 10), "b": (20, 20)}, 0.5) == {"a": 83, "b": 167}


def test_erk_hand_computed_with_a_dense_layer():
    # uniform total 2 + 410 = 412; eps = 412 / (0.5*16 + 4096/32) gives the small layer density
    # 1.51 > 1, so it is made dense (16) and the big layer takes the remaining 396
    assert erk_keep({"small": (4, 4), "big": (64, 64)}, 0.9) == {"small": 16, "big": 396}


def test_erk_extremes():
    shapes = {"a": (8, 4), "b": (16, 16), "c": (3, 5, 2, 2)}
    assert erk_keep(shapes, 0.0) == {"a": 32, "b": 256, "c": 60}
    assert erk_keep(shapes, 1.0) == {"a": 0, "b": 0, "c": 0}
    assert erk_keep({}, 0.5) == {}


def test_power_scale_zero_is_uniform_up_to_rounding():
    shapes = {"a": (7, 13), "b": (64, 32), "c": (5, 300)}
    uni = uniform_keep({n: math.prod(s) for n, s in shapes.items()}, 0.7)
    flat = erk_keep(shapes, 0.7, power_scale=0.0)
    assert sum(flat.values()) == sum(uni.values())
    assert all(abs(flat[n] - uni[n]) <= 1 for n in shapes)


def test_registry_and_unknown_name():
    shapes = {"a": (4, 6), "b": (6, 4)}
    assert set(DISTRIBUTIONS) == {"uniform", "erk"}
    assert keep_counts(shapes, 0.5, "uniform") == {"a": 12, "b": 12}
    assert keep_counts(shapes, 0.5, "erk") == erk_keep(shapes, 0.5)
    with pytest.raises(
        ConfigError, match="unknown distribution 'erdos'; choose one of: uniform, erk"
    ):
        keep_counts(shapes, 0.5, "erdos")
    with pytest.raises(SparsetoolError, match="sparsity must be"):
        keep_counts(shapes, 1.5, "erk")


shape_st = st.one_of(
    st.tuples(st.integers(1, 64), st.integers(1, 64)),
    st.tuples(st.integers(1, 512)),
    st.tuples(st.integers(1, 16), st.integers(1, 16), st.integers(1, 3), st.integers(1, 3)),
)


@settings(max_examples=200, deadline=None)
@given(shapes=st.lists(shape_st, min_size=1, max_size=8), sparsity=st.floats(0, 1))
def test_erk_total_equals_uniform_and_small_layers_are_denser(shapes, sparsity):
    named = {f"t{i}": s for i, s in enumerate(shapes)}
    numel = {n: math.prod(s) for n, s in named.items()}
    erk = erk_keep(named, sparsity)
    assert list(erk) == list(named)
    assert sum(erk.values()) == sum(uniform_keep(numel, sparsity).values())
    assert all(0 <= erk[n] <= numel[n] for n in named)
    raw = {n: sum(s) / numel[n] for n, s in named.items()}
    for a in named:
        for b in named:
            if raw[a] > raw[b]:  # a is "smaller" in the ERK sense: never less dense, up to rounding
                assert erk[a] / numel[a] >= erk[b] / numel[b] - 1 / numel[a] - 1 / numel[b]


def test_distributions_targets_and_counts_load_without_torch():
    import subprocess
    import sys

    code = (
        "import sys, sparsetool.masks.distributions, sparsetool.targets, sparsetool.masks.counts; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docstring_examples():
    """The examples in the docstrings run and print what they say (CI collects tests/ only)."""
    import doctest

    import sparsetool.masks.distributions

    result = doctest.testmod(
        sparsetool.masks.distributions, optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("distribution", list(DISTRIBUTIONS))
@pytest.mark.parametrize("sparsity", [0.3, 0.5, 0.77])
def test_a_fused_tensors_experts_count_as_if_stored_apart(distribution, sparsity):
    """Parts of a fused experts tensor are units of the distribution, like separate tensors."""
    fused = {"up": (3, 12, 20), "down": (3, 20, 12), "q": (20, 20)}
    apart = {
        "q": (20, 20),
        **{f"{n}.{e}": s[1:] for n, s in fused.items() if n != "q" for e in range(3)},
    }
    got = part_keep_counts(fused, {"up": 3, "down": 3}, sparsity, distribution)
    want = keep_counts(apart, sparsity, distribution)
    assert got["q"] == [want["q"]]
    for n in ("up", "down"):
        assert got[n] == [want[f"{n}.{e}"] for e in range(3)]
    with pytest.raises(ValueError, match="not 4 parts"):
        part_keep_counts({"up": (3, 12, 20)}, {"up": 4}, sparsity, distribution)
