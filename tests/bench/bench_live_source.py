"""The live source's own cost: CPU of a client polling 64 agents once a second.

    python tests/bench/bench_live_source.py [--agents 64] [--seconds 30] [--interval 1.0] [--json out.json]

The agents are simulated, in a separate process (this script with ``--serve``): 64 real HTTP
servers on loopback, one port each, in one asyncio loop, answering ``/api/v1/snapshot`` as the
agent's endpoint does (schema ``zeromon.snapshot/1``, HTTP/1.0, one request per connection) with
the documents of a ZeRO-3 GPU run: a 0.5 s step with 4 phases, 48 collectives and 3 memory samples
(112 events a second per rank on ``?since=``), 64 steps per snapshot, memory with every category, a
device sample, 6 collective totals, an OOM forecast and findings (about 40 KB per snapshot plus the
events). The documents are made from zeromon's own model types, so the client parses what a real
agent sends.

The client is zeromon's LiveSource as the TUI uses it: given the run folder (64 registry entries,
looked at again every poll), interval 1 s, and ``latest()`` read 4 times a second. After a warm-up,
its process CPU time (``time.process_time()``: every thread of the process) over ``--seconds`` of
wall time is the number, as a share of one core. Also measured: the same without the event stream
(``events=False``, snapshots only).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

TARGET_PCT = 5.0  # the issue: 64 agents at 1 Hz with under 5% of one core
STEP_S = 0.5
COLLECTIVES_PER_STEP = 48
EVENTS_KEPT = 4096


# --- the simulated agents (the --serve process) ------------------------------------------------------------

class SimRank:
    """One rank's snapshot documents, advanced with the wall clock: a step every STEP_S seconds."""

    def __init__(self, rank: int, world: int, t0_ns: int) -> None:
        from zeromon.model.events import RunInfo

        self.rank, self.world, self.t0_ns = rank, world, t0_ns
        self.start_ns = time.time_ns()
        self.step = -1
        self.cursor = 0
        self.events: list[bytes] = []  # encoded events; events[i] has cursor first_cursor + i
        self.first_cursor = 1
        self.steps: list[dict[str, Any]] = []
        self.body = b""  # the snapshot after its head, up to the events
        self.requests = 0
        self.events_sent = 0
        self.run_info = dataclasses.asdict(RunInfo(
            rank=rank, local_rank=rank % 8, world_size=world, host=f"node-{rank // 8}", pid=10_000 + rank,
            job="llama-7b-zero3", framework="deepspeed", framework_version="0.19.8", torch_version="2.13.0",
            backend="nccl", device=f"cuda:{rank % 8}", zero_stage=3, fsdp_strategy=None, param_dtype="bfloat16",
            reduce_dtype="float32", optimizer="FusedAdam",
            knobs={"overlap_comm": True, "reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
                   "stage3_max_live_parameters": 1_000_000_000, "offload_optimizer": "none"}))

    def _event(self, kind: str, record: Any) -> None:
        self.cursor += 1
        self.events.append(json.dumps({"cursor": self.cursor, "kind": kind, **dataclasses.asdict(record)}).encode())

    def advance(self, now_ns: int) -> None:
        from zeromon.model.events import CollectiveEvent, PhaseSpan, StepSummary

        target = int((now_ns - self.t0_ns) / (STEP_S * 1e9))
        if target <= self.step:
            return
        for s in range(max(self.step + 1, target - 64), target + 1):
            t = self.t0_ns + int(s * STEP_S * 1e9)
            bounds = {"forward": (0.0, 0.15), "backward": (0.15, 0.42), "optimizer": (0.42, 0.48), "other": (0.48, 0.5)}
            for phase, (a, b) in bounds.items():
                self._event("phase", PhaseSpan(self.rank, s, phase, t + int(a * 1e9), t + int(b * 1e9)))
            for i in range(COLLECTIVES_PER_STEP):
                gather = i < 32
                issue = t + int((0.003 * i + (0.0 if gather else 0.15)) * 1e9)
                self._event("collective", CollectiveEvent(
                    seq=s * COLLECTIVES_PER_STEP + i, rank=self.rank, step=s,
                    phase="forward" if i < 16 else "backward", op="all_gather" if gather else "reduce_scatter",
                    api="all_gather_into_tensor" if gather else "reduce_scatter_tensor", bytes_in=25_165_824,
                    bytes_out=25_165_824 * self.world if gather else 25_165_824 // self.world, dtype="bfloat16",
                    group_size=self.world, async_op=True, issue_ns=issue, complete_ns=issue + 2_400_000,
                    blocked_s=0.0004, timing="cuda_event",
                    meaning="param_all_gather" if gather else "grad_reduce_scatter", wait_ns=issue + 2_000_000))
            for phase in ("forward", "backward", "optimizer"):
                self._event("memory", self._memory(s, phase, t))
            summary = StepSummary(
                rank=self.rank, step=s, start_ns=t, end_ns=t + int(STEP_S * 1e9),
                phase_s={"forward": 0.15, "backward": 0.27, "optimizer": 0.06, "other": 0.02}, collectives=48,
                comm_bytes=48 * 25_165_824 * self.world, comm_bytes_by_op={"all_gather": 32 * 25_165_824 * self.world,
                                                                             "reduce_scatter": 16 * 25_165_824},
                comm_union_s=0.11, blocked_s=0.019, peak_memory=61_000_000_000 + s, comp_s=0.44, overlap_s=0.09,
                exposed_comm_s=0.02)
            self._event("step", summary)
            self.steps.append(dataclasses.asdict(summary))
        self.step = target
        self.steps = self.steps[-64:]
        if len(self.events) > EVENTS_KEPT:
            drop = len(self.events) - EVENTS_KEPT
            del self.events[:drop]
            self.first_cursor += drop
        self.body = self._body(now_ns)

    def _memory(self, step: int, phase: str, t: int) -> Any:
        from zeromon.model.events import MEMORY_CATEGORIES, MemorySample

        return MemorySample(
            rank=self.rank, step=step, phase=phase, t_ns=t, device=f"cuda:{self.rank % 8}", allocated=58_000_000_000,
            reserved=62_000_000_000, active=58_100_000_000, peak_allocated=61_000_000_000,
            peak_reserved=63_000_000_000, inactive_split=120_000_000, num_alloc_retries=0, num_ooms=0,
            capacity=85_899_345_920, free=20_000_000_000, rss=14_000_000_000,
            categories={c: 1_000_000_000 + i for i, c in enumerate(MEMORY_CATEGORIES)})

    def _body(self, now_ns: int) -> bytes:
        from zeromon.analysis.findings import Finding, Severity
        from zeromon.analysis.oom import OomForecast
        from zeromon.model.events import AgentStats, DeviceSample, Notice

        findings = [Finding("poor_overlap", Severity.WARN, "exposed communication is 4% of the step", rank=self.rank,
                            step=self.step, evidence=("median exposed 20.0 ms of 500.0 ms",),
                            remedies=("raise stage3_prefetch_bucket_size",), metrics={"exposed_share": 0.04})]
        oom = OomForecast(rank=self.rank, risk=Severity.WARN, capacity_bytes=85_899_345_920,
                          current_bytes=58_000_000_000, peak_bytes=61_000_000_000, headroom_bytes=8_000_000_000,
                          predicted_peak_bytes=77_000_000_000, growth_bytes_per_step=None, steps_to_capacity=None,
                          findings=(Finding("oom_risk", Severity.WARN, "predicted peak is 90% of capacity",
                                            rank=self.rank, evidence=("peak 61 GB", "gathers 16 GB"),
                                            remedies=("lower stage3_max_live_parameters",)),),
                          device=f"cuda:{self.rank % 8}")
        device = DeviceSample(self.rank, now_ns, self.rank % 8, "NVIDIA H100 80GB HBM3", 97.0, 41.0, 72_000_000_000,
                              85_899_345_920, 612.5, 71.0, 1.2e9, 1.1e9, 3.1e11, 3.0e11)
        rows = [{"op": op, "meaning": meaning, "calls": 48 * (self.step + 1), "bytes": 25_165_824 * (self.step + 1),
                 "seconds": 0.11 * (self.step + 1), "blocked_s": 0.019 * (self.step + 1), "busbw_bytes_s": 1.6e11}
                for op, meaning in (("all_gather", "param_all_gather"), ("reduce_scatter", "grad_reduce_scatter"),
                                    ("all_reduce", "grad_all_reduce"), ("all_reduce", "unknown"),
                                    ("broadcast", "param_broadcast"), ("barrier", "unknown"))]
        rest = {
            "run_info": self.run_info, "steps": self.steps,
            "memory": dataclasses.asdict(self._memory(self.step, "optimizer", now_ns)),
            "device": dataclasses.asdict(device),
            "stats": dataclasses.asdict(AgentStats(self.rank, now_ns, 56 * (self.step + 1), 0, 0, 0.01 * self.step)),
            "collectives": rows, "oom": oom.to_dict(), "findings": [f.to_dict() for f in findings + list(oom.findings)],
            "notices": [dataclasses.asdict(Notice(self.rank, self.start_ns, "info", "nvml", "NVML sampling at 1 Hz"))],
        }
        return json.dumps(rest).encode()[1:-1]

    def answer(self, query: dict[str, str]) -> bytes:
        now_ns = time.time_ns()
        self.advance(now_ns)
        self.requests += 1
        head = {"schema": "zeromon.snapshot/1", "t_ns": now_ns, "rank": self.rank, "local_rank": self.rank % 8,
                "world_size": self.world, "host": f"node-{self.rank // 8}", "pid": 10_000 + self.rank,
                "job": "llama-7b-zero3", "start_ns": self.start_ns, "cursor": self.cursor}
        parts = [json.dumps(head).encode()[:-1], b",", self.body]
        if "since" in query:
            since, limit = int(query["since"]), int(query.get("limit", 2000))
            start = max(0, since - self.first_cursor + 1)
            events = self.events[start:start + limit]
            self.events_sent += len(events)
            parts += [b',"events":[', b",".join(events), b"]"]
            if since + 1 < self.first_cursor:
                parts.append(b',"events_lost":true')
        return b"".join(parts) + b"}"


