"""``shrink --hidden`` with reconstruction: what reads a norm over the hidden size refit to what
the narrower model gives it.

A layer ``y = W x`` that reads the output ``x = g * h / rms(h)`` of an RMS norm (q/k/v read the
attention norm's, gate/up the FFN norm's) is handed, in the narrower model, the kept channels
``C`` renormalised over themselves: ``x'(t) = x_C(t) * s(t)``, ``s = rms(h) / rms_C(h)`` (each
with the norm's epsilon), a per-token factor the plain slice ignores. Its least-squares weights
on ``C`` reproduce the input model's output from that input:

    W' = W X (H' + lambda I)^-1,    X = sum_t x(t) x'(t)^T,    H' = sum_t x'(t) x'(t)^T

with ``lambda = dampening * mean(diag H')`` as :func:`~sparsetool.ops.shrink.refit.refit_columns`
dampens; a bias stays (it is added to both sides). The error of weights ``V`` on ``C`` is
``tr(W H W^T) - 2 tr(W X V^T) + tr(V H' V^T)`` (``H = sum_t x x^T``), reported relative to
``tr(W H W^T)`` for the plain slice ``W[:, C]`` and for the refit.

What is not refit: the residual stream's removed channels are gone (the rows of the o/down
projections and the embedding's columns are sliced), a norm that is not an RMS norm (its mean
over fewer channels is not a per-token factor), what reads a norm's output through anything but
the linear layers, and the head (tied to the embedding in most small models; an untied head is
sliced too). The statistics come from the input model's own activations in one more pass of the
calibration windows, after the kept channels are chosen (they are chosen on every block's
scores): not sequential, unlike ``--ffn``/``--heads``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from sparsetool.checkpoint.spill import TensorSpill
from sparsetool.models.blocks import BlockModel
from sparsetool.ops.calibration import BlockPass
from sparsetool.ops.shrink.refit import DAMPENING, Refit
from sparsetool.util.progress import Progress
from sparsetool.util.threads import torch_threads

__all__ = ["READERS", "RenormStats", "refit_renormed", "refit_readers"]

READERS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # read a norm's output


@dataclass
class RenormStats:
    """``H = sum x x^T`` (d x d), ``X = sum x x'^T`` (d x |C|) and ``H' = sum x' x'^T`` of one
    norm's outputs ``x`` and what the narrower model's norm gives ``x'`` (float64)."""

    kept: Tensor
    eps: float
    h: Tensor | None = None
    cross: Tensor | None = None
    hcc: Tensor | None = None
    tokens: int = 0

    def add(self, inputs: Tensor, outputs: Tensor) -> None:
        """Add a window: the norm's inputs ``h`` and outputs ``x`` (..., d)."""
        h = inputs.reshape(-1, inputs.shape[-1]).to(torch.float64)
        x = outputs.reshape(-1, outputs.shape[-1]).to(torch.float64)
        full = torch.sqrt((h * h).mean(1) + self.eps)
        hk = h.index_select(1, self.kept)
        narrow = torch.sqrt((hk * hk).mean(1) + self.eps)
        xk = x.index_select(1, self.kept) * (full / narrow)[:, None]
        parts = ((x.T @ x).cpu(), (x.T @ xk).cpu(), (xk.T @ xk).cpu())
        if self.h is None or self.cross is None or self.hcc is None:
            self.h, self.cross, self.hcc = parts
        else:
            for total, part in zip((self.h, self.cross, self.hcc), parts):
                total.add_(part)
        self.tokens += x.shape[0]


@torch_threads(1)  # as refit_columns: the same bits whatever --threads
def refit_renormed(w: Tensor, stats: RenormStats, dampening: float = DAMPENING) -> Refit:
    """The least-squares weights (out, |C|) of ``w`` (out, d) on the renormalised kept channels
    (see the module docstring), and the relative errors of the plain slice and of the refit."""
    h, cross, hcc = stats.h, stats.cross, stats.hcc
    assert h is not None and cross is not None and hcc is not None, "the norm saw no window"
    full = w.to(torch.float64)
    a = hcc.clone()
    a.diagonal().add_(dampening * float(torch.diagonal(a).mean()))
    rhs = full @ cross  # (out, |C|)
    fitted = torch.linalg.solve(a, rhs.T).T  # H' symmetric: V (H' + lambda I) = W X
    scale = float((full * (full @ h)).sum())
    plain = full.index_select(1, stats.kept)

    def error(v: Tensor) -> float:
        return scale - 2 * float((rhs * v).sum()) + float((v * (v @ hcc)).sum())

    denominator = max(scale, 1e-300)
    return Refit(fitted.contiguous(), None, error(plain) / denominator, error(fitted) / denominator)


