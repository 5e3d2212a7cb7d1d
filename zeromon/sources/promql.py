"""The live FleetView read through Prometheus's HTTP API, for a job whose ranks span machines.

Prometheus scrapes every rank's ``/metrics`` (targets from `zeromon targets`); this module asks it
for the newest run's series with two instant queries per poll and turns them into the same
RankViews that the agents' snapshots give.

Where Prometheus evaluates zeromon's recording rules (dashboard/grafana/zeromon-rules.yml), a poll
reads the job's numbers from their few series instead (FleetView.totals) and the per-rank series of
only the worst ranks they name: three queries, tens of job-level series and those ranks' ~50 each,
where reading every rank costs ~50 series per rank (~50,000 for 1,024 ranks). Whether the rules'
series are there is asked at the first poll and, while they are not, every RULES_RECHECK_S. Through Prometheus there is less: no event stream (no
phase spans), no findings beyond the OOM risk level, and the steps are the last step's gauges as
seen at each poll (a step history at the poll's resolution), not every step.

Stale ranks: Prometheus drops a target's series once its scrape fails (``up`` is 0); this client
keeps each rank's last view, marked ``alive=False`` with the time since it was last seen.
"""

from __future__ import annotations

import math
import re
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from zeromon.analysis.findings import Severity
from zeromon.analysis.oom import OomForecast
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.events import AgentStats, DeviceSample, MemorySample, RunInfo, StepSummary, span_ns
from zeromon.sources.fleet import CollectiveTotal, FleetTotals, FleetView, RankView
from zeromon.sources.http import FetchError, describe_os_error, http_get, http_status_error, json_loads

STEPS_KEPT = 64
# The newest run: the one whose agents started last. zeromon_run is the label `zeromon targets` puts on
# its file_sd groups; without it (a hand-written scrape config) the metrics' own job label tells runs apart.
RUNS_QUERY = "max by (zeromon_run, job) (zeromon_agent_start_time_seconds)"
# The scrape health of the targets `zeromon targets` listed, when there is no zeromon series to read.
TARGETS_QUERY = 'up{zeromon_run!=""}'
# Everything of one run in one query; histogram buckets are left out (the view needs sums and counts).
SERIES_QUERY = '{{__name__=~"up|zeromon_.+",__name__!~".+_bucket|.+_created",{selector}}}'
# The recording rules' series of one run: the job's numbers (job:), its worst ranks (job_rank:), its targets' health.
RECORDED_QUERY = '{{__name__=~"job:zeromon_.+|job_rank:zeromon_.+|run:zeromon_.+",{selector}}}'
RULES_RECHECK_S = 30.0  # without the rules' series, look for them again this often (one small query)
# The per-rank lists of the rules, by what they rank: (the recorded name, worst first when descending).
WORST_LISTS = {"oom_risk": ("job_rank:zeromon_oom_risk:topk", True),
               "headroom": ("job_rank:zeromon_memory_headroom_ratio:bottomk", False),
               "exposed": ("job_rank:zeromon_step_exposed_comm_ratio:topk", True),
               "step_time": ("job_rank:zeromon_last_step_duration_seconds:topk", True)}
_RISK = {0: Severity.OK, 1: Severity.WARN, 2: Severity.CRITICAL}
_ZERO_STRATEGY = re.compile(r"^zero-?(\d)$", re.IGNORECASE)


class PromQLError(Exception):
    """Prometheus answered, with an error (a bad query, a timeout on its side)."""


@frozen
class Series:
    labels: Mapping[str, str]
    value: float


