"""The Memory page's numbers, as plain data: each rank's memory over time (its level, the categories as
the agent walked them, its capacity and the OOM forecast's predicted peak), its allocator counters, and
one row per rank (the table and the imbalance bars) made from the TUI's own rows and drill-down lines,
so that the browser and the terminal show one number, computed once."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from operator import attrgetter

from zeromon.analysis.findings import Severity
from zeromon.analysis.oom import OomForecast
from zeromon.model.columns import TableRecords
from zeromon.model.events import MEMORY_CATEGORIES, MemorySample, OomEvent, step_number
from zeromon.views.fleet import rank_row, run_ended, short_bytes
from zeromon.views.rank_detail import memory_lines
from zeromon.views.run_data import RankHistory, RunData

_BY_TIME = attrgetter("t_ns")


def forecasts(data: RunData) -> dict[int, OomForecast]:
    """Each rank's OOM forecast: the report's for a recording (made over the whole recording, with
    `--capacity` applied), else the live view's."""
    if data.report is not None:
        return {r.rank: r.oom for r in data.report.ranks}
    return {r.rank: r.oom for r in data.fleet.ranks if r.rank is not None and r.oom is not None}


def origin_ns(histories: Mapping[int, RankHistory]) -> int | None:
    """The run's first memory sample: time zero of every memory figure, so that the ranks line up."""
    firsts = [h.memory[0].t_ns if isinstance(h.memory, TableRecords) else min(h.memory, key=_BY_TIME).t_ns
              for h in histories.values() if h.memory]
    return min(firsts) if firsts else None


def _in_order(samples: Sequence[MemorySample]) -> Sequence[MemorySample]:
    if isinstance(samples, TableRecords):  # a finished recording's, in time order: made once, here
        return list(samples)
    # Recordings are written in time order: the check is one pass, a sort only when it fails.
    ordered = all(a.t_ns <= b.t_ns for a, b in pairwise(samples))
    return samples if ordered else sorted(samples, key=_BY_TIME)


# --- over time --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemorySeries:
    """One rank's memory over time; times in seconds since the run's first sample."""

    rank: int
    device: str  # "cuda:0", "cpu", "-" without samples
    level_name: str  # "allocated" (the allocator, on GPU) or "RSS" (the process, on CPU)
    t_s: tuple[float, ...]
    level_bytes: tuple[int, ...]
    # The category walks, each held until the next and the last to the rank's last sample (a walk
    # costs time, so the agent walks now and then): the times, then per category (MEMORY_CATEGORIES
    # order) its bytes at each of those times.
    walk_t_s: tuple[float, ...]
    categories: tuple[tuple[str, tuple[int, ...]], ...]
    level_peak_bytes: int  # the highest level
    stacked_peak_bytes: int  # the largest sum of the categories at one walk
    capacity_bytes: int | None
    predicted_peak_bytes: int | None
    headroom_bytes: int | None = None  # the forecast's: capacity − predicted peak
    steps_to_capacity: float | None = None  # the forecast's: None unless the level grows


def _category_names(walks: Iterable[MemorySample]) -> list[str]:
    seen = {name for m in walks for name in m.categories}
    return [n for n in MEMORY_CATEGORIES if n in seen] + sorted(seen - set(MEMORY_CATEGORIES))


def memory_series(history: RankHistory, origin: int, forecast: OomForecast | None = None) -> MemorySeries:
    samples = _in_order(history.memory)
    on_gpu = any(m.allocated is not None for m in samples)
    points = [(m.t_ns, level) for m in samples if (level := m.allocated if on_gpu else m.rss) is not None]
    # MemorySample.walked, inline: the property's generator costs ~0.2 µs a sample (6 ms per 30,000)
    walks = [m for m in samples if len(m.categories) > ("activations" in m.categories)]
    names = _category_names(walks)
    walk_t = [m.t_ns for m in walks]
    values = {name: [m.categories.get(name, 0) for m in walks] for name in names}
    if walks and samples[-1].t_ns > walk_t[-1]:
        walk_t.append(samples[-1].t_ns)
        for column in values.values():
            column.append(column[-1])
    capacity = forecast.capacity_bytes if forecast is not None and forecast.capacity_bytes else next(
        (m.capacity for m in reversed(samples) if m.capacity), None)
    return MemorySeries(
        rank=history.rank, device=samples[-1].device if samples else "-",
        level_name="allocated" if on_gpu else "RSS",
        t_s=tuple((t - origin) / 1e9 for t, _ in points), level_bytes=tuple(v for _, v in points),
        walk_t_s=tuple((t - origin) / 1e9 for t in walk_t),
        categories=tuple((name, tuple(values[name])) for name in names),
        level_peak_bytes=max((v for _, v in points), default=0),
        stacked_peak_bytes=max((sum(column) for column in zip(*values.values(), strict=True)), default=0),
        capacity_bytes=capacity,
        predicted_peak_bytes=forecast.predicted_peak_bytes if forecast is not None else None,
        headroom_bytes=forecast.headroom_bytes if forecast is not None else None,
        steps_to_capacity=forecast.steps_to_capacity if forecast is not None else None)


