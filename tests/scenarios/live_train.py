"""A small FSDP2 run on gloo that trains until told to stop, for tests that scrape it live.

    torchrun --nproc-per-node 2 tests/scenarios/live_train.py --stop-file STOP [--steps N]

Each Linear layer is an FSDP2 unit, so every step all-gathers parameters (param_all_gather) and
reduce-scatters gradients (grad_reduce_scatter). A step sleeps --sleep seconds in its forward so the
run stays light on a shared 2-core machine. The agent is attached explicitly; its settings come from
the ZEROMON_* environment (--render-every-scrape turns the endpoint's caches off, for benchmarks
that measure what a scrape costs when it renders). The run ends when the stop file appears, after --steps steps, or after
--max-seconds, whichever comes first; rank 0 decides and tells rank 1 through the step's all-reduce.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.distributed as dist
from gloo_exit import leave
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import zeromon_agent


class Model(torch.nn.Module):
    def __init__(self, width: int, depth: int, sleep_s: float) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.sleep_s = sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stop-file", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=10**9)
    parser.add_argument("--max-seconds", type=float, default=300.0)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--render-every-scrape", action="store_true")
    parser.add_argument("--linger-s", type=float, default=0.0, help="go on this long after the agent stopped")
    args = parser.parse_args()
    if args.render_every_scrape:
        from zeromon_agent.live import view as snapshot
        from zeromon_agent.serve import metrics

        metrics.RENDER_TTL_S = snapshot.VIEW_TTL_S = snapshot.FORECAST_TTL_S = 0.0
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Model(args.width, args.depth, args.sleep)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    zeromon_agent.attach(model=model, optimizer=opt)
    x = torch.randn(16, args.width)
    deadline = time.monotonic() + args.max_seconds
    for _ in range(args.steps):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        stop = torch.tensor([float(time.monotonic() > deadline
                                   or (args.stop_file is not None and args.stop_file.exists()))])
        dist.all_reduce(stop)  # every rank leaves after the same step
        if stop.item():
            break
    zeromon_agent.detach()
    dist.destroy_process_group()
    time.sleep(args.linger_s)  # a process that outlives its agent (a teardown, an evaluation left unwatched)


if __name__ == "__main__":
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
