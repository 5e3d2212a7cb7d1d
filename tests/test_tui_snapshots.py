"""`zeromon attach`'s layout, as pytest-textual-snapshot SVGs under tests/__snapshots__/.

The views are built from fixed data with a fixed clock (test_tui's fleet(), through its FakeSource
test double), so a change in these pictures is a change in the layout. After an intended change:
``python -m pytest tests/test_tui_snapshots.py --snapshot-update`` and look at the new SVGs.
"""

from __future__ import annotations

from typing import Any

from test_tui import FakeSource, empty_fleet, fleet, overlap_fleet

from zeromon.tui.app import ZeromonApp

SMALL = (80, 24)
LARGE = (200, 60)


def app_for(view: Any, replay: bool = False) -> ZeromonApp:
    return ZeromonApp(FakeSource(view, replay=replay), refresh_s=3600)  # no refresh while the picture is taken


def eight_ranks() -> Any:
    return fleet(8, r1={"alive": False, "stale_s": 7.0})


def test_main_screen_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(eight_ranks()), terminal_size=SMALL)


def test_main_screen_200x60_with_64_ranks(snap_compare: Any) -> None:
    assert snap_compare(app_for(fleet(64, r5={"alive": False, "stale_s": 31.0}), replay=True), terminal_size=LARGE)


def test_256_ranks_findings_one_entry_per_problem_200x60(snap_compare: Any) -> None:
    """Every rank's poor overlap in one entry (its ranks, spread, worst rank), the findings panel focused (tab)."""
    assert snap_compare(app_for(overlap_fleet(256)), press=["tab"], terminal_size=LARGE)


def test_sorted_by_risk_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(eight_ranks()), press=["s"], terminal_size=SMALL)


def test_rank_drill_down_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(eight_ranks()), press=["down", "down", "enter"], terminal_size=SMALL)


def test_rank_drill_down_200x60(snap_compare: Any) -> None:
    assert snap_compare(app_for(eight_ranks()), press=["down", "down", "enter"], terminal_size=LARGE)


def test_no_agent_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(empty_fleet()), terminal_size=SMALL)


def test_replay_finished_80x24(snap_compare: Any) -> None:
    """The end of a replay: said plainly, the final data kept, every rank "ended" (not stale)."""
    source = FakeSource(fleet(8, **{f"r{r}": {"alive": False, "stale_s": 0.5} for r in range(8)}), replay=True)
    source.finished = True  # type: ignore[attr-defined]
    assert snap_compare(ZeromonApp(source, refresh_s=3600), terminal_size=SMALL)


def test_help_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(eight_ranks()), press=["question_mark"], terminal_size=SMALL)
