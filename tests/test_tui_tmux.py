"""End to end: the real `zeromon attach` in a real tmux, read with capture-pane and driven with send-keys.

Each test runs its own tmux server (``tmux -S <socket> -f /dev/null``: no user configuration, and
nothing of the user's sessions touched) with a 120x40 window whose one pane runs the CLI; the pane
stays after the CLI exits (remain-on-exit), so its last screen can still be read.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from conftest import REPO, child_env, ranks_args, zeromon

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (the CI installs it: .ci/run)")

SCENARIO = REPO / "tests" / "scenarios" / "live_train.py"
T = TypeVar("T")
# A ranks-table row: the marks (worst, not answering: none, one or both), the rank, then its cells.
ROW = re.compile(r"^\s*\W{0,2}\s*(\d+)\s+(.*)$")
HEADER_STEP = re.compile(r"\bstep (\d+)(?:–(\d+))?")


class Tmux:
    """One tmux server, one session, one pane running ``command``.

    The command runs under ``sh``, which writes its exit status to a file: tmux 3.3 now and then
    marks a pane dead (its terminal closed) without reaping the process, leaving no status to read.
    """

    def __init__(self, command: list[str], env: dict[str, str], status_file: Path, width: int = 120,
                 height: int = 40) -> None:
        # Its own socket, removed by kill() (a socket path must stay short: no pytest tmp folder).
        self.socket = Path(tempfile.gettempdir()) / f"zeromon-tui-test-{uuid.uuid4().hex[:8]}.sock"
        self.env = env
        self.status_file = status_file
        status_file.unlink(missing_ok=True)
        script = f"{shlex.join(command)}; echo $? > {shlex.quote(str(status_file))}"
        self.tmux("new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), "-c", str(REPO),
                  shlex.join(["sh", "-c", script]), ";", "set-option", "-t", "t", "remain-on-exit", "on")

    def tmux(self, *args: str) -> str:
        result = subprocess.run(["tmux", "-S", str(self.socket), "-f", os.devnull, *args], env=self.env,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"tmux {' '.join(args)}: {result.stderr}"
        return result.stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def exit_status(self) -> int | None:
        """The command's exit status; None while it runs."""
        text = self.status_file.read_text() if self.status_file.exists() else ""
        return int(text) if text.strip() else None

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", str(self.socket), "kill-server"], env=self.env, capture_output=True, timeout=30)
        self.socket.unlink(missing_ok=True)


@contextmanager
def tmux_pane(command: list[str], env: dict[str, str], status_file: Path) -> Iterator[Tmux]:
    pane = Tmux(command, env, status_file)
    try:
        yield pane
    finally:
        pane.kill()


def wait_for(check: Callable[[], T | None], pane: Tmux, timeout_s: float, what: str) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; the screen:\n{pane.screen()}")


def rows(screen: str) -> dict[int, str]:
    """The ranks table's rows by rank: the lines after the header line that names the columns."""
    lines = screen.splitlines()
    start = next((i for i, line in enumerate(lines) if "rank" in line.split() and "state" in line.split()), None)
    if start is None:
        return {}
    out = {}
    for line in lines[start + 1:]:
        match = ROW.match(line)
        if match is None:
            break
        out[int(match.group(1))] = match.group(2)
    return out


def _header(screen: str) -> list[str]:
    """The ranks table's column names, as the screen shows them (a cut column shows cut)."""
    line = next((line for line in screen.splitlines() if "rank" in line.split() and "state" in line.split()), "")
    return line.strip("│ ").split()


def header_step(screen: str) -> int | None:
    """The newest step the header shows (``step 7``, or ``step 6–7`` when the ranks differ)."""
    match = HEADER_STEP.search(screen)
    if match is None:
        return None
    return int(match.group(2) or match.group(1))


def zeromon_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "zeromon", *args]


def attach(*args: str) -> list[str]:
    return [sys.executable, "-m", "zeromon", "attach", *args]


def tui_env(**extra: str) -> dict[str, str]:
    """The pane's environment: the pane's own size (not this terminal's), a terminal Textual draws in."""
    env = child_env(TERM="xterm-256color", **extra)
    for name in ("COLUMNS", "LINES", "TMUX", "TMUX_PANE"):
        env.pop(name, None)
    return env


