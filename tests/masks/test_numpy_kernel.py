"""The numpy kernel is the one implementation: numpy bit patterns in and torch tensors in give the
same masks, torch is not imported by the mask modules, and seeded random draws equal torch's."""

import subprocess
import sys

import numpy as np
import pytest
import torch

from sparsetool.masks.global_magnitude import (
    MagnitudeHistogram,
    apply_threshold,
    global_magnitude_masks,
    global_threshold_plan,
)
from sparsetool.masks.kernel import top_k_mask
from sparsetool.masks.select import magnitude_mask, nm_mask, random_keys, random_mask
from sparsetool.util.floatbits import float_format

DTYPES = [
    torch.bfloat16,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def bits(w: torch.Tensor) -> tuple[np.ndarray, str]:
    fmt = float_format(w.dtype)
    return w.view(getattr(torch, fmt.view)).numpy(), fmt.st


def stress(shape, dtype, seed):
    """Random weights with ties, both zeros, NaN, and a dead mask."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g)
    flat = w.view(-1)
    flat[::7] = 0.5
    flat[::11] = 0.0
    flat[3::13] = -0.0
    flat[5::97] = float("nan")
    w = w.to(dtype)
    alive = torch.rand(shape, generator=g) > 0.2
    return w, alive


SIZES = [(40, 64), (1100, 1024)]  # one small tensor, one of more than 2**20 entries


CASES = [(dtype, SIZES[0]) for dtype in DTYPES] + [
    (dtype, SIZES[1]) for dtype in (torch.bfloat16, torch.float32)
]


@pytest.mark.parametrize("dtype,shape", CASES)  # multi-chunk sizes: bf16 and fp32
def test_numpy_and_torch_entries_give_the_same_masks(dtype, shape):
    w, alive = stress(shape, dtype, 1)
    b, st = bits(w)
    a = alive.numpy()
    n = w.numel()
    for keep in (0, 1, n // 4, n // 2, n - 3, n):
        for ex_t, ex_n in ((None, None), (alive, a)):
            t = magnitude_mask(w, keep=keep, existing=ex_t)
            got = magnitude_mask(b, keep=keep, existing=ex_n, dtype=st)
            assert isinstance(got, np.ndarray) and isinstance(t, torch.Tensor)
            assert np.array_equal(got, t.numpy()), (keep, ex_t is None)
    t = nm_mask(w, 2, 4, existing=alive)
    assert np.array_equal(nm_mask(b, 2, 4, existing=a, dtype=st), t.numpy())
    t = nm_mask(w, 3, 8 if shape[1] % 32 else 32, dim=1)
    assert np.array_equal(nm_mask(b, 3, 8 if shape[1] % 32 else 32, dim=1, dtype=st), t.numpy())
    hist_t = MagnitudeHistogram.of(w, alive)
    hist_n = MagnitudeHistogram.of(b, a, dtype=st)
    assert np.array_equal(hist_t.counts, hist_n.counts)
    plan = global_threshold_plan([hist_n], n // 3)
    if not plan.done:
        fine = {0: MagnitudeHistogram.of(b, a, refine=plan.refine_bucket, dtype=st)}
        plan = global_threshold_plan([hist_n], n // 3, refined=fine)
    t = apply_threshold(w, plan.tensors[0], alive)
    got = apply_threshold(b, plan.tensors[0], a, dtype=st)
    assert np.array_equal(got, t.numpy()) and int(got.sum()) == plan.kept
    pieces = []
    apply_threshold(
        b, plan.tensors[0], a, dtype=st, sink=lambda lo, hi, m: pieces.append((lo, m.copy()))
    )
    streamed = np.zeros(n, dtype=bool)
    for lo, m in pieces:
        streamed[lo : lo + m.size] = m
    assert np.array_equal(streamed, got.reshape(-1))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(50, 30), (1100, 1024)])
def test_top_k_signed_scores_numpy_equals_torch(dtype, shape):
    g = torch.Generator().manual_seed(2)
    s = torch.randn(shape, generator=g, dtype=torch.float64).to(
        getattr(torch, np.dtype(dtype).name)
    )
    flat = s.view(-1)
    flat[::9] = 0.25
    flat[1::9] = -0.25
    flat[2::17] = -0.0
    flat[4::31] = float("nan")
    allowed = torch.rand(shape, generator=g) > 0.3
    n = s.numel()
    for k in (0, 5, n // 3, int(0.6 * n), n - 1):
        t = top_k_mask(s, k, allowed)
        got = top_k_mask(s.numpy(), k, allowed.numpy())
        assert isinstance(got, np.ndarray) and np.array_equal(got, t.numpy()), k
        assert np.array_equal(top_k_mask(s.numpy(), k), top_k_mask(s, k).numpy()), k


def test_global_masks_and_random_masks_numpy_equal_torch():
    tensors = [stress((300, 200), dt, i)[0] for i, dt in enumerate((torch.float32, torch.float16))]
    keep = 30_000
    t = global_magnitude_masks(tensors, keep=keep)
    got = global_magnitude_masks([x.numpy() for x in tensors], keep=keep)
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(got, t))
    alive = torch.rand(1100, 1024, generator=torch.Generator().manual_seed(3)) > 0.5
    for seed in (0, 7, 2**40 + 3):
        tm = random_mask((1100, 1024), 0.6, existing=alive, seed=seed)
        nm = random_mask((1100, 1024), 0.6, existing=alive.numpy(), seed=seed)
        assert isinstance(tm, torch.Tensor) and isinstance(nm, np.ndarray)
        assert np.array_equal(nm, tm.numpy())
        assert np.array_equal(
            random_mask((30, 7), keep=50, seed=seed, as_numpy=True),
            random_mask((30, 7), keep=50, seed=seed).numpy(),
        )


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1, 2**32, 2**32 + 5, 2**62 + 17, 2**63 - 2])
def test_seeded_draws_equal_torch_randint(seed):
    """The seeded draws are made in numpy, bit for bit torch's (ops/prune gives 63-bit seeds)."""
    for n in (1, 5, (1 << 20) + 3):
        expected = torch.randint(
            0, 1 << 30, (n,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32
        ).numpy()
        assert np.array_equal(random_keys(n, seed), expected), (seed, n)


def test_torch_results_come_back_on_the_input_device_and_shape():
    w = torch.randn(6, 8, generator=torch.Generator().manual_seed(0)).t()  # not contiguous
    m = magnitude_mask(w, 0.5)
    assert isinstance(m, torch.Tensor) and m.shape == (8, 6) and m.device == w.device
    assert torch.equal(m, magnitude_mask(w.contiguous(), 0.5))
    assert top_k_mask(w.requires_grad_(), 3).dtype == torch.bool


def test_the_mask_modules_do_not_import_torch():
    code = (
        "import sparsetool.masks, sparsetool.masks.select, sparsetool.masks.kernel, "
        "sparsetool.masks.keys, sparsetool.masks.global_magnitude, sparsetool.masks.counts, "
        "sparsetool.masks.distributions, sys\n"
        "import numpy as np\n"
        "from sparsetool.masks import magnitude_mask\n"
        "m = magnitude_mask(np.array([0x3F80, 0x4000, 0, -0x4080], dtype=np.int16), keep=2, "
        "dtype='BF16')\nassert m.tolist() == [True, True, False, False], m\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
