"""The encodings as records: one :class:`Codec` per encoding, with what its callers branch on.

How each encoding stores a pruned weight is in :mod:`sparsetool.checkpoint.encodings`; what the
rest of sparsetool needs to know about one (can it be written piece by piece, does the header
need each tensor's kept count, are pruned entries NaN, does config.json declare it) is here, so
nothing outside ``checkpoint/`` compares encoding names (``tests/test_structure.py``). No numpy,
no torch: option parsing reads the names.

>>> codec("bitmask").kept_counts_in_header, codec("nan").nan_sentinel, codec("mask").streamed
(True, True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsetool.errors import SparsetoolError

__all__ = [
    "Codec",
    "ZEROS",
    "MASK",
    "NAN",
    "BITMASK",
    "CODECS",
    "ENCODINGS",
    "DEFAULT_ENCODING",
    "codec",
]


@dataclass(frozen=True)
class Codec:
    """One encoding of pruned weights.

    ``streamed``: its stored tensors can be written piece by piece as the mask is made
    (:func:`~sparsetool.checkpoint.encodings.encode_piece`, prune's fast path).
    ``kept_counts_in_header``: a stored tensor's size is the tensor's kept count (bitmask's
    compressed values), so the header, written first, needs every count before any data.
    ``nan_sentinel``: pruned entries are stored as NaN (the input's NaN means pruned).
    ``side_mask``: a bool ``<name>_mask`` tensor (True = kept) is stored beside the values.
    ``compressed``: compressed-tensors groups, which config.json must declare
    (:func:`~sparsetool.checkpoint.config.bitmask_sparsity_config`).
    ``loader_problem``: why transformers' ``from_pretrained`` cannot load it, or None if it can.
    """

    name: str
    streamed: bool
    kept_counts_in_header: bool = False
    nan_sentinel: bool = False
    side_mask: bool = False
    compressed: bool = False
    loader_problem: str | None = None


ZEROS = Codec("zeros", streamed=True)
MASK = Codec("mask", streamed=True, side_mask=True)
NAN = Codec(
    "nan",
    streamed=True,
    nan_sentinel=True,
    loader_problem="transformers' from_pretrained loads the nan encoding as a model full of NaN",
)
BITMASK = Codec(
    "bitmask",
    streamed=False,
    kept_counts_in_header=True,
    compressed=True,
    loader_problem=(
        "transformers' from_pretrained cannot load the bitmask encoding (it "
        "asks for compressed-tensors, whose current releases dropped "
        "sparse-bitmask and re-initialise the pruned weights at random)"
    ),
)

CODECS: dict[str, Codec] = {c.name: c for c in (ZEROS, MASK, NAN, BITMASK)}

ENCODINGS = tuple(CODECS)

DEFAULT_ENCODING = ZEROS.name


def codec(name: str) -> Codec:
    """The record of the encoding ``name``; an error naming the encodings for any other name."""
    try:
        return CODECS[name]
    except KeyError:
        raise SparsetoolError(
            f"unknown encoding {name!r}; use one of: {', '.join(ENCODINGS)}"
        ) from None
