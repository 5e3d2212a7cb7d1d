"""One run, many machines' folders: a job whose nodes each ran their own `zeromon run --out nodeK` (a
disk per node) is read as one run from its folders, or from a quoted glob, by `report`, `summary`,
`live --replay`, `attach --replay` and `dashboard` (a recording or a replay); folders of two runs, a
rank in two folders and a folder without recordings are refused in one line (exit 2), and a node's
folder left out is named.

The run is real: two launchers started at once on this machine, each `zeromon run --out nodeK --
torchrun --nnodes 2 --node-rank K --nproc-per-node 1` of the FSDP2 example over one rendezvous, as
two nodes would run it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from zeromon.model.codec import missing_ranks_note

from conftest import EXAMPLES, REPO, child_env, free_port, zeromon

STEPS = 5


def _node_command(out: Path, node: int, port: int) -> list[str]:
    return [sys.executable, "-m", "zeromon", "run", "--quiet", "--out", str(out), "--",
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            str(EXAMPLES / "fsdp2_train.py"), "--steps", str(STEPS)]


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding node0/ and node1/: the two launchers' --out, rank 0 in one, rank 1 in the other."""
    job = tmp_path_factory.mktemp("job")
    port = free_port()
    launchers = [subprocess.Popen(_node_command(job / f"node{k}", k, port), env=child_env(), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in launchers]
    for launcher, output in zip(launchers, outputs, strict=True):
        assert launcher.returncode == 0, output[-3000:]
    return job


def _header(path: Path) -> dict[str, Any]:
    with path.open() as handle:
        header: dict[str, Any] = json.loads(handle.readline())
    return header


def _without_paths(value: Any) -> Any:
    """A report's JSON without where it was read from (the folders and files named)."""
    if isinstance(value, dict):
        return {k: _without_paths(v) for k, v in value.items() if k not in ("run_dir", "file")}
    if isinstance(value, list):
        return [_without_paths(v) for v in value]
    return value


def _refusal(*args: str, cwd: Path) -> str:
    """The one error line of a refused command (exit 2, nothing on stdout, a hint after)."""
    result = zeromon(*args, cwd=cwd)
    assert result.returncode == 2 and result.stdout == "", (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    error, hint = result.stderr.splitlines()
    assert error.startswith("zeromon: error: ") and hint.startswith("hint: "), result.stderr
    return error.removeprefix("zeromon: error: ")


@pytest.mark.distributed
def test_each_launcher_wrote_its_own_rank_and_both_share_the_jobs_run_id(nodes: Path) -> None:
    assert sorted(p.relative_to(nodes).as_posix() for p in nodes.glob("node*/rank-*.jsonl")) == \
        ["node0/rank-0.jsonl", "node1/rank-1.jsonl"]
    first, second = _header(nodes / "node0" / "rank-0.jsonl"), _header(nodes / "node1" / "rank-1.jsonl")
    assert first["world_size"] == second["world_size"] == 2 and first["job"] == second["job"]
    # Agreed through the job's rendezvous store by two processes of two launchers: one id, not two.
    assert isinstance(first["run_id"], str) and len(first["run_id"]) == 32
    assert first["run_id"] == second["run_id"]


@pytest.mark.distributed
def test_report_of_two_folders_is_the_report_of_their_files_in_one(nodes: Path, tmp_path: Path) -> None:
    together = tmp_path / "together"
    together.mkdir()
    for path in nodes.glob("node*/rank-*.jsonl"):
        shutil.copy(path, together)
    one = zeromon("report", "--json", str(together))
    two = zeromon("report", "--json", "node0", "node1", cwd=nodes)
    glob = zeromon("report", "--json", "node*", cwd=nodes)  # quoted: the glob reaches zeromon
    for result in (one, two, glob):
        assert result.returncode == 0 and result.stderr == "", result.stderr
    report = json.loads(two.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["world_size"] == 2
    assert all(r["steps"] == STEPS for r in report["ranks"])
    assert report["run_dir"] == "node0 + node1"
    assert _without_paths(report) == _without_paths(json.loads(one.stdout)) == _without_paths(json.loads(glob.stdout))

    text = zeromon("report", "node0", "node1", cwd=nodes)
    assert text.returncode == 0 and text.stdout.startswith("zeromon report: node0 + node1 (2 of 2 ranks)")
    assert "has no recording" not in text.stdout


@pytest.mark.distributed
def test_summary_and_the_replay_read_both_nodes_ranks(nodes: Path) -> None:
    summary = zeromon("summary", "node0", "node1", cwd=nodes)
    assert summary.returncode == 0 and summary.stderr == "", summary.stderr
    assert summary.stdout.startswith("zeromon: run node0 + node1 (2 of 2 ranks recorded)")
    rows = [line.split() for line in summary.stdout.splitlines()[2:4]]
    assert [(row[0], row[3]) for row in rows] == [("0", str(STEPS)), ("1", str(STEPS))]

    replay = zeromon("live", "--once", "--json", "--replay", "node*", cwd=nodes)
    assert replay.returncode == 0 and replay.stderr == "", replay.stderr
    view = json.loads(replay.stdout)
    assert view["source"] == "replay node0 + node1"
    assert [(r["rank"], [s["step"] for s in r["steps"]]) for r in view["ranks"]] == \
        [(0, list(range(STEPS))), (1, list(range(STEPS)))]


def _dash_update(url: str, outputs: list[str], inputs: list[dict[str, Any]], state: list[dict[str, Any]]) -> Any:
    """What the page's browser asks of the server: one callback's outputs (Dash's /_dash-update-component)."""
    body = {"output": ".." + "...".join(outputs) + "..", "changedPropIds": [f"{i['id']}.{i['property']}" for i in inputs],
            "outputs": [dict(zip(("id", "property"), o.split("."), strict=True)) for o in outputs],
            "inputs": inputs, "state": state}
    request = urllib.request.Request(url.rstrip("/") + "/_dash-update-component", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)["response"]


# The overview page's callback, asked with all its outputs as the page asks it.
OVERVIEW_OUTPUTS = ["overview-banners.children", "overview-grid-risk.figure", "overview-grid-exposed.figure",
                    "overview-info.children", "overview-findings-title.children", "overview-findings.children",
                    "overview-drawn.data"]


@pytest.mark.distributed
@pytest.mark.parametrize("words", [["node0", "node1"], ["--replay", "node*", "--speed", "1000"]],
                         ids=["recording", "replay"])
def test_the_dashboard_serves_both_nodes_ranks(nodes: Path, words: list[str]) -> None:
    from dashboard_browser import Dashboard

    dashboard = Dashboard(*[str(nodes / w) if w.startswith("node") else w for w in words], logs=nodes / "logs")
    with dashboard:
        status = _dash_update(dashboard.url, ["status.children", "source-error.children", "tick.disabled",
                                              "pause.children"],
                              [{"id": "tick", "property": "n_intervals", "value": 1},
                               {"id": "pause", "property": "n_clicks", "value": 0}], [])
        overview = _dash_update(dashboard.url, OVERVIEW_OUTPUTS,
                                [{"id": "tick", "property": "n_intervals", "value": 1},
                                 {"id": "url", "property": "search", "value": ""}],
                                [{"id": "url", "property": "pathname", "value": "/"},
                                 {"id": "overview-drawn", "property": "data", "value": None}])
    said = status["status"]["children"]
    assert f"{nodes / 'node0'} + {nodes / 'node1'}" in said and "2 ranks" in said, said
    grid = json.dumps(overview["overview-grid-risk"]["figure"])
    assert "rank 0" in grid and "rank 1" in grid and "rank 2" not in grid
    assert "warning" not in dashboard.stderr, dashboard.stderr  # no rank missing


@pytest.mark.distributed
def test_attach_replays_both_nodes_in_a_terminal(nodes: Path, tmp_path: Path) -> None:
    tmux = pytest.importorskip("test_tui_tmux")
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (the CI installs it: .ci/run)")
    command = tmux.attach("--replay", str(nodes / "node0"), str(nodes / "node1"), "--speed", "1000")
    with tmux.tmux_pane(command, tmux.tui_env(), tmp_path / "status") as pane:
        table = tmux.wait_for(lambda: sorted(t := tmux.rows(pane.screen())) == [0, 1] and t, pane, 60,
                              "both nodes' ranks in the table")
        assert len(table) == 2
        pane.keys("q")
        status = tmux.wait_for(lambda: (s := pane.exit_status()) is not None and (s,), pane, 15, "the TUI to exit")
        assert status == (0,), pane.screen()


@pytest.mark.distributed
def test_folders_of_two_runs_are_refused_naming_a_file_of_each(nodes: Path, fsdp2_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"  # rank 1 of another run of the same script, world size and framework
    other.mkdir()
    shutil.copy(fsdp2_run / "rank-1.jsonl", other)
    error = _refusal("report", str(nodes / "node0"), str(other), cwd=tmp_path)
    assert error.startswith(f"{nodes / 'node0' / 'rank-0.jsonl'} and {other / 'rank-1.jsonl'} are from different "
                            "runs: run id "), error
    for args in (("summary", str(nodes / "node0"), str(other)),
                 ("live", "--once", "--replay", str(nodes / "node0"), str(other)),
                 ("dashboard", "--port", "0", str(nodes / "node0"), str(other))):
        assert _refusal(*args, cwd=tmp_path) == error, args


@pytest.mark.distributed
def test_a_rank_in_two_folders_and_a_folder_without_recordings_are_refused(nodes: Path, tmp_path: Path) -> None:
    shutil.copytree(nodes / "node1", tmp_path / "node1-copy")
    error = _refusal("report", str(nodes / "node1"), "node1-copy", str(nodes / "node0"), cwd=tmp_path)
    assert error == f"{nodes / 'node1' / 'rank-1.jsonl'} and node1-copy/rank-1.jsonl are both rank 1"
    (tmp_path / "empty").mkdir()
    for args in (("report", str(nodes / "node0"), "empty"), ("summary", str(nodes / "node0"), "empty")):
        assert _refusal(*args, cwd=tmp_path) == "empty: no rank-<r>.zmr (or .jsonl) recordings in this folder"
    assert _refusal("live", "--once", "--replay", str(nodes / "node0"), "empty", cwd=tmp_path) == \
        "replay empty: no rank-<r>.zmr (or .jsonl) recordings in this folder"
    assert _refusal("report", "nodes-*", cwd=tmp_path) == "RUN_DIR nodes-*: it matches nothing"


@pytest.mark.distributed
def test_a_nodes_folder_left_out_is_named_and_the_rest_reported(nodes: Path) -> None:
    for args in (("report", "node0"), ("summary", "node0"), ("live", "--once", "--replay", "node0")):
        result = zeromon(*args, cwd=nodes)
        assert result.returncode == 0, result.stderr
        assert result.stderr == ("zeromon: warning: rank 1 missing: world size 2, 1 rank found in node0 (rank 0); "
                                 "is a node's folder missing?\n"), args
        if args[0] != "live":  # the ends, as each node's `zeromon run` prints them too
            assert "rank 1 has no recording here (it ran on another node, whose folder holds it;" in result.stdout


def test_the_missing_ranks_note_names_the_ranks_each_folder_holds() -> None:
    def headers(folder: str, ranks: range, world: int = 8) -> list[tuple[Path, dict[str, Any]]]:
        return [(Path(folder) / f"rank-{r}.jsonl", {"rank": r, "world_size": world}) for r in ranks]

    assert missing_ranks_note(headers("n0", range(4)) + headers("n1", range(4, 8))) is None
    assert missing_ranks_note(headers("n0", range(2)) + headers("n2", range(4, 6))) == (
        "ranks 2-3, 6-7 missing: world size 8, 4 ranks found in n0 (ranks 0-1) and n2 (ranks 4-5); "
        "is a node's folder missing?")
    assert missing_ranks_note([(Path("old/rank-0.jsonl"), {"rank": 0})]) is None  # no world size: nothing to say
