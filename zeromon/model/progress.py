"""Where a rank is in its collectives: what each agent publishes so that a hang can be named.

Every rank's agent says, per process group, how many collectives it has issued (the group's own
sequence number, which the backend keeps and every rank counts alike), what the training thread is
blocked in now and since when, its Python stack, and when it last made progress (a collective
issued or completed, a step ended). zeromon.analysis.hang compares the ranks' reports; the live
endpoint serves the newest one (the snapshot's ``progress``) and the recording keeps those written when
the rank stalled, was stopped by a signal, or went on after a stall (ProgressReport).

Plain data, JSON both ways (``to_dict``, ``progress_from_dict``): a report read from a newer agent keeps
the fields it knows.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zeromon.model.classes import frozen

# RankProgress.reason
LIVE = "live"  # asked for by a live client
STALLED = "stalled"  # the rank made no progress for its threshold
RESUMED = "resumed"  # it made progress again after a stall was reported
# otherwise the rank's end, as RunEnd.how says it: "signal SIGTERM", "exit"

STACK_FRAMES_KEPT = 64  # the innermost frames of a stack: a recursion must not make a report of megabytes


@frozen
class StackFrame:
    """One frame of a Python stack."""

    file: str
    line: int
    function: str

    @property
    def where(self) -> str:
        """``hang.py:17``: the file's name and the line."""
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_list(self) -> list[Any]:
        return [self.file, self.line, self.function]


@frozen
class CallInfo:
    """One collective as ranks compare it: where it sits in its group's order, and what it moves."""

    group: str  # the process group's name (torch's group_name: the same on every rank of the group)
    seq: int  # its number in the group, from 1 (the group's sequence number when it was issued); 0: not known
    op: str  # "all_gather", ... (CollectiveEvent.op)
    meaning: str  # "param_all_gather", ... (ZeroMeaning)
    bytes: int  # the larger of what it sends and receives
    dtype: str
    phase: str  # the step phase it was issued in
    step: int  # the step it was issued in (from 0; -1: before the first)

    @property
    def signature(self) -> tuple[str, int, str]:
        """What every rank of the group must agree on at one sequence number."""
        return (self.op, self.bytes, self.dtype)


@frozen
class Blocked:
    """What the training thread is blocked in: a collective's call, or the wait of an async one."""

    call: CallInfo
    waiting: bool  # in the wait of an async collective (Work.wait), not in the call itself
    since_ns: int  # Unix ns: when the call (or the wait) began
    module: str | None = None  # the model's submodule it was issued for, where the stack shows it


@frozen
class GroupState:
    """A process group as one rank sees it."""

    group: str  # torch's group_name
    desc: str  # torch's group_desc ("default_pg", "mesh_dp", ...; "" where it has none)
    ranks: tuple[int, ...]  # the group's global ranks
    issued: int  # collectives issued in it so far (its sequence number); -1: the backend does not say
    last: CallInfo | None = None  # the newest collective zeromon recorded in it
    last_done: bool = True  # that one has completed

    @property
    def label(self) -> str:
        """How the group is named to a user: its description where it has one, else its number."""
        if self.desc == "default_pg":
            return "the default group"
        desc = self.desc.removeprefix("mesh_")
        if desc and desc != "undefined":
            return f"group {desc}"
        return f"group {self.group}"


@frozen
class RankProgress:
    """One rank's progress at one moment (``t_ns``, on its own clock)."""

    rank: int
    t_ns: int
    reason: str  # LIVE, STALLED, RESUMED, or the rank's end ("signal SIGTERM")
    step: int  # the step it is in (from 0; -1: before the first)
    collectives: int  # collectives the agent recorded so far
    progress_ns: int  # Unix ns of the last progress seen: a collective issued or completed, a step ended
    threshold_s: float  # no progress for this long makes the rank suspect (its agent's setting, or auto)
    blocked: Blocked | None
    groups: tuple[GroupState, ...]
    stack: tuple[StackFrame, ...]  # the training thread's Python stack, outermost first
    where: StackFrame | None  # the innermost frame of the program's own code (not the stdlib's, not a library's)
    stalled_s: float | None = None  # RESUMED: how long the stall lasted
    host: str | None = None
    pid: int | None = None

    @property
    def idle_s(self) -> float:
        """Seconds without progress when the report was made."""
        return max(0.0, (self.t_ns - self.progress_ns) / 1e9)

    @property
    def stalled(self) -> bool:
        return self.idle_s >= self.threshold_s

    def group(self, name: str) -> GroupState | None:
        return next((g for g in self.groups if g.group == name), None)

    def to_dict(self) -> dict[str, Any]:
        blocked = self.blocked
        return {
            "rank": self.rank, "t_ns": self.t_ns, "reason": self.reason, "step": self.step,
            "collectives": self.collectives, "progress_ns": self.progress_ns, "threshold_s": self.threshold_s,
            "blocked": None if blocked is None else {
                "call": _call_dict(blocked.call), "waiting": blocked.waiting, "since_ns": blocked.since_ns,
                "module": blocked.module},
            "groups": [{"group": g.group, "desc": g.desc, "ranks": list(g.ranks), "issued": g.issued,
                        "last": _call_dict(g.last) if g.last is not None else None, "last_done": g.last_done}
                       for g in self.groups],
            "stack": [frame.to_list() for frame in self.stack],
            "where": self.where.to_list() if self.where is not None else None,
            "stalled_s": self.stalled_s, "host": self.host, "pid": self.pid,
        }


