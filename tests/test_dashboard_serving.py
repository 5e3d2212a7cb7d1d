"""The dashboard's plumbing without a browser: the URL state, the token and path-prefix rules, the
feeds (a recording, a replay, live views) and the overview's banners, on a real recording."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.comm_advice import EXPOSED_SHARE_CRITICAL
from zeromon.sources.fleet import FleetView
from zeromon.views.overview import exposed_banner, grid_shape, oom_banner, rank_cells
from zeromon.views.run_data import LiveFeed, RankHistory, ReplayFeed, RunData, StaticFeed, recording_data
from zeromon_dashboard.server import PrefixMiddleware, TokenMiddleware, loopback
from zeromon_dashboard.state import PageState, page_of, parse_state, state_search

# --- the URL ---------------------------------------------------------------------------------------------


def test_the_url_keeps_page_ranks_and_step_counted_from_1() -> None:
    state = parse_state("/communication", "?ranks=0,3&step=12&params=7B")
    assert state == PageState(page="communication", ranks=(0, 3), step=11, extra=(("params", "7B"),))
    assert state_search(state) == "?ranks=0,3&step=12&params=7B"
    assert parse_state("/memory", "?ranks=2-5").ranks == (2, 3, 4, 5)


@pytest.mark.parametrize("search", ["?ranks=a,b", "?step=0", "?step=-3", "?step=x", "?ranks=5-1", "??&&=="])
def test_a_hand_edited_url_gives_the_defaults_for_what_it_spoils(search: str) -> None:
    state = parse_state("/memory", search)
    assert state.page == "memory" and state.ranks == () and state.step is None


def test_unknown_pages_and_prefixes() -> None:
    assert page_of("/nope") == "overview"
    assert page_of("/user/me/proxy/8050/ranks/", "/user/me/proxy/8050/") == "ranks"
    assert page_of(None) == "overview"


# --- serving -----------------------------------------------------------------------------------------------

def _call(app: Any, path: str, query: str = "", headers: dict[str, str] | None = None) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {"PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": ""}
    environ.update({f"HTTP_{k.upper().replace('-', '_')}": v for k, v in (headers or {}).items()})
    seen: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(response_headers)

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def _echo(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"{environ.get('SCRIPT_NAME', '')}|{environ['PATH_INFO']}".encode()]


def test_a_prefix_is_served_whether_or_not_the_proxy_strips_it() -> None:
    app = PrefixMiddleware(_echo, "/user/me/proxy/8050/")
    assert _call(app, "/user/me/proxy/8050/memory")[2] == b"/user/me/proxy/8050|/memory"
    assert _call(app, "/user/me/proxy/8050")[2] == b"/user/me/proxy/8050|/"
    assert _call(app, "/memory")[2] == b"|/memory"  # stripped by the proxy already
    assert _call(app, "/user/me/proxy/80500/x")[2] == b"|/user/me/proxy/80500/x"  # not the prefix


def test_the_token_rule() -> None:
    app = TokenMiddleware(_echo, "s3cret", "/")
    status, headers, body = _call(app, "/")
    assert status.startswith("401") and b"?token=" in body and "Bearer" in headers["WWW-Authenticate"]
    assert _call(app, "/", headers={"Authorization": "Bearer wrong"})[0].startswith("401")
    assert _call(app, "/", headers={"Authorization": "bearer s3cret"})[0] == "200 OK"  # any case, as the agents
    assert _call(app, "/", headers={"Cookie": "zeromon_token=s3cret"})[0] == "200 OK"
    # A browser's first visit: the token in the query sets the cookie and goes to the same page without it.
    status, headers, _ = _call(app, "/memory", "ranks=1&token=s3cret")
    assert status.startswith("303") and headers["Location"] == "/memory?ranks=1"
    assert headers["Set-Cookie"].startswith("zeromon_token=s3cret;") and "HttpOnly" in headers["Set-Cookie"]
    assert _call(app, "/memory", "token=nope")[0].startswith("401")


def test_loopback_addresses() -> None:
    assert loopback("127.0.0.1") and loopback("::1") and loopback("localhost") and loopback("127.1.2.3")
    assert not loopback("0.0.0.0") and not loopback("10.0.0.1") and not loopback("example.org")


# --- on a real recording -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(fsdp2_run: Path) -> RunData:
    return recording_data(fsdp2_run)


@pytest.mark.distributed
def test_a_recording_is_read_whole_with_its_report(data: RunData, fsdp2_run: Path) -> None:
    from zeromon.model.codec import read_run

    recordings = read_run(fsdp2_run)
    assert data.kind == "recording" and data.finished and not data.live
    assert sorted(data.histories) == [0, 1] and data.report is not None
    for rec in recordings:
        history = data.histories[rec.rank]
        assert len(history.memory) == len(rec.memory) and len(history.steps) == len(rec.steps) == 8
        step = history.steps[3].step
        expected = sorted((c for c in rec.collectives if c.step == step), key=lambda c: c.issue_ns)
        assert history.step_collectives(step) == expected and expected
    assert data.findings == data.report.findings


@pytest.mark.distributed
def test_the_banners_speak_for_the_worst_rank(data: RunData) -> None:
    assert data.report is not None
    shares = {r.rank: r.median_exposed_share for r in data.report.ranks}
    worst = max(shares, key=lambda r: shares[r] or 0)
    banner = exposed_banner(data)
    assert banner is not None and banner.rank == worst
    # gloo on CPU overlaps nothing: a third of the step is exposed, as the report's finding says.
    assert (banner.level == "critical") == ((shares[worst] or 0) >= EXPOSED_SHARE_CRITICAL)
    assert f"{shares[worst]:.0%}" in banner.text
    # Its window said, the findings' own (the steps after the first, numbered from 1), and its ms the report's.
    steps = len(data.histories[worst].steps)
    assert banner.text.endswith(f" ms per step), median of steps 2-{steps}"), banner.text
    exposed_s = next(r.median_exposed_comm_s for r in data.report.ranks if r.rank == worst)
    assert exposed_s is not None and f"({exposed_s * 1e3:.1f} ms per step)" in banner.text
    memory = oom_banner(data)
    assert memory is not None and memory.level == "ok"  # a few hundred MiB of a host's RAM share
    assert "headroom" in memory.text and f"rank {memory.rank}" in memory.text
    cells = rank_cells(data)
    assert [c.rank for c in cells] == [0, 1] and all(c.used_share is not None and 0 < c.used_share < 1 for c in cells)


def test_the_grid_keeps_a_node_per_row_then_goes_square() -> None:
    assert grid_shape(2) == (1, 2) and grid_shape(16) == (2, 8) and grid_shape(64) == (8, 8)
    assert grid_shape(256) == (16, 16) and grid_shape(1024) == (32, 32) and grid_shape(0) == (0, 0)


@pytest.mark.distributed
def test_a_replay_shows_each_rank_up_to_its_position(fsdp2_run: Path) -> None:
    """Each rank's history at a position is its recording's records published by then (cut from the tables
    the replay holds: nothing copied), steps in step order, found by step as a recording's are."""
    from zeromon.model.codec import read_run
    from zeromon.views.timeline import default_step, rank_step, step_choices

    recordings = {rec.rank: rec for rec in read_run(fsdp2_run)}
    feed = ReplayFeed(fsdp2_run, speed=1.0)
    replay = feed.replay
    versions = []
    for position in (0, replay.duration_ns // 2, replay.duration_ns * 3 // 4, replay.duration_ns):
        replay.seek(position)
        data = feed.latest()
        versions.append(data.version)
        t = replay.start_ns + position
        assert data.kind == "replay" and data.live and set(data.histories) == set(recordings)
        for rank, history in data.histories.items():
            rec = recordings[rank]
            assert list(history.memory) == sorted((m for m in rec.memory if m.t_ns <= t), key=lambda m: m.t_ns)
            steps = sorted((s for s in rec.steps if s.end_ns <= t), key=lambda s: s.step)
            assert list(history.steps) == steps
            assert list(history.phases) == sorted((p for p in rec.phases if p.end_ns <= t), key=lambda p: p.end_ns)
            assert list(history.ooms) == [o for o in rec.ooms if o.t_ns <= t]
            for summary in steps:
                assert history.step_collectives(summary.step) == sorted(
                    (c for c in rec.collectives if c.step == summary.step and c.issue_ns <= t), key=lambda c: c.issue_ns)
                drawn = rank_step(history, summary.step)  # found by step in the table's keys
                assert not isinstance(drawn, str) and drawn.summary == summary, drawn
            assert "is not held by this dashboard" in str(rank_step(history, len(rec.steps) + 5))
            assert step_choices({rank: history}, [rank]) == ((steps[0].step, steps[-1].step) if steps else None)
        # The step a timeline opens on: the newest every rank with steps holds with its phases.
        chosen = default_step(data.histories, sorted(data.histories))
        held = [h for h in data.histories.values() if h.steps]
        assert chosen is None if not held else all(
            any(s.step == chosen for s in h.steps) and any(p.step == chosen for p in h.phases) for h in held)
        # What the pages draw of it is what they draw of the same records held as objects.
        held_as_objects = {rank: RankHistory(
            rank=rank, memory=list(h.memory), steps=list(h.steps), phases=list(h.phases),
            collectives=h.collectives, ooms=list(h.ooms), complete=False, until_ns=t) for rank, h in data.histories.items()}
        _assert_pages_draw_the_same(data, dataclasses.replace(data, histories=held_as_objects))
    assert versions == sorted(set(versions))
    assert sum(len(h.steps) for h in data.histories.values()) == sum(len(r.steps) for r in recordings.values())


def _same(a: Any, b: Any) -> bool:
    """Equal, numpy arrays compared by value (NaN equal to NaN) wherever they sit in dataclasses, tuples, dicts."""
    import numpy as np

    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b), equal_nan=np.asarray(a).dtype.kind == "f")
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (tuple, list)):
        return isinstance(b, (tuple, list)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "to_plotly_json"):  # a figure or a Dash component, as the page sends it
        return type(a) is type(b) and _same(a.to_plotly_json(), b.to_plotly_json())
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:  # NaN
        return True
    return bool(a == b)


