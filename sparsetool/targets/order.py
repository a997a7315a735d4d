"""The one order in which tensors are listed: by layer as a number, then role, then name.

Checkpoint files keep tensor names in lexicographic order, so a 12-layer model reads layers 0, 1,
10, 11, 2, ... Every listing (``report``'s table, JSON and plot, ``simulate``'s layers, ``diff``)
sorts with :func:`tensor_sort_key` instead:

- tensors outside the transformer blocks that come before them (token and position embeddings)
  first, then the blocks by layer index (the first all-digit name component, compared as a
  number), then everything else outside the blocks (final norm, LM head);
- within a layer, roles in the fixed order of :data:`ROLE_ORDER` (q/k/v, attention output, FFN
  in, FFN out, router, then norms, biases, anything else), separate q, k and v projections as
  Q, K, V;
- then the name in natural order (``experts.2`` before ``experts.10``).

Torch-free, like the rest of :mod:`sparsetool.targets`.

>>> names = ["h.10.mlp.c_fc.weight", "h.2.attn.c_attn.weight", "lm_head.weight", "wte.weight",
...          "h.2.mlp.c_proj.weight", "h.2.ln_1.weight", "h.2.attn.c_proj.weight"]
>>> sort_names(names)  # doctest: +NORMALIZE_WHITESPACE
['wte.weight', 'h.2.attn.c_attn.weight', 'h.2.attn.c_proj.weight', 'h.2.mlp.c_proj.weight',
 'h.2.ln_1.weight', 'h.10.mlp.c_fc.weight', 'lm_head.weight']
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from sparsetool.targets.roles import role as _role

ROLE_ORDER = (
    "qkv",
    "attn_out",
    "ffn_in",
    "ffn_out",
    "router",
    "norm",
    "bias",
    "embedding",
    "position",
    "head",
    "other",
)
"""Roles within one layer, in listing order (every value of :func:`sparsetool.targets.role`)."""

_BEFORE_BLOCKS = {"embedding", "position"}
SEPARATE_QKV = {
    **dict.fromkeys(
        [
            "q_proj",
            "query",
            "wq",
            "q_lin",
            "q",
            "q_attn",
            "proj_q_dense_layer",
            "q_a_proj",
            "q_b_proj",
        ],
        "Q",
    ),  # DeepSeek MLA: the query path, both factors
    **dict.fromkeys(["k_proj", "key", "wk", "k_lin", "k", "proj_k_dense_layer"], "K"),
    **dict.fromkeys(["v_proj", "value", "wv", "v_lin", "v", "proj_v_dense_layer"], "V"),
}
"""Separate query/key/value projections: leaf module name -> ``"Q"``, ``"K"`` or ``"V"``."""
_DIGITS = re.compile(r"(\d+)")


def layer_index(name: str) -> int | None:
    """The first all-digit dotted component of ``name`` (``h.3`` and ``layers.3`` -> 3), or None.

    >>> layer_index("model.layers.11.mlp.down_proj.weight"), layer_index("lm_head.weight")
    (11, None)
    """
    return next((int(p) for p in name.split(".") if p.isdigit()), None)


def natural_key(name: str) -> tuple[str | int, ...]:
    """``name`` with its digit runs compared as numbers: ``"a.10"`` sorts after ``"a.2"``.

    >>> sorted(["x.10", "x.2", "x.1"], key=natural_key)
    ['x.1', 'x.2', 'x.10']
    """
    parts = _DIGITS.split(name)  # str, int, str, int, ..., str: the same types at each position
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))


def qkv_leaf(name: str) -> str | None:
    """``"Q"``, ``"K"`` or ``"V"`` when ``name`` is a separate projection's parameter, else None.

    >>> qkv_leaf("model.layers.0.self_attn.k_proj.weight"), qkv_leaf("h.0.attn.c_attn.weight")
    ('K', None)
    """
    parts = name.lower().split(".")
    leaf = parts[-2] if len(parts) > 1 and parts[-1] in ("weight", "bias") else parts[-1]
    return SEPARATE_QKV.get(leaf)


def _qkv_rank(name: str) -> int:
    """0, 1, 2 for a separate q, k or v projection; 3 for a fused one (or anything else)."""
    return "QKV".find(qkv_leaf(name) or "-") % 4


def tensor_sort_key(
    name: str, role: str | None = None, shape: Sequence[int] = ()
) -> tuple[object, ...]:
    """The listing key of tensor ``name`` (``role`` as :func:`sparsetool.targets.role` gives it;
    computed from ``name`` and ``shape`` when None)."""
    if role is None:
        role = _role(name, tuple(shape))
    layer = layer_index(name)
    group = (0 if role in _BEFORE_BLOCKS else 2) if layer is None else 1
    rank = ROLE_ORDER.index(role) if role in ROLE_ORDER else len(ROLE_ORDER)
    sub = _qkv_rank(name) if role == "qkv" else 0
    return (group, layer if layer is not None else -1, rank, sub, natural_key(name))


def sort_names(names: Iterable[str]) -> list[str]:
    """``names`` in listing order (roles computed from the names alone)."""
    return sorted(names, key=tensor_sort_key)


__all__ = [
    "ROLE_ORDER",
    "SEPARATE_QKV",
    "qkv_leaf",
    "layer_index",
    "natural_key",
    "tensor_sort_key",
    "sort_names",
]
