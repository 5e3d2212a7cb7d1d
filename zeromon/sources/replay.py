"""A recorded run played back as if it were live: the FleetViews that LiveSource gives, on a virtual clock.

``ReplaySource(run_dir, speed=1.0, loop=False)`` reads the run folder's (or folders', one per node) rank files once, one at a
time, and keeps per rank each kind of record sorted by the time the agent would have published it
(a step at its end, a collective at its completion, a memory sample when taken), stored as columns
(ColumnTable), with the collectives' running totals as prefix sums. A view at virtual time T is then a
few bisections per rank, never a rescan. As columns, a run takes less memory than its files take on
disk.

The clock starts at the run's first record when ``start()`` is called and runs at ``speed`` × wall
time; ``paused`` stops it, ``seek()`` moves it. A background thread (never the caller's) rebuilds
the view every ``interval_s`` and, at most every ANALYSIS_EVERY_S of wall time per rank, the OOM
forecast and the findings from the data so far, as the agent's endpoint does (zeromon.analysis.oom
on the last MEMORY_HISTORY samples, poor-overlap findings on the last steps). ``latest()`` only
hands over the newest view.

Each rank's view carries its newest progress report written at or before T (a stalled one's time without
progress runs on to T: the rank says when it goes on), and the FleetView the hang verdict over them
(zeromon.analysis.hang.recorded_verdict; a rank whose recording ended without an end record is dead once T is
past its end).

A rank is alive while the replay runs through its recording; a rank whose recording ends before
the others turns stale there (``alive=False``, ``stale_s`` growing), and when the replay finishes
every rank is stale: the job has ended. With ``loop=True`` it starts over instead. A RankView's
``t_ns`` is the virtual time its data last changed (a stale rank's: its last record), so that an
unchanged rank keeps its view object from one refresh to the next.
"""

from __future__ import annotations

import bisect
import math
import statistics
import threading
import time
from array import array
from collections.abc import Sequence
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from zeromon.analysis.bandwidth import event_bandwidth
from zeromon.analysis.comm_advice import overlap_findings_of_summaries
from zeromon.analysis.findings import Finding
from zeromon.analysis.hang import HangVerdict, recorded_verdict
from zeromon.analysis.oom import OomForecast, forecast
from zeromon.analysis.rank_ends import CUT_OFF, RankEnd, died_lines, rank_ends
from zeromon.analysis.recording_summary import corrupt_lines_note
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen, mutable
from zeromon.model.codec import (
    Recording,
    RunDirs,
    check_one_run,
    rank_file_paths,
    rank_files,
    run_folders,
    run_name,
)
from zeromon.model.columns import ColumnTable
from zeromon.model.events import (
    AgentStats,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    PhaseSpan,
    RunInfo,
    StepSummary,
    Timing,
)
from zeromon.model.numbers import REPLAY_SPEED, SOURCE_SECONDS, checked
from zeromon.model.progress import STALLED, ProgressFormatError, RankProgress, progress_from_dict
from zeromon.model.rank_pool import OnProgress, map_rank_files, read_rank_file
from zeromon.model.run_end import read_file_end
from zeromon.sources.fleet import CollectiveTotal, FleetView, RankView

# What the live agent keeps, so that a replayed rank shows what its endpoint would have served.
STEPS_SHOWN = 64  # LiveSource's STEPS_ASKED
STEP_HISTORY = 512  # the agent's LiveViews.recent_steps
MEMORY_HISTORY = 2048  # the agent's LiveViews.memory_history: the OOM forecast's input
BUSBW_WINDOW = 256  # recorder's recent bus-bandwidth samples per op
PHASE_STEPS = 8  # phase spans of the last steps (the TUI's timeline draws 8)
PHASES_MAX = 256  # and at most this many (before the first step: setup)
ANALYSIS_EVERY_S = 1.0  # wall seconds between two OOM forecasts of a rank, like the endpoint's FORECAST_TTL_S
# CPU one tick may spend on forecasts: a rank's costs milliseconds (half of it making the samples), so
# many ranks' are spread over the ticks, oldest first, and the UI thread never waits long for the GIL (at
# most 8% of a core at 4 ticks a second).
ANALYSIS_BUDGET_S = 0.02


