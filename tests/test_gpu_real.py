"""The GPU paths on a real GPU: CUDA-event timing of NCCL collectives, allocator stats, NVML.

Skipped without a CUDA GPU (this machine and CI have none); run where one is lent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import EXAMPLES, child_env, free_port, ranks_args, run_python, zeromon

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
        from zeromon_agent.memory.readings import CudaMemory
        flat = torch.cuda.memory_stats(0)  # the allocator's own names, against the nested read the agent makes
        totals_match = CudaMemory(0).totals() == tuple(flat.get(key) for key in (
            "allocated_bytes.all.current", "reserved_bytes.all.current", "active_bytes.all.current",
            "allocated_bytes.all.peak", "reserved_bytes.all.peak", "inactive_split_bytes.all.current",
            "num_alloc_retries", "num_ooms"))
        zeromon_agent.detach()
        rec = read_recording(os.path.join(sys.argv[1], "rank-0.jsonl"))
        print(json.dumps({
            "totals_match": totals_match,
            "timings": sorted({e.timing for e in rec.collectives}),
            "timed_steps": sorted({e.step for e in rec.collectives if e.timing == "cuda_event"}),
            "launched_steps": sorted({e.step for e in rec.collectives if e.timing == "launch"}),
            "durations_ok": all(e.complete_ns is not None and e.complete_ns >= e.issue_ns
                                for e in rec.collectives if e.timing == "cuda_event"),
            "launched_ok": all(e.complete_ns is None for e in rec.collectives if e.timing == "launch"),
            "unknown_comm_steps": sorted(s.step for s in rec.steps if s.comm_union_s is None),
            "allocated": [m.allocated for m in rec.memory][-1],
            "capacity": [m.capacity for m in rec.memory][-1],
            "optimizer_state": max(m.categories.get("optimizer_state", 0) for m in rec.memory),
            "device_samples": len(rec.device),
            "steps": len(rec.steps),
        }))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="3"))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # Timed on the device: the first two steps and 1 in 3 after (step 3); steps 2 and 4 launched only.
    assert result["timings"] == ["cuda_event", "launch"], result
    assert result["timed_steps"] == [0, 1, 3] and result["launched_steps"] == [2, 4], result
    assert result["unknown_comm_steps"] == [2, 4], result
    assert result["durations_ok"] and result["launched_ok"]
    assert result["allocated"] > 0 and result["capacity"] > result["allocated"]
    assert result["totals_match"], result
    # AdamW keeps two fp32 moments per parameter (plus a step scalar each).
    n_params = 1024 * 1024 + 1024 + 1024 + 1
    assert result["optimizer_state"] >= 2 * 4 * n_params
    assert result["device_samples"] >= 1
    assert result["steps"] == 5


def test_phases_and_overlap_on_the_gpu_clock(tmp_path: Path) -> None:
    """The forward pass queues 60 ms of GPU work and returns at once: on the host it takes
    microseconds, on the GPU 60 ms. Phase spans, compute and the live per-step overlap must be
    on the GPU's clock, and a synchronous all-reduce must count as time the stream waited."""
    script = tmp_path / "gpu_phases.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, time, torch, torch.distributed as dist
        import zeromon_agent
        from zeromon.model import read_recording
        from zeromon.analysis.step_overlap import step_overlaps
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        kernel_s = []

        class Slow(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(256, 256)
            def forward(self, x):
                # Tens of ms of GPU time and none of the host's; its real length timed on the GPU.
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(); torch.cuda._sleep(60_000_000); end.record()
                kernel_s.append((start, end))
                return self.lin(x)

        model = Slow().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1], device_interval_s=0)
        host_forward = []
        for _ in range(6):
            t0 = time.perf_counter()
            loss = model(torch.randn(32, 256, device="cuda")).sum()
            host_forward.append(time.perf_counter() - t0)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step(); opt.zero_grad()
            loss.item()
        torch.cuda.synchronize()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(sys.argv[1], "rank-0.jsonl"))
        forward = [p for p in rec.phases if p.phase == "forward" and p.step >= 1]
        steps = sorted((s for s in rec.steps if s.step >= 1), key=lambda s: s.step)
        analysed = {o.step: o for o in step_overlaps(rec)}
        print(json.dumps({
            # the model is on the GPU: its phases are on the stream's clock from the first step
            "phase_timings": sorted({str(p.timing) for p in rec.phases if p.step >= 0}),
            "kernel_s": [a.elapsed_time(b) / 1e3 for a, b in kernel_s[1:]],
            "forward_s": [p.duration_s for p in forward],
            "host_forward_s": host_forward[1:],
            "comp_s": [s.comp_s for s in steps],
            "live_exposed": [s.exposed_comm_s for s in steps],
            "analysed_exposed": [analysed[s.step].exposed_comm_s for s in steps],
            "blocked_s": [s.blocked_s for s in steps],
            "comm_s": [s.comm_union_s for s in steps],
            "wait_set": all(e.wait_ns is not None for e in rec.collectives if e.step >= 1),
        }))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["phase_timings"] == ["cuda_event"], r
    kernel = min(r["kernel_s"])
    assert kernel > 0.01, r
    assert max(r["host_forward_s"]) < 0.5 * kernel, r  # the host does not wait for the kernel
    for forward, k in zip(r["forward_s"], r["kernel_s"], strict=True):
        assert 0.95 * k <= forward <= k + 0.01, r  # the forward span is the GPU's time in it
    for comp, k in zip(r["comp_s"], r["kernel_s"], strict=True):
        assert comp >= 0.95 * k, r
    # A synchronous NCCL all-reduce: the stream waits for it, so none of it is hidden.
    assert r["wait_set"], r
    for live, analysed, comm in zip(r["live_exposed"], r["analysed_exposed"], r["comm_s"], strict=True):
        assert live is not None and abs(live - analysed) <= 0.1 * comm + 1e-6, r
        assert live >= 0.5 * comm, r


