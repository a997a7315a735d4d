"""sparsetool.ops.paired: the paired bootstrap intervals of eval's comparisons, against values known
in closed form (numpy only, no model)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from sparsetool.ops.paired import Interval, loss_ratio, mean_difference, mean_of_differences


def test_identical_checkpoints_give_the_degenerate_interval_at_zero():
    a = np.random.default_rng(1).integers(0, 2, 500)
    r = mean_difference(a, a)
    assert (r.estimate, r.low, r.high, r.items) == (0.0, 0.0, 0.0, 500)
    assert r.inside_noise
    ratio = loss_ratio([3.5, 2.0, 7.25], [3.5, 2.0, 7.25], [4, 2, 8])
    assert (ratio.estimate, ratio.low, ratio.high) == (1.0, 1.0, 1.0) and ratio.inside_noise


def test_a_known_difference_of_accuracies():
    """B is right on 300 of 1,000 items A gets wrong and on all A gets right: the difference is
    0.3, and the bootstrap's 95% interval is the normal one, 0.3 +- 1.96 sqrt(0.3 * 0.7 / 1000),
    to the bootstrap's own precision."""
    a = np.zeros(1000)
    b = np.r_[np.ones(300), np.zeros(700)]
    r = mean_difference(a, b)
    half = 1.96 * math.sqrt(0.3 * 0.7 / 1000)
    assert r.estimate == pytest.approx(0.3)
    assert r.low == pytest.approx(0.3 - half, abs=0.004)
    assert r.high == pytest.approx(0.3 + half, abs=0.004)
    assert not r.inside_noise
    # a difference of mean accuracy is a multiple of 1/n on every draw
    assert round(r.low * 1000, 6) == int(round(r.low * 1000))


def test_discordant_pairs_that_cancel_are_inside_the_noise():
    """Ten items A alone gets right and ten B alone gets right: no difference, interval about
    +-1.96 sqrt(20) / 100 (McNemar's discordant pairs)."""
    a = np.r_[np.ones(10), np.zeros(10), np.zeros(80)]
    b = np.r_[np.zeros(10), np.ones(10), np.zeros(80)]
    r = mean_difference(a, b)
    assert r.estimate == 0.0 and r.inside_noise
    assert r.high == pytest.approx(1.96 * math.sqrt(20) / 100, abs=0.02)
    assert r.low == pytest.approx(-r.high, abs=0.011)


def test_the_seed_makes_it_reproducible_and_another_seed_differs():
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    assert mean_difference(a, b) == mean_difference(a, b)
    assert mean_difference(a, b, seed=5) == mean_difference(a, b, seed=5)
    assert mean_difference(a, b, seed=5) != mean_difference(a, b, seed=6)


def test_many_distinct_values_are_drawn_item_by_item_to_the_same_distribution():
    """Per-item values of a continuous metric: more distinct items than are drawn as counts; the
    interval of a mean of N(0.5, 1) differences is 0.5 +- 1.96 / sqrt(n)."""
    rng = np.random.default_rng(3)
    d = rng.normal(0.5, 1.0, 2000)
    r = mean_difference(np.zeros(2000), d)
    assert r.estimate == pytest.approx(d.mean())
    assert r.high - r.low == pytest.approx(2 * 1.96 * d.std() / math.sqrt(2000), rel=0.05)
    assert r.low < d.mean() < r.high


def test_mean_over_tasks_is_the_mean_of_each_task_difference():
    """Task 1: +0.5 on 4 items, task 2: 0 on 2 items; the mean over tasks is +0.25 (not the
    item-weighted +0.33), each task resampled on its own."""
    r = mean_of_differences([([0, 0, 0, 0], [1, 1, 0, 0]), ([1, 0], [1, 0])])
    assert r.estimate == 0.25 and r.items == 6
    assert 0.0 <= r.low <= 0.25 <= r.high <= 0.5
    one = mean_of_differences([([0, 0, 0, 0], [1, 1, 0, 0])])
    assert one == mean_difference([0, 0, 0, 0], [1, 1, 0, 0])


def test_perplexity_ratio_of_a_known_shift():
    """B's loss is A's plus 0.1 nats on every token: the ratio is exp(0.1) exactly, and with the
    shift the same on every window the interval is that point."""
    tokens = np.array([100, 100, 50, 100])
    a = np.array([250.0, 300.0, 140.0, 260.0])
    r = loss_ratio(a, a + 0.1 * tokens, tokens)
    assert r.estimate == pytest.approx(math.exp(0.1))
    assert r.low == pytest.approx(math.exp(0.1)) and r.high == pytest.approx(math.exp(0.1))
    assert r.null == 1.0 and not r.inside_noise


def test_perplexity_ratio_of_noisy_windows_holds_the_estimate():
    rng = np.random.default_rng(0)
    tokens = np.full(40, 128)
    a = rng.normal(3.0, 0.2, 40) * tokens
    b = a + rng.normal(0.0, 0.05, 40) * tokens
    r = loss_ratio(a, b, tokens)
    assert r.low < r.estimate < r.high
    assert r.inside_noise == (r.low <= 1.0 <= r.high)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="one value per item"):
        mean_difference([1, 0], [1])
    with pytest.raises(ValueError, match="at least one item"):
        mean_difference([], [])
    with pytest.raises(ValueError, match="positive count"):
        loss_ratio([1.0], [1.0], [0])


def test_json_and_no_torch():
    r = Interval(0.1, -0.05, 0.2, 30)
    assert r.to_json() == {
        "estimate": 0.1,
        "low": -0.05,
        "high": 0.2,
        "items": 30,
        "inside_noise": True,
    }
    code = (
        "import sys, sparsetool.ops.paired as p; p.mean_difference([0, 1], [1, 1]); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
