"""The agent's memory stays bounded: process RSS before and after a million recorded collectives.

    python tests/bench/bench_agent_memory.py [--events 1000000] [--driver gloo|noop] [--json out.json]

The agent runs as in production: ``zeromon_agent.attach(out_dir=<tmp>)`` in a world-size-1 gloo
process group, its Recorder thread draining the raw buffer every 0.2 s and writing the rank file.
The driver issues one collective per event:

- ``gloo`` (default): the patched ``dist.all_reduce`` on a 16-element tensor, ~12 us a call, a
  pace the recorder keeps up with;
- ``noop``: ``make_wrapper`` around a no-op bound to the agent's state, ~1 us a call, far faster
  than the recorder drains: the raw buffer fills and the oldest entries are dropped and counted.
  This is the worst case for the buffer's size.

Scenarios (``--scenario``):

- ``steps`` (default): every ``--per-step`` collectives are one ``with zeromon_agent.step():``, so
  step summaries are built and written too;
- ``open-step``: a root module is attached and runs one forward (which starts step 0), and no step
  ever ends (no torch optimizer steps, no ``step()`` context): an evaluation loop, or a custom
  optimizer that is not a ``torch.optim.Optimizer``.

RSS (``/proc/self/statm``, after ``gc.collect()``) is read once the agent
has warmed up (buffers, caches and the file's write buffer in place), after every tenth of the
events, and at the end once the recorder has drained everything; VmHWM gives the peak.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib
import torch
import torch.distributed as dist

import zeromon_agent
from zeromon_agent.hooks import collectives
from zeromon_agent.hooks.state import STATE

TARGET_MB = 50.0  # the issue: <= 50 MB RSS added by a million events


def noop_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> None:
    return None


def make_driver(name: str) -> Callable[[torch.Tensor], Any]:
    if name == "gloo":
        assert hasattr(dist.all_reduce, "__zeromon_original__"), "attach() did not patch dist.all_reduce"
        return dist.all_reduce
    _, extract = collectives.DIST_SPECS["all_reduce"]
    return collectives.make_wrapper(noop_all_reduce, "all_reduce", "all_reduce", extract, STATE)


def drive(collective: Callable[[torch.Tensor], Any], tensor: torch.Tensor, events: int, per_step: int) -> None:
    """`events` collectives, `per_step` to a step; per_step 0: no steps at all."""
    if per_step == 0:
        for _ in range(events):
            collective(tensor)
        return
    for _ in range(events // per_step):
        with zeromon_agent.step():
            for _ in range(per_step):
                collective(tensor)


def settled_rss() -> int:
    gc.collect()
    return benchlib.rss_bytes()


def wait_drained(timeout_s: float = 120.0) -> bool:
    """Until the recorder has taken everything out of the raw buffer (it drains every 0.2 s)."""
    drained = benchlib.wait_until(lambda: not STATE.raw, timeout_s)
    time.sleep(0.5)  # one more flush period: the last drain finishes its events and writes them
    return drained


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="collectives recorded after warmup")
    parser.add_argument("--warmup", type=int, default=50_000, help="collectives before the first reading")
    parser.add_argument("--per-step", type=int, default=100, help="collectives per training step")
    parser.add_argument("--driver", choices=("gloo", "noop"), default="gloo")
    parser.add_argument("--scenario", choices=("steps", "open-step"), default="steps")
    parser.add_argument("--json", metavar="PATH", help="also write the rows as JSON (run_all.py reads them)")
    args = parser.parse_args(argv)
    if args.events % (10 * args.per_step) or args.warmup % args.per_step:
        parser.error("--events must be a multiple of 10 x --per-step, --warmup of --per-step")

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{benchlib.free_port()}")
    tensor = torch.zeros(16)
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-mem-") as tmp:
        run_dir = Path(tmp) / "run"
        rss_before_attach = settled_rss()
        per_step = args.per_step
        if args.scenario == "open-step":
            model = torch.nn.Linear(4, 4)
            agent = zeromon_agent.attach(model=model, out_dir=str(run_dir))
            model(torch.zeros(1, 4))  # the root's first forward starts step 0; nothing ever ends it
            per_step = 0
        else:
            agent = zeromon_agent.attach(out_dir=str(run_dir))
        collective = make_driver(args.driver)

        drive(collective, tensor, args.warmup, per_step)
        wait_drained()
        recorded0, dropped0 = STATE.recorded, STATE.dropped
        rss0 = settled_rss()
        print(f"RSS before attach {rss_before_attach / benchlib.MB:.1f} MB, after attach + {args.warmup:,} "
              f"events {rss0 / benchlib.MB:.1f} MB", flush=True)

        chunk = args.events // 10
        readings: list[tuple[int, float, int]] = []  # (events so far, RSS MB, raw buffer length)
        started = time.perf_counter()
        for i in range(1, 11):
            drive(collective, tensor, chunk, per_step)
            buffered = len(STATE.raw)
            readings.append((i * chunk, settled_rss() / benchlib.MB, buffered))
            print(f"  {i * chunk:>9,} events  RSS {readings[-1][1]:7.1f} MB  raw buffer {buffered:>6,}  "
                  f"dropped {STATE.dropped - dropped0:,}  {time.perf_counter() - started:5.1f} s", flush=True)
        drive_s = time.perf_counter() - started
        drained = wait_drained()
        rss1 = settled_rss()
        peak = benchlib.peak_rss_bytes()
        recorded, dropped = STATE.recorded - recorded0, STATE.dropped - dropped0
        finalized = agent.recorder.events_finalized if agent.recorder is not None else 0
        zeromon_agent.detach()  # closes the file
        file_bytes = (run_dir / "rank-0.jsonl").stat().st_size
    dist.destroy_process_group()

    added_mb = (rss1 - rss0) / benchlib.MB
    second_half_mb = readings[-1][1] - readings[4][1]
    steps_text = f"{args.per_step} collectives per step" if per_step else "one step that never ends"
    note = (f"{args.driver} driver, {steps_text}; {drive_s:.1f} s to issue "
            f"({args.events / drive_s:,.0f}/s); {benchlib.load_note()}")
    name = f"agent memory ({args.driver}, {args.scenario})"
    rows = [
        benchlib.Row(name, "RSS: attach + warmup", "MB", rss_before_attach / benchlib.MB,
                     rss0 / benchlib.MB, "", None, f"imports, buffers and caches; {args.warmup:,} warmup events"),
        benchlib.Row(name, f"RSS after {args.events:,} events (drained)", "MB", rss0 / benchlib.MB,
                     rss1 / benchlib.MB, f"added <= {TARGET_MB:.0f} MB", added_mb <= TARGET_MB, note),
        benchlib.Row(name, "peak RSS (VmHWM) vs before", "MB", rss0 / benchlib.MB, peak / benchlib.MB,
                     "", None, "VmHWM covers the whole process life"),
        benchlib.Row(name, "RSS growth over the second half", "MB", readings[4][1], readings[-1][1],
                     "", None, f"{readings[4][0]:,} -> {readings[-1][0]:,} events"),
        benchlib.Row(name, "events recorded", "events", None, recorded, "", None),
        benchlib.Row(name, "events dropped (buffer full)", "events", None, dropped, "", None,
                     f"raw buffer {STATE.raw_capacity:,} entries; {finalized:,} events finalized in all"),
        benchlib.Row(name, "recording file size", "MB", None, file_bytes / benchlib.MB, "", None,
                     f"{file_bytes / max(finalized, 1):.0f} bytes per finalized event"),
    ]
    if not drained:
        print("warning: the recorder did not drain the raw buffer within 120 s")
    benchlib.print_rows(f"{name}: RSS around {args.events:,} collectives", rows)
    print(f"second half growth: {second_half_mb:+.1f} MB")
    benchlib.write_rows(args.json, rows, {"readings": readings})
    return 0


if __name__ == "__main__":
    sys.exit(main())