def _assert_pages_draw_the_same(data: RunData, expected: RunData) -> None:
    from zeromon.views import memory, overview, ranks, timeline

    ranks_shown = sorted(data.histories)
    origin = memory.origin_ns(data.histories)
    assert origin == memory.origin_ns(expected.histories)
    drawn = {
        "memory rows": lambda d: memory.memory_rows(d),
        "step matrix": lambda d: ranks.step_matrix(d),
        "memory peaks": lambda d: ranks.memory_peaks(d),
        "exposed shares": lambda d: overview.rank_exposed_shares(d),
        "step choices": lambda d: timeline.step_choices(d.histories, ranks_shown),
        "default step": lambda d: timeline.default_step(d.histories, ranks_shown),
    }
    for rank in ranks_shown:
        drawn[f"rank {rank} series"] = lambda d, r=rank: (
            memory.memory_series(d.histories[r], origin or 0), memory.allocator_series(d.histories[r], origin or 0),
            timeline.step_series(d, r), timeline.step_bytes(d.histories[r]))
    step = timeline.default_step(expected.histories, ranks_shown)
    if step is not None:
        drawn["timeline"] = lambda d: timeline.step_timeline(d.histories, ranks_shown, step)
    # Each page's figures and tables, as its callback sends them, on its default state.
    from zeromon_dashboard.pages import communication
    from zeromon_dashboard.pages import memory as memory_page
    from zeromon_dashboard.pages import overview as overview_page
    from zeromon_dashboard.pages import ranks as ranks_page

    drawn["overview page"] = lambda d: overview_page._draw(parse_state("/", ""), d)
    drawn["memory page"] = lambda d: memory_page._draw(parse_state("/memory", ""), d)
    drawn["communication page"] = lambda d: (communication._draw(parse_state("/communication", ""), d, None),
                                             communication._draw_step(parse_state("/communication", ""), d))
    drawn["ranks page"] = lambda d: ranks_page._draw(parse_state("/ranks", ""), d)
    for what, draw in drawn.items():
        assert _same(draw(data), draw(expected)), what


