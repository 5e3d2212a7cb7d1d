"""A 2-rank FSDP2 training loop on gloo with torch's FSDPMemTracker in the same process, with or without zeromon.

Step 0 warms up (FSDP2's lazy init, the optimizer state); step 1 runs inside ``FSDPMemTracker`` (the
oracle); steps 2.. run after it has exited, when its ``__exit__`` has registered FSDP's forward hooks
again. Each rank writes OUT/oracle-<rank>.json: what FSDPMemTracker saw in step 1, in zeromon's
category names:
- ``snapshots``: per FSDP module (its name, "" for the root) and per state (FSDPMemTracker's
  ``_FSDPModState`` values: "After Post-Forward", "After Pre-Backward", "Before Post-Backward", the
  per-module "Peak Forward" / "Peak Backward") the bytes per category on the CPU;
- ``peak``: ``get_tracker_snapshot("peak")``, the step's highest total;
- ``sizes``: bytes of the tensors the test needs to explain where FSDPMemTracker's categories
  differ from zeromon's by definition: the input batch, the model's output, the loss and its seed
  gradient (which the loop holds), and the gradients of the output layer (made first in backward).
With ``--agent before`` zeromon is attached before step 0, with ``--agent inside`` inside the
FSDPMemTracker context, before step 1 (``memory_every=1``: every step walks); its recording goes to
ZEROMON_OUT.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from gloo_exit import leave
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

WIDTH = 64
BATCH = 96
BLOCKS = 3
STEPS = 4
TRACKED_STEP = 1

# FSDPMemTracker's reference types (``_FSDPRefType`` values) in zeromon's names (DESIGN.md); "Inputs"
# (what ``track_inputs`` was given) has no zeromon counterpart.
CATEGORY = {
    "Sharded Param": "sharded_params", "Unsharded Param": "unsharded_params", "Buffer": "buffers",
    "Sharded Grad": "sharded_grads", "Unsharded Grad": "unsharded_grads", "Activation": "activations",
    "Temp": "temporaries", "All Gather": "all_gather_buffers", "Reduce Scatter": "reduce_scatter_buffers",
    "OptState": "optimizer_state", "Inputs": "inputs", "Total": "total",
}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(torch.nn.Module):
    """3 blocks (one FSDP2 unit each) and a root unit holding the input and output layers, and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.out = torch.nn.Linear(WIDTH, 1)
        self.register_buffer("scale", torch.ones(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x) * self.scale
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def let_gloo_settle() -> None:
    """Make FSDP2's collectives return only once gloo's worker thread has dropped its references to
    their buffers. A buffer's storage dies on whichever thread drops the last reference, FSDP2's or
    gloo's: without this, FSDPMemTracker (which counts live storages) sees a freed all-gather or
    reduce-scatter buffer a moment longer in some runs than in others, zeromon or not. Each call
    waits until its tensors' storages have no more users than before it (gloo's work holds them
    while it runs), then 10 ms more. The wrappers replace torch.distributed's names, which FSDP2
    looks up at each call; zeromon's wrappers, when attached, are inside them."""
    def uses(tensor: torch.Tensor) -> int:
        return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)

    for name in ("all_gather_single", "reduce_scatter_single"):
        original = getattr(dist, name)

        @functools.wraps(original)
        def settled(output: torch.Tensor, input: torch.Tensor, *args: Any, _name: str = name, **kwargs: Any) -> Any:
            before = (uses(output), uses(input))
            # Looked up at each call: zeromon wraps the function in distributed_c10d when it attaches.
            result = getattr(c10d, _name)(output, input, *args, **kwargs)
            if not kwargs.get("async_op"):
                deadline = time.monotonic() + 5
                while (uses(output) > before[0] or uses(input) > before[1]) and time.monotonic() < deadline:
                    time.sleep(0.0002)
                time.sleep(0.01)  # and whatever else its work held (a copy of the input, ~16 KB here)
            return result

        setattr(dist, name, settled)


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


def cpu_snapshot(snapshot: dict[Any, dict[str, int]]) -> dict[str, int]:
    """One device's snapshot (the CPU's) in zeromon's names; {} when nothing was tracked."""
    for device, cats in snapshot.items():
        if torch.device(device).type == "cpu":
            return {CATEGORY.get(str(getattr(k, "value", k)), str(k)): int(v) for k, v in cats.items()}
    return {}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--agent", choices=("none", "before", "inside"), default="none",
                        help="attach zeromon before the first step, or inside FSDPMemTracker (at step 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    let_gloo_settle()
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def attach() -> None:
        import zeromon_agent

        zeromon_agent.attach(model=model, optimizer=optimizer, memory_every=1)

    if args.agent == "before":
        attach()
    names = {module: name for name, module in model.named_modules()}
    result: dict[str, Any] = {"snapshots": {}, "peak": {}, "sizes": {}}

    def train_step(step: int, tracker: FSDPMemTracker | None = None) -> None:
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(step * 2 + rank))
        if tracker is not None:
            tracker.track_inputs((x,))
        out = model(x)
        loss = out.sum()
        seed = torch.ones_like(loss)  # what loss.backward() would make: created here, it is measured
        loss.backward(seed)
        result["sizes"] = {"input": nbytes(x), "output": nbytes(out), "loss": nbytes(loss), "seed": nbytes(seed),
                           # out's weight (1 x WIDTH) and bias: the first gradients the backward makes
                           "head_grads": (WIDTH + 1) * out.element_size()}
        del out, loss, seed
        optimizer.step()
        optimizer.zero_grad()

    train_step(0)
    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        if args.agent == "inside":
            attach()
        train_step(TRACKED_STEP, tracker)
    for module, stats in tracker.memory_tracking.items():
        result["snapshots"][names[module]] = {
            str(getattr(state, "value", state)): [cpu_snapshot(s) for s in snaps]
            for state, snaps in stats.snapshots.items()}
    result["peak"] = cpu_snapshot(tracker.get_tracker_snapshot("peak"))
    for step in range(TRACKED_STEP + 1, STEPS):
        train_step(step)
    if args.agent != "none":
        import zeromon_agent

        zeromon_agent.detach()
    Path(args.out, f"oracle-{rank}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
