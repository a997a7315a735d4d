"""Sparse encodings: how a pruned weight looks on disk (:func:`encode`), and back (:func:`decode`).

| encoding | stored tensors |
|---|---|
| ``zeros``   | ``<name>``: pruned entries +0.0 (never -0.0) |
| ``mask``    | ``<name>`` as zeros, plus bool ``<name>_mask`` (True = kept), Cerebras Model Zoo 2.2+ |
| ``nan``     | ``<name>``: pruned entries NaN (the "sparse sentinel" of Cerebras Model Zoo 1.7-1.9) |
| ``bitmask`` | compressed-tensors sparse-bitmask: ``<module>.shape/.compressed/.bitmask/.row_offsets`` |

>>> w = torch.tensor([[1.0, -0.0], [0.0, 2.0]])
>>> m = torch.tensor([[True, False], [False, True]])
>>> [(n, t.tolist()) for n, t in encode("x.weight", w, m, "nan")]
[('x.weight', [[1.0, nan], [nan, 2.0]])]
>>> [n for n, _ in encode("x.weight", w, m, "bitmask")]
['x.shape', 'x.compressed', 'x.bitmask', 'x.row_offsets']
"""

from __future__ import annotations

import numpy as _np
import torch

from sparsetool.checkpoint import bitmask as bm
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.reader import MASK_SUFFIX, Checkpoint, LogicalTensor
from sparsetool.checkpoint.zeros import has_bits, int_bits
from sparsetool.errors import CheckpointError, SparsetoolError
from sparsetool.util.wording import plural

ENCODINGS = ("zeros", "mask", "nan", "bitmask")


def may_hold_nan(t: torch.Tensor) -> bool:
    """False only when ``t`` certainly holds no NaN.

    A sum is NaN whenever any term is, and a reduction is several times faster than ``isnan``
    over the tensor; only a non-finite sum (NaN, inf, or overflow) needs the exact check.
    """
    if not t.dtype.is_floating_point or t.numel() == 0:
        return False
    if t.element_size() == 1:  # fp8: no sum on CPU, and the tensors are small; ask exactly
        return bool(torch.isnan(t).any())
    return not bool(torch.isfinite(t.sum()))


def _check_encoding(encoding: str) -> None:
    if encoding not in ENCODINGS:
        raise SparsetoolError(f"unknown encoding {encoding!r}; use one of: {', '.join(ENCODINGS)}")


def bitmask_module(name: str, shape: tuple[int, ...] | torch.Size) -> str:
    """Module prefix of a weight for the bitmask layout; errors for what compressed-tensors would not compress."""
    if not name.endswith(".weight"):
        raise SparsetoolError(
            f"tensor {name}: the bitmask encoding applies only to tensors named '<module>.weight' "
            "(as compressed-tensors does); use --encoding zeros, mask or nan for it"
        )
    if len(shape) != 2:
        raise SparsetoolError(
            f"tensor {name}: the bitmask encoding takes 2-D weights only, this one has shape "
            f"{list(shape)}; use --encoding zeros, mask or nan, or exclude it"
        )
    return name[: -len(".weight")]


def encoded_specs(lt_name: str, dtype: torch.dtype, shape: tuple[int, ...], nnz: int, encoding: str) -> list[TensorSpec]:
    """The stored tensors ``encode`` will produce, known before the data is.

    For ``bitmask``, ``nnz`` must be the number of entries that are non-zero *after* masking
    (``stored_nonzeros(dense, mask)``): a kept weight that is exactly 0 is not stored, as in
    compressed-tensors.

    >>> [(s.name, s.dtype, s.shape) for s in encoded_specs("l.weight", torch.bfloat16, (3, 10), 7, "bitmask")]
    [('l.shape', torch.int64, (2,)), ('l.compressed', torch.bfloat16, (7,)), ('l.bitmask', torch.uint8, (3, 2)), ('l.row_offsets', torch.int64, (3,))]
    """
    _check_encoding(encoding)
    shape = tuple(int(d) for d in shape)
    if encoding in ("zeros", "nan"):
        return [TensorSpec(lt_name, dtype, shape)]
    if encoding == "mask":
        return [TensorSpec(lt_name, dtype, shape), TensorSpec(lt_name + MASK_SUFFIX, torch.bool, shape)]
    module = bitmask_module(lt_name, shape)
    rows, cols = shape
    return [
        TensorSpec(module + ".shape", torch.int64, (2,)),
        TensorSpec(module + ".compressed", dtype, (int(nnz),)),
        TensorSpec(module + ".bitmask", torch.uint8, (rows, bm.packed_cols(cols))),
        TensorSpec(module + ".row_offsets", torch.int64, (rows,)),
    ]


