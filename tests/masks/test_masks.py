"""Exact-count masks: magnitude, random, N:M and global magnitude against sort-based references."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparsetool.errors import SparsetoolError
from sparsetool.masks.counts import fraction_keep, sparsity_keep
from sparsetool.masks.global_magnitude import (
    GlobalPlan,
    MagnitudeHistogram,
    TensorPlan,
    apply_threshold,
    global_magnitude_masks,
    global_threshold_plan,
)
from sparsetool.masks.select import magnitude_mask, nm_mask, random_mask

from helpers import tiny_chunks

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64]
# Few distinct magnitudes so ties are common; both zeros; values that share one bf16 / coarse
# bucket.
POOL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    -2.0,
    3.0,
    1.0 + 2**-20,
    1.0 + 2**-10,
    1e-30,
    -1e-30,
    65504.0,
    float("inf"),
    float("-inf"),
    float("nan"),
    1e-8,
    7.25,
    -7.25,
]


# ----------------------------------------------------------------------------------------------
# references


def ref_magnitude(w: torch.Tensor, keep: int, existing=None) -> torch.Tensor:
    """Sort-based reference: largest |w| first, ties by flat index, NaN and dead excluded."""
    values = w.double().abs().reshape(-1).tolist()
    alive = [True] * len(values) if existing is None else existing.reshape(-1).tolist()
    order = sorted(
        (i for i, v in enumerate(values) if alive[i] and not math.isnan(v)),
        key=lambda i: (-values[i], i),
    )
    mask = torch.zeros(len(values), dtype=torch.bool)
    mask[order[:keep]] = True
    return mask.reshape(w.shape)


def ref_global(tensors, keep, existing):
    """Reference global selection: fp32 |w|, then earlier tensor, then lower flat index."""
    entries = []
    for t, (w, e) in enumerate(zip(tensors, existing)):
        values = w.float().double().abs().reshape(-1).tolist()
        alive = [True] * len(values) if e is None else e.reshape(-1).tolist()
        entries += [(-v, t, i) for i, v in enumerate(values) if alive[i] and not math.isnan(v)]
    entries.sort()
    masks = [torch.zeros(w.numel(), dtype=torch.bool) for w in tensors]
    for _, t, i in entries[:keep]:
        masks[t][i] = True
    return [m.reshape(w.shape) for m, w in zip(masks, tensors)]


@st.composite
def weights(draw, max_size=48, pool=True):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, max_size))
    if pool and draw(st.booleans()):
        values = draw(st.lists(st.sampled_from(POOL), min_size=n, max_size=n))
    else:
        values = draw(st.lists(st.floats(width=32, allow_nan=True), min_size=n, max_size=n))
    w = torch.tensor(values, dtype=torch.float64).to(dtype)
    cols = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
    return w.reshape(n // cols, cols)


@st.composite
def weights_and_alive(draw, max_size=48):
    w = draw(weights(max_size))
    alive = None
    if draw(st.booleans()):
        bits = draw(st.lists(st.booleans(), min_size=w.numel(), max_size=w.numel()))
        alive = torch.tensor(bits, dtype=torch.bool).reshape(w.shape)
    return w, alive


# ----------------------------------------------------------------------------------------------
# counts and checks


def test_keep_counts_round_half_to_even():
    assert sparsity_keep(10, 0.25) == 8  # round(2.5) = 2
    assert sparsity_keep(10, 0.35) == 6  # round(3.5) = 4
    assert sparsity_keep(1000, 0.9) == 100
    assert sparsity_keep(7, 1.0) == 0 and sparsity_keep(7, 0.0) == 7
    assert fraction_keep(100, 0.2) == 80 and fraction_keep(0, 0.5) == 0


# (the sparsity and fraction checks are tested with the other shared options:
# tests/util/test_options.py)


# ----------------------------------------------------------------------------------------------
# magnitude


def test_magnitude_hand_computed():
    w = torch.tensor([[0.5, -2.0, 0.0, 1.0], [1.0, 3.0, -0.5, 0.25]])
    # keep 4: 3.0, -2.0, then the two 1.0 (indices 3 and 4)
    assert magnitude_mask(w, 0.5).tolist() == [
        [False, True, False, True],
        [True, True, False, False],
    ]
    # keep 3: the tie between the 1.0s goes to the lower flat index
    assert magnitude_mask(w, keep=3).reshape(-1).nonzero().reshape(-1).tolist() == [1, 3, 5]
    # keep 5: 0.5 and -0.5 tie, lower index first
    assert magnitude_mask(w, keep=5).reshape(-1).nonzero().reshape(-1).tolist() == [0, 1, 3, 4, 5]


def test_negative_zero_equals_zero_and_nan_is_never_kept():
    w = torch.tensor([-0.0, 0.0, float("nan"), -0.0, 1.0])
    assert magnitude_mask(w, keep=2).tolist() == [True, False, False, False, True]
    assert magnitude_mask(w, keep=5).tolist() == [True, True, False, True, True]
    assert magnitude_mask(w, keep=0).tolist() == [False] * 5


def test_fp32_values_inside_one_coarse_bucket_are_ordered_exactly():
    # all share the high 16 bits of 1.0, so the second (low 16-bit) level decides
    w = torch.tensor([1.0, 1.0 + 2**-23, 1.0 + 2**-22, 1.0 + 2**-23, 1.0 + 2**-16])
    assert magnitude_mask(w, keep=3).tolist() == [False, True, True, False, True]
    assert magnitude_mask(w.double(), keep=3).tolist() == [False, True, True, False, True]


def test_infinity_is_the_largest_and_nan_payloads_next_to_it_are_not():
    inf_bits = torch.tensor([0x7F800000, 0x7F800001, 0x7FC00000, 0x3F800000], dtype=torch.int32)
    w = inf_bits.view(torch.float32)  # inf, NaN (payload 1), NaN, 1.0
    assert magnitude_mask(w, keep=1).tolist() == [True, False, False, False]
    assert magnitude_mask(w, keep=3).tolist() == [True, False, False, True]


def test_fp8_is_ranked_through_fp32():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")
    w = torch.tensor([0.5, -4.0, 2.0, 1.0]).to(torch.float8_e4m3fn)
    assert magnitude_mask(w, keep=2).tolist() == [False, True, True, False]


def test_existing_mask_never_revives():
    w = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    alive = torch.tensor([False, True, False, True, True])
    assert magnitude_mask(w, keep=2, existing=alive).tolist() == [False, True, False, True, False]
    # asking for more than is alive keeps exactly the alive ones
    assert magnitude_mask(w, keep=4, existing=alive).tolist() == alive.tolist()
    assert magnitude_mask(w, 0.0, existing=alive).tolist() == alive.tolist()


def test_iterative_fraction_steps_compose():
    w = torch.randn(40, 25, generator=torch.Generator().manual_seed(1))
    mask, nnz = None, w.numel()
    for _ in range(4):
        keep = fraction_keep(nnz, 0.2)
        new = magnitude_mask(w, keep=keep, existing=mask)
        if mask is not None:
            assert not (new & ~mask).any()
        assert int(new.sum()) == keep
        mask, nnz = new, keep
    assert nnz == 410  # 1000 -> 800 -> 640 -> 512 -> 410 (round(102.4) = 102)


def test_magnitude_bad_input():
    w = torch.ones(2, 3)
    with pytest.raises(SparsetoolError, match="exactly one"):
        magnitude_mask(w)
    with pytest.raises(SparsetoolError, match="exactly one"):
        magnitude_mask(w, 0.5, keep=3)
    with pytest.raises(SparsetoolError, match="from 0 to 6"):
        magnitude_mask(w, keep=7)
    with pytest.raises(SparsetoolError, match="sparsity must be"):
        magnitude_mask(w, 1.2)
    with pytest.raises(SparsetoolError, match=r"shape \(3, 2\).*\(2, 3\)"):
        magnitude_mask(w, 0.5, existing=torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(SparsetoolError, match="floating"):
        magnitude_mask(torch.ones(4, dtype=torch.int64), 0.5)


def test_input_is_not_modified():
    w = torch.tensor([1.0, -2.0, float("nan"), -0.0])
    before = w.clone()
    magnitude_mask(w, 0.5, existing=torch.tensor([True, True, False, True]))
    nm_mask(w.reshape(2, 2), 1, 2)
    MagnitudeHistogram.of(w)
    assert torch.equal(w.view(torch.int32), before.view(torch.int32))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=weights_and_alive(), data=st.data())
def test_magnitude_equals_sort_reference(case, data):
    w, alive = case
    keep = data.draw(st.integers(0, w.numel()))
    with tiny_chunks(data.draw(st.booleans())):
        got = magnitude_mask(w, keep=keep, existing=alive)
    assert got.shape == w.shape and got.dtype == torch.bool
    assert torch.equal(got, ref_magnitude(w, keep, alive))
    available = int((~torch.isnan(w) & (alive if alive is not None else True)).sum())
    assert int(got.sum()) == min(keep, available)


@settings(max_examples=150, deadline=None)
@given(w=weights(), sparsity=st.floats(0, 1))
def test_sparsity_gives_exact_zero_count_and_keeps_the_largest(w, sparsity):
    w = w.masked_fill(torch.isnan(w), 0.0)
    mask = magnitude_mask(w, sparsity)
    assert int((~mask).sum()) == round(sparsity * w.numel())
    a = w.double().abs()
    if mask.any() and (~mask).any():
        assert a[mask].min() >= a[~mask].max()


@settings(max_examples=100, deadline=None)
@given(w=weights(), data=st.data())
def test_prune_of_prune_is_nested_and_exact(w, data):
    k1 = data.draw(st.integers(0, w.numel()))
    k2 = data.draw(st.integers(0, w.numel()))
    m1 = magnitude_mask(w, keep=k1)
    m2 = magnitude_mask(w, keep=k2, existing=m1)
    assert not (m2 & ~m1).any()
    assert int(m2.sum()) == min(k2, int(m1.sum()))
    if k2 <= k1:  # the smaller keep of the same weights is the same set either way
        assert torch.equal(m2, magnitude_mask(w, keep=k2))


def torch_reference(w, keep, alive):
    """Vectorised reference for big tensors: a stable sort of |w| (float64), descending."""
    a = w.double().abs().reshape(-1)
    dead = torch.isnan(a) | ~alive.reshape(-1)
    a = a.masked_fill(dead, -1.0)
    order = torch.sort(a, descending=True, stable=True).indices[:keep]
    mask = torch.zeros(a.numel(), dtype=torch.bool)
    mask[order] = True
    return mask & ~dead


@pytest.mark.parametrize("dtype", DTYPES)
def test_magnitude_on_a_multi_chunk_tensor_with_ties_nan_and_dead_weights(dtype):
    g = torch.Generator().manual_seed(5)
    w = torch.randn(1536, 1024, generator=g).to(dtype)  # 1.5 chunks of 2**20
    w.view(-1)[::97] = 0.5  # a big tie group spread over both chunks
    w.view(-1)[::1001] = -0.0
    w.view(-1)[3::4999] = float("nan")
    alive = torch.rand(w.shape, generator=g) > 0.1
    for keep in (1, 700_000, w.numel()):
        got = magnitude_mask(w, keep=keep, existing=alive)
        assert torch.equal(got.reshape(-1), torch_reference(w, keep, alive)), keep
    # the tie group straddles the boundary: keep exactly up to the middle of it
    above = int((w.double().abs() > 0.5).logical_and(alive).sum())
    keep = above + int(((w == 0.5) & alive).sum()) // 2
    assert torch.equal(
        magnitude_mask(w, keep=keep, existing=alive).reshape(-1), torch_reference(w, keep, alive)
    )


# ----------------------------------------------------------------------------------------------
# random


def test_random_is_exact_reproducible_and_seed_dependent():
    a = random_mask((64, 32), 0.75, seed=7)
    assert int(a.sum()) == 512 and a.shape == (64, 32)
    assert torch.equal(a, random_mask((64, 32), 0.75, seed=7))
    assert torch.equal(a, random_mask((64, 32), 0.75, generator=torch.Generator().manual_seed(7)))
    assert not torch.equal(a, random_mask((64, 32), 0.75, seed=8))
    assert torch.equal(random_mask((5,), keep=2), random_mask((5,), keep=2, seed=0))


@pytest.mark.parametrize("sparsity", [0.0001, 0.5, 0.9999])
def test_random_is_exact_on_a_multi_chunk_tensor(sparsity):
    shape = (1500, 1000)  # 1.4 chunks: the histogram path, with keys in every top-digit bucket
    alive = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.3
    keep = sparsity_keep(1_500_000, sparsity)
    m = random_mask(shape, sparsity, seed=4)
    assert int(m.sum()) == keep
    m = random_mask(shape, keep=keep // 2, existing=alive, seed=4)
    assert int(m.sum()) == keep // 2 and not (m & ~alive).any()


def test_keys_just_below_the_top_key_are_counted():
    """Keys that share the top digit with the "inf" key but sit below it are alive."""
    from sparsetool.masks.kernel import select_top
    from sparsetool.masks.keys import int_keys

    keys = torch.full((10_000,), 0x3FFF0000, dtype=torch.int32)
    keys[::3] = 5
    with tiny_chunks():
        mask = select_top(int_keys(keys, 31, (1 << 30) - 1), 6000)
    assert int(mask.sum()) == 6000 and bool(mask[1]) and not bool(mask[0])


def test_random_generator_gives_a_different_mask_per_call():
    g = torch.Generator().manual_seed(0)
    assert not torch.equal(
        random_mask((32, 32), 0.5, generator=g), random_mask((32, 32), 0.5, generator=g)
    )


def test_random_is_roughly_uniform():
    hits = torch.zeros(100)
    for seed in range(200):
        hits += random_mask((100,), keep=10, seed=seed).float()
    # each position is kept with probability 0.1: 20 expected of 200, binomial sd ~4.2
    assert hits.min() >= 4 and hits.max() <= 40


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 200), data=st.data())
def test_random_composes(n, data):
    alive = torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    keep = data.draw(st.integers(0, n))
    seed = data.draw(st.integers(0, 2**31))
    m = random_mask((n,), keep=keep, existing=alive, seed=seed)
    with tiny_chunks():
        assert torch.equal(m, random_mask((n,), keep=keep, existing=alive, seed=seed))
    assert not (m & ~alive).any()
    assert int(m.sum()) == min(keep, int(alive.sum()))


def test_random_bad_input():
    with pytest.raises(SparsetoolError, match="not both"):
        random_mask((4,), 0.5, seed=1, generator=torch.Generator())


# ----------------------------------------------------------------------------------------------
# N:M


def test_nm_hand_computed_and_ties():
    w = torch.tensor([[1.0, -4.0, 3.0, 2.0, 0.0, 0.0, 0.0, 5.0]])
    assert nm_mask(w, 2, 4).tolist() == [[False, True, True, False, True, False, False, True]]
    w = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    assert nm_mask(w, 2, 4).tolist() == [[True, True, False, False]]
    assert nm_mask(w, 0, 4).tolist() == [[False] * 4] and nm_mask(w, 4, 4).all()


def test_nm_along_dim_0_for_conv1d_layout():
    w = torch.tensor([[1.0, 9.0], [3.0, 2.0], [0.0, 0.0], [-5.0, 1.0]])  # (in=4, out=2)
    assert nm_mask(w, 1, 2, dim=0).tolist() == [
        [False, True],
        [True, False],
        [False, False],
        [True, True],
    ]


def test_nm_composes_and_skips_nan():
    w = torch.tensor([[4.0, 3.0, 2.0, 1.0, float("nan"), 1.0, 2.0, 3.0]])
    alive = torch.tensor([[False, True, True, True, True, True, True, False]])
    assert nm_mask(w, 2, 4, existing=alive).tolist() == [
        [False, True, True, False, False, True, True, False]
    ]


def test_nm_errors_name_the_problem():
    w = torch.ones(4, 6)
    with pytest.raises(SparsetoolError, match="size along dimension 1 is 6, not divisible by 4"):
        nm_mask(w, 2, 4)
    with pytest.raises(SparsetoolError, match="0 <= N <= M"):
        nm_mask(w, 3, 2)
    with pytest.raises(SparsetoolError, match="0 <= N <= M"):
        nm_mask(w, 1, 0)
    with pytest.raises(SparsetoolError, match="out of range"):
        nm_mask(w, 1, 2, dim=2)


@pytest.mark.parametrize(
    "dtype,dim,n,m",
    [
        (torch.bfloat16, -1, 2, 4),
        (torch.float32, 0, 2, 4),
        (torch.float16, 1, 3, 8),
        (torch.float32, -1, 5, 32),
    ],
)
def test_nm_on_a_multi_chunk_tensor(dtype, dim, n, m):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(1024, 1536, generator=g).to(dtype)
    w.view(-1)[::13] = 0.5  # ties inside groups
    w.view(-1)[::4001] = float("nan")
    alive = torch.rand(w.shape, generator=g) > 0.1
    got = nm_mask(w, n, m, dim=dim, existing=alive)
    # reference: a stable sort of each group by |w| (dead and NaN last)
    a = w.double().abs().masked_fill(torch.isnan(w) | ~alive, -1.0).movedim(dim, -1)
    groups = a.reshape(-1, m)
    order = torch.sort(groups, dim=1, descending=True, stable=True).indices[:, :n]
    expected = torch.zeros_like(groups, dtype=torch.bool).scatter_(1, order, True) & (groups >= 0)
    assert torch.equal(got.movedim(dim, -1).reshape(-1, m), expected)


@settings(max_examples=150, deadline=None)
@given(w=weights(max_size=64), data=st.data())
def test_nm_pattern_holds(w, data):
    dim = data.draw(st.sampled_from([0, 1, -1]))
    size = w.shape[dim]
    m = data.draw(st.sampled_from([d for d in range(1, size + 1) if size % d == 0]))
    n = data.draw(st.integers(0, m))
    alive = None
    if data.draw(st.booleans()):
        alive = torch.tensor(
            data.draw(st.lists(st.booleans(), min_size=w.numel(), max_size=w.numel()))
        ).reshape(w.shape)
    with tiny_chunks(data.draw(st.booleans())):
        mask = nm_mask(w, n, m, dim=dim, existing=alive)
    groups_w = w.movedim(dim, -1).reshape(-1, m)
    groups_m = mask.movedim(dim, -1).reshape(-1, m)
    groups_a = None if alive is None else alive.movedim(dim, -1).reshape(-1, m)
    for g in range(groups_w.shape[0]):
        got = groups_m[g]
        expected = ref_magnitude(groups_w[g], n, None if groups_a is None else groups_a[g])
        assert torch.equal(got, expected)


# ----------------------------------------------------------------------------------------------
# global


def test_global_hand_computed():
    a = torch.tensor([3.0, 1.0, 2.0])
    b = torch.tensor([2.0, 5.0], dtype=torch.bfloat16)
    masks = global_magnitude_masks([a, b], keep=3)
    # 5, 3, then the 2.0 tie goes to the earlier tensor
    assert [m.tolist() for m in masks] == [[True, False, True], [False, True]]
    masks = global_magnitude_masks([a, b], 0.0)
    assert all(m.all() for m in masks)
    masks = global_magnitude_masks([a, b], 1.0)
    assert not any(m.any() for m in masks)


def test_global_bf16_needs_one_histogram_pass():
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(50, 20, generator=g).to(torch.bfloat16) for _ in range(3)]
    plan = global_threshold_plan([MagnitudeHistogram.of(t) for t in ts], 1234)
    assert plan.done and plan.kept == 1234 and sum(p.kept for p in plan.tensors) == 1234


def test_global_fp32_refines_only_tensors_in_the_boundary_bucket():
    a = torch.tensor([1.0, 1.0 + 2**-20, 4.0])
    b = torch.tensor([8.0, 16.0], dtype=torch.bfloat16)
    c = torch.tensor([0.5, 1.0 + 2**-21])
    hists = [MagnitudeHistogram.of(t) for t in (a, b, c)]
    plan = global_threshold_plan(hists, 5)
    assert not plan.done and plan.refine_bucket == 0x3F80 and plan.refine == (0, 2)
    fine = {i: MagnitudeHistogram.of(t, refine=plan.refine_bucket) for i, t in [(0, a), (2, c)]}
    plan = global_threshold_plan(hists, 5, refined=fine)
    assert plan.done and [p.kept for p in plan.tensors] == [2, 2, 1]
    masks = [apply_threshold(t, p) for t, p in zip((a, b, c), plan.tensors)]
    assert [m.tolist() for m in masks] == [[False, True, True], [True, True], [False, True]]


def test_global_detects_a_tensor_that_changed_between_passes():
    a = torch.tensor([1.0, 2.0, 3.0])
    plan = global_threshold_plan([MagnitudeHistogram.of(a)], 2)
    assert plan.done
    with pytest.raises(SparsetoolError, match="change between passes"):
        apply_threshold(torch.tensor([1.0, 5.0, 6.0, 7.0]), plan.tensors[0])
    a = torch.tensor([1.0, 1.0 + 2**-20])
    plan = global_threshold_plan([MagnitudeHistogram.of(a)], 1)
    with pytest.raises(SparsetoolError, match="change between passes"):
        global_threshold_plan(
            [MagnitudeHistogram.of(a)],
            1,
            refined={0: MagnitudeHistogram.of(a[:1], refine=plan.refine_bucket)},
        )


def test_histogram_merge_and_total():
    a = MagnitudeHistogram.of(torch.tensor([1.0, float("nan"), -2.0]))
    b = MagnitudeHistogram.of(torch.tensor([1.0, 3.0]), torch.tensor([False, True]))
    both = a + b
    assert (a.total, b.total, both.total) == (2, 1, 3)
    with pytest.raises(SparsetoolError, match="merge"):
        a.merge(MagnitudeHistogram.of(torch.tensor([1.0]), refine=0x3F80))


def test_plan_types_are_small_and_plain():
    plan = global_threshold_plan([MagnitudeHistogram.of(torch.tensor([1.0, 2.0]))], 2)
    assert isinstance(plan, GlobalPlan) and plan.tensors == (TensorPlan(-1, 0, 2),)


def test_global_on_multi_chunk_tensors_of_mixed_dtypes():
    g = torch.Generator().manual_seed(11)
    tensors = [
        torch.randn(1200, 1000, generator=g).to(dt)
        for dt in (torch.float32, torch.bfloat16, torch.float16)
    ]
    for t in tensors:
        t.view(-1)[::89] = 0.75  # exactly representable in all three: one big cross-tensor tie
        t.view(-1)[5::7919] = float("nan")
    alive = [None, torch.rand(1200, 1000, generator=g) > 0.2, None]
    values = torch.cat([t.float().abs().reshape(-1) for t in tensors]).double()
    dead = torch.cat(
        [
            torch.isnan(t.float().reshape(-1)) | (False if a is None else ~a.reshape(-1))
            for t, a in zip(tensors, alive)
        ]
    )
    order = torch.sort(values.masked_fill(dead, -1.0), descending=True, stable=True).indices
    above = int(((values > 0.75) & ~dead).sum())
    at = int(((values == 0.75) & ~dead).sum())
    for keep in (above + at // 2, 1_500_000):  # inside the tie, and inside a refined fp32 bucket
        expected = torch.zeros(values.numel(), dtype=torch.bool)
        expected[order[:keep]] = True
        got = global_magnitude_masks(tensors, keep=keep, existing=alive)
        assert torch.equal(torch.cat([m.reshape(-1) for m in got]), expected), keep


@st.composite
def tensor_lists(draw):
    count = draw(st.integers(1, 4))
    tensors, alive = [], []
    for _ in range(count):
        w, a = draw(weights_and_alive(max_size=24))
        tensors.append(w)
        alive.append(a)
    return tensors, alive


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tensor_lists(), data=st.data())
def test_global_equals_sort_reference(case, data):
    tensors, alive = case
    keep = data.draw(st.integers(0, sum(t.numel() for t in tensors)))
    with tiny_chunks(data.draw(st.booleans())):
        got = global_magnitude_masks(tensors, keep=keep, existing=alive)
    expected = ref_global(tensors, keep, alive)
    for g, e in zip(got, expected):
        assert torch.equal(g, e)
    available = sum(int(e.sum()) for e in ref_global(tensors, 10**9, alive))
    assert sum(int(g.sum()) for g in got) == min(keep, available)


# ----------------------------------------------------------------------------------------------
# edge cases


def test_empty_scalar_and_non_contiguous_inputs():
    assert magnitude_mask(torch.empty(0, 4), 0.5).shape == (0, 4)
    assert nm_mask(torch.empty(3, 0), 2, 4).shape == (3, 0)
    assert random_mask((), keep=1).item() is True
    assert global_magnitude_masks([torch.empty(0), torch.tensor([1.0, 2.0])], keep=1)[
        1
    ].tolist() == [False, True]
    w = torch.randn(64, 48, generator=torch.Generator().manual_seed(2))
    assert torch.equal(magnitude_mask(w.t(), 0.7), magnitude_mask(w.t().contiguous(), 0.7))
    assert torch.equal(nm_mask(w.t(), 2, 4), nm_mask(w.t().contiguous(), 2, 4))


def test_fp8_needs_no_refinement_pass():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")
    t = torch.tensor([0.5, -4.0, 2.0, 1.0, 2.0]).to(torch.float8_e4m3fn)
    plan = global_threshold_plan([MagnitudeHistogram.of(t)], 2)
    assert plan.done and apply_threshold(t, plan.tensors[0]).tolist() == [
        False,
        True,
        True,
        False,
        False,
    ]


def test_a_pool_inherited_through_fork_is_replaced():
    """A forked child inherits the pool object but none of its threads; using it would hang."""
    import sparsetool.util.workers as pool_module

    big = torch.randn(3 << 20, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    pool_module.set_workers(2)  # a pool exists whatever the machine and the tests before
    try:
        expected = magnitude_mask(big, 0.5)
        stale = pool_module._POOL
        assert stale is not None
        pool_module._POOL_PID = -1  # what a child sees: the pool was made by another process
        assert torch.equal(magnitude_mask(big, 0.5), expected)
        assert pool_module._POOL is not stale
    finally:
        pool_module.set_workers(None)


@pytest.mark.parametrize(
    "module",
    [
        "sparsetool.masks.select",
        "sparsetool.masks.global_magnitude",
        "sparsetool.masks.counts",
        "sparsetool.masks.kernel",
    ],
)
def test_docstring_examples(module):
    """The examples in the docstrings run and print what they say (CI collects tests/ only)."""
    import doctest
    import importlib

    result = doctest.testmod(
        importlib.import_module(module), optionflags=doctest.NORMALIZE_WHITESPACE
    )
    assert result.attempted > 0 and result.failed == 0