def test_a_replays_steps_that_ended_out_of_order_show_once_every_earlier_step_has_ended() -> None:
    from zeromon.model.columns import ColumnTable
    from zeromon.model.events import StepSummary
    from zeromon.views.run_data import _in_step_order

    def step(index: int, end_ns: int) -> StepSummary:
        return StepSummary(rank=0, step=index, start_ns=end_ns - 50, end_ns=end_ns, phase_s={}, collectives=0,
                           comm_bytes=0, comm_bytes_by_op={}, comm_union_s=0.0, blocked_s=0.0, peak_memory=None)

    in_order = ColumnTable(StepSummary, [step(0, 100), step(1, 200), step(2, 300)], "end_ns")
    table, ends, keys = _in_step_order(in_order)
    assert table is in_order and list(ends) == [100, 200, 300] and keys is not None and list(keys) == [0, 1, 2]
    assert [s.step for s in table.prefix(2, keys).slice(0, 9)] == [0, 1] and list(table.prefix(2, keys).t_ns) == [0, 1]
    # Step 1 ended after step 2 (an odd loop): by step, step 2 waits for it.
    odd = ColumnTable(StepSummary, [step(0, 100), step(1, 400), step(2, 300)], "end_ns")
    table, ends, keys = _in_step_order(odd)
    assert keys is None and list(table.t_ns) == [0, 1, 2] and list(ends) == [100, 400, 400]
    assert [s.step for s in table.prefix(1).slice(0, 9)] == [0]