def stored_nonzeros(dense: torch.Tensor, mask: torch.Tensor | None) -> int:
    """How many values the bitmask encoding stores for this tensor (the ``nnz`` of encoded_specs)."""
    keep = bm.nonzero_mask(dense)
    if mask is not None:
        keep &= mask.to(torch.bool)
    return int(torch.count_nonzero(keep))


def bit_maskable(t: torch.Tensor) -> bool:
    """Can ``zero_pruned``/``fill_pruned_nan`` work on the raw bits of ``t``?"""
    return has_bits(t)


STREAMED = ("zeros", "mask", "nan")
"""Encodings whose stored tensors can be written piece by piece (:func:`encode_piece`)."""


def nan_bits(dtype: torch.dtype) -> int:
    """The bit pattern (a signed integer of the type's width) of NaN in a float ``dtype``."""
    return int(int_bits(torch.tensor(float("nan"), dtype=dtype)).item())


def encode_piece(encoding: str, bits: _np.ndarray, keep: _np.ndarray,
                 nan: int = 0) -> list[_np.ndarray]:
    """One piece of each stored tensor of a ``STREAMED`` encoding, from the raw bits (a flat
    signed integer array) and the bool mask (True = kept) of the same positions: the values with
    pruned entries +0.0 (NaN, whose bits ``nan`` gives, for ``nan``), and for ``mask`` the mask
    bytes too. The same bytes :func:`encode` writes for those positions.

    >>> bits = _np.array([0x3F80, -0x4080, -0x8000], dtype=_np.int16)  # 1.0, -1.0, -0.0 in bf16
    >>> [p.tolist() for p in encode_piece("mask", bits, _np.array([True, False, True]))]
    [[16256, 0, -32768], [1, 0, 1]]
    """
    values = _np.multiply(bits, keep)  # an integer multiply: kept bits unchanged, others 0
    if encoding == "nan":
        values |= _np.multiply(~keep, _np.array(nan, dtype=values.dtype), dtype=values.dtype)
    if encoding == "mask":
        return [values, keep.view(_np.uint8)]
    return [values]


