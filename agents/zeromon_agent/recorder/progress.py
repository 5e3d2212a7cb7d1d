"""Where this rank is in its collectives, read off the training thread: progress, stalls, stacks.

Nothing here runs on the training thread, and the hot path pays nothing for it:
- progress is seen by the recorder's thread, once a pass, as a change in what the training thread has
  queued (ProgressWatch.tick): a collective, a wait, a phase boundary, a memory sample;
- what the training thread is blocked in is read from its own frames (``sys._current_frames``): a
  collective's wrapper frame holds the call's op, group, sizes and start time as its locals;
- each group's sequence number is the backend's own (``_get_sequence_number_for_group``): the count the
  ranks' backends match collectives by, including the ones zeromon does not record.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import sysconfig
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from zeromon.model.progress import (
    RESUMED,
    STACK_FRAMES_KEPT,
    STALLED,
    Blocked,
    CallInfo,
    GroupState,
    RankProgress,
    StackFrame,
    without_agent_frames,
)
from zeromon_agent.hooks import collectives
from zeromon_agent.hooks.issuers import issuer_of
from zeromon_agent.hooks.state import (
    AT_BYTES_IN,
    AT_BYTES_OUT,
    AT_CALLER,
    AT_DTYPE,
    AT_GROUP,
    AT_OP,
    AT_PHASE,
    AT_SEQ,
    AT_STEP,
    RAW_COLLECTIVE,
    HotState,
)
from zeromon_agent.recorder.step_acc import meaning_of

# The automatic threshold: a rank is suspect after the larger of these (ZEROMON_HANG_AFTER sets one).
STALL_FLOOR_S = 30.0
STALL_STEPS = 10  # ... and this many median steps: a run whose steps are slow is not hung
# Before its first step ends, a rank loads checkpoints, downloads weights, compiles: minutes without a
# collective are common there, and the others wait for it in a barrier or a broadcast.
STALL_SETUP_S = 300.0
MODULE_FRAMES = 40  # frames looked at, outward from a blocked call, for the model's submodule it serves


# The agent's own folder (zeromon_agent/, two up from this file): its frames are not the program's code.
_AGENT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _inner_code(factory: Callable[..., Any], name: str) -> types.CodeType:
    """The code object of the function ``factory`` defines as ``name``: every wrapper it makes shares it."""
    return next(c for c in factory.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == name)


_CALL_CODES = frozenset({_inner_code(collectives.make_wrapper, "zeromon_collective"),
                         _inner_code(collectives.make_funcol_wrapper, "zeromon_funcol")})
_WAIT_CODES = frozenset({_inner_code(collectives.make_wait, "zeromon_wait"),
                         _inner_code(collectives.make_wait_tensor, "zeromon_wait_tensor")})
_ANY_CODES = _CALL_CODES | _WAIT_CODES


def _library_prefixes() -> tuple[str, ...]:
    """Where code that is not the program's own lives: the standard library, installed packages, zeromon."""
    paths = sysconfig.get_paths()
    found = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if paths.get(key)}
    import zeromon

    found.add(_AGENT_ROOT)
    found.add(os.path.dirname(os.path.abspath(zeromon.__file__)))
    return tuple(os.path.join(path, "") for path in sorted(found))


@functools.lru_cache(maxsize=4096)  # a stack's files repeat from one report to the next
def is_program_code(filename: str) -> bool:
    """Whether a frame's file is the training program's own (not the standard library's, a package's, zeromon's)."""
    if filename.startswith("<"):  # <frozen ...>, <string>
        return False
    return not os.path.abspath(filename).startswith(_libraries())


@functools.cache
def _libraries() -> tuple[str, ...]:
    return _library_prefixes()


def stack_of(frame: types.FrameType | None) -> tuple[StackFrame, ...]:
    """A frame's stack, outermost first, the innermost STACK_FRAMES_KEPT of it."""
    frames: list[StackFrame] = []
    while frame is not None and len(frames) < STACK_FRAMES_KEPT:
        code = frame.f_code
        frames.append(StackFrame(code.co_filename, frame.f_lineno or 0, code.co_name))
        frame = frame.f_back
    frames.reverse()
    return tuple(frames)


def innermost_program_frame(stack: Iterable[StackFrame]) -> StackFrame | None:
    """Where the stack leaves the program's own code: its innermost frame that is not a library's."""
    return next((f for f in reversed(tuple(stack)) if is_program_code(f.file)), None)




# --- process groups -----------------------------------------------------------------------------------

def _c10d() -> Any:
    return sys.modules.get("torch.distributed.distributed_c10d")


