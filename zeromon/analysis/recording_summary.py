"""A first look at a recorded run: per rank, what was recorded and what a step costs.

``summarize_recording``: a recording in, a RankSummary out; ``summarize_run`` has each rank file read and
summarized in a worker process (zeromon.model.rank_pool); ``format_summary`` renders the text the CLI prints.
"""

from __future__ import annotations

import operator
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from pathlib import Path

from zeromon.analysis.hang import HangVerdict, ended_lines, last_report, recorded_verdict
from zeromon.analysis.rank_ends import CUT_OFF, RankEnd, end_lines, rank_ends
from zeromon.analysis.restarts import Restarts, restarts
from zeromon.model.attempts import read_attempts
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording, RunDirs, check_one_run, run_headers, run_name
from zeromon.model.events import RunInfo, StepSummary, step_number
from zeromon.model.progress import RankProgress
from zeromon.model.rank_pool import OnProgress, map_rank_files, read_rank_file
from zeromon.model.run_end import FileEnd, recording_end
from zeromon.model.step_records import StepRecords
from zeromon.model.units import format_bytes

RANKS_SHOWN = 16  # the ranks a summarised text shows (`zeromon summary`, and `zeromon report` of each list)


@frozen
class RankSummary:
    rank: int
    framework: str
    strategy: str
    steps: int
    # Medians over the steps after the first (all steps when there is one), as `zeromon report`'s:
    # the first step holds one-off work (allocation, lazy initialization, the first gathers).
    median_step_s: float | None
    collectives: int
    # Median over the steps after the first of the bytes each step moved, per ZeRO meaning.
    bytes_per_step_by_meaning: dict[str, int] = field(default_factory=dict)
    # The step time communication cost (docs/definitions.md), `zeromon report`'s "exposed ms"; None: not known
    # for any step (a recording older than format 1.1).
    median_exposed_comm_s: float | None = None
    peak_memory: int | None = None
    capacity: int | None = None
    last_categories: dict[str, int] = field(default_factory=dict)
    events_dropped: int = 0
    hook_errors: int = 0
    corrupt_lines: tuple[int, ...] = ()  # line numbers in the rank file, skipped
    line_errors: dict[int, str] = field(default_factory=dict)  # what was wrong with some (Recording.line_errors)
    notices: tuple[str, ...] = ()
    file: str = ""


@frozen
class RunSummary:
    run_dir: str
    world_size: int
    ranks: tuple[RankSummary, ...]
    ends: tuple[RankEnd, ...] = ()  # how each rank ended (rank_ends): died, cut off, incomplete
    restarts: Restarts = Restarts()  # the earlier attempts of a run torchelastic restarted
    hang: HangVerdict | None = None  # the hang or stall the ranks' last progress reports show (recorded_verdict)


def strategy_label(rec: Recording) -> str:
    """'ZeRO-3', 'FULL_SHARD', ...: how the rank's run shards, in the words of its framework."""
    info = rec.run_info
    if info is None:
        return "-"
    if info.zero_stage is not None:
        return f"ZeRO-{info.zero_stage}"
    return info.fsdp_strategy or "-"


def _step_columns(steps: Sequence[StepSummary]) -> tuple[Sequence[int], list[float], Sequence[float | None],
                                                          Sequence[int | None]]:
    """(step, duration, exposed communication seconds, collectives) of each summary: a StepRecords' columns, no
    object made."""
    if isinstance(steps, StepRecords):
        starts, ends = steps.column("start_ns"), steps.column("end_ns")
        return (steps.column("step"), [(end - start) / 1e9 for start, end in zip(starts, ends, strict=True)],
                steps.column("exposed_comm_s"), steps.column("collectives"))
    return ([s.step for s in steps], [s.duration_s for s in steps], [s.exposed_comm_s for s in steps],
            [s.collectives for s in steps])


def summarize_recording(rec: Recording) -> RankSummary:
    numbers, durations, exposed, step_collectives = _step_columns(rec.steps)
    # the steps after the first (all of them when there is one)
    steady = [i for i, number in enumerate(numbers) if number >= 1] or range(len(numbers))
    per_step: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    columns = rec.collective_columns()  # no event objects: a recording holds up to a million
    counts: Counter[int] = Counter()
    for step, meaning, b_in, b_out in zip(columns.step, columns.meaning, columns.bytes_in, columns.bytes_out,
                                          strict=True):
        counts[step] += 1
        if step >= 0:
            per_step[step][meaning] += b_in if b_in > b_out else b_out
    later = [s for s in sorted(per_step) if s >= 1] or sorted(per_step)
    meanings = {m for s in later for m in per_step[s]}
    by_meaning = {m: int(statistics.median(per_step[s].get(m, 0) for s in later)) for m in sorted(meanings)}
    levels = [level for m in rec.memory
              if (level := m.allocated if m.allocated is not None else m.rss) is not None]
    with_categories = [m for m in rec.memory if len(m.categories) > 1]
    capacity = next((m.capacity for m in reversed(rec.memory) if m.capacity), None)
    exposed_steady = [value for i in steady if (value := exposed[i]) is not None]
    info = rec.run_info
    return RankSummary(
        rank=rec.rank,
        framework=info.framework if info else "-",
        strategy=strategy_label(rec),
        steps=len(numbers),
        median_step_s=statistics.median(durations[i] for i in steady) if steady else None,
        # A bounded recording's steps whose detail was dropped (all or part): their summaries count them.
        collectives=len(columns) + sum(max(0, (n or 0) - counts[step])
                                       for step, n in zip(numbers, step_collectives, strict=True)),
        bytes_per_step_by_meaning=by_meaning,
        median_exposed_comm_s=statistics.median(exposed_steady) if exposed_steady else None,
        peak_memory=max(levels) if levels else None,
        capacity=capacity,
        last_categories=dict(with_categories[-1].categories) if with_categories else {},
        events_dropped=rec.stats.events_dropped if rec.stats else 0,
        hook_errors=rec.stats.hook_errors if rec.stats else 0,
        corrupt_lines=tuple(rec.corrupt_lines),
        line_errors=dict(rec.line_errors),
        notices=tuple(f"{n.level}: {n.message}" for n in rec.notices),
        file=str(rec.path),
    )


