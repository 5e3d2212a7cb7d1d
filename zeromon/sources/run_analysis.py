"""A run's folder (or its folders, one per node) analysed as `zeromon report` does: each rank read and analysed in a worker process,
the analyses combined here. The report command, the dashboard and the tests read runs through it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeromon.analysis.report import RankAnalysis, RunReport
from zeromon.errors import ZeromonError
from zeromon.model.codec import Recording, RunDirs

# What a caller keeps of each rank's recording beside its analysis (a module-level function: it
# goes to the worker processes by name).
Keep = Callable[[Recording], Any]
# Told (ranks done, ranks in all) as each rank's analysis comes back: a command's progress bar.
OnProgress = Callable[[int, int], None]


def analyse_run(run_dir: RunDirs, peak_busbw: float | None = None, capacity_bytes: int | None = None,
                workers: int | None = None, progress: OnProgress | None = None) -> RunReport:
    """build_report(read_run(run_dir)), faster: each rank file is read and analysed in a worker
    process, ``workers`` at once (default: one per CPU, at most one per rank; 1: all in this
    process), and only the ranks' analyses come back, to be combined here. A rank of half a million
    collectives takes ~2.5 s of one core to read and analyse, and sends back ~20 MB."""
    return analyse_and_keep(run_dir, None, peak_busbw, capacity_bytes, workers, progress)[0]


def analyse_and_keep(run_dir: RunDirs, keep: Keep | None, peak_busbw: float | None = None,
                     capacity_bytes: int | None = None, workers: int | None = None,
                     progress: OnProgress | None = None) -> tuple[RunReport, list[Any]]:
    """analyse_run's report, and ``keep(recording)`` of each rank (by rank), made by the worker that
    read the recording: one read of each file serves both (the dashboard keeps each rank's history)."""
    from zeromon.analysis.report import combine_report
    from zeromon.model.codec import check_one_run, run_headers, run_name

    headers = run_headers(run_dir)  # the files' headers checked here; their RunInfo once analysed
    files = [path for path, _ in headers]
    workers = min(len(files), workers or _usable_cpus())
    tell = progress or (lambda done, total: None)
    if workers <= 1:
        done = _analyse_here(files, capacity_bytes, keep, tell)
    else:
        done = _analyse_in_processes(files, capacity_bytes, workers, keep, tell)
    check_one_run([(path, header, rank.run_info) for (path, header), (rank, _) in zip(headers, done, strict=True)])
    done.sort(key=lambda pair: pair[0].report.rank)  # as read_run orders the recordings
    return combine_report([rank for rank, _ in done], run_name(run_dir), peak_busbw), [kept for _, kept in done]


def _analyse_here(files: list[Path], capacity_bytes: int | None, keep: Keep | None,
                  tell: OnProgress) -> list[tuple[RankAnalysis, Any]]:
    done = []
    for path in files:
        done.append(_analyse_file(path, capacity_bytes, keep))
        tell(len(done), len(files))
    return done


def _analyse_in_processes(files: list[Path], capacity_bytes: int | None, workers: int,
                          keep: Keep | None, tell: OnProgress) -> list[tuple[RankAnalysis, Any]]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    from zeromon.model.codec import collector_paused

    # fork: the workers start at once, zeromon imported. forkserver and spawn re-run the caller's
    # __main__ script in every worker (and fail where it is not a file: `python -`); their one
    # advantage, safety for a caller with threads, does not apply to this single-threaded command.
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    except (OSError, ValueError, NotImplementedError):  # no fork or no semaphores (some sandboxes)
        return _analyse_here(files, capacity_bytes, keep, tell)
    with pool:
        futures = [pool.submit(_analyse_file, path, capacity_bytes, keep) for path in files]
        try:
            # The collector paused while the pool's thread unpickles the analyses (~2M objects a rank).
            # A worker's ZeromonError (a bad file) comes back pickled, message and hint, and is raised here.
            with collector_paused():
                for done, future in enumerate(as_completed(futures), 1):
                    future.result()  # a worker's error raised as it comes
                    tell(done, len(futures))
                return [future.result() for future in futures]
        except BrokenProcessPool:
            raise ZeromonError(f"{files[0].parent}: a worker process analysing the rank files died (killed, or "
                               "out of memory)",
                               hint="analyse fewer ranks at once: move some rank files to a folder of their "
                                    "own") from None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on, in a container too
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _analyse_file(path: Path, capacity_bytes: int | None, keep: Keep | None) -> tuple[RankAnalysis, Any]:
    from zeromon.analysis.report import analyze_rank
    from zeromon.model.codec import read_recording

    try:
        # The summaries as rows (a StepRecords): the analyses read them a field at a time; ``keep`` gets them so too.
        recording = read_recording(path, steps_as_rows=True)
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot read recording: {exc.strerror}") from None
    return analyze_rank(recording, capacity_bytes), keep(recording) if keep is not None else None
