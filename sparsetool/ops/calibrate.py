"""Calibration pruning (``prune --method wanda|sparsegpt``): the model, block by block.

Both papers prune a transformer one block at a time. Calibration text is tokenized by the model's
own tokenizer (bytes for sparsetool's GPT, as ``eval`` does) and cut into ``samples`` windows of
``seq`` tokens, chosen among the non-overlapping windows of the text by ``seed``. The inputs of
block 0 are captured with a forward pre-hook; then for each block in order:

1. the current inputs run through the block while hooks on its targeted linear layers accumulate
   their input statistics (Wanda: the sum of squares of each input feature; SparseGPT: ``X^T X``);
2. each targeted weight of the block is pruned (:mod:`sparsetool.masks.wanda`,
   :mod:`sparsetool.masks.sparsegpt`) and its statistics dropped;
3. the inputs run through the pruned block; its outputs are the next block's inputs.

Memory holds the model, one block's activations for the calibration set and one block's
statistics; never every layer's ``X^T X`` at once. The checkpoint is then written by ``prune``'s own
writer (:func:`sparsetool.ops.prune.prune_checkpoint`): same layout, encodings and counts; Wanda
writes the input's weights under the new mask, SparseGPT its updated weights.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sparsetool.checkpoint import Checkpoint, LogicalTensor
from sparsetool.checkpoint.zeros import count_nonzero
from sparsetool.errors import SparsetoolError
from sparsetool.masks.distributions import keep_counts
from sparsetool.masks.sparsegpt import sparsegpt_prune
from sparsetool.masks.wanda import wanda_mask
from sparsetool.ops.lm import Model, load_model, read_text
from sparsetool.ops.prune_options import PruneOptions
from sparsetool.targets import TargetPlan
from sparsetool.wording import plural

__all__ = ["CalibratedPlanner", "calibration_windows", "find_blocks"]

NEEDS = "calibration pruning (--method wanda or sparsegpt) runs causal language models only"
Progress = Callable[[str, int, int], None]


class _Captured(Exception):
    """Raised by the hook on block 0 once its inputs are stored: the rest of the model is not run."""


def calibration_windows(ids: list[int], samples: int, seq: int, seed: int, source: str) -> torch.Tensor:
    """``samples`` windows (rows) of ``seq`` tokens: distinct non-overlapping windows of the text,
    picked at random by ``seed`` and kept in text order."""
    need = samples * seq
    if len(ids) < need:
        raise SparsetoolError(
            f"--calibration {source}: {plural(len(ids), 'token')} for this model's tokenizer, but "
            f"--samples {samples} x --seq {seq} needs {need:,}; give more text or lower "
            "--samples or --seq")
    n = len(ids) // seq
    pick = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:samples].sort().values
    t = torch.tensor(ids[: n * seq], dtype=torch.long).view(n, seq)
    return t[pick]


def find_blocks(module: torch.nn.Module, params: list[str]) -> tuple[str, torch.nn.ModuleList]:
    """The ModuleList of transformer blocks: the one holding the most of ``params`` (model names)."""
    best: tuple[int, str, Any] = (0, "", None)
    for prefix, m in module.named_modules():
        if isinstance(m, torch.nn.ModuleList) and len(m):
            inside = sum(1 for p in params if p.startswith(prefix + ".") and
                         p[len(prefix) + 1:].split(".")[0].isdigit())
            if inside > best[0]:
                best = (inside, prefix, m)
    if best[2] is None:
        raise SparsetoolError(f"no transformer blocks hold the targeted tensors; {NEEDS}")
    return best[1], best[2]


def _block_of(prefix: str, name: str) -> int | None:
    if not name.startswith(prefix + "."):
        return None
    head = name[len(prefix) + 1:].split(".")[0]
    return int(head) if head.isdigit() else None


class _Stats:
    """One targeted layer's input statistics, fed by a forward hook."""

    def __init__(self, n_in: int, hessian: bool):
        self.n_in = n_in
        self.sq = torch.zeros(n_in, dtype=torch.float64)
        self.h = torch.zeros(n_in, n_in, dtype=torch.float32) if hessian else None

    def __call__(self, module, args, output) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        if x.shape[1] != self.n_in:
            raise SparsetoolError(f"a targeted layer takes {x.shape[1]} inputs but its weight has "
                                  f"{self.n_in}; the input dimension of this model is not known")
        if self.h is not None:
            self.h += x.T @ x
        else:
            self.sq += x.double().pow(2).sum(0)


