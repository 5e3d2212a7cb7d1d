"""Moments inside the forward and the backward where the agent looks at memory, in the steps that
walk the categories: a step's highest memory is rarely at a phase's end.

- FSDP2: each FSDPParamGroup's ``post_forward`` before it runs (the unit's parameters still
  gathered, its activations saved), ``pre_backward`` after it returns (gathered again, the next
  unit's all-gather prefetched) and ``post_backward`` before it runs (the unsharded gradients
  computed, not yet reduce-scattered): where FSDPMemTracker takes its "Before Post-Forward", "After
  Pre-Backward" and "Before Post-Backward" snapshots. Wrapped on the instance, as FSDPMemTracker
  does (FSDP2 looks the methods up at each call); outside walk steps a wrapper reads one flag.
  FSDPMemTracker's ``__exit__`` puts back the methods it found on entry; wrappers it did not see
  are installed again at the next walk step.
- Other models (FSDP1, DeepSpeed, DDP, a plain module): the blocks (FSDP1's units, else the
  entries of the largest ModuleList or Sequential, else the root's children with parameters). In a
  walk step's forward only: a forward hook at each block's end (prepended, so that it runs before
  DeepSpeed ZeRO-3 releases the block's parameters), and on the block's output a gradient hook, at
  the start of the block's backward (after FSDP1 or ZeRO-3 gathered the parameters again).

``on_point("forward_point" | "backward_point")`` is called at each moment while armed; it must not
raise (the agent routes it through the phase tracker's guarded, timed boundary).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from zeromon.model.classes import mutable
from zeromon_agent.memory.readings import fsdp2_groups

# FSDPParamGroup method -> (point, whether the point is after the call)
_FSDP2_POINTS: tuple[tuple[str, str, bool], ...] = (
    ("post_forward", "forward_point", False),
    ("pre_backward", "backward_point", True),
    ("post_backward", "backward_point", False),
)
_REDISCOVER_EVERY = 50  # arms between two searches of the model for FSDP2 groups or blocks


class MemoryPoints:
    def __init__(self, on_point: Callable[[str], None]) -> None:
        self.on_point = on_point
        self.armed = False
        self._model: Any = None
        self._arms = 0
        self._groups: list[Any] = []
        self._blocks: list[Any] = []
        self._wrapped: list[tuple[Any, str, Any, Any]] = []  # (group, method, our wrapper, what it replaced)
        self._block_handles: list[Any] = []

    # --- arming -----------------------------------------------------------------------------------
    def arm(self, model: Any) -> None:
        """Look at memory at this step's moments, from now until ``disarm``."""
        self.disarm()
        if model is None:
            return
        if model is not self._model or self._arms % _REDISCOVER_EVERY == 0:
            self._discover(model)
        self._arms += 1
        if self._groups:
            for group in self._groups:
                self._wrap_group(group)
        else:
            for block in self._blocks:
                self._block_handles.append(block.register_forward_hook(self._block_forward_end, prepend=True))
        self.armed = True

    def disarm(self) -> None:
        self.armed = False
        handles, self._block_handles = self._block_handles, []
        for handle in handles:
            handle.remove()

    def close(self) -> None:
        """Remove the wrappers that are still the ones FSDP2 calls (one wrapped in turn by another
        tool stays, and passes through)."""
        self.disarm()
        for group, name, wrapper, previous in reversed(self._wrapped):
            if group.__dict__.get(name) is wrapper:
                if previous is None:
                    del group.__dict__[name]
                else:
                    group.__dict__[name] = previous
        self._wrapped.clear()
        self._model, self._groups, self._blocks = None, [], []

    def _discover(self, model: Any) -> None:
        self._model = model
        self._groups = fsdp2_groups(model)
        self._blocks = [] if self._groups else _blocks(model)

    # --- FSDP2 ------------------------------------------------------------------------------------
    def _wrap_group(self, group: Any) -> None:
        for name, point, after in _FSDP2_POINTS:
            current = getattr(group, name, None)
            if current is None or self._is_ours(current):
                continue
            wrapper = self._wrapper(current, point, after)
            previous = group.__dict__.get(name)
            group.__dict__[name] = wrapper
            self._wrapped.append((group, name, wrapper, previous))

    def _is_ours(self, fn: Any) -> bool:
        """Whether our wrapper is ``fn`` or inside it (FSDPMemTracker wraps with functools.wraps)."""
        for _ in range(8):
            if getattr(fn, "__zeromon_points__", None) is self:
                return True
            fn = getattr(fn, "__wrapped__", None)
            if fn is None:
                return False
        return False

    def _wrapper(self, original: Any, point: str, after: bool) -> Any:
        points = self
        if after:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                result = original(*args, **kwargs)
                if points.armed:
                    points.on_point(point)
                return result
        else:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if points.armed:
                    points.on_point(point)
                return original(*args, **kwargs)
        wrapper = functools.wraps(original)(wrapper)
        wrapper.__zeromon_points__ = self  # type: ignore[attr-defined]
        return wrapper

    # --- blocks (everything else) -----------------------------------------------------------------
    def _block_forward_end(self, module: Any, args: Any, output: Any) -> None:
        if not self.armed:
            return
        self.on_point("forward_point")
        try:
            for tensor in _grad_tensors(output):
                tensor.register_hook(self._block_backward_start)
        except Exception:  # noqa: BLE001 - an output we cannot hook is a moment missed, no more
            pass

    def _block_backward_start(self, grad: Any) -> None:
        if self.armed:
            self.on_point("backward_point")


