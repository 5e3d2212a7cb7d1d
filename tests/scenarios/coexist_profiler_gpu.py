"""torch.profiler with CPU and CUDA activities around a GPU training loop, with zeromon or without.

    python coexist_profiler_gpu.py OUT_DIR PORT on|off

A world-size-1 NCCL process group; 3 plain steps, then 5 under the profiler (wait 1, warmup 1,
active 3). Prints one JSON line: the profiler's key_averages counts, its exported trace's event
counts by category and name, and (with zeromon) zeromon's collectives per step.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

PLAIN_STEPS = 3
WAIT, WARMUP, ACTIVE = 1, 1, 3


def main() -> None:
    out_dir, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    if mode == "on":
        import zeromon_agent

        zeromon_agent.attach(model=model, optimizer=optimizer, out_dir=out_dir, device_interval_s=0)

    def train_step() -> None:
        model(torch.randn(64, 1024, device="cuda")).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()

    for _ in range(PLAIN_STEPS):
        train_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1)) as prof:
        for _ in range(WAIT + WARMUP + ACTIVE):
            train_step()
            prof.step()
        torch.cuda.synchronize()
    trace_path = os.path.join(out_dir, f"trace-{mode}.json")
    prof.export_chrome_trace(trace_path)
    with open(trace_path) as f:
        trace = json.load(f)
    events = Counter(f"{e.get('cat')}|{e.get('name')}" for e in trace["traceEvents"]
                     if e.get("ph") == "X" and e.get("name") != "[memory]")
    result: dict[str, Any] = {"counts": {e.key: e.count for e in prof.key_averages() if e.key != "[memory]"},
              "events": dict(events)}
    if mode == "on":
        import zeromon_agent
        from zeromon.model import read_recording

        zeromon_agent.detach()
        rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
        per_step: dict[int, Counter[str]] = {}
        for e in rec.collectives:
            per_step.setdefault(e.step, Counter())[f"{e.op}|{e.meaning}|{e.phase}|{e.bytes_in}|{e.timing}"] += 1
        result["zeromon_steps"] = sorted(s.step for s in rec.steps)
        result["zeromon_per_step"] = {str(k): dict(v) for k, v in sorted(per_step.items())}
        result["hook_errors"] = rec.stats.hook_errors if rec.stats else None
    print(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
