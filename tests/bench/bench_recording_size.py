"""Bytes per collective on disk, and the writer's CPU per record: format 1.3 JSON lines vs the compact 2.x.

    python tests/bench/bench_recording_size.py [--steps 12] [--rounds 5] [--json out.json]

Real recordings of examples/fsdp2_train.py, 2 ranks on gloo, written by the agent itself in each form
(ZEROMON_FORMAT=jsonl, then compact): the 80-layer shape of a 70B-class job (80 blocks: 240 collectives
per step per rank) and the example's default. "All records counted": the file's size (header, phases,
memory samples, steps, notices, the end record) over its collectives.

Then the JSON-lines recording of the 80-layer run is written again, record by record, in the layouts
that were weighed (segments cut where the agent would flush: every ``FLUSH_S`` of the records' own times,
the agent's default flush interval):
zlib'd JSON rows, and the columns at zlib levels 1, 6 and 9; with the writer's CPU per record (the
agent's recorder thread, not training's), as the median of ``--rounds`` interleaved rounds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib

sys.path[:0] = [str(benchlib.REPO_ROOT), str(benchlib.REPO_ROOT / "agents")]

from zeromon.model.codec import RecordingWriter, encode_record, iter_records  # noqa: E402
from zeromon.model.events import CollectiveEvent, Record  # noqa: E402
from zeromon.model.segments import FRAME, CompactWriter  # noqa: E402
from zeromon_agent.context.config import AgentConfig  # noqa: E402

TARGET_BYTES = 50.0  # the issue: "at most 50 bytes per collective including everything"
FLUSH_S = AgentConfig().flush_interval_s  # the agent's default flush interval (ZEROMON_FLUSH_INTERVAL): a segment each
SHAPES = {"80 layers (240 collectives/step)": ("--layers", "80", "--hidden", "32", "--heads", "2", "--seq", "16",
                                                "--batch", "2"),
          "the example's default": ()}


def record(out: Path, form: str, steps: int, shape: tuple[str, ...]) -> Path:
    """A real 2-rank run under `zeromon run`, its rank 0's file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}
    env.update(OMP_NUM_THREADS="1", ZEROMON_PORT="0", ZEROMON_ENDPOINT="0", ZEROMON_FORMAT=form,
               PYTHONPATH=os.pathsep.join([str(benchlib.REPO_ROOT), str(benchlib.REPO_ROOT / "agents")]))
    command = [sys.executable, "-m", "zeromon", "run", "--quiet", "--out", str(out), "--", sys.executable, "-m",
               "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(benchlib.free_port()),
               str(benchlib.REPO_ROOT / "examples" / "fsdp2_train.py"), "--steps", str(steps), *shape]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=benchlib.REPO_ROOT)
    return out / ("rank-0.zmr" if form == "compact" else "rank-0.jsonl")


def collectives(path: Path) -> int:
    return sum(isinstance(r, CollectiveEvent) for r in iter_records(path))


def _time_of(record: Record) -> int | None:
    for name in ("issue_ns", "t_ns", "start_ns"):
        value = getattr(record, name, None)
        if type(value) is int:
            return value
    return None


def flush_groups(records: list[Record]) -> list[list[Record]]:
    """The records as the agent would flush them: a group per FLUSH_S of their own times."""
    groups: list[list[Record]] = [[]]
    start: int | None = None
    for rec in records:
        t = _time_of(rec)
        if t is not None and start is not None and t > start + FLUSH_S * 1e9 and groups[-1]:
            groups.append([])
            start = t
        start = t if start is None else start
        groups[-1].append(rec)
    return groups


def write_all(make: Callable[[Path], RecordingWriter], groups: list[list[Record]], path: Path) -> float:
    """CPU seconds to write every group and flush after each, as the recorder thread does."""
    cpu0 = time.process_time()
    writer = make(path)
    for group in groups:
        for rec in group:
            writer.write(rec)
        writer.flush()
    writer.close()
    return time.process_time() - cpu0


