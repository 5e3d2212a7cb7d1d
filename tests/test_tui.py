"""`zeromon attach`: the view model without a terminal, the app through Textual's Pilot, the CLI's flags.

The app is driven by FakeSource, a test double for the source: any object with start(), stop() and
latest() -> FleetView is one, and this one returns FleetViews built here from the real model types
(the same ones LiveSource builds from the agents' snapshots), so every screen is deterministic. The
last test drives the app with a real LiveSource against the real agents of a 2-rank gloo run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text
from textual.widgets import DataTable, Input, Static

from zeromon.analysis.findings import Finding, Severity
from zeromon.analysis.live_stragglers import memory_imbalance_finding, straggler_finding
from zeromon.analysis.oom import OomForecast
from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.model import registry
from zeromon.model.events import MemorySample, PhaseSpan, RunInfo, StepSummary
from zeromon.sources.fleet import CollectiveTotal, FleetView, RankView
from zeromon.sources.live import LiveSource
from zeromon.tui.app import ZeromonApp
from zeromon.tui.screens import CollectivesTable, HelpScreen, RankScreen
from zeromon.tui.widgets import FindingsPanel, FleetHeader, NoAgentPanel, RanksTable
from zeromon.views.fleet import (
    COLUMN_KEYS,
    STALE_MARK,
    WORST_MARK,
    FindingsLog,
    JobStatus,
    RankFilter,
    RunClock,
    header,
    memory_bar,
    no_agent_text,
    rank_rows,
    short_bytes,
    sort_rows,
    trends,
    worst_row,
)
from zeromon.views.rank_detail import (
    NARROW_COLLECTIVE_COLUMNS,
    collective_rows,
    memory_lines,
    phase_timeline,
    rank_title,
)

from conftest import REPO, child_env, free_port, ranks_args

T0 = 1_700_000_000_000_000_000  # the views' clock: fixed, so every screen is the same every run
GIB = 2**30
MS = 1_000_000


# --- deterministic fleets ------------------------------------------------------------------------------

def make_rank(rank: int, world: int = 4, steps: int = 12, step_ms: float = 100.0, exposed_ms: float = 10.0,
              overlap: float = 0.75, used_gib: float = 10.0, capacity_gib: float = 80.0,
              risk: Severity = Severity.OK, headroom_gib: float | None = None, alive: bool = True,
              stale_s: float | None = 0.0, blocked_ms: float = 20.0, findings: tuple[Finding, ...] = (),
              framework: str = "deepspeed", t_ns: int = T0) -> RankView:
    """One rank's view as LiveSource builds it: `steps` steps of `step_ms` ending at t_ns."""
    info = RunInfo(rank=rank, local_rank=rank % 8, world_size=world, host=f"node{rank // 8}", pid=1000 + rank,
                   job="llama-7b", framework=framework,
                   framework_version="0.19.8" if framework == "deepspeed" else "2.13.0", torch_version="2.13.0",
                   backend="nccl", device=f"cuda:{rank % 8}", zero_stage=3 if framework == "deepspeed" else None,
                   fsdp_strategy=None if framework == "deepspeed" else "FULL_SHARD", param_dtype="bf16",
                   reduce_dtype="fp32", optimizer="AdamW")
    step_ns = int(step_ms * MS)
    summaries = []
    spans = []
    for i in range(steps):
        start = t_ns - (steps - i) * step_ns
        comm_s = exposed_ms / 1e3 / (1 - overlap) if overlap < 1 else exposed_ms / 1e3
        summaries.append(StepSummary(
            rank=rank, step=i, start_ns=start, end_ns=start + step_ns,
            phase_s={"forward": step_ms * 0.3e-3, "backward": step_ms * 0.6e-3, "optimizer": step_ms * 0.1e-3},
            collectives=40, comm_bytes=2 * GIB, comm_bytes_by_op={"all_gather": GIB, "reduce_scatter": GIB},
            comm_union_s=comm_s, blocked_s=blocked_ms / 1e3, peak_memory=int((used_gib + 0.1 * i) * GIB),
            comp_s=step_ms * 0.9e-3, overlap_s=comm_s * overlap, exposed_comm_s=exposed_ms / 1e3))
        for phase, a, b in (("forward", 0.0, 0.3), ("backward", 0.3, 0.9), ("optimizer", 0.9, 1.0)):
            spans.append(PhaseSpan(rank=rank, step=i, phase=phase, start_ns=start + int(a * step_ns),
                                   end_ns=start + int(b * step_ns)))
    used = int(used_gib * GIB)
    peak = int((used_gib + 0.1 * (steps - 1)) * GIB)
    capacity = int(capacity_gib * GIB)
    memory = MemorySample(rank=rank, step=steps - 1, phase="optimizer", t_ns=t_ns, device=f"cuda:{rank % 8}",
                          allocated=used, reserved=used + GIB, active=used, peak_allocated=peak,
                          peak_reserved=peak + GIB, inactive_split=0, num_alloc_retries=0, num_ooms=0,
                          capacity=capacity, free=capacity - used - GIB, rss=2 * GIB,
                          categories={"sharded_params": used // 4, "optimizer_state": used // 2,
                                      "activations": used // 4})
    headroom = int(headroom_gib * GIB) if headroom_gib is not None else capacity - peak
    oom = OomForecast(rank=rank, risk=risk, capacity_bytes=capacity, current_bytes=used, peak_bytes=peak,
                      headroom_bytes=headroom, predicted_peak_bytes=capacity - headroom,
                      growth_bytes_per_step=0.1 * GIB, steps_to_capacity=None, device=f"cuda:{rank % 8}")
    collectives = (
        CollectiveTotal("all_gather", "param_all_gather", 480, 12 * GIB, 0.9, 0.1, 150e9),
        CollectiveTotal("reduce_scatter", "grad_reduce_scatter", 480, 12 * GIB, 0.6, 0.12, 140e9),
        CollectiveTotal("all_reduce", "unknown", 12, 4096, 0.01, 0.01, None),
    )
    return RankView(rank=rank, target=f"127.0.0.1:{9470 + rank}", alive=alive, stale_s=stale_s,
                    error=None if alive else "connection refused (nothing listens there: the agent stopped?)",
                    run_info=info, steps=tuple(summaries), memory=memory, collectives=collectives, oom=oom,
                    findings=findings, phases=tuple(spans), host=f"node{rank // 8}", pid=1000 + rank,
                    job="llama-7b", local_rank=rank % 8, world_size=world, t_ns=t_ns)


OOM_FINDING = Finding(kind="oom_risk", severity=Severity.WARN, title="rank 2: peak at 91% of capacity",
                      rank=2, step=11, evidence=("peak 72.8 GiB of 80.0 GiB",),
                      remedies=("lower the micro-batch size", "activation checkpointing"))


def fleet(n: int = 4, t_ns: int = T0, **overrides: Any) -> FleetView:
    """n ranks; rank 2 is the worst (WARN, 3 GiB headroom) unless overridden per rank with {rank: kwargs}."""
    ranks = []
    for r in range(n):
        kwargs: dict[str, Any] = dict(world=n, step_ms=100.0 + r, exposed_ms=10.0 + r, t_ns=t_ns)
        if r == 2:
            kwargs.update(risk=Severity.WARN, headroom_gib=3.0, used_gib=70.0, findings=(OOM_FINDING,))
        kwargs.update(overrides.get(f"r{r}", {}))
        ranks.append(make_rank(r, **kwargs))
    return FleetView(t_ns=t_ns, source="run /runs/demo", ranks=tuple(ranks),
                     looked_at=("/runs/demo/endpoints (the run folder's endpoints)",))


def empty_fleet(t_ns: int = T0) -> FleetView:
    looked = ("/home/u/.cache/zeromon/agents (the user-level index of local agents, ZEROMON_REGISTRY)",)
    return FleetView(t_ns=t_ns, source="newest local run (none found yet)", ranks=(), looked_at=looked,
                     error="no agent found (looked at: /home/u/.cache/zeromon/agents)")


class FakeSource:
    """A test double for the source: returns whatever view the test set. ``speed``/``paused`` as a replay has."""

    def __init__(self, view: FleetView, replay: bool = False) -> None:
        self.view = view
        self.started = self.stopped = 0
        self.calls = 0
        self.fail: Exception | None = None
        if replay:
            self.speed = 1.0
            self.paused = False

    def start(self) -> FakeSource:
        self.started += 1
        return self

    def stop(self) -> None:
        self.stopped += 1

    def latest(self) -> FleetView:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return self.view


def text_of(widget: Static) -> str:
    """A Static's content as plain text (Rich tables and groups rendered 120 columns wide)."""
    content = widget.content
    if isinstance(content, str | Text):
        return str(content)
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(content)
    return console.export_text()


def findings_text(panel: FindingsPanel) -> str:
    """The findings panel's entries as plain text, one after the other (rendered 120 columns wide)."""
    console = Console(width=120, record=True, file=io.StringIO())
    for option in panel.options:
        console.print(option.prompt)
    return console.export_text()


def table_column(table: RanksTable, key: str) -> list[str]:
    """A column's cells; for "rank" the rank alone, without the marks."""
    values = [v.strip() for v in table.column_values(key)]
    return [v.split()[-1] for v in values] if key == "rank" else values


def screen_text(app: ZeromonApp) -> str:
    """What the terminal shows, as lines of text: the screen rendered as App.export_screenshot() renders
    it, exported as text instead of SVG (whose text is split by style and placed by coordinates)."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))  # noqa: SLF001
    return console.export_text()


async def settle(app: ZeromonApp, pilot: Any) -> None:
    app.refresh_view()
    await pilot.pause()


# --- the view model (no terminal) ----------------------------------------------------------------------

def test_rows_header_and_the_worst_rank() -> None:
    view = fleet(4)
    rows = rank_rows(view)
    assert [r.key for r in rows] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    worst = worst_row(rows)
    assert worst is not None and worst.rank == 2  # WARN beats the others' OK
    cells = dict(zip(COLUMN_KEYS, worst.cells(worst=True), strict=True))
    assert cells["rank"] == f" {WORST_MARK} 2" and cells["risk"] == "warn" and cells["headroom"] == "3G"
    # The drill-down's three digits (71.1G, not 71G), the unit said once when all three share it.
    assert cells["memory"] == memory_bar(70 * GIB, int(71.1 * GIB), 80 * GIB, 5) + " 70/71.1/80G"
    first = dict(zip(COLUMN_KEYS, rows[0].cells(), strict=True))
    assert [first[k] for k in ("step_ms", "overlap", "exposed_ms", "exposed_pct", "busbw", "state")] == [
        "100.0", "75%", "10.0", "10%", "150", "alive"]
    h = header(view, rows, uptime_s=1.2, uptime_exact=True)
    assert (h.job, h.framework, h.strategy, h.world, h.dtypes) == (
        "llama-7b", "DeepSpeed 0.19.8", "ZeRO-3", "4", "param bf16 reduce fp32")
    # Steps done, as training scripts count them: the recording's last index is 11.
    assert h.step == "12" and h.answering == "4/4 ranks answering" and h.uptime == "1s"
    assert float(h.steps_per_s) == pytest.approx(1000 / 101.5, rel=0.02)  # median over ranks
    assert h.worst_risk is Severity.WARN and h.worst_risk_text == "warn: rank 2, headroom 3G"
    assert h.worst_overlap_text == "75% (rank 0)"


def test_memory_bar_shows_used_peak_and_capacity() -> None:
    assert memory_bar(2, 5, 10) == "██▒▒▒·····"
    assert memory_bar(10, 10, 10) == "█" * 10
    assert memory_bar(3, 3, None) == "?" * 10  # no capacity known: no bar, not a wrong one
    assert short_bytes(1536) == "1.5K" and short_bytes(3 * GIB) == "3G" and short_bytes(-GIB) == "-1G"


def test_a_target_that_never_answered_is_a_row_too() -> None:
    never = RankView(rank=None, target="10.0.0.9:9470", alive=False, stale_s=None,
                     error="connection refused (nothing listens there: the agent stopped?)")
    view = fleet(2)
    rows = rank_rows(FleetView(view.t_ns, view.source, (*view.ranks, never), view.looked_at))
    row = rows[-1]
    assert (row.key, row.state, row.level, row.host) == ("10.0.0.9:9470", "down", "stale", "10.0.0.9")
    assert row.cells()[0] == f" {STALE_MARK} ?" and row.cells()[1] == "-"
    assert [r.key for r in sort_rows(rows, "risk")][-1] == "10.0.0.9:9470"  # no data: not the worst
    assert worst_row(rows) is not None and worst_row(rows).key != "10.0.0.9:9470"  # type: ignore[union-attr]
    assert rank_title(never).endswith("never answered · connection refused (nothing listens there: the agent stopped?)")


def test_a_stale_rank_is_not_the_worst_while_another_answers_and_keeps_its_mark() -> None:
    # Rank 2 (the WARN one) stopped answering: its data is old, the worst among the answering ranks stands out.
    rows = rank_rows(fleet(4, r2={"alive": False, "stale_s": 75.0}))
    worst = worst_row(rows)
    assert worst is not None and worst.rank == 3  # the longest step and most exposed of the answering ranks
    assert rows[2].cells()[0] == f" {STALE_MARK} 2" and rows[2].state == "stale 1m"  # fits the 9-cell column
    # No rank answers: the worst is a stale one, and shows both marks (the colour is not the only sign).
    rows = rank_rows(fleet(4, **{f"r{r}": {"alive": False, "stale_s": 5.0} for r in range(4)}))
    worst = worst_row(rows)
    assert worst is not None and worst.rank == 2
    assert worst.cells(worst=True)[0] == f"{WORST_MARK}{STALE_MARK} 2"


def test_the_table_and_the_drill_down_say_the_capacity_alike() -> None:
    rank = make_rank(0, capacity_gib=23.5, used_gib=0.35)
    cells = dict(zip(COLUMN_KEYS, rank_rows(FleetView(T0, "x", (rank,), ())).__getitem__(0).cells(), strict=True))
    assert cells["memory"].endswith(" 358M/1.45G/23.5G")
    assert ("capacity", "23.5G") in memory_lines(rank)[1]


def test_sort_orders_and_filter_terms() -> None:
    view = fleet(4, r3={"alive": False, "stale_s": 12.0})
    rows = rank_rows(view)
    assert [r.rank for r in sort_rows(rows, "risk")][0] == 2
    assert [r.rank for r in sort_rows(rows, "step time")] == [3, 2, 1, 0]  # slowest first
    assert [r.rank for r in sort_rows(rows, "state")][0] == 3  # not answering first
    assert [r.rank for r in rows if RankFilter("1-2").matches(r)] == [1, 2]
    assert [r.rank for r in rows if RankFilter("stale").matches(r)] == [3]
    assert [r.rank for r in rows if RankFilter("warn 0").matches(r)] == [0, 2]
    assert [r.rank for r in rows if RankFilter("crit").matches(r)] == []
    assert [r.rank for r in rows if RankFilter("node0").matches(r)] == [0, 1, 2, 3]
    assert [r.rank for r in rows if RankFilter("nowhere").matches(r)] == []
    assert rows[3].state == "stale 12s" and rows[3].level == "stale"


def test_findings_one_entry_per_problem_newest_first() -> None:
    log = FindingsLog()
    overlap = [Finding(kind="poor_overlap", severity=Severity.WARN, title=f"rank {r}: {share:.0%} of step time is "
                       "exposed communication", rank=r, remedies=("prefetch",), metrics={"exposed_share": share})
               for r, share in ((1, 0.30), (3, 0.34))]
    first = log.update([OOM_FINDING], T0)
    assert [i.group.kind for i in first] == ["oom_risk"] and first[0].rank_key == "rank 2"
    later = log.update([OOM_FINDING, *overlap], T0 + 10**9)
    assert [i.group.kind for i in later] == ["poor_overlap", "oom_risk"]  # the newer problem first
    assert later[0].group.ranks == (1, 3) and later[0].rank_key == "rank 3"  # the worst rank, to open
    assert later[0].group.title == "ranks 1, 3: 30-34% of step time is exposed communication"
    assert log.update([*overlap], T0 + 2 * 10**9)[0].first_seen_ns == T0 + 10**9  # it did not start anew
    again = log.update([OOM_FINDING, *overlap], T0 + 3 * 10**9)
    assert [i.group.kind for i in again] == ["oom_risk", "poor_overlap"]  # gone and back: new again
    # Another remedy is another problem: an entry of its own, new.
    waiting = dataclasses.replace(overlap[0], remedies=("most of it is waiting for rank 3", "prefetch"))
    split = log.update([OOM_FINDING, waiting, overlap[1]], T0 + 4 * 10**9)
    assert [(i.group.ranks, i.first_seen_ns) for i in split] == [((1,), T0 + 4 * 10**9), ((2,), T0 + 3 * 10**9),
                                                                ((3,), T0 + 10**9)]


def test_straggler_and_memory_imbalance_across_ranks() -> None:
    # Rank 3 is busy 30 ms longer per step; the others wait for it, blocked 35 ms.
    steps = {r: make_rank(r, blocked_ms=35.0 if r != 3 else 5.0).steps for r in range(4)}
    finding = straggler_finding(steps)
    assert finding is not None and finding.rank == 3 and finding.kind == "straggler"
    assert finding.metrics["gap_s"] == pytest.approx(0.030, abs=1e-6)
    assert finding.severity is Severity.CRITICAL  # 30% of a 100 ms step
    even = {r: make_rank(r).steps for r in range(4)}
    assert straggler_finding(even) is None
    imbalance = memory_imbalance_finding({0: 10 * GIB, 1: 10 * GIB, 2: 14 * GIB})
    assert imbalance is not None and imbalance.rank == 2 and "29%" in imbalance.title
    assert memory_imbalance_finding({0: 10 * GIB, 1: 10 * GIB + 2**20}) is None


def test_trends_take_the_largest_over_ranks_per_step() -> None:
    t = trends(fleet(3).ranks)
    assert t.steps == tuple(range(12))
    assert t.step_s[-1] == pytest.approx(0.102)  # rank 2's 102 ms
    assert t.exposed_s[0] == pytest.approx(0.012)
    assert t.peak_memory[0] == 70 * GIB


def test_rank_detail_memory_collectives_and_timeline() -> None:
    rank = make_rank(1)
    categories, totals = memory_lines(rank)
    assert [c.label for c in categories] == ["optimizer state", "sharded params", "activations"]
    assert categories[0].share == pytest.approx(0.5)
    assert ("fragmentation", "1G") in totals and ("OOM risk", "ok") in totals
    assert ("steps to capacity", "-") in totals  # not growing toward it
    for steps, says in ((37.4, "37"), (0.0, "already over")):
        over = dataclasses.replace(rank, oom=dataclasses.replace(rank.oom, steps_to_capacity=steps))
        assert ("steps to capacity", says) in memory_lines(over)[1]
    rows = collective_rows(rank)
    assert rows[0][:3] == ("all_gather", "param_all_gather", "480")
    assert rows[0][6] == "150" and rows[0][8] == "11%"  # busbw GB/s; 0.1 s blocked of 0.9 s
    # Narrow: no mean, the meaning as what moves; the exposed share stays.
    narrow = dict(zip(NARROW_COLLECTIVE_COLUMNS, collective_rows(rank, narrow=True)[1], strict=True))
    assert (narrow["op"], narrow["meaning"], narrow["busbw"], narrow["exposed"]) == ("reduce_scatter", "grads", "140", "20%")
    timeline = phase_timeline(rank, n=3, width=20)
    assert [t.step for t in timeline] == [9, 10, 11]
    assert timeline[-1].cells == "F" * 6 + "B" * 12 + "O" * 2
    # Without phase spans (through Prometheus): the step's phase totals side by side.
    totals = phase_timeline(dataclasses.replace(rank, phases=()), n=1, width=20)
    assert totals[0].cells == "F" * 6 + "B" * 12 + "O" * 2


def test_uptime_is_exact_only_from_step_zero() -> None:
    clock = RunClock()
    assert clock.observe(fleet(2)) == (pytest.approx(12 * 0.101), True)
    later = RunClock()
    view = fleet(2)
    trimmed = FleetView(view.t_ns, view.source, tuple(dataclasses.replace(r, steps=r.steps[5:]) for r in view.ranks),
                        view.looked_at)
    uptime, exact = later.observe(trimmed)
    assert not exact and uptime == pytest.approx(7 * 0.101)
    # Agents that say when they started make it exact however late the TUI attached.
    started = FleetView(view.t_ns, view.source, tuple(dataclasses.replace(r, steps=r.steps[5:],
                                                                        start_ns=view.t_ns - 30 * 10**9 - r.rank)
                                                    for r in view.ranks), view.looked_at)
    assert RunClock().observe(started) == (pytest.approx(30.0 + 1e-9), True)
    # A run whose ranks all ended: its uptime stops at their last answer, however long the screen stays.
    clock = RunClock()
    clock.observe(started)
    ended = FleetView(view.t_ns + 60 * 10**9, view.source, tuple(dataclasses.replace(r, alive=False, ended=True)
                                                                 for r in view.ranks), view.looked_at)
    assert clock.observe(ended) == (pytest.approx(30.0 + 1e-9), True)  # the agents' start, remembered


def test_no_agent_text_says_where_and_how() -> None:
    text = no_agent_text(empty_fleet(), 1.0)
    assert "ZEROMON_REGISTRY" in text and "zeromon run -- torchrun" in text and "zeromon_agent.attach(" in text
    assert "Still looking, every 1 s" in text
    assert "Why:" not in text  # "no agent found (looked at: ...)" would only repeat the list
    unreadable = dataclasses.replace(empty_fleet(), error="agents/x.json: missing key 'port'")
    assert "Why: agents/x.json: missing key 'port'" in no_agent_text(unreadable, 1.0)


def test_no_agent_text_under_run_tui_and_through_prometheus() -> None:
    run = FleetView(T0, "run /runs/x", (), ("/runs/x/endpoints (the run folder's endpoints)",),
                    error="no agent found (looked at: /runs/x/endpoints (the run folder's endpoints))")
    text = no_agent_text(run, 1.0, JobStatus(pid=4242, log="/runs/x/launcher.log"))
    assert text.startswith("Waiting for the job's ranks to start and register")
    assert "pid 4242" in text and "/runs/x/launcher.log" in text and "/runs/x/endpoints" in text
    assert "zeromon run --" not in text and "Still looking" in text  # it is starting one: no advice to start a run
    ended = no_agent_text(run, 1.0, JobStatus(pid=4242, log="/runs/x/launcher.log", exit_code=3))
    assert ended.startswith("The job ended (exit status 3) before any rank registered") and "Still looking" not in ended
    # A run folder followed without the job (`zeromon attach RUN_DIR`, the dashboard beside `zeromon run`).
    waiting = no_agent_text(run, 1.0)
    assert waiting.startswith("Waiting for the ranks of /runs/x to start and register their agents.")
    assert "zeromon run --out FOLDER --" in waiting and "Still looking" in waiting
    prom = FleetView(T0, "prometheus http://127.0.0.1:1", (), ("prometheus http://127.0.0.1:1",),
                     error="prometheus http://127.0.0.1:1: connection refused")
    text = no_agent_text(prom, 1.0)
    assert "Why: prometheus http://127.0.0.1:1: connection refused" in text
    assert "Check that Prometheus is up" in text and "zeromon targets --write" in text
    assert "zeromon run --" not in text


# --- the app, through Pilot ----------------------------------------------------------------------------

def run_app(source: FakeSource, size: tuple[int, int] = (160, 48),
            body: Callable[[ZeromonApp, Any], Any] | None = None, **kwargs: Any) -> ZeromonApp:
    app = ZeromonApp(source, refresh_s=60, **kwargs)  # the tests drive refreshes themselves

    async def go() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            if body is not None:
                await body(app, pilot)

    asyncio.run(go())
    return app


def test_app_shows_header_table_findings_and_starts_and_stops_the_source() -> None:
    source = FakeSource(fleet(4))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        head = text_of(app.screen.query_one(FleetHeader))
        assert "llama-7b" in head and "DeepSpeed 0.19.8" in head and "ZeRO-3" in head and "world 4" in head
        assert "worst OOM risk warn: rank 2, headroom 3G" in head and "4/4 ranks answering" in head
        table = app.screen.query_one(RanksTable)
        assert table.row_count == 4
        assert [v.strip() for v in table.column_values("rank")] == ["0", "1", WORST_MARK + " 2", "3"]
        assert table.row_style("rank 2") == "bold yellow"  # colour too, not the symbol alone
        assert WORST_MARK + " 2" in screen_text(app)  # and drawn
        findings = findings_text(app.screen.query_one(FindingsPanel))
        assert "warn rank 2: peak at 91% of capacity" in findings
        assert "lower the micro-batch size" in findings and "peak 72.8 GiB" in findings
        assert not app.screen.query_one(NoAgentPanel).display

    run_app(source, body=body)
    assert source.started == 1 and source.stopped == 1


def test_sort_key_cycles_and_a_column_header_sorts() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        table = app.screen.query_one(RanksTable)
        assert table_column(table, "rank") == ["0", "1", "2", "3"]
        await pilot.press("s")  # rank -> risk
        assert app.sort == "risk" and table_column(table, "rank")[0] == "2"
        assert "sort risk" in text_of(app.screen.query_one(FleetHeader))
        for _ in range(3):  # -> headroom -> memory -> step time
            await pilot.press("s")
        assert app.sort == "step time" and table_column(table, "rank") == ["3", "2", "1", "0"]
        await pilot.click(RanksTable, offset=(2 + 75, 1))  # "state" (the 160-column layout: a border, a blank)
        await pilot.pause()
        assert app.sort == "state" and table_column(table, "rank")[0] == "0"
        app.sort = "rank"
        app.draw()
        assert table_column(table, "rank") == ["0", "1", "2", "3"]

    run_app(FakeSource(fleet(4)), body=body)


def test_filter_shows_matching_ranks_and_escape_clears_it() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        table = app.screen.query_one(RanksTable)
        await pilot.press("slash")
        field = app.screen.query_one("#filter", Input)
        assert field.display and field.has_focus
        await pilot.press("1", "-", "2")
        assert table_column(table, "rank") == ["1", "2"]
        assert app.sort == "rank"  # typing did not trigger the keys (s, p, q) of the screen
        await pilot.press("enter")
        assert table.has_focus and table_column(table, "rank") == ["1", "2"]
        assert "filter 1-2: 2 of 4" in text_of(app.screen.query_one(FleetHeader))
        await pilot.press("escape")
        assert table_column(table, "rank") == ["0", "1", "2", "3"] and not field.display

    run_app(FakeSource(fleet(4)), body=body)


def test_enter_drills_into_a_rank_and_escape_comes_back() -> None:
    source = FakeSource(fleet(4))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        app.screen.query_one(RanksTable).focus()
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, RankScreen) and screen.key == "rank 2"
        assert "rank 2 · node0 · pid 1002" in text_of(screen.query_one("#rank-title", Static))
        memory = text_of(screen.query_one("#rank-memory", Static))
        assert "optimizer state" in memory and "headroom" in memory and "3G" in memory
        collectives = screen.query_one("#rank-collectives", DataTable)
        assert collectives.row_count == 3 and str(collectives.get_row_at(0)[1]) == "param_all_gather"
        timeline = text_of(screen.query_one("#rank-timeline", Static))
        assert "\n     12 │FFFF" in timeline and "FFFF" in timeline and "BBBB" in timeline  # step 12: index 11
        # The drill-down follows the data.
        source.view = fleet(4, r2={"risk": Severity.CRITICAL, "headroom_gib": -1.0, "used_gib": 70.0})
        await settle(app, pilot)
        assert "risk critical" in text_of(screen.query_one("#rank-summary", Static))
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, RankScreen)
        assert table_column(app.screen.query_one(RanksTable), "risk")[2] == "crit"

    run_app(source, body=body)


def overlap_fleet(n: int) -> FleetView:
    """fleet(n) with every rank's overlap poor (a finding each, 20-28% exposed), rank 5's with another remedy."""
    overrides: dict[str, Any] = {}
    for r in range(n):
        share = 0.20 + (r * 7 % 9) / 100
        remedies = ("most of it is waiting for rank 3: make that rank faster first",) if r == 5 else ()
        finding = Finding("poor_overlap", Severity.WARN, f"rank {r}: {share:.0%} of step time is exposed communication",
                          rank=r, evidence=(f"median over steps 2-12: rank {r}'s exposed communication",),
                          remedies=(*remedies, "prefetch the next unit's all-gather"), metrics={"exposed_share": share})
        overrides[f"r{r}"] = {"findings": (finding, OOM_FINDING) if r == 2 else (finding,)}
    return fleet(n, **overrides)


def test_at_256_ranks_the_findings_are_one_entry_per_problem_and_enter_opens_the_worst_rank() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        panel = app.screen.query_one(FindingsPanel)
        groups = [item.group for item in panel.items]
        assert [(g.kind, g.ranks_text()) for g in groups] == [  # the most ranks first, then by kind
            ("poor_overlap", "ranks 0-255 but 5"), ("memory_imbalance", "rank 2"), ("oom_risk", "rank 2"),
            ("poor_overlap", "rank 5")]
        assert panel.option_count == 4 and str(panel.border_title) == "findings (4 on 256 ranks, newest first)"
        text = findings_text(panel)
        assert "warn ranks 0-255 but 5: 20-28% of step time is exposed communication" in text
        worst = groups[0].worst_rank
        assert worst is not None and f"▸  worst: rank {worst} (28%); the evidence is rank {worst}'s" in text
        assert text.count("prefetch the next unit's all-gather") == 2  # once an entry, not once a rank
        await pilot.press("tab")  # the findings panel; the first entry highlighted
        assert panel.has_focus and panel.highlighted == 0
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, RankScreen) and app.screen.key == f"rank {worst}"
        await pilot.press("escape", "end", "enter")  # the last entry: rank 5's own
        await pilot.pause()
        assert isinstance(app.screen, RankScreen) and app.screen.key == "rank 5"

    run_app(FakeSource(overlap_fleet(256)), body=body)


@pytest.mark.distributed
def test_a_recorded_256_rank_run_shows_its_overlap_as_one_entry_that_opens_its_worst_rank(fleet256_run: Path) -> None:
    """The final view of a generated 256-rank recording (conftest's fleet256_run), as `zeromon attach --replay`
    shows it at its end: the live analyses' findings of every rank, grouped."""
    from zeromon.sources.replay import final_view

    view = final_view(fleet256_run)

    async def body(app: ZeromonApp, pilot: Any) -> None:
        panel = app.screen.query_one(FindingsPanel)
        findings = sum(len(r.findings) for r in view.ranks)
        assert findings > 256 and len(panel.items) < 10
        overlap = next(item for item in panel.items if item.group.kind == "poor_overlap")
        assert len(overlap.group.ranks) >= 252 and overlap.rank_key == f"rank {overlap.group.worst_rank}"
        await pilot.press("tab")
        panel.highlighted = panel.items.index(overlap)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, RankScreen) and app.screen.key == overlap.rank_key

    run_app(FakeSource(view), body=body)


def test_pause_freezes_the_view_and_pauses_a_replay() -> None:
    source = FakeSource(fleet(4), replay=True)

    async def body(app: ZeromonApp, pilot: Any) -> None:
        table = app.screen.query_one(RanksTable)
        await pilot.press("p")
        assert app.paused and source.paused
        assert "PAUSED" in text_of(app.screen.query_one(FleetHeader))
        source.view = fleet(2)
        calls = source.calls
        await settle(app, pilot)
        assert source.calls == calls and table.row_count == 4  # not even asked
        await pilot.press("p")
        await settle(app, pilot)
        assert not source.paused and table.row_count == 2
        await pilot.press("plus")
        assert source.speed == 2.0 and "replay ×2" in text_of(app.screen.query_one(FleetHeader))
        await pilot.press("minus", "minus")
        assert source.speed == 0.5

    run_app(source, body=body)


def test_stale_ranks_show_and_a_rank_that_comes_back_is_picked_up() -> None:
    source = FakeSource(fleet(4))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        table = app.screen.query_one(RanksTable)
        source.view = fleet(4, r1={"alive": False, "stale_s": 7.0})
        await settle(app, pilot)
        assert table_column(table, "state")[1] == "stale 7s"
        assert table.column_values("rank")[1] == f" {STALE_MARK} 1" and table.row_style("rank 1") == "dim"
        assert "3/4 ranks answering" in text_of(app.screen.query_one(FleetHeader))
        source.view = fleet(4, **{f"r{r}": {"alive": False, "stale_s": 9.0} for r in range(4)})
        await settle(app, pilot)
        assert "no rank answers (connection refused" in text_of(app.screen.query_one(FleetHeader))
        source.view = fleet(4)  # they answer again
        await settle(app, pilot)
        assert table_column(table, "state") == ["alive"] * 4
        assert "4/4 ranks answering" in text_of(app.screen.query_one(FleetHeader))

    run_app(source, body=body)


def test_no_agent_message_then_the_agents_appear() -> None:
    source = FakeSource(empty_fleet())

    async def body(app: ZeromonApp, pilot: Any) -> None:
        panel = app.screen.query_one(NoAgentPanel)
        assert panel.display and not app.screen.query_one("#body").display
        text = text_of(panel)
        assert "No zeromon agent is answering" in text and ".cache/zeromon/agents" in text
        assert "zeromon run -- torchrun" in text and "zeromon_agent.attach(" in text
        source.view = fleet(2)  # it keeps looking: the next view has ranks
        await settle(app, pilot)
        assert not panel.display and app.screen.query_one(RanksTable).row_count == 2

    run_app(source, body=body)


def test_keys_reach_the_table_when_the_agents_appear_after_the_start() -> None:
    # `zeromon run --tui` always starts before its ranks: the table was hidden behind the "no agent" panel.
    source = FakeSource(empty_fleet())

    async def body(app: ZeromonApp, pilot: Any) -> None:
        assert app.screen.focused is None  # nothing focusable shows
        source.view = fleet(4)
        await settle(app, pilot)
        await pilot.press("down", "enter")  # no tab first
        await pilot.pause()
        assert isinstance(app.screen, RankScreen) and app.screen.key == "rank 1"

    run_app(source, size=(80, 24), body=body)


def test_sparkline_titles_show_their_numbers_after_longer_ones() -> None:
    source = FakeSource(fleet(2, r0={"exposed_ms": 1.0}, r1={"exposed_ms": 1.0}))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        assert "exposed comm 1.0 ms" in screen_text(app)
        source.view = fleet(3)  # a rank more: the sparklines are redone at once; rank 2 exposes 12 ms
        await settle(app, pilot)
        shown = screen_text(app)
        assert "exposed comm 12.0 ms" in shown and "peak memory 71.1G" in shown  # one cell longer, not cut

    run_app(source, size=(80, 24), body=body)


def test_the_drill_down_at_80_columns_shows_the_exposed_share() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        await pilot.press("down", "down", "enter")
        await pilot.pause()
        table = app.screen.query_one(CollectivesTable)
        assert [str(c.label) for c in table.columns.values()] == list(NARROW_COLLECTIVE_COLUMNS)
        assert table.virtual_size.width <= table.content_size.width  # nothing beyond the right edge
        assert [str(c) for c in table.get_row_at(0)][-1] == "11%" and "100%" in screen_text(app)

    run_app(FakeSource(fleet(4)), size=(80, 24), body=body)


def test_wide_drill_down_memory_labels_whole_and_phase_bars_as_wide_as_the_panel() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        await pilot.press("enter")
        await pilot.pause()
        shown = screen_text(app)
        assert "optimizer to come" in shown and "mean ms" in shown
        line = next(line for line in shown.splitlines() if "     12 │" in line)
        bar = line.split("     12 │")[1].split("│")[0]
        assert len(bar) > 80 and set(bar) == {"F", "B", "O"}  # 36 cells before, in a 140-cell panel

    run_app(FakeSource(fleet(4)), size=(200, 60), body=body)


def test_a_filter_matching_nothing_says_so() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        await pilot.press("slash", "z", "z")
        assert app.screen.query_one(RanksTable).row_count == 0
        assert "no rank matches 'zz' (escape clears the filter)" in screen_text(app)
        await pilot.press("escape")
        assert "no rank matches" not in screen_text(app)

    run_app(FakeSource(fleet(4)), size=(80, 24), body=body)


def ended_fleet(steps: int = 12) -> FleetView:
    """Every rank gone (as LiveSource shows the ranks of a job that exited, or a replay its end)."""
    return fleet(2, **{f"r{r}": {"alive": False, "stale_s": 3.0, "steps": steps} for r in range(2)})


def test_a_job_that_finishes_shows_its_final_state_not_a_crash() -> None:
    source = FakeSource(fleet(2))
    job = JobStatus(pid=4242, log="/runs/x/launcher.log")
    asked = []

    def final_view() -> FleetView:
        asked.append(1)
        return ended_fleet(steps=15)  # the recording has the steps after the last poll

    async def body(app: ZeromonApp, pilot: Any) -> None:
        nonlocal job
        assert "job running (pid 4242, output: launcher.log)" in text_of(app.screen.query_one(FleetHeader))
        source.view = ended_fleet()  # the ranks exited; the job's launcher ends a moment later
        job = dataclasses.replace(job, exit_code=0)
        await settle(app, pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        head = text_of(app.screen.query_one(FleetHeader))
        assert "job finished (exit 0) — showing its final state" in head
        assert "still looking" not in head and "no rank answers" not in head and "connection refused" not in head
        assert "step 15" in head  # the final steps, from the recording
        table = app.screen.query_one(RanksTable)
        assert table_column(table, "state") == ["ended", "ended"] and table.row_style("rank 0") != "dim"
        assert not app.screen.query_one(NoAgentPanel).display
        source.view = empty_fleet()  # whatever the source says now, the final state stays
        await settle(app, pilot)
        assert table.row_count == 2 and asked == [1]

    run_app(source, body=body, job=lambda: job, final_view=final_view)


def test_attach_to_a_run_whose_ranks_exited_shows_its_recordings_final_state() -> None:
    """`zeromon attach --run DIR` (no job of its own): once every rank has ended, the final
    state comes from the recording, not from whatever the last poll caught."""
    def gone(view: FleetView) -> FleetView:
        return dataclasses.replace(view, ranks=tuple(dataclasses.replace(r, alive=False, ended=True)
                                                     for r in view.ranks))

    source = FakeSource(fleet(2))
    asked = []

    def final_view() -> FleetView:
        asked.append(1)
        return gone(ended_fleet(steps=15))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        await settle(app, pilot)
        assert asked == []  # not while the ranks run
        source.view = gone(ended_fleet())
        await settle(app, pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        head = text_of(app.screen.query_one(FleetHeader))
        assert "run ended: every rank has ended — showing its final state (from the recording)" in head
        assert "step 15" in head and asked == [1]

    run_app(source, body=body, final_view=final_view)


def test_a_job_that_fails_says_so_and_keeps_the_last_data_polled() -> None:
    source = FakeSource(fleet(2))
    job = JobStatus(pid=4242, log="/runs/x/launcher.log")

    def no_recording() -> FleetView:
        raise ZeromonError("replay /runs/x: no rank-<r>.zmr (or .jsonl) recordings in this folder")

    async def body(app: ZeromonApp, pilot: Any) -> None:
        nonlocal job
        source.view = ended_fleet()
        job = dataclasses.replace(job, exit_code=-9)
        await settle(app, pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        head = text_of(app.screen.query_one(FleetHeader))
        assert "job ended with signal 9 (SIGKILL) — showing the last data polled (its recording: replay " in head
        assert "its output: /runs/x/launcher.log" in head and "step 12" in head

    run_app(source, body=body, job=lambda: job, final_view=no_recording)


def test_a_job_that_ends_before_any_rank_registers() -> None:
    job = JobStatus(pid=4242, log="/runs/x/launcher.log", exit_code=1)

    async def body(app: ZeromonApp, pilot: Any) -> None:
        assert "The job ended (exit status 1) before any rank registered" in text_of(app.screen.query_one(NoAgentPanel))

    run_app(FakeSource(empty_fleet()), body=body, job=lambda: job)


def test_a_finished_replay_says_so() -> None:
    source = FakeSource(fleet(2), replay=True)

    async def body(app: ZeromonApp, pilot: Any) -> None:
        source.view = fleet(2, **{f"r{r}": {"alive": False, "stale_s": 0.5} for r in range(2)})
        source.finished = True  # type: ignore[attr-defined]
        await settle(app, pilot)
        head = text_of(app.screen.query_one(FleetHeader))
        assert "replay finished — showing the recording's final state" in head and "still looking" not in head
        assert table_column(app.screen.query_one(RanksTable), "state") == ["ended", "ended"]

    run_app(source, body=body)


def test_live_source_tells_an_exited_rank_from_one_that_stopped_answering(tmp_path: Path) -> None:
    """A rank whose registered process is gone has ended; one whose process lives only stopped answering."""
    run_dir = tmp_path / "run"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for rank, pid in ((0, gone.pid), (1, os.getpid())):
        port = free_port()  # nothing listens there
        entry = registry.EndpointEntry(
            run_dir=str(run_dir), run_id="run", job="j", host=os.uname().nodename, address="127.0.0.1", port=port,
            url=registry.url_for("127.0.0.1", port), rank=rank, local_rank=rank, world_size=2, pid=pid,
            start_ns=T0, token_required=False)
        registry.write_entry(registry.run_entry_path(run_dir, rank), entry)
    view = LiveSource(run_dir=run_dir, timeout_s=2.0).poll()
    assert [(r.rank, r.alive, r.ended) for r in view.ranks] == [(0, False, True), (1, False, False)]
    assert all("connection refused" in (r.error or "") for r in view.ranks)
    rows = rank_rows(view)
    assert [r.state for r in rows] == ["ended", "down"]
    assert rank_title(view.ranks[0]).endswith("ended: its recording is complete")


def test_help_opens_and_closes_and_q_quits() -> None:
    async def body(app: ZeromonApp, pilot: Any) -> None:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "filter ranks" in text_of(app.screen.query_one("#help-text Static", Static))
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("tab")
        assert app.screen.query_one(FindingsPanel).has_focus  # tab: the next panel
        await pilot.press("q")
        await pilot.pause()
        assert app.return_code == 0 and not app.is_running

    run_app(FakeSource(fleet(4)), body=body)


def test_a_failing_source_is_shown_and_asked_again() -> None:
    source = FakeSource(fleet(3))

    async def body(app: ZeromonApp, pilot: Any) -> None:
        app.screen.query_one(RanksTable).focus()
        await pilot.press("down", "down", "enter")
        assert isinstance(app.screen, RankScreen)
        source.view = fleet(2)  # rank 2 is gone from the view
        await settle(app, pilot)
        assert "rank 2: no longer in the view" in text_of(app.screen.query_one("#rank-title", Static))
        await pilot.press("escape")
        source.fail = OSError("disk gone")
        await settle(app, pilot)
        assert "the source failed: OSError: disk gone" in text_of(app.screen.query_one(FleetHeader))
        assert app.screen.query_one(RanksTable).row_count == 2  # the last view stays
        source.fail = None
        await settle(app, pilot)
        assert "the source failed" not in text_of(app.screen.query_one(FleetHeader))

    run_app(source, body=body)


def test_a_source_that_cannot_start_is_shown() -> None:
    source = FakeSource(empty_fleet())

    def refuse() -> FakeSource:
        raise RuntimeError("no recording in runs/x")

    source.start = refuse  # type: ignore[method-assign]
    source.fail = RuntimeError("not started")

    async def body(app: ZeromonApp, pilot: Any) -> None:
        head = text_of(app.screen.query_one(FleetHeader))
        assert "the source failed: RuntimeError: not started" in head
        assert app.screen.query_one(NoAgentPanel).display  # and the screen still says where it looked

    run_app(source, body=body)


def test_hundreds_of_ranks_scroll_and_refresh_quickly() -> None:
    views = [fleet(256, t_ns=T0 + i * 10**9, r7={"step_ms": 1000.0 + i}) for i in range(6)]
    source = FakeSource(views[0])

    async def body(app: ZeromonApp, pilot: Any) -> None:
        table = app.screen.query_one(RanksTable)
        assert table.row_count == 256
        table.focus()
        await pilot.press("ctrl+end")
        assert table.cursor_row == 255 and table.scroll_y > 0
        await pilot.press("s", "s", "s", "s")  # step time: rank 7 first, the cursor stays on rank 255
        assert table_column(table, "rank")[0] == "7" and table.selected_key == "rank 255"
        took = []
        for view in views[1:]:
            source.view = view
            started = time.perf_counter()
            app.refresh_view()
            took.append(time.perf_counter() - started)
            await pilot.pause()
        assert sorted(took)[len(took) // 2] < 0.25, took  # the benchmark measures it properly; this catches a blow-up

    run_app(source, size=(200, 60), body=body)


# --- the CLI's flags -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "says"), [
    (["attach", "--speed", "2"], "--speed applies to --replay only"),
    (["attach", "--replay", ".", "--speed", "inf"], "--speed 'inf': is not finite: must be a speed factor from"),
    (["attach", "--replay", ".", "--speed", "nan"], "--speed 'nan': is not finite"),
    (["attach", "--replay", ".", "--speed", "0"], "--speed '0': must be a speed factor from 0.001 to 100000"),
    (["attach", "--interval", "0"], "--interval '0': must be seconds from 0.05 to 86400"),
    (["attach", "--interval", "inf"], "--interval 'inf': is not finite: must be seconds from 0.05 to 86400"),
    (["attach", "--interval", "1e-9"], "--interval '1e-9': must be seconds from 0.05 to 86400"),
    (["attach", "--prometheus", "http://[::1"], "--prometheus"),
    (["attach", "nohost"], "'nohost': neither a run folder (none has that name) nor a host:port target"),
    (["attach", "nohost:x"], "TARGET 'nohost:x': the port 'x' is not a number"),
    (["attach", "127.0.0.1:9470", "--run", "."], "give one source; TARGET and --run were given"),
    (["attach", "--prometheus", "http://p:9090", "--run", "."], "give one source; --run and --prometheus"),
    (["attach", "--replay", "/nonexistent/run"], "--replay /nonexistent/run: no such run folder"),
    (["attach", "--replay", ".", "--token", "t"], "takes no --token"),
    (["attach", "--run", "/nonexistent/run"], "--run /nonexistent/run: no such run folder"),
    (["attach", "tests", "zeromon"], "RUN_DIR: give one run folder, not 2"),
])
def test_bad_flags_exit_2_with_one_clear_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert says in err.splitlines()[0] and "Traceback" not in err


def test_attach_without_a_terminal_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach", "127.0.0.1:1"]) == 2  # pytest's stdin and stdout are not terminals
    assert "draws in a terminal" in capsys.readouterr().err


# --- `zeromon run --tui`, in a real terminal (tmux) ----------------------------------------------------

@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_run_tui_quit_leaves_the_job_running_and_returns_its_status(tmp_path: Path) -> None:
    out, done = tmp_path / "run", tmp_path / "status"
    job = "import sys, time; print('hello from the job', flush=True); time.sleep(4); sys.exit(3)"
    line = (f"{sys.executable} -m zeromon run --out {out} --tui -- {sys.executable} -c {shlex.quote(job)}; "
            f"echo $? > {done}; sleep 30")
    tmux = ["tmux", "-L", f"zeromon-test-{os.getpid()}"]  # a server of its own, started with child_env()
    subprocess.run([*tmux, "new-session", "-d", "-s", "t", "-x", "100", "-y", "30", line], env=child_env(),
                   cwd=REPO, check=True)

    def screen() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True).stdout

    def wait_for(what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; the screen:\n{screen()}"
            time.sleep(0.2)

    try:
        # The command has no process group, so no agent: the TUI waits for its ranks, says where it looks,
        # and the job's status; not how to start a run (it is starting one).
        wait_for("the TUI", lambda: "Waiting for the job's ranks to start and register" in screen())
        shown = screen()
        assert "endpoints" in shown and "zeromon run -- torchrun" not in shown
        assert "job running (pid" in shown
        subprocess.run([*tmux, "send-keys", "-t", "t", "q"], check=True)
        wait_for("the TUI to close", lambda: "the job goes on" in screen())
        assert not done.exists()  # the job runs on after the TUI quit
        wait_for("the job's exit status", lambda: done.exists() and done.read_text().strip() != "")
        assert done.read_text().strip() == "3"  # zeromon run returns the job's status
        assert "hello from the job" in (out / "launcher.log").read_text()
        # The job's output went to the log, not the terminal; its failure then shows the log's end, quoted.
        lines = [line.strip() for line in screen().splitlines()]
        assert "hello from the job" not in lines and "| hello from the job" in lines
        assert any("the job ended with exit status 3" in line for line in lines)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


# --- a real LiveSource against the real agents of a 2-rank gloo run -----------------------------------

SCENARIO = REPO / "tests" / "scenarios" / "live_train.py"


@pytest.mark.distributed
def test_the_app_on_a_real_two_rank_run(tmp_path: Path) -> None:
    run_dir, stop = tmp_path / "run", tmp_path / "STOP"
    env = child_env(ZEROMON_OUT=str(run_dir), ZEROMON_REGISTRY=str(tmp_path / "registry"), ZEROMON_PORT="0",
                    ZEROMON_JOB="tui-e2e")
    run_dir.mkdir()
    train = subprocess.Popen(ranks_args(2, SCENARIO, "--stop-file", str(stop), "--max-seconds", "120"),
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    source = LiveSource(run_dir=run_dir, interval_s=0.25)
    app = ZeromonApp(source, refresh_s=0.2, interval_s=0.25)

    async def wait_until(pilot: Any, check: Callable[[], bool], what: str, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.2)

    async def go() -> None:
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.screen.query_one(NoAgentPanel).display
                             or app.screen.query_one(RanksTable).row_count > 0, "the first view")
            await wait_until(pilot, lambda: [r.steps_done is not None and r.alive for r in app.rows] == [True, True],
                             "both ranks alive with a step")
            head = text_of(app.screen.query_one(FleetHeader))
            assert "tui-e2e" in head and "FSDP2" in head and "world 2" in head and "2/2 ranks answering" in head
            table = app.screen.query_one(RanksTable)
            assert table_column(table, "rank") == ["0", "1"] and table_column(table, "state") == ["alive"] * 2
            table.focus()
            await pilot.press("enter")

            def meanings() -> list[str]:
                return [str(c) for c in app.screen.query_one("#rank-collectives", DataTable).get_column_at(1)]

            await wait_until(pilot, lambda: isinstance(app.screen, RankScreen) and "param_all_gather" in meanings(),
                             "the rank's collectives")
            await pilot.press("escape")
            stop.touch()
            assert train.wait(timeout=60) == 0
            # The registered processes are gone: the ranks ended (not stale), and the header says the run did.
            await wait_until(pilot, lambda: table_column(app.screen.query_one(RanksTable), "state") == ["ended"] * 2,
                             "both ranks ended after the run ended", timeout_s=15)
            head = text_of(app.screen.query_one(FleetHeader))
            assert "run ended: every rank has ended" in head and "still looking" not in head

    try:
        asyncio.run(go())
    finally:
        stop.touch()
        if train.poll() is None:
            train.kill()
        out = train.communicate(timeout=30)[0]
    assert train.returncode == 0, out
    assert source._thread is None, "the app stopped its source"  # noqa: SLF001
