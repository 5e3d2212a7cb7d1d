"""OOM forecast: whether a rank will run out of memory, when, and why, before it does.

One rank's recording in, an OomForecast out: a risk level (ok / warn / critical), headroom, the
predicted peak, the growth per step and the steps left until capacity, and Findings that name their
evidence and the remedies that apply to this run's framework and config.

The level is what the rank holds at each moment the agent samples (forward end, backward end, step
end, and in the steps that walk the categories the highest moments inside the forward and the
backward): the caching allocator's ``allocated`` on GPU, the process RSS on CPU. On GPU the
allocator's high-water mark (``peak_allocated``) also catches peaks between samples, and the device
memory outside the allocator (CUDA context, NCCL buffers, other processes: capacity − free −
reserved at the last sample) is added to every predicted peak.

The peak still to come is the largest of:
- the peak seen so far;
- before the first optimizer step has finished, that peak plus the optimizer state, which does not
  exist yet and stays for every later step: Adam keeps two states per parameter that this rank's
  optimizer updates (its FSDP shard, all of them for DDP), in that parameter's dtype. DeepSpeed
  allocates its fp32 master partition at initialization (seen as optimizer_state) and Adam's two
  moments, each the master's size, at the first step;
- ZeRO-3: the sharded state plus up to ``stage3_max_live_parameters`` gathered parameters
  (DeepSpeed's default 1e9) of the parameter dtype, at most the whole model.

The trend is the Theil–Sen slope of the per-step peak over the last TREND_WINDOW_STEPS complete
steps after WARMUP_STEPS. It counts as growth (a leak) only when the Mann–Kendall statistic says
the peak rises consistently and it rose by more than noise: RSS creeps by a few MiB while the C
allocator and Python settle; the GPU allocator's count
is exact.

Thresholds (the constants below): warn when a predicted peak passes 85% of capacity or a growing
peak reaches capacity within 1000 steps or, at the median step time, 1 hour of training; critical
past 95%, within 50 steps or 10 minutes, on any recorded OOM, or when the allocator's retries grew
in the last 10 steps. Steps alone let a fast leak through (1500 steps of 30 ms are 45 s); time
alone would call 40 steps of 60 s only a warning. The time horizon counts only up to 100 trend
windows ahead, since a short trend extrapolated further is mostly noise. When the categories hold
under 25% of the level, the peak is blamed on what is outside them (leaks, caches, the runtime's
RSS), not on model state.
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Iterable, Mapping
from itertools import repeat

from zeromon.analysis.findings import Finding, Severity, worst
from zeromon.analysis.memory_remedies import (
    DS_DEFAULT_MAX_LIVE_PARAMETERS,
    MemoryContext,
    fsdp_offloads,
    memory_remedies,
    number_knob,
    untracked_remedies,
)
from zeromon.model.classes import frozen
from zeromon.model.codec import Recording
from zeromon.model.events import PEAK_PHASES, MemorySample, step_number
from zeromon.model.step_records import step_column
from zeromon.model.units import format_bytes

WARN_PEAK_SHARE = 0.85
CRITICAL_PEAK_SHARE = 0.95
# At 0.5–5 s a step, 1000 steps are 8 minutes to 1.4 hours: time to act; 50 steps are minutes.
WARN_STEPS_TO_CAPACITY = 1000
CRITICAL_STEPS_TO_CAPACITY = 50
# The same horizon in training time, when the step time is known: short steps reach a far step count soon.
WARN_SECONDS_TO_CAPACITY = 3600.0
CRITICAL_SECONDS_TO_CAPACITY = 600.0
# ... as far as a trend can be trusted: capacity at most this many trend windows ahead. RSS that
# creeps over a few short steps while the C allocator settles (a CPU ZeRO-3 run) would otherwise be a
# leak due within the hour, though a thousand windows ahead; tests/test_oom.py's leak is due a few
# windows ahead.
TIME_HORIZON_MAX_WINDOWS = 100
WARMUP_STEPS = 2  # step 0 allocates the optimizer state; step 1 may still fill allocator caches
TREND_WINDOW_STEPS = 50
MIN_TREND_STEPS = 5
GROWTH_MIN_TAU = 0.6  # Mann–Kendall tau: (rising − falling pairs) / all pairs
GROWTH_MIN_BYTES = 4 * 2**20  # the least rise over the window that counts, and as a share of the level:
GROWTH_MIN_SHARE_RSS = 0.02
GROWTH_MIN_SHARE_ALLOCATED = 0.002
RETRY_RECENT_STEPS = 10
FRAGMENTATION_WARN_SHARE = 0.10  # reserved − allocated, of capacity
GATHER_MIN_SHARE = 0.01  # ZeRO-3 gathers beyond those seen must add this share of capacity to be a finding
# Below this share of the level the categories do not explain the peak: the finding says what is
# outside them (leaks, caches, the runtime's RSS) rather than offering model-state remedies.
TRACKED_MIN_SHARE = 0.25

_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8,
                "float8_e4m3fn": 1, "float8_e5m2": 1}
# States per parameter, each the parameter's size, by a fragment of the optimizer's class name
# (FusedAdam, DeepSpeedCPUAdam and AdamW all contain "adam"). SGD keeps one only with momentum.
_OPTIMIZER_STATES = (("adafactor", 0), ("adam", 2), ("lamb", 2), ("lion", 1), ("adagrad", 1),
                     ("rmsprop", 1), ("sgd", 1))


@frozen
class OomForecast:
    rank: int
    risk: Severity  # OK, WARN or CRITICAL: the worst finding (INFO findings leave it OK)
    capacity_bytes: int | None
    current_bytes: int | None  # the level at the last sample
    peak_bytes: int | None  # the highest level seen
    headroom_bytes: int | None  # capacity − predicted peak; negative: it will not fit
    # The largest of the peaks seen and still to come, plus on GPU the memory outside the allocator.
    predicted_peak_bytes: int | None
    growth_bytes_per_step: float | None  # Theil–Sen slope of the per-step peak; None: too few steps
    steps_to_capacity: float | None  # None unless the level grows (see the module's docstring)
    findings: tuple[Finding, ...] = ()
    device: str = "-"  # "cpu" (the level is RSS) or "cuda:N" (the allocator's allocated bytes)
    pending_optimizer_bytes: int = 0  # optimizer state the first optimizer step will still allocate

    def to_dict(self) -> dict[str, object]:
        return {"rank": self.rank, "risk": self.risk.value, "device": self.device,
                "capacity_bytes": self.capacity_bytes, "current_bytes": self.current_bytes,
                "peak_bytes": self.peak_bytes, "headroom_bytes": self.headroom_bytes,
                "predicted_peak_bytes": self.predicted_peak_bytes,
                "growth_bytes_per_step": self.growth_bytes_per_step,
                "steps_to_capacity": self.steps_to_capacity,
                "pending_optimizer_bytes": self.pending_optimizer_bytes,
                "findings": [f.to_dict() for f in self.findings]}


@frozen
class _Trend:
    slope: float
    fitted_last: float  # the fitted line at the last step of the window
    tau: float
    steps: tuple[int, ...]
    values: tuple[int, ...]
    growing: bool


def forecast(recording: Recording, capacity_bytes: int | None = None) -> OomForecast:
    """The OOM forecast of one rank; ``capacity_bytes`` overrides the capacity the agent recorded."""
    samples = sorted(recording.memory, key=lambda m: m.t_ns)
    on_gpu = any(m.allocated is not None for m in samples)
    points = [(m, level) for m in samples if (level := m.allocated if on_gpu else m.rss) is not None]
    capacity = capacity_bytes or next((m.capacity for m in reversed(samples) if m.capacity), None)
    findings = _recorded_ooms(recording, samples)
    if not points:
        findings.append(Finding("oom_no_data", Severity.INFO, "no memory samples recorded: nothing to forecast",
                                rank=recording.rank))
        return OomForecast(rank=recording.rank, risk=_risk(findings), capacity_bytes=capacity,
                           current_bytes=None, peak_bytes=None, headroom_bytes=None, predicted_peak_bytes=None,
                           growth_bytes_per_step=None, steps_to_capacity=None, findings=tuple(findings))
    walks = [m for m in samples if any(k != "activations" for k in m.categories)]
    run = MemoryContext(rank=recording.rank, info=recording.run_info, on_gpu=on_gpu, capacity=capacity,
               outside=_outside_allocator(samples) if on_gpu else 0, walk=walks[-1] if walks else None)

    peaks = _step_peaks(points, on_gpu)
    peak = max([level for _, level in points] + list(peaks.values()))
    peak_step = max(peaks, key=lambda s: peaks[s]) if peaks else None
    last_step = max(peaks) if peaks else -1
    # The summaries a field at a time (step_column: of a StepRecords, no object made).
    summary_steps = step_column(recording.steps, "step")
    done = set(summary_steps) | {s for s in peaks if s < last_step}
    # The trend from the samples taken every step: the peaks inside the forward and the backward are
    # sampled in the steps that walk the categories only, and would make a sawtooth of the series.
    every_step = _step_peaks([p for p in points if p[0].phase not in PEAK_PHASES], on_gpu)
    # A bounded recording keeps memory samples in some steps only; every step's summary has its peak,
    # taken by the agent from the same samples.
    for step, summary_peak in zip(summary_steps, step_column(recording.steps, "peak_memory"), strict=True):
        if summary_peak is not None and step >= 0:
            every_step.setdefault(step, summary_peak)
    trend = _trend(every_step, done, on_gpu)
    # StepSummary.duration_s of each
    durations = map(operator.sub, step_column(recording.steps, "end_ns"), step_column(recording.steps, "start_ns"))
    step_s = statistics.median(map(operator.truediv, durations, repeat(1e9))) if recording.steps else None

    # Until a step has ended the optimizer has not stepped: its state is still to come.
    stepped = bool(recording.steps) or last_step >= 1
    predicted, pending, finding = (peak, 0, None) if stepped else \
        _optimizer_still_to_come(run, peak, peak_step, points[-1][1])
    if finding is None:
        finding = _peak_finding(run, peak, peak_step, recording, growing=trend is not None and trend.growing)
    if finding is not None:
        findings.append(finding)
    gather_peak, finding = _zero3_gathers(run, peak, walks)
    if finding is not None:
        findings.append(finding)
    predicted = max(predicted, gather_peak)

    steps_to_capacity = None
    if trend is not None and trend.growing:
        if capacity:
            steps_to_capacity = max(0.0, (capacity - run.outside - trend.fitted_last) / trend.slope)
        findings.append(_growth_finding(run, trend, steps_to_capacity, step_s, walks))
    if on_gpu:
        findings.extend(_allocator_findings(run, samples))

    predicted_total = predicted + run.outside
    return OomForecast(
        rank=recording.rank, risk=_risk(findings), capacity_bytes=capacity, current_bytes=points[-1][1],
        peak_bytes=peak, headroom_bytes=capacity - predicted_total if capacity else None,
        predicted_peak_bytes=predicted_total, growth_bytes_per_step=trend.slope if trend else None,
        steps_to_capacity=steps_to_capacity, findings=tuple(findings),
        device=points[-1][0].device, pending_optimizer_bytes=pending)


def forecast_run(recordings: Iterable[Recording], capacity_bytes: int | None = None) -> tuple[OomForecast, ...]:
    """One forecast per rank, in the order given."""
    return tuple(forecast(rec, capacity_bytes) for rec in recordings)


# --- levels and trend -------------------------------------------------------------------------------

def _outside_allocator(samples: list[MemorySample]) -> int:
    for m in reversed(samples):
        if m.capacity is not None and m.free is not None and m.reserved is not None:
            return max(0, m.capacity - m.free - m.reserved)
    return 0


def _step_peaks(points: list[tuple[MemorySample, int]], on_gpu: bool) -> dict[int, int]:
    """The highest level of each step. On GPU a rise of the allocator's high-water mark since the
    previous sample happened within this sample's step; the first sample's mark is left out, since
    it may be setup's (materializing the model before sharding it)."""
    peaks: dict[int, int] = {}
    high: int | None = None
    for m, level in points:
        value = level
        if on_gpu and m.peak_allocated is not None:
            if high is not None and m.peak_allocated > high:
                value = max(value, m.peak_allocated)
            high = m.peak_allocated if high is None else max(high, m.peak_allocated)
        if m.step >= 0:
            peaks[m.step] = max(peaks.get(m.step, value), value)
    return peaks


