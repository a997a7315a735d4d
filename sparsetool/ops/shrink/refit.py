"""Least-squares reconstruction of a projection whose input lost channels (``shrink --ffn`` and
``--heads``): the weights on the kept inputs refit to reproduce the full layer's output on the
calibration activations.

For ``y = W x (+ b)`` with ``W`` (out, in), calibration inputs ``x(t)`` and ``K`` the kept input
channels, the plain slice keeps ``W[:, K]``; the least-squares weights on ``K`` are

    W_K = W H[:, K] (H[K, K] + lambda I)^-1,    H = sum_t x(t) x(t)^T

(the rule SparseGPT applies to the weights it keeps, here to whole columns: ZipLM, SlimGPT), in
float64, with ``lambda = dampening * mean(diag H[K, K])`` as SparseGPT dampens. A layer with a bias
(GPT-2's FFN output) refits it too: the input gains a constant 1 that is always kept, so the bias
absorbs the removed channels' mean contribution and the kept weights are fitted to what is left
around it. The error of either choice is a quadratic form of ``H``, no activation is kept:

    err(W') = sum_t ||W x(t) + b - W' x_K(t) - b'||^2 = tr(D H D^T),  D = [W - W'_K, b - b']

over the input with its constant; :func:`refit_columns` reports it relative to the output's
``sum_t ||W x(t) + b||^2`` for the plain slice and for the refit.

``shrink --blocks``: a removed run of blocks is replaced by one linear map ``T`` (d x d) on the
MLP output ``m`` of the kept block before it (ReplaceMe, arXiv 2505.02819): least squares of
``m T ~= h_after_run - h_before_run + m`` over the calibration tokens (:class:`RunMap`), so that
the kept block's output ``h_before_run - m + m T`` approximates what the run would have given.
``m = W_down a (+ b)``, so ``T`` folds into the down projection: ``W_down <- T^T W_down`` (and
``b <- T^T b``): no new parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["DAMPENING", "Gram", "Refit", "RunMap", "refit_columns"]

DAMPENING = 0.01
"""``lambda`` as a fraction of the mean diagonal of ``H[K, K]`` (SparseGPT's default)."""


@dataclass
class Gram:
    """``H = sum_t x x^T``, ``sum_t x`` and the token count of a layer's inputs, in float64."""

    h: Tensor | None = None
    sums: Tensor | None = None
    tokens: int = 0

    def add(self, x: Tensor) -> None:
        """Add inputs ``x`` (..., in)."""
        x = x.reshape(-1, x.shape[-1]).to(torch.float64)
        h, s = (x.T @ x).cpu(), x.sum(0).cpu()
        if self.h is None or self.sums is None:
            self.h, self.sums = h, s
        else:  # in place: the sum and one window's product, never a third copy
            self.h.add_(h)
            self.sums.add_(s)
        self.tokens += x.shape[0]

    def augmented(self) -> Tensor:
        """``H`` of the input with a constant 1 appended (its last row and column)."""
        assert self.h is not None and self.sums is not None
        n = self.h.shape[0]
        out = torch.empty((n + 1, n + 1), dtype=torch.float64)
        out[:n, :n] = self.h
        out[:n, n] = out[n, :n] = self.sums
        out[n, n] = self.tokens
        return out


@dataclass
class Refit:
    """A refit layer: its kept columns' weights (out, len(kept)), its bias (None without one) and
    the relative calibration error of the plain slice and of the refit."""

    weight: Tensor
    bias: Tensor | None
    error_before: float
    error_after: float

    def record(self) -> dict:
        return {"error_before": self.error_before, "error_after": self.error_after}


def refit_columns(
    w: Tensor,
    gram: Gram,
    kept: list[int],
    *,
    bias: Tensor | None = None,
    dampening: float = DAMPENING,
) -> Refit:
    """The least-squares weights of ``w`` (out, in) on the input columns ``kept``, given the
    inputs' :class:`Gram` (see the module docstring); ``bias`` (out,) is refit alongside."""
    assert gram.h is not None, "the layer saw no calibration input"
    n = w.shape[1]
    if bias is None:
        h = gram.h
        full = w.to(torch.float64)
        cols = list(kept)
    else:
        h = gram.augmented()
        full = torch.cat([w.to(torch.float64), bias.to(torch.float64).unsqueeze(1)], 1)
        cols = [*kept, n]  # the constant input is always kept
    k = torch.tensor(cols, dtype=torch.long)
    hkk = h.index_select(0, k).index_select(1, k)
    damp = dampening * float(torch.diagonal(hkk).mean())
    hkk.diagonal().add_(damp)
    rhs = full @ h.index_select(1, k)  # (out, |K|): W H[:, K]
    # W_K (H[K, K] + lambda I) = W H[:, K]; H[K, K] + lambda I is symmetric positive definite
    fitted = torch.linalg.solve(hkk, rhs.T).T
    scale = float(torch.einsum("ij,jk,ik->", full, h, full))
    plain = full.index_select(1, k)
    if bias is not None:
        plain[:, -1] = full[:, -1]  # the plain slice keeps the bias as it is
    before, after = (_error(full, h, k, v) / max(scale, 1e-300) for v in (plain, fitted))
    weight, new_bias = (fitted[:, :-1], fitted[:, -1]) if bias is not None else (fitted, None)
    return Refit(weight.contiguous(), new_bias, before, after)


def _error(full: Tensor, h: Tensor, k: Tensor, kept_weights: Tensor) -> float:
    """``tr(D H D^T)``, ``D = full`` less ``kept_weights`` put back in the columns ``k``."""
    d = full.clone()
    d.index_add_(1, k, kept_weights, alpha=-1.0)
    return float(torch.einsum("ij,jk,ik->", d, h, d))


@dataclass
class RunMap:
    """ReplaceMe's map of a removed run of blocks, from sums over the calibration tokens of the
    last kept block's MLP output ``m`` (row vectors, width d) and of the target ``y = h_after_run
    - h_before_run + m``: ``M^T M``, ``M^T Y``, ``||Y||^2`` and ``||h_after||^2``."""

    mtm: Tensor | None = None
    mty: Tensor | None = None
    yty: float = 0.0
    target: float = 0.0

    def add(self, m: Tensor, before: Tensor, after: Tensor) -> None:
        m, before, after = (
            t.reshape(-1, t.shape[-1]).to(torch.float64) for t in (m, before, after)
        )
        y = after - before + m
        mtm, mty = (m.T @ m).cpu(), (m.T @ y).cpu()
        if self.mtm is None or self.mty is None:
            self.mtm, self.mty = mtm, mty
        else:  # in place, as Gram.add
            self.mtm.add_(mtm)
            self.mty.add_(mty)
        self.yty += float((y * y).sum())
        self.target += float((after * after).sum())

    def solve(self, dampening: float = DAMPENING) -> tuple[Tensor, float, float]:
        """``T`` (d, d) minimising ``||M T - Y||^2`` (dampened as :func:`refit_columns`), and the
        run's output error relative to ``||h_after||^2`` without the map (``T = I``: the blocks
        just removed) and with it."""
        assert self.mtm is not None and self.mty is not None, "the run saw no calibration token"
        a = self.mtm.clone()
        a.diagonal().add_(dampening * float(torch.diagonal(a).mean()))
        t = torch.linalg.solve(a, self.mty)
        eye = torch.eye(a.shape[0], dtype=torch.float64)
        scale = max(self.target, 1e-300)
        return t, self._residual(eye) / scale, self._residual(t) / scale

    def _residual(self, t: Tensor) -> float:
        """``||Y - M T||^2 = ||Y||^2 - 2 tr(T^T M^T Y) + tr(T^T M^T M T)``."""
        assert self.mtm is not None and self.mty is not None
        return self.yty - 2 * float((t * self.mty).sum()) + float((t * (self.mtm @ t)).sum())
