"""The Ranks page as plain data: step time per rank and step (a rank × step matrix, binned past
MAX_STEP_COLUMNS by the slowest step of each bin so that a slow step stays visible), who waits for
whom, and each rank's memory peak against the median.

Who waits for whom comes from `zeromon report`'s analysis for a recording (collectives matched
across ranks: the wait each rank caused its peers and the wait it suffered, over the steps after the
first). Live and replayed data carry no report: there the page counts, per step every rank has
finished, which rank finished it last (step end times, one host clock per machine): an
approximation of the same question.
"""

from __future__ import annotations

import statistics
from operator import attrgetter

import numpy as np

from zeromon.analysis.stragglers import Imbalance
from zeromon.model.classes import frozen
from zeromon.views.fleet import rank_rows
from zeromon.views.run_data import RankHistory, RunData

MAX_STEP_COLUMNS = 2000  # past this many steps the matrix is binned: ~2000 columns is what a screen shows
WAIT_KINDS = ("straggler", "step_skew")  # the findings the waits speak for
MEMORY_KINDS = ("memory_imbalance",)


@frozen(eq=False)
class StepMatrix:
    """Step time of each rank (rows) in each step (columns). Unbinned, column j is step ``steps[j]``;
    binned, it holds ``bin_size`` consecutive columns and each cell shows its slowest step."""

    ranks: tuple[int, ...]
    steps: np.ndarray  # int64 per column: the recorded index of its (first) step; shown +1
    last_steps: np.ndarray  # int64 per column: the recorded index of its last step (= steps unbinned)
    step_ms: np.ndarray  # float32 (ranks, columns); NaN where the rank has no such step
    exposed_ms: np.ndarray  # float32, the exposed communication of the step shown; NaN where unknown
    shown_step: np.ndarray | None = None  # int64 (ranks, columns), binned only: the step each cell shows
    end_ns: np.ndarray | None = None  # int64 (ranks, columns), unbinned only: when each step ended; -1: none
    bin_size: int = 1
    total_steps: int = 0  # columns before binning

    @property
    def binned(self) -> bool:
        return self.bin_size > 1


def _report_exposed(data: RunData, rank: int) -> dict[int, float]:
    """The report's exposed communication by step, for a rank whose step summaries lack it."""
    if data.report is None:
        return {}
    report = next((r for r in data.report.ranks if r.rank == rank), None)
    return {s.step: s.exposed_comm_s for s in report.steps} if report is not None else {}


_STEP, _START, _END, _EXPOSED = (attrgetter("step"), attrgetter("start_ns"), attrgetter("end_ns"),
                                 attrgetter("exposed_comm_s"))


def _fill_row(data: RunData, history: RankHistory, cols: np.ndarray, matrix: StepMatrix, row: int) -> None:
    # Whole rows at a time (attrgetter over the summaries into numpy): a Python loop per summary
    # costs several times more on a large run.
    steps, n = history.steps, len(history.steps)
    ends = np.fromiter(map(_END, steps), np.int64, n)
    assert matrix.end_ns is not None
    matrix.end_ns[row, cols] = ends
    matrix.step_ms[row, cols] = (ends - np.fromiter(map(_START, steps), np.int64, n)) / 1e6
    exposed = list(map(_EXPOSED, steps))
    if None in exposed:  # an old recording's, or a step read through Prometheus: the report's, if any
        known = _report_exposed(data, history.rank)
        exposed = [v if v is not None else known.get(s.step) for s, v in zip(steps, exposed, strict=True)]
    matrix.exposed_ms[row, cols] = np.array(exposed, dtype=np.float64) * 1e3  # None -> NaN


def step_matrix(data: RunData) -> StepMatrix:
    """Every rank's step summaries (a recording's all; live, what the histories hold), by step (a
    step summarized twice: the later one)."""
    histories = [data.histories[r] for r in sorted(data.histories)]
    numbers = [np.fromiter(map(_STEP, h.steps), np.int64, len(h.steps)) for h in histories]
    steps = np.unique(np.concatenate(numbers)) if numbers else np.zeros(0, dtype=np.int64)
    shape = (len(histories), len(steps))
    matrix = StepMatrix(ranks=tuple(h.rank for h in histories), steps=steps, last_steps=steps,
                        step_ms=np.full(shape, np.nan, dtype=np.float32),
                        exposed_ms=np.full(shape, np.nan, dtype=np.float32),
                        end_ns=np.full(shape, -1, dtype=np.int64), total_steps=len(steps))
    for row, (history, own) in enumerate(zip(histories, numbers, strict=True)):
        if len(own):
            _fill_row(data, history, np.searchsorted(steps, own), matrix, row)
    return matrix


