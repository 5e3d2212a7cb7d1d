"""The whole offline analysis of a recorded run, as one value: what `zeromon report` prints."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import field
from typing import Any

import numpy as np

from zeromon.analysis.bandwidth import (
    BandwidthRow,
    SampleGroups,
    bandwidth_samples,
    busbw_by_op_of_samples,
    merge_samples,
    table_of_samples,
)
from zeromon.analysis.comm_advice import overlap_findings_of_medians, with_waiting_for_peers
from zeromon.analysis.finding_groups import group_findings
from zeromon.analysis.findings import Finding
from zeromon.analysis.oom import OomForecast, forecast
from zeromon.analysis.recording_summary import strategy_label
from zeromon.analysis.step_overlap import StepOverlap, WarmUp, teardown, warmup
from zeromon.analysis.step_table import StepTable, step_table
from zeromon.analysis.stragglers import Imbalance, RankArrivals, combine_imbalance, rank_arrivals
from zeromon.analysis.tracked_memory import peak_tracked_bytes
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording, collector_paused, orjson_module
from zeromon.model.events import RunInfo


@frozen
class RankReport:
    rank: int
    framework: str
    strategy: str
    steps: Sequence[StepOverlap]  # a StepTable (zeromon.analysis.step_table) from rank_report
    median_step_s: float | None
    median_exposed_comm_s: float | None
    median_exposed_share: float | None
    median_overlap_ratio: float | None
    median_blocked_s: float | None
    peak_memory: int | None
    capacity: int | None
    busbw_by_op: dict[str, float]
    oom: OomForecast
    file: str = ""  # the rank file read
    corrupt_lines: tuple[int, ...] = ()  # its lines that could not be decoded, skipped
    line_errors: Mapping[int, str] = field(default_factory=dict)  # what was wrong with some (Recording.line_errors)
    warmup: WarmUp = WarmUp(collectives=0, bytes=0, blocked_s=0.0)  # before the first step
    teardown: WarmUp = WarmUp(collectives=0, bytes=0, blocked_s=0.0)  # after the last step that ended
    # The peak of the sum of the tracked memory categories (zeromon.analysis.tracked_memory): what `zeromon
    # whatif` predicts; None before the agent's first walk of the categories.
    peak_tracked_bytes: int | None = None


@frozen
class RunReport:
    run_dir: str
    world_size: int
    ranks: tuple[RankReport, ...]
    bandwidth: tuple[BandwidthRow, ...]
    imbalance: Imbalance
    findings: tuple[Finding, ...]  # worst first

    def to_dict(self) -> dict[str, Any]:
        return self._head() | {"ranks": [_rank_dict(r) for r in self.ranks]} | self._tail()

    def json_chunks(self, extra: Mapping[str, Any] | None = None) -> Iterator[str]:
        """The text of ``json.dumps(self.to_dict() | extra, indent=1)`` as json.loads reads it, in pieces of
        one rank at most, with each step of a rank's per_step on a line of its own.

        A rank's dict and its text are made as the rank is written and dropped after, its steps by orjson
        (json.dump with indent is pure Python): a large run's to_dict, dumped whole, is slow and holds the
        whole report at once (tests/bench/bench_fleet_report.py)."""
        yield "{\n" + _members(self._head(), 1) + ',\n "ranks": ['
        for i, r in enumerate(self.ranks):
            yield ("," if i else "") + "\n" + _rank_json(r)
        yield ("\n ]," if self.ranks else "],") + "\n" + _members(self._tail() | dict(extra or {}), 1) + "\n}\n"

    def _head(self) -> dict[str, Any]:
        return {"run_dir": self.run_dir, "world_size": self.world_size, "definitions": _DEFINITIONS}

    def _tail(self) -> dict[str, Any]:
        return {
            "bandwidth": [_bandwidth_dict(b) for b in self.bandwidth],
            "imbalance": {
                "step_skew_median": self.imbalance.step_skew_median,
                "slowest_rank_counts": {str(k): v for k, v in self.imbalance.slowest_rank_counts.items()},
                "median_step_s": {str(k): v for k, v in self.imbalance.median_step_s.items()},
                "peak_memory_bytes": {str(k): v for k, v in self.imbalance.peak_memory.items()},
                "memory_spread": self.imbalance.memory_spread,
                "steady_steps": self.imbalance.steady_steps,
                "arrivals": [{"rank": a.rank, "matched": a.matched, "last_arrivals": a.last_arrivals,
                              "caused_wait_s": a.caused_wait_s, "waited_s": a.waited_s,
                              "steady_matched": a.steady_matched, "steady_last_arrivals": a.steady_last_arrivals,
                              "steady_caused_wait_s": a.steady_caused_wait_s, "steady_waited_s": a.steady_waited_s,
                              "steps_most_waited_for": a.steps_most_waited_for}
                             for a in self.imbalance.ranks],
            },
            "findings": [f.to_dict() for f in self.findings],
            # One entry per problem across ranks, as the text, the dashboard and the TUI list them.
            "finding_groups": [g.to_dict() for g in group_findings(self.findings)],
        }


_DEFINITIONS = ("per rank, comm_comp_overlap_pct, exposed_comm_s and exposed_comm_share are medians per step over "
                "the steps after the first (per_step has every step); temporal_breakdown sums those steps; "
                "exposed_comm_s is, on the host, the time the training thread spent blocked in collective calls and waits "
                "(on GPU, communication not hidden behind the stream's compute phases); agent_s is zeromon's own time "
                "on the training thread, neither compute nor communication; warmup counts the collectives before the "
                "first step, which no step includes; "
                "step is the recording's step index, from 0 (the text and HTML number steps from 1, as training "
                "scripts log them); imbalance: arrivals' matched, last_arrivals, caused_wait_s and waited_s count "
                "all steps, their steady_ keys, steps_most_waited_for, steady_steps, step_skew_median, "
                "slowest_rank_counts and median_step_s the steps after the first (what the findings judge); "
                "times in seconds, rates in bytes per second")


def _pct(ratio: float | None) -> float | None:
    return None if ratio is None else round(100.0 * ratio, 3)


def _rank_dict(r: RankReport) -> dict[str, Any]:
    return _rank_head(r) | {"per_step": _per_step(r)}


def _rank_head(r: RankReport) -> dict[str, Any]:
    return {
        "rank": r.rank, "file": r.file, "corrupt_lines": list(r.corrupt_lines),
        "line_errors": {str(line): error for line, error in r.line_errors.items()},
        "framework": r.framework, "strategy": r.strategy, "steps": len(r.steps),
        "median_step_s": r.median_step_s,
        "comm_comp_overlap_pct": _pct(r.median_overlap_ratio),
        "exposed_comm_s": r.median_exposed_comm_s,
        "exposed_comm_share": r.median_exposed_share,
        "blocked_s": r.median_blocked_s,
        "peak_memory_bytes": r.peak_memory,
        "peak_tracked_bytes": r.peak_tracked_bytes,
        "capacity_bytes": r.capacity,
        "busbw_bytes_per_s": r.busbw_by_op,
        "temporal_breakdown": _temporal_breakdown(r),
        "oom": {"risk": r.oom.risk.value, "headroom_bytes": r.oom.headroom_bytes,
                "predicted_peak_bytes": r.oom.predicted_peak_bytes,
                "growth_bytes_per_step": r.oom.growth_bytes_per_step,
                "steps_to_capacity": r.oom.steps_to_capacity},
        "warmup": {"collectives": r.warmup.collectives, "bytes": r.warmup.bytes, "blocked_s": r.warmup.blocked_s},
        "device_timed_steps": device_timed_steps(r),
        "teardown": {"collectives": r.teardown.collectives, "bytes": r.teardown.bytes,
                     "blocked_s": r.teardown.blocked_s},
    }


def _per_step(r: RankReport) -> list[dict[str, Any]]:
    """A dict a step, read from the rank's StepTable's columns (no StepOverlap made)."""
    steps = _table(r)
    columns = steps.values.tolist()  # VALUE_COLUMNS' rows
    columns = [[None if value != value else value for value in column] for column in columns]  # NaN: unknown
    return [{"step": step, "step_s": step_s, "comm_s": comm, "comp_s": comp, "overlap_s": overlap,
             "exposed_comm_s": exposed, "idle_s": idle, "blocked_s": blocked, "agent_s": agent,
             "comm_comp_overlap_pct": _pct(overlap / comm if comm and overlap is not None else None)}
            for step, step_s, comm, comp, overlap, exposed, idle, blocked, agent
            in zip(steps.step.tolist(), *columns, strict=True)]


def _members(document: Mapping[str, Any], level: int) -> str:
    """The members of ``document`` as json.dumps(indent=1) writes them, indented to ``level``."""
    text = json.dumps(document, indent=1, default=str)[2:-2]  # within "{\n" and "\n}"
    return text.replace("\n", "\n" + " " * (level - 1)) if level > 1 else text  # no raw newline within a JSON string


def _rank_json(r: RankReport) -> str:
    """One rank of the report's "ranks", indented as the list's item, each step of its per_step on a line.
    The steps by orjson where it is installed (a dependency), an order of magnitude faster than json's C
    encoder.
    Either way one step follows another as "}, {" or "},{" only there: a step's dict holds numbers and null."""
    steps = _per_step(r)
    if not steps:
        per_step = '   "per_step": []'
    else:
        orjson = orjson_module()
        rows = (orjson.dumps(steps).decode()[1:-1].replace("},{", "},\n    {") if orjson
                else json.dumps(steps)[1:-1].replace("}, {", "},\n    {"))
        per_step = '   "per_step": [\n    ' + rows + "\n   ]"
    return "  {\n   " + _members(_rank_head(r), 3).lstrip() + ",\n" + per_step + "\n  }"