@mutable
class _Totals:
    """One (op, meaning)'s running totals, one entry per collective in completion order."""

    op: str
    meaning: str
    t_ns: array[int]
    bytes: array[int]  # cumulative
    seconds: array[float]  # cumulative measured duration
    blocked_s: array[float]  # cumulative


@mutable
class _Analysis:
    key: tuple[int, int, int]  # (memory, steps, ooms) indices it was computed at
    wall: float  # time.monotonic() when computed
    oom: OomForecast | None
    findings: tuple[Finding, ...]


@mutable
class _Track:
    """One rank's recording, indexed by time."""

    rank: int
    target: str
    run_info: RunInfo | None
    stats: AgentStats | None
    first_ns: int
    last_ns: int  # -1: no records
    steps: ColumnTable[StepSummary]  # by end
    memory: ColumnTable[MemorySample]
    last_walk: array[int]  # per memory sample, the index of the last one at or before it with a walk; -1: none
    device: ColumnTable[DeviceSample]
    phases: ColumnTable[PhaseSpan]  # by end
    notices: ColumnTable[Notice]
    ooms: ColumnTable[OomEvent]
    totals: list[_Totals]
    busbw_t: dict[str, array[int]]
    busbw: dict[str, array[float]]
    # Its progress reports (written when it stalled, went on, or was stopped by a signal), by time.
    progress_t: array[int] = field(default_factory=lambda: array("q"))
    progress: tuple[RankProgress, ...] = ()
    died: str | None = None  # how the rank died, from its recording's end (rank_ends.died_line)
    cut_off: bool = False  # its recording ended without an end record, its process gone: killed
    end: RankEnd | None = None  # how it ended (died_lines places a dead rank among the others)
    incomplete: str | None = None  # what its recording could not write (rank_ends.incomplete_line)
    skipped: str | None = None  # the lines its reader skipped, as `summary` says it (corrupt_lines_note)
    analysis: _Analysis | None = None
    # The last built pieces, reused while their indices stay the same.
    steps_at: tuple[int, tuple[StepSummary, ...]] = (0, ())
    phases_at: tuple[int, tuple[PhaseSpan, ...]] = (0, ())
    notices_at: tuple[int, tuple[Notice, ...]] = (0, ())
    memory_at: tuple[int, MemorySample | None] = (0, None)
    device_at: tuple[int, DeviceSample | None] = (0, None)
    collectives_at: tuple[tuple[int, ...], tuple[CollectiveTotal, ...]] = ((), ())
    view_at: tuple[tuple[object, ...], RankView] | None = None  # the last alive view and what it was made of
    medians: dict[tuple[str, int], float] = field(default_factory=dict)


def _collective_totals(rec: Recording) -> tuple[list[_Totals], dict[str, array[int]], dict[str, array[float]]]:
    """The agent's running totals (recorder._count) as prefix sums: every call counts its bytes and
    blocked time, one with a known completion its duration, a measured one its bus bandwidth."""
    per_key: dict[tuple[str, str], list[tuple[int, int, float, float]]] = {}
    per_op: dict[str, list[tuple[int, float]]] = {}
    for event in rec.collectives:
        t = event.complete_ns if event.complete_ns is not None else event.issue_ns
        duration = event.duration_s if event.timing != Timing.UNKNOWN.value else None
        per_key.setdefault((event.op, event.meaning), []).append(
            (t, max(event.bytes_in, event.bytes_out), duration or 0.0, event.thread_blocked_s))
        bandwidth = event_bandwidth(event) if duration else None
        if bandwidth is not None:
            per_op.setdefault(event.op, []).append((t, bandwidth[1]))
    totals = []
    for (op, meaning), rows in sorted(per_key.items()):
        rows.sort(key=lambda row: row[0])
        nbytes, seconds, blocked = 0, 0.0, 0.0
        cum_bytes, cum_seconds, cum_blocked = array("q"), array("d"), array("d")
        for _, b, s, w in rows:
            nbytes, seconds, blocked = nbytes + b, seconds + s, blocked + w
            cum_bytes.append(nbytes)
            cum_seconds.append(seconds)
            cum_blocked.append(blocked)
        totals.append(_Totals(op, meaning, array("q", (row[0] for row in rows)), cum_bytes, cum_seconds, cum_blocked))
    busbw_t, busbw = {}, {}
    for op, samples in per_op.items():
        samples.sort(key=lambda s: s[0])
        busbw_t[op] = array("q", (s[0] for s in samples))
        busbw[op] = array("d", (s[1] for s in samples))
    return totals, busbw_t, busbw


