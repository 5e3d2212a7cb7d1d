"""Live data from running agents, as one immutable FleetView that the TUI and the dashboard draw.

LiveSource finds the agents (``host:port`` targets, a run folder's ``endpoints/``, or by itself
the newest local run in the user-level index; zeromon.sources.discovery), polls each one's
``/api/v1/snapshot`` every ``interval_s`` from one background thread (non-blocking sockets and a
selector: a slow or dead agent holds a socket, never the others), and keeps the newest answer of
each rank. ``latest()`` never touches the network: it copies references under a lock.
With ``prometheus=URL`` it reads the same view through Prometheus's HTTP API instead
(zeromon.sources.promql), for a job that spans machines.

A rank that stops answering stays in the view with its last data, ``alive=False``, ``stale_s``
and the reason in ``error``; one that comes back is picked up, and so are agents that register in
the run's folder later. Nothing a target answers, or fails to, raises out of ``latest()``.

What one poll of a rank costs the client (tests/bench/bench_live_source.py): one HTTP/1.0 request on a new
connection (the endpoint serves one request per connection), one JSON parse, and new objects only
for what changed: after the first poll it asks only for the steps that can have ended since
(``?steps=``) and the events since its cursor (``?since=``), and reuses the steps it has.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.errors import ZeromonError
from zeromon.model.classes import mutable
from zeromon.model.events import (
    CollectiveEvent,
    PhaseSpan,
    StepSummary,
)
from zeromon.model.numbers import SOURCE_SECONDS, checked
from zeromon.model.registry import EndpointEntry, pid_alive, registry_dir
from zeromon.sources.discovery import (
    EntryFolder,
    Target,
    agent_query,
    entry_target,
    local_runs,
    parse_target,
    run_endpoints_folder,
    run_to_follow,
)
from zeromon.sources.fleet import (
    FleetView,
    RankView,
    check_snapshot,
    rank_view_from_snapshot,
    record_from_dict,
    with_hang,
)
from zeromon.sources.http import (
    FetchError,
    HttpFetcher,
    check_token,
    describe_os_error,
    http_request,
    http_status_error,
    json_loads,
)

if TYPE_CHECKING:
    from zeromon.model.run_end import FileEnd

STEPS_ASKED = 64  # steps per snapshot (?steps=): the agent's default
EVENTS_LIMIT = 2000  # events per poll (?limit=); a client further behind skips ahead
PHASES_KEPT = 512  # recent phase spans kept per rank
PHASES_BACKFILL = 256  # events asked for before the first cursor: the last step or so


# --- polling -----------------------------------------------------------------------------------------

@mutable(eq=False)
class _Slot:
    """One watched agent and what was last learnt from it. Mutated under LiveSource._lock."""

    key: str
    target: Target
    rank: int | None
    view: RankView | None = None  # built from the last answer
    last_ok: float | None = None  # time.monotonic() of the last answer
    error: str | None = "not polled yet"
    cursor: int | None = None  # events were read through this cursor
    start_ns: int | None = None  # of the agent that answered (a restarted agent numbers events anew)
    full_steps: bool = True  # ask for all STEPS_ASKED steps next time (first poll, or steps were missed)
    parsed: dict[str, tuple[Any, Any]] = dataclasses.field(default_factory=dict)  # see rank_view_from_snapshot
    phases: deque[PhaseSpan] = dataclasses.field(default_factory=lambda: deque(maxlen=PHASES_KEPT))
    collectives: deque[CollectiveEvent] | None = None  # recent ones, when LiveSource keeps them
    due: float = 0.0  # time.monotonic() of its next poll
    in_flight: bool = False  # a request is out: a slow agent is not asked twice
    entry: EndpointEntry | None = None  # its registration, when found through one: its host and pid
    ended: bool = False  # it stopped answering and its process is gone or its recording ended: it did not hang
    died: str | None = None  # how it died, from its recording's end, once it ended (rank_ends.died_line)


def _recording_end(entry: EndpointEntry) -> FileEnd | None:
    """The end of the rank's recording in its run folder (on this host); None where it cannot be read."""
    from zeromon.model.codec import rank_file_path
    from zeromon.model.run_end import read_file_end

    try:
        return read_file_end(rank_file_path(entry.run_dir, entry.rank))
    except (OSError, ValueError, ZeromonError):
        return None


