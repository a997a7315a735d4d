"""A package's public names imported on first use: the ``__getattr__`` and ``__dir__`` of a package
whose ``__init__.py`` lists its names in a ``_WHERE`` table (name -> module of the package), so
importing the package imports none of its modules (and torch-free paths stay torch-free)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(namespace: dict[str, Any], where: Mapping[str, str]
               ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is ``namespace``: a name
    of ``where`` is imported from its module on first use and kept in ``namespace``."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
