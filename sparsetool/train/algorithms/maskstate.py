"""The mask state of a sparsifier, kept beside the model as torch.ao.pruning does: one bool mask
per sparse parameter, keyed by its full name, never inside the weights.

:class:`MaskState` holds the masks and what keeps them true -- pruned weights and their optimizer
moments at exactly +0.0, gradients of pruned weights at 0 -- and reports sparsity from them. It
decides nothing: which weights are kept is the business of :class:`~.base.Sparsifier`, which
derives from it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch

from sparsetool.errors import ConfigError
from sparsetool.train.sharding import count_kept, gathered, is_sharded, laid_out_like

__all__ = ["MaskState"]


class MaskState:
    """Masks of the sparse parameters and their application (a mixin of ``Sparsifier``).

    Attributes: ``masks`` (name -> bool tensor, True = kept), ``densified`` (masks dropped for
    good), ``_params`` (name -> the sparse parameters, in the model's order), ``_optimizer``
    (whose same-shaped state is zeroed with the weights, or None), ``_grown`` (weights regrown
    by the update of the current step).
    """

    masks: dict[str, torch.Tensor]
    densified: bool
    last_update: dict[str, dict[str, int]]  # the Sparsifier's: name -> weights dropped and grown
    last_event: dict[str, Any] | None

    def _init_mask_state(self) -> None:
        self._params: dict[str, torch.nn.Parameter] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self._grown: dict[str, torch.Tensor] = {}
        self._grown_before: dict[str, torch.Tensor] = {}  # regrown by the last update that grew
        self._pruned_cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._kept_cache: dict[str, tuple[torch.Tensor, int]] = {}
        self._decisions: dict[str, tuple[torch.Tensor, str]] = {}  # sharded: digest of the whole

    def _laid_out(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """The whole mask ``whole`` of parameter ``name`` (the same on every rank) in that
        parameter's layout (:mod:`sparsetool.train.sharding`), its count of kept weights noted
        on the way."""
        mask = laid_out_like(whole.to(torch.bool), self._params[name])
        self._kept_cache[name] = (mask, int(whole.sum()))
        if is_sharded(mask):  # this rank's decision, before it kept only its slice
            self._decisions[name] = (mask, _digest(whole))
        return mask

    def decisions_digest(self) -> str:
        """SHA-256 over the names and whole masks this rank decided on: equal on every rank
        when the ranks' decisions agreed bit for bit. A sharded mask this rank did not decide on
        itself (one loaded from a checkpoint) is gathered whole (a collective)."""
        h = hashlib.sha256()
        for name in sorted(self.masks):
            mask = self.masks[name]
            decided = self._decisions.get(name)
            h.update(name.encode())
            h.update(
                (
                    decided[1]
                    if decided is not None and decided[0] is mask
                    else _digest(gathered(mask))
                ).encode()
            )
        return h.hexdigest()

    def _laid_out_grown(self, name: str, whole: torch.Tensor) -> torch.Tensor:
        """Weights regrown in parameter ``name`` (a whole bool tensor) in its layout."""
        return laid_out_like(whole.to(torch.bool), self._params[name])

    def _adopt_grown(self) -> None:
        """The weights regrown by the last update (a resume's saved state) in their parameters'
        layouts and devices, as the masks they are compared with."""
        self._grown_before = {
            n: g.to(torch.bool) if is_sharded(g) else self._laid_out_grown(n, g)
            for n, g in self._grown_before.items()
            if n in self._params
        }

    def _whole_mask(self, name: str) -> torch.Tensor:
        """The whole mask of ``name`` (gathered if it is sharded: a collective)."""
        return gathered(self.masks[name])

    def _kept(self, name: str) -> int:
        """Kept weights of mask ``name``: noted when the mask was made, else counted (a
        collective for a sharded mask) and cached while it is the same tensor object."""
        mask = self.masks[name]
        cached = self._kept_cache.get(name)
        if cached is None or cached[0] is not mask:
            cached = (mask, count_kept(mask))
            self._kept_cache[name] = cached
        return cached[1]

    def _adopt(self, given: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``given`` masks checked against the sparse parameters (names and shapes), as bool
        tensors in the parameters' layouts (a whole mask given for a sharded parameter keeps
        this rank's slice; a sharded one is taken as it is)."""
        missing = [n for n in self._params if n not in given]
        extra = [n for n in given if n not in self._params]
        if missing or extra:
            raise ConfigError(
                f"saved masks do not match the sparse parameters: missing {missing[:4]}, "
                f"unexpected {extra[:4]}; resume with the same model and param_filter"
            )
        out = {}
        for name, p in self._params.items():
            m = given[name]
            if tuple(m.shape) != tuple(p.shape):
                raise ConfigError(
                    f"mask for {name} has shape {tuple(m.shape)}, the parameter {tuple(p.shape)}"
                )
            if is_sharded(m):
                out[name] = m.to(torch.bool).clone()
            elif is_sharded(p):
                out[name] = laid_out_like(m.to(torch.bool), p)
            else:
                out[name] = m.to(device=p.device, dtype=torch.bool).clone()
        return out

    def _pruned(self, name: str, mask: torch.Tensor) -> torch.Tensor:
        """``~mask``, cached while the mask is the same tensor object (every change here makes a
        new tensor): saves an allocation and a pass over the tensor twice per step."""
        cached = self._pruned_cache.get(name)
        if cached is None or cached[0] is not mask:
            cached = (mask, ~mask)
            self._pruned_cache[name] = cached
        return cached[1]

    @torch.no_grad()
    def _apply(
        self, masks: Mapping[str, torch.Tensor], also_zero: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Pruned weights, and every same-shaped optimizer state tensor (AdamW ``exp_avg``,
        ``exp_avg_sq``, ``max_exp_avg_sq``; SGD ``momentum_buffer``) to +0.0 at pruned positions.
        ``masked_fill_`` rather than multiply: ``-w * 0`` is -0.0 and ``nan * 0`` is NaN."""
        for name, p in self._params.items():
            zero = self._pruned(name, masks[name])
            if also_zero and name in also_zero:
                zero = zero | also_zero[name]
            p.masked_fill_(zero, 0.0)
            if self._optimizer is not None:
                for value in self._optimizer.state.get(p, {}).values():
                    if torch.is_tensor(value) and value.shape == p.shape:
                        value.masked_fill_(zero, 0.0)

    def _mask_grads(self) -> None:
        """Zero the gradient of every pruned weight, and of every weight regrown at this step (so
        that it enters the next step at exactly 0 with zero AdamW moments)."""
        for name, p in self._params.items():
            if p.grad is None:
                continue
            frozen = self._pruned(name, self.masks[name])
            grown = self._grown.get(name)
            if grown is not None:
                frozen = frozen | grown
            p.grad.masked_fill_(frozen, 0.0)

    def _finish_update(
        self, step: int, new_masks: dict[str, torch.Tensor], fraction: float
    ) -> None:
        """Install ``new_masks`` and record the update's totals in :attr:`last_event`: weights
        dropped and grown over all tensors, the drop fraction used, and the fraction of the
        weights grown at the previous update that this one kept (None when it grew none)."""
        prev = self._grown_before
        grown_prev = sum(count_kept(g) for g in prev.values())
        survived = None
        if grown_prev:
            kept = sum(count_kept(g & new_masks[n]) for n, g in prev.items() if n in new_masks)
            survived = kept / grown_prev
        self.last_event = {
            "algorithm": getattr(self, "name", ""),
            "dropped": sum(u["dropped"] for u in self.last_update.values()),
            "grown": sum(u["grown"] for u in self.last_update.values()),
            "drop_fraction": round(float(fraction), 6),
            "grown_survived": None if survived is None else round(survived, 6),
        }
        self._grown_before = {n: g.clone() for n, g in self._grown.items()}
        self.masks = new_masks
        self._apply(self.masks, also_zero=self._grown)

    # ----------------------------------------------------------------- reporting

    def sparsity(self) -> float:
        """Current overall sparsity of the sparse tensors, from the masks (0.0 once densified)."""
        if self.densified or not self.masks:
            return 0.0
        total = sum(m.numel() for m in self.masks.values())
        kept = sum(self._kept(n) for n in self.masks)
        return 1.0 - kept / total

    def layer_sparsity(self) -> dict[str, float]:
        """Sparsity of each sparse tensor, from the masks."""
        return {n: 1.0 - self._kept(n) / m.numel() for n, m in self.masks.items()}

    # ----------------------------------------------------------------- dropping, sharing

    def densify(self) -> None:
        """Drop every mask (SPDF dense fine-tuning, the dense stage 2 of Variable SPDF; Thangarasa
        et al. 2023). Pruned weights are 0.0 now and trainable from the next step on, their AdamW
        moments start from 0."""
        self.masks = {}
        self._grown = {}
        self._grown_before = {}
        self._pruned_cache = {}
        self._kept_cache = {}
        self._decisions = {}
        self.densified = True

    def broadcast_masks(self) -> None:
        """When torch.distributed is initialised, copy rank 0's masks to every rank and re-apply
        them (a safety net: the update rules are already deterministic across ranks)."""
        import torch.distributed as dist

        if self.densified or not (dist.is_available() and dist.is_initialized()):
            return
        for name in list(self.masks):
            buf = self._whole_mask(name).to(torch.uint8)  # gloo has no bool broadcast
            dist.broadcast(buf, src=0)
            self.masks[name] = (
                self._laid_out(name, buf) if name in self._params else buf.to(torch.bool)
            )
        self._apply(self.masks)


def _digest(whole: torch.Tensor) -> str:
    return hashlib.sha256(whole.to("cpu", torch.uint8).contiguous().numpy().tobytes()).hexdigest()
