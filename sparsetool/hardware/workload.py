"""What is being run: the pruned layers and the dense work around them, for ``T`` tokens.

Three sources: one synthetic layer (``--shape MxK``), a model preset with one sparsity (random
masks, tile counts drawn exactly; see :func:`sparsetool.hardware.layers.sampled_random`), or a
checkpoint's real masks. Attention (logits, softmax, values) and the LM-head logits are dense
work weight sparsity does not touch; their FLOPs come from the same Chinchilla Appendix-F split
``sparsetool flops`` uses (:func:`sparsetool.flops.forward_terms`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from sparsetool.errors import CheckpointError, ConfigError
from sparsetool.hardware.layers import LayerMask, sampled_random, stats_from_mask, synthetic_mask
from sparsetool.util.wording import plural

UNTARGETED_TERMS = ("attn_logits", "softmax", "attn_values", "logits")
"""Appendix-F forward terms that stay dense under weight sparsity (embeddings are excluded, as
in the SPDF tables)."""


@dataclass
class Workload:
    """Pruned layers plus the dense forward FLOPs of everything else, for ``tokens`` tokens."""

    label: str
    source: str  # "shape" | "model" | "checkpoint"
    tokens: float
    layers: list[LayerMask]
    untargeted_flops: float = 0.0  # forward, whole step
    seq_len: int | None = None
    notes: list[str] = field(default_factory=list)
    targeting: dict[str, Any] = field(default_factory=dict)  # checkpoint: targets.recorded summary

    @property
    def sparsity(self) -> float:
        """Sparsity over the targeted matrices (non-zeros over entries)."""
        numel = sum(ly.numel for ly in self.layers)
        return 1.0 - sum(ly.nnz for ly in self.layers) / numel if numel else 0.0


def _check_tokens(tokens: float) -> float:
    if not tokens >= 1:
        raise ConfigError(f"--tokens must be at least 1, got {tokens}")
    return float(tokens)


def from_shape(shape: tuple[int, int], sparsity: float, tokens: float, grids: list[tuple[int, int]],
               pattern: str = "random", seed: int = 0) -> tuple[Workload, np.ndarray]:
    """One ``M x K`` layer with a seeded synthetic mask; returns the mask too (for ``--verify``)."""
    mask = synthetic_mask(shape, sparsity, pattern, seed)
    name = f"{shape[0]}x{shape[1]}"
    layer = stats_from_mask(name, "other", mask, grids)
    wl = Workload(f"{name} layer, {pattern} mask", "shape", _check_tokens(tokens), [layer])
    return wl, mask


def model_layers(cfg: Any) -> list[tuple[str, str, tuple[int, int]]]:
    """``(name, role, (M, K))`` of every targeted matrix of a ``ModelConfig``, as Appendix F
    counts them (q/k/v fused; SwiGLU has gate and up as two ``ffn_in`` matrices)."""
    d, k, h, f = cfg.d_model, cfg.d_head, cfg.n_heads, cfg.d_ff
    out = []
    for i in range(cfg.n_layers):
        out.append((f"layers.{i}.qkv", "qkv", (k * (h + 2 * cfg.kv_heads), d)))
        out.append((f"layers.{i}.attn_out", "attn_out", (d, k * h)))
        for j in range(cfg.ffn_matrices - 1):
            out.append((f"layers.{i}.ffn_in{'' if cfg.ffn_matrices == 2 else j}", "ffn_in", (f, d)))
        out.append((f"layers.{i}.ffn_out", "ffn_out", (d, f)))
    return out


def untargeted_flops(cfg: Any, tokens: float) -> tuple[float, int]:
    """Dense forward FLOPs (attention and logits) for ``tokens`` tokens, and the sequence length
    used: ``min(seq_len, tokens)``, so ``tokens / seq_len`` sequences."""
    from sparsetool.flops import forward_terms

    seq = int(min(cfg.seq_len, tokens))
    terms = forward_terms(cfg, seq_len=seq)
    return sum(terms[t] for t in UNTARGETED_TERMS) * tokens / seq, seq


def from_model(cfg: Any, sparsity: float, tokens: float, grids: list[tuple[int, int]],
               seed: int = 0) -> Workload:
    """Every targeted matrix of ``cfg`` at ``sparsity`` with a uniformly random mask (seeded)."""
    tokens = _check_tokens(tokens)
    rng = np.random.default_rng(seed)
    layers = [sampled_random(n, r, s, sparsity, grids, rng) for n, r, s in model_layers(cfg)]
    flops, seq = untargeted_flops(cfg, tokens)
    return Workload(f"{cfg.name} at sparsity {sparsity:g}, random masks", "model", tokens, layers,
                    flops, seq, ["masks: uniformly random; per-core-group counts drawn exactly, "
                                 "2:4 violations are expected values"])


def from_checkpoint(path: Path, tokens: float, grids: list[tuple[int, int]],
                    seq_len: int | None = None,
                    progress: Callable[[int, int, str], None] | None = None, *,
                    include: Sequence[str] = (), exclude: Sequence[str] = (),
                    default_targets: bool = False) -> Workload:
    """The real mask of every targeted matrix in the checkpoint at ``path``.

    The mask is the encoding's when there is one (True = kept), else ``weight != 0``. Shapes for
    the dense work are inferred as ``sparsetool flops --checkpoint`` infers them. ``include`` and
    ``exclude`` choose the targeted tensors as for ``prune`` (:func:`sparsetool.targets.plan_targets`);
    without them the globs the checkpoint was pruned with, unless ``default_targets``
    (:func:`sparsetool.targets.recorded.plan_checkpoint_targets`).
    """
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.config import read_model_config
    from sparsetool.checkpoint.encodings import decode
    from sparsetool.flops import infer_model
    from sparsetool.targets.order import tensor_sort_key
    from sparsetool.targets.recorded import plan_checkpoint_targets, targeting_summary

    tokens = _check_tokens(tokens)
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint '{path}' not found; pass a .safetensors file or a directory")
    layers: list[LayerMask] = []
    rows: list[dict[str, Any]] = []
    with open_checkpoint(path) as ck:
        plan = plan_checkpoint_targets(ck.logical, ck.config, ck.metadata(), include, exclude,
                                       default_targets=default_targets, source=path.name)
        todo = [lt for lt in ck.logical if plan[lt.name].targeted and len(lt.shape) == 2]
        todo.sort(key=lambda lt: tensor_sort_key(lt.name, plan[lt.name].role))  # layer 2 before 10
        names = {lt.name for lt in todo}
        for lt in ck.logical:
            if lt.name not in names:  # shapes only: nothing to read
                rows.append(dict(name=lt.name, shape=lt.shape, dtype=str(lt.dtype),
                                 role=plan[lt.name].role, targeted=False,
                                 numel=lt.numel, nonzero=lt.numel))
        for i, lt in enumerate(todo):
            if progress:
                progress(i, len(todo), lt.name)
            dense, mask = decode(ck, lt)
            if mask is None:
                mask = dense != 0
            del dense
            r = plan[lt.name].role
            ly = stats_from_mask(lt.name, r, mask.numpy(), grids, plan[lt.name].input_dim)
            del mask
            layers.append(ly)
            rows.append(dict(name=lt.name, shape=lt.shape, dtype=str(lt.dtype), role=r,
                             targeted=True, numel=ly.numel, nonzero=ly.nnz))
        if progress:
            progress(len(todo), len(todo), "")
    if not layers:
        raise CheckpointError(f"'{path}' has no attention or feed-forward weight matrices to simulate; "
                              "simulate a preset or one layer instead, e.g. --model gpt2-small --sparsity 0.5 "
                              "or --shape 4096x4096 --sparsity 0.5")
    inferred = infer_model(rows, name=path.name, hf_config=read_model_config(path), seq_len=seq_len)
    cfg = inferred.config
    if seq_len is None and cfg.context is not None:
        # a step runs sequences the model takes: up to its context (flops counts 2048 by default)
        cfg = replace(cfg, seq_len=cfg.context, seq_len_source="the model's context")
    flops, seq = untargeted_flops(cfg, tokens)
    return Workload(f"{path.name} ({plural(len(layers), 'pruned matrix', 'pruned matrices')}, real masks)", "checkpoint",
                    tokens, layers, flops, seq, list(inferred.notes), targeting_summary(plan))
