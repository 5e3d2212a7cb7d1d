"""The Memory page's numbers, as plain data: each rank's memory over time (its level, the categories as
the agent walked them, its capacity and the OOM forecast's predicted peak), its allocator counters, and
one row per rank (the table and the imbalance bars) made from the TUI's own rows and drill-down lines,
so that the browser and the terminal show one number, computed once."""

from __future__ import annotations

import dataclasses
import statistics
from array import array
from collections.abc import Iterable, Mapping, Sequence
from itertools import pairwise
from operator import attrgetter

import numpy as np

from zeromon.analysis.findings import Severity
from zeromon.analysis.oom import OomForecast
from zeromon.model.classes import frozen
from zeromon.model.columns import NO_INT, ColumnTable, TableRecords
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


# --- one rank's samples as columns -------------------------------------------------------------------------

_NUMBERS = ("allocated", "rss", "capacity", "reserved", "num_alloc_retries", "num_ooms")


@frozen
class SampleColumns:
    """One rank's memory samples in time order as arrays (NaN where a sample has no value), and the
    category walks among them: what the figures draw, made without a MemorySample per sample where
    the history is stored as columns (a finished recording: an object a sample would be made again, for
    every rank, on every draw)."""

    t_ns: np.ndarray  # int64
    numbers: Mapping[str, np.ndarray]  # _NUMBERS: float64
    device: str  # the last sample's
    walk_t_ns: np.ndarray  # int64: the samples that walked the categories
    names: tuple[str, ...]  # the categories walked, MEMORY_CATEGORIES order then the others
    walks: np.ndarray  # float64, one row per name, one column per walk; 0 where a walk lacks a name

    @property
    def empty(self) -> bool:
        return not len(self.t_ns)


def _walked(keys: tuple[str, ...]) -> bool:
    """MemorySample.walked for a key tuple: some category but the activations."""
    return len(keys) > ("activations" in keys)


def _ordered_names(seen: Iterable[str]) -> tuple[str, ...]:
    seen = set(seen)
    return tuple([n for n in MEMORY_CATEGORIES if n in seen] + sorted(seen - set(MEMORY_CATEGORIES)))


def _float_column(raw: array | None, n: int) -> np.ndarray:
    if raw is None:
        return np.full(n, np.nan)
    if raw.typecode == "d":
        return np.array(raw, dtype=np.float64)
    ints = np.frombuffer(raw, dtype=np.int64)
    out = ints.astype(np.float64)
    out[ints == NO_INT] = np.nan
    return out


def _table_walks(table: ColumnTable[MemorySample]) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    """The walks' indices, their category names and values, gathered from the stored arrays: one
    fancy index per distinct key tuple (a run has a handful), not a dict per sample."""
    column = table.mappings("categories")
    if column is None:  # no sample has categories, or they are not numbers: one record at a time
        return _object_walks([table.get(i) for i in range(len(table))])
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, keys in enumerate(column.keys):
        if _walked(keys):
            groups.setdefault(keys, []).append(i)
    if column.others:  # a mapping of something else than numbers: taken as it is, where it is a walk
        for mapping in column.others.values():
            if _walked(tuple(mapping)):
                groups.setdefault(tuple(mapping), [])
    names = _ordered_names(name for keys in groups for name in keys)
    index = np.asarray(sorted(i for found in groups.values() for i in found), dtype=np.int64)
    values = np.zeros((len(names), len(index)))
    row_of = {name: r for r, name in enumerate(names)}
    offsets = np.frombuffer(column.offsets, dtype=np.int64)
    ints, floats = np.frombuffer(column.ints, dtype=np.int64), np.frombuffer(column.floats, dtype=np.float64)
    for keys, found in groups.items():
        at = np.asarray([i for i in found if i not in column.others] if column.others else found, dtype=np.int64)
        if not len(at):
            continue
        where = np.searchsorted(index, at)
        rows = np.asarray([row_of[name] for name in keys], dtype=np.int64)
        starts = offsets[at]
        span = np.arange(len(keys))
        as_int = starts >= 0
        if as_int.any():
            values[np.ix_(rows, where[as_int])] = ints[starts[as_int][:, None] + span].T
        if (~as_int).any():
            values[np.ix_(rows, where[~as_int])] = floats[(~starts[~as_int])[:, None] + span].T
    for i, mapping in column.others.items():
        if _walked(tuple(mapping)):
            j = int(np.searchsorted(index, i))
            for name, v in mapping.items():
                values[row_of[name], j] = float(v)
    return index, names, values


def _object_walks(samples: Sequence[MemorySample]) -> tuple[np.ndarray, tuple[str, ...], np.ndarray]:
    # MemorySample.walked, inline: the property's generator would be a cost for every sample
    index = [i for i, m in enumerate(samples) if len(m.categories) > ("activations" in m.categories)]
    names = _ordered_names(name for i in index for name in samples[i].categories)
    values = np.array([[samples[i].categories.get(name, 0) for i in index] for name in names],
                      dtype=np.float64).reshape(len(names), len(index))
    return np.asarray(index, dtype=np.int64), names, values


