"""``--ffn``/``--heads`` with reconstruction: each block's kept channels and heads chosen as soon as
it is scored and the projections that read them refit by least squares, in memory, before the
block runs again for the next one's inputs (:class:`Refitter`); the memory that takes."""

from __future__ import annotations

from typing import cast

import torch

from sparsetool.checkpoint.spill import TensorSpill
from sparsetool.errors import SparsetoolError
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.shrink.memory import widths_statistics
from sparsetool.ops.shrink.options import ShrinkOptions
from sparsetool.ops.shrink.refit import DAMPINGS, Gram, held_windows, is_held, refit_columns
from sparsetool.ops.shrink.results import (
    LeastSquares,
    WidthsNarrowed,
)
from sparsetool.ops.shrink.width_cuts import (
    Cut,
    choose_layer,
    stored_name,
)
from sparsetool.ops.shrink.width_plan import (
    Geometry,
    WidthPlan,
)
from sparsetool.ops.shrink.width_scores import (
    Layer,
)


def refits(opts: ShrinkOptions) -> bool:
    """Whether the run refits: ``--ffn`` or ``--heads`` without ``--no-reconstruct``."""
    return opts.reconstruct and (opts.ffn is not None or opts.heads is not None)


class Refitter:
    """``--ffn``/``--heads`` with reconstruction. Each block's kept channels and heads are chosen
    as soon as it is scored (on what the shrunk blocks before it feed it); the projections that
    read them (the FFN's down projection, attention's output projection) are refit by least
    squares on the block's calibration inputs (:mod:`sparsetool.ops.shrink.refit`) and put into
    the block in memory, the removed inputs' columns at zero (which computes what the narrower
    block computes), before the block runs again for the next one's inputs. Each refit's damping
    is chosen on the held-back windows (:func:`~sparsetool.ops.shrink.refit.is_held`), and a layer
    no damping improves there keeps its plain slice. The refit weights,
    in the stored dtype and orientation, wait for the writer; the ``X^T X`` of a block is freed
    once it is refit."""

    def __init__(
        self,
        model: BlockModel,
        layers: list[Layer],
        g: Geometry,
        plan: WidthPlan,
        spill: TensorSpill,
        windows: int,
    ):
        self.model, self.layers, self.geometry, self.plan = model, layers, g, plan
        self.windows = windows  # calibration windows, in the order each block sees them
        self.cuts: dict[str, Cut] = {}
        # stored name -> the axis its refit tensor (in ``spill``: one tensor in memory at a time,
        # whatever the depth) is already cut along to the kept inputs; None: a bias
        self.values: dict[str, int | None] = {}
        self.spill = spill
        self.layer_records: list[dict] = []

    def hooks(self, layer: Layer) -> list:
        """Forward pre-hooks gathering ``X^T X`` of the inputs of ``layer``'s projections."""
        handles = []
        if layer.ffn_out:
            layer.gram_ffn, layer.held_ffn = Gram(), Gram()
            handles.append(
                _gram_hook(self.model, layer.ffn_out, layer.gram_ffn, layer.held_ffn, self.windows)
            )
        if layer.o:
            layer.gram_o, layer.held_o = Gram(), Gram()
            handles.append(
                _gram_hook(self.model, layer.o, layer.gram_o, layer.held_o, self.windows)
            )
        return handles

    def block(self, i: int) -> None:
        """Choose block ``i``'s kept channels and heads, refit its projections (in memory)."""
        layer = self.layers[i]
        rec = choose_layer(self.model, i, layer, self.geometry, self.plan, self.cuts)
        if layer.ffn_out and layer.gram_ffn is not None:
            conv1d = layer.ffn_out.endswith("c_proj")
            rec["ffn_refit"] = self._refit(
                layer.ffn_out, layer.gram_ffn, layer.held_ffn, rec["ffn_kept"], conv1d
            )
        if layer.o and layer.gram_o is not None:
            hd = self.geometry.head_dim
            rows = [h * hd + d for h in rec["heads_kept"] for d in range(hd)]
            rec["o_refit"] = self._refit(layer.o, layer.gram_o, layer.held_o, rows, False)
        layer.gram_ffn = layer.gram_o = layer.held_ffn = layer.held_o = None
        self.layer_records.append(rec)

    def _refit(
        self, path: str, gram: Gram, held: Gram | None, kept: list[int], conv1d: bool
    ) -> dict:
        model = self.model
        module = model.module.get_submodule(path)
        stored_w = stored_name(model, f"{path}.weight")
        stored_b = stored_name(model, f"{path}.bias")
        if stored_w is None:
            raise SparsetoolError(f"{model.path}: {path}.weight is not stored; cannot refit it")
        w = model.ckpt.read_stored(stored_w)  # the stored precision, not the compute dtype's
        b = model.ckpt.read_stored(stored_b) if stored_b is not None else None
        fit = refit_columns(w.T if conv1d else w, gram, kept, bias=b, held=held)
        k = torch.tensor(kept, dtype=torch.long)
        full = torch.zeros((w.shape[1], w.shape[0]) if conv1d else w.shape, dtype=torch.float64)
        full[:, k] = fit.weight  # (out, in), the removed inputs' columns at zero
        weight = cast(torch.Tensor, module.weight)
        weight.copy_((full.T if conv1d else full).to(weight.dtype))
        kept_w = fit.weight.T if conv1d else fit.weight
        self._keep(stored_w, kept_w.to(w.dtype), 0 if conv1d else 1)
        if b is not None and stored_b is not None and fit.bias is not None:
            bias = cast(torch.Tensor, module.bias)
            bias.copy_(fit.bias.to(bias.dtype))
            self._keep(stored_b, fit.bias.to(b.dtype), None)
        return fit.record()

    def _keep(self, name: str, t: torch.Tensor, axis: int | None) -> None:
        self.spill.put(name, t)
        self.values[name] = axis

    def record(self) -> WidthsNarrowed:
        """The widths' record with each layer's refit errors and their summary."""
        kinds = [k for k in ("ffn_refit", "o_refit") if any(k in r for r in self.layer_records)]
        fits = [r[k] for r in self.layer_records for k in kinds if k in r]
        names = {"ffn_refit": self.layers[0].ffn_out, "o_refit": self.layers[0].o}
        held = held_windows(self.windows)
        checked = [f for f in fits if "held_before" in f]
        extra = {
            "held_back_windows": held,
            "dampings": list(DAMPINGS),
            "layers_refit": sum(not f["kept_plain"] for f in checked),
            "layers_kept_plain": len(fits) - sum(not f["kept_plain"] for f in checked),
        }
        if checked:
            extra["held_before"] = sum(f["held_before"] for f in checked) / len(checked)
            extra["held_after"] = sum(f["held_after"] for f in checked) / len(checked)
        refit = LeastSquares(
            [names[k].rsplit(".", 1)[-1] for k in kinds],
            "least squares on the kept inputs' X^T X (float64), sequential, damped toward the "
            "plain slice; the damping chosen on the held-back windows",
            None,
            sum(f["error_before"] for f in fits) / max(len(fits), 1),
            sum(f["error_after"] for f in fits) / max(len(fits), 1),
            extra=extra,
        )
        return WidthsNarrowed(self.plan.ffn, self.plan.heads, self.layer_records, refit)