class PromQL:
    """A minimal client of Prometheus's instant-query API (``GET /api/v1/query``)."""

    def __init__(self, url: str, timeout_s: float = 5.0, token: str | None = None) -> None:
        try:
            parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        except ValueError as exc:  # "Invalid IPv6 URL": a bracket left open
            raise ZeromonError(f"--prometheus {url}: not a URL ({exc})",
                               hint="e.g. --prometheus http://localhost:9090 or http://[::1]:9090") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ZeromonError(f"--prometheus {url}: not an http(s) URL", hint="e.g. --prometheus http://localhost:9090")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ZeromonError(f"--prometheus {url}: the port is not a number from 1 to 65535",
                               hint="e.g. --prometheus http://localhost:9090") from None
        self.url = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.timeout_s = timeout_s
        self._base = parts.path.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._host, self._port, self._https = parts.hostname, port, parts.scheme == "https"

    def query(self, expr: str) -> list[Series]:
        """An instant vector query. FetchError: no answer; PromQLError: Prometheus refused the query."""
        data = self._get("query", {"query": expr})
        if data.get("resultType") != "vector":
            raise PromQLError(f"expected an instant vector, got {data.get('resultType')!r}")
        out = []
        for item in data.get("result") or ():
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            # Prometheus writes NaN and +Inf (a gauge set so, a division by zero in a rule): nothing
            # zeromon reads is one, and int() of one would raise far from here.
            if math.isfinite(value) and isinstance(item.get("metric"), Mapping):
                out.append(Series(item["metric"], value))
        return out

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets?state=active``: each scrape target's labels, health and last error."""
        targets = self._get("targets", {"state": "active"}).get("activeTargets")
        return [t for t in targets if isinstance(t, dict)] if isinstance(targets, list) else []

    def _get(self, route: str, params: Mapping[str, str]) -> dict[str, Any]:
        """The ``data`` of an /api/v1 answer. FetchError: no answer; PromQLError: Prometheus said error."""
        path = f"{self._base}/api/v1/{route}?" + urllib.parse.urlencode(params)
        try:
            status, reason, body = http_get(self._host, self._port, path, self._headers, self.timeout_s, self._https)
        except OSError as exc:
            raise FetchError(describe_os_error(exc, self.timeout_s, server="Prometheus")) from None
        try:
            doc = json_loads(body)
        except ValueError:
            raise FetchError(f"not Prometheus's API ({http_status_error(status, reason, body, False)})") from None
        if not isinstance(doc, dict) or "status" not in doc:
            raise FetchError(f"not Prometheus's API (HTTP {status}: a JSON answer without 'status')")
        if doc["status"] != "success":
            raise PromQLError(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}")
        data = doc.get("data")
        return data if isinstance(data, dict) else {}

    def check(self) -> None:
        """ZeromonError naming the URL when Prometheus cannot be queried."""
        try:
            self.query("vector(1)")
        except (FetchError, PromQLError) as exc:
            raise ZeromonError(f"--prometheus {self.url}: {exc}",
                               hint="the URL of a Prometheus server, e.g. http://localhost:9090") from None

    def close(self) -> None:
        """Nothing to close: every query is one request on its own connection."""


def _selector(run: Mapping[str, str]) -> str:
    if run.get("zeromon_run"):
        return f'zeromon_run="{_escape(run["zeromon_run"])}"'
    return f'job="{_escape(run.get("job", ""))}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class _Rank:
    """One rank's series, by metric name."""

    def __init__(self) -> None:
        self.series: dict[str, list[Series]] = {}

    def add(self, name: str, series: Series) -> None:
        self.series.setdefault(name, []).append(series)

    def get(self, name: str, **labels: str) -> float | None:
        for s in self.series.get(name, ()):
            if all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
        return None

    def int(self, name: str, **labels: str) -> int | None:
        value = self.get(name, **labels)
        return int(value) if value is not None else None

    def labels(self, name: str) -> Mapping[str, str]:
        items = self.series.get(name)
        return items[0].labels if items else {}