def _trend(peaks: Mapping[int, int], done: set[int], on_gpu: bool) -> _Trend | None:
    steps = sorted(s for s in done if s >= WARMUP_STEPS and s in peaks)[-TREND_WINDOW_STEPS:]
    n = len(steps)
    if n < MIN_TREND_STEPS:
        return None
    values = [peaks[s] for s in steps]
    slopes: list[float] = []
    concordance = 0
    for i in range(n):
        for j in range(i + 1, n):
            rise = values[j] - values[i]
            slopes.append(rise / (steps[j] - steps[i]))
            concordance += (rise > 0) - (rise < 0)
    slope = statistics.median(slopes)
    intercept = statistics.median(y - slope * x for x, y in zip(steps, values, strict=True))
    fitted_last = intercept + slope * steps[-1]
    tau = concordance / (n * (n - 1) / 2)
    floor = max(GROWTH_MIN_BYTES, (GROWTH_MIN_SHARE_ALLOCATED if on_gpu else GROWTH_MIN_SHARE_RSS) * fitted_last)
    growing = slope > 0 and tau >= GROWTH_MIN_TAU and slope * (steps[-1] - steps[0]) >= floor
    return _Trend(slope=slope, fitted_last=fitted_last, tau=tau, steps=tuple(steps), values=tuple(values),
                  growing=growing)


