"""The live view the TUI and the dashboard draw: FleetView of RankViews, and the agent's snapshot
JSON (schema zeromon.snapshot/1) turned into it, with zeromon's model types where there are any.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.hang import HangVerdict, diagnose
from zeromon.analysis.oom import OomForecast
from zeromon.model.classes import frozen
from zeromon.model.codec import FIELDS_OF
from zeromon.model.events import (
    AgentStats,
    CollectiveEvent,
    DeviceSample,
    MemorySample,
    Notice,
    PhaseSpan,
    RunInfo,
    StepSummary,
)
from zeromon.model.progress import ProgressFormatError, RankProgress, progress_from_dict

SNAPSHOT_SCHEMA = "zeromon.snapshot/1"


# --- the view --------------------------------------------------------------------------------------

@frozen
class CollectiveTotal:
    """Totals of one (op, ZeRO meaning) since the agent started."""

    op: str
    meaning: str
    calls: int
    bytes: int
    seconds: float  # sum of measured durations
    blocked_s: float
    busbw_bytes_s: float | None  # median of the recent bus bandwidth samples (nccl-tests' busbw)


@frozen
class RankView:
    """One rank as the client last saw it. Its data stays when the rank stops answering."""

    rank: int | None  # None: a target that never answered
    target: str  # host:port
    alive: bool  # the last poll got an answer
    stale_s: float | None  # seconds since the last answer; None: never answered
    error: str | None  # why the last poll failed
    run_info: RunInfo | None = None
    steps: tuple[StepSummary, ...] = ()  # newest last
    memory: MemorySample | None = None
    device: DeviceSample | None = None
    stats: AgentStats | None = None
    collectives: tuple[CollectiveTotal, ...] = ()
    oom: OomForecast | None = None
    findings: tuple[Finding, ...] = ()
    phases: tuple[PhaseSpan, ...] = ()  # recent phase spans, oldest first
    # recent collectives, oldest first: only from a LiveSource asked to keep them (the dashboard's
    # step timeline); the TUI shows totals
    recent_collectives: tuple[CollectiveEvent, ...] = ()
    notices: tuple[Notice, ...] = ()
    host: str | None = None
    pid: int | None = None
    job: str | None = None
    local_rank: int | None = None
    world_size: int | None = None
    t_ns: int | None = None  # the agent's clock when it answered
    start_ns: int | None = None  # when the rank's agent started
    ended: bool = False  # not answering because it ended (its process exited, or its recording has its end;
    # seen on its host): its data is its last
    # How it died, when it ended and its recording says so: "rank 1 died at step 276 (no end record; ...)"
    # (zeromon.analysis.rank_ends); None while alive, after a clean end, or where not known.
    died: str | None = None
    # What its recording could not write, when it ended and its end record says so: "rank 1: the recording
    # is incomplete: 1,234 records (2.1 MiB) could not be written (...)"; None where whole or not known.
    incomplete: str | None = None
    progress: RankProgress | None = None  # where it is in its collectives (the snapshot's; zeromon.model.progress)

    @property
    def last_step(self) -> StepSummary | None:
        return self.steps[-1] if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["oom"] = self.oom.to_dict() if self.oom is not None else None
        out["progress"] = self.progress.to_dict() if self.progress is not None else None
        out["findings"] = [f.to_dict() for f in self.findings]
        for name in ("run_info", "memory", "device", "stats"):
            value = out[name]
            out[name] = _plain(value) if value is not None else None
        for name in ("steps", "collectives", "phases", "notices", "recent_collectives"):
            out[name] = [_plain(v) for v in out[name]]
        return out


@frozen
class FleetTotals:
    """The whole job's numbers, read from Prometheus's recording rules (dashboard/grafana/zeromon-rules.yml)
    when FleetView.ranks holds only the worst ranks those rules name. None: the rule had no value."""

    ranks: int  # ranks whose agents Prometheus scrapes
    answering: int | None  # the run's scrape targets up, of ...
    targets: int | None  # ... all its targets (None: a scrape config without zeromon_run)
    step_min: int | None  # the last step (0-based) of the furthest-behind rank
    step_max: int | None
    worst_risk: Severity | None
    risk_ranks: Mapping[str, int]  # "ok", "warn", "critical" -> ranks at that level
    headroom_min_bytes: int | None
    headroom_min_ratio: float | None  # of its rank's capacity
    exposed_share: Mapping[str, float]  # "0.5", "0.9", "0.99", "max" -> exposed communication / step time
    overlap_min: float | None
    step_s: Mapping[str, float]  # "min", "0.5", "max" -> last step's duration across ranks
    step_skew: float | None  # max / median - 1
    events_dropped: int | None
    worst: Mapping[str, tuple[int, ...]]  # "oom_risk", "headroom", "exposed", "step_time" -> ranks, worst first

    @property
    def ranks_expected(self) -> int:
        """The ranks with series and those whose target is down (Prometheus drops a down target's series)."""
        down = self.targets - self.answering if self.targets is not None and self.answering is not None else 0
        return self.ranks + max(0, down)

    def to_dict(self) -> dict[str, Any]:
        out = _plain(self)
        out["ranks_expected"] = self.ranks_expected
        out["worst_risk"] = self.worst_risk.value if self.worst_risk is not None else None
        out["worst"] = {k: list(v) for k, v in self.worst.items()}
        return out


@frozen
class FleetView:
    """Every rank of the watched run at one moment, ordered by rank."""

    t_ns: int
    source: str  # what is watched: "run <dir>", "targets ...", "prometheus <url>"
    ranks: tuple[RankView, ...]
    looked_at: tuple[str, ...]  # where agents were looked for (for a "no agent found" message)
    error: str | None = None  # about the source as a whole: no agent found, Prometheus unreachable
    # The job's numbers from Prometheus's recording rules; set only when ``ranks`` are its worst few.
    totals: FleetTotals | None = None
    hang: HangVerdict | None = None  # who holds the job up, where (with_hang); None where no rank reports progress

    @property
    def alive(self) -> int:
        return sum(1 for r in self.ranks if r.alive)

    def to_dict(self) -> dict[str, Any]:
        return {"t_ns": self.t_ns, "source": self.source, "looked_at": list(self.looked_at), "error": self.error,
                "ranks": [r.to_dict() for r in self.ranks],
                "totals": self.totals.to_dict() if self.totals is not None else None,
                "hang": self.hang.to_dict() if self.hang is not None else None}


def with_hang(view: FleetView) -> FleetView:
    """``view`` with its hang verdict (zeromon.analysis.hang.diagnose) over its ranks' progress: a rank not
    answering counts as dead when its process is known gone, as not reporting otherwise."""
    reports: dict[int, RankProgress | None] = {}
    dead: dict[int, str] = {}
    for r in view.ranks:
        if r.rank is None:
            continue
        reports[r.rank] = r.progress
        if r.died or r.ended:
            dead[r.rank] = r.died or "its process has ended"
        elif not r.alive and r.progress is not None:
            reports[r.rank] = None  # its last report is stale: where it is now is not known
    if not any(reports.values()):
        return view
    return dataclasses.replace(view, hang=diagnose(reports, dead))


def _plain(record: Any) -> dict[str, Any]:
    return {name: (dict(v) if isinstance(v := getattr(record, name), Mapping) else v)
            for name in (f.name for f in dataclasses.fields(record))}


# --- the snapshot JSON into model types ----------------------------------------------------------------

_NAMES: dict[type, tuple[str, ...]] = {**FIELDS_OF, CollectiveTotal: tuple(f.name for f in dataclasses.fields(CollectiveTotal))}


def record_from_dict(cls: type, data: Any) -> Any:
    """A dataclass from a JSON object: known keys only (newer agents may add some); None if it lacks a required one."""
    if not isinstance(data, dict):
        return None
    try:
        return cls(**{k: data[k] for k in _NAMES[cls] if k in data})
    except TypeError:
        return None


def _severity(value: Any) -> Severity:
    try:
        return Severity(value)
    except ValueError:
        return Severity.INFO


def finding_from_dict(data: Any) -> Finding | None:
    """Finding.to_dict() read back."""
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return None
    metrics = data.get("metrics")
    return Finding(kind=data["kind"], severity=_severity(data.get("severity")), title=str(data.get("title", "")),
                   rank=data.get("rank"), step=data.get("step"), evidence=tuple(data.get("evidence") or ()),
                   remedies=tuple(data.get("remedies") or ()),
                   metrics=dict(metrics) if isinstance(metrics, dict) else {})


def forecast_from_dict(data: Any) -> OomForecast | None:
    """OomForecast.to_dict() read back."""
    if not isinstance(data, dict):
        return None
    keys = ("capacity_bytes", "current_bytes", "peak_bytes", "headroom_bytes", "predicted_peak_bytes",
            "growth_bytes_per_step", "steps_to_capacity")
    findings = tuple(f for f in map(finding_from_dict, data.get("findings") or ()) if f is not None)
    return OomForecast(rank=int(data.get("rank", -1)), risk=_severity(data.get("risk", "ok")),
                       **{k: data.get(k) for k in keys}, findings=findings, device=str(data.get("device", "-")),
                       pending_optimizer_bytes=int(data.get("pending_optimizer_bytes") or 0))


def _steps(items: Any, previous: tuple[StepSummary, ...]) -> tuple[StepSummary, ...]:
    """The snapshot's steps, reusing the objects of steps already seen (most of them, every poll)."""
    if not isinstance(items, list):
        return ()
    # The answer holds the agent's newest steps: only as many of the newest known ones can match.
    known: dict[tuple[Any, Any], StepSummary] = {(s.step, s.end_ns): s for s in previous[-len(items):]}
    out = []
    for item in items:
        if isinstance(item, dict):
            step = known.get((item.get("step"), item.get("end_ns"))) or record_from_dict(StepSummary, item)
            if step is not None:
                out.append(step)
    return tuple(out)


def check_snapshot(doc: Any) -> dict[str, Any]:
    """The snapshot document, or ValueError saying why it is not one this client reads."""
    if not isinstance(doc, dict):
        raise ValueError("the answer is not a JSON object")
    schema = doc.get("schema")
    if not isinstance(schema, str) or schema.split("/")[0] != SNAPSHOT_SCHEMA.split("/")[0]:
        raise ValueError(f"not a zeromon snapshot (schema {schema!r})")
    if schema.split("/")[-1].split(".")[0] != SNAPSHOT_SCHEMA.split("/")[-1]:
        raise ValueError(f"snapshot schema {schema} is not supported; this zeromon reads {SNAPSHOT_SCHEMA}")
    return doc


def _collectives(items: Any) -> tuple[CollectiveTotal, ...]:
    return tuple(c for c in (record_from_dict(CollectiveTotal, d) for d in items or ()) if c is not None)


def _findings(items: Any) -> tuple[Finding, ...]:
    return tuple(f for f in map(finding_from_dict, items or ()) if f is not None)


def _progress(raw: Any) -> RankProgress | None:
    try:
        return progress_from_dict(raw) if raw is not None else None
    except ProgressFormatError:
        return None


def _notices(items: Any) -> tuple[Notice, ...]:
    return tuple(n for n in (record_from_dict(Notice, d) for d in items or ()) if n is not None)


# Snapshot keys and how each becomes model objects.
_PARTS: dict[str, Callable[[Any], Any]] = {
    "run_info": lambda raw: record_from_dict(RunInfo, raw), "memory": lambda raw: record_from_dict(MemorySample, raw),
    "device": lambda raw: record_from_dict(DeviceSample, raw), "stats": lambda raw: record_from_dict(AgentStats, raw),
    "collectives": _collectives, "oom": forecast_from_dict, "findings": _findings, "notices": _notices,
    "progress": _progress,
}


def rank_view_from_snapshot(doc: dict[str, Any], target: str, previous: RankView | None = None,
                            phases: tuple[PhaseSpan, ...] = (),
                            parsed: dict[str, tuple[Any, Any]] | None = None) -> RankView:
    """An alive RankView from a checked snapshot document.

    ``previous``: the rank's last view, whose steps are reused. ``parsed``: the rank's (JSON, object)
    of each part last time, updated here: a part whose JSON is unchanged (run info, notices, the
    forecast between steps) keeps its object; comparing the parsed JSON costs less than building it.
    """
    old_steps = previous.steps if previous is not None else ()
    cache = parsed if parsed is not None else {}
    parts: dict[str, Any] = {}
    for name, build in _PARTS.items():
        raw = doc.get(name)
        hit = cache.get(name)
        if hit is None or hit[0] != raw:
            hit = cache[name] = (raw, build(raw))
        parts[name] = hit[1]
    rank = doc.get("rank")

    def opt_int(name: str) -> int | None:
        value = doc.get(name)
        return value if isinstance(value, int) else None

    return RankView(
        rank=rank if isinstance(rank, int) else None, target=target, alive=True, stale_s=0.0, error=None,
        steps=_steps(doc.get("steps"), old_steps), phases=phases, **parts,
        host=doc.get("host") if isinstance(doc.get("host"), str) else None, pid=opt_int("pid"),
        job=doc.get("job") if isinstance(doc.get("job"), str) else None, local_rank=opt_int("local_rank"),
        world_size=opt_int("world_size"), t_ns=opt_int("t_ns"), start_ns=opt_int("start_ns"),
    )
