"""What the trainers' callbacks share: attaching the agent to the trainer's objects, and turning the
agent's newest figures (zeromon_agent.StepFigures) into the keys a logger takes and its new
findings into lines of text. Framework-free: hf.py and lightning.py adapt it to their trainer.

Every entry point here is called from a training hook and never raises: an error is counted as a
hook error of the agent (its recording's stats) and logged once, as the agent's own hooks do.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import zeromon_agent
from zeromon.analysis.finding_groups import FindingGroup, group_findings
from zeromon.analysis.findings import Finding, Severity

# The agent's public face (zeromon_agent's __all__), and its hot state, whose error count a failing logger joins.
from zeromon_agent import StepFigures
from zeromon_agent.hooks.state import STATE

__all__ = ["DEFAULT_PREFIX", "TrainerReport", "finding_text", "innermost_optimizer", "logged_values"]

DEFAULT_PREFIX = "zeromon/"
T = TypeVar("T")
# Findings at these severities are counted and sent as text; INFO ones (a pending optimizer state that
# fits, no samples yet) are notes for the report, not news for a training dashboard.
_SENT = (Severity.WARN, Severity.CRITICAL)


def innermost_optimizer(optimizer: Any) -> Any:
    """The torch optimizer inside the trainers' wrappers (accelerate's AcceleratedOptimizer, Lightning's
    LightningOptimizer keep it as ``.optimizer``): the one whose step the agent's hooks see."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer = inner
    return optimizer


def _is_deepspeed_engine(model: Any) -> bool:
    engine_module = sys.modules.get("deepspeed.runtime.engine")  # loaded by whoever made one
    return engine_module is not None and isinstance(model, engine_module.DeepSpeedEngine)


def logged_values(figures: StepFigures, prefix: str = DEFAULT_PREFIX) -> dict[str, float]:
    """The figures as a logger's scalars, under ``prefix`` (docs/trainers.md); unknown ones left out."""
    ratio = figures.exposed_comm_ratio
    values: dict[str, float | int | None] = {
        "step": figures.step,
        "step_time_s": figures.step_s,
        "comm_s": figures.comm_s,
        "exposed_comm_s": figures.exposed_comm_s,
        "exposed_comm_pct": 100.0 * ratio if ratio is not None else None,
        "overlap_ratio": figures.overlap_ratio,
        "comm_bytes": figures.comm_bytes,
        "collectives": figures.collectives,
        "peak_memory_bytes": figures.peak_memory_bytes,
        "memory_capacity_bytes": figures.capacity_bytes,
        "memory_headroom_bytes": figures.headroom_bytes,
        "oom_predicted_peak_bytes": figures.predicted_peak_bytes,
        "oom_steps_to_capacity": figures.steps_to_capacity,
        "oom_risk": figures.oom_risk_level,
        "findings": sum(f.severity in _SENT for f in figures.findings),
    }
    return {prefix + name: value for name, value in values.items() if value is not None}


def finding_text(finding: Finding | FindingGroup) -> str:
    """One line: severity, title (a group's, as every surface words it) and the first remedy."""
    remedy = f" (remedy: {finding.remedies[0]})" if finding.remedies else ""
    return f"{finding.severity.value}: {finding.title}{remedy}"


class TrainerReport:
    """One callback's state: the findings it has sent (each once per kind and severity)."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a string (for example {DEFAULT_PREFIX!r}), not {type(prefix).__name__}")
        self.prefix = prefix
        self._sent_findings: set[tuple[str, str]] = set()

    def attach(self, model: Any, optimizer: Any) -> None:
        """Start the agent, or give the running one (``zeromon run``'s) the trainer's model and optimizer.
        ``model``: the outermost module the trainer calls (DDP, FSDP or a DeepSpeed engine, where it wraps),
        None to let the agent find it on the first forward."""
        def attach() -> None:
            if _is_deepspeed_engine(model):
                zeromon_agent.attach(engine=model)
            else:
                zeromon_agent.attach(model=model, optimizer=innermost_optimizer(optimizer)
                                     if optimizer is not None else None)

        guarded("integration_attach", attach, None)

    def read(self) -> tuple[dict[str, float], list[str]]:
        """The scalars of the newest summarized step (empty before the first; the same step again where no
        newer one was summarized since: ``<prefix>step`` names it) and the text of the findings not sent
        before."""
        def read() -> tuple[dict[str, float], list[str]]:
            agent = zeromon_agent.get_agent()
            figures = agent.latest_step_figures() if agent is not None else None
            if figures is None:
                return {}, []
            texts = []
            # As every surface lists them (one entry per problem); sent once per kind and severity, as the
            # title of a live finding changes with its figures ("peak memory at 88% of capacity").
            for group in group_findings(f for f in figures.findings if f.severity in _SENT):
                key = (group.kind, group.severity.value)
                if key not in self._sent_findings:
                    self._sent_findings.add(key)
                    texts.append(finding_text(group))
            return logged_values(figures, self.prefix), texts

        nothing: tuple[dict[str, float], list[str]] = ({}, [])
        return guarded("integration_figures", read, nothing)


def guarded(where: str, call: Callable[[], T], default: T) -> T:
    """``call()``, or ``default`` where it raises (counted as the agent's hook error ``where``)."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - a logging callback must never stop the training
        STATE.hook_error(where, exc)
        return default
