"""A real hung run in the two graphical front ends: `zeromon attach` in a real terminal (tmux) and `zeromon
dashboard` in a real headless chromium name the stuck rank, its function and the collective its peer waits in,
within the threshold plus 10 s; and the run's recording, once it is stopped, says the same in a replay.

One run serves every test (a hung run costs ~15 s on 2 cores): rank 1 of a 2-rank FSDP2 run
(tests/scenarios/hang.py) sleeps in data_loader_stall() at its step 12 while rank 0 waits in an all_gather.
The TUI and the dashboard start while the run still steps, and each is watched from the start on a thread of its
own, so that both are timed from the hang itself whichever test reads its answer first.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from dashboard_browser import (
    Dashboard,
    browser_missing,
    browser_required,
    chromium,
    console,
    open_page,
    page_text,
    screenshot,
    severe,
    text_of,
    wait_until,
)
from test_hang import HANG_AFTER, SCENARIO, START_TIMEOUT, VERDICT_WITHIN, HungRun
from test_tui_tmux import Tmux, attach, rows, tui_env
from test_tui_tmux import wait_for as wait_on_screen

from zeromon.analysis.hang import STUCK, WAITING
from zeromon.model.codec import iter_records, rank_file_paths
from zeromon.sources.live import LiveSource
from zeromon.sources.replay import final_view
from zeromon.views.run_data import RECORDING_CHECK_S, LiveFeed
from zeromon_dashboard.pages.overview import banners

from conftest import torchrun_args

pytestmark = [pytest.mark.distributed, pytest.mark.filterwarnings("ignore:HTTPResponse.getheader:DeprecationWarning")]
NO_TMUX = shutil.which("tmux") is None
NO_BROWSER = browser_missing() is not None and not browser_required()
HANG_AT_STEP = 12  # late enough that the TUI and the dashboard are up before the hang begins
# The dashboard reads a recording again once its files grow, checked every RECORDING_CHECK_S: a verdict the ranks
# wrote there is on the page that long (and a read) after it is in the files.
DASHBOARD_WITHIN = VERDICT_WITHIN + RECORDING_CHECK_S + 2
BANNER = re.compile(r"HUNG rank 1 has not reached all_gather #\d+ of the default group .*?it is in data_loader_stall")
BORDERS = "│▌▐ "


class FirstSeen:
    """``check()`` asked on a thread of its own until it answers: its first answer, and when (monotonic)."""

    def __init__(self, check: Callable[[], Any], period_s: float = 0.3) -> None:
        self.check = check
        self.period_s = period_s
        self.value: Any = None
        self.at: float | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                value = self.check()
            except Exception as exc:  # a page between two loads, a pane redrawing: asked again
                self.error = f"{type(exc).__name__}: {exc}"
                value = None
            if value:
                self.value, self.at = value, time.monotonic()
                return
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def result(self, run: HungRun, timeout_s: float, what: str) -> tuple[Any, float]:
        """The first answer and the seconds from the run's hang to it; fails when none came in ``timeout_s``
        after the hang."""
        assert run.hung_at is not None
        self._thread.join(timeout=max(0.0, run.hung_at + timeout_s - time.monotonic()))
        self.stop()
        assert self.at is not None, f"no {what} {timeout_s:g} s after the hang began (last error: {self.error})"
        return self.value, self.at - run.hung_at


@dataclass
class Screens:
    run: HungRun
    pane: Tmux | None
    tui: FirstSeen | None
    dashboard: Dashboard | None
    browser: Any
    web: FirstSeen | None


def _recording_started(out: Path) -> bool:
    """Both ranks' files hold a record: `zeromon dashboard RUN_DIR` reads the recording (not the live agents)."""
    paths = rank_file_paths(out)
    return len(paths) == 2 and all(next(iter(iter_records(p)), None) is not None for p in paths)


def flat(screen: str) -> str:
    """The screen's lines joined, without the borders at their ends and with one space between words: a text
    wrapped over several lines reads as one."""
    return re.sub(r"\s+", " ", " ".join(line.strip(BORDERS) for line in screen.splitlines()))


