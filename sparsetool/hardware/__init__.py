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

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from sparsetool.util.options import parse_shape as parse_shape

    from .compare import APPENDIX_C_TICKS as APPENDIX_C_TICKS
    from .compare import simulate as simulate
    from .compare import sweep as sweep
    from .devices import CPU as CPU
    from .devices import PASSES as PASSES
    from .devices import Cost as Cost
    from .devices import Dataflow as Dataflow
    from .devices import DenseGPU as DenseGPU
    from .devices import Device as Device
    from .devices import FlashLLMGPU as FlashLLMGPU
    from .devices import Refused as Refused
    from .devices import Sparse24GPU as Sparse24GPU
    from .devices import SpMMGPU as SpMMGPU
    from .layers import LayerMask as LayerMask
    from .layers import stats_from_mask as stats_from_mask
    from .layers import synthetic_mask as synthetic_mask
    from .measured import load_measurement as load_measurement
    from .presets import PRESETS as PRESETS
    from .presets import builtin_devices as builtin_devices
    from .presets import load_devices as load_devices
    from .presets import sources as sources
    from .request import hardware_constants as hardware_constants
    from .request import run_simulation as run_simulation
    from .workload import Workload as Workload
    from .workload import from_checkpoint as from_checkpoint
    from .workload import from_model as from_model
    from .workload import from_shape as from_shape

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
