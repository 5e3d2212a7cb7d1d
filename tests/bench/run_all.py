"""Run every benchmark (each in its own process, ``--repeat`` times) and rewrite tests/bench/RESULTS.md.

    python tests/bench/run_all.py [--repeat 2] [--output tests/bench/RESULTS.md]

Each script prints its own side-by-side table as it goes and hands its rows over as JSON; this
script only runs them and writes the markdown. Running every benchmark more than once shows how
far the numbers move between runs on this shared machine: a target counts as met only when it is
met in every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import benchlib


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    script: str
    args: tuple[str, ...]
    what: str  # one line for RESULTS.md: what this run exercises

    @property
    def command(self) -> str:
        return " ".join(["python", f"tests/bench/{self.script}", *self.args])


JOBS: tuple[Job, ...] = (
    Job("bench_collective_overhead.py", (),
        "added cost per collective call: no-op vs wrapped no-op, and gloo all_reduce original vs patched"),
    Job("bench_fsdp2_overhead.py", (),
        "2-rank FSDP2 TinyGPT, agent attached and switched on/off every step"),
    Job("bench_recorder_cpu.py", (),
        "2-rank FSDP2 example (default and 80 blocks) under `zeromon run`: the agent's background CPU per "
        "recorded collective, and the process's CPU per collective with the agent off vs on"),
    Job("bench_agent_cost.py", (),
        "2-rank FSDP2 example under `zeromon run`, 400 steps: the agent's CPU per recorded collective by part of its "
        "work, timed in the run, without each part, and what a pass costs (its runs at a 2 s and a 15 s flush)"),
    Job("bench_training_gc.py", (),
        "2-rank FSDP2 example, 600 steps, with the agent and without: Python's garbage collector on each thread, the "
        "training thread's collections that the agent's allocations bring on and the objects each walks"),
    Job("bench_whole_run.py", (),
        "a whole 200-step 2-rank FSDP2 run under `zeromon run` against plain torchrun: wall, CPU, its own start and end"),
    Job("bench_recorder_instructions.py", ("--functions", "25", "--bytecodes", "25"),
        "the recorder's passes of 400 steady FSDP2 steps replayed under valgrind's callgrind: instructions and "
        "Python bytecodes a collective, counted (no machine's noise), and where they go"),
    Job("bench_agent_start.py", (),
        "the agent's start in a fresh rank (world-1 gloo, attach() after torch's import) and `zeromon run -- true`: "
        "CPU of the import, the start, the classes made"),
    Job("bench_gpu_drain.py", (),
        "the recorder's drain per collective of a GPU run's paths (stand-in CUDA tensor and events, a real compact "
        "recording), and the whole agent on a host-bound loop, where the recorder thread's GIL time is the training's"),
    Job("bench_agent_memory.py", (),
        "1M gloo all_reduce recorded, 100 per step: the recorder keeps up"),
    Job("bench_agent_memory.py", ("--driver", "noop"),
        "1M wrapped no-op calls, 100 per step: far faster than the recorder, the buffer overflows"),
    Job("bench_agent_memory.py", ("--scenario", "open-step"),
        "1M gloo all_reduce inside one step that never ends (eval loop, non-torch optimizer)"),
    Job("bench_analysis.py", (),
        "zeromon report's analysis of a 2-rank recording with 1M collectives and 10k memory samples"),
    Job("bench_recording_size.py", (),
        "bytes per collective (format 1.x JSON lines vs compact 2.x) of real 2-rank FSDP2 recordings; writer CPU"),
    Job("bench_fleet_report.py", (),
        "zeromon report and zeromon summary over a generated run of 64, 256 and 1,024 ranks x 10,000 steps (summaries, "
        "and the detail of 70 steps a rank) in the agent's compact form (format 2.x), and of 1,024 ranks as JSON "
        "lines (1.x)"),
    Job("bench_parquet_export.py", (),
        "zeromon export --format parquet of a generated run of 1,024 ranks x 10,000 steps (compact form): time, peak "
        "RSS and size; docs/parquet.md's per-rank query over the export in DuckDB"),
    Job("bench_dashboard_load.py", (),
        "zeromon dashboard opening a generated run of 256 ranks x 10,000 steps, as a recording and as a replay: "
        "time until its page answers, peak RSS and RSS once open"),
    Job("bench_trace_import.py", (),
        "streamed Kineto trace import and HTA-exact overlap, against HolisticTraceAnalysis, up to 100 MB"),
    Job("bench_live_source.py", (), "the live source polling 64 simulated agents at 1 Hz: the client's own CPU"),
    Job("bench_prometheus_fleet.py", (),
        "one poll of a 1,024-rank job through a real Prometheus, with and without the recording rules"),
    Job("bench_scrape.py", (), "one rank's /metrics scraped 1000 times while a 2-rank FSDP2 run trains"),
    Job("bench_hang.py", (),
        "real 2-rank FSDP2 runs left hanging (a rank stuck outside any collective): time from the hang to the verdict "
        "of `zeromon live`; the cost of a progress report and of a recorder pass's look for progress"),
    Job("bench_tui.py", (), "zeromon attach headless at 200x60 replaying 256 synthesized ZeRO-3 ranks: refresh time, RSS"),
    Job("bench_dashboard.py", (),
        "zeromon dashboard in headless Chromium: 256 synthesized ZeRO-3 ranks, and 8 ranks x 10,000 steps; "
        "a live refresh on the server; the server's RSS"),
)


def run_job(job: Job, json_path: Path) -> tuple[list[benchlib.Row], float, int]:
    """Run one script, its output going straight to ours; its rows, wall seconds and exit code."""
    print(f"\n### {job.command}", flush=True)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(benchlib.BENCH_DIR / job.script), *job.args,
                           "--json", str(json_path)], cwd=benchlib.REPO_ROOT, check=False)
    wall_s = time.perf_counter() - started
    rows = benchlib.read_rows(json_path)[0] if proc.returncode == 0 and json_path.exists() else []
    return rows, wall_s, proc.returncode


def cell_met(met: bool | None) -> str:
    return "" if met is None else ("yes" if met else "**no**")


def render(machine: dict[str, object], load_after: float, repeat: int,
           results: Sequence[tuple[Job, int, list[benchlib.Row], float, int]]) -> str:
    lines = [
        "# zeromon agent benchmarks",
        "",
        "Generated by `python tests/bench/run_all.py"
        + (f" --repeat {repeat}`" if repeat != 2 else "`") + "; do not edit by hand.",
        "",
        f"- date: {machine['date']}",
        f"- machine: {machine['nproc']} CPUs (nproc), {machine['cpu_model']}, no GPU",
        f"- python {machine['python']}, torch {machine['torch']}",
        f"- load average (1 min): {machine['loadavg_1min']:.2f} at the start, {load_after:.2f} at the end "
        "(the machine is shared; other processes' load moves wall-clock numbers)",
        f"- every benchmark ran {repeat} time(s); a target is met only if it is met in every run",
        "",
        "All times are medians over interleaved batches or steps unless a row says otherwise; "
        "*added* is with agent minus without, *ratio* with agent / without.",
        "",
        "## Targets",
        "",
        "| Benchmark | Measure | Target | Runs met | Met |",
        "|---|---|---|---|---|",
    ]
    targeted: dict[tuple[str, str, str], list[bool]] = {}
    for _job, _run, rows, _wall, _rc in results:
        for r in rows:
            if r.met is not None:
                targeted.setdefault((r.benchmark, r.measure, r.target), []).append(r.met)
    for (bench, measure, target), mets in targeted.items():
        lines.append(f"| {bench} | {measure} | {target} | {sum(mets)}/{len(mets)} | {cell_met(all(mets))} |")

    for job in dict.fromkeys(j for j, *_ in results):
        lines += ["", f"## `{job.command}`", "", job.what, ""]
        runs = [(run, rows, wall, rc) for j, run, rows, wall, rc in results if j == job]
        failed = [f"run {run} exited with {rc}" for run, _rows, _wall, rc in runs if rc != 0]
        if failed:
            lines += ["Failed: " + "; ".join(failed), ""]
        lines += ["| Measure | Run | Unit | Without agent | With agent | Added | Ratio | Target | Met |",
                  "|---|---|---|---|---|---|---|---|---|"]
        # Each script's own row order, then the runs of a measure next to each other.
        order: dict[tuple[str, str], int] = {}
        for _run, rows, _w, _rc in runs:
            for r in rows:
                order.setdefault((r.benchmark, r.measure), len(order))
        ordered = sorted(((r, run) for run, rows, _w, _rc in runs for r in rows),
                         key=lambda item: (order[(item[0].benchmark, item[0].measure)], item[1]))
        for r, run in ordered:
            lines.append(
                f"| {r.benchmark}: {r.measure} | {run} | {r.unit} | {benchlib.fmt(r.baseline, r.unit)} | "
                f"{benchlib.fmt(r.agent, r.unit)} | {benchlib.fmt(r.added, r.unit)} | "
                f"{benchlib.fmt_ratio(r.ratio)} | {r.target} | {cell_met(r.met)} |")
        lines += notes_lines(ordered, len(runs))
        lines += ["", "Wall time: " + ", ".join(f"run {run} {wall:.0f} s" for run, _r, wall, _rc in runs)]
    return "\n".join(lines) + "\n"


def notes_lines(ordered: Sequence[tuple[benchlib.Row, int]], runs: int) -> list[str]:
    """The rows' notes under the table: once where every run has the same, else one per run."""
    by_measure: dict[str, list[tuple[int, str]]] = {}
    for r, run in ordered:
        if r.note:
            by_measure.setdefault(f"{r.benchmark}: {r.measure}", []).append((run, r.note))
    lines: list[str] = []
    for measure, notes in by_measure.items():
        texts = {note for _run, note in notes}
        if len(texts) == 1 and len(notes) == runs:
            lines.append(f"- {measure}: {notes[0][1]}")
        else:
            lines += [f"- {measure}, run {run}: {note}" for run, note in notes]
    return [""] + lines if lines else []


