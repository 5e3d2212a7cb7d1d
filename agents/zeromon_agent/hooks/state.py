"""The state the training-thread hooks touch: kept tiny, read with plain attribute loads.

Hooks queue raw records on two bounded rings (``push(kind, ...)``, the fields of one record); the agent's
background thread takes them as tuples and turns them into events. Queueing never blocks: when a ring is full
its oldest record is dropped and counted.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from zeromon.model.compiled import compiled

log = logging.getLogger("zeromon.agent")

# Raw record kinds (first element of each tuple in HotState.raw).
RAW_COLLECTIVE = 0  # (kind, seq, api, op, t0, t1, bytes_in, bytes_out, dtype, group, async_op, work,
#                     phase, step, cuda, sampled, caller): caller, the file of the code that called the
#                     collective (step_acc.issuer_of: FSDP, DeepSpeed, DDP or the user's; None where not known)
RAW_WAIT = 1  # (kind, seq, t_wait_start, t_wait_end, completed_before_wait, cuda_end_event,
#                cuda_wait_start_event, step at the wait)
RAW_DONE = 2  # (kind, seq, t_done)             a sampled completion callback fired
RAW_SEEN_DONE = 9  # (kind, seq, t)   an async collective was found complete at a phase change: done by t
RAW_PHASE = 3  # (kind, phase, t, step[, cuda_event])   the phase changed at t
RAW_STEP_END = 4  # (kind, step, t, cuda_event, explicit)   step `step` ended at t
RAW_MEMORY = 5  # (kind, phase, step, t, sample_fields)
RAW_OOM = 6  # (kind, t, device, alloc_info, snapshot_path)
RAW_STEP_START = 7  # (kind, step, t, cuda_event, phase)   zeromon_agent.step() opened step `step` at t
RAW_AGENT = 8  # (kind, step, t0, t1, phase)   zeromon's own work on the training thread, back to `phase` at t1
# The positions of a RAW_COLLECTIVE tuple's fields, for the code that reads one outside the recorder's hot loop
# (which indexes by number: a module global costs a look-up per read, a number none).
(AT_SEQ, AT_API, AT_OP, AT_T0, AT_T1, AT_BYTES_IN, AT_BYTES_OUT, AT_DTYPE, AT_GROUP, AT_ASYNC, AT_WORK, AT_PHASE,
 AT_STEP, AT_CUDA, AT_SAMPLED, AT_CALLER) = range(1, 17)
# Where each kind holds the perf_ns time it happened (its end): the newest record says when the training thread
# last did something (zeromon_agent.recorder.progress).
RAW_TIME_AT = {RAW_COLLECTIVE: 5, RAW_WAIT: 3, RAW_DONE: 2, RAW_SEEN_DONE: 2, RAW_PHASE: 2, RAW_STEP_END: 2,
               RAW_MEMORY: 3, RAW_OOM: 1, RAW_STEP_START: 2, RAW_AGENT: 3}


# The mark of a collective issued in a step not timed on the device (HotState.time_step), compared by identity. A
# string, not an instance of a class of its own: the garbage collector tracks such an instance, and with it every
# raw tuple holding it, which then goes through the collector's generations until the recorder drains it; a tuple
# holding only untracked objects is untracked at the collector's first look.
UNTIMED: Any = "UNTIMED"


# A run's first steps are timed on the device more densely than the rest: a run of a few hundred steps gets its
# communication medians and findings from dozens of steps, while a long run pays what 1 step in
# ZEROMON_DEVICE_TIMING_EVERY costs (a timed step's events cost a collective several times an untimed step's
# Python: tests/bench/bench_collective_overhead.py part (f)). A function of the step alone, so that every rank
# times the same steps.
EARLY_STEPS = 256
EARLY_EVERY = 8


def timed_step(step: int, every: int) -> bool:
    """Whether ``step`` is timed on the device with ZEROMON_DEVICE_TIMING_EVERY=``every``: the warm-up (-1), the
    first two steps (the first is compared with none: the report's medians start at step 1), then 1 in
    ``min(every, EARLY_EVERY)`` up to step EARLY_STEPS and 1 in ``every`` from there."""
    if step < 2 or every <= 1:
        return True
    return step % (min(every, EARLY_EVERY) if step < EARLY_STEPS else every) == 0


class DequeRing:
    """The hooks' queue where the C ring (hooks/_ring.c) is not built: the same methods over a deque of tuples.
    A record is held as a tuple until the recorder takes it (the C ring holds its fields with no object a
    record: tests/bench/RESULTS.md, "The hooks' queue as a ring")."""

    __slots__ = ("_queue", "capacity", "width", "dropped", "refused", "_mark", "crowded")

    def __init__(self, capacity: int, width: int) -> None:
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque(maxlen=capacity)
        self.capacity, self.width, self.dropped, self.refused = capacity, width, 0, 0
        self._mark = 0
        self.crowded: Callable[[], Any] | None = None  # call_when's callback

    def push(self, *fields: Any) -> None:
        """Queue a record of ``fields`` (never raises; full, the oldest goes, counted)."""
        if not fields or len(fields) > self.width:
            self.refused += 1
            return
        queue = self._queue
        if len(queue) >= self.capacity:
            self.dropped += 1
            queue.append(fields)
            return
        queue.append(fields)
        if len(queue) == self._mark:
            self._tell_crowded()

    def _tell_crowded(self) -> None:
        """call_when's callback, where there is one; its error is the reader's, not the training's."""
        if self.crowded is not None:
            try:
                self.crowded()
            except Exception:  # noqa: BLE001 - never raised into the hook's push
                pass

    def call_when(self, size: int, callback: Callable[[], Any] | None) -> None:
        """``callback()`` each time a push brings the queue to ``size`` records (None: never)."""
        self._mark, self.crowded = (size, callback) if callback is not None else (0, None)

    def append(self, record: tuple[Any, ...]) -> None:
        self.push(*record)

    def extend(self, records: Iterable[tuple[Any, ...]]) -> None:
        """append of each of ``records``, in one call."""
        given = list(records)
        kept = [record for record in given if 0 < len(record) <= self.width]
        self.refused += len(given) - len(kept)
        before = len(self._queue)
        self.dropped += max(0, before + len(kept) - self.capacity)
        if before < self._mark <= min(before + len(kept), self.capacity):
            self._queue.extend(kept[:self._mark - before])  # to the mark, where push calls the callback
            kept = kept[self._mark - before:]
            self._tell_crowded()
        self._queue.extend(kept)

    def take(self) -> list[tuple[Any, ...]]:
        """Every record queued now, oldest first; what a hook queues meanwhile stays for the next take."""
        popleft = self._queue.popleft
        return [popleft() for _ in range(len(self._queue))]

    def newest(self, n: int) -> list[tuple[Any, ...]]:
        """The ``n`` newest records, newest first (one C call: no hook's push interleaves)."""
        return list(itertools.islice(reversed(self._queue), max(n, 0)))

    def clear(self) -> None:
        self._queue.clear()

    def __len__(self) -> int:
        return len(self._queue)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return self._queue[index]


_ring = compiled("zeromon_agent.hooks._ring")
# The hooks' queue: the C ring where setup.py built it, else the same methods over a deque.
Ring: Any = _ring.Ring if _ring is not None else DequeRing
RAW_WIDTH = 17  # the most fields a raw record has (RAW_COLLECTIVE's)
CONTROL_WIDTH = 8  # a control record's (RAW_OOM's 7)
CONTROL_CAPACITY = 65536


class HotState:
    __slots__ = (
        "enabled",
        "phase",
        "step",
        "seq",
        "raw",
        "control",
        "_crowded",
        "pending",
        "pending_capacity",
        "works",
        "async_sample_every",
        "async_count",
        "hook_errors",
        "_logged",
        "inside",
        "cuda_timing",
        "device_timer",
        "untimed",
        "device_timing_every",
        "autostart",
        "groups_destroyed",
        "on_world_destroyed",
    )

    def __init__(self, raw_capacity: int = 65536) -> None:
        self.enabled = False
        self.phase = "setup"
        self.step = -1
        self.seq = 0
        self.raw: Any = Ring(raw_capacity, RAW_WIDTH)  # collectives, waits and completions
        # Phase changes, step ends, memory samples and OOMs: a few per step, never crowded out by
        # collectives (a lost step end would leave its step open). Bounded all the same.
        self.control: Any = Ring(CONTROL_CAPACITY, CONTROL_WIDTH)
        self._crowded: tuple[float, int, Callable[[], Any]] | None = None  # call_when_crowded's
        # id(Work) -> seq of the async collective that returned it, until it is waited on.
        self.pending: dict[int, int] = {}
        self.pending_capacity = 8192
        # seq -> Work of the async collectives in flight (bounded like pending): looked at, at each phase
        # change, to bound the completion of those that nobody has waited on yet, and by the recorder's poll of
        # one never waited on (the queue names a Work by id: CollectiveRecords._work_of).
        self.works: dict[int, Any] = {}
        self.async_sample_every = 16
        self.async_count = 0
        self.hook_errors = 0
        self._logged: set[str] = set()
        # True while inside a recorded collective: deprecated aliases call the new names through
        # module globals, and only the outermost call is recorded. One flag for the process, not
        # per thread (a thread-local's read would cost every call): a collective that a second thread issues
        # while the first is inside one passes through unrecorded.
        self.inside = False
        # On a GPU, the CudaTimer (device_timer) times the collectives and phases of one step in
        # device_timing_every on the stream (timed_step); cuda_timing is it in those steps, None in the
        # others, where untimed (UNTIMED) goes into each collective's record instead of its events.
        self.device_timer: Any = None
        self.cuda_timing: Any = None
        self.untimed: Any = None
        self.device_timing_every = 1
        # `zeromon run`: starts the agent from the first collective when the process group was made
        # by a path whose init_process_group could not be wrapped. Returns True once started.
        self.autostart: Any = None
        # destroy_process_group calls so far: the recorder lets go of the groups it keeps (by object) once it has
        # drained what was queued before the call, so that a destroyed group is not kept alive by zeromon.
        self.groups_destroyed = 0
        # Called (on the thread that destroyed it) once the default group is destroyed: the distributed training
        # is over, and the agent lets go of what it holds of it (Agent.let_go_of_training).
        self.on_world_destroyed: Any = None

    @property
    def dropped(self) -> int:
        """The raw records not kept: let go of by a full ring (its oldest), or refused (more fields than a record
        has: a hook's mistake)."""
        return self.raw.dropped + self.raw.refused  # type: ignore[no-any-return]

    @property
    def control_dropped(self) -> int:
        return self.control.dropped + self.control.refused  # type: ignore[no-any-return]

    @property
    def raw_capacity(self) -> int:
        return self.raw.capacity  # type: ignore[no-any-return]

    @property
    def recorded(self) -> int:
        """The collectives recorded: each took the next seq (one counter fewer on the hot path)."""
        return self.seq

    def resize(self, raw_capacity: int) -> None:
        """A raw ring of ``raw_capacity`` records, what the old one held in it (the newest, where fewer fit). The C
        ring's slots are made at once (the OS gives their pages as they are written); where the process may not have
        them (ZEROMON_BUFFER_EVENTS in the millions, strict overcommit), the deque's, which grows as it fills."""
        try:
            raw = Ring(raw_capacity, RAW_WIDTH)
        except MemoryError:
            raw = DequeRing(raw_capacity, RAW_WIDTH)
        raw.extend(self.raw.take())
        self.raw = raw
        if self._crowded is not None:
            self.call_when_crowded(*self._crowded)

    def call_when_crowded(self, raw_share: float, control_records: int, callback: Callable[[], Any]) -> None:
        """``callback()`` on the pushing thread as the raw ring comes to hold ``raw_share`` of its capacity, or the
        control ring ``control_records``: the recorder, which otherwise looks only when its next pass is due, woken
        as its queues crowd (a C call such as a lock's release: no Python code runs inside the hook's push)."""
        self._crowded = (raw_share, control_records, callback)
        self.raw.call_when(max(1, math.ceil(self.raw.capacity * raw_share)), callback)
        self.control.call_when(control_records, callback)

    def time_step(self) -> None:
        """Whether the step now starting (self.step) is timed on the device: its collectives and phases get
        CUDA events, or go on the host's clock alone, their records marked UNTIMED."""
        timer = self.device_timer
        if timer is not None:
            timed = timed_step(self.step, self.device_timing_every)
            self.cuda_timing = timer if timed else None
            self.untimed = None if timed else UNTIMED

    def hook_error(self, where: str, exc: BaseException) -> None:
        """Count an exception raised inside zeromon; log it once per place. Never raises."""
        try:
            self.hook_errors += 1
            if where not in self._logged:
                self._logged.add(where)
                log.warning("zeromon: error in %s hook (training continues; logged once): %r", where, exc)
        except Exception:  # noqa: BLE001 - the last line of defence must not raise
            pass


STATE = HotState()
perf_ns = time.perf_counter_ns
