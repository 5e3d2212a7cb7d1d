"""A 2-rank gloo run with a known straggler and a known memory imbalance.

Rank --slow-rank spends --delay seconds more in every forward, so it reaches each step's
all-reduce last and its peer waits about --delay for it; rank 0 also keeps --extra-mb MiB alive
that rank 1 does not (rank-0-only buffers, as logging or checkpointing code keeps). Rank
--warmup-rank, if given, is late once, by --warmup-delay seconds before its first step (as a rank
that allocates or loads data before its loop).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from gloo_exit import leave

import zeromon_agent


class Work(torch.nn.Module):
    def __init__(self, delay_s: float) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(256, 256)
        self.delay_s = delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)
        return self.linear(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.03)
    parser.add_argument("--extra-mb", type=int, default=200)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup-rank", type=int, default=-1)
    parser.add_argument("--warmup-delay", type=float, default=0.0)
    parser.add_argument("--teardown", type=int, default=0,
                        help="all-gathers after the last optimizer step, as a trainer's final logging issues them")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = Work(args.delay if rank == args.slow_rank else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keep = torch.ones(args.extra_mb * 2**20 // 4) if rank == 0 else None  # noqa: F841 - held on purpose
    if args.warmup_rank >= 0:
        # The ranks leave their setup together (before the agent is attached: not recorded), so that the
        # warm-up rank is late by --warmup-delay: building the optimizer takes 2 s of CPU here (its first
        # import), and a loaded machine once made one rank's 2 s longer, absorbing most of the delay.
        dist.barrier()
    zeromon_agent.attach(model=model, optimizer=opt)
    x = torch.randn(64, 256)
    for step in range(args.steps):
        if step == 0 and rank == args.warmup_rank:
            time.sleep(args.warmup_delay)
        opt.zero_grad()
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    for _ in range(args.teardown):
        gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, torch.ones(2))
    zeromon_agent.detach()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
