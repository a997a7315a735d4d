"""FLOP accounting (Chinchilla Appendix F) for dense, sparse, Variable-SPDF and fine-tuning runs.

Pure arithmetic: no torch, no numpy, so ``sparsetool flops`` starts fast. (Only
:func:`from_checkpoint` reads a checkpoint, and it imports the torch-based reader when called.)
"""

# Each name is imported from its module on first use, so ``import sparsetool.flops.config`` (all
# that ``sparsetool flops --model ...`` needs) does not load the checkpoint-shape reader.
_WHERE = {
    "BACKWARD_FACTOR": "sparsetool.flops.accounting",
    "CHINCHILLA_TOKENS_PER_PARAM": "sparsetool.flops.config",
    "ConfigError": "sparsetool.errors",
    "InferredModel": "sparsetool.flops.shapes",
    "ModelConfig": "sparsetool.flops.config",
    "PRESETS": "sparsetool.flops.config",
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
    "from_hf_config": "sparsetool.flops.config",
    "from_mapping": "sparsetool.flops.config",
    "get_preset": "sparsetool.flops.config",
    "infer_model": "sparsetool.flops.shapes",
    "input_warnings": "sparsetool.flops.accounting",
    "json_result": "sparsetool.flops.accounting",
    "keys_per_query": "sparsetool.flops.formula",
    "seq_len_note": "sparsetool.flops.config",
    "layer_sparsities": "sparsetool.flops.formula",
    "load_config": "sparsetool.flops.config",
    "param_counts": "sparsetool.flops.formula",
    "parse_count": "sparsetool.flops.accounting",
    "parse_sparsities": "sparsetool.flops.accounting",
    "parse_stage": "sparsetool.flops.accounting",
    "read_hf_config": "sparsetool.flops.shapes",
    "term_formulas": "sparsetool.flops.formula",
    "with_overrides": "sparsetool.flops.config",
}


def __getattr__(name: str) -> object:
    if name not in _WHERE:
        raise AttributeError(f"module 'sparsetool.flops' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "BACKWARD_FACTOR", "ConfigError", "CHINCHILLA_TOKENS_PER_PARAM", "PRESETS", "ROLES", "TARGETED_TERMS",
    "TERMS", "TRAIN_FACTOR", "InferredModel", "ModelConfig", "Stage", "account", "check_stages",
    "default_tokens", "forward_flops", "forward_terms", "from_checkpoint", "from_hf_config",
    "from_mapping", "get_preset", "infer_model", "input_warnings", "json_result", "keys_per_query", "layer_sparsities", "load_config",
    "param_counts", "parse_count", "parse_sparsities", "parse_stage", "read_hf_config", "seq_len_note",
    "term_formulas", "with_overrides",
]
