"""A rank restarted by torchelastic keeps its earlier attempt's recording (zeromon.model.attempts).

Under `torchrun --max-restarts N` a restarted worker records to the same rank-<r> file as the worker it
replaces; before it opens that file, start_attempt moves the earlier attempt's file into
``attempts/<n>/`` of the run folder, and the new file's header says which attempt wrote it. Rank 0 also
moves the files of ranks this attempt no longer has (an elastic job that shrank). Each rank moves only
its own file (and rank 0 those of ranks that are gone), so that no two ranks race for one file; the
launcher starts no worker of the next attempt before every worker of the last has ended, so no file moved
is still written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from zeromon.model.attempts import ATTEMPT_KEY, attempt_folder, attempt_of, header_attempt, rank_of_file
from zeromon.model.kinds import RANK_FILE_SUFFIXES, rank_file_name
from zeromon.model.run_files import rank_file_paths

log = logging.getLogger("zeromon.agent")


def start_attempt(run_dir: Path, rank: int, world_size: int,
                  environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """This rank's attempt as header keys ({"attempt": 1}; none outside torchelastic), once the files of
    earlier attempts it replaces are set aside. Never raises: a file that cannot be moved is replaced, as
    it was before attempts were kept, and the log says so."""
    attempt = attempt_of(environ)
    if attempt is None:
        return {}
    if attempt > 0:
        try:
            for path in _replaced(run_dir, rank, world_size):
                _set_aside(path, attempt)
        except Exception as exc:  # noqa: BLE001 - zeromon must never be the reason a run dies
            log.warning("zeromon: rank %d: the earlier attempt's recording could not be kept: %s", rank, exc)
    return {ATTEMPT_KEY: attempt}


def _replaced(run_dir: Path, rank: int, world_size: int) -> list[Path]:
    """The files this rank's start replaces: its own, and for rank 0 those of ranks past the world size."""
    own = [run_dir / rank_file_name(rank, suffix) for suffix in RANK_FILE_SUFFIXES]
    gone = [path for path in rank_file_paths(run_dir) if rank_of_file(path) >= world_size] if rank == 0 else []
    return [path for path in own + gone if path.exists()]


def _set_aside(path: Path, attempt: int) -> None:
    """Move an earlier attempt's file to attempts/<its attempt>/ (a header that does not say: the one
    before this); a file this attempt wrote (an agent started again in one process) stays."""
    earlier = header_attempt(path)
    if earlier is not None and earlier >= attempt:
        return
    folder = attempt_folder(path.parent, earlier if earlier is not None else attempt - 1)
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(path, folder / path.name)
