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

INT64 = "zeromon/model/_int64.h"  # a Python int read as a 64-bit one, shared by the modules below
COLUMNS = dict(include_dirs=["zeromon/model"], depends=[INT64, "agents/zeromon_agent/recorder/_columns.h"])

setup(ext_modules=[
    Extension("zeromon.model._planes", ["zeromon/model/_planes.c"], depends=[INT64], optional=True),
    Extension("zeromon_agent.recorder._batch", ["agents/zeromon_agent/recorder/_batch.c"], **COLUMNS, optional=True),
    Extension("zeromon_agent.recorder._host", ["agents/zeromon_agent/recorder/_host.c"], **COLUMNS, optional=True),
    Extension("zeromon_agent.hooks._ring", ["agents/zeromon_agent/hooks/_ring.c"], optional=True),
    Extension("zeromon_agent.live._totals", ["agents/zeromon_agent/live/_totals.c"], include_dirs=["zeromon/model"],
              depends=[INT64], optional=True),
])
