"""/metrics: the agent's live state as Prometheus metric families, made at scrape time.

A custom collector (prometheus_client's documented pattern) on a private CollectorRegistry: nothing
is registered globally and nothing is updated on the training thread; each scrape turns the latest
``live.view.View`` into families. Base units (bytes, seconds), ``_total`` counters, histograms for
durations, and labels rank, local_rank, host, job on every series; the other labels take bounded
values only (op, meaning, memory category, direction). A gauge whose value is unknown is left out.

This module imports prometheus_client; the agent imports it only when the endpoint starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from zeromon.model.events import COLLECTIVE_OPS, MEMORY_CATEGORIES, ZeroMeaning
from zeromon_agent.context.version import __version__
from zeromon_agent.live.figures import RISK_LEVEL
from zeromon_agent.live.totals import DURATION_BUCKETS, STEP_BUCKETS
from zeromon_agent.live.view import LiveData, View

BASE_LABELS = ("rank", "local_rank", "host", "job")
RENDER_TTL_S = 0.5
_MAX_FORMATS = 4
_OPS = frozenset(COLLECTIVE_OPS)
_MEANINGS = frozenset(m.value for m in ZeroMeaning)
_CATEGORIES = frozenset(MEMORY_CATEGORIES)


def _bounded(value: str, allowed: frozenset[str], other: str) -> str:
    """A label value from a known set: whatever else shows up is counted under ``other``."""
    return value if value in allowed else other


def _cumulative(counts: Sequence[int], bounds: Sequence[float]) -> list[tuple[str, float]]:
    """Prometheus histogram buckets (cumulative, le as Go formats it) from per-bound counts."""
    out: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*bounds, float("inf")), counts, strict=False):
        running += count
        out.append((floatToGoString(bound), float(running)))
    return out


class AgentCollector(Collector):
    """Yields the families of one rank's agent from the live view at collect() time."""

    def __init__(self, live: LiveData) -> None:
        self.live = live
        ident = live.identity
        self.base = [str(ident.rank), str(ident.local_rank), ident.host, ident.job]

    def collect(self) -> Iterator[Metric]:
        view = self.live.view()
        yield from self._run_info(view)
        yield from self._collectives(view)
        yield from self._steps(view)
        yield from self._memory(view)
        yield from self._device(view)
        yield from self._progress(view)
        yield from self._agent(view)

    # --- helpers ------------------------------------------------------------------------------------
    def _gauge(self, name: str, doc: str, value: float | None) -> Iterator[Metric]:
        if value is None:
            return
        family = GaugeMetricFamily(name, doc, labels=BASE_LABELS)
        family.add_metric(self.base, float(value))
        yield family

    def _counter(self, name: str, doc: str, value: float | None) -> Iterator[Metric]:
        if value is None:
            return
        family = CounterMetricFamily(name, doc, labels=BASE_LABELS)
        family.add_metric(self.base, float(value))
        yield family

    # --- families -------------------------------------------------------------------------------------
    def _run_info(self, view: View) -> Iterator[Metric]:
        info = view.run_info
        ident = self.live.identity
        strategy = "unknown"
        if info is not None:
            strategy = f"ZeRO-{info.zero_stage}" if info.zero_stage is not None else info.fsdp_strategy or info.framework
        family = InfoMetricFamily("zeromon_run", "What is trained and how: framework, sharding, dtypes.",
                                  labels=BASE_LABELS)
        family.add_metric(self.base, {
            "framework": info.framework if info else "unknown",
            "framework_version": (info.framework_version if info else None) or "unknown",
            "strategy": strategy,
            "world_size": str(info.world_size if info else ident.world_size),
            "backend": (info.backend if info else None) or "unknown",
            "device": info.device if info else "unknown",
            "param_dtype": (info.param_dtype if info else None) or "unknown",
            "zeromon_version": __version__,
        })
        yield family

    def _collectives(self, view: View) -> Iterator[Metric]:
        labels = (*BASE_LABELS, "op", "meaning")
        calls = CounterMetricFamily("zeromon_collective_calls", "Collective calls recorded, by op and ZeRO meaning.",
                                    labels=labels)
        nbytes = CounterMetricFamily("zeromon_collective_bytes", "Bytes moved by collectives (the larger of "
                                     "input and output per call), by op and ZeRO meaning.", labels=labels)
        blocked = CounterMetricFamily("zeromon_collective_blocked_seconds", "Time the training thread was "
                                      "blocked in collectives (their calls and waits; on GPU, the stream's waits), by "
                                      "op and ZeRO meaning.", labels=labels)
        duration = HistogramMetricFamily("zeromon_collective_duration_seconds", "Collective duration, issue to "
                                         "completion, of the calls whose completion was observed.", labels=labels)
        merged: dict[tuple[str, str], list[float]] = {}
        histograms: dict[tuple[str, str], tuple[list[int], float]] = {}
        for row in view.collectives:
            key = (_bounded(row.op, _OPS, "other"), _bounded(row.meaning, _MEANINGS, "unknown"))
            acc = merged.setdefault(key, [0, 0, 0.0])
            acc[0] += row.calls
            acc[1] += row.bytes
            acc[2] += row.blocked_s
            counts, seconds = histograms.get(key, ([0] * len(row.buckets), 0.0))
            histograms[key] = ([a + b for a, b in zip(counts, row.buckets, strict=False)], seconds + row.seconds)
        for key, (n, b, s) in merged.items():
            values = [*self.base, *key]
            calls.add_metric(values, n)
            nbytes.add_metric(values, b)
            blocked.add_metric(values, s)
            counts, seconds = histograms[key]
            duration.add_metric(values, _cumulative(counts, DURATION_BUCKETS), seconds)
        yield from (calls, nbytes, blocked, duration)
        busbw = GaugeMetricFamily("zeromon_collective_busbw_bytes_per_second", "Bus bandwidth (nccl-tests "
                                  "definition), median of the recent calls, by op.", labels=(*BASE_LABELS, "op"))
        for op, value in view.busbw.items():
            if op in _OPS:
                busbw.add_metric([*self.base, op], value)
        yield busbw

    def _steps(self, view: View) -> Iterator[Metric]:
        yield from self._counter("zeromon_steps", "Training steps completed.", view.step_count)
        histogram = HistogramMetricFamily("zeromon_step_duration_seconds", "Step duration, first phase start "
                                          "to optimizer step end.", labels=BASE_LABELS)
        histogram.add_metric(self.base, _cumulative(view.step_buckets, STEP_BUCKETS), view.step_seconds)
        yield histogram
        if not view.steps:
            return
        last = view.steps[-1]
        step_s = last.duration_s
        yield from self._gauge("zeromon_step", "Index of the last completed step, from 0 (zeromon_steps_total counts them).", last.step)
        yield from self._gauge("zeromon_last_step_duration_seconds", "Duration of the last completed step.", step_s)
        yield from self._gauge("zeromon_step_comm_seconds", "Communication time in the last completed step "
                               "(overlapped + exposed: HTA's communication union).", last.comm_union_s)
        exposed = last.exposed_comm_s
        yield from self._gauge("zeromon_step_exposed_comm_seconds", "Communication not overlapped with "
                               "computation in the last completed step (HTA's definition).", exposed)
        yield from self._gauge("zeromon_step_exposed_comm_ratio", "Exposed communication / step duration, "
                               "last completed step.", exposed / step_s if exposed is not None and step_s > 0 else None)
        yield from self._gauge("zeromon_step_overlap_ratio", "Overlapped / all communication time, last "
                               "completed step (HTA's overlap ratio).", last.overlap_ratio)

    def _memory(self, view: View) -> Iterator[Metric]:
        m, oom = view.memory, view.oom
        if m is not None:
            yield from self._gauge("zeromon_memory_allocated_bytes", "Caching allocator: bytes allocated.",
                                   m.allocated)
            yield from self._gauge("zeromon_memory_reserved_bytes", "Caching allocator: bytes reserved.", m.reserved)
            yield from self._gauge("zeromon_memory_rss_bytes", "Resident set size of the training process.", m.rss)
            yield from self._gauge("zeromon_memory_capacity_bytes", "Memory capacity: device total on GPU; on CPU "
                                   "a rank's share of host memory (host RAM or the cgroup limit, divided by the "
                                   "ranks on this host).", m.capacity)
        peak = m.peak_allocated if m is not None and m.peak_allocated is not None else \
            oom.peak_bytes if oom is not None else None
        yield from self._gauge("zeromon_memory_peak_bytes", "Highest memory level seen: the allocator's peak "
                               "allocated on GPU, the highest RSS sample on CPU.", peak)
        if view.categories:
            family = GaugeMetricFamily("zeromon_memory_category_bytes", "Bytes per memory category (FSDPMemTracker "
                                       "names) at the last category walk.", labels=(*BASE_LABELS, "category"))
            for category, value in view.categories.items():
                if category in _CATEGORIES:
                    family.add_metric([*self.base, category], value)
            yield family
        if oom is not None:
            yield from self._gauge("zeromon_memory_headroom_bytes", "Capacity minus the predicted peak "
                                   "(negative: it will not fit).", oom.headroom_bytes)
            yield from self._gauge("zeromon_oom_risk", "OOM risk: 0 ok, 1 warn, 2 critical.", RISK_LEVEL[oom.risk])
            yield from self._gauge("zeromon_oom_predicted_peak_bytes", "Predicted peak memory, including the peaks "
                                   "still to come (first optimizer step, ZeRO-3 gathers).", oom.predicted_peak_bytes)
            yield from self._gauge("zeromon_oom_steps_to_capacity", "Steps until the growing peak reaches capacity "
                                   "(only while it grows).", oom.steps_to_capacity)
        if m is not None:
            yield from self._counter("zeromon_allocator_retries", "cudaMalloc retries of the caching allocator "
                                     "(the earliest sign of memory pressure).", m.num_alloc_retries)
        allocator_ooms = m.num_ooms if m is not None and m.num_ooms is not None else 0
        yield from self._counter("zeromon_ooms", "Out-of-memory errors seen.", max(view.ooms, allocator_ooms))

    def _device(self, view: View) -> Iterator[Metric]:
        d = view.device
        if d is None:
            return
        yield from self._gauge("zeromon_device_utilization_ratio", "GPU utilization (NVML), 0..1.",
                               d.util_gpu_pct / 100 if d.util_gpu_pct is not None else None)
        yield from self._gauge("zeromon_device_memory_used_bytes", "Device memory used, all processes (NVML).",
                               d.mem_used)
        yield from self._gauge("zeromon_device_memory_total_bytes", "Device memory total (NVML).", d.mem_total)
        yield from self._gauge("zeromon_device_power_watts", "Power draw (NVML).", d.power_w)
        yield from self._gauge("zeromon_device_temperature_celsius", "GPU temperature (NVML).", d.temperature_c)
        for name, doc, tx, rx in (
            ("zeromon_device_pcie_bytes_per_second", "PCIe throughput (NVML).", d.pcie_tx_bytes_s, d.pcie_rx_bytes_s),
            ("zeromon_device_nvlink_bytes_per_second", "NVLink throughput (NVML).", d.nvlink_tx_bytes_s,
             d.nvlink_rx_bytes_s),
        ):
            if tx is None and rx is None:
                continue
            family = GaugeMetricFamily(name, doc, labels=(*BASE_LABELS, "direction"))
            for direction, value in (("tx", tx), ("rx", rx)):
                if value is not None:
                    family.add_metric([*self.base, direction], value)
            yield family

    def _progress(self, view: View) -> Iterator[Metric]:
        """Where the rank is in its collectives: what a hang alert compares across ranks (zeromon-alerts.yml)."""
        p = view.progress
        if p is None:
            return
        yield from self._gauge("zeromon_progress_age_seconds", "Seconds since the rank last made progress (a "
                               "collective issued or completed, a phase or step boundary).", round(p.idle_s, 3))
        yield from self._gauge("zeromon_stall_threshold_seconds", "No progress for this long makes the rank "
                               "suspect (ZEROMON_HANG_AFTER, else the larger of 30 s and ten median steps; before the first "
                               "step ends ZEROMON_HANG_AFTER_SETUP, else the larger of 300 s and ZEROMON_HANG_AFTER).",
                               p.threshold_s)
        yield from self._gauge("zeromon_stalled", "1 while the rank has made no progress for its threshold.",
                               1 if p.stalled else 0)
        group_labels = (*BASE_LABELS, "group", "group_desc")
        issued = GaugeMetricFamily("zeromon_group_collectives_issued", "Collectives the rank has issued in each "
                                   "process group: the group's sequence number, which every rank of it counts "
                                   "alike.", labels=group_labels)
        for g in p.groups:
            if g.issued >= 0:
                issued.add_metric([*self.base, g.group, g.desc], g.issued)
        yield issued
        blocked = p.blocked
        if blocked is None:
            return
        call = blocked.call
        labels = (*group_labels, "op", "meaning")
        group = p.group(call.group)
        values = [*self.base, call.group, group.desc if group is not None else "", _bounded(call.op, _OPS, "other"),
                  _bounded(call.meaning, _MEANINGS, "unknown")]
        seconds = GaugeMetricFamily("zeromon_collective_inflight_seconds", "How long the training thread has been "
                                    "inside this collective (its call, or its wait); absent when it is in none.",
                                    labels=labels)
        seconds.add_metric(values, max(0.0, (p.t_ns - blocked.since_ns) / 1e9))
        seq = GaugeMetricFamily("zeromon_collective_inflight_seq", "The group sequence number of the collective the "
                                "training thread is inside.", labels=labels)
        seq.add_metric(values, call.seq)
        yield from (seconds, seq)

    def _agent(self, view: View) -> Iterator[Metric]:
        s = view.stats
        yield from self._counter("zeromon_agent_events_recorded", "Collective calls the agent's hooks recorded "
                                 "(phases, steps and memory samples are not counted).", s.events_recorded)
        yield from self._counter("zeromon_agent_events_dropped", "Events dropped because the agent's bounded "
                                 "buffer was full.", s.events_dropped)
        yield from self._counter("zeromon_agent_hook_errors", "Exceptions caught inside zeromon's hooks "
                                 "(training continued).", s.hook_errors)
        yield from self._counter("zeromon_recording_lost_records", "Records the agent could not write to its "
                                 "recording (a full disk, a read-only or removed folder); the live endpoint goes on.",
                                 s.records_lost)
        yield from self._counter("zeromon_recording_lost_bytes", "Bytes of the records the agent could not write "
                                 "to its recording.", s.bytes_lost)
        yield from self._counter("zeromon_agent_cpu_seconds", "CPU time of the agent's own threads (recorder "
                                 "and endpoint).", s.cpu_time_s)
        yield from self._gauge("zeromon_agent_start_time_seconds", "When the agent's endpoint started, Unix "
                               "seconds.", self.live.identity.start_ns / 1e9)


class MetricsRenderer:
    """The exposition bytes for a scrape, rendered at most every RENDER_TTL_S per format."""

    def __init__(self, live: LiveData) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(live))
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bytes]] = {}

    def render(self, accept: str | None) -> tuple[bytes, str]:
        """(body, content type) for an Accept header: OpenMetrics when asked for, else text 0.0.4."""
        encoder, content_type = choose_encoder(accept or "")
        with self._lock:
            now = time.monotonic()
            hit = self._cache.get(content_type)
            if hit is not None and now - hit[0] < RENDER_TTL_S:
                return hit[1], content_type
            body = encoder(self.registry)
            if len(self._cache) >= _MAX_FORMATS:  # the content type echoes the client's version: bounded
                self._cache.clear()
            self._cache[content_type] = (now, body)
            return body, content_type
