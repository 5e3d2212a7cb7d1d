"""A restarted run's attempts, as its folder keeps them (stdlib only).

torchelastic (`torchrun --max-restarts N`) restarts every worker of a job when one fails, and the new
workers record into the same run folder. The last attempt keeps the usual rank-<r> names, so that every
reader reads it as it reads any run; each rank of a later attempt first moves its file of an earlier
attempt into ``attempts/<n>/`` (zeromon_agent.context.attempts), a run folder of its own that `zeromon report
RUN/attempts/<n>` reads. No reader of the run folder counts those files: rank files are looked for in the
folder itself, not below it. A rank file's header says which attempt wrote it (ATTEMPT_KEY).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.recording import read_file_header
from zeromon.model.run_end import FileEnd, read_file_ends
from zeromon.model.run_files import RunDirs, rank_file_paths, run_folders

ATTEMPTS_DIR = "attempts"  # inside a run folder
ATTEMPT_KEY = "attempt"  # in a rank file's header: torchelastic's restart count when the rank started
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # set by torchelastic in every worker: 0, then 1, ...


def attempt_of(environ: Mapping[str, str] | None = None) -> int | None:
    """The attempt this process belongs to under torchelastic; None outside it (or a value not a count)."""
    value = (os.environ if environ is None else environ).get(RESTART_COUNT_ENV, "")
    return int(value) if value.isdigit() else None


def attempt_folder(run_dir: str | Path, number: int) -> Path:
    return Path(run_dir) / ATTEMPTS_DIR / str(number)


def header_attempt(path: Path) -> int | None:
    """The attempt a rank file's header says wrote it; None: not said (not under torchelastic, an older
    zeromon) or a header that cannot be read."""
    try:
        value = read_file_header(path).get(ATTEMPT_KEY)
    except (OSError, ValueError, ZeromonError):
        return None
    return value if type(value) is int else None


@frozen
class EarlierAttempt:
    """An earlier attempt kept in a run's folders: its number, its folders (one per run folder that holds
    it) and the ends of its rank files (only their tails are read)."""

    number: int
    folders: tuple[Path, ...]
    file_ends: tuple[FileEnd, ...]


def earlier_attempts(run: RunDirs) -> list[EarlierAttempt]:
    """The earlier attempts a run's folders keep, by number; none for a run that never restarted."""
    found: dict[int, list[Path]] = {}
    for folder in run_folders(run):
        try:
            kept = sorted((folder / ATTEMPTS_DIR).iterdir()) if (folder / ATTEMPTS_DIR).is_dir() else []
        except OSError:
            continue
        for sub in kept:
            if sub.name.isdigit() and sub.is_dir() and rank_file_paths(sub):
                found.setdefault(int(sub.name), []).append(sub)
    return [EarlierAttempt(n, tuple(folders), tuple(read_file_ends([p for f in folders for p in rank_file_paths(f)])))
            for n, folders in sorted(found.items())]


@frozen
class RunAttempts:
    """What a run's folders say of its attempts: the earlier ones they keep, the attempt their own rank
    files are, and, where the folder read is itself an earlier attempt (RUN/attempts/0), whose."""

    earlier: tuple[EarlierAttempt, ...] = ()
    last: int | None = None
    attempt_in: tuple[Path, int] | None = None  # (the run folder, this attempt's number)
    # The run's own rank files of an earlier attempt than the last, (rank, attempt): a rank whose agent did
    # not start in the last attempt left its file of the one before in place.
    behind: tuple[tuple[int, int], ...] = ()


def read_attempts(run: RunDirs) -> RunAttempts:
    folders = run_folders(run)
    numbers = {rank_of_file(path): number for folder in folders for path in rank_file_paths(folder)
               if (number := header_attempt(path)) is not None}
    last = max(numbers.values(), default=None)
    return RunAttempts(tuple(earlier_attempts(run)), last, attempt_in(folders[0]) if len(folders) == 1 else None,
                       tuple(sorted((rank, n) for rank, n in numbers.items() if last is not None and n < last)))


def rank_of_file(path: Path) -> int:
    """The rank a rank file's name says (rank-3.zmr: 3); -1 for another name."""
    number = path.name.removeprefix("rank-").split(".")[0]
    return int(number) if number.isdigit() else -1


def attempt_in(folder: str | Path) -> tuple[Path, int] | None:
    """(the run folder, the attempt's number) where ``folder`` is an earlier attempt kept in a run folder
    (RUN/attempts/0); None otherwise."""
    folder = Path(folder)
    if folder.parent.name == ATTEMPTS_DIR and folder.name.isdigit():
        return folder.parent.parent, int(folder.name)
    return None
