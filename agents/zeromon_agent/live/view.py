"""A reader's copy of what the recorder has published: one consistent View, taken under the recorder's lock.

``LiveData.view()`` copies the recorder's live state (zeromon_agent.live.published.LiveViews) under its lock
(references and a few small tuples: tens of microseconds, so the recorder thread never waits long) and derives
the rest outside the lock: bus bandwidth medians, the OOM forecast (``zeromon.analysis.oom.forecast`` on a
Recording of the live memory history, kept for FORECAST_TTL_S) and the findings. A view is reused for
VIEW_TTL_S, so a scrape storm costs one copy per half second. /metrics (zeromon_agent.serve.metrics), the
snapshot JSON (zeromon_agent.serve.snapshot) and the trainers' loggers (zeromon_agent.live.figures) all read
views, so they agree with each other.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zeromon.analysis.comm_advice import overlap_findings
from zeromon.analysis.findings import Finding
from zeromon.analysis.oom import OomForecast, forecast
from zeromon.analysis.step_overlap import StepOverlap, overlap_of_summary
from zeromon.model.classes import frozen
from zeromon.model.events import (
    AgentStats,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    RunInfo,
    StepSummary,
)
from zeromon.model.progress import LIVE, RankProgress
from zeromon.model.recording import Recording

VIEW_TTL_S = 0.5
# The OOM forecast is a trend over the memory history (2,048 samples, hundreds of steps), the dearest part of a view
# at a full history: taken again at most this often, and at once when an OOM is counted (tests/bench/RESULTS.md, the
# watched loop).
FORECAST_TTL_S = 5.0


@frozen
class Identity:
    """Who this endpoint is: the labels of every metric and the head of every snapshot."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    job: str
    start_ns: int


@frozen
class CollectiveRow:
    op: str
    meaning: str
    calls: int
    bytes: int
    seconds: float  # sum of measured durations
    timed_calls: int  # calls with a measured duration
    blocked_s: float
    buckets: tuple[int, ...]  # not cumulative, per live_totals.DURATION_BUCKETS bound, last = +Inf


@frozen
class View:
    """The recorder's live state at one moment, and what is derived from it."""

    t_ns: int
    cursor: int
    run_info: RunInfo | None
    steps: tuple[StepSummary, ...]  # newest last
    memory: MemorySample | None
    categories: Mapping[str, int]  # of the newest sample with a category walk
    device: DeviceSample | None
    stats: AgentStats
    collectives: tuple[CollectiveRow, ...]
    busbw: Mapping[str, float]  # op -> median of the recent bus bandwidth samples, bytes/s
    step_count: int
    step_seconds: float
    step_buckets: tuple[int, ...]  # not cumulative, per live_totals.STEP_BUCKETS bound, last = +Inf
    ooms: int
    oom: OomForecast | None
    findings: tuple[Finding, ...]
    notices: tuple[Notice, ...]
    recent: tuple[Any, ...]  # the records published last, oldest first; a record may be unmade: materialize
    progress: RankProgress | None = None  # where the rank is in its collectives (None: not known)


