"""The web dashboard with 256 ranks, and with 8 ranks x 10,000 steps: pages drawn in a real browser,
one step's timeline redrawn, a live refresh on the server, the server's RSS.

    python tests/bench/bench_dashboard.py [--quick] [--loads 7] [--refreshes 50] [--json out.json]

The issue's targets: the Overview of 256 ranks and the Memory page of 8 ranks x 10,000 steps drawn in
the browser in under 2 s; one step's timeline in under 500 ms; a live refresh callback under 100 ms on
the server; the dashboard process under 300 MB with those.

Two recordings are synthesized with bench_tui's writer (a ZeRO-3 GPU job: 1 s steps, 3 memory samples a
step, rank 7 a straggler, rank 100 leaking): 256 ranks x 120 steps with bench_tui's 16 collectives a
step, and 8 ranks x 10,000 steps with 4 collectives a step (16 would be 1.3M collectives held in the
server's memory; the Memory page's cost is its 30,000 memory samples a rank, not the collectives).

The browser part is the real thing: `python -m zeromon dashboard RUN_DIR --port P` in a subprocess, and
Debian's headless Chromium driven by selenium. A script added to every document before the page's own
(CDP Page.addScriptToEvaluateOnNewDocument) polls every 10 ms from the page itself and notes, with
performance.now() (ms since the navigation started), when the page is drawn: every expected graph
(``#<id> .js-plotly-plot``) holds its traces and Plotly has drawn them, no element carries
data-dash-is-loading and Dash's store has no callback requested, waiting or running; the time is taken
at the next frame after that. Each page is loaded --loads times afresh after a first load (the
server's first drawing of that page and, for the first page, the browser's first download of Dash and
Plotly), which is reported apart. A step change is typed into the Communication page's step input as a
user does (select, type, Enter) and timed from the Enter key to the redrawn timeline ("Step N:" in its
title), the page idle again. The server's RSS (VmRSS, VmHWM from /proc/PID/status) is read after all
that.

The live refresh runs in this process: a LiveFeed fed with the FleetViews of a ReplaySource of the
256-rank recording at successive positions (a third of a second apart: one memory sample a rank each;
the first ones untimed, so the histories hold what a dashboard that has watched a while holds), and
after each, each page's redraw callback called as the browser's tick calls it: a POST to
/_dash-update-component through the Flask test client (the page's draw function, Dash's JSON encoding
of the figures, the response). The Overview draws all 256 ranks, Memory and Communication the 2 ranks
they choose by default. Each page's callback runs once untimed first (its first call's imports). The
garbage collector is set as `zeromon dashboard` sets it once its app is built (what exists then, the
replay included, frozen out of full collections, which run less often); the refreshes a full
collection fell in are counted, and the p95 without them reported.

bench_tui places a step's collectives for 16 a step: with 4, the 2 reduce-scatters are issued 75 and
12 ms before their step's start. The Memory page does not draw collectives, and the step timeline
draws them as they are.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import bench_tui
import benchlib

from zeromon.demo.train import first_bindable

DRAWN_TARGET_MS = 2000.0  # the Overview of 256 ranks, the Memory page of 8 ranks x 10,000 steps
STEP_TARGET_MS = 500.0  # one step's timeline
REFRESH_TARGET_MS = 100.0  # a live refresh callback on the server
RSS_TARGET_MB = 300.0  # the dashboard process
PORTS = range(8160, 8170)  # this benchmark's share of the machine's ports; else any free one
LONG_COLLECTIVES = 4  # a step, in the 10,000-step recording
SERVER_START_S = 600.0  # reading and analysing the recording before it listens
DRAWN_TIMEOUT_S = 60.0
URL_LINE = re.compile(r"^zeromon dashboard: (http://\S+) \(", re.MULTILINE)

# What must be drawn, per page (by the URL's path).
GRAPHS = {"/": ("overview-grid-risk", "overview-grid-exposed"), "/memory": ("memory-stack", "memory-imbalance"),
          "/communication": ("comm-timeline",)}

# Runs in every page before its own scripts. window.__zm.result: {drawn_ms, ready_ms} once drawn.
WATCH_JS = r"""
(() => {
  const GRAPHS = __GRAPHS__;
  const zm = window.__zm = {result: null, step: null, enter_ms: null};
  function idle() {
    if (!window.store) return false;
    const callbacks = Object.assign({}, window.store.getState().callbacks);
    delete callbacks.stored; delete callbacks.completed;
    if (Object.values(callbacks).some(list => Array.isArray(list) && list.length)) return false;
    return !document.querySelector('[data-dash-is-loading]');
  }
  function plot(id) {
    const gd = document.querySelector('#' + id + ' .js-plotly-plot');
    if (!gd || !gd.data || !gd.data.length || !gd._fullLayout || !gd._fullData) return null;
    return gd.querySelector('.trace, .hm') ? gd : null;  // its traces drawn: SVG groups, heatmap images
  }
  function drawn(ids) { return ids.every(id => plot(id) !== null) && idle(); }
  function atNextFrame(ready, done) {
    requestAnimationFrame(() => setTimeout(() => done({ready_ms: ready, drawn_ms: performance.now()}), 0));
  }
  const timer = setInterval(() => {
    const ids = GRAPHS[location.pathname];
    if (ids && drawn(ids)) { clearInterval(timer); atNextFrame(performance.now(), r => { zm.result = r; }); }
  }, 10);
  // A step typed into the Communication page: from Enter to the timeline of that step drawn.
  document.addEventListener('keydown', e => { if (e.key === 'Enter') zm.enter_ms = performance.now(); }, true);
  zm.watchStep = (shown) => {
    zm.step = null; zm.enter_ms = null;
    const old = plot('comm-timeline').data;
    const want = 'Step ' + shown + ':';
    const t = setInterval(() => {
      const gd = plot('comm-timeline');
      const title = gd && gd.layout.title && (gd.layout.title.text || '');
      if (gd && gd.data !== old && title.startsWith(want) && zm.enter_ms !== null && idle()) {
        clearInterval(t); atNextFrame(performance.now(), r => { zm.step = r; });
      }
    }, 10);
  };
})();
""".replace("__GRAPHS__", json.dumps({k: list(v) for k, v in GRAPHS.items()}))


# --- data ---------------------------------------------------------------------------------------------------

def synthesize(run_dir: Path, ranks: int, steps: int, collectives: int) -> tuple[int, float]:
    """bench_tui's recording with ``collectives`` a step; the records written and the files' MB."""
    saved = bench_tui.COLLECTIVES
    bench_tui.COLLECTIVES = collectives
    try:
        records = bench_tui.synthesize(run_dir, ranks, steps, time.time_ns())
    finally:
        bench_tui.COLLECTIVES = saved
    return records, sum(f.stat().st_size for f in run_dir.iterdir()) / benchlib.MB


# --- the server ---------------------------------------------------------------------------------------------

def pick_port() -> int:
    port = first_bindable(PORTS)
    return port if port is not None else benchlib.free_port()


@contextmanager
def dashboard(run_dir: Path, logs: Path) -> Iterator[Server]:
    server = Server(run_dir, logs)
    try:
        yield server.start()
    finally:
        server.stop()


class Server:
    """`python -m zeromon dashboard RUN_DIR --port P`, its output to files (a pipe nobody reads blocks)."""

    def __init__(self, run_dir: Path, logs: Path) -> None:
        self.port = pick_port()
        self.command = [sys.executable, "-m", "zeromon", "dashboard", str(run_dir), "--port", str(self.port)]
        self.out, self.err = logs / f"dashboard-{self.port}.out", logs / f"dashboard-{self.port}.err"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.started_s = 0.0  # from the command to its URL line: the recording read and analysed

    def start(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZEROMON_")}  # no token, no registry
        started = time.perf_counter()
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=err, env=env, cwd=benchlib.REPO_ROOT)
        deadline = time.monotonic() + SERVER_START_S
        while time.monotonic() < deadline:
            match = URL_LINE.search(self.out.read_text())
            if match:
                self.url, self.started_s = match.group(1).rstrip("/"), time.perf_counter() - started
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"`{' '.join(self.command)}` exited {self.proc.returncode}:\n"
                                 f"{self.err.read_text()[-3000:]}")
            time.sleep(0.1)
        raise SystemExit(f"`{' '.join(self.command)}` printed no URL in {SERVER_START_S:g} s")

    def memory_bytes(self) -> tuple[int, int]:
        """VmRSS and VmHWM of the dashboard's process."""
        assert self.proc is not None
        fields: dict[str, int] = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) * 1024
        return fields["VmRSS"], fields["VmHWM"]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # as Ctrl-C: the server closes and the feed stops
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# --- the browser --------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Load:
    """One page load: ms from the navigation's start to the page drawn, and its largest callback."""

    drawn_ms: float
    callback_server_ms: float  # request sent to first byte of the largest update: the server's part
    callback_kb: float  # that response's body
    callback_end_ms: float  # when it had arrived (since the navigation's start): the rest is the browser's


