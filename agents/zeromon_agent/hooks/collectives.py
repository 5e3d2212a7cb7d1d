"""Wrap the torch.distributed collectives so that every call from FSDP1, FSDP2 and DeepSpeed is seen.

What is patched, and why:
- ``torch.distributed.<name>`` and ``torch.distributed.distributed_c10d.<name>``: FSDP2 looks up
  ``dist.all_gather_single`` at call time; the deprecated aliases (``_all_gather_base``,
  ``all_gather_into_tensor``) call the new names through distributed_c10d's globals, so both modules
  are patched and only the outermost call is recorded.
- ``Work.wait``: the time a thread blocks on an async collective, and its completion when it blocked.
- ``torch.distributed._functional_collectives``: DTensor's collectives (``clip_grad_norm_`` on FSDP2)
  bypass ``dist.*``; their wait is ``wait_tensor``.
- ``destroy_process_group`` (both modules): counted, so that the recorder lets go of the groups it keeps
  by object once it has drained their collectives (make_destroy_wrapper).
- DeepSpeed's ``TorchBackend`` caches ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` when it
  initializes: patch before that (``zeromon run`` does), or ``repatch_deepspeed()`` re-points the cache.

Its cost on the hot path is a benchmark's (tests/bench/bench_collective_overhead.py,
tests/bench/RESULTS.md). A completion callback on a gloo Work costs far more than the wrapper, so only
every Nth async call gets one (ZEROMON_ASYNC_SAMPLE_EVERY); the others are timed by their wait.
"""

from __future__ import annotations

import functools
import importlib
import sys
import weakref
from collections.abc import Callable
from sys import _getframe
from types import ModuleType
from typing import Any

from zeromon_agent.hooks import issuers
from zeromon_agent.hooks.after_import import AfterImport
from zeromon_agent.hooks.issuers import FINAL, issuer_path
from zeromon_agent.hooks.state import RAW_COLLECTIVE, RAW_DONE, RAW_WAIT, STATE, UNTIMED, HotState, perf_ns

Extract = Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, int, Any, Any, bool]]


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str, default: Any = None) -> Any:
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _list_bytes(tensors: Any) -> int:
    return sum(t.nbytes for t in tensors) if tensors else 0


def _first_dtype(tensors: Any) -> Any:
    return tensors[0].dtype if tensors else None


