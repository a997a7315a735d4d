"""The picture of a bench run: speed-up over dense against batch (one panel per matrix timed),
or, where several sparsities were timed, against sparsity (one line per batch, the break-even
sparsity where a line crosses 1x). matplotlib is imported only here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import Written
from sparsetool.util.wording import plural

_MARKERS = "os^vDP*Xph<>"


def bench_figure(result: dict[str, Any]) -> Any:
    """The matplotlib Figure :func:`plot_bench` writes."""
    from sparsetool.util.plotting import pyplot

    plt = pyplot()
    import matplotlib.ticker

    shapes: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for ly in result["layers"]:
        shapes.setdefault(tuple(ly["shape"]), []).append(ly)
    sweep = any(len(lys) > 1 for lys in shapes.values())
    fig, axes = plt.subplots(
        1,
        len(shapes),
        figsize=(4.6 * len(shapes) + 1.8, 4.2),
        dpi=110,
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    for ax, (shape, lys) in zip(axes[0], shapes.items()):
        if sweep:
            lys = sorted(lys, key=lambda ly: ly["sparsity"])
            for i, batch in enumerate(result["batches"]):
                pts = [
                    (ly["sparsity"], ly["runs"][i]["best_speedup"])
                    for ly in lys
                    if ly["runs"][i]["best_speedup"]
                ]
                if pts:
                    ax.plot(
                        *zip(*pts), marker=_MARKERS[i % len(_MARKERS)], ms=4, label=f"batch {batch}"
                    )
            for r in result["break_even"]:
                crossed = r["kernel"] == "best" and r["sparsity"] is not None
                if crossed and tuple(r["shape"]) == shape:
                    ax.plot([r["sparsity"]], [1.0], "k|", ms=12)
            ax.set_xlabel("sparsity (fraction of zero weights)")
            title = f"{shape[0]} x {shape[1]}: fastest sparse kernel"
        else:
            ly = lys[0]
            batches = [r["batch"] for r in ly["runs"]]
            for j, k in enumerate(result["kernels"]):
                pts = [
                    (b, r["sparse"][k]["speedup"])
                    for b, r in zip(batches, ly["runs"])
                    if k in r["sparse"]
                ]
                if pts:
                    ax.plot(*zip(*pts), marker=_MARKERS[j % len(_MARKERS)], ms=4, label=k)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xlabel("batch (tokens per product)")
            title = f"{shape[0]} x {shape[1]} at sparsity {ly['sparsity']:.2f}"
            if ly["count"] > 1:
                title += f" (x{ly['count']})"
        ax.axhline(1.0, color="k", lw=1, alpha=0.5)
        ax.set_title(title, fontsize=9)
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("speed-up over the fastest dense kernel")
    if axes[0][0].get_legend_handles_labels()[0]:
        axes[0][0].legend(fontsize=8, loc="best")
    dev = result["device"]
    fig.suptitle(
        f"{result['label']} on {dev['name']} ({plural(dev['threads'], 'thread')}, "
        f"{result['dtype']})",
        fontsize=10,
    )
    return fig


def plot_bench(result: dict[str, Any], path: Path) -> Written:
    """Write the PNG of a bench result to ``path`` atomically."""
    from sparsetool.ops.plots import save_png

    return save_png(bench_figure(result), path)