def _track(rec: Recording) -> _Track:
    steps = ColumnTable(StepSummary, rec.steps, "end_ns")
    memory = ColumnTable(MemorySample, rec.memory, "t_ns")
    device = ColumnTable(DeviceSample, rec.device, "t_ns")
    phases = ColumnTable(PhaseSpan, rec.phases, "end_ns")
    notices = ColumnTable(Notice, rec.notices, "t_ns")
    ooms = ColumnTable(OomEvent, rec.ooms, "t_ns")
    totals, busbw_t, busbw = _collective_totals(rec)
    end = _ended(rec)
    died, incomplete = (end.lines()[0] if end.died else None, end.incomplete_line()) if end else (None, None)
    progress = _progress_reports(rec)
    times = [t for table in (steps, memory, device, phases, notices, ooms) if table
             for t in (table.t_ns[0], table.t_ns[-1])]
    times += [report.t_ns for report in progress[-1:]]
    times += [t for totals_ in totals for t in (totals_.t_ns[0], totals_.t_ns[-1])]
    if rec.phases:  # a phase is published at its end, but the rank was there from its start
        times.append(min(p.start_ns for p in rec.phases))
    if rec.stats is not None:
        times.append(rec.stats.t_ns)
    return _Track(
        rank=rec.rank, target=rec.path.name, run_info=rec.run_info, stats=rec.stats,
        first_ns=min(times) if times else 0, last_ns=max(times) if times else -1, steps=steps, memory=memory,
        last_walk=_last_walks(rec.memory), device=device, phases=phases, notices=notices, ooms=ooms, totals=totals,
        busbw_t=busbw_t, busbw=busbw, progress_t=array("q", (r.t_ns for r in progress)), progress=progress,
        died=died, incomplete=incomplete, cut_off=end is not None and end.state == CUT_OFF, end=end,
        skipped=corrupt_lines_note(str(rec.path), rec.corrupt_lines, errors=rec.line_errors)
        if rec.corrupt_lines else None)


def _ended(rec: Recording) -> RankEnd | None:
    """How the rank ended, from the end of its file (its step from its recording); None where it cannot be read."""
    try:
        file_end = read_file_end(rec.path)
    except (OSError, ValueError, ZeromonError):
        return None
    through = max((s.step for s in rec.steps), default=None)
    return rank_ends([file_end], {file_end.rank: through})[0]


def _progress_reports(rec: Recording) -> tuple[RankProgress, ...]:
    """The rank's readable progress reports, oldest first."""
    out = []
    for record in rec.progress:
        try:
            out.append(progress_from_dict(record.report))
        except ProgressFormatError:
            continue
    return tuple(sorted(out, key=lambda r: r.t_ns))


def _progress_at(track: _Track, t: int) -> tuple[int, RankProgress | None]:
    """(how many reports ``t`` has seen, the newest of them). A stall lasts until the rank reports that it went
    on: a stalled report's no-progress time runs on to ``t`` (at most to the rank's last record)."""
    i = bisect.bisect_right(track.progress_t, t)
    if not i:
        return 0, None
    report = track.progress[i - 1]
    if report.reason != STALLED:
        return i, report
    return i, replace(report, t_ns=max(report.t_ns, min(t, track.last_ns)))


