"""The training thread's stopwatch (tests/scenarios/overlap_truth.py) against zeromon's exposed communication: how
much of a step's difference the thread lost outside zeromon's wrapper, where no wrapper can time it.

The script reads its clock before a collective's call and after it returns; zeromon's wrapper reads its own at its
first and last statements. Between the two lie the caller's own code and the call's entry and return, where the
interpreter may hand the GIL to another thread (or the scheduler preempt the thread) for milliseconds on a busy
machine. That time is the thread's, and it is not zeromon's to count (issue 47); a step whose difference is more
than it is zeromon short, or long, inside its own calls.
"""

from __future__ import annotations

from typing import Any


def _outside_ns(thread: list[int], start_ns: int, length_s: float | None) -> int:
    """The thread's time in [thread[0], thread[1]] before zeromon's span [start_ns, start_ns + length_s] starts and
    after it ends."""
    if length_s is None:
        return 0
    end_ns = start_ns + round(length_s * 1e9)
    return max(0, start_ns - thread[0]) + max(0, thread[1] - end_ns)


def outside_wrapper_s(truth: dict[str, Any], call: Any) -> float:
    """Seconds of the step's issue call and wait, by the script's stopwatch (``truth``, its row of the step), outside
    zeromon's spans of them (``call``, the step's all-reduce as recorded: a CollectiveEvent)."""
    issue_s = call.issue_s if call.async_op else call.blocked_s
    outside = _outside_ns(truth["call_ns"], call.issue_ns, issue_s)
    if call.async_op and truth.get("wait_ns") and call.wait_ns is not None:
        outside += _outside_ns(truth["wait_ns"], call.wait_ns, call.blocked_s)
    return outside / 1e9
