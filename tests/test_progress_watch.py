"""The agent's own view of its progress (zeromon_agent.recorder.progress.ProgressWatch): when a rank is suspect, and that
it says so once per stall. Times are given, not waited for; the real runs are in tests/test_hang.py."""

from __future__ import annotations

import time

from zeromon.model.progress import RESUMED, STALLED
from zeromon_agent.hooks.state import RAW_COLLECTIVE, RAW_PHASE, RAW_WAIT, HotState
from zeromon_agent.recorder.loop import Recorder
from zeromon_agent.recorder.progress import (
    STALL_FLOOR_S,
    STALL_SETUP_S,
    STALL_STEPS,
    ProgressWatch,
    call_of_raw,
    is_program_code,
)

S = 10**9


def watch(durations: list[float], setting: float = 0.0, setup: float = 0.0) -> ProgressWatch:
    return ProgressWatch(HotState(), rank=0, threshold_s=setting, step_durations=lambda: durations,
                         setup_threshold_s=setup)


def test_the_automatic_threshold_is_the_larger_of_30_s_and_ten_median_steps() -> None:
    assert watch([]).threshold() == STALL_SETUP_S == 300.0  # before the first step: setup's long silences
    assert STALL_FLOOR_S == 30.0
    assert watch([0.2] * 50).threshold() == 30.0
    assert watch([4.0, 5.0, 6.0, 60.0]).threshold() == STALL_STEPS * 5.5  # the median: one slow step moves it little
    assert watch([9.0] * 3, setting=12.0).threshold() == 12.0  # ZEROMON_HANG_AFTER wins


def test_setup_has_its_own_threshold_that_a_threshold_for_steps_does_not_shorten() -> None:
    # A threshold chosen for steps (ZEROMON_HANG_AFTER=6) would call a long checkpoint load or compile hung: before
    # the first step ends ZEROMON_HANG_AFTER_SETUP holds, by default the larger of 300 s and ZEROMON_HANG_AFTER.
    assert watch([], setting=6.0).threshold() == STALL_SETUP_S
    assert watch([], setting=900.0).threshold() == 900.0
    assert watch([], setting=6.0, setup=20.0).threshold() == 20.0
    assert watch([1.0], setting=6.0, setup=20.0).threshold() == 6.0  # the first step has ended


def test_a_stall_is_said_once_and_its_end_once() -> None:
    w = watch([0.1], setting=5.0)
    t0 = w.progress_perf
    said = [w.tick(t0, t0 + t * S) for t in (1, 4, 5, 6, 60)]  # nothing newer done since: no progress
    said += [w.tick(t0 + 61 * S, t0 + 61 * S), w.tick(t0 + 61 * S, t0 + 62 * S)]  # a collective at 61 s
    assert said == [None, None, STALLED, None, None, RESUMED, None]


def test_progress_is_when_the_training_thread_acted_not_when_it_was_looked_at() -> None:
    # The recorder's thread may look late (a loaded machine): a record made at 2 s, seen at 9 s, is progress at 2 s.
    w = watch([0.1], setting=5.0)
    t0 = w.progress_perf
    assert w.tick(t0 + 2 * S, t0 + 9 * S) is None
    assert w.tick(t0 + 2 * S, t0 + 9 * S + 1) == STALLED  # 7 s since then: a stall, at once


def test_the_newest_record_of_any_kind_is_the_training_threads_last_activity_queued_or_drained() -> None:
    state = HotState()
    recorder = Recorder(state, rank=0, writer=None, flush_interval_s=5.0)
    t0 = recorder.last_activity()
    state.control.append((RAW_PHASE, "forward", t0 + 10, 0))  # a phase boundary
    assert recorder.last_activity() == t0 + 10
    state.raw.append((RAW_WAIT, 1, t0 + 20, t0 + 30, False, None, None, 0))  # the end of a wait
    assert recorder.last_activity() == t0 + 30
    with recorder._drain_lock:
        recorder._drain(final=False)  # drained, the times stay
    assert not state.raw and not state.control and recorder.last_activity() == t0 + 30


