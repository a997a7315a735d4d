"""Where a Mixture of Experts' routed experts live: in the config, in the model run block by
block, and in the checkpoint.

A layer's routed experts are transformers' fused experts module (3-D parameters, one matrix per
expert, expert first) beside a router whose weight has one row per expert. In the checkpoint an
expert's matrix is either its own 2-D tensor (``...experts.7.gate_proj.weight``; a
:class:`~sparsetool.models.hf.Piece` of the merged parameter) or one slot of a fused 3-D tensor
(``...experts.gate_up_proj``, expert axis 0). The router's weight rows, its bias and DeepSeek-V3's
``e_score_correction_bias`` have one entry per expert too. Shared experts are ordinary layers:
never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sparsetool.errors import SparsetoolError, UsageError
from sparsetool.models.blocks import BlockModel
from sparsetool.models.hf import Piece
from sparsetool.ops.calibration import is_experts

__all__ = [
    "EXPERT_COUNT_KEYS",
    "ExpertLayer",
    "Role",
    "expert_count",
    "expert_layers",
]

EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
"""config.json's name for the routed experts per layer, by family (Mixtral and gpt-oss; Qwen-MoE
and OLMoE; DeepSeek-V3)."""
TOP_K_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")


def expert_count(cfg, config: dict, path) -> tuple[int, int]:
    """(routed experts per layer, experts per token) of a Hugging Face config; a model without
    routed experts is a usage error naming it."""
    experts = next(
        (int(v) for k in EXPERT_COUNT_KEYS if isinstance(v := getattr(cfg, k, None), int)),
        0,
    )
    top_k = next(
        (int(v) for k in TOP_K_KEYS if isinstance(v := getattr(cfg, k, None), int)),
        0,
    )
    model_type = config.get("model_type")
    if experts < 2 or top_k < 1:
        raise UsageError(
            f"{path}: {model_type or 'this model'} has no routed experts (config.json names no "
            f"{' / '.join(EXPERT_COUNT_KEYS)}); shrink --experts removes experts of "
            "Mixture-of-Experts models"
        )
    return experts, top_k


@dataclass
class Role:
    """One kind of stored tensor of a layer's experts: every expert's ``gate_proj.weight``, say.
    ``pieces[e]`` is expert ``e``'s (its own tensor), or ``fused`` names the one tensor holding all
    of them along axis 0."""

    param: str  # the model's parameter it is loaded into
    pieces: dict[int, Piece] = field(default_factory=dict)
    fused: str | None = None
    position: int = -1  # the dotted component of a piece's name that is its expert number

    def renamed(self, stored: str, new: int) -> str:
        """A stored tensor name of this role (``stored``, or one of its encoding's parts) for
        the expert that becomes number ``new``."""
        parts = stored.split(".")
        parts[self.position] = str(new)
        return ".".join(parts)

    def index(self, piece: Piece, new: int) -> tuple:
        """``piece``'s place in the parameter, for the expert that becomes number ``new``."""
        return tuple(new if isinstance(i, int) else i for i in piece.index)


@dataclass
class ExpertLayer:
    """One block's routed experts: the experts module and router (model paths), the stored
    tensors of each role, and the router's stored tensors (one row or entry per expert)."""

    block: int
    experts_path: str
    router_path: str
    roles: list[Role]
    router: dict[str, str]  # model name (parameter or buffer) -> stored tensor

    def stored_names(self) -> list[str]:
        """Every checkpoint tensor (logical name) of this layer's experts and router."""
        names = [p.stored for r in self.roles for p in r.pieces.values()]
        names += [r.fused for r in self.roles if r.fused]
        return names + list(self.router.values())


def expert_layers(model: BlockModel, experts: int) -> dict[int, ExpertLayer]:
    """Each block that holds routed experts -> where they are; a model whose experts module is not
    called with each token's chosen experts and weights (Llama 4) is refused."""
    layers: dict[int, ExpertLayer] = {}
    for i, block in enumerate(model.block_list):
        found = [(rel, m) for rel, m in block.named_modules() if is_experts(m)]
        if not found:
            continue
        rel, module = found[0]
        path = f"{model.block_prefix}.{i}.{rel}"
        if not hasattr(module, "has_gate"):
            raise SparsetoolError(
                f"{model.path}: the experts of {type(module).__name__} ({path}) are not called "
                "with each token's chosen experts and routing weights (their tokens come sorted "
                "per expert), so shrink cannot score or remove them"
            )
        parent_rel = rel.rpartition(".")[0]
        parent = block.get_submodule(parent_rel)
        router_rel = next(
            (
                name
                for name, m in parent.named_children()
                if m is not module
                and isinstance(w := getattr(m, "weight", None), torch.Tensor)
                and w.ndim == 2
                and w.shape[0] == experts
            ),
            None,
        )
        if router_rel is None:
            raise SparsetoolError(
                f"{model.path}: block {i} has routed experts ({path}) but no router with one row "
                f"per expert ({experts}) beside them; shrink does not know this model's layout"
            )
        base = f"{model.block_prefix}.{i}" + (f".{parent_rel}" if parent_rel else "")
        router_path = f"{base}.{router_rel}"
        router = parent.get_submodule(router_rel)
        router_names = [
            f"{router_path}.{n}"
            for n, t in list(router.named_parameters(recurse=False))
            + list(router.named_buffers(recurse=False))
            if t.ndim >= 1 and t.shape[0] == experts
        ]
        layers[i] = ExpertLayer(
            i,
            path,
            router_path,
            _roles(model, path, module, experts),
            {n: _single(model, n) for n in router_names if n in model.sources},
        )
    return layers


def _single(model: BlockModel, name: str) -> str:
    pieces = model.sources[name]
    assert len(pieces) == 1 and not pieces[0].index, f"{name} is not one stored tensor"
    return pieces[0].stored


def _roles(model: BlockModel, path: str, module: torch.nn.Module, experts: int) -> list[Role]:
    roles: list[Role] = []
    for n, p in module.named_parameters(recurse=False):
        name = f"{path}.{n}"
        if p.shape[0] != experts:
            raise SparsetoolError(
                f"{model.path}: {name} {list(p.shape)} does not hold one entry per expert "
                f"({experts}); shrink does not know this model's layout"
            )
        pieces = model.sources[name]
        if len(pieces) == 1 and not pieces[0].index:
            roles.append(Role(name, fused=pieces[0].stored))
            continue
        by_role: dict[tuple, Role] = {}
        for piece in pieces:
            e = next(i for i in piece.index if isinstance(i, int))
            key = tuple(None if isinstance(i, int) else (i.start, i.stop) for i in piece.index)
            by_role.setdefault(key, Role(name)).pieces[e] = piece
        for role in by_role.values():
            role.position = _expert_position(model, role)
            roles.append(role)
    return roles


def _expert_position(model: BlockModel, role: Role) -> int:
    """The dotted component of the role's stored names that is the expert's number: the one
    equal to ``e`` in expert ``e``'s name for every expert."""
    split = {e: piece.stored.split(".") for e, piece in role.pieces.items()}
    lengths = {len(parts) for parts in split.values()}
    if len(lengths) == 1:
        (n,) = lengths
        found = [k for k in range(n) if all(parts[k] == str(e) for e, parts in split.items())]
        if len(found) == 1:
            return found[0]
    first = next(iter(role.pieces.values())).stored
    raise SparsetoolError(
        f"{model.path}: tensor {first!r}: the expert's number is not one part of the names of "
        "its layer's experts; shrink cannot renumber them"
    )
