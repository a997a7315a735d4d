"""Speedup versus sparsity for each device, with the theoretical ``1 / (1 - s)`` line (the
picture of the SPDF paper's Appendix C figure). matplotlib is imported only here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import (
    Written,
    reclaiming,
    remove,
    temp_beside,
    write_error,
)
from sparsetool.errors import SparsetoolError


def theoretical_curve(max_sparsity: float, points: int = 201) -> tuple[list[float], list[float]]:
    """``1 / (1 - s)`` sampled finely from the dense point to ``max_sparsity``: the curve itself,
    not straight segments between the sparsities of a sweep.

    >>> xs, ys = theoretical_curve(0.9, points=4)
    >>> [round(x, 2) for x in xs], [round(y, 2) for y in ys]
    ([0.0, 0.3, 0.6, 0.9], [1.0, 1.43, 2.5, 10.0])
    """
    xs = [max_sparsity * i / (points - 1) for i in range(points)]
    return xs, [1.0 / (1.0 - s) for s in xs]


def dodge(
    series: dict[str, list[tuple[float, float]]], width: float = 0.006, tolerance: float = 0.02
) -> dict[str, list[tuple[float, float]]]:
    """Points of different series that coincide (same x, y within ``tolerance`` relative) moved
    apart along x by ``width`` each, centred on their x, so that none hides another.

    >>> dodge(
    ...     {
    ...         "a100": [(0.5, 1.0), (0.9, 1.0)],
    ...         "h100": [(0.5, 1.0), (0.9, 1.0)],
    ...         "cs2": [(0.5, 2.0)],
    ...     }
    ... )
    {'a100': [(0.497, 1.0), (0.897, 1.0)], 'h100': [(0.503, 1.0), (0.903, 1.0)], 'cs2': [(0.5,
    2.0)]}
    """
    at: dict[float, list[tuple[str, int, float]]] = {}
    for name, pts in series.items():
        for i, (x, y) in enumerate(pts):
            at.setdefault(x, []).append((name, i, y))
    out = {name: list(pts) for name, pts in series.items()}
    for x, found in at.items():
        groups: list[list[tuple[str, int, float]]] = []
        for item in found:
            for g in groups:
                if abs(item[2] - g[0][2]) <= tolerance * max(abs(g[0][2]), 1e-12):
                    g.append(item)
                    break
            else:
                groups.append([item])
        for g in groups:
            for j, (name, i, y) in enumerate(g):
                out[name][i] = (round(x + (j - (len(g) - 1) / 2) * width, 9), y)
    return out


_MARKERS = "os^vDP*Xph<>"
_DASHES = [
    "-",
    "--",
    ":",
    "-.",
    (0, (5, 1, 1, 1, 1, 1)),
    (0, (1, 3)),
    (0, (8, 2)),
    (0, (3, 1, 1, 1)),
]


def sweep_figure(
    rows: list[dict[str, Any]],
    title: str,
    key: str = "forward_speedup",
    nm_point: dict[str, Any] | None = None,
) -> Any:
    """The matplotlib Figure :func:`plot_sweep` writes: each device its own marker and line style,
    points that coincide (a100 and h100 both at 1x; the two 2:4 devices on a 2:4 mask) moved a
    little apart and drawn half transparent, so that every device stays visible."""
    from sparsetool.util.plotting import pyplot

    plt = pyplot()
    import matplotlib.ticker

    xs = [r["sparsity"] for r in rows]
    fig, ax = plt.subplots(figsize=(9.5, 4.8), dpi=110)
    cx, cy = theoretical_curve(max(xs, default=0.9))
    ax.plot(cx, cy, "k-", lw=2.5, alpha=0.35, label="theoretical 1/(1-s)")
    names = list(rows[0]["devices"]) if rows else []
    series = {
        name: [
            (r["sparsity"], r["devices"][name][key])
            for r in rows
            if r["sparsity"] > 0 and r["devices"][name][key] is not None
        ]
        for name in names
    }
    series = {n: pts for n, pts in series.items() if pts}  # none: refused on every sparse mask
    point = nm_point or {}
    nm = {
        f"{name} (on a 2:4 mask)": [(point["sparsity"], d[key])]
        for name, d in point.get("devices", {}).items()
        if d.get(key) is not None
    }
    moved = dodge({**series, **nm})
    for i, name in enumerate(series):
        ax.plot(
            *zip(*moved[name]),
            marker=_MARKERS[i % len(_MARKERS)],
            ls=_DASHES[i % len(_DASHES)],
            ms=5,
            mfc="none" if i % 2 else None,
            alpha=0.8,
            label=name,
        )
    for j, name in enumerate(nm):
        ax.plot(
            *zip(*moved[name]),
            marker="D",
            ls="none",
            ms=8 - 2 * (j % 2),
            alpha=0.7,
            mfc="none" if j % 2 == 0 else None,
            mew=1.5,
            label=name,
        )
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
    return fig


def plot_sweep(
    rows: list[dict[str, Any]],
    path: Path,
    title: str,
    key: str = "forward_speedup",
    nm_point: dict[str, Any] | None = None,
) -> Written:
    """Write a PNG of ``rows`` (from :func:`sparsetool.hardware.compare.sweep`) to ``path``,
    atomically (temporary file, then rename). ``nm_point``: the 2:4 devices on a 2:4 mask.
    Returns the path and the temporaries of killed runs removed beside it."""
    path = Path(path)
    if not path.parent.is_dir():
        raise SparsetoolError(f"--plot: directory '{path.parent}' does not exist; create it first")
    from sparsetool.util.plotting import pyplot

    plt = pyplot()

    fig = sweep_figure(rows, title, key, nm_point)
    with reclaiming() as reclaimed:
        tmp = temp_beside(path)  # named after this process: a kill -9 leaves nothing for long
        try:
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
                fig.savefig(f, format="png")  # an ordinary file: the umask's mode
            os.replace(tmp, path)
        except OSError as e:  # read-only, no space, no permission: one clean line
            raise write_error(e, path, "--plot") from None
        finally:
            plt.close(fig)
            remove(tmp)
    return Written(path, reclaimed)