def _exposed_in(table: StepTable, steps: Sequence[int]) -> float:
    """The rank's exposed communication in ``steps`` (those the waiting for peers was measured in: a
    bounded recording keeps some steps' collectives only), all its steady steps where none is known."""
    if not steps:
        return table.steady_sum("exposed_comm_s")
    return float(sum(table.column("exposed_comm_s")[np.isin(table.step, np.asarray(steps))].tolist()))


def _table(r: RankReport) -> StepTable:
    return r.steps if isinstance(r.steps, StepTable) else StepTable.of(r.rank, r.steps)


def device_timed_steps(r: RankReport) -> int:
    """How many of the rank's steps had their communication timed (on a GPU, the steps timed on the device:
    ZEROMON_DEVICE_TIMING_EVERY; every step elsewhere)."""
    return int((~np.isnan(_table(r).column("comm_s"))).sum())


def last_step(r: RankReport) -> int | None:
    """The rank's last summarized step (from 0); None: no step ended."""
    return _table(r).last_step


def _temporal_breakdown(r: RankReport) -> dict[str, float]:
    """HTA's temporal breakdown over the steps after the first: idle (neither), compute, and
    non-compute (communication not hidden behind compute), in seconds and as shares of the time."""
    steps = _table(r)
    total, idle, compute, non_compute = (steps.steady_sum(name) for name in ("step_s", "idle_s", "comp_s",
                                                                              "exposed_comm_s"))
    share = (lambda x: round(100.0 * x / total, 3)) if total > 0 else (lambda x: 0.0)
    return {"idle_time_s": idle, "compute_time_s": compute, "non_compute_time_s": non_compute,
            "idle_time_pctg": share(idle), "compute_time_pctg": share(compute),
            "non_compute_time_pctg": share(non_compute)}