def _last_walks(samples: Sequence[MemorySample]) -> array[int]:
    out, last = array("q"), -1
    for i, sample in enumerate(sorted(samples, key=lambda m: m.t_ns)):  # ColumnTable's order
        if sample.walked:
            last = i
        out.append(last)
    return out


def _with_last_walk(track: _Track, i: int) -> MemorySample:
    """Sample i as the live endpoint would serve it (MemorySample.with_walk)."""
    walk = track.last_walk[i]
    sample = track.memory.get(i)
    return sample.with_walk(track.memory.get(walk).categories) if walk >= 0 and walk != i else sample


def load_tracks(run_dir: RunDirs, progress: OnProgress | None = None, workers: int | None = 1) -> list[_Track]:
    """Every rank file of the run's folder (or folders), indexed; one rank's records in memory at a time
    in each of ``workers`` processes (map_rank_files': None, one per CPU; 1, the default, all in this
    process: a caller with threads of its own must not fork). ``progress``: told as each rank is read."""
    loaded = map_rank_files(replayed_files(run_dir), _load_track, workers, progress)
    check_one_run([identity for _, identity in loaded])  # and one framework
    tracks = sorted((track for track, _ in loaded), key=lambda t: t.rank)
    _check_some_records(run_dir, [t.last_ns for t in tracks])
    said = died_lines(t.end for t in tracks if t.end is not None)  # the first to die says so, as `report` does
    for track in tracks:
        track.died = said.get(track.rank, track.died)
    return tracks


def replayed_files(run_dir: RunDirs) -> list[Path]:
    """The rank files of the run's folders (one run's, from their headers); a folder that is missing or holds
    none: a ZeromonError naming it."""
    for folder in run_folders(run_dir):
        if not folder.is_dir():
            raise ZeromonError(f"replay {folder}: no such run folder",
                               hint="a run folder is the --out of `zeromon run` (it holds rank-<r>.zmr or .jsonl files)")
        if not rank_file_paths(folder):
            raise ZeromonError(f"replay {folder}: no rank-<r>.zmr (or .jsonl) recordings in this folder",
                               hint="record a run with `zeromon run --out DIR -- CMD ...`")
    return rank_files(run_dir)


def _check_some_records(run_dir: RunDirs, last_ns: Sequence[int]) -> None:
    if all(last < 0 for last in last_ns):
        raise ZeromonError(f"replay {run_name(run_dir)}: the recordings hold no records to play back",
                           hint="the run ended before its first step; record it again")


def _load_track(path: Path) -> tuple[_Track, tuple[Path, dict[str, Any], RunInfo | None]]:
    """One rank file's track, and what check_one_run compares of it (a file that cannot be read: a ZeromonError
    naming it)."""
    recording = read_rank_file(path)
    return _track(recording), (recording.path, recording.header, recording.run_info)


def _analyse(track: _Track, key: tuple[int, int, int], wall: float) -> _Analysis:
    """The OOM forecast and the findings of the data up to the indices in ``key``."""
    mi, si, oi = key
    steps = track.steps.slice(si - STEP_HISTORY, si)
    oom = None
    if mi:
        recording = Recording(path=Path(f"<replay rank {track.rank}>"), header={"rank": track.rank},
                              memory=track.memory.slice(mi - MEMORY_HISTORY, mi), steps=steps,
                              run_info=track.run_info, ooms=track.ooms.slice(0, oi))
        oom = forecast(recording)
    findings = (oom.findings if oom is not None else ()) + overlap_findings_of_summaries(
        track.rank, steps, track.run_info)
    return _Analysis(key, wall, oom, findings)


