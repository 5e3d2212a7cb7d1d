"""`zeromon summary RUN_DIR`: what a recorded run holds, per rank."""

from __future__ import annotations

import argparse
from pathlib import Path

NAME = "summary"
HELP = "summarize a recorded run folder"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.recording_summary import format_summary, summarize_run

    print(format_summary(summarize_run(Path(args.run_dir))))
    return 0
