"""What the cost model needs to know about one pruned weight matrix, read from its mask.

A layer is an ``M x K`` weight (M output features, K input features; ``y = x @ W.T``). The
zero-skipping machine splits it over a ``g_m x g_k`` grid of core groups and the busiest group
sets the pace (see :mod:`sparsetool.hardware.devices`), so the one statistic that matters beyond
the non-zero count is the non-zero count *per tile* of that grid. The 2:4 sparse tensor cores need
to know whether every group of 4 consecutive weights along the reduction dimension keeps at most 2.
Both are counted here with whole-array reductions (no Python loop over entries): a 12288 x 12288
mask (144M entries) takes well under a second.

Synthetic masks (``random``, ``rows``, ``2:4``) are seeded and have exact counts: the number of
zeros is ``round(sparsity * numel)``, as ``sparsetool prune`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sparsetool.errors import ConfigError

PATTERNS = ("random", "rows", "cols", "2:4")
"""Synthetic mask patterns: uniform random; pruning concentrated in the leading output rows (or
input columns), the worst case for load balance; and 2:4 along the input dimension."""


def edges(n: int, g: int) -> np.ndarray:
    """Tile boundaries splitting ``n`` items into ``min(g, n)`` nearly equal parts.

    >>> edges(10, 4).tolist()
    [0, 2, 5, 7, 10]
    >>> edges(3, 8).tolist()
    [0, 1, 2, 3]
    """
    g = max(1, min(g, n))
    return (np.arange(g + 1, dtype=np.int64) * n) // g


def tile_sizes(m: int, k: int, grid: tuple[int, int]) -> np.ndarray:
    """Entries per tile, ``(g_m, g_k)``.

    >>> tile_sizes(4, 6, (2, 4)).tolist()
    [[2, 4, 2, 4], [2, 4, 2, 4]]
    """
    return np.outer(np.diff(edges(m, grid[0])), np.diff(edges(k, grid[1])))


def tile_counts(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Non-zeros per tile of a 2-D bool ``mask`` (True = kept) on a ``grid = (g_rows, g_cols)``.

    One ``sum(axis=0)`` per row band, then a ``reduceat`` over columns of the small result; a
    ``reduceat`` straight on the bool array is 50x slower.

    >>> tile_counts(np.eye(4, dtype=bool), (2, 2)).tolist()
    [[2, 0], [0, 2]]
    """
    e0, e1 = edges(mask.shape[0], grid[0]), edges(mask.shape[1], grid[1])
    bands = np.stack([mask[a:b].sum(axis=0, dtype=np.int64) for a, b in zip(e0[:-1], e0[1:])])
    return np.add.reduceat(bands, e1[:-1], axis=1)


def nm_violation(mask: np.ndarray, axis: int, n: int = 2, m: int = 4) -> float | None:
    """Fraction of groups of ``m`` consecutive entries along ``axis`` that keep more than ``n``.

    0.0 means the mask fits the N:M sparse tensor cores along that axis; ``None`` when the
    dimension is not a multiple of ``m`` (the pattern cannot apply at all). NVIDIA's 2:4 sparse
    tensor cores (A100 whitepaper, 2020) need 2:4 along the reduction dimension.

    >>> mk = np.array([[1, 1, 0, 0, 1, 0, 1, 1]], dtype=bool)
    >>> nm_violation(mk, axis=1)
    0.5
    >>> nm_violation(mk, axis=0) is None
    True
    """
    if mask.shape[axis] % m:
        return None
    a = np.moveaxis(mask, axis, -1) if axis != mask.ndim - 1 else mask
    groups = a.size // m
    if groups == 0:
        return 0.0
    counts: np.ndarray | int  # sum() types an empty sum as 0 (there are m >= 1 terms)
    if m == 4 and a.flags["C_CONTIGUOUS"]:
        # four 0/1 bytes in one uint32; multiplying by 0x01010101 puts their sum in the top byte
        v = np.ascontiguousarray(a).view(np.uint32)
        counts = (v * np.uint32(0x01010101)) >> np.uint32(24)
    elif axis == 0 and mask.flags["C_CONTIGUOUS"]:
        u = mask.view(np.uint8)
        counts = sum(u[i::m] for i in range(m))
    else:
        counts = np.ascontiguousarray(a).reshape(-1, m).sum(axis=1)
    return float(np.count_nonzero(counts > n)) / groups


