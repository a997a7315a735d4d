"""FLOP accounting (Chinchilla Appendix F) for dense, sparse, Variable-SPDF and fine-tuning runs.

Pure arithmetic: no torch, no numpy, so ``sparsetool flops`` starts fast. (Only
:func:`from_checkpoint` reads a checkpoint, and it imports the torch-based reader when called.)
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from sparsetool.checkpoint.config import read_model_config
    from sparsetool.errors import ConfigError as ConfigError
    from sparsetool.flops.accounting import BACKWARD_FACTOR as BACKWARD_FACTOR
    from sparsetool.flops.accounting import TRAIN_FACTOR as TRAIN_FACTOR
    from sparsetool.flops.accounting import Stage as Stage
    from sparsetool.flops.accounting import account as account
    from sparsetool.flops.accounting import check_stages as check_stages
    from sparsetool.flops.accounting import default_tokens as default_tokens
    from sparsetool.flops.accounting import input_warnings as input_warnings
    from sparsetool.flops.accounting import json_result as json_result
    from sparsetool.flops.accounting import moe_summary as moe_summary
    from sparsetool.flops.accounting import parse_count as parse_count
    from sparsetool.flops.accounting import parse_sparsities as parse_sparsities
    from sparsetool.flops.accounting import parse_stage as parse_stage
    from sparsetool.flops.formula import ROLES as ROLES
    from sparsetool.flops.formula import TARGETED_TERMS as TARGETED_TERMS
    from sparsetool.flops.formula import TERMS as TERMS
    from sparsetool.flops.formula import active_ffn_width as active_ffn_width
    from sparsetool.flops.formula import forward_flops as forward_flops
    from sparsetool.flops.formula import forward_terms as forward_terms
    from sparsetool.flops.formula import keys_per_query as keys_per_query
    from sparsetool.flops.formula import layer_sparsities as layer_sparsities
    from sparsetool.flops.formula import param_counts as param_counts
    from sparsetool.flops.formula import qkv_matrices as qkv_matrices
    from sparsetool.flops.formula import term_formulas as term_formulas
    from sparsetool.flops.modelconfig import (
        CHINCHILLA_TOKENS_PER_PARAM as CHINCHILLA_TOKENS_PER_PARAM,
    )
    from sparsetool.flops.modelconfig import ModelConfig as ModelConfig
    from sparsetool.flops.modelconfig import seq_len_note as seq_len_note
    from sparsetool.flops.modelconfig import with_overrides as with_overrides
    from sparsetool.flops.modelfile import MLA_TYPES as MLA_TYPES
    from sparsetool.flops.modelfile import MOE_TYPES as MOE_TYPES
    from sparsetool.flops.modelfile import from_mapping as from_mapping
    from sparsetool.flops.modelfile import load_config as load_config
    from sparsetool.flops.presets import PRESETS as PRESETS
    from sparsetool.flops.presets import get_preset as get_preset
    from sparsetool.flops.shapes import InferredModel as InferredModel
    from sparsetool.flops.shapes import from_checkpoint as from_checkpoint
    from sparsetool.flops.shapes import infer_model as infer_model

    read_hf_config = read_model_config  # shapes.py imports it under this name

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
