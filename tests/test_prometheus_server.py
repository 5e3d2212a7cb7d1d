"""The Grafana dashboard and the alert rules, checked against a real Prometheus server.

The dashboard's PromQL may only name the metrics the agent exports (the issue's interface spec);
`promtool` checks the alert rules, and its rule unit tests check that they fire when they should;
a real `prometheus` binary (Debian's `prometheus` package, which `.ci/run` installs) scrapes the
agents of a real 2-rank gloo training run, with a bearer token, through the file_sd file that
`zeromon targets --write` keeps, and every dashboard query runs against it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import EXAMPLES, REPO, child_env, free_port, ranks_args

GRAFANA = REPO / "dashboard" / "grafana"
DASHBOARD = GRAFANA / "zeromon.json"
ALERTS = GRAFANA / "zeromon-alerts.yml"
RULES = GRAFANA / "zeromon-rules.yml"  # the recording rules (test_prometheus_rules.py)
GRAFANA_GUIDE = REPO / "docs" / "prometheus-grafana.md"

# Loopback only: never through an http_proxy from the environment.
_LOCAL_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None, reason="no `prometheus` binary on PATH (Debian: apt-get install prometheus; .ci/run does)")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="no `promtool` on PATH (Debian: apt-get install prometheus; .ci/run does)")

# The agent's metric families (the interface spec's section 2). Histograms also expose
# _bucket, _sum and _count series.
HISTOGRAMS = {"zeromon_collective_duration_seconds", "zeromon_step_duration_seconds"}
AGENT_METRICS = HISTOGRAMS | {
    "zeromon_run_info",
    "zeromon_collective_calls_total", "zeromon_collective_bytes_total",
    "zeromon_collective_blocked_seconds_total", "zeromon_collective_busbw_bytes_per_second",
    "zeromon_steps_total", "zeromon_step", "zeromon_last_step_duration_seconds",
    "zeromon_step_comm_seconds", "zeromon_step_exposed_comm_seconds", "zeromon_step_exposed_comm_ratio",
    "zeromon_step_overlap_ratio",
    "zeromon_memory_allocated_bytes", "zeromon_memory_reserved_bytes", "zeromon_memory_peak_bytes",
    "zeromon_memory_rss_bytes", "zeromon_memory_capacity_bytes", "zeromon_memory_headroom_bytes",
    "zeromon_memory_category_bytes", "zeromon_oom_risk", "zeromon_oom_predicted_peak_bytes",
    "zeromon_oom_steps_to_capacity", "zeromon_allocator_retries_total", "zeromon_ooms_total",
    "zeromon_device_utilization_ratio", "zeromon_device_memory_used_bytes", "zeromon_device_memory_total_bytes",
    "zeromon_device_power_watts", "zeromon_device_temperature_celsius", "zeromon_device_pcie_bytes_per_second",
    "zeromon_device_nvlink_bytes_per_second",
    "zeromon_agent_events_recorded_total", "zeromon_agent_events_dropped_total", "zeromon_agent_hook_errors_total",
    "zeromon_agent_cpu_seconds_total", "zeromon_agent_start_time_seconds",
    "zeromon_recording_lost_records_total", "zeromon_recording_lost_bytes_total",
    "zeromon_progress_age_seconds", "zeromon_stall_threshold_seconds", "zeromon_stalled",
    "zeromon_group_collectives_issued", "zeromon_collective_inflight_seconds", "zeromon_collective_inflight_seq",
}
# Exported only while the training thread is inside a collective as the agent is scraped.
WHILE_IN_A_COLLECTIVE = {"zeromon_collective_inflight_seconds", "zeromon_collective_inflight_seq"}
SERIES_NAMES = AGENT_METRICS | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
PROMETHEUS_OWN = {"up"}  # the scrape health series Prometheus adds per target

_PROMQL_WORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                 "group_right", "inf", "nan", "atan2"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not its functions, keywords or label names)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery windows
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][\w:]*", text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group().lower() not in _PROMQL_WORDS:
            names.add(match.group())
    return names


def test_promql_metric_names_finds_the_selected_metrics_only() -> None:
    expr = ('histogram_quantile(0.99, sum by (op, le) (rate(zeromon_collective_duration_seconds_bucket'
            '{job=~"$job", rank=~"$rank"}[$__rate_interval]))) / on (job) group_left (rank) up{x="a(b"} '
            'and bottomk(1, foo_total offset 5m)')
    assert promql_metric_names(expr) == {"zeromon_collective_duration_seconds_bucket", "up", "foo_total"}


# ---------------------------------------------------------------------------------------------------
# the dashboard


def _load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    dashboard = _load_dashboard()
    queries = [(f"panel {p['title']!r} target {t['refId']}", t["expr"])
               for p in _panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            # label_values(SELECTOR, label) is Grafana's; the selector inside is PromQL.
            found = re.fullmatch(r"label_values\((.*),\s*\w+\)", var["definition"])
            assert found, f"variable {var['name']}: {var['definition']!r} is not label_values(selector, label)"
            queries.append((f"variable {var['name']!r}", found.group(1)))
    return queries


def substitute(expr: str, job: str, ranks: list[str]) -> str:
    """Grafana's template variables as Grafana fills them in (multi-value rank as a regex group)."""
    return (expr.replace("$__rate_interval", "5s").replace("$__interval", "1s").replace("$__range", "1m")
            .replace("$job", re.escape(job)).replace("$rank", "(" + "|".join(ranks) + ")"))


