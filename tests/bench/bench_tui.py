"""The TUI with 256 ranks of replayed data: the time of a refresh and the size of the process.

    python tests/bench/bench_tui.py [--ranks 256] [--steps 120] [--refreshes 120] [--json out.json]

A recording of a 256-rank ZeRO-3 GPU job is synthesized with the codec's RecordingWriter (one
rank-<r>.jsonl per rank, as the agent writes them): a 1 s step with forward, backward, optimizer and
other phases, 16 collectives (8 parameter all-gathers in forward, 8 gradient reduce-scatters in
backward, timed with CUDA events), three memory samples per step (the optimizer's with every memory
category), one NVML device sample and a step summary per step. Rank 7 is a straggler (its steps
take 30% longer), rank 100 leaks 40 MiB a step, and the others differ a little in memory and in
communication time, so the table, the sparklines and the findings all have something to show.

The app is zeromon's ZeromonApp, headless (``App.run_test(size=(200, 60))``), watching a
ReplaySource of that folder playing at --speed (its clock and analysis run in its own thread, as
in `zeromon attach --replay`). The app's own timer is switched off; the benchmark calls its refresh
(``refresh_view()``: ``latest()``, the rows, header, sparklines and findings, the table's cell
updates) each time the replay has a new FleetView, and waits until the screen has drawn the result:
the compositor's update of the changed regions, encoded into the escape sequences a terminal
driver would write (the headless driver writes none, so the benchmark encodes them itself). A
refresh is the wall time from the call to the end of that drawing, including the wait for the
screen's next frame (Textual draws at most 60 times a second); the busy part without that wait is
reported too. The process's RSS is read at the end (and its peak, VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import benchlib

REFRESH_TARGET_MS = 50.0  # the issue: a refresh in under 50 ms with 256 ranks of replayed data
RSS_TARGET_MB = 150.0  # and the process under 150 MB
STEP_S = 1.0
COLLECTIVES = 16  # per step: 8 all-gathers in forward, 8 reduce-scatters in backward
GiB = 2**30


def synthesize(run_dir: Path, ranks: int, steps: int, t0_ns: int) -> int:
    """Write the recording; the records written."""
    from zeromon.model.codec import RecordingWriter, rank_file_name
    from zeromon.model.events import (
        MEMORY_CATEGORIES,
        AgentStats,
        CollectiveEvent,
        DeviceSample,
        MemorySample,
        Notice,
        PhaseSpan,
        RunInfo,
        StepSummary,
    )

    written = 0
    shard = 48 * 2**20  # bytes of one unit's parameter shard, bf16
    for rank in range(ranks):
        writer = RecordingWriter(run_dir / rank_file_name(rank), rank)
        slow = 1.3 if rank == 7 else 1.0
        jitter = (rank * 7919 % 97) / 97  # a fixed per-rank spread in [0, 1)
        writer.write(RunInfo(
            rank=rank, local_rank=rank % 8, world_size=ranks, host=f"node-{rank // 8:02d}", pid=20_000 + rank,
            job="llama-13b-zero3", framework="deepspeed", framework_version="0.19.8", torch_version="2.13.0",
            backend="nccl", device=f"cuda:{rank % 8}", zero_stage=3, fsdp_strategy=None, param_dtype="bfloat16",
            reduce_dtype="float32", optimizer="FusedAdam",
            knobs={"overlap_comm": True, "reduce_bucket_size": 500_000_000,
                   "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000}))
        writer.write(Notice(rank, t0_ns, "info", "nvml", "NVML found 8 GPUs"))
        seq = 0
        for s in range(steps):
            t = t0_ns + int(s * STEP_S * slow * 1e9)
            step_ns = int(STEP_S * slow * 1e9)
            bounds = (("forward", 0.0, 0.3), ("backward", 0.3, 0.8), ("optimizer", 0.8, 0.95), ("other", 0.95, 1.0))
            for phase, a, b in bounds:
                writer.write(PhaseSpan(rank, s, phase, t + int(a * step_ns), t + int(b * step_ns), "cuda_event"))
            comm_s = 0.0
            for i in range(COLLECTIVES):
                gather = i < COLLECTIVES // 2
                issue = t + int((0.3 * i / 8 if gather else 0.3 + 0.5 * (i - 8) / 8) * step_ns)
                took_ns = int((2.4 + 0.4 * jitter) * 1e6) if gather else int((3.1 + 0.5 * jitter) * 1e6)
                comm_s += took_ns / 1e9
                writer.write(CollectiveEvent(
                    seq=seq, rank=rank, step=s, phase="forward" if gather else "backward",
                    op="all_gather" if gather else "reduce_scatter",
                    api="all_gather_into_tensor" if gather else "reduce_scatter_tensor",
                    bytes_in=shard if gather else shard * ranks, bytes_out=shard * ranks if gather else shard,
                    dtype="bfloat16", group_size=ranks, async_op=True, issue_ns=issue, complete_ns=issue + took_ns,
                    blocked_s=0.0003, timing="cuda_event",
                    meaning="param_all_gather" if gather else "grad_reduce_scatter", wait_ns=issue + took_ns - 300_000))
                seq += 1
            base = int((52 + 4 * jitter) * GiB) + (40 * 2**20 * s if rank == 100 else 0)
            for phase, extra, at in (("forward", 6 * GiB, 0.3), ("backward", 9 * GiB, 0.8), ("optimizer", 2 * GiB, 0.95)):
                categories = ({c: (i + 1) * GiB // 4 for i, c in enumerate(MEMORY_CATEGORIES)}
                              if phase == "optimizer" else {"activations": extra})
                writer.write(MemorySample(
                    rank=rank, step=s, phase=phase, t_ns=t + int(at * step_ns), device=f"cuda:{rank % 8}",
                    allocated=base + extra, reserved=base + 11 * GiB, active=base + extra, peak_allocated=base + 9 * GiB,
                    peak_reserved=base + 11 * GiB, inactive_split=120 * 2**20, num_alloc_retries=0, num_ooms=0,
                    capacity=80 * GiB, free=80 * GiB - base - 12 * GiB, rss=14 * GiB, categories=categories))
            writer.write(DeviceSample(rank, t + step_ns - 1, rank % 8, "NVIDIA H100 80GB HBM3", 95.0 - 10 * jitter, 40.0,
                                      base + 12 * GiB, 80 * GiB, 610.0, 70.0, 1.2e9, 1.1e9, 3.1e11, 3.0e11))
            exposed = 0.02 + 0.03 * jitter
            writer.write(StepSummary(
                rank=rank, step=s, start_ns=t, end_ns=t + step_ns,
                phase_s={p: (b - a) * step_ns / 1e9 for p, a, b in bounds}, collectives=COLLECTIVES,
                comm_bytes=COLLECTIVES * shard * ranks,
                comm_bytes_by_op={"all_gather": 8 * shard * ranks, "reduce_scatter": 8 * shard * ranks},
                comm_union_s=comm_s, blocked_s=0.0048, peak_memory=base + 9 * GiB, comp_s=0.95 * step_ns / 1e9,
                overlap_s=comm_s - exposed, exposed_comm_s=exposed))
            written += 4 + COLLECTIVES + 3 + 1 + 1
        writer.write(AgentStats(rank, t0_ns + int(steps * STEP_S * slow * 1e9), written, 0, 0, 0.5))
        writer.close()
        written += 3
    return written


class FullCollections:
    """Full (generation 2) garbage collections while measuring: when each ran (perf_counter seconds)."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.spans.append((self._started, time.perf_counter()))

    @property
    def ms(self) -> list[float]:
        return [(b - a) * 1e3 for a, b in self.spans]

    def during(self, start: float, end: float) -> bool:
        return any(a < end and b > start for a, b in self.spans)


