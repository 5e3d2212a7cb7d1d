"""The package's optional C modules (setup.py builds them where a C compiler is): each one, or None where it was not
built or ZEROMON_NO_COMPILED=1 leaves the C parts out of this process (a comparison; a build to rule out). Each has a
Python path that gives the same values (tests/test_recorder_fast_path.py runs both)."""

from __future__ import annotations

import importlib
import os
from typing import Any

# Every C module setup.py builds, and what it does.
MODULES = {
    "zeromon.model._planes": "the recording's column coder and its records' type check",
    "zeromon_agent.recorder._batch": "a pass's collectives' columns and step accounting, a step's sums, its records out "
                                     "of the collector's walk",
    "zeromon_agent.recorder._host": "a GPU-less pass's phases, step boundaries and memory samples",
    "zeromon_agent.hooks._ring": "the hooks' queue",
    "zeromon_agent.live._totals": "the live totals' count of a pass's collectives",
}


def compiled(name: str, environment: bool = True) -> Any:
    """The C module ``name`` (imported by name: a C module imports nothing, which the layers' contracts cannot
    read from an import statement), or None; ``environment`` False: whether it was built, whatever
    ZEROMON_NO_COMPILED says."""
    if environment and os.environ.get("ZEROMON_NO_COMPILED", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:  # not built: an install without a C compiler
        return None
