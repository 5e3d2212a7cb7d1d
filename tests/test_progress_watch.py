"""The agent's own view of its progress (zeromon_agent.progress.ProgressWatch): when a rank is suspect, and that
it says so once per stall. Times are given, not waited for; the real runs are in tests/test_hang.py."""

from __future__ import annotations

from zeromon.model.progress import RESUMED, STALLED
from zeromon_agent.progress import STALL_FLOOR_S, STALL_SETUP_S, STALL_STEPS, ProgressWatch, is_program_code
from zeromon_agent.state import HotState

S = 10**9


def watch(durations: list[float], setting: float = 0.0) -> ProgressWatch:
    return ProgressWatch(HotState(), rank=0, threshold_s=setting, step_durations=lambda: durations)


def test_the_automatic_threshold_is_the_larger_of_30_s_and_ten_median_steps() -> None:
    assert watch([]).threshold() == STALL_SETUP_S == 300.0  # before the first step: setup's long silences
    assert STALL_FLOOR_S == 30.0
    assert watch([0.2] * 50).threshold() == 30.0
    assert watch([4.0, 5.0, 6.0, 60.0]).threshold() == STALL_STEPS * 5.5  # the median: one slow step moves it little
    assert watch([9.0] * 3, setting=12.0).threshold() == 12.0  # ZEROMON_HANG_AFTER wins


def test_a_stall_is_said_once_and_its_end_once() -> None:
    w = watch([], setting=5.0)
    state = w.state
    said = [w.tick(pushed=1, now=0)]
    said += [w.tick(pushed=1, now=t * S) for t in (1, 4, 5, 6, 60)]  # nothing queued since: no progress
    state.seq += 1  # a collective
    said += [w.tick(pushed=2, now=61 * S), w.tick(pushed=2, now=62 * S)]
    assert said == [None, None, None, STALLED, None, None, RESUMED, None]


def test_anything_the_training_thread_queues_is_progress() -> None:
    w = watch([], setting=5.0)
    w.tick(pushed=10, now=0)
    for t, pushed in ((3, 11), (6, 12), (9, 13)):  # a phase boundary, a memory sample, a wait every 3 s
        assert w.tick(pushed=pushed, now=t * S) is None
    w.state.step += 1
    assert w.tick(pushed=13, now=12 * S) is None  # a step ended
    assert w.tick(pushed=13, now=17 * S) == STALLED


def test_the_programs_own_frames_are_told_from_the_libraries() -> None:
    import threading

    import torch

    assert is_program_code("/home/me/job/train.py")
    assert not is_program_code(torch.__file__)
    assert not is_program_code(threading.__file__)
    assert not is_program_code(__import__("zeromon_agent.progress").__file__)
    assert not is_program_code("<frozen importlib._bootstrap>")