def summarize_run(run_dir: RunDirs, workers: int | None = None, progress: OnProgress | None = None) -> RunSummary:
    """Each rank file read and summarized in a worker process (``workers``: map_rank_files'), only its
    summary sent back: a large run's records would not fit in this process's memory."""
    headers = run_headers(run_dir)  # checked to be one run's before any file is read whole
    done = map_rank_files([path for path, _ in headers], _summarize_file, workers, progress, doing="summarizing")
    check_one_run([(path, header, info) for (path, header), (_, info, *_) in zip(headers, done, strict=True)])
    done.sort(key=lambda rank: rank[0].rank)
    world = max((info.world_size for _, info, *_ in done if info), default=len(done))
    ends = rank_ends([end for _, _, _, end, _ in done if end is not None],
                     {summary.rank: last for summary, _, last, *_ in done}, world)
    last = max((last for _, _, last, *_ in done if last is not None), default=None)
    hang = recorded_verdict({summary.rank: report for summary, *_, report in done},
                            [e.rank for e in ends if e.state == CUT_OFF])
    return RunSummary(run_dir=run_name(run_dir), world_size=world, ranks=tuple(summary for summary, *_ in done),
                      ends=ends, restarts=restarts(read_attempts(run_dir), step_number(last) if last is not None else None),
                      hang=hang)


def _summarize_file(path: Path) -> tuple[RankSummary, RunInfo | None, int | None, FileEnd | None, RankProgress | None]:
    """A worker's part: one rank's summary, its RunInfo (the run check), its last step, its file's end and its
    last progress report."""
    rec = read_rank_file(path)
    numbers = _step_columns(rec.steps)[0]
    return (summarize_recording(rec), rec.run_info, max(numbers, default=None), recording_end(rec),
            last_report(rec.progress))


def counted(n: int, thing: str) -> str:
    """'1 hook error', '3 hook errors'."""
    return f"{n} {thing}" if n == 1 else f"{n:,} {thing}s"


def corrupt_lines_note(file: str, lines: Sequence[int], shown: int = 5, errors: Mapping[int, str] | None = None) -> str:
    """'rank-1.jsonl: 2 corrupt lines skipped (lines 57, 80; line 57: collective.meaning is 7, not a
    string)', with at most ``shown`` line numbers and the first of ``errors`` (line: what was wrong); of a
    compact file (.zmr), record numbers: 'rank-1.zmr: 5 corrupt records skipped (records 6, ...)'."""
    numbers = ", ".join(map(str, lines[:shown]))
    if len(lines) > shown:
        numbers += f" and {len(lines) - shown} more"
    word = "record" if Path(file).suffix == ".zmr" else "line"  # a compact file's records are numbered from 1
    where = f"{word} {numbers}" if len(lines) == 1 else f"{word}s {numbers}"
    first = next(iter(errors.items()), None) if errors else None
    why = f"; {word} {first[0]}: {first[1]}" if first is not None else ""
    return f"{Path(file).name}: {counted(len(lines), 'corrupt ' + word)} skipped ({where}{why})"


def _off(value: float | int | None, median: float | None) -> float:
    """How far ``value`` is from ``median``, as a share of it (0 where either is unknown)."""
    if value is None or median is None or median <= 0:
        return 0.0
    return abs(value - median) / median


def ranks_shown(ranks: Sequence[RankSummary], shown: int = RANKS_SHOWN) -> tuple[list[RankSummary], dict[str, float]]:
    """The ``shown`` ranks furthest from the run's typical rank, furthest first, and the medians over all
    ranks of what that is measured by: the median step time, the exposed communication (a late rank
    waits less; its peers wait for it) and the peak memory, each as a share of its median over the ranks."""
    medians = {name: statistics.median(present) if (present := [v for r in ranks if (v := get(r)) is not None])
               else None for name, get in _MEASURES.items()}

    def distance(r: RankSummary) -> tuple[float, int]:
        return -max(_off(get(r), medians[name]) for name, get in _MEASURES.items()), r.rank

    return sorted(ranks, key=distance)[:shown], {name: m for name, m in medians.items() if m is not None}


