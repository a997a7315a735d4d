"""The masked-kernel hardware model behind ``sparsetool simulate``.

What unstructured sparsity buys on a zero-skipping dataflow machine versus GPUs, from real masks:
:mod:`layers` (per-core-group non-zero counts and 2:4 checks from a mask), :mod:`devices` (the
cost of one pass of one matmul per kind of hardware), :mod:`presets` (the published and fitted
constants, ``--hardware FILE`` overrides), :mod:`fits` (how the fitted ones were fitted),
:mod:`workload` (shape, model preset or checkpoint), :mod:`compare` (time, speedup, theoretical,
breakdown), :mod:`verify` (the zero-skipping schedule, executed), :mod:`plot`, :mod:`measured`
(the model against measured kernel times, and the CPU constants fitted to them) and
:mod:`request` (a whole ``sparsetool simulate`` request: :func:`run_simulation`).
No CLI imports; numpy only (torch only to read a checkpoint, matplotlib only to plot).
"""

from sparsetool.util.lazy import lazy_names

_WHERE = {
    "APPENDIX_C_TICKS": ".compare",
    "simulate": ".compare",
    "sweep": ".compare",
    "PASSES": ".devices",
    "CPU": ".devices",
    "Cost": ".devices",
    "Dataflow": ".devices",
    "DenseGPU": ".devices",
    "Device": ".devices",
    "FlashLLMGPU": ".devices",
    "Refused": ".devices",
    "Sparse24GPU": ".devices",
    "SpMMGPU": ".devices",
    "load_measurement": ".measured",
    "LayerMask": ".layers",
    "stats_from_mask": ".layers",
    "synthetic_mask": ".layers",
    "PRESETS": ".presets",
    "builtin_devices": ".presets",
    "load_devices": ".presets",
    "sources": ".presets",
    "hardware_constants": ".request",
    "run_simulation": ".request",
    "Workload": ".workload",
    "from_checkpoint": ".workload",
    "from_model": ".workload",
    "from_shape": ".workload",
    "parse_shape": "sparsetool.util.options",
}

__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
