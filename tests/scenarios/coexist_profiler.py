"""A 2-rank FSDP2 training loop on gloo, half of it under torch.profiler, with or without zeromon.

Steps 0..PLAIN-1 run without the profiler; the next ones run inside ``torch.profiler.profile``
(CPU activities, record_shapes, a wait/warmup/active schedule advanced by ``prof.step()``), whose
trace is exported to OUT/trace/ by ``tensorboard_trace_handler``. Each rank writes what the profiler
saw to OUT/profiler-<rank>.json, for the test to compare a run with zeromon attached (``--agent``)
against one without:
- ``counts``: key_averages() event name -> calls (ProfilerStep#N included);
- ``comm_events``: the exported trace's communication events (c10d ops, gloo work,
  record_param_comms) per profiled step: name and the args that describe the collective;
- ``allocations``: the sizes of the allocations the trace's memory events show (profile_memory).
  Frees are left out: which thread drops the last reference to a collective's buffer, the training
  thread or gloo's (whose frees the profiler does not see), varies from run to run, zeromon or not.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from gloo_exit import leave
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

WIDTH = 64
BLOCKS = 3
# The args of a communication event that describe the collective; ids, sequence numbers of the
# process group's creation, timestamps and thread ids vary from run to run.
COMM_ARGS = ("Collective name", "In msg nelems", "Out msg nelems", "In split size", "Out split size",
             "Group size", "dtype", "Input Dims", "Input type", "Process Group Name", "Process Group Description",
             "Rank", "Seq")
WAIT, WARMUP, ACTIVE = 1, 1, 3


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(torch.nn.Module):
    """3 blocks (one FSDP2 unit each) and a root unit holding the input and output layers."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(WIDTH, WIDTH)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.out = torch.nn.Linear(WIDTH, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def is_comm(name: str) -> bool:
    return name.startswith(("c10d::", "gloo:", "nccl:")) or name == "record_param_comms"


def comm_events_by_step(trace: dict[str, Any]) -> dict[str, list[list[Any]]]:
    """Communication events of the exported trace inside each ProfilerStep#N span, in order."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    out: dict[str, list[list[Any]]] = {s["name"]: [] for s in steps}
    for e in sorted(events, key=lambda e: (e["ts"], e["name"])):
        if not is_comm(e["name"]):
            continue
        owner = next((s["name"] for s in steps if s["ts"] <= e["ts"] <= s["ts"] + s["dur"]), "outside")
        args = e.get("args", {})
        out.setdefault(owner, []).append([e["name"], *(args.get(k) for k in COMM_ARGS)])
    for key in out:
        out[key].sort(key=json.dumps)  # gloo's threads may interleave: compare as multisets
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--agent", action="store_true", help="attach zeromon")
    parser.add_argument("--plain-steps", type=int, default=3, help="steps before the profiler starts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Net()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.agent:
        import zeromon_agent

        zeromon_agent.attach(model=model, optimizer=optimizer)

    def train_step(step: int) -> None:
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(step * 2 + rank))
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    for step in range(args.plain_steps):
        train_step(step)
    out = Path(args.out)
    trace_dir = out / "trace"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}")) as prof:
        for step in range(args.plain_steps, args.plain_steps + WAIT + WARMUP + ACTIVE):
            train_step(step)
            prof.step()
    counts = {e.key: e.count for e in prof.key_averages() if e.key != "[memory]"}
    traces = sorted(trace_dir.glob(f"rank{rank}.*.json"))
    trace = json.loads(traces[-1].read_text())
    if args.agent:
        import zeromon_agent

        zeromon_agent.detach()
    (out / f"profiler-{rank}.json").write_text(json.dumps({
        "counts": counts, "comm_events": comm_events_by_step(trace), "trace_events": len(trace["traceEvents"]),
        "allocations": sorted(e["args"]["Bytes"] for e in trace["traceEvents"]
                              if e.get("name") == "[memory]" and e["args"]["Bytes"] > 0),
        "distributed_info": trace.get("distributedInfo"), "trace_files": [t.name for t in traces],
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
