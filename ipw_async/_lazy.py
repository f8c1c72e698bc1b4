"""A package's public names, each loaded with its module on first use (PEP 562)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, exports: dict[str, str], loaded: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` (``loaded``: its globals): a
    name in ``exports`` (name: module, relative to the package) imports its module the first
    time it is asked for, and ``dir()`` lists it before."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    def __dir__() -> list[str]:
        return sorted({*loaded, *exports})

    return __getattr__, __dir__
