"""A callback run right after a module's first import has executed it (an import hook on sys.meta_path).

`zeromon run`'s bootstrap patches torch.distributed the moment ``import torch`` completes; the agent patches
DTensor's functional collectives the moment they are imported, where they were not when it started (a DDP or
DeepSpeed run never imports them, and importing them is a cost at every rank's start: tests/bench/RESULTS.md).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after the module ``name`` finishes executing, once; removes itself then."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original_exec = loader.exec_module
        finder = self

        def exec_module(module: ModuleType) -> None:
            original_exec(module)
            finder.remove()
            finder.callback(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def install(self) -> AfterImport:
        """First on sys.meta_path."""
        sys.meta_path.insert(0, self)
        return self

    def remove(self) -> None:
        """Off sys.meta_path (nothing if it was not there)."""
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