_MEASURES: dict[str, Callable[[RankSummary], float | int | None]] = {
    "step ms": operator.attrgetter("median_step_s"), "exposed ms": operator.attrgetter("median_exposed_comm_s"),
    "peak mem": operator.attrgetter("peak_memory")}


def _rank_line(r: RankSummary) -> str:
    step_ms = f"{r.median_step_s * 1e3:.1f}" if r.median_step_s is not None else "-"
    exposed = f"{r.median_exposed_comm_s * 1e3:.1f}" if r.median_exposed_comm_s is not None else "-"
    # A meaning whose median is nothing is not in a typical step (the demo's stop check, every fourth step).
    meanings = ", ".join(f"{m}={format_bytes(b)}" for m, b in r.bytes_per_step_by_meaning.items() if b) or "-"
    return (f"{r.rank:>4}  {r.framework:<10} {r.strategy:<14} {r.steps:>5} {step_ms:>8} {exposed:>10} "
            f"{r.collectives:>11} {format_bytes(r.peak_memory):>11}  {meanings}")


def _rest_line(summary: RunSummary, shown: list[RankSummary], medians: dict[str, float]) -> str:
    """What the ranks left out of a summarised table are: how far from the medians at most."""
    shown_ranks = {r.rank for r in shown}
    rest = [r for r in summary.ranks if r.rank not in shown_ranks]
    within = []
    for name, get in _MEASURES.items():
        if name in medians:
            median = medians[name]
            typical = format_bytes(round(median)) if name == "peak mem" else f"{median * 1e3:.1f} ms"
            far = 100 * max(_off(get(r), median) for r in rest)
            within.append(f"{name.removesuffix(' ms')} {typical} (within {far:.1f}%)" if far < 10
                          else f"{name.removesuffix(' ms')} {typical} (within {far:.0f}%)")
    return (f"… and {counted(len(rest), 'more rank')}, each as near the median of every rank as this: "
            + ", ".join(within) + " (a line for every rank: --all-ranks)")


def format_summary(summary: RunSummary, all_ranks: bool = False) -> str:
    """The per-rank table; past RANKS_SHOWN ranks (without ``all_ranks``), only the ranks furthest from the
    run's typical rank (ranks_shown) and a line for the rest, and the per-rank notes of as many ranks."""
    lines = [f"zeromon: run {summary.run_dir} ({len(summary.ranks)} of {summary.world_size} ranks recorded)"]
    if summary.restarts.note is not None:
        lines.append(summary.restarts.note)
    header = f"{'rank':>4}  {'framework':<10} {'strategy':<14} {'steps':>5} {'step ms':>8} {'exposed ms':>10} " \
             f"{'collectives':>11} {'peak mem':>11}  bytes per step by meaning"
    summarised = not all_ranks and len(summary.ranks) > RANKS_SHOWN
    shown, medians = ranks_shown(summary.ranks) if summarised else (list(summary.ranks), {})
    if summarised:
        lines.append(f"the {len(shown)} ranks furthest from the median of every rank (by step time, exposed "
                     "communication and peak memory), furthest first:")
    lines.append(header)
    lines.extend(map(_rank_line, shown))
    if summarised:
        lines.append(_rest_line(summary, shown, medians))
    lines.append("(step ms, exposed ms and bytes per step: medians over the steps after the first, as in "
                 "`zeromon report`; exposed = the step time communication cost)")
    first = summary.ranks[0] if summary.ranks else None
    if first is not None and first.last_categories:
        cats = ", ".join(f"{k}={format_bytes(v)}" for k, v in first.last_categories.items() if v)
        lines.append(f"rank {first.rank} memory by category (last sample): {cats}")
    lost_lines = []
    for r in summary.ranks:
        lost = [counted(n, thing) + suffix for n, thing, suffix in
                ((r.events_dropped, "event", " dropped"), (r.hook_errors, "hook error", "")) if n]
        if lost:
            lost_lines.append(f"rank {r.rank}: {', '.join(lost)}")
        if r.corrupt_lines:
            lost_lines.append(corrupt_lines_note(r.file, r.corrupt_lines, errors=r.line_errors))
    if summarised and len(lost_lines) > RANKS_SHOWN:
        left = len(lost_lines) - RANKS_SHOWN
        lost_lines[RANKS_SHOWN:] = [f"… and {counted(left, 'more line')} of dropped events, hook errors or corrupt "
                                    "records (every one: --all-ranks)"]
    lines.extend(lost_lines)
    lines.extend(ended_lines(summary.hang))
    lines.extend(end_lines(summary.ends))
    lines.extend(summary.restarts.lines("the summary above is"))
    seen: set[str] = set()
    for r in summary.ranks:
        for note in r.notices:
            if note not in seen:
                seen.add(note)
                lines.append(f"note: {note}")
    return "\n".join(lines)