@pytest.mark.distributed
def test_live_views_build_each_ranks_history_without_duplicates(fsdp2_run: Path) -> None:
    """A LiveFeed fed the views a replay of a real run gives at 20 moments (what a LiveSource gives
    while polling): each memory sample and step is kept once, in order, and what was seen stays."""
    from zeromon.sources.replay import ReplaySource

    replay = ReplaySource(fsdp2_run)
    views = [replay.view_at(replay.duration_ns * i // 20) for i in range(21)]
    feed = LiveFeed(StaticFleet(views[0]), interval_s=1.0)
    for view in views + [views[-1]]:  # the last view twice: nothing is added again
        feed.add(view)
    data = feed.latest()
    assert data.kind == "live"
    for rank, history in data.histories.items():
        steps = [s.step for s in history.steps]
        assert steps == sorted(set(steps)) and steps[-1] == 7
        times = [m.t_ns for m in history.memory]
        assert times == sorted(set(times))
        seen = {v.memory.t_ns for view in views for v in view.ranks if v.rank == rank and v.memory is not None}
        assert set(times) == seen


@pytest.mark.distributed
def test_live_history_is_bounded_over_all_ranks(fsdp2_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zeromon.sources.replay import ReplaySource
    from zeromon.views import run_data

    monkeypatch.setattr(run_data, "LIVE_SAMPLES_TOTAL", 8)
    monkeypatch.setattr(run_data, "LIVE_SAMPLES_MIN", 3)
    replay = ReplaySource(fsdp2_run)
    feed = LiveFeed(StaticFleet(replay.view_at(0)))
    for i in range(41):
        feed.add(replay.view_at(replay.duration_ns * i // 40))
    for history in feed.latest().histories.values():
        assert len(history.memory) <= 4 and len(history.steps) <= 4  # 8 over 2 ranks
        assert history.steps[-1].step == 7  # the newest kept


def test_a_live_feed_tells_each_change_of_the_sources_error() -> None:
    said: list[str | None] = []
    down = FleetView(t_ns=1, source="prometheus http://127.0.0.1:9", ranks=(), looked_at=("x",),
                     error="Prometheus refused the connection")
    feed = LiveFeed(StaticFleet(down), on_error=said.append)
    feed.add(down)
    feed.add(dataclasses.replace(down, error=None))
    assert said == ["Prometheus refused the connection", None]
    assert feed.latest().error is None


def test_a_static_feed_is_what_it_was_given() -> None:
    data = RunData(kind="trace", source="traces in x", version=1,
                   fleet=FleetView(t_ns=0, source="x", ranks=(), looked_at=()), finished=True)
    assert StaticFeed(data).start().latest() is data and not data.live


class StaticFleet:
    """A source that always answers the same view (LiveFeed's tests feed it views with ``add``)."""

    def __init__(self, view: FleetView) -> None:
        self.view = view

    def start(self) -> StaticFleet:
        return self

    def stop(self) -> None:
        pass

    def latest(self) -> FleetView:
        return self.view


@pytest.mark.distributed
def test_the_app_serves_its_layout_under_a_prefix(data: RunData) -> None:
    """The real Dash app behind the real middleware, through werkzeug's test client."""
    from werkzeug.test import Client

    from zeromon_dashboard.app import create_app
    from zeromon_dashboard.server import wsgi_app

    prefix = "/user/me/proxy/8050/"
    app = create_app(StaticFeed(data), prefix=prefix)
    client = Client(wsgi_app(app, prefix, token=None))
    page = client.get(prefix + "memory")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'{prefix}_dash-component-suites/' in html and "zeromon" in html
    assert client.get(prefix + "_dash-layout").status_code == 200
    assert client.get("/_dash-layout").status_code == 200  # a proxy that strips the prefix
