"""Whole-run accounting: training FLOPs over a token budget, Variable-SPDF stages, dense
fine-tuning, inference FLOPs per token and parameter counts, dense vs sparse.

Conventions (SPDF paper, Thangarasa et al. 2023, Sec. 3.5 and App. A.4):

- training FLOPs per sequence = forward + backward = 3 x forward (backward = 2 x forward);
- sequences = tokens / seq_len; total training FLOPs = sequences x training FLOPs per sequence;
- the token budget defaults to Chinchilla's 20 tokens per parameter (Hoffmann et al. 2022),
  using the size the model is named by when a preset has one (125M -> 2.5B, 1.3B -> 26B);
- Variable SPDF (Cerebras, "Variable Sparse Pre-training"): stage ``i`` trains on a fraction
  ``F_i`` of the tokens at sparsity ``S_i``; effective sparsity = sum F_i * S_i. FLOPs are affine
  in sparsity, so the staged run costs exactly a plain run at the effective sparsity;
- dense fine-tuning adds 3 x forward(dense, fine-tuning length) x fine-tuning sequences to both
  the sparse and the dense run (SPDF Table 2 reports pre-training + fine-tuning);
- a mixture of experts counts the FLOPs of the experts each token goes through (top-k routed plus
  shared) and its router's; ``params`` is every parameter, ``active_params`` a token's share;
- inference FLOPs per token = forward FLOPs of a full sequence / seq_len, for the model the run
  ends with (the last stage's sparsity), as in the iterative-pruning post's "3x fewer inference
  FLOPs" at 83.8% sparsity.

Ratios are sparse / dense (the paper's "0.401x"); the CLI also shows dense / sparse ("2.49x").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparsetool.errors import ConfigError
from sparsetool.flops.formula import LayerSparsity, forward_terms, layer_sparsities, param_counts
from sparsetool.flops.modelconfig import CHINCHILLA_TOKENS_PER_PARAM, ModelConfig
from sparsetool.util import options

BACKWARD_FACTOR = 2.0
"""Backward pass = 2 x forward (Chinchilla App. F; Kaplan et al. 2020)."""
TRAIN_FACTOR = 1.0 + BACKWARD_FACTOR


@dataclass(frozen=True)
class Stage:
    """One pre-training stage: ``fraction`` of the token budget at ``sparsity``."""

    sparsity: float | LayerSparsity
    fraction: float


def parse_stage(text: str) -> Stage:
    """``"S:F"`` -> Stage(S, F), e.g. Variable SPDF's 90% sparse for 5/6 of the tokens
    (parsed by :func:`sparsetool.util.options.parse_stage`, as train's ``--stage``).

    >>> parse_stage("0.9:0.8333")
    Stage(sparsity=0.9, fraction=0.8333)
    """
    return Stage(*options.parse_stage(text))


def check_stages(stages: Sequence[Stage], tol: float = 1e-3) -> list[Stage]:
    """Validate that fractions sum to 1 (within ``tol``, so 0.8333 + 0.1667 passes) and
    rescale them to sum to exactly 1."""
    if not stages:
        raise ConfigError("give at least one --stage SPARSITY:FRACTION")
    total = sum(st.fraction for st in stages)
    if not all(st.fraction > 0 for st in stages) or abs(total - 1.0) > tol:
        raise ConfigError(
            f"stage fractions sum to {total:.4g}; they are fractions of the token budget and "
            "must sum to 1 (e.g. --stage 0.9:0.8333 --stage 0:0.1667)"
        )
    return [Stage(st.sparsity, st.fraction / total) for st in stages]


def _mean_sparsity(cfg: ModelConfig, sparsity: float | LayerSparsity) -> float:
    """Weight-count-weighted sparsity over the targeted matrices."""
    p = param_counts(cfg, sparsity)
    return (p["total"] - p["nonzero"]) / p["targeted"] if p["targeted"] else 0.0


def default_tokens(cfg: ModelConfig, params: float | None = None) -> float:
    """Chinchilla's 20 tokens per parameter; the nominal size of a preset when it has one."""
    n = cfg.nominal_params or params or param_counts(cfg)["total"]
    return CHINCHILLA_TOKENS_PER_PARAM * n


def account(
    cfg: ModelConfig,
    *,
    sparsity: float | LayerSparsity = 0.0,
    stages: Sequence[Stage] | None = None,
    tokens: float | None = None,
    embeddings: bool = False,
    finetune_tokens: float = 0.0,
    finetune_seq_len: int | None = None,
    params: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Dense-vs-sparse FLOPs and parameters of one run, as a JSON-ready dict.

    ``stages`` (Variable SPDF) replaces ``sparsity``. ``params`` (``{"total", "nonzero"}``)
    overrides the counted parameters with measured ones (a checkpoint's). Plain keys describe
    the sparse run, ``dense_``-prefixed keys the dense baseline; ratios are sparse / dense.

    >>> from sparsetool.flops.presets import get_preset
    >>> r = account(get_preset("gpt3-xl"), sparsity=0.75)
    >>> round(r["total_train_flops"] / 1e18, 2), round(r["train_flops_ratio"], 3)
    (94.76, 0.401)
    """
    s_len = cfg.seq_len
    staged = stages is not None
    stages = _checked_stages(cfg, sparsity, stages)
    n_params, n_nonzero, n_active, n_active_nonzero = _param_figures(cfg, stages[-1], params)
    tokens, tokens_source = _token_budget(cfg, tokens, n_params, finetune_tokens)
    sequences = tokens / s_len

    dense_terms = forward_terms(cfg, embeddings=embeddings)
    dense_fwd = sum(dense_terms.values())
    stage_rows, total, eff_sparsity = _stage_rows(cfg, stages, tokens, sequences, embeddings)
    last_terms = forward_terms(cfg, sparsity=stages[-1].sparsity, embeddings=embeddings)
    last_fwd = sum(last_terms.values())
    train_per_seq = total / sequences  # token-weighted mean over stages
    dense_total = TRAIN_FACTOR * dense_fwd * sequences
    ft_len, ft_fwd, ft_flops = _finetune(cfg, finetune_tokens, finetune_seq_len, embeddings)

    out: dict[str, Any] = {
        "model": cfg.name,
        "seq_len": s_len,
        "vocab": cfg.vocab,
        "embeddings": embeddings,
        "tokens": tokens,
        "tokens_source": tokens_source,
        "sequences": sequences,
        "sparsity": eff_sparsity,
        "effective_sparsity": eff_sparsity,
        "stages": stage_rows if staged else None,
        "forward_flops_per_seq": train_per_seq / TRAIN_FACTOR,
        "dense_forward_flops_per_seq": dense_fwd,
        "train_flops_per_seq": train_per_seq,
        "dense_train_flops_per_seq": TRAIN_FACTOR * dense_fwd,
        "total_train_flops": total,
        "dense_total_train_flops": dense_total,
        "train_flops_ratio": total / dense_total,
        "inference_flops_per_token": last_fwd / s_len,
        "dense_inference_flops_per_token": dense_fwd / s_len,
        "inference_flops_ratio": last_fwd / dense_fwd,
        "params": n_params,
        "nonzero_params": n_nonzero,
        "dense_params": n_params,
        "dense_nonzero_params": n_params,
        "nonzero_params_ratio": n_nonzero / n_params if n_params else 1.0,
        "active_params": n_active,
        "active_nonzero_params": n_active_nonzero,
        "finetune_tokens": float(finetune_tokens),
        "finetune_seq_len": ft_len,
        "finetune_forward_flops_per_seq": ft_fwd,
        "finetune_flops": ft_flops,
        "end_to_end_flops": total + ft_flops,
        "dense_end_to_end_flops": dense_total + ft_flops,
        "end_to_end_ratio": (total + ft_flops) / (dense_total + ft_flops),
        "forward_terms": last_terms,
        "dense_forward_terms": dense_terms,
    }
    return out


def _checked_stages(
    cfg: ModelConfig, sparsity: float | LayerSparsity, stages: Sequence[Stage] | None
) -> list[Stage]:
    """The run's stages (one, of the whole budget at ``sparsity``, without ``stages``), their
    fractions checked and each sparsity validated early, with a clear message."""
    checked = [Stage(sparsity, 1.0)] if stages is None else check_stages(stages)
    for st in checked:
        layer_sparsities(cfg, st.sparsity)
    return checked


def _param_figures(
    cfg: ModelConfig, last: Stage, params: Mapping[str, float] | None
) -> tuple[float, float, float, float]:
    """Total, non-zero, active and active non-zero parameters of the model the run ends with:
    counted, or the measured ``params`` with a token's share taken off as counted."""
    counted = param_counts(cfg, last.sparsity)
    if params is not None:
        n_params, n_nonzero = float(params["total"]), float(params["nonzero"])
    else:
        n_params, n_nonzero = counted["total"], counted["nonzero"]
    # a token's share: measured totals less the experts it does not go through, as counted
    n_active = n_params - (counted["total"] - counted["active"])
    n_active_nonzero = n_nonzero - (counted["nonzero"] - counted["active_nonzero"])
    return n_params, n_nonzero, n_active, n_active_nonzero


def _token_budget(
    cfg: ModelConfig, tokens: float | None, n_params: float, finetune_tokens: float
) -> tuple[float, str]:
    """The pre-training tokens (Chinchilla's budget when not given) and where they came from;
    ConfigError for a budget that is not positive or fine-tuning tokens below zero."""
    if tokens is None:
        tokens, tokens_source = default_tokens(cfg, n_params), "chinchilla"
    else:
        tokens_source = "given"
    tokens = float(tokens)
    if not (tokens > 0 and math.isfinite(tokens)):
        raise ConfigError(
            f"--tokens {tokens:g}: give a positive number of tokens, e.g. --tokens 26B"
        )
    if not (finetune_tokens >= 0 and math.isfinite(finetune_tokens)):
        raise ConfigError(
            f"--finetune-tokens {finetune_tokens:g}: give zero or more tokens, "
            "e.g. --finetune-tokens 64.5M"
        )
    return tokens, tokens_source


def _stage_rows(
    cfg: ModelConfig,
    stages: Sequence[Stage],
    tokens: float,
    sequences: float,
    embeddings: bool,
) -> tuple[list[dict[str, Any]], float, float]:
    """Each stage's row (mean sparsity, fraction, tokens, training FLOPs), the training FLOPs of
    all stages and the token-weighted (effective) sparsity."""
    stage_rows = []
    total = 0.0
    eff_sparsity = 0.0
    for st in stages:
        fwd = sum(forward_terms(cfg, sparsity=st.sparsity, embeddings=embeddings).values())
        flops = TRAIN_FACTOR * fwd * sequences * st.fraction
        total += flops
        mean_s = _mean_sparsity(cfg, st.sparsity)
        eff_sparsity += st.fraction * mean_s
        stage_rows.append(
            {
                "sparsity": mean_s,
                "fraction": st.fraction,
                "tokens": tokens * st.fraction,
                "train_flops": flops,
            }
        )
    return stage_rows, total, eff_sparsity


def _finetune(
    cfg: ModelConfig, finetune_tokens: float, finetune_seq_len: int | None, embeddings: bool
) -> tuple[int, float, float]:
    """Dense fine-tuning's sequence length, forward FLOPs per sequence and training FLOPs."""
    ft_len = int(finetune_seq_len or cfg.seq_len)
    if ft_len < 1:
        raise ConfigError(
            f"--finetune-seq-len must be a positive integer, got {finetune_seq_len!r}"
        )
    ft_fwd = sum(forward_terms(cfg, seq_len=ft_len, embeddings=embeddings).values())
    ft_flops = TRAIN_FACTOR * ft_fwd * finetune_tokens / ft_len
    return ft_len, ft_fwd, ft_flops


def input_warnings(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """What in the inputs makes the numbers meaningless though they compute: a token budget
    shorter than one sequence (the run is a fraction of one forward pass)."""
    r = runs[0]
    out = []
    if r["sequences"] < 1:
        out.append(
            f"--tokens {r['tokens']:,.0f} is less than one sequence of {r['seq_len']:,} tokens "
            f"({r['sequences']:.4g} sequences): give the whole pre-training budget, e.g. "
            "--tokens 26B, or a shorter --seq-len"
        )
    if 0 < r["finetune_tokens"] < r["finetune_seq_len"]:
        out.append(
            f"--finetune-tokens {r['finetune_tokens']:,.0f} is less than one fine-tuning "
            f"sequence of {r['finetune_seq_len']:,} tokens"
        )
    return out


def json_result(
    cfg: ModelConfig,
    runs: Sequence[Mapping[str, Any]],
    measured: Any = None,
    warnings: Sequence[str] = (),
) -> dict[str, Any]:
    """``sparsetool flops --json``: the same keys for every input, one ``runs`` entry per sparsity
    (or one for a staged run or a checkpoint). ``measured``: the :class:`InferredModel` of a
    checkpoint; without one ``targeted_sparsity`` and ``targeting`` are None and ``notes`` empty.
    ``warnings``: :func:`input_warnings`."""
    from dataclasses import asdict

    return {
        "model": cfg.name,
        "config": asdict(cfg),
        "moe": moe_summary(cfg),
        "notes": list(measured.notes) if measured is not None else [],
        "warnings": list(warnings),
        "targeted_sparsity": measured.targeted_sparsity if measured is not None else None,
        "targeting": measured.targeting if measured is not None else None,
        "runs": [dict(r) for r in runs],
    }


def moe_summary(cfg: ModelConfig) -> dict[str, Any] | None:
    """What a mixture of experts routes to (None for a dense model): ``experts`` per MoE layer,
    ``top_k`` per token, ``expert_width``, ``shared_width`` (0: no shared expert),
    ``moe_layers`` and the ``dense_layers`` between them."""
    if not cfg.is_moe:
        return None
    return {
        "experts": cfg.n_experts,
        "top_k": cfg.top_k,
        "expert_width": cfg.expert_width,
        "shared_width": cfg.d_shared,
        "moe_layers": cfg.moe_layers,
        "dense_layers": list(cfg.dense_layers),
    }


def parse_count(text: str | float, what: str = "--tokens") -> int:
    """A token count (zero allowed) written as ``26e9``, ``26B``, ``2.5b`` or ``64,512``:
    :func:`sparsetool.util.options.parse_tokens`.

    >>> parse_count("26B"), parse_count("2.5e9"), parse_count("64,512")
    (26000000000, 2500000000, 64512)
    """
    return options.parse_tokens(text, what, minimum=0)


parse_sparsities = options.parse_sparsities
