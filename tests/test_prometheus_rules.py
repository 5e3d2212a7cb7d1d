"""The recording rules (dashboard/grafana/zeromon-rules.yml): promtool checks them, its rule unit
tests check each recorded value against hand-computed input series, and the federation and remote
write configs of docs/prometheus-grafana.md pass `promtool check config`.

A real Prometheus evaluating the rules over a real 2-rank run is in test_prometheus_server.py; the
live source reading them (and falling back without them) is in test_prometheus_fleet.py.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml
from test_prometheus_server import (
    ALERTS,
    GRAFANA_GUIDE,
    PROMETHEUS_OWN,
    RULES,
    SERIES_NAMES,
    _promtool,
    _series,
    needs_promtool,
    promql_metric_names,
)

# level:metric:operations (https://prometheus.io/docs/practices/rules/), with the levels the file uses.
RULE_NAME = re.compile(r"^(job|job_rank|run):zeromon_[a-z_]+:[a-z0-9_]+$")


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


@needs_promtool
def test_promtool_accepts_the_recording_rules_named_by_prometheus_convention() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    rules = _rules()
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    for rule in rules:
        assert "alert" not in rule and RULE_NAME.match(rule["record"]), rule
        for name in promql_metric_names(rule["expr"]):
            assert name in SERIES_NAMES | PROMETHEUS_OWN, f"{rule['record']}: unknown metric {name}"


def _sample(value: float, **labels: str) -> dict[str, Any]:
    return {"labels": "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "value": value}


def _between(low: float, high: float, weight: float) -> float:
    """Prometheus's quantile interpolation, in its float operations (promtool compares exactly)."""
    return low * (1 - weight) + high * weight


@needs_promtool
def test_recording_rules_compute_the_fleet_numbers_from_per_rank_series(tmp_path: Path) -> None:
    # Three ranks of job "train" (run "run-a"): rank 0 critical with 1 GiB of headroom, the most
    # exposed and the slowest; rank 1 healthy; rank 2 at "warn". One of the run's three targets is
    # down. Each recorded value below is worked out by hand from these.
    gib = 2**30

    def rank(r: str) -> dict[str, str]:
        return {"job": "train", "zeromon_run": "run-a", "rank": r, "local_rank": r, "host": "node1",
                "instance": f"node1:947{r}"}

    per_rank = {  # metric: (rank 0, rank 1, rank 2)
        "zeromon_agent_start_time_seconds": (1000, 1001, 1002),
        "zeromon_step": (10, 12, 12),
        "zeromon_oom_risk": (2, 0, 1),
        "zeromon_memory_headroom_bytes": (gib, 40 * gib, 8 * gib),
        "zeromon_memory_capacity_bytes": (80 * gib, 80 * gib, 80 * gib),
        "zeromon_allocator_retries_total": (3, 0, 1),
        "zeromon_ooms_total": (0, 0, 0),
        "zeromon_step_exposed_comm_ratio": (0.5, 0.02, 0.1),
        "zeromon_step_overlap_ratio": (0.1, 0.9, 0.6),
        "zeromon_last_step_duration_seconds": (2.5, 1.0, 2.0),
        "zeromon_agent_events_dropped_total": (40, 0, 2),
        "zeromon_agent_hook_errors_total": (0, 1, 0),
    }
    series = [_series(name, f"{v}x5", **rank(str(r))) for name, values in per_rank.items()
              for r, v in enumerate(values)]
    series += [_series("up", f"{v}x5", instance=f"node1:947{r}", job="zeromon", zeromon_run="run-a")
               for r, v in enumerate((1, 1, 0))]
    job = {"job": "train", "zeromon_run": "run-a"}

    def expect(expr: str, *samples: dict[str, Any]) -> dict[str, Any]:
        named = [{**s, "labels": s["labels"].replace("{", f'{{__name__="{expr}", ', 1)} for s in samples]
        return {"expr": expr, "eval_time": "2m", "exp_samples": named}

    tests = [
        expect("job:zeromon_ranks:count", _sample(3, **job)),
        expect("run:zeromon_targets_up:sum", _sample(2, zeromon_run="run-a")),
        expect("run:zeromon_targets:count", _sample(3, zeromon_run="run-a")),
        expect("job:zeromon_step:min", _sample(10, **job)),
        expect("job:zeromon_step:max", _sample(12, **job)),
        expect("job:zeromon_oom_risk:max", _sample(2, **job)),
        expect("job:zeromon_oom_risk:count", *(_sample(1, **job, risk=r) for r in ("ok", "warn", "critical"))),
        expect("job:zeromon_memory_headroom_bytes:min", _sample(gib, **job)),
        expect("job:zeromon_memory_headroom_ratio:min", _sample(1 / 80, **job)),
        expect("job:zeromon_allocator_retries_total:sum", _sample(4, **job)),
        expect("job:zeromon_ooms_total:sum", _sample(0, **job)),
        # sorted 0.02, 0.1, 0.5: the q-quantile interpolates at position q * (3 - 1)
        expect("job:zeromon_step_exposed_comm_ratio:quantile", _sample(0.1, **job, quantile="0.5"),
               _sample(_between(0.1, 0.5, 0.9 * 2 - 1), **job, quantile="0.9"),
               _sample(_between(0.1, 0.5, 0.99 * 2 - 1), **job, quantile="0.99")),
        expect("job:zeromon_step_exposed_comm_ratio:max", _sample(0.5, **job)),
        expect("job:zeromon_step_overlap_ratio:min", _sample(0.1, **job)),
        expect("job:zeromon_last_step_duration_seconds:quantile", _sample(2.0, **job, quantile="0.5")),
        expect("job:zeromon_last_step_duration_seconds:max", _sample(2.5, **job)),
        expect("job:zeromon_last_step_duration_seconds:min", _sample(1.0, **job)),
        expect("job:zeromon_last_step_duration_seconds:skew", _sample(0.25, **job)),  # 2.5 / 2.0 - 1
        expect("job:zeromon_agent_events_dropped_total:sum", _sample(42, **job)),
        expect("job:zeromon_agent_hook_errors_total:sum", _sample(1, **job)),
        # The worst ranks keep their own labels: ranks at risk only, worst first.
        expect("job_rank:zeromon_oom_risk:topk", _sample(2, **rank("0")), _sample(1, **rank("2"))),
        expect("job_rank:zeromon_memory_headroom_ratio:bottomk", _sample(1 / 80, **rank("0")),
               _sample(0.5, **rank("1")), _sample(0.1, **rank("2"))),
        expect("job_rank:zeromon_step_exposed_comm_ratio:topk",
               *(_sample(v, **rank(str(r))) for r, v in enumerate(per_rank["zeromon_step_exposed_comm_ratio"]))),
        expect("job_rank:zeromon_last_step_duration_seconds:topk",
               *(_sample(v, **rank(str(r))) for r, v in enumerate(per_rank["zeromon_last_step_duration_seconds"]))),
    ]
    assert {t["expr"] for t in tests} == {r["record"] for r in _rules()}, "each recorded series has a case"
    result = _unit_test(tmp_path, series, tests)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _unit_test(tmp_path: Path, series: list[dict[str, str]], tests: list[dict[str, Any]]) -> Any:
    """`promtool test rules` of the recording rules over ``series``, with ``tests`` as its expectations."""
    shutil.copy(RULES, tmp_path / RULES.name)
    unit = {"rule_files": [RULES.name], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}]}
    (tmp_path / "unit.yml").write_text(yaml.safe_dump(unit))
    return _promtool("test", "rules", "unit.yml", cwd=tmp_path)


