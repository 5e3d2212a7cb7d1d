"""The drill-down on one rank, as plain data: memory by category, collectives, the phase timeline."""

from __future__ import annotations

from zeromon.model.classes import frozen
from zeromon.model.events import MEMORY_CATEGORIES, PhaseSpan, StepSummary
from zeromon.sources.fleet import RankView
from zeromon.views.fleet import duration, ms, pct, rate, short_bytes

TIMELINE_STEPS = 8
TIMELINE_WIDTH = 36  # cells of a phase bar when the panel's width is not known yet
TIMELINE_MIN_WIDTH = 12
# One letter per phase, so the timeline reads without colour too.
PHASE_LETTERS = {"forward": "F", "backward": "B", "optimizer": "O", "other": "·", "setup": "s"}
IDLE = " "


@frozen
class MemoryLine:
    label: str
    bytes: int | None
    share: float | None  # of the rank's current level (allocator or RSS)


def memory_lines(rank: RankView) -> tuple[tuple[MemoryLine, ...], tuple[tuple[str, str], ...]]:
    """(categories largest first, allocator and forecast totals as label/value pairs)."""
    m, oom = rank.memory, rank.oom
    if m is None:
        return (), ()
    level = m.allocated if m.allocated is not None else m.rss
    order = {name: i for i, name in enumerate(MEMORY_CATEGORIES)}
    categories = sorted(m.categories.items(), key=lambda kv: (-kv[1], order.get(kv[0], 99), kv[0]))
    lines = tuple(MemoryLine(name.replace("_", " "), value, value / level if level else None)
                  for name, value in categories)
    fragmentation = m.reserved - m.allocated if m.reserved is not None and m.allocated is not None else None
    totals: list[tuple[str, str]] = [
        ("device", m.device), ("allocated", short_bytes(m.allocated)), ("reserved", short_bytes(m.reserved)),
        ("active", short_bytes(m.active)), ("peak allocated", short_bytes(m.peak_allocated)),
        ("fragmentation", short_bytes(fragmentation)), ("RSS", short_bytes(m.rss)),
        ("capacity", short_bytes(m.capacity)),
        ("alloc retries", "-" if m.num_alloc_retries is None else str(m.num_alloc_retries)),
        ("OOMs", "-" if m.num_ooms is None else str(m.num_ooms)),
    ]
    if oom is not None:
        totals += [("OOM risk", oom.risk.value), ("headroom", short_bytes(oom.headroom_bytes)),
                   ("predicted peak", short_bytes(oom.predicted_peak_bytes)),
                   ("growth/step", short_bytes(oom.growth_bytes_per_step)),
                   ("steps to capacity", _steps_to_capacity(oom.steps_to_capacity)),
                   ("optimizer to come", short_bytes(oom.pending_optimizer_bytes))]
    return lines, tuple(totals)


COLLECTIVE_COLUMNS = ("op", "meaning", "count", "bytes", "time s", "mean ms", "busbw GB/s", "blocked s", "exposed")
# Under ~100 columns: no mean (time / count), and the meaning says only what moves (the op says how),
# so that the exposed share still shows at 80x24.
NARROW_COLLECTIVE_COLUMNS = ("op", "meaning", "count", "bytes", "time s", "busbw", "blocked s", "exposed")
_MOVED = {"param_all_gather": "params", "param_broadcast": "params", "grad_reduce_scatter": "grads",
          "grad_all_reduce": "grads", "unknown": "?"}


def collective_rows(rank: RankView, narrow: bool = False) -> tuple[tuple[str, ...], ...]:
    """One row per (op, ZeRO meaning), most time first, in COLLECTIVE_COLUMNS (``narrow``:
    NARROW_COLLECTIVE_COLUMNS). 'exposed': the share of the op's time the training thread was
    blocked on it (a synchronous collective is all exposed)."""
    rows: list[tuple[str, ...]] = []
    for c in sorted(rank.collectives, key=lambda c: (-c.seconds, c.op, c.meaning)):
        exposed = pct(min(1.0, c.blocked_s / c.seconds) if c.seconds > 0 else None)
        if narrow:
            rows.append((c.op, _MOVED.get(c.meaning, c.meaning), str(c.calls), short_bytes(c.bytes),
                         f"{c.seconds:.3f}", rate(c.busbw_bytes_s), f"{c.blocked_s:.3f}", exposed))
        else:
            rows.append((c.op, c.meaning, str(c.calls), short_bytes(c.bytes), f"{c.seconds:.3f}",
                         ms(c.seconds / c.calls) if c.calls else "-", rate(c.busbw_bytes_s), f"{c.blocked_s:.3f}",
                         exposed))
    return tuple(rows)


