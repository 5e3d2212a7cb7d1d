"""The agent's background thread: raw tuples in, events, step summaries and the rank file out.

Everything that costs (dtype names, group sizes, ZeRO meaning, clock conversion, JSON, file I/O,
NVML) happens here, off the training thread. The thread holds the GIL only in short bursts every
pass (see LIVE_PASS_S); its own CPU time is measured and reported, every record counted
(tests/bench/bench_recorder_cpu.py).

A pass drains the queues and hands each raw record to its part: collectives to CollectiveRecords
(recorder/collective_records.py: in flight until complete, then a record; every synchronous host collective a
column at a time), phase and step boundaries to the StepBook (step_book.py: spans, each step's
accumulator, its summary once whole), memory samples and OOMs here. What the parts make goes to the
Outbox (outbox.py): the recording now, live clients (LiveViews, live/published.py) at the pass's end.
The recorder also watches the rank's progress (ProgressWatch, progress.py) once a pass.
"""

from __future__ import annotations

import collections
import logging
import operator
import threading
import time
from typing import Any

from zeromon.analysis.hang import progress_notice
from zeromon.analysis.step_overlap import AGENT_PHASE
from zeromon.model.compiled import compiled
from zeromon.model.events import (
    PEAK_PHASES,
    AgentStats,
    DeviceSample,
    MemorySample,
    Notice,
    OomEvent,
    ProgressReport,
    RunEnd,
    RunInfo,
    record_maker,
)
from zeromon.model.jsonl import RecordingWriter
from zeromon.model.kinds import FIELDS_OF, orjson_module
from zeromon.model.progress import RESUMED, STALLED, RankProgress
from zeromon_agent.hooks.state import (
    AT_CUDA,
    AT_SEQ,
    RAW_AGENT,
    RAW_COLLECTIVE,
    RAW_DONE,
    RAW_MEMORY,
    RAW_OOM,
    RAW_PHASE,
    RAW_SEEN_DONE,
    RAW_STEP_END,
    RAW_STEP_START,
    RAW_TIME_AT,
    RAW_WAIT,
    HotState,
)
from zeromon_agent.live.published import LiveViews
from zeromon_agent.recorder.collective_records import CollectiveRecords
from zeromon_agent.recorder.outbox import Outbox
from zeromon_agent.recorder.progress import ProgressWatch, issued_in_all_groups
from zeromon_agent.recorder.step_acc import Mark, new_acc
from zeromon_agent.recorder.step_book import StepBook

log = logging.getLogger("zeromon.agent")