class PrometheusFleet:
    """Polls Prometheus for the newest zeromon run and keeps a RankView per rank seen (stale ones too)."""

    def __init__(self, url: str, timeout_s: float = 5.0, token: str | None = None, run: str | None = None) -> None:
        self.client = PromQL(url, timeout_s, token)
        self.url = self.client.url
        self.run = run  # a zeromon_run to watch; None: the newest
        self._views: dict[int, RankView] = {}
        self._seen: dict[int, float] = {}  # rank -> time.monotonic() last seen alive
        self._steps: dict[int, deque[StepSummary]] = {}
        self._watched: tuple[tuple[str, str], ...] = ()  # the labels of the run being watched
        self._totals: FleetTotals | None = None  # from the recording rules, when the last poll used them
        self._rules_looked: float | None = None  # time.monotonic() the rules' series were last found missing

    def close(self) -> None:
        self.client.close()

    def poll(self, source: str, looked_at: tuple[str, ...]) -> FleetView:
        """One poll: never raises for what Prometheus answers or fails to."""
        try:
            error = self._poll()
        except (FetchError, PromQLError) as exc:
            error = f"prometheus {self.url}: {exc}"
            for rank, view in self._views.items():
                self._views[rank] = replace(view, alive=False, error=error)
        now = time.monotonic()
        ranks = tuple(replace(v, stale_s=round(now - self._seen[r], 3)) if r in self._seen else v
                      for r, v in sorted(self._views.items()))
        watched = dict(self._watched)
        if watched.get("zeromon_run"):
            source = f"{source}: run {watched['zeromon_run']}"
        elif watched.get("job"):
            source = f"{source}: job {watched['job']}"
        totals = self._totals
        if totals is not None:
            source = f"{source} · recorded rules: {totals.ranks} ranks, the worst {len(ranks)} shown"
        elif self._watched:
            source = f"{source} · per-rank series"
        return FleetView(time.time_ns(), source, ranks, looked_at, error, totals)

    def _poll(self) -> str | None:
        if self.run is not None:
            run: Mapping[str, str] = {"zeromon_run": self.run}
        else:
            runs = self.client.query(RUNS_QUERY)
            if runs:
                run = max(runs, key=lambda s: s.value).labels
            elif self._watched:  # the watched run has no fresh series (it ended): its ranks turn stale
                run = dict(self._watched)
            else:
                return self._why_no_series()
        watched = tuple(sorted((k, v) for k, v in run.items() if k in ("zeromon_run", "job")))
        if watched != self._watched:  # another run: the ranks of the last one are not its ranks
            self._watched = watched
            self._views.clear()
            self._seen.clear()
            self._steps.clear()
        now = time.monotonic()
        if self._rules_looked is None or now - self._rules_looked >= RULES_RECHECK_S:
            totals = fleet_totals(self.client.query(RECORDED_QUERY.format(selector=_selector(run))))
            if totals is not None:
                self._poll_worst(run, totals)
                return None
            self._rules_looked = now
        if self._totals is not None:  # the rules' series went away: every rank again, from scratch
            self._totals = None
            self._views.clear()
        self._poll_every_rank(run)
        return None

    def _poll_worst(self, run: Mapping[str, str], totals: FleetTotals) -> None:
        """The views of the ranks the rules name as worst, from their own series; the rest is in totals."""
        if self._totals is None:  # until now every rank was read: keep only the worst
            self._views.clear()
        self._totals, self._rules_looked = totals, None
        worst = sorted({r for ranks in totals.worst.values() for r in ranks})
        by_rank: dict[int, _Rank] = {}
        instance_of: dict[int, str] = {}
        if worst:  # `up` has no rank label: these ranks' targets answered (their series are fresh)
            selector = f'{_selector(run)},rank=~"{"|".join(map(str, worst))}"'
            by_rank = self._by_rank(self.client.query(SERIES_QUERY.format(selector=selector)), {}, instance_of)
        now, now_ns = time.monotonic(), time.time_ns()
        for rank in [r for r in self._views if r not in by_rank]:  # no longer among the worst: not shown
            del self._views[rank]
            self._steps.pop(rank, None)
        for rank, data in by_rank.items():
            self._views[rank] = self._rank_view(rank, data, instance_of.get(rank, ""), now_ns)
            self._seen[rank] = now

    @staticmethod
    def _by_rank(series: list[Series], up: dict[str, float], instance_of: dict[int, str]) -> dict[int, _Rank]:
        """The series by rank; ``up`` and ``instance_of`` filled on the way (up by instance, instance by rank)."""
        by_rank: dict[int, _Rank] = {}
        for item in series:
            name = item.labels.get("__name__", "")
            if name == "up":
                up[item.labels.get("instance", "")] = item.value
                continue
            try:
                rank = int(item.labels["rank"])
            except (KeyError, ValueError):
                continue
            by_rank.setdefault(rank, _Rank()).add(name, item)
            if "instance" in item.labels:
                instance_of[rank] = item.labels["instance"]
        return by_rank

    def _poll_every_rank(self, run: Mapping[str, str]) -> None:
        """Every rank's series, as without the recording rules."""
        up: dict[str, float] = {}
        instance_of: dict[int, str] = {}
        by_rank = self._by_rank(self.client.query(SERIES_QUERY.format(selector=_selector(run))), up, instance_of)
        now, now_ns = time.monotonic(), time.time_ns()
        for rank, data in by_rank.items():
            instance = instance_of.get(rank, "")
            if up.get(instance, 1.0) >= 1.0:
                self._views[rank] = self._rank_view(rank, data, instance, now_ns)
                self._seen[rank] = now
        down = {i for i, v in up.items() if v < 1.0}
        for rank, view in self._views.items():
            if rank not in by_rank or view.target in down:
                # The same words for every rank whose target is down, so that 256 of them are one line across ranks
                # (zeromon live's status lines); the target is the rank's own (its title says it).
                reason = ("Prometheus cannot scrape its endpoint (up == 0)" if view.target in down
                          else "no fresh series in Prometheus")
                self._views[rank] = replace(view, alive=False, error=reason)

    def _why_no_series(self) -> str:
        """Why Prometheus has no zeromon series: no zeromon target, targets all down (and why), or
        targets that answer without zeromon's metrics."""
        targets = self.client.query(TARGETS_QUERY)
        if not targets:
            return (f"prometheus {self.url} has no zeromon series (zeromon_agent_start_time_seconds) and no "
                    "target labelled zeromon_run: is it scraping the agents? (`zeromon targets --write FILE` "
                    "makes its file_sd list)")
        up = sum(1 for s in targets if s.value >= 1)
        if up:
            return (f"prometheus {self.url}: {up} of {len(targets)} zeromon target(s) up, but none exports "
                    "zeromon_agent_start_time_seconds: are they zeromon agents?")
        why = ""
        try:
            errors = sorted((str(t["labels"].get("instance", "")), str(t["lastError"]))
                            for t in self.client.active_targets()
                            if isinstance(t.get("labels"), dict) and t["labels"].get("zeromon_run") and t.get("lastError"))
            if errors:
                instance, error = errors[0]
                why = f": {error} ({instance}){_scrape_hint(error)}"
        except (FetchError, PromQLError):
            pass  # the count says enough
        return f"prometheus {self.url}: {len(targets)} zeromon target(s), all down{why}"

    def _rank_view(self, rank: int, d: _Rank, instance: str, now_ns: int) -> RankView:
        info = d.labels("zeromon_run_info")
        base = next(iter(s.labels for items in d.series.values() for s in items), {})
        run_info = _run_info(rank, info, base) if info else None
        device_name = run_info.device if run_info is not None else "-"
        step = d.int("zeromon_step")
        categories = {s.labels["category"]: int(s.value) for s in d.series.get("zeromon_memory_category_bytes", ())
                      if "category" in s.labels}
        memory_names = ("zeromon_memory_allocated_bytes", "zeromon_memory_rss_bytes", "zeromon_memory_capacity_bytes")
        memory = None
        if categories or any(n in d.series for n in memory_names):
            memory = MemorySample(
                rank=rank, step=step if step is not None else -1, phase="", t_ns=now_ns, device=device_name,
                allocated=d.int("zeromon_memory_allocated_bytes"), reserved=d.int("zeromon_memory_reserved_bytes"),
                active=None, peak_reserved=None,
                # On GPU the peak is the allocator's; on CPU it is the highest RSS sample (OomForecast's peak).
                peak_allocated=d.int("zeromon_memory_peak_bytes") if "zeromon_memory_allocated_bytes" in d.series
                else None,
                inactive_split=None, num_alloc_retries=d.int("zeromon_allocator_retries_total"),
                num_ooms=d.int("zeromon_ooms_total"), capacity=d.int("zeromon_memory_capacity_bytes"), free=None,
                rss=d.int("zeromon_memory_rss_bytes"), categories=categories)
        return RankView(
            rank=rank, target=instance or "-", alive=True, stale_s=0.0, error=None, run_info=run_info,
            steps=self._step_history(rank, d, step, now_ns), memory=memory, device=_device(rank, d, now_ns),
            stats=_stats(rank, d, now_ns), collectives=_collectives(d), oom=_oom(rank, d, memory),
            host=base.get("host"), job=base.get("job"),
            local_rank=int(base["local_rank"]) if base.get("local_rank", "").isdigit() else None,
            world_size=run_info.world_size if run_info is not None else None, t_ns=now_ns,
            start_ns=int(started * 1e9) if (started := d.get("zeromon_agent_start_time_seconds")) and
            0 < started < 2**32 else None)  # a Unix time in seconds: past 2106 it is a damaged value

    def _step_history(self, rank: int, d: _Rank, step: int | None, now_ns: int) -> tuple[StepSummary, ...]:
        """The last step from its gauges, appended to what earlier polls saw."""
        history = self._steps.setdefault(rank, deque(maxlen=STEPS_KEPT))
        duration = d.get("zeromon_last_step_duration_seconds")
        if step is None or duration is None:
            return tuple(history)
        if history and history[-1].step == step:
            return tuple(history)
        if history and history[-1].step > step:  # a new run of the same rank: its steps start again
            history.clear()
        comm = d.get("zeromon_step_comm_seconds") or 0.0
        ratio = d.get("zeromon_step_overlap_ratio")
        # Only the step's gauges are there: what a step summary has beyond them is None (unknown). The
        # duration is the agent's; the end is when this poll saw the step (it ended at most a scrape and a
        # poll interval before), which keeps the steps' rate and durations right.
        history.append(StepSummary(
            rank=rank, step=step, start_ns=now_ns - span_ns(max(0.0, duration)), end_ns=now_ns, phase_s={}, collectives=None,
            comm_bytes=None, comm_bytes_by_op={}, comm_union_s=comm, blocked_s=None, peak_memory=None, comp_s=None,
            overlap_s=ratio * comm if ratio is not None else None,
            exposed_comm_s=d.get("zeromon_step_exposed_comm_seconds")))
        return tuple(history)


