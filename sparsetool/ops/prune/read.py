"""How prune reads a targeted tensor in its general path: the dense values and the mask of the
weights still alive, refusing NaN and inf.

A zero already counts as pruned (composing prunes never revives a weight). A plain tensor holding
NaN reads as the ``nan`` encoding (NaN = pruned) only if the input records that it was written in
that encoding; otherwise NaN, like inf, is an error naming the tensor. The fast path
(``stream.py``) learns the same from its histogram and hands such tensors over to here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.bits import nonzero_bits
from sparsetool.checkpoint.encodings import as_tensor, decode_array
from sparsetool.checkpoint.provenance import recorded_codec
from sparsetool.errors import SparsetoolError
from sparsetool.util.floatbits import F32_INF, FORMATS, fp32_bits
from sparsetool.util.wording import plural

if TYPE_CHECKING:
    import torch


def nonfinite_counts(values: np.ndarray, st: str) -> tuple[int, int]:
    """(NaN entries, +-inf entries) of float values of type ``st`` given by their bits. One pass
    when there are none (the largest magnitude is below that of inf)."""
    fmt = FORMATS[st]
    if fmt.fp8 is not None:  # fp8: on the exact fp32 patterns (some have no inf, FNUZ has 0x80)
        magnitude, inf = fp32_bits(values, st) & 0x7FFF_FFFF, F32_INF
    else:
        if fmt.inf is None:  # every format but fp8 has an inf
            raise AssertionError(f"{st} has no inf")
        magnitude, inf = values & np.array(fmt.magnitude).astype(values.dtype), fmt.inf
    if magnitude.size == 0 or int(magnitude.max()) < inf:
        return 0, 0
    return int(np.count_nonzero(magnitude > inf)), int(np.count_nonzero(magnitude == inf))


def _check_finite(
    ckpt: Checkpoint,
    lt: LogicalTensor,
    values: np.ndarray,
    mask: np.ndarray | None,
    nan_means_pruned: bool,
) -> None:
    """Refuse a targeted tensor holding NaN or +-inf: no magnitude ranks them (a NaN is neither
    large nor small, an inf would always be kept) and a mask would carry them into the output.

    The exception is an input recorded as written in the ``nan`` encoding, where NaN means pruned.
    """
    nan = 0
    if mask is not None and lt.encoding == "plain" and not nan_means_pruned:
        nan = lt.numel - int(
            np.count_nonzero(mask)
        )  # the reader took this tensor's NaNs for pruned weights
    inf = nonfinite_counts(values, lt.st_dtype)[1] if lt.floating else 0
    if nan or inf:
        found = " and ".join(
            plural(n, what) for n, what in ((nan, "NaN value"), (inf, "infinite value")) if n
        )
        raise SparsetoolError(
            f"{ckpt.path}: tensor {lt.name!r} holds {found}; prune refuses them (no "
            "magnitude ranks a NaN, an inf would always be kept): fix or re-export the weights, "
            "or leave the tensor out with --exclude. If its "
            "NaNs mark pruned weights (the nan encoding written without a sparsetool record), run "
            "'sparsetool densify' on it first and prune the dense copy"
        )


def read_alive(
    ckpt: Checkpoint, lt: LogicalTensor, *, nan_means_pruned: bool = False, writable: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(values as stored, a float's bits, in the tensor's shape; the bool mask of the weights
    still alive). Without an encoding, a zero already counts as pruned.

    A plain tensor holding NaN reads as the ``nan`` encoding (NaN = pruned); unless the input
    records that it was written in that encoding (``nan_means_pruned``) that is an error, as is
    an inf (:func:`_check_finite`). The values are mapped read-only unless ``writable``.
    """
    if lt.encoding == "plain" and lt.floating:
        values = ckpt.read_array(lt.stored[0], writable=writable).reshape(tuple(lt.shape))
        if nonfinite_counts(values, lt.st_dtype) == (0, 0):
            return values, nonzero_bits(values, floating=True)
    values, mask = decode_array(ckpt, lt, writable=writable)
    _check_finite(ckpt, lt, values, mask, nan_means_pruned)
    alive = nonzero_bits(values, floating=lt.floating)
    return values, alive if mask is None else mask & alive


def read_alive_tensors(
    ckpt: Checkpoint, lt: LogicalTensor, *, nan_means_pruned: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`read_alive` as torch tensors (the values in their own dtype), for the calibration
    methods."""
    values, alive = read_alive(ckpt, lt, nan_means_pruned=nan_means_pruned, writable=True)
    return as_tensor(values, lt.st_dtype), as_tensor(alive, "BOOL")


def recorded_nan_encoding(ckpt: Checkpoint) -> bool:
    recorded = recorded_codec(ckpt.metadata())
    return recorded is not None and recorded.nan_sentinel
