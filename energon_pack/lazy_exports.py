"""PEP 562 hooks for a package whose public names load on first use (the package face, ``chat``, ``energon``).

A package lists ``name -> module`` and installs the hooks with
``__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())``: ``import pkg`` then costs nothing, and
``pkg.name`` imports only the module that defines it (torch, Megatron-Energon, transformers stay unloaded until a
name that needs them is used). A name is kept in the package once loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` map each public name to its module (absolute,
    or relative to ``package``); ``namespace`` is the package's ``globals()``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