# Steps summarized before the recorded collectives are compared with the process groups' own counts.
UNSEEN_CHECK_STEPS = 5
# The drain gives the GIL away every 256 records, well within the interpreter's own switch interval.
# Each give costs: the training thread runs meanwhile, and the drain comes back to cold caches (giving it
# more often costs the drain measurably: tests/bench/bench_recorder_cpu.py).
_YIELD_EVERY = 256
# A run of a GPU-less pass's phase changes, agent spans, step boundaries and memory samples in one call (_host.c's
# host_phases), or None.
_HOST_PHASES = getattr(compiled("zeromon_agent.recorder._host"), "host_phases", None)
_ALL_SYNC = getattr(compiled("zeromon_agent.recorder._batch"), "all_sync", None)  # _all_sync's pass in C, or None
# The first pass comes this soon: the run's info and first records reach the file (and live views) as
# the training starts, not a whole flush interval later.
_FIRST_PASS_S = 0.2
# Passes: one every LIVE_PASS_S (the live views' age) while a live client reads this rank (its endpoint read
# within WATCHED_S; a read after a quiet spell wakes one at once), on a GPU while the CUDA events of the timing
# pool (4,096) wait to be read, and as soon as a queue crowds (a quarter of the raw one: its push wakes the thread).
# Otherwise (nobody reading) one at each flush of the recording only: each pass pays a cold start, so the fewer the
# passes, the less the recorder's thread spends a collective (tests/bench/bench_recorder_cpu.py); and between two,
# no look at all but where a stall could be named first (Recorder._next_look_s). Async collectives on the host
# brought a pass a second until issue 44 (its cost: tests/bench/RESULTS.md): what
# bounds an unwaited Work's completion is the training thread's look at each phase change (hooks/phases.py),
# and the queue names it by id (collectives._record_async), so a later pass keeps no tensor alive.
LIVE_PASS_S = 1.0
WATCHED_S = 3.0
_SOONEST_LOOK_S = 0.05  # the shortest wait between two looks at a rank nobody reads
_RECENT_RAW = 256  # raw records kept after their drain, for each group's newest collective (progress)
_RAW_CROWDED = 0.25  # the share of the raw queue's room that, queued, brings a pass forward (its push wakes the thread)
_CONTROL_CROWDED = 16384  # control records queued that bring a pass forward (the queue holds 65,536)
_BATCH = 256  # synchronous collectives finalized a column at a time, between two gives of the GIL
_KIND, _ASYNC, _STEP, _CUDA = (operator.itemgetter(i) for i in (0, 10, 13, 14))  # of a raw collective
# Built once per record, from the values' tuple (record_maker: the slots set directly, as @frozen's __init__ does).
_new_memory = record_maker(MemorySample)
_MEMORY_ORDER = FIELDS_OF[MemorySample][4:]  # the values the agent's sample queues, in order (memory.watch)
_MEMORY_PLAIN = _MEMORY_ORDER[:-1]  # a sample as a dict: all but the categories, which it has when they were walked
_MEMORY_FIELDS, _MEMORY_FIELDS_WALKED = frozenset(_MEMORY_PLAIN), frozenset(_MEMORY_ORDER)
_MEMORY_N = len(_MEMORY_ORDER)
_AT_ALLOCATED, _AT_RSS = 4 + _MEMORY_ORDER.index("allocated"), 4 + _MEMORY_ORDER.index("rss")  # in a sample's values