def fleet_totals(series: list[Series]) -> FleetTotals | None:
    """The job's numbers from the recording rules' series of one run; None without them (the rules are
    not loaded, or not evaluated yet)."""
    one: dict[str, float] = {}
    by_label: dict[str, dict[str, float]] = {}
    lists: dict[str, list[tuple[float, int]]] = {}
    for item in series:
        name = item.labels.get("__name__", "")
        if name.startswith("job_rank:"):
            if item.labels.get("rank", "").isdigit():
                lists.setdefault(name, []).append((item.value, int(item.labels["rank"])))
        elif "risk" in item.labels or "quantile" in item.labels:
            by_label.setdefault(name, {})[item.labels.get("risk") or item.labels["quantile"]] = item.value
        else:
            one[name] = item.value
    ranks = one.get("job:zeromon_ranks:count")
    if ranks is None:
        return None

    def whole(name: str) -> int | None:
        value = one.get(name)
        return int(value) if value is not None else None

    risk = whole("job:zeromon_oom_risk:max")
    step_s = {**by_label.get("job:zeromon_last_step_duration_seconds:quantile", {}),
              **{k: v for k in ("min", "max") if (v := one.get(f"job:zeromon_last_step_duration_seconds:{k}"))
                 is not None}}
    exposed = {**by_label.get("job:zeromon_step_exposed_comm_ratio:quantile", {}),
               **({"max": v} if (v := one.get("job:zeromon_step_exposed_comm_ratio:max")) is not None else {})}
    worst = {what: tuple(r for _v, r in sorted(lists.get(name, ()), key=lambda vr: (-vr[0] if down else vr[0], vr[1])))
             for what, (name, down) in WORST_LISTS.items()}
    return FleetTotals(
        ranks=int(ranks), answering=whole("run:zeromon_targets_up:sum"), targets=whole("run:zeromon_targets:count"),
        step_min=whole("job:zeromon_step:min"), step_max=whole("job:zeromon_step:max"),
        worst_risk=_RISK.get(risk, Severity.CRITICAL) if risk is not None else None,
        risk_ranks={k: int(v) for k, v in by_label.get("job:zeromon_oom_risk:count", {}).items()},
        headroom_min_bytes=whole("job:zeromon_memory_headroom_bytes:min"),
        headroom_min_ratio=one.get("job:zeromon_memory_headroom_ratio:min"), exposed_share=exposed,
        overlap_min=one.get("job:zeromon_step_overlap_ratio:min"), step_s=step_s,
        step_skew=one.get("job:zeromon_last_step_duration_seconds:skew"),
        events_dropped=whole("job:zeromon_agent_events_dropped_total:sum"), worst=worst)


