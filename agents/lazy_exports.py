"""Lazy package exports: a package's names imported on first use, so a harness process that imports one
module of the package loads only what it needs (not fullasync, nor the other interpreter's harness).

Owns: `lazy_getattr(package, exports)`, a module `__getattr__` over `{name: module path}`. Stdlib only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_getattr(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """`__getattr__ = lazy_getattr(__name__, _EXPORTS)`: each name from its module, imported when first asked for."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