# --- the allocator -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AllocatorSeries:
    """One rank's allocator counters over its samples that have them (GPU), and its OOMs."""

    rank: int
    t_s: tuple[float, ...]
    alloc_retries: tuple[int | None, ...]  # cumulative cudaMalloc retries
    fragmentation_bytes: tuple[int | None, ...]  # reserved − allocated
    num_ooms: tuple[int | None, ...]  # cumulative
    oom_t_s: tuple[float, ...]  # each OOM the observer saw
    oom_texts: tuple[str, ...]

    @property
    def has_stats(self) -> bool:
        return bool(self.t_s) or bool(self.oom_t_s)


def oom_text(event: OomEvent) -> str:
    return (f"OOM in step {step_number(event.step)} ({event.phase}) on {event.device}: requested "
            f"{short_bytes(event.requested)}, allocated {short_bytes(event.allocated)}, free {short_bytes(event.free)}")


def allocator_series(history: RankHistory, origin: int) -> AllocatorSeries:
    stats = [m for m in _in_order(history.memory)
             if m.num_alloc_retries is not None or m.reserved is not None or m.num_ooms is not None]
    ooms = sorted(history.ooms, key=_BY_TIME)
    return AllocatorSeries(
        rank=history.rank, t_s=tuple((m.t_ns - origin) / 1e9 for m in stats),
        alloc_retries=tuple(m.num_alloc_retries for m in stats),
        fragmentation_bytes=tuple(m.fragmentation for m in stats),
        num_ooms=tuple(m.num_ooms for m in stats),
        oom_t_s=tuple((e.t_ns - origin) / 1e9 for e in ooms), oom_texts=tuple(oom_text(e) for e in ooms))


# --- one row per rank --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MemoryRow:
    """One rank's memory now: the values (sorting, colours, bars) and, in ``texts``, the cells as the
    TUI shows them (keys: MEMORY_TEXT_KEYS)."""

    rank: int
    device: str
    risk: Severity | None
    current_bytes: int | None
    peak_bytes: int | None
    predicted_peak_bytes: int | None
    capacity_bytes: int | None
    headroom_bytes: int | None
    growth_bytes_per_step: float | None
    steps_to_capacity: float | None
    optimizer_to_come_bytes: int | None
    alloc_retries: int | None
    num_ooms: int | None
    fragmentation_bytes: int | None
    texts: Mapping[str, str]


# memory_lines' labels, which its totals give as text
MEMORY_TEXT_KEYS = ("OOM risk", "predicted peak", "growth/step", "steps to capacity", "optimizer to come",
                    "alloc retries", "OOMs", "fragmentation")


def memory_rows(data: RunData) -> tuple[MemoryRow, ...]:
    """Every rank of the view (those that answered), by rank, with the forecast forecasts() picks."""
    chosen = forecasts(data)
    final = run_ended(data.fleet)
    rows = []
    for seen in sorted((r for r in data.fleet.ranks if r.rank is not None), key=lambda r: r.rank or 0):
        rank = seen.rank
        assert rank is not None
        view = dataclasses.replace(seen, oom=chosen.get(rank, seen.oom))
        row, (_, totals) = rank_row(view, final), memory_lines(view)
        m, oom = view.memory, view.oom
        texts = {key: "-" for key in MEMORY_TEXT_KEYS} | dict(totals)
        texts |= {"current": short_bytes(row.used), "peak": short_bytes(row.peak),
                  "capacity": short_bytes(row.capacity), "headroom": short_bytes(row.headroom)}
        rows.append(MemoryRow(
            rank=rank, device=m.device if m is not None else (oom.device if oom is not None else "-"),
            risk=row.risk, current_bytes=row.used, peak_bytes=row.peak,
            predicted_peak_bytes=oom.predicted_peak_bytes if oom is not None else None,
            capacity_bytes=row.capacity, headroom_bytes=row.headroom,
            growth_bytes_per_step=oom.growth_bytes_per_step if oom is not None else None,
            steps_to_capacity=oom.steps_to_capacity if oom is not None else None,
            optimizer_to_come_bytes=oom.pending_optimizer_bytes if oom is not None else None,
            alloc_retries=m.num_alloc_retries if m is not None else None,
            num_ooms=m.num_ooms if m is not None else None,
            fragmentation_bytes=m.fragmentation if m is not None else None, texts=texts))
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class PeakSpread:
    """How far the ranks' peaks are apart: the median, the highest and lowest rank, and (max − min) / max."""

    median_bytes: float
    high_rank: int
    low_rank: int
    spread: float


def peak_spread(rows: Sequence[MemoryRow]) -> PeakSpread | None:
    peaks = {r.rank: r.peak_bytes for r in rows if r.peak_bytes is not None}
    if not peaks:
        return None
    high = max(peaks, key=lambda r: (peaks[r], -r))
    low = min(peaks, key=lambda r: (peaks[r], r))
    spread = (peaks[high] - peaks[low]) / peaks[high] if peaks[high] > 0 else 0.0
    return PeakSpread(statistics.median(peaks.values()), high, low, spread)
