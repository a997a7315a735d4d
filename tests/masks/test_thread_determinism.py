"""Calibration pruning gives the same bits whatever torch's thread count (``--threads``).

MKL rounds a float32 matrix product's inner sums, and LAPACK's Cholesky its panels, differently on
one thread and on two: SparseGPT's ``X^T X``, its inverse factor and its column updates came out
different in their last bits, the masks chosen after them diverged and the differences grew from
block to block (benchmarks/archive/RESULTS-archive.md, "reproducible calibration pruning"). The
statistics and the SparseGPT solve now run on one thread whatever the caller's count. The sizes
here are the smallest at which the two counts gave different bits before.
"""

from __future__ import annotations

import pytest
import torch

from sparsetool.masks.sparsegpt import inverse_hessian_factor, sparsegpt_prune, sparsegpt_update

from helpers import make_text, save_tokenizer


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def on_threads(n: int, fn, *args, **kwargs):
    torch.set_num_threads(n)
    assert torch.get_num_threads() == n
    return fn(*args, **kwargs)


def inputs(tokens: int = 4096, n_in: int = 384, rows: int = 256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, n_in, generator=g) * torch.rand(n_in, generator=g) * 3
    w = torch.randn(rows, n_in, generator=g)
    return x, w


@pytest.mark.usefixtures("restore_threads")
def test_the_sparsegpt_solve_is_the_same_bits_on_one_thread_and_on_two():
    x, w = inputs()
    h = x.T @ x  # one X^T X for both: only the solve's own threads differ
    one = on_threads(1, sparsegpt_prune, w, h, keep=w.numel() // 2)
    two = on_threads(2, sparsegpt_prune, w, h, keep=w.numel() // 2)
    assert torch.equal(one[1], two[1])
    assert torch.equal(one[0], two[0])
    f1 = on_threads(1, inverse_hessian_factor, h)
    f2 = on_threads(2, inverse_hessian_factor, h)
    assert torch.equal(f1, f2)
    # the column sweep alone, from one factor
    u1 = on_threads(1, sparsegpt_update, w, f1, keep=w.numel() // 2)
    u2 = on_threads(2, sparsegpt_update, w, f1, keep=w.numel() // 2)
    assert torch.equal(u1[0], u2[0]) and torch.equal(u1[1], u2[1])
    assert torch.get_num_threads() == 2  # the caller's count is restored


@pytest.mark.usefixtures("restore_threads")
def test_x_transpose_x_is_the_same_bits_on_one_thread_and_on_two():
    from sparsetool.ops.prune.statistics import InputStatistics

    x, _w = inputs()

    def gathered():
        stats = InputStatistics(x.shape[1], hessian=True, device=torch.device("cpu"))
        stats.add(x)  # one window of 4096 tokens
        return stats.h

    one, two = on_threads(1, gathered), on_threads(2, gathered)
    assert torch.equal(one, two)
    assert torch.get_num_threads() == 2  # the caller's count is restored


def llama(width: int = 256, ffn: int = 512):
    import transformers as t

    torch.manual_seed(0)
    return t.LlamaForCausalLM(
        t.LlamaConfig(
            num_hidden_layers=2,
            hidden_size=width,
            intermediate_size=ffn,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=320,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=1,
            pad_token_id=None,
        )
    ).eval()


@pytest.fixture(scope="module")
def model_and_text(tmp_path_factory):
    work = tmp_path_factory.mktemp("threads")
    text = make_text(1200)
    src = work / "dense"
    llama().save_pretrained(src)
    save_tokenizer(src, text)
    (work / "calib.txt").write_text(text)
    return src, work / "calib.txt"


@pytest.mark.usefixtures("restore_threads")
@pytest.mark.parametrize(
    "method, more",
    [
        ("wanda", {}),
        ("sparsegpt", {}),
        ("wanda", {"refine": "dsnot"}),  # DSnoT's swaps read each layer's outputs' statistics
        ("sparsegpt", {"allocation": "owl", "refine": "dsnot"}),
    ],
)
def test_a_calibrated_prune_writes_the_same_bytes_on_one_thread_and_on_two(
    method, more, model_and_text, tmp_path
):
    from sparsetool.ops.prune import PruneOptions, prune_checkpoint

    src, calib = model_and_text
    opts = PruneOptions(
        method=method,
        calibration=str(calib),
        sparsity=0.5,
        samples=4,
        seq=256,
        device="cpu",
        **more,
    )
    out = {}
    for n in (1, 2):
        on_threads(n, prune_checkpoint, src, tmp_path / f"t{n}", opts)
        out[n] = (tmp_path / f"t{n}" / "model.safetensors").read_bytes()
    assert out[1] == out[2]
