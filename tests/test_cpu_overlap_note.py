"""A CPU run's overlap is near 0 % by nature (gloo has no GPU streams to hide communication behind): where a
front end says that overlap looks fine, it says why on CPU too (issue 35's healthy demo: 0 % overlap beside
"overlap ... look fine"). The TUI's line is read off a real terminal in tests/test_demo.py (healthy)."""

from __future__ import annotations

from zeromon.analysis.step_overlap import CPU_OVERLAP_NOTE
from zeromon.model.events import MemorySample
from zeromon.sources.fleet import RankView
from zeromon.views.fleet import on_cpu
from zeromon_dashboard.pages.overview import findings_list


def _rank(rank: int, device: str | None) -> RankView:
    memory = None if device is None else MemorySample(
        rank=rank, step=3, phase="optimizer", t_ns=1, device=device, allocated=None, reserved=None, active=None,
        peak_allocated=None, peak_reserved=None, inactive_split=None, num_alloc_retries=None, num_ooms=None,
        capacity=2**30, free=None, rss=2**28)
    return RankView(rank=rank, target=f"h:{9100 + rank}", alive=True, stale_s=0.1, error=None, memory=memory)


def test_a_run_is_on_cpu_when_every_rank_that_sampled_memory_sampled_the_hosts() -> None:
    assert on_cpu([_rank(0, "cpu"), _rank(1, "cpu")])
    assert on_cpu([_rank(0, "cpu"), _rank(1, None)])  # a rank without a sample yet says nothing
    assert not on_cpu([_rank(0, "cpu"), _rank(1, "cuda:0")])
    assert not on_cpu([_rank(0, "cuda:0")])
    assert not on_cpu([_rank(0, None)])  # nothing known yet: no note


def test_the_dashboards_empty_findings_say_why_a_cpu_runs_overlap_is_near_zero() -> None:
    said = str(findings_list([], cpu=True).children)
    assert "No findings" in said and CPU_OVERLAP_NOTE in said
    assert CPU_OVERLAP_NOTE not in str(findings_list([], cpu=False).children)