def _scrape_hint(error: str) -> str:
    """What a scrape error of Prometheus's means for zeromon's agents."""
    if "HTTP status 401" in error:
        return "; the agents want a bearer token: `authorization` in the scrape config (their ZEROMON_TOKEN)"
    if "HTTP status 404" in error:  # the agent id in the file_sd list is not the one listening there
        return "; the agents listed have stopped and others have their ports: the run has ended"
    return ""


def _run_info(rank: int, info: Mapping[str, str], base: Mapping[str, str]) -> RunInfo:
    def label(name: str) -> str | None:
        value = info.get(name)
        return None if value in (None, "", "unknown") else value

    strategy = label("strategy")
    zero = _ZERO_STRATEGY.match(strategy or "")
    world = info.get("world_size", "")
    local = base.get("local_rank", "")
    return RunInfo(
        rank=rank, local_rank=int(local) if local.isdigit() else -1, world_size=int(world) if world.isdigit() else -1,
        host=base.get("host", "-"), pid=None, job=base.get("job", "-"), framework=label("framework") or "unknown",
        framework_version=label("framework_version"), torch_version=None, backend=label("backend"),
        device=label("device") or "-", zero_stage=int(zero.group(1)) if zero else None,
        fsdp_strategy=None if zero or strategy == label("framework") else strategy,
        param_dtype=label("param_dtype"), reduce_dtype=None, optimizer=None,
        knobs={"zeromon_version": info["zeromon_version"]} if "zeromon_version" in info else {})


