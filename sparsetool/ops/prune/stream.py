"""prune's fast path: select and write one plain float tensor chunk by chunk, in two passes.

For the common case (magnitude, a plain bf16/fp16/fp32/fp64/fp8 tensor, the zeros, mask or nan
encoding) one pass over the tensor's magnitude keys (:func:`sparsetool.masks.kernel.scan`) gives
everything prune needs before writing: the histogram that fixes the exact threshold, the count of
zeros (so the non-zeros before pruning), and whether any entry is inf or NaN (then the general
path takes the tensor over, to refuse it or to read NaN as pruned). The second pass compares each
chunk's keys with the threshold and hands the chunk's mask to a sink that encodes the chunk and
writes it at its place in the output (:meth:`ShardWriter.parts`), on the pool's threads. No
full-size mask, masked copy or separate NaN/inf screen is ever made.

A fused experts tensor at layer scope is selected part by part (:func:`stream_top_parts`): each
expert's matrix keeps its own count, as if it were stored apart.

The masks are the kernel's (the same threshold, the same ties to the lower index), so the bytes
equal those of the general path: ``keep`` is capped at the non-zeros, and when it is, every
non-zero is kept and every zero (-0.0 included) is written +0.0, as the general path's "alive"
mask does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

from sparsetool.checkpoint import Checkpoint, LogicalTensor, encoded_specs
from sparsetool.checkpoint.codecs import codec
from sparsetool.checkpoint.encodings import encode_piece, nan_bits
from sparsetool.checkpoint.writer import ShardWriter
from sparsetool.masks.global_magnitude import TensorPlan, apply_threshold
from sparsetool.masks.kernel import Scan, Sink, scan, select_top
from sparsetool.masks.keys import Keys, magnitude_keys


def streams(lt: LogicalTensor, encoding: str) -> bool:
    """Can the fast path write this tensor in this encoding?"""
    return lt.encoding == "plain" and lt.floating and codec(encoding).streamed


def _sink(
    put: Callable[[int, int, memoryview], None], encoding: str, bits: np.ndarray, st: str
) -> Sink:
    """Encode positions [a, b) of the flat values ``bits`` under a chunk's mask and write them."""
    size = bits.itemsize
    nan = nan_bits(st) if codec(encoding).nan_sentinel else 0

    def sink(a: int, b: int, mask: np.ndarray) -> None:
        pieces = encode_piece(encoding, bits[a:b], mask, nan)
        # .data is memoryview(array), which numpy's stubs allow only from Python 3.12 on
        put(0, a * size, pieces[0].data.cast("B"))
        if len(pieces) > 1:
            put(1, a, pieces[1].data.cast("B"))

    return sink


class Scanned:
    """A plain float tensor read once: its raw values (flat bits), magnitude keys and
    :class:`Scan`."""

    def __init__(
        self,
        ckpt: Checkpoint | None,
        lt: LogicalTensor,
        *,
        copy: bool = False,
        bits: np.ndarray | None = None,
    ):
        self.lt = lt
        if bits is None:
            if ckpt is None:  # the callers give one of them
                raise AssertionError(f"{lt.name}: neither a checkpoint nor its bits")
            bits = ckpt.read_array(lt.stored[0])
        self.bits = bits
        self.keys: Keys = magnitude_keys(self.bits, dtype=lt.st_dtype)
        self.numel = self.bits.size
        # with copy, the same pass is the first of the selection (select_top)
        self.found: Scan = scan(self.keys, zeros=True, copy=copy)

    @classmethod
    def of_bits(cls, lt: LogicalTensor, bits: np.ndarray, *, copy: bool = False) -> Scanned:
        """The scan of ``bits``, a part of ``lt``'s flat values (one expert of a fused tensor)."""
        return cls(None, lt, copy=copy, bits=bits)

    @property
    def finite(self) -> bool:
        """No inf and no NaN anywhere (else the general path decides)."""
        return self.found.above_inf == 0

    @property
    def nonzero(self) -> int:
        """Non-zero entries (-0.0 is zero); meaningful when :attr:`finite`."""
        return self.numel - self.found.zeros


@contextlib.contextmanager
def _chunk_writer(
    sw: ShardWriter, lt: LogicalTensor, bits: np.ndarray, encoding: str
) -> Iterator[Sink]:
    """A kernel sink that writes ``lt``'s encoded tensors into ``sw`` chunk by chunk."""
    names = [s.name for s in encoded_specs(lt.name, lt.st_dtype, tuple(lt.shape), 0, encoding)]
    with sw.parts(*names) as put:
        yield _sink(put, encoding, bits, lt.st_dtype)


def stream_top(
    ckpt: Checkpoint, lt: LogicalTensor, sw: ShardWriter, keep: int, encoding: str
) -> tuple[int, int] | None:
    """Prune ``lt`` to its ``keep`` largest |w| straight into ``sw``: (non-zeros before, kept),
    or None, having written nothing, when the tensor holds inf or NaN."""
    scanned = Scanned(ckpt, lt, copy=True)
    if not scanned.finite:
        return None
    before = scanned.nonzero
    keep = min(keep, before)
    with _chunk_writer(sw, lt, scanned.bits, encoding) as sink:
        select_top(scanned.keys, keep, found=scanned.found, sink=sink)
    return before, keep


def stream_top_parts(
    ckpt: Checkpoint, lt: LogicalTensor, sw: ShardWriter, keeps: list[int], encoding: str
) -> tuple[int, int] | None:
    """:func:`stream_top` for a tensor cut along its first dimension into ``len(keeps)`` equal
    parts (a fused experts tensor, one matrix per expert): part ``e`` keeps its ``keeps[e]``
    largest |w|, chosen among its own weights only. Every part is scanned before anything is
    written, so a tensor holding inf or NaN anywhere is handed back (None) untouched."""
    bits = ckpt.read_array(lt.stored[0])
    size = lt.numel // len(keeps)
    parts: list[Scanned | None] = [
        Scanned.of_bits(lt, bits[e * size : (e + 1) * size], copy=True) for e in range(len(keeps))
    ]
    if not all(p is not None and p.finite for p in parts):
        return None
    before = kept = 0
    with _chunk_writer(sw, lt, bits, encoding) as sink:
        for e, keep in enumerate(keeps):
            part, parts[e] = parts[e], None  # its copy of the keys goes after its selection
            assert part is not None
            keep = min(keep, part.nonzero)
            before, kept = before + part.nonzero, kept + keep
            select_top(part.keys, keep, found=part.found, sink=_shifted(sink, e * size))
    return before, kept


def _shifted(sink: Sink, offset: int) -> Sink:
    """``sink`` for a part that starts at flat position ``offset``."""
    return lambda a, b, mask: sink(a + offset, b + offset, mask)


def stream_plan(
    ckpt: Checkpoint, lt: LogicalTensor, sw: ShardWriter, plan: TensorPlan, encoding: str
) -> int:
    """Write ``lt`` under its share of a global threshold (a tensor :class:`Scanned` finite in
    the first pass, whose histogram left its zeros out); the count kept."""
    if plan.threshold < 0:  # "keep every available weight": its zeros are not available
        plan = TensorPlan(0, 0, plan.kept)
    bits = ckpt.read_array(lt.stored[0])
    with _chunk_writer(sw, lt, bits, encoding) as sink:
        apply_threshold(bits, plan, sink=sink, dtype=lt.st_dtype)
    return plan.kept
