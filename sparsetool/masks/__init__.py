"""Pure tensor -> mask functions in numpy: one exact selection kernel, N:M, distributions, exact
counts.

A mask is a bool array of the weight's shape, True = kept: a numpy array for numpy input, a torch
tensor on the input's device for torch input (the selection runs in numpy either way, and no module
here imports torch; see :mod:`sparsetool.masks.select`). Nothing here reads or writes files.
"""

# Lazy: the names below load the numpy kernel (select.py) on first use; counts and distributions
# (which flops and option checks use) load only themselves.
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
