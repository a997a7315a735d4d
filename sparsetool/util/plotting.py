"""matplotlib, set up once for every picture sparsetool draws (``--plot``, ``train``'s loss.png,
the demo): imported on first use, on the file-only Agg backend, and when it is not installed one
:class:`~sparsetool.errors.SparsetoolError` naming the ``plot`` extra. Every module that draws
calls :func:`pyplot` before it imports anything of matplotlib (``matplotlib.ticker``, ...)."""

from __future__ import annotations

from typing import Any

from sparsetool.errors import SparsetoolError

__all__ = ["PLOT_EXTRA", "pyplot"]

PLOT_EXTRA = "pip install 'sparsetool[plot]' (or pip install -e '.[plot]' in a source checkout)"


def pyplot(doing: str = "drawing a plot") -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a SparsetoolError that says what needed it
    (``doing``) and how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SparsetoolError(
            f"{doing} needs matplotlib, which is not installed: {PLOT_EXTRA}"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
