"""The recorder's collectives: a raw issue tuple (and its wait, completion callback or CUDA events)
in, a CollectiveEvent out, counted in its step (StepBook) and handed to the recording and the live views
(Outbox).

A synchronous host collective (every one on gloo) takes finalize_sync, or a batch of them
finalize_sync_batch, much cheaper than _finalize's general path; a pass of GPU collectives of steps not
timed on the device and of async host collectives with their waits takes finalize_pass, a column at a time
where it can. tests/test_recorder_fast_path.py checks that they agree. The recorder's thread needs the GIL for all of it, so in a host-bound loop its time
is the training's (tests/bench/bench_gpu_drain.py).
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from zeromon.analysis.bandwidth import MEASURED_TIMINGS, bus_factor, event_bandwidth
from zeromon.model.classes import mutable
from zeromon.model.compiled import compiled
from zeromon.model.events import (
    MAX_SPAN_S,
    CollectiveEvent,
    Timing,
    record_maker,
    span_ns,
)
from zeromon_agent.hooks.issuers import issuer_of
from zeromon_agent.hooks.state import (
    AT_API,
    AT_ASYNC,
    AT_CUDA,
    AT_GROUP,
    AT_SAMPLED,
    AT_SEQ,
    AT_STEP,
    AT_T0,
    AT_T1,
    AT_WORK,
    RAW_COLLECTIVE,
    RAW_DONE,
    RAW_SEEN_DONE,
    RAW_WAIT,
    UNTIMED,
)
from zeromon_agent.live.totals import counted
from zeromon_agent.recorder.step_acc import (
    MAX_STEP_INTERVALS,
    StepAcc,
    add_blocked,
    add_interval,
    meaning_of,
    new_acc,
    seconds,
    settle,
    settle_runs,
    step_runs,
)

if TYPE_CHECKING:
    from zeromon_agent.hooks.state import HotState
    from zeromon_agent.recorder.outbox import Outbox
    from zeromon_agent.recorder.step_book import StepBook

# An async collective nobody waits on is polled for completion after this long.
_POLL_AFTER_NS = 200_000_000
# A sampled completion callback that has not fired this long after the wait is given up on.
CALLBACK_GRACE_NS = 2_000_000_000
_MAX_SHAPES = 4096  # collective call shapes whose derived fields are kept (an FSDP step repeats a few dozen)
# Built once per record, so built with the slots set directly (record_maker).
_new_collective = record_maker(CollectiveEvent)
_SYNC, _UNKNOWN, _LAUNCH = Timing.SYNC.value, Timing.UNKNOWN.value, Timing.LAUNCH.value  # .value read once
_BOUND, _WAIT, _CALLBACK = Timing.BOUND.value, Timing.WAIT.value, Timing.CALLBACK.value
# A batch's calls last less than this (MAX_SPAN_S, in ns: span_ns caps nothing) and are whole nanoseconds
# that ns / 1e9 and back gives again (below 2**50), so their records go into the columns as they are.
_BATCH_MAX_NS = int(MAX_SPAN_S * 1e9)
_add, _sub, _mul, _truediv = operator.add, operator.sub, operator.mul, operator.truediv
_is_not, _and = operator.is_not, operator.and_
_TIMING = operator.itemgetter(5)  # of a finalize_pass row
# finalize_sync_batch's columns made in C (_batch.c), or None: its Python path (zeromon.model.compiled).
_BATCHER = compiled("zeromon_agent.recorder._batch")
# _count_run's count by op in C (_batch.c's count_ops), or None: its loop.
_COUNT_OPS = getattr(_BATCHER, "count_ops", None)
# finalize_sync_batch's step accounting in C (account_sync: _account_sync_run of each run), or None: the loop.
_ACCOUNT_SYNC = getattr(_BATCHER, "account_sync", None)
_BATCH = 256  # records finalize_pass goes through between two gives of the GIL (the recorder's _BATCH)
_WAITED_LATER: Any = object()  # _plan_columns: an async collective finalized at its wait, further on
_PLAN_YIELD = 1024  # records planned between two gives of the GIL (about half a millisecond)
_FEW = 32  # a step's run of collectives this short is counted by op in a loop, a longer one by a Counter
_repeat = itertools.repeat


@mutable
class Inflight:
    raw: tuple[Any, ...]
    wait: tuple[Any, ...] | None = None
    done_ns: int | None = None  # perf ns from a sampled completion callback
    done_by: int | None = None  # perf ns of a phase change at which it was found complete
    launch: bool = False  # on a GPU, of a step not timed on the device: its completion is not known


class CollectiveRecords:
    """The collectives a recorder drains: those in flight until they complete, and each one's record."""

    def __init__(self, state: HotState, rank: int, cuda_timer: Any, clock_offset_ns: int, out: Outbox,
                 steps: StepBook) -> None:
        self.state = state
        self.rank = rank
        self.cuda_timer = cuda_timer
        self.clock_offset_ns = clock_offset_ns  # perf_counter_ns -> Unix ns
        self.out = out
        self.steps = steps
        # The outbox's and the book's parts the loops below touch a record, bound once (they stay the same objects).
        self.keeper, self.writer = out.keeper, out.writer
        self._records, self._counted, self._write_detail = out.records, out.collectives, out.write_detail
        self._accs = steps.accs
        self.events_finalized = 0
        self.inflight: dict[int, Inflight] = {}  # by seq: async collectives, and a GPU's not resolved yet
        # What came for a seq before its issue record was drained (the issue record still queued behind it).
        self._orphan_waits: dict[int, tuple[Any, ...]] = {}
        self._orphan_done: dict[int, int] = {}
        self._orphan_seen: dict[int, int] = {}
        # Kept by the process group's object (let go with it: forget_groups).
        self._group_sizes: dict[Any, int] = {}
        self._group_hosts: dict[Any, bool] = {}
        self._shapes: dict[tuple[Any, ...], tuple[str, int, str, int, float | None, int]] = {}  # _shape
        self._dtype_names: dict[Any, str] = {}

    def forget_groups(self) -> None:
        """Let go of the process groups kept by object (their sizes, and the shapes of calls on them)."""
        self._group_sizes.clear()
        self._group_hosts.clear()
        self._shapes.clear()

    def inflight_steps(self) -> set[int]:
        """The steps the collectives still in flight were issued in."""
        return {entry.raw[AT_STEP] for entry in self.inflight.values()}

    def on_collective(self, item: tuple[Any, ...]) -> None:
        seq, async_op, work, cuda = item[AT_SEQ], item[AT_ASYNC], item[AT_WORK], item[AT_CUDA]
        launch = False
        if cuda is UNTIMED:  # issued in a step not timed on the device
            item = (*item[:14], None, *item[15:])
            cuda = None
            launch = not self._on_host(item[AT_GROUP])
            if launch and not async_op:
                self._finalize(item, None, item[AT_T1] - item[AT_T0], _LAUNCH, wait_perf=item[AT_T0])
                return
        if not async_op or (work is None and not str(item[AT_API]).startswith("funcol.")):
            if cuda is not None and isinstance(cuda, tuple) and cuda[1] is not None:
                self.inflight[seq] = Inflight(raw=item)  # resolved when its CUDA events complete
                return
            t0, t1 = item[AT_T0], item[AT_T1]
            self._finalize(item, t1, t1 - t0, _SYNC, wait_perf=t0)
            return
        entry = Inflight(raw=item, launch=launch)
        wait = self._orphan_waits.pop(seq, None)
        done = self._orphan_done.pop(seq, None)
        entry.wait, entry.done_ns = wait, done
        entry.done_by = self._orphan_seen.pop(seq, None)
        self.inflight[seq] = entry
        self._try_finalize_async(seq, entry)

    def on_wait(self, item: tuple[Any, ...]) -> None:
        seq = item[1]
        entry = self.inflight.get(seq)
        if entry is None:
            if len(self._orphan_waits) < 65536:
                self._orphan_waits[seq] = item  # the issue record is still in the queue behind it
            return
        entry.wait = item
        self._try_finalize_async(seq, entry)

    def on_done(self, item: tuple[Any, ...]) -> None:
        seq = item[1]
        entry = self.inflight.get(seq)
        if entry is None:
            if len(self._orphan_done) < 65536:
                self._orphan_done[seq] = item[2]
            return
        entry.done_ns = item[2]
        self._try_finalize_async(seq, entry)

    def on_seen_done(self, item: tuple[Any, ...]) -> None:
        seq = item[1]
        entry = self.inflight.get(seq)
        if entry is None:
            if len(self._orphan_seen) < 65536:
                self._orphan_seen[seq] = item[2]
            return
        entry.done_by = item[2]

    def _try_finalize_async(self, seq: int, entry: Inflight, now: int | None = None) -> bool:
        item, wait = entry.raw, entry.wait
        sampled = item[AT_SAMPLED]
        if wait is None:
            return False
        _, _, w0, w1, done_before, cuda_end, cuda_wait, wait_step = wait
        cuda = item[AT_CUDA]
        if cuda is not None and self.cuda_timer is not None and cuda_end is not None:
            resolved = self.cuda_timer.resolve(cuda[0], cuda_end)
            if resolved is None and not (now is not None and now - w1 > CALLBACK_GRACE_NS):
                return False
            del self.inflight[seq]
            if resolved is not None:
                # The stream waited from the event before the wait to the one after it.
                waited = self.cuda_timer.resolve_one(cuda_wait)
                stream_wait = None if waited is None else (waited, max(0, resolved[1] - waited) / 1e9)
                self._finalize(item, None, w1 - w0, Timing.CUDA_EVENT.value, unix_span=resolved,
                               extra_event=cuda_end, wait_perf=w0, wait_step=wait_step, stream_wait=stream_wait,
                               wait_event=cuda_wait)
            else:  # at exit, or a GPU that never got there: the host's wait times stand in
                self._finalize(item, w1, w1 - w0, Timing.WAIT.value, extra_event=cuda_end, wait_perf=w0, wait_step=wait_step,
                               wait_event=cuda_wait)
            return True
        if cuda_wait is not None and self.cuda_timer is not None:
            self.cuda_timer.release(cuda_wait)  # its end event was not to be had (the pool ran dry)
        if entry.launch and entry.done_ns is None:  # a GPU collective's wait on the host: not its completion
            del self.inflight[seq]
            self._finalize(item, None, w1 - w0, _LAUNCH, wait_perf=w0, wait_step=wait_step)
            return True
        if sampled and entry.done_ns is None and (now is None or now - w1 < CALLBACK_GRACE_NS):
            return False  # the exact completion time is on its way
        del self.inflight[seq]
        blocked = w1 - w0
        if entry.done_ns is not None:
            self._finalize(item, entry.done_ns, blocked, Timing.CALLBACK.value, wait_perf=w0, wait_step=wait_step)
        elif done_before:  # done by the wait's start, or by an earlier phase change where it was seen done
            done_by = w0 if entry.done_by is None else min(w0, entry.done_by)
            self._finalize(item, done_by, blocked, Timing.BOUND.value, wait_perf=w0, wait_step=wait_step)
        else:
            self._finalize(item, w1, blocked, Timing.WAIT.value, wait_perf=w0, wait_step=wait_step)
        return True

    def check_inflight(self, final: bool) -> None:
        if not self.inflight:
            return
        now = time.perf_counter_ns()
        for seq, entry in list(self.inflight.items()):
            item = entry.raw
            if entry.wait is not None:
                if self._try_finalize_async(seq, entry, now=now if not final else now + CALLBACK_GRACE_NS):
                    continue
            cuda = item[AT_CUDA]
            if cuda is not None and isinstance(cuda, tuple) and cuda[1] is not None and self.cuda_timer is not None:
                resolved = self.cuda_timer.resolve(cuda[0], cuda[1])
                if resolved is not None:
                    del self.inflight[seq]
                    # A synchronous collective on CUDA: the stream waits for it from start to end.
                    self._finalize(item, None, item[AT_T1] - item[AT_T0], Timing.CUDA_EVENT.value,
                                   unix_span=resolved, wait_perf=item[AT_T0],
                                   stream_wait=(resolved[0], (resolved[1] - resolved[0]) / 1e9))
                elif final:
                    del self.inflight[seq]
                    self._finalize(item, item[AT_T1], item[AT_T1] - item[AT_T0], Timing.SYNC.value, wait_perf=item[AT_T0])
                continue
            if entry.wait is not None:
                continue
            work = item[AT_WORK]
            age = now - item[AT_T0]
            if work is not None and (age > _POLL_AFTER_NS or final):
                live, work_id = self._work_of(seq, work)
                try:
                    # A Work not to be had (dropped unwaited, or a GPU launch's) is done as far as anyone can know.
                    completed = True if live is None else bool(live.is_completed())
                except Exception:  # noqa: BLE001
                    completed = True
                if completed and not final and work_id is not None and not self._claim_pending(seq, work_id) \
                        and age < _POLL_AFTER_NS + CALLBACK_GRACE_NS:
                    if entry.done_by is None and live is not None:
                        entry.done_by = now  # seen done: a bound on its end, if the wait started later
                    continue  # the training is in its wait, whose record is queued behind this pass's drain
                if completed or final:
                    del self.inflight[seq]
                    self._forget_pending(seq, work_id)
                    if entry.done_ns is not None:
                        self._finalize(item, entry.done_ns, 0, Timing.CALLBACK.value)
                    elif entry.launch:
                        self._finalize(item, None, 0, _LAUNCH)
                    elif entry.done_by is not None:
                        self._finalize(item, min(now, entry.done_by), 0, Timing.BOUND.value)
                    elif live is None:  # gone unwaited, or not held: when it completed was not seen
                        self._finalize(item, None, 0, Timing.UNKNOWN.value)
                    else:
                        self._finalize(item, now if completed else None, 0,
                                       Timing.POLL.value if completed else Timing.UNKNOWN.value)
            elif work is None and (age > _POLL_AFTER_NS * 10 or final):
                # A functional collective whose result was never waited on through wait_tensor: its pending
                # entry goes too (else a later tensor at the same address would take its wait).
                del self.inflight[seq]
                self._forget_pending(seq, None)
                self._finalize(item, None, 0, Timing.UNKNOWN.value)

    def _work_of(self, seq: int, work: Any) -> tuple[Any, int | None]:
        """(the Work object, its id) of an async collective's raw ``work``: the id the hooks record (an int, which
        the garbage collector does not track, so that a queued record is not walked through its generations),
        the Work itself the hot path's (HotState.works: a host collective's, until a phase change sees it done
        or its wait starts; CudaTimer.refs: one timed with CUDA events, weakly, until its wait; None otherwise).
        A weak reference or a Work in ``work``: a record queued by an agent of another version (a test's)."""
        if type(work) is int:
            live = self.state.works.get(seq)
            if live is None and self.cuda_timer is not None:  # one timed with CUDA events, held weakly till its wait
                live = self.cuda_timer.refs.get(seq)
                if type(live) is weakref.ReferenceType:
                    live = live()
            return live, work
        if type(work) is weakref.ReferenceType:
            work = work()
            return work, None if work is None else id(work)
        return work, id(work)

    def _claim_pending(self, seq: int, work_id: int) -> bool:
        """Take ``seq`` from the hot path's pending waits (by its Work's id), so that no wait of its Work is recorded
        after the poll finalizes it; False where a wait took it first (or it was never there: a full table)."""
        pending = self.state.pending
        taken = pending.pop(work_id, None)  # one atomic step: the training thread's wait pops the same key
        if taken is not None and taken != seq:
            pending[work_id] = taken
        return taken == seq

    def _forget_pending(self, seq: int, work_id: int | None) -> None:
        """Drop ``seq`` from the hot path's pending waits (by its Work's id; by value when the Work is gone)."""
        if work_id is not None:
            self._claim_pending(seq, work_id)
            return
        pending = self.state.pending
        for key in [key for key, value in list(pending.items()) if value == seq]:  # rare: a Work dropped unwaited
            pending.pop(key, None)

    def _group_size(self, group: Any) -> int:
        try:
            return self._group_sizes[group]
        except (KeyError, TypeError):
            pass
        size = -1
        try:
            import torch.distributed as dist

            if isinstance(group, tuple) and group and group[0] == "funcol":
                import torch.distributed._functional_collectives as funcol
                from torch.distributed.distributed_c10d import _resolve_process_group

                size = _resolve_process_group(funcol._resolve_group_name(group[1])).size()
            else:
                size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        except Exception:  # noqa: BLE001
            size = -1
        try:
            if len(self._group_sizes) < 1024:
                self._group_sizes[group] = size
        except TypeError:
            pass
        return size

    def _on_host(self, group: Any) -> bool:
        """Whether the collectives of ``group`` run on the host (gloo alone), where a call's and a wait's host
        times are its own: a gloo group of a GPU job."""
        try:
            return self._group_hosts[group]
        except (KeyError, TypeError):
            pass
        try:
            import torch.distributed as dist

            if isinstance(group, tuple):  # a functional collective's group name
                on_host = False
            else:
                on_host = str(dist.get_backend(group)) == "gloo"
        except Exception:  # noqa: BLE001 - a group being destroyed, a backend that cannot say: the GPU's
            on_host = False
        try:
            if len(self._group_hosts) < 1024:
                self._group_hosts[group] = on_host
        except TypeError:
            pass
        return on_host

    def _dtype(self, dtype: Any) -> str:
        name = self._dtype_names.get(dtype)
        if name is None:
            name = "" if dtype is None else str(dtype).replace("torch.", "")
            self._dtype_names[dtype] = name
        return name

    def _finalize(self, item: tuple[Any, ...], complete_perf: int | None, blocked_ns: int, timing: str,
                  unix_span: tuple[int, int] | None = None, extra_event: Any = None,
                  wait_perf: int | None = None, stream_wait: tuple[int, float] | None = None,
                  wait_event: Any = None, wait_step: int | None = None) -> None:
        """``stream_wait`` (GPU): when the CUDA stream began waiting for the collective and how long;
        it replaces the host's wait, since on GPU it is the stream that cannot compute meanwhile.
        ``wait_step``: the step the thread was in when it waited, if not the one it issued in."""
        (_, seq, api, op, t0, t1, b_in, b_out, dtype, group, async_op, _work, phase, step, cuda,
         _sampled, caller) = item
        if self.cuda_timer is not None and (cuda is not None or extra_event is not None or wait_event is not None):
            # Every CUDA event of this collective goes back to the pool, whichever path finished it.
            self.cuda_timer.release(*(cuda or ()), extra_event, wait_event)
            self.cuda_timer.awaiting.discard(seq)  # finalized without a wait (polled, or at exit)
            self.cuda_timer.refs.pop(seq, None)
        if async_op and self.cuda_timer is not None:  # one of a step not timed on the device, never waited on
            self.cuda_timer.untimed_waits.discard(seq)
        complete_ns: int | None
        offset = self.clock_offset_ns  # self.unix(), inline
        wait_ns = wait_perf + offset if wait_perf is not None else None
        if stream_wait is not None:
            wait_ns, stream_blocked_s = stream_wait
            blocked_s = round(stream_blocked_s, 9)
        else:
            blocked_s = seconds(blocked_ns)
        if unix_span is not None:
            issue_ns, complete_ns = unix_span
        else:
            issue_ns = t0 + offset
            complete_ns = complete_perf + offset if complete_perf is not None else None
        nbytes = max(b_in, b_out)
        dtype_name = self._dtype_names.get(dtype)
        event = _new_collective((
            seq, self.rank, step, phase, op, api, b_in, b_out,
            dtype_name if dtype_name is not None else self._dtype(dtype), self._group_size(group), bool(async_op),
            issue_ns, complete_ns, blocked_s, timing, meaning_of(op, phase, nbytes, issuer_of(caller)), wait_ns,
            seconds(t1 - t0)))
        self.events_finalized += 1
        self._publish_collective(event)
        # Counted in the step it was issued in; its time in every step it spans (waited on in a later
        # step, or issued in the warm-up and waited on in the first step).
        emitted = self.steps.emitted_through
        last = max(step, wait_step if wait_step is not None else step)
        if step > emitted:
            acc = self.steps.acc(step)
            acc.collectives += 1
            acc.comm_bytes += nbytes
            acc.by_op[op] = acc.by_op.get(op, 0) + nbytes
            if timing == _LAUNCH:
                acc.device_untimed = True
            if last == step:  # the usual case, in one step: _account's work without its look-ups
                if complete_ns is not None:
                    add_interval(acc, (issue_ns, max(issue_ns, complete_ns)))
                blocked = event.blocked_interval_ns
                if blocked is not None:
                    add_blocked(acc, blocked)
                if async_op and (issued := event.issue_interval_ns) is not None:
                    add_blocked(acc, issued)
                return
        if last > emitted:
            if timing == _LAUNCH:
                for s in range(max(step, emitted + 1), last + 1):
                    self.steps.acc(s).device_untimed = True
            if complete_ns is not None:
                for s in range(max(step, emitted + 1), last + 1):
                    add_interval(self.steps.acc(s), (issue_ns, max(issue_ns, complete_ns)))
            blocked = event.blocked_interval_ns
            issued = event.issue_interval_ns if async_op else None  # a synchronous call's is its wait
            for interval, into in ((blocked, last), (issued, step)):
                if interval is not None and into > emitted:
                    add_blocked(self.steps.acc(into), interval)

    def finalize_sync(self, item: tuple[Any, ...]) -> bool:
        """_finalize of a synchronous host collective of a step not yet summarized (every collective on
        gloo): the same event, record, live counts and step accounting, with what depends only on the
        call's shape (dtype name, group size, meaning, bus factor) looked up once per shape, and the
        record's values handed to the writer as they are. Much cheaper than _finalize's general path
        (tests/test_recorder_fast_path.py checks they agree). False: not taken (an unhashable group)."""
        (_, seq, api, op, t0, t1, b_in, b_out, dtype, group, _, _, phase, step, _, _, caller) = item
        try:
            shape = self._shapes.get((op, phase, b_in, b_out, dtype, group, caller))
        except TypeError:
            return False
        if shape is None:
            shape = self._shape(op, phase, b_in, b_out, dtype, group, caller)
        dtype_name, group_size, meaning, nbytes, factor, size = shape
        offset = self.clock_offset_ns
        issue_ns, complete_ns, length = t0 + offset, t1 + offset, t1 - t0
        blocked_s = length / 1e9  # seconds(): round(ns / 1e9, 9)
        values = (seq, self.rank, step, phase, op, api, b_in, b_out, dtype_name, group_size, False, issue_ns,
                  complete_ns, blocked_s, _SYNC, meaning, issue_ns, blocked_s)
        event = _new_collective(values)
        self.events_finalized += 1
        self._write_detail(CollectiveEvent, values, event, step)
        # Live: event.duration_s, and event_bandwidth's busbw ((size / seconds) * factor, in its order).
        duration = max(0.0, blocked_s)
        busbw = size / blocked_s * factor if duration and factor is not None and size > 0 else None
        self._records.append(event)
        self._counted.append((op, meaning, nbytes, blocked_s, duration, busbw))
        acc = self._accs.get(step)
        if acc is None:
            acc = self._accs[step] = new_acc()
        acc.collectives += 1
        acc.comm_bytes += nbytes
        acc.by_op[op] = acc.by_op.get(op, 0) + nbytes
        add_interval(acc, (issue_ns, complete_ns if complete_ns > issue_ns else issue_ns))
        if blocked_s > 0:  # event.blocked_interval_ns
            add_blocked(acc, (issue_ns, issue_ns + span_ns(blocked_s)))
        return True

    def finalize_pass(self, items: list[tuple[Any, ...]], dispatch: Callable[[list[tuple[Any, ...]]], None]) -> None:
        """A pass's raw collectives and waits, finalized a column at a time where they can be, as finalize_sync_batch
        finalizes a pass of gloo's synchronous ones:
        - a GPU collective of a step not timed on the device (timing ``launch``: most of a GPU run's), a
          synchronous one at its call, an async one at its wait in this pass and step;
        - an async collective timed on the host (gloo's: DDP's buckets), at its wait in this pass and step, when no
          phase change timed it (timing ``bound`` or ``wait``); a sampled one (1 in ZEROMON_ASYNC_SAMPLE_EVERY) when
          its completion callback's record is in this pass too, at the wait or the record, whichever comes last
          (timing ``callback``).
        The other records go through ``dispatch`` (the general path) in their place, in runs. Records, live counts
        and step accounting are those of the general path (tests/test_recorder_fast_path.py)."""
        plan = self._plan_columns(items)
        rows: list[tuple[Any, ...]] = []  # collectives to finalize, or
        general: list[tuple[Any, ...]] = []  # records for the general path: one of the two is empty
        for index, (item, planned) in enumerate(zip(items, plan, strict=True)):
            if index and not index % _BATCH:  # what came before, and the GIL, handed on every 256 records
                if rows:
                    self._finalize_rows(rows)
                    rows = []
                if general:
                    dispatch(general)
                    general = []
                self.out.release()
                time.sleep(0)
            if planned is None:
                if rows:
                    self._finalize_rows(rows)
                    rows = []
                general.append(item)
                continue
            if general:
                dispatch(general)
                general = []
            if planned is not _WAITED_LATER:
                rows.append(planned)
        if rows:
            self._finalize_rows(rows)
        if general:
            dispatch(general)

    def _plan_columns(self, items: list[tuple[Any, ...]]) -> list[Any]:
        """For each of ``items``: (raw, blocked ns, the wait's perf ns, shape, completion perf ns or None, timing)
        where finalize_pass finalizes a collective, _WAITED_LATER at an async one finalized at its wait, None
        for the general path."""
        emitted, shapes, on_host, new_shape = self.steps.emitted_through, self._shapes, self._on_host, self._shape
        # What came for a seq before its issue record: the general path's on_collective takes it.
        early_waits, early_done, early_seen = self._orphan_waits, self._orphan_done, self._orphan_seen
        early = bool(early_waits or early_done or early_seen)
        plan: list[Any] = [None] * len(items)
        issued: dict[int, tuple[int, Any]] = {}  # seq -> (index, shape) of an async collective, until its wait
        # A sampled one's completion callback record (seq -> (index, perf ns)), before its wait; and a sampled one
        # waited on before its callback's record came (seq -> (issue index, wait index, shape, w0, w1)).
        dones: dict[int, tuple[int, int]] = {}
        waited: dict[int, tuple[int, int, Any, int, int]] = {}
        for index, item in enumerate(items):
            if index and not index % _PLAN_YIELD:
                time.sleep(0)  # the GIL, to the training (nothing here is the training thread's)
            kind = item[0]
            if kind == RAW_COLLECTIVE:
                (_, seq, _, op, t0, t1, b_in, b_out, dtype, group, async_op, work, phase, step, cuda, sampled,
                 caller) = item
                # The values the columns take as they are (finalize_sync_batch's checks, an item at a time).
                if type(step) is not int or step <= emitted or type(t0) is not int or type(t1) is not int \
                        or not 0 <= t1 - t0 < _BATCH_MAX_NS or type(b_in) is not int or type(b_out) is not int \
                        or type(phase) is not str:
                    continue
                launch = cuda is UNTIMED
                # A launch, sync or async (not one without a Work: _finalize takes those at their call); an async
                # host one (a sampled one's callback record is looked for in this pass, below).
                if not (launch and (not async_op or work is not None) or cuda is None and async_op and work is not None):
                    continue
                if async_op and early and (seq in early_waits or seq in early_done or seq in early_seen):
                    continue
                key = (op, phase, b_in, b_out, dtype, group, caller)
                try:
                    shape = shapes.get(key)
                except TypeError:  # an unhashable group
                    continue
                if launch and on_host(group):  # a gloo group of a GPU job: its host times are its own
                    continue
                if shape is None:
                    shape = new_shape(*key)
                if async_op:
                    issued[seq] = (index, shape)
                else:
                    plan[index] = (item, t1 - t0, t0, shape, None, _LAUNCH)
            elif kind == RAW_WAIT:
                at = issued.pop(item[1], None)
                if at is None:
                    continue
                index_at, shape = at
                _, _, w0, w1, done_before, cuda_end, cuda_wait, wait_step = item
                raw = items[index_at]
                if wait_step != raw[AT_STEP] or type(w0) is not int or type(w1) is not int \
                        or not 0 <= w1 - w0 < _BATCH_MAX_NS or cuda_end is not None or cuda_wait is not None:
                    continue
                done = dones.pop(item[1], None)
                if raw[AT_SAMPLED]:  # timed by its completion callback, whose record must be in this pass
                    if done is None:  # it may come further on (as on_done finalizes it there)
                        waited[item[1]] = (index_at, index, shape, w0, w1)
                        continue
                    plan[done[0]] = plan[index_at] = _WAITED_LATER
                    plan[index] = (raw, w1 - w0, w0, shape, done[1], _CALLBACK)
                    continue
                if done is not None:  # a callback's record before the wait of one not sampled: the general path's
                    continue
                plan[index_at] = _WAITED_LATER
                if raw[AT_CUDA] is UNTIMED:
                    plan[index] = (raw, w1 - w0, w0, shape, None, _LAUNCH)
                elif done_before:  # done by the wait's start (_try_finalize_async's bound)
                    plan[index] = (raw, w1 - w0, w0, shape, w0, _BOUND)
                else:
                    plan[index] = (raw, w1 - w0, w0, shape, w1, _WAIT)
            elif kind == RAW_DONE:
                seq = item[1]
                if seq in waited:  # finalized here, as on_done finalizes a waited one
                    index_at, index_wait, shape, w0, w1 = waited.pop(seq)
                    plan[index_at] = plan[index_wait] = _WAITED_LATER
                    plan[index] = (items[index_at], w1 - w0, w0, shape, item[2], _CALLBACK)
                elif seq in issued and not items[issued[seq][0]][AT_SAMPLED]:
                    issued.pop(seq)  # a callback nobody asked for: the general path's to make sense of
                else:  # before its wait, or before its call (a callback that ran as it was registered)
                    dones[seq] = (index, item[2])
            elif kind == RAW_SEEN_DONE:
                issued.pop(item[1], None)  # its time is the general path's to use: the call and its wait go there
                waited.pop(item[1], None)
        return plan

    def _finalize_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """_finalize of each of ``rows`` (_plan_columns' tuples, in the order the general path finalizes them), a
        column at a time."""
        n = len(rows)
        launches = _LAUNCH in map(_TIMING, rows)  # a GPU's: no completion known
        (seqs, apis, ops, phases, steps, b_ins, b_outs, dtype_names, group_sizes, is_async, issue, complete, blocked,
         timings, meanings, waits, issue_s, nbytes, durations, busbw, thread_blocked, reach, wait_ends,
         issue_ends) = self._row_columns(rows, launches)
        columns = (seqs, [self.rank] * n, steps, phases, ops, apis, b_ins, b_outs, dtype_names, group_sizes, is_async,
                   issue, complete, blocked, timings, meanings, waits, issue_s)
        if self.cuda_timer is not None:  # as _finalize: their waits need no completion check now
            self.cuda_timer.untimed_waits.difference_update(seqs)
        self._write_columns(columns, steps, n)
        self.out.publish_unmade(columns, n)
        self._counted.append([ops, meanings, nbytes, thread_blocked, durations, busbw])  # columns
        for step, rows_of in step_runs(steps):
            self._account_rows(step, ops[rows_of], nbytes[rows_of], launches and _LAUNCH in timings[rows_of],
                               issue[rows_of], reach[rows_of], waits[rows_of], wait_ends[rows_of], issue_ends[rows_of],
                               blocked[rows_of], issue_s[rows_of], is_async[rows_of])

    def _row_columns(self, rows: list[tuple[Any, ...]], launches: bool) -> tuple[Sequence[Any], ...]:
        """_finalize_rows' columns of ``rows`` (``launches``: a row's timing is ``launch``): a record's fields (seq,
        api, op, phase, step, bytes_in, bytes_out, dtype name, group size, async, issue_ns, complete_ns, blocked_s,
        timing, meaning, wait_ns, issue_s), the live totals' (bytes, duration, busbw, the thread's time blocked) and
        the step accounting's (reach, wait end, issue end). In C where the package's extension was built (_batch.c),
        else in the loops in C that zip and map give; the same values (tests/test_recorder_fast_path.py)."""
        if _BATCHER is not None:
            made: tuple[Sequence[Any], ...] | None = _BATCHER.async_columns(rows, self.clock_offset_ns, launches,
                                                                             MEASURED_TIMINGS)
            if made is not None:
                return made
        n = len(rows)
        raws, blocked_ns, wait_perf, shapes, completions, timings = zip(*rows, strict=True)
        (_, seqs, apis, ops, t0s, t1s, b_ins, b_outs, _, _, asyncs, _, phases, steps, _, _, _) = zip(*raws, strict=True)
        dtype_names, group_sizes, meanings, nbytes, factors, sizes = zip(*shapes, strict=True)
        offset = self.clock_offset_ns
        issue = list(map(_add, t0s, _repeat(offset, n)))
        complete = [None if c is None else c + offset for c in completions]
        waits = list(map(_add, wait_perf, _repeat(offset, n)))
        blocked = list(map(_truediv, blocked_ns, _repeat(1e9, n)))  # seconds(): ns / 1e9
        issue_s = list(map(_truediv, map(_sub, t1s, t0s), _repeat(1e9, n)))
        is_async = list(map(bool, asyncs))
        # Live, as _publish_collective counts: the duration where the completion is known, event_bandwidth's busbw
        # where it is measured, and the time each cost its caller (thread_blocked_s: an async call's issue too).
        lengths = [None if c is None else (c - i) / 1e9 for i, c in zip(issue, complete, strict=True)] if launches \
            else list(map(_truediv, map(_sub, complete, issue), _repeat(1e9, n)))
        durations = [None if s is None else s if s > 0.0 else 0.0 for s in lengths]  # max(0.0, s)
        busbw = [size / s * factor if s is not None and s > 0 and timing in MEASURED_TIMINGS and factor is not None
                 and size > 0 else None for s, timing, factor, size in zip(lengths, timings, factors, sizes, strict=True)]
        thread_blocked = [b + s if a and s > 0 else b for b, s, a in zip(blocked, issue_s, is_async, strict=True)]
        # The steps, as _finalize accounts them one by one: the interval [issue, completion] of each whose completion
        # is known (``reach``: None where not); the blocked intervals, each row's wait [wait, wait + span_ns(blocked)]
        # where it blocked, then an async call's issue [issue, issue + span_ns(issue_s)] where it took time (span_ns
        # as int(s * 1e9): the plan kept calls under MAX_SPAN_S; an empty one, its end its start, where none is taken).
        reach: list[Any] = [None if c is None else c if c > i else i
                            for i, c in zip(issue, complete, strict=True)] if launches \
            else list(map(max, issue, complete))
        wait_ends = list(map(_add, waits, map(int, map(_mul, blocked, _repeat(1e9, n)))))
        issue_ends = [i + int(s * 1e9) if a else i for i, s, a in zip(issue, issue_s, is_async, strict=True)]
        return (seqs, apis, ops, phases, steps, b_ins, b_outs, dtype_names, group_sizes, is_async, issue, complete,
                blocked, timings, meanings, waits, issue_s, nbytes, durations, busbw, thread_blocked, reach, wait_ends,
                issue_ends)

    def _account_rows(self, step: int, ops: Sequence[str], nbytes: Sequence[int], launch: bool, issue: Sequence[int],
                      reach: Sequence[Any], waits: Sequence[int], wait_ends: Sequence[int], issue_ends: Sequence[int],
                      blocked: Sequence[float], issue_s: Sequence[float], is_async: Sequence[bool]) -> None:
        """_finalize_rows' step accounting of a run of one step's rows (its columns, as _finalize_rows makes them),
        as add_interval and add_blocked take them a row at a time: into the step's columns (StepAcc.col_*) where
        they do not fold, a row at a time where they do."""
        acc = self._count_run(step, ops, nbytes)
        k = len(ops)
        if launch:
            acc.device_untimed = True
        known = list(map(_is_not, reach, _repeat(None, k))) if launch else None  # its completion known
        waited = list(map(bool, blocked))  # add_blocked's: blocked_s > 0
        issued = list(map(_and, is_async, map(bool, issue_s)))  # an async call's issue that took time
        new_intervals = k if known is None else known.count(True)
        new_blocked = waited.count(True) + issued.count(True)
        if not (new_intervals or new_blocked):
            return
        if acc.run_issue:  # what add_interval and add_blocked do first
            settle_runs(acc)
        if len(acc.intervals) + len(acc.col_issue) + new_intervals > MAX_STEP_INTERVALS or acc.overlap_known \
                and len(acc.blocked) + len(acc.col_blocked_start) + new_blocked > MAX_STEP_INTERVALS:
            for i, r, w, w_end, i_end, did_wait, did_issue in zip(issue, reach, waits, wait_ends, issue_ends, waited,
                                                                 issued, strict=True):  # folded as they come
                if r is not None:
                    add_interval(acc, (i, r))
                if did_wait:
                    add_blocked(acc, (w, w_end))
                if did_issue:
                    add_blocked(acc, (i, i_end))
            return
        if known is None:
            acc.col_issue += issue
            acc.col_complete += reach
        else:
            acc.col_issue.extend(itertools.compress(issue, known))
            acc.col_complete.extend(itertools.compress(reach, known))
        # add_blocked's sum, in its order (each row's wait, then its issue): blocked_s += (end - start) / 1e9, an empty
        # interval's 0.0 leaving the sum as it was
        acc.blocked_s = functools.reduce(_add, itertools.chain.from_iterable(zip(
            map(_truediv, map(_sub, wait_ends, waits), _repeat(1e9, k)),
            map(_truediv, map(_sub, issue_ends, issue), _repeat(1e9, k)), strict=True)), acc.blocked_s)
        if acc.overlap_known:
            acc.col_blocked_start += [*itertools.compress(waits, waited), *itertools.compress(issue, issued)]
            acc.col_blocked_end += [*itertools.compress(wait_ends, waited), *itertools.compress(issue_ends, issued)]

    def finalize_sync_batch(self, items: list[tuple[Any, ...]]) -> bool:
        """finalize_sync of each of ``items`` (synchronous host collectives of steps not yet summarized, in
        the order they were issued), a column at a time: the same records, live counts and step accounting
        (tests/test_recorder_fast_path.py), with the loops in C (zip, map) rather than one Python call and
        one record object a collective. The records handed to live clients are made when one reads them
        (``materialize``). False, nothing done: a batch this path does not take (an unhashable group, a
        value of an unexpected type, a call longer than a week); the caller goes item by item."""
        n = len(items)
        made = self._sync_columns(items)
        if made is None:
            return False
        (seqs, apis, ops, phases, steps, b_ins, b_outs, dtype_names, group_sizes, meanings, nbytes, issue, complete,
         blocked, busbw, ends) = made
        columns = (seqs, [self.rank] * n, steps, phases, ops, apis, b_ins, b_outs, dtype_names, group_sizes,
                   [False] * n, issue, complete, blocked, [_SYNC] * n, meanings, issue, blocked)
        self._write_columns(columns, steps, n)
        # Live: (op, meaning, bytes, time blocked, duration, busbw) for the totals; the records, unmade.
        self.out.publish_unmade(columns, n)
        self._counted.append([ops, meanings, nbytes, blocked, blocked, busbw])  # columns
        # The steps: one run of each step's collectives at a time, in C where built (_batch.c's account_sync, which
        # leaves a run that folds, and those after it, to the loop below).
        done = _ACCOUNT_SYNC(steps, ops, nbytes, issue, complete, blocked, ends, self._accs, new_acc,
                             MAX_STEP_INTERVALS) if _ACCOUNT_SYNC is not None else 0
        if done < n:
            steps, ops, nbytes, issue, complete, blocked, ends = (
                column[done:] for column in (steps, ops, nbytes, issue, complete, blocked, ends))
            for step, rows_of in step_runs(steps):
                self._account_sync_run(step, ops[rows_of], nbytes[rows_of], issue[rows_of], complete[rows_of],
                                       blocked[rows_of], ends[rows_of])
        return True

    def _sync_columns(self, items: list[tuple[Any, ...]]) -> tuple[Sequence[Any], ...] | None:
        """What finalize_sync_batch makes of its raw collectives, a column each: seq, api, op, phase, step, bytes_in,
        bytes_out, dtype name, group size, meaning, bytes, issue_ns, complete_ns, blocked_s, busbw and each one's
        issue_ns + span_ns(blocked_s). None for a batch this path does not take. In C where the package's
        extension was built (_batch.c: one pass to check, one to make), else in the loops in C that zip and map give."""
        if _BATCHER is not None:
            made: tuple[Sequence[Any], ...] | None = _BATCHER.sync_columns(
                items, self._shapes, self._shape, self.clock_offset_ns, _BATCH_MAX_NS)
            return made
        n = len(items)
        (_, seqs, apis, ops, t0s, t1s, b_ins, b_outs, dtypes, groups, _, _, phases, steps, _, _, callers) = zip(
            *items, strict=True)
        # What the columns take as they are (CompactWriter's fit check, once for the batch): the types the
        # hooks give, and calls no longer than span_ns takes whole.
        if {*map(type, steps), *map(type, b_ins), *map(type, b_outs), *map(type, t0s), *map(type, t1s)} != {int} \
                or set(map(type, phases)) != {str}:
            return None
        lengths = list(map(_sub, t1s, t0s))
        if min(lengths) < 0 or max(lengths) >= _BATCH_MAX_NS:
            return None
        keys = list(zip(ops, phases, b_ins, b_outs, dtypes, groups, callers, strict=True))
        try:
            shapes = list(map(self._shapes.get, keys))
        except TypeError:
            return None
        if None in shapes:
            shapes = [shape if shape is not None else self._shape(*key) for shape, key in zip(shapes, keys, strict=True)]
        dtype_names, group_sizes, meanings, nbytes, factors, sizes = zip(*shapes, strict=True)
        offset = self.clock_offset_ns
        issue = list(map(_add, t0s, _repeat(offset, n)))
        complete = list(map(_add, t1s, _repeat(offset, n)))
        blocked = list(map(_truediv, lengths, _repeat(1e9, n)))  # seconds(): ns / 1e9
        busbw = [size / seconds_ * factor if seconds_ > 0 and factor is not None and size > 0 else None
                 for size, seconds_, factor in zip(sizes, blocked, factors, strict=True)]
        ends = list(map(_add, issue, map(int, map(_mul, blocked, _repeat(1e9, n)))))  # span_ns(blocked_s)
        return (seqs, apis, ops, phases, steps, b_ins, b_outs, dtype_names, group_sizes, meanings, nbytes, issue,
                complete, blocked, busbw, ends)

    def _write_columns(self, columns: tuple[Sequence[Any], ...], steps: Sequence[int], n: int) -> None:
        """A batch's ``n`` collectives, given a field at a time, to the recording (counted as finalized)."""
        self.events_finalized += n
        keeper, writer = self.keeper, self.writer
        if keeper.level:  # thinned: the keeper holds each until its step decides
            for row, step in zip(zip(*columns, strict=True), steps, strict=True):
                keeper.detail(_new_collective(row), step)
        elif writer is not None and keeper.admit(n):
            write_columns = getattr(writer, "write_columns", None)
            if write_columns is None or not write_columns(CollectiveEvent, columns, n):
                for row in zip(*columns, strict=True):
                    writer.write(_new_collective(row))

    def _count_run(self, step: int, ops: Sequence[str], nbytes: Sequence[int]) -> StepAcc:
        """A run of one step's collectives counted into its accumulator (made at its first record), as one by one:
        their number, their bytes, their bytes by op in first-seen order. The accumulator."""
        acc = self._accs.get(step)
        if acc is None:
            acc = self._accs[step] = new_acc()
        acc.collectives += len(ops)
        by_op = acc.by_op
        if _COUNT_OPS is not None:  # the loop below in C
            acc.comm_bytes += _COUNT_OPS(by_op, ops, nbytes)
            return acc
        acc.comm_bytes += sum(nbytes)
        if len(ops) <= _FEW:  # a loop: a Counter costs more to make than a few additions
            get = by_op.get
            for op, size in zip(ops, nbytes, strict=True):
                by_op[op] = get(op, 0) + size
        else:
            for (op, size), count in collections.Counter(zip(ops, nbytes, strict=True)).items():  # first-seen order, as one by one
                by_op[op] = by_op.get(op, 0) + size * count
        return acc

    def _account_sync_run(self, step: int, ops: Sequence[str], nbytes: Sequence[int], issue: Sequence[int],
                          complete: Sequence[int], blocked: Sequence[float], ends: Sequence[int]) -> None:
        """finalize_sync's step accounting of a run of one step's synchronous collectives, in issue order
        (``ends``: each one's issue_ns + span_ns(blocked_s))."""
        acc = self._count_run(step, ops, nbytes)
        k = len(ops)
        if len(acc.intervals) + len(acc.run_issue) + k > MAX_STEP_INTERVALS:  # folded as it goes: one at a time, as finalize_sync
            for issue_ns, complete_ns, blocked_s, end_ns in zip(issue, complete, blocked, ends, strict=True):
                add_interval(acc, (issue_ns, complete_ns))
                if blocked_s > 0:
                    add_blocked(acc, (issue_ns, end_ns))
            return
        # Kept as columns until the summary (StepAcc.run_*): complete >= issue, the clock is monotonic.
        acc.run_issue.extend(issue)
        acc.run_complete.extend(complete)
        acc.run_end.extend(ends)
        acc.run_blocked.extend(blocked)
        # add_blocked of each with blocked_s > 0, in order (a zero adds 0.0 to the sum: the same double)
        acc.blocked_s = functools.reduce(_add, map(_truediv, map(_sub, ends, issue), _repeat(1e9, k)), acc.blocked_s)
        if acc.overlap_known:
            acc.run_blocked_n += k - blocked.count(0.0)  # blocked_s >= 0: the lengths were checked
            if len(acc.blocked) + acc.run_blocked_n > MAX_STEP_INTERVALS:
                settle(acc)
                acc.blocked = []
                acc.overlap_known = False

    def _shape(self, op: str, phase: str, b_in: int, b_out: int, dtype: Any, group: Any,
               caller: Any) -> tuple[str, int, str, int, float | None, int]:
        """What a collective's record takes from its call's shape: (dtype name, group size, meaning,
        bytes, bus factor, nccl-tests' array size), kept for the next call of that shape."""
        nbytes = max(b_in, b_out)
        group_size = self._group_size(group)
        size = b_out if op == "all_gather" else b_in if op == "reduce_scatter" else nbytes  # array_bytes
        shape = (self._dtype(dtype), group_size, meaning_of(op, phase, nbytes, issuer_of(caller)), nbytes,
                 bus_factor(op, group_size), size)
        if len(self._shapes) < _MAX_SHAPES and group in self._group_sizes:
            self._shapes[(op, phase, b_in, b_out, dtype, group, caller)] = shape
        return shape

    def _publish_collective(self, event: CollectiveEvent) -> None:
        """Published as its step's detail, and counted in the running totals behind the live metrics."""
        duration = event.duration_s if event.timing != _UNKNOWN else None
        bandwidth = event_bandwidth(event) if duration else None
        self.out.publish(event, detail_of=event.step)
        self._counted.append(counted(event, duration, bandwidth[1] if bandwidth is not None else None))