@frozen
class RecordedTables:
    """One rank's records as a replay holds them, each table in the order the agent published it: steps and
    phase spans by their end, memory samples and OOMs by their time (ColumnTable.upto(t): how many a
    position has seen)."""

    rank: int
    steps: ColumnTable[StepSummary]
    memory: ColumnTable[MemorySample]
    phases: ColumnTable[PhaseSpan]
    ooms: ColumnTable[OomEvent]


class ReplaySource:
    """A run's folder (or folders, one per node) played back as FleetViews, with LiveSource's interface: start(), stop(), latest().

    ``speed``: virtual seconds per wall second (settable while playing); ``loop``: start over at the
    end; ``progress`` and ``workers``: load_tracks'. Bad arguments and unreadable recordings raise
    ZeromonError here; nothing later does.
    """

    def __init__(self, run_dir: RunDirs, speed: float = 1.0, loop: bool = False,
                 interval_s: float = 0.25, progress: OnProgress | None = None, workers: int | None = 1) -> None:
        self.run_dir = run_dir
        self.folders = run_folders(run_dir)
        self._speed = _checked_speed(speed)
        self.interval_s = checked("replay interval", SOURCE_SECONDS, interval_s)
        self.loop = loop
        self._tracks = load_tracks(self.run_dir, progress, workers)
        present = [t for t in self._tracks if t.last_ns >= 0]
        self.start_ns = min(t.first_ns for t in present)
        self.end_ns = max(t.last_ns for t in present)
        self._lock = threading.Lock()  # the clock and the view
        self._build_lock = threading.Lock()  # the tracks' caches
        self._position = 0.0  # virtual ns since start_ns
        self._wall_at = time.monotonic()
        self._running = False  # the clock runs between start() and stop()
        self._paused = False
        self._built_at: float | None = None  # the position of the newest view
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._view = self._build(0, budget_s=0.0)

    # -- the clock

    @property
    def looked_at(self) -> tuple[str, ...]:
        return tuple(map(str, self.folders))

    @property
    def source(self) -> str:
        return f"replay {run_name(self.run_dir)}"

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def position_ns(self) -> int:
        """Virtual nanoseconds since the run's first record."""
        with self._lock:
            self._advance()
            return int(self._position)

    @property
    def finished(self) -> bool:
        return not self.loop and self.position_ns >= self.duration_ns

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        value = _checked_speed(value)
        with self._lock:
            self._advance()  # the time played so far at the old speed
            self._speed = value
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._paused

    @paused.setter
    def paused(self, value: bool) -> None:
        with self._lock:
            self._advance()
            self._paused = bool(value)
        self._wake.set()

    def seek(self, position_ns: int) -> None:
        """Move the clock to ``position_ns`` after the run's first record (clamped to the run)."""
        with self._lock:
            self._advance()
            self._position = float(min(max(0, position_ns), self.duration_ns))
        if self._thread is None:
            self._refresh()
        self._wake.set()

    def _advance(self) -> None:
        """Move the clock on by the wall time since the last reading. Under self._lock."""
        now = time.monotonic()
        if self._running and not self._paused:
            self._position += (now - self._wall_at) * self._speed * 1e9
            duration = self.duration_ns
            if self._position >= duration:
                self._position = self._position % duration if self.loop and duration > 0 else float(duration)
        self._wall_at = now

    # -- LiveSource's interface

    def start(self) -> ReplaySource:
        """Play from the current position, in a background thread, until stop()."""
        if self._thread is None:
            with self._lock:
                self._advance()
                self._running = True
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="zeromon-replay", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._advance()
            self._running = False
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ReplaySource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def latest(self) -> FleetView:
        """The view at the clock's position when the background thread last looked (every interval_s)."""
        with self._lock:
            return self._view

    def view_at(self, position_ns: int) -> FleetView:
        """The view at a position, built now on the caller's thread with every rank's analysis
        brought up to date (tests and one-shot use; the clock does not move)."""
        position = min(max(0, position_ns), self.duration_ns)
        return self._build(position, budget_s=math.inf, finished=not self.loop and position >= self.duration_ns)

    def tables(self) -> list[RecordedTables]:
        """Every rank's records as this replay holds them, by rank (read-only: shared with its thread)."""
        return [RecordedTables(t.rank, t.steps, t.memory, t.phases, t.ooms) for t in self._tracks]

    # -- the background thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self._refresh()
            except Exception as exc:  # a bug here must not stop the clock; it shows in the view
                with self._lock:
                    self._view = FleetView(self._view.t_ns, self.source, self._view.ranks, self.looked_at,
                                           error=f"internal error in the replay: {type(exc).__name__}: {exc}")

    @property
    def skipped(self) -> str | None:
        """The recording's lines its reader skipped, said with the view (the TUI's alerts, the dashboard's
        banner, `live`'s note), as `zeromon summary` says them: a replay must not hide them."""
        notes = [t.skipped for t in self._tracks if t.skipped]
        return "; ".join(notes) if notes else None

    def _refresh(self) -> None:
        with self._lock:
            self._advance()
            position = self._position
        finished = not self.loop and position >= self.duration_ns
        # Paused or at the end, the data stops changing: its analysis is brought up to date at once.
        view = self._build(int(position), budget_s=ANALYSIS_BUDGET_S, finished=finished,
                           settled=finished or self._paused)
        with self._lock:
            self._view = view

    def _build(self, position_ns: int, budget_s: float, finished: bool = False, settled: bool = False) -> FleetView:
        t = self.start_ns + position_ns
        with self._build_lock:
            if self._built_at is not None and position_ns < self._built_at:
                for track in self._tracks:  # back in time (a loop, a seek): the analyses are of the future
                    track.analysis = None
            self._built_at = position_ns
            self._analyse_due(t, budget_s, settled or budget_s == math.inf)
            ranks = tuple(_rank_view(track, t, finished, self.start_ns) for track in self._tracks)
        return FleetView(t_ns=t, source=self.source, ranks=ranks, looked_at=self.looked_at, error=self.skipped,
                         hang=self._hang(ranks, t, finished))

    def _hang(self, ranks: Sequence[RankView], t: int, finished: bool) -> HangVerdict | None:
        """The verdict at ``t``: over each rank's newest progress report, a rank cut off dead once its recording
        has ended."""
        dead = [track.rank for track in self._tracks if track.cut_off and (finished or t > track.last_ns)]
        return recorded_verdict({r.rank: r.progress for r in ranks if r.rank is not None}, dead)

    def _analyse_due(self, t: int, budget_s: float, at_once: bool) -> None:
        """Forecasts of the ranks whose data moved on, each at most every ANALYSIS_EVERY_S (without that
        limit when ``at_once``), oldest first, within ``budget_s`` of CPU."""
        now = time.monotonic()
        due = []
        for track in self._tracks:
            key = (track.memory.upto(t), track.steps.upto(t), track.ooms.upto(t))
            done = track.analysis
            # The first forecast comes with the first memory sample; later ones at most every ANALYSIS_EVERY_S.
            if done is None or (done.key != key and (at_once or now - done.wall >= ANALYSIS_EVERY_S
                                                     or (done.oom is None and key[0] > 0))):
                due.append((done.wall if done is not None else -math.inf, track.rank, track, key))
        due.sort(key=lambda item: (item[0], item[1]))
        deadline = time.perf_counter() + budget_s
        if budget_s <= 0:
            return
        for i, (_, _, track, key) in enumerate(due):
            if i:
                if time.perf_counter() >= deadline:
                    break  # the first always runs: a budget smaller than one forecast still makes progress
                time.sleep(0)  # let a waiting UI thread have the GIL between two forecasts
            track.analysis = _analyse(track, key, now)


