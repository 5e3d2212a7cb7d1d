"""zeromon's own time at a phase boundary is one `agent` span from the phase change on: no sliver of the
phase between the change and the agent's work (the change's own record is zeromon's cost too), and a step
ends where zeromon's step-end work ends. Read from a real 2-rank FSDP2 run on gloo."""

from __future__ import annotations

from pathlib import Path

from zeromon.analysis.step_overlap import AGENT_PHASE
from zeromon.model.codec import read_run
from zeromon.model.events import PhaseSpan


def _spans_by_start(spans: list[PhaseSpan]) -> dict[int, PhaseSpan]:
    return {span.start_ns: span for span in spans}


def test_an_agent_span_follows_the_phase_it_ends_with_no_sliver_of_other_between(fsdp2_run: Path) -> None:
    abutting = 0
    for recording in read_run(fsdp2_run):
        spans = [s for s in recording.phases if s.timing == "host"]
        agents = [s for s in spans if s.phase == AGENT_PHASE]
        assert agents, f"rank {recording.rank}: no agent span: the check below would hold of nothing"
        ending_at = {span.end_ns: span for span in spans}
        first = min(span.start_ns for span in spans)
        for agent in agents:
            before = ending_at.get(agent.start_ns)
            if before is None:  # the first forward's start: the warm-up before it is no span
                assert agent.start_ns == first, f"rank {recording.rank}: nothing ends where {agent} starts"
            elif before.phase == "other":
                # an `other` span before zeromon's work is a gap between phases (before a forward), never
                # a few µs cut off a phase that had just ended
                earlier = ending_at.get(before.start_ns)
                assert earlier is None or earlier.phase in ("other", AGENT_PHASE) or earlier.step != before.step, \
                    f"rank {recording.rank}: {before} lies between {earlier} and {agent}"
            else:
                abutting += 1
    assert abutting, "no agent span right after a forward, backward or optimizer span"


def test_a_step_ends_where_zeromon_s_work_at_its_end_ends(fsdp2_run: Path) -> None:
    for recording in read_run(fsdp2_run):
        starting_at = _spans_by_start([s for s in recording.phases if s.timing == "host"])
        ended_by_agent = 0
        for summary in recording.steps:
            last = max((s for s in recording.phases if s.step == summary.step), key=lambda s: s.end_ns)
            assert last.end_ns <= summary.end_ns
            after = starting_at.get(last.end_ns)
            if last.phase == AGENT_PHASE:
                ended_by_agent += 1
                assert last.end_ns == summary.end_ns, f"rank {recording.rank}: step {summary.step} ends " \
                                                      f"{summary.end_ns - last.end_ns} ns after zeromon's work"
                assert after is None or after.step != summary.step
            else:
                assert not (last.phase == "other" and (before := [s for s in recording.phases
                                                                   if s.end_ns == last.start_ns])
                            and before[0].phase == AGENT_PHASE), \
                    f"rank {recording.rank}: step {summary.step} ends with a sliver after zeromon's work: {last}"
        assert ended_by_agent, f"rank {recording.rank}: no step ended with zeromon's step-end work (a memory sample)"
