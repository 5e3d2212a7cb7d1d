"""What the dashboard's browser tests share: the real `zeromon dashboard` started as a subprocess on a
free port, Debian's headless chromium driven through Dash's own test browser
(dash.testing.browser.Browser), and what a test reads off a page: a graph's plotly traces as the
browser holds them, the console's SEVERE entries, a full-page screenshot kept as an artifact.

No browser is downloaded: the tests use the chromium and chromedriver on PATH (Debian's `chromium`
and `chromium-driver` packages; the CI installs them) and skip, saying so, where they are missing.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from conftest import REPO, child_env, free_port

T = TypeVar("T")
URL_LINE = re.compile(r"^zeromon dashboard: (http://\S+) \(")
WINDOW_WIDTH_PX = 1400
# A page taller than this is cut in the screenshot (chromium caps a window's size anyway).
SCREENSHOT_HEIGHT_MAX_PX = 6000


def browser_required() -> bool:
    """The CI sets ZEROMON_REQUIRE_BROWSER=1: there a missing browser fails the tests, not skips them."""
    return os.environ.get("ZEROMON_REQUIRE_BROWSER", "") not in ("", "0")


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        return (f"{' and '.join(missing)} not found on PATH: install Debian's chromium and chromium-driver "
                "(the CI does: .ci/run)")
    return None


def artifacts_dir() -> Path:
    """Where screenshots go: ZEROMON_TEST_ARTIFACTS, else test-artifacts/dashboard/ in the checkout."""
    folder = Path(os.environ.get("ZEROMON_TEST_ARTIFACTS") or REPO / "test-artifacts" / "dashboard")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# --- the real server ---------------------------------------------------------------------------------------

class Dashboard:
    """`python -m zeromon dashboard ARGS --port P`, as a user starts it; its output goes to files (a pipe
    nobody reads would block it once full)."""

    def __init__(self, *args: str, logs: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.command = [sys.executable, "-m", "zeromon", "dashboard", *args, "--port", str(self.port)]
        logs.mkdir(parents=True, exist_ok=True)
        self.stdout_path = logs / f"dashboard-{self.port}.out"
        self.stderr_path = logs / f"dashboard-{self.port}.err"
        self.env = env or child_env()
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""  # the URL the CLI printed (with its path prefix)

    def start(self, timeout_s: float = 60) -> Dashboard:
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(self.command, stdout=out, stderr=err, env=self.env, cwd=REPO)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = next((m for line in self.stdout.splitlines() if (m := URL_LINE.match(line))), None)
            if match is not None:
                self.url = match.group(1)
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"`zeromon dashboard` exited {self.proc.returncode}:\n{self.stderr[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"`zeromon dashboard` printed no URL in {timeout_s:g} s:\n{self.stderr[-3000:]}")

    @property
    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def page(self, path: str = "") -> str:
        """The URL of ``path`` ('memory?ranks=1') under the served prefix."""
        return self.url.rstrip("/") + "/" + path.lstrip("/")

    def stop(self) -> int | None:
        """Ctrl-C, as a user stops it; its exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of a plain request, redirects not followed."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


# --- the browser -------------------------------------------------------------------------------------------

@contextmanager
def chromium() -> Iterator[Any]:
    """Dash's test browser on Debian's headless chromium.

    dash.testing's Browser takes a prepared selenium Options object (``options=[opts]``) and adds its
    own flags (no sandbox, no /dev/shm, SEVERE console entries kept): the chromium binary is named
    there, so that the tests drive Debian's chromium whatever other Chrome is installed (selenium
    4.2 has no browser manager; it finds chromedriver on PATH). Headless is asked for here too, as
    --headless=new, rather than with Browser(headless=True), which adds the bare --headless flag.
    """
    from dash.testing.browser import Browser
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = str(shutil.which("chromium"))
    for arg in ("--headless=new", f"--window-size={WINDOW_WIDTH_PX},1000", "--hide-scrollbars"):
        options.add_argument(arg)
    with Browser("chrome", options=[options], percy_run=False, wait_timeout=30) as br:
        yield br


def wait_until(check: Callable[[], T | None], timeout_s: float, what: str,
               details: Callable[[], str] | None = None) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}"
                                 + (f"\n{details()}" if details else ""))
        time.sleep(0.2)


def console(br: Any) -> list[dict[str, Any]]:
    """The console entries since the last call (chromedriver hands each entry out once; Browser asks
    chromium for SEVERE ones only)."""
    return list(br.driver.get_log("browser"))


def severe(entries: list[dict[str, Any]]) -> list[str]:
    return [str(e.get("message")) for e in entries if e.get("level") == "SEVERE"]


def settled(br: Any) -> bool:
    """Dash has no callback in flight (its renderer's store, as dash.testing reads it)."""
    return bool(br.driver.execute_script("return !!window.store")) and br.redux_state_rqs == []


