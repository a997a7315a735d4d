"""``--ffn``, ``--heads``, ``--hidden``: each block's FFN, attention and norms found by the names
transformers gives them, and their scores gathered by hooks while the calibration windows run
block by block (mean |activation| per channel, mean L2 norm per query head, summed |norm output|
per embedding channel)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.refit import Gram
from sparsetool.util.progress import Progress

FFN_IN = ("gate_proj", "up_proj", "c_fc")  # read the block's input; rows = channels

FFN_OUT = ("down_proj", "c_proj")  # reads the channels

PER_HEAD_NORMS = ("q_norm", "k_norm")  # over heads' widths, not the hidden size


@dataclass
class Layer:
    """One block's FFN and attention modules (model paths) and their scores."""

    ffn_in: list[str] = field(default_factory=list)  # gate/up (or c_fc) module paths
    ffn_out: str = ""
    q: str = ""
    k: str = ""
    v: str = ""
    o: str = ""
    norms: list[str] = field(default_factory=list)  # --hidden: norms over the hidden size
    channels: torch.Tensor | None = None
    heads: torch.Tensor | None = None
    tokens: int = 0
    gram_ffn: Gram | None = None  # the down projection's inputs (reconstruction)
    gram_o: Gram | None = None  # the output projection's inputs (reconstruction)
    held_ffn: Gram | None = None  # the same over the held-back windows
    held_o: Gram | None = None


@dataclass
class Hidden:
    """``--hidden``: each embedding channel's summed |norm output| and the tokens seen."""

    sums: torch.Tensor | None = None
    tokens: int = 0
    keep: int = 0  # channels kept
    axes: dict[str, int | None] = field(default_factory=dict)  # parameter -> its hidden axis


def find_layer(model: BlockModel, i: int, opts: ShrinkOptions) -> Layer:
    """Block ``i``'s FFN and attention projections, by the names transformers gives them."""
    block = model.block_list[i]
    base = f"{model.block_prefix}.{i}"
    layer = Layer()
    names = dict(block.named_modules())
    if opts.ffn is not None:
        mlp = next((n for n in ("mlp", "feed_forward") if n in names), None)
        found_in = [f"{mlp}.{p}" for p in FFN_IN if f"{mlp}.{p}" in names] if mlp else []
        found_out = [f"{mlp}.{p}" for p in FFN_OUT if f"{mlp}.{p}" in names] if mlp else []
        if not found_in or len(found_out) != 1:
            raise SparsetoolError(
                f"{model.path}: block {i} has no feed-forward layer shrink knows (gate_proj/"
                "up_proj/down_proj or c_fc/c_proj under mlp); --ffn cannot narrow it"
            )
        layer.ffn_in = [f"{base}.{n}" for n in found_in]
        layer.ffn_out = f"{base}.{found_out[0]}"
    if opts.heads is not None or opts.hidden is not None:
        attn = next((n for n in ("self_attn", "attn") if n in names), None)
        parts = {p: f"{attn}.{p}_proj" for p in "qkvo"} if attn else {}
        if not parts or any(n not in names for n in parts.values()):
            what = (
                "--heads cannot remove heads of it"
                if opts.heads is not None
                else "--hidden cannot narrow it"
            )
            raise SparsetoolError(
                f"{model.path}: block {i}'s attention has no separate q_proj, k_proj, v_proj and "
                "o_proj (a fused projection, GPT-2's c_attn, holds every head in one matrix whose "
                f"width the config ties to the hidden size); {what}"
            )
        if opts.heads is not None:
            layer.q, layer.k, layer.v, layer.o = (f"{base}.{parts[p]}" for p in "qkvo")
    if opts.hidden is not None:
        layer.norms = [f"{base}.{n}" for n, m in names.items() if is_norm(model, m, n)]
    return layer


def is_norm(model: BlockModel, module: torch.nn.Module, name: str) -> bool:
    """Whether ``module`` (``name`` in its block or model) normalises over the hidden size."""
    weight = getattr(module, "weight", None)
    leaf = name.rsplit(".", 1)[-1]
    return (
        "norm" in leaf.lower()
        and leaf not in PER_HEAD_NORMS
        and isinstance(weight, torch.Tensor)
        and weight.ndim == 1
        and weight.shape[0] == model.width
    )


