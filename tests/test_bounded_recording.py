"""ZEROMON_MAX_DISK: a bounded recording keeps every step's summary and thins the per-collective detail
as the file fills (agents/zeromon_agent/recorder/detail.py).

The policy is checked on the keeper itself, fed as the recorder feeds it (records of known sizes, a
writer that counts); the whole is checked on a real 2-rank gloo run under `zeromon run`, read back by
`zeromon report`."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeromon.analysis.oom import forecast
from zeromon.model.codec import Recording, read_run
from zeromon.model.events import MemorySample, Notice, Record, StepSummary
from zeromon_agent.recorder.detail import END_ROOM, LAST_STEPS, LEVELS, DetailKeeper

from conftest import REPO, child_env, ranks_args, zeromon

SCENARIO = REPO / "tests" / "scenarios" / "fault_train.py"
SUMMARY_BYTES = 300
DETAIL_BYTES = 200


class CountingFile:
    """What a writer counts: records written and their bytes (a summary 300 bytes, detail 200)."""

    def __init__(self) -> None:
        self.records: list[Record | str] = []
        self.bytes = 0

    def write(self, record: Record | str) -> None:
        self.records.append(record)
        self.bytes += SUMMARY_BYTES if isinstance(record, StepSummary) else DETAIL_BYTES


def _summary(step: int, duration_ms: float, peak: int) -> StepSummary:
    start = step * 10**9
    return StepSummary(rank=0, step=step, start_ns=start, end_ns=start + int(duration_ms * 1e6), phase_s={},
                       collectives=5, comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0,
                       peak_memory=peak, comp_s=0.0, overlap_s=0.0, exposed_comm_s=0.0)


def _run_keeper(durations: list[float], max_bytes: int, per_step: int = 5, check_every: int = 3
                ) -> tuple[CountingFile, DetailKeeper, list[int]]:
    """The recorder's order: a step's detail as it comes, then its summary (if the budget admits it); the
    file's size looked at every ``check_every`` steps (a flush); the end. Returns the steps kept whole."""
    out = CountingFile()
    notices: list[str] = []
    keeper = DetailKeeper(out.write, max_bytes, lambda: out.bytes, notices.append)

    def write(record: Record | str) -> None:
        if keeper.admit():
            out.write(record)

    keeper._write = write
    for step, duration in enumerate(durations):
        for i in range(per_step):
            keeper.detail(f"detail {step} {i}", step)  # type: ignore[arg-type]
        summary = _summary(step, duration, peak=1000)
        keeper.step_done(summary)
        write(summary)
        if step % check_every == 0:
            keeper.check_size()
    keeper.close()
    counts: dict[int, int] = {}
    for record in out.records:
        if isinstance(record, str):
            step = int(record.split()[1])
            counts[step] = counts.get(step, 0) + 1
    return out, keeper, sorted(s for s, n in counts.items() if n == per_step)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=1.0, max_value=100.0), min_size=1, max_size=3000),
       st.integers(min_value=64 * 1024, max_value=2 * 1024 * 1024))
def test_the_file_stays_under_the_budget_and_keeps_summaries_while_they_fit(durations: list[float],
                                                                            max_bytes: int) -> None:
    out, keeper, kept = _run_keeper(durations, max_bytes)
    assert out.bytes <= max_bytes - END_ROOM + SUMMARY_BYTES  # the last record admitted may pass the mark
    summaries = [r.step for r in out.records if isinstance(r, StepSummary)]
    if len(durations) * SUMMARY_BYTES < max_bytes * (1 - LEVELS[-1][0]) - END_ROOM:
        assert summaries == list(range(len(durations)))  # every step's summary, in order
        assert not keeper.full
    else:
        assert summaries == list(range(len(summaries)))  # a prefix: nothing out of order, nothing skipped
    if keeper.thinned_from is not None:
        assert all(s in kept for s in range(keeper.thinned_from))  # full detail until thinned
    else:
        assert kept == list(range(len(durations)))  # a run that fits keeps everything