class Browser:
    def __init__(self) -> None:
        from selenium import webdriver

        options = webdriver.ChromeOptions()
        options.binary_location = "/usr/bin/chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(options=options)
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_JS})
        self.errors: list[str] = []  # the console's SEVERE entries

    def close(self) -> None:
        self.driver.quit()

    def _wait(self, expression: str, what: str) -> Any:
        deadline = time.monotonic() + DRAWN_TIMEOUT_S
        while time.monotonic() < deadline:
            value = self.driver.execute_script(f"return {expression};")
            if value is not None:
                return value
            time.sleep(0.05)
        self.driver.save_screenshot(str(Path(tempfile.gettempdir()) / "bench-dashboard-timeout.png"))
        raise SystemExit(f"{what} not drawn in {DRAWN_TIMEOUT_S:g} s (screenshot in {tempfile.gettempdir()})")

    def load(self, url: str) -> Load:
        self.driver.get(url)
        result = self._wait("window.__zm && window.__zm.result", url)
        largest = self.largest_callback(0.0)
        self._collect_errors()
        return Load(float(result["drawn_ms"]), largest[0], largest[1] / 1024, largest[2])

    def largest_callback(self, since_ms: float) -> tuple[float, float, float]:
        """The largest callback response started after ``since_ms``: server ms, bytes, arrived at (ms)."""
        largest = self.driver.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.name.includes('_dash-update-component')"
            " && e.startTime >= arguments[0]).map(e => [e.responseStart - e.requestStart, e.encodedBodySize,"
            " e.responseEnd]).sort((a, b) => b[1] - a[1])[0] || [0, 0, 0];", since_ms)
        return float(largest[0]), float(largest[1]), float(largest[2])

    def step_change(self, shown: int) -> Load:
        """Type step ``shown`` (as the page shows steps, from 1) into the step input: ms from Enter to its
        timeline drawn, and the redraw's callback (its arrival, too, from Enter)."""
        from selenium.webdriver.common.by import By
        from selenium.webdriver.common.keys import Keys

        self.driver.execute_script("window.__zm.watchStep(arguments[0]);", shown)
        field = self.driver.find_element(By.ID, "communication-step")
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys(str(shown))
        field.send_keys(Keys.ENTER)
        result = self._wait("window.__zm.step", f"the timeline of step {shown}")
        enter_ms = float(self.driver.execute_script("return window.__zm.enter_ms;"))
        server_ms, size, end_ms = self.largest_callback(enter_ms)
        self._collect_errors()
        return Load(float(result["drawn_ms"]) - enter_ms, server_ms, size / 1024, end_ms - enter_ms)

    def shown_step(self) -> int:
        from selenium.webdriver.common.by import By

        return int(self.driver.find_element(By.ID, "communication-step").get_attribute("value"))

    def _collect_errors(self) -> None:
        self.errors += [e["message"] for e in self.driver.get_log("browser") if e.get("level") == "SEVERE"]


