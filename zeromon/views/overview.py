"""The dashboard's first glance, as plain data: the worst OOM risk and the worst exposed communication
of the job (banners), and one cell per rank for the rank grid.

The OOM banner speaks for the rank closest to trouble as the TUI's worst row does (risk, then least
headroom); the exposed banner for the rank whose communication costs the largest share of its step:
on a recording, `zeromon report`'s medians over the steps after the first; live, the same medians
over the steps the view holds. Thresholds are the findings' own (comm_advice, oom), so a banner and
a finding never disagree.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from zeromon.analysis.comm_advice import EXPOSED_SHARE_CRITICAL, EXPOSED_SHARE_WARN
from zeromon.analysis.findings import Severity
from zeromon.analysis.step_table import StepTable
from zeromon.model.classes import frozen
from zeromon.model.events import steps_label
from zeromon.views.fleet import RankRow, duration, pct, rank_rows, short_bytes, worst_row
from zeromon.views.run_data import RunData


@frozen
class Banner:
    kind: str  # "oom", "exposed", "died" or "incomplete"
    level: str  # "critical", "warn" or "ok"
    rank: int | None
    text: str


@frozen
class RankCell:
    """One rank in the grid: where it sits, what colours it, what its hover says."""

    rank: int
    row: int
    col: int
    risk: Severity | None
    used_share: float | None  # of capacity: the peak (or predicted peak) / capacity
    exposed_share: float | None
    state: str  # "alive", "ended", "down", "stale 7s"
    answering: bool
    hover: str


def _level(severity: Severity | None) -> str:
    if severity is Severity.CRITICAL:
        return "critical"
    return "warn" if severity is Severity.WARN else "ok"


def _exposed_level(share: float | None) -> str:
    if share is None:
        return "ok"
    return "critical" if share >= EXPOSED_SHARE_CRITICAL else "warn" if share >= EXPOSED_SHARE_WARN else "ok"


# The last RunData's shares: the Overview's banner and its grid both ask, on every live refresh (a cost
# that grows with the ranks and steps held: tests/bench/bench_dashboard.py).
_last_shares: tuple[RunData, dict[int, float]] | None = None


def rank_exposed_shares(data: RunData) -> dict[int, float]:
    """Each rank's median exposed share of step time over the steps after the first (the report's
    window): from the report for a recording, else from the steps the history holds."""
    global _last_shares
    last = _last_shares  # one read: another thread may replace it meanwhile
    if last is not None and last[0] is data:
        return last[1]
    shares = _exposed_shares(data)
    _last_shares = (data, shares)
    return shares


def _exposed_shares(data: RunData) -> dict[int, float]:
    if data.report is not None:
        return {r.rank: r.median_exposed_share for r in data.report.ranks if r.median_exposed_share is not None}
    out: dict[int, float] = {}
    for rank, history in data.histories.items():
        steps = [s for s in history.steps if s.step >= 1] or list(history.steps)
        shares = [s.exposed_comm_s / s.duration_s for s in steps if s.exposed_comm_s is not None and s.duration_s > 0]
        if shares:
            out[rank] = statistics.median(shares)
    return out


def _time_left(rows_rank: int | None, data: RunData) -> str:
    """Steps (and time, at the rank's median step time) until its memory reaches capacity."""
    view = next((r for r in data.fleet.ranks if r.rank == rows_rank), None)
    oom = view.oom if view is not None else None
    if data.report is not None:
        oom = next((r.oom for r in data.report.ranks if r.rank == rows_rank), oom)
    if oom is None:
        return ""
    if oom.headroom_bytes is not None and oom.headroom_bytes < 0:
        return "already over capacity"
    steps = oom.steps_to_capacity
    if steps is None or not math.isfinite(steps):
        return ""
    history = data.histories.get(rows_rank) if rows_rank is not None else None
    durations = [s.duration_s for s in history.steps[-50:]] if history is not None else []
    if not durations:
        return f"{steps:,.0f} steps to capacity"
    left_s = steps * statistics.median(durations)
    return f"{steps:,.0f} steps to capacity (~{duration(left_s) if left_s >= 10 else f'{left_s:.1f}s'})"


def oom_banner(data: RunData, rows: Sequence[RankRow] | None = None) -> Banner | None:
    """The rank closest to running out of memory; None without memory data."""
    rows = rank_rows(data.fleet) if rows is None else rows
    worst = worst_row([r for r in rows if r.used is not None or r.risk is not None])
    if worst is None:
        return None
    level = _level(worst.risk)
    left = _time_left(worst.rank, data)
    parts = [f"rank {worst.rank}", f"headroom {short_bytes(worst.headroom)} of {short_bytes(worst.capacity)}"]
    if worst.peak is not None:
        parts.append(f"peak {short_bytes(worst.peak)}")
    if left:
        parts.append(left)
    head = {"critical": "OOM risk CRITICAL", "warn": "OOM risk", "ok": "Memory OK"}[level]
    return Banner("oom", level, worst.rank, f"{head}: " + ", ".join(parts))


def died_banners(data: RunData) -> list[Banner]:
    """One critical banner per rank that died, in the sentence `zeromon run` and `summary` print ("rank 1
    died at step 276 (no end record; its last 1 s may be lost)"): a dead rank must never read as a
    finished run. The first to end comes first, as `zeromon report` says it (rank_ends.end_order): by when each
    was last heard of (live, its last answer; in a recording, its last record, written as it ended)."""
    died = sorted((r for r in data.fleet.ranks if r.died and not r.alive),
                  key=lambda r: (r.t_ns is None, r.t_ns or 0, r.rank if r.rank is not None else -1))
    return [Banner("died", "critical", r.rank, r.died) for r in died if r.died]


def incomplete_banners(data: RunData) -> list[Banner]:
    """One warning banner per rank whose recording could not be written whole (a full disk, a removed
    folder), as `zeromon summary` says it: what the pages show of that rank stops where the file does."""
    return [Banner("incomplete", "warn", r.rank, r.incomplete) for r in data.fleet.ranks if r.incomplete]


def exposed_banner(data: RunData) -> Banner | None:
    """The rank whose exposed communication is the largest share of its step; None without steps."""
    shares = rank_exposed_shares(data)
    if not shares:
        return None
    rank = max(shares, key=lambda r: (shares[r], -r))
    share = shares[rank]
    level = _exposed_level(share)
    head = {"critical": "Exposed communication CRITICAL", "warn": "Exposed communication",
            "ok": "Communication mostly hidden"}[level]
    median_s, window = _exposed_median(data, rank)
    extra = f" ({median_s * 1e3:.1f} ms per step)" if median_s is not None else ""
    return Banner("exposed", level, rank,
                  f"{head}: rank {rank}, {pct(share)} of step time is communication not hidden behind compute{extra}"
                  f", {window}")


def _exposed_median(data: RunData, rank: int) -> tuple[float | None, str]:
    """The rank's median exposed communication per step and the window it is the median of, in the words the
    banner shows ("median of steps 2-20", steps from 1 as training scripts log them): the findings' window
    (the steps after the first) for a recording, the steps the history holds when live."""
    median_s: float | None = None
    numbers: list[int] = []
    if data.report is not None:
        report = next((r for r in data.report.ranks if r.rank == rank), None)
        if report is not None:
            median_s = report.median_exposed_comm_s
            steps = report.steps
            numbers = steps.step.tolist() if isinstance(steps, StepTable) else [s.step for s in steps]
            numbers = [n for n in numbers if n >= 1] or numbers  # the report's steady steps
    else:
        history = data.histories.get(rank)
        held = list(history.steps) if history else []
        exposed = [s for s in ([s for s in held if s.step >= 1] or held) if s.exposed_comm_s is not None]
        median_s = statistics.median(s.exposed_comm_s for s in exposed if s.exposed_comm_s is not None) \
            if exposed else None
        numbers = [s.step for s in exposed]
    if not numbers:
        return median_s, "median over its steps"
    label = steps_label(min(numbers), max(numbers))
    return median_s, label if min(numbers) == max(numbers) else f"median of {label}"


GRID_COLUMNS_MAX = 32


def grid_shape(n: int) -> tuple[int, int]:
    """(rows, columns) for n ranks: 8 per row up to 64 ranks (a node of 8 GPUs per row), then square-ish
    up to GRID_COLUMNS_MAX columns."""
    if n <= 0:
        return 0, 0
    cols = min(n, 8) if n <= 64 else min(GRID_COLUMNS_MAX, math.ceil(math.sqrt(n)))
    return math.ceil(n / cols), cols


def rank_cells(data: RunData, rows: Sequence[RankRow] | None = None) -> tuple[RankCell, ...]:
    rows = [r for r in (rank_rows(data.fleet) if rows is None else rows) if r.rank is not None]
    rows.sort(key=lambda r: r.rank if r.rank is not None else 0)
    _, cols = grid_shape(len(rows))
    shares = rank_exposed_shares(data)
    cells = []
    for i, row in enumerate(rows):
        assert row.rank is not None
        used = row.peak if row.peak is not None else row.used
        used_share = used / row.capacity if used is not None and row.capacity else None
        exposed = shares.get(row.rank, row.exposed_share)
        died = next((r.died for r in data.fleet.ranks if r.rank == row.rank and r.died and not r.alive), None)
        hover = "<br>".join([
            f"rank {row.rank} ({row.host})", f"state: {died or row.state}",
            f"OOM risk: {row.risk.value if row.risk else '-'}",
            f"memory peak {short_bytes(used)} of {short_bytes(row.capacity)} ({pct(used_share)})",
            f"headroom {short_bytes(row.headroom)}",
            f"exposed comm: {pct(exposed)} of step time", f"step {row.steps_done if row.steps_done is not None else '-'}",
        ])
        cells.append(RankCell(rank=row.rank, row=i // cols, col=i % cols, risk=row.risk, used_share=used_share,
                              exposed_share=exposed, state=row.state, answering=row.answering, hover=hover))
    return tuple(cells)
