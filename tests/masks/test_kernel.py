"""The one selection kernel (sparsetool.masks.kernel) against a sort-based reference."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sparsetool.errors import SparsetoolError
from sparsetool.masks import top_k_mask
from sparsetool.masks.histograms import bucket_histogram, histogram
from sparsetool.masks.kernel import select_top
from sparsetool.masks.keys import int_keys, magnitude_keys

from helpers import tiny_chunks

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
DTYPES += [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


def specials(dtype):
    """Values that stress the bit patterns: both zeros, subnormals, the extremes, inf, NaN, ties."""
    info = torch.finfo(dtype)
    tiny = info.tiny
    return [
        0.0,
        -0.0,
        tiny,
        -tiny,
        tiny / 2,
        -tiny / 4,
        info.max,
        -info.max,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        1.0 + info.eps,
        float("inf"),
        float("-inf"),
        float("nan"),
    ]


def ref_top_k(scores, k, allowed=None, magnitude=False):
    """Stable sort on the keys: highest first, ties by flat index, NaN and not-allowed left out."""
    values = scores.double().reshape(-1)
    if magnitude:
        values = values.abs()
    values = values.tolist()
    ok = [True] * len(values) if allowed is None else allowed.reshape(-1).tolist()
    order = sorted(
        (i for i, v in enumerate(values) if ok[i] and not math.isnan(v)),
        key=lambda i: (-values[i], i),
    )
    mask = torch.zeros(len(values), dtype=torch.bool)
    mask[order[:k]] = True
    return mask.reshape(scores.shape)


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(0, 60))
    pool = specials(dtype)
    values = draw(
        st.lists(st.sampled_from(pool) | st.floats(-4, 4, width=16), min_size=n, max_size=n)
    )
    scores = torch.tensor(values, dtype=torch.float64).to(dtype)
    if draw(st.booleans()) and n % 2 == 0 and n:
        scores = scores.reshape(2, n // 2)
    allowed = None
    if draw(st.booleans()):
        allowed = torch.tensor(
            draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool
        ).reshape(scores.shape)
    k = draw(st.integers(0, n))
    return scores, k, allowed


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans())
def test_top_k_equals_sort_reference(case, chunked):
    scores, k, allowed = case
    with tiny_chunks(chunked):
        got = top_k_mask(scores, k, allowed)
    assert torch.equal(got, ref_top_k(scores, k, allowed))


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans())
def test_magnitude_select_equals_sort_reference(case, chunked):
    scores, k, allowed = case
    alive = None if allowed is None else allowed.reshape(-1)
    with tiny_chunks(chunked):
        got = torch.from_numpy(select_top(magnitude_keys(scores, alive), k).reshape(scores.shape))
    assert torch.equal(got, ref_top_k(scores, k, allowed, magnitude=True))


def test_top_k_ties_keep_lower_index():
    s = torch.tensor([[1.0, 3.0, 1.0], [1.0, 3.0, 1.0]])
    # flat [1, 3, 1, 1, 3, 1]: both 3s, then the first 1 (flat index 0)
    assert top_k_mask(s, 3).tolist() == [[True, True, False], [False, True, False]]


def test_top_k_never_selects_nan():
    """Deliberate change: the trainer's old top-k ranked NaN below every number but still picked
    it to fill k; the one kernel never selects NaN (as magnitude pruning never kept it), and with
    fewer than k candidates selects them all instead of raising."""
    nan = torch.tensor([float("nan"), 0.0, 1.0])
    assert top_k_mask(nan, 2, allowed=torch.tensor([True, False, True])).tolist() == [
        False,
        False,
        True,
    ]
    assert top_k_mask(nan, 3, allowed=torch.tensor([True, False, True])).tolist() == [
        False,
        False,
        True,
    ]
    assert top_k_mask(-nan, 3).tolist() == [False, True, True]  # NaN with the sign bit, too
    with pytest.raises(SparsetoolError):
        top_k_mask(nan, 4)


def test_top_k_signed_order():
    s = torch.tensor([-1.0, float("-inf"), -0.0, 0.0, -2.0, 5.0])
    assert top_k_mask(s, 4).tolist() == [True, False, True, True, False, True]
    assert top_k_mask(s, 5).tolist() == [True, False, True, True, True, True]
    big = torch.randn(3000, 1000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(
        top_k_mask(big, 2_000_000), big >= big.reshape(-1).kthvalue(1_000_001).values
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40), st.data())
def test_top_k_exact_count_within_allowed(values, data):
    scores = torch.tensor(values, dtype=torch.float32)
    allowed = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
    )
    k = data.draw(st.integers(0, int(allowed.sum())))
    m = top_k_mask(scores, k, allowed=allowed)
    assert int(m.sum()) == k and not (m & ~allowed).any()
    if 0 < k < int(allowed.sum()):
        # every kept score >= every allowed, not-kept score; among equals, lower index first
        kept, rest = scores[m], scores[allowed & ~m]
        assert kept.min() >= rest.max()
        tie = kept.min()
        idx_kept = torch.nonzero(m & (scores == tie)).flatten()
        idx_rest = torch.nonzero(allowed & ~m & (scores == tie)).flatten()
        if len(idx_kept) and len(idx_rest):
            assert idx_kept.max() < idx_rest.min()


def test_histograms_count_available_keys_only():
    w = torch.tensor([1.0, -1.0, 2.0, float("nan"), float("inf"), 1.5])
    keys = magnitude_keys(w, torch.tensor([True, True, True, True, True, False]))
    total, _ = histogram(keys)
    assert int(total.sum()) == 4 and int(total[0x3F80]) == 2 and int(total[0x7F80]) == 1
    fine = bucket_histogram(keys, 0x3F80)  # 1.0 twice; 1.5 (0x3FC00000) is dead
    assert fine.size == 1 << 16 and int(fine[0]) == 2 and int(fine.sum()) == 2
    ints = int_keys(np.array([5, 9, 5, 7], dtype=np.int32), 31, 8)
    assert select_top(ints, 2).tolist() == [True, False, False, True]  # 9 is above inf: dead


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 5000),
    low=st.integers(0, 40000),
    width=st.integers(0, 40),
)
def test_histogram_from_is_the_histogram_with_the_outside_summed(seed, n, low, width):
    """Exact counts for the digits in [low, high], the keys below in low - 1 and above in
    high + 1: one comparison per digit for a narrow range, a compress and bincount for a wide one.
    """
    from sparsetool.masks.histograms import histogram, histogram_from
    from sparsetool.masks.keys import int_keys

    rng = np.random.default_rng(seed)
    centre = int(rng.integers(0, 0x7F80))
    src = np.clip(rng.normal(centre, 300, n), 0, 0x7F80).astype(np.int16)  # finite bf16 magnitudes
    keys = int_keys(src, 15, 0x7F80)
    low = min(low, 0x7FFF)
    high = min(low + width, 0x7FFF)
    full = histogram(keys)[0]
    got = histogram_from(keys, low, high)
    assert np.array_equal(got[low : high + 1], full[low : high + 1])
    if low:
        assert got[low - 1] == full[:low].sum() and not got[: low - 1].any()
    if high < 0x7FFF:
        assert got[high + 1] == full[high + 1 :].sum() and not got[high + 2 :].any()
    assert got.sum() == n