def test_a_rank_nobody_reads_is_looked_at_when_its_flush_or_a_stall_is_due() -> None:
    """Between two passes of a rank nobody reads, the recorder's thread waits until the next flush or the first
    moment a stall could be named, whichever is sooner (each wakeup costs it a timer's round trip); at the live pace
    while a client reads, on a GPU, and once stalled (its end is said within a pass)."""
    recorder = Recorder(HotState(), rank=0, writer=None, flush_interval_s=20.0, hang_after_s=6.0,
                        hang_after_setup_s=6.0)
    now = recorder.progress.progress_perf  # the training thread's last act, as last looked
    assert abs(recorder._next_look_s(1.0, False, now, 20 * S) - 6.0) < 0.1  # a stall could be named in 6 s
    assert abs(recorder._next_look_s(1.0, False, now - 16 * S, 20 * S) - 4.0) < 0.1  # the flush is due in 4 s
    assert recorder._next_look_s(1.0, False, now - 30 * S, 20 * S) == 0.05  # overdue: at once, not in a loop
    assert recorder._next_look_s(1.0, True, now, 20 * S) == 1.0  # read by a live client
    assert recorder._next_look_s(1.0, False, None, 20 * S) == 1.0  # before the first flush
    recorder.progress.stalled_at = now
    assert recorder._next_look_s(1.0, False, now, 20 * S) == 1.0


def test_a_rank_nobody_reads_sleeps_until_its_queue_crowds_and_then_drains_at_once() -> None:
    """The real thread: after its first pass, a rank nobody reads is not looked at again before its flush (20 s
    here), but a queue that fills to a quarter of the raw ring wakes it (the hook's push releases its wait), and the
    pass drains it; no wakeup comes between. Each wait below is a bound, not a time measured."""
    state = HotState(raw_capacity=64)
    recorder = Recorder(state, rank=0, writer=None, flush_interval_s=20.0, hang_after_s=600.0,
                        hang_after_setup_s=600.0)
    recorder.start()
    try:
        deadline = time.monotonic() + 10
        while recorder.looks < 1 and time.monotonic() < deadline:  # the first pass (0.2 s after the start)
            time.sleep(0.05)
        time.sleep(3.0)  # the old schedule looked every second: three times here
        assert recorder.looks == 1
        t = recorder.last_activity()
        for seq in range(15):  # below a quarter of 64: no wake
            state.raw.push(RAW_WAIT, seq, t, t + 1, False, None, None, 0)
        time.sleep(1.0)
        assert recorder.looks == 1 and len(state.raw) == 15
        state.raw.push(RAW_WAIT, 15, t, t + 1, False, None, None, 0)  # the 16th: a quarter
        while len(state.raw) and time.monotonic() < deadline + 5:
            time.sleep(0.01)
        assert len(state.raw) == 0 and recorder.looks == 2
    finally:
        recorder.stop()


def test_the_programs_own_frames_are_told_from_the_libraries() -> None:
    import threading

    import torch

    assert is_program_code("/home/me/job/train.py")
    assert not is_program_code(torch.__file__)
    assert not is_program_code(threading.__file__)
    assert not is_program_code(__import__("zeromon_agent.recorder.progress").__file__)
    assert not is_program_code("<frozen importlib._bootstrap>")


def test_a_collective_in_a_rank_report_has_the_meaning_its_issuer_gives_as_in_the_recording() -> None:
    # A setup broadcast the script issues itself is no parameter broadcast, though its op and phase look like one
    # (the hang verdict once said "broadcast #1 (param_broadcast)" for a user's broadcast of a loaded checkpoint).
    def raw(op: str, phase: str, caller: str) -> tuple[object, ...]:
        return (RAW_COLLECTIVE, 1, op, op, 0, 0, 64, 64, None, None, False, None, phase, -1, None, False, caller)

    fsdp = "/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"
    assert call_of_raw(raw("all_gather", "forward", fsdp), "default", 1).meaning == "param_all_gather"
    assert call_of_raw(raw("broadcast", "setup", "/home/me/train.py"), "default", 1).meaning == "unknown"
    assert call_of_raw(raw("broadcast", "setup", "/site-packages/torch/distributed/utils.py"), "default",
                       1).meaning == "param_broadcast"  # DDP's and FSDP's module-state broadcast
