"""The masked-kernel hardware model behind ``sparsetool simulate``.

What unstructured sparsity buys on a zero-skipping dataflow machine versus GPUs, from real masks:
:mod:`layers` (per-core-group non-zero counts and 2:4 checks from a mask), :mod:`devices` (the
cost of one pass of one matmul per kind of hardware), :mod:`presets` (the published and fitted
constants, ``--hardware FILE`` overrides), :mod:`fits` (how the fitted ones were fitted),
:mod:`workload` (shape, model preset or checkpoint), :mod:`compare` (time, speedup, theoretical,
breakdown), :mod:`verify` (the zero-skipping schedule, executed), :mod:`plot`, and :mod:`request`
(a whole ``sparsetool simulate`` request: :func:`run_simulation`).
No CLI imports; numpy only (torch only to read a checkpoint, matplotlib only to plot).
"""

from sparsetool.hardware.compare import APPENDIX_C_TICKS, simulate, sweep
from sparsetool.hardware.devices import (
    PASSES,
    Cost,
    Dataflow,
    DenseGPU,
    Device,
    FlashLLMGPU,
    Refused,
    Sparse24GPU,
    SpMMGPU,
)
from sparsetool.hardware.layers import LayerMask, stats_from_mask, synthetic_mask
from sparsetool.hardware.presets import PRESETS, builtin_devices, load_devices, sources
from sparsetool.hardware.request import hardware_constants, run_simulation
from sparsetool.hardware.workload import (
    Workload,
    from_checkpoint,
    from_model,
    from_shape,
    parse_shape,
)

__all__ = [
    "APPENDIX_C_TICKS", "PASSES", "PRESETS", "Cost", "Dataflow", "DenseGPU", "Device", "FlashLLMGPU",
    "LayerMask", "Refused", "Sparse24GPU", "SpMMGPU", "Workload", "builtin_devices", "from_checkpoint",
    "from_model", "from_shape", "hardware_constants", "load_devices", "parse_shape", "run_simulation",
    "simulate", "sources", "stats_from_mask", "sweep", "synthetic_mask",
]