def zero_pruned(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t`` where ``keep``, all-zero bits (+0.0) elsewhere; kept bits unchanged. ``t`` is not modified.

    Done as an integer multiply by the mask on the raw bits in numpy (:func:`encode_piece`),
    several times faster than ``masked_fill`` on bf16/fp16 on CPU, and exact: -0.0 and NaN survive
    where kept.

    >>> zero_pruned(torch.tensor([-1.5, -2.0, -0.0]), torch.tensor([True, False, True]))
    tensor([-1.5000,  0.0000, -0.0000])
    """
    return _on_bits(t, keep, "zeros")


def fill_pruned_nan(t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``t`` where ``keep``, NaN elsewhere (on the raw bits, as :func:`zero_pruned`)."""
    return _on_bits(t, keep, "nan")


def _on_bits(t: torch.Tensor, keep: torch.Tensor, encoding: str) -> torch.Tensor:
    if not bit_maskable(t):
        return t.masked_fill(~keep, 0 if encoding == "zeros" else float("nan"))
    bits = int_bits(t.contiguous()).reshape(-1).numpy()
    nan = nan_bits(t.dtype) if encoding == "nan" else 0
    values = encode_piece(encoding, bits, keep.contiguous().reshape(-1).numpy(), nan)[0]
    return torch.from_numpy(values).view(t.dtype).reshape(t.shape)


def _zeros(name: str, dense: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    if mask is None:
        return dense
    # pruned entries get +0.0 bits, so a pruned -0.0 becomes +0.0
    return zero_pruned(dense, mask)


def check_encodable(name: str, dense: torch.Tensor, mask: torch.Tensor | None, encoding: str) -> torch.Tensor | None:
    """Refuse what ``encoding`` cannot represent; return the mask as bool (or None)."""
    _check_encoding(encoding)
    if mask is not None:
        if tuple(mask.shape) != tuple(dense.shape):
            raise SparsetoolError(f"tensor {name}: mask shape {list(mask.shape)} differs from weight shape {list(dense.shape)}")
        mask = mask.to(torch.bool)
    if encoding == "nan":
        if not dense.dtype.is_floating_point:
            raise SparsetoolError(f"tensor {name}: the nan encoding needs a floating-point tensor, this one is {dense.dtype}; use --encoding zeros or mask")
        if may_hold_nan(dense):
            nan = torch.isnan(dense)
            kept_nan = nan if mask is None else nan & mask
            if bool(kept_nan.any()):
                raise SparsetoolError(
                    f"tensor {name} already holds {plural(int(kept_nan.sum()), 'NaN value')} at kept positions; "
                    "the nan encoding would make them look pruned. Use --encoding zeros, mask or bitmask"
                )
    if encoding == "bitmask":
        bitmask_module(name, tuple(dense.shape))
    return mask


def encode(name: str, dense: torch.Tensor, mask: torch.Tensor | None, encoding: str) -> list[tuple[str, torch.Tensor]]:
    """The stored tensors (name, tensor) of one logical tensor under ``encoding``.

    ``mask`` is True where kept, or None for "nothing pruned". ``dense`` need not be masked
    already: entries where ``mask`` is False are overwritten (+0.0, or NaN for ``nan``) in the
    one pass that builds the output, so callers should not mask it themselves. ``dense`` itself
    is never modified. Order of the result matches ``encoded_specs``.
    """
    mask = check_encodable(name, dense, mask, encoding)
    if encoding == "zeros":
        return [(name, _zeros(name, dense, mask))]
    if encoding == "mask":
        full = mask if mask is not None else torch.ones(dense.shape, dtype=torch.bool)
        return [(name, _zeros(name, dense, mask)), (name + MASK_SUFFIX, full.contiguous())]
    if encoding == "nan":
        if mask is None:
            return [(name, dense)]
        return [(name, fill_pruned_nan(dense, mask))]
    module = bitmask_module(name, tuple(dense.shape))
    masked = _zeros(name, dense, mask)
    values, bits, offsets = bm.compress(masked)
    return [
        (module + ".shape", torch.tensor(list(dense.shape), dtype=torch.int64)),
        (module + ".compressed", values),
        (module + ".bitmask", bits),
        (module + ".row_offsets", offsets),
    ]


def decode(ckpt: Checkpoint, lt: LogicalTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(dense values, mask) of one logical tensor of an open checkpoint, whatever its encoding.

    Dense has pruned entries +0.0 (NaN sentinels and pruned -0.0 included). Mask is True
    where kept, or None when the tensor carries no sparsity encoding (a plain tensor
    without NaN; zeros alone are just values).
    """
    if lt.encoding == "plain":  # zeros, or nan (known only from the data)
        t = ckpt.read_stored(lt.stored[0])
        if may_hold_nan(t):
            nan = torch.isnan(t)
            if bool(nan.any()):
                keep = ~nan
                return zero_pruned(t, keep), keep
        return t, None
    if lt.encoding == "mask":
        w = ckpt.read_stored(lt.stored[0])
        m = ckpt.read_stored(lt.stored[1])
        if w.shape != m.shape:
            raise CheckpointError(
                f"{ckpt.path}: mask {lt.stored[1]!r} has shape {list(m.shape)} but weight "
                f"{lt.stored[0]!r} has shape {list(w.shape)}; fix or drop the mask tensor"
            )
        # any non-zero byte means kept (a bool byte other than 0/1 is not a valid torch bool)
        m = m.view(torch.uint8) != 0 if m.dtype == torch.bool else m != 0
        return zero_pruned(w, m), m
    _shape_name, comp_name, bits_name, _offs = lt.stored
    values = ckpt.read_stored(comp_name)
    keep = bm.unpack(ckpt.read_stored(bits_name), list(lt.shape))
    n = int(keep.sum())
    if n != values.numel():
        raise CheckpointError(
            f"{ckpt.path}: bitmask {bits_name!r} marks {n} non-zeros but {comp_name!r} holds "
            f"{values.numel()} values: corrupt bitmask group"
        )
    # -0.0 values would be "stored zeros"; compressed-tensors never stores them, but a
    # hand-made file might: keep them as stored values, the mask says they are kept.
    return bm.scatter(values, keep), keep
