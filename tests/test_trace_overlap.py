"""Kineto trace import and HTA-defined overlap / temporal breakdown, with HTA itself as the oracle.

Holistic Trace Analysis runs once per session in a subprocess (its logging and multiprocessing stay
out of pytest) on the real multi-GPU traces in tests/data/kineto (copied from ../shared/traces) and on synthetic traces built to
hit its edge rules (microsecond rounding of sub-microsecond kernels, the dropped last step, kernels
launched before the first step, GPU annotations on a stream, one rank with a single step).
"""

from __future__ import annotations

import gzip
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zeromon.analysis.trace_overlap import (
    COMMUNICATION,
    COMPUTATION,
    MEMORY,
    OTHER,
    kernel_kind,
    kernel_overlap,
    trace_report_from,
)
from zeromon.commands import COMMAND_MODULES
from zeromon.errors import ZeromonError
from zeromon.sources.kineto import load_traces, read_trace, trace_report

from conftest import REPO, zeromon

TRACES = REPO / "tests" / "data" / "kineto"
REAL_GROUPS = {  # one HTA TraceAnalysis (one folder) each
    "a100-w2": ["a100-w2-rank0.json.gz"],
    "w128": ["w128-sampled-rank0.json.gz", "w128-sampled-rank1.json.gz"],
}
needs_traces = pytest.mark.skipif(not TRACES.is_dir(), reason=f"real traces not found in {TRACES}")

_HTA_ORACLE = r"""
import json, sys, time
from types import SimpleNamespace
from hta.trace_analysis import TraceAnalysis
from hta.analyzers.breakdown_analysis import BreakdownAnalysis
from hta.analyzers.communication_analysis import CommunicationAnalysis

def by_rank(df):
    return {int(r.pop("rank")): {k: (None if v != v else float(v)) for k, v in r.items()}
            for r in df.to_dict("records")}

out = {}
for folder in sys.argv[1:]:
    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=folder)
    load_s = time.perf_counter() - t0
    res = {"load_s": load_s, "overlap": by_rank(ta.get_comm_comp_overlap(visualize=False)),
           "breakdown": by_rank(ta.get_temporal_breakdown(visualize=False)), "iterations": {}}
    # Per iteration: HTA's own functions over the events of one value of its `iteration` column.
    for rank, df in ta.t.traces.items():
        per = {}
        for it in sorted(int(i) for i in df["iteration"].dropna().unique() if i >= 0):
            sub = df[df["iteration"] == it]
            if not (sub["stream"] != -1).any():
                continue
            t = SimpleNamespace(traces={rank: sub}, symbol_table=ta.t.symbol_table)
            per[it] = {"overlap": by_rank(CommunicationAnalysis.get_comm_comp_overlap(t, visualize=False))[rank],
                       "breakdown": by_rank(BreakdownAnalysis.get_temporal_breakdown(t, visualize=False))[rank]}
        res["iterations"][int(rank)] = per
    out[folder] = res
json.dump(out, sys.stdout)
"""

# --- synthetic traces that exercise HTA's edge rules ----------------------------------------------

