"""Figures shared by ``report --plot`` and ``diff --plot``: the layer x matrix heatmap (the axes of
SPDF Figures 3-4) and the PNG write. matplotlib is imported only when a figure is drawn."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparsetool.checkpoint.output_files import (
    Written,
    reclaiming,
    remove,
    temp_beside,
    write_error,
)
from sparsetool.util.plotting import pyplot

__all__ = [
    "MATRIX_LABELS",
    "layer_heatmap",
    "message_figure",
    "save_png",
    "shorten_path",
    "unique_suffixes",
]

MATRIX_LABELS = {
    "Q": "Q",
    "K": "K",
    "V": "V",
    "QKV": "QKV (fused)",
    "attn_out": "attention out",
    "ffn_in": "FFN in",
    "ffn_out": "FFN out",
}
"""Heatmap rows, top to bottom: matrix kind -> label."""


def layer_heatmap(
    values: Mapping[tuple[int, str], float],
    out: str | Path,
    *,
    title: str,
    colour_label: str,
    labels: Mapping[str, str] = MATRIX_LABELS,
    vmin: float = 0.0,
    vmax: float | None = None,
    cell_text: Callable[[float], str] = lambda v: f"{v:.3g}",
    hatched: Collection[tuple[int, str]] = (),
    hatch_label: str = "",
    cell_texts: Mapping[tuple[int, str], str] | None = None,
) -> Written:
    """Layers across, matrices down (in the order of ``labels``), ``values[(layer, kind)]`` as
    colour.

    A cell a layer lacks is light grey. ``vmax`` None: the largest value (1.0 if all are 0).
    With at most 12 layers every cell also prints its value through ``cell_text`` (or the text
    ``cell_texts`` gives that cell, e.g. a range of experts' sparsities); at most about
    32 layer numbers are written across, so the ticks stay readable at any depth. ``hatched``
    cells are drawn over with hatching and ``hatch_label`` in a legend (report: cells prune does
    not touch, whose zeros are the input's own).
    """
    import numpy as np

    plt = pyplot()
    layers = sorted({layer for layer, _ in values})
    kinds = [k for k in labels if any(kind == k for _, kind in values)]
    grid = np.full((len(kinds), len(layers)), np.nan)
    for (layer, kind), v in values.items():
        if kind in kinds:
            grid[kinds.index(kind), layers.index(layer)] = v
    if vmax is None:
        top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 0.0
        vmax = top if top > 0 else 1.0
    width = min(18.0, max(6.0, 0.42 * len(layers) + 2.8))
    fig, ax = plt.subplots(figsize=(width, 0.5 * len(kinds) + 1.9), layout="constrained")
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgray")
    img = ax.imshow(
        np.ma.masked_invalid(grid),
        aspect="auto",
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        interpolation="nearest",
    )
    every = max(1, math.ceil(len(layers) / 32))
    ticks = list(range(0, len(layers), every))
    ax.set_xticks(ticks, [str(layers[i]) for i in ticks], fontsize=8)
    ax.set_yticks(range(len(kinds)), [labels[k] for k in kinds], fontsize=9)
    ax.set_xlabel("layer")
    if len(layers) <= 12:
        for (r, c), v in np.ndenumerate(grid):
            if not np.isnan(v):
                dark = (v - vmin) < 0.6 * (vmax - vmin)  # viridis is dark at the low end
                text = (cell_texts or {}).get((layers[c], kinds[r])) or cell_text(float(v))
                ax.text(
                    c,
                    r,
                    text,
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
    marked = [(kinds.index(k), layers.index(layer)) for layer, k in hatched if k in kinds]
    for r, c in marked:
        ax.add_patch(
            plt.Rectangle(
                (c - 0.5, r - 0.5),
                1,
                1,
                fill=False,
                hatch="//",
                edgecolor="0.85",
                linewidth=0,
                gid="hatched",
            )
        )
    if marked and hatch_label:
        fig.legend(
            [plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="0.45", hatch="////")],
            [hatch_label],
            loc="outside lower left",
            fontsize=7,
            frameon=False,
        )
    bar = fig.colorbar(img, ax=ax, pad=0.01)
    bar.set_label(colour_label, fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_png(fig, out)


def message_figure(message: str, out: str | Path, title: str | None = None) -> Written:
    """A small PNG that only says ``message`` (nothing to draw): no axes, no legend."""
    plt = pyplot()
    fig = plt.figure(figsize=(6, 2))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True)
    return save_png(fig, out)


def save_png(fig: Any, out: str | Path, dpi: int = 120) -> Written:
    """Write ``fig`` to ``out`` through a temporary file in the same directory, renamed at the end,
    so a failed write leaves nothing behind; then close it. Returns the path and the temporaries
    of killed runs removed beside it (an error carries those as its ``reclaimed``)."""
    plt = pyplot()
    out = Path(out)
    with reclaiming() as reclaimed:
        _write_png(fig, out, dpi, plt)
    return Written(out, reclaimed)


def _write_png(fig: Any, out: Path, dpi: int, plt: Any) -> None:
    tmp = temp_beside(out)  # named after this process: a kill -9 leaves nothing for long
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            fig.savefig(f, format="png", dpi=dpi)  # an ordinary file: the umask's mode
        os.replace(tmp, out)
    except BaseException as e:
        remove(tmp)
        if isinstance(e, OSError):  # read-only, no space, no permission: one clean line
            raise write_error(e, out, "--plot") from None
        raise
    finally:
        plt.close(fig)


def unique_suffixes(paths: Sequence[str]) -> list[str]:
    """Each path as its shortest run of trailing parts that no other path ends with: labels that
    tell two ``model.safetensors`` apart without printing whole paths.

    >>> unique_suffixes(
    ...     ["runs/a/model.safetensors", "runs/b/model.safetensors", "x/pruned.safetensors"]
    ... )
    ['a/model.safetensors', 'b/model.safetensors', 'pruned.safetensors']
    >>> unique_suffixes(["/m/ft/model", "/n/ft/model", "/m/dense"])
    ['m/ft/model', 'n/ft/model', 'dense']
    >>> unique_suffixes(["a/model.safetensors", "a/model.safetensors"])  # the same path twice
    ['model.safetensors', 'model.safetensors']
    """
    parts = [[q for q in str(p).replace("\\", "/").split("/") if q] or [str(p)] for p in paths]
    out = []
    for i, mine in enumerate(parts):
        others = [o for j, o in enumerate(parts) if j != i and o != mine]
        n = 1
        while n < len(mine) and any(o[-n:] == mine[-n:] for o in others):
            n += 1
        out.append("/".join(mine[-n:]))
    return out


def shorten_path(text: str, width: int = 60) -> str:
    """``text`` in at most about ``width`` characters: a long path keeps its file name and as many
    of the folders before it as fit, behind an ellipsis; other text is cut at a word.

    >>> shorten_path("/data/corpora/wikitext-103/validation/wiki.valid.raw.txt", 40)
    '.../validation/wiki.valid.raw.txt'
    >>> shorten_path("short.txt")
    'short.txt'
    >>> shorten_path("the built-in English help text of every command, joined", 30)
    'the built-in English help...'
    """
    if len(text) <= width:
        return text
    if "/" in text and " " not in text:
        parts = text.split("/")
        kept = parts[-1]
        for q in reversed(parts[:-1]):
            if not q or len(kept) + len(q) + 5 > width:
                break
            kept = f"{q}/{kept}"
        return f".../{kept}"
    return text[: width - 3].rsplit(" ", 1)[0] + "..."
