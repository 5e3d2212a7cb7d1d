"""Start the agent with no code change: what `zeromon run` injects into every Python process.

`zeromon run` puts ``bootstrap/site`` first on PYTHONPATH; its ``sitecustomize`` calls
``install_hooks()``, which:
1. patches torch.distributed's collectives as soon as ``import torch`` completes (before DeepSpeed's
   TorchBackend caches ``all_gather_into_tensor``), recording nothing yet;
2. wraps ``init_process_group`` (everywhere torch has imported it) so that the agent starts once
   the process group exists; launchers such as torchrun never create one, so no agent starts there;
3. as a fallback, starts the agent at the first collective if the group was made another way.
A failure here prints one line to stderr and leaves the program to run unobserved.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from zeromon_agent.hooks.after_import import AfterImport

_started = threading.Event()
_failed = False


def _warn(message: str) -> None:
    try:
        sys.stderr.write(f"zeromon: {message}\n")
    except Exception:  # noqa: BLE001
        pass


def _enabled() -> bool:
    return os.environ.get("ZEROMON_ENABLE", "1").strip().lower() not in ("0", "false", "no", "off")


def start_agent() -> bool:
    """Start the agent from ZEROMON_* settings if the process group exists. Never raises."""
    global _failed
    if _started.is_set() or _failed:
        return _started.is_set()
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return False
        _started.set()
        import zeromon_agent
        from zeromon_agent.hooks.state import STATE

        STATE.autostart = None
        zeromon_agent.attach()
        return True
    except Exception as exc:  # noqa: BLE001 - a bad setting or a bug: the training goes on unobserved
        _failed = True
        from zeromon_agent.hooks.state import STATE

        STATE.autostart = None
        _warn(f"the agent did not start: {exc}")
        return False


def _wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        start_agent()
        return result

    init_process_group.__zeromon_original__ = original  # type: ignore[attr-defined]
    return init_process_group


def _on_torch_imported(torch: ModuleType) -> None:
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from zeromon_agent.hooks import collectives
        from zeromon_agent.hooks.state import STATE

        collectives.install(STATE)
        original = dist.init_process_group
        if not hasattr(original, "__zeromon_original__"):
            wrapped = _wrap_init(original)
            # Modules that did `from ... import init_process_group` (device_mesh does) hold their own name.
            for name, module in list(sys.modules.items()):
                if (name == "torch" or name.startswith("torch.")) and getattr(module, "init_process_group", None) is original:
                    setattr(module, "init_process_group", wrapped)  # noqa: B010 - any module
        STATE.autostart = start_agent
    except Exception as exc:  # noqa: BLE001
        _warn(f"could not hook torch.distributed: {exc}")


def install_hooks() -> None:
    if not _enabled():
        return
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "distributed"):
        _on_torch_imported(torch)
    else:
        AfterImport("torch", _on_torch_imported).install()
