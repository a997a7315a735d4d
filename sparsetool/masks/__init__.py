"""Pure tensor -> mask functions in numpy: one exact selection kernel, N:M, distributions, exact
counts.

A mask is a bool array of the weight's shape, True = kept: a numpy array for numpy input, a torch
tensor on the input's device for torch input (the selection runs in numpy either way; see
:mod:`sparsetool.masks.select`). The calibration methods' modules (wanda, sparsegpt, dsnot, owl)
compute in torch and import it; the others do not. Nothing here reads or writes files.
"""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from sparsetool.util.options import check_fraction as check_fraction
    from sparsetool.util.options import check_sparsity as check_sparsity

    from .counts import fraction_keep as fraction_keep
    from .counts import sparsity_keep as sparsity_keep
    from .global_magnitude import GlobalPlan as GlobalPlan
    from .global_magnitude import MagnitudeHistogram as MagnitudeHistogram
    from .global_magnitude import TensorPlan as TensorPlan
    from .global_magnitude import apply_threshold as apply_threshold
    from .global_magnitude import global_magnitude_masks as global_magnitude_masks
    from .global_magnitude import global_threshold_plan as global_threshold_plan
    from .kernel import top_k_mask as top_k_mask
    from .select import magnitude_mask as magnitude_mask
    from .select import nm_mask as nm_mask
    from .select import random_mask as random_mask

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