def test_the_endpoint_serves_allocator_and_device_metrics_on_a_gpu(tmp_path: Path) -> None:
    script = tmp_path / "gpu_endpoint.py"
    script.write_text(textwrap.dedent("""
        import json, sys, time, urllib.request, torch, torch.distributed as dist
        import zeromon_agent
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1], device_interval_s=0.05)
        for _ in range(6):
            loss = model(torch.randn(64, 1024, device="cuda")).sum()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step(); opt.zero_grad()
            loss.item()
        time.sleep(1.0)  # the recorder's passes and an NVML sample
        url = zeromon_agent.get_agent().endpoint.url
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
        snapshot = json.loads(urllib.request.urlopen(url + "/api/v1/snapshot", timeout=10).read())
        zeromon_agent.detach()
        names = sorted({line.split("{")[0].split(" ")[0] for line in metrics.splitlines()
                        if line and not line.startswith("#")})
        print(json.dumps({"names": names, "memory": snapshot["memory"], "device": snapshot["device"],
                          "oom": snapshot["oom"], "metrics": metrics}))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("zeromon_memory_allocated_bytes", "zeromon_memory_reserved_bytes", "zeromon_memory_capacity_bytes",
                 "zeromon_device_utilization_ratio", "zeromon_device_memory_used_bytes", "zeromon_device_power_watts",
                 "zeromon_collective_duration_seconds_bucket", "zeromon_allocator_retries_total", "zeromon_oom_risk"):
        assert name in r["names"], (name, r["names"])
    assert r["memory"]["device"] == "cuda:0" and r["memory"]["allocated"] > 0
    assert r["memory"]["capacity"] > r["memory"]["allocated"]
    assert r["device"] is not None and r["device"]["mem_total"] > 0
    assert r["oom"]["risk"] == "ok"
    assert 'op="all_reduce"' in r["metrics"]
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=r["metrics"], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_ddp_buckets_are_waited_on_the_gpu_clock(tmp_path: Path) -> None:
    """DDP's reducer waits for its buckets in C++; the agent's final callback waits on them first
    through Work.wait, which on NCCL makes the stream wait: each bucket gets a wait on the GPU's
    clock, and the GPU's own capacity (not the host's share) is the forecast's."""
    script = tmp_path / "gpu_ddp.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        import zeromon_agent
        from zeromon.model import read_recording
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        model = DDP(torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(),
                                        torch.nn.Linear(2048, 1)).cuda(), device_ids=[0], bucket_cap_mb=4)
        opt = torch.optim.AdamW(model.parameters())
        zeromon_agent.attach(model=model, optimizer=opt, out_dir=sys.argv[1])
        for _ in range(6):
            model(torch.randn(256, 2048, device="cuda")).sum().backward()
            opt.step(); opt.zero_grad()
        torch.cuda.synchronize()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(sys.argv[1], "rank-0.jsonl"))
        buckets = [e for e in rec.collectives if e.meaning == "grad_all_reduce"]
        print(json.dumps({
            "buckets": len(buckets), "timings": sorted({e.timing for e in buckets}),
            "waited": sum(e.wait_ns is not None for e in buckets),
            "hook_errors": rec.stats.hook_errors if rec.stats else None,
            "capacity": [m.capacity for m in rec.memory][-1], "total": torch.cuda.mem_get_info()[1],
        }))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["buckets"] >= 6, r  # at least one bucket a step
    assert r["timings"] == ["cuda_event"] and r["waited"] == r["buckets"], r
    assert r["hook_errors"] == 0, r
    assert r["capacity"] == r["total"], r


