"""Wanda scores and SparseGPT's update on hand-sized layers, against direct dense computations."""

from __future__ import annotations

import pytest
import torch

from sparsetool.errors import SparsetoolError
from sparsetool.masks.select import magnitude_mask
from sparsetool.masks.sparsegpt import block_prune_counts, sparsegpt_prune
from sparsetool.masks.wanda import row_prune_counts, wanda_mask, wanda_scores


def layer(seed: int, rows: int = 8, cols: int = 16, tokens: int = 256, dtype=torch.float64):
    """A weight and LLM-like inputs: features of very different scales, mildly correlated."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g, dtype=dtype)
    scales = torch.exp(1.5 * torch.randn(cols, generator=g, dtype=dtype))
    mix = torch.eye(cols, dtype=dtype) + 0.2 * torch.randn(cols, cols, generator=g, dtype=dtype)
    x = (torch.randn(tokens, cols, generator=g, dtype=dtype) * scales) @ mix
    return w, x


# ------------------------------------------------------------------------------------ Wanda
def test_wanda_score_is_weight_magnitude_times_input_column_norm():
    w, x = layer(0, dtype=torch.float32)
    direct = torch.empty_like(w)
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            direct[i, j] = abs(w[i, j]) * torch.sqrt(sum(x[t, j] ** 2 for t in range(x.shape[0])))
    assert torch.allclose(wanda_scores(w, (x**2).sum(0)), direct, rtol=1e-5)


@pytest.mark.parametrize("keep", [0, 1, 37, 64, 100, 128])
def test_wanda_keeps_each_rows_top_scores_with_an_exact_total(keep):
    w, x = layer(1)
    mask = wanda_mask(w, (x**2).sum(0), keep=keep)
    assert int(mask.sum()) == keep
    score = w.abs() * x.norm(dim=0)
    prunes = row_prune_counts(*w.shape, w.numel() - keep)
    for r in range(w.shape[0]):
        k = w.shape[1] - prunes[r]
        top = torch.argsort(score[r], descending=True, stable=True)[:k]
        expect = torch.zeros(w.shape[1], dtype=torch.bool)
        expect[top] = True
        assert torch.equal(mask[r], expect), r
    # rows differ in what they keep by at most one
    per_row = mask.sum(1)
    assert int(per_row.max() - per_row.min()) <= 1


def test_wanda_is_not_magnitude_when_inputs_differ_in_scale():
    w = torch.tensor([[1.0, -2.0, 3.0, 0.5], [4.0, 1.0, -1.0, 2.0]])
    sq = torch.tensor([100.0, 1.0, 1.0, 100.0])
    assert wanda_mask(w, sq, keep=4).tolist() == [
        [True, False, False, True],
        [True, False, False, True],
    ]
    assert magnitude_mask(w, keep=4).tolist() != wanda_mask(w, sq, keep=4).tolist()


def test_wanda_never_revives_a_pruned_weight():
    w, x = layer(2)
    alive = torch.rand(w.shape, generator=torch.Generator().manual_seed(0)) > 0.3
    mask = wanda_mask(w, (x**2).sum(0), keep=w.numel(), existing=alive)
    assert torch.equal(mask, alive)
    mask = wanda_mask(w, (x**2).sum(0), keep=40, existing=alive)
    assert not bool((mask & ~alive).any()) and int(mask.sum()) == 40


def test_wanda_nm_keeps_the_top_n_scores_of_every_m_inputs():
    w, x = layer(3)
    mask = wanda_mask(w, (x**2).sum(0), nm=(2, 4))
    score = (w.abs() * x.norm(dim=0)).view(8, 4, 4)
    top = torch.argsort(score, dim=2, descending=True, stable=True)[..., :2]
    expect = torch.zeros(8, 4, 4, dtype=torch.bool).scatter_(2, top, True).view(8, 16)
    assert torch.equal(mask, expect)


def test_wanda_refuses_a_norm_vector_of_the_wrong_size():
    with pytest.raises(SparsetoolError, match="one norm per input"):
        wanda_scores(torch.ones(2, 3), torch.ones(2))


# ------------------------------------------------------------------------------------ SparseGPT
def naive_sparsegpt(w, h, keep, blocksize, dampening):
    """SparseGPT written out with explicit inverses: before column j, [H^-1] of the columns j..n-1
    (dampened H) gives both the saliency w^2 / [H_F^-1]_00 and the OBS update of the rest."""
    w = w.clone()
    cols = w.shape[1]
    h = h.clone()
    h += dampening * torch.diagonal(h).mean() * torch.eye(cols, dtype=h.dtype)
    inv = [torch.linalg.inv(h[j:, j:]) for j in range(cols)]
    d = torch.tensor([float(inv[j][0, 0]) for j in range(cols)], dtype=h.dtype)
    prunes = block_prune_counts(*w.shape, w.numel() - keep, blocksize)
    kept = torch.zeros(w.shape, dtype=torch.bool)
    for b, start in enumerate(range(0, cols, blocksize)):
        end = min(start + blocksize, cols)
        score = w[:, start:end] ** 2 / d[start:end]  # d_j is the square of chol(H^-1)_jj
        order = torch.argsort(score.reshape(-1), descending=True, stable=True)
        block = torch.zeros(score.numel(), dtype=torch.bool)
        block[order[: score.numel() - prunes[b]]] = True
        kept[:, start:end] = block.view(score.shape)
        for j in range(start, end):
            for r in range(w.shape[0]):
                if not kept[r, j]:
                    w[r, j:] -= w[r, j] / inv[j][0, 0] * inv[j][0, :]
                    w[r, j] = 0.0
    return w, kept


@pytest.mark.parametrize("blocksize", [16, 5])
def test_sparsegpt_equals_the_explicit_inverse_computation(blocksize):
    w, x = layer(4)
    h = x.T @ x
    got, kept = sparsegpt_prune(w, h, keep=64, blocksize=blocksize, dampening=0.01)
    expect, expect_kept = naive_sparsegpt(w, h, 64, blocksize, 0.01)
    assert torch.equal(kept, expect_kept)
    assert torch.allclose(got, expect, atol=1e-9, rtol=1e-9)
    assert int((got != 0).sum()) == 64 and torch.equal(got != 0, kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparsegpt_at_sparsity_zero_returns_the_weights_unchanged(dtype):
    w, x = layer(5, dtype=dtype)
    got, kept = sparsegpt_prune(w, x.T @ x, keep=w.numel(), blocksize=4)
    assert bool(kept.all()) and torch.equal(got, w)


@pytest.mark.parametrize("seed", range(6))
def test_sparsegpt_reconstructs_a_one_block_layer_at_least_as_well_as_magnitude(seed):
    w, x = layer(seed, rows=16, cols=32, tokens=512)
    keep = w.numel() // 2
    new, _ = sparsegpt_prune(w, x.T @ x, keep=keep, blocksize=128)
    magnitude = w * magnitude_mask(w, keep=keep)
    err_sgpt = torch.linalg.norm(w @ x.T - new @ x.T)
    err_mag = torch.linalg.norm(w @ x.T - magnitude @ x.T)
    assert err_sgpt <= err_mag
    # and the update is what helps: the same mask without it reconstructs worse
    assert err_sgpt < torch.linalg.norm(w @ x.T - (w * (new != 0)) @ x.T)


def test_sparsegpt_nm_pattern_and_never_reviving():
    w, x = layer(6)
    new, kept = sparsegpt_prune(w, x.T @ x, nm=(2, 4), blocksize=8)
    assert bool((kept.view(8, 4, 4).sum(2) == 2).all()) and torch.equal(new != 0, kept)
    alive = torch.ones(w.shape, dtype=torch.bool)
    alive[:, 0] = False
    w0 = w.clone()
    w0[:, 0] = 0
    new, kept = sparsegpt_prune(w0, x.T @ x, keep=64, existing=alive)
    assert not bool(kept[:, 0].any()) and bool((new[:, 0] == 0).all()) and int(kept.sum()) == 64


def test_sparsegpt_block_shares_add_up_and_bad_shapes_are_refused():
    for rows, cols, prune, bs in [
        (3, 10, 7, 4),
        (5, 128, 321, 128),
        (7, 300, 1000, 128),
        (2, 9, 18, 2),
    ]:
        counts = block_prune_counts(rows, cols, prune, bs)
        assert sum(counts) == prune and len(counts) == -(-cols // bs)
        assert all(0 <= c <= rows * min(bs, cols - i * bs) for i, c in enumerate(counts))
    with pytest.raises(SparsetoolError, match="not divisible"):
        sparsegpt_prune(torch.ones(2, 6), torch.eye(6), nm=(2, 4), blocksize=4)
    with pytest.raises(SparsetoolError, match="X\\^T X has shape"):
        sparsegpt_prune(torch.ones(2, 6), torch.eye(5), keep=3)
