"""CUDA memory history that the program turned on itself, then zeromon attached (CUDA builds only).

    python coexist_memory_history.py OUT_DIR PORT

A world-size-1 NCCL process group. The program records the allocator's history with its own settings
(tracebacks of allocations, Python frames only) and allocates a marker tensor of a size nothing
else has; then zeromon attaches (ZEROMON_MEMORY_HISTORY as the environment says) and a few training
steps run. Prints one JSON line: what the program's own snapshot holds afterwards, and zeromon's
memory samples, for the test to check that neither changed the other.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import zeromon_agent
from zeromon.model import read_recording

STEPS = 4
WIDTH = 1024
MARKER_BYTES = 5861 * 512  # a multiple of the allocator's 512-byte rounding, unlike anything else here


def _cpp_frame(frame: dict[str, Any]) -> bool:
    """A C++ frame (stacks="all" adds them); Python's are .py files or <...> pseudo-files."""
    name = str(frame.get("filename", ""))
    return not (name.endswith(".py") or name.startswith("<"))


def main() -> None:
    out_dir, port = sys.argv[1], int(sys.argv[2])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    # The program's own settings, before zeromon: history of every event, tracebacks of allocations,
    # Python frames only. zeromon's own call would ask for context and stacks "all".
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python", max_entries=1_000_000)
    marker = torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    entries_before = len(torch.cuda.memory._snapshot()["device_traces"][0])
    zeromon_agent.attach(model=model, optimizer=optimizer, out_dir=out_dir, device_interval_s=0)
    for _ in range(STEPS):
        loss = model(torch.randn(64, WIDTH, device="cuda")).sum()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    history_on = bool(torch._C._cuda_isHistoryEnabled())
    allocated_now, peak_now = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    zeromon_agent.detach()
    trace = snapshot["device_traces"][0]
    rec = read_recording(os.path.join(out_dir, "rank-0.jsonl"))
    samples = [m for m in rec.memory if m.allocated is not None]
    print(json.dumps({
        "history_on": history_on,
        "entries_before": entries_before,
        "entries_after": len(trace),
        "marker_alloc_kept": any(e["action"] == "alloc" and e["size"] == MARKER_BYTES for e in trace),
        "allocs_with_frames": sum(1 for e in trace if e["action"] == "alloc" and e.get("frames")),
        "cpp_frames": sum(1 for e in trace for f in e.get("frames") or () if _cpp_frame(f)),
        "marker_bytes": marker.nbytes,
        "allocated_now": allocated_now,
        "peak_now": peak_now,
        "samples": len(samples),
        "sample_allocated": [m.allocated for m in samples],
        "sample_peak": max((m.peak_allocated or 0) for m in samples) if samples else None,
        "capacity": samples[-1].capacity if samples else None,
        "optimizer_state": max((m.categories.get("optimizer_state", 0) for m in rec.memory), default=0),
        "n_params": sum(p.numel() for p in model.parameters()),
        "steps": len(rec.steps),
        "hook_errors": rec.stats.hook_errors if rec.stats else None,
        "notices": [n.message for n in rec.notices],
    }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
