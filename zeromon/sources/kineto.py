"""Reads PyTorch profiler (Kineto) trace files, streamed: ``.json`` and ``.json.gz``.

Only what the overlap analysis needs is kept (``zeromon.analysis.trace_overlap.RankTrace``): the
events on a GPU stream (``args.stream``) as columns, the CPU-side events that launched them (by
``args.correlation``), the ``ProfilerStep#N`` annotations and the rank from ``distributedInfo``.
The JSON is parsed by ijson's C backend (yajl) in 1 MiB chunks: memory is the kept columns plus
one chunk of events, not a DataFrame of every event (HTA's loader builds one). What an import costs
is a benchmark's (tests/bench/bench_trace_import.py).
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import zlib
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from zeromon.analysis.trace_overlap import (
    DEVICE_SYNC_NAMES,
    STEP_MARKER,
    Launch,
    RankTrace,
    StepAnnotation,
    StreamEvents,
    trace_report_from,
)
from zeromon.errors import ZeromonError

CHUNK_BYTES = 1 << 20
# Times beyond this many microseconds (~285 years, where a float64 stops holding every integer) are no
# event's: such an event is skipped, as one without a number for its time is, before its nanoseconds
# overflow the analysis.
MAX_TIME_US = 2**53
TRACE_SUFFIXES = (".json", ".gz")  # what HTA picks up in a trace folder
_HINT = ("write traces with torch.profiler: on_trace_ready=tensorboard_trace_handler(dir), "
         "or prof.export_chrome_trace(path)")


def _as_int(value: Any, default: int = -1) -> int:
    """HTA's ``int(stream)``: numbers and numeric strings convert, anything else is ``default``."""
    if value is None or isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class _Collector:
    """Keeps, event by event, what RankTrace holds."""

    def __init__(self) -> None:
        self.name_ids: dict[str, int] = {}
        self.names: list[str] = []
        self.cols = StreamEvents(array("q"), array("q"), array("q"), array("d"), array("d"), array("q"))
        self.launches: dict[int, Launch] = {}
        self.first_uncorrelated: float | None = None
        self.steps: list[StepAnnotation] = []
        self.step_symbols: set[str] = set()
        self.fractional_ts = False
        self.count = 0

    def add(self, events: Iterable[Any]) -> None:
        # The hot loop of the import, run for every event: locals, and calls only off the common path.
        cols = self.cols
        launches = self.launches
        first_uncorrelated = self.first_uncorrelated
        fractional_ts = self.fractional_ts
        position = self.count - 1
        for event in events:
            position += 1
            if type(event) is not dict:
                continue
            ts = event.get("ts")
            if type(ts) is not int:  # a float ts (or none) makes HTA's ts column float: it rounds
                fractional_ts = True
                if type(ts) is not float:
                    continue
            dur = event.get("dur")
            cat = event.get("cat")
            if dur is None or cat is None or cat == "Trace" or type(dur) not in (int, float) \
                    or not -MAX_TIME_US <= ts <= MAX_TIME_US or not -MAX_TIME_US <= dur <= MAX_TIME_US:
                continue
            args = event.get("args")
            if type(args) is dict:
                stream = args.get("stream", -1)
                corr = args.get("correlation", -1)
                if type(stream) is not int:
                    stream = _as_int(stream)
                if type(corr) is not int:
                    corr = _as_int(corr)
            else:
                stream = corr = -1
            name = event.get("name")
            if type(name) is not str:
                name = str(name)
            if STEP_MARKER in name:
                self.steps.append(StepAnnotation(name, ts, dur, stream, corr, position))
                self.step_symbols.add(name)
            if type(cat) is str and STEP_MARKER in cat:
                self.step_symbols.add(cat)
            if stream != -1:
                name_id = self.name_ids.get(name)
                if name_id is None:
                    name_id = self.name_ids[name] = len(self.names)
                    self.names.append(name)
                cols.name_ids.append(name_id)
                cols.streams.append(stream)
                cols.correlations.append(corr)
                cols.ts_us.append(ts)
                cols.dur_us.append(dur)
                cols.positions.append(position)
            if (stream >= 0 and corr >= 0) or name in DEVICE_SYNC_NAMES:
                continue  # runs on the GPU (trace_overlap.runs_on_gpu)
            if corr != -1:
                known = launches.get(corr)
                first = ts if known is None or ts < known.first_ts_us else known.first_ts_us
                launches[corr] = Launch(first, ts, position)
            elif first_uncorrelated is None or ts < first_uncorrelated:
                first_uncorrelated = ts
        self.count = position + 1
        self.first_uncorrelated = first_uncorrelated
        self.fractional_ts = fractional_ts


