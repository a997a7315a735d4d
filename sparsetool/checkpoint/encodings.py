"""Sparse encodings: how a pruned weight looks on disk (:func:`encode_array`), and back
(:func:`decode_array`).

Each encoding and its stored tensors:

- ``zeros``: ``<name>``: pruned entries +0.0 (never -0.0)
- ``mask``: ``<name>`` as zeros, plus bool ``<name>_mask`` (True = kept), Cerebras Model Zoo 2.2+
- ``nan``: ``<name>``: pruned entries NaN (the "sparse sentinel" of Cerebras Model Zoo 1.7-1.9)
- ``bitmask``: compressed-tensors sparse-bitmask:
  ``<module>.shape/.compressed/.bitmask/.row_offsets``

The codecs work in numpy on the values as stored (floats as the signed integers of their bit
patterns, :mod:`sparsetool.util.floatbits`), so ``prune`` never imports torch. :func:`encode` and
:func:`decode` are the same codecs for torch tensors (the calibration methods, eval, ``load``).

>>> bits = np.array([[0x3F80, -0x8000], [0, 0x4000]], dtype=np.int16)  # bf16 [[1, -0], [0, 2]]
>>> keep = np.array([[True, False], [False, True]])
>>> [(n, a.tolist()) for n, a in encode_array("x.weight", bits, "BF16", keep, "nan")]
[('x.weight', [[16256, 32704], [32704, 16384]])]
>>> [n for n, _ in encode_array("x.weight", bits, "BF16", keep, "bitmask")]
['x.shape', 'x.compressed', 'x.bitmask', 'x.row_offsets']
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from sparsetool.checkpoint import bitmask as bm
from sparsetool.checkpoint import dtypes
from sparsetool.checkpoint.bits import nonzero_bits
from sparsetool.checkpoint.codecs import codec
from sparsetool.checkpoint.format import TensorSpec
from sparsetool.checkpoint.reader import MASK_SUFFIX, Checkpoint, LogicalTensor
from sparsetool.errors import CheckpointError, SparsetoolError
from sparsetool.util.floatbits import FORMATS, is_nan
from sparsetool.util.wording import plural

if TYPE_CHECKING:
    import torch


def loader_warning(encoding: str, out: Any, command: str) -> str | None:
    """The warning for a Hugging Face directory ``out`` that ``command`` (prune, train) writes in
    ``encoding``, if transformers cannot load that encoding (its codec's ``loader_problem``,
    tests/checkpoint/test_loaders.py); None if it can."""
    problem = codec(encoding).loader_problem
    if problem is None:
        return None
    return (
        f"{problem}; sparsetool.load and `sparsetool eval` read it. For "
        f"transformers run `sparsetool densify {out} -o DENSE_DIR`, or {command} with "
        "--encoding zeros or mask"
    )


def bitmask_module(name: str, shape: tuple[int, ...]) -> str:
    """Module prefix of a weight for the bitmask layout; errors for what compressed-tensors would
    not compress."""
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


def encoded_specs(
    lt_name: str, dtype: Any, shape: tuple[int, ...], nnz: int, encoding: str
) -> list[TensorSpec]:
    """The stored tensors ``encode_array`` will produce, known before the data is (``dtype``: the
    values' type, a safetensors name or a torch dtype).

    For ``bitmask``, ``nnz`` must be the number of entries that are non-zero *after* masking
    (:func:`stored_count`): a kept weight that is exactly 0 is not stored, as in compressed-tensors.

    >>> [
    ...     (s.name, s.dtype, s.shape)
    ...     for s in encoded_specs("l.weight", "BF16", (3, 10), 7, "bitmask")
    ... ]
    [('l.shape', 'I64', (2,)), ('l.compressed', 'BF16', (7,)), ('l.bitmask', 'U8', (3, 2)),
    ('l.row_offsets', 'I64', (3,))]
    """
    codec(encoding)  # an unknown name is an error
    st = dtypes.st_name(dtype)
    shape = tuple(int(d) for d in shape)
    if encoding in ("zeros", "nan"):
        return [TensorSpec(lt_name, st, shape)]
    if encoding == "mask":
        return [TensorSpec(lt_name, st, shape), TensorSpec(lt_name + MASK_SUFFIX, "BOOL", shape)]
    module = bitmask_module(lt_name, shape)
    rows, cols = shape
    return [
        TensorSpec(module + ".shape", "I64", (2,)),
        TensorSpec(module + ".compressed", st, (int(nnz),)),
        TensorSpec(module + ".bitmask", "U8", (rows, bm.packed_cols(cols))),
        TensorSpec(module + ".row_offsets", "I64", (rows,)),
    ]


def _floating(st: str) -> bool:
    return st in FORMATS


def stored_count(values: np.ndarray, st: str, mask: np.ndarray | None) -> int:
    """How many values the bitmask encoding stores for these values under ``mask`` (the ``nnz``
    of :func:`encoded_specs`)."""
    keep = nonzero_bits(values, floating=_floating(st))
    if mask is not None:
        keep &= mask
    return int(np.count_nonzero(keep))


def nan_bits(st: str) -> int:
    """The bit pattern (a signed integer of the type's width) of NaN in float type ``st``."""
    return FORMATS[st].nan


def encode_piece(
    encoding: str, bits: np.ndarray, keep: np.ndarray, nan: int = 0
) -> list[np.ndarray]:
    """One piece of each stored tensor of a ``streamed`` encoding
    (:class:`~sparsetool.checkpoint.codecs.Codec`), from the raw values (a flat integer array: a
    float's bits) and the bool mask (True = kept) of the same positions: the values with pruned
    entries +0.0 (NaN, whose bits ``nan`` gives, for ``nan``), and for ``mask`` the mask bytes too.
    The same bytes :func:`encode_array` writes for those positions.

    >>> bits = np.array([0x3F80, -0x4080, -0x8000], dtype=np.int16)  # 1.0, -1.0, -0.0 in bf16
    >>> [p.tolist() for p in encode_piece("mask", bits, np.array([True, False, True]))]
    [[16256, 0, -32768], [1, 0, 1]]
    """
    values = np.multiply(bits, keep)  # an integer multiply: kept bits unchanged, others 0
    if encoding == "nan":
        values |= np.multiply(~keep, np.array(nan, dtype=values.dtype), dtype=values.dtype)
    if encoding == "mask":
        return [values, keep.view(np.uint8)]
    return [values]


def check_encodable(
    name: str, values: np.ndarray, st: str, mask: np.ndarray | None, encoding: str
) -> None:
    """Refuse what ``encoding`` cannot represent."""
    codec(encoding)  # an unknown name is an error
    if mask is not None and tuple(mask.shape) != tuple(values.shape):
        raise SparsetoolError(
            f"tensor {name}: mask shape {list(mask.shape)} differs from weight shape "
            f"{list(values.shape)}"
        )
    if encoding == "nan":
        if not _floating(st):
            raise SparsetoolError(
                f"tensor {name}: the nan encoding needs a floating-point tensor, this one is "
                f"{dtypes.torch_name(st)}; use --encoding zeros or mask"
            )
        nan = is_nan(values, st)
        if mask is not None:
            nan &= mask
        found = int(np.count_nonzero(nan))
        if found:
            raise SparsetoolError(
                f"tensor {name} already holds {plural(found, 'NaN value')} at kept positions; "
                "the nan encoding would make them look pruned. Use --encoding zeros, mask or "
                "bitmask"
            )
    if encoding == "bitmask":
        bitmask_module(name, tuple(values.shape))


def encode_array(
    name: str, values: np.ndarray, st: str, mask: np.ndarray | None, encoding: str
) -> list[tuple[str, np.ndarray]]:
    """The stored tensors (name, array of the stored values) of one logical tensor under
    ``encoding``; ``values`` as stored (a float's bits), of type ``st``.

    ``mask`` is a bool array, True where kept, or None for "nothing pruned". ``values`` need not be
    masked already: entries where ``mask`` is False are overwritten (+0.0, or NaN for ``nan``) in
    the one pass that builds the output; ``values`` itself is never modified. The order of the
    result matches :func:`encoded_specs`.
    """
    check_encodable(name, values, st, mask, encoding)
    masked = values if mask is None else encode_piece("zeros", values, mask)[0]
    if encoding == "zeros":
        return [(name, masked)]
    if encoding == "mask":
        full = mask if mask is not None else np.ones(values.shape, dtype=bool)
        return [
            (name, masked),
            (name + MASK_SUFFIX, np.ascontiguousarray(full).reshape(full.shape)),
        ]
    if encoding == "nan":
        if mask is None:
            return [(name, values)]
        return [(name, encode_piece("nan", values, mask, nan_bits(st))[0])]
    module = bitmask_module(name, tuple(values.shape))
    stored, bits, offsets = bm.compress(masked, floating=_floating(st))
    return [
        (module + ".shape", np.array(values.shape, dtype=np.int64)),
        (module + ".compressed", stored),
        (module + ".bitmask", bits),
        (module + ".row_offsets", offsets),
    ]


def decode_array(
    ckpt: Checkpoint, lt: LogicalTensor, *, writable: bool = False
) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, mask) of one logical tensor of an open checkpoint, whatever its encoding: the
    values as stored (a float's bits) in the tensor's shape, pruned entries +0.0 (NaN sentinels
    and pruned -0.0 included); the mask True where kept, or None when the tensor carries no
    sparsity encoding (a plain tensor without NaN; zeros alone are just values). Read-only
    arrays mapped from the file unless ``writable`` or decoding made new ones.
    """
    shape = tuple(lt.shape)
    if lt.encoding == "plain":  # zeros, or nan (known only from the data)
        values = ckpt.read_array(lt.stored[0], writable=writable).reshape(shape)
        if _floating(lt.st_dtype):
            nan = is_nan(values, lt.st_dtype)
            if nan.any():
                keep = ~nan
                return encode_piece("zeros", values, keep)[0], keep
        return values, None
    if lt.encoding == "mask":
        w = ckpt.read_array(lt.stored[0], writable=writable)
        m = ckpt.read_array(lt.stored[1])
        w_shape, m_shape = ckpt.entry(lt.stored[0]).shape, ckpt.entry(lt.stored[1]).shape
        if w_shape != m_shape:
            raise CheckpointError(
                f"{ckpt.path}: mask {lt.stored[1]!r} has shape {list(m_shape)} but weight "
                f"{lt.stored[0]!r} has shape {list(w_shape)}; fix or drop the mask tensor"
            )
        keep = (m != 0).reshape(shape)  # any non-zero byte means kept
        return encode_piece("zeros", w.reshape(shape), keep)[0], keep
    _shape_name, comp_name, bits_name, _offs = lt.stored
    values = ckpt.read_array(comp_name)
    keep = bm.unpack(ckpt.read_array(bits_name), list(shape))
    n = int(np.count_nonzero(keep))
    if n != values.size:
        raise CheckpointError(
            f"{ckpt.path}: bitmask {bits_name!r} marks {n} non-zeros but {comp_name!r} holds "
            f"{values.size} values: corrupt bitmask group"
        )
    # -0.0 values would be "stored zeros"; compressed-tensors never stores them, but a
    # hand-made file might: keep them as stored values, the mask says they are kept.
    return bm.scatter(values, keep), keep


# ----------------------------------------------------------------- the same codecs for torch


def as_array(t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A CPU torch tensor's values as stored (a float's bits, no copy if contiguous) and its
    type."""
    st = dtypes.st_name(t.dtype)
    t = t.detach().cpu().contiguous()
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t = t.view(dtypes.int_view(t.element_size()))
    return t.numpy(), st


def as_tensor(values: np.ndarray, st: str) -> torch.Tensor:
    """A numpy array of stored values of type ``st`` as a torch tensor of that type (no copy if
    contiguous)."""
    import torch

    # np.ascontiguousarray makes a 0-d array 1-d: the reshape keeps the shape
    out = torch.from_numpy(np.ascontiguousarray(values)).reshape(values.shape)
    target = dtypes.to_torch(st)
    return out if out.dtype == target else out.view(target)


def _as_mask(mask: torch.Tensor | None, shape: tuple[int, ...], name: str) -> np.ndarray | None:
    if mask is None:
        return None
    if tuple(mask.shape) != shape:
        raise SparsetoolError(
            f"tensor {name}: mask shape {list(mask.shape)} differs from weight shape {list(shape)}"
        )
    m = mask.detach().cpu()
    if str(m.dtype) != "torch.bool":
        m = m != 0
    return m.contiguous().numpy()


def encode(
    name: str, dense: torch.Tensor, mask: torch.Tensor | None, encoding: str
) -> list[tuple[str, torch.Tensor]]:
    """:func:`encode_array` for a torch tensor and mask: the stored tensors as torch tensors."""
    values, st = as_array(dense)
    stored = encode_array(name, values, st, _as_mask(mask, tuple(values.shape), name), encoding)
    specs = encoded_specs(name, st, tuple(values.shape), 0, encoding)  # the stored types
    # encoded_specs gives every spec a safetensors name ("BF16"), never a torch dtype
    return [(n, as_tensor(a, cast(str, spec.dtype))) for (n, a), spec in zip(stored, specs)]


def stored_nonzeros(dense: torch.Tensor, mask: torch.Tensor | None) -> int:
    """:func:`stored_count` of a torch tensor and mask."""
    values, st = as_array(dense)
    return stored_count(values, st, _as_mask(mask, tuple(values.shape), "tensor"))


def decode(ckpt: Checkpoint, lt: LogicalTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`decode_array` as torch tensors (writable: mapped copy-on-write where nothing was
    decoded)."""
    values, mask = decode_array(ckpt, lt, writable=True)
    return as_tensor(values, lt.st_dtype), None if mask is None else as_tensor(mask, "BOOL")
