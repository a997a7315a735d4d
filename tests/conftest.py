"""The tests' fixtures: small real checkpoints, models and texts made on the fly (nothing is
downloaded). The functions they are made with, and the rest the tests share, are in helpers.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from safetensors.torch import save_file

from helpers import gpt2_like_state, hf_model, make_corpus, make_text, save_tokenizer

# Property tests draw the same examples on every run, so a run's verdict does not depend on luck;
# HYPOTHESIS_PROFILE=explore draws new ones (a failure prints the example and its
# @reproduce_failure).
settings.register_profile("repeatable", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def pytest_configure(config):
    """Tests send SIGINT and SIGTERM to the commands they start (and raise them in-process). A
    suite started with those signals ignored (``nohup``, ``cmd &`` in a script) would pass the
    ignoring on to every child, as it should for users; here each test needs the defaults."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def gpt2_file(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(gpt2_like_state(), str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def gpt2_bf16_file(tmp_path: Path) -> Path:
    path = tmp_path / "model-bf16.safetensors"
    save_file(gpt2_like_state(dtype=torch.bfloat16), str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: a tiny model on a busy 2-core machine trains several
    times faster without the threads' synchronisation. Train test modules use it for every test
    (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A directory of Python-looking text files (``helpers.make_corpus``), one per module."""
    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A run directory of sparsetool's GPT (tiny preset, context 64, two steps): a checkpoint eval
    scores in a second."""
    from helpers import run

    root = tmp_path_factory.mktemp("gpt")
    data = make_corpus(root / "corpus", files=6)
    r = run(
        "train",
        "-o",
        root / "run",
        "--data",
        data,
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--warmup",
        "1",
        "--json",
    )
    assert r.exit_code == 0, r.output
    return root / "run"


# ----------------------------------------------------------------------------- task data
@pytest.fixture(scope="module")
def datasets_cache(tmp_path_factory):
    """The data-set library's cache in a temporary directory for a module's tests (nothing
    written to the home); use with ``pytestmark = pytest.mark.usefixtures("datasets_cache")``."""
    old = os.environ.get("HF_DATASETS_CACHE")
    os.environ["HF_DATASETS_CACHE"] = str(tmp_path_factory.mktemp("hf_datasets"))
    yield
    if old is None:
        os.environ.pop("HF_DATASETS_CACHE", None)
    else:
        os.environ["HF_DATASETS_CACHE"] = old


# ----------------------------------------------------------------------------- plots
@pytest.fixture
def figures(monkeypatch) -> list:
    """Keep every figure drawn (instead of closing it) to look at its axes and legend."""
    import sparsetool.ops.plots as plots

    kept: list = []

    from sparsetool.checkpoint.output_files import Written

    def keep(fig, out, dpi=120):
        kept.append(fig)
        fig.savefig(out, format="png", dpi=dpi)
        return Written(Path(out), [])

    monkeypatch.setattr(plots, "save_png", keep)
    yield kept
    from sparsetool.util.plotting import pyplot

    for fig in kept:
        pyplot().close(fig)


# ----------------------------------------------------------------------------- calibration
@pytest.fixture(scope="module")
def text() -> str:
    return make_text(400)


@pytest.fixture(scope="module")
def calib_file(tmp_path_factory, text) -> Path:
    path = tmp_path_factory.mktemp("calib") / "calib.txt"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A random GPT-2 (transformers) with a tokenizer trained here: its per-token losses spread,
    so a short text is uncertain."""
    d = tmp_path_factory.mktemp("hf") / "gpt2"
    torch.manual_seed(0)
    hf_model("gpt2").save_pretrained(d)
    save_tokenizer(d, make_text())
    return d


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model_dir(request, tmp_path_factory, text) -> Path:
    d = tmp_path_factory.mktemp(request.param) / "dense"
    torch.manual_seed(0)
    hf_model(request.param).eval().save_pretrained(d)
    save_tokenizer(d, text)
    return d