def _severity_of_share(share: float | None) -> Severity:
    if share is None:
        return Severity.INFO
    if share >= CRITICAL_PEAK_SHARE:
        return Severity.CRITICAL
    return Severity.WARN if share >= WARN_PEAK_SHARE else Severity.INFO


def _risk(findings: list[Finding]) -> Severity:
    level = worst(findings)
    return Severity.OK if level == Severity.INFO else level


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def duration_words(seconds: float) -> str:
    """'8.5 s', '32 s', '5 min', '1.2 h'."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _capacity_text(run: MemoryContext) -> str:
    text = f"capacity {format_bytes(run.capacity)}"
    if run.outside:
        text += f", of which {format_bytes(run.outside)} is held outside PyTorch's allocator (CUDA context, " \
                "NCCL, other processes)"
    return text


def _breakdown(run: MemoryContext) -> str | None:
    cats = {k: v for k, v in run.categories.items() if v > 0}
    if run.walk is None or not cats:
        return None
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]))
    return f"by category at the end of step {step_number(run.walk.step)}'s forward: {parts}"


# --- the peaks still to come ------------------------------------------------------------------------

def _optimizer_states(name: str | None) -> tuple[int, str]:
    if name:
        low = name.lower()
        for fragment, states in _OPTIMIZER_STATES:
            if fragment in low:
                return states, f"{name} keeps {states} state{'s' if states != 1 else ''} per parameter"
    return 2, f"optimizer {'not known yet' if not name else name + ' not known'}: assumed Adam, 2 states per parameter"


def _optimizer_off_gpu(run: MemoryContext) -> bool:
    """Whether the optimizer state lives off this GPU (DeepSpeed's or FSDP's offload)."""
    return run.on_gpu and (run.knob("offload_optimizer") not in (None, "none") or fsdp_offloads(run))


def _optimizer_still_to_come(run: MemoryContext, peak: int, peak_step: int | None,
                             current: int) -> tuple[int, int, Finding | None]:
    """(predicted peak, optimizer state still to come, finding) before the first optimizer step.

    The state stays for every later step, so the next forward and backward peak at ``peak + state``.
    The step itself holds the state on top of what the backward left (``current``), and torch's
    foreach implementation (its default on CUDA) a temporary of the parameters' size besides.
    """
    if run.walk is None:
        return peak, 0, None
    cats = run.categories
    existing = cats.get("optimizer_state", 0)
    states, about = _optimizer_states(run.info.optimizer if run.info else None)
    framework = run.info.framework if run.info else "unknown"
    if states == 0 or _optimizer_off_gpu(run):
        return peak, 0, None
    temporaries = 0
    if framework == "deepspeed" and existing > 0:
        basis, what = existing, "DeepSpeed's fp32 master partition (allocated at initialization)"
        pending = states * existing
    else:
        category = "sharded_params" if cats.get("sharded_params") else "unsharded_params"
        basis, what = cats.get(category, 0), f"this rank's parameters ({category})"
        pending = max(0, states * basis - existing)
        temporaries = basis if run.on_gpu else 0  # on CPU torch steps one parameter at a time
    if pending <= 0:
        return peak, 0, None
    predicted = max(peak + pending, current + pending + temporaries)
    share = run.share(predicted)
    severity = _severity_of_share(share)
    so_far = f"peak so far {format_bytes(peak)}" + (f" (step {step_number(peak_step)})" if peak_step is not None else "")
    evidence = [
        f"the first optimizer step has not finished: the optimizer state does not exist yet; {about}: "
        f"{states} × {format_bytes(basis)} of {what} = {format_bytes(pending)}",
        f"{so_far} + {format_bytes(pending)} optimizer state = {format_bytes(peak + pending)}",
    ]
    if temporaries:
        evidence.append(f"during the step: {format_bytes(current)} now + {format_bytes(pending)} state + "
                        f"{format_bytes(temporaries)} of foreach temporaries = "
                        f"{format_bytes(current + pending + temporaries)} (a fused optimizer, e.g. "
                        "AdamW(fused=True), has none)")
    if run.capacity:
        evidence.append(f"predicted peak {format_bytes(predicted)}: {_pct(share)} of {_capacity_text(run)}")
    if breakdown := _breakdown(run):
        evidence.append(breakdown)
    if severity == Severity.INFO:
        title = f"the first optimizer step will add {format_bytes(pending)} of optimizer state; it fits"
    else:
        verb = "will not fit" if share is not None and share >= 1 else "will leave little headroom"
        title = f"the first optimizer step will allocate {format_bytes(pending)} of optimizer state and {verb}: " \
                f"predicted peak {_pct(share)} of capacity"
    metrics = {"pending_optimizer_bytes": float(pending), "predicted_peak_bytes": float(predicted)}
    if share is not None:
        metrics["predicted_share"] = share
    return predicted, pending, Finding(
        "optimizer_state_pending", severity, title, rank=run.rank, step=0, evidence=tuple(evidence),
        remedies=memory_remedies(run, {"optimizer", "activations"}) if severity != Severity.INFO else (), metrics=metrics)


def _zero3_gathers(run: MemoryContext, peak: int, walks: list[MemorySample]) -> tuple[int, Finding | None]:
    info = run.info
    if info is None or info.framework != "deepspeed" or info.zero_stage != 3 or run.walk is None:
        return 0, None
    max_live, configured = number_knob(run.knob("stage3_max_live_parameters"), DS_DEFAULT_MAX_LIVE_PARAMETERS)
    itemsize = _DTYPE_BYTES.get(info.param_dtype or "", 2)
    bound = int(max_live * itemsize)
    # The partitions ds_tensor holds, times the ranks: the whole model in the parameter dtype.
    model_bytes = run.categories.get("sharded_params", 0) * max(1, info.world_size)
    gathered = min(bound, model_bytes) if model_bytes else bound
    seen = max((w.categories.get("unsharded_params", 0) for w in walks), default=0)
    predicted = max(peak, peak - seen + gathered)
    share = run.share(predicted)
    severity = _severity_of_share(share)
    # Gathers already seen at the peak are in the peak finding; this one is about those still possible.
    if severity == Severity.INFO or not run.capacity or predicted - peak < GATHER_MIN_SHARE * run.capacity:
        return predicted, None
    knob = f"stage3_max_live_parameters={max_live:.3g}" + ("" if configured else " (DeepSpeed's default)")
    evidence = (
        f"{knob} × {itemsize} bytes ({info.param_dtype}) lets ZeRO-3 hold up to {format_bytes(bound)} of gathered "
        f"parameters" + (f"; the whole model is {format_bytes(model_bytes)}" if model_bytes else ""),
        f"peak {format_bytes(peak)} with {format_bytes(seen)} gathered seen; with {format_bytes(gathered)} gathered "
        f"it would be {format_bytes(predicted)}, {_pct(share)} of {_capacity_text(run)}",
    )
    return predicted, Finding("zero3_gather_bound", severity,
                              f"ZeRO-3 may gather up to {format_bytes(gathered)} of parameters at once: "
                              f"{_pct(share)} of capacity", rank=run.rank, evidence=evidence,
                              remedies=memory_remedies(run, {"gathers"}),
                              metrics={"gather_bound_bytes": float(gathered), "predicted_peak_bytes": float(predicted)})


def _first_step_rise(recording: Recording, peak: int) -> str | None:
    """How far the first optimizer step moved the peak: the level before it versus the peak."""
    start = min((p.start_ns for p in recording.phases if p.phase == "optimizer" and p.step == 0), default=None)
    if start is None:
        return None
    before = [m.allocated if m.allocated is not None else m.rss for m in recording.memory
              if m.step == 0 and m.t_ns < start]
    levels = [b for b in before if b is not None]
    if not levels or peak <= max(levels):
        return None
    return f"before the first optimizer step the peak was {format_bytes(max(levels))}; it is now " \
           f"{format_bytes(peak)} (+{format_bytes(peak - max(levels))})"


def _peak_finding(run: MemoryContext, peak: int, peak_step: int | None, recording: Recording,
                  growing: bool) -> Finding | None:
    share = run.share(peak)
    severity = _severity_of_share(share)
    if severity == Severity.INFO:
        return None
    cats = {k: v for k, v in run.categories.items() if v > 0 and k != "other"}
    largest = max(cats, key=lambda k: cats[k]) if cats else None
    level = run.walk_level
    tracked_share = run.tracked / level if run.walk is not None and level else None
    untracked = tracked_share is not None and tracked_share < TRACKED_MIN_SHARE
    title = f"peak memory at {_pct(share)} of capacity"
    if untracked and level is not None:
        title += f", mostly outside the model and optimizer: their categories hold {format_bytes(run.tracked)} " \
                 f"of {format_bytes(level)}"
    elif largest is not None:
        title += f"; the largest category is {largest} ({format_bytes(cats[largest])})"
    evidence = [f"peak {format_bytes(peak)}" + (f" in step {step_number(peak_step)}" if peak_step is not None else "")
                + f", {_pct(share)} of {_capacity_text(run)}"]
    if breakdown := _breakdown(run):
        evidence.append(breakdown)
    if untracked and run.walk is not None and level is not None:
        runtime = "the process RSS also holds the Python and torch runtime, libraries and memory the C allocator " \
                  "keeps after frees; and " if not run.on_gpu else ""
        evidence.append(f"the categories (parameters, gradients, optimizer state, activations) hold "
                        f"{format_bytes(run.tracked)} of the {format_bytes(level)} at step {step_number(run.walk.step)} "
                        f"({tracked_share:.1%}); the rest is untracked: {runtime}tensors held outside the model "
                        "and optimizer (leaks, caches, activations of other code)")
    optimizer_state = cats.get("optimizer_state", 0)
    if optimizer_state and (rise := _first_step_rise(recording, peak)) is not None:
        evidence.append(f"{rise}; the optimizer state is now {format_bytes(optimizer_state)}")
    remedies = untracked_remedies(run, growing) if untracked else memory_remedies(run, {"all"})
    metrics = {"peak_bytes": float(peak), "share": share or 0.0}
    if tracked_share is not None:
        metrics["tracked_share"] = tracked_share
    return Finding("peak_near_capacity", severity, title, rank=run.rank, step=peak_step, evidence=tuple(evidence),
                   remedies=remedies, metrics=metrics)


# --- growth, allocator, recorded OOMs ---------------------------------------------------------------

def _growth_severity(steps_to_capacity: float | None, seconds_to_capacity: float | None) -> Severity:
    """The worse of the step horizon and, where it applies (``seconds_to_capacity``), the time horizon."""
    if steps_to_capacity is None:
        return Severity.INFO  # no capacity: nothing to reach
    by_steps = (Severity.CRITICAL if steps_to_capacity <= CRITICAL_STEPS_TO_CAPACITY else
                Severity.WARN if steps_to_capacity <= WARN_STEPS_TO_CAPACITY else Severity.INFO)
    if seconds_to_capacity is None:
        return by_steps
    by_time = (Severity.CRITICAL if seconds_to_capacity <= CRITICAL_SECONDS_TO_CAPACITY else
               Severity.WARN if seconds_to_capacity <= WARN_SECONDS_TO_CAPACITY else Severity.INFO)
    return max(by_steps, by_time, key=lambda s: s.rank)


def _horizon_text(severity: Severity, steps_to_capacity: float, seconds_to_capacity: float | None,
                  time_reach_steps: int | None) -> str:
    """Which horizon the growth is inside, and what the horizons are: the reason for its severity.

    ``time_reach_steps``: how far ahead the time horizon counts (None: no step time yet).
    """
    timed = time_reach_steps is not None and steps_to_capacity <= time_reach_steps
    warn, critical = f"{WARN_STEPS_TO_CAPACITY} steps", f"{CRITICAL_STEPS_TO_CAPACITY} steps"
    if timed:
        warn += f" or {duration_words(WARN_SECONDS_TO_CAPACITY)} of training"
        critical += f" or {duration_words(CRITICAL_SECONDS_TO_CAPACITY)}"
    horizons = f"warn when capacity is within {warn}, critical within {critical}"
    if time_reach_steps is None:
        horizons += " (no step time yet: no time horizon)"
    elif not timed:
        horizons += (f"; training time counts only within {time_reach_steps} steps ({TIME_HORIZON_MAX_WINDOWS} × "
                     "the steps the trend was seen over): further out, a trend this short says little")
    if severity == Severity.INFO:
        return f"beyond the horizon: {horizons}"
    steps_limit = CRITICAL_STEPS_TO_CAPACITY if severity == Severity.CRITICAL else WARN_STEPS_TO_CAPACITY
    if steps_to_capacity <= steps_limit or seconds_to_capacity is None:
        inside = f"~{steps_to_capacity:.0f} steps"
    else:  # the time horizon made it so
        inside = f"~{duration_words(seconds_to_capacity)} of training"
    return f"{severity.value}: capacity is {inside} away; {horizons}"


def _steadiness(trend: _Trend) -> str:
    """How steady the rise was, in plain words: the Theil–Sen slope and Mann–Kendall tau stay in the
    docs (docs/definitions.md) and the finding's metrics, where a user can look them up."""
    values, n = trend.values, len(trend.values)
    rises = sum(b > a for a, b in zip(values, values[1:], strict=False))
    if rises == n - 1:
        return f"the typical rise over {n} steps: the peak rose in every step"
    higher = sum(values[j] > values[i] for i in range(n) for j in range(i + 1, n)) / (n * (n - 1) / 2)
    return (f"the typical rise over {n} steps: the peak rose in {rises} of {n - 1} steps, and a later step's peak "
            f"was above an earlier one's in {higher:.0%} of pairs of steps")


