"""Execute the zero-skipping schedule the dataflow model times, and check it is the real product.

The schedule (seed post "Harnessing the power of sparsity for large GPT AI models": "a sparse
GEMM is simply a collection of AXPY operations, with one operation for every non-zero element"):
core group ``(i, j)`` owns outputs ``M_i`` and inputs ``K_j``; for every non-zero ``w[m, k]`` in
its tile it performs one AXPY ``part[:, m] += w[m, k] * x[:, k]`` over all tokens; zeros are
never visited. The partial sums of the groups along K are then reduced. The result must equal
the dense product with the mask applied, ``x @ (w * mask).T``, and the number of AXPYs per group
must equal the per-tile non-zero counts the cost model uses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sparsetool.hardware.layers import edges, tile_counts

MAX_SIDE = 512
"""Verification runs one Python-level AXPY per non-zero, so it takes at most a 512 x 512 block."""


def run_schedule(
    mask: np.ndarray, grid: tuple[int, int], tokens: int = 8, seed: int = 0
) -> dict[str, Any]:
    """Run the schedule on the leading ``<= 512 x 512`` block of ``mask`` (``(M, K)``, True = kept)
    with random weights and activations; report whether it matches the masked dense product.

    >>> r = run_schedule(np.eye(6, dtype=bool), (2, 3), tokens=4)
    >>> r["equal"], r["axpys"], r["axpys_match_tiles"]
    (True, 6, True)
    """
    block = mask[:MAX_SIDE, :MAX_SIDE]
    m, k = block.shape
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, k)) * block  # float64: the only difference left is summation order
    x = rng.standard_normal((tokens, k))
    e_m, e_k = edges(m, grid[0]), edges(k, grid[1])
    y = np.zeros((tokens, m))
    axpys = np.zeros((len(e_m) - 1, len(e_k) - 1), dtype=np.int64)
    for i, (m0, m1) in enumerate(zip(e_m[:-1], e_m[1:])):
        parts = []
        for j, (k0, k1) in enumerate(zip(e_k[:-1], e_k[1:])):
            part = np.zeros((tokens, m1 - m0))  # this group's partial sums for outputs M_i
            rows, cols = np.nonzero(block[m0:m1, k0:k1])
            for r, c in zip(rows.tolist(), cols.tolist()):
                part[:, r] += w[m0 + r, k0 + c] * x[:, k0 + c]  # one AXPY per non-zero
            axpys[i, j] = rows.size
            parts.append(part)
        y[:, m0:m1] = np.sum(parts, axis=0)  # reduction over the groups along K
    reference = x @ w.T
    err = float(np.max(np.abs(y - reference))) if y.size else 0.0
    scale = float(np.max(np.abs(reference))) if y.size else 0.0
    return {
        "block": [m, k],
        "tokens": tokens,
        "core_groups": [len(e_m) - 1, len(e_k) - 1],
        "axpys": int(axpys.sum()),
        "nonzero": int(np.count_nonzero(block)),
        "axpys_match_tiles": bool(np.array_equal(axpys, tile_counts(block, grid))),
        "max_abs_error": err,
        "equal": bool(np.allclose(y, reference, rtol=1e-12, atol=1e-12 * max(scale, 1.0))),
    }