def table_lines(screen: str) -> list[str]:
    """The screen's lines without the borders at their ends."""
    return [line.strip(BORDERS) for line in screen.splitlines()]


def _tui_banner(pane: Tmux) -> str | None:
    screen = pane.screen()
    return screen if BANNER.search(flat(screen)) else None


def _web_banner(br: Any) -> str | None:
    """The Overview's hang banner once it says hung (a recording read between the two ranks' reports is only
    stalled: one rank has said so, the other not yet), with rank 1 and its function."""
    found = br.driver.execute_script(
        "const e = document.getElementById('banner-hang'); return e ? [e.dataset.level, e.innerText] : null")
    if not found or found[0] != "critical":
        return None
    text = str(found[1])
    return text if "rank 1" in text and "data_loader_stall" in text else None


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Screens]:
    folder = tmp_path_factory.mktemp("hang-screens")
    run = HungRun(folder / "run", torchrun_args(2, SCENARIO, "--mode", "stuck", "--rank", "1", "--step",
                                                str(HANG_AT_STEP), "--steps", "40", "--step-sleep", "0.3"))
    pane = tui = dashboard = web = None
    browser: Any = None
    with_browser = not browser_missing()
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not _recording_started(run.out):
            assert run.proc.poll() is None and run.hung_at is None, "the run ended or hung before it recorded"
            assert time.monotonic() < deadline, "no recording:\n" + "\n".join(run.lines[-30:])
            time.sleep(0.2)
        if not NO_TMUX:
            pane = Tmux(attach(str(run.out), "--interval", "0.5"), tui_env(), folder / "tui-status")
            tui = FirstSeen(lambda: _tui_banner(pane))
        if with_browser:
            dashboard = Dashboard(str(run.out), logs=folder / "logs").start()
            browser_context = chromium()
            browser = browser_context.__enter__()
            open_page(browser, dashboard.page(), elements=("overview-banners",))
            web = FirstSeen(lambda: _web_banner(browser))
        run.wait_for_cue()
        yield Screens(run, pane, tui, dashboard, browser, web)
    finally:
        for watch in (tui, web):
            if watch is not None:
                watch.stop()
        if pane is not None:
            pane.kill()
        if browser is not None:
            browser_context.__exit__(None, None, None)
        if dashboard is not None:
            dashboard.stop()
        run.stop()


@pytest.mark.skipif(NO_TMUX, reason="tmux is not installed (the CI installs it: .ci/run)")
def test_attach_names_the_stuck_rank_its_function_and_the_all_gather_within_the_threshold_plus_10_s(
        screens: Screens) -> None:
    assert screens.pane is not None and screens.tui is not None
    screen, elapsed = screens.tui.result(screens.run, VERDICT_WITHIN + 20, "banner in the TUI")
    assert elapsed <= VERDICT_WITHIN, f"the banner came {elapsed:.1f} s after the hang:\n{screen}"
    table = rows(screen)
    assert "waiting" in table[0].split() and "stuck" in table[1].split(), screen  # the state column
    pane = screens.pane
    pane.keys("h")
    shown = wait_on_screen(lambda: "training threads' stacks" in (s := pane.screen()) and s, pane, 15,
                           "the hang screen")
    lines = table_lines(shown)
    assert any(re.match(r"1\s+stuck\s+\d+\s+\d+ s\s+in data_loader_stall \(hang\.py:\d+\)", line) for line in lines), shown
    assert any(re.match(r"0\s+waiting\s+\d+\s+\d+ s\s+rank 1\s+in all_gather #\d+ of the default group", line)
               for line in lines), shown
    assert re.search(r'File ".*hang\.py", line \d+, in data_loader_stall', shown), shown  # rank 1's stack
    pane.keys("Escape")
    wait_on_screen(lambda: "training threads' stacks" not in pane.screen() and _tui_banner(pane), pane, 15,
                   "the main screen again")  # before q: an escape and a q that come together are alt+q
    pane.keys("q")
    status = wait_on_screen(lambda: (s := pane.exit_status()) is not None and (s,), pane, 15, "the TUI to exit")
    assert status == (0,), pane.screen()