def _bandwidth_dict(b: BandwidthRow) -> dict[str, Any]:
    return {"op": b.op, "size_bucket_bytes": b.size_bucket_bytes, "group_size": b.group_size, "count": b.count,
            "total_bytes": b.total_bytes, "median_time_s": b.median_time_s,
            "median_algbw_bytes_per_s": b.median_algbw, "median_busbw_bytes_per_s": b.median_busbw,
            "busbw_p10_bytes_per_s": b.busbw_p10, "peak_share": b.peak_share}


def rank_report(rec: Recording, capacity_bytes: int | None = None,
                samples: SampleGroups | None = None) -> RankReport:
    """One rank's report; ``samples``: its bandwidth_samples, when the caller has them already."""
    if samples is None:
        samples = bandwidth_samples(rec.collective_columns())
    steps = step_table(rec)
    levels = [level for m in rec.memory
              if (level := m.allocated if m.allocated is not None else m.rss) is not None]
    capacity = capacity_bytes or next((m.capacity for m in reversed(rec.memory) if m.capacity), None)
    return RankReport(
        rank=rec.rank,
        framework=rec.run_info.framework if rec.run_info else "-",
        strategy=strategy_label(rec),
        steps=steps,
        median_step_s=steps.steady_median("step_s"),
        median_exposed_comm_s=steps.steady_median("exposed_comm_s"),
        median_exposed_share=steps.steady_median("exposed_share"),
        median_overlap_ratio=steps.steady_median("overlap_ratio"),
        median_blocked_s=steps.steady_median("blocked_s"),
        peak_memory=max(levels) if levels else None,
        capacity=capacity,
        busbw_by_op=busbw_by_op_of_samples(samples),
        oom=forecast(rec, capacity_bytes=capacity_bytes),
        file=str(rec.path),
        corrupt_lines=tuple(rec.corrupt_lines),
        line_errors=dict(rec.line_errors),
        warmup=warmup(rec.collective_columns()),
        teardown=teardown(rec.collective_columns(), -1 if steps.last_step is None else steps.last_step),
        peak_tracked_bytes=peak_tracked_bytes(rec.memory),
    )


