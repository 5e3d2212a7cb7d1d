"""`zeromon export RUN_DIR [--out DIR | -] [--format jsonl|parquet]`: a run's recording as format 1.4 JSON lines,
for grep and jq, or as Parquet datasets (zeromon.exporters.parquet), for DuckDB, Polars and Spark."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zeromon.model.codec import RunDirs

NAME = "export"
FORMATS = ("jsonl", "parquet")
PARQUET_INSTALL = "pip install 'zeromon[parquet]'"  # zeromon.exporters.parquet.INSTALL, without importing it
HELP = "write a recorded run as JSON lines (format 1.4) or as Parquet datasets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("A recorded run's rank files (the compact rank-<r>.zmr that the agent writes, or "
                          "rank-<r>.jsonl) as format 1.4 JSON lines: the exact lines the JSON-lines writer "
                          "(ZEROMON_FORMAT=jsonl) would have written, a header line then a JSON array per record; "
                          "or, with --format parquet, as Parquet datasets in --out DIR, one per record kind, "
                          "partitioned by rank (DIR/collectives/rank=3/part-0.parquet; docs/parquet.md). "
                          "Records skipped as corrupt are left out and said on stderr. 2 for bad input.")
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="+",
                        help="a run folder written by `zeromon run --out RUN_DIR`, or several folders of one run "
                             "(each node's --out, or a quoted glob such as 'runs/job/node*')")
    parser.add_argument("--out", metavar="DIR", default="-",
                        help="write rank-<r>.jsonl files into this folder (made if missing; not the run's own "
                             "folder, and no rank file there is overwritten); '-', the default: every rank's "
                             "lines to stdout, rank by rank; with --format parquet, the folder of the datasets "
                             "(made if missing; none of its datasets' folders may exist)")
    parser.add_argument("--format", choices=FORMATS, default="jsonl",
                        help="jsonl (the default): format 1.4 JSON lines; parquet: a dataset per record kind, "
                             f"partitioned by rank, for DuckDB, Polars or Spark (needs pyarrow: {PARQUET_INSTALL})")


def run(args: argparse.Namespace) -> int:
    from zeromon.commands.progress import Progress
    from zeromon.commands.source_flags import run_folder_words
    from zeromon.errors import ZeromonError
    from zeromon.model.codec import rank_file_name, run_folders, run_headers

    run = run_folder_words(args.run_dir, "RUN_DIR")
    if args.format == "parquet":
        return _export_parquet(run, args.out)
    headers = run_headers(run)  # one run's files, checked; an error naming the folder otherwise
    files = [path for path, _ in headers]
    out = None if args.out == "-" else Path(args.out)
    targets: list[Path | None] = [None] * len(files)
    if out is not None:
        if out.exists() and not out.is_dir():
            raise ZeromonError(f"--out {out}: a file, not a folder")
        if out.exists() and any(out.resolve() == folder.resolve() for folder in run_folders(run)):
            raise ZeromonError(f"--out {out}: the run's own folder; its rank files would be read twice",
                               hint="give another folder, e.g. --out exported")
        named = [out / (rank_file_name(header["rank"]) if type(header.get("rank")) is int else f"{path.stem}.jsonl")
                 for path, header in headers]
        existing = [str(target) for target in named if target.exists()]
        if existing:
            raise ZeromonError(f"--out {out}: {existing[0]} exists (nothing is overwritten)",
                               hint="give an empty or new folder")
        targets = list(named)
    with Progress("rank files exported") as progress:  # on stderr: stdout may be the lines
        for done, (path, target) in enumerate(zip(files, targets, strict=True), 1):
            _export_file(path, target)
            progress(done, len(files))
    return 0


def _export_file(path: Path, target: Path | None) -> None:
    """One rank file's lines into ``target`` (None: stdout); its records skipped as corrupt said on stderr."""
    from zeromon.analysis.recording_summary import corrupt_lines_note
    from zeromon.errors import ZeromonError
    from zeromon.model.recording import export_lines

    corrupt: list[int] = []
    errors: dict[int, str] = {}
    try:
        if target is None:
            sys.stdout.buffer.writelines(export_lines(path, corrupt, errors))
            sys.stdout.buffer.flush()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "wb") as handle:
                handle.writelines(export_lines(path, corrupt, errors))
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            raise
        raise ZeromonError(f"{exc.filename or target or 'stdout'}: cannot write: {exc.strerror or exc}") from None
    if corrupt:
        print(f"zeromon: warning: {corrupt_lines_note(str(path), corrupt, errors=errors)}", file=sys.stderr)


def _export_parquet(run: RunDirs, out_word: str) -> int:
    """The run as Parquet datasets in ``out_word``; what was written on stdout, what was skipped on stderr."""
    from zeromon.analysis.recording_summary import corrupt_lines_note, counted
    from zeromon.commands.progress import Progress
    from zeromon.errors import ZeromonError
    from zeromon.exporters.parquet import export_run
    from zeromon.model.codec import run_folders

    if out_word == "-":
        raise ZeromonError("--format parquet writes a folder of datasets, not stdout: give --out DIR",
                           hint="e.g. zeromon export RUN_DIR --format parquet --out run-parquet")
    out = Path(out_word)
    if out.exists() and not out.is_dir():
        raise ZeromonError(f"--out {out}: a file, not a folder")
    if out.exists() and any(out.resolve() == folder.resolve() for folder in run_folders(run)):
        raise ZeromonError(f"--out {out}: the run's own folder; its datasets would sit among its rank files",
                           hint="give another folder, e.g. --out exported")
    with Progress("rank files exported") as progress:
        done = export_run(run, out, progress=progress)
    for rank in (*done.ranks, *(r for ranks in done.attempts.values() for r in ranks)):
        if rank.skipped:
            note = corrupt_lines_note(rank.source, rank.skipped, errors=rank.reasons)
            print(f"zeromon: warning: {note}", file=sys.stderr)
    rows: dict[str, int] = {}
    for rank in done.ranks:
        for name, count in rank.rows.items():
            rows[name] = rows.get(name, 0) + count
    rows_said = ", ".join(f"{name} {count:,}" for name, count in rows.items())
    print(f"zeromon: {counted(len(done.ranks), 'rank file')} exported to {out} as Parquet ({rows_said} rows)")
    for number, ranks in done.attempts.items():
        print(f"zeromon: attempt {number}, before the run restarted: {counted(len(ranks), 'rank file')} exported to "
              f"{out / 'attempts' / str(number)}")
    return 0
