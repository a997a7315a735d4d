"""Small real checkpoints made on the fly (nothing is downloaded)."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file


def pytest_configure(config):
    """Tests send SIGINT and SIGTERM to the commands they start (and raise them in-process). A
    suite started with those signals ignored (``nohup``, ``cmd &`` in a script) would pass the
    ignoring on to every child, as it should for users; here each test needs the defaults."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

def gpt2_like_state(n_layer: int = 2, d: int = 16, vocab: int = 64, seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Tensors named like Hugging Face GPT-2 (Conv1D weights stored (in, out))."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    state = {"transformer.wte.weight": r(vocab, d), "transformer.wpe.weight": r(32, d)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        state |= {
            p + "ln_1.weight": torch.ones(d, dtype=dtype), p + "ln_1.bias": torch.zeros(d, dtype=dtype),
            p + "attn.c_attn.weight": r(d, 3 * d), p + "attn.c_attn.bias": r(3 * d),
            p + "attn.c_proj.weight": r(d, d), p + "attn.c_proj.bias": r(d),
            p + "ln_2.weight": torch.ones(d, dtype=dtype), p + "ln_2.bias": torch.zeros(d, dtype=dtype),
            p + "mlp.c_fc.weight": r(d, 4 * d), p + "mlp.c_fc.bias": r(4 * d),
            p + "mlp.c_proj.weight": r(4 * d, d), p + "mlp.c_proj.bias": r(d),
        }
    state["transformer.ln_f.weight"] = torch.ones(d, dtype=dtype)
    state["transformer.ln_f.bias"] = torch.zeros(d, dtype=dtype)
    return state


TARGET_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def is_gpt2_target(name: str) -> bool:
    return name.endswith(TARGET_SUFFIXES)


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


@contextlib.contextmanager
def tiny_chunks(on: bool = True):
    """Run the selection kernel's chunked, threaded path on small inputs: 7-key chunks, sorting
    only below 5 keys."""
    import sparsetool.masks.kernel as kernel

    saved = kernel._CHUNK, kernel._SMALL
    if on:
        kernel._CHUNK, kernel._SMALL = 7, 4
    try:
        yield
    finally:
        kernel._CHUNK, kernel._SMALL = saved


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
    """A directory of Python-looking text files (``test_train.make_corpus``), one per module."""
    from test_train import make_corpus

    return make_corpus(tmp_path_factory.mktemp("data") / "corpus")


def tiny_causal_lm(kind: str):
    """A small random transformers causal LM of ``kind`` ("opt", "gpt_neox" or "mistral"):
    2 layers, width 32, vocabulary 320, context 64 (tests that build one need transformers)."""
    import transformers as t

    if kind == "opt":
        return t.OPTForCausalLM(t.OPTConfig(
            num_hidden_layers=2, hidden_size=32, ffn_dim=64, num_attention_heads=4, vocab_size=320,
            max_position_embeddings=64, word_embed_proj_dim=32, bos_token_id=1, eos_token_id=1,
            pad_token_id=0))
    if kind == "gpt_neox":
        return t.GPTNeoXForCausalLM(t.GPTNeoXConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            vocab_size=320, max_position_embeddings=64, bos_token_id=1, eos_token_id=1))
    if kind == "mistral":
        return t.MistralForCausalLM(t.MistralConfig(
            num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=64, bos_token_id=1,
            eos_token_id=1, sliding_window=16))
    raise ValueError(f"no tiny model of kind {kind!r}")

