"""What the dashboard draws at one moment, as one immutable value (RunData), and the feeds that make it
from each kind of source: a recording (RUN_DIR), a replay of one, live agents or Prometheus, profiler
traces.

Every feed builds RunData on its own thread (or once, for a recording); a page's callback only reads
the newest one (``Feed.latest()``: a reference under a lock, no I/O), so a refresh costs the drawing
alone. The numbers come from the same objects the TUI and `zeromon report` use: the FleetView (rank
rows, OOM forecasts, findings), the recordings and the RunReport.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from zeromon.analysis.findings import Finding
from zeromon.analysis.report import RunReport
from zeromon.analysis.trace_overlap import RankTraceOverlap
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen, mutable
from zeromon.model.codec import CollectiveColumns, Recording, RunDirs, rank_file_paths, run_folders, run_name
from zeromon.model.columns import ColumnTable, TableRecords
from zeromon.model.events import CollectiveEvent, MemorySample, OomEvent, PhaseSpan, StepSummary
from zeromon.model.rank_pool import OnProgress, in_two_passes
from zeromon.sources.fleet import FleetView, RankView
from zeromon.views.fleet import fleet_findings

if TYPE_CHECKING:
    from zeromon.sources.replay import FinalRank, RecordedTables

_COLLECTIVE_FIELDS = tuple(f.name for f in dataclasses.fields(CollectiveEvent))
_COLUMN_FIELDS = tuple(f.name for f in dataclasses.fields(CollectiveColumns))
RECORDING_CHECK_S = 2.0  # how often a followed recording's files are looked at for growth
# Live history kept per rank: enough for hours of steps on a few ranks, bounded on hundreds (a step
# summary or memory sample costs ~0.5-1 KB): the total is what bounds the process's memory.
LIVE_SAMPLES_TOTAL = 400_000
LIVE_SAMPLES_MIN = 512


@frozen
class RankHistory:
    """One rank over time, oldest first: what the recording holds (``complete``), or what a live
    client has seen since it started (bounded)."""

    rank: int
    memory: Sequence[MemorySample] = ()
    steps: Sequence[StepSummary] = ()
    phases: Sequence[PhaseSpan] = ()
    collectives: CollectiveColumns | None = None
    ooms: Sequence[OomEvent] = ()
    complete: bool = False
    until_ns: int | None = None  # a replay's position: nothing after it is shown
    _by_step: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)
    _phases_by_step: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def step_collectives(self, step: int) -> list[CollectiveEvent]:
        """The collectives issued in ``step`` (by the agent's step index), in issue order."""
        columns = self.collectives
        if columns is None or not len(columns):
            return []
        if not self._by_step:
            for i, s in enumerate(columns.step):
                self._by_step.setdefault(s, []).append(i)
        indices = self._by_step.get(step)
        if not indices:
            return []
        # Only the step's own columns are made into events: not the whole recording's.
        values = [getattr(columns, name) for name in _COLLECTIVE_FIELDS]
        out = [CollectiveEvent(*(column[i] for column in values)) for i in indices]
        if self.until_ns is not None:
            out = [c for c in out if c.issue_ns <= self.until_ns]
        return sorted(out, key=lambda c: c.issue_ns)

    def step_phases(self, step: int) -> list[PhaseSpan]:
        phases = self.phases
        if not isinstance(phases, TableRecords):
            return [p for p in phases if p.step == step]
        table = phases.table  # stored as columns: only the step's own are made
        if not self._phases_by_step:
            for i in range(len(table)):
                self._phases_by_step.setdefault(table.value(i, "step"), []).append(i)
        return [table.get(i) for i in self._phases_by_step.get(step, ())]


@frozen
class RunData:
    """Everything a page may draw, at one moment."""

    kind: str  # "recording", "replay", "live", "trace"
    source: str  # what is watched, in words
    version: int  # grows whenever the data changes: a page whose version is drawn skips the redraw
    fleet: FleetView
    histories: Mapping[int, RankHistory] = field(default_factory=dict)
    report: RunReport | None = None  # the offline analysis, for a recording
    findings: tuple[Finding, ...] = ()  # worst first: the report's, or the live view's (as the TUI shows them)
    traces: tuple[RankTraceOverlap, ...] = ()  # for --trace
    error: str | None = None  # about the source as a whole: shown on every page
    finished: bool = False  # the run (or the replay) has ended: this is its final state
    position_s: float | None = None  # a replay's position
    duration_s: float | None = None  # a replay's length
    run_dir: RunDirs | None = None  # a recording's folder (or folders): what `zeromon whatif` reads again

    @property
    def live(self) -> bool:
        """Pages refresh themselves: the data can still change."""
        return self.kind in ("live", "replay") or (self.kind == "recording" and not self.finished)


class Feed(Protocol):
    def start(self) -> Any: ...

    def stop(self) -> None: ...

    def latest(self) -> RunData: ...


def _sorted_findings(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (-f.severity.rank, f.rank if f.rank is not None else -1, f.kind)))


