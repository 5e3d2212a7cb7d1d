"""One process, one GPU: FSDP2 (a 1-rank mesh on NCCL) with zeromon and FSDPMemTracker, for the
GPU path of the memory peaks (the allocator's allocated bytes pick the highest moment; the
categories are walked there; ``other`` is the allocator's remainder).

Step 0 warms up; step 1 runs inside FSDPMemTracker; steps 2.. after it. Writes OUT/oracle.json:
FSDPMemTracker's per-unit snapshots of step 1 on the GPU (zeromon's category names; FSDPMemTracker
rounds each storage up to 512 bytes on CUDA, so every tensor here is a multiple of 512 bytes) and
the allocator's allocated bytes at each moment zeromon looks at in step 1 (``allocated_at``, in
order: each unit's forward end, then the backward's moments and its end), and ``sizes`` as
FSDPMemTracker counts them (the model's output, the loss and its seed gradient, the output layer's
gradients; AdamW's step counters, on the CPU). zeromon's recording goes to ZEROMON_OUT.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WIDTH = 256
BATCH = 128
BLOCKS = 3
STEPS = 4

CATEGORY = {
    "Sharded Param": "sharded_params", "Unsharded Param": "unsharded_params", "Buffer": "buffers",
    "Sharded Grad": "sharded_grads", "Unsharded Grad": "unsharded_grads", "Activation": "activations",
    "Temp": "temporaries", "All Gather": "all_gather_buffers", "Reduce Scatter": "reduce_scatter_buffers",
    "OptState": "optimizer_state", "Inputs": "inputs", "Total": "total",
}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH, bias=False)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.out = torch.nn.Linear(WIDTH, 128, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def gpu_snapshot(snapshot: dict[Any, dict[str, int]]) -> dict[str, int]:
    for device, cats in snapshot.items():
        if torch.device(device).type == "cuda":
            return {CATEGORY.get(str(getattr(k, "value", k)), str(k)): int(v) for k, v in cats.items()}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.manual_seed(0)
    model = Net().cuda()
    mesh = init_device_mesh("cuda", (1,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    import zeromon_agent

    agent = zeromon_agent.attach(model=model, optimizer=optimizer, memory_every=1)
    allocated_at: list[int] = []
    original = agent.memory.at_point

    def at_point() -> None:  # the allocator's reading at each moment, before zeromon looks
        if agent.memory.search.best is not None and agent.state.step == 1:
            allocated_at.append(torch.cuda.memory_allocated())
        original()

    agent.memory.at_point = at_point  # type: ignore[method-assign]
    names = {module: name for name, module in model.named_modules()}

    sizes: dict[str, int] = {}

    def train_step(step: int, tracker: FSDPMemTracker | None = None) -> None:
        x = torch.randn(BATCH, WIDTH, device="cuda", generator=torch.Generator("cuda").manual_seed(step))
        if tracker is not None:
            tracker.track_inputs((x,))
        out = model(x)
        loss = out.sum()
        seed = torch.ones_like(loss)
        del out  # not saved by sum(): freed here, as in model(x).sum().backward()
        loss.backward(seed)
        # As FSDPMemTracker counts them on CUDA: each storage rounded up to 512 bytes.
        sizes.update(output=BATCH * 128 * 4, loss=512, seed=512, head_grads=128 * WIDTH * 4)
        del loss, seed
        optimizer.step()
        optimizer.zero_grad()
        sizes["cpu_optimizer_state"] = sum(  # AdamW's step counters
            v.untyped_storage().nbytes() for state in optimizer.state.values() for v in state.values()
            if isinstance(v, torch.Tensor) and v.device.type == "cpu")

    train_step(0)
    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        train_step(1, tracker)
    snapshots = {names[m]: {str(getattr(s, "value", s)): [gpu_snapshot(x) for x in snaps]
                            for s, snaps in stats.snapshots.items()}
                 for m, stats in tracker.memory_tracking.items()}
    for step in range(2, STEPS):
        train_step(step)
    zeromon_agent.detach()
    Path(args.out, "oracle.json").write_text(json.dumps(
        {"snapshots": snapshots, "peak": gpu_snapshot(tracker.get_tracker_snapshot("peak")),
         "allocated_at": allocated_at, "sizes": sizes}, indent=1, sort_keys=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
