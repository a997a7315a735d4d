"""sparsetool: tools for unstructured-sparse language models.

The Python API, with the CLI's parameter names (each loaded on first use, so ``import sparsetool``
stays light and does not import torch)::

    sparsetool.load(path) -> dict[str, torch.Tensor]       # dense tensors from any sparse encoding
    sparsetool.prune(path, output, sparsity=0.75, ...)    # -> PruneResult
    sparsetool.shrink(path, output, experts=0.5, calibration="text.txt")  # -> ShrinkResult
    sparsetool.densify(path, output)                      # -> DensifyResult
    sparsetool.convert(gguf_or_dir, output, gguf_type="q8_0")  # a GGUF file <-> a directory
    sparsetool.report(path) -> Report                     # .to_json() is `report --json`
    sparsetool.eval([path, ...], text=None) -> EvalResult  # NLL, perplexity, bits per byte
    sparsetool.diff(a, b) -> DiffResult                   # per-matrix change between checkpoints
    sparsetool.simulate(model="gpt3-xl", sparsity=0.75)   # -> SimulationResult (`simulate --json`)

``flops``, ``train`` and ``demo`` are reached through the library (``sparsetool.flops.account``,
``sparsetool.train.loop.train``, ``sparsetool.demo.run_demo``): docs/python-api.md.

``sparsetool.eval`` is not in ``__all__``, so ``from sparsetool import *`` leaves the builtin
``eval`` alone.
"""

from typing import TYPE_CHECKING

from sparsetool.util.lazy import lazy_names
from sparsetool.util.version import __version__

__all__ = [
    "__version__",
    "load",
    "prune",
    "shrink",
    "densify",
    "convert",
    "report",
    "diff",
    "simulate",
]

_WHERE = dict.fromkeys(
    ["load", "prune", "shrink", "densify", "convert", "report", "eval", "diff", "simulate"],
    "sparsetool.api",
)

if TYPE_CHECKING:  # what a type checker sees; at run time each name loads on first use
    from sparsetool.api import convert as convert
    from sparsetool.api import densify as densify
    from sparsetool.api import diff as diff
    from sparsetool.api import eval as eval
    from sparsetool.api import load as load
    from sparsetool.api import prune as prune
    from sparsetool.api import report as report
    from sparsetool.api import shrink as shrink
    from sparsetool.api import simulate as simulate

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
