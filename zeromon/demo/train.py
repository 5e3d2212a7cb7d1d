"""The training `zeromon demo` runs: a small FSDP2 model on CPU (gloo), with one problem built in.

    zeromon run -- python zeromon/demo/train.py --scenario leak

It is an ordinary training script: it does not import zeromon. Under `zeromon run` the agent hooks
it from outside (no code change), as it would any user's job. It starts its ranks itself
(torch.multiprocessing, with the environment torchrun would give them), so that Ctrl-C stops them
cleanly at the end of a step: torchrun answers Ctrl-C by killing its workers, with tracebacks.

A stack of Linear layers sharded with FSDP2 (``fully_shard``), trained with AdamW on random data. A
forward "computes" by sleeping ``compute_s`` (the compute a GPU would do, without loading a shared
CPU); the scenarios:

- healthy:   two layers of 256 as one FSDP2 unit, 300 ms of compute a step: its two collectives
             (an all-gather, a reduce-scatter, each small on gloo) are a sliver;
- leak:      healthy, and every step keeps ``leak_mib`` MiB more alive (tensors kept in a list, as
             a loop that keeps its outputs without ``.detach()`` leaks), against a small stated capacity;
- exposed:   four layers of 768 gathered again in backward, 5 ms of compute: the all-gathers and
             reduce-scatters of 2.3 MiB layers have nothing to hide behind (on gloo a collective
             blocks the training thread);
- straggler: healthy, and rank 1 computes 100 ms more every step: rank 0 waits for it at every
             collective.

Ends after ``--steps`` steps, ``--seconds`` seconds (rank 0's clock) or Ctrl-C, whichever is first: the
ranks agree every STOP_CHECK_EVERY_STEPS steps through a one-number all-reduce, so both stop at the
same step.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import itertools
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - imported before the process group exists: see _let_go_of_the_group
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


@dataclass(frozen=True, slots=True)
class Shape:
    width: int
    layers: int
    batch: int
    compute_s: float  # sleep per forward, every rank
    late_rank: int | None = None  # this rank sleeps late_s more per forward
    late_s: float = 0.0
    leak_mib: float = 0.0  # MiB kept alive per step
    per_layer: bool = False  # each layer its own FSDP2 unit (else one unit for the whole model)
    reshard: bool = False  # FSDP2's reshard_after_forward: gather the parameters again in backward


class Flag:
    """Set by a signal handler, read by the training loop, all in the main thread. Not threading.Event:
    its set() takes a lock, and a second Ctrl-C whose handler runs while the first one's set() holds it
    waits for it forever, in the thread that holds it (the demo hung so once, its ranks done)."""

    __slots__ = ("_set", "_sets")

    def __init__(self) -> None:
        self._set = False
        self._sets = itertools.count()

    def set(self) -> bool:
        """Set it; whether this call was the first. Exactly one call is, however handlers nest: next()
        on a count is one C call, between whose start and end no Python handler runs."""
        first = next(self._sets) == 0
        self._set = True
        return first

    def is_set(self) -> bool:
        return self._set


def ctrl_c_handler(flag: Flag, say: str | None = None) -> Callable[[int, object], None]:
    """A SIGINT handler that notes Ctrl-C in ``flag`` and says ``say`` on stderr the first time. Ctrl-C can
    come twice within microseconds (from the terminal, and forwarded by `zeromon run`)."""

    def handler(_sig: int, _frame: object) -> None:
        if flag.set() and say is not None:
            print(say, file=sys.stderr, flush=True)

    return handler


STOP_CHECK_EVERY_STEPS = 4  # Ctrl-C stops the ranks within this many steps (~1.3 s at 0.32 s a step)

SHAPES = {
    "healthy": Shape(width=256, layers=2, batch=16, compute_s=0.3),
    "leak": Shape(width=256, layers=2, batch=16, compute_s=0.3, leak_mib=8.0),
    "exposed": Shape(width=768, layers=4, batch=4, compute_s=0.005, per_layer=True, reshard=True),
    "straggler": Shape(width=256, layers=2, batch=16, compute_s=0.3, late_rank=1, late_s=0.1),
}


class Stack(nn.Module):
    def __init__(self, shape: Shape, rank: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(shape.width, shape.width) for _ in range(shape.layers))
        self.sleep_s = shape.compute_s + (shape.late_s if rank == shape.late_rank else 0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.sleep_s)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SHAPES), default="healthy")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seconds", type=float, default=0.0, help="stop after this long (0: no limit)")
    parser.add_argument("--ranks", type=int, default=2)
    return parser.parse_args(argv)


def build(shape: Shape, rank: int, world: int) -> nn.Module:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Stack(shape, rank)
    if shape.per_layer:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=shape.reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=shape.reshard)
    return model


def main(argv: list[str] | None = None) -> int:
    """Start the ranks (as torchrun would set them up) and wait for them. Ctrl-C reaches every process of
    the terminal: the ranks finish their step and stop together; this one waits for them."""
    args = parse_args(argv)
    with socket.socket() as probe:  # a free port for the rendezvous (the default 29500 may be taken)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # A handler, not KeyboardInterrupt: Ctrl-C comes twice (from the terminal, and forwarded by `zeromon run`),
    # and the second would land in the first one's handling.
    signal.signal(signal.SIGINT, ctrl_c_handler(Flag(), "demo: Ctrl-C: the ranks stop after this step"))
    context = mp.start_processes(rank_main, args=(args, port), nprocs=args.ranks, join=False, start_method="spawn")
    while not context.join():
        pass
    return 0


def rank_main(local_rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(args.ranks),
                      LOCAL_WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    interrupted = Flag()
    # A KeyboardInterrupt between two collectives would leave the peer blocked in the next one (gloo's
    # timeout is 30 minutes): the ranks note Ctrl-C and agree to stop at the end of a step instead.
    signal.signal(signal.SIGINT, ctrl_c_handler(interrupted))
    train(SHAPES[args.scenario], args, interrupted)
    _let_go_of_the_group()  # train()'s model is unreferenced now: collected with its group


def train(shape: Shape, args: argparse.Namespace, interrupted: Flag) -> None:
    torch.set_num_threads(1)  # two ranks on a laptop's or a CI runner's few cores
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(shape, rank, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    leak_numel = int(shape.leak_mib * 2**20) // 4
    started = time.monotonic()
    step = 0
    try:
        while step < args.steps:
            x = torch.randn(shape.batch, shape.width, generator=torch.Generator().manual_seed(step * world + rank))
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if leak_numel:
                kept.append(torch.ones(leak_numel))  # filled: its pages are resident
            step += 1
            if step % STOP_CHECK_EVERY_STEPS:
                continue
            timed_out = args.seconds > 0 and rank == 0 and time.monotonic() - started >= args.seconds
            if _agree_to_stop(timed_out or interrupted.is_set()):
                break
        if rank == 0:
            why = " (stopped by Ctrl-C)" if interrupted.is_set() else ""
            print(f"demo {args.scenario}: {step} steps in {time.monotonic() - started:.1f} s{why}", flush=True)
    finally:
        dist.destroy_process_group()


# DTensor's caches that hold device meshes, and through them process groups (torch 2.13).
DTENSOR_CACHES = (
    ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
)


def _let_go_of_the_group() -> None:
    """Drop what still holds the process group after destroy_process_group, so that its gloo worker threads
    end once train() has returned, not during the interpreter's exit: a worker that drops a finished collective's
    tensor there takes the GIL, which a finalizing Python answers with pthread_exit, and the rank dies by
    SIGABRT ("terminate called without an active exception") after its training ended. The holders:
    torch.distributed.nn's default arguments (``group=group.WORLD``, evaluated on its import, which building
    the optimizer does: imported before init_process_group, they hold None) and DTENSOR_CACHES."""
    for module_name, path in DTENSOR_CACHES:
        try:
            target: Any = importlib.import_module(module_name)
            for name in path.split("."):
                target = getattr(target, name)
            target()
        except (ImportError, AttributeError):  # another torch: its caches, if any, stay
            pass
    gc.collect()


def _agree_to_stop(stop: bool) -> bool:
    """Whether any rank wants to stop (Ctrl-C, or rank 0's clock), agreed by all: each rank's own answer
    would stop them at different steps. A 4-byte all-reduce, not free on gloo: every
    STOP_CHECK_EVERY_STEPS steps, so that the healthy run's communication stays a sliver of its steps."""
    flag = torch.tensor([1.0 if stop else 0.0])
    dist.all_reduce(flag)
    return bool(flag.item() > 0)


if __name__ == "__main__":
    sys.exit(main())
