"""A package face that loads its names on first use: the one helper every ``__init__.py`` uses.

A face names its public parts in a table, name -> the module that defines it (absolute, or
relative to the package with a leading dot), and imports each only when it is first asked for,
so ``import sparsetool`` and ``import sparsetool.flops`` stay free of torch and numpy::

    _WHERE = {"open_checkpoint": ".reader", "ConfigError": "sparsetool.errors"}
    __all__ = sorted(_WHERE)
    __getattr__, __dir__ = lazy_names(__name__, _WHERE)

``tests/test_structure.py`` resolves every name of every ``__all__``, so a table naming a wrong
module fails there. This module imports nothing but the standard library.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping

__all__ = ["lazy_names"]


def lazy_names(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of the package ``package`` whose names
    ``where`` maps to their modules. A name is imported on first use and kept in the package,
    so the second use is a plain attribute; any other name raises AttributeError as usual."""

    def __getattr__(name: str) -> object:
        home = where.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