@pytest.mark.distributed
def test_attach_watches_a_live_2_rank_run_and_quits_with_q(tmp_path: Path) -> None:
    registry, run_dir, stop = tmp_path / "registry", tmp_path / "run", tmp_path / "STOP"
    env = child_env(ZEROMON_OUT=str(run_dir), ZEROMON_REGISTRY=str(registry), ZEROMON_PORT="0",
                    ZEROMON_JOB="tui-e2e")
    train = subprocess.Popen(ranks_args(2, SCENARIO, "--stop-file", str(stop), "--max-seconds", "150",
                                           "--sleep", "0.1"),
                             env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # No arguments: the newest local run, found through the user-level index (ZEROMON_REGISTRY).
        with tmux_pane(attach("--interval", "0.5"), tui_env(ZEROMON_REGISTRY=str(registry)),
                       tmp_path / "status") as pane:
            def both_alive() -> tuple[str, dict[int, str]] | None:
                screen = pane.screen()
                table = rows(screen)
                ok = sorted(table) == [0, 1] and all("alive" in r and re.search(r"\d+\.\d", r) for r in table.values())
                return (screen, table) if ok and header_step(screen) is not None else None

            screen, table = wait_for(both_alive, pane, 150, "both ranks' rows, alive, with numbers")
            assert "tui-e2e" in screen and "FSDP2" in screen and "2/2 ranks answering" in screen
            first = header_step(screen)
            assert first is not None
            wait_for(lambda: (s := header_step(pane.screen())) is not None and s >= first + 3, pane, 60,
                     f"the step to advance past {first + 2}")
            assert pane.exit_status() is None
            pane.keys("q")
            status = wait_for(lambda: (s := pane.exit_status()) is not None and (s,), pane, 15, "the TUI to exit")
            assert status == (0,), pane.screen()
        assert train.poll() is None  # quitting the TUI leaves the training alone
    finally:
        stop.touch()
        try:
            out = train.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            train.kill()
            out = train.communicate()[0]
    assert train.returncode == 0, out


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tui") / "run"
    result = zeromon("run", "--quiet", "--out", str(out), "--job", "tui-replay", "--",
                     *ranks_args(2, SCENARIO, "--steps", "30", "--sleep", "0.05"),
                     env=child_env(ZEROMON_ENDPOINT="0"), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.distributed
def test_attach_replay_pauses_with_p_and_quits_with_q(recorded_run: Path, tmp_path: Path) -> None:
    with tmux_pane(attach("--replay", str(recorded_run), "--speed", "0.5"), tui_env(), tmp_path / "status") as pane:
        def playing() -> str | None:
            screen = pane.screen()
            table = rows(screen)
            alive = sorted(table) == [0, 1] and all("alive" in r for r in table.values())
            return screen if alive and header_step(screen) is not None else None

        screen = wait_for(playing, pane, 60, "both ranks alive with a step")
        assert "tui-replay" in screen and "replay ×0.5" in screen
        pane.keys("p")
        paused = wait_for(lambda: "PAUSED" in (s := pane.screen()) and s, pane, 10, "the pause")
        time.sleep(2.0)  # 1 s of the recording at x0.5: steps of ~0.1 s would have moved on
        assert pane.screen() == paused  # nothing moves while paused
        held = header_step(paused)
        # The layout at the sizes a user has: at 160x45 the ranks table whole (its last column, host, too) and
        # the findings as wide as the rest; at 80x24 both ranks' rows and the table's header still there.
        pane.tmux("resize-window", "-t", "t", "-x", "160", "-y", "45")
        def seen(check: Callable[[str], bool]) -> Callable[[], str | None]:
            return lambda: s if check(s := pane.screen()) else None

        wide = wait_for(seen(lambda s: _header(s)[-1:] == ["host"]), pane, 15,
                        "the table's last column, host, whole at 160x45")
        assert sorted(rows(wide)) == [0, 1], wide
        border = next(line for line in wide.splitlines() if "findings (" in line)
        assert border.rindex("╮") - border.index("╭") >= 100, wide  # room for a finding's line
        pane.tmux("resize-window", "-t", "t", "-x", "80", "-y", "24")
        # the first nine columns whole, the rest a sideways scroll away
        small = wait_for(seen(lambda s: _header(s)[-1:] == ["state"] and sorted(rows(s)) == [0, 1]), pane, 15,
                         "both rows at 80x24")
        assert _header(small)[:2] == ["rank", "risk"] and max(map(len, small.splitlines())) <= 80, small
        pane.keys("p")
        wait_for(lambda: "PAUSED" not in pane.screen(), pane, 10, "the replay to resume")
        wait_for(lambda: (s := header_step(pane.screen())) is not None and (held is None or s > held), pane, 30,
                 "the replay to move on after the pause")
        pane.keys("q")
        status = wait_for(lambda: (s := pane.exit_status()) is not None and (s,), pane, 15, "the TUI to exit")
        assert status == (0,), pane.screen()


@pytest.mark.distributed
def test_run_tui_keys_work_at_once_and_the_end_shows_the_final_state(tmp_path: Path) -> None:
    """`zeromon run --tui` starts the TUI before its ranks: enter drills down with no tab first, and when
    the job finishes the screen says so, with the last step (from the recording), not a crash."""
    out = tmp_path / "run"
    command = zeromon_cli("run", "--quiet", "--out", str(out), "--job", "tui-end", "--tui", "--",
                          *ranks_args(2, SCENARIO, "--steps", "40", "--sleep", "0.1"))
    with tmux_pane(command, tui_env(ZEROMON_REGISTRY=str(tmp_path / "registry"), ZEROMON_PORT="0"),
                   tmp_path / "status") as pane:
        wait_for(lambda: "Waiting for the job's ranks to start and register" in pane.screen(), pane, 60,
                 "the TUI waiting for the job's ranks")
        wait_for(lambda: sorted(rows(pane.screen())) == [0, 1], pane, 150, "both ranks' rows")
        pane.keys("Enter")  # no tab: the table has the keys as soon as it shows
        wait_for(lambda: "collectives by op and ZeRO meaning" in pane.screen(), pane, 15, "the rank's drill-down")
        pane.keys("Escape")
        screen = wait_for(lambda: "showing its final state" in (s := pane.screen()) and s, pane, 150,
                          "the job's end")
        assert "job finished (exit 0) — showing its final state" in screen
        assert "still looking" not in screen and "connection refused" not in screen
        assert header_step(screen) == 40  # steps 0..39 recorded: the 40th is the last, as the script logs it
        assert all("ended" in row for row in rows(screen).values()), screen
        pane.keys("q")
        status = wait_for(lambda: (s := pane.exit_status()) is not None and (s,), pane, 30, "zeromon run to exit")
        assert status == (0,), pane.screen()


def test_run_tui_leaves_a_failed_jobs_status_and_output_on_the_terminal(tmp_path: Path) -> None:
    """Under --tui the job's output goes to launcher.log; once the TUI closes, a failed job's exit
    status and the end of its output must be on the terminal, not a hint about process groups."""
    out = tmp_path / "run"
    command = zeromon_cli("run", "--out", str(out), "--tui", "--",
                          sys.executable, "-c", "import sys; print('boom: bad batch'); sys.exit(3)")
    with tmux_pane(command, tui_env(ZEROMON_REGISTRY=str(tmp_path / "registry"), ZEROMON_PORT="0"),
                   tmp_path / "status") as pane:
        wait_for(lambda: "exit status 3" in pane.screen(), pane, 60, "the TUI to say the job ended")
        pane.keys("q")
        status = wait_for(lambda: (s := pane.exit_status()) is not None and (s,), pane, 30, "zeromon run to exit")
        screen = pane.tmux("capture-pane", "-p", "-J", "-S", "-200", "-t", "t")  # with the scrollback, lines joined
        assert status == (3,), screen
        assert f"the job ended with exit status 3; its output is in {out / 'launcher.log'}" in screen
        assert "its last line:" in screen
        assert "| boom: bad batch" in screen
        assert "process group" not in screen
