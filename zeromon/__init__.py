"""zeromon: live memory and communication monitoring for DeepSpeed ZeRO and PyTorch FSDP training.

The package root stays light: submodules load on first use (PEP 562), so importing ``zeromon``
from inside a training process costs milliseconds.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = {"model", "analysis", "errors", "cli"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