# --- a recording ---------------------------------------------------------------------------------------

def _files_state(run_dir: RunDirs) -> tuple[tuple[str, int, int], ...]:
    try:
        return tuple(sorted((str(p), (st := p.stat()).st_size, st.st_mtime_ns)
                            for folder in run_folders(run_dir) for p in rank_file_paths(folder)))
    except OSError:
        return ()


def recording_data(run_dir: RunDirs, version: int = 1, peak_busbw: float | None = None,
                   capacity_bytes: int | None = None, finished: bool = True, workers: int | None = None,
                   progress: OnProgress | None = None) -> RunData:
    """A run's folder (or folders, one per node) read whole and analysed as `zeromon report` does
    (ZeromonError for folders that are not one run), with the TUI's view of its final state.

    Read in a forked loader process (``workers``: analyse_run's, whose workers also store each rank's
    history; 1: all in this process, which has threads running, where fork is not safe), which sends
    the report, each rank's compact history and the final view back one piece at a time: this
    process never holds the records read, the analyses' intermediates, or more than one piece in
    transit (all at once, the peak here would grow with the run). ``progress``: told
    as each rank is analysed (by the loader, which shares this process's stderr)."""
    pieces = _load_pieces(run_dir, peak_busbw, capacity_bytes, 1, progress) if workers == 1 else _loaded_in_a_child(
        run_dir, peak_busbw, capacity_bytes, workers, progress)
    report: RunReport | None = None
    histories: dict[int, RankHistory] = {}
    fleet: FleetView | None = None
    for kind, piece in pieces:
        if kind == "report":
            report = piece
        elif kind == "rank":
            histories[piece.rank] = piece
        else:
            fleet = piece
    _give_back_freed_memory()
    assert report is not None and fleet is not None
    if finished:
        fleet = _all_ended(fleet)
    return RunData(kind="recording", source=f"recording {run_name(run_dir)}", version=version, fleet=fleet,
                   histories=dict(sorted(histories.items())), report=report, findings=report.findings,
                   finished=finished, run_dir=run_dir)


def _load_pieces(run_dir: RunDirs, peak_busbw: float | None, capacity_bytes: int | None,
                 workers: int | None, progress: OnProgress | None = None,
                 send_rank: Callable[[RankHistory], None] | None = None) -> Iterator[tuple[str, Any]]:
    """The recording as pieces: ("report", RunReport), ("rank", RankHistory) for each rank, then
    ("view", FleetView), the run's final view; each rank file read once, by a worker that makes all three
    of it. ``send_rank``: each rank's history handed to it as soon as its worker is done instead (the
    loader process sends it on and holds none of them)."""
    from zeromon.sources.replay import final_view_of
    from zeromon.sources.run_analysis import analyse_and_keep

    def hand_on(kept: tuple[RankHistory, FinalRank]) -> tuple[None, FinalRank]:
        assert send_rank is not None
        send_rank(kept[0])
        return None, kept[1]

    report, kept = analyse_and_keep(run_dir, history_and_final_rank, peak_busbw=peak_busbw,
                                    capacity_bytes=capacity_bytes, workers=workers, progress=progress,
                                    on_kept=hand_on if send_rank is not None else None)
    yield "report", report
    finals = []
    for history, final in kept:
        if history is not None:
            yield "rank", history
        finals.append(final)
    del kept
    yield "view", final_view_of(run_dir, finals)


