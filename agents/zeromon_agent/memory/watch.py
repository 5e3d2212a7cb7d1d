"""The agent's memory samples: one at each phase's end, and in walk steps the categories and the peaks.

Every step: a sample (allocator totals or RSS) at the forward's, the backward's and the step's end. In a walk
step (walk_due: within _WALK_BUDGET of step time) also the categories: at the forward's end, and at the moments
inside the forward and the backward that peaks.MemoryPoints names, keeping the highest of each: "forward_peak"
and "backward_peak" samples. The highest is by the allocator's allocated bytes on GPU (one read per moment, a
walk only at a new high) and by the categories' sum on CPU, which has no allocator count (a walk of what moves
per moment). Runs on the training thread, inside the phase tracker's guarded boundaries (Agent._on_boundary).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeromon_agent.context.config import AgentConfig
from zeromon_agent.hooks.state import RAW_MEMORY, RAW_OOM, HotState, perf_ns
from zeromon_agent.memory.activations import SavedTensorMeter
from zeromon_agent.memory.peaks import MemoryPoints, PeakSearch
from zeromon_agent.memory.readings import (
    Categorizer,
    CudaMemory,
    LocalRankCount,
    cpu_capacity,
    launched_local_ranks,
    local_ranks,
    process_rss,
)

# Keep the category walk (and activation counting) under this share of step time when
# ZEROMON_MEMORY_EVERY=auto.
_WALK_BUDGET = 0.0025
# The step at whose memory sample the ranks on this host are read from the store (memory.LocalRankCount):
# every rank has joined by then, since the first steps' collectives needed them all.
LOCAL_COUNT_STEP = 2

# A sample's values as the hot path queues them: MemorySample's fields after (rank, step, phase, t_ns), which the
# recorder puts before them (tests/test_recorder_fast_path.py holds the two orders together). A tuple, not a dict the
# recorder would read back key by key: a boundary's work runs cold between two phases of training, where each
# object it makes or reads costs the training thread several times what a warm loop says.
MEMORY_VALUES = ("device", "allocated", "reserved", "active", "peak_allocated", "peak_reserved", "inactive_split",
                 "num_alloc_retries", "num_ooms", "capacity", "free", "rss", "categories")
_ALLOCATOR = MEMORY_VALUES[1:9]  # CudaMemory.totals()'s order
_NO_ALLOCATOR = (None,) * len(_ALLOCATOR)
_ALLOCATED, _CATEGORIES = MEMORY_VALUES.index("allocated"), MEMORY_VALUES.index("categories")
MemoryValues = tuple[Any, ...]  # in MEMORY_VALUES' order

# What the walks look at: (model, optimizer, engine), what attach gave or else what the hooks found.
TrainingObjects = Callable[[], tuple[Any, Any, Any]]
# A Notice: (level, source, message).
NoticeSink = Callable[[str, str, str], None]


class MemoryWatch:
    """Memory samples and the peak search of walk steps, pushed to the recorder's control queue.
    ``boundary(what)`` is the phase tracker's timed boundary, through which the moments of a walk
    step are reported (so that their time is the agent's, not the forward's or backward's)."""

    def __init__(self, config: AgentConfig, state: HotState, objects: TrainingObjects,
                 boundary: Callable[[str], None], notice: NoticeSink) -> None:
        self.config = config
        self.state = state
        self._objects = objects
        self._notice = notice
        self.meter = SavedTensorMeter() if config.activations else None
        self.categorizer = Categorizer()
        self.points = MemoryPoints(boundary)
        self.search = PeakSearch()
        self.cuda_memory: CudaMemory | None = None
        self.device_name = "cpu"
        self.capacity: int | None = None
        # The ranks on this host where no launcher said (memory.LocalRankCount): joined at the first step's
        # memory sample, read at LOCAL_COUNT_STEP's; None once done or not needed.
        self._local_count: LocalRankCount | None = None
        self._walk_this_forward = False
        self._walk_spent_s = 0.0
        self._walk_cost_s = 0.0
        self._last_walk_step = -(10**9)
        self._step_started: tuple[int, float] | None = None  # (step, perf_counter at its first forward)
        self._step_s: float | None = None

    # --- the device -------------------------------------------------------------------------------
    def use_cuda(self, index: int) -> None:
        self.device_name = f"cuda:{index}"
        self.cuda_memory = CudaMemory(index)

    def use_cpu(self, world_size: int) -> str:
        """The host's memory as this rank's capacity (its share among the host's ranks); what the note says of it."""
        # Where no launcher says how many ranks this host runs and there are several in all, they are counted on
        # the store once training runs (_count_local_ranks); until then the note claims no count.
        counted_later = launched_local_ranks() is None and world_size > 1
        self.capacity, note = cpu_capacity(None if counted_later else local_ranks())
        if self.config.cpu_capacity:
            self.capacity, note = self.config.cpu_capacity, "capacity set by ZEROMON_CPU_CAPACITY"
        elif counted_later:
            self._local_count = LocalRankCount()
        return note

    def close(self) -> None:
        """The activation meter's and the moments' hooks off (Agent.stop)."""
        if self.meter is not None:
            self.meter.stop()
            self.meter.release()
        self.points.close()

    def release(self) -> None:
        """Let go of the training's objects the walks hold (Agent.stop), whatever closing the hooks met."""
        self.categorizer.release()

    # --- the phases' boundaries -------------------------------------------------------------------
    def time_step(self) -> None:
        """At a forward's start: the step's time (walk_due's budget) runs from its first forward."""
        step = self.state.step
        if self._step_started is None or self._step_started[0] != step:
            self._step_started = (step, time.perf_counter())

    def forward_start(self) -> None:
        self._finish_search()  # a forward with no backward after it (evaluation)
        self._walk_this_forward = self.walk_due()
        if self._walk_this_forward:
            self._begin_search()

    def forward_end(self) -> None:
        if self._walk_this_forward:
            self._end_forward_search()
        else:
            self.sample_memory("forward", categories=False)
        self._walk_this_forward = False

    def backward_end(self) -> None:
        if self.search.best is not None:
            self._end_backward_search()
        else:
            self.sample_memory("backward", categories=False)

    def step_end(self) -> None:
        started = self._step_started
        if started is not None and started[0] == self.state.step:
            self._step_s = time.perf_counter() - started[1]  # first forward to optimizer step
        self.sample_memory("optimizer", categories=False)

    def walk_due(self) -> bool:
        """Whether this forward starts a walk step (at most one a step): the categories at its end and
        the peaks of its forward and backward. ``_walk_cost_s`` is what the last walk step cost."""
        step = self.state.step
        if step >= 1 > self._last_walk_step:
            return True  # the first step after the first optimizer step: its state exists from now on
        if self.config.memory_every:
            every = self.config.memory_every
        elif self._step_s and self._walk_cost_s:
            every = max(1, math.ceil(self._walk_cost_s / (_WALK_BUDGET * self._step_s)))
        else:
            every = 1
        return step - self._last_walk_step >= every

    def walked_model(self) -> Any:
        """The module whose FSDP2 units or blocks hold the moments (a DeepSpeed engine's module)."""
        model, _, engine = self._objects()
        walked = getattr(engine, "module", None) if engine is not None else None
        return walked if walked is not None else model

    # --- the peak search of a walk step -------------------------------------------------------------
    def _begin_search(self) -> None:
        w0 = time.perf_counter()
        self._walk_spent_s = 0.0
        self.search.begin_step()
        self.search.begin_phase("forward")
        # What holds still (parameter shards, buffers, optimizer state) once; each moment of this
        # forward and its backward then walks only what moves.
        model, optimizer, engine = self._objects()
        self.categorizer.walk_still(model=model, optimizer=optimizer, engine=engine)
        if self.meter is not None:
            # Activations are counted in the walk steps only: the pack hook is a cost per saved
            # tensor, so it follows the same budget.
            self.meter.start(self.categorizer.buffer_pointers())
        self.points.arm(self.walked_model())
        self._walk_spent_s += time.perf_counter() - w0

    def at_point(self) -> None:
        """A moment inside this walk step's forward or backward: kept if memory is the highest yet."""
        search = self.search
        if search.best is None or not search.wants():
            return
        w0 = time.perf_counter()
        t = perf_ns()
        try:
            if self.cuda_memory is not None:
                level = self.cuda_memory.allocated()
                if level is None or level <= search.best.level:
                    return
                cats = self._categories(moving=True)
            else:
                cats = self._categories(moving=True)
                level = sum(cats.values())
                if level <= search.best.level:
                    return
            search.offer(level, t, self._memory_fields(cats))
        finally:
            self._walk_spent_s += time.perf_counter() - w0

    def _end_forward_search(self) -> None:
        """The forward's end (the ``forward`` sample, always walked) is its last moment; then the
        forward's peak."""
        w0 = time.perf_counter()
        search = self.search
        if self.meter is not None:
            self.meter.stop()  # its alive bytes follow the frees through the backward
        t = perf_ns()
        fields = self._memory_fields(self._categories(moving=True))
        self._last_walk_step = self.state.step
        if search.best is not None:
            search.wants()  # counted: the end is always looked at
            level = self._level(fields)
            if level is not None:
                search.offer(level, t, fields)
            peak = search.end_phase()
            if peak is not None and peak.fields is not None:  # fields: for mypy; end_phase checks
                self._push_memory("forward_peak", peak.t, peak.fields)
            search.begin_phase("backward")
        self._push_memory("forward", t, fields)
        self._walk_spent_s += time.perf_counter() - w0

    def _end_backward_search(self) -> None:
        """The backward's end is its last moment (all gradients there), then the backward's peak."""
        w0 = time.perf_counter()
        self.at_point()
        t = perf_ns()
        fields = self._memory_fields({})
        peak = self.search.end_phase()
        if peak is not None and peak.fields is not None:
            self._push_memory("backward_peak", peak.t, peak.fields)
        self._push_memory("backward", t, fields)
        self._walk_spent_s += time.perf_counter() - w0
        self._finish_search()

    def _finish_search(self) -> None:
        if self.search.best is None and not self.points.armed:
            return
        self.search.end_step()
        self.points.disarm()
        if self.meter is not None:
            self.meter.stop()
            self.meter.release()
        self._walk_cost_s = self._walk_spent_s

    def _categories(self, moving: bool) -> dict[str, int]:
        if moving:
            cats = self.categorizer.categorize_moving()
        else:
            model, optimizer, engine = self._objects()
            cats = self.categorizer.categorize(model=model, optimizer=optimizer, engine=engine)
        if self.meter is not None and self.points.armed:
            cats["activations"] = self.meter.alive_bytes
        return cats

    def _level(self, fields: MemoryValues) -> int | None:
        """What "highest" compares: allocated bytes on GPU, the categories' sum on CPU."""
        if self.cuda_memory is not None:
            return fields[_ALLOCATED]
        cats = fields[_CATEGORIES]
        return sum(cats.values()) if cats else None

    # --- samples ----------------------------------------------------------------------------------
    def sample_memory(self, phase: str, categories: bool, activations: int | None = None) -> None:
        """Take a memory sample at the end of ``phase`` (with the category walk if asked)."""
        t = perf_ns()
        cats: dict[str, int] = {}
        if categories:
            w0 = time.perf_counter()
            cats = self._categories(moving=False)
            self._walk_cost_s = time.perf_counter() - w0
            self._last_walk_step = self.state.step
        if activations is not None:
            cats["activations"] = activations
        if self._local_count is not None:
            self._count_local_ranks(self._local_count)
        self._push_memory(phase, t, self._memory_fields(cats))

    def _count_local_ranks(self, count: LocalRankCount) -> None:
        """The host's share of its memory per rank where no launcher said how many ranks it runs: each rank
        joins the count at its first sample, and reads it at LOCAL_COUNT_STEP (two store round trips, once)."""
        try:
            if not count.joined:
                if not count.join():
                    return
            if self.state.step < LOCAL_COUNT_STEP:
                return
            self._local_count = None
            ranks = count.read()
            if ranks is None or ranks == 1:
                return
            self.capacity, note = cpu_capacity(ranks)
            self._notice("info", "device", f"{note} (ranks on this host counted on the process group's store: "
                         "the launcher set no LOCAL_WORLD_SIZE)")
        except Exception as exc:  # noqa: BLE001 - the launcher's word (or 1) stands
            self._local_count = None
            self.state.hook_error("local_ranks", exc)

    def _memory_fields(self, cats: dict[str, int]) -> MemoryValues:
        """A MemorySample's values now (MEMORY_VALUES), with the categories ``cats`` (bytes; {}: none walked)."""
        cuda = self.cuda_memory
        if cuda is None:
            return (self.device_name, *_NO_ALLOCATOR, self.capacity, None, process_rss(), cats)
        totals = cuda.totals()
        capacity, free = cuda.capacity()
        allocated = totals[0]
        if cats and allocated is not None and len(cats) > ("activations" in cats):
            # On GPU the allocator's remainder: temporaries, caches, tensors outside the model.
            cats["other"] = max(0, allocated - sum(v for k, v in cats.items() if k != "other"))
        return (self.device_name, *totals, capacity, free, process_rss(), cats)

    def _push_memory(self, phase: str, t: int, fields: MemoryValues) -> None:
        self.state.control.push(RAW_MEMORY, phase, self.state.step, t, fields)

    # --- out of memory ----------------------------------------------------------------------------
    def observe_oom(self, torch: Any, run_dir: Path, rank: int) -> None:
        """An OomEvent at each CUDA out-of-memory, with the allocator's snapshot (a file in ``run_dir``) where
        ZEROMON_MEMORY_HISTORY records the allocator's history."""
        from zeromon_agent.hooks import cuda

        if self.config.memory_history:
            try:
                # A program that records the allocator's history already chose its own max_entries,
                # context and stacks; calling _record_memory_history again would replace them. Its
                # history serves the OOM snapshot as it is.
                already = getattr(torch._C, "_cuda_isHistoryEnabled", None)
                if already is not None and already():
                    self._notice("info", "cuda", "allocator history already on: the program's settings are kept "
                                 "for the OOM snapshot")
                else:
                    torch.cuda.memory._record_memory_history(max_entries=100000)
            except Exception as exc:  # noqa: BLE001
                self._notice("warning", "cuda", f"allocator history unavailable: {exc}")

        def on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
            try:
                snapshot = None
                if self.config.memory_history:
                    path = str(run_dir / f"oom-snapshot-rank-{rank}-{int(time.time())}.pickle")
                    snapshot = path if cuda.dump_snapshot(torch, path) else None
                info = {"allocated": int(device_alloc), "requested": int(alloc), "free": int(device_free)}
                self.state.control.push(RAW_OOM, perf_ns(), f"cuda:{device}", info, snapshot, self.state.phase,
                                        self.state.step)
            except Exception as exc:  # noqa: BLE001
                self.state.hook_error("oom_observer", exc)

        try:
            cuda.attach_oom_observer(torch, on_oom)
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("oom_observer", exc)
