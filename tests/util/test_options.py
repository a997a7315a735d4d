"""sparsetool.util.options: the one parser/validator of the options every command shares."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparsetool.errors import ConfigError, SparsetoolError
from sparsetool.util import options
from sparsetool.util.options import (
    check_fraction,
    check_seed,
    check_sparsity,
    parse_fraction,
    parse_globs,
    parse_nm,
    parse_sparsities,
    parse_sparsity,
    parse_stage,
    parse_tokens,
)

# ----------------------------------------------------------------------------------------------
# sparsity and fraction (moved here from tests/masks/test_masks.py with the checks)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), float("inf"), True, "0.5", None])
def test_check_sparsity_refuses(bad):
    with pytest.raises(SparsetoolError, match="--sparsity must be a number from 0 to 1"):
        check_sparsity(bad)


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0, float("nan"), False])
def test_check_fraction_refuses(bad):
    with pytest.raises(SparsetoolError, match="--fraction must be at least 0 and below 1"):
        check_fraction(bad)


def test_check_names_the_option():
    with pytest.raises(SparsetoolError, match="--final-sparsity"):
        check_sparsity(3, "--final-sparsity")
    assert check_sparsity(1) == 1.0 and check_fraction(0) == 0.0


def test_sparsity_one_is_allowed_and_fraction_one_is_not():
    # the one rule for every command: a sparsity of 1 (all targeted weights zero) is valid
    assert parse_sparsity("1.0") == 1.0 and parse_sparsity("1") == 1.0 and parse_sparsity(1) == 1.0
    assert parse_sparsities("0,1") == [0.0, 1.0]
    assert parse_stage("1:0.5") == (1.0, 0.5)
    with pytest.raises(ConfigError, match="below 1"):
        parse_fraction("1")


@pytest.mark.parametrize("text", ["x", "", " ", "1e", "nan", "0.5.5"])
def test_parse_sparsity_refuses_non_numbers(text):
    with pytest.raises(ConfigError, match="from 0 to 1"):
        parse_sparsity(text)


def test_percent_hint():
    with pytest.raises(ConfigError, match="write 75% as 0.75"):
        parse_sparsity("75")
    with pytest.raises(ConfigError, match="write 75% as 0.75"):
        parse_sparsities("0.5,75")


def test_parse_sparsities():
    assert parse_sparsities(" 0, 0.5 ,0.75") == [0.0, 0.5, 0.75]
    for bad in ("0.5,", "a,0.5", ""):
        with pytest.raises(ConfigError, match="not a number"):
            parse_sparsities(bad)
    with pytest.raises(ConfigError, match="^--levels '0.5,x'"):
        parse_sparsities("0.5,x", "--levels")


@given(st.floats(min_value=0.0, max_value=1.0))
def test_every_sparsity_in_range_round_trips_through_text(s):
    assert parse_sparsity(repr(s)) == s
    assert check_sparsity(s) == s


# ----------------------------------------------------------------------------------------------
# N:M, stages


def test_parse_nm():
    assert parse_nm("2:4") == (2, 4) and parse_nm("4:4") == (4, 4) and parse_nm("1:8") == (1, 8)
    for bad in ("2", "2:4:8", "a:b", "2.0:4", ""):
        with pytest.raises(ConfigError, match="expected N:M with integers"):
            parse_nm(bad)
    for bad in ("0:4", "5:4", "-1:4"):
        with pytest.raises(ConfigError, match="need 0 < N <= M"):
            parse_nm(bad)


def test_parse_stage():
    assert parse_stage("0.9:0.8333") == (0.9, 0.8333) and parse_stage("0:1") == (0.0, 1.0)
    for bad in ("0.9", "a:b", "0.9:0.5:1", ""):
        with pytest.raises(ConfigError, match="is not SPARSITY:FRACTION"):
            parse_stage(bad)
    with pytest.raises(ConfigError, match="sparsity must be a number from 0 to 1"):
        parse_stage("1.2:1")
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        parse_stage("0.5:0")


def test_flops_and_train_parse_stages_with_the_one_parser():
    from sparsetool.flops import Stage
    from sparsetool.flops import parse_stage as flops_stage
    from sparsetool.train.configkeys import merge

    for text in ("0.9:0.8", "1:1", "0:0.2"):
        assert flops_stage(text) == Stage(*parse_stage(text))
    for text in ("0.9:1", "1:1", "0:1"):  # a run's stages add up to the whole run
        assert merge({}, {"stages": [text]}).stages == [parse_stage(text)]


# ----------------------------------------------------------------------------------------------
# token counts


@pytest.mark.parametrize(
    "text, value",
    [
        ("26B", 26_000_000_000),
        ("26b", 26_000_000_000),
        ("26G", 26_000_000_000),
        ("2.6e10", 26_000_000_000),
        ("300M", 300_000_000),
        ("1_000", 1000),
        ("64,512", 64512),
        ("64.512M", 64_512_000),
        ("2.5B", 2_500_000_000),
        ("1.5K", 1500),
        ("1T", 10**12),
        (" 2048 ", 2048),
        (2048, 2048),
        (2.6e10, 26_000_000_000),
    ],
)
def test_parse_tokens(text, value):
    got = parse_tokens(text)
    assert got == value and type(got) is int


@pytest.mark.parametrize(
    "text, match",
    [
        ("lots", "not a number of tokens"),
        ("", "not a number of tokens"),
        ("B", "not a number"),
        ("inf", "not a number"),
        ("nan", "not a number"),
        ("1.5", "whole number"),
        ("0.0001K", "whole number"),
        ("0", "positive"),
        ("-5", "positive"),
        (True, "not a number"),
    ],
)
def test_parse_tokens_refuses(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_tokens(text)


def test_parse_tokens_minimum_names_the_option():
    assert parse_tokens("0", "--finetune-tokens", minimum=0) == 0
    with pytest.raises(ConfigError, match="^--finetune-tokens -1: give zero or more tokens"):
        parse_tokens("-1", "--finetune-tokens", minimum=0)


def test_flops_parses_counts_with_the_one_parser():
    from sparsetool.flops import parse_count
    from sparsetool.flops import parse_sparsities as flops_sparsities

    assert parse_count("2.6e10") == parse_count("26B") == parse_tokens("26B")
    assert parse_count("0") == 0
    assert flops_sparsities is options.parse_sparsities


# ----------------------------------------------------------------------------------------------
# seeds, globs


def test_seeds():
    assert check_seed(0) == 0 and check_seed(2**63 - 1) == 2**63 - 1
    for bad in (-1, 2**63, 1.5, True, "x", None):
        with pytest.raises(ConfigError, match="--seed must be a whole number"):
            check_seed(bad)


def test_globs():
    assert parse_globs(("*.mlp.*", "lm_head.weight")) == ("*.mlp.*", "lm_head.weight")
    assert (
        parse_globs("*.attn.*") == ("*.attn.*",)
        and parse_globs([]) == ()
        and parse_globs(None) == ()
    )
    for bad in ([""], ["  "]):
        with pytest.raises(ConfigError, match="^--exclude needs a glob"):
            parse_globs(bad, "--exclude")
    for bad in ([3], 3, {"a": 1}):
        with pytest.raises(ConfigError, match="^--exclude takes a glob or a list of globs"):
            parse_globs(bad, "--exclude")


# ----------------------------------------------------------------------------------------------
# where the rules are used


def test_mask_counts_use_the_one_check():
    from sparsetool.masks import counts

    assert counts.check_sparsity is check_sparsity and counts.check_fraction is check_fraction


def test_train_accepts_sparsity_one_like_the_other_commands():
    from sparsetool.train.configkeys import merge

    assert merge({}, {"sparsity": 1.0, "algorithm": "rigl"}).sparsity == 1.0
    assert merge({}, {"stages": [(1.0, 0.5), (0.0, 0.5)]}).stages == [(1.0, 0.5), (0.0, 0.5)]
    with pytest.raises(ConfigError, match="--sparsity must be a number from 0 to 1"):
        merge({"sparsity": 1.5}, {})
    with pytest.raises(ConfigError, match="--seed must be a whole number"):
        merge({"seed": -3}, {})


def test_prune_options_use_the_one_check():
    from sparsetool.ops.prune import PruneOptions

    PruneOptions(sparsity=1.0).validate()
    with pytest.raises(ConfigError, match="--sparsity must be a number from 0 to 1"):
        PruneOptions(sparsity=1.5).validate()
    with pytest.raises(ConfigError, match="--seed must be a whole number"):
        PruneOptions(sparsity=0.5, seed=-1).validate()


def test_options_module_is_light():
    code = (
        "import sys, sparsetool.util.options; "
        "bad = [m for m in ('torch', 'typer', 'rich', 'numpy') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
