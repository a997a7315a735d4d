"""Which tensors of a checkpoint are pruned: one rule, planned once per checkpoint.

A checkpoint is planned once: :func:`plan_targets` reads every name, shape and dtype and returns a
:class:`TargetPlan` (name -> role, targeted or why not, input dimension and layout) that prune,
report, flops, simulate and train all consult, so ``--include``/``--exclude`` mean one thing
everywhere. The roles themselves (which names mean q/k/v, attention output, FFN in and out, for
every naming family, sparsetool's own GPT included) live in :mod:`sparsetool.targets.roles`.

This package does not import torch: ``dtype`` may be a safetensors dtype string (``"BF16"``), a
torch-style name (``"bfloat16"``, ``"torch.bfloat16"``) or a ``torch.dtype``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparsetool.checkpoint.dtypes import is_floating, torch_name
from sparsetool.errors import ConfigError
from sparsetool.targets.roles import (
    LINEAR_ROLES,
    ROLES,
    conv1d_layout,
    expert_index,
    experts_in_out,
    input_dim,
    is_routed_expert,
    role,
)
from sparsetool.util.options import parse_globs

__all__ = [
    "ROLES",
    "LINEAR_ROLES",
    "TargetEntry",
    "TargetPlan",
    "plan_targets",
    "role",
    "is_targeted",
    "is_floating",
    "input_dim",
    "conv1d_layout",
    "experts_in_out",
    "expert_index",
    "is_routed_expert",
    "STACKED_LAYOUTS",
    "tied_embedding",
    "tied_head_warning",
]

STACKED_LAYOUTS = ("stacked", "stacked_t")
"""The layouts of a fused experts tensor: one matrix per index of its first dimension."""


def _decide(
    name: str,
    shape: tuple[int, ...],
    dtype: Any,
    found_role: str,
    include: Sequence[str],
    exclude: Sequence[str],
    select: Sequence[str] | None,
) -> tuple[bool, str]:
    """(targeted, why): the one targeting rule, given the tensor's role."""
    if name.endswith("_mask"):
        return False, "a _mask side tensor"
    if not is_floating(dtype):
        return False, f"dtype {str(dtype).removeprefix('torch.')} is not floating-point"
    if len(shape) < 2:
        return False, "fewer than 2 dimensions"
    for pattern in exclude:
        if fnmatch.fnmatchcase(name, pattern):
            return False, f"--exclude '{pattern}'"
    for pattern in include:
        if fnmatch.fnmatchcase(name, pattern):
            return True, f"--include '{pattern}'"
    if select is not None:
        hit = next((g for g in select if fnmatch.fnmatchcase(name, g)), None)
        return (True, f"param_filter '{hit}'") if hit else (False, "no param_filter glob matches")
    if found_role in LINEAR_ROLES:
        return True, f"role {found_role}"
    return False, f"role {found_role} is not an attention/FFN matrix"


