"""What the endpoint serves, taken from the recorder: one consistent copy, and the snapshot JSON.

``LiveData.view()`` copies the recorder's live state (live_views.LiveViews) under its lock (references and a
few small tuples: tens of microseconds, so the recorder thread never waits long) and derives the
rest outside the lock: bus bandwidth medians, the OOM forecast (``zeromon.analysis.oom.forecast``
on a Recording of the live memory history, kept for FORECAST_TTL_S) and the findings. A view is
reused for VIEW_TTL_S, so a scrape storm costs one copy per half second. /metrics and
/api/v1/snapshot both render from views, so they agree with each other.

Snapshot JSON, schema ``zeromon.snapshot/1`` (docs/snapshot.md documents it for clients).
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeromon.analysis.comm_advice import overlap_findings_of_summaries
from zeromon.analysis.findings import Finding
from zeromon.analysis.oom import OomForecast, forecast
from zeromon.model.events import (
    AgentStats,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    Record,
    RunInfo,
    StepSummary,
)
from zeromon.model.kinds import FIELDS_OF, GETTERS, KIND_OF
from zeromon.model.progress import LIVE, RankProgress
from zeromon.model.recording import Recording
from zeromon_agent.collective_records import unmade_type

SCHEMA = "zeromon.snapshot/1"
VIEW_TTL_S = 0.5
FORECAST_TTL_S = 1.0
DEFAULT_STEPS = 64
DEFAULT_EVENT_LIMIT = 2000
MAX_EVENT_LIMIT = 20000


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this endpoint is: the labels of every metric and the head of every snapshot."""

    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int
    job: str
    start_ns: int


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    op: str
    meaning: str
    calls: int
    bytes: int
    seconds: float  # sum of measured durations
    timed_calls: int  # calls with a measured duration
    blocked_s: float
    buckets: tuple[int, ...]  # not cumulative, per live_totals.DURATION_BUCKETS bound, last = +Inf


@dataclass(frozen=True, slots=True)
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
        self._forecast: tuple[float, OomForecast | None] | None = None  # (when, forecast)

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
        oom = self._oom(now, history, steps, run_info, recent if ooms else ())
        findings = (oom.findings if oom is not None else ()) + overlap_findings_of_summaries(self.identity.rank, steps, run_info)
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

    def _oom(self, now: float, history: list[MemorySample], steps: tuple[StepSummary, ...],
             run_info: RunInfo | None, recent: tuple[Any, ...]) -> OomForecast | None:
        """The OOM forecast of the live memory history, recomputed at most every FORECAST_TTL_S. ``recent``:
        where the OOMs are looked for (empty where the recorder counted none: 4,096 records by default)."""
        cached = self._forecast
        if cached is not None and now - cached[0] < FORECAST_TTL_S and (cached[1] is not None or not history):
            return cached[1]
        if not history:
            result = None
        else:
            recording = Recording(
                path=Path(f"<live rank {self.identity.rank}>"), header={"rank": self.identity.rank},
                memory=history, steps=list(steps), run_info=run_info,
                ooms=[r for r in recent if isinstance(r, OomEvent)])
            result = forecast(recording)
        self._forecast = (now, result)
        return result


_SCALAR_TYPES = frozenset(f"{t}{none}" for t in ("int", "float", "str", "bool") for none in ("", " | None"))
# Per record type, the fields that may hold a mapping (those not declared a scalar), the only ones looked
# at; the values read in one call (codec's getters): a snapshot makes up to 2,000 of these a second.
_MAPPING_FIELDS = {cls: tuple(f.name for f in dataclasses.fields(cls) if str(f.type) not in _SCALAR_TYPES)
                   for cls in FIELDS_OF}


def record_dict(record: Record) -> dict[str, Any]:
    """A record's fields by name (mappings as plain dicts), as the recording's schema names them."""
    cls = type(record)
    return _with_fields({}, cls, GETTERS[cls](record))


