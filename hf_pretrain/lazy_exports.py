"""A package's names imported when first used, not when the package is.

Importing `hf_pretrain.preflight.doctor` runs `hf_pretrain/preflight/__init__.py` first; when that file
imports torch (through the checks it re-exports), `hf-pretrain doctor --help` waits seconds (a minute on
a loaded machine) for a library it never uses. A package whose names are listed here instead loads each
one's module on first use (PEP 562), so `from hf_pretrain.preflight import run_checks` still works.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `exports[name]` (a module path) when `name` is read."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
