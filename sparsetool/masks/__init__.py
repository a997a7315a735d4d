"""Pure tensor -> mask functions: one exact selection kernel, N:M, distributions, exact counts.

A mask is a bool tensor of the weight's shape, True = kept. Nothing here reads or writes files.
"""

# Lazy: counts and distributions are torch-free (flops and option checks use them before torch
# is imported); the tensor functions load torch only when first asked for.
__all__ = [
    "magnitude_mask", "random_mask", "nm_mask", "fraction_keep", "sparsity_keep",
    "check_sparsity", "check_fraction",
    "MagnitudeHistogram", "TensorPlan", "GlobalPlan", "global_threshold_plan", "apply_threshold",
    "global_magnitude_masks", "top_k_mask",
]


def __getattr__(name: str):
    if name in __all__:
        from sparsetool.masks import select

        return getattr(select, name)
    raise AttributeError(f"module 'sparsetool.masks' has no attribute {name!r}")