def _rank_view(track: _Track, t: int, finished: bool, start_ns: int) -> RankView:
    """The rank at ``t`` (Unix ns); ``start_ns``: the run's first record; ``finished``: the replay is at its end."""
    info = track.run_info
    if track.last_ns < 0 or t < track.first_ns:  # as LiveSource shows a rank that never answered
        return RankView(rank=track.rank, target=track.target, alive=False, stale_s=None,
                        error="the recording holds no records" if track.last_ns < 0 else "not started yet",
                        run_info=info, **_identity(info))
    si = track.steps.upto(t)
    if track.steps_at[0] != si:
        track.steps_at = (si, track.steps.window(si - STEPS_SHOWN, si))
    pi = track.phases.upto(t)
    if track.phases_at[0] != pi:
        # From the start of the PHASE_STEPS-th last step: spans are ordered by their end.
        first = (bisect.bisect_right(track.phases.t_ns, track.steps.value(si - PHASE_STEPS, "start_ns"))
                 if si >= PHASE_STEPS else 0)
        track.phases_at = (pi, track.phases.window(max(first, pi - PHASES_MAX), pi))
    ni = track.notices.upto(t)
    if track.notices_at[0] != ni:
        track.notices_at = (ni, track.notices.window(0, ni))
    mi = track.memory.upto(t)
    if track.memory_at[0] != mi:
        track.memory_at = (mi, _with_last_walk(track, mi - 1) if mi else None)
    di = track.device.upto(t)
    if track.device_at[0] != di:
        track.device_at = (di, track.device.get(di - 1) if di else None)
    analysis = track.analysis
    collectives = _collectives(track, t)
    stale = finished or t > track.last_ns
    stats = track.stats if track.stats is not None and track.stats.t_ns <= t else None
    reports, progress = _progress_at(track, t)
    # An alive rank whose data has not moved on is the same view: no new objects for the
    # collector to promote (a view of 256 ranks lives for one tick).
    key = (si, pi, ni, mi, di, collectives, analysis, stats, reports, progress.t_ns if progress is not None else None)
    if not stale and track.view_at is not None and track.view_at[0] == key:
        return track.view_at[1]
    error = None
    if finished:
        error = "the recording ended"
    elif stale:
        error = f"its recording ends {(track.last_ns - start_ns) / 1e9:.1f} s into the run"
    if error is not None and track.died is not None:
        error = f"{track.died}; {error}"
    last = min(t, track.last_ns)  # a stale rank's last answer was its last record
    view = RankView(
        rank=track.rank, target=track.target, alive=not stale,
        stale_s=round((t - last) / 1e9, 3), error=error, run_info=info,
        steps=track.steps_at[1], memory=track.memory_at[1], device=track.device_at[1], stats=stats,
        collectives=collectives, oom=analysis.oom if analysis else None,
        findings=analysis.findings if analysis else (), phases=track.phases_at[1],
        notices=track.notices_at[1], t_ns=last, died=track.died if stale else None,
        ended=finished and track.died is None,  # the replay's end, of a rank that did not die: its final state
        incomplete=track.incomplete if stale else None, progress=progress, **_identity(info))
    track.view_at = None if stale else (key, view)
    return view