def test_dashboard_is_a_grafana_dashboard_with_datasource_job_and_rank_variables() -> None:
    dashboard = _load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"] and dashboard["id"] is None
    assert [i["pluginId"] for i in dashboard["__inputs"]] == ["prometheus"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["job"]["type"] == variables["rank"]["type"] == "query"
    assert variables["rank"]["multi"] and variables["rank"]["includeAll"]
    assert "$job" in variables["rank"]["definition"], "the rank list follows the chosen job"

    panels = list(_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in panels:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], panel["title"]
            # Every agent query is narrowed by the dashboard's variables (a recorded job-level or
            # worst-ranks series by the job: it is about all of the job's ranks).
            for name in promql_metric_names(target["expr"]) - PROMETHEUS_OWN:
                selectors = re.findall(re.escape(name) + r"(?![\w:])(\{[^}]*\})?", target["expr"])
                needs = ('job=~"$job"',) if name in recorded_names() else ('job=~"$job"', 'rank=~"$rank"')
                assert all(all(n in s for n in needs) for s in selectors), \
                    f"panel {panel['title']!r}: {name} without the {' and '.join(needs)} variables"


def test_dashboard_queries_name_only_the_agents_metrics() -> None:
    used: set[str] = set()
    for where, expr in dashboard_queries():
        names = promql_metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        unknown = names - SERIES_NAMES - PROMETHEUS_OWN - recorded_names()
        assert not unknown, f"{where}: {sorted(unknown)} are neither metrics the agent exports nor recorded ({expr!r})"
        used |= names
    # What the issue asks the dashboard to show.
    for required in ("zeromon_memory_allocated_bytes", "zeromon_memory_reserved_bytes",
                     "zeromon_memory_capacity_bytes", "zeromon_memory_headroom_bytes", "zeromon_oom_risk",
                     "zeromon_step_exposed_comm_seconds", "zeromon_step_overlap_ratio",
                     "zeromon_collective_busbw_bytes_per_second", "zeromon_step_duration_seconds_sum",
                     "zeromon_collective_bytes_total", "zeromon_collective_blocked_seconds_total",
                     "zeromon_agent_events_dropped_total", "zeromon_agent_hook_errors_total"):
        assert required in used, f"no dashboard panel shows {required}"
    # The fleet row: the recorded job-level series and worst-rank lists.
    for required in ("job:zeromon_oom_risk:count", "job:zeromon_memory_headroom_ratio:min",
                     "job:zeromon_step_exposed_comm_ratio:quantile", "job:zeromon_last_step_duration_seconds:skew",
                     "job_rank:zeromon_memory_headroom_ratio:bottomk"):
        assert required in used, f"no dashboard panel shows {required}"


def recorded_names() -> set[str]:
    """The series zeromon-rules.yml records."""
    return {r["record"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


# ---------------------------------------------------------------------------------------------------
# the alert rules


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    result = _promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    for rule in rules:
        for name in promql_metric_names(rule["expr"]):
            assert name in SERIES_NAMES | PROMETHEUS_OWN, f"alert {rule['alert']}: unknown metric {name}"


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _alert(name: str, at: str, *firing: dict[str, str]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": name, "exp_alerts": [{"exp_labels": labels} for labels in firing]}


@needs_promtool
def test_alert_rules_fire_when_they_should_and_not_otherwise(tmp_path: Path) -> None:
    # promtool's rule unit tests: minute-spaced series, expected alerts at given times. The rules'
    # annotations are dropped from the copy under test (promtool compares them verbatim; their
    # templates are checked by `promtool check rules` above).
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))

    def rank(r: str) -> dict[str, str]:
        return {"job": "train", "rank": r, "local_rank": r, "host": "node1"}

    def hung_rank(r: str) -> dict[str, str]:
        return {"job": "hung", "rank": r, "local_rank": r, "host": "node2"}

    inflight = {"group": "0", "group_desc": "default_pg", "op": "all_gather", "meaning": "param_all_gather"}
    sick, healthy = rank("0"), rank("1")
    at_risk = {"job": "train", "rank": "0", "host": "node1"}
    gib = 2**30
    series = [
        _series("zeromon_oom_risk", "0 0 2x10", **sick), _series("zeromon_oom_risk", "0x12", **healthy),
        _series("zeromon_oom_risk", "1x12", **rank("2")),
        _series("zeromon_memory_headroom_bytes", f"{gib}x30", **sick),
        _series("zeromon_memory_headroom_bytes", f"{40 * gib}x30", **healthy),
        _series("zeromon_memory_capacity_bytes", f"{80 * gib}x30", **sick),
        _series("zeromon_memory_capacity_bytes", f"{80 * gib}x30", **healthy),
        _series("zeromon_step_overlap_ratio", "0.1x30", **sick),
        _series("zeromon_step_overlap_ratio", "0.9x30", **healthy),
        _series("zeromon_step_exposed_comm_ratio", "0.5x30", **sick),
        _series("zeromon_step_exposed_comm_ratio", "0.02x30", **healthy),
        _series("zeromon_agent_events_dropped_total", "0 0 0 40 40 40", **sick),
        _series("zeromon_agent_events_dropped_total", "0x5", **healthy),
        _series("zeromon_allocator_retries_total", "0 0 3 3", **sick),
        _series("zeromon_allocator_retries_total", "0x3", **healthy),
        _series("zeromon_ooms_total", "0 0 0 0 0 0 1 1", **sick), _series("zeromon_ooms_total", "0x7", **healthy),
        _series("zeromon_agent_hook_errors_total", "0 2 2", **sick),
        _series("zeromon_agent_hook_errors_total", "0x2", **healthy),
        _series("zeromon_steps_total", "10+10x5 60x25", **sick),
        _series("zeromon_steps_total", "10+10x30", **healthy),
        _series("up", "1 1 0x10", instance="node1:9470", job="zeromon", zeromon_run="run-a"),
        _series("up", "1x12", instance="node1:9471", job="zeromon", zeromon_run="run-a"),
        # A hang from minute 3 in job "hung": rank 1 stops before the default group's collective #25, rank 0 waits
        # in it (its threshold 30 s); both stalled from minute 4. Rank 2 of job "train" is healthy and in a call.
        *(_series(name, values, **hung_rank(r), **labels) for r, name, values, labels in (
            ("0", "zeromon_group_collectives_issued", "20 24 25x10", {"group": "0", "group_desc": "default_pg"}),
            ("1", "zeromon_group_collectives_issued", "20 24x11", {"group": "0", "group_desc": "default_pg"}),
            ("0", "zeromon_stalled", "0 0 0 0 1x8", {}), ("1", "zeromon_stalled", "0 0 0 0 1x8", {}),
            ("0", "zeromon_stall_threshold_seconds", "30x12", {}),
            ("1", "zeromon_stall_threshold_seconds", "30x12", {}),
            ("0", "zeromon_collective_inflight_seq", "_ _ 25x10", inflight),
            ("0", "zeromon_collective_inflight_seconds", "_ _ 0+60x10", inflight))),
        _series("zeromon_group_collectives_issued", "10+5x12", **rank("2"), group="0", group_desc="default_pg"),
        _series("zeromon_stalled", "0x12", **rank("2")),
        _series("zeromon_stall_threshold_seconds", "30x12", **rank("2")),
        _series("zeromon_collective_inflight_seq", "11+5x12", **rank("2"), **inflight),
        _series("zeromon_collective_inflight_seconds", "0.01x12", **rank("2"), **inflight),
    ]
    down = {"instance": "node1:9470", "job": "zeromon", "zeromon_run": "run-a"}
    tests = [
        # critical from minute 2 for 1m: pending at 2m, firing from 3m; rank 1 never
        _alert("ZeromonOOMRiskCritical", "2m"),
        _alert("ZeromonOOMRiskCritical", "4m", {"severity": "critical", **at_risk}),
        # warn on rank 2 from minute 0 for 5m
        _alert("ZeromonOOMRiskWarning", "4m"),
        _alert("ZeromonOOMRiskWarning", "6m", {"severity": "warning", "job": "train", "rank": "2",
                                               "host": "node1"}),
        # 1 GiB of 80 GiB (1.25%) on rank 0, half the capacity on rank 1
        _alert("ZeromonLowMemoryHeadroom", "6m", {"severity": "warning", **sick}),
        _alert("ZeromonHighExposedCommunication", "9m"),
        _alert("ZeromonHighExposedCommunication", "11m", {"severity": "warning", **sick}),
        _alert("ZeromonPoorOverlap", "11m", {"severity": "warning", **sick}),
        _alert("ZeromonEventsDropped", "4m", {"severity": "warning", **sick}),
        _alert("ZeromonEventsDropped", "2m"),
        _alert("ZeromonAllocatorRetries", "3m", {"severity": "warning", **sick}),
        _alert("ZeromonOutOfMemory", "5m"),
        _alert("ZeromonOutOfMemory", "7m", {"severity": "critical", **sick}),
        _alert("ZeromonHookErrors", "1m", {"severity": "warning", **sick}),
        # up == 0 from minute 2, for 1m
        _alert("ZeromonRankDown", "2m"),
        _alert("ZeromonRankDown", "3m", {"severity": "critical", **down}),
        # rank 0 stops stepping at minute 5: 10m without a step, then 5m more
        _alert("ZeromonTrainingStalled", "16m"),
        _alert("ZeromonTrainingStalled", "21m", {"severity": "warning", **sick}),
        # The hang: the culprit once both are stalled (minute 4, for 10 s: firing at 5m), never the waiting rank nor
        # the healthy job's rank, whose call is one of many; the victim once inside past its threshold (minute 3).
        _alert("ZeromonRankHoldsUpCollective", "3m"),
        _alert("ZeromonRankHoldsUpCollective", "5m", {"severity": "critical", **hung_rank("1"), "group": "0",
                                                      "group_desc": "default_pg"}),
        _alert("ZeromonCollectiveHang", "2m"),
        _alert("ZeromonCollectiveHang", "5m", {"severity": "critical", **hung_rank("0"), **inflight}),
    ]
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}]}
    (tmp_path / "unit.yml").write_text(yaml.safe_dump(unit))
    result = _promtool("test", "rules", "unit.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    every_alert = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert every_alert == {t["alertname"] for t in tests if t["exp_alerts"]}, "each alert has a firing case"


@needs_promtool
def test_the_guides_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", GRAFANA_GUIDE.read_text(), flags=re.S)
    configs = [b for b in blocks if "scrape_configs:" in b and "file_sd_configs:" in b]
    assert len(configs) == 1, "docs/prometheus-grafana.md shows one prometheus.yml"
    config = yaml.safe_load(configs[0])
    job = config["scrape_configs"][0]
    assert job["honor_labels"] is True and job["file_sd_configs"], "scrapes the agents through file_sd"
    shutil.copy(ALERTS, tmp_path / ALERTS.name)
    shutil.copy(RULES, tmp_path / RULES.name)
    (tmp_path / "prometheus.yml").write_text(configs[0])
    result = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 rule files found" in result.stdout  # the alerts and the recording rules


# ---------------------------------------------------------------------------------------------------
# a real Prometheus server


class PrometheusServer:
    """A `prometheus` process on a free loopback port with its own storage, for one test."""

    def __init__(self, folder: Path, targets_file: Path, token_file: Path | None = None,
                 rule_files: tuple[Path, ...] = (ALERTS, RULES), evaluation_interval: str = "1s") -> None:
        self.folder = folder
        self.log = folder / "prometheus.log"
        scrape: dict[str, Any] = {"job_name": "zeromon", "honor_labels": True,
                                  "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]}
        if token_file is not None:  # the agents' ZEROMON_TOKEN, as docs/prometheus-grafana.md says
            scrape["authorization"] = {"credentials_file": str(token_file)}
        self.query_log = folder / "queries.log"  # every query Prometheus answers, one JSON line each
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": evaluation_interval,
                       "query_log_file": str(self.query_log)},
            "rule_files": [str(f) for f in rule_files],
            "scrape_configs": [scrape],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 30) -> None:
        assert PROMETHEUS is not None
        for _attempt in range(3):  # the free port may be taken between free_port() and the bind
            self.url = f"http://127.0.0.1:{free_port()}"
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(
                    [PROMETHEUS, f"--config.file={self.folder / 'prometheus.yml'}",
                     f"--storage.tsdb.path={self.folder / 'data'}",
                     f"--web.listen-address={self.url.removeprefix('http://')}", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, cwd=self.folder)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with _LOCAL_HTTP.open(self.url + "/-/ready", timeout=2) as response:
                        if response.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.1)
            self.stop()
        raise AssertionError(f"prometheus did not become ready:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def api(self, path: str, **params: str) -> dict[str, Any]:
        """GET an /api/v1 route; a PromQL error comes back as the JSON body Prometheus sends."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with _LOCAL_HTTP.open(url, timeout=10) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as err:
            return dict(json.load(err))

    def logged_queries(self) -> list[str]:
        """The queries Prometheus has answered over HTTP (its query log, which also has the rules' own), oldest first."""
        if not self.query_log.exists():
            return []
        entries = [json.loads(line) for line in self.query_log.read_text().splitlines() if line]
        return [e["params"]["query"] for e in entries if "httpRequest" in e]

    def query(self, expr: str, **params: str) -> list[dict[str, Any]]:
        """An instant query's result vector; fails the test with Prometheus's error message."""
        body = self.api("query", query=expr, **params)
        assert body["status"] == "success", f"{expr!r}: {body.get('errorType')}: {body.get('error')}"
        return list(body["data"]["result"])


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    yield from prometheus_servers(tmp_path)


def prometheus_servers(tmp_path: Path) -> Iterator[Callable[..., PrometheusServer]]:
    """The `prometheus` fixture's body (other test files' fixtures yield from it): start(...) starts one."""
    servers: list[PrometheusServer] = []

    def start(targets_file: Path, token_file: Path | None = None,
              rule_files: tuple[Path, ...] = (ALERTS, RULES), evaluation_interval: str = "1s") -> PrometheusServer:
        folder = tmp_path / f"prometheus-{len(servers)}"
        folder.mkdir()
        server = PrometheusServer(folder, targets_file, token_file, rule_files, evaluation_interval)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@needs_prometheus
def test_every_dashboard_query_is_valid_promql(tmp_path: Path,
                                               prometheus: Callable[..., PrometheusServer]) -> None:
    # With no target at all: the parser and the type checks (a range vector where an instant one is
    # wanted, an unknown function) answer without data.
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    server = prometheus(targets)
    for where, expr in dashboard_queries():
        body = server.api("query", query=substitute(expr, "train", ["0", "1"]))
        assert body["status"] == "success", f"{where}: {expr!r}: {body.get('error')}"


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str,
              *procs: subprocess.Popen[str]) -> None:
    """Poll ``predicate``; fail early, with its stderr, when one of ``procs`` ends first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc in procs:
            if proc.poll() is not None:
                _out, err = proc.communicate()
                raise AssertionError(f"{proc.args[:4]} ended (exit {proc.returncode}) before {what}:\n{err[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _listed_targets(path: Path) -> list[str]:
    try:
        return [t for group in json.loads(path.read_text()) for t in group["targets"]]
    except (OSError, ValueError):
        return []


def _by_rank(result: list[dict[str, Any]]) -> dict[str, float]:
    return {s["metric"]["rank"]: float(s["value"][1]) for s in result}


def _stop(proc: subprocess.Popen[str], sig: signal.Signals, *, group: bool) -> str:
    """Send ``sig`` (to the process group with ``group``), wait, kill if need be; its stderr."""
    if proc.poll() is None:
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    try:
        return proc.communicate(timeout=60)[1] or ""
    except subprocess.TimeoutExpired:
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        return proc.communicate()[1] or ""


# Metrics the agent leaves out on a CPU run: what only a CUDA allocator or NVML knows, and the
# steps to capacity, which exist only while the per-step peak grows.
NOT_ON_CPU = {
    "zeromon_memory_allocated_bytes", "zeromon_memory_reserved_bytes", "zeromon_allocator_retries_total",
    "zeromon_oom_steps_to_capacity", *(m for m in AGENT_METRICS if m.startswith("zeromon_device_")),
}


@needs_prometheus
@pytest.mark.distributed
def test_prometheus_scrapes_a_real_2_rank_run_through_zeromon_targets(
        tmp_path: Path, prometheus: Callable[..., PrometheusServer]) -> None:
    run_dir = tmp_path / "run"
    job = "promtest"
    token = "s3cret-zeromon-test-token"
    token_file = tmp_path / "zeromon-token"
    token_file.write_text(token + "\n")
    # ZEROMON_PORT=0: any free port, so that other runs on this machine do not matter. With a
    # token, Prometheus scrapes with the credentials file that docs/prometheus-grafana.md's config shows.
    env = child_env(ZEROMON_PORT="0", ZEROMON_REGISTRY=str(tmp_path / "registry"), ZEROMON_TOKEN=token)
    train = subprocess.Popen(
        [sys.executable, "-m", "zeromon", "run", "--out", str(run_dir), "--job", job, "--",
         *ranks_args(2, EXAMPLES / "fsdp2_train.py", "--steps", "100000")],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    targets = tmp_path / "zeromon-targets.json"
    writer: subprocess.Popen[str] | None = None
    try:
        # starts while the ranks import torch; no targets yet
        server = prometheus(targets, token_file, evaluation_interval=EVALUATION_BESIDE_SCRAPES)
        _wait_for(lambda: len(list((run_dir / "endpoints").glob("rank-*.json"))) == 2, 120,
                  "both ranks' endpoints", train)

        # The scrape list as a user keeps it: `zeromon targets RUN_DIR --write FILE` rewrites the
        # file_sd file whenever the run's agents change, and Prometheus follows the file.
        writer = subprocess.Popen(
            [sys.executable, "-m", "zeromon", "targets", str(run_dir), "--write", str(targets), "--interval", "0.5"],
            env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_for(lambda: len(_listed_targets(targets)) == 2, 30, "zeromon targets to list both ranks", writer)
        groups = json.loads(targets.read_text())
        ids = [json.loads((run_dir / "endpoints" / f"rank-{r}.json").read_text())["agent_id"] for r in (0, 1)]
        assert [g["labels"] for g in groups] == [{"zeromon_run": run_dir.name, "__param_agent": i} for i in ids]

        this_run = f'zeromon_steps_total{{zeromon_run="{run_dir.name}"}}'

        def both_scraped() -> bool:
            steps = [float(s["value"][1]) for s in server.query(this_run)]
            return len(steps) == 2 and min(steps) >= 2
        _wait_for(both_scraped, 90, "Prometheus to scrape two steps from both ranks", train, writer)

        # Prometheus scrapes exactly the agents the list names, and both answer.
        active = server.api("targets", state="active")["data"]["activeTargets"]
        assert sorted(t["labels"]["instance"] for t in active) == sorted(_listed_targets(targets))
        assert all(t["health"] == "up" for t in active), [t["lastError"] for t in active]
        assert sorted(t["scrapeUrl"].split("?agent=")[1] for t in active) == sorted(ids)  # each names its agent
        with pytest.raises(urllib.error.HTTPError) as refused:  # and the token was needed
            _LOCAL_HTTP.open(f"http://{active[0]['labels']['instance']}/metrics", timeout=10)
        assert refused.value.code == 401

        # Labels: the agent's own rank, local_rank, host and job (kept by honor_labels: true), and
        # the file_sd group's zeromon_run.
        entries = {e["rank"]: e for e in (json.loads(p.read_text()) for p in (run_dir / "endpoints").iterdir())}
        first = server.query(this_run)
        assert sorted(s["metric"].get("rank") for s in first) == ["0", "1"], first
        for series in first:
            labels = series["metric"]
            entry = entries[int(labels["rank"])]
            assert labels["local_rank"] == labels["rank"]  # one node
            assert labels["host"] == entry["host"]
            assert labels["job"] == job
            assert labels["zeromon_run"] == run_dir.name
            assert labels["instance"] in _listed_targets(targets)
            assert labels["instance"].endswith(f":{entry['port']}")

        # The agents export the spec's metrics, and on CPU all of them but the GPU-only ones.
        present = {s["metric"]["__name__"]
                   for s in server.query(f'group by (__name__) ({{__name__=~"zeromon_.+", job="{job}"}})')}
        assert not present - SERIES_NAMES, f"metrics outside the spec: {sorted(present - SERIES_NAMES)}"
        missing = SERIES_NAMES - HISTOGRAMS - NOT_ON_CPU - WHILE_IN_A_COLLECTIVE - present
        assert not missing, f"the agents do not export {sorted(missing)}"

        # Plausible values: memory in use within a capacity, FSDP2's gathers and reduce-scatters.
        memory = {name: _by_rank(server.query(f'{name}{{job="{job}"}}'))
                  for name in ("zeromon_memory_rss_bytes", "zeromon_memory_capacity_bytes")}
        for r in ("0", "1"):
            assert 0 < memory["zeromon_memory_rss_bytes"][r] < memory["zeromon_memory_capacity_bytes"][r], memory
        meanings = {s["metric"]["meaning"]
                    for s in server.query(f'zeromon_collective_bytes_total{{job="{job}"}} > 0')}
        assert {"param_all_gather", "grad_reduce_scatter"} <= meanings

        # Collective bytes and steps grow while training runs.
        bytes_expr = f'sum by (rank) (zeromon_collective_bytes_total{{job="{job}"}})'
        before_bytes, before_steps = _by_rank(server.query(bytes_expr)), _by_rank(first)
        time.sleep(3)
        after_bytes = _by_rank(server.query(bytes_expr))
        after_steps = _by_rank(server.query(f'zeromon_steps_total{{job="{job}"}}'))
        for r in ("0", "1"):
            assert after_steps[r] > before_steps[r], (before_steps, after_steps)
            assert after_bytes[r] > before_bytes[r], (before_bytes, after_bytes)
        rates = _by_rank(server.query(f'sum by (rank) (rate(zeromon_collective_bytes_total{{job="{job}"}}[5s]))'))
        assert sorted(rates) == ["0", "1"] and min(rates.values()) > 0, rates

        # Every dashboard query runs on the live data, and one whose metrics exist returns data
        # (which catches label sets that do not match across a division, and histogram names).
        # A series that exists only while a rank is inside a collective can be gone by the query: those
        # queries must run, not return data.
        # A scrape missed on a loaded machine (its 1 s timeout) leaves a 5 s rate window short of two samples for
        # a moment: a query with metrics is given 15 s to return data.
        for where, expr in dashboard_queries():
            query = substitute(expr, job, ["0", "1"])
            result = server.query(query)
            names = promql_metric_names(expr)
            if names <= present | PROMETHEUS_OWN and not names & WHILE_IN_A_COLLECTIVE and not result:
                _wait_for(lambda query=query: bool(server.query(query)), 15, f"{where}: data from {expr!r}", train)

        # The alert and recording rules are loaded and evaluate without error on these series.
        rule_groups = [g for f in (ALERTS, RULES) for g in yaml.safe_load(f.read_text())["groups"]]
        loaded = server.api("rules")["data"]["groups"]
        assert sorted(g["name"] for g in loaded) == sorted(g["name"] for g in rule_groups)
        assert sum(len(g["rules"]) for g in loaded) == sum(len(g["rules"]) for g in rule_groups)
        _wait_for(lambda: all(r["health"] == "ok" for g in server.api("rules")["data"]["groups"]
                              for r in g["rules"]), 10, "every rule evaluated")
        _check_recorded_series(server, job, run_dir.name)
        # The live source of the TUI and dashboard, through this Prometheus (a multi-node job's path),
        # reads the job's numbers from the recorded series and both ranks (the worst 5 of 2).
        from zeromon.sources.live import LiveSource

        source = LiveSource(prometheus=server.url)
        fleet = source.poll()
        for _attempt in range(30):  # both ranks alive: scraped lately, which a missed scrape delays for a moment
            if fleet.error is not None or [(r.rank, r.alive) for r in fleet.ranks] == [(0, True), (1, True)]:
                break
            time.sleep(0.5)
            fleet = source.poll()
        assert fleet.error is None, fleet.error
        assert fleet.totals is not None and fleet.totals.ranks == 2, fleet.source
        assert fleet.source.endswith("recorded rules: 2 ranks, the worst 2 shown"), fleet.source
        assert [(r.rank, r.alive) for r in fleet.ranks] == [(0, True), (1, True)], fleet.ranks
        for view in fleet.ranks:
            assert view.job == job and view.steps and view.memory is not None and view.collectives, view
        assert train.poll() is None, "training ran through every check"
    finally:
        writer_err = _stop(writer, signal.SIGINT, group=False) if writer is not None else ""
        _stop(train, signal.SIGTERM, group=True)
    assert writer.returncode == 0, writer_err  # Ctrl-C ends `zeromon targets --write` cleanly


def _values(result: list[dict[str, Any]], leave_out: Mapping[str, str]) -> dict[tuple[tuple[str, str], ...], float]:
    """A query's result by its label sets, without the metric name and the labels a rule adds."""
    return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__" and k not in leave_out)):
            float(s["value"][1]) for s in result}


