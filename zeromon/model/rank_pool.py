"""A run's rank files read in worker processes, one file at a time each: what `zeromon report` and
`zeromon summary` do with each rank (and the dashboard, through the report's analysis).

Each worker reads a rank file, makes what the caller asked of it (an analysis, a summary) and sends that
back; the records read never leave the worker. A large run's records would not fit in one process's
memory, where its per-rank results are small.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from zeromon.errors import ZeromonError
from zeromon.model.recording import read_recording
from zeromon.model.rows import collector_paused

if TYPE_CHECKING:
    from zeromon.model.recording import Recording

T = TypeVar("T")
# Told (ranks done, ranks in all) as each rank's result comes back: a command's progress bar.
OnProgress = Callable[[int, int], None]


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what this process may run on, in a container too
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def in_two_passes(progress: OnProgress | None) -> tuple[OnProgress, OnProgress]:
    """``progress`` told of two passes over the same files as of one: the first pass's (done, total) as
    (done, 2 total), the second's as (total + done, 2 total)."""
    tell = progress or (lambda done, total: None)
    return (lambda done, total: tell(done, 2 * total)), (lambda done, total: tell(total + done, 2 * total))


def map_rank_files(files: list[Path], per_file: Callable[[Path], T], workers: int | None = None,
                   progress: OnProgress | None = None, doing: str = "reading",
                   on_result: Callable[[T], T] | None = None) -> list[T]:
    """``per_file(path)`` of each of ``files``, in their order: ``workers`` processes at once (default: one
    per CPU, at most one per file; 1: all in this process). ``per_file`` goes to the workers by name (a
    module-level function, or a functools.partial of one); a ZeromonError it raises is raised here.
    ``doing``: what the workers do, for the message when one dies ("analysing"). ``on_result``: called
    here with each result as it comes back (in the order they finish); what it returns is kept instead, so
    that a caller that hands part of a result on at once (the dashboard's loader) does not hold it."""
    tell = progress or (lambda done, total: None)
    keep = on_result or (lambda result: result)
    workers = min(len(files), workers or usable_cpus())
    if workers <= 1:
        return _here(files, per_file, tell, keep)
    return _in_processes(files, per_file, workers, tell, doing, keep)


def _here(files: list[Path], per_file: Callable[[Path], T], tell: OnProgress, keep: Callable[[T], T]) -> list[T]:
    done = []
    for path in files:
        done.append(keep(per_file(path)))
        tell(len(done), len(files))
    return done


def _in_processes(files: list[Path], per_file: Callable[[Path], T], workers: int, tell: OnProgress,
                  doing: str, keep: Callable[[T], T]) -> list[T]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    # fork: the workers start at once, zeromon imported. forkserver and spawn re-run the caller's
    # __main__ script in every worker (and fail where it is not a file: `python -`); their one
    # advantage, safety for a caller with threads, does not apply to these single-threaded commands.
    try:
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    except (OSError, ValueError, NotImplementedError):  # no fork or no semaphores (some sandboxes)
        return _here(files, per_file, tell, keep)
    with pool:
        # Each future dropped once its result is taken (as_completed drops its own): a result is held here
        # as ``keep`` leaves it, not as it came.
        index = {pool.submit(per_file, path): i for i, path in enumerate(files)}
        results: list[Any] = [None] * len(files)
        try:
            # The collector paused while the pool's thread unpickles the results (~2M objects a rank's analysis).
            # A worker's ZeromonError (a bad file) comes back pickled, message and hint, and is raised here.
            with collector_paused():
                for done, future in enumerate(as_completed(list(index)), 1):
                    results[index.pop(future)] = keep(future.result())  # a worker's error raised as it comes
                    tell(done, len(files))
                return results
        except BrokenProcessPool:
            raise ZeromonError(f"{files[0].parent}: a worker process {doing} the rank files died (killed, or "
                               "out of memory)",
                               hint="read fewer ranks at once: move some rank files to a folder of their "
                                    "own") from None


def read_rank_file(path: Path) -> Recording:
    """A worker's read of one rank file: its step summaries as rows (a StepRecords), which the analyses
    and summaries read a field at a time; a file that cannot be read is a ZeromonError naming it."""

    try:
        return read_recording(path, steps_as_rows=True)
    except OSError as exc:
        raise ZeromonError(f"{path}: cannot read recording: {exc.strerror}") from None