def sample_columns(history: RankHistory) -> SampleColumns:
    """The history's memory samples as columns, in time order."""
    memory = history.memory
    if isinstance(memory, TableRecords):  # a finished recording's, in time order
        table = memory.table
        n = len(table)
        t_ns = np.frombuffer(table.t_ns, dtype=np.int64).copy()
        numbers = {name: _float_column(table.numbers(name), n) for name in _NUMBERS}
        device = table.value(n - 1, "device") if n else "-"
        index, names, walks = _table_walks(table)
    else:
        # Recordings are written in time order: the check is one pass, a sort only when it fails.
        samples = memory if all(a.t_ns <= b.t_ns for a, b in pairwise(memory)) else sorted(memory, key=_BY_TIME)
        t_ns = np.fromiter((m.t_ns for m in samples), dtype=np.int64, count=len(samples))
        numbers = {name: np.array([getattr(m, name) for m in samples], dtype=np.float64).reshape(len(samples))
                   for name in _NUMBERS}  # None: NaN
        device = samples[-1].device if samples else "-"
        index, names, walks = _object_walks(samples)
    return SampleColumns(t_ns=t_ns, numbers=numbers, device=device, walk_t_ns=t_ns[index], names=names, walks=walks)


# --- over time --------------------------------------------------------------------------------------------

@frozen
class MemorySeries:
    """One rank's memory over time; times in seconds since the run's first sample, as float64 arrays."""

    rank: int
    device: str  # "cuda:0", "cpu", "-" without samples
    level_name: str  # "allocated" (the allocator, on GPU) or "RSS" (the process, on CPU)
    t_s: np.ndarray
    level_bytes: np.ndarray
    # The category walks, each held until the next and the last to the rank's last sample (a walk
    # costs time, so the agent walks now and then): the times, then per category (MEMORY_CATEGORIES
    # order) its bytes at each of those times.
    walk_t_s: np.ndarray
    categories: tuple[tuple[str, np.ndarray], ...]
    level_peak_bytes: int  # the highest level
    stacked_peak_bytes: int  # the largest sum of the categories at one walk
    capacity_bytes: int | None
    predicted_peak_bytes: int | None
    headroom_bytes: int | None = None  # the forecast's: capacity − predicted peak
    steps_to_capacity: float | None = None  # the forecast's: None unless the level grows


def memory_series(history: RankHistory, origin: int, forecast: OomForecast | None = None,
                  columns: SampleColumns | None = None) -> MemorySeries:
    c = columns if columns is not None else sample_columns(history)
    allocated, rss = c.numbers["allocated"], c.numbers["rss"]
    on_gpu = bool((~np.isnan(allocated)).any())
    level = allocated if on_gpu else rss
    has = ~np.isnan(level)
    walk_t, walks = c.walk_t_ns, c.walks
    if len(walk_t) and c.t_ns[-1] > walk_t[-1]:  # the last walk held to the last sample
        walk_t = np.append(walk_t, c.t_ns[-1])
        walks = np.concatenate([walks, walks[:, -1:]], axis=1)
    capacities = c.numbers["capacity"]
    known = capacities[~np.isnan(capacities) & (capacities > 0)]
    capacity = forecast.capacity_bytes if forecast is not None and forecast.capacity_bytes else (
        int(known[-1]) if len(known) else None)
    return MemorySeries(
        rank=history.rank, device=c.device, level_name="allocated" if on_gpu else "RSS",
        t_s=(c.t_ns[has] - origin) / 1e9, level_bytes=level[has],
        walk_t_s=(walk_t - origin) / 1e9,
        categories=tuple((name, walks[i]) for i, name in enumerate(c.names)),
        level_peak_bytes=int(level[has].max()) if has.any() else 0,
        stacked_peak_bytes=int(walks.sum(axis=0).max()) if walks.shape[1] else 0,
        capacity_bytes=capacity,
        predicted_peak_bytes=forecast.predicted_peak_bytes if forecast is not None else None,
        headroom_bytes=forecast.headroom_bytes if forecast is not None else None,
        steps_to_capacity=forecast.steps_to_capacity if forecast is not None else None)


# --- the allocator -----------------------------------------------------------------------------------------

@frozen
class AllocatorSeries:
    """One rank's allocator counters over its samples that have them (GPU), as float64 arrays (NaN
    where a sample lacks one), and its OOMs."""

    rank: int
    t_s: np.ndarray
    alloc_retries: np.ndarray  # cumulative cudaMalloc retries
    fragmentation_bytes: np.ndarray  # reserved − allocated
    num_ooms: np.ndarray  # cumulative
    oom_t_s: tuple[float, ...]  # each OOM the observer saw
    oom_texts: tuple[str, ...]

    @property
    def has_stats(self) -> bool:
        return bool(len(self.t_s)) or bool(self.oom_t_s)


def oom_text(event: OomEvent) -> str:
    return (f"OOM in step {step_number(event.step)} ({event.phase}) on {event.device}: requested "
            f"{short_bytes(event.requested)}, allocated {short_bytes(event.allocated)}, free {short_bytes(event.free)}")


def allocator_series(history: RankHistory, origin: int, columns: SampleColumns | None = None) -> AllocatorSeries:
    c = columns if columns is not None else sample_columns(history)
    retries, reserved, ooms_counted = c.numbers["num_alloc_retries"], c.numbers["reserved"], c.numbers["num_ooms"]
    stats = ~np.isnan(retries) | ~np.isnan(reserved) | ~np.isnan(ooms_counted)
    ooms = sorted(history.ooms, key=_BY_TIME)
    return AllocatorSeries(
        rank=history.rank, t_s=(c.t_ns[stats] - origin) / 1e9, alloc_retries=retries[stats],
        fragmentation_bytes=(reserved - c.numbers["allocated"])[stats],  # NaN where either is missing
        num_ooms=ooms_counted[stats],
        oom_t_s=tuple((e.t_ns - origin) / 1e9 for e in ooms), oom_texts=tuple(oom_text(e) for e in ooms))


# --- one row per rank --------------------------------------------------------------------------------------

@frozen
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


@frozen
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
