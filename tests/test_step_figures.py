"""The agent's per-step figures for in-process readers (Agent.latest_step_figures, the trainers'
callbacks): read without waiting, fresh once the recorder has published, never raising into training.
The callbacks under the real trainers: tests/test_callback_hf.py, tests/test_callback_lightning.py."""

from __future__ import annotations

from typing import Any

import pytest

import zeromon_agent
from zeromon.analysis.findings import Finding, Severity
from zeromon_agent.hooks.state import RAW_MEMORY, STATE, HotState, perf_ns
from zeromon_agent.integrations.hf import _ahead_of_integrations
from zeromon_agent.integrations.report import TrainerReport, logged_values
from zeromon_agent.live.figures import StepFigures
from zeromon_agent.live.view import Identity, LiveData
from zeromon_agent.recorder.loop import Recorder


def _live() -> tuple[HotState, Recorder, LiveData]:
    state = HotState()
    recorder = Recorder(state, rank=0, writer=None, flush_interval_s=1.0)
    return state, recorder, LiveData(recorder, Identity(rank=0, local_rank=0, world_size=1, host="h", pid=1, job="j",
                                                        start_ns=0))


def _sample(state: HotState) -> None:
    fields = dict.fromkeys(("allocated", "reserved", "active", "peak_allocated", "peak_reserved", "inactive_split",
                            "num_alloc_retries", "num_ooms", "free"))
    state.control.append((RAW_MEMORY, "forward", 0, perf_ns(), {**fields, "device": "cpu", "rss": 2**30,
                                                                "capacity": 2**32}))


def test_a_reader_never_waits_for_a_view_another_thread_is_taking() -> None:
    _, _, live = _live()
    first = live.view_if_free()  # none cached, no other reader: taken
    assert first is not None
    with live._lock:  # a scrape taking a view: the training thread gets the previous one, at once
        assert live.view_if_free() is first


def test_a_reader_gets_a_new_view_once_the_recorder_has_published_and_the_endpoint_keeps_its_ttl() -> None:
    state, recorder, live = _live()
    first = live.view_if_free()
    _sample(state)
    recorder._drain(final=False)
    assert live.view() is first  # within VIEW_TTL_S, the endpoint's scrapes share one copy
    newer = live.view_if_free()
    assert newer is not first and newer is not None and newer.memory is not None


def _figures(*findings: Finding, exposed: float | None = 0.25) -> StepFigures:
    return StepFigures(rank=0, step=3, step_s=0.5, comm_s=0.3, exposed_comm_s=exposed, overlap_ratio=None,
                       comm_bytes=1000, collectives=2, peak_memory_bytes=None, capacity_bytes=2**32,
                       headroom_bytes=2**31, predicted_peak_bytes=2**31, steps_to_capacity=None,
                       oom_risk=Severity.WARN, findings=findings)


def test_the_logged_values_are_the_figures_under_the_prefix_and_leave_out_what_is_unknown() -> None:
    values = logged_values(_figures(Finding("poor_overlap", Severity.WARN, "t"), Finding("oom_no_data", Severity.INFO,
                                                                                           "n")), prefix="z/")
    assert values["z/exposed_comm_pct"] == pytest.approx(50.0) and values["z/step"] == 3
    assert values["z/oom_risk"] == 1 and values["z/findings"] == 1  # INFO is not counted
    assert "z/overlap_ratio" not in values and "z/peak_memory_bytes" not in values
    assert "z/exposed_comm_pct" not in logged_values(_figures(exposed=None))


class _Agent:
    def __init__(self, figures: Any) -> None:
        self.figures = figures

    def latest_step_figures(self) -> Any:
        if isinstance(self.figures, Exception):
            raise self.figures
        return self.figures


def test_a_finding_is_sent_as_text_once_per_kind_and_severity(monkeypatch: pytest.MonkeyPatch) -> None:
    report = TrainerReport()
    warn = Finding("poor_overlap", Severity.WARN, "rank 0: 30% of step time is exposed communication",
                   remedies=("prefetch",))
    agent = _Agent(_figures(warn))
    monkeypatch.setattr(zeromon_agent, "get_agent", lambda: agent)
    values, texts = report.read()
    assert values["zeromon/step"] == 3
    assert texts == ["warn: rank 0: 30% of step time is exposed communication (remedy: prefetch)"]
    assert report.read()[1] == []  # the same finding, the same severity: said already
    agent.figures = _figures(Finding("poor_overlap", Severity.CRITICAL, "rank 0: 60% ..."))
    assert report.read()[1] == ["critical: rank 0: 60% ..."]


def test_an_error_while_reading_is_counted_never_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zeromon_agent, "get_agent", lambda: _Agent(RuntimeError("boom")))
    before = STATE.hook_errors
    assert TrainerReport().read() == ({}, [])
    assert STATE.hook_errors == before + 1
    with pytest.raises(TypeError, match="prefix"):
        TrainerReport(prefix=3)  # type: ignore[arg-type]  # the caller's own code: said at once


def test_the_hf_callback_goes_just_ahead_of_the_first_report_to_integration() -> None:
    integration = type("TensorBoardCallback", (), {"__module__": "transformers.integrations.integration_utils"})()
    flow, printer, ours = object(), object(), object()
    assert _ahead_of_integrations([flow, integration, ours, printer], ours) == [flow, ours, integration, printer]
    assert _ahead_of_integrations([flow, ours, integration], ours) is None  # there already
    assert _ahead_of_integrations([flow, ours, printer], ours) is None  # no integration
