"""Zero tests on the bit patterns of float tensors.

A float comparison on bf16 runs several times slower on CPU than an integer test of the same
memory in numpy, and the integer view also tells -0.0 (only the sign bit set) from +0.0. Both
count as zero here: a pruned weight may have been written as either.
"""

from __future__ import annotations

import numpy as np
import torch

from sparsetool.checkpoint.bits import count_nonzero_bits
from sparsetool.checkpoint.dtypes import INT_VIEW, int_view


def has_bits(t: torch.Tensor) -> bool:
    """Can ``t``'s memory be seen as one signed integer per element (a CPU, non-complex type of
    1, 2, 4 or 8 bytes)?"""
    return t.element_size() in INT_VIEW and not t.is_complex() and t.device.type == "cpu"


def int_bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as signed integers of the same width (``t`` contiguous, ``has_bits(t)``).

    >>> int_bits(torch.tensor([-0.0, 1.0], dtype=torch.bfloat16)).tolist()
    [-32768, 16256]
    """
    return t.view(int_view(t.element_size()))


def tensor_bits(t: torch.Tensor) -> np.ndarray | None:
    """The bit patterns of a CPU float tensor as a numpy integer array (no copy if contiguous)."""
    if not t.is_floating_point() or not has_bits(t):
        return None
    return int_bits(t.contiguous()).numpy()


def count_nonzero_values(t: torch.Tensor) -> int:
    """Entries of ``t`` that are not zero (-0.0 is zero; NaN is not), fast for bool and floats.

    >>> count_nonzero_values(torch.tensor([0.0, -0.0, 1.5, float("nan")]))
    2
    """
    if t.dtype == torch.bool and t.device.type == "cpu":
        return int(np.count_nonzero(t.contiguous().numpy()))
    bits = tensor_bits(t)
    if bits is None:
        return int(torch.count_nonzero(t))
    return count_nonzero_bits(bits.reshape(-1))


def negative_zeros(t: torch.Tensor) -> torch.Tensor | None:
    """Where ``t`` holds -0.0 (bool mask), or None if nowhere. -0.0 is the bit pattern with only
    the sign bit set, so on the integer view it is the type's minimum (a numpy test, far faster
    than float comparisons on bf16)."""
    if not t.is_floating_point():
        return None
    bits = tensor_bits(t)
    if bits is not None:
        negative_zero = np.iinfo(bits.dtype).min
        if not (bits == negative_zero).any():
            return None
        return torch.from_numpy(bits == negative_zero)
    found = (t == 0) & torch.signbit(t)
    return found if bool(found.any()) else None