def _sections(text: str) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(the lines before the targets table's rows, its rows, the sections after it by heading, in order). A
    "## `command`" section is a benchmark's, which a new measurement replaces; any other "## " section is
    written by hand (a before-and-after, a study) and stays as it is."""
    lines = text.rstrip("\n").split("\n")
    first = lines.index("## Targets") + 4  # the heading, a blank line, the table's header and rule
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("|"))
    sections: dict[str, list[str]] = {}
    heading = None
    for line in lines[end:]:
        if line.startswith("## "):
            heading = line
            sections[heading] = []
        elif heading is not None:
            sections[heading].append(line)
    return lines[:first], lines[first:end], sections


def splice(old: str, new: str, machine: dict[str, object]) -> str:
    """``old`` with the benchmarks measured in ``new`` put in place of theirs (their target rows and
    sections), each section saying when it was measured again."""
    head, rows, sections = _sections(old)
    _, new_rows, new_sections = _sections(new)
    measured = {row.split("|")[1] for row in new_rows}
    rows = [row for row in rows if row.split("|")[1] not in measured]
    load = f"load average {machine['loadavg_1min']:.2f} at its start"
    for heading, body in new_sections.items():
        note = ["", f"Measured again on its own on {machine['date']} ({load}), after the rest of this file."]
        sections[heading] = note + body
    out = head + rows + new_rows
    for heading, body in sections.items():
        out += ["", heading] + body if out[-1] != "" else [heading] + body
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs of every benchmark (default 2)")
    parser.add_argument("--output", default=str(benchlib.BENCH_DIR / "RESULTS.md"))
    parser.add_argument("--only", action="append", metavar="SCRIPT",
                        help="run only this script's jobs (repeatable) and replace their sections and target rows "
                             "in --output, keeping the rest as measured before")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    jobs = [j for j in JOBS if not args.only or j.script in args.only]
    if not jobs:
        parser.error(f"--only: no such benchmark; one of {', '.join(sorted({j.script for j in JOBS}))}")

    machine = benchlib.machine()
    results: list[tuple[Job, int, list[benchlib.Row], float, int]] = []
    with tempfile.TemporaryDirectory(prefix="zeromon-bench-all-") as tmp:
        # Runs outermost: run 2 of a benchmark comes minutes after run 1, under whatever load then is.
        for run in range(1, args.repeat + 1):
            for i, job in enumerate(jobs):
                rows, wall_s, rc = run_job(job, Path(tmp) / f"{i}-{run}.json")
                results.append((job, run, rows, wall_s, rc))
    text = render(machine, os.getloadavg()[0], args.repeat, results)
    if args.only:
        text = splice(Path(args.output).read_text(), text, machine)
    Path(args.output).write_text(text)
    print(f"\nwrote {args.output}")
    return 0 if all(rc == 0 for *_, rc in results) else 1


if __name__ == "__main__":
    sys.exit(main())
