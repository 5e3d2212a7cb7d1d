"""Import speed and peak memory of PyTorch profiler (Kineto) traces: zeromon's streamed reader vs HTA.

    python tests/bench/bench_trace_import.py [--mb 100] [--repeat 3] [--no-hta] [--json out.json]

Inputs: the real traces of ../shared/traces, and a synthetic ~100 MB trace (``.json`` and
``.json.gz``) made by replicating every event of the real a100 trace with shifted timestamps,
correlation ids and ProfilerStep numbers, so it has the real mix of CPU ops, launches and kernels.

Each measurement runs in a fresh interpreter so that its peak RSS (VmHWM) is its own:

- ``zeromon``: ``zeromon.sources.kineto.read_trace`` (the import) then ``trace_report_from`` (the
  analysis), timed separately;
- ``json``: ``json.load`` of the whole document, what a reader that is not streamed starts with;
- ``hta``: ``TraceAnalysis(trace_dir=...)`` (the import, into pandas) then ``get_comm_comp_overlap``
  and ``get_temporal_breakdown``, when HolisticTraceAnalysis is installed.

Peak RSS is reported as the whole process's and as the part above the interpreter with the
libraries imported (what the import itself costs). Times are medians over ``--repeat`` runs,
interleaved so that load from other processes on this shared machine spreads over all of them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

TRACES = benchlib.REPO_ROOT.parent / "shared" / "traces"
SEED_TRACE = "a100-w2-rank0.json.gz"
TARGET_S = 5.0  # the issue: "a 100 MB trace in seconds"
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


# --- the synthetic trace ---------------------------------------------------------------------------

def make_synthetic(seed: Path, out: Path, target_mb: float) -> int:
    """Write ``out`` (.json), about ``target_mb`` MB: copies of every event of ``seed``, shifted."""
    with gzip.open(seed, "rt") as f:
        trace = json.load(f)
    events = [e for e in trace.pop("traceEvents") if e.get("cat") != "Trace"]
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e["dur"] for e in events if isinstance(e.get("dur"), (int, float))]
    span = math.ceil(max(ends) - min(starts)) + 1000
    steps = sorted(int(m.group(1)) for e in events if (m := _STEP_RE.match(str(e.get("name")))))
    step_stride = steps[-1] - steps[0] + 1
    corr_stride = 1 + max(max(e.get("args", {}).get("correlation", 0), e.get("args", {}).get("External id", 0),
                              e.get("id", 0) if isinstance(e.get("id"), int) else 0) for e in events)
    one_copy = sum(len(json.dumps(e)) + 2 for e in events)
    copies = max(1, round(target_mb * 1e6 / one_copy))
    with open(out, "w") as f:
        header = json.dumps(trace)[:-1]  # the metadata object, left open
        f.write(header + ', "traceEvents": [\n')
        first = True
        for k in range(copies):
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                if isinstance(e2.get("id"), int):
                    e2["id"] = e2["id"] + k * corr_stride
                m = _STEP_RE.match(str(e2.get("name")))
                if m:
                    e2["name"] = f"ProfilerStep#{int(m.group(1)) + k * step_stride}"
                if isinstance(e2.get("args"), dict):
                    args = dict(e2["args"])
                    for key in ("correlation", "External id"):
                        if isinstance(args.get(key), int) and args[key] >= 0:
                            args[key] += k * corr_stride
                    e2["args"] = args
                f.write(("" if first else ",\n") + json.dumps(e2))
                first = False
        f.write("\n]}\n")
    return copies


# --- one measurement, in a child process ----------------------------------------------------------

def child(kind: str, path: str) -> dict[str, Any]:
    if kind == "zeromon":
        import ijson  # noqa: F401  (imported before the baseline RSS, as the others' libraries are)

        from zeromon.analysis.trace_overlap import trace_report_from
        from zeromon.sources.kineto import read_trace
        rss0 = benchlib.rss_bytes()
        t0 = time.perf_counter()
        trace = read_trace(path)
        t1 = time.perf_counter()
        report = trace_report_from([trace])
        t2 = time.perf_counter()
        rank = report["ranks"][0]
        return {"import_s": t1 - t0, "analyse_s": t2 - t1, "rss0": rss0, "peak": benchlib.peak_rss_bytes(),
                "overlap_pct": rank["comm_comp_overlap_pct"],
                "kernel_time_us": rank["temporal_breakdown"]["kernel_time_s"] * 1e6,
                "stream_events": len(trace.stream_events), "events": trace.event_count}
    if kind == "json":
        rss0 = benchlib.rss_bytes()
        t0 = time.perf_counter()
        opener: Any = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            doc = json.load(f)
        t1 = time.perf_counter()
        return {"import_s": t1 - t0, "analyse_s": 0.0, "rss0": rss0, "peak": benchlib.peak_rss_bytes(),
                "events": len(doc["traceEvents"])}
    if kind == "hta":
        import logging

        from hta.trace_analysis import TraceAnalysis

        logging.disable(logging.WARNING)
        folder = tempfile.mkdtemp(prefix="hta-bench-")
        try:
            os.symlink(os.path.abspath(path), os.path.join(folder, os.path.basename(path)))
            rss0 = benchlib.rss_bytes()
            t0 = time.perf_counter()
            ta = TraceAnalysis(trace_dir=folder)
            t1 = time.perf_counter()
            overlap = ta.get_comm_comp_overlap(visualize=False)
            breakdown = ta.get_temporal_breakdown(visualize=False)
            t2 = time.perf_counter()
        finally:
            shutil.rmtree(folder)
        return {"import_s": t1 - t0, "analyse_s": t2 - t1, "rss0": rss0, "peak": benchlib.peak_rss_bytes(),
                "overlap_pct": float(overlap["comp_comm_overlap_pctg"].iloc[0]),
                "kernel_time_us": float(breakdown["kernel_time(us)"].iloc[0])}
    raise ValueError(kind)


def measure(kind: str, path: Path, timeout: float = 600) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if out.returncode != 0:
        raise RuntimeError(f"{kind} on {path} failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# --- main -------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the synthetic trace (uncompressed MB)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    parser.add_argument("--json", metavar="PATH", help="write benchlib rows for run_all.py")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    try:
        import hta  # noqa: F401
        kinds = ["zeromon", "json"] + ([] if args.no_hta else ["hta"])
    except ImportError:
        kinds = ["zeromon", "json"]
    work = Path(tempfile.mkdtemp(prefix="zeromon-trace-bench-"))
    try:
        synthetic = work / "synthetic-rank0.json"
        t0 = time.perf_counter()
        copies = make_synthetic(TRACES / SEED_TRACE, synthetic, args.mb)
        packed = work / "synthetic-rank0.json.gz"
        with open(synthetic, "rb") as src, gzip.open(packed, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        print(f"synthetic trace: {copies} copies of {SEED_TRACE}, {synthetic.stat().st_size / 1e6:.1f} MB "
              f"({packed.stat().st_size / 1e6:.1f} MB gzipped), made in {time.perf_counter() - t0:.1f} s; "
              f"{benchlib.load_note()}")
        real = [TRACES / name for name in sorted(os.listdir(TRACES)) if name.endswith(".gz")]
        inputs = [*real, synthetic, packed]
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for _ in range(args.repeat):
            for path in inputs:
                for kind in kinds:
                    results.setdefault((path.name, kind), []).append(measure(kind, path))
        rows = report(inputs, kinds, results)
        benchlib.write_rows(args.json, rows, {"machine": benchlib.machine(), "synthetic_copies": copies})
    finally:
        shutil.rmtree(work)
    return 0


def uncompressed_bytes(path: Path) -> int:
    if not path.name.endswith(".gz"):
        return path.stat().st_size
    with gzip.open(path) as f:
        return f.seek(0, os.SEEK_END)


def report(inputs: list[Path], kinds: list[str],
           results: dict[tuple[str, str], list[dict[str, Any]]]) -> list[benchlib.Row]:
    med = statistics.median
    print(f"\n{'trace':<30} {'MB':>6} {'reader':<8} {'import s':>9} {'analyse s':>10} {'peak RSS MB':>12} "
          f"{'import adds MB':>15}  result")
    rows: list[benchlib.Row] = []
    for path in inputs:
        mb = uncompressed_bytes(path) / 1e6
        for kind in kinds:
            runs = results[(path.name, kind)]
            imp, ana = med(r["import_s"] for r in runs), med(r["analyse_s"] for r in runs)
            peak = med(r["peak"] for r in runs) / benchlib.MB
            added = med(r["peak"] - r["rss0"] for r in runs) / benchlib.MB
            what = (f"overlap {runs[0]['overlap_pct']}%, kernel time {runs[0]['kernel_time_us']:.0f} us"
                    if "overlap_pct" in runs[0] else f"{runs[0]['events']} events")
            print(f"{path.name:<30} {mb:>6.1f} {kind:<8} {imp:>9.2f} {ana:>10.2f} {peak:>12.0f} "
                  f"{added:>15.0f}  {what}")
        if "hta" in kinds:
            ours, theirs = results[(path.name, "zeromon")][0], results[(path.name, "hta")][0]
            assert ours["overlap_pct"] == theirs["overlap_pct"], (path, ours, theirs)
            assert abs(ours["kernel_time_us"] - theirs["kernel_time_us"]) < 1, (path, ours, theirs)
        hta = results.get((path.name, "hta"))
        ours_total = med(r["import_s"] + r["analyse_s"] for r in results[(path.name, "zeromon")])
        big = path.name.startswith("synthetic")
        rows.append(benchlib.Row(
            benchmark="trace import (Kineto)", measure=f"{path.name} ({mb:.0f} MB): import + analysis",
            unit="s", baseline=med(r["import_s"] + r["analyse_s"] for r in hta) if hta else None,
            agent=ours_total, target=f"zeromon <= {TARGET_S:.0f} s" if big else "",
            met=(ours_total <= TARGET_S) if big else None,
            note="baseline: HolisticTraceAnalysis; agent: zeromon"))
        rows.append(benchlib.Row(
            benchmark="trace import (Kineto)", measure=f"{path.name}: peak RSS above the interpreter",
            unit="MB", baseline=med(r["peak"] - r["rss0"] for r in hta) / benchlib.MB if hta else None,
            agent=med(r["peak"] - r["rss0"] for r in results[(path.name, "zeromon")]) / benchlib.MB,
            target="", met=None, note="baseline: HolisticTraceAnalysis; agent: zeromon"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
