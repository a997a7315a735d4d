"""Pure tensor -> mask functions in numpy: one exact selection kernel, N:M, distributions, exact
counts.

A mask is a bool array of the weight's shape, True = kept: a numpy array for numpy input, a torch
tensor on the input's device for torch input (the selection runs in numpy either way; see
:mod:`sparsetool.masks.select`). The calibration methods' modules (wanda, sparsegpt, dsnot, owl)
compute in torch and import it; the others do not. Nothing here reads or writes files.
"""

from sparsetool.util.lazy import lazy_names

# Lazy: counts and distributions are torch-free (flops and option checks use them before torch
# is imported); the tensor functions load torch only when first asked for.
_WHERE = {
    "magnitude_mask": ".select",
    "random_mask": ".select",
    "nm_mask": ".select",
    "fraction_keep": ".counts",
    "sparsity_keep": ".counts",
    "check_sparsity": "sparsetool.util.options",
    "check_fraction": "sparsetool.util.options",
    "MagnitudeHistogram": ".global_magnitude",
    "TensorPlan": ".global_magnitude",
    "GlobalPlan": ".global_magnitude",
    "global_threshold_plan": ".global_magnitude",
    "apply_threshold": ".global_magnitude",
    "global_magnitude_masks": ".global_magnitude",
    "top_k_mask": ".kernel",
}

__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
