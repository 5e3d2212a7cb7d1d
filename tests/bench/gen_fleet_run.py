"""A fleet-sized run made from a real one: N ranks x S steps, written through zeromon's own writer.

Written in the agent's default form: rank-<r>.zmr (format 2.x, CompactWriter), or with ``--format jsonl``
rank-<r>.jsonl (format 1.x, RecordingWriter). The agent appends one segment per ``flush_interval_s``
(5 s by default: agents/zeromon_agent/context/config.py, recorder.py's loop) holding what its drain passes
buffered since the last, and writes none when nothing came. The generator does the same on the run's
own clock: a step's records (its kept detail, then its summary) go into the segment of the window
its end falls in, a window with no step end writes nothing. The steps' period is the template's longest
step, the second straggler's delay and jitter: ~75 ms from a 12-step source recorded on a quiet machine
here (median step 36 ms, its time blocked spread over 18.5 ms: delays of 18.5 and 27.8 ms), ~66 step
summaries a segment, ~150 segments a rank of 10,000 steps; longer on a busy machine. A detail step's
segment holds its ~11 collectives, ~9 phase spans (~16 in a recording made before zeromon's work at a
boundary became one span) and 3-4 memory samples besides. An AgentStats goes in every 10 s of the run's
clock, as the agent writes one.

A real 2-rank FSDP2 run on gloo is recorded once (or one is given), and its rank 0's steady steps
are replayed as every rank's steps, with the variation a fleet has:

- every step has a StepSummary; collectives, phase spans and memory samples ("kept detail") only in
  the last ``DETAIL_LAST_STEPS`` steps and every ``DETAIL_EVERY``-th step (a bounded recording);
- two straggler ranks: the first late (its forward slower by ``STRAGGLER_DELAY_SHARES[0]`` of a step,
  or by the spread of the source's time blocked where that is more) in three of four steps, the second
  in the fourth, and every peer blocked that long in its first collective;
- one rank whose memory grows every step, to ``GROWING_RANK_END_SHARE`` of its capacity at the end;
- per-rank memory offsets, a per-rank clock offset and per-step jitter of the step boundaries.

One run id, the world size N in every header and RunInfo, hosts of 8 ranks each: `zeromon report`
reads it as one run. Ranks are written in parallel, one process per CPU.

    python tests/bench/gen_fleet_run.py OUT --ranks 1024 --steps 10000 [--source RUN_DIR] [--format jsonl]

Importable: tests call ``record_source`` and ``generate``; ``fleet_roles(n)`` names the special ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zeromon.model import (
    AgentStats,
    CollectiveEvent,
    MemorySample,
    Notice,
    PhaseSpan,
    RecordingWriter,
    RunInfo,
    StepSummary,
)
from zeromon.model.codec import rank_file_name, read_recording, run_headers
from zeromon.model.events import RunEnd
from zeromon.model.segments import CompactWriter
from zeromon_agent.context.config import AgentConfig

DETAIL_LAST_STEPS = 50
DETAIL_EVERY = 500
# How late each straggler's forward makes it in its late steps, as shares of the source's median step
# time (a loaded machine records slower steps: the stragglers stay as late in proportion); the first's
# delay is at least the spread of the source's time blocked (max - min over its steps), and the second's
# in the same proportion to it.
STRAGGLER_DELAY_SHARES = (0.2, 0.3)
GROWING_RANK_END_SHARE = 0.93  # the growing rank's memory at the last step, of its capacity
STEP_JITTER_S = 0.002  # the step boundaries' jitter (every rank), and each rank's own on top:
RANK_JITTER_S = 0.0005
CLOCK_OFFSET_S = 0.00002  # each rank's clock, within +- this of the others'
MEMORY_SPREAD_BYTES = 4 * 2**20  # each rank's memory within + this of the source's
# The agent's default flush_interval_s (ZEROMON_FLUSH_INTERVAL): one compact segment per window.
FLUSH_INTERVAL_NS = round(AgentConfig().flush_interval_s * 1e9)
STATS_INTERVAL_NS = 10_000_000_000  # the agent writes its AgentStats every 10 s
FORMATS = {"zmr": (CompactWriter, ".zmr"), "jsonl": (RecordingWriter, ".jsonl")}


@dataclass(frozen=True, slots=True)
class Roles:
    """The ranks that differ: what a report of the generated run should name first."""

    stragglers: tuple[int, int]  # the first is late in 3 of 4 steps, the second in the 4th
    growing_memory: int


def fleet_roles(ranks: int) -> Roles:
    if ranks < 4:
        raise ValueError("a fleet run has at least 4 ranks (two stragglers, a growing rank, a peer)")
    return Roles(stragglers=(ranks // 3, (2 * ranks) // 3 + 1), growing_memory=ranks - 2)


def is_detail_step(step: int, steps: int) -> bool:
    return step >= steps - DETAIL_LAST_STEPS or step % DETAIL_EVERY == 0


def record_source(out: Path, steps: int = 12) -> Path:
    """A real 2-rank FSDP2 run on gloo, recorded by `zeromon run` into ``out`` (~25 s)."""
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", ZEROMON_PORT="0")
    from benchlib import free_port

    port = free_port()
    command = [sys.executable, "-m", "zeromon", "run", "--out", str(out), "--",
               sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
               str(repo / "examples" / "fsdp2_train.py"), "--steps", str(steps)]
    result = subprocess.run(command, env=env, cwd=repo, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"recording the source run failed:\n{result.stderr[-3000:]}")
    return out


@dataclass(frozen=True, slots=True)
class _TemplateStep:
    summary: StepSummary
    collectives: tuple[CollectiveEvent, ...]
    phases: tuple[PhaseSpan, ...]
    memory: tuple[MemorySample, ...]


@dataclass(frozen=True, slots=True)
class _Template:
    steps: tuple[_TemplateStep, ...]  # the source's steady steps (after the first), in order
    header: dict[str, Any]
    run_info: RunInfo
    notices: tuple[Notice, ...]


def _template(source: Path) -> _Template:
    # rank 0's file in either form (the agent writes rank-0.zmr by default, tests rank-0.jsonl)
    rec = read_recording(next((path for path, header in run_headers(source) if header.get("rank") == 0),
                              source / rank_file_name(0)))
    if rec.run_info is None or len(rec.steps) < 3:
        raise ValueError(f"{source}: rank 0 needs a RunInfo and at least 3 steps to be a template")
    by_step: dict[int, dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for c in rec.collectives:
        by_step[c.step]["collectives"].append(c)
    for p in rec.phases:
        by_step[p.step]["phases"].append(p)
    for m in rec.memory:
        by_step[m.step]["memory"].append(m)
    steady = sorted((s for s in rec.steps if s.step >= 1), key=lambda s: s.step)
    steps = tuple(_TemplateStep(s, *(tuple(by_step[s.step][kind]) for kind in ("collectives", "phases", "memory")))
                  for s in steady)
    header = {k: v for k, v in rec.header.items() if k not in ("format", "version", "rank", "schemas")}
    return _Template(steps=steps, header=header, run_info=rec.run_info, notices=tuple(rec.notices))


@dataclass(frozen=True, slots=True)
class _Plan:
    ranks: int
    steps: int
    out: Path
    run_id: str
    seed: int
    step_s: float  # the replayed steps' period: the longest template step, a straggler's delay and jitter
    delays_s: tuple[float, float]  # the stragglers' (see STRAGGLER_DELAY_SHARES)
    form: str = "zmr"  # a FORMATS key


_TEMPLATE: _Template | None = None  # set in the parent before the workers fork
_FLEET_JITTER: tuple[float, ...] = ()  # each step's jitter, the same for every rank: made once, not per rank


def _shift(value: int | None, offset: int, cut: int, delay: int) -> int | None:
    """A time of the template step moved to the generated one: later by ``delay`` past ``cut``."""
    if value is None:
        return None
    return value + offset + (delay if value > cut else 0)


def _write_rank(rank: int, plan: _Plan) -> int:
    """Write one rank's file; its number of records."""
    assert _TEMPLATE is not None
    template, roles = _TEMPLATE, fleet_roles(plan.ranks)
    first_issues = [min((c.issue_ns for c in t.collectives), default=t.summary.start_ns) for t in template.steps]
    rng = random.Random(plan.seed * 1_000_003 + rank)
    period_ns = int(plan.step_s * 1e9)
    start0 = template.steps[0].summary.start_ns
    clock_ns = int(rng.uniform(-CLOCK_OFFSET_S, CLOCK_OFFSET_S) * 1e9)
    memory_offset = rng.randrange(MEMORY_SPREAD_BYTES)
    capacity = next((m.capacity for t in template.steps for m in t.memory if m.capacity), None) or 16 * 2**30
    base_level = template.steps[-1].summary.peak_memory or 0
    growth = (GROWING_RANK_END_SHARE * capacity - base_level) / max(1, plan.steps - 1) \
        if rank == roles.growing_memory else 0.0
    header = dict(template.header, world_size=plan.ranks, run_id=plan.run_id, host=f"node{rank // 8}",
                  pid=10_000 + rank)
    writer_type, suffix = FORMATS[plan.form]
    writer = writer_type(plan.out / rank_file_name(rank, suffix), rank, **header)
    writer.write(dataclasses.replace(template.run_info, rank=rank, local_rank=rank % 8, world_size=plan.ranks,
                                     host=f"node{rank // 8}", pid=10_000 + rank))
    for notice in template.notices:
        writer.write(dataclasses.replace(notice, rank=rank, t_ns=notice.t_ns + clock_ns))
    written = 1 + len(template.notices)
    end_prev = start0 + clock_ns
    window, stats_due = 0, end_prev + STATS_INTERVAL_NS
    for step in range(plan.steps):
        t = template.steps[step % len(template.steps)]
        s = t.summary
        step_start = start0 + step * period_ns + clock_ns
        offset = step_start - s.start_ns
        late = roles.stragglers[0] if step % 4 else roles.stragglers[1]
        delay = int(plan.delays_s[0 if step % 4 else 1] * 1e9)
        jitter = int((_FLEET_JITTER[step] + rng.uniform(0, RANK_JITTER_S)) * 1e9)
        first_issue = first_issues[step % len(template.steps)]
        cut = s.start_ns if rank == late else first_issue  # the straggler's forward, the peers' first wait
        end_ns = s.end_ns + offset + delay + jitter
        level_add = memory_offset + int(growth * step)
        phase_s = dict(s.phase_s)
        phase_s["forward"] = phase_s.get("forward", 0.0) + (delay / 1e9 if rank == late else 0.0)
        phase_s["other"] = phase_s.get("other", 0.0) + jitter / 1e9
        waited = 0.0 if rank == late else delay / 1e9
        # The agent's flush: what was buffered goes out as one segment when the step ends in a new window.
        if (end_ns - start0 - clock_ns) // FLUSH_INTERVAL_NS != window:
            writer.flush()
            window = (end_ns - start0 - clock_ns) // FLUSH_INTERVAL_NS
        if end_ns >= stats_due:
            writer.write(AgentStats(rank, end_ns, written, 0, 0, 0.01, 0, 0))
            written += 1
            stats_due += STATS_INTERVAL_NS
        if is_detail_step(step, plan.steps):
            for c in t.collectives:
                first = c.issue_ns == first_issue and rank != late
                writer.write(CollectiveEvent(
                    c.seq + step * 1000, rank, step, c.phase, c.op, c.api, c.bytes_in, c.bytes_out, c.dtype,
                    plan.ranks, c.async_op, _shift(c.issue_ns, offset, cut, delay) or 0,
                    _shift(c.complete_ns, offset, cut, delay), c.blocked_s + (waited if first else 0.0), c.timing,
                    c.meaning, _shift(c.wait_ns, offset, cut, delay), c.issue_s))
            for p in t.phases:
                writer.write(PhaseSpan(rank, step, p.phase, _shift(p.start_ns, offset, cut, delay) or 0,
                                       _shift(p.end_ns, offset, cut, delay) or 0, p.timing))
            for m in t.memory:
                writer.write(dataclasses.replace(
                    m, rank=rank, step=step, t_ns=_shift(m.t_ns, offset, cut, delay),
                    rss=None if m.rss is None else m.rss + level_add,
                    allocated=None if m.allocated is None else m.allocated + level_add))
            written += len(t.collectives) + len(t.phases) + len(t.memory)
        writer.write(StepSummary(
            rank, step, end_prev, end_ns, phase_s, s.collectives, s.comm_bytes, s.comm_bytes_by_op,
            s.comm_union_s + waited, None if s.blocked_s is None else s.blocked_s + waited,
            None if s.peak_memory is None else s.peak_memory + level_add,
            None if s.comp_s is None else s.comp_s + (delay / 1e9 if rank == late else 0.0) + jitter / 1e9,
            s.overlap_s, None if s.exposed_comm_s is None else s.exposed_comm_s + waited))
        written += 1
        end_prev = end_ns
    writer.write(AgentStats(rank, end_prev, written, 0, 0, 0.01, 0, 0))
    writer.close(RunEnd(rank=rank, t_ns=end_prev, how="exit", last_step=plan.steps - 1, records_lost=0,
                        bytes_lost=0))
    return written + 2


