"""The fitted constants of the presets, recomputed from the published measurements they fit.

Each function returns the value the preset stores (rounded there to 3-4 significant figures); the
tests check that the two agree, so a changed model or source figure cannot leave a stale constant.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sparsetool.hardware.devices import Dataflow, DenseGPU, Sparse24GPU
from sparsetool.hardware.layers import LayerMask, sampled_random

# PyTorch blog, "Accelerating Neural Network Training with Semi-Structured (2:4) Sparsity" (2024):
# one 13008 x 4096 x 1024 GEMM on A100, 538 us dense and 387 us with 2:4 sparse tensor cores.
PT24_SHAPE = (13008, 4096, 1024)
PT24_DENSE_S = 538e-6
PT24_SPARSE_S = 387e-6

# Flash-LLM (Xia et al., VLDB 2024): speedup over cuBLAS in the skinny regime.
FLASH_LLM_POINTS = ((0.70, 1.4), (0.80, 1.7), (0.90, 2.1))

# SPDF paper (Thangarasa et al., UAI 2023), Appendix C, Figure 1 (after Lie 2021): a GPT-3 layer's
# 12k x 12k matmul, measured speedup close to the theoretical 1/(1-s) at the figure's sparsity
# ticks (compare.APPENDIX_C_TICKS). The figure has no table; we read "close" at the last tick as
# 85% of theoretical (an assumption).
APPENDIX_C_SHAPE = (12288, 12288)
APPENDIX_C_TOKENS = 2048
APPENDIX_C_EFFICIENCY_AT_90 = 0.85


def _pt24_layer() -> tuple[LayerMask, float]:
    m, n, k = PT24_SHAPE
    # which of the three sizes is the token count does not change the FLOPs; the GEMM is
    # compute-bound
    return LayerMask("pt24", "other", out_features=n, in_features=k, nnz=n * k), float(m)


def fit_gpu_eta(gpu: DenseGPU) -> float:
    """Tensor-core efficiency ``eta`` so that the modelled dense GEMM takes 538 us.

    Compute-bound, so ``538 us = 2 M N K / (eta * peak) + launch``.

    >>> from sparsetool.hardware.presets import builtin_devices
    >>> round(fit_gpu_eta(builtin_devices()["a100"]), 3)
    0.656
    """
    layer, tokens = _pt24_layer()
    flops = 2.0 * tokens * layer.numel
    return flops / ((PT24_DENSE_S - gpu.launch_s) * gpu.peak_flops)


def fit_24_speedup(gpu: Sparse24GPU) -> float:
    """2:4 ``math_speedup`` so the modelled sparse GEMM takes 387 us (the dense one 538 us).

    >>> from sparsetool.hardware.presets import builtin_devices
    >>> round(fit_24_speedup(builtin_devices()["a100-2:4"]), 3)
    1.395
    """
    layer, tokens = _pt24_layer()
    flops = 2.0 * tokens * layer.numel
    eta = fit_gpu_eta(gpu)
    return flops / ((PT24_SPARSE_S - gpu.launch_s) * eta * gpu.peak_flops)


def fit_flash_llm() -> tuple[float, float]:
    """``(floor, slope)``: least squares of ``1/speedup = floor + slope * density`` on the
    Flash-LLM points, i.e. weight traffic relative to dense in the memory-bound (skinny) limit.

    >>> [round(v, 3) for v in fit_flash_llm()]
    [0.355, 1.19]
    """
    d = np.array([1 - s for s, _ in FLASH_LLM_POINTS])
    y = np.array([1 / x for _, x in FLASH_LLM_POINTS])
    slope, floor = np.polyfit(d, y, 1)
    return float(floor), float(slope)


def appendix_c_layer(sparsity: float, grid: tuple[int, int], seed: int = 0) -> LayerMask:
    """The 12k x 12k layer at ``sparsity`` with tile counts of a uniformly random mask."""
    return sampled_random(
        "gpt3-12k", "other", APPENDIX_C_SHAPE, sparsity, [grid], np.random.default_rng(seed)
    )


def fit_dataflow_fixed(df: Dataflow, seed: int = 0) -> float:
    """``fixed_s`` so the modelled 12k x 12k forward matmul at 90% sparsity reaches
    ``APPENDIX_C_EFFICIENCY_AT_90`` x 10 speedup. Solves ``(D + F) / (S + F) = target`` where D
    and S are the dense and sparse times without the fixed term.

    >>> from sparsetool.hardware.presets import builtin_devices
    >>> round(fit_dataflow_fixed(builtin_devices()["cs2"]) * 1e6, 2)
    1.28
    """
    free = replace(df, fixed_s=0.0)
    layer = appendix_c_layer(0.9, df.grid, seed)
    dense = free.dense_cost(layer, APPENDIX_C_TOKENS, "forward").total
    sparse = free.sparse_cost(layer, APPENDIX_C_TOKENS, "forward").total
    target = APPENDIX_C_EFFICIENCY_AT_90 / (1 - 0.9)
    return (dense - target * sparse) / (target - 1)