@dataclass(frozen=True, slots=True)
class PageTimes:
    first: Load
    again: list[Load]

    @property
    def drawn_ms(self) -> list[float]:
        return [x.drawn_ms for x in self.again]


def load_page(browser: Browser, url: str, loads: int) -> PageTimes:
    first = browser.load(url)
    return PageTimes(first, [browser.load(url) for _ in range(loads)])


def step_changes(browser: Browser, url: str, steps: int, changes: int) -> list[Load]:
    """Load the Communication page and change its step ``changes`` times (each a different step)."""
    browser.load(url)
    current = browser.shown_step()
    wanted = [s for s in dict.fromkeys(max(2, steps * k // (changes + 2)) for k in range(1, changes + 3))
              if s != current]
    out = []
    for shown in (wanted * changes)[:changes]:
        if shown == current:  # the same step again changes nothing
            continue
        out.append(browser.step_change(shown))
        current = shown
    return out


# --- the live refresh, in this process ----------------------------------------------------------------------

LIVE_PAGES = {"overview": "/", "memory": "/memory", "communication": "/communication"}


class JsonTimer:
    """Dash's JSON encoding of a callback's outputs (dash._callback.to_json), timed."""

    def __init__(self) -> None:
        import dash._callback

        self.module = dash._callback
        self.original: Callable[[Any], str] = dash._callback.to_json
        self.ms: list[float] = []

    def __enter__(self) -> JsonTimer:
        def timed(value: Any) -> str:
            started = time.perf_counter()
            try:
                return self.original(value)
            finally:
                self.ms.append((time.perf_counter() - started) * 1e3)

        self.module.to_json = timed
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.to_json = self.original


def redraw_body(app: Any, page: str, pathname: str, n: int) -> dict[str, Any]:
    """The POST the browser sends for ``page``'s redraw callback on tick ``n``."""
    key = next(k for k in app.callback_map if f"{page}-drawn.data" in k)
    spec = app.callback_map[key]
    outputs = [{"id": i, "property": p} for i, _, p in (o.partition(".") for o in key.strip(".").split("..."))]
    values = {("tick", "n_intervals"): n, ("url", "search"): "", ("url", "pathname"): pathname,
              (f"{page}-drawn", "data"): None}
    return {"output": key, "outputs": outputs,
            "inputs": [{**i, "value": values[(i["id"], i["property"])]} for i in spec["inputs"]],
            "state": [{**s, "value": values[(s["id"], s["property"])]} for s in spec["state"]],
            "changedPropIds": ["tick.n_intervals"]}


@dataclass(frozen=True, slots=True)
class LiveTimes:
    callback_ms: dict[str, list[float]]
    json_ms: dict[str, list[float]]
    collected: dict[str, list[bool]]  # a full garbage collection ran during the refresh
    collections: bench_tui.FullCollections
    response_kb: dict[str, float]
    memory_samples: int  # a rank's history when measured
    ranks: int


def live_refreshes(run_dir: Path, refreshes: int, warmup: int) -> LiveTimes:
    from zeromon.commands import dashboard as command
    from zeromon.sources.replay import ReplaySource
    from zeromon.views.run_data import LiveFeed
    from zeromon_dashboard.app import create_app

    replay = ReplaySource(run_dir)
    feed = LiveFeed(replay)  # never started: the views are given to it here
    app = create_app(feed, refresh_s=1.0)
    # What `zeromon dashboard` does once its app is built: what exists then (here the replay too, which
    # stands in for the agents) is frozen out of full garbage collections, and those run less often.
    thresholds = gc.get_threshold()
    command._calm_the_collector()
    client = app.server.test_client()
    gap_ns = int(bench_tui.STEP_S * 1e9 / 3)  # one memory sample a rank each time
    if (warmup + refreshes + 1) * gap_ns > replay.duration_ns:
        raise SystemExit("the recording is too short for --refreshes: add steps")
    for k in range(1, warmup + 1):
        feed.add(replay.view_at(k * gap_ns))
    callback_ms: dict[str, list[float]] = {page: [] for page in LIVE_PAGES}
    json_ms: dict[str, list[float]] = {page: [] for page in LIVE_PAGES}
    response_kb: dict[str, list[float]] = {page: [] for page in LIVE_PAGES}
    collected: dict[str, list[bool]] = {page: [] for page in LIVE_PAGES}
    collections = bench_tui.FullCollections()
    order = list(LIVE_PAGES)
    rng = random.Random(0)
    for page in order:  # once each, untimed: the first call's imports and caches are not a refresh's cost
        client.post("/_dash-update-component", json=redraw_body(app, page, LIVE_PAGES[page], 0))
    gc.callbacks.append(collections)
    with JsonTimer() as encoding:
        for n in range(refreshes):
            feed.add(replay.view_at((warmup + 1 + n) * gap_ns))  # the feed's thread does this, not the callback
            rng.shuffle(order)
            for page in order:
                body = redraw_body(app, page, LIVE_PAGES[page], n + 1)
                before = len(encoding.ms)
                started = time.perf_counter()
                response = client.post("/_dash-update-component", json=body)
                done = time.perf_counter()
                callback_ms[page].append((done - started) * 1e3)
                collected[page].append(collections.during(started, done))
                text = response.get_data(as_text=True)
                if response.status_code != 200 or "could not be drawn" in text:
                    raise SystemExit(f"the {page} redraw failed ({response.status_code}): {text[:500]}")
                json_ms[page].append(sum(encoding.ms[before:]))
                response_kb[page].append(len(text) / 1024)
    gc.callbacks.remove(collections)
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    histories = feed.latest().histories
    return LiveTimes(callback_ms, json_ms, collected, collections,
                     {p: benchlib.median(v) for p, v in response_kb.items()},
                     min(len(h.memory) for h in histories.values()), len(histories))


# --- rows ---------------------------------------------------------------------------------------------------

def p95(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def breakdown(loads: Sequence[Load]) -> str:
    """Where a load's time went (medians): the server's part of its largest callback, and the browser's
    after that callback's response arrived."""
    server = benchlib.median([x.callback_server_ms for x in loads])
    kb = benchlib.median([x.callback_kb for x in loads])
    arrived = benchlib.median([x.callback_end_ms for x in loads])
    after = benchlib.median([x.drawn_ms - x.callback_end_ms for x in loads])
    return (f"its largest callback {server:.0f} ms on the server, {kb:,.0f} KB, arrived at {arrived:.0f} ms; "
            f"drawn {after:.0f} ms after that")


def drawn_rows(what: str, times: PageTimes, target_ms: float, note: str,
               first: str = "the server's first drawing of the page") -> list[benchlib.Row]:
    """Median and max of the loads after the first (against the target), and the first apart."""
    target = f"< {target_ms:g} ms"
    ms = times.drawn_ms
    median_, max_ = benchlib.median(ms), max(ms)
    return [
        benchlib.Row("dashboard", f"{what} drawn in the browser (median)", "ms", None, median_, target,
                     median_ < target_ms, f"{len(ms)} fresh loads after the first; {breakdown(times.again)}; {note}"),
        benchlib.Row("dashboard", f"{what} drawn in the browser (max)", "ms", None, max_, target, max_ < target_ms),
        benchlib.Row("dashboard", f"{what} drawn in the browser, first load", "ms", None, times.first.drawn_ms,
                     "informational", None, f"{first}; {breakdown([times.first])}"),
    ]


def step_rows(what: str, changes: Sequence[Load], note: str) -> list[benchlib.Row]:
    ms = [x.drawn_ms for x in changes]
    median_, max_ = benchlib.median(ms), max(ms)
    target = f"< {STEP_TARGET_MS:g} ms"
    return [
        benchlib.Row("dashboard", f"{what} step timeline redrawn after a step change (median)", "ms", None, median_,
                     target, median_ < STEP_TARGET_MS,
                     f"{len(ms)} steps typed into the step input, from Enter to the timeline drawn; "
                     f"{breakdown(changes)} (from Enter); {note}"),
        benchlib.Row("dashboard", f"{what} step timeline redrawn after a step change (max)", "ms", None, max_,
                     target, max_ < STEP_TARGET_MS),
    ]


class RssLog:
    """The dashboard process's VmRSS after each stage: where its memory went."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.stages: list[tuple[str, float]] = []

    def mark(self, stage: str) -> None:
        self.stages.append((stage, self.server.memory_bytes()[0] / benchlib.MB))

    def row(self, what: str, note: str) -> benchlib.Row:
        rss, peak = (b / benchlib.MB for b in self.server.memory_bytes())
        stages = ", ".join(f"{stage} {mb:.0f}" for stage, mb in self.stages)
        return benchlib.Row("dashboard", f"{what} dashboard process RSS after the pages", "MB", None, rss,
                            f"< {RSS_TARGET_MB:g} MB", rss < RSS_TARGET_MB and peak < RSS_TARGET_MB,
                            f"peak (VmHWM) {peak:.0f} MB; VmRSS (MB) {stages}; {note}")


def live_rows(live: LiveTimes) -> list[benchlib.Row]:
    rows = []
    for page, shown in (("overview", f"Overview ({live.ranks} ranks)"), ("memory", "Memory (2 ranks)"),
                        ("communication", "Communication (2 ranks)")):
        ms = live.callback_ms[page]
        median_, p95_ = benchlib.median(ms), p95(ms)
        target = f"< {REFRESH_TARGET_MS:g} ms"
        note = (f"{len(ms)} refreshes, each rank's history {live.memory_samples} memory samples; "
                f"of it Dash's JSON encoding {benchlib.median(live.json_ms[page]):.1f} ms (median), "
                f"response {live.response_kb[page]:,.0f} KB; {benchlib.load_note()}")
        quiet = [t for t, hit in zip(ms, live.collected[page], strict=True) if not hit]
        hit = [t for t, hit in zip(ms, live.collected[page], strict=True) if hit]
        rows += [benchlib.Row("dashboard", f"live refresh callback, {shown} (median)", "ms", None, median_, target,
                              median_ < REFRESH_TARGET_MS, note),
                 benchlib.Row("dashboard", f"live refresh callback, {shown} (p95)", "ms", None, p95_, target,
                              p95_ < REFRESH_TARGET_MS),
                 benchlib.Row("dashboard", f"live refresh callback, {shown}, no full garbage collection in it (p95)",
                              "ms", None, p95(quiet or [0.0]), "informational", None,
                              f"{len(hit)} of {len(ms)} refreshes had one of the process's "
                              f"{len(live.collections.spans)} full collections in them (median "
                              f"{benchlib.median(live.collections.ms or [0.0]):.0f} ms each), max "
                              f"{max(hit, default=0.0):.0f} ms")]
    return rows


# --- the runs -----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Sizes:
    ranks: int
    steps: int
    long_ranks: int
    long_steps: int
    loads: int
    changes: int
    refreshes: int
    warmup: int


FULL = Sizes(ranks=256, steps=120, long_ranks=8, long_steps=10_000, loads=7, changes=7, refreshes=50, warmup=250)
QUICK = Sizes(ranks=32, steps=40, long_ranks=2, long_steps=500, loads=3, changes=3, refreshes=10, warmup=60)


def wide_run(browser: Browser, run_dir: Path, logs: Path, sizes: Sizes, data_note: str) -> list[benchlib.Row]:
    """The many-ranks recording: Overview, Communication's step changes, the server's RSS."""
    what = f"{sizes.ranks} ranks:"
    with dashboard(run_dir, logs) as server:
        rss = RssLog(server)
        rss.mark("at start")
        started = f"the server listened {server.started_s:.0f} s after its start (read + analysed)"
        overview = load_page(browser, server.url + "/", sizes.loads)
        rss.mark(f"after the Overview x{1 + sizes.loads}")
        print(f"overview drawn: first {overview.first.drawn_ms:.0f} ms, then {fmt_ms(overview.drawn_ms)}", flush=True)
        steps = step_changes(browser, server.url + "/communication?ranks=0,1", sizes.steps, sizes.changes)
        rss.mark(f"after Communication with {len(steps)} step changes")
        print(f"step changes: {fmt_ms([x.drawn_ms for x in steps])}", flush=True)
        browser.load(server.url + "/memory")  # each page drawn before the RSS is read
        rss.mark("after Memory")
        note = f"{data_note}; {started}; {benchlib.load_note()}"
        return [*drawn_rows(f"{what} Overview", overview, DRAWN_TARGET_MS, note,
                            "the server's first drawing of the page, the browser's first download of Dash and Plotly"),
                *step_rows(f"{what} ranks 0,1:", steps, note),
                rss.row(what, started)]


def long_run(browser: Browser, run_dir: Path, logs: Path, sizes: Sizes, data_note: str) -> list[benchlib.Row]:
    """The long recording: the Memory page (its default 2 ranks, then all ranks), a step change, RSS."""
    what = f"{sizes.long_ranks} ranks x {sizes.long_steps:,} steps:"
    with dashboard(run_dir, logs) as server:
        rss = RssLog(server)
        rss.mark("at start")
        started = f"the server listened {server.started_s:.0f} s after its start (read + analysed)"
        default = load_page(browser, server.url + "/memory", sizes.loads)
        rss.mark(f"after Memory x{1 + sizes.loads}")
        print(f"memory drawn: first {default.first.drawn_ms:.0f} ms, then {fmt_ms(default.drawn_ms)}", flush=True)
        every = load_page(browser, server.url + f"/memory?ranks=0-{sizes.long_ranks - 1}", sizes.loads)
        rss.mark(f"after Memory of all ranks x{1 + sizes.loads}")
        print(f"memory, all ranks: first {every.first.drawn_ms:.0f} ms, then {fmt_ms(every.drawn_ms)}", flush=True)
        steps = step_changes(browser, server.url + "/communication?ranks=0,1", sizes.long_steps, sizes.changes)
        rss.mark(f"after Communication with {len(steps)} step changes")
        print(f"step changes: {fmt_ms([x.drawn_ms for x in steps])}", flush=True)
        browser.load(server.url + "/")
        rss.mark("after the Overview")
        note = f"{data_note}; {started}; {benchlib.load_note()}"
        return [*drawn_rows(f"{what} Memory (2 ranks, the default)", default, DRAWN_TARGET_MS, note),
                *drawn_rows(f"{what} Memory (all {sizes.long_ranks} ranks)", every, DRAWN_TARGET_MS, note),
                *step_rows(f"{what} ranks 0,1:", steps, note),
                rss.row(what, started)]


def fmt_ms(values: Sequence[float]) -> str:
    return ", ".join(f"{v:.0f}" for v in values) + " ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small recordings and few repeats: a check that it runs")
    parser.add_argument("--loads", type=int, help="fresh loads of each page after the first (default 7)")
    parser.add_argument("--refreshes", type=int, help="live refreshes timed (default 50)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.loads is not None:
        sizes = replace(sizes, loads=args.loads)
    if args.refreshes is not None:
        sizes = replace(sizes, refreshes=args.refreshes)

    with tempfile.TemporaryDirectory(prefix="zeromon-bench-dashboard-") as tmp:
        wide_dir, long_dir, logs = Path(tmp) / "wide", Path(tmp) / "long", Path(tmp)
        started = time.perf_counter()
        records, size_mb = synthesize(wide_dir, sizes.ranks, sizes.steps, bench_tui.COLLECTIVES)
        wide_note = (f"{sizes.ranks} ranks x {sizes.steps} steps, {bench_tui.COLLECTIVES} collectives a step "
                     f"({records:,} records, {size_mb:.0f} MB)")
        long_records, long_mb = synthesize(long_dir, sizes.long_ranks, sizes.long_steps, LONG_COLLECTIVES)
        long_note = (f"{sizes.long_ranks} ranks x {sizes.long_steps:,} steps, 3 memory samples and "
                     f"{LONG_COLLECTIVES} collectives a step ({long_records:,} records, {long_mb:.0f} MB)")
        print(f"synthesized {wide_note} and {long_note} in {time.perf_counter() - started:.0f} s", flush=True)

        browser = Browser()
        try:
            rows = wide_run(browser, wide_dir, logs, sizes, wide_note)
            rows += long_run(browser, long_dir, logs, sizes, long_note)
        finally:
            browser.close()
        started = time.perf_counter()
        live = live_refreshes(wide_dir, sizes.refreshes, sizes.warmup)
        print(f"live refreshes in {time.perf_counter() - started:.0f} s", flush=True)
        rows += live_rows(live)
    if browser.errors:
        print("the browser's console had errors:\n  " + "\n  ".join(browser.errors[:10]), file=sys.stderr)
    benchlib.print_rows(f"zeromon dashboard: {sizes.ranks} ranks, {sizes.long_ranks} x {sizes.long_steps:,} steps",
                        rows)
    benchlib.write_rows(args.json, rows, {"console_errors": browser.errors[:20]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
