"""The agent's newest per-step figures, as one immutable value for whoever shows them in-process.

What the trainers' loggers get from zeromon_agent.integrations (HF Trainer, Lightning): the newest
step the agent has summarized (its time, communication and exposed communication, the overlap the
agent computed), the OOM forecast (headroom, predicted peak, risk) and the findings, all taken from
one ``live.view.View``, the same that /metrics and /api/v1/snapshot render, so that the numbers agree
with the endpoint's and, step by step, with the recording.
"""

from __future__ import annotations

from zeromon.analysis.findings import Finding, Severity
from zeromon.model.classes import frozen
from zeromon_agent.live.view import View

__all__ = ["RISK_LEVEL", "StepFigures", "figures_of"]

# The OOM risk as a number (the zeromon_oom_risk gauge's): 0 ok, 1 warn, 2 critical.
RISK_LEVEL = {Severity.OK: 0, Severity.INFO: 0, Severity.WARN: 1, Severity.CRITICAL: 2}


@frozen
class StepFigures:
    """One rank's newest summarized step and its memory outlook. None: not known (yet)."""

    rank: int
    step: int  # zeromon's index of the step, from 0 (the recording's StepSummary.step)
    step_s: float  # first phase start to optimizer step end
    comm_s: float | None  # union of the step's collective intervals; None: a GPU step not timed on the device
    exposed_comm_s: float | None  # communication not overlapped with computation (HTA's definition)
    overlap_ratio: float | None  # overlapped / all communication time
    comm_bytes: int | None  # sum of the larger of bytes in/out per collective
    collectives: int | None
    peak_memory_bytes: int | None  # the step's highest allocator (GPU) or RSS (CPU) reading
    capacity_bytes: int | None
    headroom_bytes: int | None  # capacity minus the predicted peak; negative: it will not fit
    predicted_peak_bytes: int | None
    steps_to_capacity: float | None  # only while the peak grows
    oom_risk: Severity  # OK without a forecast
    findings: tuple[Finding, ...]  # every finding the agent holds now (the forecast's and the overlap's)

    @property
    def exposed_comm_ratio(self) -> float | None:
        """Exposed communication / step time (the zeromon_step_exposed_comm_ratio gauge)."""
        if self.exposed_comm_s is None or self.step_s <= 0:
            return None
        return self.exposed_comm_s / self.step_s

    @property
    def oom_risk_level(self) -> int:
        return RISK_LEVEL[self.oom_risk]


def figures_of(view: View, rank: int) -> StepFigures | None:
    """The figures of ``view`` (None before the first step is summarized)."""
    if not view.steps:
        return None
    last, oom = view.steps[-1], view.oom
    return StepFigures(
        rank=rank, step=last.step, step_s=last.duration_s, comm_s=last.comm_union_s,
        exposed_comm_s=last.exposed_comm_s, overlap_ratio=last.overlap_ratio, comm_bytes=last.comm_bytes,
        collectives=last.collectives, peak_memory_bytes=last.peak_memory,
        capacity_bytes=oom.capacity_bytes if oom is not None else None,
        headroom_bytes=oom.headroom_bytes if oom is not None else None,
        predicted_peak_bytes=oom.predicted_peak_bytes if oom is not None else None,
        steps_to_capacity=oom.steps_to_capacity if oom is not None else None,
        oom_risk=oom.risk if oom is not None else Severity.OK, findings=view.findings)
