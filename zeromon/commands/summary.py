"""`zeromon summary RUN_DIR ...`: what a recorded run holds, per rank."""

from __future__ import annotations

import argparse

NAME = "summary"
HELP = "summarize a recorded run folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("A first look at a recorded run: per rank, the framework and sharding, steps and their "
                          "median time, exposed communication (the step time communication costs), the collectives "
                          "recorded, peak memory and the bytes each step moves by ZeRO meaning; then dropped events, "
                          "corrupt lines and the agent's notes; and how each rank ended (the first to die first) and, for a run "
                          "torchelastic restarted, when and why. `zeromon report` gives the whole analysis. "
                          "Exit status 3 (after printing everything) when a rank died (a signal, an exception, "
                          "or no end record) or its recording is incomplete; 2 for bad input.")
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="+",
                        help="a run folder written by `zeromon run --out RUN_DIR` (its rank-<r>.zmr or .jsonl files), or "
                             "several folders of one run (each node's --out, or a quoted glob such as "
                             "'runs/job/node*'): read as one run")
    parser.add_argument("--all-ranks", action="store_true",
                        help="a line for every rank; past 16 ranks the table shows the ranks furthest from the median "
                             "of every rank and a line for the rest")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.rank_ends import exit_status
    from zeromon.analysis.recording_summary import format_summary, summarize_run
    from zeromon.commands.progress import Progress
    from zeromon.commands.source_flags import run_folder_words, say_missing_ranks

    run = run_folder_words(args.run_dir, "RUN_DIR")
    say_missing_ranks(run)  # the folders checked to be one run's; a node's folder left out, named
    with Progress("ranks read and summarized") as progress:
        summary = summarize_run(run, progress=progress)
    print(format_summary(summary, args.all_ranks))
    return exit_status(summary.ends)  # 3: a rank died or its recording is incomplete (said above)