class _Reader:
    """The file's decompressed bytes for ijson, counting them (for error positions) and naming the
    file when the gzip stream is damaged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        opener: Any = gzip.open if path.name.endswith(".gz") else open
        try:
            self.fh: IO[bytes] = opener(path, "rb")
        except OSError as exc:
            raise ZeromonError(f"{path}: cannot read: {exc.strerror or exc}") from exc

    def read(self, size: int = -1) -> bytes:
        try:
            data = self.fh.read(size)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise ZeromonError(f"{self.path}: damaged gzip data after {self.offset} decompressed bytes "
                               f"({exc})",
                               hint="the file is truncated or not gzip; copy it again") from exc
        except OSError as exc:
            raise ZeromonError(f"{self.path}: cannot read: {exc.strerror or exc}") from exc
        self.offset += len(data)
        return data

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()


def _distributed_info(path: Path) -> dict[str, Any]:
    """``distributedInfo``: from the header (Kineto writes it before traceEvents), else a second pass
    over the file (in C, cheap beside the import; single-GPU traces, which have none, pay it)."""
    import ijson

    info: dict[str, Any] = {}
    with _Reader(path) as reader:
        for prefix, event, value in ijson.parse(reader, use_float=True):
            if prefix == "" and event == "map_key" and value == "traceEvents":
                break
            if prefix.startswith("distributedInfo.") and event in ("number", "string"):
                info[prefix.partition(".")[2]] = value
        else:
            return info
    if info:
        return info
    with _Reader(path) as reader:  # rare: distributedInfo after traceEvents
        for found in ijson.items(reader, "distributedInfo", use_float=True):
            return found if isinstance(found, dict) else {}
    return {}


def read_trace(path: Path | str) -> RankTrace:
    """One trace file, streamed. Raises ZeromonError for unreadable, damaged or non-Kineto files."""
    import ijson

    path = Path(path)
    collector = _Collector()
    reader = _Reader(path)
    try:
        with reader:
            events = ijson.items(reader, "traceEvents.item", use_float=True, buf_size=CHUNK_BYTES)
            while batch := list(itertools.islice(events, 1024)):
                collector.add(batch)
        info = _distributed_info(path) if collector.count else {}
    except ijson.IncompleteJSONError as exc:
        if "premature EOF" in str(exc):
            raise ZeromonError(
                f"{path}: the JSON ends early, after {reader.offset} bytes: the file is truncated",
                hint="profiler traces are complete once the profiler stops; copy it again") from exc
        raise _bad_json(path, reader.offset, exc) from exc
    except ijson.JSONError as exc:
        raise _bad_json(path, reader.offset, exc) from exc
    except UnicodeDecodeError as exc:  # yajl passes on bytes that are not UTF-8 (or escapes of halves of a pair)
        raise ZeromonError(f"{path}: not UTF-8 text in bytes {max(0, reader.offset - CHUNK_BYTES)}..{reader.offset}"
                           f": {exc.reason}", hint=_HINT) from exc

    if collector.count == 0:
        raise ZeromonError(
            f"{path}: no traceEvents (or an empty list): not a PyTorch profiler (Kineto) trace", hint=_HINT)
    if not len(collector.cols):
        raise ZeromonError(
            f"{path}: no GPU kernels (no event has args.stream) among {collector.count} events",
            hint="profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]; a CPU-only "
                 "trace has no kernels to overlap")
    return RankTrace(path=str(path), rank=_as_int(info.get("rank"), default=-1),
                     world_size=_as_int(info.get("world_size"), default=0) or None,
                     names=tuple(collector.names), stream_events=collector.cols, launches=collector.launches,
                     first_uncorrelated_cpu_ts_us=collector.first_uncorrelated, steps=tuple(collector.steps),
                     step_symbols=frozenset(collector.step_symbols), fractional_ts=collector.fractional_ts,
                     event_count=collector.count)


def _bad_json(path: Path, offset: int, exc: Exception) -> ZeromonError:
    """ijson does not say the byte; yajl parses what was read last, so it lies in that chunk."""
    first = max(0, offset - CHUNK_BYTES)
    where = f"in bytes {first}..{offset}" + (" of the decompressed data" if path.name.endswith(".gz") else "")
    detail = " ".join(str(exc).split())[:200]
    return ZeromonError(f"{path}: not valid JSON {where}: {detail}", hint=_HINT)


def trace_files(path: Path | str | Iterable[Path | str]) -> list[Path]:
    """The trace files of a folder (its ``*.json`` and ``*.gz``, as HTA picks them), a file, or a list."""
    if isinstance(path, (str, Path)):
        path = Path(path)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
            if not files:
                raise ZeromonError(f"{path}: no trace files (*.json, *.json.gz) in this folder", hint=_HINT)
            return files
        if not path.exists():
            raise ZeromonError(f"{path}: no such file or folder")
        return [path]
    return [Path(p) for p in path]


def load_traces(path: Path | str | Iterable[Path | str]) -> list[RankTrace]:
    """Every trace of a folder (or the given files), one per rank, in rank order.

    The rank is ``distributedInfo.rank``. A single file without one is rank 0 (as in HTA); several
    without one, or two files of one rank, are an error naming the files.
    """
    traces = [read_trace(p) for p in trace_files(path)]
    if len(traces) == 1 and traces[0].rank < 0:
        traces = [dataclasses.replace(traces[0], rank=0)]
    by_rank: dict[int, RankTrace] = {}
    for trace in traces:
        if trace.rank < 0:
            raise ZeromonError(
                f"{trace.path}: no distributedInfo.rank, so its rank among {len(traces)} traces is unknown",
                hint='analyse it alone, or add "distributedInfo": {"rank": N} to it')
        if trace.rank in by_rank:
            raise ZeromonError(f"{by_rank[trace.rank].path} and {trace.path} are both rank {trace.rank}",
                               hint="keep one trace per rank in the folder (several profiling runs?)")
        by_rank[trace.rank] = trace
    return [by_rank[r] for r in sorted(by_rank)]


def trace_report(path: Path | str | Iterable[Path | str]) -> dict[str, Any]:
    """``zeromon report --trace``'s JSON object for a folder or files of traces."""
    return trace_report_from(load_traces(path))
