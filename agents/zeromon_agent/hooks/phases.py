"""Step phases (forward, backward, optimizer, other) and step boundaries, found automatically.

- forward: the root module's forward pre-hook and forward hook. Without ``attach(model=...)`` the
  root is found on the first forward: the first top-level module call that owns trainable
  parameters (global module hooks, removed once the root is known).
- backward: every top-level ``torch.autograd.backward`` call (``loss.backward()``), from its start
  to its return.
- optimizer: torch's global optimizer step hooks; with DeepSpeed, the engine's ``backward`` and
  ``step`` (ZeRO-1/2 all-gather the updated parameters inside ``engine.step`` after the inner
  optimizer returns, so the engine's step is the phase).
- steps: a step ends when the optimizer step (or DeepSpeed's engine.step at a gradient-accumulation
  boundary) returns, and the next one starts there; the first starts at the root's first forward.
  With ``with zeromon_agent.step():`` a step is the block, from its entry to its exit.
- agent: zeromon's own work at a boundary (memory samples, category walks) is timed and recorded as
  its own phase, so that it counts as neither computation nor communication.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zeromon_agent.hooks.state import (
    RAW_AGENT,
    RAW_PHASE,
    RAW_SEEN_DONE,
    RAW_STEP_END,
    RAW_STEP_START,
    STATE,
    HotState,
    perf_ns,
)

# The root's hook registrations that keep_root_hooks_in_place follows.
_GUARDED_REGISTRATIONS = ("register_forward_pre_hook", "register_forward_hook")

# zeromon's work at a boundary shorter than this is not recorded as an `agent` span (two clock
# reads and a comparison are all it costs then).
_AGENT_SPAN_MIN_NS = 20_000


class PhaseTracker:
    def __init__(self, state: HotState = STATE, on_boundary: Callable[[str], None] | None = None) -> None:
        self.state = state
        # Called (guarded) at "forward_start", "forward_end", "backward_end", "optimizer_start", "step_end",
        # and at the agent's memory moments inside a forward or backward ("forward_point", "backward_point").
        self.on_boundary = on_boundary
        self.explicit_steps = False
        self.root: Any = None
        self.optimizer: Any = None  # the optimizer whose step ends a step; the first seen if not given
        self.engine: Any = None
        self._handles: list[Any] = []
        self._global_handles: list[Any] = []
        self._root_watch: Any = None
        self._autograd_patch: tuple[Any, Any] | None = None
        self._engine_patched: list[tuple[Any, str, Any]] = []

    # --- primitive transitions --------------------------------------------------------------------
    def set_phase(self, phase: str) -> int | None:
        """Enter ``phase``; the time of the change (perf ns), None where there was none."""
        state = self.state
        if state.enabled and state.phase != phase:
            state.phase = phase
            timer = state.cuda_timing  # on GPU the boundary is also marked on the stream
            t = perf_ns()
            state.control.push(RAW_PHASE, phase, t, state.step, timer.mark() if timer is not None else None)
            if state.works:
                self._look_at_works(t)
            return t
        return None

    def _look_at_works(self, t: int) -> None:
        """Bound the completion of the async collectives in flight: one found complete now was done
        by ``t`` (a few is_completed() calls per phase change; the exact time needs a callback)."""
        works = self.state.works
        try:
            done = [seq for seq, work in works.items() if work.is_completed()]
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("is_completed", exc)
            works.clear()
            return
        for seq in done:
            del works[seq]
            self.state.raw.push(RAW_SEEN_DONE, seq, t)

    def begin_training(self) -> None:
        if self.state.step < 0:
            self.state.step = 0
            self.state.time_step()

    def end_step(self) -> None:
        state = self.state
        if state.step < 0 or not state.enabled:
            return
        end = self._boundary("step_end", self.set_phase("other"))
        timer = state.cuda_timing
        state.control.push(RAW_STEP_END, state.step, end, timer.mark() if timer is not None else None,
                           self.explicit_steps)
        state.step += 1
        state.time_step()

    def _boundary(self, what: str, since: int | None = None) -> int:
        """The agent's work at boundary ``what``; when it is long enough to be seen, an `agent` span from
        ``since`` (the phase change just made, whose own cost is zeromon's too: no sliver of the phase
        between the two) or from the work's start. The time it ended (perf ns)."""
        state = self.state
        t0 = perf_ns()
        if self.on_boundary is not None and state.enabled:
            try:
                self.on_boundary(what)
            except Exception as exc:  # noqa: BLE001
                state.hook_error(f"boundary:{what}", exc)
            t1 = perf_ns()
            if t1 - t0 >= _AGENT_SPAN_MIN_NS:
                state.control.push(RAW_AGENT, state.step, t0 if since is None else since, t1, state.phase)
            return t1
        return t0

    # --- module hooks -----------------------------------------------------------------------------
    def set_root(self, module: Any) -> None:
        if self.root is module:
            return
        self.remove_module_hooks()
        self.root = module
        # prepend: the phase is set before FSDP's own pre-forward hook gathers the root's parameters;
        # the forward hook goes last, after FSDP's post-forward (which reshards and frees the last
        # all-gather buffer). Both stay there when others register hooks later (_RootHookGuard).
        self._handles.append(module.register_forward_pre_hook(self._on_forward_pre, prepend=True))
        self._handles.append(module.register_forward_hook(self._on_forward_post))
        for name in _GUARDED_REGISTRATIONS:
            module.__dict__[name] = _RootHookGuard(self, module, name)
        timer = self.state.device_timer
        if timer is not None and not timer.active:
            try:  # a model on the GPU: time its phases on the stream from the first step on
                param = next(module.parameters(), None)
                timer.active = bool(param is not None and param.is_cuda)
            except Exception as exc:  # noqa: BLE001
                self.state.hook_error("set_root", exc)

    def _on_forward_pre(self, module: Any, args: Any) -> None:
        try:
            if not self.explicit_steps:
                self.begin_training()
            self._boundary("forward_start", self.set_phase("forward"))
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("forward_pre", exc)

    def _on_forward_post(self, module: Any, args: Any, output: Any) -> None:
        try:
            if self.state.phase == "forward":
                self._boundary("forward_end", self.set_phase("other"))
            self.keep_root_hooks_in_place()
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("forward_post", exc)

    def keep_root_hooks_in_place(self) -> None:
        """zeromon's forward pre-hook first on the root, its forward hook last (two dict reads when
        they are; a move_to_end when not).

        Whoever registers a root hook after zeromon with prepend=True goes ahead of its pre-hook: so
        does FSDPMemTracker, whose ``__enter__`` and ``__exit__`` remove FSDP2's forward hooks and
        register them again (``__exit__`` FSDP's own ``_pre_forward``, prepended, and
        ``_post_forward``, appended). From then on the root's all-gather would run before the
        phase is "forward", and the forward's end would be seen before FSDP's post-forward. The
        root's ``register_forward_pre_hook`` / ``register_forward_hook`` are guarded to call this
        after each registration; the forward hook calls it too, for hooks added to the dicts directly.
        """
        root = self.root
        if root is None or len(self._handles) < 2:
            return
        pre_id, post_id = self._handles[0].id, self._handles[1].id
        pre, post = root._forward_pre_hooks, root._forward_hooks
        if pre and next(iter(pre)) != pre_id and pre_id in pre:
            pre.move_to_end(pre_id, last=False)
        if post and next(reversed(post)) != post_id and post_id in post:
            post.move_to_end(post_id)

    def watch_backward(self) -> None:
        """Phase every top-level ``torch.autograd.backward`` call (what ``loss.backward()`` runs).

        Its start comes before any hook FSDP registers on the outputs (FSDP2 re-gathers the last
        block there); its return comes after the engine's final callbacks (FSDP's last
        reduce-scatters), so the phase covers the whole backward and nothing else.
        """
        import torch.autograd

        original = torch.autograd.backward
        if hasattr(original, "__zeromon_original__"):
            return
        tracker = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            outer = tracker.state.phase != "backward"
            if outer:
                try:
                    tracker.set_phase("backward")
                except Exception as exc:  # noqa: BLE001
                    tracker.state.hook_error("backward_start", exc)
            try:
                return original(*args, **kwargs)
            finally:
                if outer:
                    try:
                        tracker._boundary("backward_end", tracker.set_phase("other"))
                    except Exception as exc:  # noqa: BLE001
                        tracker.state.hook_error("backward_end", exc)

        backward.__zeromon_original__ = original  # type: ignore[attr-defined]
        torch.autograd.backward = backward
        self._autograd_patch = (torch.autograd, original)

    def watch_for_root(self) -> None:
        """Find the root module on the first forward, when attach() was not given one."""
        import torch.nn.modules.module as module_mod

        def pre(module: Any, args: Any) -> None:
            try:
                if self.root is not None:
                    return
                if not any(p.requires_grad for p in module.parameters()):
                    return
                self.stop_watching_for_root()
                self.set_root(module)
                self._on_forward_pre(module, args)  # this call's own pre-hooks have already run
            except Exception as exc:  # noqa: BLE001
                self.state.hook_error("find_root", exc)

        self._root_watch = module_mod.register_module_forward_pre_hook(pre)

    def stop_watching_for_root(self) -> None:
        if self._root_watch is not None:
            self._root_watch.remove()
            self._root_watch = None

    # --- optimizer hooks --------------------------------------------------------------------------
    def watch_optimizers(self, optimizer: Any = None) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.optimizer = optimizer
        self._global_handles.append(register_optimizer_step_pre_hook(self._on_optimizer_pre))
        self._global_handles.append(register_optimizer_step_post_hook(self._on_optimizer_post))

    def _is_the_optimizer(self, optimizer: Any) -> bool:
        if self.optimizer is None:
            self.optimizer = optimizer
        return optimizer is self.optimizer

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        try:
            if self._is_the_optimizer(optimizer):
                self._boundary("optimizer_start", self.set_phase("optimizer"))
                return self._phased_closure(args, kwargs)
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("optimizer_pre", exc)
        return None

    def _phased_closure(self, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """``step(closure)``'s arguments with the closure wrapped (the hook's return replaces them), or None
        where there is no closure. Lightning's Trainer (and LBFGS) run forward and backward inside the
        optimizer's step: the closure is their phases and "other", and the update after it the optimizer's."""
        # The hook is given step's arguments as called, the optimizer first: (optimizer, closure).
        if len(args) > 1 and callable(args[1]):
            closure, args = args[1], (args[0], self._closure(args[1]), *args[2:])
        elif callable(kwargs.get("closure")):
            closure, kwargs = kwargs["closure"], {**kwargs, "closure": self._closure(kwargs["closure"])}
        else:
            return None
        return (args, kwargs) if closure is not None else None

    def _closure(self, closure: Callable[[], Any]) -> Callable[[], Any]:
        tracker = self

        def zeromon_closure() -> Any:
            try:
                tracker.set_phase("other")
            except Exception as exc:  # noqa: BLE001
                tracker.state.hook_error("closure_start", exc)
            try:
                return closure()
            finally:
                try:
                    tracker._boundary("optimizer_start", tracker.set_phase("optimizer"))
                except Exception as exc:  # noqa: BLE001
                    tracker.state.hook_error("closure_end", exc)

        return zeromon_closure

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        try:
            if not self._is_the_optimizer(optimizer) or self.engine is not None:
                return  # DeepSpeed: the engine's step is the phase, and it ends the step
            if self.explicit_steps:
                self.set_phase("other")
            else:
                self.end_step()
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("optimizer_post", exc)

    # --- DeepSpeed engine -------------------------------------------------------------------------
    def watch_engine(self, engine: Any) -> None:
        """Phase the DeepSpeed engine's backward and step (patched on the instance)."""
        if self.engine is engine:
            return
        self.engine = engine
        self.set_root(engine)
        tracker = self

        original_backward = engine.backward
        original_step = engine.step

        def backward(*args: Any, **kwargs: Any) -> Any:
            tracker.set_phase("backward")
            try:
                return original_backward(*args, **kwargs)
            finally:
                try:
                    tracker._boundary("backward_end", tracker.set_phase("other"))
                except Exception as exc:  # noqa: BLE001
                    tracker.state.hook_error("engine.backward", exc)

        def step(*args: Any, **kwargs: Any) -> Any:
            before = getattr(engine, "global_steps", None)
            tracker.set_phase("optimizer")
            try:
                return original_step(*args, **kwargs)
            finally:
                try:
                    stepped = getattr(engine, "global_steps", None) != before
                    if stepped and not tracker.explicit_steps:
                        tracker.end_step()
                    else:
                        tracker.set_phase("other")
                except Exception as exc:  # noqa: BLE001
                    tracker.state.hook_error("engine.step", exc)

        for name, fn in (("backward", backward), ("step", step)):
            self._engine_patched.append((engine, name, engine.__dict__.get(name)))
            setattr(engine, name, fn)

    # --- explicit steps ---------------------------------------------------------------------------
    def explicit_step_enter(self) -> None:
        self.explicit_steps = True
        self.begin_training()
        state = self.state
        if not state.enabled:
            return
        if state.phase == "setup":  # the warm-up ends here, not at the first forward
            state.phase = "other"
        timer = state.cuda_timing
        state.control.push(RAW_STEP_START, state.step, perf_ns(), timer.mark() if timer is not None else None,
                           state.phase)

    def explicit_step_exit(self) -> None:
        self.end_step()

    # --- teardown ---------------------------------------------------------------------------------
    def remove_module_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        root = self.root
        if root is not None:
            for name in _GUARDED_REGISTRATIONS:
                guard = root.__dict__.get(name)
                if isinstance(guard, _RootHookGuard) and guard.tracker is self:
                    del root.__dict__[name]

    def remove_global_hooks(self) -> None:
        self.stop_watching_for_root()
        for handle in self._global_handles:
            handle.remove()
        self._global_handles.clear()

    def close(self) -> None:
        self.remove_module_hooks()
        self.remove_global_hooks()
        if self._autograd_patch is not None:
            module, original = self._autograd_patch
            module.backward = original
            self._autograd_patch = None
        for engine, name, previous in self._engine_patched:
            if previous is None:
                engine.__dict__.pop(name, None)
            else:
                setattr(engine, name, previous)
        self._engine_patched.clear()
        self.root = self.optimizer = self.engine = None  # the training's, not to be kept alive by the agent


class _RootHookGuard:
    """The root module's own ``register_forward_pre_hook`` / ``register_forward_hook`` (an instance
    attribute, found before the class's method): registers as asked, then puts zeromon's root hooks
    back in place. Costs nothing at forward time; a registration costs a little more."""

    __slots__ = ("module", "name", "tracker")

    def __init__(self, tracker: PhaseTracker, module: Any, name: str) -> None:
        self.tracker = tracker
        self.module = module
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        handle = getattr(type(self.module), self.name)(self.module, *args, **kwargs)
        tracker = self.tracker
        if tracker.root is self.module:
            try:
                tracker.keep_root_hooks_in_place()
            except Exception as exc:  # noqa: BLE001
                tracker.state.hook_error("root_hooks", exc)
        return handle
