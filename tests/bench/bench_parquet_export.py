"""`zeromon export --format parquet` at fleet scale: 64 and 1,024 ranks x 10,000 steps of a generated run (the
export's memory should not grow with the ranks), and a query of docs/parquet.md over the export in DuckDB.

The run is made by gen_fleet_run.py from a real 2-rank FSDP2 recording (recorded here, ~25 s, or given with
--source), in the agent's compact form, in a folder under /tmp removed at the end. The export runs ``--repeat``
times as a user runs it (`python -m zeromon export RUN --format parquet --out DIR`, its workers one per CPU):
wall time from start to exit, and peak RSS as the largest sum of the RSS of the process and its workers, sampled
every 50 ms from outside (benchlib.run_watched); the export's size on disk beside the recording's. Then the
doc's per-rank query (median step time and exposed communication per rank, over every step of every rank) runs
``--repeat`` times in a fresh `python` each, timed and watched the same way: the query's text is read from
docs/parquet.md, as the tests run it.

    python tests/bench/bench_parquet_export.py [--sizes 64,1024] [--steps 10000] [--repeat 3] [--source RUN_DIR]
                                               [--json out.json]
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import benchlib
import gen_fleet_run

LIMIT_S = 600.0
LIMIT_RSS_MB = 8192.0
DOC = benchlib.REPO_ROOT / "docs" / "parquet.md"
QUERY_HEAD = "-- per rank: ranks[].median_step_s"  # the first line of the doc's query this measures


def doc_query() -> tuple[str, str]:
    """(the doc's views, its per-rank query), as docs/parquet.md writes them."""
    blocks = re.findall(r"^```sql\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    return blocks[0], next(block for block in blocks if block.startswith(QUERY_HEAD))


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _watched(command: list[str], what: str) -> benchlib.TreeRun:
    run = benchlib.run_watched(command, LIMIT_S, LIMIT_RSS_MB)
    state = f"stopped at the {run.stopped} limit" if run.stopped else f"exit {run.returncode}"
    print(f"  {what}: {run.wall_s:.1f} s, peak RSS {run.peak_rss_mb:,.0f} MB ({state})", flush=True)
    if run.stopped or run.returncode != 0:
        print(run.stderr[-3000:])
    return run


def measure(source: Path, work: Path, ranks: int, steps: int, repeat: int) -> list[benchlib.Row]:
    """The export of a generated run of ``ranks`` x ``steps``, ``repeat`` times, then the doc's query over it."""
    views, query = doc_query()
    what = f"{ranks:,} ranks x {steps:,} steps"
    run = work / f"run-{ranks}"
    started = time.perf_counter()
    records = gen_fleet_run.generate(source, run, ranks, steps)
    recording_mb = gen_fleet_run.run_bytes(run) / benchlib.MB
    print(f"{what}: {records:,} records, {recording_mb:,.0f} MB of recording written in "
          f"{time.perf_counter() - started:.1f} s ({benchlib.load_note()})", flush=True)
    exports, export_mb, files = [], 0.0, 0
    out = work / f"export-{ranks}"
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        exports.append(_watched([sys.executable, "-m", "zeromon", "export", str(run), "--format", "parquet",
                                 "--out", str(out)], "export"))
        export_mb = folder_bytes(out) / benchlib.MB
        files = sum(1 for _ in out.rglob("*.parquet"))
    script = (f"import duckdb; con = duckdb.connect(); con.execute(\"SET file_search_path = '{out}'\"); "
              f"con.execute({views!r}); print(len(con.execute({query!r}).fetchall()))")
    queries = [_watched([sys.executable, "-c", script], "the doc's per-rank query") for _ in range(repeat)]
    assert all(q.stdout.strip() == str(ranks) for q in queries if q.returncode == 0), queries[-1].stdout
    shutil.rmtree(run)
    shutil.rmtree(out)
    note = (f"median of {len(exports)} runs; {records:,} records, {recording_mb:,.0f} MB of recording (compact); "
            f"{benchlib.load_note()}")
    group = "parquet export (zeromon export --format parquet)"
    return [
        benchlib.Row(group, f"{what}: wall time", "s", None, benchlib.median([r.wall_s for r in exports]), "",
                     None, note),
        benchlib.Row(group, f"{what}: peak RSS, all processes", "MB", None,
                     benchlib.median([r.peak_rss_mb for r in exports]), "", None, note),
        benchlib.Row(group, f"{what}: size on disk", "MB", None, export_mb, "", None,
                     f"{files:,} files; the recording: {recording_mb:,.0f} MB"),
        benchlib.Row("parquet query (DuckDB)", f"{what}: docs/parquet.md's per-rank medians, a fresh process",
                     "s", None, benchlib.median([q.wall_s for q in queries]), "", None,
                     f"median of {len(queries)} runs, Python's and DuckDB's start included; {benchlib.load_note()}"),
        benchlib.Row("parquet query (DuckDB)", f"{what}: its peak RSS", "MB", None,
                     benchlib.median([q.peak_rss_mb for q in queries]), "", None, ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,1024", help="rank counts, comma-separated")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--source", type=Path, help="a 2-rank run folder (default: record one)")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zeromon-parquet-", dir="/tmp"))
    rows: list[benchlib.Row] = []
    try:
        source = args.source or gen_fleet_run.record_source(work / "source")
        for ranks in (int(n) for n in args.sizes.split(",")):
            rows += measure(source, work, ranks, args.steps, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    benchlib.print_rows("zeromon export --format parquet at fleet scale", rows)
    benchlib.write_rows(args.json, rows)


if __name__ == "__main__":
    main()
