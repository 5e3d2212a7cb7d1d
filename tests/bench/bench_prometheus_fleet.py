"""One poll of a 1,024-rank job through Prometheus, with and without zeromon's recording rules.

    python tests/bench/bench_prometheus_fleet.py [--polls 10] [--json out.json]

A 1,024-rank job cannot run here: one HTTP exporter serves 1,024 ranks' series in the agent's metric
names and labels (~36 a rank: tests/test_prometheus_fleet.py's exposition), and a real `prometheus`
scrapes it every second, once with dashboard/grafana/zeromon-rules.yml loaded and once without. The
client is zeromon's PrometheusFleet (what `attach`, `live` and `dashboard --prometheus` poll with):
per poll, its wall time, its own CPU time (``time.process_time()``), the queries it sends and the
series Prometheus sends back; medians over ``--polls`` polls after a first one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

sys.path.insert(0, str(benchlib.REPO_ROOT / "tests"))

import test_prometheus_fleet as fleet_test  # noqa: E402 (the tests folder first)
from test_prometheus_server import ALERTS, RULES, PrometheusServer, _wait_for  # noqa: E402

from zeromon.sources import promql  # noqa: E402

BENCH = "prometheus fleet"


def _ready(server: PrometheusServer, with_rules: bool) -> Any:
    """True once Prometheus has scraped the ranks (and, with the rules, evaluated their last group)."""
    return lambda: bool(server.query("count(zeromon_oom_risk)")) and (
        not with_rules or bool(server.query("job_rank:zeromon_last_step_duration_seconds:topk")))


def _polls(url: str, polls: int, counts: list[int]) -> list[tuple[float, float, int, int, int]]:
    """(wall s, client CPU s, queries, series, ranks shown) of each poll after the first."""
    fleet = promql.PrometheusFleet(url, timeout_s=60)
    out = []
    for i in range(polls + 1):
        counts.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        view = fleet.poll("prometheus", ())
        if i:
            out.append((time.perf_counter() - wall, time.process_time() - cpu, len(counts), sum(counts),
                        len(view.ranks)))
        time.sleep(0.2)
    return out


def measure(polls: int) -> list[benchlib.Row]:
    counts: list[int] = []
    original = promql.PromQL.query

    def counted(client: promql.PromQL, expr: str) -> list[promql.Series]:
        result = original(client, expr)
        counts.append(len(result))
        return result
    promql.PromQL.query = counted  # type: ignore[method-assign]
    exporter = fleet_test.serve_exposition()
    rows = []
    try:
        for mode, rule_files in (("per-rank series (no rules)", (ALERTS,)), ("recorded rules", (ALERTS, RULES))):
            folder = Path(tempfile.mkdtemp(prefix="zeromon-bench-prom-"))
            targets = folder / "targets.json"
            targets.write_text(json.dumps([{"targets": [f"127.0.0.1:{exporter.server_address[1]}"],
                                            "labels": {"zeromon_run": fleet_test.RUN}}]))
            (folder / "prometheus").mkdir()
            server = PrometheusServer(folder / "prometheus", targets, None, rule_files)
            server.start()
            try:
                _wait_for(_ready(server, with_rules=RULES in rule_files), 60, "the first scrape and rule evaluation")
                results = _polls(server.url, polls, counts)
            finally:
                server.stop()
            wall = statistics.median(r[0] for r in results) * 1e3
            cpu = statistics.median(r[1] for r in results) * 1e3
            queries, series, shown = results[-1][2:]
            note = f"{queries} queries, {series:,} series, {shown} ranks shown per poll; {len(results)} polls"
            rows += [benchlib.Row(BENCH, f"1,024 ranks, {mode}: poll wall time", "ms", None, wall, "", None, note),
                     benchlib.Row(BENCH, f"1,024 ranks, {mode}: client CPU per poll", "ms", None, cpu, "", None),
                     benchlib.Row(BENCH, f"1,024 ranks, {mode}: series per poll", "series", None, float(series),
                                  "< 1,000 with the rules" if mode == "recorded rules" else "",
                                  series < 1000 if mode == "recorded rules" else None)]
    finally:
        promql.PromQL.query = original  # type: ignore[method-assign]
        exporter.shutdown()
        exporter.server_close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=10)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = measure(args.polls)
    benchlib.print_rows("a 1,024-rank job polled through Prometheus, with and without the recording rules", rows)
    benchlib.write_rows(args.json, rows, {"machine": benchlib.machine()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