def test_an_explicit_step_loop_on_the_gpu_clock(tmp_path: Path) -> None:
    """A `zeromon_agent.step()` loop of plain tensor code (no module, autograd or optimizer) on the
    GPU: each step is the block on the stream's clock, the stream's time in it is computation but
    its waits, and the async collectives' issue calls are recorded without counting on the stream."""
    script = tmp_path / "gpu_explicit.py"
    script.write_text(textwrap.dedent("""
        import json, os, sys, torch, torch.distributed as dist
        import zeromon_agent
        from zeromon.model import read_recording
        from zeromon.analysis.step_overlap import step_overlaps
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        zeromon_agent.attach(out_dir=sys.argv[1], device_interval_s=0)
        x = torch.ones(1 << 22, device="cuda")
        blocks = []
        for _ in range(6):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with zeromon_agent.step():
                start.record()
                work = dist.all_reduce(x, async_op=True)
                torch.cuda._sleep(40_000_000)          # tens of ms of the stream's time, outside any module
                work.wait()
                dist.all_reduce(x)
                end.record()
            blocks.append((start, end))
        torch.cuda.synchronize()
        zeromon_agent.detach()
        rec = read_recording(os.path.join(sys.argv[1], "rank-0.jsonl"))
        analysed = {o.step: o for o in step_overlaps(rec)}
        steps = sorted(rec.steps, key=lambda s: s.step)
        print(json.dumps({
            "block_s": [a.elapsed_time(b) / 1e3 for a, b in blocks],
            "steps": [s.step for s in steps],
            "step_s": [s.duration_s for s in steps],
            # step 0 opens before the first CUDA collective turns the stream's marks on
            "phase_timings": sorted({str(p.timing) for p in rec.phases if p.step >= 1}),
            "comp_s": [analysed[s.step].comp_s for s in steps],
            "live_exposed": [s.exposed_comm_s for s in steps],
            "analysed_exposed": [analysed[s.step].exposed_comm_s for s in steps],
            "comm_s": [analysed[s.step].comm_s for s in steps],
            "timings": sorted({e.timing for e in rec.collectives}),
            "issue_s": [e.issue_s for e in rec.collectives],
            "hook_errors": rec.stats.hook_errors if rec.stats else None,
        }))
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["steps"] == list(range(6)), r
    assert r["phase_timings"] == ["cuda_event"] and r["timings"] == ["cuda_event"], r
    assert all(s is not None and s > 0 for s in r["issue_s"]), r
    assert r["hook_errors"] == 0, r
    for block, step, comp in zip(r["block_s"][1:], r["step_s"][1:], r["comp_s"][1:], strict=True):
        assert abs(step - block) <= 0.05 * block + 0.002, r  # the block, on the stream's clock
        assert comp >= 0.9 * block - 0.002, r  # the stream's time in the block counts as computation
    for live, analysed, comm in zip(r["live_exposed"], r["analysed_exposed"], r["comm_s"], strict=True):
        assert live is not None and abs(live - analysed) <= 1e-4 + 0.05 * comm, r
        assert 0 <= analysed <= comm + 1e-6, r


def test_the_agents_events_are_recorded_on_torchs_current_stream_on_a_gpu() -> None:
    """The agent records its CUDA events on the stream its fast reader gives (zeromon_agent.hooks.cuda.stream_reader,
    CudaTimer.current_stream): here it must take the fast path, agree with torch.cuda.current_stream() on the
    default stream, inside ``with torch.cuda.stream(s)`` and after it, and the event must land on that stream."""
    from zeromon_agent.hooks.cuda import CudaTimer, stream_reader

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    read = stream_reader(torch)
    assert read is not torch.cuda.current_stream, "this torch's private stream calls were refused"
    assert read() == torch.cuda.current_stream()
    timer = CudaTimer(torch, pool_size=4)
    timer.active = True  # as after a CUDA collective

    def record_now(event: torch.cuda.Event) -> None:
        timer.events.append(event)  # the next mark takes it: the pool holds the events' numbers
        timer.pool.appendleft(len(timer.events) - 1)
        number = timer.mark()
        assert number is not None and timer.events[number] is event

    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        assert read() == side == torch.cuda.current_stream()
        torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU cycles on the side stream alone
        event = torch.cuda.Event(enable_timing=True)
        record_now(event)
    idle = torch.cuda.Event(enable_timing=True)
    record_now(idle)  # the default stream, which has nothing queued
    idle.synchronize()
    assert not event.query(), "the event was not queued behind the side stream's work"
    event.synchronize()
    assert read() == torch.cuda.current_stream() != side


def test_a_progress_report_on_nccl_counts_the_groups_collectives_and_sees_one_still_in_flight(tmp_path: Path) -> None:
    # On a GPU the host goes past a collective that the stream has not reached: the report's group says it is not
    # complete (its CUDA events), which is how a rank whose host went on waits in it (zeromon.analysis.hang).
    script = tmp_path / "progress.py"
    script.write_text(textwrap.dedent("""
        import json, sys, time, torch, torch.distributed as dist
        import zeromon_agent
        from zeromon.analysis.hang import waiting_in
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{sys.argv[2]}")
        agent = zeromon_agent.attach(out_dir=sys.argv[1])
        t = torch.ones(1 << 20, device="cuda")
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        time.sleep(2.5)  # the recorder's passes (one a second on a GPU) see their events complete
        before = agent.recorder.progress_report("live")
        torch.cuda._sleep(3_000_000_000)  # a second or two of GPU time ahead of the next collective on the stream
        dist.all_reduce(t)
        during = agent.recorder.progress_report("live")
        waiting = waiting_in(during)
        torch.cuda.synchronize()
        time.sleep(2.5)
        after = agent.recorder.progress_report("live")
        group = lambda report: next(g for g in report.groups if g.desc == "default_pg")
        print(json.dumps({
            "issued": [group(r).issued for r in (before, during, after)],
            "last_done": [group(r).last_done for r in (before, during, after)],
            "waiting": [waiting[0].op, waiting[0].seq] if waiting else None,
            "blocked": during.blocked is not None,
        }))
        zeromon_agent.detach()
    """))
    out = run_python(script, str(tmp_path), str(free_port()), env=child_env(ZEROMON_DEVICE_TIMING_EVERY="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    first, during, after = result["issued"]
    assert first >= 5 and during == after == first + 1  # NCCL's own sequence number of the group
    assert result["last_done"] == [True, False, True]
    assert result["waiting"] == ["all_reduce", during] and not result["blocked"]


@pytest.mark.parametrize("script", ["fsdp2_train.py", "ddp_train.py"])
def test_whatif_replays_a_one_gpu_run_on_its_streams_clock(tmp_path: Path, script: str) -> None:
    """`zeromon whatif` on a one-GPU run at the agent's default device timing: the steps timed on the device are
    replayed (the first two, then 1 in 8), on the stream's clock, within the issue's 5% of the measured step. FSDP2
    on one rank issues no collective (a GPU run by its phases on the stream), DDP all-reduces its buckets (NCCL
    collectives timed with CUDA events)."""
    out = tmp_path / "run"
    shape = ("--hidden", "1024", "--layers", "4", "--batch", "8", "--seq", "512")
    result = zeromon("run", "--out", str(out), "--", *ranks_args(1, EXAMPLES / script, "--steps", "20", *shape))
    assert result.returncode == 0, result.stderr[-3000:]
    answers = {}
    for change in ("comm=hidden", "micro_batch=x2"):
        answer = zeromon("whatif", str(out), change, "--json", timeout=120)
        assert answer.returncode == 0, answer.stderr[-3000:]
        answers[change] = json.loads(answer.stdout)
    hidden, micro = answers["comm=hidden"], answers["micro_batch=x2"]
    assert hidden["steps"] == [0, 1, 8, 16], hidden["steps"]
    assert any("compute stream's" in a for a in hidden["assumptions"]), hidden["assumptions"]
    assert abs(hidden["replay"]["error_pct"]) <= 5.0, hidden
    assert hidden["predicted"]["median_step_s"] <= hidden["replay"]["median_step_s"] + 1e-9, hidden
    assert micro["predicted"]["median_step_s"] > micro["replay"]["median_step_s"], micro
    assert micro["predicted"]["peak_tracked_bytes"] > micro["measured"]["peak_tracked_bytes"], micro
