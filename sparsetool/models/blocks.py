"""A checkpoint as a language model run one transformer block at a time: sparsetool's GPT or a
Hugging Face causal LM, at any size.

The model is built as a skeleton whose parameters live on torch's ``meta`` device (shapes, no
memory); the buffers a model computes itself (rotary frequencies) are real. Weights are read from
the checkpoint by sparsetool's own reader when their turn comes (any encoding, any sharding, so
``nan`` and ``bitmask`` run exactly like ``zeros``) and dropped after:

- the *outer* weights (embeddings, position table, final norm) for the first pass, which turns
  token ids into the first block's inputs (:meth:`BlockModel.capture`), and again for the last;
- block ``i``'s weights while the hidden states pass through block ``i``
  (:meth:`BlockModel.load_block`, :meth:`BlockModel.run_block`, :meth:`BlockModel.release_block`);
- the LM head for the last pass only (:meth:`BlockModel.final_hidden` and
  :meth:`BlockModel.logits`).

Nothing that grows with depth stays resident.

A batch may be *packed* (:meth:`BlockModel.capture` with ``layouts``): several sequences that
share a prefix laid out as one row, the prefix once and each sequence's own tokens behind it, with
position ids restarting after the prefix for each and a segment id per token (0 for the prefix).
The model's own forward pass makes the position embeddings from those position ids; the attention
mask it passes each block (causal, sliding-window, chunked: whatever the model builds for a plain
sequence) is read at the tokens' positions and cut so a sequence's tokens see the prefix and
themselves only (:meth:`BlockModel.pack_masks`). Each token then gets what it would get in its own
sequence run alone. The first block's inputs are captured by a hook on
it: the model's own forward pass runs the embeddings, positions and masks, so every model family
transformers knows is handled by its own code. The last pass runs the model's forward again with
each block replaced by a stand-in that hands back the hidden states already computed, so the final
norm (and anything else the model does after its blocks) is the model's own code too.

:func:`sparsetool.models.open.open_model` builds one from a checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from sparsetool.checkpoint import Checkpoint
from sparsetool.checkpoint.encodings import decode
from sparsetool.checkpoint.zeros import count_nonzero_values, negative_zeros
from sparsetool.errors import SparsetoolError
from sparsetool.models.hf import Piece
from sparsetool.targets import is_floating, plan_targets

__all__ = ["BlockModel", "Call", "Encoded", "Unpackable", "find_blocks", "block_index"]

# Config keys of models that transform logits after the head (the chunked head would miss it).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass
class Encoded:
    """Token ids of a text, and how many UTF-8 bytes of it the first ``k`` tokens cover."""

    ids: list[int]
    byte_ends: Callable[[int], int]  # k tokens -> bytes of text they cover


@dataclass
class Call:
    """One batch on its way through the blocks: its token ids (B, T), the hidden states entering
    the next block (B, T, d), and the other arguments the model passes its blocks (position
    embeddings, attention mask), captured from the model's own forward pass."""

    ids: torch.Tensor
    hidden: torch.Tensor
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    # The blocks the model passes other arguments than block 0's (a full-attention block's mask
    # among sliding-window ones): block -> (args, kwargs).
    others: dict[int, tuple[tuple, dict]] = field(default_factory=dict)
    # A packed batch's position ids (B, T) (None: 0 .. T-1 in every row, the model's default).
    positions: torch.Tensor | None = None

    def arguments(self, block: int) -> tuple[tuple, dict]:
        """What the model passes block ``block`` beside the hidden states."""
        return self.others.get(block, (self.args, self.kwargs))

    def passed(self, hidden: torch.Tensor) -> Call:
        """This batch, entering the next block with ``hidden``."""
        return dataclasses.replace(self, hidden=hidden)


class Unpackable(SparsetoolError):
    """The model passes its blocks no attention mask a packed batch could be given through (a
    model that builds the causal mask inside its attention): sequences run one by one instead."""


class _Captured(Exception):
    """Raised by a hook once it holds what it was waiting for: the rest of the model is not run."""


class _Replay(torch.nn.Module):
    """Stands in for a block in the last pass: the first hands back the hidden states computed
    block by block, the others pass them on."""

    value: torch.Tensor | None

    def __init__(self, first: bool, as_tuple: bool):
        super().__init__()
        self.first, self.as_tuple, self.value = first, as_tuple, None

    def forward(self, hidden, *args, **kwargs):
        out = self.value if self.first else hidden
        return (out,) if self.as_tuple else out