@dataclass
class _Block:
    """One block's norms seen in a window (output tensor id -> (norm path, inputs, outputs)) and
    which norm each reader read."""

    seen: dict[int, tuple[str, Tensor, Tensor]] = field(default_factory=dict)
    reads: dict[str, str] = field(default_factory=dict)  # reader path -> norm path


def refit_readers(
    model: BlockModel,
    windows: Tensor,
    kept: list[int],
    spill: TensorSpill,
    values: dict[str, int | None],
    progress: Progress | None = None,
) -> dict:
    """One more pass of ``windows`` through the input model: every block's readers of an RMS
    norm over the hidden size refit to the kept channels ``kept`` (their stored tensors, cut to
    ``kept`` along their inputs, into ``spill``; ``values[name] = 1``, the axis done); the
    record (per block, each reader's errors; what was not refit and why)."""
    index = torch.tensor(kept, dtype=torch.long)
    layers: list[dict] = []
    skipped: set[str] = set()
    for step in BlockPass(model, windows, "refit hidden", progress):
        i = step.index
        prefix = f"{model.block_prefix}.{i}."
        block = model.block_list[i]
        state = _Block()
        stats: dict[str, RenormStats] = {}
        handles = []
        for name, module in block.named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in READERS and isinstance(module, torch.nn.Linear):
                handles.append(module.register_forward_pre_hook(_reader(prefix + name, state)))
            elif _rms_eps(module, model.width) is not None and "norm" in leaf.lower():
                eps = _rms_eps(module, model.width)
                assert eps is not None
                stats[prefix + name] = RenormStats(index, eps)
                handles.append(module.register_forward_hook(_norm(prefix + name, state)))
            elif _over(module, model.width) and "norm" in leaf.lower():
                skipped.add(type(module).__name__)  # a norm over the hidden size, not RMS
        outs = []
        try:
            for call in step.calls:
                state.seen.clear()
                outs.append(call.passed(model.run_block(i, call)))
                for norm in set(state.reads.values()):
                    found = next((v for v in state.seen.values() if v[0] == norm), None)
                    if found is not None:
                        stats[norm].add(found[1], found[2])
            state.seen.clear()
        finally:
            for h in handles:
                h.remove()
        step.outputs = outs  # the input model's own outputs: the next block's inputs
        record: dict = {"block": i}
        for reader, norm in sorted(state.reads.items()):
            stored = _single(model, f"{reader}.weight")
            if stored is None:
                continue
            w = model.ckpt.read_stored(stored)
            fit = refit_renormed(w, stats[norm])
            spill.put(stored, fit.weight.to(w.dtype))
            values[stored] = 1
            record[reader.rsplit(".", 1)[-1]] = fit.record()
            del fit, w  # before the next reader's refit
        stats.clear()
        layers.append(record)
    fits = [r[k] for r in layers for k in READERS if k in r]
    return {
        "readers": [k for k in READERS if any(k in r for r in layers)],
        "method": "least squares on the kept channels renormalised over themselves (float64), "
        "on the input model's activations",
        "dampening": DAMPENING,
        "error_before": sum(f["error_before"] for f in fits) / max(len(fits), 1),
        "error_after": sum(f["error_after"] for f in fits) / max(len(fits), 1),
        "not_refit": sorted(skipped),
        "layers": layers,
    }


def _over(module: torch.nn.Module, width: int) -> bool:
    """Whether ``module`` has one weight per channel of ``width`` (a norm over the hidden size,
    not a per-head one)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.ndim == 1 and weight.shape[0] == width


def _rms_eps(module: torch.nn.Module, width: int) -> float | None:
    """An RMS norm over ``width`` channels: its epsilon (None: not one)."""
    if "RMSNorm" not in type(module).__name__ or not _over(module, width):
        return None
    eps = getattr(module, "variance_epsilon", None)
    eps = getattr(module, "eps", None) if eps is None else eps
    return float(eps) if isinstance(eps, (int, float)) else None


def _norm(path: str, state: _Block):
    def see(module, args, output) -> None:
        out = output[0] if isinstance(output, tuple) else output
        state.seen[id(out)] = (path, args[0], out)  # held: its id is not reused in the window

    return see


def _reader(path: str, state: _Block):
    def see(module, args) -> None:
        found = state.seen.get(id(args[0])) if args else None
        if found is not None:
            state.reads.setdefault(path, found[0])

    return see


def _single(model: BlockModel, param: str) -> str | None:
    """The one stored tensor ``param`` is read from (None: several, or a part of one)."""
    pieces = model.sources.get(param)
    if not pieces or len(pieces) != 1 or pieces[0].index:
        return None
    return pieces[0].stored
