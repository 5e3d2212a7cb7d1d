"""A model named on the command line or in the dashboard's planner (MODULE:FACTORY or FILE.py:FACTORY),
built and counted as DeepSpeed counts it: `zeromon plan --model`."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError


def load_model(spec: str) -> Any:
    """'pkg.module:factory' or 'path/to/file.py:factory' -> factory(), which must be a torch nn.Module."""
    module_name, sep, factory_name = spec.rpartition(":")
    hint = "--model takes MODULE:FACTORY (e.g. examples.mymodel:build) or FILE.py:FACTORY, FACTORY() -> nn.Module"
    if not sep or not module_name or not factory_name.isidentifier():
        raise ZeromonError(f"--model: {spec!r} is not MODULE:FACTORY", hint=hint)
    try:
        module = _import(module_name)
    except Exception as exc:  # anything the user's module raises on import is the user's problem to see
        raise ZeromonError(f"--model: cannot import {module_name!r}: {type(exc).__name__}: {exc}", hint=hint) from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ZeromonError(f"--model: {module_name!r} has no callable {factory_name!r}", hint=hint)
    try:
        model = factory()
    except Exception as exc:
        raise ZeromonError(f"--model: {spec}() failed: {type(exc).__name__}: {exc}", hint=hint) from None
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ZeromonError(f"--model: {spec}() returned {type(model).__name__}, not a torch nn.Module", hint=hint)
    return model

def _import(module_name: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:  # the `zeromon` script, unlike `python -m`
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_name)

def count_model_params(model: Any) -> tuple[int, int]:
    """(total, largest layer) as DeepSpeed's stage3.model_to_params counts them.

    Total: each storage once (tied weights share a data_ptr); meta tensors, which all report data_ptr 0,
    count once per Parameter object. Largest layer: the module with the most parameters of its own
    (``parameters(recurse=False)``), DeepSpeed's definition of a layer.
    """
    unique = {}
    for p in model.parameters():
        key = ("ptr", p.data_ptr()) if not p.is_meta and p.numel() > 0 else ("id", id(p))
        unique[key] = p.numel()
    total = sum(unique.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    if total < 1:
        raise ZeromonError("--model: the model has no parameters", hint="pass --params N instead")
    return total, largest
