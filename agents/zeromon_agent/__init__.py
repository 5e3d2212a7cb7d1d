"""zeromon's in-process agent: records every collective, step phase and memory category of a rank.

    import zeromon_agent
    zeromon_agent.attach(model=model, optimizer=optimizer)   # everything optional
    for batch in data:
        with zeromon_agent.step():                           # optional: steps are found by themselves
            ...

or, with no code change: ``zeromon run --out runs/x -- torchrun --nproc-per-node 2 train.py``.

Importing this package is cheap (stdlib only): torch is imported when the agent starts, and UI
libraries (textual, dash, plotly) never are.

This module is the agent's public face (``__all__``): ``attach``, ``step``, ``detach``, ``get_agent``, the
``Agent`` they return, the settings (``load_config``, ``AgentConfig``) and the per-step figures the trainers'
loggers show (``StepFigures``, ``Agent.latest_step_figures()``). Everything else is the agent's inside, laid
out by where it runs (docs/development.md, "The agent's data flow"): ``hooks`` (the training thread),
``memory`` (its samples), ``recorder`` (the background thread), ``live`` (what the recorder publishes and
readers copy), ``serve`` (the endpoint), ``context`` (settings and what the run is), ``compact`` (the
recorder's compact records), ``exits`` (how the process ends); ``bootstrap`` and ``integrations`` adapt
launchers and trainers to the face.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from zeromon_agent.context.version import __version__

if TYPE_CHECKING:
    from zeromon_agent.agent import Agent
    from zeromon_agent.context.config import AgentConfig, load_config
    from zeromon_agent.live.figures import StepFigures

__all__ = ["Agent", "AgentConfig", "StepFigures", "__version__", "attach", "detach", "get_agent", "load_config",
           "step"]

# The face's classes and the settings loader, imported when first asked for (PEP 562): `import zeromon_agent`
# stays cheap, and the analysis the figures need is loaded only where someone reads them.
_LAZY = {"Agent": "zeromon_agent.agent", "AgentConfig": "zeromon_agent.context.config",
         "load_config": "zeromon_agent.context.config", "StepFigures": "zeromon_agent.live.figures"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'zeromon_agent' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

_agent: Agent | None = None
_lock = threading.Lock()


def attach(model: Any = None, optimizer: Any = None, engine: Any = None, **settings: Any) -> Agent:
    """Start the agent in this process (or add objects to the running one) and return it.

    ``model``: the root module (found on the first forward if omitted); ``optimizer``: the optimizer
    whose step ends a training step; ``engine``: a DeepSpeed engine (its module and optimizer are
    used). ``settings`` override the ZEROMON_* environment variables (see zeromon_agent.context.config).
    Raises zeromon.errors.ZeromonError for a bad or unknown keyword setting, naming it; a bad ZEROMON_*
    variable is a warning (stderr and a notice in the recording) and its default.
    """
    global _agent
    with _lock:
        if _agent is not None and _agent.started:
            _agent.attach_objects(model=model, optimizer=optimizer, engine=engine)
            return _agent
        from zeromon_agent.agent import Agent
        from zeromon_agent.context.config import load_config

        # A bad ZEROMON_* variable must not stop the training: a notice and its default (a bad keyword
        # here is the caller's own code, and raises).
        notices: list[str] = []
        config = load_config(notices=notices, **settings)
        for message in notices:
            _say(message)
        _agent = Agent(config)
        agent = _agent.start(model=model, optimizer=optimizer, engine=engine)
        for message in notices:
            agent.notice("warning", "settings", message)
        return agent


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"zeromon: warning: {message}\n")
    except Exception:  # noqa: BLE001 - a closed stderr is no reason to stop
        pass


def detach() -> None:
    """Flush and stop the agent; training goes on unobserved. Also runs at exit and on SIGTERM."""
    global _agent
    with _lock:
        if _agent is not None:
            _agent.stop()
            _agent = None


def get_agent() -> Agent | None:
    return _agent


@contextlib.contextmanager
def step() -> Iterator[None]:
    """Mark one training step explicitly, when the automatic detection does not fit the loop."""
    agent = _agent
    if agent is None or not agent.started:
        yield
        return
    try:
        agent.tracker.explicit_step_enter()
    except Exception as exc:  # noqa: BLE001
        agent.state.hook_error("step_enter", exc)
    try:
        yield
    finally:
        try:
            agent.tracker.explicit_step_exit()
        except Exception as exc:  # noqa: BLE001
            agent.state.hook_error("step_exit", exc)
