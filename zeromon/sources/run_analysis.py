"""A run's folder (or its folders, one per node) analysed as `zeromon report` does: each rank read and analysed in a worker process,
the analyses combined here. The report command, the dashboard and the tests read runs through it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeromon.analysis.hang import last_report
from zeromon.analysis.report import RankAnalysis, RunReport
from zeromon.model.codec import Recording, RunDirs
from zeromon.model.progress import RankProgress
from zeromon.model.rank_pool import OnProgress, map_rank_files, read_rank_file
from zeromon.model.run_end import FileEnd, recording_end

# What a caller keeps of each rank's recording beside its analysis (a module-level function: it
# goes to the worker processes by name).
Keep = Callable[[Recording], Any]


def analyse_run(run_dir: RunDirs, peak_busbw: float | None = None, capacity_bytes: int | None = None,
                workers: int | None = None, progress: OnProgress | None = None) -> RunReport:
    """build_report(read_run(run_dir)), faster: each rank file is read and analysed in a worker
    process, ``workers`` at once (default: one per CPU, at most one per rank; 1: all in this
    process), and only the ranks' analyses come back, to be combined here. A large rank's read and
    analysis keep a core busy for seconds, and what comes back is far smaller than what was read."""
    return analyse_and_keep(run_dir, None, peak_busbw, capacity_bytes, workers, progress)[0]


def analyse_and_keep(run_dir: RunDirs, keep: Keep | None, peak_busbw: float | None = None,
                     capacity_bytes: int | None = None, workers: int | None = None,
                     progress: OnProgress | None = None,
                     on_kept: Callable[[Any], Any] | None = None) -> tuple[RunReport, list[Any]]:
    """analyse_run's report, and ``keep(recording)`` of each rank (by rank), made by the worker that
    read the recording: one read of each file serves both (the dashboard keeps each rank's history).
    ``on_kept``: each rank's kept value handed to it as its worker finishes; what it returns is held
    in its place: the dashboard's loader sends each rank's history on at once and holds none."""
    from zeromon.analysis.report import combine_report
    from zeromon.model.codec import check_one_run, run_headers, run_name

    headers = run_headers(run_dir)  # the files' headers checked here; their RunInfo once analysed
    hand_on = None if on_kept is None else (lambda done: (done[0], on_kept(done[1])))
    done = map_rank_files([path for path, _ in headers], functools.partial(_analyse_file, capacity_bytes=capacity_bytes,
                                                                           keep=keep),
                          workers, progress, doing="analysing", on_result=hand_on)
    check_one_run([(path, header, rank.run_info) for (path, header), (rank, _) in zip(headers, done, strict=True)])
    done.sort(key=lambda pair: pair[0].report.rank)  # as read_run orders the recordings
    return combine_report([rank for rank, _ in done], run_name(run_dir), peak_busbw), [kept for _, kept in done]


def _analyse_file(path: Path, capacity_bytes: int | None, keep: Keep | None) -> tuple[RankAnalysis, Any]:
    from zeromon.analysis.report import analyze_rank

    recording = read_rank_file(path)  # ``keep`` gets its summaries as rows too
    return analyze_rank(recording, capacity_bytes), keep(recording) if keep is not None else None


def rank_ending(recording: Recording) -> tuple[int, FileEnd | None, RankProgress | None]:
    """What `zeromon report` keeps of each rank beside its analysis (a worker's part): its file's end and its last
    progress report (where it stalled, or where a signal found it)."""
    return recording.rank, recording_end(recording), last_report(recording.progress)