def is_targeted(
    name: str,
    shape: tuple[int, ...] | Sequence[int],
    dtype: Any,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> bool:
    """True if tensor ``name`` should be pruned (one tensor; for a checkpoint use
    :func:`plan_targets`).

    Default: floating tensors with at least two dimensions whose :func:`role` is one of
    :data:`LINEAR_ROLES` (q/k/v or fused qkv, attention output, FFN in/up/gate, FFN out/down).
    ``include`` and ``exclude`` are globs matched against the full name with
    :func:`fnmatch.fnmatchcase` (case-sensitive, ``*`` also crosses dots). ``include`` adds tensors
    of any role (say ``*wte*`` to prune the embedding), ``exclude`` removes them, and exclude wins.
    Whatever the globs say, only floating tensors with two or more dimensions are ever targeted, and
    never a ``*_mask`` side tensor: pruning a bias, a norm scale, an integer or bool tensor is not
    something a mask encoding can represent.

    >>> is_targeted("model.layers.0.mlp.down_proj.weight", (4096, 11008), "BF16")
    True
    >>> is_targeted("lm_head.weight", (32000, 4096), "BF16")
    False
    >>> is_targeted("lm_head.weight", (32000, 4096), "BF16", include=["lm_head.*"])
    True
    >>> is_targeted("model.layers.0.mlp.down_proj.weight", (4096, 11008), "BF16",
    ...             exclude=["*.layers.0.*"])
    False
    """
    shape = tuple(shape)
    return _decide(name, shape, dtype, role(name, shape), include, exclude, None)[0]


@dataclass(frozen=True)
class TargetEntry:
    """What the plan says about one tensor.

    ``input_dim`` is the axis holding input features (N:M groups run along it); ``layout`` says
    how the matrix is stored: ``linear`` (out, in), ``conv1d`` (in, out; GPT-2), ``stacked``
    (experts, out, in: input_dim 2), ``stacked_t`` (experts, in, out: input_dim 1; gpt-oss and
    Llama 4 store their fused experts so, :func:`experts_in_out`), ``kernel`` (out, in, ...) or
    ``vector`` (fewer than 2 dimensions). A ``stacked``/``stacked_t`` tensor holds one matrix per
    index of its first dimension, expert ``e``'s being ``tensor[e]`` (2-D; its input axis is
    ``input_dim - 1``): each is pruned as a matrix of its own. ``expert`` is the routed expert a
    per-expert tensor belongs to (``experts.5.w1`` -> 5, :func:`expert_index`), None for every
    other tensor (a fused one included: its experts are its first dimension).
    ``reason`` says why the tensor is (or is not) targeted, e.g. ``"role qkv"``,
    ``"--exclude '*.mlp.*'"`` or ``"dtype I64 is not floating-point"``.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str
    targeted: bool
    reason: str
    input_dim: int
    layout: str
    expert: int | None = None

    @property
    def experts(self) -> int:
        """How many expert matrices the tensor holds: its first dimension if fused (stacked),
        else 0."""
        return self.shape[0] if self.layout in STACKED_LAYOUTS else 0


@dataclass
class TargetPlan:
    """Every tensor of one checkpoint (or model) with its :class:`TargetEntry`, in the given order.

    >>> plan = plan_targets(
    ...     {"h.0.attn.c_attn.weight": ((8, 24), "F32"), "wte.weight": ((50, 8), "F32")}
    ... )
    >>> plan.targeted, plan["wte.weight"].reason
    (['h.0.attn.c_attn.weight'], 'role embedding is not an attention/FFN matrix')
    """

    entries: dict[str, TargetEntry]
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    conv1d: bool | None = None
    targeted: list[str] = field(init=False)
    recorded_by: str | None = None  # the command whose recorded globs these are (targets.recorded)
    dtype_skipped: list[str] = field(
        default_factory=list
    )  # targeted but for their (integer, bool) dtype
    tied_head: str | None = None  # the token embedding that is also the LM head (tied_embedding)
    experts_in_out: bool = False  # fused experts stored (experts, in, out) (experts_in_out)

    def __post_init__(self) -> None:
        self.targeted = [n for n, e in self.entries.items() if e.targeted]

    def __getitem__(self, name: str) -> TargetEntry:
        return self.entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __iter__(self) -> Iterator[TargetEntry]:
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def is_targeted(self, name: str) -> bool:
        return self.entries[name].targeted


def _layout(shape: tuple[int, ...], dim: int, found_role: str) -> str:
    if len(shape) < 2:
        return "vector"
    if len(shape) == 2:
        return "conv1d" if dim == 0 else "linear"
    if len(shape) == 3 and found_role in LINEAR_ROLES:
        return "stacked_t" if dim == 1 else "stacked"
    return "stacked" if found_role in LINEAR_ROLES else "kernel"


def _items(tensors: Any) -> Iterator[tuple[str, tuple[int, ...], Any]]:
    if isinstance(tensors, Mapping):
        for name, (shape, dtype) in tensors.items():
            yield str(name), tuple(int(x) for x in shape), dtype
        return
    for t in tensors:
        if isinstance(t, tuple):
            name, shape, dtype = t
        else:
            # anything with .name, .shape and .st_dtype or .dtype (a checkpoint's logical tensors)
            name, shape = t.name, t.shape
            dtype = torch_name(t.st_dtype) if hasattr(t, "st_dtype") else t.dtype
        yield str(name), tuple(int(x) for x in shape), dtype


def _examples(names: Sequence[str], roles: Mapping[str, str]) -> list[str]:
    """Three names that show the checkpoint's naming: a qkv, an FFN-in and an embedding first."""
    picked: list[str] = []
    for wanted in ("qkv", "ffn_in", "embedding", *ROLES):
        hit = next((n for n in names if roles[n] == wanted and n not in picked), None)
        if hit and len(picked) < 3:
            picked.append(hit)
    picked += [n for n in names if n not in picked][: 3 - len(picked)]
    return sorted(picked)


def tied_embedding(
    shapes: Mapping[str, tuple[int, ...]],
    roles: Mapping[str, str],
    config: Mapping[str, Any] | None,
) -> str | None:
    """The token embedding that is also the LM head, or None.

    A causal LM whose ``config.json`` ties the head to the input embedding
    (``tie_word_embeddings``, true or absent: absent means true for transformers' base config)
    stores the matrix once, under the embedding's name: the checkpoint holds no tensor of role
    ``head``. The embedding is the 2-D tensor of role ``embedding`` with ``vocab_size`` rows (the
    largest one when the config gives no vocabulary size). Without a config nothing is said, nor
    for a model without a head (``architectures`` naming only bare ``...Model`` classes).

    >>> shapes = {"model.embed_tokens.weight": (320, 32), "model.norm.weight": (32,)}
    >>> roles = {"model.embed_tokens.weight": "embedding", "model.norm.weight": "norm"}
    >>> tied_embedding(shapes, roles, {"tie_word_embeddings": True, "vocab_size": 320})
    'model.embed_tokens.weight'
    >>> tied_embedding(shapes, roles, {"tie_word_embeddings": False}) is None
    True
    """
    if not isinstance(config, Mapping):
        return None
    text = config.get("text_config")
    tie = config.get(
        "tie_word_embeddings",
        text.get("tie_word_embeddings", True) if isinstance(text, Mapping) else True,
    )
    if not tie or any(r == "head" for r in roles.values()):
        return None
    arch = config.get("architectures")
    if (
        isinstance(arch, list)
        and arch
        and all(isinstance(a, str) and a.endswith("Model") and "LMHead" not in a for a in arch)
    ):
        return None  # a bare encoder or decoder ("BertModel", "LlamaModel"): no head at all
    embeddings = [n for n, r in roles.items() if r == "embedding" and len(shapes[n]) == 2]
    vocab = config.get("vocab_size", text.get("vocab_size") if isinstance(text, Mapping) else None)
    if isinstance(vocab, int):
        embeddings = [n for n in embeddings if shapes[n][0] == vocab]
    if not embeddings:
        return None
    return max(embeddings, key=lambda n: (shapes[n][0] * shapes[n][1], n))


def tied_head_warning(plan: TargetPlan) -> str | None:
    """The warning for pruning the tied embedding (it prunes the LM head too), or None when the
    plan does not target it."""
    name = plan.tied_head
    if name is None or not plan.is_targeted(name):
        return None
    return (
        f"{name} is also the LM head (config.json ties them: tie_word_embeddings): pruning "
        "it prunes the output layer as well, and every loader (transformers, sparsetool "
        f"eval) computes the logits with the pruned matrix; leave it out with --exclude '{name}' "
        "to prune the blocks only"
    )


def plan_targets(
    tensors: Mapping[str, tuple[Sequence[int], Any]] | Iterable[Any],
    config: Mapping[str, Any] | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    *,
    select: Sequence[str] | None = None,
    source: str = "the checkpoint",
) -> TargetPlan:
    """Plan the targeting of one checkpoint: every tensor's role, whether it is pruned and why.

    ``tensors`` maps name -> (shape, dtype), or is an iterable of ``(name, shape, dtype)`` or of
    objects with ``name``, ``shape`` and ``dtype``. ``config`` is the ``config.json`` (it tells
    GPT-2's Conv1D layout from GPT-BigCode's, see :func:`conv1d_layout`, and the orientation of
    fused expert weights, see :func:`experts_in_out`). ``include`` adds
    tensors of any role, ``exclude`` removes tensors, exclude wins; both are
    :func:`fnmatch.fnmatchcase` globs over the full name and may be repeated (see
    :func:`is_targeted` for what is never targeted). ``select`` (the Model Zoo ``param_filter``)
    replaces the default roles by globs. The plan's ``dtype_skipped`` lists the tensors that would
    be targeted were they floating-point (quantized integer or bool weights). An ``include`` or
    ``exclude`` glob that matches no tensor name at all is a :class:`~sparsetool.errors.ConfigError`
    naming ``source``: it is almost always a typo, and silently pruning the default set instead
    would hide it.

    >>> plan_targets({"wte.weight": ((50, 8), "F32")}, include=["nomatch*"], source="m.safetensors")
    Traceback (most recent call last):
    ...
    sparsetool.errors.ConfigError: --include 'nomatch*' matches no tensor in m.safetensors; tensor
    names look like: wte.weight
    """
    include, exclude = parse_globs(include, "--include"), parse_globs(exclude, "--exclude")
    select = None if select is None else parse_globs(select, "select")
    items = list(_items(tensors))
    roles = {name: role(name, shape) for name, shape, _ in items}
    names = list(roles)
    tied = tied_embedding({name: shape for name, shape, _ in items}, roles, config)
    for option, globs in (("include", include), ("exclude", exclude)):
        for glob in globs:
            if not any(fnmatch.fnmatchcase(n, glob) for n in names):
                looks = ", ".join(_examples(names, roles)) if names else "(it holds no tensors)"
                head = (
                    f"; the LM head has no tensor of its own: config.json ties it to {tied} "
                    f"(tie_word_embeddings), which --{option} '{tied}' names, head and "
                    "embedding alike"
                    if tied and ("head" in glob.lower() or "embed_out" in glob)
                    else ""
                )
                raise ConfigError(
                    f"--{option} '{glob}' matches no tensor in {source}; "
                    f"tensor names look like: {looks}{head}"
                )
    conv1d = conv1d_layout(config)
    transposed = experts_in_out(config)
    entries: dict[str, TargetEntry] = {}
    dtype_skipped: list[str] = []
    for name, shape, dtype in items:
        found = roles[name]
        targeted, reason = _decide(name, shape, dtype, found, include, exclude, select)
        dim = input_dim(name, shape, conv1d=conv1d, known_role=found, experts_transposed=transposed)
        entries[name] = TargetEntry(
            name=name,
            shape=shape,
            dtype=str(dtype).removeprefix("torch."),
            role=found,
            targeted=targeted,
            reason=reason,
            input_dim=dim,
            layout=_layout(shape, dim, found),
            expert=expert_index(name),
        )
        if (
            not targeted
            and not is_floating(dtype)
            and _decide(name, shape, "F32", found, include, exclude, select)[0]
        ):
            dtype_skipped.append(name)
    return TargetPlan(
        entries,
        include,
        exclude,
        conv1d,
        dtype_skipped=dtype_skipped,
        tied_head=tied,
        experts_in_out=transposed,
    )