def open_page(br: Any, url: str, graphs: tuple[str, ...] = (), elements: tuple[str, ...] = (),
              timeout_s: float = 60) -> None:
    """Load ``url`` and wait until plotly has drawn each of ``graphs``, each of ``elements`` (ids) is in
    the page, and no callback is left in flight."""
    br.driver.get("about:blank")  # an earlier live page stops polling its (maybe stopped) server
    console(br)  # what an earlier page said is not this page's
    br.driver.get(url)
    br.wait_for_element_by_css_selector(br.dash_entry_locator, timeout=timeout_s)
    for graph_id in graphs:
        wait_until(lambda i=graph_id: br.driver.execute_script(_DRAWN_JS, i), timeout_s, f"#{graph_id} drawn",
                   lambda: page_text(br)[-2000:])
    for element_id in elements:
        wait_until(lambda i=element_id: br.find_elements(f"#{i}"), timeout_s, f"#{element_id} in the page",
                   lambda: page_text(br)[-2000:])
    wait_until(lambda: settled(br), timeout_s, "the page's callbacks to finish")


_DRAWN_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
return !!(gd && gd._fullLayout && gd.data);
"""

_FIGURE_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
if (!gd || !gd.data) return null;
return {data: gd.data, layout: {title: gd.layout.title, meta: gd.layout.meta || null,
        annotations: gd.layout.annotations || []}};
"""


def _decoded(value: Any) -> Any:
    """A plotly array as the page holds it: a list, or plotly.py's typed-array spec {dtype, bdata,
    shape} (how numpy arrays travel), decoded."""
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = value.get("shape")
        if shape:
            array = array.reshape([int(s) for s in str(shape).split(",")])
        return array.tolist()
    return value


def figure(br: Any, graph_id: str) -> dict[str, Any]:
    """The figure a dcc.Graph shows: {'data': [trace, ...], 'layout': {title, meta, annotations}},
    as plotly holds it in the browser, typed arrays decoded."""
    fig = br.driver.execute_script(_FIGURE_JS, graph_id)
    assert fig is not None, f"#{graph_id}: no plotly graph in the page"
    for trace in fig["data"]:
        for key in ("x", "y", "z", "base", "text", "customdata"):
            if key in trace:
                trace[key] = _decoded(trace[key])
    return dict(fig)


def title(fig: dict[str, Any]) -> str:
    t = fig["layout"].get("title")
    return str(t.get("text", "") if isinstance(t, dict) else t or "")


def page_text(br: Any) -> str:
    return str(br.driver.execute_script("return document.body.innerText"))


def text_of(br: Any, element_id: str) -> str | None:
    """An element's text, None while it is not in the page; read in one script, so that a live page
    redrawing the element between two selenium calls cannot leave a stale reference."""
    text = br.driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.innerText : null", element_id)
    return None if text is None else str(text)


def dropdown_values(br: Any, dropdown_id: str) -> list[str]:
    """What a dcc.Dropdown shows as chosen (its value items' labels)."""
    items = br.find_elements(f"#{dropdown_id}-value .dash-dropdown-value-item")
    return [item.text for item in items]


_CELL_JS = """
const gd = document.querySelector('#' + CSS.escape(arguments[0]) + ' .js-plotly-plot');
const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
return [box.left + xa.d2p(arguments[1]), box.top + ya.d2p(arguments[2])];
"""


def click_point(br: Any, graph_id: str, x: Any, y: Any) -> None:
    """A real mouse click on the graph's plot area at data coordinates (x, y), as a user clicks a cell
    (plotly's drag layer receives it and emits plotly_click; Dash turns that into clickData)."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    br.driver.execute_script(
        "document.querySelector('#' + CSS.escape(arguments[0])).scrollIntoView({block: 'center'})", graph_id)
    left, top = br.driver.execute_script(_CELL_JS, graph_id, x, y)
    actions = ActionBuilder(br.driver)
    actions.pointer_action.move_to_location(int(left), int(top))
    actions.pointer_action.click()
    actions.perform()


def screenshot(br: Any, name: str) -> Path:
    """The whole page as ``<artifacts>/<name>.png``: the window is made as tall as the page first (its
    frame, outer minus inner height, added: chromium sizes the window, not the viewport)."""
    height, frame = br.driver.execute_script(
        "return [Math.max(document.body.scrollHeight, document.documentElement.scrollHeight),"
        " window.outerHeight - window.innerHeight]")
    br.driver.set_window_size(WINDOW_WIDTH_PX, min(max(int(height), 700) + int(frame), SCREENSHOT_HEIGHT_MAX_PX))
    time.sleep(0.5)  # plotly redraws on resize
    path = artifacts_dir() / f"{name}.png"
    assert br.driver.save_screenshot(str(path)), f"chromium took no screenshot of {name}"
    br.driver.set_window_size(WINDOW_WIDTH_PX, 1000)
    return path
