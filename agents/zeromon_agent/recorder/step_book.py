"""The recorder's steps: phase boundaries into spans, spans and collectives into each step's accumulator, and a
step's summary once it is whole.

A boundary on a GPU carries a CUDA event (a Mark): its span waits until the GPU has reached both ends, and is
then on the GPU's clock (on the host's if the GPU does not get there within _MARK_GRACE_NS). Without a GPU every
boundary is a plain perf_ns and its spans are tuples, finished a column at a time (the host handlers,
``_use_host_phases``); tests/test_recorder_fast_path.py holds the two ways equal. A step is summarized in order,
once it has ended, its spans are resolved and its async collectives are finalized (or a grace has passed).
"""

from __future__ import annotations

import collections
import itertools
import operator
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from zeromon.analysis.step_overlap import AGENT_PHASE, COMPUTE_PHASES, DEVICE_CLOCK, HOST_CLOCK
from zeromon.model.compiled import compiled
from zeromon.model.events import PhaseSpan, record_maker
from zeromon_agent.recorder.step_acc import Mark, Span, StepAcc, new_acc, step_runs, summarize

if TYPE_CHECKING:
    from zeromon_agent.recorder.outbox import Outbox

# A step's summary waits this long for its in-flight async collectives.
_STEP_GRACE_NS = 2_000_000_000
# A CUDA event (a phase boundary) the GPU has not reached this long after it was recorded is given
# up on: its spans fall back to host times. Bounds the wait of a step summary on a stalled GPU.
_MARK_GRACE_NS = 10_000_000_000
# Built once per record, from the values' tuple (record_maker: the slots set directly, as @frozen's __init__ does).
_new_span = record_maker(PhaseSpan)
# finish_host_spans' columns and step accounting in C (_host.c's host_spans), or None: the Python loops.
_HOST_SPANS = getattr(compiled("zeromon_agent.recorder._host"), "host_spans", None)


