"""A run's files: the rank files of its folder (or of its folders, one per node), checked to be one run's,
and read."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError
from zeromon.model.events import RunInfo
from zeromon.model.kinds import RANK_FILE_SUFFIXES, rank_file_name
from zeromon.model.rank_pool import map_rank_files
from zeromon.model.recording import Recording, read_file_header, read_recording
from zeromon.model.units import rank_ranges


def rank_file_paths(folder: Path) -> list[Path]:
    """The rank-<r>.zmr and rank-<r>.jsonl files of a folder, sorted by name."""
    return sorted(path for suffix in RANK_FILE_SUFFIXES for path in folder.glob(f"rank-*{suffix}"))


def rank_file_path(folder: str | Path, rank: int) -> Path:
    """Where a rank's file is in a folder: its .zmr if there is one, else its .jsonl."""
    compact = Path(folder) / rank_file_name(rank, ".zmr")
    return compact if compact.exists() else Path(folder) / rank_file_name(rank)



def _rank_in_name(path: Path) -> int | None:
    """r of a file named rank-<r>.zmr or rank-<r>.jsonl; None for another name the folder's glob matched."""
    number = path.name.removeprefix("rank-").removesuffix(path.suffix)
    return int(number) if number.isdigit() else None


# A run: the folder its ranks recorded in (the --out of `zeromon run`), or its folders, one per node
# where each node's launcher wrote its own ranks to a disk of its own.
RunDirs = str | Path | Sequence[str | Path]


def run_folders(run: RunDirs) -> list[Path]:
    """The folders of a run, in the order given, each once (a folder named twice, by a glob and by
    name, is read once)."""
    if isinstance(run, (str, Path)):
        return [Path(run)]
    folders: dict[Path, Path] = {}
    for folder in map(Path, run):
        folders.setdefault(folder.resolve(), folder)
    return list(folders.values())


def run_name(run: RunDirs) -> str:
    """The run in a report's words: its folder, or its folders joined by '+'."""
    return " + ".join(map(str, run_folders(run)))


def run_headers(run: RunDirs) -> list[tuple[Path, dict[str, Any]]]:
    """Each rank file of a run's folder (or folders) with its header, checked to be one run's
    (check_one_run): an error naming the folder when it is not one or holds no rank file. Only the
    first line of each file is read."""
    headers = [item for folder in run_folders(run) for item in _folder_headers(folder)]
    check_one_run([(path, header, None) for path, header in headers], by_run_id=False)  # the readers compare it
    return headers