def _gram_hook(model: BlockModel, path: str, gram: Gram, held: Gram, windows: int):
    """A forward pre-hook on ``path`` adding its input into ``gram``, or into ``held`` for the
    held-back windows (its calls are the ``windows`` calibration windows, in order)."""
    calls = [0]

    def see(module, args, kwargs) -> None:
        x = args[0] if args else next(iter(kwargs.values()))
        (held if is_held(calls[0] % windows, windows) else gram).add(x)
        calls[0] += 1

    return model.module.get_submodule(path).register_forward_pre_hook(see, with_kwargs=True)


def refit_statistics(model: BlockModel, layers: list[Layer], g: Geometry, plan: WidthPlan) -> int:
    """The most a block's refits hold (:func:`~sparsetool.ops.shrink.memory.widths_statistics`)."""
    layer = layers[0]
    ffn = (g.ffn, plan.keep_ffn) if layer.ffn_out and plan.keep_ffn is not None else None
    heads = None
    if layer.o:
        heads = (g.heads * g.head_dim, plan.kept_groups * plan.per_group * g.head_dim)
    bias = bool(layer.ffn_out) and stored_name(model, f"{layer.ffn_out}.bias") is not None
    return widths_statistics(width=model.width, ffn=ffn, heads=heads, bias=bias)
