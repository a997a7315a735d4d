"""Which experts a layer keeps: each expert's saliency from the calibration tokens routed to it,
the choice per layer (per router group), and, with ``--merge``, the kept expert each removed one
is folded into.

The statistics come from a forward pre-hook on the layer's fused experts module, which the block
calls with its hidden states, each token's chosen experts and the weights it applies to their
outputs (after the model's own top-k normalisation and scaling). For expert ``j``, token ``t``
routed to it with weight ``g_j(t)`` and the expert's output ``f_j(t)``:

- ``reap``: ``mean_t g_j(t) * ||f_j(t)||_2`` (REAP, arXiv 2510.13999); an expert no token reached
  scores 0;
- ``frequency``: the number of tokens routed to ``j``;
- ``ean``: ``sum_t ||f_j(t)||_2`` (expert activation norm);
- ``random``: a seeded uniform draw per layer (a baseline; no text needed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch

from sparsetool.ops.calibration import gated_product, routing_of
from sparsetool.ops.shrink.options import ExpertPlan

__all__ = ["ExpertStatistics", "expert_output", "choose_kept", "merge_clusters", "random_scores"]


def expert_output(experts: torch.nn.Module, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``e``'s output for inputs ``x`` (tokens, d), before its routing weight: the fused
    module's gate/up projections and gate, then its down projection (with its bias)."""
    h = gated_product(experts, e, x)
    w = cast(torch.Tensor, experts.down_proj)[e]
    out = h @ w if getattr(experts, "is_transposed", False) else h @ w.T
    if getattr(experts, "has_bias", False):
        out = out + cast(torch.Tensor, experts.down_proj_bias)[e]
    return out


class ExpertStatistics:
    """One layer's per-expert sums over the calibration tokens (float64): routed tokens, the
    routing-weighted output norms (REAP), the output norms (EAN), and with ``outputs`` each
    expert's summed output over every token (what ``--merge`` compares)."""

    def __init__(self, experts: int, width: int, outputs: bool):
        self.experts = experts
        self.count = torch.zeros(experts, dtype=torch.float64)
        self.gated = torch.zeros(experts, dtype=torch.float64)
        self.norm = torch.zeros(experts, dtype=torch.float64)
        self.outputs = torch.zeros(experts, width, dtype=torch.float64) if outputs else None
        self.tokens = 0

    def hook(self, module: torch.nn.Module) -> Callable:
        """A forward pre-hook (``with_kwargs``) for the layer's experts module."""

        def see(_module, args, kwargs) -> None:
            self.add(module, *routing_of(args, kwargs))

        return see

    def add(
        self,
        module: torch.nn.Module,
        hidden: torch.Tensor,
        index: torch.Tensor,
        weights: torch.Tensor,
    ) -> None:
        self.tokens += hidden.shape[0]
        for e in range(self.experts):
            tokens, slot = (index == e).nonzero(as_tuple=True)
            if self.outputs is not None:
                every = expert_output(module, e, hidden)
                self.outputs[e] += every.double().sum(0).cpu()
                f = every[tokens]
            elif tokens.numel():
                f = expert_output(module, e, hidden[tokens])
            else:
                continue
            if not tokens.numel():
                continue
            n = f.float().norm(dim=-1).double()
            g = weights[tokens, slot].double()
            self.count[e] += tokens.numel()
            self.gated[e] += (g * n).sum().cpu()
            self.norm[e] += n.sum().cpu()

    def scores(self, criterion: str) -> torch.Tensor:
        """Each expert's saliency under ``criterion`` (higher is kept)."""
        if criterion == "reap":
            return torch.where(self.count > 0, self.gated / self.count.clamp_min(1), 0.0)
        if criterion == "frequency":
            return self.count.clone()
        if criterion == "ean":
            return self.norm.clone()
        raise ValueError(criterion)


def random_scores(experts: int, seed: int, block: int) -> torch.Tensor:
    """``--criterion random``: a uniform draw per expert, from ``seed`` and the block."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + block)
    return torch.rand(experts, generator=g, dtype=torch.float64)


def choose_kept(scores: torch.Tensor, plan: ExpertPlan) -> list[int]:
    """The experts kept, ascending: in each router group the ``plan.keep_per_group`` highest
    scores; among equal scores the lower index stays.

    >>> choose_kept(torch.tensor([0.3, 0.1, 0.3, 0.9]), ExpertPlan(4, 2, 1))
    [0, 3]
    >>> choose_kept(torch.tensor([0.3, 0.1, 0.3, 0.9]), ExpertPlan(4, 2, 1, groups=2))
    [0, 3]
    """
    per = plan.experts // plan.groups
    kept: list[int] = []
    for g in range(plan.groups):
        members = range(g * per, (g + 1) * per)
        ranked = sorted(members, key=lambda e: (-float(scores[e]), e))
        kept += sorted(ranked[: plan.keep_per_group])
    return kept


def merge_clusters(
    kept: list[int], stats: ExpertStatistics, plan: ExpertPlan
) -> dict[int, list[tuple[int, float]]]:
    """``--merge``: each kept expert -> the experts folded into it (itself first) with their
    weights in the average: each removed expert joins the kept one of its router group whose mean
    output over the calibration tokens is the most similar (cosine; ties: the lower index), and a
    cluster's weights are its members' routed-token counts (equal when none was routed)."""
    assert stats.outputs is not None, "gathered without outputs"
    per = plan.experts // plan.groups
    mean = stats.outputs / max(stats.tokens, 1)
    unit = mean / mean.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    members: dict[int, list[int]] = {k: [k] for k in kept}
    for r in range(plan.experts):
        if r in members:
            continue
        same = [k for k in kept if k // per == r // per]
        best = max(same, key=lambda k: (float(unit[r] @ unit[k]), -k))
        members[best].append(r)
    clusters: dict[int, list[tuple[int, float]]] = {}
    for k, group in members.items():
        counts = [float(stats.count[j]) for j in group]
        total = sum(counts)
        weights = [c / total for c in counts] if total > 0 else [1 / len(group)] * len(group)
        clusters[k] = list(zip(group, weights))
    return clusters