class StepBook:
    """Each step's accumulator (StepAcc) until its summary is out, and the phase spans that fill it."""

    def __init__(self, rank: int, clock_offset_ns: int, cuda_timer: Any, out: Outbox) -> None:
        self.rank = rank
        self.clock_offset_ns = clock_offset_ns  # perf_counter_ns -> Unix ns
        self.cuda_timer = cuda_timer
        self.out = out
        self.accs: dict[int, StepAcc] = {}
        self.emitted_through = -1  # steps up to this one are summarized; later records skip them
        # (phase, its start, step): its start a Mark, or on the host (no GPU) its perf_ns (_on_phase_host)
        self.current: tuple[str, Any, int] | None = None
        self._marks: list[Mark] = []  # boundaries whose CUDA event the GPU has not reached yet
        # Closed, waiting for their marks: Spans, or on the host (phase, step, start, end) in perf_ns, in a list
        self.closed: Any = collections.deque()
        self.host_phases = False  # the host's handlers: the recorder may take a run of boundaries in C (host_phases)
        if cuda_timer is None:  # no GPU, for the whole run: phases as plain tuples
            self._use_host_phases()

    def acc(self, step: int) -> StepAcc:
        """``step``'s accumulator, made at its first record."""
        acc = self.accs.get(step)
        if acc is None:
            acc = self.accs[step] = new_acc()
        return acc

    # --- boundaries (a GPU's: Marks and Spans) ----------------------------------------------------------
    def _mark(self, t: int, event: Any) -> Mark:
        mark = Mark(perf=t, event=event if self.cuda_timer is not None else None)
        if mark.event is not None:
            self._marks.append(mark)
        return mark

    def on_phase(self, item: tuple[Any, ...]) -> None:
        phase, t, step = item[1], item[2], item[3]
        mark = self._mark(t, item[4] if len(item) > 4 else None)
        self._close_phase(mark)
        self.current = (phase, mark, step)

    def _close_phase(self, end: Mark) -> Span | None:
        if self.current is None:
            return None
        phase, start, step = self.current
        self.current = None
        if end.perf <= start.perf:
            return None
        span = Span(phase, step, start, end)
        self.closed.append(span)
        return span

    def on_agent(self, item: tuple[Any, ...]) -> None:
        """zeromon's own work at a boundary: a span of the `agent` phase inside the current one (host
        clock only: on the GPU the stream goes on meanwhile, and its spans are on the GPU's clock)."""
        _, step, t0, t1, phase = item
        if self.current is None or (self.cuda_timer is not None and self.cuda_timer.active):
            return
        current, _, current_step = self.current
        self._close_phase(Mark(perf=t0))
        self.closed.append(Span(AGENT_PHASE, current_step, Mark(perf=t0), Mark(perf=t1)))
        self.current = (current, Mark(perf=t1), current_step)

    def on_step_start(self, item: tuple[Any, ...]) -> None:
        """zeromon_agent.step()'s entry: the step opens here; the time since the previous step's exit
        belongs to no step."""
        _, step, t, event, phase = item
        mark = self._mark(t, event)
        gap = self._close_phase(mark)
        if gap is not None and gap.step == step and self.closed and self.closed[-1] is gap:
            self.closed.pop()
        self.current = (phase, mark, step)
        self.acc(step).start = mark

    def on_step_end(self, item: tuple[Any, ...]) -> None:
        _, step, t, event, explicit = item
        mark = self._mark(t, event)
        phase = self.current
        self._close_phase(mark)
        if phase is not None and not explicit:  # the next step starts where this one ends
            self.current = (phase[0], mark, step + 1)
        acc = self.acc(step)
        acc.end = mark
        acc.ended_at_perf = time.perf_counter_ns()

    # --- boundaries on the host (no GPU) -------------------------------------------------------------
    # The same spans as the handlers above, made of plain values: the current phase is (phase, start perf_ns,
    # step), a closed one (phase, step, start perf_ns, end perf_ns), no Mark nor Span a boundary (a step has
    # a span or more a phase, each an object otherwise). Steps' own boundaries stay Marks (StepAcc.start,
    # .end: two a step).
    def _use_host_phases(self) -> None:
        self.host_phases, self.closed = True, []  # appended to by _host.c's host_phases too
        self.on_phase, self.on_agent = self._on_phase_host, self._on_agent_host  # type: ignore[method-assign]
        self.on_step_start, self.on_step_end = self._on_step_start_host, self._on_step_end_host  # type: ignore[method-assign]

    def _on_phase_host(self, item: tuple[Any, ...]) -> None:
        t = item[2]
        current = self.current
        if current is not None and t > current[1]:
            self.closed.append((current[0], current[2], current[1], t))
        self.current = (item[1], t, item[3])

    def _on_agent_host(self, item: tuple[Any, ...]) -> None:
        _, _, t0, t1, _ = item
        current = self.current
        if current is None:
            return
        name, start, step = current
        spans = self.closed
        if t0 > start:
            spans.append((name, step, start, t0))
        spans.append((AGENT_PHASE, step, t0, t1))
        self.current = (name, t1, step)

    def _on_step_start_host(self, item: tuple[Any, ...]) -> None:
        _, step, t, _, phase = item
        current = self.current
        if current is not None and t > current[1] and current[2] != step:  # a gap inside the step is none
            self.closed.append((current[0], current[2], current[1], t))
        self.current = (phase, t, step)
        self.acc(step).start = Mark(perf=t)

    def _on_step_end_host(self, item: tuple[Any, ...]) -> None:
        _, step, t, _, explicit = item
        current = self.current
        if current is not None and t > current[1]:
            self.closed.append((current[0], current[2], current[1], t))
        self.current = (current[0], t, step + 1) if current is not None and not explicit else None
        acc = self.acc(step)
        acc.end = Mark(perf=t)
        acc.ended_at_perf = time.perf_counter_ns()

    # --- spans into records --------------------------------------------------------------------------
    def resolve_spans(self, final: bool) -> None:
        """Turn closed phases into PhaseSpans, in order: on the GPU's clock once the GPU has reached
        both of their boundaries, else (no GPU, given up, or at exit) on the host's."""
        if self._marks:
            timer, now = self.cuda_timer, time.perf_counter_ns()
            waiting = []
            for mark in self._marks:
                unix = timer.resolve_one(mark.event)
                if unix is None and not final and now - mark.perf < _MARK_GRACE_NS:
                    waiting.append(mark)
                    continue
                timer.release(mark.event)
                mark.event, mark.unix = None, unix
            self._marks = waiting
        spans, offset, finish = self.closed, self.clock_offset_ns, self.finish_span
        if self.cuda_timer is None and spans:  # no GPU: every closed phase is on the host's clock, now
            self.finish_host_spans(list(spans))
            spans.clear()
            return
        while spans and spans[0].start.event is None and spans[0].end.event is None:  # neither pending
            span = spans.popleft()
            start, end = span.start, span.end
            if start.unix is not None and end.unix is not None:
                finish(span, start.unix, end.unix, "cuda_event")
            else:
                finish(span, start.perf + offset, end.perf + offset, HOST_CLOCK)

    def finish_host_spans(self, spans: list[tuple[str, int, int, int]]) -> None:
        """finish_span of each of ``spans`` (closed, in order) on the host's clock, a column at a time: the
        same records and step accounting (tests/test_recorder_fast_path.py), the records handed to live
        clients unmade (``materialize``), as CollectiveRecords.finalize_sync_batch does for collectives. The
        columns and the accounting in C where _host.c was built (host_spans), else in the loops below."""
        k, offset, rank = len(spans), self.clock_offset_ns, self.rank
        made = _HOST_SPANS(spans, offset, self.emitted_through, AGENT_PHASE, self.accs, new_acc) \
            if _HOST_SPANS is not None else None
        if made is not None:  # accounted, and of the types the columns take
            steps, phases, starts, ends = made
            columns_take = True
        else:
            phases, steps, starts_perf, ends_perf = zip(*spans, strict=True)  # _on_phase_host's tuples
            starts = list(map(operator.add, starts_perf, itertools.repeat(offset, k)))
            ends = list(map(operator.add, ends_perf, itertools.repeat(offset, k)))
            columns_take = set(map(type, steps)) == {int} and set(map(type, phases)) == {str} \
                and {*map(type, starts), *map(type, ends)} == {int}  # CompactWriter's fit check, for all
        columns = ([rank] * k, steps, phases, starts, ends, [HOST_CLOCK] * k)
        out = self.out
        keeper, writer = out.keeper, out.writer
        write_columns = getattr(writer, "write_columns", None)
        if keeper.level or not columns_take or write_columns is None:
            for row, step in zip(zip(*columns, strict=True), steps, strict=True):
                out.write_detail(PhaseSpan, row, _new_span(row), step)
        elif keeper.admit(k) and not write_columns(PhaseSpan, columns, k) and writer is not None:
            for row in zip(*columns, strict=True):
                writer.write(_new_span(row))  # the file is gone: counted as lost
        out.publish_unmade(columns, k)
        if made is None:
            self._account_host_spans(steps, phases, starts, ends)

    def _account_host_spans(self, steps: Sequence[int], phases: Sequence[str], starts: list[int],
                            ends: list[int]) -> None:
        """finish_host_spans' step accounting in Python: a run of one step's spans at a time (a pass holds a few
        steps, each ~10 spans)."""
        get_acc, emitted, durations = self.acc, self.emitted_through, list(map(operator.sub, ends, starts))
        for step, rows_of in step_runs(steps):
            if step > emitted:
                acc = get_acc(step)
                phase_ns, run_phases = acc.phase_ns, phases[rows_of]
                for phase, duration in zip(run_phases, durations[rows_of], strict=True):  # in order: the dict's
                    phase_ns[phase] = phase_ns.get(phase, 0) + duration
                if AGENT_PHASE in run_phases:
                    acc.agent.extend(itertools.compress(zip(starts[rows_of], ends[rows_of], strict=True),
                                                        map(AGENT_PHASE.__eq__, run_phases)))
                first = min(starts[rows_of])
                if acc.start_ns is None or first < acc.start_ns:
                    acc.start_ns = first

    def finish_span(self, span: Span, start_ns: int, end_ns: int, timing: str) -> None:
        values = (self.rank, span.step, span.phase, start_ns, end_ns, timing)
        record = _new_span(values)
        self.out.write_detail(PhaseSpan, values, record, span.step)
        self.out.records.append(record)
        if span.step > self.emitted_through:
            acc = self.acc(span.step)
            acc.phase_ns[span.phase] = acc.phase_ns.get(span.phase, 0) + end_ns - start_ns
            if span.phase == AGENT_PHASE:
                acc.agent.append((start_ns, end_ns))
            elif timing == DEVICE_CLOCK:
                acc.on_stream = True
                if span.phase in COMPUTE_PHASES:
                    acc.compute.append((start_ns, end_ns))
            if acc.start_ns is None or start_ns < acc.start_ns:
                acc.start_ns = start_ns

    # --- summaries -----------------------------------------------------------------------------------
    def emit_steps(self, final: bool, inflight_steps: Collection[int]) -> None:
        """Summarize the steps that are whole, in order (``inflight_steps``: the steps of the async collectives
        not finalized yet, which a step's summary waits _STEP_GRACE_NS for; at ``final``, nothing waits)."""
        now = time.perf_counter_ns()
        unresolved_steps = {span.step for span in self.closed}
        out, offset, accs, rank = self.out, self.clock_offset_ns, self.accs, self.rank
        step_done, write, records, steps = out.keeper.step_done, out.write, out.records, out.steps
        for step in sorted(accs):
            acc = accs[step]
            end = acc.end
            if end is None:
                break  # unfinished: a step that never ended is not summarized, nor any after it
            if not final and (end.pending or (acc.start is not None and acc.start.pending)
                              or step in unresolved_steps):
                break  # its phases still wait for the GPU (bounded by _MARK_GRACE_NS)
            if step in inflight_steps and not final and now - acc.ended_at_perf < _STEP_GRACE_NS:
                break  # summaries go out in step order
            del accs[step]
            self.emitted_through = step
            end_ns = end.unix if end.unix is not None else end.perf + offset
            if acc.start is not None:  # zeromon_agent.step(): the block's entry
                start_ns = acc.start.unix if acc.start.unix is not None else acc.start.perf + offset
            else:
                start_ns = acc.start_ns if acc.start_ns is not None else end_ns
            start_ns = min(start_ns, end_ns)
            summary = summarize(acc, rank, step, start_ns, end_ns)
            step_done(summary)
            write(summary)
            records.append(summary)
            steps.append(summary)
