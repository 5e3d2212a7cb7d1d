"""One rank's steps as columns: what `zeromon report` keeps of each step, for ten thousand steps.

A StepOverlap object a step, pickled by the worker that read the rank and kept in the report, makes a
large run's report slow and its memory large (tests/bench/bench_fleet_report.py). A StepTable holds the
same numbers as nine numpy arrays (loaded as one block each) and is still a sequence of StepOverlap for
the clients that walk the steps (made one at a time, when looked at).

Steps that have a summary but no detail (a bounded recording keeps collectives and phase spans for
some steps only) take the overlap the agent computed as the step ended (StepSummary's comm_union_s,
comp_s, overlap_s, exposed_comm_s, blocked_s); ``overlap_of_summary`` is the one-step reference of
that arithmetic (zeromon.analysis.step_overlap), ``summary_columns`` the same for all steps at once.

The engine is numpy, already a dependency, chosen against DuckDB and Polars on the report's hot
operations (tests/bench/engines_fleet.py: per rank the derived columns and five medians; across ranks,
per step the median, slowest and fastest, per rank the median). Neither is faster by enough to matter,
and each costs an import in every worker; the cost that matters is the same for all three, making
columns of a rank's step summaries. Polars' small lead across ranks does not pay for a large new
dependency, nor for matching the reference's choice among equal maxima (the first rank) in a group-by.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import overload

import numpy as np

from zeromon.analysis.step_overlap import StepOverlap, step_overlaps
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording
from zeromon.model.events import StepSummary
from zeromon.model.step_records import step_column

# StepOverlap's float fields, in its order: the rows of StepTable.values.
VALUE_COLUMNS = ("step_s", "comm_s", "comp_s", "overlap_s", "exposed_comm_s", "idle_s", "blocked_s", "agent_s")
_ROW = {name: i for i, name in enumerate(VALUE_COLUMNS)}


@frozen(eq=False)
class StepTable(Sequence[StepOverlap]):
    """A rank's StepOverlaps in step order: ``step`` (int64) and ``values`` (float64, one row per
    VALUE_COLUMNS name, one column per step)."""

    rank: int
    step: np.ndarray
    values: np.ndarray

    @classmethod
    def of(cls, rank: int, overlaps: Sequence[StepOverlap]) -> StepTable:
        values = np.array([[getattr(s, name) for name in VALUE_COLUMNS] for s in overlaps], dtype=np.float64)
        return cls(rank=rank, step=np.array([s.step for s in overlaps], dtype=np.int64),
                   values=values.T.reshape(len(VALUE_COLUMNS), len(overlaps)))

    def __len__(self) -> int:
        return len(self.step)

    @overload
    def __getitem__(self, index: int) -> StepOverlap: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepOverlap]: ...

    def __getitem__(self, index: int | slice) -> StepOverlap | list[StepOverlap]:
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._row(index)

    def _row(self, i: int) -> StepOverlap:
        return StepOverlap(self.rank, int(self.step[i]), *self.values[:, i].tolist())

    def __iter__(self) -> Iterator[StepOverlap]:
        rows = self.values.T.tolist()
        return (StepOverlap(self.rank, step, *row) for step, row in zip(self.step.tolist(), rows, strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (StepTable, list, tuple)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares as the list it stands for

    def column(self, name: str) -> np.ndarray:
        return self.values[_ROW[name]]

    @property
    def last_step(self) -> int | None:
        return int(self.step.max()) if len(self.step) else None

    def steady(self) -> np.ndarray:
        """The mask of the steps after the first (all of them when there is none): what the medians judge."""
        mask = self.step >= 1
        return mask if mask.any() else np.ones(len(self.step), dtype=bool)

    def steady_window(self) -> tuple[int, int] | None:
        """The first and last of the steady steps (recording indices), None without steps."""
        steps = self.step[self.steady()]
        return (int(steps.min()), int(steps.max())) if len(steps) else None

    def steady_sum(self, name: str) -> float:
        """Python's sum of the column over the steady steps, in step order (numpy's pairwise sum rounds
        differently, and the report's numbers stay those of the per-object code)."""
        return float(sum(self.column(name)[self.steady()].tolist()))

    def steady_median(self, name: str) -> float | None:
        """The median over the steady steps, of "exposed_share" and "overlap_ratio" too (StepOverlap's
        properties: None, left out, where the step time or the communication is 0)."""
        mask = self.steady()
        if name == "exposed_share":
            values = _ratio(self.column("exposed_comm_s"), self.column("step_s"))[mask]
        elif name == "overlap_ratio":
            values = _ratio(self.column("overlap_s"), self.column("comm_s"))[mask]
        else:
            values = self.column(name)[mask]
        values = values[~np.isnan(values)]
        return float(np.median(values)) if len(values) else None


