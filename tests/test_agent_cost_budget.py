"""The recorder's Python work per collective, held where issue 44 brought it: a ratchet, not a stopwatch.

A timed test flakes on a shared machine (the recorder's CPU per collective moves by a quarter from one run to the
next: tests/bench/RESULTS.md), so what is held here is what the time is made of and does not move with the
machine: the Python functions the recorder's passes call, counted with ``sys.setprofile``, for the passes of a
steady FSDP2 step as examples/fsdp2_train.py's rank 0 queues them on gloo (11 synchronous collectives, seven
phase changes, three memory samples and three agent spans a step: the queues' contents captured from a real run by
``tests/bench/bench_recorder_cpu.py --capture``, rebuilt here). A change that adds a Python call a record adds
~2.3 calls a collective (these steps queue 25 records for 11 collectives) and fails here; one that makes the passes
cheaper lowers the ceiling with it. Raise the ceiling only with the cost measured (bench_agent_cost.py,
bench_recorder_cpu.py --replay, alternated against the parent) and written in RESULTS.md.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from zeromon.model.compiled import compiled
from zeromon.model.segments import CompactWriter
from zeromon_agent.hooks.state import (
    RAW_AGENT,
    RAW_COLLECTIVE,
    RAW_MEMORY,
    RAW_PHASE,
    RAW_STEP_END,
    HotState,
)
from zeromon_agent.recorder.loop import Recorder

# Python calls a collective in the passes of STEPS steady steps, the flushes' and the stop's included (a generator
# resumed counts as a call: the live totals' rows, one a collective): what they made when it was set
# (tests/bench/RESULTS.md, issue 44), with room for less than one call a record more.
# The recorder's Python paths 6.90 (7.5); with its loops in C (setup.py's modules, built where a compiler is, as in
# CI) 6.38 (7.0), 4.66 once the live totals were counted in C (live/_totals.c: no generator resumed a collective),
# 3.58 once memory samples joined the runs of phases in C and the spans' step accounting was C too (_batch.c), 3.32
# with a step's bytes by op counted in C, a record made from its values in C and a run of samples written in one call,
# 2.32 once a step's boundaries joined the C runs, a run of samples was fit-checked in one C call and a batch's step
# accounting was C too, 1.25 once a step's summary went out with fewer calls (the keeper's history, the steps counted
# a pass at a time) and a pass's queue was checked in one C call.
CALLS_PER_COLLECTIVE_CEILING = 2.0 if compiled("zeromon_agent.recorder._batch") and compiled("zeromon.model._planes") \
    and compiled("zeromon_agent.live._totals") \
    else 7.5
STEPS = 400  # a pass a flush (5 s) holds ~130 of these steps; four passes
_GROUP = "group"
_CALLER = "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"
_CPU_SAMPLE = ("cpu", None, None, None, None, None, None, None, None, 12_638_255_104, None)
_FORWARD = [("all_gather", 139_520, 279_040)] + [("all_gather", 99_968, 199_936)] * 3
_BACKWARD = [("all_gather", 99_968, 199_936)] * 3 + [("reduce_scatter", 199_936, 99_968)] * 3 + \
    [("reduce_scatter", 279_040, 139_520)]


def _steady_steps(steps: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(control items, collectives) of ``steps`` steps as the hot path queues them for an FSDP2 step on gloo."""
    control: list[tuple[Any, ...]] = []
    raw: list[tuple[Any, ...]] = []
    t, seq, rss = 10**12, 0, 350_000_000
    for step in range(steps):
        for phase, calls, sample in (("forward", _FORWARD, "forward"), ("backward", _BACKWARD, "backward"),
                                     ("optimizer", (), "optimizer")):
            control.append((RAW_PHASE, phase, t, step, None))
            for op, b_in, b_out in calls:
                seq += 1
                raw.append((RAW_COLLECTIVE, seq, f"{op}_single" if op == "all_gather" else "reduce_scatter_tensor",
                            op, t + 300_000, t + 900_000, b_in, b_out, "torch.float32", _GROUP, False, None, phase,
                            step, None, False, _CALLER))
                t += 1_000_000
            t += 2_000_000
            control.append((RAW_PHASE, "other", t, step, None))
            rss += 4096
            control.append((RAW_MEMORY, sample, step, t + 5_000, (*_CPU_SAMPLE, rss, {})))
            control.append((RAW_AGENT, step, t, t + 25_000, "other"))
            t += 100_000
        control.append((RAW_STEP_END, step, t, None, False))
        t += 500_000
    return control, raw


