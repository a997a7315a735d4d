"""Where calibration pruning finds each targeted tensor in the block model: its block, its
parameter and, for a Mixture of Experts, its expert and which input that expert's matrix reads.

:func:`place_targets` makes the :class:`Placement` of a run once the model is open: each targeted
tensor (or, for a tensor holding every expert, each expert's matrix) becomes a unit with a key
(the model's parameter name, or the checkpoint tensor's name with ``[expert]``) and a
:class:`Place`, listed under its block. The block loop (``calibrated.py``), the statistics hooks
(``statistics.py``), the memory plan (``memory_plan.py``) and OWL's pass (``owl_pass.py``) read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparsetool.checkpoint import LogicalTensor
from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.models.hf import Piece
from sparsetool.ops.calibration import is_experts
from sparsetool.targets import STACKED_LAYOUTS, TargetPlan

__all__ = ["Place", "Placement", "check_layouts", "oriented", "place_targets"]

LAYOUTS = ("linear", "conv1d") + STACKED_LAYOUTS  # the weights calibration pruning takes


@dataclass(frozen=True)
class Place:
    """Where a targeted checkpoint tensor (``lt``) lives in the model: the parameter (``own``)
    and its place there; for one expert's matrix of a Mixture of Experts, the experts module, the
    expert, and whether it reads the block's hidden states (``"in"``: gate, up) or the gated
    product (``"out"``: down)."""

    lt: LogicalTensor
    own: str
    piece: Piece
    experts: torch.nn.Module | None = None
    expert: int | None = None
    part: str = ""
    slot: bool = False  # the checkpoint tensor holds every expert: this is its ``[expert]``


def oriented(t: torch.Tensor, layout: str) -> torch.Tensor:
    """``t`` as (out, in), or (experts, out, in) for a tensor of every expert: a GPT-2 Conv1D
    weight is stored (in, out), gpt-oss's experts (experts, in, out). Its own inverse."""
    return t.T if layout == "conv1d" else t.transpose(1, 2) if layout == "stacked_t" else t


def check_layouts(targets: list[LogicalTensor], plan: TargetPlan, method: str) -> None:
    """Refuse a targeted tensor that is not a linear layer's weight (before the model loads)."""
    for lt in targets:
        if plan[lt.name].layout not in LAYOUTS:
            raise SparsetoolError(
                f"tensor {lt.name!r} {list(lt.shape)}: --method {method} prunes "
                "linear layers (2-D weights) only; leave it out with --exclude"
            )


@dataclass
class Placement:
    """The targeted units of a run: ``where`` (key -> :class:`Place`) and ``by_block`` (block ->
    its (key, tensor) pairs, in file order)."""

    plan: TargetPlan
    where: dict[str, Place] = field(default_factory=dict)
    by_block: dict[int, list[tuple[str, LogicalTensor]]] = field(default_factory=dict)

    def add(self, block: int, key: str, place: Place) -> None:
        self.where[key] = place
        self.by_block.setdefault(block, []).append((key, place.lt))

    def oriented(self, lt: LogicalTensor, t: torch.Tensor) -> torch.Tensor:
        """``t``, a value of ``lt`` as stored, as (out, in) (see :func:`oriented`)."""
        return oriented(t, self.plan[lt.name].layout)

    def n_in(self, lt: LogicalTensor) -> int:
        """Input features of a targeted weight (of each expert's matrix)."""
        return lt.shape[self.plan[lt.name].input_dim]

    @property
    def has_experts(self) -> bool:
        """Whether some unit is one expert's matrix of a Mixture of Experts."""
        return any(p.expert is not None for p in self.where.values())

    def expected_groups(self, block: int) -> list[list[tuple[str, LogicalTensor]]]:
        """The guess, before anything runs, of which units of ``block`` read one input: the
        query/key/value projections of one attention module, and the feed-forward input
        projections (gate, up) of one module, when they take as many inputs; an expert's gate
        and up (its routed tokens); every other layer its own."""
        groups: dict[tuple, list[tuple[str, LogicalTensor]]] = {}
        for key, lt in self.by_block.get(block, []):
            place = self.where[key]
            role = self.plan[lt.name].role
            group: tuple[object, ...]
            if place.expert is not None:  # an expert's gate and up read its routed tokens
                group = (place.own.rpartition(".")[0], place.expert, place.part)
            elif role in ("qkv", "ffn_in"):
                group = (role, place.own.rpartition(".")[0].rpartition(".")[0], self.n_in(lt))
            else:
                group = (key,)
            groups.setdefault(group, []).append((key, lt))
        return list(groups.values())


def place_targets(
    model: BlockModel, targets: list[LogicalTensor], plan: TargetPlan, method: str
) -> Placement:
    """Find every targeted tensor in ``model``; refuse one outside the transformer blocks, or
    experts the model does not call with each token's routing."""
    placement = Placement(plan)
    for lt in targets:
        found = model.piece_of(lt.name)
        if found is None:
            raise SparsetoolError(
                f"tensor {lt.name!r} is not a parameter of the {model.kind} "
                "model; leave it out with --exclude"
            )
        own, piece = found
        i = next((j for j, names in enumerate(model.blocks) if own in names), None)
        if i is None:
            raise SparsetoolError(
                f"tensor {lt.name!r} is outside the transformer blocks "
                f"({model.block_prefix}.N); --method {method} prunes block weights only: leave "
                "it out with --exclude"
            )
        owner, _, attr = own.rpartition(".")
        module = model.module.get_submodule(owner)
        if not is_experts(module):
            placement.add(i, own, Place(lt, own, piece))
            continue
        if not hasattr(module, "has_gate"):  # not transformers' experts interface (Llama 4)
            raise SparsetoolError(
                f"tensor {lt.name!r} {list(lt.shape)}: the experts of {type(module).__name__} "
                "are not called with each token's chosen experts and routing weights, so "
                f"--method {method} cannot tell which tokens each expert sees; prune "
                "them by magnitude, or leave them out with --exclude '*.experts.*'"
            )
        part = "out" if attr.startswith("down") else "in"
        transposed = bool(module.is_transposed)
        stored_t = plan[lt.name].layout == "stacked_t"
        if piece.index and not transposed:  # one expert's matrix
            placement.add(i, lt.name, Place(lt, own, piece, module, int(piece.index[0]), part))
        elif not piece.index and transposed == stored_t:
            for e in range(lt.shape[0]):  # every expert's matrix, each a unit of its own
                place = Place(lt, own, piece, module, e, part, slot=True)
                placement.add(i, f"{lt.name}[{e}]", place)
        else:
            raise SparsetoolError(
                f"tensor {lt.name!r} {list(lt.shape)}: its experts are stored "
                f"{'(in, out)' if stored_t else '(out, in)'}"
                f" but the model reads them the other way; --method {method} cannot "
                "prune it: prune it by magnitude, or leave it out with --exclude"
            )
    return placement
