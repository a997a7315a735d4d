"""A block's input statistics in calibration pruning, gathered by forward hooks while the
calibration windows run through the block: one set per distinct input tensor (layers that read
the same tensor share it), holding what the methods need: Wanda's and OWL's sum of squares of each
input feature, SparseGPT's ``X^T X`` (which becomes its inverse factor in place), DSnoT's mean and
variance. :func:`gather_statistics` runs a block's windows with the hooks on and returns them; the
block loop (:class:`~sparsetool.ops.prune.calibrated.CalibratedPlanner`) and OWL's pass
(``owl_pass.py``) make one per block."""

from __future__ import annotations

from collections.abc import Callable

import torch

from sparsetool.checkpoint import LogicalTensor
from sparsetool.errors import CheckpointError, SparsetoolError
from sparsetool.masks.sparsegpt import ROWS
from sparsetool.models.blocks import BlockModel, Call
from sparsetool.ops.calibration import gated_product, routed_inputs, routing_of
from sparsetool.ops.prune.placement import Placement
from sparsetool.util.threads import torch_threads

__all__ = [
    "InputStatistics",
    "BlockStatistics",
    "gather_statistics",
]


class InputStatistics:
    """The statistics of one distinct input of a block, shared by every targeted layer that reads
    that tensor (Llama's q/k/v projections read one, its gate/up projections another): Wanda's sum
    of squares of each feature (float64), SparseGPT's ``X^T X`` (float32), which becomes its
    inverse's factor, in place, when the first of its layers is solved. They are added up on one
    torch thread: MKL rounds ``X^T X`` differently on one thread and on two."""

    def __init__(self, n_in: int, hessian: bool, device: torch.device, moments: bool = False):
        self.n_in = n_in
        zeros = lambda: torch.zeros(n_in, dtype=torch.float64, device=device)  # noqa: E731
        self.sq = None if hessian and not moments else zeros()
        self.sum = zeros() if moments else None  # DSnoT: each feature's sum, for its mean
        self.tokens = 0
        self.h = torch.zeros(n_in, n_in, dtype=torch.float32, device=device) if hessian else None
        self.factor: torch.Tensor | None = None
        self.users: list[str] = []  # the layers (model names) that read it, in forward order
        self.left = 0  # users not pruned yet

    @torch_threads(1)  # the same sums, bit for bit, whatever --threads (util/threads.py)
    def add(self, x: torch.Tensor) -> None:
        if self.h is not None:
            xt = x.T
            for r in range(0, self.n_in, ROWS):  # not the whole in x in product beside h
                self.h[r : r + ROWS] += xt[r : r + ROWS] @ x
        if self.sq is not None:
            self.sq += x.double().pow(2).sum(0)
        if self.sum is not None:
            self.sum += x.double().sum(0)
        self.tokens += x.shape[0]

    def squares(self) -> torch.Tensor:
        """Wanda's sum of squares of each feature (gathered unless only ``X^T X`` was asked)."""
        if self.sq is None:
            raise AssertionError("gathered without the sums of squares")
        return self.sq

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """DSnoT's view of the input: each feature's mean and variance over the tokens (CPU)."""
        assert self.sum is not None and self.sq is not None, "gathered without moments"
        mean = self.sum / max(self.tokens, 1)
        var = (self.sq / max(self.tokens, 1) - mean * mean).clamp_min(0)
        return mean.cpu(), var.cpu()

    def drop(self) -> None:
        self.sq = self.h = self.factor = self.sum = None