def _growth_finding(run: MemoryContext, trend: _Trend, steps_to_capacity: float | None, step_s: float | None,
                    walks: list[MemorySample]) -> Finding:
    seconds_to_capacity = steps_to_capacity * step_s if steps_to_capacity is not None and step_s else None
    time_reach_steps = TIME_HORIZON_MAX_WINDOWS * len(trend.steps) if step_s else None
    timed = steps_to_capacity is not None and time_reach_steps is not None and steps_to_capacity <= time_reach_steps
    severity = _growth_severity(steps_to_capacity, seconds_to_capacity if timed else None)
    first, last = trend.steps[0], trend.steps[-1]
    evidence = [
        f"the per-step peak rose from {format_bytes(trend.values[0])} (step {step_number(first)}) to "
        f"{format_bytes(trend.values[-1])} (step {step_number(last)}): {format_bytes(trend.slope)} per step, "
        f"{_steadiness(trend)}",
    ]
    over = steps_to_capacity == 0
    if over:
        evidence.append(f"at step {step_number(last)} the per-step peak is already {_pct(run.share(trend.fitted_last))} of "
                        f"the {_capacity_text(run)}")
    elif steps_to_capacity is not None:
        when = f" (~{duration_words(seconds_to_capacity)} at {step_s:.2g} s per step, the median)" \
            if seconds_to_capacity is not None and step_s else ""
        evidence.append(f"at this rate the {_capacity_text(run)} is reached in ~{steps_to_capacity:.0f} steps{when}")
    if steps_to_capacity is not None and not over:
        evidence.append(_horizon_text(severity, steps_to_capacity, seconds_to_capacity, time_reach_steps))
    # Like with like: a step's walks are at different moments (its forward's peak and end, its
    # backward's peak); compare those at the moment of the last one.
    window = [w for w in walks if first <= w.step <= last and w.phase == walks[-1].phase] if walks else []
    if len(window) >= 2:
        a, b = window[0].categories, window[-1].categories
        total = trend.slope * (last - first)
        grew = {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if k != "other"}
        named = [f"{k} +{format_bytes(v)}" for k, v in sorted(grew.items(), key=lambda kv: -kv[1])
                 if v > 0.25 * total]
        if named:
            evidence.append(f"between steps {window[0].step} and {window[-1].step}: " + ", ".join(named))
        else:
            evidence.append(f"no category the agent tracks (parameters, gradients, optimizer state, activations) "
                            f"grew between steps {window[0].step} and {window[-1].step}: the growth is in tensors "
                            "held outside the model and optimizer")
    title = f"memory grows {format_bytes(trend.slope)} per step"
    if over:
        title += ": already over capacity"
    elif steps_to_capacity is not None:
        title += f": capacity in ~{steps_to_capacity:.0f} steps"
        if seconds_to_capacity is not None:
            title += f" (~{duration_words(seconds_to_capacity)})"
    remedies = [
        "look for tensors kept across steps: losses or outputs appended to a list or summed without .item() "
        "or .detach(), caches keyed by step, metrics kept as tensors",
        "check for retain_graph=True and for sequence lengths or batch sizes that grow with the step",
    ]
    if run.on_gpu:
        remedies.append("record the allocator's history (ZEROMON_MEMORY_HISTORY=1, or torch.cuda.memory."
                        "_record_memory_history) and compare two snapshots steps apart at pytorch.org/memory_viz")
    else:
        remedies.append("compare what is alive at two steps, e.g. tracemalloc snapshots or gc.get_objects() "
                        "filtered to torch.Tensor")
    return Finding("memory_growth", severity, title, rank=run.rank, step=last, evidence=tuple(evidence),
                   remedies=tuple(remedies),
                   metrics={"growth_bytes_per_step": trend.slope, "tau": trend.tau,
                            **({"steps_to_capacity": steps_to_capacity} if steps_to_capacity is not None else {}),
                            **({"seconds_to_capacity": seconds_to_capacity}
                               if seconds_to_capacity is not None else {})})