def resolve_group(group: Any) -> Any:
    """The ProcessGroup a collective's group argument means (None: the default group); None if unknown."""
    c10d = _c10d()
    if c10d is None:
        return None
    try:
        if isinstance(group, tuple) and len(group) == 2 and group[0] == "funcol":
            group = group[1]
        if group is None:
            return c10d._get_default_group()
        if isinstance(group, c10d.ProcessGroup):
            return group
        if isinstance(group, str):
            return c10d._resolve_process_group(group)
        get_group = getattr(group, "get_group", None)  # a one-dimensional DeviceMesh
        return get_group() if callable(get_group) else None
    except Exception:  # noqa: BLE001 - a group that cannot be named is left unnamed
        return None


def _group_names() -> dict[Any, str]:
    c10d = _c10d()
    if c10d is None:
        return {}
    try:
        return dict(c10d._world.pg_names)
    except Exception:  # noqa: BLE001 - no default group yet, or a torch without these
        return {}


def issued_in_all_groups() -> int | None:
    """The collectives this process issued in all its process groups, by the backends' own counts (their
    sequence numbers, which count what C++ issues too: DDP's reducer, extensions); None where a backend keeps
    none or there is no group yet."""
    total = 0
    for pg in _group_names():
        try:
            issued = int(pg._get_sequence_number_for_group())
        except Exception:  # noqa: BLE001 - a backend that keeps no sequence number
            return None
        total += max(0, issued)
    return total if _group_names() else None


def _group_state(pg: Any, name: str) -> GroupState:
    c10d = _c10d()
    try:
        ranks = tuple(sorted(c10d._world.pg_group_ranks.get(pg, {})))
    except Exception:  # noqa: BLE001
        ranks = ()
    try:
        issued = int(pg._get_sequence_number_for_group())
    except Exception:  # noqa: BLE001 - a backend that keeps no sequence number
        issued = -1
    desc = getattr(pg, "group_desc", "") or ""
    return GroupState(group=name, desc=str(desc), ranks=ranks, issued=issued)


# --- the blocked call ---------------------------------------------------------------------------------

def _dtype_name(dtype: Any) -> str:
    return "" if dtype is None else str(dtype).replace("torch.", "")


def call_of_raw(item: tuple[Any, ...], group: str, seq: int) -> CallInfo:
    """A raw collective record (state.RAW_COLLECTIVE) as a CallInfo, numbered ``seq`` in ``group``."""
    op, b_in, b_out = item[AT_OP], item[AT_BYTES_IN], item[AT_BYTES_OUT]
    nbytes = max(b_in, b_out)
    meaning = meaning_of(op, item[AT_PHASE], nbytes, issuer_of(item[AT_CALLER]))  # as the recording says it
    return CallInfo(group=group, seq=seq, op=op, meaning=meaning, bytes=nbytes,
                    dtype=_dtype_name(item[AT_DTYPE]), phase=item[AT_PHASE], step=item[AT_STEP])


def _find(frame: types.FrameType | None, codes: frozenset[types.CodeType]) -> types.FrameType | None:
    while frame is not None:
        if frame.f_code in codes:
            return frame
        frame = frame.f_back
    return None