@dataclass
class LayerMask:
    """One targeted weight matrix as the cost model sees it.

    ``tiles`` maps a core-group grid ``(g_m, g_k)`` to the ``(g_m, g_k)`` array of non-zeros per
    tile; ``measured`` is False when the counts were drawn for a uniformly random mask rather than
    counted from a real one (``--model``).
    """

    name: str
    role: str
    out_features: int  # M
    in_features: int  # K
    nnz: int
    tiles: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)
    nm_violation_in: float | None = None  # 2:4 along K (forward, y = x W^T)
    nm_violation_out: float | None = None  # 2:4 along M (backward-data, dx = dy W)
    measured: bool = True
    _busiest: dict[tuple[int, int], float] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def numel(self) -> int:
        return self.out_features * self.in_features

    @property
    def density(self) -> float:
        return self.nnz / self.numel

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nnz / self.numel

    @property
    def is_dense(self) -> bool:
        return self.nnz == self.numel

    def busiest_over_mean(self, grid: tuple[int, int]) -> float:
        """Work of the busiest core group over the mean, cores shared in proportion to tile size.

        1.0 is perfect balance; it equals the largest tile density over the layer's density.
        """
        if self.nnz == 0:
            return 1.0
        cached = self._busiest.get(grid)
        if cached is None:  # asked for every pass and kernel choice: compute once per grid
            dens = self.tiles[grid] / tile_sizes(self.out_features, self.in_features, grid)
            cached = self._busiest[grid] = float(dens.max()) / self.density
        return cached


def stats_from_mask(
    name: str,
    role: str,
    mask: np.ndarray,
    grids: list[tuple[int, int]],
    input_dim: int = 1,
) -> LayerMask:
    """Count what the model needs from a real 2-D bool mask (True = kept).

    ``input_dim`` is the axis holding the K input features: 1 for ``nn.Linear`` (out, in), 0 for
    GPT-2's ``Conv1D`` (in, out). The array is never copied or transposed.
    """
    if mask.ndim != 2:
        raise ConfigError(f"{name}: the cost model needs a 2-D weight, got shape {mask.shape}")
    if mask.dtype != np.bool_:
        mask = mask != 0
    out_dim = 1 - input_dim
    m, k = mask.shape[out_dim], mask.shape[input_dim]
    tiles = {}
    for gm, gk in grids:
        if input_dim == 1:
            tiles[(gm, gk)] = tile_counts(mask, (gm, gk))
        else:
            tiles[(gm, gk)] = tile_counts(mask, (gk, gm)).T
    return LayerMask(
        name=name,
        role=role,
        out_features=m,
        in_features=k,
        nnz=int(np.count_nonzero(mask)),
        tiles=tiles,
        nm_violation_in=nm_violation(mask, input_dim),
        nm_violation_out=nm_violation(mask, out_dim),
    )