def table_width(columns: tuple[str, ...], rows: tuple[tuple[str, ...], ...], padding: int = 1) -> int:
    """Cells a DataTable of these needs to show every column whole (``padding`` either side of a cell)."""
    return sum(max([len(label), *(len(r[i]) for r in rows)]) + 2 * padding for i, label in enumerate(columns))


@frozen
class TimelineRow:
    step: int  # the recording's index (zeromon.model.events.step_number() is what to show)
    cells: str  # one letter per time slice (PHASE_LETTERS, IDLE where no phase ran)
    step_s: float
    exposed_s: float | None


def _cells_from_spans(spans: list[PhaseSpan], start_ns: int, end_ns: int, width: int) -> str:
    span_ns = max(1, end_ns - start_ns)
    cover = [dict[str, int]() for _ in range(width)]
    for p in spans:
        a, b = max(p.start_ns, start_ns), min(p.end_ns, end_ns)
        if b <= a:
            continue
        first = min(width - 1, (a - start_ns) * width // span_ns)
        last = min(width - 1, (b - 1 - start_ns) * width // span_ns)
        for i in range(first, last + 1):
            lo = start_ns + i * span_ns // width
            hi = start_ns + (i + 1) * span_ns // width
            cover[i][p.phase] = cover[i].get(p.phase, 0) + max(0, min(b, hi) - max(a, lo))
    return "".join(PHASE_LETTERS.get(max(c, key=lambda k: c[k]), "·") if c else IDLE for c in cover)


def _cells_from_totals(step: StepSummary, width: int) -> str:
    """Without phase spans (Prometheus, or events not read): phase times side by side, in order."""
    total = step.duration_s
    if total <= 0:
        return IDLE * width
    out = ""
    for phase in ("forward", "backward", "optimizer", "other"):
        out += PHASE_LETTERS[phase] * round(width * step.phase_s.get(phase, 0.0) / total)
    return (out + IDLE * width)[:width]


def phase_timeline(rank: RankView, n: int = TIMELINE_STEPS, width: int = TIMELINE_WIDTH) -> tuple[TimelineRow, ...]:
    """The last n steps, each drawn over its own duration (a step's bar is as wide as any other's)."""
    by_step: dict[int, list[PhaseSpan]] = {}
    for span in rank.phases:
        by_step.setdefault(span.step, []).append(span)
    rows = []
    for step in rank.steps[-n:]:
        spans = by_step.get(step.step)
        cells = (_cells_from_spans(spans, step.start_ns, step.end_ns, width) if spans
                 else _cells_from_totals(step, width))
        rows.append(TimelineRow(step.step, cells, step.duration_s, step.exposed_comm_s))
    return tuple(rows)


def rank_title(rank: RankView) -> str:
    who = f"rank {rank.rank}" if rank.rank is not None else rank.target
    # A rank that died says how, in the words `zeromon run` and `summary` use ("rank 1 died at step 276
    # (no end record; its last 1 s may be lost)"), not "ended" as a clean finish would.
    state = ("alive" if rank.alive else rank.died.removeprefix(f"{who} ") if rank.died
             else "ended: its recording is complete" if rank.ended
             else "never answered" if rank.stale_s is None else f"stale for {duration(rank.stale_s)}")
    parts = [who, rank.host or "-", f"pid {rank.pid}" if rank.pid is not None else "", rank.target, state]
    if rank.error and not rank.alive and not rank.ended:  # an ended rank's "connection refused" says nothing more
        parts.append(rank.error)
    if rank.incomplete:  # what its recording could not write: the drill-down stops where the file does
        parts.append(rank.incomplete.removeprefix(f"{who}: "))
    return " · ".join(p for p in parts if p)


def _steps_to_capacity(steps: float | None) -> str:
    if steps is None:
        return "-"
    return "already over" if steps <= 0 else f"{steps:.0f}"