class BlockRefit(Protocol):
    """What refits a block as the scoring pass goes (:class:`~.width_refit.Refitter`)."""

    def hooks(self, layer: Layer) -> list[torch.utils.hooks.RemovableHandle]:
        """The hooks gathering what the refit of ``layer`` needs."""
        ...

    def block(self, i: int) -> None:
        """Block ``i`` scored: cut and refit it in memory."""
        ...


def score_widths(
    model: BlockModel,
    layers: list[Layer],
    windows: torch.Tensor,
    progress: Progress | None,
    hidden: Hidden | None = None,
    refit: BlockRefit | None = None,
) -> None:
    """Each layer's channel and head scores, and the embedding channels' (``hidden``), from the
    calibration windows: of the original model, or with ``refit`` of the model as shrunk so far
    (each block cut and refit once scored, then run again for the next block's inputs)."""
    blocks = BlockPass(model, windows, "score", progress, final=hidden is not None)
    for step in blocks:
        i, layer = step.index, layers[step.index]
        handles = []
        if layer.ffn_out:
            handles.append(_hook(model, layer.ffn_out, layer, "channels", None))
        if layer.o:
            handles.append(_hook(model, layer.o, layer, "heads", _head_dim(model, layer)))
        if hidden is not None:
            handles += [_norm_hook(model, n, hidden) for n in layer.norms]
        if refit is not None:
            handles += refit.hooks(layer)
        try:
            step.run()
        finally:
            for h in handles:
                h.remove()
        if refit is not None:
            refit.block(i)  # this block cut and refit in memory: run it again
            step.run()
    if hidden is not None:
        with torch.no_grad():
            hidden.tokens = sum(int(row.numel()) for row in windows)
            _final_norm_scores(model, blocks.calls, hidden)


def _norm_hook(model: BlockModel, path: str, hidden: Hidden):
    """A forward hook on the norm ``path`` adding its output's per-channel sum of |y|."""

    def see(module, args, output) -> None:
        _add_abs(hidden, output[0] if isinstance(output, tuple) else output)

    return model.module.get_submodule(path).register_forward_hook(see)


def _add_abs(hidden: Hidden, y: torch.Tensor) -> None:
    add = y.reshape(-1, y.shape[-1]).float().abs().double().sum(0).cpu()
    hidden.sums = add if hidden.sums is None else hidden.sums + add


def _final_norm_scores(model: BlockModel, calls: list, hidden: Hidden) -> None:
    """The final norms' outputs (the head's input) on the last block's outputs ``calls``."""
    norms = {n.rsplit(".", 1)[0] for n in model.outer} - {""}
    found = [n for n in sorted(norms) if is_norm(model, model.module.get_submodule(n), n)]
    names = [p for p in model.outer if p.rsplit(".", 1)[0] in found]
    model.load(names)
    try:
        for n in found:
            norm = model.module.get_submodule(n)
            for call in calls:
                _add_abs(hidden, norm(call.hidden))
    finally:
        model.release(names)


def _head_dim(model: BlockModel, layer: Layer) -> int:
    cfg: Any = model.module.config
    return int(getattr(cfg, "head_dim", None) or model.width // int(cfg.num_attention_heads))


def _hook(model: BlockModel, path: str, layer: Layer, what: str, head_dim: int | None):
    """A forward pre-hook on ``path`` adding its input's per-channel mean |x| (or per-head mean
    L2 norm, ``head_dim`` wide slices) into ``layer``."""

    def see(module, args, kwargs) -> None:
        x = args[0] if args else next(iter(kwargs.values()))
        x = x.reshape(-1, x.shape[-1]).float()
        if head_dim is None:
            add = x.abs().double().sum(0)
        else:
            add = x.view(x.shape[0], -1, head_dim).norm(dim=-1).double().sum(0)
        old = getattr(layer, what)
        setattr(layer, what, add.cpu() if old is None else old + add.cpu())
        if what == "channels" or not layer.ffn_out:
            layer.tokens += x.shape[0]

    return model.module.get_submodule(path).register_forward_pre_hook(see, with_kwargs=True)