class ProgressWatch:
    """This rank's progress, seen from the recorder's thread, and its reports (RankProgress)."""

    def __init__(self, state: HotState, rank: int, threshold_s: float = 0.0,
                 step_durations: Callable[[], list[float]] | None = None, setup_threshold_s: float = 0.0) -> None:
        self.state = state
        self.rank = rank
        self.threshold_s = threshold_s  # 0: automatic (STALL_FLOOR_S, STALL_STEPS median steps)
        self.setup_threshold_s = setup_threshold_s  # before the first step ends; 0: automatic (STALL_SETUP_S)
        self.step_durations = step_durations or list
        self.clock_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.main_ident = threading.main_thread().ident
        self.host, self.pid = os.uname().nodename, os.getpid()
        self.model_of: Callable[[], Any] = lambda: None  # the model, for the names of its submodules (the agent's)
        self._named: tuple[Any, dict[int, str]] | None = None  # (a weak reference to the model, its names by id)
        self.progress_perf = time.perf_counter_ns()  # when the training thread last did something, as last looked
        self.stalled_at: int | None = None  # perf ns of the progress before a reported stall

    # --- progress ------------------------------------------------------------------------------------
    def tick(self, activity: int, now: int) -> str | None:
        """One look, from the recorder's thread; ``activity``: perf_ns of the training thread's newest record (the
        time it happened, however late the look). STALLED when the rank has just gone its threshold without
        progress, RESUMED when it moved again after that was said, else None."""
        if activity > self.progress_perf:
            self.progress_perf = activity
            if self.stalled_at is not None:
                return RESUMED
            return None
        if self.stalled_at is None and (now - self.progress_perf) / 1e9 >= self.threshold():
            self.stalled_at = self.progress_perf
            return STALLED
        return None

    def threshold(self) -> float:
        """No progress for this long makes the rank suspect. Before the first step has ended: the setup setting,
        else the larger of STALL_SETUP_S and the training's setting (a threshold chosen for steps would call a
        checkpoint's load hung). After: the setting, else the larger of STALL_FLOOR_S and STALL_STEPS median steps."""
        durations = self.step_durations()
        if not durations:
            return self.setup_threshold_s or max(STALL_SETUP_S, self.threshold_s)
        if self.threshold_s:
            return self.threshold_s
        return max(STALL_FLOOR_S, STALL_STEPS * statistics.median(durations))

    # --- reports ---------------------------------------------------------------------------------------
    def report(self, reason: str, recent: list[tuple[Any, ...]], inflight: set[int],
               activity: int | None = None) -> RankProgress:
        """This rank's progress now. ``recent``: the newest raw collectives, newest first; ``inflight``: the
        seqs of async collectives not known complete; ``activity``: perf_ns of the training thread's newest record,
        fresher than the last look (a RESUMED report ends the stall it follows)."""
        progress_perf = max(self.progress_perf, activity or 0)
        now_ns = time.time_ns()
        names = _group_names()
        frame = self._training_frame(sys._current_frames())
        stack = without_agent_frames(stack_of(frame))  # the user's stack: no frame of zeromon's wrappers in it
        blocked = self._blocked(frame, names, recent)
        groups = self._groups(names, recent, inflight, blocked)
        stalled_s = None
        if reason == RESUMED and self.stalled_at is not None:
            stalled_s = round((self.progress_perf - self.stalled_at) / 1e9, 3)
            self.stalled_at = None
        state = self.state
        return RankProgress(
            rank=self.rank, t_ns=now_ns, reason=reason, step=state.step, collectives=state.seq,
            progress_ns=progress_perf + self.clock_offset_ns, threshold_s=round(self.threshold(), 3),
            blocked=blocked, groups=groups, stack=stack, where=innermost_program_frame(stack),
            stalled_s=stalled_s, host=self.host, pid=self.pid)

    def _training_frame(self, frames: Mapping[int, types.FrameType]) -> types.FrameType | None:
        ident = self._training_thread(frames)
        return frames.get(ident) if ident is not None else None

    def _training_thread(self, frames: Mapping[int, types.FrameType]) -> int | None:
        """The thread that trains: one inside a collective (the main thread first), else the main thread."""
        main = frames.get(self.main_ident) if self.main_ident is not None else None
        if main is not None and _find(main, _ANY_CODES) is not None:
            return self.main_ident
        here = threading.get_ident()
        return next((ident for ident, frame in frames.items()
                     if ident != here and _find(frame, _ANY_CODES) is not None), self.main_ident)

    def stacks(self, agent_frames: bool = False) -> list[dict[str, Any]]:
        """Every thread's stack (outermost first), the training thread first: what /api/v1/stacks serves. The
        program's threads without the agent's frames (its collective wrappers), unless ``agent_frames``; the agent's
        own threads as they are."""
        frames = sys._current_frames()
        training = self._training_thread(frames)
        threads = {t.ident: t for t in threading.enumerate()}
        out = []
        for ident, frame in frames.items():
            thread = threads.get(ident)
            name = thread.name if thread is not None else f"thread {ident}"
            stack = stack_of(frame)
            if not agent_frames:
                stack = without_agent_frames(stack)
            out.append({"thread": name, "ident": ident, "training": ident == training,
                        "zeromon": name.startswith("zeromon"), "daemon": bool(thread is not None and thread.daemon),
                        "where": (w.to_list() if (w := innermost_program_frame(stack)) is not None else None),
                        "stack": [f.to_list() for f in stack]})
        del frames
        return sorted(out, key=lambda t: (not t["training"], t["zeromon"], t["thread"]))

    def _blocked(self, frame: types.FrameType | None, names: Mapping[Any, str],
                 recent: list[tuple[Any, ...]]) -> Blocked | None:
        """What the training thread is inside: a collective's call, or an async collective's wait."""
        call_frame = _find(frame, _ANY_CODES)
        while call_frame is not None:
            local = call_frame.f_locals
            t0 = local.get("t0")
            call = None
            if not isinstance(t0, int):
                pass  # still reading its arguments: not in the call yet
            elif call_frame.f_code in _WAIT_CODES:
                # A synchronous call's own wait is not one zeromon tracks (no seq): its call is further out.
                raw = next((item for item in recent if item[AT_SEQ] == local.get("seq")), None)
                if raw is not None:
                    call = self._call(raw, names, recent, in_flight_call=False)
            else:
                state = self.state
                raw = (RAW_COLLECTIVE, 0, local.get("api", ""), local.get("op", ""), t0, t0, local.get("b_in") or 0,
                       local.get("b_out") or 0, local.get("dtype"), local.get("group"), bool(local.get("async_op")),
                       None, state.phase, state.step, None, False, local.get("caller"))
                call = self._call(raw, names, recent, in_flight_call=True)
            if call is not None and isinstance(t0, int):
                return Blocked(call=call, waiting=call_frame.f_code in _WAIT_CODES, since_ns=t0 + self.clock_offset_ns,
                               module=self._module_of(call_frame))
            call_frame = _find(call_frame.f_back, _ANY_CODES)
        return None

    def _call(self, raw: tuple[Any, ...], names: Mapping[Any, str], recent: list[tuple[Any, ...]],
              in_flight_call: bool) -> CallInfo:
        """``raw`` as a CallInfo numbered in its group: a call under way is the group's newest; a waited one is
        as many back as were issued in the group since."""
        group_arg = raw[AT_GROUP]
        pg = resolve_group(group_arg)
        name = names.get(pg, "") if pg is not None else ""
        if not name and isinstance(group_arg, tuple) and isinstance(group_arg[-1], str):
            name = group_arg[-1]
        seq = 0
        if pg is not None:
            try:
                issued = int(pg._get_sequence_number_for_group())
            except Exception:  # noqa: BLE001
                issued = 0
            later = 0 if in_flight_call else sum(1 for item in recent if item[AT_SEQ] > raw[AT_SEQ] and
                                                 resolve_group(item[AT_GROUP]) is pg)
            seq = max(0, issued - later)
        return call_of_raw(raw, name, seq)

    def _groups(self, names: Mapping[Any, str], recent: list[tuple[Any, ...]], inflight: set[int],
                blocked: Blocked | None) -> tuple[GroupState, ...]:
        """Every group of this process, with its newest recorded collective (``recent``, newest first)."""
        newest: dict[Any, tuple[Any, ...]] = {}  # pg -> its newest raw collective
        for raw in recent:
            pg = resolve_group(raw[AT_GROUP])
            if pg is not None and pg not in newest:
                newest[pg] = raw
        pending = set(self.state.pending.values())
        out = []
        for pg, name in names.items():
            state = _group_state(pg, name)
            item = newest.get(pg)
            if item is not None:
                # The newest recorded is the group's newest issued, but for a call under way (not recorded yet).
                in_call = blocked is not None and not blocked.waiting and blocked.call.group == name
                last = call_of_raw(item, name, max(0, state.issued - in_call))
                waited = blocked is not None and blocked.waiting and blocked.call.group == name \
                    and blocked.call.seq == last.seq
                done = not (item[AT_SEQ] in inflight or item[AT_SEQ] in pending or waited)
                state = dataclasses.replace(state, last=last, last_done=done)
            out.append(state)
        return tuple(sorted(out, key=lambda g: (len(g.group), g.group)))

    # --- the model's submodule ---------------------------------------------------------------------------
    def _module_of(self, frame: types.FrameType) -> str | None:
        """The model's submodule a blocked collective serves: the innermost module an outer frame holds."""
        names = self._names()
        if not names:
            return None
        current: types.FrameType | None = frame
        for _ in range(MODULE_FRAMES):
            if current is None:
                break
            local = current.f_locals
            for key in ("module", "mod", "self"):
                name = names.get(id(local.get(key)))
                if name is not None:
                    return name or "the model"
            current = current.f_back
        return None

    def _names(self) -> dict[int, str]:
        """The model's submodules' names by object id, made once per model."""
        root = self.model_of()
        if root is None:
            return {}
        if self._named is None or self._named[0]() is not root:
            try:
                names = {id(m): name for name, m in root.named_modules()}
                self._named = (weakref.ref(root), names)
            except Exception:  # noqa: BLE001 - a model that cannot be walked (or weakly referred to) has no names
                return {}
        return self._named[1]

    def release(self) -> None:
        """Let go of the model (the agent's stop)."""
        self.model_of, self._named = (lambda: None), None