def _with_fields(out: dict[str, Any], cls: type, values: Any) -> dict[str, Any]:
    """``out`` with the fields of a ``cls`` record whose values are ``values`` (in field order), mappings as
    plain dicts."""
    out.update(zip(FIELDS_OF[cls], values, strict=True))
    for name in _MAPPING_FIELDS[cls]:
        value = out[name]
        if isinstance(value, Mapping):
            out[name] = dict(value)
    return out


class SnapshotError(ValueError):
    """A bad query parameter (answered with 400)."""


def _int_param(query: Mapping[str, list[str]], name: str, default: int | None, low: int,
               high: int | None = None) -> int | None:
    values = query.get(name)
    if not values:
        return default
    try:
        value = int(values[-1])
    except ValueError:
        raise SnapshotError(f"?{name}={values[-1]!r} is not an integer") from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"from {low} to {high}"
        raise SnapshotError(f"?{name}={value} is out of range (expected {bound})")
    return value


def build_snapshot(identity: Identity, view: View, query: Mapping[str, list[str]]) -> dict[str, Any]:
    """The /api/v1/snapshot document. ``query``: parsed ``steps``, ``since``, ``limit`` (SnapshotError if bad)."""
    n_steps = _int_param(query, "steps", DEFAULT_STEPS, 0, 100_000) or 0
    since = _int_param(query, "since", None, 0)
    limit = _int_param(query, "limit", DEFAULT_EVENT_LIMIT, 1, MAX_EVENT_LIMIT) or DEFAULT_EVENT_LIMIT
    world = view.run_info.world_size if view.run_info is not None else identity.world_size
    snapshot: dict[str, Any] = {
        "schema": SCHEMA, "t_ns": view.t_ns, "rank": identity.rank, "local_rank": identity.local_rank,
        "world_size": world, "host": identity.host, "pid": identity.pid, "job": identity.job,
        "start_ns": identity.start_ns, "cursor": view.cursor,
        "run_info": record_dict(view.run_info) if view.run_info is not None else None,
        "steps": [record_dict(s) for s in view.steps[len(view.steps) - n_steps:]] if n_steps else [],
        "memory": record_dict(view.memory.with_walk(view.categories)) if view.memory is not None else None,
        "device": record_dict(view.device) if view.device is not None else None,
        "stats": record_dict(view.stats),
        "collectives": [{"op": r.op, "meaning": r.meaning, "calls": r.calls, "bytes": r.bytes,
                         "seconds": r.seconds, "blocked_s": r.blocked_s, "busbw_bytes_s": view.busbw.get(r.op)}
                        for r in view.collectives],
        "oom": view.oom.to_dict() if view.oom is not None else None,
        "findings": [f.to_dict() for f in view.findings],
        "notices": [record_dict(n) for n in view.notices],
        "progress": view.progress.to_dict() if view.progress is not None else None,
    }
    if since is not None:
        events, lost = events_since(view.recent, view.cursor, since, limit)
        snapshot["events"] = events
        if lost:
            snapshot["events_lost"] = True
    return snapshot


def events_since(recent: tuple[Any, ...], cursor: int, since: int, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The oldest ``limit`` records with cursor > since (``recent``'s newest numbered ``cursor``), and whether
    some after ``since`` are gone."""
    first = cursor - len(recent) + 1
    start = max(0, since + 1 - first)
    # Lost: the first kept record is not the one right after `since` (the deque has moved past it).
    lost = bool(recent) and first > since + 1
    events = [_event(first + index, entry) for index, entry in enumerate(recent[start:start + limit], start)]
    return events, lost


def _event(cursor: int, entry: Any) -> dict[str, Any]:
    """An event of the snapshot: the record's cursor, kind and fields (record_dict's). A record the recorder
    left unmade is read from its values (in field order) without making it, at a fraction of the cost,
    for up to 2,000 of them a snapshot."""
    if type(entry) is tuple:
        cls = unmade_type(entry)
        values: Any = entry
    else:
        cls = type(entry)
        values = GETTERS[cls](entry)
    return _with_fields({"cursor": cursor, "kind": KIND_OF[cls]}, cls, values)