def _grad_tensors(output: Any) -> list[Any]:
    """The tensors of a block's output that backward flows through (a tensor, or one level of
    tuple, list or dict); one is enough to know the block's backward has started."""
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else (output,)
    for item in items:
        if getattr(item, "requires_grad", False) and hasattr(item, "register_hook"):
            return [item]
    return []


def _blocks(model: Any) -> list[Any]:
    """The model's repeated blocks: FSDP1's units, else the entries of its largest ModuleList or
    Sequential, else its children that hold parameters."""
    fsdp1_mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp1_mod is not None:
        # The root unit's forward is the whole forward: not a block.
        units = [m for m in model.modules() if isinstance(m, fsdp1_mod.FullyShardedDataParallel) and m is not model]
        if units:
            return units
    import torch.nn as nn

    lists = [m for m in model.modules() if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) > 1]
    if lists:
        return list(max(lists, key=len))
    return [c for c in model.children() if next(c.parameters(), None) is not None]


@mutable
class Moment:
    """The highest moment of a forward or a backward so far: its level, time and sample fields."""

    level: int = -1
    t: int = 0
    fields: tuple[Any, ...] | None = None  # the sample's values (memory.watch.MEMORY_VALUES)


class PeakSearch:
    """Which of a walk step's moments to look at, and the highest seen in the current phase.

    The moments of a forward (or a backward) are numbered in the order they come, the phase's end
    last. A full search looks at all of them; the next walk steps look only at the highest one of
    the last full search and its two neighbours, since a training step repeats itself: 3 moments a
    phase instead of up to 3 per FSDP unit. A full search again every ``full_every`` walk steps, or
    as soon as a phase has a different number of moments or its peak moved to a neighbour.
    """

    def __init__(self, full_every: int = 16) -> None:
        self.full_every = full_every
        self.best: Moment | None = None  # None: no search under way
        self._walk_steps = 0
        self._full = True
        self._phase = ""
        self._index = 0
        self._best_index = -1
        self._learned: dict[str, tuple[int, int]] = {}  # phase -> (index of its peak, moments)

    def begin_step(self) -> None:
        self._full = self._walk_steps % self.full_every == 0 or len(self._learned) < 2
        self._walk_steps += 1

    def begin_phase(self, phase: str) -> None:
        self.best = Moment()
        self._phase, self._index, self._best_index = phase, 0, -1

    def wants(self) -> bool:
        """Whether to look at the moment that has come (each call is the next moment)."""
        index = self._index
        self._index += 1
        if self._full:
            return True
        learned = self._learned.get(self._phase)
        return learned is None or abs(index - learned[0]) <= 1

    def offer(self, level: int, t: int, fields: tuple[Any, ...]) -> None:
        best = self.best
        if best is not None and level > best.level:
            best.level, best.t, best.fields = level, t, fields
            self._best_index = self._index - 1

    def end_phase(self) -> Moment | None:
        """The phase's highest moment (None if none was looked at); learns where it was."""
        best, self.best = self.best, None
        moments, phase = self._index, self._phase
        learned = self._learned.get(phase)
        if self._full:
            self._learned[phase] = (self._best_index, moments)
        elif learned is not None and (learned[1] != moments or self._best_index != learned[0]):
            del self._learned[phase]  # another shape of step, or the peak moved: search all next time
            self._walk_steps = 0
        return best if best is not None and best.fields is not None else None

    def end_step(self) -> None:
        self.best = None
