"""FLOP accounting (Chinchilla Appendix F) for dense, sparse, Variable-SPDF and fine-tuning runs.

Pure arithmetic: no torch, no numpy, so ``sparsetool flops`` starts fast. (Only
:func:`from_checkpoint` reads a checkpoint, and it imports the torch-based reader when called.)
"""

from sparsetool.flops.accounting import (
    BACKWARD_FACTOR,
    TRAIN_FACTOR,
    Stage,
    account,
    check_stages,
    default_tokens,
    parse_count,
    parse_sparsities,
    parse_stage,
)
from sparsetool.flops.config import (
    CHINCHILLA_TOKENS_PER_PARAM,
    PRESETS,
    ModelConfig,
    from_hf_config,
    from_mapping,
    get_preset,
    load_config,
    with_overrides,
)
from sparsetool.flops.formula import (
    ROLES,
    TARGETED_TERMS,
    TERMS,
    forward_flops,
    forward_terms,
    layer_sparsities,
    param_counts,
    term_formulas,
)
from sparsetool.errors import ConfigError
from sparsetool.flops.shapes import InferredModel, from_checkpoint, infer_model, read_hf_config

__all__ = [
    "BACKWARD_FACTOR", "ConfigError", "CHINCHILLA_TOKENS_PER_PARAM", "PRESETS", "ROLES", "TARGETED_TERMS",
    "TERMS", "TRAIN_FACTOR", "InferredModel", "ModelConfig", "Stage", "account", "check_stages",
    "default_tokens", "forward_flops", "forward_terms", "from_checkpoint", "from_hf_config",
    "from_mapping", "get_preset", "infer_model", "layer_sparsities", "load_config",
    "param_counts", "parse_count", "parse_sparsities", "parse_stage", "read_hf_config",
    "term_formulas", "with_overrides",
]