@pytest.mark.skipif(NO_BROWSER, reason=browser_missing() or "")
def test_the_dashboard_names_the_stuck_rank_and_its_function_within_the_threshold_plus_10_s(
        screens: Screens) -> None:
    assert screens.web is not None and screens.dashboard is not None, f"ZEROMON_REQUIRE_BROWSER: {browser_missing()}"
    text, elapsed = screens.web.result(screens.run, DASHBOARD_WITHIN + 20, "hang banner on the Overview")
    assert elapsed <= DASHBOARD_WITHIN, f"the banner came {elapsed:.1f} s after the hang: {text}"
    assert text.startswith("Hung: rank 1 has not reached all_gather #") and "rank 0 waits in it since" in text
    br = screens.browser
    assert br.driver.execute_script("return document.getElementById('banner-hang').dataset.rank") == "1"
    screenshot(br, "overview-hung")
    br.find_element("#banner-hang-link").click()
    wait_until(lambda: br.find_elements("#hang-ranks tr[data-rank='1']"), 30, "the Hang page's table",
               lambda: page_text(br)[-2000:])
    states = br.driver.execute_script(
        "return Array.from(document.querySelectorAll('#hang-ranks tr[data-rank]')).map(r => "
        "[r.dataset.rank, r.dataset.state, r.innerText])")
    assert [(rank, state) for rank, state, _ in states] == [("0", WAITING), ("1", STUCK)], states
    assert "data_loader_stall (hang.py:" in states[1][2]
    stacks = text_of(br, "hang-stacks") or ""
    assert re.search(r'File ".*hang\.py", line \d+, in data_loader_stall', stacks), stacks
    screenshot(br, "hang")
    errors = severe(console(br))
    assert not errors, "console errors:\n" + "\n".join(errors)
    assert "Traceback" not in screens.dashboard.stderr, screens.dashboard.stderr[-4000:]


def test_the_dashboard_on_the_live_agents_has_the_same_banner(screens: Screens) -> None:
    """`zeromon dashboard HOST:PORT ...` (or a run folder without a recording yet) follows the agents (LiveFeed):
    the verdict comes from their snapshots, through the same banner."""
    run = screens.run
    assert run.hung_at is not None
    time.sleep(max(0.0, run.hung_at + HANG_AFTER + 1 - time.monotonic()))  # the ranks have stalled
    source = LiveSource(run_dir=str(run.out))
    try:
        feed = LiveFeed(source)
        feed.add(source.poll())
    finally:
        source.stop()
    first = banners(feed.latest())[0]
    assert first.id == "banner-hang" and getattr(first, "data-rank") == "1"
    text = str(first.children[0].children[0])
    assert re.match(r"Hung: rank 1 has not reached all_gather #\d+ of the default group .*: it is in data_loader_stall",
                    text), text


def test_once_stopped_its_recording_names_the_stuck_rank_in_a_replay(screens: Screens) -> None:
    """SIGTERM stops both ranks (each writes where it was): the replay's verdict is the live one."""
    run = screens.run
    assert run.hung_at is not None
    time.sleep(max(0.0, run.hung_at + HANG_AFTER + 1 - time.monotonic()))  # the ranks have stalled
    run.stop()
    hang = final_view(run.out).hang
    assert hang is not None and hang.hung and hang.culprits == (1,), hang
    assert hang.of(1) is not None and hang.of(1).state == STUCK  # type: ignore[union-attr]
    assert hang.of(0) is not None and hang.of(0).state == WAITING  # type: ignore[union-attr]
    assert re.match(r"rank 1 has not reached all_gather #\d+ of the default group .*: it is in data_loader_stall",
                    hang.lines[0]), hang.lines
