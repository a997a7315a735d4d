"""How prune reads a targeted tensor in its general path: the dense values and the mask of the
weights still alive, refusing NaN and inf.

A zero already counts as pruned (composing prunes never revives a weight). A plain tensor holding
NaN reads as the ``nan`` encoding (NaN = pruned) only if the input records that it was written in
that encoding; otherwise NaN, like inf, is an error naming the tensor. The fast path
(``stream.py``) learns the same from its histogram and hands such tensors over to here.
"""

from __future__ import annotations

import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.encodings import decode, may_hold_nan
from sparsetool.checkpoint.provenance import read_provenance
from sparsetool.checkpoint.zeros import nonzero_mask
from sparsetool.errors import SparsetoolError
from sparsetool.util.wording import plural


def _count_inf(t: torch.Tensor, chunk: int = 1 << 24) -> int:
    """+-inf entries of ``t`` (fp8 has no isinf kernel: it is widened a chunk at a time)."""
    if not t.is_floating_point():
        return 0
    if t.element_size() > 1:
        if t.numel() == 0:
            return 0
        lo, hi = torch.aminmax(t)  # one fast pass: both finite means no inf (and no NaN) anywhere
        if bool(torch.isfinite(lo)) and bool(torch.isfinite(hi)):
            return 0
        return int(torch.isinf(t).sum())
    flat = t.reshape(-1)
    return sum(int(torch.isinf(flat[i:i + chunk].float()).sum()) for i in range(0, flat.numel(), chunk))


def _check_finite(ckpt: Checkpoint, lt: LogicalTensor, dense: torch.Tensor,
                  mask: torch.Tensor | None, nan_means_pruned: bool) -> None:
    """Refuse a targeted tensor holding NaN or +-inf: no magnitude ranks them (a NaN is neither
    large nor small, an inf would always be kept) and a mask would carry them into the output.

    The exception is an input recorded as written in the ``nan`` encoding, where NaN means pruned.
    """
    nan = 0
    if mask is not None and lt.encoding == "plain" and not nan_means_pruned:
        nan = lt.numel - int(mask.sum())  # the reader took this tensor's NaNs for pruned weights
    inf = _count_inf(dense)
    if nan or inf:
        found = " and ".join(plural(n, what) for n, what in ((nan, "NaN value"), (inf, "infinite value"))
                             if n)
        raise SparsetoolError(
            f"{ckpt.path}: tensor {lt.name!r} holds {found}; prune refuses them (no "
            "magnitude ranks a NaN, an inf would always be kept): fix or re-export the weights, "
            "or leave the tensor out with --exclude. If its "
            "NaNs mark pruned weights (the nan encoding written without a sparsetool record), run "
            "'sparsetool densify' on it first and prune the dense copy"
        )


def read_alive(ckpt: Checkpoint, lt: LogicalTensor, *,
               nan_means_pruned: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense values, kept mask). Without an encoding, a zero already counts as pruned.

    A plain tensor holding NaN reads as the ``nan`` encoding (NaN = pruned); unless the input
    records that it was written in that encoding (``nan_means_pruned``) that is an error, as is
    an inf (:func:`_check_finite`).
    """
    if lt.encoding == "plain" and lt.floating and lt.dtype.itemsize > 1:
        dense = ckpt.read_stored(lt.stored[0])
        if not may_hold_nan(dense):  # a finite sum: no NaN and no inf anywhere, one pass
            return dense, nonzero_mask(dense)
    dense, mask = decode(ckpt, lt)
    _check_finite(ckpt, lt, dense, mask, nan_means_pruned)
    alive = nonzero_mask(dense)
    return dense, alive if mask is None else mask & alive


def recorded_nan_encoding(ckpt: Checkpoint) -> bool:
    return (read_provenance(ckpt.metadata()) or {}).get("encoding") == "nan"