def kept_count(numel: int, sparsity: float) -> int:
    """Entries kept at ``sparsity``: ``numel - round(sparsity * numel)`` (exact, as ``prune``).

    >>> kept_count(10, 0.25)
    8
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ConfigError(f"sparsity must be between 0 and 1 (fraction of zeros), got {sparsity}")
    return numel - int(round(sparsity * numel))


def synthetic_mask(
    shape: tuple[int, int], sparsity: float, pattern: str = "random", seed: int = 0
) -> np.ndarray:
    """A seeded ``(M, K)`` bool mask with exactly ``round(sparsity * (M * K))`` zeros
    (:func:`kept_count`).

    ``random``: uniform over all masks with that count (i.i.d. draws, then a uniformly chosen set
    of surplus entries flipped, which keeps the result uniform by symmetry; SFC64 generator).
    ``rows``/``cols``: all the pruning concentrated in the leading output rows (input columns):
    whole rows pruned from the top, the remainder at random in the next row. ``2:4``: two of every
    four consecutive weights along K kept, pattern chosen uniformly (sparsity must be 0.5).

    >>> mk = synthetic_mask((8, 8), 0.75, seed=1)
    >>> int(mk.sum())
    16
    >>> synthetic_mask((2, 8), 0.5, "2:4").reshape(-1, 4).sum(1).tolist()
    [2, 2, 2, 2]
    """
    m, k = shape
    rng = np.random.Generator(np.random.SFC64(seed))
    keep = kept_count(m * k, sparsity)
    if pattern == "random":
        return _random_exact(rng, m * k, keep).reshape(m, k)
    if pattern in ("rows", "cols"):
        rows, cols = (m, k) if pattern == "rows" else (k, m)
        out = np.ones((rows, cols), dtype=bool)
        zeros = rows * cols - keep
        full, rest = divmod(zeros, cols)
        out[:full] = False
        if rest:
            out[full, rng.choice(cols, rest, replace=False)] = False
        return out if pattern == "rows" else np.ascontiguousarray(out.T)
    if pattern == "2:4":
        if k % 4:
            raise ConfigError(f"pattern 2:4 needs the input dimension K={k} to be a multiple of 4")
        if abs(sparsity - 0.5) > 1e-12:
            raise ConfigError(
                f"pattern 2:4 keeps exactly half the weights: use --sparsity 0.5, not {sparsity}"
            )
        table = np.array(
            [[1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 0, 1], [0, 0, 1, 1]],
            dtype=bool,
        )
        return table[rng.integers(0, 6, size=(m, k // 4), dtype=np.uint8)].reshape(m, k)
    raise ConfigError(f"unknown mask pattern '{pattern}'; choose one of {', '.join(PATTERNS)}")


def _random_exact(rng: np.random.Generator, n: int, keep: int) -> np.ndarray:
    if keep in (0, n):
        return np.full(n, keep == n, dtype=bool)
    minority = min(keep, n - keep)
    if minority < n / 128:  # few kept (or few pruned): draw their positions directly
        out = np.full(n, keep > minority, dtype=bool)
        out[_distinct(rng, n, minority)] = keep == minority
        return out
    # i.i.d. draws from one random byte per entry (the cheapest source that is fast enough for
    # 144M entries); the count is then made exact by flipping uniformly chosen surplus entries
    threshold = min(255, max(1, int(round(keep / n * 256))))
    out = np.frombuffer(rng.bytes(n), dtype=np.uint8) < threshold
    diff = int(np.count_nonzero(out)) - keep
    state, need = diff > 0, abs(diff)
    frac = threshold / 256 if state else 1 - threshold / 256
    if need and frac < 0.02:  # the entries to flip are rare: list them instead of rejecting
        pool = np.flatnonzero(out == state)
        out[pool[rng.choice(pool.size, need, replace=False)]] = not state
        need = 0
    while need:
        cand = rng.integers(0, n, size=int(need / frac * 1.3) + 16)
        cand = cand[out[cand] == state]
        _, first = np.unique(cand, return_index=True)  # distinct, still in random order
        cand = cand[np.sort(first)][:need]
        out[cand] = not state
        need -= cand.size
    return out


def _distinct(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    """``count`` distinct positions in ``range(n)``, uniformly (rejection of repeats)."""
    picked = np.empty(0, dtype=np.int64)
    while picked.size < count:
        more = rng.integers(0, n, size=int((count - picked.size) * 1.1) + 16)
        cand = np.concatenate([picked, more])
        _, first = np.unique(cand, return_index=True)
        picked = cand[np.sort(first)][:count]
    return picked


def sampled_random(
    name: str,
    role: str,
    shape: tuple[int, int],
    sparsity: float,
    grids: list[tuple[int, int]],
    rng: np.random.Generator,
) -> LayerMask:
    """Tile counts of a uniformly random exact-count mask, drawn without building the mask.

    The non-zeros per tile of such a mask follow a multivariate hypergeometric distribution over
    the tile sizes, so one draw per grid gives exactly the distribution the real mask would; whole
    models (1.2B entries for GPT-3 XL) stay fast. The 2:4 violation fraction is the expected one,
    ``P(more than 2 of 4 kept)`` with each weight kept with probability ``density``.
    """
    m, k = shape
    keep = kept_count(m * k, sparsity)
    tiles = {}
    for grid in grids:
        sizes = tile_sizes(m, k, grid)
        drawn = rng.multivariate_hypergeometric(sizes.ravel(), keep, method="marginals")
        tiles[grid] = drawn.reshape(sizes.shape)
    d = keep / (m * k)
    p_violate = 4 * d**3 * (1 - d) + d**4
    return LayerMask(
        name=name,
        role=role,
        out_features=m,
        in_features=k,
        nnz=keep,
        tiles=tiles,
        nm_violation_in=None if k % 4 else p_violate,
        nm_violation_out=None if m % 4 else p_violate,
        measured=False,
    )