def _ratio(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    """top / bottom where bottom > 0, NaN elsewhere (StepOverlap's None)."""
    out = np.full(len(top), np.nan)
    with np.errstate(over="ignore"):  # a share of a nanosecond step: inf, as Python's division gives
        np.divide(top, bottom, out=out, where=bottom > 0)
    return out


# The summary fields summary_columns reads, integers (exact in int64, not in float64) and seconds.
_INTEGERS = ("step", "start_ns", "end_ns")
_SECONDS = ("comm_union_s", "comp_s", "overlap_s", "exposed_comm_s", "blocked_s")
_AGENT = operator.methodcaller("get", "agent", 0.0)  # of a summary's phase_s: StepOverlap.agent_s


def summary_columns(summaries: Sequence[StepSummary]) -> tuple[np.ndarray, np.ndarray]:
    """overlap_of_summary of every summary at once, as (steps, values) of a StepTable; the summaries
    must all have the overlap (has_overlap). A list of each field (step_column: of a StepRecords, no
    object made), then numpy: far cheaper than a getattr per field and step."""
    integers = np.array([step_column(summaries, name) for name in _INTEGERS], dtype=np.int64).reshape(3, -1)
    seconds = np.array([step_column(summaries, name) for name in _SECONDS], dtype=np.float64).reshape(5, -1)
    agent = np.fromiter(map(_AGENT, step_column(summaries, "phase_s")), np.float64, len(summaries))
    return _summary_values(integers, seconds, agent)


def _summary_values(integers: np.ndarray, seconds: np.ndarray, agent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """summary_columns of the columns: integers (step, start_ns, end_ns), seconds (_SECONDS), agent seconds."""
    comm, comp, overlap, exposed, blocked = seconds
    step_s = (integers[2] - integers[1]) / 1e9
    idle = np.maximum(0.0, step_s - (comm + comp - overlap))
    return integers[0].copy(), np.stack([step_s, comm, comp, overlap, exposed, idle, blocked, agent])


def step_table(rec: Recording) -> StepTable:
    """The rank's steps as step_overlaps gives them, each step summarized: from its collectives and
    phase spans where the recording kept them, from its summary's overlap where it kept none (both
    absent: the summary alone), in one pass of numpy over those. The summaries are read a field at a
    time (step_column): a StepRecords' 10,000 rows make no object, but for the steps with detail."""
    summaries = rec.steps
    n = len(summaries)
    order = np.argsort(np.array(step_column(summaries, "step"), dtype=np.int64).reshape(n), kind="stable")
    integers = np.array([step_column(summaries, name) for name in _INTEGERS], dtype=np.int64).reshape(3, n)[:, order]
    raw = [step_column(summaries, name) for name in _SECONDS]
    seconds = np.array(raw, dtype=np.float64).reshape(5, n)[:, order]  # None: NaN, where has_overlap is False
    steps = integers[0]
    detail = set(rec.collective_columns().step)
    detail.update(p.step for p in rec.phases)
    # has_overlap, a column at a time (a column without None, as recorded since format 1.1, in one C scan)
    overlap = np.logical_and.reduce([np.fromiter(map(operator.is_not, column, repeat(None)), bool, n)
                                     if None in column else np.ones(n, dtype=bool) for column in raw[1:]])[order]
    alone = ~np.isin(steps, np.fromiter(detail, np.int64, len(detail))) & overlap
    if not alone.any():
        return StepTable.of(rec.rank, step_overlaps(rec))
    values = np.empty((len(VALUE_COLUMNS), n))
    phases = step_column(summaries, "phase_s")
    agent = np.fromiter(map(_AGENT, map(phases.__getitem__, order[alone].tolist())), np.float64, int(alone.sum()))
    values[:, alone] = _summary_values(integers[:, alone], seconds[:, alone], agent)[1]
    kept = np.flatnonzero(~alone).tolist()
    if kept:
        by_step = [summaries[i] for i in order[kept].tolist()]
        values[:, kept] = StepTable.of(rec.rank, step_overlaps(rec, by_step)).values
    return StepTable(rec.rank, steps.copy(), values)