def row_layout_bytes(groups: list[list[Record]], level: int) -> int:
    """The layout not chosen: each flush's JSON lines, zlib'd, in the same frame."""
    return sum(FRAME.size + len(zlib.compress("\n".join(map(encode_record, g)).encode(), level)) for g in groups)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows: list[benchlib.Row] = []
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-size-") as tmp:
        base = Path(tmp)
        jsonl_80 = None
        for label, shape in SHAPES.items():
            key = "l80" if shape else "default"
            files = {form: record(base / f"{key}-{form}", form, args.steps, shape) for form in ("jsonl", "compact")}
            per = {form: path.stat().st_size / collectives(path) for form, path in files.items()}
            n = collectives(files["compact"])
            # The target is the job: ~240 collectives a step. The example's default issues 11 a step
            # with ~10 phase spans (16 before zeromon's own time at a boundary became one span) and a few
            # memory samples, and a file of 12 steps spreads its header over ~130 collectives: its bytes per
            # collective are mostly not the collectives'. Said, not targeted.
            targeted = bool(shape)
            rows.append(benchlib.Row("recording size", f"{label}: bytes per collective, all records counted",
                                     "bytes", per["jsonl"], per["compact"],
                                     f"compact <= {TARGET_BYTES:g} bytes" if targeted else "-",
                                     per["compact"] <= TARGET_BYTES if targeted else None,
                                     f"written by the agent, rank 0 of 2, {args.steps} steps, {n:,} collectives; "
                                     f"baseline: format 1.3 JSON lines"
                                     + ("" if targeted else "; 0.9 phase spans a collective, the header over few")))
            extra[key] = {"jsonl_bytes_per_collective": per["jsonl"], "compact_bytes_per_collective": per["compact"]}
            if shape:
                jsonl_80 = files["jsonl"]
        assert jsonl_80 is not None
        records = list(iter_records(jsonl_80))
        groups = flush_groups(records)
        n = sum(isinstance(r, CollectiveEvent) for r in records)
        note = (f"the 80-layer JSON-lines recording written again: {len(records):,} records, {n:,} collectives, "
                f"{len(groups)} segments (one per {FLUSH_S:g} s of record time)")
        for level in (1, 6, 9):
            rows.append(benchlib.Row("recording size", f"layout: JSON rows, zlib {level}: bytes per collective",
                                     "bytes", None, row_layout_bytes(groups, level) / n, "-", None, note))
        writers: dict[str, Callable[[Path], RecordingWriter]] = {
            "jsonl": lambda p: RecordingWriter(p, 0),
            **{f"columns, zlib {level}": (lambda p, level=level: CompactWriter(p, 0, level=level)) for level in (1, 6, 9)},
        }
        cpu: dict[str, list[float]] = {name: [] for name in writers}
        sizes: dict[str, int] = {}
        for round_ in range(args.rounds):
            order = list(writers)[round_ % len(writers):] + list(writers)[:round_ % len(writers)]
            for name in order:
                path = base / f"rewrite-{name.replace(' ', '').replace(',', '-')}"
                cpu[name].append(write_all(writers[name], groups, path) / len(records) * 1e9)
                sizes[name] = path.stat().st_size
        for name in writers:
            if name != "jsonl":
                rows.append(benchlib.Row("recording size", f"layout: {name}: bytes per collective", "bytes",
                                         sizes["jsonl"] / n, sizes[name] / n, "-", None, note))
        for name in writers:
            if name != "jsonl":
                rows.append(benchlib.Row("recording size", f"writer CPU per record, {name} vs JSON lines", "ns",
                                         benchlib.median(cpu["jsonl"]), benchlib.median(cpu[name]), "-", None,
                                         f"median of {args.rounds} interleaved rounds; write + flush per segment, on "
                                         f"the recorder thread; {benchlib.load_note()}"))
        extra["cpu_ns_per_record"] = {name: benchlib.median(v) for name, v in cpu.items()}
    benchlib.print_rows("recording size: format 1.3 JSON lines vs compact 2.x", rows)
    benchlib.write_rows(args.json, rows, {"machine": benchlib.machine(), **extra})
    return 0


if __name__ == "__main__":
    sys.exit(main())
