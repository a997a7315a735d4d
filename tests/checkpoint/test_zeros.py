"""Bit-pattern zero tests agree with plain float comparisons, -0.0 and NaN included."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.checkpoint.zeros import count_nonzero_values as count_nonzero
from sparsetool.checkpoint.zeros import negative_zeros

VALUES = st.sampled_from([0.0, -0.0, 1.0, -2.5, 1e-3, float("nan"), float("inf"), -float("inf")])


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(VALUES, min_size=0, max_size=40),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]),
)
def test_agrees_with_float_comparison(values, dtype):
    t = torch.tensor(values, dtype=dtype)
    assert count_nonzero(t) == int((t != 0).sum())
    neg = negative_zeros(t)
    expected = (t == 0) & torch.signbit(t)
    if expected.any():
        assert torch.equal(neg, expected)
    else:
        assert neg is None


def test_bool_int_and_strided():
    assert count_nonzero(torch.tensor([True, False, True])) == 2
    assert count_nonzero(torch.tensor([0, 3, -1], dtype=torch.int64)) == 2
    t = torch.tensor([[0.0, 1.0], [-0.0, 2.0]]).T  # not contiguous: counted on a contiguous copy
    assert count_nonzero(t) == 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_negative_zero_positions(dtype):
    t = torch.tensor([-0.0, 0.0, -1.0, -0.0], dtype=dtype)
    assert negative_zeros(t).tolist() == [True, False, False, True]
