"""Counts and screens on raw bit patterns (numpy, no torch) against the float semantics torch
gives the same values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.checkpoint.bits import (
    count_nonzero_bits,
    holds_nan_or_negative_zero,
    nonzero_bits,
)

TYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64}
VIEWS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _values(st_dtype: str, seed: int, n: int, specials: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=g, dtype=torch.float64)
    if specials:  # some NaN of either sign, -0.0, +0.0 and infinities
        picks = torch.randint(0, 8, (n,), generator=g)
        t[picks == 0] = float("nan")
        t[picks == 1] = -float("nan")
        t[picks == 2] = -0.0
        t[picks == 3] = 0.0
        t[picks == 4] = -float("inf")
    return t.to(TYPES[st_dtype])


@settings(max_examples=60, deadline=None)
@given(
    st_dtype=st.sampled_from(sorted(TYPES)),
    seed=st.integers(0, 10_000),
    n=st.integers(1, 300),
    specials=st.booleans(),
)
def test_bit_counts_agree_with_float_semantics(st_dtype, seed, n, specials):
    t = _values(st_dtype, seed, n, specials)
    if specials and seed % 3 == 0:  # only one kind of special at a time, too
        t = torch.where(torch.isnan(t), torch.zeros_like(t), t)
    bits = t.view(VIEWS[t.element_size()]).numpy()
    nan = int(torch.isnan(t).sum())
    negative_zero = int(((t == 0) & torch.signbit(t)).sum())
    assert holds_nan_or_negative_zero(bits, st_dtype) == (nan + negative_zero > 0)
    assert count_nonzero_bits(bits, st_dtype) == int((t != 0).sum())
    assert np.array_equal(nonzero_bits(bits, floating=True), (t != 0).numpy())


@pytest.mark.parametrize("st_dtype", sorted(TYPES))
def test_the_screen_finds_one_special_in_a_long_array(st_dtype):
    """One NaN or -0.0 in several chunks of clean values, at the start, middle or end."""
    clean = _values(st_dtype, 0, 5_000_000, False)
    clean[clean == 0] = 1.0
    for special in (float("nan"), -float("nan"), -0.0):
        for at in (0, 2_500_001, 4_999_999):
            t = clean.clone()
            t[at] = special
            assert holds_nan_or_negative_zero(t.view(VIEWS[t.element_size()]).numpy(), st_dtype)
    assert not holds_nan_or_negative_zero(clean.view(VIEWS[clean.element_size()]).numpy(), st_dtype)