def test_thinned_steps_are_every_nth_the_outliers_and_the_last() -> None:
    durations = [10.0] * 4000
    durations[2345] = 50.0  # one slow step, 5x the median
    out, keeper, kept = _run_keeper(durations, max_bytes=4 * 1024 * 1024)
    assert keeper.thinned_from is not None and keeper.level >= 2 and not keeper.full
    assert 2345 in kept  # it stands out
    assert kept[:keeper.thinned_from] == list(range(keeper.thinned_from))
    later = [s for s in kept if s >= keeper.thinned_from and s < len(durations) - LAST_STEPS]
    assert later and all(s % 10 == 0 or s == 2345 for s in later), later
    assert kept[-LAST_STEPS:] == list(range(len(durations) - LAST_STEPS, len(durations)))  # written at the end
    assert keeper.steps_kept + keeper.steps_thinned == len(durations) - keeper.thinned_from


# The compact form holds ~10x the steps' detail in a budget: a smaller one thins it as soon.
@pytest.mark.parametrize(("form", "max_disk"), [("jsonl", 2**20), ("compact", 160 * 2**10)])
def test_a_real_run_stays_under_max_disk_and_reports_every_step(tmp_path: Path, form: str, max_disk: int) -> None:
    steps = 1000
    out = tmp_path / "run"
    # Passes of 0.2 s: a budget this small holds a few seconds of this fast run's detail, and a 1 s pass (the
    # default) of JSON lines writes past 20% of it before the first step is judged (it thins from there on).
    run = zeromon("run", "--out", str(out), "--", *ranks_args(2, SCENARIO, "--steps", str(steps)),
                  env=child_env(ZEROMON_MAX_DISK=str(max_disk), ZEROMON_FORMAT=form, ZEROMON_FLUSH_INTERVAL="0.2"),
                  timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    files = sorted(out.glob("rank-*"))
    assert [f.suffix for f in files] == [".zmr" if form == "compact" else ".jsonl"] * 2
    assert all(f.stat().st_size <= max_disk for f in files), [f.stat().st_size for f in files]
    for rec in read_run(out):
        assert [s.step for s in rec.steps] == list(range(steps))
        said = [n.message for n in rec.notices if isinstance(n, Notice) and n.source == "recording"]
        # Each change of level says what is kept from then on. The file's size is looked at once per pass,
        # so a pass that comes late (a loaded machine) may take the recording past a level (20% to 32%
        # seen in CI): whichever levels were met, they say so in order, and the shares rise.
        levels = [m for m in said if m.startswith("the recording holds")]
        assert levels and all(re.search(r"per-collective detail is kept for every 10+th step|no per-collective "
                                        r"detail is kept", m) for m in levels), said
        shares = [int(m.split("% of ZEROMON_MAX_DISK")[0].rsplit(" ", 1)[1]) for m in levels]
        assert shares == sorted(shares) and shares[0] >= 20, shares
        assert any(m.startswith("bounded recording: from step") for m in said), said
        detailed = set(rec.collective_columns().step)
        assert 0 < len(detailed & set(range(steps))) < steps  # thinned, not emptied
    report = zeromon("report", str(out), "--json", timeout=120)
    assert report.returncode == 0, report.stderr
    ranks = json.loads(report.stdout)["ranks"]
    # Steps without detail count with the overlap the agent computed for them: the blocking all-reduces
    # of every step are exposed, in every step.
    assert len(ranks) == 2 and all(r["exposed_comm_s"] and r["exposed_comm_s"] > 0 for r in ranks), ranks
    summary = zeromon("summary", str(out), timeout=120)
    assert summary.returncode == 0 and "bounded recording" in summary.stdout + summary.stderr


def test_memory_growth_is_found_from_the_summaries_where_samples_were_thinned(tmp_path: Path) -> None:
    """A bounded recording keeps memory samples in a few steps only; every step's summary keeps its peak,
    and the OOM forecast's trend reads them (a steady 8 MiB a step here, samples in 3 steps of 60)."""
    def sample(step: int, rss: int) -> MemorySample:
        return MemorySample(rank=0, step=step, phase="optimizer", t_ns=step * 10**9, device="cpu", allocated=None,
                            reserved=None, active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                            num_alloc_retries=None, num_ooms=None, capacity=64 * 2**30, free=None, rss=rss)

    level = [2**30 + 8 * 2**20 * step for step in range(60)]
    steps = [dataclasses.replace(_summary(step, 100.0, level[step]), peak_memory=level[step]) for step in range(60)]
    rec = Recording(path=tmp_path / "rank-0.jsonl", header={}, steps=steps,
                    memory=[sample(step, level[step]) for step in (0, 30, 59)])
    result = forecast(rec)
    assert result.growth_bytes_per_step == pytest.approx(8 * 2**20)
    assert "memory_growth" in [f.kind for f in result.findings]
