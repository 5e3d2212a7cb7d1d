"""The ranks' training for `zeromon demo` (``train.py`` beside this file starts them): torch, FSDP2 and gloo.

Imported by each rank alone, so that the launcher that starts them does not import torch (seconds, before the
first rank can start).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - imported before the process group exists: see let_go_of_the_group
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

if TYPE_CHECKING:
    from zeromon.demo.train import Flag, Shape

STOP_CHECK_EVERY_STEPS = 4  # Ctrl-C stops the ranks within this many steps (~1.3 s at 0.32 s a step)


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


def build(shape: Shape, rank: int, world: int) -> nn.Module:
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    model = Stack(shape, rank)
    if shape.per_layer:
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=shape.reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=shape.reshard)
    return model


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


def let_go_of_the_group() -> None:
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
