"""The scoring engine (sparsetool.ops.scoring) is torch only: perplexity and the task requests'
scoring load no lm_eval; only the harness integration (sparsetool.ops.tasks.model) does."""

from __future__ import annotations

import subprocess
import sys

import pytest


def loads_lm_eval(module: str) -> bool:
    code = f"import sys, {module}; print('lm_eval' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.parametrize(
    "module", ["sparsetool.ops.scoring", "sparsetool.ops.eval", "sparsetool.ops.tasks.layout"]
)
def test_the_engine_and_perplexity_load_no_lm_eval(module):
    assert not loads_lm_eval(module)


def test_the_harness_model_is_where_lm_eval_is_loaded():
    assert loads_lm_eval("sparsetool.ops.tasks.model")