@needs_promtool
def test_recording_rules_keep_zero_counts_and_leave_out_what_no_rank_knows(tmp_path: Path) -> None:
    # A healthy CPU job: no rank at risk (the counts say 0 instead of vanishing, the at-risk list is
    # empty), and no capacity known (the headroom ratios are absent, not a division by zero).
    def rank(r: str) -> dict[str, str]:
        return {"job": "cpu", "rank": r, "local_rank": r, "host": "h"}

    series = [_series("zeromon_oom_risk", "0x5", **rank(r)) for r in ("0", "1")]
    series += [_series("zeromon_memory_headroom_bytes", "100x5", **rank(r)) for r in ("0", "1")]
    series += [_series("zeromon_memory_capacity_bytes", "0x5", **rank(r)) for r in ("0", "1")]
    job = {"job": "cpu"}
    tests = [
        {"expr": "sum by (job, risk) (job:zeromon_oom_risk:count)", "eval_time": "2m",
         "exp_samples": [_sample(2, **job, risk="ok"), _sample(0, **job, risk="warn"),
                         _sample(0, **job, risk="critical")]},
        {"expr": "job_rank:zeromon_oom_risk:topk", "eval_time": "2m", "exp_samples": []},
        {"expr": "job:zeromon_memory_headroom_ratio:min", "eval_time": "2m", "exp_samples": []},
        {"expr": "min by (job) (job:zeromon_memory_headroom_bytes:min)", "eval_time": "2m",
         "exp_samples": [_sample(100, **job)]},
    ]
    result = _unit_test(tmp_path, series, tests)
    assert result.returncode == 0, result.stdout + result.stderr


def _readme_configs(key: str) -> list[str]:
    blocks = re.findall(r"```yaml\n(.*?)```", GRAFANA_GUIDE.read_text(), flags=re.S)
    return [b for b in blocks if key in b]


@needs_promtool
def test_the_readmes_federation_and_remote_write_configs_pass_promtool(tmp_path: Path) -> None:
    # The global Prometheus that federates the node-level ones' recorded series, and a node-level
    # one that remote-writes them: both as docs/prometheus-grafana.md shows them, checked by promtool.
    federation = _readme_configs("/federate")
    assert len(federation) == 1, "docs/prometheus-grafana.md shows one federation config"
    job = yaml.safe_load(federation[0])["scrape_configs"][0]
    assert job["honor_labels"] is True and job["metrics_path"] == "/federate"
    assert any(re.fullmatch(m.split("=~")[1].strip('{}"'), "job:zeromon_oom_risk:max")
               for m in job["params"]["match[]"]), "federates the job-level recorded series"
    remote = _readme_configs("remote_write:")
    assert len(remote) == 1, "docs/prometheus-grafana.md shows one remote_write config"
    for name, text in (("federate.yml", federation[0]), ("remote.yml", remote[0])):
        shutil.copy(ALERTS, tmp_path / ALERTS.name)
        shutil.copy(RULES, tmp_path / RULES.name)
        (tmp_path / name).write_text(text)
        result = _promtool("check", "config", name, cwd=tmp_path)
        assert result.returncode == 0, f"{name}: {result.stdout}{result.stderr}"