def binned(matrix: StepMatrix, max_columns: int = MAX_STEP_COLUMNS) -> StepMatrix:
    """At most ``max_columns`` columns: consecutive steps in bins, each cell its bin's slowest step
    (the max, not the mean: one slow step in a thousand is what the page is for)."""
    n = len(matrix.steps)
    if n <= max_columns:
        return matrix
    size = -(-n // max_columns)
    bins = -(-n // size)
    pad = bins * size - n
    rows = len(matrix.ranks)

    def padded(values: np.ndarray) -> np.ndarray:
        return np.pad(values, ((0, 0), (0, pad)), constant_values=np.nan).reshape(rows, bins, size)

    ms = padded(matrix.step_ms)
    slowest = np.where(np.isnan(ms), -np.inf, ms).argmax(axis=2)[..., None]
    step_ms = np.take_along_axis(ms, slowest, axis=2)[..., 0]  # NaN where the whole bin is
    exposed = np.take_along_axis(padded(matrix.exposed_ms), slowest, axis=2)[..., 0]
    steps = np.pad(matrix.steps, (0, pad), mode="edge").reshape(bins, size)
    shown = np.where(np.isnan(step_ms), -1, steps[np.arange(bins)[None, :], slowest[..., 0]])
    return StepMatrix(ranks=matrix.ranks, steps=steps[:, 0], last_steps=steps[:, -1], step_ms=step_ms,
                      exposed_ms=exposed, shown_step=shown.astype(np.int64), bin_size=size,
                      total_steps=matrix.total_steps)


def column_x(matrix: StepMatrix) -> np.ndarray:
    """Where each column is drawn, in steps from 1: its step, or its bin's middle."""
    return matrix.steps + (matrix.bin_size - 1) / 2 + 1


def cell_step(matrix: StepMatrix, rank: int, x: float) -> int | None:
    """The recorded step a cell drawn at (``x``, ``rank``) shows (a bin's slowest); None: no such cell."""
    if rank not in matrix.ranks or not len(matrix.steps):
        return None
    col = int(np.abs(column_x(matrix) - x).argmin())
    if matrix.shown_step is None:
        return int(matrix.steps[col]) if not np.isnan(matrix.step_ms[matrix.ranks.index(rank), col]) else None
    step = int(matrix.shown_step[matrix.ranks.index(rank), col])
    return step if step >= 0 else None


@frozen
class RankWaits:
    rank: int
    late: int  # collectives it issued last at (a recording), or steps it finished last (live)
    caused_wait_s: float | None = None  # its peers' wait for it (a recording)
    waited_s: float | None = None  # its wait for later peers (a recording)
    steps_most_waited_for: int | None = None  # steps in which its peers waited for it the most (a recording)


@frozen
class Waits:
    """Who waits for whom. ``measured``: from the report's matched collectives (a recording); else the
    live approximation from step end times."""

    measured: bool
    ranks: tuple[RankWaits, ...]
    compared: int  # matched collectives per rank (measured), or steps every rank finished (live)
    steps: int  # the steps judged: the steps after the first with matched collectives, or ``compared``


def report_waits(imbalance: Imbalance) -> Waits:
    """The report's arrivals over the steps after the first: the window its straggler findings judge."""
    ranks = tuple(RankWaits(rank=a.rank, late=a.steady_last_arrivals, caused_wait_s=a.steady_caused_wait_s,
                            waited_s=a.steady_waited_s, steps_most_waited_for=a.steps_most_waited_for)
                  for a in imbalance.ranks)
    matched = max((a.steady_matched for a in imbalance.ranks), default=0)
    return Waits(measured=True, ranks=ranks, compared=matched, steps=imbalance.steady_steps)


def last_to_finish(matrix: StepMatrix) -> Waits:
    """Per rank (with a step), the steps it finished last among the steps every such rank has
    finished (ties: the lower rank). In data-parallel training the rank that ends its step last is
    the one the others wait for. ``matrix``: unbinned (step_matrix's)."""
    assert matrix.end_ns is not None, "last_to_finish needs step_matrix's end times"
    reported = [bool(row.any()) for row in matrix.end_ns >= 0]
    ends = matrix.end_ns[np.array(reported, dtype=bool)]
    ranks = [r for r, keep in zip(matrix.ranks, reported, strict=True) if keep]
    complete = (ends >= 0).all(axis=0) if len(ranks) > 1 else np.zeros(ends.shape[1], dtype=bool)
    counts = np.bincount(ends[:, complete].argmax(axis=0), minlength=len(ranks)) if complete.any() else \
        np.zeros(len(ranks), dtype=np.int64)
    compared = int(complete.sum())
    return Waits(measured=False, ranks=tuple(RankWaits(rank=r, late=int(c)) for r, c in zip(ranks, counts, strict=True)),
                 compared=compared, steps=compared)


def waits(data: RunData, matrix: StepMatrix | None = None) -> Waits:
    """The report's waits for a recording; else the live approximation (from ``matrix``, made if not given)."""
    if data.report is not None:
        return report_waits(data.report.imbalance)
    return last_to_finish(matrix if matrix is not None and matrix.end_ns is not None else step_matrix(data))


@frozen
class MemoryPeaks:
    peaks: dict[int, int]  # rank -> its highest level, bytes
    level: str  # what was measured: "allocated" (the allocator, GPU) or "RSS" (the process, CPU)

    @property
    def median(self) -> float | None:
        return statistics.median(self.peaks.values()) if self.peaks else None


def _level_name(data: RunData) -> str:
    for history in data.histories.values():
        if history.memory:
            return "allocated" if history.memory[-1].allocated is not None else "RSS"
    return "allocated or RSS"


def memory_peaks(data: RunData) -> MemoryPeaks:
    """The peaks the memory_imbalance finding judges: the report's for a recording, else the rank
    rows' (the TUI's and the live findings')."""
    if data.report is not None:
        peaks = dict(data.report.imbalance.peak_memory)
    else:
        peaks = {row.rank: row.peak for row in rank_rows(data.fleet) if row.rank is not None and row.peak is not None}
    return MemoryPeaks(peaks=dict(sorted(peaks.items())), level=_level_name(data))
