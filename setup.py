"""The package's compiled parts; everything else is in pyproject.toml.

The recorder's loops in C, built where a C compiler and Python's headers are: the coder of a recording's columns
(zeromon/model/_planes.c), the columns and step accounting of a pass's collectives
(agents/zeromon_agent/recorder/_batch.c), a GPU-less pass's phases, step boundaries and memory samples (_host.c beside
it), the hooks' queue (agents/zeromon_agent/hooks/_ring.c) and the live totals' count (agents/zeromon_agent/live/_totals.c).
Optional, so that an install without them succeeds, and the recorder then takes their Python paths, which give the
same values (zeromon.model.compiled). Here rather than in
pyproject.toml's ``[tool.setuptools.ext-modules]``, which setuptools still calls experimental.
"""

from setuptools import Extension, setup

# The headers in zeromon/model the modules share: a Python int read as a 64-bit one, and what the collector follows.
SHARED = ["zeromon/model/_int64.h", "zeromon/model/_tracked.h"]


def module(name: str, source: str, *headers: str) -> Extension:
    return Extension(name, [source], include_dirs=["zeromon/model"], depends=[*SHARED, *headers], optional=True)


COLUMNS = "agents/zeromon_agent/recorder/_columns.h"
setup(ext_modules=[
    module("zeromon.model._planes", "zeromon/model/_planes.c"),
    module("zeromon_agent.recorder._batch", "agents/zeromon_agent/recorder/_batch.c", COLUMNS),
    module("zeromon_agent.recorder._host", "agents/zeromon_agent/recorder/_host.c", COLUMNS),
    module("zeromon_agent.hooks._ring", "agents/zeromon_agent/hooks/_ring.c"),
    module("zeromon_agent.live._totals", "agents/zeromon_agent/live/_totals.c"),
])
