"""`zeromon report --trace`'s table as plain data: one row per rank (overlap, exposed communication per
iteration and in all, HTA's temporal breakdown) and the notes on what the table leaves out. The text
report prints these rows and the dashboard's Trace page shows them, so both say the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence

from zeromon.analysis.trace_overlap import RankTraceOverlap
from zeromon.model.classes import frozen

# What the table's columns mean, printed under it (and shown under the page's table).
TABLE_LEGEND = ("(exposed ms/iter: median over the profiled iterations; total: over the whole trace)",
                "(overlap and temporal breakdown over the whole trace, as Holistic Trace Analysis defines them)")


@frozen
class TraceRow:
    """One rank's line of the table; None where the trace has no such number (no communication, no
    iteration, no kernel time)."""

    rank: int
    iterations: int
    overlap_pct: float | None  # HTA's comp_comm_overlap_pctg, whole trace
    exposed_ms_per_iteration: float | None  # median over the profiled iterations
    exposed_ms_total: float  # whole trace
    idle_pct: float | None  # HTA's temporal breakdown, % of kernel time
    compute_pct: float | None
    non_compute_pct: float | None


def trace_rows(results: Sequence[RankTraceOverlap]) -> list[TraceRow]:
    rows = []
    for r in results:
        tb = r.total.breakdown
        per_iteration = r.median_iteration_exposed_comm_s
        rows.append(TraceRow(
            rank=r.rank, iterations=len(r.iterations), overlap_pct=r.total.comm_comp_overlap_pct,
            exposed_ms_per_iteration=None if per_iteration is None else per_iteration * 1e3,
            exposed_ms_total=r.total.exposed_comm_ns / 1e9 * 1e3, idle_pct=tb.idle_time_pctg,
            compute_pct=tb.compute_time_pctg, non_compute_pct=tb.non_compute_time_pctg))
    return rows


def trace_notes(results: Sequence[RankTraceOverlap]) -> list[str]:
    """What the table leaves out: the last profiler step dropped (as HTA does), and ranks of the
    world that have no trace in the folder."""
    notes = []
    dropped = sorted({r.dropped_step for r in results if r.dropped_step})
    if dropped:
        notes.append(f"note: the last profiler step ({', '.join(dropped)}) and what it launched are left out, as "
                     "Holistic Trace Analysis does (the profiler may stop in the middle of it)")
    world = max((r.world_size for r in results if r.world_size), default=None)
    if world is not None and len(results) < world:
        notes.append(f"note: {len(results)} of a world of {world} ranks "
                     f"({'rank' if len(results) == 1 else 'ranks'} {', '.join(str(r.rank) for r in results)}); "
                     "the others' traces are not among those read")
    return notes
