"""sparsetool's version: read by ``sparsetool.__version__`` and by the provenance every written
checkpoint records (``checkpoint/provenance.py``), low in the stack so neither imports upward."""

__version__ = "0.1.0"