async def _serve(n: int, ports_file: Path) -> None:
    t0_ns = time.time_ns()
    ranks = [SimRank(r, n, t0_ns - int(r * 0.003e9)) for r in range(n)]  # ranks a few ms apart

    def handler(rank: SimRank) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
                target = head.split(b" ", 2)[1].decode()
                path, _, qs = target.partition("?")
                query = dict(p.split("=", 1) for p in qs.split("&") if "=" in p)
                body = rank.answer(query) if path == "/api/v1/snapshot" else b"{}"
                status = b"200 OK" if path == "/api/v1/snapshot" else b"404 Not Found"
                writer.write(b"HTTP/1.0 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
                await writer.drain()
            except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()
        return handle

    servers = [await asyncio.start_server(handler(rank), "127.0.0.1", 0, backlog=16) for rank in ranks]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    ports_file.write_text(json.dumps(ports))
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the client closes our stdin
    for s in servers:
        s.close()
    print(json.dumps({"requests": [r.requests for r in ranks], "events_sent": sum(r.events_sent for r in ranks),
                      "server_cpu_s": time.process_time()}), flush=True)


# --- the client (this process) ----------------------------------------------------------------------------

def measure(run_dir: Path, seconds: float, interval_s: float, events: bool) -> dict[str, Any]:
    from zeromon.sources.live import LiveSource

    source = LiveSource(run_dir=run_dir, interval_s=interval_s, events=events).start()
    try:
        deadline = time.monotonic() + 30
        while source.latest().alive < len(source.latest().ranks) or not source.latest().ranks:
            if time.monotonic() > deadline:
                raise SystemExit(f"the agents did not all answer: {source.latest().to_dict()['error']}")
            time.sleep(0.1)
        time.sleep(3 * interval_s)  # warm-up: connections, first event backfill
        first = {r.rank: r.last_step.step if r.last_step else -1 for r in source.latest().ranks}
        cpu0, wall0 = time.process_time(), time.monotonic()
        reads = 0
        while time.monotonic() - wall0 < seconds:
            time.sleep(0.25)  # a TUI redraws 4 times a second
            source.latest()
            reads += 1
        cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
        view = source.latest()
    finally:
        source.stop()
    advanced = sum(1 for r in view.ranks if r.last_step and r.last_step.step > first.get(r.rank, -1))
    phases = min(len(r.phases) for r in view.ranks)
    return {"cpu_s": cpu_s, "wall_s": wall_s, "pct": 100 * cpu_s / wall_s, "alive": view.alive,
            "ranks": len(view.ranks), "advanced": advanced, "reads": reads, "min_phases": phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # the agents' process
    args = parser.parse_args(argv)
    if args.serve is not None:
        asyncio.run(_serve(args.agents, args.serve))
        return 0

    from zeromon.model.registry import EndpointEntry, run_entry_path, write_entry

    rows: list[benchlib.Row] = []
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-live-") as tmp:
        ports_file, run_dir = Path(tmp) / "ports.json", Path(tmp) / "run"
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(ports_file), "--agents", str(args.agents)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            if not benchlib.wait_until(ports_file.exists, 30):
                raise SystemExit("the simulated agents did not start")
            time.sleep(0.2)
            ports = json.loads(ports_file.read_text())
            host = os.uname().nodename
            for rank, port in enumerate(ports):
                write_entry(run_entry_path(run_dir, rank), EndpointEntry(
                    run_dir=str(run_dir), run_id="run", job="llama-7b-zero3", host=host, address="127.0.0.1",
                    port=port, url=f"http://127.0.0.1:{port}", rank=rank, local_rank=rank % 8, world_size=len(ports),
                    pid=server.pid, start_ns=time.time_ns(), token_required=False))
            results = {}
            for events in (True, False):
                results[events] = measure(run_dir, args.seconds, args.interval, events)
        finally:
            out, _ = server.communicate(input="", timeout=60)
        served = json.loads(out.strip().splitlines()[-1])
    total_wall = sum(r["wall_s"] for r in results.values()) + 6 * args.interval
    for events, r in results.items():
        what = "snapshots and event stream (default)" if events else "snapshots only (events=False)"
        note = (f"{r['cpu_s']:.2f} s CPU in {r['wall_s']:.1f} s; {r['alive']}/{r['ranks']} ranks alive, "
                f"{r['advanced']} advanced, >= {r['min_phases']} phase spans each; {benchlib.load_note()}")
        rows.append(benchlib.Row("live source", f"{args.agents} agents at {1 / args.interval:g} Hz: {what}",
                                 "% core", None, r["pct"], f"< {TARGET_PCT:g}% of one core",
                                 r["pct"] < TARGET_PCT and r["alive"] == r["ranks"] == args.agents, note))
    rate = sum(served["requests"]) / total_wall
    rows.append(benchlib.Row("live source", "snapshots answered per second (all agents)", "req/s", None, rate,
                             "", None, f"{min(served['requests'])}-{max(served['requests'])} per agent; "
                             f"{served['events_sent']:,} events sent; the agents' process used "
                             f"{served['server_cpu_s']:.1f} s CPU"))
    benchlib.print_rows(f"live source: {args.agents} simulated agents, {args.seconds:g} s each", rows)
    benchlib.write_rows(args.json, rows)
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
