"""The GPU paths on a real GPU: CUDA-event timing of NCCL collectives, allocator stats, NVML.

Skipped without a CUDA GPU (this machine and CI have none); run where one is lent.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import child_env, free_port, run_python

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_nccl_collectives_memory_and_nvml_on_a_gpu(tmp_path: Path) -> None:
    script = tmp_path / "gpu.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, torch, torch.distributed as dist
        import zeromon_agent
        from zeromon.model import read_recording
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1], device_interval_s=0.05)
        for _ in range(5):
            loss = model(torch.randn(64, 1024, device="cuda")).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            w = dist.all_reduce(torch.ones(1 << 20, device="cuda"), async_op=True)
            w.wait()
            opt.step(); opt.zero_grad()
        torch.cuda.synchronize()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(sys.argv[1], "rank-0.jsonl"))
        print(json.dumps({
            "timings": sorted({e.timing for e in rec.collectives}),
            "durations_ok": all(e.complete_ns is not None and e.complete_ns >= e.issue_ns for e in rec.collectives),
            "allocated": [m.allocated for m in rec.memory][-1],
            "capacity": [m.capacity for m in rec.memory][-1],
            "optimizer_state": max(m.categories.get("optimizer_state", 0) for m in rec.memory),
            "device_samples": len(rec.device),
            "steps": len(rec.steps),
        }))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["timings"] == ["cuda_event"]
    assert result["durations_ok"]
    assert result["allocated"] > 0 and result["capacity"] > result["allocated"]
    # AdamW keeps two fp32 moments per parameter (plus a step scalar each).
    n_params = 1024 * 1024 + 1024 + 1024 + 1
    assert result["optimizer_state"] >= 2 * 4 * n_params
    assert result["device_samples"] >= 1
    assert result["steps"] == 5