@frozen
class RankAnalysis:
    """One rank's share of the run's report, without its recording: what combine_report needs of it.
    Small enough to send back from the worker process that read the rank (`zeromon report` reads and
    analyses the ranks in parallel): its figures and samples, none of the records."""

    report: RankReport
    samples: SampleGroups  # its bandwidth samples, for the run's bandwidth table
    arrivals: RankArrivals  # for the imbalance across ranks
    run_info: RunInfo | None
    findings: tuple[Finding, ...]  # its OOM and overlap findings


def analyze_rank(rec: Recording, capacity_bytes: int | None = None) -> RankAnalysis:
    with collector_paused():
        samples = bandwidth_samples(rec.collective_columns())
        report = rank_report(rec, capacity_bytes, samples)
        arrivals = rank_arrivals(rec)
    findings = report.oom.findings + overlap_findings_of_medians(
        rec.rank, report.median_exposed_share, report.median_overlap_ratio, report.median_exposed_comm_s,
        report.median_step_s, rec.run_info, window=_table(report).steady_window())
    return RankAnalysis(report=report, samples=samples, arrivals=arrivals, run_info=rec.run_info, findings=findings)


def combine_report(ranks: Sequence[RankAnalysis], run_dir: str, peak_busbw: float | None = None) -> RunReport:
    """The run's report from each rank's analysis, in rank order."""
    with collector_paused():
        imbalance = combine_imbalance([r.arrivals for r in ranks])
        bandwidth = table_of_samples(merge_samples(r.samples for r in ranks), peak_busbw)
    # The waiting and the exposed communication it is a share of, over the steps after the first:
    # the window of the per-rank table and of the straggler findings (a rank late once, in its first
    # step, is warm-up, not a reason to look at a peer).
    waited = {a.rank: a.steady_waited_s for a in imbalance.ranks}
    late = [f.rank for f in imbalance.findings if f.kind == "straggler" and f.rank is not None]
    findings = [with_waiting_for_peers(f, _exposed_in(_table(r.report), imbalance.waiting_steps),
                                       waited[r.report.rank], late)
                for r in ranks for f in r.findings]
    findings.extend(imbalance.findings)
    findings.sort(key=lambda f: (-f.severity.rank, f.rank if f.rank is not None else -1))
    world = max((r.run_info.world_size for r in ranks if r.run_info), default=len(ranks))
    return RunReport(run_dir=run_dir, world_size=world, ranks=tuple(r.report for r in ranks), bandwidth=bandwidth,
                     imbalance=imbalance, findings=tuple(findings))


def build_report(recordings: Sequence[Recording], run_dir: str, peak_busbw: float | None = None,
                 capacity_bytes: int | None = None) -> RunReport:
    return combine_report([analyze_rank(rec, capacity_bytes) for rec in recordings], run_dir, peak_busbw)