def _allocator_findings(run: MemoryContext, samples: list[MemorySample]) -> list[Finding]:
    findings: list[Finding] = []
    retries = [(m.step, m.num_alloc_retries) for m in samples if m.num_alloc_retries is not None]
    if retries and retries[-1][1] > 0:
        last_step, count = retries[-1]
        earlier = [c for s, c in retries if s < last_step - RETRY_RECENT_STEPS + 1]
        before = earlier[-1] if earlier else 0
        growing = count > before
        frag = next((m for m in reversed(samples) if m.fragmentation is not None), None)
        evidence = [f"num_alloc_retries {count}" + (f", {count - before} of them in the last {RETRY_RECENT_STEPS} "
                                                    "steps" if growing else f", none in the last {RETRY_RECENT_STEPS} steps"),
                    "each retry is a cudaMalloc that failed until the allocator freed its cached blocks: the step "
                    "stalls, and the next larger allocation may be an OOM"]
        if frag is not None and frag.fragmentation is not None:
            evidence.append(f"reserved {format_bytes(frag.reserved)}, allocated {format_bytes(frag.allocated)}: "
                            f"{format_bytes(frag.fragmentation)} cached but unused")
        if breakdown := _breakdown(run):  # what the remedies act on (activation checkpointing: the activations)
            evidence.append(breakdown)
        findings.append(Finding(
            "alloc_retries", Severity.CRITICAL if growing else Severity.WARN,
            f"the allocator retried {count} times" + (" and keeps retrying: memory pressure" if growing else ""),
            rank=run.rank, step=last_step, evidence=tuple(evidence),
            remedies=memory_remedies(run, {"fragmentation", "all"}),
            metrics={"num_alloc_retries": float(count), "recent_retries": float(count - before)}))
    reserved = [m for m in samples if m.reserved is not None and m.allocated is not None]
    if reserved and run.capacity:
        top = max(reserved, key=lambda m: m.reserved or 0)
        frag_bytes = top.fragmentation or 0
        if frag_bytes >= FRAGMENTATION_WARN_SHARE * run.capacity:
            pressure = run.share(top.reserved or 0)
            severity = Severity.WARN if pressure is not None and pressure >= WARN_PEAK_SHARE else Severity.INFO
            evidence = [f"at the highest reservation (step {step_number(top.step)}): reserved {format_bytes(top.reserved)}, "
                        f"allocated {format_bytes(top.allocated)}; {format_bytes(frag_bytes)} "
                        f"({_pct(frag_bytes / run.capacity)} of capacity) cached but unused",
                        f"reserved is {_pct(pressure)} of {_capacity_text(run)}"]
            if top.inactive_split:
                evidence.append(f"{format_bytes(top.inactive_split)} in inactive split blocks: free pieces of "
                                "larger blocks that only smaller allocations can use")
            findings.append(Finding("fragmentation", severity,
                                    f"allocator fragmentation: {format_bytes(frag_bytes)} reserved but unused "
                                    f"({_pct(frag_bytes / run.capacity)} of capacity)",
                                    rank=run.rank, step=top.step, evidence=tuple(evidence),
                                    remedies=memory_remedies(run, {"fragmentation"}),
                                    metrics={"fragmentation_bytes": float(frag_bytes)}))
    return findings