def _collectives(track: _Track, t: int) -> tuple[CollectiveTotal, ...]:
    indices = tuple(bisect.bisect_right(totals.t_ns, t) for totals in track.totals)
    if indices == track.collectives_at[0]:
        return track.collectives_at[1]
    out = []
    for totals, i in zip(track.totals, indices, strict=True):
        if i:
            out.append(CollectiveTotal(
                op=totals.op, meaning=totals.meaning, calls=i, bytes=totals.bytes[i - 1],
                seconds=totals.seconds[i - 1], blocked_s=totals.blocked_s[i - 1],
                busbw_bytes_s=_busbw(track, totals.op, t)))
    track.collectives_at = (indices, tuple(out))
    return track.collectives_at[1]


def _busbw(track: _Track, op: str, t: int) -> float | None:
    """Median of the op's last BUSBW_WINDOW measured bus bandwidths up to ``t`` (the agent's window)."""
    times = track.busbw_t.get(op)
    if times is None:
        return None
    i = bisect.bisect_right(times, t)
    if not i:
        return None
    median = track.medians.get((op, i))
    if median is None:
        if len(track.medians) > 64:
            track.medians.clear()
        median = track.medians[(op, i)] = statistics.median(track.busbw[op][max(0, i - BUSBW_WINDOW):i])
    return median