def replay_passes(control: list[tuple[Any, ...]], raw: list[tuple[Any, ...]], folder: Path) -> Recorder:
    """The recorder's passes over the queued ``control`` records and ``raw`` collectives (_steady_steps'): a pass a
    quarter of them, each flushed, then the stop and a read of the live totals, as a scrape does
    (tests/bench/bench_recorder_instructions.py counts the same passes)."""
    state = HotState()
    writer = CompactWriter(folder / "rank-0.zmr", 0)
    recorder = Recorder(state, 0, writer, 5.0)
    recorder.collectives._group_sizes[_GROUP] = 2
    cut_control, cut_raw = len(control) // 4, len(raw) // 4
    for part in range(4):
        state.control.extend(control[part * cut_control:(part + 1) * cut_control if part < 3 else None])
        state.raw.extend(raw[part * cut_raw:(part + 1) * cut_raw if part < 3 else None])
        recorder._drain(final=False)
        writer.flush()
    recorder.stop()
    recorder.live.totals.collectives  # noqa: B018 - counted when read, as a scrape does
    return recorder


def _calls_per_collective(tmp_path: Path) -> tuple[float, Counter[str]]:
    """The Python calls of the recorder's passes over STEPS steady steps (replay_passes), a collective; and the
    calls by function, for the message."""
    control, raw = _steady_steps(STEPS)
    calls: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"] += 1

    sys.setprofile(count)
    try:
        recorder = replay_passes(control, raw, tmp_path)
    finally:
        sys.setprofile(None)
    assert recorder.events_finalized == len(raw)
    return sum(calls.values()) / len(raw), calls


def test_the_recorder_s_python_calls_a_collective_stay_under_their_ceiling(tmp_path: Path) -> None:
    (tmp_path / "warm").mkdir()
    _calls_per_collective(tmp_path / "warm")  # what a first pass imports or caches once (a run's start pays it)
    per_collective, calls = _calls_per_collective(tmp_path)
    assert per_collective <= CALLS_PER_COLLECTIVE_CEILING, (
        f"the recorder's passes make {per_collective:.2f} Python calls a collective (ceiling "
        f"{CALLS_PER_COLLECTIVE_CEILING}); the most called: {calls.most_common(12)}")


def test_the_steady_steps_are_summarized_as_the_run_s_were(tmp_path: Path) -> None:
    """The stand-in steps are what the counted passes are for: each step summarized with its 11 collectives,
    its phases' time and its memory peak; each record written."""
    from zeromon.model.recording import read_recording

    control, raw = _steady_steps(6)
    state = HotState()
    recorder = Recorder(state, 0, CompactWriter(tmp_path / "rank-0.zmr", 0), 5.0)
    recorder.collectives._group_sizes[_GROUP] = 2
    state.control.extend(control)
    state.raw.extend(raw)
    recorder.stop()
    rec = read_recording(tmp_path / "rank-0.zmr")
    assert [s.collectives for s in rec.steps] == [11] * 6
    assert all(s.phase_s["forward"] > 0 and s.phase_s["agent"] > 0 and s.peak_memory for s in rec.steps)
    assert len(rec.collectives) == 66 and len(rec.memory) == 18
    assert {p.phase for p in rec.phases} == {"forward", "backward", "optimizer", "other", "agent"}