def _recorded_ooms(recording: Recording, samples: list[MemorySample]) -> list[Finding]:
    counted = max((m.num_ooms for m in samples if m.num_ooms is not None), default=0)
    events = sorted(recording.ooms, key=lambda e: e.t_ns)
    if not counted and not events:
        return []
    evidence = [f"the allocator counted {counted} OOM{'s' if counted != 1 else ''} (num_ooms)"] if counted else []
    for e in events[:3]:
        evidence.append(f"OOM in step {step_number(e.step)} ({e.phase}) on {e.device}: requested {format_bytes(e.requested)} "
                        f"with {format_bytes(e.allocated)} allocated and {format_bytes(e.free)} free"
                        + (f"; allocator snapshot {e.snapshot_path} (open at pytorch.org/memory_viz)"
                           if e.snapshot_path else ""))
    if len(events) > 3:
        evidence.append(f"... and {len(events) - 3} more")
    info = recording.run_info
    run = MemoryContext(rank=recording.rank, info=info, on_gpu=True, capacity=None, outside=0, walk=None)
    first = events[0] if events else None
    return [Finding("oom_recorded", Severity.CRITICAL,
                    f"out of memory: {max(counted, len(events))} OOM{'s' if max(counted, len(events)) != 1 else ''} "
                    "recorded", rank=recording.rank, step=first.step if first else None, evidence=tuple(evidence),
                    remedies=memory_remedies(run, {"all", "fragmentation"}),
                    metrics={"num_ooms": float(max(counted, len(events)))})]