class BlockStatistics:
    """The input statistics of one block's targeted layers, one set per distinct input tensor,
    fed by forward hooks (:meth:`hook`) while the calibration windows run through the block.

    Which layers share an input is seen, not assumed: in the first window, a layer whose input is
    the very tensor object an earlier layer of that window read joins that layer's statistics; the
    others each get their own. Every later window must share the same way (it always does in a
    block's fixed code). Each input's statistics are added once per window, so a shared ``X^T X``
    is the same, bit for bit, as each layer's own would be; :meth:`release` drops it when the
    last of its layers is pruned."""

    def __init__(
        self, n_in: dict[str, int], hessian: bool, device: torch.device, moments: bool = False
    ):
        self.n_in, self.hessian, self.device, self.moments = n_in, hessian, device, moments
        self.inputs: list[InputStatistics] = []  # in the order they were first seen
        self._of: dict[str, InputStatistics] = {}
        # id(tensor) -> (the tensor, its statistics, the layers of this window that read it)
        self._window: dict[int, tuple[torch.Tensor, InputStatistics, set[str]]] = {}
        self._windows = 0

    def hook(self, own: str) -> Callable:
        def see(module, args, output) -> None:
            self.see(own, args[0])

        return see

    def experts_hook(
        self, experts: torch.nn.Module, units: dict[int, dict[str, list[str]]]
    ) -> Callable:
        """A forward pre-hook for a Mixture of Experts' ``experts`` module (transformers' fused
        experts: called with the block's hidden states, each token's chosen experts and their
        routing weights) that feeds the statistics of each expert's targeted matrices
        (``units``: expert -> ``"in"`` or ``"out"`` -> their keys) from the tokens routed to that
        expert only.

        An expert's output enters the block's output multiplied by its routing weight, so each
        routed token's input row is scaled by that weight: Wanda's norms and SparseGPT's
        ``X^T X`` weigh each token's squared error as the model weighs it. ``"in"`` matrices
        (gate and up) read the hidden states; ``"out"`` (down) reads the gated product, computed
        with the expert's weights as they are now and the module's own gate
        (:func:`~sparsetool.ops.calibration.routed_inputs`)."""

        def see(module, args, kwargs) -> None:
            hidden, index, weights = routing_of(args, kwargs)
            for e, parts in units.items():
                x, w = routed_inputs(experts, e, hidden, index, weights)
                if "in" in parts:
                    xw = x * w[:, None]
                    for key in parts["in"]:
                        self.see(key, xw)
                if "out" in parts:
                    hw = gated_product(experts, e, x) * w[:, None]
                    for key in parts["out"]:
                        self.see(key, hw)

        return see

    def see(self, own: str, x: torch.Tensor) -> None:
        """Add input ``x`` (..., features) of the targeted layer ``own`` to its statistics."""
        if x.shape[-1] != self.n_in[own]:
            raise SparsetoolError(
                f"a targeted layer takes {x.shape[-1]} inputs but its weight has "
                f"{self.n_in[own]}; the input dimension of this model is not "
                "known"
            )
        seen = self._window.get(id(x))
        if seen is not None and seen[0] is not x:
            seen = None  # the id of a tensor that is gone
        stats = self._of.get(own)
        if stats is None:  # the layer's first run: it joins the statistics of the tensor it reads
            if self._windows:
                raise CheckpointError(
                    f"layer {own!r} ran in a later calibration window but not "
                    "in the first; please report this"
                )
            if seen is not None:
                stats = seen[1]
            else:
                stats = InputStatistics(self.n_in[own], self.hessian, self.device, self.moments)
                self.inputs.append(stats)
            self._of[own] = stats
            stats.users.append(own)
        if seen is not None and seen[1] is not stats or seen is None and stats.users[0] != own:
            raise CheckpointError(
                f"layer {own!r} shares its input differently from one "
                "calibration window to the next; please report this"
            )
        if seen is not None and own not in seen[2]:  # this window's tensor is in already
            seen[2].add(own)
            return
        if x.numel():
            stats.add(x.detach().reshape(-1, x.shape[-1]).float())
        if seen is None:
            self._window[id(x)] = (x, stats, {own})

    def window_done(self) -> None:
        """Between two windows: forget which tensors this one's layers read."""
        self._window.clear()
        self._windows += 1

    def solve_order(self, cost: Callable[[str], int]) -> list[str]:
        """Every layer, in the order to prune them: the layers of one input together, inputs by
        the largest ``cost`` of their layers (ties: as first seen), so the costliest solve runs
        when the fewest statistics are still held. A layer that never ran gets zeros."""
        for own in self.n_in:
            if own not in self._of:
                stats = InputStatistics(self.n_in[own], self.hessian, self.device, self.moments)
                self._of[own] = stats
                stats.users.append(own)
                self.inputs.append(stats)
        for stats in self.inputs:
            stats.left = len(stats.users)
        ranked = sorted(self.inputs, key=lambda st: max(cost(own) for own in st.users))
        return [own for stats in ranked for own in stats.users]

    def groups(self) -> list[list[str]]:
        """The layers (model names) that share each input, inputs in the order first seen."""
        return [list(st.users) for st in self.inputs]

    def of(self, own: str) -> InputStatistics:
        return self._of[own]

    def release(self, own: str) -> None:
        """``own`` is pruned: drop its input's statistics if it was the last of their layers."""
        stats = self._of.pop(own)
        stats.left -= 1
        if stats.left == 0:
            stats.drop()
            self.inputs.remove(stats)


def gather_statistics(
    model: BlockModel,
    i: int,
    layers: dict[str, LogicalTensor],
    calls: list[Call],
    placement: Placement,
    *,
    hessian: bool,
    moments: bool,
    outputs: list | None = None,
) -> BlockStatistics:
    """Run every window (``calls``) through block ``i`` of ``model`` (loaded) with hooks on its
    targeted ``layers`` (key -> tensor, placed by ``placement``): their input statistics, with
    ``X^T X`` when ``hessian``, DSnoT's moments when ``moments``. The block's outputs go into
    ``outputs`` when it is given (the block as it is now)."""
    stats = BlockStatistics(
        {key: placement.n_in(lt) for key, lt in layers.items()}, hessian, model.device, moments
    )
    hooks = []
    experts: dict[str, tuple[torch.nn.Module, dict[int, dict[str, list[str]]]]] = {}
    for key in layers:
        place = placement.where[key]
        owner = place.own.rpartition(".")[0]
        if place.experts is None:
            hooks.append(model.module.get_submodule(owner).register_forward_hook(stats.hook(key)))
        else:
            units = experts.setdefault(owner, (place.experts, {}))[1]
            if place.expert is None:  # a unit of an experts module is one expert's
                raise AssertionError(f"{key}: an experts unit without its expert")
            units.setdefault(place.expert, {}).setdefault(place.part, []).append(key)
    for module, units in experts.values():
        hooks.append(
            module.register_forward_pre_hook(stats.experts_hook(module, units), with_kwargs=True)
        )
    try:
        for call in calls:
            out = model.run_block(i, call)
            if outputs is not None:
                outputs.append(call.passed(out))
            stats.window_done()
    finally:
        for h in hooks:
            h.remove()
    return stats
