"""Lazy name tables behind the public facades (`ms_optim`, `ms_optim.nn`, `ms_optim.train_thor`).

Each facade maps a public name to the module that defines it and imports that module on first use,
so importing `ms_optim.nn` stays cheap and one unit's import error cannot break the others.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Dict, Optional


def lazy_getattr(table: Dict[str, str], facade: str, fallback: Optional[str] = None):
    """Return a module-level ``__getattr__`` resolving ``table[name]`` (a module path) lazily.

    Names not in ``table`` are looked up in the ``fallback`` module (for ``ms_optim.nn`` that is
    ``mindspore.nn``, so ``from ms_optim import nn`` still gives ``nn.Dense``, ``nn.Momentum``, ...).
    """

    def __getattr__(name: str) -> Any:
        if name in table:
            module: ModuleType = importlib.import_module(table[name])
            return getattr(module, name)
        if fallback is not None and not name.startswith("__"):
            module = importlib.import_module(fallback)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module '{facade}' has no attribute '{name}'")

    return __getattr__


def lazy_dir(table: Dict[str, str], fallback: Optional[str] = None):
    """Return a module-level ``__dir__`` listing the table's names (and the fallback's)."""

    def __dir__():
        names = set(table)
        if fallback is not None:
            names.update(n for n in dir(importlib.import_module(fallback)) if not n.startswith("_"))
        return sorted(names)

    return __dir__
