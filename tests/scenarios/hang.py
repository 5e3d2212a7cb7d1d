"""A gloo run that hangs on purpose, in one of the ways real jobs do (or, as controls, does not).

Every step: a forward and backward of a small FSDP2 model (its all-gathers and reduce-scatters on the
default group), then --per-step all-reduces on a subgroup when --subgroups is given. At --step, rank --rank:
- ``stuck``: calls data_loader_stall(), which sleeps --stall seconds outside any collective;
- ``skip``: skips the step (no forward, no backward), then joins a final barrier after its last step;
- ``extra``: issues one all_reduce of 4 bytes that its peers do not;
- ``kill``: is killed by SIGKILL (its peers wait for it);
- ``subgroup``: (4 ranks, --subgroups) sleeps in data_loader_stall() before its subgroup's all-reduce;
- ``checkpoint``: sleeps --stall seconds in save_checkpoint(), then goes on (a pause shorter than the threshold);
- ``none``: nothing: a healthy run (with --step-sleep, one whose steps are slow).
With --setup-stall, rank --rank first sleeps that long in load_checkpoint() while the others wait in the
broadcast of what it loaded (a long setup, not a hang).
The backend timeout is long (--timeout): a hang stays a hang until the test ends it. Prints "STEP <n>" as each
step ends, and "HUNG" once the rank is about to hang (the test's cue). ``--spawn N`` starts N ranks of itself
with the launcher's variables and only waits for them: a launcher that, unlike torchrun, does not stop the
others when one dies.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 - before the group: its default arguments would hold it (gloo_exit.py)
from gloo_exit import leave
from scenario_output import say


def data_loader_stall(seconds: float) -> None:
    """A data loader that stops delivering (a dead worker, a stalled filesystem)."""
    time.sleep(seconds)


def load_checkpoint(seconds: float) -> None:
    """A checkpoint read by one rank before the first step, then broadcast."""
    time.sleep(seconds)


def save_checkpoint(seconds: float) -> None:
    """A long checkpoint write on one rank."""
    time.sleep(seconds)


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def spawn(world: int, master_port: str) -> None:
    """Start ``world`` ranks of this script (the same arguments, less --spawn) and wait for them all."""
    argv = [a for i, a in enumerate(sys.argv) if a != "--spawn" and (i == 0 or sys.argv[i - 1] != "--spawn")]
    ranks = [subprocess.Popen([sys.executable, *argv], env={
        **os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master_port}) for r in range(world)]
    for rank in ranks:
        rank.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="none",
                        choices=["none", "stuck", "skip", "extra", "kill", "subgroup", "checkpoint"])
    parser.add_argument("--rank", type=int, default=1)
    parser.add_argument("--step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stall", type=float, default=3600.0)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--setup-stall", type=float, default=0.0)
    parser.add_argument("--subgroups", action="store_true")
    parser.add_argument("--async-unshard", action="store_true", help="FSDP2's all-gathers async_op=True, waited on")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--spawn", type=int, default=0)
    parser.add_argument("--master-port", default="29500")
    args = parser.parse_args()
    if args.spawn:
        spawn(args.spawn, args.master_port)
        return
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    pairs = [dist.new_group([r, r + 1]) for r in range(0, world, 2)] if args.subgroups else []
    mine = pairs[rank // 2] if pairs else None
    torch.manual_seed(0)
    model = Model()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.async_unshard:
        model._set_unshard_async_op(True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    me = rank == args.rank
    if args.setup_stall:
        if me:
            load_checkpoint(args.setup_stall)
        dist.broadcast(torch.zeros(16), src=args.rank)
    for step in range(args.steps):
        if me and step == args.step:
            if args.mode == "stuck":
                say("HUNG")
                data_loader_stall(args.stall)
            elif args.mode == "skip":
                say("HUNG")
                continue
            elif args.mode == "kill":
                say("HUNG")
                os.kill(os.getpid(), signal.SIGKILL)
            elif args.mode == "checkpoint":
                save_checkpoint(args.stall)
        opt.zero_grad()
        model(x).sum().backward()
        if me and step == args.step and args.mode == "extra":
            say("HUNG")
            dist.all_reduce(torch.ones(1))
        if mine is not None:
            if me and step == args.step and args.mode == "subgroup":
                say("HUNG")
                data_loader_stall(args.stall)
            dist.all_reduce(torch.ones(16), group=mine)
        opt.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        say(f"STEP {step}")
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    leave()