# Not a multiple of the 1 s scrape interval: each evaluation meets the scrapes at another phase (_check_recorded_series).
EVALUATION_BESIDE_SCRAPES = "1370ms"


def _scrapes(server: PrometheusServer, run: str, window: str) -> list[tuple[float, float]]:
    """Each scrape of the run's targets in the window: (its samples' timestamp, which is when it started; how long it took)."""
    return [(float(ts), float(seconds)) for series in server.query(f'scrape_duration_seconds{{zeromon_run="{run}"}}[{window}]')
            for ts, seconds in series["values"]]


def _check_recorded_series(server: PrometheusServer, job: str, run: str) -> None:
    """Each recorded series holds its rule's expression over the per-rank series Prometheus scraped, at
    the time the rule was evaluated (asked again at that time: the same samples, the same value).

    Only an evaluation that no scrape overlapped can be asked again. A scrape's samples carry its start, and
    are written when it ends: one that started before an evaluation and ended after it is in the expression
    asked later at that time, never in what was recorded (a CI run saw the minimum step recorded one scrape
    behind). Prometheus scrapes and evaluates each at a fixed phase of its interval, so
    with equal intervals a slow scrape overlaps every evaluation; the server of this test evaluates every
    1.37 s (`EVALUATION_BESIDE_SCRAPES`), so that evaluations slide across the scrapes."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert server.query(f'job:zeromon_ranks:count{{job="{job}", zeromon_run="{run}"}}'), "rules evaluated"
    margin = 0.1  # from a scrape's end to its samples' commit, and the clock's rounding to milliseconds
    for rule in rules:
        static = rule.get("labels", {})
        selector = ",".join(f'{k}="{v}"' for k, v in static.items())
        deadline = time.monotonic() + 30
        while True:
            history = server.query(f"{rule['record']}{{{selector}}}[20s]")
            scrapes = _scrapes(server, run, "25s")
            evaluations: dict[float, list[dict[str, Any]]] = {}
            for series in history:
                for ts, value in series["values"]:
                    evaluations.setdefault(float(ts), []).append({"metric": series["metric"], "value": [ts, value]})
            # The evaluations that every scrape before them had ended by, the clearest three (a scrape's samples
            # are committed some time after its end: the more room, the surer).
            room = {at: min((at - started - seconds for started, seconds in scrapes if started <= at), default=0.0)
                    for at in evaluations}
            clean = sorted((at for at in evaluations if room[at] >= margin), key=room.__getitem__)[-3:]
            if clean or not evaluations or time.monotonic() > deadline:
                break
            time.sleep(1)
        if not evaluations:  # nothing recorded: the expression must say nothing either
            assert not server.query(rule["expr"]), f"{rule['record']}: recorded nothing where the expression has data"
            continue
        assert clean, (f"{rule['record']}: a scrape overlapped each of its evaluations at {sorted(evaluations)}; "
                       f"the scrapes (start, seconds): {scrapes}")
        for at in clean:
            computed = server.query(rule["expr"], time=f"{at:.3f}")
            assert _values(evaluations[at], static) == _values(computed, static), (
                f"{rule['record']} at {at:.3f}: recorded {_values(evaluations[at], static)} != computed "
                f"{_values(computed, static)}; no scrape overlapped it: {scrapes}")
    # The job's numbers as a 2-rank CPU run has them.
    def one(expr: str) -> float:
        result = server.query(expr)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])
    assert one(f'job:zeromon_ranks:count{{job="{job}"}}') == 2
    assert one(f'run:zeromon_targets_up:sum{{zeromon_run="{run}"}}') == one(f'run:zeromon_targets:count{{zeromon_run="{run}"}}') == 2
    assert sum(float(s["value"][1]) for s in server.query(f'job:zeromon_oom_risk:count{{job="{job}"}}')) == 2
    worst = server.query(f'job_rank:zeromon_last_step_duration_seconds:topk{{job="{job}"}}')
    assert sorted(s["metric"]["rank"] for s in worst) == ["0", "1"] and all(s["metric"]["host"] for s in worst)
    # The dashboard's fleet row has data.
    fleet_row = [(where, expr) for where, expr in dashboard_queries() if promql_metric_names(expr) <= recorded_names()]
    assert len(fleet_row) >= 9
    for where, expr in fleet_row:
        assert server.query(substitute(expr, job, ["0", "1"])), f"{where}: no data from {expr!r}"


@needs_prometheus
def test_a_port_taken_by_another_jobs_agent_is_down_not_read_as_the_ended_run(
        tmp_path: Path, prometheus: Callable[..., PrometheusServer]) -> None:
    # Run A ended; job B's agent now listens on the port A's rank 0 had (every job starts at the same
    # base port), and `zeromon targets --write` still lists A. Prometheus must not file B's series
    # under A: A's target is down (up == 0, which ZeromonRankDown fires on), B's is up.
    from zeromon.model.registry import run_entry_path, write_entry
    from zeromon.sources.discovery import file_sd_text, run_entries
    from zeromon.sources.live import LiveSource
    from zeromon_agent.hooks.state import HotState
    from zeromon_agent.recorder.loop import Recorder
    from zeromon_agent.serve.endpoint import AgentEndpoint

    recorder = Recorder(HotState(), rank=0, writer=None, flush_interval_s=0.05)
    recorder.start()
    job_b = AgentEndpoint.start(recorder, rank=0, local_rank=0, world_size=1, job="job-b", run_dir=tmp_path / "job-b",
                                address="127.0.0.1", base_port=0, token=None, registry_folder=tmp_path / "registry",
                                notice=recorder.notice)
    try:
        run_a = tmp_path / "run-a"
        write_entry(run_entry_path(run_a, 0), dataclasses.replace(
            job_b.entry, run_dir=str(run_a), run_id="run-a", job="job-a", agent_id="00000000000000aa"))
        targets = tmp_path / "zeromon-targets.json"
        targets.write_text(file_sd_text(run_entries(run_a)))
        server = prometheus(targets)

        def scraped(run: str) -> dict[str, Any] | None:
            active = server.api("targets", state="active")["data"]["activeTargets"]
            found = [t for t in active if t["labels"].get("zeromon_run") == run and t["health"] != "unknown"]
            return found[0] if found else None
        _wait_for(lambda: scraped("run-a") is not None, 30, "Prometheus to scrape run A's target")
        target = scraped("run-a")
        assert target is not None and target["health"] == "down" and "404" in target["lastError"], target
        assert [float(s["value"][1]) for s in server.query('up{zeromon_run="run-a"}')] == [0.0]
        assert server.query('{__name__=~"zeromon_.+", zeromon_run="run-a"}') == []  # nothing of B's under A
        # The live view through this Prometheus says why there is nothing to show.
        fleet = LiveSource(prometheus=server.url).poll()
        assert fleet.ranks == () and "1 zeromon target(s), all down" in (fleet.error or ""), fleet.error
        assert "HTTP status 404" in (fleet.error or "") and "the run has ended" in (fleet.error or "")

        # Listed with its own id, B's agent is scraped as usual.
        targets.write_text(file_sd_text(run_entries(run_a) + run_entries(tmp_path / "job-b")))
        _wait_for(lambda: (t := scraped("job-b")) is not None and t["health"] == "up", 30,
                  "Prometheus to scrape job B's target")
        assert server.query('zeromon_agent_start_time_seconds{zeromon_run="job-b"}')
        assert [float(s["value"][1]) for s in server.query('up{zeromon_run="run-a"}')] == [0.0]
    finally:
        job_b.stop()
        recorder.stop()
