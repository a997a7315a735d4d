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

A refit must never make the cut worse. With few calibration tokens the least-squares weights
fit the calibration text and lose on other text, and a damping that pulls them toward zero can
lose to the plain cut. So every refit is checked on windows it was not fitted on: every
:data:`HELD_EVERY`-th calibration window is held back (:func:`is_held`), the weights are fitted on
the rest with each damping of :data:`DAMPINGS`, shrinking toward the cut they replace,

    W_K(lambda) = (W H[:, K] + lambda W[:, K]) (H[K, K] + lambda I)^-1

(``lambda -> infinity`` is the plain slice), and the damping of least error on the held-back
windows is kept, then refit on every window; where no damping beats the plain slice there, the
plain slice is kept (:class:`Refit`'s ``kept_plain``).

``shrink --blocks``: a removed run of blocks is replaced by one linear map ``T`` (d x d) on the
MLP output ``m`` of the kept block before it (ReplaceMe, arXiv 2505.02819): least squares of
``m T ~= h_after_run - h_before_run + m`` over the calibration tokens (:class:`RunMap`), so that
the kept block's output ``h_before_run - m + m T`` approximates what the run would have given.
``m = W_down a (+ b)``, so ``T`` folds into the down projection: ``W_down <- T^T W_down`` (and
``b <- T^T b``): no new parameters. The map is checked as the refits are, its damping pulling
toward ``T = I`` (the blocks just removed): ``T(lambda) = (M^T M + lambda I)^-1 (M^T Y + lambda
I)``, chosen on the held-back windows, and no map at all where none beats ``T = I`` there
(:func:`choose_map`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from sparsetool.util.threads import torch_threads

__all__ = [
    "DAMPENING",
    "DAMPINGS",
    "HELD_EVERY",
    "Gram",
    "MapChoice",
    "Refit",
    "RunMap",
    "choose_map",
    "held_windows",
    "is_held",
    "refit_columns",
]

DAMPENING = 0.01
"""``lambda`` as a fraction of the mean diagonal of ``H[K, K]`` (SparseGPT's default), where one
damping is asked for (:func:`refit_columns`' ``dampening``; ``--hidden``'s readers)."""
DAMPINGS = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
"""The dampings a refit or a map chooses from on the held-back windows, each a fraction of the
mean diagonal of ``H[K, K]`` (``M^T M``); larger pulls harder toward the plain cut."""
BETTER = 1e-12
"""How much lower a refit's relative held-back error must be to count as better than the cut
(rounding, not a gain, below it)."""
HELD_EVERY = 4
"""Every 4th calibration window (the 4th, 8th, ...) is held back to choose the damping on."""


def is_held(index: int, windows: int) -> bool:
    """Whether window ``index`` of ``windows`` is held back: every :data:`HELD_EVERY`-th, or the
    last of 2 or 3; none of 1 (which nothing can be checked on).

    >>> [i for i in range(9) if is_held(i, 9)], [i for i in range(3) if is_held(i, 3)]
    ([3, 7], [2])
    >>> is_held(0, 1)
    False
    """
    if windows >= HELD_EVERY:
        return index % HELD_EVERY == HELD_EVERY - 1
    return windows >= 2 and index == windows - 1


def held_windows(windows: int) -> int:
    """How many of ``windows`` calibration windows are held back (:func:`is_held`)."""
    return sum(is_held(i, windows) for i in range(windows))


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

    def merged(self, other: Gram) -> Gram:
        """The sums over both sets of inputs (``other`` may have seen none)."""
        assert self.h is not None and self.sums is not None
        if other.h is None or other.sums is None:
            return self
        return Gram(self.h + other.h, self.sums + other.sums, self.tokens + other.tokens)

    def matrix(self, bias: bool) -> Tensor:
        """``H``, or with ``bias`` the :meth:`augmented` one."""
        assert self.h is not None
        return self.augmented() if bias else self.h

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
    the relative calibration error of the plain slice and of what is kept. Chosen on held-back
    windows: the damping kept (``damping``, a fraction as :data:`DAMPINGS`; None when the plain
    slice is kept), the held-back error of the plain slice and of the refit fitted without them
    (``held_before``, ``held_after``: the best damping's, the plain slice's when kept plain)."""

    weight: Tensor
    bias: Tensor | None
    error_before: float
    error_after: float
    damping: float | None = None
    held_before: float | None = None
    held_after: float | None = None
    kept_plain: bool = False

    def record(self) -> dict:
        rec: dict[str, float | bool | None] = {
            "error_before": self.error_before,
            "error_after": self.error_after,
        }
        if self.held_before is not None:
            rec |= {
                "held_before": self.held_before,
                "held_after": self.held_after,
                "damping": self.damping,
                "kept_plain": self.kept_plain,
            }
        return rec


@torch_threads(1)  # LAPACK's solves and whole-tensor sums split by thread count: the same bits
def refit_columns(
    w: Tensor,
    gram: Gram,
    kept: list[int],
    *,
    bias: Tensor | None = None,
    held: Gram | None = None,
    dampening: float | None = None,
) -> Refit:
    """The least-squares weights of ``w`` (out, in) on the input columns ``kept``, given the
    inputs' :class:`Gram` (see the module docstring); ``bias`` (out,) is refit alongside.

    With ``held`` (the held-back windows' inputs) the damping is chosen on them from
    :data:`DAMPINGS`, shrinking toward the plain slice, and the plain slice is kept where no
    damping beats it there; the weights are then fitted on both. Without, ``dampening`` is the
    one damping (toward zero, as SparseGPT); with neither, the plain slice is kept (nothing to
    check a refit on)."""
    assert gram.h is not None, "the layer saw no calibration input"
    n = w.shape[1]
    full = w.to(torch.float64)
    cols = list(kept)
    if bias is not None:
        full = torch.cat([full, bias.to(torch.float64).unsqueeze(1)], 1)
        cols = [*kept, n]  # the constant input is always kept
    k = torch.tensor(cols, dtype=torch.long)
    plain = full.index_select(1, k)  # the plain slice keeps the bias as it is
    with_bias = bias is not None
    if held is not None and held.h is not None and held.tokens:
        choice = _choose_damping(full, gram.matrix(with_bias), held.matrix(with_bias), k)
        h = gram.merged(held).matrix(with_bias)
    else:
        choice = None
        h = gram.matrix(with_bias)
    damping = dampening if choice is None else choice[0]
    if damping is None:
        fitted = plain
    else:
        fitted = _solve_toward(full, h, k, damping, toward_plain=choice is not None)
    scale = float(torch.einsum("ij,jk,ik->", full, h, full))
    before, after = (_error(full, h, k, v) / max(scale, 1e-300) for v in (plain, fitted))
    weight, new_bias = (fitted[:, :-1], fitted[:, -1]) if bias is not None else (fitted, None)
    fit = Refit(weight.contiguous(), new_bias, before, after, damping, kept_plain=damping is None)
    if choice is not None:
        fit.held_before, fit.held_after = choice[1], choice[2]
    return fit


def _solve_toward(full: Tensor, h: Tensor, k: Tensor, damping: float, toward_plain: bool) -> Tensor:
    """``W_K`` (out, |K|) solving ``W_K (H[K, K] + lambda I) = W H[:, K] (+ lambda W[:, K])``,
    ``lambda = damping x mean(diag H[K, K])``: toward the plain slice, or toward zero."""
    hkk = h.index_select(0, k).index_select(1, k)
    lam = damping * float(torch.diagonal(hkk).mean())
    hkk.diagonal().add_(lam)
    rhs = full @ h.index_select(1, k)  # (out, |K|): W H[:, K]
    if toward_plain:
        rhs.add_(full.index_select(1, k), alpha=lam)
    # H[K, K] + lambda I is symmetric positive definite
    return torch.linalg.solve(hkk, rhs.T).T


def _choose_damping(
    full: Tensor, h: Tensor, hh: Tensor, k: Tensor
) -> tuple[float | None, float, float]:
    """(the damping of :data:`DAMPINGS` whose refit on ``h`` has the least error on the held-back
    ``hh``, or None when none beats the plain slice there; the plain slice's held-back error; the
    kept choice's), both relative to the output's held-back ``tr(W Hh W^T)``.

    All in the eigenbasis of ``H[K, K] = Q diag(e) Q^T``: ``W_K(lambda) Q = (W H[:, K] Q + lambda
    W[:, K] Q) / (e + lambda)``, and the held-back error ``tr(W Hh W^T) - 2 <W_K, (W Hh)[:, K]>
    + tr(W_K Hh[K, K] W_K^T)``, one product per damping."""
    hkk = h.index_select(0, k).index_select(1, k)
    e, q = torch.linalg.eigh(hkk)
    mean_diag = float(torch.diagonal(hkk).mean())
    rq = (full @ h.index_select(1, k)) @ q  # W H[:, K] Q
    plain = full.index_select(1, k)
    pq = plain @ q
    fh = full @ hh
    scale = max(float((fh * full).sum()), 1e-300)
    aq = fh.index_select(1, k) @ q  # (W Hh)[:, K] Q
    g = q.T @ hh.index_select(0, k).index_select(1, k) @ q  # Hh[K, K] in the eigenbasis

    def held_error(z: Tensor) -> float:  # z: W_K Q
        return (scale - 2 * float((z * aq).sum()) + float(((z @ g) * z).sum())) / scale

    plain_error = held_error(pq)
    best, best_error = None, plain_error
    for damping in DAMPINGS:
        lam = damping * mean_diag
        err = held_error((rq + lam * pq) / (e + lam))
        if err < best_error - BETTER:
            best, best_error = damping, err
    return best, plain_error, best_error


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

    @torch_threads(1)  # its scalar sums: the same bits whatever --threads
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

    def merged(self, other: RunMap) -> RunMap:
        """The sums over both sets of tokens (``other`` may have seen none)."""
        assert self.mtm is not None and self.mty is not None
        if other.mtm is None or other.mty is None:
            return self
        return RunMap(
            self.mtm + other.mtm,
            self.mty + other.mty,
            self.yty + other.yty,
            self.target + other.target,
        )

    def solve(self, damping: float = DAMPENING, toward_identity: bool = False) -> Tensor:
        """``T`` (d, d) minimising ``||M T - Y||^2 + lambda ||T - T0||^2``, ``lambda = damping x
        mean(diag M^T M)``, ``T0`` the identity (``toward_identity``) or zero."""
        assert self.mtm is not None and self.mty is not None, "the run saw no calibration token"
        a = self.mtm.clone()
        lam = damping * float(torch.diagonal(a).mean())
        a.diagonal().add_(lam)
        rhs = self.mty.clone()
        if toward_identity:
            rhs.diagonal().add_(lam)
        return torch.linalg.solve(a, rhs)

    def errors(self, t: Tensor | None) -> tuple[float, float]:
        """The run's output error relative to ``||h_after||^2`` without the map (``T = I``: the
        blocks just removed) and with ``t`` (None: without)."""
        assert self.mtm is not None, "the run saw no calibration token"
        eye = torch.eye(self.mtm.shape[0], dtype=torch.float64)
        scale = max(self.target, 1e-300)
        plain = self._residual(eye) / scale
        return plain, (plain if t is None else self._residual(t) / scale)

    def _residual(self, t: Tensor) -> float:
        """``||Y - M T||^2 = ||Y||^2 - 2 tr(T^T M^T Y) + tr(T^T M^T M T)``."""
        assert self.mtm is not None and self.mty is not None
        return self.yty - 2 * float((t * self.mty).sum()) + float((t * (self.mtm @ t)).sum())


@dataclass
class MapChoice:
    """A run's map as chosen on the held-back windows: ``t`` (None: no map beat the blocks just
    removed, ``T = I``, there), its ``damping`` (a fraction as :data:`DAMPINGS`), the held-back
    error of ``T = I`` and of the best map fitted without them (``held_before``,
    ``held_after``), and the calibration error of ``T = I`` and of what is kept over every
    window (``error_before``, ``error_after``)."""

    t: Tensor | None
    damping: float | None
    held_before: float | None
    held_after: float | None
    error_before: float
    error_after: float


@torch_threads(1)  # as refit_columns
def choose_map(fit: RunMap, held: RunMap) -> MapChoice:
    """ReplaceMe's map of a run fitted on ``fit``'s tokens, its damping (pulling toward ``T =
    I``) chosen on ``held``'s from :data:`DAMPINGS`, then fitted on both; no map where none beats
    ``T = I`` on ``held``. With nothing held back (one calibration window), no map."""
    if held.mtm is None:
        before, _ = fit.errors(None)
        return MapChoice(None, None, None, None, before, before)
    plain, _ = held.errors(None)
    best, best_error = None, plain
    for damping in DAMPINGS:
        _, err = held.errors(fit.solve(damping, toward_identity=True))
        if err < best_error - BETTER:
            best, best_error = damping, err
    every = fit.merged(held)
    t = None if best is None else every.solve(best, toward_identity=True)
    before, after = every.errors(t)
    return MapChoice(t, best, plain, best_error, before, after)