def history_and_final_rank(rec: Recording) -> tuple[RankHistory, FinalRank]:
    """What the dashboard keeps of a rank (made by the worker that read it): its history and its part of the
    run's final view."""
    from zeromon.sources.replay import final_rank

    return compact_history(rec), final_rank(rec)


def _give_back_freed_memory() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim): what unpickling the
    pieces freed stays in this long-lived process otherwise. Nothing where there is no glibc."""
    import ctypes
    import ctypes.util

    try:
        name = ctypes.util.find_library("c")
        trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
        if trim is not None:
            trim(0)
    except OSError:
        pass


def _send_pieces(conn: Any, run_dir: RunDirs, peak_busbw: float | None, capacity_bytes: int | None,
                 workers: int | None, progress: OnProgress | None) -> None:
    """The loader process: each piece sent as it is made; an error sent as the last piece."""
    try:
        for piece in _load_pieces(run_dir, peak_busbw, capacity_bytes, workers, progress,
                                  send_rank=lambda history: conn.send(("rank", history))):
            conn.send(piece)
    except Exception as exc:  # ZeromonError and its hint pickle; anything else goes as its text
        try:
            conn.send(("error", exc))
        except Exception:
            conn.send(("error", ZeromonError(f"{run_name(run_dir)}: {type(exc).__name__}: {exc}")))
    finally:
        done = getattr(progress, "__exit__", None)  # a bar this process drew (a command's Progress) is cleared here
        if done is not None:
            done(None, None, None)
        conn.close()


def _loaded_in_a_child(run_dir: RunDirs, peak_busbw: float | None, capacity_bytes: int | None,
                       workers: int | None, progress: OnProgress | None = None) -> Iterator[tuple[str, Any]]:
    """_load_pieces in a forked process, each piece received as it comes (in this process where no
    fork can be had). ``progress`` goes to the child as it is (a fork copies it), and is told there."""
    import multiprocessing

    from zeromon.model.codec import collector_paused

    try:
        context = multiprocessing.get_context("fork")
        receiver, sender = context.Pipe(duplex=False)
        child = context.Process(target=_send_pieces, args=(sender, run_dir, peak_busbw, capacity_bytes, workers,
                                                           progress), name="zeromon-recording-loader")
        child.start()
    except (OSError, ValueError, NotImplementedError):
        yield from _load_pieces(run_dir, peak_busbw, capacity_bytes, workers, progress)
        return
    sender.close()  # the child's end: EOF here when the child is gone
    try:
        while True:
            try:
                with collector_paused():  # a piece is many objects, none of them garbage
                    kind, piece = receiver.recv()
            except EOFError:
                child.join()
                raise ZeromonError(f"{run_name(run_dir)}: the process reading the recording died (exit code "
                                   f"{child.exitcode}: killed, or out of memory)",
                                   hint="open fewer ranks at once: move some rank files to a folder of "
                                        "their own") from None
            if kind == "error":
                raise piece
            yield kind, piece
            if kind == "view":
                return
    finally:
        receiver.close()
        if child.is_alive():
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()


def compact_history(rec: Recording) -> RankHistory:
    """A finished recording's rank, stored as columns (far smaller than the records): each page makes the
    records it draws again."""
    return RankHistory(rank=rec.rank, memory=TableRecords(ColumnTable(MemorySample, rec.memory, "t_ns")),
                       steps=TableRecords(ColumnTable(StepSummary, rec.steps, "step")),
                       phases=TableRecords(ColumnTable(PhaseSpan, rec.phases, "start_ns")),
                       collectives=compact_collectives(rec), ooms=rec.ooms, complete=True)


def _all_ended(fleet: FleetView) -> FleetView:
    """A run that is over: its ranks ended (the final state), they are not stale."""
    return dataclasses.replace(fleet, ranks=tuple(dataclasses.replace(r, ended=True) for r in fleet.ranks))


class RecordingFeed:
    """A run's folder (or folders, one per node). Read at start; while its files grow (a run still training into it), read again
    at most every RECORDING_CHECK_S on a thread of its own, the old data shown meanwhile."""

    def __init__(self, run_dir: RunDirs, peak_busbw: float | None = None, capacity_bytes: int | None = None,
                 alive: Callable[[], bool] | None = None, progress: OnProgress | None = None) -> None:
        """``progress``: told as each rank of the first read is analysed (the later reads say nothing)."""
        self.run_dir = run_dir
        self.peak_busbw, self.capacity_bytes = peak_busbw, capacity_bytes
        self._alive = alive  # is the run still being written? (its agents' processes)
        self._state = _files_state(self.run_dir)
        self._data = self._read(1, finished=not self._still_running(), progress=progress)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self, version: int, finished: bool, progress: OnProgress | None = None) -> RunData:
        # The first read runs before the server's threads start: analyse_run may fork its workers.
        # Later ones run beside them, in this process alone.
        return recording_data(self.run_dir, version, peak_busbw=self.peak_busbw, capacity_bytes=self.capacity_bytes,
                              finished=finished, workers=None if version == 1 else 1, progress=progress)

    def _still_running(self) -> bool:
        try:
            return bool(self._alive and self._alive())
        except Exception:  # a registry that cannot be read: take the run as ended
            return False

    def start(self) -> RecordingFeed:
        if self._thread is None and not self._data.finished:
            self._thread = threading.Thread(target=self._loop, name="zeromon-recording-feed", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def latest(self) -> RunData:
        with self._lock:
            return self._data

    def _loop(self) -> None:
        while not self._stop.wait(RECORDING_CHECK_S):
            state = _files_state(self.run_dir)
            running = self._still_running()
            if state == self._state and running:
                continue
            try:
                data = self._read(self._data.version + 1, finished=not running)
            except Exception as exc:  # a half-written line is skipped by the reader; anything else is shown
                with self._lock:
                    self._data = dataclasses.replace(self._data, error=f"reading {run_name(self.run_dir)} again: {exc}",
                                                     version=self._data.version + 1)
                continue
            with self._lock:
                self._state, self._data = state, data
            if not running:
                return


# --- a replay --------------------------------------------------------------------------------------------

@frozen
class _ReplayedRank:
    """What a replay's histories are cut from, for one rank: the replay's own tables, and its collectives."""

    tables: RecordedTables
    steps: ColumnTable[StepSummary]  # in step order: the replay's own table where its steps ended in that order
    step_ends: Sequence[int]  # per step in that order, the latest end up to it: bisected, how many steps a position shows
    step_keys: array[int] | None  # the steps' indices, where ``steps`` is stored by end
    collectives: CollectiveColumns


def _in_step_order(table: ColumnTable[StepSummary]) -> tuple[ColumnTable[StepSummary], Sequence[int], array[int] | None]:
    """A replay's steps (stored by end) in step order, for the pages' lookups by step: the table itself, keyed
    by the steps' indices, where they ended in step order (as a training loop's do); otherwise a table of its
    own, a step shown once every step before it has ended."""
    indices = table.numbers("step")
    if indices is not None and all(a < b for a, b in itertools.pairwise(indices)):
        return table, table.t_ns, indices
    records = sorted(table.slice(0, len(table)), key=lambda s: s.step)
    return (ColumnTable(StepSummary, records, "step"),
            array("q", itertools.accumulate((s.end_ns for s in records), max)), None)


def compact_collectives(rec: Recording) -> CollectiveColumns:
    """A recording's collectives as columns, each column stored as compactly as its values allow."""
    from zeromon.model.columns import compact_column

    columns = rec.collective_columns()
    return CollectiveColumns(*(compact_column(getattr(columns, name)) for name in _COLUMN_FIELDS))


