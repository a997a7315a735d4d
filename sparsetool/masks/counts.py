"""Keep counts shared by every pruning path (no torch needed).

"Sparsity S" means ``round(S * numel)`` zeros, so a tensor keeps ``numel - round(S * numel)``;
"prune a fraction F of the remaining non-zeros" (one step of iterative magnitude pruning,
Han et al. 2015; Frankle & Carbin 2019) keeps ``nnz - round(F * nnz)``. ``round`` is Python's:
halves go to the even integer.
"""

from __future__ import annotations

# The range checks live with the other shared options.
from sparsetool.util.options import check_fraction, check_sparsity

__all__ = ["sparsity_keep", "fraction_keep"]


def sparsity_keep(numel: int, sparsity: float) -> int:
    """How many of ``numel`` weights a sparsity keeps: ``numel - round(sparsity * numel)``.

    >>> sparsity_keep(10, 0.75), sparsity_keep(4, 0.5), sparsity_keep(7, 0.0)
    (2, 2, 7)
    """
    check_sparsity(sparsity, "sparsity")
    return int(numel) - round(sparsity * int(numel))


def fraction_keep(nnz: int, fraction: float) -> int:
    """How many of ``nnz`` remaining non-zeros survive pruning a ``fraction`` of them.

    One step of iterative magnitude pruning (Han et al. 2015; Frankle & Carbin 2019) keeps
    ``nnz - round(fraction * nnz)``.

    >>> fraction_keep(100, 0.2), fraction_keep(80, 0.2)
    (80, 64)
    """
    check_fraction(fraction, "fraction")
    return int(nnz) - round(fraction * int(nnz))