# Extractors: (bytes_in, bytes_out, dtype, group, async_op) from a call's arguments, by position or
# keyword (DeepSpeed passes keywords), written out: inspect.signature().bind would cost tens of times
# more a call. async_op is returned as passed (truthy); the recorder makes it a bool.
def _ex_inplace(group_pos: int, async_pos: int) -> Extract:
    def extract(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
        n = len(a)
        t = a[0] if n else k["tensor"]
        nbytes = t.nbytes
        return (nbytes, nbytes, t.dtype, a[group_pos] if n > group_pos else k.get("group"),
                a[async_pos] if n > async_pos else k.get("async_op", False))

    return extract


def _ex_all_reduce_coalesced(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    ts = a[0] if a else k["tensors"]
    n = _list_bytes(ts)
    return n, n, _first_dtype(ts), _arg(a, k, 2, "group"), _arg(a, k, 3, "async_op", False)


def _ex_out_in(out_name: str, in_name: str, group_pos: int, async_pos: int) -> Extract:
    """Functions of the form f(output_tensor, input_tensor, ...)."""

    def extract(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
        n = len(a)
        if n > 1:
            out, inp = a[0], a[1]
        else:
            out = a[0] if n else k[out_name]
            inp = k[in_name]
        return (inp.nbytes, out.nbytes, inp.dtype, a[group_pos] if n > group_pos else k.get("group"),
                a[async_pos] if n > async_pos else k.get("async_op", False))

    return extract


def _ex_all_gather(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    out = a[0] if a else k["tensor_list"]
    inp = a[1] if len(a) > 1 else k["tensor"]
    return inp.nbytes, _list_bytes(out), inp.dtype, _arg(a, k, 2, "group"), _arg(a, k, 3, "async_op", False)


def _ex_all_gather_coalesced(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    outs = a[0] if a else k["output_tensor_lists"]
    ins = a[1] if len(a) > 1 else k["input_tensor_list"]
    out_bytes = sum(_list_bytes(o) for o in outs)
    return (_list_bytes(ins), out_bytes, _first_dtype(ins), _arg(a, k, 2, "group"),
            _arg(a, k, 3, "async_op", False))


def _ex_reduce_scatter(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    out = a[0] if a else k["output"]
    ins = a[1] if len(a) > 1 else k["input_list"]
    return _list_bytes(ins), out.nbytes, out.dtype, _arg(a, k, 3, "group"), _arg(a, k, 4, "async_op", False)


def _ex_all_to_all(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    outs = a[0] if a else k["output_tensor_list"]
    ins = a[1] if len(a) > 1 else k["input_tensor_list"]
    return (_list_bytes(ins), _list_bytes(outs), _first_dtype(ins), _arg(a, k, 2, "group"),
            _arg(a, k, 3, "async_op", False))


def _ex_gather(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    t = a[0] if a else k["tensor"]
    gl = _arg(a, k, 1, "gather_list")
    return t.nbytes, _list_bytes(gl), t.dtype, _arg(a, k, 3, "group"), _arg(a, k, 4, "async_op", False)


def _ex_scatter(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    t = a[0] if a else k["tensor"]
    sl = _arg(a, k, 1, "scatter_list")
    return _list_bytes(sl), t.nbytes, t.dtype, _arg(a, k, 3, "group"), _arg(a, k, 4, "async_op", False)


def _ex_barrier(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    return 0, 0, None, _arg(a, k, 0, "group"), _arg(a, k, 1, "async_op", False)


def _ex_p2p(always_async: bool) -> Extract:
    def extract(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
        t = a[0] if a else k["tensor"]
        n = t.nbytes
        return n, n, t.dtype, _arg(a, k, 2, "group"), always_async

    return extract


def _ex_broadcast_coalesced(a: tuple[Any, ...], k: dict[str, Any]) -> tuple[int, int, Any, Any, bool]:
    # torch._C._broadcast_coalesced(process_group, tensors, buffer_size, src): DDP's parameter sync.
    tensors = a[1] if len(a) > 1 else k.get("tensors", ())
    n = _list_bytes(tensors)
    return n, n, _first_dtype(tensors), a[0] if a else k.get("process_group"), False


# Called as torch.distributed.<name> only (C++ functions re-exported there, not in distributed_c10d).
DIST_ONLY_SPECS: dict[str, tuple[str, Extract]] = {
    "_broadcast_coalesced": ("broadcast", _ex_broadcast_coalesced),
}

# api name -> (canonical op, extractor)
DIST_SPECS: dict[str, tuple[str, Extract]] = {
    "all_reduce": ("all_reduce", _ex_inplace(2, 3)),
    "all_reduce_coalesced": ("all_reduce", _ex_all_reduce_coalesced),
    "all_gather": ("all_gather", _ex_all_gather),
    "all_gather_single": ("all_gather", _ex_out_in("output_tensor", "input_tensor", 2, 3)),
    "all_gather_into_tensor": ("all_gather", _ex_out_in("output_tensor", "input_tensor", 2, 3)),
    "_all_gather_base": ("all_gather", _ex_out_in("output_tensor", "input_tensor", 2, 3)),
    "all_gather_coalesced": ("all_gather", _ex_all_gather_coalesced),
    "reduce_scatter": ("reduce_scatter", _ex_reduce_scatter),
    "reduce_scatter_single": ("reduce_scatter", _ex_out_in("output", "input", 3, 4)),
    "reduce_scatter_tensor": ("reduce_scatter", _ex_out_in("output", "input", 3, 4)),
    "_reduce_scatter_base": ("reduce_scatter", _ex_out_in("output", "input", 3, 4)),
    "broadcast": ("broadcast", _ex_inplace(2, 3)),
    "reduce": ("reduce", _ex_inplace(3, 4)),
    "all_to_all_single": ("all_to_all", _ex_out_in("output", "input", 4, 5)),
    "all_to_all": ("all_to_all", _ex_all_to_all),
    "gather": ("gather", _ex_gather),
    "scatter": ("scatter", _ex_scatter),
    "barrier": ("barrier", _ex_barrier),
    "send": ("send", _ex_p2p(False)),
    "recv": ("recv", _ex_p2p(False)),
    "isend": ("send", _ex_p2p(True)),
    "irecv": ("recv", _ex_p2p(True)),
}


def _c10d_files() -> frozenset[str]:
    """The files of torch.distributed's own collective helpers: broadcast_object_list, all_gather_object and
    the like call the collectives the agent wraps, and the logging decorators around them. A collective
    called from them was issued by their caller."""
    files = set()
    for name in ("torch.distributed.distributed_c10d", "torch.distributed.c10d_logger"):
        try:
            files.add(importlib.import_module(name).__file__)
        except Exception:  # noqa: BLE001 - another torch's layout: the direct caller is taken as is
            pass
    return frozenset(f for f in files if f)


def _record_async(state: HotState, api: str, op: str, t0: int, t1: int, b_in: int, b_out: int, dtype: Any,
                  group: Any, async_op: Any, result: Any, cuda: Any, caller: Any) -> None:
    state.seq += 1
    seq = state.seq
    work: Any = None
    sampled = False
    if async_op and result is not None:
        # The queue holds no Work: a Work holds its tensors (a DDP bucket, ZeRO's flat buffers), which must not
        # outlive the training's own references by the time the queue waits for the recorder's next pass (up to a
        # flush interval: a model's gradients in GPU memory, or a DDP run's buckets in tests/test_oom.py). Its id
        # names it: an int, which the garbage collector does not track, so the queued tuple is untracked at the
        # collector's first look and never walked again (a weak reference, tracked, took each tuple through the
        # generations into the oldest, and brought its full collections on: tests/bench/bench_gpu_drain.py). The
        # recorder polls a host one through HotState.works, held until a phase change sees it done or its wait;
        # one timed with CUDA events (whose tuple holds its events' numbers, ints too) through CudaTimer.refs, a
        # weak reference until its wait.
        work = id(result)
        pending = state.pending
        if len(pending) < state.pending_capacity:
            pending[id(result)] = seq
            if cuda is None:  # timed on the host: looked at, at phase changes, for when it completed
                works = state.works
                if len(works) < state.pending_capacity:
                    works[seq] = result
            else:  # timed with CUDA events: its wait is marked on the stream (make_wait)
                timer = state.device_timer
                timer.awaiting.add(seq)
                try:
                    timer.refs[seq] = weakref.ref(result)
                except TypeError:  # a Work type without weak references (a custom backend's): held until its wait
                    timer.refs[seq] = result
        # A completion callback times 1 in N collectives timed on the host; on a GPU the events do, or nothing
        # does (a step not timed on the device: a callback through an NCCL Work's future costs more than events).
        every = state.async_sample_every if cuda is None else 0
        if every:
            state.async_count += 1
            if state.async_count % every == 0:
                result.get_future().add_done_callback(lambda _f: state.raw.push(RAW_DONE, seq, perf_ns()))
                sampled = True
        if cuda is None:  # the issue ends as the call returns to its caller (make_wrapper: issue 47)
            t1 = perf_ns()
    state.raw.push(RAW_COLLECTIVE, seq, api, op, t0, t1, b_in, b_out, dtype, group, bool(async_op), work,
                   state.phase, state.step, cuda, sampled, caller)


def make_wrapper(fn: Callable[..., Any], api: str, op: str, extract: Extract,
                 state: HotState = STATE) -> Callable[..., Any]:
    """The recording wrapper of one collective API.

    The synchronous path is written out inline (each Python call is a cost on the training thread): two flag
    reads, the extractor, two clock reads and one record's fields pushed onto the bounded ring (state.Ring).
    """

    @functools.wraps(fn)
    def zeromon_collective(*args: Any, **kwargs: Any) -> Any:
        if state.inside or not state.enabled:
            if state.inside or state.autostart is None or not state.autostart():
                return fn(*args, **kwargs)
        # The call starts here, as its caller's stopwatch has it, and ends as it returns (issue 47): the thread's
        # time in this wrapper is the call's. A thread preempted in it (on a busy machine, often just after the issue
        # wakes gloo's workers) lost that time in the collective's call, not in its computation; clock reads around
        # the original call alone left it uncounted.
        t0 = perf_ns()
        try:
            # Who called: the issuer, which a collective's meaning comes from. Where not settled (its first call,
            # a shim, torch's own helpers), issuers.issuer_path looks.
            settled = FINAL.get(id(_getframe(1).f_code))
            caller = settled[1] if settled is not None else issuer_path(_getframe(1))
            b_in, b_out, dtype, group, async_op = extract(args, kwargs)
            cuda = state.cuda_timing
            if cuda is not None:
                cuda = cuda.begin(args, kwargs)
            else:  # no GPU (None), or a step not timed on it (UNTIMED)
                cuda = state.untimed
        except Exception as exc:  # noqa: BLE001 - never raise into training
            state.hook_error(f"collective:{api}", exc)
            return fn(*args, **kwargs)
        state.inside = True
        try:
            result = fn(*args, **kwargs)
        finally:
            t1 = perf_ns()
            state.inside = False
        try:
            if async_op and cuda is UNTIMED and result is not None:
                # On a GPU, an async collective of a step not timed on the device (most of a GPU run's): written
                # out, as the synchronous path is, without _record_async's call and branches (its cost on the host:
                # tests/bench/bench_collective_overhead.py part (g); before and after a change: ab_gpu_paths.py).
                state.seq = seq = state.seq + 1
                work = id(result)  # as _record_async records it, and why
                pending = state.pending
                if len(pending) < state.pending_capacity:
                    pending[id(result)] = seq
                    state.device_timer.untimed_waits.add(seq)  # its wait needs no completion check
                state.raw.push(RAW_COLLECTIVE, seq, api, op, t0, t1, b_in, b_out, dtype, group, True, work,
                               state.phase, state.step, cuda, False, caller)
            elif async_op:
                if cuda is not None and cuda is not UNTIMED:
                    cuda = state.device_timer.end(cuda, result is not None)
                _record_async(state, api, op, t0, t1, b_in, b_out, dtype, group, async_op, result, cuda, caller)
            elif cuda is not None and cuda is not UNTIMED:  # timed by its CUDA events (the recorder reads them)
                cuda = state.device_timer.end(cuda, False)
                state.seq = seq = state.seq + 1
                state.raw.push(RAW_COLLECTIVE, seq, api, op, t0, t1, b_in, b_out, dtype, group, False, None,
                               state.phase, state.step, cuda, False, caller)
            else:
                state.seq = seq = state.seq + 1
                state.raw.push(RAW_COLLECTIVE, seq, api, op, t0, t1, b_in, b_out, dtype, group, False, None,
                               state.phase, state.step, cuda, False, caller)
        except Exception as exc:  # noqa: BLE001
            state.hook_error(f"collective:{api}", exc)
        return result

    zeromon_collective.__zeromon_original__ = fn  # type: ignore[attr-defined]
    return zeromon_collective


def make_wait(orig_wait: Callable[..., Any], state: HotState = STATE) -> Callable[..., Any]:
    pending = state.pending

    @functools.wraps(orig_wait)
    def zeromon_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        seq = pending.pop(id(self), None)
        if seq is None:
            return orig_wait(self, *args, **kwargs)
        t0 = perf_ns()  # the wait starts where its caller's does (as a collective's call: make_wrapper)
        timer = state.device_timer
        if timer is not None:
            untimed = timer.untimed_waits
            if seq in untimed:
                # A GPU collective of a step not timed on the device (most of a GPU run's): no event, and no
                # completion check (on NCCL, Work.is_completed queries an event: a launch's cost).
                untimed.discard(seq)
                try:
                    return orig_wait(self, *args, **kwargs)
                finally:
                    t1 = perf_ns()
                    try:
                        state.raw.push(RAW_WAIT, seq, t0, t1, False, None, None, state.step)
                    except Exception as exc:  # noqa: BLE001
                        state.hook_error("Work.wait", exc)
            if seq in timer.awaiting:  # a collective timed with CUDA events
                timer.awaiting.discard(seq)
                timer.refs.pop(seq, None)
            else:
                timer = None
        state.works.pop(seq, None)
        stream = cuda_start = None
        try:
            # Whether it was done before the wait times a collective without events; one timed by the two
            # events of its wait does not need it.
            done_before = False if timer is not None and timer.can_mark(2) else self.is_completed()
            if timer is not None:
                stream = timer.current_stream()
                cuda_start = timer.mark(stream)  # where the stream begins to wait
        except Exception:  # noqa: BLE001
            done_before = False
        try:
            return orig_wait(self, *args, **kwargs)
        finally:
            t1 = perf_ns()
            try:
                cuda_end = timer.after_wait(stream) if timer is not None else None
                state.raw.push(RAW_WAIT, seq, t0, t1, done_before, cuda_end, cuda_start, state.step)
            except Exception as exc:  # noqa: BLE001
                state.hook_error("Work.wait", exc)

    zeromon_wait.__zeromon_original__ = orig_wait  # type: ignore[attr-defined]
    return zeromon_wait


# --- DTensor / functional collectives -------------------------------------------------------------

# api -> (canonical op, input is a list, positional index of the group argument)
FUNCOL_SPECS: dict[str, tuple[str, bool, int]] = {
    "all_reduce": ("all_reduce", False, 2),
    "all_reduce_coalesced": ("all_reduce", True, 2),
    "all_gather_single": ("all_gather", False, 2),
    "all_gather_tensor": ("all_gather", False, 2),
    "reduce_scatter_single": ("reduce_scatter", False, 3),
    "reduce_scatter_tensor": ("reduce_scatter", False, 3),
    "all_to_all_single": ("all_to_all", False, 3),
    "broadcast": ("broadcast", False, 2),
}


def _result_bytes(result: Any) -> int:
    if isinstance(result, (list, tuple)):
        return sum(_result_bytes(r) for r in result)
    elem = getattr(result, "elem", result)  # AsyncCollectiveTensor wraps the real output
    return int(elem.nbytes)


def _wait_key(result: Any) -> Any:
    if isinstance(result, (list, tuple)):
        return None
    return id(getattr(result, "elem", result))


def make_funcol_wrapper(fn: Callable[..., Any], name: str, op: str, list_input: bool, group_pos: int,
                        state: HotState = STATE) -> Callable[..., Any]:
    api = f"funcol.{name}"

    @functools.wraps(fn)
    def zeromon_funcol(*args: Any, **kwargs: Any) -> Any:
        if not state.enabled or state.inside:
            return fn(*args, **kwargs)
        t0 = perf_ns()  # the call from its start to its return (make_wrapper: issue 47)
        try:
            settled = FINAL.get(id(_getframe(1).f_code))
            caller = settled[1] if settled is not None else issuer_path(_getframe(1))
            t = args[0] if args else kwargs["self"]
            b_in = _list_bytes(t) if list_input else t.nbytes
            dtype = _first_dtype(t) if list_input else t.dtype
            group = args[group_pos] if len(args) > group_pos else kwargs.get("group")
        except Exception as exc:  # noqa: BLE001
            state.hook_error(f"collective:{api}", exc)
            return fn(*args, **kwargs)
        state.inside = True
        try:
            result = fn(*args, **kwargs)
        finally:
            state.inside = False
        try:
            b_out = _result_bytes(result)
            state.seq += 1
            key = _wait_key(result)
            # Functional collectives are always asynchronous: the result is waited on at first use.
            if key is not None and len(state.pending) < state.pending_capacity:
                state.pending[key] = state.seq
            state.raw.push(RAW_COLLECTIVE, state.seq, api, op, t0, perf_ns(), b_in, b_out, dtype, ("funcol", group),
                           True, None, state.phase, state.step, None, False, caller)
        except Exception as exc:  # noqa: BLE001
            state.hook_error(f"collective:{api}", exc)
        return result

    zeromon_funcol.__zeromon_original__ = fn  # type: ignore[attr-defined]
    return zeromon_funcol


def make_wait_tensor(orig: Callable[..., Any], state: HotState = STATE) -> Callable[..., Any]:
    pending = state.pending

    @functools.wraps(orig)
    def zeromon_wait_tensor(tensor: Any) -> Any:
        seq = pending.pop(id(tensor), None)
        if seq is None:
            return orig(tensor)
        t0 = perf_ns()
        try:
            return orig(tensor)
        finally:
            try:
                state.raw.push(RAW_WAIT, seq, t0, perf_ns(), False, None, None, state.step)
            except Exception as exc:  # noqa: BLE001
                state.hook_error("wait_tensor", exc)

    zeromon_wait_tensor.__zeromon_original__ = orig  # type: ignore[attr-defined]
    return zeromon_wait_tensor


# --- installing and removing the patches ----------------------------------------------------------

_installed: list[tuple[Any, str, Any]] = []  # (owner, attribute, original) to restore


def make_destroy_wrapper(fn: Callable[..., Any], state: HotState = STATE,
                         initialized: Callable[[], bool] | None = None) -> Callable[..., Any]:
    """``destroy_process_group``, counted: the recorder keeps the groups it has seen (their sizes, by object)
    until then. Held on, a destroyed group would keep its communicators and threads (gloo's workers, which can
    abort a finished rank at exit; NCCL's communicators and their GPU memory) for as long as zeromon runs.
    Once the default group is gone (``initialized()`` false after the call), ``state.on_world_destroyed`` lets go
    of the training's objects too, so that the script's own teardown (a gc.collect() after it) frees them and
    their groups then, not the agent at the interpreter's exit."""

    @functools.wraps(fn)
    def zeromon_destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            state.groups_destroyed += 1
            let_go = state.on_world_destroyed
            if let_go is not None and initialized is not None:
                try:
                    if not initialized():
                        let_go()
                except Exception as exc:  # noqa: BLE001 - never into the script's teardown
                    state.hook_error("destroy_process_group", exc)

    zeromon_destroy_process_group.__zeromon_original__ = fn  # type: ignore[attr-defined]
    return zeromon_destroy_process_group


def _set(owner: Any, name: str, value: Any) -> None:
    _installed.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def install(state: HotState = STATE) -> list[str]:
    """Patch torch.distributed (both modules) and Work.wait.

    Idempotent. Returns the API names wrapped. Recording starts only once ``state.enabled`` is set,
    so this can run at import time (before DeepSpeed caches functions) at the cost of a flag check.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    issuers.C10D_FILES = _c10d_files()
    wrapped: list[str] = []
    for api, (op, extract) in DIST_SPECS.items():
        original = getattr(c10d, api, None)
        if original is None or hasattr(original, "__zeromon_original__"):
            continue
        wrapper = make_wrapper(original, api, op, extract, state)
        _set(c10d, api, wrapper)
        if getattr(dist, api, None) is original:
            _set(dist, api, wrapper)
        wrapped.append(api)

    for api, (op, extract) in DIST_ONLY_SPECS.items():
        original = getattr(dist, api, None)
        if original is not None and not hasattr(original, "__zeromon_original__"):
            _set(dist, api, make_wrapper(original, api, op, extract, state))
            wrapped.append(api)

    work_cls = getattr(c10d, "Work", None)
    if work_cls is not None and not hasattr(work_cls.wait, "__zeromon_original__"):
        _set(work_cls, "wait", make_wait(work_cls.wait, state))

    destroy = getattr(c10d, "destroy_process_group", None)
    if destroy is not None and not hasattr(destroy, "__zeromon_original__"):
        wrapper = make_destroy_wrapper(destroy, state, getattr(c10d, "is_initialized", None))
        _set(c10d, "destroy_process_group", wrapper)
        if getattr(dist, "destroy_process_group", None) is destroy:
            _set(dist, "destroy_process_group", wrapper)

    repatch_deepspeed()
    return wrapped


# DTensor's functional collectives, patched once imported (install_functional)
_FUNCOL = "torch.distributed._functional_collectives"
_funcol_pending: list[AfterImport] = []  # the import hook waiting for them (uninstall removes it)


def install_functional(state: HotState = STATE) -> list[str]:
    """Patch DTensor's functional collectives and their wait_tensor, now where they are imported, else the moment
    they are (an import hook): a run that never uses DTensor (DDP, DeepSpeed, FSDP1) does not import them for
    zeromon (a cost at every rank's start: tests/bench/RESULTS.md), and code that imports their names later gets the wrappers.
    Idempotent. Returns the API names wrapped now."""
    funcol = sys.modules.get(_FUNCOL)
    if funcol is not None:
        return _patch_functional(funcol, state)
    if not _funcol_pending:
        _funcol_pending.append(AfterImport(_FUNCOL, lambda module: _functional_imported(module, state)).install())
    return []


def _functional_imported(module: ModuleType, state: HotState) -> None:
    """The import hook's callback: from inside someone's import, so it never raises."""
    _funcol_pending.clear()
    try:
        _patch_functional(module, state)
    except Exception as exc:  # noqa: BLE001
        state.hook_error("install_functional", exc)


def _patch_functional(funcol: Any, state: HotState) -> list[str]:
    wrapped: list[str] = []
    for name, (op, list_input, group_pos) in FUNCOL_SPECS.items():
        original = getattr(funcol, name, None)
        if original is not None and not hasattr(original, "__zeromon_original__"):
            _set(funcol, name, make_funcol_wrapper(original, name, op, list_input, group_pos, state))
            wrapped.append(f"funcol.{name}")
    if hasattr(funcol, "wait_tensor") and not hasattr(funcol.wait_tensor, "__zeromon_original__"):
        _set(funcol, "wait_tensor", make_wait_tensor(funcol.wait_tensor, state))
    return wrapped


def repatch_deepspeed() -> bool:
    """Point DeepSpeed's cached collective functions at the wrappers, if DeepSpeed initialized first."""
    comm = sys.modules.get("deepspeed.comm.comm")
    backend = getattr(comm, "cdb", None) if comm is not None else None
    if backend is None:
        return False
    import torch.distributed as dist

    changed = False
    for attr, api in (("all_gather_function", "all_gather_into_tensor"),
                      ("reduce_scatter_function", "reduce_scatter_tensor")):
        cached = getattr(backend, attr, None)
        current = getattr(dist, api, None)
        if cached is not None and current is not None and cached is not current \
                and getattr(current, "__zeromon_original__", None) is cached:
            _set(backend, attr, current)
            changed = True
    return changed


def uninstall() -> None:
    while _funcol_pending:
        _funcol_pending.pop().remove()
    while _installed:
        owner, name, original = _installed.pop()
        try:
            setattr(owner, name, original)
        except Exception:  # noqa: BLE001
            pass
