"""Injected by `zeromon run` (first on PYTHONPATH): hooks zeromon's agent into this process.

It then runs the sitecustomize it shadows, if there is one further down sys.path.
"""

import importlib.util
import os
import sys

try:
    from zeromon_agent.bootstrap import install_hooks

    install_hooks()
except Exception as _exc:  # noqa: BLE001 - never stop the user's program from starting
    sys.stderr.write(f"zeromon: agent bootstrap failed: {_exc}\n")


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_zeromon_chained_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            return


try:
    _chain()
except Exception as _exc:  # noqa: BLE001
    sys.stderr.write(f"zeromon: the chained sitecustomize failed: {_exc}\n")
