"""Measured dense against sparse matrix products on this machine, behind ``sparsetool bench``.

:mod:`matrices` (what is timed: a checkpoint's real masks, a preset's shapes, one shape),
:mod:`kernels` (each product, CPU and CUDA), :mod:`timing` (median and spread), :mod:`run` (a
whole run, speed-ups, break-even sparsity, the model's speed-up per token, the verdict: the JSON
``simulate --measured`` reads) and :mod:`plot`. No CLI imports.
"""