def _collectives_of_file(path: Path) -> tuple[int, CollectiveColumns]:
    from zeromon.model.rank_pool import read_rank_file

    rec = read_rank_file(path)
    return rec.rank, compact_collectives(rec)


class ReplayFeed:
    """A recording played back (ReplaySource's clock and FleetViews); each rank's history is its
    recording up to the replay's position: a prefix of the tables the replay holds (nothing copied), and
    the rank's collectives as columns, read beside them. 256 ranks x 10,000 steps: see docs/dashboard.md."""

    def __init__(self, run_dir: RunDirs, speed: float = 1.0, progress: OnProgress | None = None,
                 workers: int | None = 1) -> None:
        """``progress``: told as each rank file is read (twice each: the collectives, then the replay's
        indexes); ``workers``: this feed's read of the collectives, and the replay's (ReplaySource). The
        collectives are read first: the workers forked for the replay's read then share (and a sum of RSS
        counts again) only them, not every rank's tables, as they would the other way round."""
        from zeromon.model.rank_pool import map_rank_files
        from zeromon.sources.replay import ReplaySource, replayed_files

        read, indexed = in_two_passes(progress)
        self.run_dir = run_dir
        collectives = dict(map_rank_files(replayed_files(self.run_dir), _collectives_of_file, workers, read))
        self.replay = ReplaySource(self.run_dir, speed=speed, progress=indexed, workers=workers)
        self._ranks = [_ReplayedRank(tables, *_in_step_order(tables.steps), collectives=collectives[tables.rank])
                       for tables in self.replay.tables()]
        self._lock = threading.Lock()
        self._last: tuple[int, RunData] | None = None

    def start(self) -> ReplayFeed:
        self.replay.start()
        return self

    def stop(self) -> None:
        self.replay.stop()

    def latest(self) -> RunData:
        fleet = self.replay.latest()
        if self.replay.finished:  # played through
            fleet = _all_ended(fleet)
        t = self.replay.start_ns + self.replay.position_ns
        with self._lock:
            if self._last is not None and self._last[0] == t:
                return self._last[1]
            version = (self._last[1].version + 1) if self._last else 1
            histories = {}
            for r in self._ranks:
                memory, phases, ooms = r.tables.memory, r.tables.phases, r.tables.ooms
                histories[r.tables.rank] = RankHistory(
                    rank=r.tables.rank, memory=TableRecords(memory.prefix(memory.upto(t))),
                    steps=TableRecords(r.steps.prefix(bisect.bisect_right(r.step_ends, t), r.step_keys)),
                    phases=TableRecords(phases.prefix(phases.upto(t))), collectives=r.collectives,
                    ooms=TableRecords(ooms.prefix(ooms.upto(t))), complete=False, until_ns=t)
            data = RunData(kind="replay", source=f"replay of {run_name(self.run_dir)} at {self.replay.speed:g}x",
                           version=version, fleet=fleet, histories=histories,
                           findings=_sorted_findings(fleet_findings(fleet.ranks)), error=fleet.error,
                           finished=self.replay.finished, position_s=self.replay.position_ns / 1e9,
                           duration_s=self.replay.duration_ns / 1e9)
            self._last = (t, data)
            return data


