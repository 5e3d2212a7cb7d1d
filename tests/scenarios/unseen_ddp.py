"""DDP whose gradient all-reduces zeromon cannot see: a builtin (C++) comm hook was registered before the agent
attached, so its own hook is refused and the reducer issues every bucket below Python. World size 1, gloo.

    python tests/scenarios/unseen_ddp.py OUT_DIR PORT
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import zeromon_agent


def main() -> None:
    out, port = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    zeromon_agent.attach(model=model, optimizer=optimizer, out_dir=out)
    for _ in range(8):
        model(torch.randn(16, 64)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    zeromon_agent.detach()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
