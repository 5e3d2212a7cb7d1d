"""DDP's gradient all-reduces: issued by its C++ reducer, so a torch.distributed patch never sees them.

The agent registers a communication hook that does exactly what DDP does without one (divide the
bucket by the group size, all-reduce it; it is torch's own ``allreduce_hook``) but through the
patched ``dist.all_reduce``, so every bucket is recorded. Each bucket also gets a completion
callback (a few per step: each costs far more than the wrapper on gloo).

DDP waits for its buckets in C++ (``finalize_backward``, a final callback of the autograd engine),
where no patch sees the rank block. So when the last bucket is launched, the hook queues a final
callback of its own, which the engine runs just before DDP's: it waits on the step's buckets through
the patched ``Work.wait()``, which DDP was about to do anyway. The wait is then recorded like any
other: on CPU the training thread's blocked time, on GPU where the stream waits. Without it a rank
blocked on its last bucket at the end of backward would count as computing (100% overlap).
If the model already has a comm hook, DDP allows no second one: that is said once, as a notice.
"""

from __future__ import annotations

import sys
from typing import Any

from zeromon_agent.hooks.state import RAW_DONE, HotState, perf_ns


def is_ddp(module: Any) -> bool:
    ddp_mod = sys.modules.get("torch.nn.parallel.distributed")
    return ddp_mod is not None and isinstance(module, ddp_mod.DistributedDataParallel)


# How deep below the module whose forward the training calls a DDP module is looked for: trainers wrap it
# (Fabric's _FabricModule, torch.compile's OptimizedModule, PEFT's PeftModel hold it one or two levels down).
WRAPPER_DEPTH = 3


def find_ddp(root: Any) -> Any:
    """The DistributedDataParallel module at ``root`` or inside the wrappers around it (breadth first, at most
    WRAPPER_DEPTH levels down); None if there is none."""
    level = [root]
    for _ in range(WRAPPER_DEPTH + 1):
        for module in level:
            if is_ddp(module):
                return module
        try:
            level = [child for module in level for child in module.children()]
        except Exception:  # noqa: BLE001 - not a torch module
            return None
        if not level:
            return None
    return None


def register_recorded_allreduce(model: Any, state: HotState) -> str | None:
    """Register the recording hook on a DDP module (once). Returns a reason when it could not."""
    if getattr(model, "_zeromon_recorded", False):
        return None
    if getattr(model, "_comm_hooks", None):
        return "this DDP model already has a communication hook: its gradient all-reduces are not recorded"
    import torch.distributed as dist
    from torch.autograd import Variable

    launched: list[Any] = []  # this backward's buckets, waited on by the final callback

    def wait_for_buckets() -> None:
        works = launched[:]
        launched.clear()
        for work in works:
            try:
                work.wait()  # the patched Work.wait records when the rank blocked, and for how long
            except Exception:  # noqa: BLE001, S110 - DDP's own wait, just after, raises it as usual
                pass

    def zeromon_allreduce_hook(process_group, bucket):  # type: ignore[no-untyped-def]
        # No annotations: DDP checks them against dist.GradBucket / Future and refuses others.
        group = process_group if process_group is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(group.size())  # what DDP does without a hook: average, before summing
        work = dist.all_reduce(tensor, group=group, async_op=True)
        future = work.get_future()
        seq = state.pending.get(id(work))
        if seq is not None:
            future.add_done_callback(lambda _f: state.raw.push(RAW_DONE, seq, perf_ns()))
            _queue_wait(work, bucket)
        return future.then(lambda fut: fut.value()[0])

    def _queue_wait(work: Any, bucket: Any) -> None:
        try:
            launched.append(work)
            if bucket.is_last():
                # Queued before DDP queues finalize_backward (right after this hook returns), so it runs first.
                Variable._execution_engine.queue_callback(wait_for_buckets)
        except Exception as exc:  # noqa: BLE001 - e.g. a bucket launched outside a backward pass
            launched.clear()
            state.hook_error("ddp.wait", exc)

    try:
        model.register_comm_hook(None, zeromon_allreduce_hook)
    except Exception as exc:  # noqa: BLE001 - e.g. a builtin hook was registered before
        return f"could not hook DDP's gradient all-reduce ({exc}): it is not recorded"
    model._zeromon_recorded = True
    return None