def _call_dict(call: CallInfo) -> dict[str, Any]:
    return {"group": call.group, "seq": call.seq, "op": call.op, "meaning": call.meaning, "bytes": call.bytes,
            "dtype": call.dtype, "phase": call.phase, "step": call.step}


class ProgressFormatError(ValueError):
    """A progress report that is not one (a wrong type, a missing field)."""


def _get(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in (kinds if isinstance(kinds, tuple) else (kinds,)):
        raise ProgressFormatError(f"progress.{key} is {value!r}")
    if not isinstance(value, kinds):
        raise ProgressFormatError(f"progress.{key} is {value!r}")
    return value


def _call(data: Any) -> CallInfo:
    if not isinstance(data, Mapping):
        raise ProgressFormatError("a collective of a progress report is not an object")
    return CallInfo(group=str(_get(data, "group", str)), seq=_get(data, "seq", int), op=_get(data, "op", str),
                    meaning=_get(data, "meaning", str), bytes=_get(data, "bytes", int), dtype=_get(data, "dtype", str),
                    phase=_get(data, "phase", str), step=_get(data, "step", int))


def _frame(data: Any) -> StackFrame:
    if not (isinstance(data, list) and len(data) == 3 and isinstance(data[0], str) and isinstance(data[1], int)
            and isinstance(data[2], str)):
        raise ProgressFormatError(f"a stack frame of a progress report is {data!r:.60}")
    return StackFrame(data[0], data[1], data[2])


def is_agent_file(path: str) -> bool:
    """Whether a frame's file is zeromon's agent's (its wrapper of a collective, its signal handler): a stack read
    by someone debugging their job leaves it out, wherever it stands (recordings made before the agent did so
    keep such frames: the readers take them out too)."""
    return "/zeromon_agent/" in path.replace("\\", "/")


def without_agent_frames(stack: tuple[StackFrame, ...]) -> tuple[StackFrame, ...]:
    """``stack`` without the agent's frames (is_agent_file); a stack that is nothing but the agent's (its own
    threads) as it is."""
    kept = tuple(frame for frame in stack if not is_agent_file(frame.file))
    return kept if kept or not stack else stack


def progress_from_dict(data: Any) -> RankProgress:
    """The RankProgress a to_dict() gave (from JSON). Raises ProgressFormatError for anything else."""
    if not isinstance(data, Mapping):
        raise ProgressFormatError("a progress report is not an object")
    raw_blocked = _get(data, "blocked", Mapping, optional=True)
    blocked = None
    if raw_blocked is not None:
        blocked = Blocked(call=_call(raw_blocked.get("call")), waiting=bool(raw_blocked.get("waiting")),
                          since_ns=_get(raw_blocked, "since_ns", int),
                          module=_get(raw_blocked, "module", str, optional=True))
    groups = []
    for g in _get(data, "groups", list):
        if not isinstance(g, Mapping):
            raise ProgressFormatError("a group of a progress report is not an object")
        last = g.get("last")
        groups.append(GroupState(group=_get(g, "group", str), desc=_get(g, "desc", str),
                                 ranks=tuple(int(r) for r in _get(g, "ranks", list)), issued=_get(g, "issued", int),
                                 last=_call(last) if last is not None else None,
                                 last_done=bool(g.get("last_done", True))))
    where = data.get("where")
    return RankProgress(
        rank=_get(data, "rank", int), t_ns=_get(data, "t_ns", int), reason=_get(data, "reason", str),
        step=_get(data, "step", int), collectives=_get(data, "collectives", int),
        progress_ns=_get(data, "progress_ns", int), threshold_s=float(_get(data, "threshold_s", (int, float))),
        blocked=blocked, groups=tuple(groups), stack=without_agent_frames(tuple(map(_frame, _get(data, "stack", list)))),
        where=_frame(where) if where is not None else None,
        stalled_s=_get(data, "stalled_s", (int, float), optional=True),
        host=_get(data, "host", str, optional=True), pid=_get(data, "pid", int, optional=True))
