"""The Kineto importer under any input (hypothesis): random, garbled, truncated, wrong-typed and
huge-number trace JSON, plain and gzip. `zeromon report --trace` gives a result or one ZeromonError
(exit 2 from the CLI), never another exception or a hang."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zeromon.analysis.trace_overlap import trace_report_from
from zeromon.cli import main
from zeromon.errors import ZeromonError
from zeromon.sources.kineto import load_traces

PROPERTIES = settings(max_examples=int(os.environ.get("ZEROMON_PROPERTY_EXAMPLES", "60")), deadline=None,
                      derandomize=True, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# Numbers as a trace holds them and as none should: huge, negative, fractional, past 64 bits.
_number = st.one_of(st.integers(-5, 5), st.integers(0, 10**6), st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63) - 1,
                                                                                10**400, -1]),
                    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, -1e308, 5e-324]))
_scalar = st.none() | st.booleans() | _number | st.text(max_size=8)
_any = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=3), max_leaves=6)
_name = st.sampled_from(["ProfilerStep#1", "ProfilerStep#2", "ncclKernel_AllGather", "nccl:all_reduce", "aten::mm",
                         "cudaLaunchKernel", "cudaDeviceSynchronize", "gemm", "Memcpy HtoD"]) | st.text(max_size=8)
_cat = st.sampled_from(["kernel", "cpu_op", "cuda_runtime", "user_annotation", "gpu_user_annotation", "Trace",
                        "gpu_memcpy", "ProfilerStep#3"])


def _sometimes(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The plausible value, or any JSON value (a wrong type)."""
    return st.one_of(strategy, strategy, strategy, _any)


_event = st.fixed_dictionaries(
    {"ph": st.just("X"), "name": _sometimes(_name), "cat": _sometimes(_cat), "ts": _sometimes(st.integers(0, 10**4)),
     "dur": _sometimes(st.integers(0, 500))},
    optional={"args": _sometimes(st.fixed_dictionaries({}, optional={
        "stream": _sometimes(st.sampled_from([7, 13, 0, -1])), "correlation": _sometimes(st.integers(-1, 20))})),
        "pid": _scalar, "tid": _scalar})
_trace = st.fixed_dictionaries(
    {"traceEvents": st.lists(_sometimes(_event), max_size=30)},
    optional={"distributedInfo": _sometimes(st.fixed_dictionaries(
        {"rank": _sometimes(st.integers(0, 3)), "world_size": _sometimes(st.integers(1, 4))})),
        "schemaVersion": _scalar})


@st.composite
def trace_bytes(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, content): a trace, maybe cut short or garbled, maybe gzip (itself maybe cut)."""
    document = draw(st.one_of(_trace, _trace, _any))
    text = json.dumps(document).encode()
    damage = draw(st.sampled_from(["none", "none", "cut", "garble", "nan"]))
    if damage == "cut" and text:
        text = text[:draw(st.integers(0, len(text) - 1))]
    elif damage == "garble" and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.binary(min_size=1, max_size=4)) + text[at + 1:]
    elif damage == "nan":
        text = text.replace(b"0", b"NaN", 1)
    if draw(st.booleans()):
        packed = gzip.compress(text)
        if draw(st.booleans()):
            packed = packed[:draw(st.integers(0, len(packed)))]
        return "trace.json.gz", packed
    return "trace.json", text


@PROPERTIES
@given(st.lists(trace_bytes(), min_size=1, max_size=2))
def test_any_trace_gives_a_report_or_a_zeromon_error(tmp_path_factory: pytest.TempPathFactory,
                                                     files: list[tuple[str, bytes]]) -> None:
    folder = tmp_path_factory.mktemp("traces")
    for i, (name, content) in enumerate(files):
        (folder / f"{i}-{name}").write_bytes(content)
    try:
        report = trace_report_from(load_traces(folder))
    except ZeromonError as exc:
        assert "\n" not in exc.message and str(folder) in exc.message  # one line, naming the file or folder
    else:
        json.dumps(report)


@PROPERTIES
@given(trace_bytes())
def test_report_trace_exits_0_or_2_with_one_error_line(tmp_path_factory: pytest.TempPathFactory,
                                                       file: tuple[str, bytes]) -> None:
    folder = tmp_path_factory.mktemp("traces")
    (folder / file[0]).write_bytes(file[1])
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["report", "--trace", str(folder), "--json"])
    assert code in (0, 2)
    if code == 2:
        first, *rest = err.getvalue().splitlines()
        assert first.startswith("zeromon: error: ") and all(line.startswith("hint: ") for line in rest)
    else:
        json.loads(out.getvalue())


def test_a_trace_with_a_kernel_of_every_wrong_type_is_read(tmp_path: Path) -> None:
    """Wrong types in single events are skipped (as HTA's loader coerces or drops them), not fatal."""
    good = {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10, "dur": 5, "args": {"stream": 7, "correlation": 1}}
    events = [good, good | {"ts": "10"}, good | {"dur": [5]}, good | {"args": {"stream": 2**63 - 1}},
              good | {"args": {"stream": 7, "correlation": -(2**62)}}, good | {"args": "x"}, good | {"name": {"a": 1}},
              good | {"ts": 1e308}, good | {"dur": -1e308}, good | {"ts": 2**63 - 1}, 7, None, "event"]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    (trace,) = load_traces(path)
    assert len(trace.stream_events) >= 1
    json.dumps(trace_report_from([trace]))


@pytest.mark.parametrize("number", [2**64, -(2**63) - 1, 10**400])
def test_an_integer_past_64_bits_is_one_error_naming_the_file(tmp_path: Path, number: int) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": number, "dur": 1}]}))
    with pytest.raises(ZeromonError, match=r"trace.json: not valid JSON .*integer overflow"):
        load_traces(path)
