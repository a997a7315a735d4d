"""Keep counts and option checks shared by every pruning path (no torch needed).

"Sparsity S" means ``round(S * numel)`` zeros, so a tensor keeps ``numel - round(S * numel)``;
"prune a fraction F of the remaining non-zeros" (one step of iterative magnitude pruning,
Han et al. 2015; Frankle & Carbin 2019) keeps ``nnz - round(F * nnz)``. ``round`` is Python's:
halves go to the even integer.
"""

from __future__ import annotations

from sparsetool.errors import SparsetoolError

__all__ = ["check_sparsity", "check_fraction", "sparsity_keep", "fraction_keep"]


def check_sparsity(value: float, option: str = "--sparsity") -> float:
    """Return ``value`` if it is a sparsity (a fraction of zeros, 0 <= S <= 1), else raise.

    >>> check_sparsity(0.75)
    0.75
    >>> check_sparsity(1.5)
    Traceback (most recent call last):
    ...
    sparsetool.errors.SparsetoolError: --sparsity must be a number from 0 to 1 (the fraction of weights set to zero), got 1.5; for example --sparsity 0.75
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value <= 1):
        raise SparsetoolError(
            f"{option} must be a number from 0 to 1 (the fraction of weights set to zero), "
            f"got {value!r}; for example {option} 0.75"
        )
    return float(value)


def check_fraction(value: float, option: str = "--fraction") -> float:
    """Return ``value`` if it is a pruning fraction (0 <= F < 1), else raise.

    F is the fraction of the *remaining* non-zeros to prune in one iterative step; F = 1 would
    prune everything and is refused (use a sparsity of 1 for that).

    >>> check_fraction(0.2)
    0.2
    >>> check_fraction(1.0)
    Traceback (most recent call last):
    ...
    sparsetool.errors.SparsetoolError: --fraction must be at least 0 and below 1 (the fraction of the remaining non-zeros to prune), got 1.0; for example --fraction 0.2
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < 1):
        raise SparsetoolError(
            f"{option} must be at least 0 and below 1 (the fraction of the remaining non-zeros "
            f"to prune), got {value!r}; for example {option} 0.2"
        )
    return float(value)


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