async def measure(run_dir: Path, speed: float, refreshes: int,
                  collections: FullCollections) -> tuple[list[float], list[float], list[bool], int]:
    """Per refresh: wall ms, busy ms and whether a full collection ran in it; the ranks shown in the table."""
    from textual.screen import Screen

    from zeromon.sources.replay import ReplaySource
    from zeromon.tui.app import ZeromonApp
    from zeromon.tui.widgets import RanksTable

    source = ReplaySource(run_dir, speed=speed)
    app = ZeromonApp(source, refresh_s=3600.0)  # the benchmark refreshes, not the app's timer
    drawn: list[float] = []  # perf_counter() at the end of each screen update
    busy_draw: list[float] = []  # seconds each screen update took

    original_refresh = Screen._compositor_refresh

    def compositor_refresh(screen: Screen[object]) -> None:
        started = time.perf_counter()
        original_refresh(screen)
        done = time.perf_counter()
        busy_draw.append(done - started)
        drawn.append(done)

    original_display = app._display

    def display(screen: Screen[object], renderable: object) -> None:
        original_display(screen, renderable)  # type: ignore[arg-type]
        render = getattr(renderable, "render_segments", None)
        if render is not None:  # what the terminal driver would do with it: escape sequences
            render(app.console)

    app._display = display  # type: ignore[method-assign]
    Screen._compositor_refresh = compositor_refresh  # type: ignore[method-assign]
    wall_ms: list[float] = []
    busy_ms: list[float] = []
    collected: list[bool] = []
    try:
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause(0.5)
            gc.callbacks.append(collections)
            last_t = None
            while len(wall_ms) < refreshes:
                if source.finished:
                    raise SystemExit(f"the replay ended after {len(wall_ms)} refreshes: raise --steps or lower --speed")
                view = source.latest()
                if view.t_ns == last_t:
                    await asyncio.sleep(0.005)
                    continue
                last_t = view.t_ns
                before = len(drawn)
                started = time.perf_counter()
                app.refresh_view()
                updated = time.perf_counter()
                while len(drawn) == before:
                    await asyncio.sleep(0)
                wall_ms.append((drawn[-1] - started) * 1e3)
                collected.append(collections.during(started, drawn[-1]))
                busy_ms.append((updated - started + sum(busy_draw[before:])) * 1e3)
            shown = len(app.screen.query_one(RanksTable).row_keys)
    finally:
        if collections in gc.callbacks:
            gc.callbacks.remove(collections)
        Screen._compositor_refresh = original_refresh  # type: ignore[method-assign]
    return wall_ms, busy_ms, collected, shown


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=256)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--refreshes", type=int, default=120)
    parser.add_argument("--speed", type=float, default=4.0, help="replay speed (virtual s per wall s)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="zeromon-bench-tui-") as tmp:
        run_dir = Path(tmp) / "run"
        started = time.perf_counter()
        records = synthesize(run_dir, args.ranks, args.steps, time.time_ns())
        size_mb = sum(f.stat().st_size for f in run_dir.iterdir()) / benchlib.MB
        print(f"synthesized {args.ranks} ranks x {args.steps} steps: {records:,} records, {size_mb:.0f} MB, "
              f"{time.perf_counter() - started:.1f} s")
        rss_before = benchlib.rss_bytes()
        started = time.perf_counter()
        collections = FullCollections()
        wall_ms, busy_ms, collected, shown = asyncio.run(measure(run_dir, args.speed, args.refreshes, collections))
        elapsed = time.perf_counter() - started
        rss = benchlib.rss_bytes()
    peak = benchlib.peak_rss_bytes()
    assert shown == args.ranks, f"the table shows {shown} ranks, not {args.ranks}"
    note = (f"{len(wall_ms)} refreshes at 200x60, {args.ranks} ranks x {args.steps} steps replayed at x{args.speed:g} "
            f"({records:,} records); {benchlib.load_note()}")
    wall_median, wall_p95 = benchlib.median(wall_ms), p95(wall_ms)
    quiet = [ms for ms, gc_ran in zip(wall_ms, collected, strict=True) if not gc_ran]
    hit = [ms for ms, gc_ran in zip(wall_ms, collected, strict=True) if gc_ran]
    rows = [
        benchlib.Row("tui", "refresh, new FleetView to drawn (median)", "ms", None, wall_median,
                     f"< {REFRESH_TARGET_MS:g} ms", wall_median < REFRESH_TARGET_MS, note),
        benchlib.Row("tui", "refresh, new FleetView to drawn (p95)", "ms", None, wall_p95,
                     f"< {REFRESH_TARGET_MS:g} ms", wall_p95 < REFRESH_TARGET_MS),
        benchlib.Row("tui", "refresh without the wait for the frame (median)", "ms", None, benchlib.median(busy_ms),
                     "informational", None),
        benchlib.Row("tui", "refresh without the wait for the frame (p95)", "ms", None, p95(busy_ms),
                     "informational", None),
        benchlib.Row("tui", "refresh with no full garbage collection in it (p95)", "ms", None, p95(quiet),
                     "informational", None,
                     f"{len(collections.spans)} full collections of the process's objects while measuring, median "
                     f"{benchlib.median(collections.ms or [0.0]):.0f} ms each; {sum(collected)} of {len(wall_ms)} "
                     f"refreshes had one in them, max {max(hit, default=0.0):.0f} ms"),
        benchlib.Row("tui", "process RSS with the app and the replay", "MB", None, rss / benchlib.MB,
                     f"< {RSS_TARGET_MB:g} MB", rss / benchlib.MB < RSS_TARGET_MB,
                     f"peak (VmHWM) {peak / benchlib.MB:.0f} MB, before the app {rss_before / benchlib.MB:.0f} MB; "
                     f"{elapsed:.0f} s with the app"),
    ]
    benchlib.print_rows(f"zeromon attach: {args.ranks} replayed ranks", rows)
    benchlib.write_rows(args.json, rows, {"pid": os.getpid()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