def _skipped_mask(block: torch.nn.Module, args: tuple, kwargs: dict) -> str | int | None:
    """Where ``block`` was passed ``attention_mask=None`` (by name: the name; by position: the
    index in ``args``, which follow the hidden states), or None if it was not."""
    if "attention_mask" in kwargs:
        return "attention_mask" if kwargs["attention_mask"] is None else None
    try:
        names = list(inspect.signature(block.forward).parameters)
    except (TypeError, ValueError):
        return None
    at = names.index("attention_mask") - 1 if "attention_mask" in names else -1
    return at if 0 <= at < len(args) and args[at] is None else None


class _Recorder(torch.nn.Module):
    """Stands in for a block while the arguments the model passes each block are recorded: it
    keeps them and hands the hidden states on."""

    seen: tuple[tuple, dict] | None  # (args, kwargs) of its last call; None before any

    def __init__(self, as_tuple: bool):
        super().__init__()
        self.as_tuple, self.seen = as_tuple, None

    def forward(self, hidden=None, *args, **kwargs):
        self.seen = (args, {k: v for k, v in kwargs.items() if k != "hidden_states"})
        if hidden is None:
            hidden = kwargs["hidden_states"]
        return (hidden,) if self.as_tuple else hidden


_Seen = list[list[tuple[tuple, dict] | None]]
"""What each block was passed, per call: its (args, kwargs), None where it was not reached."""


def _differing(call: Call, per_block: list) -> dict[int, tuple[tuple, dict]]:
    """The blocks (after block 0) whose recorded arguments (``per_block``) differ from those
    ``call`` holds for block 0."""
    args, kwargs = call.args, call.kwargs
    return {
        j: got
        for j, got in enumerate(per_block)
        if j
        and got is not None
        and not (
            _same(got[0], args)
            and got[1].keys() == kwargs.keys()
            and all(_same(got[1][k], kwargs[k]) for k in got[1])
        )
    }


