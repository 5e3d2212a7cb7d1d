"""`zeromon whatif RUN_DIR CHANGE [CHANGE ...] [--json]`: what a change would do to the run's step time and
peak memory, predicted from its own recording, beside the replay's error."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from zeromon.errors import ZeromonError
from zeromon.model.numbers import CAPACITY, flag
from zeromon.model.units import format_bytes

if TYPE_CHECKING:
    from zeromon.analysis.whatif import Figures, WhatIf

NAME = "whatif"
HELP = ("predict what a change (resharding, ZeRO stage, overlap, bandwidth, micro-batch, accumulation, world size) "
        "does to step time and peak memory")

_CHANGES_HELP = ("reshard_after_forward=false|true (FSDP2), sharding_strategy=SHARD_GRAD_OP|FULL_SHARD (FSDP1), "
                 "zero_stage=1|2 (DeepSpeed, from the other), comm=hidden (every collective overlapped: the step's "
                 "lower bound), bandwidth=xK (a K times faster network), micro_batch=xK (K times the micro-batch), "
                 "grad_accum=N (N micro-batches a step), world_size=N (N ranks at the same per-rank batch); several "
                 "apply together")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Replays a recorded run (or a live run's recording so far) through a model of its ranks: "
                          "each rank's compute as measured, coupled to its peers at every collective, the collectives' "
                          "times fitted from the same recording. Prints the run as measured, the unchanged run "
                          "replayed (its error says how far the model is from the run) and the run with the "
                          "changes, as a step's time (compute, transfer, waiting for peers) and the peak of the "
                          "tracked memory categories. Refuses, saying why, what one recording cannot support. "
                          "docs/whatif.md. Exit status 2 for bad input or a refusal.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run folder written by `zeromon run --out RUN_DIR`")
    parser.add_argument("changes", metavar="CHANGE", nargs="+",
                        help=f"{_CHANGES_HELP}. A word without '=' is another folder of the same run (each node's "
                             "--out)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object: measured, replay (with error_pct), predicted, assumptions, "
                             "validated_error_pct")
    parser.add_argument("--capacity", metavar="SIZE", type=flag("--capacity", CAPACITY),
                        help=f"memory capacity per rank to hold the peak against ({CAPACITY.accepts}); the "
                             "recording's own by default")


def run(args: argparse.Namespace) -> int:
    from zeromon.commands.source_flags import run_folder_words
    from zeromon.views.whatif import what_if_of_run

    folders = [args.run_dir, *(word for word in args.changes if "=" not in word)]
    run_dir = run_folder_words(folders, "RUN_DIR")
    try:
        answer = what_if_of_run(run_dir, [word for word in args.changes if "=" in word])
    except ZeromonError as exc:
        raise ZeromonError(f"zeromon whatif: {exc.message}", hint=exc.hint) from exc
    capacity = args.capacity or answer.capacity_bytes
    if args.json:
        print(json.dumps(answer.to_dict() | {"capacity_bytes": capacity}, indent=1))
    else:
        print(format_what_if(answer, args.run_dir, capacity))
    return 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _row(label: str, figures: Figures, step_note: str = "") -> str:
    return (f"{label:<22} {_ms(figures.median_step_s) + step_note:>18} {_ms(figures.compute_s):>9} "
            f"{_ms(figures.transfer_s):>9} {_ms(figures.waiting_s):>9} {format_bytes(figures.peak_tracked_bytes):>12}")


def format_what_if(answer: WhatIf, run_dir: str, capacity: int | None) -> str:
    from zeromon.views.whatif import capacity_words, delta_words

    measured, predicted = answer.measured, answer.predicted
    error = answer.replay_error_pct
    lines = [f"{run_dir}: {', '.join(c.text for c in answer.changes)}",
             f"{'':<22} {'step (ms)':>18} {'compute':>9} {'transfer':>9} {'waiting':>9} {'peak tracked':>12}",
             _row("measured", measured),
             _row("replay (unchanged)", answer.replay, "" if error is None else f" ({error:+.1f}%)"),
             _row("predicted", predicted, "" if answer.step_change_pct is None else f" ({answer.step_change_pct:+.1f}%)")]
    if answer.samples_factor != 1.0 and answer.per_sample_change_pct is not None:
        lines.append(f"a step trains on {answer.samples_factor:g} times the samples: "
                     f"{answer.per_sample_change_pct:+.1f}% a sample")
    if answer.peak_delta_bytes is not None:
        fits = capacity_words(answer.left_bytes(capacity))
        lines.append(f"peak tracked memory: {format_bytes(measured.peak_tracked_bytes)} -> "
                     f"{format_bytes(predicted.peak_tracked_bytes)} ({delta_words(answer.peak_delta_bytes)})"
                     + (f", {fits} (capacity {format_bytes(capacity or answer.capacity_bytes)})" if fits else ""))
    lines.append("the predicted step's change is against the replay (the model against itself); the replay's "
                 "error against the measured run is in brackets")
    for fit in answer.fits:
        bandwidth = f"{format_bytes(fit.busbw_bytes_per_s)}/s bus" if fit.busbw_bytes_per_s else "no slope"
        lines.append(f"fit {fit.op} (group of {fit.group_size}): {fit.alpha_s * 1e3:.3f} ms + bytes at {bandwidth}, "
                     f"{fit.samples} samples, residual {fit.residual_pct:.0f}% of the mean time")
    for kind, pct in answer.validated_error_pct.items():
        lines.append(f"validated: {kind}: " + (
            "not checked against real runs" if pct is None
            else f"off real CPU runs by up to {pct['median_step_s']:.1f}% on the step and "
                 f"{pct['peak_tracked_bytes']:.1f}% on the peak (the benchmark's medians: docs/whatif.md)"))
    lines.append("assumptions:")
    lines.extend(f"  - {a}" for a in answer.assumptions)
    return "\n".join(lines)
