"""The Python API's errors name the argument as the caller gave it (``sparsity=1.5: must be ...``)
where the command line names its flag (``--sparsity must be ...``): one rewording of the same
checks (sparsetool.util.options.named_as_given), for prune, shrink, eval and simulate."""

from __future__ import annotations

import pytest

import sparsetool
from sparsetool.errors import ConfigError, UsageError

from helpers import ROOT, run

TINY = ROOT / "fixtures" / "tiny-gpt2"


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda out: sparsetool.prune(TINY, out, sparsity=1.5),
            "sparsity=1.5: must be a number from 0 to 1 (the fraction of weights set to zero)",
        ),
        (
            lambda out: sparsetool.prune(TINY, out, sparsity=50),
            "sparsity=50: must be a number from 0 to 1 (the fraction of weights set to zero) "
            "(write 50% as 0.5)",
        ),
        (
            lambda out: sparsetool.prune(TINY, out, nm="4:2"),
            "nm='4:2': need 0 < N <= M (keep N of every M weights)",
        ),
        (
            lambda out: sparsetool.prune(TINY, out, sparsity=0.5, max_memory="lots"),
            "max_memory='lots': not a memory size; write e.g. 12G, 512M or 1.5T",
        ),
        (
            lambda out: sparsetool.prune(TINY, out, sparsity=0.5, method="wanda"),
            "method='wanda': needs calibration text: give calibration=FILE|DIR",
        ),
        (
            lambda out: sparsetool.shrink(TINY, out, experts=1.5),
            "experts=1.5: must be strictly between 0 and 1 (the fraction of each layer's "
            "routed experts removed)",
        ),
        (
            lambda out: sparsetool.shrink(TINY, out, experts=0.5, samples=0),
            "samples=0: must be a whole number of at least 1",
        ),
        (lambda out: sparsetool.eval(TINY, seq=1), "seq=1: must be at least 2"),
        (
            lambda out: sparsetool.eval(TINY, device="gpu"),
            "device='gpu': use auto, cpu, cuda or cuda:N",
        ),
        (
            lambda out: sparsetool.eval(TINY, limit=3),
            "limit=3: applies to task accuracy only; add tasks=NAME[,NAME...] or drop limit",
        ),
        (
            lambda out: sparsetool.eval(TINY, tasks="arc_easy", seq=8),
            "tasks and seq do not go together: seq is for perplexity",
        ),
        (
            lambda out: sparsetool.simulate(model="gpt2-small", sparsity=1.5),
            "sparsity=1.5: must be a number from 0 to 1",
        ),
        (
            lambda out: sparsetool.simulate(model="gpt2-small", sparsity=0.5, tokens="lots"),
            "tokens='lots': not a number of tokens; write e.g. 26B, 2.6e10, 300M or 1_000",
        ),
        (
            lambda out: sparsetool.simulate(shape="12x", sparsity=0.5),
            "shape='12x': must look like MxK",
        ),
    ],
)
def test_api_errors_name_the_argument_given(call, message, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as e:
        call(out)
    assert str(e.value).startswith(message), str(e.value)
    assert "--" not in str(e.value)
    assert not out.exists()


def test_usage_errors_stay_usage_errors():
    with pytest.raises(UsageError, match=r"^stride=9: must be between 1 and seq \(4\)$"):
        sparsetool.eval(TINY, seq=4, stride=9)


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["prune", TINY, "-o", "x", "--sparsity", "1.5"],
            "--sparsity must be a number from 0 to 1 (the fraction of weights set to zero), got "
            "1.5; for example --sparsity 0.75",
        ),
        (["eval", TINY, "--limit", "3"], "--limit applies to task accuracy only"),
        (["shrink", TINY, "-o", "x", "--experts", "1.5"], "--experts must be strictly between"),
        (
            ["simulate", "--model", "gpt2-small", "-s", "0.5", "--tokens", "lots"],
            "--tokens 'lots' is not a number of tokens",
        ),
    ],
)
def test_the_cli_keeps_naming_its_flags(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run(*args, columns=200)
    assert r.exit_code in (1, 2) and message in " ".join(r.stderr.split()), r.stderr