def _same(a: Any, b: Any) -> bool:
    """Whether two arguments of a block are the same (the one object, or equal tensors)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is not type(b) or isinstance(a, torch.Tensor):
        return False
    try:
        return bool(a == b)
    except Exception:  # an object whose == is not a truth value (an array): not known the same
        return False


class BlockModel:
    """A model whose weights stay in the checkpoint until a pass needs them; see the module doc.

    ``sources`` maps each parameter of ``module`` to the checkpoint tensors it is read from: one
    :class:`~sparsetool.models.hf.Piece` holding all of it, or the pieces of a Mixture of Experts'
    merged experts (a tied head shares its embedding's). ``blocks[i]`` holds the parameter names of
    block ``i``; ``outer`` the rest but the head; ``head`` the untied LM head's (empty when tied).
    """

    def __init__(
        self,
        path: Path,
        ckpt: Checkpoint,
        kind: str,
        module: torch.nn.Module,
        context: int,
        encode: Callable[[str], Encoded],
        sources: dict[str, list[Piece]],
        dtype: torch.dtype,
        device: torch.device,
        head_module: torch.nn.Module,
        forward: Callable[[torch.Tensor], Any],
    ):
        self.path, self.ckpt, self.kind, self.module = path, ckpt, kind, module
        self.context, self.encode, self.sources = context, encode, sources
        self.dtype, self.device = dtype, device
        self._head_module, self._forward = head_module, forward
        self._lts = {lt.name: lt for lt in ckpt.logical}
        # Tied parameters (a head sharing the embedding) are one object under several names.
        self._aliases: dict[str, list[str]] = {}
        self._meta: dict[str, torch.nn.Parameter] = {}
        first: dict[int, str] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            if id(p) in first:
                self._aliases[first[id(p)]].append(name)
            else:
                first[id(p)] = name
                self._meta[name] = p
                self._aliases[name] = [name]
        own = list(self._meta)
        self._by_stored = {
            piece.stored: (name, piece) for name in reversed(own) for piece in self.sources[name]
        }
        self.block_prefix, block_list = find_blocks(module, own)
        self.block_list: torch.nn.ModuleList = block_list
        self.blocks: list[list[str]] = [[] for _ in range(len(block_list))]
        rest: list[str] = []
        for name in own:
            i = block_index(self.block_prefix, name)
            (self.blocks[i] if i is not None else rest).append(name)
        untied = {id(p) for p in head_module.parameters()} - {
            id(p) for p in self._input_embeddings().parameters()
        }
        self.head = [n for n in rest if id(self._meta[n]) in untied]
        self.outer = [n for n in rest if n not in self.head]
        self._loaded: set[str] = set()
        self._tuple_out = False
        # What each checkpoint tensor holds, counted the first time it is read (eval's table).
        stored = {piece.stored for n in own for piece in self.sources[n]}
        self.plan = plan_targets(
            [(s, tuple(self._lts[s].shape), self._lts[s].dtype) for s in sorted(stored)]
        )
        self.counts: dict[str, tuple[int, int]] = {}  # checkpoint name -> (numel, non-zeros)
        self._load_buffers()

    def _load_buffers(self) -> None:
        """Buffers the checkpoint stores (DeepSeek-V3's ``e_score_correction_bias``) take its
        values, in the buffer's own type: the model builds them as zeros. They are small."""
        for name, buf in list(self.module.named_buffers()):
            pieces = self.sources.get(name)
            if name in self._meta or not pieces or len(pieces) != 1 or pieces[0].index:
                continue
            value, _mask = decode(self.ckpt, self._lts[pieces[0].stored])
            owner, _, attr = name.rpartition(".")
            setattr(self.module.get_submodule(owner), attr, value.to(buf.device, buf.dtype))

    # ------------------------------------------------------------------ sizes
    def numel(self, names: list[str]) -> int:
        return sum(self._meta[n].numel() for n in names)

    def bytes_of(self, names: list[str]) -> int:
        return self.numel(names) * self.dtype.itemsize

    @property
    def largest_block_bytes(self) -> int:
        return max((self.bytes_of(b) for b in self.blocks), default=0)

    # torch types a module's attributes as a tensor or a module: these are weights and methods
    @property
    def vocab_size(self) -> int:
        return int(cast("torch.Tensor", self._head_module.weight).shape[0])

    @property
    def width(self) -> int:
        """The hidden size: the width of the block's input (the last dimension of the embedding)."""
        return int(cast("torch.Tensor", self._input_embeddings().weight).shape[-1])

    def _input_embeddings(self) -> torch.nn.Module:
        if hasattr(self.module, "get_input_embeddings"):
            return cast("Callable[[], torch.nn.Module]", self.module.get_input_embeddings)()
        return cast("torch.nn.Module", self.module.tok_emb)  # sparsetool's GPT

    def block_work_bytes(self, batch: int, seq: int) -> int:
        """What one forward pass through a block makes for ``batch`` windows of ``seq`` tokens:
        the outputs of its largest layer and of all its layers side by side (an estimate), and
        the attention scores with their softmax (float32, as eager attention makes them: an upper
        bound for fused attention, which calibration does not use). The largest block
        counts; a mixture of experts' merged experts count as one expert's matrix (they run one
        expert at a time)."""
        per_token = 0
        for block in self.blocks:
            outs = [
                self._meta[n].shape[0] if self._meta[n].ndim == 2 else self._meta[n].shape[1]
                for n in block
                if self._meta[n].ndim in (2, 3)
            ]
            per_token = max(per_token, sum(outs) + 2 * max(outs, default=0))
        return batch * (seq * per_token * self.dtype.itemsize + 3 * self._heads() * seq * seq * 4)

    @property
    def kv_width(self) -> int:
        """Numbers a block's key/value cache keeps per token for keys (as many for values): its
        key/value heads times the head width (fewer than the model's width under grouped-query
        attention); the model's width when its config does not say."""
        cfg = getattr(self.module, "config", None)
        heads = getattr(cfg, "num_key_value_heads", None)
        head_dim = getattr(cfg, "head_dim", None) or (self.width // max(1, self._heads()))
        if isinstance(heads, int) and heads > 0 and isinstance(head_dim, int) and head_dim > 0:
            return heads * head_dim
        return self.width

    def _heads(self) -> int:
        cfg = getattr(self.module, "config", None) or getattr(self.module, "cfg", None)
        for attr in ("num_attention_heads", "n_head", "num_heads"):
            v = getattr(cfg, attr, None)
            if isinstance(v, int) and v > 0:
                return v
        return 1

    # ------------------------------------------------------------------ weights in and out
    def read(self, stored: str) -> torch.Tensor:
        """One checkpoint tensor, dense in its stored dtype (pruned entries +0.0, whatever the
        encoding); counted the first time."""
        dense, _mask = decode(self.ckpt, self._lts[stored])
        negative = negative_zeros(dense)
        if negative is not None:
            dense = dense.masked_fill(negative, 0.0)
        if stored not in self.counts and is_floating(dense.dtype):
            self.counts[stored] = (dense.numel(), count_nonzero_values(dense))
        return dense

    def set_weight(self, name: str, value: torch.Tensor) -> None:
        """Give parameter ``name`` (and its aliases) ``value``, in compute precision on the
        device."""
        p = torch.nn.Parameter(value.to(self.device, self.dtype), requires_grad=False)
        for alias in self._aliases[name]:
            owner, _, attr = alias.rpartition(".")
            setattr(self.module.get_submodule(owner), attr, p)
        self._loaded.add(name)

    def load(self, names: list[str]) -> None:
        for name in names:
            if name in self._loaded:
                continue
            pieces = self.sources[name]
            if len(pieces) == 1 and not pieces[0].index:
                self.set_weight(name, self.read(pieces[0].stored))
                continue
            merged = torch.empty(self._meta[name].shape, dtype=self.dtype, device=self.device)
            for piece in pieces:  # one expert's matrix at a time
                merged[piece.index] = self.read(piece.stored)
            self.set_weight(name, merged)

    def set_piece(self, name: str, piece: Piece, value: torch.Tensor) -> None:
        """Give the place of ``piece`` in loaded parameter ``name`` ``value`` (one expert's
        matrix)."""
        assert name in self._loaded, f"{name} is not loaded"
        self.module.get_parameter(name).data[piece.index] = value.to(self.device, self.dtype)

    def piece_of(self, stored: str) -> tuple[str, Piece] | None:
        """The parameter checkpoint tensor ``stored`` is read into, and its place there."""
        return self._by_stored.get(stored)

    def release(self, names: list[str]) -> None:
        for name in names:
            if name in self._loaded:
                for alias in self._aliases[name]:
                    owner, _, attr = alias.rpartition(".")
                    setattr(self.module.get_submodule(owner), attr, self._meta[name])
                self._loaded.discard(name)

    def load_block(self, i: int) -> None:
        self.load(self.blocks[i])

    def release_block(self, i: int) -> None:
        self.release(self.blocks[i])

    # ------------------------------------------------------------------ passes
    def capture(
        self,
        batches: list[torch.Tensor],
        layouts: list[tuple[torch.Tensor, torch.Tensor] | None] | None = None,
    ) -> list[Call]:
        """The first block's inputs for each batch of token ids (B, T), with the arguments the
        model passes its blocks: the model's own forward pass, stopped at the first block.

        ``layouts[k]``: batch ``k`` packed, as its position ids and segment ids (both (B, T); see
        the module doc), or None (plain sequences). A model whose blocks take no attention mask
        to pack with raises :class:`Unpackable`."""
        self.load(self.outer)
        calls: list[Call] = []
        layouts = layouts or [None] * len(batches)

        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            calls.append(
                Call(ids, hidden.detach(), tuple(args[1:]) if args else (), rest, {}, positions)
            )
            raise _Captured

        handle = self.block_list[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            with torch.inference_mode():
                for ids, layout in zip(batches, layouts):
                    ids = ids.to(self.device)
                    positions = None if layout is None else layout[0].to(self.device)
                    try:
                        self._run(ids, positions)
                    except _Captured:
                        continue
                    raise SparsetoolError(
                        f"{self.path}: the model never ran its first block; "
                        "only causal language models built of blocks are supported"
                    )
            if len(self.block_list) > 1:
                self._record_arguments(calls)
        finally:
            handle.remove()
            self.release(self.outer)
        for call, layout in zip(calls, layouts):
            if layout is not None:
                self.pack_masks(call, layout[1].to(self.device))
        return calls

    def _run(self, ids: torch.Tensor, positions: torch.Tensor | None) -> Any:
        """The model's forward pass on ``ids`` (with position ids ``positions``, when given)."""
        if positions is None:
            return self._forward(ids)
        if self.kind == "sparsetool-gpt":
            return self.module(ids, positions=positions)
        # An all-ones padding mask: the model builds its mask for positions 0 .. T-1 (what
        # pack_masks reads), not the one it would guess for sequences packed back to back.
        return self.module(
            input_ids=ids,
            position_ids=positions,
            attention_mask=torch.ones_like(ids),
            use_cache=False,
        )

    def pack_masks(self, call: Call, segments: torch.Tensor) -> None:
        """Give the blocks of packed ``call`` the masks of its layout: a token sees the tokens the
        model's own mask lets its position see, among the prefix's (segment 0) and its own
        segment's. The model's mask was built for positions 0 .. T-1, so it holds every pair of
        positions the layout has; it is read at the tokens' positions."""
        pos = call.positions
        assert pos is not None
        seg = segments
        allowed = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])  # (B, Tq, Tk)
        if self.kind == "sparsetool-gpt":  # its blocks take a boolean mask (True: attend)
            causal = pos[:, None, :] <= pos[:, :, None]
            call.kwargs = {**call.kwargs, "attn_mask": (allowed & causal)[:, None]}
            return
        T = call.ids.shape[1]
        made: dict[int, torch.Tensor] = {}

        def is_mask(value: Any) -> bool:
            return (
                isinstance(value, torch.Tensor)
                and value.ndim == 4
                and tuple(value.shape[-2:]) == (T, T)
                and (value.dtype == torch.bool or value.is_floating_point())
            )

        def adapted(mask: torch.Tensor) -> torch.Tensor:
            if id(mask) not in made:
                rows = []
                for b in range(pos.shape[0]):
                    m = mask[min(b, mask.shape[0] - 1)]  # (heads or 1, T, T)
                    m = m[:, pos[b][:, None], pos[b][None, :]]
                    if m.dtype == torch.bool:
                        rows.append(m & allowed[b])
                    else:
                        low = torch.finfo(m.dtype).min
                        rows.append(torch.where(allowed[b], m, torch.full_like(m, low)))
                made[id(mask)] = torch.stack(rows)
            return made[id(mask)]

        def packed(block: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            """The mask ``block`` is passed by name (``attention_mask``) or, failing that, by
            position; or the one fused attention was not given."""
            if is_mask(kwargs.get("attention_mask")):
                return args, {**kwargs, "attention_mask": adapted(kwargs["attention_mask"])}
            at = [j for j, a in enumerate(args) if is_mask(a)]
            if len(at) == 1:
                return tuple(adapted(a) if j == at[0] else a for j, a in enumerate(args)), kwargs
            if not at:
                skipped = _skipped_mask(block, args, kwargs)
                if skipped is not None:
                    # Fused attention (sdpa) is given no mask where the model's own is plain
                    # causal over 0 .. T-1 (no padding, any window longer than T): it is causal
                    # at the tokens' positions.
                    mask = (allowed & (pos[:, None, :] <= pos[:, :, None]))[:, None]
                    if isinstance(skipped, str):
                        return args, {**kwargs, skipped: mask}
                    return tuple(mask if j == skipped else a for j, a in enumerate(args)), kwargs
            raise Unpackable(f"{self.path}: its blocks take no attention mask to pack with")

        call.args, call.kwargs = packed(self.block_list[0], call.args, call.kwargs)
        call.others = {i: packed(self.block_list[i], a, k) for i, (a, k) in call.others.items()}

    def _record_arguments(self, calls: list[Call]) -> None:
        """The arguments the model passes each block, where they differ from block 0's (models
        that mix sliding-window and full attention pass each kind its own mask): the model's
        forward pass again with every block replaced by a :class:`_Recorder`, stopped at the head.
        The first batch shows which blocks differ; only then are the others recorded.

        Whether a block hands back a tuple is not known before one runs; stand-ins of the wrong
        kind bring the head hidden states of the wrong shape, and the pass is made again."""
        originals = list(self.block_list)
        reached: list[torch.Tensor] = []

        def at_head(module, args, kwargs):
            reached.append(args[0] if args else next(iter(kwargs.values())))
            raise _Captured

        def record(batch: list[Call], as_tuple: bool) -> _Seen | None:
            recorders = [_Recorder(as_tuple) for _ in originals]
            for k, r in enumerate(recorders):
                self.block_list[k] = r
            seen: _Seen = []
            reached.clear()
            with torch.inference_mode():
                for call in batch:
                    with contextlib.suppress(_Captured):
                        self._run(call.ids, call.positions)
                    seen.append([r.seen for r in recorders])
            fits = len(reached) == len(batch) and all(
                h.shape == c.hidden.shape for h, c in zip(reached, batch)
            )
            return seen if fits else None

        handle = self._head_module.register_forward_pre_hook(at_head, with_kwargs=True)
        try:
            for as_tuple in (False, True):
                first = record(calls[:1], as_tuple)
                if first is not None:
                    break
            else:  # the model does not pass its blocks' outputs on as expected: block 0's for all
                self._unrecorded()
                return
            if not _differing(calls[0], first[0]):
                return  # every block takes block 0's arguments
            rest = record(calls[1:], as_tuple)
            if rest is None:
                self._unrecorded()
                return
        finally:
            handle.remove()
            for k, m in enumerate(originals):
                self.block_list[k] = m
        for call, per_block in zip(calls, first + rest):
            call.others.update(_differing(call, per_block))

    def _unrecorded(self) -> None:
        """What each block takes could not be recorded: fine for a model whose blocks are all of
        one kind (each takes block 0's arguments); refused for one of several kinds."""
        kinds = set(getattr(getattr(self.module, "config", None), "layer_types", None) or ())
        if len(kinds) > 1:  # its blocks do not all take block 0's mask
            raise SparsetoolError(
                f"{self.path}: its blocks are of several kinds ({', '.join(sorted(kinds))}) "
                "and the arguments the model passes each could not be recorded; this "
                "model cannot run block by block; please report this"
            )

    def run_block(self, i: int, call: Call) -> torch.Tensor:
        """Block ``i`` (loaded) applied to one batch: its output hidden states."""
        args, kwargs = call.arguments(i)
        out = self.block_list[i](call.hidden, *args, **kwargs)
        if isinstance(out, (tuple, list)):
            self._tuple_out = True
            return out[0]
        return out

    def through_blocks(
        self, calls: list[Call], after_block: Callable[[], None] | None = None
    ) -> list[Call]:
        """``calls`` through every block in turn, each block read once for all of them (the
        inputs of a block are dropped as its outputs are made); ``after_block()`` after each."""
        for i in range(len(self.blocks)):
            self.load_block(i)
            calls = [c.passed(self.run_block(i, c)) for c in calls]
            self.release_block(i)
            if after_block:
                after_block()
        return calls

    def final_hidden(self, calls: list[Call]) -> list[torch.Tensor]:
        """The head's input for each batch whose hidden states went through every block: the
        model's own forward pass with the blocks replaced by their results (final norm and
        whatever else the model applies after its blocks included), stopped at the head."""
        cfg = getattr(self.module, "config", None)
        scaled = [k for k in _LOGIT_TRANSFORMS if getattr(cfg, k, None) not in (None, 1, 1.0)]
        if scaled:
            raise SparsetoolError(
                f"{self.path}: this model transforms its logits after the head "
                f"({', '.join(scaled)}), which eval does not apply yet"
            )
        loaded = set(self._loaded)
        self.load(self.outer)
        originals = list(self.block_list)
        replays = [_Replay(j == 0, self._tuple_out) for j in range(len(originals))]
        out: list[torch.Tensor] = []

        def hook(module, args, kwargs):
            out.append((args[0] if args else next(iter(kwargs.values()))).detach())
            raise _Captured

        handle = self._head_module.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            for j, r in enumerate(replays):
                self.block_list[j] = r
            with torch.inference_mode():
                for call in calls:
                    replays[0].value = call.hidden
                    try:
                        self._run(call.ids, call.positions)
                    except _Captured:
                        continue
                    raise SparsetoolError(f"{self.path}: the model never reached its head")
        finally:
            handle.remove()
            for j, m in enumerate(originals):
                self.block_list[j] = m
            replays[0].value = None
            self.release([n for n in self.outer if n not in loaded])
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head applied to some of :meth:`final_hidden`'s rows (load it with
        :meth:`load_head`)."""
        return self._head_module(hidden)

    def load_head(self) -> None:
        self.load(self.outer + self.head)

    def release_head(self) -> None:
        self.release(self.outer + self.head)

    def close(self) -> None:
        self.release(list(self._loaded))
        self.ckpt.close()


def find_blocks(module: torch.nn.Module, params: list[str]) -> tuple[str, torch.nn.ModuleList]:
    """The ModuleList of transformer blocks: the one holding the most of ``params`` (model
    names)."""
    best: tuple[int, str, Any] = (0, "", None)
    for prefix, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m):
            inside = sum(1 for p in params if block_index(prefix, p) is not None)
            if inside > best[0]:
                best = (inside, prefix, m)
    if best[2] is None:
        raise SparsetoolError(
            "the model has no list of transformer blocks; only causal language "
            "models built of blocks are supported"
        )
    return best[1], best[2]


def block_index(prefix: str, name: str) -> int | None:
    """The block a parameter name belongs to (``prefix.N.``), or None.

    >>> (
    ...     block_index("model.layers", "model.layers.12.mlp.up_proj.weight"),
    ...     block_index("h", "wte.weight"),
    ... )
    (12, None)
    """
    if not name.startswith(prefix + "."):
        return None
    head = name[len(prefix) + 1 :].split(".")[0]
    return int(head) if head.isdigit() else None
