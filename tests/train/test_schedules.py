"""Schedules against their formulas, with values worked out by hand."""

import math
import re

import pytest

from sparsetool.errors import ConfigError
from sparsetool.train.schedules import (
    SCHEDULES,
    Constant,
    Cosine,
    Periodic,
    Polynomial,
    Wiring,
    build_schedule,
    update_window,
    wire,
)


def test_constant():
    s = Constant(0.8)
    assert [s(t) for t in (0, 1, 10**9)] == [0.8, 0.8, 0.8]


def test_cosine_is_rigl_drop_fraction_decay():
    # Evci et al. 2020, Eq. 1: f(t) = alpha/2 * (1 + cos(pi t / T_end)); alpha = 0.3, T_end = 1000.
    f = Cosine(start=0.3, end=0.0, begin_step=0, end_step=1000)
    assert f(0) == 0.3
    assert f(500) == pytest.approx(0.15, abs=1e-15)  # cos(pi/2) = 0
    assert f(250) == pytest.approx(0.15 * (1 + math.sqrt(0.5)))  # cos(pi/4) = 1/sqrt(2)
    assert f(750) == pytest.approx(0.15 * (1 - math.sqrt(0.5)))
    assert f(1000) == 0.0
    assert f(4000) == 0.0  # held at the end value, not cycling back up


def test_cosine_with_offset_and_floor():
    f = Cosine(start=1.0, end=0.2, begin_step=100, end_step=300)
    assert f(0) == 1.0 and f(100) == 1.0
    assert f(200) == pytest.approx(0.6)  # 0.2 + 0.8 * (1 + 0) / 2
    assert f(300) == 0.2


def test_cubic_is_zhu_gupta_gmp():
    # Zhu & Gupta 2017 Eq. 1 with s_i = 0, s_f = 0.8, t0 = 100, n*dt = 400.
    s = Polynomial(initial=0.0, final=0.8, begin_step=100, end_step=500)
    assert s(0) == 0.0 and s(100) == 0.0
    assert s(200) == pytest.approx(0.8 * (1 - 0.75**3))  # 0.4625
    assert s(200) == pytest.approx(0.4625)
    assert s(300) == pytest.approx(0.7)  # 0.8 - 0.8 * 0.125
    assert s(400) == pytest.approx(0.8 - 0.8 / 64)  # 0.7875
    assert s(500) == 0.8 and s(10_000) == 0.8  # exactly the final value at the end


def test_polynomial_sparse_to_sparse_and_other_power():
    # GraNet's sparse-to-sparse ramp, 0.5 -> 0.75 (Liu et al. 2021).
    s = Polynomial(0.5, 0.75, 0, 100)
    assert s(50) == pytest.approx(0.75 - 0.25 * 0.125)
    lin = Polynomial(0.0, 1.0, 0, 10, power=1)
    assert [round(lin(t), 10) for t in (0, 3, 10)] == [0.0, 0.3, 1.0]


def test_periodic_window_excludes_stop():
    p = Periodic(every=100, begin_step=0, end_step=300)
    assert [t for t in range(1000) if p(t)] == [0, 100, 200]
    q = Periodic(every=3, begin_step=2)
    assert [t for t in range(12) if q(t)] == [2, 5, 8, 11]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Periodic(every=0),
        lambda: Cosine(1, 0, 5, 5),
        lambda: Polynomial(0, 1, 10, 3),
        lambda: Polynomial(0, 1, 0, 10, power=0),
    ],
)
def test_bad_arguments(bad):
    with pytest.raises(ConfigError):
        bad()


def test_build_schedule_numbers_and_objects():
    assert build_schedule(0.5) == Constant(0.5)
    assert build_schedule("0.25") == Constant(0.25)
    p = Periodic(5)
    assert build_schedule(p) is p


def test_build_schedule_model_zoo_cosine():
    # The drop_fraction block of the Cerebras Model Zoo GPT-3 125M RigL config.
    f = build_schedule({"type": "cosine", "init": 0.3, "half_period": 3584})
    assert f == Cosine(start=0.3, end=0.0, begin_step=0, end_step=3584)
    assert f(1792) == pytest.approx(0.15)


def test_build_schedule_cubic_and_periodic_aliases():
    s = build_schedule({"type": "cubic", "init": 0.5, "end": 0.8, "begin": 10, "stop": 20})
    assert s == Polynomial(0.5, 0.8, 10, 20, 3)
    p = build_schedule({"type": "periodic", "freq": 10, "start": 5, "stop": 50})
    assert p == Periodic(10, 5, 50)


def test_build_schedule_errors_name_the_valid_choices():
    with pytest.raises(
        ConfigError, match="valid types: constant, cosine, cubic, periodic, polynomial"
    ):
        build_schedule({"type": "exp"})
    with pytest.raises(ConfigError, match="unknown key 'gamma'.*valid keys"):
        build_schedule({"type": "cosine", "init": 0.3, "half_period": 10, "gamma": 2})
    with pytest.raises(ConfigError, match="missing end_step"):
        build_schedule({"type": "cosine", "init": 0.3})
    with pytest.raises(ConfigError, match="must be a number"):
        build_schedule({"type": "cosine", "init": "high", "half_period": 10})
    with pytest.raises(ConfigError):
        build_schedule([0.1, 0.2])
    assert set(SCHEDULES) == {"constant", "cosine", "polynomial", "cubic", "periodic"}


# ------------------------------------------------------------------ wire: the one wiring path


def test_wire_without_updates_is_the_sparsity_alone():
    assert wire("static", 100, 0.5) == Wiring(Constant(0.5))
    assert not wire("static", 100, 0.5).is_update_step(0)


def test_wire_set_and_rigl_differ_only_in_the_drop_decay():
    s = wire("set", 1000, 0.9, updates=True, drop_fraction=0.3, drop_decay="constant")
    r = wire("rigl", 1000, 0.9, updates=True, drop_fraction=0.3, drop_decay="cosine")
    assert s.updates == r.updates == Periodic(100, 100, 750)
    assert s.drop_fraction == Constant(0.3)
    assert r.drop_fraction == Cosine(0.3, 0.0, 0, 750)
    assert s.final_update is None and r.final_update is None


def test_wire_ramp_ends_with_an_update_off_the_grid():
    w = wire(
        "gmp", 100, 0.8, updates=True, ramp_from=0.2, update_freq=7, update_start=3, update_stop=40
    )
    assert w.sparsity == Polynomial(0.2, 0.8, 3, 40, 3)
    assert [t for t in range(100) if w.is_update_step(t)] == [3, 10, 17, 24, 31, 38, 40]
    assert w.drop_fraction(10) == 0.0  # no drop-and-grow


def test_wire_cosine_drop_mapping_defaults_its_end_to_the_update_stop():
    w = wire(
        "set", 100, 0.5, updates=True, drop_fraction={"type": "cosine", "init": 0.5}, update_stop=60
    )
    assert w.drop_fraction == Cosine(0.5, 0.0, 0, 60)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"update_start": 50, "update_stop": 50}, "stop (50) must be after start (50)"),
        ({"ramp_from": 0.9}, "below initial_sparsity 0.9"),
    ],
)
def test_wire_errors_name_the_algorithm(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        wire("granet", 100, 0.8, updates=True, **kwargs)
    assert str(e.value).startswith("granet:")


def test_update_window_defaults_follow_rigl():
    assert update_window(10_000) == (100, 100, 7500)
    assert update_window(60) == (15, 15, 45)
    assert update_window(60, freq=5, start=0, stop=50) == (5, 0, 50)
