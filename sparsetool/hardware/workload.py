"""What is being run: the pruned layers and the dense work around them, for ``T`` tokens.

Three sources: one synthetic layer (``--shape MxK``), a model preset with one sparsity (random
masks, tile counts drawn exactly; see :func:`sparsetool.hardware.layers.sampled_random`), or a
checkpoint's real masks. Attention (logits, softmax, values) and the LM-head logits are dense
work weight sparsity does not touch; their FLOPs come from the same Chinchilla Appendix-F split
``sparsetool flops`` uses (:func:`sparsetool.flops.forward_terms`).

A mixture of experts runs each token through the ``top_k`` experts its router picks, so a step
holds the matrices of ``top_k`` experts per MoE layer (the first ``top_k`` of a checkpoint, with
their real masks), each multiplying every token, and the router's matmul as dense work: the
FLOPs of the step exactly, and the weights a decode step reads. A step of many tokens reads
more experts' weights than that (each token picks its own): the memory time is a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from sparsetool.errors import CheckpointError, ConfigError
from sparsetool.hardware.layers import LayerMask, sampled_random, stats_from_mask, synthetic_mask
from sparsetool.util.wording import plural

UNTARGETED_TERMS = ("attn_logits", "softmax", "attn_values", "router", "logits")
"""Appendix-F forward terms that stay dense under weight sparsity (embeddings are excluded, as
in the SPDF tables; a mixture of experts' router is never pruned)."""


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
    moe: dict[str, Any] | None = None  # a mixture of experts: sparsetool.flops.moe_summary

    @property
    def sparsity(self) -> float:
        """Sparsity over the targeted matrices (non-zeros over entries)."""
        numel = sum(ly.numel for ly in self.layers)
        return 1.0 - sum(ly.nnz for ly in self.layers) / numel if numel else 0.0


def _check_tokens(tokens: float) -> float:
    if not tokens >= 1:
        raise ConfigError(f"--tokens must be at least 1, got {tokens}")
    return float(tokens)


def from_shape(
    shape: tuple[int, int],
    sparsity: float,
    tokens: float,
    grids: list[tuple[int, int]],
    pattern: str = "random",
    seed: int = 0,
) -> tuple[Workload, np.ndarray]:
    """One ``M x K`` layer with a seeded synthetic mask; returns the mask too (for ``--verify``)."""
    mask = synthetic_mask(shape, sparsity, pattern, seed)
    name = f"{shape[0]}x{shape[1]}"
    layer = stats_from_mask(name, "other", mask, grids)
    wl = Workload(f"{name} layer, {pattern} mask", "shape", _check_tokens(tokens), [layer])
    return wl, mask


def model_layers(cfg: Any) -> list[tuple[str, str, tuple[int, int]]]:
    """``(name, role, (M, K))`` of every targeted matrix of a ``ModelConfig`` one token goes
    through, as Appendix F counts them (q/k/v fused; SwiGLU has gate and up as two ``ffn_in``
    matrices; a mixture of experts' MoE layer has the ``top_k`` active experts' and the shared
    expert's; multi-head latent attention has its four ``qkv`` matrices,
    :func:`sparsetool.flops.qkv_matrices`)."""
    from sparsetool.flops import qkv_matrices

    d = cfg.d_model
    out = []

    def ffn(prefix: str, f: int) -> None:
        for j in range(cfg.ffn_matrices - 1):
            out.append((f"{prefix}.ffn_in{'' if cfg.ffn_matrices == 2 else j}", "ffn_in", (f, d)))
        out.append((f"{prefix}.ffn_out", "ffn_out", (d, f)))

    for i in range(cfg.n_layers):
        out += [(f"layers.{i}.{n}", "qkv", shape) for n, shape in qkv_matrices(cfg)]
        out.append((f"layers.{i}.attn_out", "attn_out", (d, cfg.value_head * cfg.n_heads)))
        if cfg.is_moe_layer(i):
            for e in range(cfg.top_k):
                ffn(f"layers.{i}.experts.{e}", cfg.expert_width)
            if cfg.d_shared:
                ffn(f"layers.{i}.shared_expert", cfg.d_shared)
        else:
            ffn(f"layers.{i}", cfg.d_ff)
    return out


def moe_note(cfg: Any, source: str) -> list[str]:
    """What a mixture of experts' step holds, for the output (nothing for a dense model)."""
    if not cfg.is_moe:
        return []
    shared = " and the shared expert" if cfg.d_shared else ""
    return [
        f"mixture of experts: {cfg.top_k} of {cfg.n_experts} experts active per token in each of "
        f"{cfg.moe_layers} MoE layers; the step multiplies every token by the {cfg.top_k} active "
        f"experts' matrices{shared} ({source}) and reads only their weights, as a decode step "
        "does; the router's matmul is dense work"
    ]


def untargeted_flops(cfg: Any, tokens: float) -> tuple[float, int]:
    """Dense forward FLOPs (attention and logits) for ``tokens`` tokens, and the sequence length
    used: ``min(seq_len, tokens)``, so ``tokens / seq_len`` sequences."""
    from sparsetool.flops import forward_terms

    seq = int(min(cfg.seq_len, tokens))
    terms = forward_terms(cfg, seq_len=seq)
    return sum(terms[t] for t in UNTARGETED_TERMS) * tokens / seq, seq


def from_model(
    cfg: Any, sparsity: float, tokens: float, grids: list[tuple[int, int]], seed: int = 0
) -> Workload:
    """Every targeted matrix of ``cfg`` at ``sparsity`` with a uniformly random mask (seeded)."""
    tokens = _check_tokens(tokens)
    rng = np.random.default_rng(seed)
    layers = [sampled_random(n, r, s, sparsity, grids, rng) for n, r, s in model_layers(cfg)]
    flops, seq = untargeted_flops(cfg, tokens)
    from sparsetool.flops import moe_summary

    return Workload(
        f"{cfg.name} at sparsity {sparsity:g}, random masks",
        "model",
        tokens,
        layers,
        flops,
        seq,
        [
            "masks: uniformly random; per-core-group counts drawn exactly, "
            "2:4 violations are expected values",
            *moe_note(cfg, "random masks"),
        ],
        moe=moe_summary(cfg),
    )


def from_checkpoint(
    path: Path,
    tokens: float,
    grids: list[tuple[int, int]],
    seq_len: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
) -> Workload:
    """The real mask of every targeted matrix in the checkpoint at ``path``
    (:func:`checkpoint_layers`), and the dense work around them: shapes inferred as ``sparsetool
    flops --checkpoint`` infers them."""
    from sparsetool.flops import infer_model, moe_summary
    from sparsetool.targets.recorded import targeting_summary

    tokens = _check_tokens(tokens)
    layers, rows, plan, hf_config = checkpoint_layers(
        path, grids, progress, include=include, exclude=exclude, default_targets=default_targets
    )
    path = Path(path)
    if not layers:
        raise CheckpointError(
            f"'{path}' has no attention or feed-forward weight matrices to simulate; "
            "simulate a preset or one layer instead, e.g. --model gpt2-small --sparsity 0.5 "
            "or --shape 4096x4096 --sparsity 0.5"
        )
    inferred = infer_model(rows, name=path.name, hf_config=hf_config or None, seq_len=seq_len)
    cfg = inferred.config
    if seq_len is None and cfg.context is not None:
        # a step runs sequences the model takes: up to its context (flops counts 2048 by default)
        cfg = replace(cfg, seq_len=cfg.context, seq_len_source="the model's context")
    flops, seq = untargeted_flops(cfg, tokens)
    notes = [n for n in inferred.notes if not n.startswith("mixture of experts")]
    notes += moe_note(cfg, f"the first {cfg.top_k} of each layer, real masks")
    return Workload(
        label=(
            f"{path.name} ({plural(len(layers), 'pruned matrix', 'pruned matrices')}, real masks)"
        ),
        source="checkpoint",
        tokens=tokens,
        layers=layers,
        untargeted_flops=flops,
        seq_len=seq,
        notes=notes,
        targeting=targeting_summary(plan),
        moe=moe_summary(cfg),
    )


def checkpoint_layers(
    path: Path,
    grids: list[tuple[int, int]],
    progress: Callable[[int, int, str], None] | None = None,
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    default_targets: bool = False,
) -> tuple[list[LayerMask], list[dict[str, Any]], Any, dict[str, Any]]:
    """Every targeted matrix a token goes through in the checkpoint at ``path``, counted from its
    real mask: ``(layers, rows, plan, config)``, ``rows`` every tensor's shape and non-zeros (what
    shape inference reads), ``plan`` the :class:`~sparsetool.targets.TargetPlan`, ``config`` its
    ``config.json`` (or ``{}``). Possibly no layers at all.

    The mask is the encoding's when there is one (True = kept), else ``weight != 0``. ``include``
    and ``exclude`` choose the targeted tensors as for ``prune``
    (:func:`sparsetool.targets.plan_targets`); without them the globs the checkpoint was pruned
    with, unless ``default_targets`` (:func:`sparsetool.targets.recorded.plan_checkpoint_targets`).
    """
    from sparsetool.checkpoint import open_checkpoint
    from sparsetool.checkpoint.config import read_model_config
    from sparsetool.checkpoint.encodings import decode
    from sparsetool.flops.shapes import beyond_stated_layers, expert_part
    from sparsetool.targets.order import layer_index, tensor_sort_key
    from sparsetool.targets.recorded import plan_checkpoint_targets

    path = Path(path)
    if not path.exists():
        raise CheckpointError(
            f"checkpoint '{path}' not found; pass a .safetensors file or a directory"
        )
    layers: list[LayerMask] = []
    rows: list[dict[str, Any]] = []
    hf_config = read_model_config(path) or {}
    top_k = hf_config.get("num_experts_per_tok")

    def simulated(lt: Any) -> bool:
        """A targeted matrix a token goes through: not an expert past the first top_k, not in a
        layer past config.json's (DeepSeek-V3's multi-token prediction module)."""
        if layer_index(lt.name) in extra:
            return False
        part, expert = expert_part(lt.name, lt.shape)
        if part == "stacked":
            return plan[lt.name].role in ("ffn_in", "ffn_out") and top_k is not None
        return len(lt.shape) == 2 and (part != "expert" or top_k is None or expert < top_k)

    with open_checkpoint(path) as ck:
        plan = plan_checkpoint_targets(
            ck.logical,
            ck.config,
            ck.metadata(),
            include,
            exclude,
            default_targets=default_targets,
            source=path.name,
        )
        indices = cast("set[int]", {layer_index(lt.name) for lt in ck.logical} - {None})
        extra = set(beyond_stated_layers(indices, hf_config))
        todo = [lt for lt in ck.logical if plan[lt.name].targeted and simulated(lt)]
        todo.sort(key=lambda lt: tensor_sort_key(lt.name, plan[lt.name].role))  # layer 2 before 10
        names = {lt.name for lt in todo}
        for lt in ck.logical:
            if lt.name not in names:  # shapes only: nothing to read
                rows.append(
                    dict(
                        name=lt.name,
                        shape=lt.shape,
                        dtype=str(lt.dtype),
                        role=plan[lt.name].role,
                        targeted=False,
                        numel=lt.numel,
                        nonzero=lt.numel,
                    )
                )
        for i, lt in enumerate(todo):
            if progress:
                progress(i, len(todo), lt.name)
            dense, mask = decode(ck, lt)
            if mask is None:
                mask = dense != 0
            del dense
            r = plan[lt.name].role
            m = mask.numpy()
            del mask
            if m.ndim == 3:  # stacked experts: the first top_k, each a matrix of its own
                if top_k is None:  # simulated() takes stacked experts only with a top_k
                    raise AssertionError(f"{lt.name}: stacked experts without top_k")
                for e in range(min(int(top_k), m.shape[0])):
                    layers.append(
                        stats_from_mask(
                            f"{lt.name}[{e}]", r, m[e], grids, plan[lt.name].input_dim - 1
                        )
                    )
                numel, nnz = int(m.size), int(np.count_nonzero(m))
            else:
                ly = stats_from_mask(lt.name, r, m, grids, plan[lt.name].input_dim)
                layers.append(ly)
                numel, nnz = ly.numel, ly.nnz
            del m
            rows.append(
                dict(
                    name=lt.name,
                    shape=lt.shape,
                    dtype=str(lt.dtype),
                    role=r,
                    targeted=True,
                    numel=numel,
                    nonzero=nnz,
                )
            )
        if progress:
            progress(len(todo), len(todo), "")
    return layers, rows, plan, hf_config