class Recorder:
    """One rank's recorder: the thread that drains the hooks' queues into its parts (the module's docstring)."""

    def __init__(self, state: HotState, rank: int, writer: RecordingWriter | None, flush_interval_s: float,
                 recent_events: int = 4096, device: Any = None, device_interval_s: float = 1.0,
                 cuda_timer: Any = None, max_disk: int | None = None, hang_after_s: float = 0.0,
                 hang_after_setup_s: float = 0.0, clock_offset_ns: int | None = None) -> None:
        self.state = state
        self.rank = rank
        self.writer = writer
        self.flush_interval_s = flush_interval_s
        self.device = device  # NvmlDevice or None
        self.device_interval_s = device_interval_s
        self.cuda_timer = cuda_timer
        self.live = LiveViews(recent_events)  # what live clients read (the endpoint, latest_step_figures)
        self.out = Outbox(writer, self.live, max_disk, lambda message: self._recording_notice("info", message))
        self.keeper = self.out.keeper  # ZEROMON_MAX_DISK: which steps' collectives and phase spans go to the file
        # perf_counter_ns -> Unix ns, for the recorder and its parts alike (given: a test's fixed clock). One pair:
        # the two clocks drift by parts per million at most.
        self.clock_offset_ns = clock_offset_ns if clock_offset_ns is not None else time.time_ns() - time.perf_counter_ns()
        self.steps = StepBook(rank, self.clock_offset_ns, cuda_timer, self.out)
        self.collectives = CollectiveRecords(state, rank, cuda_timer, self.clock_offset_ns, self.out, self.steps)
        self.cpu_time_s = 0.0
        self.looks = 0  # the thread's wakeups: passes, and looks that found nothing due
        # The newest raw collectives drained (they hold their groups: let go with them, _forget_groups), and when
        # the newest record drained happened: with what is queued, when the training thread last did something.
        self._recent_raw: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=_RECENT_RAW)
        self._drained_until = time.perf_counter_ns()
        self.progress = ProgressWatch(state, rank, hang_after_s, self._step_durations, hang_after_setup_s)
        self._unseen_checked = False  # check_unseen_collectives has looked
        self._groups_destroyed = state.groups_destroyed
        self._last_device_ns = 0
        self._last_stats_ns = 0
        self._stop = threading.Event()
        # Released (_wake_up) by stop(), a live client's read after a quiet spell and a queue that crowds (the
        # hooks' push, HotState.call_when_crowded); the thread's wait is its acquire. A lock, not an Event: a push
        # releases it with one C call, where an Event's set runs Python code inside the hook.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._watched_ns = -(10**18)  # perf_counter_ns of the last live client's read (watched)
        self._thread: threading.Thread | None = None
        self._drain_lock = threading.Lock()
        self._loss_said = False
        self._hook_places_said: set[str] = set()

    @property
    def events_finalized(self) -> int:
        """The collectives recorded so far."""
        return self.collectives.events_finalized

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        self._check_writer()  # a file that could not be made is said before the first step
        # The one module the thread's records need that the agent's import leaves out (a step summary's row,
        # a snapshot's JSON) is imported here, as the agent starts after init_process_group, not by this
        # thread at the first step's end: an import there holds the GIL while the training runs,
        # and the import lock that the training's own first-use imports take.
        orjson_module()
        self.state.call_when_crowded(_RAW_CROWDED, _CONTROL_CROWDED, self._wake.release)
        self._thread = threading.Thread(target=self._run, name="zeromon-recorder", daemon=True)
        self._thread.start()

    def final_progress(self, how: str) -> RankProgress | None:
        """The progress report the recording's end keeps: where a signal found the rank (a hung rank is stopped
        this way); None at any other end (after an exception or at exit the training thread has left the place
        where it stalled, which its stall's report keeps), or where it cannot be made."""
        if not how.startswith("signal "):
            return None
        try:
            return self.progress_report(how)
        except Exception as exc:  # noqa: BLE001 - the end is written without it
            self.state.hook_error("progress", exc)
            return None

    def stop(self, timeout_s: float = 5.0, how: str = "exit", detail: str | None = None,
             progress: RankProgress | None = None) -> None:
        """Drain everything, finalize what is left, write stats, ``progress`` (final_progress, made by the caller
        before it let go of the model; made here where not given) and the end record (``how`` the rank ended:
        RunEnd.how), close the file. Idempotent."""
        self._stop.set()
        self._wake_up()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
        with self._drain_lock:
            try:
                self._drain(final=True)
                self.check_unseen_collectives()  # a run too short for the passes to have looked
                progress = progress if progress is not None else self.final_progress(how)
                if progress is None and self.progress.tick(self.last_activity(), time.perf_counter_ns()) == RESUMED:
                    # It went on after a stall since the last pass: said, or the stall would be its last word.
                    progress = self.progress_report(RESUMED)
                if progress is not None:
                    self._write_progress(progress)
                kept = self.keeper.close()
                if kept is not None:
                    self._recording_notice("info", kept)
            finally:  # the end record is written whatever the drain met
                self._say_hook_errors()
                writer = self.writer
                if writer is not None:
                    writer.write(self.stats())  # past ZEROMON_MAX_DISK too: the room for the end holds it
                    end = RunEnd(rank=self.rank, t_ns=time.time_ns(), how=how,
                                 last_step=self.steps.emitted_through if self.steps.emitted_through >= 0 else None,
                                 records_lost=writer.records_lost, bytes_lost=writer.bytes_lost,
                                 detail=detail, write_error=writer.error)
                    writer.close(end)
                    self._check_writer()
                # Held past the stop (the agent lives on in atexit's list), the groups kept their gloo worker
                # threads into the interpreter's exit, where gloo can abort a finished rank.
                self._forget_groups()
                self.progress.release()

    def watched(self) -> None:
        """A live client read this rank (its endpoint's /metrics or snapshot): passes come every LIVE_PASS_S
        while reads go on, and a read after a quiet spell wakes one now."""
        now = time.perf_counter_ns()
        quiet = now - self._watched_ns >= WATCHED_S * 1e9
        self._watched_ns = now
        if quiet:
            self._wake_up()

    def _wake_up(self) -> None:
        """The thread's next pass now (its wait's lock released), where no wake is pending already."""
        try:
            self._wake.release()
        except RuntimeError:  # released already: a wake is pending
            pass

    def _run(self) -> None:
        cpu0 = time.thread_time()
        every = min(self.flush_interval_s, LIVE_PASS_S)
        wait = min(every, _FIRST_PASS_S)
        flush_ns = round(self.flush_interval_s * 1e9)
        watched_ns = WATCHED_S * 1e9
        state = self.state
        last_flush = None  # the first pass flushes: the run's header and info reach the file as training starts
        while True:
            self._wake.acquire(True, wait)  # a wake (_wake_up, a crowded queue) or the wait's end
            if self._stop.is_set():
                break
            self.looks += 1
            now = time.perf_counter_ns()
            # Half a pass early: a flush due between two wakeups is made at the first of them.
            flush = last_flush is None or now - last_flush >= flush_ns - every * 5e8
            watched = now - self._watched_ns < watched_ns
            due = (flush or watched or self.cuda_timer is not None
                   or len(state.raw) >= state.raw_capacity * _RAW_CROWDED
                   or len(state.control) >= _CONTROL_CROWDED)
            try:
                self._watch_progress(now)
                if not due:  # nobody reads, nothing crowds, no flush due: NVML every device_interval_s all the same
                    if self.device is not None:
                        with self._drain_lock:
                            self._sample_device()
                    continue
                with self._drain_lock:
                    self._drain(final=False)
                    self._sample_device()
                    now = time.perf_counter_ns()
                    if now - self._last_stats_ns > 10_000_000_000:
                        self._last_stats_ns = now
                        self.out.write(self.stats())
                    if flush:  # with no file too: a rank nobody reads is drained at the flush interval
                        last_flush = now
                    if self.writer is not None:
                        if flush:
                            self.writer.flush()
                            self._check_writer()
                        self.keeper.check_size()
                    self._say_hook_errors()
                    self.check_unseen_collectives()
            except Exception as exc:  # noqa: BLE001 - the recorder must never take training down
                self.state.hook_error("recorder", exc)
            finally:
                wait = self._next_look_s(every, watched, last_flush, flush_ns)
                self.cpu_time_s = time.thread_time() - cpu0

    def _next_look_s(self, every: float, watched: bool, last_flush: int | None, flush_ns: int) -> float:
        """How long the thread waits for its next look: ``every`` (LIVE_PASS_S at most) while a live client reads
        the rank, on a GPU (its timing pool, NVML's samples) and while the rank is stalled (its resumption is said
        within a pass); else until the next flush is due or until a stall could first be named, whichever comes
        first. Each wakeup costs the thread a timer's round trip through the kernel (~0.1 ms of CPU on this
        project's virtual machine: tests/bench/RESULTS.md), so a rank nobody reads is looked at when there is
        something to do; a queue that crowds meanwhile wakes it (HotState.call_when_crowded)."""
        try:
            progress = self.progress
            if watched or self.cuda_timer is not None or self.device is not None or last_flush is None \
                    or progress.stalled_at is not None:
                return every
            now = time.perf_counter_ns()
            look_ns = min(last_flush + flush_ns - now, progress.progress_perf + progress.threshold() * 1e9 - now)
            return max(_SOONEST_LOOK_S, look_ns / 1e9)
        except Exception as exc:  # noqa: BLE001 - as a pass's
            self.state.hook_error("recorder", exc)
            return every

    # --- progress ---------------------------------------------------------------------------------
    def last_activity(self) -> int:
        """perf_ns of the newest thing the training thread did that the agent sees (a collective issued or waited
        on, a phase or step boundary, a memory sample): the newest record queued, else the newest drained. From
        any thread: a queue's last record is read in one C call."""
        newest = self._drained_until
        for queue in (self.state.raw, self.state.control):
            try:
                item = queue[-1]
            except IndexError:
                continue
            newest = max(newest, item[RAW_TIME_AT[item[0]]])
        return newest

    def _watch_progress(self, now: int) -> None:
        """Once a pass: has the training thread done anything since the last? A stall past the threshold, and
        the progress after it, are written at once (a report, a notice) and flushed: a rank killed later keeps them."""
        said = self.progress.tick(self.last_activity(), now)
        if said is None:
            return
        with self._drain_lock:
            self._drain(final=False)
            report = self.progress_report(said)
            self._write_progress(report)
            message = progress_notice(report)
            if message is not None:
                self._recording_notice("warning" if said == STALLED else "info", message, source="progress")
            if self.writer is not None:
                self.writer.flush()

    def progress_report(self, reason: str) -> RankProgress:
        """This rank's progress now (zeromon.model.progress), from any thread."""
        # Newest first: what the training thread queued since the last drain, then what was drained. Each copy is
        # one C call, which no other thread interleaves with (a Python loop over a queue another thread pushes to
        # would fail); the queue's newest _RECENT_RAW are enough.
        queued = self.state.raw.newest(_RECENT_RAW)
        drained = list(reversed(self._recent_raw))
        recent = [item for item in queued + drained if item[0] == RAW_COLLECTIVE]
        # In flight: what the recorder has not seen complete, and what it has not drained yet of the collectives a
        # GPU times (their events say when they complete; a just-launched one usually has not).
        inflight = set(self.collectives.inflight) | {item[AT_SEQ] for item in queued
                                                       if item[0] == RAW_COLLECTIVE and item[AT_CUDA]}
        return self.progress.report(reason, recent, inflight, self.last_activity())

    def say_progress(self, reason: str) -> None:
        """Write this rank's progress now and flush it (a signal the main thread cannot handle yet)."""
        with self._drain_lock:
            self._drain(final=False)
            self._write_progress(self.progress_report(reason))
            if self.writer is not None:
                self.writer.flush()

    def _write_progress(self, report: RankProgress) -> None:
        self.out.write(ProgressReport(rank=self.rank, t_ns=report.t_ns, reason=report.reason, report=report.to_dict()))

    def _step_durations(self) -> list[float]:
        return self.live.step_durations(64)

    def _check_writer(self) -> None:
        """Say once, in a Notice and the log, that the recording stopped being written."""
        writer = self.writer
        if self._loss_said or writer is None or writer.error is None:
            return
        self._loss_said = True
        message = (f"{writer.error}; the recording stops here (what follows is counted as lost: "
                   "zeromon_recording_lost_records_total); training and the live endpoint go on")
        log.warning("zeromon: rank %d: %s", self.rank, message)
        self.live.add_notice(Notice(rank=self.rank, t_ns=time.time_ns(), level="error", source="recording",
                                    message=message))

    def check_unseen_collectives(self) -> None:
        """Once, when UNSEEN_CHECK_STEPS steps are summarized: say so if the process groups counted far more
        collectives than zeromon recorded (at least one a step, and more than it saw). Those were issued where
        the patch of torch.distributed cannot see them (from C++: DDP's reducer of a DDP module not found in
        what zeromon watches, a builtin comm hook, an extension), and every figure and piece of advice leaves
        them out. A few unseen are usual (an object collective is two or three to the backend)."""
        if self._unseen_checked or self.steps.emitted_through + 1 < UNSEEN_CHECK_STEPS:
            return
        self._unseen_checked = True
        issued = issued_in_all_groups()
        recorded = self.state.seq
        if issued is None or issued - recorded < max(self.steps.emitted_through + 1, recorded, 1):
            return
        run_info = self.live.run_info
        framework = run_info.framework if run_info is not None else "unknown"
        self._recording_notice("warning", (
            f"the process groups counted {issued:,} collectives and zeromon recorded {recorded:,}: "
            f"{issued - recorded:,} were issued where its patch of torch.distributed does not see them (from C++: "
            f"DDP's reducer, a builtin comm hook, an extension). Communication, exposed time and advice leave "
            f"them out. Framework found: {framework}; if a trainer wraps the model, give zeromon_agent.attach"
            "(model=...) the module that holds the DDP or FSDP module"), source="collectives")

    def _recording_notice(self, level: str, message: str, source: str = "recording") -> None:
        """A Notice (about the recording itself, by default) from the recorder's thread (the drain lock held)."""
        record = Notice(rank=self.rank, t_ns=time.time_ns(), level=level, source=source, message=message)
        self.live.add_notice(record)
        if self.writer is not None:  # past ZEROMON_MAX_DISK too: it says so
            self.writer.write(record)

    def _say_hook_errors(self) -> None:
        """A Notice for each place whose hook raised, once per place (HotState.hook_error counts every
        error and logs each place once; its set of places is read here, off the training thread)."""
        try:
            places = set(self.state._logged) - self._hook_places_said
        except RuntimeError:  # the set grew while copied: next pass
            return
        for where in sorted(places):
            self._hook_places_said.add(where)
            record = Notice(rank=self.rank, t_ns=time.time_ns(), level="warning", source="hooks",
                            message=f"an error in zeromon's {where} hook: training goes on, zeromon's "
                                    "hook errors count it (and any more)")
            self.live.add_notice(record)
            self.out.write(record)

    # --- output -----------------------------------------------------------------------------------
    def unix(self, perf_ns: int) -> int:
        return perf_ns + self.clock_offset_ns

    def stats(self) -> AgentStats:
        writer = self.writer
        return AgentStats(rank=self.rank, t_ns=time.time_ns(), events_recorded=self.state.recorded,
                          events_dropped=self.state.dropped, hook_errors=self.state.hook_errors,
                          cpu_time_s=round(self.cpu_time_s, 6),
                          records_lost=writer.records_lost if writer is not None else None,
                          bytes_lost=writer.bytes_lost if writer is not None else None)

    def notice(self, level: str, source: str, message: str) -> None:
        record = Notice(rank=self.rank, t_ns=time.time_ns(), level=level, source=source, message=message)
        self.live.add_notice(record)
        with self._drain_lock:
            self.out.write(record)

    def set_run_info(self, info: RunInfo) -> None:
        self.live.set_run_info(info)
        with self._drain_lock:
            self.out.write(info)

    # --- draining ---------------------------------------------------------------------------------
    def _drain(self, final: bool) -> None:
        # Control records first: every collective issued before a step ended is already in the raw
        # queue by then, so the step's summary, made at the end of this pass, includes it.
        # Take what is queued now, no more: a producer faster than this thread must not keep one
        # pass going (and its step summaries waiting) forever; the rest is dropped at the queue.
        destroyed = self.state.groups_destroyed  # read first: a destroyed group's collectives are all in this pass
        items = self.state.control.take()
        collectives = self.state.raw.take()
        for drained in (items, collectives):
            if drained:
                self._drained_until = max(self._drained_until, drained[-1][RAW_TIME_AT[drained[-1][0]]])
        self._recent_raw.extend(collectives[-_RECENT_RAW:])  # the newest: the deque keeps no more
        self._dispatch(items)
        if collectives and self._all_sync(collectives):  # every collective on gloo: a column at a time
            for start in range(0, len(collectives), _BATCH):
                if start:
                    self.out.release()  # as _dispatch does every 256 records
                    time.sleep(0)
                batch = collectives[start:start + _BATCH]
                if not self.collectives.finalize_sync_batch(batch):
                    self._dispatch(batch)
        elif collectives:  # what of the rest can be, a column at a time (a GPU's launches, async host collectives)
            self.collectives.finalize_pass(collectives, self._dispatch)
        self.collectives.check_inflight(final)
        self.steps.resolve_spans(final)
        self.steps.emit_steps(final, self.collectives.inflight_steps())
        self.out.release()
        if destroyed != self._groups_destroyed:
            self._groups_destroyed = destroyed
            self._forget_groups()

    def let_go_of_groups(self) -> None:
        """The default group was destroyed (Agent.let_go_of_training): what is queued drained now, as at the stop
        (nothing waits for a completion or a GPU any more); the drain, seeing the destroy counted, lets go of every
        group the recorder keeps, so that none outlives the script's teardown because of zeromon. The recording
        stays open."""
        with self._drain_lock:
            self._drain(final=True)

    def _forget_groups(self) -> None:
        """Let go of the process groups kept by object (their sizes, and the shapes of calls on them): after a
        destroy_process_group, and at the stop. They are found again at their next collective."""
        self.collectives.forget_groups()
        self._recent_raw.clear()

    def _all_sync(self, items: list[tuple[Any, ...]]) -> bool:
        """Whether ``items`` are all synchronous host collectives of steps not yet summarized (the queue's
        whole content on gloo): CollectiveRecords.finalize_sync_batch's, the checks made in C (_batch.c's all_sync,
        one pass over the queue, where built)."""
        if _ALL_SYNC is not None:
            return _ALL_SYNC(items, RAW_COLLECTIVE, self.steps.emitted_through)  # type: ignore[no-any-return]
        return (set(map(_KIND, items)) == {RAW_COLLECTIVE} and not any(map(_ASYNC, items))
                and set(map(_CUDA, items)) == {None} and min(map(_STEP, items)) > self.steps.emitted_through)

    def _dispatch(self, items: list[tuple[Any, ...]]) -> None:
        """Each raw record in turn, by its kind."""
        sleep, emitted, finalize_sync = time.sleep, self.steps.emitted_through, self.collectives.finalize_sync
        # The other kinds' handlers (the StepBook's are the host's where there is no GPU).
        steps, collectives = self.steps, self.collectives
        handlers = {RAW_PHASE: steps.on_phase, RAW_MEMORY: self._on_memory, RAW_AGENT: steps.on_agent,
                    RAW_STEP_END: steps.on_step_end, RAW_STEP_START: steps.on_step_start,
                    RAW_WAIT: collectives.on_wait, RAW_DONE: collectives.on_done,
                    RAW_SEEN_DONE: collectives.on_seen_done, RAW_OOM: self._on_oom}
        # A run of phase changes, agent spans, step boundaries and the agent's memory samples on the host (no GPU) in
        # one call (_host.c's host_phases: the host handlers' spans and current phase, each step boundary's Mark on
        # its accumulator, the samples' values and each step's peak, which _take_samples then writes and publishes),
        # else None: the handlers a record at a time.
        host_phases = _HOST_PHASES if steps.host_phases else None
        samples: list[tuple[Any, ...]] = []
        peaks: dict[int, int | None] = {}
        memory = (RAW_MEMORY, samples, peaks, self.rank, self.clock_offset_ns, _MEMORY_N, emitted, PEAK_PHASES,
                  _AT_ALLOCATED - 4, _AT_RSS - 4)
        bounds = (RAW_STEP_START, RAW_STEP_END, steps.accs, new_acc, Mark, time.perf_counter_ns)
        index, n, give_at = 0, len(items), _YIELD_EVERY
        while index < n:
            if index >= give_at:
                # Hand the GIL back: a waiting training thread would otherwise wait until the
                # interpreter's switch interval forces it, stretching whatever it was timing.
                # What was published so far goes to live clients first: a long pass holds the lock
                # (and the GIL) for 256 records' worth of live totals at a time, not for all of them.
                give_at = index + _YIELD_EVERY
                self.out.release()
                sleep(0)
            item = items[index]
            kind = item[0]
            if kind == RAW_COLLECTIVE:
                # Synchronous, on the host, of a step not yet summarized (every collective on gloo): the
                # fast path. emitted_through moves only at the pass's end (StepBook.emit_steps). Bare indices here, the
                # hot loop's (state.AT_ASYNC, AT_CUDA, AT_STEP name them).
                if item[10] or item[14] is not None or item[13] <= emitted or not finalize_sync(item):
                    collectives.on_collective(item)
            elif host_phases is not None and (kind == RAW_PHASE or kind == RAW_AGENT or kind == RAW_MEMORY
                                              or kind == RAW_STEP_END or kind == RAW_STEP_START):
                ran, steps.current = host_phases(items, index, give_at, steps.current, steps.closed, AGENT_PHASE,
                                                 RAW_PHASE, RAW_AGENT, memory, bounds)
                if samples:
                    self._take_samples(samples, peaks)
                if ran > index:
                    index = ran
                    continue
                handlers[kind](item)  # an odd record: its handler says what is wrong
            else:
                handler = handlers.get(kind)
                if handler is not None:
                    handler(item)
            index += 1

    def _on_memory(self, item: tuple[Any, ...]) -> None:
        _, phase, step, t, fields = item
        t_ns = t + self.clock_offset_ns
        if type(fields) is tuple and len(fields) == _MEMORY_N:
            sample: Any = (self.rank, step, phase, t_ns, *fields)  # the agent's: its values in order (memory.watch)
        elif type(fields) is dict and fields.keys() in (_MEMORY_FIELDS, _MEMORY_FIELDS_WALKED):
            sample = (self.rank, step, phase, t_ns, *map(fields.__getitem__, _MEMORY_PLAIN),
                      fields.get("categories", {}))
        else:
            sample = None
        if sample is not None:
            self._write_sample(sample)
            allocated, rss = sample[_AT_ALLOCATED], sample[_AT_RSS]
        else:  # anything else: the constructor says what is wrong
            sample = MemorySample(rank=self.rank, step=step, phase=phase, t_ns=t_ns, **fields)
            self.keeper.detail(sample, step)
            allocated, rss = sample.allocated, sample.rss
        self.out.records.append(sample)
        self.out.memory.append(sample)
        # The step's peak from the samples taken every step: those of the highest moments inside a
        # forward or backward come in walk steps only, and would make a sawtooth of the series.
        if step > self.steps.emitted_through and phase not in PEAK_PHASES:
            level = allocated if allocated is not None else rss
            acc = self.steps.acc(step)
            if level is not None and (acc.peak_memory is None or level > acc.peak_memory):
                acc.peak_memory = level

    def _write_sample(self, sample: tuple[Any, ...]) -> None:
        """A memory sample of the agent's usual values (with or without the categories walked) to the recording: the
        slots set directly, and the values handed to the compact writer as they are (no attribute getter). Live
        clients get the values, the record made when one reads it (materialize): a sample nobody reads makes none."""
        out = self.out
        keeper, writer, write_values = out.keeper, out.writer, out.write_values
        if keeper.level:  # thinned: the keeper holds the record until its step decides
            keeper.detail(_new_memory(sample), sample[1])
        elif writer is not None and keeper.admit() and not (write_values is not None
                                                            and write_values(MemorySample, sample)):
            writer.write(_new_memory(sample))

    def _take_samples(self, samples: list[tuple[Any, ...]], peaks: dict[int, int | None]) -> None:
        """_on_memory's work for the agent's samples of a run that _host.c's host_phases took: ``samples`` their values
        in order, ``peaks`` each step's highest level among them (None: none had one), both emptied here."""
        out = self.out
        if out.keeper.level or out.write_rows is None:
            for sample in samples:
                self._write_sample(sample)
        elif out.keeper.admit(len(samples)):  # the file grows a segment at a time: one answer for the run
            out.write_rows(MemorySample, samples, _new_memory)
        out.records.extend(samples)
        out.memory.extend(samples)
        acc = self.steps.acc
        for step, level in peaks.items():
            step_acc = acc(step)
            if level is not None and (step_acc.peak_memory is None or level > step_acc.peak_memory):
                step_acc.peak_memory = level
        samples.clear()
        peaks.clear()

    def _on_oom(self, item: tuple[Any, ...]) -> None:
        _, t, device, info, snapshot, phase, step = item
        self.live.count_oom()
        self.out.publish(OomEvent(rank=self.rank, step=step, phase=phase, t_ns=self.unix(t), device=device,
                               allocated=info.get("allocated"), requested=info.get("requested"),
                               free=info.get("free"), snapshot_path=snapshot))

    def _sample_device(self) -> None:
        if self.device is None or not self.device_interval_s:
            return
        now = time.perf_counter_ns()
        if now - self._last_device_ns < self.device_interval_s * 1e9:
            return
        self._last_device_ns = now
        reading = self.device.read()
        if reading is None:
            return
        sample = DeviceSample(rank=self.rank, t_ns=time.time_ns(), **reading)
        self.out.publish(sample)
        self.live.set_device(sample)
        self.out.release()
