"""FLOP accounting (Chinchilla Appendix F) for dense, sparse, Variable-SPDF and fine-tuning runs.

Pure arithmetic: no torch, no numpy, so ``sparsetool flops`` starts fast.
"""

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

__all__ = [
    "CHINCHILLA_TOKENS_PER_PARAM", "PRESETS", "ROLES", "TARGETED_TERMS", "TERMS", "ModelConfig",
    "forward_flops", "forward_terms", "from_hf_config", "from_mapping", "get_preset",
    "layer_sparsities", "load_config", "param_counts", "term_formulas", "with_overrides",
]