class LiveData:
    """Views of one recorder, cached; safe to call from any number of endpoint threads."""

    def __init__(self, recorder: Any, identity: Identity, extra_cpu_s: Callable[[], float] | None = None) -> None:
        self.recorder = recorder
        self.identity = identity
        self.extra_cpu_s = extra_cpu_s  # the endpoint's own threads' CPU time, counted as the agent's
        self._lock = threading.Lock()  # one copy at a time; the others wait for it and share it
        self._view: View | None = None
        self._view_at = 0.0
        self._forecast: tuple[float, int, OomForecast | None] | None = None  # (when, OOMs counted, forecast)
        # Each step's overlap (overlap_of_summary) by step number, with the summary it was taken from: a view takes
        # only the new steps' (the findings' medians run over the 512 recent steps)
        self._overlaps: dict[int, tuple[StepSummary, StepOverlap | None]] = {}

    def view(self) -> View:
        with self._lock:
            return self._fresh()

    def view_if_free(self) -> View | None:
        """The view as ``view()`` gives it, also taken again as soon as the recorder has published since
        (one copy per pass at most), but never waiting for another thread's copy: while one is being made
        elsewhere (a scrape), the previous view (None before the first). For the training thread."""
        if not self._lock.acquire(blocking=False):
            return self._view
        try:
            return self._fresh(newer=True)
        finally:
            self._lock.release()

    def _fresh(self, newer: bool = False) -> View:
        """The cached view, taken again once older than VIEW_TTL_S, or (``newer``) once the recorder's cursor
        has moved past it (self._lock held)."""
        now = time.monotonic()
        view = self._view
        if view is None or now - self._view_at >= VIEW_TTL_S or (newer and self.recorder.live.cursor != view.cursor):
            view = self._view = self._take(now)
            self._view_at = now
        return view

    def _take(self, now: float) -> View:
        rec = self.recorder
        live = rec.live
        history = live.memory_samples()
        with live.lock:
            cursor = live.cursor
            run_info = live.run_info
            steps = tuple(live.recent_steps)
            memory = live.latest_memory
            device = live.latest_device
            notices = tuple(live.notices)
            recent = tuple(live.recent)
            rows = tuple(CollectiveRow(op, meaning, t.calls, t.bytes, t.seconds, t.timed_calls, t.blocked_s,
                                       tuple(t.buckets)) for (op, meaning), t in live.totals.collectives.items())
            busbw_samples = {op: list(window) for op, window in live.totals.busbw.items() if window}
            step_totals = live.totals.steps
            step_count, step_seconds, step_buckets = step_totals.count, step_totals.seconds, tuple(step_totals.buckets)
            ooms = live.totals.ooms
        stats = rec.stats()
        if self.extra_cpu_s is not None:
            stats = dataclasses.replace(stats, cpu_time_s=round(stats.cpu_time_s + self.extra_cpu_s(), 6))
        walked = next((m for m in reversed(history) if m.walked), None)
        oom = self._oom(now, history, steps, run_info, recent if ooms else (), ooms)
        overlaps = [o for o in self._step_overlaps(steps) if o is not None]
        findings = (oom.findings if oom is not None else ()) + (
            overlap_findings(self.identity.rank, overlaps, run_info) if overlaps else ())
        return View(
            t_ns=time.time_ns(), cursor=cursor, run_info=run_info, steps=steps, memory=memory,
            categories=dict(walked.categories) if walked is not None else {}, device=device, stats=stats,
            collectives=tuple(sorted(rows, key=lambda r: (r.op, r.meaning))),
            busbw={op: statistics.median(values) for op, values in sorted(busbw_samples.items())},
            step_count=step_count, step_seconds=step_seconds, step_buckets=step_buckets, ooms=ooms, oom=oom,
            findings=findings, notices=notices, recent=recent, progress=self._progress(),
        )

    def _progress(self) -> RankProgress | None:
        report = getattr(self.recorder, "progress_report", None)
        if report is None:
            return None
        try:
            return report(LIVE)  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - a snapshot without it rather than none
            return None

    def _step_overlaps(self, steps: tuple[StepSummary, ...]) -> list[StepOverlap | None]:
        """overlap_of_summary of each of ``steps``, taken once a step (self._lock held); the steps gone from the
        recent ones forgotten."""
        known, fresh = self._overlaps, {}
        for summary in steps:
            entry = known.get(summary.step)
            if entry is None or entry[0] is not summary:
                entry = (summary, overlap_of_summary(summary))
            fresh[summary.step] = entry
        self._overlaps = fresh
        return [overlap for _, overlap in fresh.values()]

    def _oom(self, now: float, history: list[MemorySample], steps: tuple[StepSummary, ...],
             run_info: RunInfo | None, recent: tuple[Any, ...], ooms: int) -> OomForecast | None:
        """The OOM forecast of the live memory history, recomputed at most every FORECAST_TTL_S, and at once when
        an OOM was counted since. ``recent``: where the OOMs are looked for (empty where the recorder counted none:
        4,096 records by default)."""
        cached = self._forecast
        if cached is not None and now - cached[0] < FORECAST_TTL_S and cached[1] == ooms \
                and (cached[2] is not None or not history):
            return cached[2]
        if not history:
            result = None
        else:
            recording = Recording(
                path=Path(f"<live rank {self.identity.rank}>"), header={"rank": self.identity.rank},
                memory=history, steps=list(steps), run_info=run_info,
                ooms=[r for r in recent if isinstance(r, OomEvent)])
            result = forecast(recording)
        self._forecast = (now, ooms, result)
        return result