def _folder_headers(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    if run_dir.is_file():
        raise ZeromonError(f"{run_dir}: is a file; a run is the folder of rank-<r>.zmr (or .jsonl) files",
                           hint=f"pass the folder that holds it: {run_dir.parent}")
    if not run_dir.is_dir():
        raise ZeromonError(f"{run_dir}: no such run folder")
    files = rank_file_paths(run_dir)
    if not files:
        traces = [*run_dir.glob("*.json"), *run_dir.glob("*.json.gz")]  # PyTorch profiler traces, likely
        raise ZeromonError(
            f"{run_dir}: no rank-<r>.zmr (or .jsonl) recordings in this folder"
            + (f"; it holds {len(traces)} .json/.json.gz file{'s' if len(traces) != 1 else ''}, profiler "
               "traces?" if traces else ""),
            hint=f"for PyTorch profiler traces: zeromon report --trace {shlex.quote(str(run_dir))}" if traces
            else "record a run with `zeromon run --out DIR -- CMD ...`",
        )
    return [(path, read_file_header(path)) for path in files]


def missing_ranks_note(headers: Sequence[tuple[Path, dict[str, Any]]]) -> str | None:
    """What the run's headers say of ranks without a file, and where the others are: "rank 1 missing:
    world size 2, 1 rank found in node0 (rank 0); is a node's folder missing?"; None when none is
    missing or the headers give no world size (files of an older format or written by hand)."""
    worlds: list[int] = [h["world_size"] for _, h in headers if type(h.get("world_size")) is int]
    by_folder: dict[Path, list[int]] = {}
    for path, header in headers:
        if type(header.get("rank")) is int:
            by_folder.setdefault(path.parent, []).append(header["rank"])
    found = {rank for ranks in by_folder.values() for rank in ranks}
    missing = sorted(set(range(max(worlds))) - found) if worlds else []
    if not missing:
        return None
    where = " and ".join(f"{folder} ({rank_ranges(ranks)})" for folder, ranks in by_folder.items())
    return (f"{rank_ranges(missing)} missing: world size {max(worlds)}, {len(found)} rank"
            f"{'s' if len(found) != 1 else ''} found in {where}; is a node's folder missing?")


def rank_files(run: RunDirs) -> list[Path]:
    """The rank files of a run's folder (or folders), checked to be one run's (run_headers)."""
    return [path for path, _ in run_headers(run)]


# What makes rank files one run's: each a value in the header (written by the agent at start) or in
# the run's RunInfo. A value missing from a file (an older or hand-made one) is not compared.
# run_id: one value for every rank of a job, however many launchers (nodes) started them (the agent
# agrees on it through the job's rendezvous store: zeromon_agent.agent.shared_run_id). Compared after
# the others, over all files: "framework 'fsdp2' and 'none'" tells a user more than two random ids.
_IDENTITY = (("job", "job"), ("world_size", "world size"), ("framework", "framework"), ("run_id", "run id"))
_DIFFERENT_RUNS_HINT = ("a run folder holds the rank files of one run (the --out of one `zeromon run`): "
                        "move the other run's files to a folder of their own")
_DIFFERENT_RUNS_HINT_FOLDERS = ("give the folders of one run: each node's --out of the same job (one "
                                "`zeromon run` per node)")
_RANK_TWICE_HINT_FOLDERS = ("each node's folder holds its own ranks: was a folder given twice under two names, "
                            "or a rank file copied into another node's folder?")


def _identity(header: dict[str, Any], info: RunInfo | None) -> dict[str, Any]:
    values = {key: header.get(key) for key, _ in _IDENTITY}
    if info is not None:
        values["job"] = values["job"] or info.job
        values["world_size"] = values["world_size"] or info.world_size
        # "unknown": not yet detected (a rank that stopped early), so it tells runs apart by nothing.
        values["framework"] = info.framework if info.framework != "unknown" else None
    return values


def check_one_run(files: Sequence[tuple[Path, dict[str, Any], RunInfo | None]], by_run_id: bool = True) -> None:
    """Refuse rank files that are not one run's, naming them: a header's rank that is not the one
    in the file's name (a copied or renamed file), two files of one rank, or a job, world size,
    framework or run id that differs between files (two runs' files in one folder, or folders of two
    runs). Every analysis would otherwise match one run's collectives against another's and report
    stragglers that are not.

    ``files``: each file with its header and, where read, its RunInfo (None: the header alone); they may
    be in several folders (one per node), which the hints then speak of. ``by_run_id`` False: the run
    id is not compared (a check of the headers alone, before the RunInfo that may name a difference
    in the user's words)."""
    several = len({path.parent for path, _, _ in files}) > 1
    by_rank: dict[int, Path] = {}
    for path, header, _ in files:
        rank = header.get("rank")
        named = _rank_in_name(path)
        if named is not None and rank is not None and rank != named:
            raise ZeromonError(f"{path}: the header says rank {rank}, the file name rank {named}",
                               hint="a rank file keeps the name `zeromon run` gave it: was it copied or renamed?")
        if isinstance(rank, int):
            if rank in by_rank:
                raise ZeromonError(f"{by_rank[rank]} and {path} are both rank {rank}",
                                   hint=_RANK_TWICE_HINT_FOLDERS if several
                                   else "keep one recording per rank in a run folder (several runs mixed?)")
            by_rank[rank] = path
    identities = [(path, _identity(header, info)) for path, header, info in files]
    for key, label in _IDENTITY if by_run_id else _IDENTITY[:-1]:  # a key over all files, then the next
        first_seen: tuple[Path, Any] | None = None
        for path, values in identities:
            value = values[key]
            if value is None:
                continue
            if first_seen is None:
                first_seen = (path, value)
            elif first_seen[1] != value:
                raise ZeromonError(f"{first_seen[0]} and {path} are from different runs: {label} {first_seen[1]!r} "
                                   f"and {value!r}", hint=_DIFFERENT_RUNS_HINT_FOLDERS if several else _DIFFERENT_RUNS_HINT)


def read_run(run: RunDirs, progress: Callable[[int, int], None] | None = None) -> list[Recording]:
    """Read every rank file of a run's folder (or folders), ordered by rank; an error when they are not
    one run's. ``progress``: told (files read, files in all) as each is read."""
    recordings = map_rank_files(rank_files(run), read_recording, workers=1, progress=progress)  # in this process: kept here
    check_one_run([(r.path, r.header, r.run_info) for r in recordings])
    return sorted(recordings, key=lambda r: r.rank)