_COMPUTE = ["void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>(int)",
            "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32",
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float>()"]
_COMM = ["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
         "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"]


def synthetic_trace(seed: int, rank: int, steps: int = 3, fractional: bool = True) -> dict[str, Any]:
    """A Kineto-shaped trace: steps of CPU launches, kernels on a compute and a communication stream."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    now = 1_700_000_000_000 + rng.randint(0, 1000) + (0.137 if fractional else 0)
    cursors = {7: now, 20: now}
    corr = 1000

    def t(x: float) -> float | int:
        return round(x, 3) if fractional else int(round(x))

    def launch(name: str, cat: str, stream: int) -> None:
        nonlocal now, corr
        corr += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                       "ts": t(now), "dur": t(rng.uniform(2, 6)), "args": {"correlation": corr, "cbid": 211}})
        kind = rng.random()
        # a quarter shorter than a microsecond: HTA's rounding may turn them inside out
        dur = rng.uniform(0.1, 0.95) if kind < 0.25 else rng.uniform(1, 40) if kind < 0.8 else rng.uniform(40, 400)
        start = max(cursors[stream], now + rng.uniform(3, 60))
        # Kineto writes ns-resolution floats; in the integer variant durations keep their fractions.
        events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": t(start),
                       "dur": round(dur, 3), "args": {"device": 0, "stream": stream, "correlation": corr}})
        cursors[stream] = start + dur + rng.uniform(0, 30)
        now += rng.uniform(2, 25)

    def some_kernels(n: int) -> None:
        for _ in range(n):
            r = rng.random()
            if r < 0.55:
                launch(rng.choice(_COMPUTE), "kernel", 7)
            elif r < 0.85:
                launch(rng.choice(_COMM), "kernel", 20)
            elif r < 0.93:
                launch("Memcpy DtoD (Device -> Device)", "gpu_memcpy", rng.choice([7, 20]))
            elif r < 0.97:
                launch("Memset (Device)", "gpu_memset", 7)
            else:
                launch("Stream Sync", "cuda_sync", 7)

    events.append({"name": "process_name", "ph": "M", "ts": t(now), "pid": 1, "tid": 0,
                   "args": {"name": "python"}})
    some_kernels(3)  # launched before the first profiled step: iteration -1, still in HTA's totals
    annotation_ts = now + 30
    for s in range(steps):
        start = now
        some_kernels(rng.randint(15, 40))
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{10 + s}", "pid": 1, "tid": 1,
                       "ts": t(start), "dur": t(now - start + 1), "args": {}})
        now += 5
    # A GPU-side annotation on a stream without a correlation id: HTA counts it (as computation).
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "## forward ##", "pid": 0, "tid": 7,
                   "ts": t(annotation_ts), "dur": t(50), "args": {"stream": 7}})
    events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
                   "ts": t(1_700_000_000_000), "dur": t(now), "args": {}})
    _avoid_ambiguous_ties(events)
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
            "traceEvents": events}


def _avoid_ambiguous_ties(events: list[dict[str, Any]]) -> None:
    """Drop sub-microsecond kernels that round to a negative interval starting where another event
    does: HTA's unstable sort orders those arbitrarily (trace_overlap's docstring, rule 5)."""
    on_stream = [e for e in events if e.get("args", {}).get("stream", -1) != -1]
    starts: dict[int, int] = {}
    for e in on_stream:
        starts[math.ceil(e["ts"])] = starts.get(math.ceil(e["ts"]), 0) + 1
    for e in on_stream:
        if math.floor(e["ts"] + e["dur"]) < math.ceil(e["ts"]) and starts[math.ceil(e["ts"])] > 1:
            events.remove(e)


SYNTHETIC_GROUPS: dict[str, list[dict[str, Any]]] = {
    "two-ranks-ns": [synthetic_trace(1, 0), synthetic_trace(2, 1)],
    "integer-us": [synthetic_trace(3, 0, fractional=False)],
    "rank1-one-step": [synthetic_trace(4, 0), synthetic_trace(5, 1, steps=1)],
    "four-steps-ns": [synthetic_trace(6, 0, steps=4), synthetic_trace(7, 1, steps=4)],
}


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """HTA's results per folder of traces, computed once (about 5 s)."""
    pytest.importorskip("hta", reason="HolisticTraceAnalysis (the test extra) is the oracle")
    root = tmp_path_factory.mktemp("hta")
    folders: dict[str, Path] = {}
    if TRACES.is_dir():
        for group, files in REAL_GROUPS.items():
            folders[group] = root / group
            folders[group].mkdir()
            for name in files:
                shutil.copy(TRACES / name, folders[group] / name)
    for group, traces in SYNTHETIC_GROUPS.items():
        folders[group] = root / group
        folders[group].mkdir()
        for trace in traces:
            rank = trace["distributedInfo"]["rank"]
            with gzip.open(folders[group] / f"rank{rank}.pt.trace.json.gz", "wt") as f:
                json.dump(trace, f)
    out = subprocess.run([sys.executable, "-c", _HTA_ORACLE, *map(str, folders.values())],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    return {group: (folder, results[str(folder)]) for group, folder in folders.items()}


def _assert_same(ours: dict[str, Any], overlap: dict[str, Any], breakdown: dict[str, Any], where: str) -> None:
    hta_pct = overlap["comp_comm_overlap_pctg"]
    if hta_pct is None:
        assert ours["comm_comp_overlap_pct"] is None, where
    else:
        assert ours["comm_comp_overlap_pct"] == pytest.approx(hta_pct, abs=0.011), where
    tb = ours["temporal_breakdown"]
    for field in ("idle_time", "compute_time", "non_compute_time", "kernel_time"):
        # zeromon's JSON is in seconds, HTA's columns in microseconds.
        assert tb[f"{field}_s"] * 1e6 == pytest.approx(breakdown[f"{field}(us)"], abs=0.01), (where, field)
    for field in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
        assert tb[field] == pytest.approx(breakdown[field], abs=0.011), (where, field)


def _check_group(oracle: dict[str, tuple[Path, dict[str, Any]]], group: str) -> dict[str, Any]:
    folder, hta = oracle[group]
    report = trace_report(folder)
    assert sorted(r["rank"] for r in report["ranks"]) == sorted(int(k) for k in hta["overlap"])
    for r in report["ranks"]:
        rank = str(r["rank"])
        _assert_same(r, hta["overlap"][rank], hta["breakdown"][rank], f"{group} rank {rank}")
        hta_iterations = hta["iterations"][rank]
        assert [it["iteration"] for it in r["iterations"]] == sorted(int(i) for i in hta_iterations), group
        for it in r["iterations"]:
            expected = hta_iterations[str(it["iteration"])]
            _assert_same(it, expected["overlap"], expected["breakdown"],
                         f"{group} rank {rank} iteration {it['iteration']}")
    return report


@needs_traces
@pytest.mark.parametrize("group", list(REAL_GROUPS))
def test_real_gpu_traces_match_hta(oracle: dict[str, tuple[Path, dict[str, Any]]], group: str) -> None:
    report = _check_group(oracle, group)
    for r in report["ranks"]:
        # Real NCCL runs: some communication, partly hidden; the last profiled step is left out.
        assert 0 < r["comm_comp_overlap_pct"] < 100
        assert 0 < r["exposed_comm_s"] < r["comm_s"]
        assert r["dropped_step"] is not None and r["iterations"]


@needs_traces
def test_real_trace_known_values(oracle: dict[str, tuple[Path, dict[str, Any]]]) -> None:
    """The numbers themselves (HTA 0.5 prints them for a100-w2-rank0), so a change on both sides shows."""
    folder, _ = oracle["a100-w2"]
    (rank0,) = trace_report(folder)["ranks"]
    assert rank0["comm_comp_overlap_pct"] == 14.31
    assert rank0["temporal_breakdown"] == {  # HTA's microseconds, in seconds
        "idle_time_s": 0.338781, "compute_time_s": 0.075169, "non_compute_time_s": 0.021636,
        "kernel_time_s": 0.435586, "idle_time_pctg": 77.78, "compute_time_pctg": 17.26,
        "non_compute_time_pctg": 4.97}
    # Two iterations: the typical one's exposed communication, beside the whole trace's.
    exposed = sorted(it["exposed_comm_s"] for it in rank0["iterations"])
    assert rank0["median_iteration_exposed_comm_s"] == pytest.approx(sum(exposed) / 2)
    assert rank0["median_iteration_exposed_comm_s"] < rank0["exposed_comm_s"]
    assert [it["iteration"] for it in rank0["iterations"]] == [4, 5] and rank0["dropped_step"] == "ProfilerStep#6"


@pytest.mark.parametrize("group", list(SYNTHETIC_GROUPS))
def test_synthetic_edge_cases_match_hta(oracle: dict[str, tuple[Path, dict[str, Any]]], group: str) -> None:
    report = _check_group(oracle, group)
    if group == "rank1-one-step":
        # Two step names across the ranks: rank 1's only step is its last and goes; what it
        # launched before that step stays.
        rank1 = report["ranks"][1]
        assert rank1["iterations"] == [] and rank1["dropped_step"] == "ProfilerStep#10"
        assert 0 < rank1["gpu_events"] <= 3


def test_rounding_makes_negative_groups_as_hta_does() -> None:
    # [0, 10) communication, [5, 20) computation, and a sub-microsecond communication kernel that
    # HTA's inward rounding turned into [30, 29): a group of length -1 us in the communication total.
    us = 1000
    intervals = [(0, 10 * us), (5 * us, 20 * us), (30 * us, 29 * us)]
    result = kernel_overlap(intervals, [COMMUNICATION, COMPUTATION, COMMUNICATION])
    assert result.comm_ns == 9 * us and result.overlap_ns == 5 * us
    assert result.comm_comp_overlap_pct == round(100 * 5 / 9, 2)
    tb = result.breakdown
    assert tb.kernel_time_ns == 29 * us  # the last group's end (29) minus the first start (0)
    assert tb.idle_time_ns == 29 * us - (20 * us - 1 * us) and tb.compute_time_ns == 15 * us
    assert tb.non_compute_time_ns == tb.kernel_time_ns - tb.compute_time_ns - tb.idle_time_ns
    no_comm = kernel_overlap([(0, 5 * us)], [COMPUTATION])
    assert no_comm.comm_comp_overlap_pct is None and no_comm.exposed_comm_ns == 0  # HTA: NaN


def test_kernel_kinds_follow_hta_names() -> None:
    assert kernel_kind("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)") == COMMUNICATION
    assert kernel_kind("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*)") == COMMUNICATION
    assert kernel_kind("Memcpy HtoD (Pageable -> Device)") == MEMORY
    assert kernel_kind("Memset (Device)") == MEMORY
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4>()") == COMPUTATION
    assert kernel_kind("Stream Sync") == OTHER
    assert kernel_kind("void cub::DeviceMemcpyKernel()") == OTHER  # "Memcpy" anywhere is not computation
    assert kernel_kind("nccl:all_reduce") == COMPUTATION  # a name, not a kernel: HTA counts it as compute


# --- import ---------------------------------------------------------------------------------------


def _write(path: Path, trace: dict[str, Any]) -> Path:
    """The trace as a file, gzipped when the name ends in .gz."""
    data = json.dumps(trace).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def test_json_and_gzip_import_the_same(tmp_path: Path) -> None:
    trace = synthetic_trace(11, 0)
    plain = read_trace(_write(tmp_path / "t.json", trace))
    packed = read_trace(_write(tmp_path / "t.json.gz", trace))
    assert plain.rank == packed.rank == 0 and plain.world_size == 2
    assert plain.event_count == packed.event_count == len(trace["traceEvents"])
    assert plain.stream_events.ts_us == packed.stream_events.ts_us
    assert plain.launches == packed.launches and plain.steps == packed.steps and plain.fractional_ts
    report_plain = trace_report_from([plain])["ranks"]
    report_packed = trace_report_from([packed])["ranks"]
    for r in report_plain + report_packed:
        r.pop("file")
    assert report_plain == report_packed


@needs_traces
def test_real_trace_json_equals_gzip(tmp_path: Path) -> None:
    source = TRACES / "w128-sampled-rank1.json.gz"
    plain = tmp_path / "w128-sampled-rank1.json"
    plain.write_bytes(gzip.decompress(source.read_bytes()))
    a, b = read_trace(source), read_trace(plain)
    assert (a.rank, a.world_size, a.event_count) == (b.rank, b.world_size, b.event_count) == (1, 128, 4720)
    assert a.stream_events.ts_us == b.stream_events.ts_us and len(a.stream_events) == 1154
    assert not a.fractional_ts  # integer-microsecond trace: HTA does not round it


def test_truncated_gzip_names_the_file(tmp_path: Path) -> None:
    good = gzip.compress(json.dumps(synthetic_trace(12, 0)).encode())
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(good[: len(good) // 2])
    with pytest.raises(ZeromonError, match=r"rank0\.json\.gz: damaged gzip data after \d+ decompressed bytes"):
        read_trace(bad)


def test_truncated_json_names_the_file_and_length(tmp_path: Path) -> None:
    data = json.dumps(synthetic_trace(13, 0)).encode()
    bad = tmp_path / "rank0.json"
    bad.write_bytes(data[: len(data) - 100])
    with pytest.raises(ZeromonError, match=rf"rank0\.json: the JSON ends early, after {len(data) - 100} bytes"):
        read_trace(bad)


def test_corrupt_json_names_the_file_and_position(tmp_path: Path) -> None:
    data = bytearray(json.dumps(synthetic_trace(14, 0)).encode())
    where = data.index(b'"dur": ', len(data) // 2)
    data[where + 5] = ord("}")  # '"dur"} 3.2': a key without its colon
    bad = tmp_path / "rank0.json.gz"
    bad.write_bytes(gzip.compress(bytes(data)))
    with pytest.raises(ZeromonError) as err:
        read_trace(bad)
    assert "rank0.json.gz: not valid JSON in bytes 0.." in err.value.message
    assert "of the decompressed data" in err.value.message and "(right here)" in err.value.message
    assert "separated by a colon" in err.value.message


def test_not_gzip_and_not_kineto(tmp_path: Path) -> None:
    fake = tmp_path / "x.json.gz"
    fake.write_bytes(b"this is not gzip")
    with pytest.raises(ZeromonError, match="x.json.gz: damaged gzip data"):
        read_trace(fake)
    with pytest.raises(ZeromonError, match=r"no traceEvents \(or an empty list\): not a PyTorch profiler"):
        read_trace(_write(tmp_path / "y.json", {"schemaVersion": 1, "events": []}))


def test_trace_without_gpu_kernels_says_so(tmp_path: Path) -> None:
    cpu_only = {"distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "args": {}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 9, "dur": 7}]}
    with pytest.raises(ZeromonError) as err:
        read_trace(_write(tmp_path / "cpu.json", cpu_only))
    assert "cpu.json: no GPU kernels" in err.value.message and "ProfilerActivity.CUDA" in (err.value.hint or "")


def test_folder_rules(tmp_path: Path) -> None:
    with pytest.raises(ZeromonError, match="no trace files"):
        load_traces(tmp_path)
    with pytest.raises(ZeromonError, match="no such file or folder"):
        load_traces(tmp_path / "missing")
    _write(tmp_path / "a.json.gz", synthetic_trace(15, 3))
    _write(tmp_path / "b.json", synthetic_trace(16, 3))
    with pytest.raises(ZeromonError, match=r"a\.json\.gz and .*b\.json are both rank 3"):
        load_traces(tmp_path)
    (tmp_path / "b.json").unlink()
    (tmp_path / "notes.txt").write_text("not a trace")  # ignored, as HTA ignores it
    (only,) = load_traces(tmp_path)
    assert only.rank == 3
    no_rank = synthetic_trace(17, 0)
    del no_rank["distributedInfo"]
    (tmp_path / "alone").mkdir()
    alone = _write(tmp_path / "alone" / "t.json", no_rank)
    assert load_traces(alone)[0].rank == 0  # one file without a rank is rank 0, as in HTA
    with pytest.raises(ZeromonError, match="no distributedInfo.rank"):
        load_traces([alone, tmp_path / "a.json.gz"])


# --- the report -----------------------------------------------------------------------------------


def test_report_json_shape(tmp_path: Path) -> None:
    for rank in (0, 1):
        _write(tmp_path / f"rank{rank}.json.gz", synthetic_trace(20 + rank, rank))
    report = trace_report(tmp_path)
    assert json.loads(json.dumps(report)) == report  # plain JSON types only
    assert report["source"] == "kineto"
    assert report["files"] == [str(tmp_path / "rank0.json.gz"), str(tmp_path / "rank1.json.gz")]
    breakdown_keys = {"idle_time_s", "compute_time_s", "non_compute_time_s", "kernel_time_s",
                      "idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"}
    for rank, r in enumerate(report["ranks"]):
        assert r["rank"] == rank and r["world_size"] == 2 and r["dropped_step"] == "ProfilerStep#12"
        assert {"comm_comp_overlap_pct", "exposed_comm_s", "comm_s", "comp_s", "overlap_s",
                "exposed_comm_share", "temporal_breakdown", "iterations"} <= set(r)
        assert set(r["temporal_breakdown"]) == breakdown_keys
        assert r["exposed_comm_s"] == pytest.approx(r["comm_s"] - r["overlap_s"])
        assert r["temporal_breakdown"]["kernel_time_s"] == pytest.approx(r["kernel_time_s"])
        assert [it["iteration"] for it in r["iterations"]] == [10, 11]
        assert r["median_iteration_exposed_comm_s"] == pytest.approx(
            (r["iterations"][0]["exposed_comm_s"] + r["iterations"][1]["exposed_comm_s"]) / 2)
        for it in r["iterations"]:
            assert {"iteration", "comm_comp_overlap_pct", "exposed_comm_s", "comm_s", "comp_s"} <= set(it)
            assert set(it["temporal_breakdown"]) == breakdown_keys
            assert 0 <= it["exposed_comm_s"] <= it["comm_s"]
        # The iterations are parts of the rank's trace.
        assert sum(it["comm_s"] for it in r["iterations"]) <= r["comm_s"] + 1e-9


@pytest.mark.skipif("zeromon.commands.report" not in COMMAND_MODULES, reason="zeromon report is not registered")
def test_report_command_with_traces(tmp_path: Path) -> None:
    _write(tmp_path / "rank0.json.gz", synthetic_trace(30, 0))
    out = zeromon("report", "--trace", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ranks"][0] == trace_report(tmp_path)["ranks"][0]
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1,')
    out = zeromon("report", "--trace", str(tmp_path), "--json")
    assert out.returncode == 2 and out.stdout == ""
    assert "rank1.json: the JSON ends early" in out.stderr and "Traceback" not in out.stderr
