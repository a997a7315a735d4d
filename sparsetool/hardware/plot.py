"""Speedup versus sparsity for each device, with the theoretical ``1 / (1 - s)`` line (the
picture of the SPDF paper's Appendix C figure). matplotlib is imported only here."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sparsetool.errors import SparsetoolError

_STYLE = {"dataflow": "-o", "gpu-dense": "--s", "gpu-2:4": "D", "gpu-spmm": ":^", "gpu-flash-llm": "-.v"}


def theoretical_curve(max_sparsity: float, points: int = 201) -> tuple[list[float], list[float]]:
    """``1 / (1 - s)`` sampled finely from the dense point to ``max_sparsity``: the curve itself,
    not straight segments between the sparsities of a sweep.

    >>> xs, ys = theoretical_curve(0.9, points=4)
    >>> [round(x, 2) for x in xs], [round(y, 2) for y in ys]
    ([0.0, 0.3, 0.6, 0.9], [1.0, 1.43, 2.5, 10.0])
    """
    xs = [max_sparsity * i / (points - 1) for i in range(points)]
    return xs, [1.0 / (1.0 - s) for s in xs]


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str, key: str = "forward_speedup",
               nm_point: dict[str, Any] | None = None) -> None:
    """Write a PNG of ``rows`` (from :func:`sparsetool.hardware.compare.sweep`) to ``path``,
    atomically (temporary file, then rename). ``nm_point``: the 2:4 devices on a 2:4 mask."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    if not path.parent.is_dir():
        raise SparsetoolError(f"--plot: directory '{path.parent}' does not exist; create it first")
    xs = [r["sparsity"] for r in rows]
    fig, ax = plt.subplots(figsize=(9.5, 4.8), dpi=110)
    cx, cy = theoretical_curve(max(xs, default=0.9))
    ax.plot(cx, cy, "k-", lw=2.5, alpha=0.35, label="theoretical 1/(1-s)")
    names = list(rows[0]["devices"]) if rows else []
    for name in names:
        pts = [(r["sparsity"], r["devices"][name][key]) for r in rows
               if r["sparsity"] > 0 and r["devices"][name][key] is not None]
        if not pts:  # refused on every sparse mask (2:4 cores on random masks)
            continue
        kind = rows[0]["devices"][name]["kind"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], _STYLE.get(kind, "-"), ms=4, label=name)
    for name, d in (nm_point or {}).get("devices", {}).items():
        if d.get(key) is not None:
            ax.plot([nm_point["sparsity"]], [d[key]], "D", ms=7, label=f"{name} (on a 2:4 mask)")
    ax.plot([0.0], [1.0], "ko", ms=5, label="sparsity 0: every device's dense run")
    ax.set_xlabel("sparsity (fraction of zero weights)")
    ax.set_ylabel("speedup over the same device's dense run")
    ax.set_title(title, fontsize=10)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.grid(True, which="both", alpha=0.3)
    # Outside the axes, so it never covers the dense point at (0, 1x) or a device's curve.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, format="png")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a plot is an ordinary file
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.unlink(tmp)