def straggler_delays(median_step_s: float, blocked_s: list[float]) -> tuple[float, float]:
    """The two stragglers' delays (STRAGGLER_DELAY_SHARES of the median step), the first at least the spread of
    the source's time blocked ``blocked_s``: a smaller delay can leave the first straggler's median blocked time
    where its peers' is (it did, once in CI: it came fourth, behind an ordinary rank; sim_straggler_delay.py)."""
    first = max(STRAGGLER_DELAY_SHARES[0] * median_step_s, max(blocked_s) - min(blocked_s) if blocked_s else 0.0)
    return first, first * STRAGGLER_DELAY_SHARES[1] / STRAGGLER_DELAY_SHARES[0]


def _write_rank_star(args: tuple[int, _Plan]) -> int:
    return _write_rank(*args)


def generate(source: Path, out: Path, ranks: int, steps: int, workers: int | None = None, seed: int = 0,
             form: str = "zmr") -> int:
    """Write ``ranks`` rank files of ``steps`` steps into ``out`` from ``source``'s rank 0, in ``form``
    (a FORMATS key); the records written."""
    global _TEMPLATE, _FLEET_JITTER
    _TEMPLATE = template = _template(source)
    _FLEET_JITTER = tuple(random.Random(seed * 7_919 + step).uniform(0, STEP_JITTER_S) for step in range(steps))
    durations = sorted(t.summary.end_ns - t.summary.start_ns for t in template.steps)
    delays = straggler_delays(durations[len(durations) // 2] / 1e9,
                              [t.summary.blocked_s for t in template.steps if t.summary.blocked_s is not None])
    plan = _Plan(ranks=ranks, steps=steps, out=out, run_id=uuid.uuid4().hex, seed=seed, delays_s=delays, form=form,
                 step_s=durations[-1] / 1e9 + max(delays) + STEP_JITTER_S + RANK_JITTER_S + 2 * CLOCK_OFFSET_S)
    out.mkdir(parents=True, exist_ok=True)
    workers = min(ranks, workers or len(os.sched_getaffinity(0)))
    jobs = [(rank, plan) for rank in range(ranks)]
    if workers <= 1:
        return sum(map(_write_rank_star, jobs))
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        return sum(pool.imap_unordered(_write_rank_star, jobs, chunksize=max(1, ranks // (8 * workers))))


def run_bytes(folder: Path) -> int:
    """The size of a run folder's rank files, of either form."""
    return sum(f.stat().st_size for suffix in (".zmr", ".jsonl") for f in folder.glob(f"rank-*{suffix}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder to write rank-<r>.zmr (or .jsonl) into")
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--source", type=Path, help="a 2-rank run folder to replicate (default: record one)")
    parser.add_argument("--workers", type=int)
    parser.add_argument("--format", choices=sorted(FORMATS), default="zmr",
                        help="zmr: the compact form the agent writes by default (format 2.x); jsonl: format 1.x")
    args = parser.parse_args()
    source = args.source or record_source(args.out.with_name(args.out.name + "-source"))
    started = time.perf_counter()
    records = generate(source, args.out, args.ranks, args.steps, args.workers, form=args.format)
    size = run_bytes(args.out)
    print(f"{args.out}: {args.ranks} ranks x {args.steps} steps, {records:,} records, {size / 2**20:,.0f} MB "
          f"in {time.perf_counter() - started:.1f} s; roles {fleet_roles(args.ranks)}")


if __name__ == "__main__":
    main()