def _identity(info: RunInfo | None) -> dict[str, Any]:
    """RankView's host, pid, job, local_rank and world_size: in a recording, the run info's."""
    if info is None:
        return {}
    return {"host": info.host, "pid": info.pid, "job": info.job, "local_rank": info.local_rank,
            "world_size": info.world_size}


def _checked_speed(speed: object) -> float:
    return checked("replay speed", REPLAY_SPEED, speed)


@frozen
class FinalRank:
    """One rank's part of a recorded run's final view, made where the rank was read (final_rank): small
    enough to send back from a worker process, with no record of the rank kept."""

    rank: int
    view: RankView  # at the rank's own end: final_view counts its stale_s from the run's end
    first_ns: int
    last_ns: int  # -1: no records
    skipped: str | None
    identity: tuple[Path, dict[str, Any], RunInfo | None]  # what check_one_run compares
    cut_off: bool = False  # its recording ended without an end record, its process gone (_Track.cut_off)
    end: RankEnd | None = None  # how it ended (_Track.end)


def final_rank(recording: Recording) -> FinalRank:
    """The rank as its recording ends: ReplaySource.view_at(duration_ns)'s view of it, but for its stale_s."""
    track = _track(recording)
    t = max(track.last_ns, track.first_ns)
    track.analysis = _analyse(track, (track.memory.upto(t), track.steps.upto(t), track.ooms.upto(t)), time.monotonic())
    return FinalRank(track.rank, _rank_view(track, t, finished=True, start_ns=track.first_ns), track.first_ns, track.last_ns,
                     track.skipped, (recording.path, recording.header, recording.run_info), track.cut_off, track.end)


def final_view(run_dir: RunDirs, progress: OnProgress | None = None, workers: int | None = 1) -> FleetView:
    """A recorded run's final state: every rank as its recording ends (the TUI's view of an ended run), the
    same as ReplaySource(run_dir).view_at(duration_ns). Each rank is read and made into its FinalRank by one
    of ``workers`` processes (map_rank_files'; 1, the default, all in this process) and none is held here: a
    long run's replay holds every rank's tables, which the final state does not need. ``progress``: told as
    each rank is read."""
    return final_view_of(run_dir, map_rank_files(replayed_files(run_dir), _final_rank_of_file, workers, progress))


def _final_rank_of_file(path: Path) -> FinalRank:
    return final_rank(read_rank_file(path))


def final_view_of(run_dir: RunDirs, parts: Sequence[FinalRank]) -> FleetView:
    """final_view of the run's FinalRanks (one a rank file, made by final_rank)."""
    check_one_run([part.identity for part in parts])
    parts = sorted(parts, key=lambda part: part.rank)
    _check_some_records(run_dir, [part.last_ns for part in parts])
    end_ns = max(part.last_ns for part in parts)
    said = died_lines(part.end for part in parts if part.end is not None)  # the first to die says so
    ranks = tuple(part.view if part.last_ns < 0 else replace(
        part.view, stale_s=round((end_ns - part.last_ns) / 1e9, 3),
        died=said.get(part.rank, part.view.died) if part.view.died else None) for part in parts)
    notes = [part.skipped for part in parts if part.skipped]
    hang = recorded_verdict({part.rank: part.view.progress for part in parts}, [p.rank for p in parts if p.cut_off])
    return FleetView(t_ns=end_ns, source=f"replay {run_name(run_dir)}", ranks=ranks,
                     looked_at=tuple(map(str, run_folders(run_dir))), error="; ".join(notes) if notes else None,
                     hang=hang)