class CalibratedPlanner:
    """Decides each targeted tensor's mask (and, for SparseGPT, values) by running calibration
    text through the model; the interface ``prune_checkpoint`` writes from (``prepare``,
    ``mask``, ``nonzero_after``). ``existing(ckpt, lt)`` reads a tensor as prune does (dense,
    alive mask; refusing NaN and inf)."""

    needs_first_pass = True

    def stream(self, lt, sw) -> None:
        """No fast path: the masks come from activations, decided in ``prepare``."""
        return None

    def __init__(self, ckpt: Checkpoint, targets: list[LogicalTensor], opts: PruneOptions,
                 progress: Progress | None, plan: TargetPlan,
                 existing: Callable[[Checkpoint, LogicalTensor], tuple[torch.Tensor, torch.Tensor]]):
        self.ckpt, self.targets, self.opts, self.progress = ckpt, targets, opts, progress
        self.target_plan, self.existing = plan, existing
        self.keep: dict[str, int] = {}
        if opts.sparsity is not None:
            self.keep = keep_counts({lt.name: tuple(lt.shape) for lt in targets}, opts.sparsity,
                                    opts.distribution)
        self.nonzero_before: dict[str, int] = {}
        self.nonzero_after: dict[str, int] = {}
        self._kept: dict[str, torch.Tensor] = {}
        self._params: dict[str, torch.nn.Parameter] = {}

    def prepare(self) -> None:
        for lt in self.targets:  # refuse NaN/inf before the long part, and count what is there
            entry = self.target_plan[lt.name]
            if entry.layout not in ("linear", "conv1d"):
                raise SparsetoolError(
                    f"tensor {lt.name!r} {list(lt.shape)}: --method {self.opts.method} prunes "
                    "linear layers (2-D weights) only; leave it out with --exclude")
            _dense, alive = self.existing(self.ckpt, lt)
            self.nonzero_before[lt.name] = count_nonzero(alive)
        text = read_text(self.opts.calibration, "--calibration")  # a bad file fails before the model loads
        model = load_model(self.ckpt.path, NEEDS)
        with torch.no_grad():
            self._run(model, text)
        for name, kept in self._kept.items():
            self.nonzero_after[name] = count_nonzero(kept)

    def mask(self, lt: LogicalTensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        dense, _alive = self.existing(self.ckpt, lt)
        kept = self._kept.pop(lt.name)
        if self.opts.method == "sparsegpt":  # the updated weights, in the input's dtype
            dense = self._params.pop(lt.name).detach().to(dense.dtype)
        return dense, kept, self.nonzero_before[lt.name]

    # ------------------------------------------------------------------ the block-by-block run
    def _run(self, model: Model, text: str) -> None:
        o = self.opts
        by_ckpt = {ckpt: own for own, ckpt in model.names.items()}
        own_params = dict(model.module.named_parameters())
        targets: dict[str, str] = {}  # model name -> checkpoint name
        for lt in self.targets:
            own = by_ckpt.get(lt.name)
            if own is None or own not in own_params:
                raise SparsetoolError(f"tensor {lt.name!r} is not a parameter of the {model.kind} "
                                      "model; leave it out with --exclude")
            targets[own] = lt.name
        prefix, blocks = find_blocks(model.module, list(targets))
        per_block: dict[int, list[str]] = {}
        for own, name in targets.items():
            i = _block_of(prefix, own)
            if i is None:
                raise SparsetoolError(
                    f"tensor {name!r} is outside the transformer blocks ({prefix}.N); --method "
                    f"{o.method} prunes block weights only: leave it out with --exclude")
            per_block.setdefault(i, []).append(own)

        if o.seq > model.context:
            raise SparsetoolError(f"--seq {o.seq}: {self.ckpt.path} takes at most {model.context} "
                                  f"tokens at once; use --seq {model.context} or less")
        windows = calibration_windows(model.encode(text).ids, o.samples, o.seq, o.seed, o.calibration)
        hidden, args, kwargs = self._capture(model, blocks, windows)
        last = max(per_block)
        for i in range(last + 1):
            names = per_block.get(i, [])
            if names:
                stats = {own: _Stats(self._n_in(targets[own], own_params[own]),
                                     o.method == "sparsegpt") for own in names}
                hooks = [model.module.get_submodule(own.rpartition(".")[0]).register_forward_hook(stats[own])
                         for own in names]
                try:
                    for x in hidden:
                        _call(blocks[i], x, args, kwargs)
                finally:
                    for h in hooks:
                        h.remove()
                for own in names:
                    self._prune(targets[own], own_params[own], stats.pop(own))
            if i < last:
                hidden = [_call(blocks[i], x, args, kwargs) for x in hidden]
            if self.progress:
                self.progress("calibrate", i + 1, last + 1)

    def _n_in(self, name: str, p: torch.nn.Parameter) -> int:
        """Input features of a weight: a GPT-2 Conv1D weight is stored (in, out)."""
        return p.shape[0] if self.target_plan[name].layout == "conv1d" else p.shape[1]

    def _prune(self, name: str, p: torch.nn.Parameter, stats: _Stats) -> None:
        o = self.opts
        conv = self.target_plan[name].layout == "conv1d"
        w = p.T if conv else p
        alive = w != 0
        keep = None if o.nm is not None else self.keep.get(name, w.numel() - round(o.sparsity * w.numel()))
        try:
            if o.method == "wanda":
                kept = wanda_mask(w, stats.sq, keep=keep, nm=o.nm, existing=alive)
                new = w * kept
            else:
                new, kept = sparsegpt_prune(w, stats.h, keep=keep, nm=o.nm, existing=alive,
                                            blocksize=o.blocksize, dampening=o.dampening)
        except SparsetoolError as e:
            raise SparsetoolError(f"tensor {name!r} {list(p.shape)}: {e}") from None
        new = torch.where(kept, new.to(p.dtype), torch.zeros((), dtype=p.dtype))
        p.copy_(new.T if conv else new)
        self._kept[name] = kept.T.contiguous() if conv else kept
        self._params[name] = p

    def _capture(self, model: Model, blocks: torch.nn.ModuleList, windows: torch.Tensor):
        """Block 0's input for each window, and the other arguments it was called with."""
        hidden: list[torch.Tensor] = []
        call: dict[str, Any] = {}

        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            hidden.append(x.detach())
            call.setdefault("args", args[1:] if args else ())
            call.setdefault("kwargs", {k: v for k, v in kwargs.items() if k != "hidden_states"})
            raise _Captured

        handle = blocks[0].register_forward_pre_hook(hook, with_kwargs=True)
        try:
            for row in windows:
                try:
                    model.logits(row.unsqueeze(0))
                except _Captured:
                    pass
        finally:
            handle.remove()
        if not hidden:
            raise SparsetoolError(f"the model never ran its first block; {NEEDS}")
        return hidden, call["args"], call["kwargs"]


def _call(block: torch.nn.Module, x: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
    out = block(x, *args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out
