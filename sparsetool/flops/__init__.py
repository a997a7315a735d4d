"""FLOP accounting (Chinchilla Appendix F) for dense, sparse, Variable-SPDF and fine-tuning runs.

Pure arithmetic: no torch, no numpy, so ``sparsetool flops`` starts fast. (Only
:func:`from_checkpoint` reads a checkpoint, and it imports the torch-based reader when called.)
"""

from sparsetool.util.lazy import lazy_names

# Each name is imported from its module on first use, so the shape record and the presets (all
# that ``sparsetool flops --model ...`` needs) do not load the checkpoint-shape reader.
_WHERE = {
    "BACKWARD_FACTOR": "sparsetool.flops.accounting",
    "CHINCHILLA_TOKENS_PER_PARAM": "sparsetool.flops.modelconfig",
    "ConfigError": "sparsetool.errors",
    "InferredModel": "sparsetool.flops.shapes",
    "ModelConfig": "sparsetool.flops.modelconfig",
    "PRESETS": "sparsetool.flops.presets",
    "ROLES": "sparsetool.flops.formula",
    "Stage": "sparsetool.flops.accounting",
    "TARGETED_TERMS": "sparsetool.flops.formula",
    "TERMS": "sparsetool.flops.formula",
    "TRAIN_FACTOR": "sparsetool.flops.accounting",
    "account": "sparsetool.flops.accounting",
    "check_stages": "sparsetool.flops.accounting",
    "default_tokens": "sparsetool.flops.accounting",
    "forward_flops": "sparsetool.flops.formula",
    "forward_terms": "sparsetool.flops.formula",
    "from_checkpoint": "sparsetool.flops.shapes",
    "from_mapping": "sparsetool.flops.modelfile",
    "get_preset": "sparsetool.flops.presets",
    "infer_model": "sparsetool.flops.shapes",
    "input_warnings": "sparsetool.flops.accounting",
    "json_result": "sparsetool.flops.accounting",
    "keys_per_query": "sparsetool.flops.formula",
    "MLA_TYPES": "sparsetool.flops.modelfile",
    "MOE_TYPES": "sparsetool.flops.modelfile",
    "active_ffn_width": "sparsetool.flops.formula",
    "seq_len_note": "sparsetool.flops.modelconfig",
    "layer_sparsities": "sparsetool.flops.formula",
    "load_config": "sparsetool.flops.modelfile",
    "param_counts": "sparsetool.flops.formula",
    "moe_summary": "sparsetool.flops.accounting",
    "parse_count": "sparsetool.flops.accounting",
    "parse_sparsities": "sparsetool.flops.accounting",
    "parse_stage": "sparsetool.flops.accounting",
    "qkv_matrices": "sparsetool.flops.formula",
    "read_hf_config": "sparsetool.flops.shapes",
    "term_formulas": "sparsetool.flops.formula",
    "with_overrides": "sparsetool.flops.modelconfig",
}


__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