def _device(rank: int, d: _Rank, now_ns: int) -> DeviceSample | None:
    if not any(name.startswith("zeromon_device_") for name in d.series):
        return None
    util = d.get("zeromon_device_utilization_ratio")
    pcie, nvlink = "zeromon_device_pcie_bytes_per_second", "zeromon_device_nvlink_bytes_per_second"
    return DeviceSample(
        rank=rank, t_ns=now_ns, index=-1, name="", util_gpu_pct=util * 100 if util is not None else None,
        util_mem_pct=None, mem_used=d.int("zeromon_device_memory_used_bytes"),
        mem_total=d.int("zeromon_device_memory_total_bytes"), power_w=d.get("zeromon_device_power_watts"),
        temperature_c=d.get("zeromon_device_temperature_celsius"), pcie_tx_bytes_s=d.get(pcie, direction="tx"),
        pcie_rx_bytes_s=d.get(pcie, direction="rx"), nvlink_tx_bytes_s=d.get(nvlink, direction="tx"),
        nvlink_rx_bytes_s=d.get(nvlink, direction="rx"))


def _stats(rank: int, d: _Rank, now_ns: int) -> AgentStats | None:
    recorded = d.int("zeromon_agent_events_recorded_total")
    if recorded is None:
        return None
    return AgentStats(rank=rank, t_ns=now_ns, events_recorded=recorded,
                      events_dropped=d.int("zeromon_agent_events_dropped_total") or 0,
                      hook_errors=d.int("zeromon_agent_hook_errors_total") or 0,
                      cpu_time_s=d.get("zeromon_agent_cpu_seconds_total") or 0.0)


def _collectives(d: _Rank) -> tuple[CollectiveTotal, ...]:
    keys = sorted({(s.labels.get("op", ""), s.labels.get("meaning", ""))
                   for s in d.series.get("zeromon_collective_calls_total", ())})
    busbw = {s.labels.get("op"): s.value for s in d.series.get("zeromon_collective_busbw_bytes_per_second", ())}
    return tuple(CollectiveTotal(
        op=op, meaning=meaning, calls=d.int("zeromon_collective_calls_total", op=op, meaning=meaning) or 0,
        bytes=d.int("zeromon_collective_bytes_total", op=op, meaning=meaning) or 0,
        seconds=d.get("zeromon_collective_duration_seconds_sum", op=op, meaning=meaning) or 0.0,
        blocked_s=d.get("zeromon_collective_blocked_seconds_total", op=op, meaning=meaning) or 0.0,
        busbw_bytes_s=busbw.get(op)) for op, meaning in keys)


def _oom(rank: int, d: _Rank, memory: MemorySample | None) -> OomForecast | None:
    risk = d.int("zeromon_oom_risk")
    if risk is None:
        return None
    on_gpu = memory is not None and memory.allocated is not None
    current = (memory.allocated if on_gpu else memory.rss) if memory is not None else None
    return OomForecast(
        rank=rank, risk=_RISK.get(risk, Severity.CRITICAL), capacity_bytes=memory.capacity if memory else None,
        current_bytes=current, peak_bytes=d.int("zeromon_memory_peak_bytes"),
        headroom_bytes=d.int("zeromon_memory_headroom_bytes"),
        predicted_peak_bytes=d.int("zeromon_oom_predicted_peak_bytes"), growth_bytes_per_step=None,
        steps_to_capacity=d.get("zeromon_oom_steps_to_capacity"),
        device=memory.device if memory is not None else "-")


def check_prometheus(url: str, timeout_s: float = 5.0) -> None:
    """ZeromonError naming ``--prometheus URL`` when it is malformed or does not answer queries."""
    client = PromQL(url, timeout_s)
    try:
        client.check()
    finally:
        client.close()