# --- live agents or Prometheus ------------------------------------------------------------------------

@mutable
class _LiveTrack:
    memory: deque[MemorySample]
    steps: dict[int, StepSummary]


class LiveFeed:
    """A LiveSource (agents, a run folder's agents, the newest local run, or Prometheus), polled on
    its own threads; this feed's thread takes each new FleetView every ``interval_s`` and adds what is
    new to each rank's history (memory samples, steps), bounded to LIVE_SAMPLES_TOTAL over all ranks."""

    def __init__(self, source: Any, interval_s: float = 1.0,
                 on_error: Callable[[str | None], None] | None = None,
                 final: Callable[[], RunData] | None = None) -> None:
        self.source = source
        self.interval_s = interval_s
        # Once every rank has ended: the run's final state (its recording), as `zeromon attach --run`
        # shows it: the last poll can be an interval older than the last step.
        self._final = final
        self._on_error = on_error  # told each time the source's error changes (the terminal says it too)
        self._last_error: str | None = None
        self._tracks: dict[int, _LiveTrack] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._version = 0
        self._started = False  # the source's error is told once it polls (before, it has not looked yet)
        self._data = self._build(source.latest())

    def start(self) -> LiveFeed:
        self.source.start()
        self._started = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="zeromon-live-feed", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.source.stop()

    def latest(self) -> RunData:
        with self._lock:
            return self._data

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                data = self._build(self.source.latest())
                if data.finished and self._final is not None:
                    final = dataclasses.replace(self._final(), version=data.version + 1)
                    with self._lock:
                        self._data = final
                    return  # the run is over: its recording is the whole of it
            except Exception as exc:  # shown on the page; the feed goes on
                with self._lock:
                    self._data = dataclasses.replace(self._data, error=f"internal error: {type(exc).__name__}: {exc}")
                continue
            with self._lock:
                self._data = data

    def add(self, fleet: FleetView) -> None:
        """Take one view into the histories (the feed's thread does this; tests call it directly)."""
        self._started = True
        data = self._build(fleet)
        with self._lock:
            self._data = data

    def _build(self, fleet: FleetView) -> RunData:
        ranks = [r for r in fleet.ranks if r.rank is not None]
        keep = max(LIVE_SAMPLES_MIN, LIVE_SAMPLES_TOTAL // max(1, len(ranks)))
        for view in ranks:
            assert view.rank is not None
            track = self._tracks.get(view.rank)
            if track is None or track.memory.maxlen != keep:
                track = self._tracks[view.rank] = _LiveTrack(
                    deque(track.memory if track else (), maxlen=keep), dict(track.steps) if track else {})
            _take(track, view, keep)
        self._version += 1
        histories = {view.rank: _live_history(view, self._tracks[view.rank]) for view in ranks
                     if view.rank is not None}
        ended = bool(fleet.ranks) and all(r.ended for r in fleet.ranks)
        if self._started and fleet.error != self._last_error:
            self._last_error = fleet.error
            if self._on_error is not None:
                self._on_error(fleet.error)
        return RunData(kind="live", source=fleet.source, version=self._version, fleet=fleet, histories=histories,
                       findings=_sorted_findings(fleet_findings(fleet.ranks)), error=fleet.error, finished=ended)


def _take(track: _LiveTrack, view: RankView, keep: int) -> None:
    m = view.memory
    if m is not None and (not track.memory or m.t_ns > track.memory[-1].t_ns):
        track.memory.append(m)
    for s in view.steps:
        track.steps[s.step] = s
    if len(track.steps) > keep:
        for step in sorted(track.steps)[:len(track.steps) - keep]:
            del track.steps[step]


def _live_history(view: RankView, track: _LiveTrack) -> RankHistory:
    assert view.rank is not None
    return RankHistory(rank=view.rank, memory=tuple(track.memory),
                       steps=tuple(track.steps[s] for s in sorted(track.steps)), phases=view.phases,
                       collectives=CollectiveColumns.of(list(view.recent_collectives)))


# --- profiler traces -------------------------------------------------------------------------------------

def trace_data(trace_dir: str | Path) -> RunData:
    """`zeromon report --trace`'s analysis (ZeromonError for a folder without traces)."""
    from zeromon.analysis.trace_overlap import analyze_traces
    from zeromon.sources.kineto import load_traces

    results = analyze_traces(load_traces(Path(trace_dir)))
    fleet = FleetView(t_ns=time.time_ns(), source=f"traces in {trace_dir}", ranks=(), looked_at=(str(trace_dir),))
    return RunData(kind="trace", source=f"traces in {trace_dir}", version=1, fleet=fleet, traces=tuple(results),
                   finished=True)


class StaticFeed:
    """Data that does not change (profiler traces)."""

    def __init__(self, data: RunData) -> None:
        self._data = data

    def start(self) -> StaticFeed:
        return self

    def stop(self) -> None:
        pass

    def latest(self) -> RunData:
        return self._data


def run_processes_alive(run_dir: RunDirs) -> Callable[[], bool]:
    """Whether any agent registered in the run's folder (or folders) still has a live process (on this
    host: another node's processes are not seen, and count as ended)."""
    from zeromon.model.registry import pid_alive
    from zeromon.sources.discovery import EntryFolder, run_endpoints_folder

    folders = [EntryFolder(run_endpoints_folder(folder)) for folder in run_folders(run_dir)]

    def alive() -> bool:
        return any(pid_alive(entry) is True for folder in folders for entry in folder.read())

    return alive

