"""What a shrink run holds beside the calibration pass, in bytes, planned before any text runs.

The pass's part (the process, one block, the windows' hidden states at both ends of a block) is
:func:`sparsetool.ops.calibration.pass_memory`; each kind of shrink adds what it gathers:

- ``--ffn``/``--heads`` with reconstruction (:func:`widths_statistics`): a block's ``X^T X`` of
  the down projection's inputs (``d_ff x d_ff``, float64) and of the output projection's
  (``heads x head_dim`` square), each twice (the windows fitted on and those held back), held
  together while the windows run, with one window's product being added; then each refit beside
  them (:func:`refit_solve_bytes`: choosing its damping, then the solve on their sum). Without
  reconstruction the scores are a few numbers per channel.
- ``--hidden`` with reconstruction (:func:`renorm_bytes`): in its own pass, the sums of the two
  norms whose outputs the block's layers read (``H``, ``X``, ``H'``: ``d^2``, ``d x kept``,
  ``kept^2`` float64) and the refit of its widest reader beside them.
- ``--blocks`` (:func:`blocks_statistics`, :func:`blocks_held`): angular distance keeps the
  inputs of the last N blocks; ReplaceMe's fit keeps the MLP output and the hidden states before
  the run being replaced, and that run's map sums (``M^T M``, ``M^T Y``: ``d x d`` float64, for
  the windows fitted on and those held back) until it ends and its map is chosen, solved and
  folded into a down projection.
- ``--experts``: the experts' routed inputs (:func:`sparsetool.ops.calibration.routed_bytes`)
  and the kept experts' copy of a block's experts.

Each constant names what it counts; ``benchmarks/RESULTS.md`` compares the plan with the peak.
"""

from __future__ import annotations

__all__ = [
    "blocks_held",
    "blocks_statistics",
    "gram_bytes",
    "refit_solve_bytes",
    "renorm_bytes",
    "widths_statistics",
]

FLOAT64 = 8  # the refits' sums and solves are float64
GRAM_ADDING = 1  # one window's x^T x beside the sum it is added to (in place)
HELD_SETS = 2  # every sum twice: over the windows fitted on and over those held back
SOLVE_SQUARES = 4  # H[K, K] (dampened), its eigenvectors (or the solver's factor), the held-back
# H[K, K] in their basis, and the eigensolver's workspace
SOLVE_MERGED = 1  # H over every window, summed for the last solve
SOLVE_FULL = 4  # (out, in) float64: the weights with their bias, their error's difference and
# product, the refit written back at full width
SOLVE_KEPT = 6  # (out, kept) float64: W H[:, K], the plain slice and the held-back W Hh[:, K] in
# the eigenbasis, a damping's solution and its product, the final solution
REPLACEME_HELD = 2  # hidden-state sets: the MLP output before the run, and its block's output
MAP_SUMS = 2 * HELD_SETS  # a run's M^T M and M^T Y (d x d float64), fitted on and held back
MAP_SOLVE = 7  # choosing and solving a map: the dampened copy, its right side, T, the identity,
# M^T M T, and the merged M^T M and M^T Y (d x d float64)
FOLD_COPIES = 2  # folding a map: the down projection in float64, and its product
READ_NORMS = 2  # norms a block's layers read: attention's and the FFN's
RENORM_FULL = 2  # (out, d) float64 of a reader's refit: its weights, and their product with H
RENORM_KEPT = 5  # (out, kept) float64: W X, the solution, the plain slice, the error's products


def gram_bytes(n: int) -> int:
    """A :class:`~sparsetool.ops.shrink.refit.Gram` of ``n`` inputs: ``H`` and the sums."""
    return n * n * FLOAT64 + n * FLOAT64


def refit_solve_bytes(out: int, n: int, kept: int, bias: bool) -> int:
    """What :func:`~sparsetool.ops.shrink.refit.refit_columns` of a projection (``out`` x ``n``
    inputs, ``kept`` of them kept) holds beside its Gram: the squares of the kept inputs, the
    full-width and kept-width matrices, and ``H`` with its constant input (``bias``)."""
    squares = SOLVE_SQUARES * (kept + bias) ** 2 * FLOAT64
    augmented = HELD_SETS * (n + 1) ** 2 * FLOAT64 if bias else 0
    merged = SOLVE_MERGED * (n + bias) ** 2 * FLOAT64
    return squares + augmented + merged + (SOLVE_FULL * n + SOLVE_KEPT * kept) * out * FLOAT64


def widths_statistics(
    *,
    width: int,
    ffn: tuple[int, int] | None,
    heads: tuple[int, int] | None,
    bias: bool,
) -> int:
    """The most a block's refits hold at once: ``ffn`` (channels, kept) of the down projection
    and ``heads`` (inputs, kept) of the output projection (None: not refit), both writing
    ``width`` outputs; ``bias``: the down projection has one (GPT-2)."""
    grams = [HELD_SETS * gram_bytes(n) for n, _k in (p for p in (ffn, heads) if p is not None)]
    if not grams:
        return 0
    held = sum(grams)
    adding = max(n for n, _k in (p for p in (ffn, heads) if p is not None)) ** 2 * FLOAT64
    peak = held + GRAM_ADDING * adding
    if ffn is not None:
        peak = max(peak, held + refit_solve_bytes(width, ffn[0], ffn[1], bias))
    if heads is not None:  # the FFN's Gram is gone by then
        rest = held - (HELD_SETS * gram_bytes(ffn[0]) if ffn is not None else 0)
        peak = max(peak, rest + refit_solve_bytes(width, heads[0], heads[1], False))
    return peak


def renorm_bytes(width: int, kept: int, widest: int) -> int:
    """``--hidden``'s refit pass: the sums of :data:`READ_NORMS` norms over ``width`` channels
    (``kept`` kept), one window's products being added, or the refit of a reader of ``widest``
    outputs beside them (its dampened ``H'`` and the solver's factor)."""
    sums = (width * width + width * kept + kept * kept) * FLOAT64
    solve = SOLVE_SQUARES * kept * kept * FLOAT64
    solve += (RENORM_FULL * width + RENORM_KEPT * kept) * widest * FLOAT64
    return READ_NORMS * sums + max(sums, solve)


def blocks_statistics(*, width: int, ffn: int, runs: int, stored: int) -> int:
    """ReplaceMe's map of one removed run (its sums, ``width`` square; a run's map is solved as
    the run ends), one window's sums being added or the map being solved and folded into a down
    projection (``ffn`` x ``width``), and the folded projections of up to ``runs`` runs
    (``stored`` bytes per weight) waiting for the writer."""
    if runs == 0:
        return 0
    square = width * width * FLOAT64
    fold = FOLD_COPIES * ffn * width * FLOAT64
    waiting = runs * ffn * width * stored
    return MAP_SUMS * square + max(MAP_SUMS * square, MAP_SOLVE * square + fold) + waiting


def blocks_held(n: int, angular: bool, reconstruct: bool) -> int:
    """Hidden-state sets ``--blocks N`` keeps beside a block's two ends: the inputs of the last
    ``n`` blocks (angular distance), or ReplaceMe's two (the passes do not overlap)."""
    return max(n if angular else 0, REPLACEME_HELD if reconstruct else 0)
