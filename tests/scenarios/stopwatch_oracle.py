"""The stopwatch of tests/scenarios/exposed_oracle.py: the training thread's time inside every call in
which it blocks on communication, measured with time.perf_counter_ns and none of zeromon's code."""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

# Every torch.distributed collective FSDP1/2, DDP and DeepSpeed may call (zeromon_agent's list, written
# out again: the oracle shares no code with what it checks).
DIST_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_single", "all_gather_into_tensor",
    "_all_gather_base", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_single",
    "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "reduce", "all_to_all_single", "all_to_all",
    "gather", "scatter", "barrier", "send", "recv", "isend", "irecv",
)
DIST_ONLY = ("_broadcast_coalesced",)  # C++ functions re-exported in torch.distributed alone (DDP)
# DTensor's functional collectives (always async: waited by wait_tensor at first use).
FUNCTIONAL = (
    "all_reduce", "all_reduce_coalesced", "all_reduce_inplace", "all_gather_single", "all_gather_tensor",
    "all_gather_tensor_autograd", "all_gather_into_tensor_coalesced", "reduce_scatter_single",
    "reduce_scatter_tensor", "reduce_scatter_tensor_autograd", "reduce_scatter_tensor_coalesced",
    "all_to_all_single", "all_to_all_single_autograd", "broadcast", "permute_tensor", "wait_tensor",
)


class BlockedClock:
    """The training thread's time inside communication calls: a stopwatch around each outermost call."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.depth = 0
        self.blocked_ns = 0
        self.by_api: dict[str, int] = defaultdict(int)
        self.intervals: list[tuple[str, int, int]] = []  # (api, start ns, end ns) of each timed call

    def wrap(self, fn: Callable[..., Any], api: str) -> Callable[..., Any]:
        clock = self

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            # Other threads (gloo's, zeromon's recorder) and nested calls pass through untimed.
            if clock.depth or threading.get_ident() != clock.thread:
                return fn(*args, **kwargs)
            clock.depth = 1
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = time.perf_counter_ns()
                clock.depth = 0
                clock.blocked_ns += t1 - t0
                clock.by_api[api] += t1 - t0
                clock.intervals.append((api, t0, t1))

        return timed

    def take(self) -> tuple[int, dict[str, int], list[tuple[str, int, int]]]:
        """(blocked ns, blocked ns by API, the calls) since the last take; and start over."""
        taken = self.blocked_ns, dict(self.by_api), self.intervals
        self.blocked_ns = 0
        self.by_api.clear()
        self.intervals = []
        return taken


def install_oracle(clock: BlockedClock) -> None:
    """Wrap every way the training thread blocks on communication, over whatever is there now.

    One wrapper per function: an attribute holding a function wrapped under another name (the alias in
    torch.distributed, DeepSpeed's cached copies) gets the same wrapper, so that zeromon, attaching
    afterwards, still recognizes DeepSpeed's cache as what it wrapped.
    """
    import torch.distributed._functional_collectives as funcol

    wrappers: dict[int, Callable[..., Any]] = {}

    def rewrap(owner: Any, attr: str, api: str) -> None:
        current = getattr(owner, attr, None)
        if current is None:
            return
        if id(current) not in wrappers:
            wrappers[id(current)] = clock.wrap(current, api)
        setattr(owner, attr, wrappers[id(current)])

    for api in DIST_COLLECTIVES:
        rewrap(c10d, api, api)
        rewrap(dist, api, api)
    for api in DIST_ONLY:
        rewrap(dist, api, api)
    rewrap(c10d.Work, "wait", "Work.wait")
    for api in FUNCTIONAL:
        rewrap(funcol, api, f"funcol.{api}")
    backend = getattr(sys.modules.get("deepspeed.comm.comm"), "cdb", None)
    if backend is not None:  # DeepSpeed's TorchBackend cached these two when it initialized
        rewrap(backend, "all_gather_function", "all_gather_into_tensor")
        rewrap(backend, "reduce_scatter_function", "reduce_scatter_tensor")