def _died(slot: _Slot, file_end: FileEnd) -> str | None:
    """How an ended rank died, from the end of its recording (rank_ends.died_line); None for a clean end."""
    from zeromon.analysis.rank_ends import died_line

    steps = slot.view.steps if slot.view is not None else ()
    return died_line(file_end, steps[-1].step if steps else None)


class LiveSource:
    """Polls live agents (or Prometheus) in the background; ``latest()`` is the newest FleetView.

    ``targets``: ``host:port`` strings; else ``run_dir``: the agents registered in that run folder;
    else the newest local run (the user-level index, ZEROMON_REGISTRY). ``prometheus``: a
    Prometheus server's URL instead of agents. ``token``: the agents' bearer token (default
    ZEROMON_TOKEN). Bad arguments raise ZeromonError here; nothing later does.
    """

    def __init__(self, targets: list[str] | None = None, run_dir: str | Path | None = None,
                 prometheus: str | None = None, token: str | None = None, interval_s: float = 1.0,
                 timeout_s: float | None = None, events: bool = True, keep_collectives: int = 0) -> None:
        self.interval_s = checked("interval", SOURCE_SECONDS, interval_s)
        self.timeout_s = float(timeout_s) if timeout_s is not None else min(5.0, max(1.0, 2 * self.interval_s))
        self.token = token if token is not None else os.environ.get("ZEROMON_TOKEN") or None
        if self.token:  # "" in code: no token, whatever ZEROMON_TOKEN says
            check_token(self.token, "--token" if token is not None else "ZEROMON_TOKEN")
        self.events = events  # read phase spans from the event stream (?since=)
        # Recent collectives kept per rank (RankView.recent_collectives), for the dashboard's step
        # timeline; 0: none (the TUI), so that none is built for nothing.
        self.keep_collectives = max(0, int(keep_collectives)) if events else 0
        self._targets = [parse_target(t) for t in targets or ()]
        self._run_dir = Path(run_dir) if run_dir is not None else None
        if self._run_dir is not None and not self._run_dir.is_dir():
            raise ZeromonError(f"run folder {run_dir}: no such folder",
                               hint="a run folder is the --out of `zeromon run` (ZEROMON_OUT)")
        self._prometheus: Any = None
        if prometheus is not None:
            from zeromon.sources.promql import PrometheusFleet

            self._prometheus = PrometheusFleet(prometheus, timeout_s=self.timeout_s)
        self._auto = not self._targets and self._run_dir is None and self._prometheus is None
        self._folder = EntryFolder(run_endpoints_folder(self._run_dir)) if self._run_dir is not None else None
        self._auto_start_ns = -1
        self._registry = EntryFolder(registry_dir()) if self._auto else None
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._problems: tuple[str, ...] = ()
        self._source_error: str | None = None
        self._prom_view: FleetView | None = None
        self._fetcher: HttpFetcher | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        for target in self._targets:
            self._slots[str(target)] = self._new_slot(str(target), target, None)

    def _new_slot(self, key: str, target: Target, rank: int | None) -> _Slot:
        slot = _Slot(key, target, rank)
        if self.keep_collectives:
            slot.collectives = deque(maxlen=self.keep_collectives)
        return slot

    # -- public

    @property
    def looked_at(self) -> tuple[str, ...]:
        if self._prometheus is not None:
            return (f"prometheus {self._prometheus.url}",)
        if self._targets:
            return tuple(f"target {t}" for t in self._targets)
        places = []
        if self._auto:
            places.append(f"{registry_dir()} (the user-level index of local agents, ZEROMON_REGISTRY)")
        if self._run_dir is not None:
            places.append(f"{run_endpoints_folder(self._run_dir)} (the run folder's endpoints)")
        return tuple(places)

    @property
    def source(self) -> str:
        if self._prometheus is not None:
            return f"prometheus {self._prometheus.url}"
        if self._targets:
            return "targets " + " ".join(str(t) for t in self._targets)
        return f"run {self._run_dir}" if self._run_dir is not None else "newest local run (none found yet)"

    def start(self) -> LiveSource:
        """Poll in the background (one daemon thread), every interval_s, until stop()."""
        if self._thread is None:
            self._stop.clear()
            if self._prometheus is None and self._fetcher is None:
                self._fetcher = HttpFetcher()
            self._thread = threading.Thread(target=self._loop, name="zeromon-live-source", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._fetcher is not None:
            self._fetcher.wake()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)
            self._thread = None
        if self._fetcher is not None:
            self._close(self._fetcher)
            self._fetcher = None
        if self._prometheus is not None:
            self._prometheus.close()

    def _close(self, fetcher: HttpFetcher) -> None:
        fetcher.close()
        with self._lock:
            for slot in self._slots.values():
                slot.in_flight = False  # its exchange went with the fetcher

    def __enter__(self) -> LiveSource:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def poll(self) -> FleetView:
        """One round now, waiting for its answers (at most timeout_s): for one-shot use and tests.
        Once start()ed, the background thread polls and this is latest()."""
        if self._thread is not None:
            return self.latest()
        if self._prometheus is not None:
            self._poll_prometheus()
            return self.latest()
        self._discover()
        fetcher = HttpFetcher()
        try:
            with self._lock:
                slots = list(self._slots.values())
            for slot in slots:
                self._send(fetcher, slot)
            while fetcher.in_flight:  # each exchange ends by its deadline
                for slot, result in fetcher.wait(self.timeout_s):
                    self._receive(slot, result)
        finally:
            self._close(fetcher)
        return self.latest()

    def latest(self) -> FleetView:
        """The newest view; never blocks on the network."""
        if self._prometheus is not None:
            with self._lock:
                fleet = self._prom_view
            return fleet if fleet is not None else FleetView(time.time_ns(), self.source, (), self.looked_at,
                                                           error="not polled yet")
        now = time.monotonic()
        with self._lock:
            slots = [(s, s.view, s.last_ok, s.error, s.rank, s.ended, s.died) for s in self._slots.values()]
            problems, error = self._problems, self._source_error
        ranks = []
        for slot, view, last_ok, err, rank, ended, died in slots:
            stale = None if last_ok is None else round(now - last_ok, 3)
            if view is None:
                ranks.append(RankView(rank=rank, target=str(slot.target), alive=False, stale_s=stale, error=err,
                                      ended=ended, died=died))
            else:
                ranks.append(dataclasses.replace(view, alive=err is None, stale_s=stale, error=err, ended=ended,
                                                 died=died))
        ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.target))
        if error is None and not ranks:
            error = "no agent found (looked at: " + "; ".join(self.looked_at) + ")"
        if error is None and problems:
            error = "; ".join(problems[:3])
        return with_hang(FleetView(time.time_ns(), self.source, tuple(ranks), self.looked_at, error))

    # -- the loop

    def _loop(self) -> None:
        """Every slot polled every interval_s, each on its own schedule: one slow agent delays no other."""
        next_discover = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if self._prometheus is not None:
                    self._poll_prometheus()
                    self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - now)))
                    continue
                fetcher = self._fetcher
                assert fetcher is not None  # made by start()
                if now >= next_discover:
                    self._discover()
                    next_discover = now + self.interval_s
                with self._lock:
                    slots = list(self._slots.values())
                for slot in slots:
                    if not slot.in_flight and now >= slot.due:
                        slot.due = now + self.interval_s
                        self._send(fetcher, slot)
                wake_at = min([next_discover, *(s.due for s in slots if not s.in_flight)])
                for slot, result in fetcher.wait(wake_at - time.monotonic()):
                    self._receive(slot, result)
                self._source_error = None
            except Exception as exc:  # a bug here must not end the polling; it shows in the view
                with self._lock:
                    self._source_error = f"internal error while polling: {type(exc).__name__}: {exc}"
                self._stop.wait(self.interval_s)

    def _poll_prometheus(self) -> None:
        view = self._prometheus.poll(self.source, self.looked_at)
        with self._lock:
            self._prom_view = view

    def _discover(self) -> None:
        """Registered agents to slots: new ranks added, restarted ones (a new address) re-pointed."""
        if self._targets:
            return
        problems: list[str] = []
        if self._auto:
            # A newer run takes over, and an older one still going replaces one that ended; an older
            # crashed run's leftovers never do (discovery.run_to_follow).
            runs = local_runs(self._registry, problems)
            follow = run_to_follow(runs, self._run_dir, self._auto_start_ns)
            if follow is not None:
                self._auto_start_ns = follow.start_ns
                self._run_dir = Path(follow.run_dir)
                self._folder = EntryFolder(run_endpoints_folder(self._run_dir))
                with self._lock:
                    self._slots = {}
            entries = self._folder.read(problems) if self._folder is not None else []
            followed = next((r for r in runs if self._run_dir == Path(r.run_dir)), None)
            if not entries and followed is not None:
                entries = list(followed.entries)  # the run folder is gone: the index still has this host's
        else:
            assert self._folder is not None
            entries = self._folder.read(problems)
        newest_of: dict[int, EndpointEntry] = {}
        for entry in entries:
            if entry.rank not in newest_of or entry.start_ns > newest_of[entry.rank].start_ns:
                newest_of[entry.rank] = entry
        with self._lock:
            self._problems = tuple(problems)
            for rank, entry in newest_of.items():
                key = f"rank {rank}"
                try:
                    target = entry_target(entry)
                except ZeromonError as exc:
                    self._problems += (exc.message,)
                    continue
                slot = self._slots.get(key)
                if slot is None:
                    slot = self._slots[key] = self._new_slot(key, target, rank)
                elif slot.target != target and not slot.in_flight:
                    slot.target = target  # the rank's agent restarted elsewhere
                slot.entry = entry

    def _send(self, fetcher: HttpFetcher, slot: _Slot) -> None:
        n_steps = STEPS_ASKED if slot.full_steps else self._steps_to_ask(slot)
        path = f"/api/v1/snapshot?steps={n_steps}"
        if self.events and slot.cursor is not None:
            # the kinds it reads: the phases, and the collectives where it keeps them (the agent skips the rest)
            path += f"&since={slot.cursor}&limit={EVENTS_LIMIT}&kinds=phase{',collective' if self.keep_collectives else ''}"
        path += agent_query(slot.entry)  # its own agent, not another run's on a reused port
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        target = slot.target
        slot.in_flight = True
        error = fetcher.start(slot, target.host, target.port, http_request(target.host, target.port, path, headers),
                              self.timeout_s)
        if error is not None:
            self._receive(slot, error)

    def _receive(self, slot: _Slot, result: tuple[int, str, bytes] | BaseException) -> None:
        slot.in_flight = False
        try:
            self._read(slot, result)
        except Exception as exc:  # an answer nobody foresaw: the rank shows it, polling goes on
            self._failed(slot, f"unexpected answer: {type(exc).__name__}: {exc}")

    def _read(self, slot: _Slot, result: tuple[int, str, bytes] | BaseException) -> None:
        if isinstance(result, BaseException):
            self._failed(slot, str(result) if isinstance(result, FetchError)
                         else describe_os_error(result, self.timeout_s))
            return
        status, reason, body = result
        if status != 200:
            self._failed(slot, http_status_error(status, reason, body, bool(self.token)))
            return
        try:
            doc = check_snapshot(json_loads(body))
        except ValueError as exc:  # JSON that does not parse, or not a snapshot
            self._failed(slot, f"not a zeromon snapshot: {exc}")
            return
        target = slot.target
        start_ns = doc.get("start_ns")
        previous = slot.view
        if slot.start_ns is not None and start_ns != slot.start_ns:
            # Another agent process answers for this rank (a restart): its steps and events start anew.
            previous, slot.cursor, slot.full_steps = None, None, True
            slot.phases.clear()
            if slot.collectives is not None:
                slot.collectives.clear()
            slot.parsed.clear()
        slot.start_ns = start_ns if isinstance(start_ns, int) else None
        self._read_events(slot, doc)
        view = rank_view_from_snapshot(doc, str(target), previous, tuple(slot.phases), slot.parsed)
        if slot.collectives is not None:
            view = dataclasses.replace(view, recent_collectives=tuple(slot.collectives))
        answered = view.steps
        # No steps yet, or a gap after the steps already known: ask for all of them next time.
        slot.full_steps = not answered
        if previous is not None and previous.steps and answered:
            slot.full_steps = answered[0].step > previous.steps[-1].step + 1
            view = dataclasses.replace(view, steps=_merge_steps(previous.steps, answered))
        with self._lock:
            slot.view, slot.error, slot.last_ok, slot.ended = view, None, time.monotonic(), False
            if view.rank is not None:
                slot.rank = view.rank

    def _steps_to_ask(self, slot: _Slot) -> int:
        """Steps the agent can have finished since the last answer, twice over: 64 steps of 40 KB
        parsed every second are most of a poll's cost when steps take longer than the poll interval."""
        view, last_ok = slot.view, slot.last_ok
        if view is None or last_ok is None or len(view.steps) < 2:
            return STEPS_ASKED
        recent = view.steps[-8:]
        step_s = max(1e-3, (recent[-1].end_ns - recent[0].end_ns) / 1e9 / (len(recent) - 1))
        since_s = time.monotonic() - last_ok + self.interval_s
        return max(4, min(STEPS_ASKED, 2 * math.ceil(since_s / step_s) + 2))

    def _failed(self, slot: _Slot, error: str) -> None:
        # A registered process that is gone ended (cleanly or not: the job's status tells), and so did one whose
        # recording has its end record: its agent stopped (at the process's exit, or detached), and nothing more
        # will come from it, though the process may still be on its way out (its interpreter's teardown, the
        # gloo threads: a second and more at every run's end, when all ranks read "not answering"). One that
        # lives without an ended recording, or runs on another host, only stopped answering. Until it has ended,
        # one kill(pid, 0) per failed poll and, on this host, a tail read of its recording, which also says how
        # it ended; once ended, it stays so until it answers again.
        entry, died, ended = slot.entry, slot.died, slot.ended
        if entry is not None and not ended:
            alive = pid_alive(entry)
            file_end = _recording_end(entry) if alive is not None else None
            ended = alive is False or (file_end is not None and file_end.end is not None)
            if ended:
                died = _died(slot, file_end) if file_end is not None else None
        with self._lock:
            slot.error, slot.ended, slot.died = (died or error), ended, died

    def _read_events(self, slot: _Slot, doc: dict[str, Any]) -> None:
        """Phase spans from the events since the last poll; the cursor moves on (skipping ahead when far behind)."""
        cursor = doc.get("cursor")
        if not self.events or not isinstance(cursor, int):
            return
        if slot.cursor is not None and cursor < slot.cursor:
            slot.cursor = None  # the agent's numbering went back: it is another process
            slot.phases.clear()
            if slot.collectives is not None:
                slot.collectives.clear()
        if slot.cursor is None:
            slot.cursor = max(0, cursor - PHASES_BACKFILL)
            return
        newest = slot.cursor
        events = doc.get("events")
        if isinstance(events, list) and events:
            # Most events are collectives, which only a source that keeps them turns into objects.
            for event in events:
                if not isinstance(event, dict):
                    continue
                kind = event.get("kind")
                if kind == "phase":
                    span = record_from_dict(PhaseSpan, event)
                    if span is not None:
                        slot.phases.append(span)
                elif kind == "collective" and slot.collectives is not None:
                    collective = record_from_dict(CollectiveEvent, event)
                    if collective is not None:
                        slot.collectives.append(collective)
            last = events[-1]  # the agent sends them in cursor order
            if isinstance(last, dict) and isinstance(last.get("cursor"), int):
                newest = max(newest, last["cursor"])
        through = doc.get("events_through")  # where the agent looked through the kinds asked for
        if isinstance(through, int) and not isinstance(through, bool) and through <= cursor:
            newest = max(newest, through)
        slot.cursor = max(newest, cursor - EVENTS_LIMIT)


def _merge_steps(old: tuple[StepSummary, ...], new: tuple[StepSummary, ...]) -> tuple[StepSummary, ...]:
    """The newest STEPS_ASKED steps of both, by step number (the newer answer wins)."""
    first_new = new[0].step
    kept = [s for s in old if s.step < first_new]
    return (*kept, *new)[-STEPS_ASKED:]
