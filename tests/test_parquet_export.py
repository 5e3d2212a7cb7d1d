"""`zeromon export --format parquet`: every record of a run as Parquet, read back by DuckDB and Polars.

On the session's real 2-rank FSDP2 recording (conftest's ``fsdp2_run``): every record of every rank comes back
from the datasets as it was recorded, in order; docs/parquet.md's schema tables are the exporter's schema; and
the page's queries, extracted from it and run as written (DuckDB's SQL, then Polars), give `zeromon report
--json`'s figures: counts, sizes and peaks exactly, medians to 1e-12 of the value (an average of the two
middle values, rounded by each engine), sums of waits to 1e-9 (added in another order). On a generated run
with a torn last line, a killed rank and an earlier attempt of an elastic restart, each kept as zeromon's
writers leave them (real runs of each: tests/test_faults.py, tests/test_rank_ends.py): every record the
readers read, in each attempt.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zeromon.cli import main
from zeromon.exporters import parquet as parquet_export
from zeromon.exporters.parquet_schema import (
    FILES,
    FLOAT_MAP,
    FORMAT_NAME,
    FORMAT_VERSION,
    INT_MAP,
    JSON,
    METADATA_KEY,
    PARTITION,
    RECORD,
    datasets,
)
from zeromon.model.codec import KIND_OF, TYPE_OF, RecordingWriter, encode_record, iter_records, read_recording
from zeromon.model.events import (
    AgentStats,
    CollectiveEvent,
    MemorySample,
    Notice,
    PhaseSpan,
    Record,
    RunEnd,
    RunInfo,
    StepSummary,
)
from zeromon.model.segments import CompactWriter

from conftest import REPO, zeromon

_MISSING = "{} is not installed (the test extra installs it: pip install -e '.[test]')"
pa = pytest.importorskip("pyarrow", reason=_MISSING.format("pyarrow"))
pq = pytest.importorskip("pyarrow.parquet")
duckdb = pytest.importorskip("duckdb", reason=_MISSING.format("duckdb"))
pl = pytest.importorskip("polars", reason=_MISSING.format("polars"))

DOC = REPO / "docs" / "parquet.md"
MEDIAN_REL = 1e-12
SUM_REL = 1e-9
DATASET_OF = {d.kind: d for d in datasets()}


@pytest.fixture(scope="module")
def exported(fsdp2_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parquet") / "run-parquet"
    result = zeromon("export", str(fsdp2_run), "--format", "parquet", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"zeromon: 2 rank files exported to {out} as Parquet (collectives ")
    return out


@pytest.fixture(scope="module")
def report(fsdp2_run: Path) -> dict[str, Any]:
    result = zeromon("report", str(fsdp2_run), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


def _records(root: Path, rank: int) -> list[Record]:
    """Every row of the rank's partition of every dataset, made a record again, in the order of ``record``."""
    numbered: list[tuple[int, Record]] = []
    for kind, cls in TYPE_OF.items():
        data = DATASET_OF[kind]
        path = root / data.name / f"{PARTITION}={rank}" / "part-0.parquet"
        if not path.exists():
            continue
        decode = {c.name: _decoder(c.type) for c in data.columns}
        for row in pq.read_table(path).to_pylist():
            values = {name: decode[name](value) for name, value in row.items()}
            numbered.append((values.pop(RECORD), cls(rank=rank, **values)))
    return [record for _, record in sorted(numbered, key=lambda pair: pair[0])]


def _decoder(word: str) -> Callable[[Any], Any]:
    if word in (FLOAT_MAP, INT_MAP):
        return dict  # Arrow's map reads back as (key, value) pairs, in the order written
    return json.loads if word == JSON else (lambda value: value)


def _files_row(root: Path, rank: int) -> dict[str, Any]:
    rows = pq.read_table(root / FILES / f"{PARTITION}={rank}" / "part-0.parquet").to_pylist()
    assert len(rows) == 1
    return dict(rows[0])


@pytest.mark.distributed
def test_every_record_of_a_real_run_comes_back_from_the_datasets_in_order(fsdp2_run: Path, exported: Path) -> None:
    for rank in (0, 1):
        source = fsdp2_run / f"rank-{rank}.jsonl"
        records = list(iter_records(source))
        assert {type(r) for r in records} >= {CollectiveEvent, PhaseSpan, MemorySample, StepSummary, RunInfo, RunEnd}
        assert _records(exported, rank) == records
        files = _files_row(exported, rank)
        assert files["records"] == len(records) and files["skipped"] == [] and files["form"] == "jsonl"
        assert files["source"] == str(source) and files["end_record"] is True and files["attempt"] == 0
        assert json.loads(files["header"])["run_id"] == files["run_id"]


@pytest.mark.distributed
def test_each_file_holds_its_schema_and_version_and_the_docs_tables_are_that_schema(exported: Path) -> None:
    for data in datasets():
        path = exported / data.name / f"{PARTITION}=0" / "part-0.parquet"
        written = pq.read_schema(path)
        said = json.loads(written.metadata[METADATA_KEY.encode()])
        assert (said["format"], said["version"], said["dataset"], said["rank"]) == (FORMAT_NAME, FORMAT_VERSION,
                                                                                   data.name, 0)
        assert said["columns"] == {c.name: {"type": c.type, "unit": c.unit} for c in data.columns}
        assert written.names == list(data.column_names())  # rank is the partition, not a column
        for column in data.columns:
            field = written.field(column.name)
            assert field.nullable == column.nullable
            assert (field.metadata or {}).get(b"unit", b"").decode() == column.unit
            assert pa.types.is_dictionary(field.type) == (column.type == "string (dictionary)")
    assert _doc_tables() == {d.name: [(c.name, c.type, c.unit, "yes" if c.nullable else "no") for c in d.columns]
                             for d in datasets()}
    assert pq.read_table(exported / "ooms").num_rows == 0  # on CPU: one file of no rows, readable


def _doc_tables() -> dict[str, list[tuple[str, str, str, str]]]:
    """docs/parquet.md's schema: each `### dataset` heading's table, (column, type, unit, nullable) a row."""
    schema_part = DOC.read_text().split("## Schema", 1)[1].split("\n## ", 1)[0]
    tables = {}
    for name, body in re.findall(r"^### (\w+)\n(.*?)(?=^### |\Z)", schema_part, flags=re.M | re.S):
        rows = re.findall(r"^\| ([^|]+?) \| ([^|]+?) \| ([^|]*?) \| (yes|no) \| .+ \|$", body, flags=re.M)
        tables[name] = [(c, t, u.strip(), n) for c, t, u, n in rows if c != "column"]
    return tables


def _doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)


def _close(got: float | None, want: float | None, rel: float) -> bool:
    return got == want if got is None or want is None else got == pytest.approx(want, rel=rel, abs=0)


def _check_figures(per_rank: list[dict[str, Any]], bandwidth: list[dict[str, Any]], peaks: list[dict[str, Any]],
                   arrivals: list[dict[str, Any]], report: dict[str, Any], rates_rel: float = 0.0) -> None:
    """Each figure of the doc's queries against the report's: exact, or to the tolerance its arithmetic needs.
    ``rates_rel``: for one collective's rate (the 10th percentile of busbw), 0 where the engine divides as
    Python does."""
    ranks = report["ranks"]
    assert [r["rank"] for r in per_rank] == [r["rank"] for r in ranks] == [0, 1]
    for got, want in zip(per_rank, ranks, strict=True):
        for key in ("median_step_s", "exposed_comm_s", "exposed_comm_share"):
            assert _close(got[key], want[key], MEDIAN_REL), (key, got, want)
    assert [(b["op"], b["size_bucket_bytes"], b["group_size"], b["count"], b["total_bytes"]) for b in bandwidth] == \
        [(b["op"], b["size_bucket_bytes"], b["group_size"], b["count"], b["total_bytes"]) for b in report["bandwidth"]]
    for got, want in zip(bandwidth, report["bandwidth"], strict=True):
        for key in ("median_time_s", "median_algbw_bytes_per_s", "median_busbw_bytes_per_s"):
            assert _close(got[key], want[key], MEDIAN_REL), (key, got, want)
        assert _close(got["busbw_p10_bytes_per_s"], want["busbw_p10_bytes_per_s"], rates_rel), (got, want)
    assert [(p["rank"], p["peak_memory_bytes"], p["capacity_bytes"]) for p in peaks] == \
        [(r["rank"], r["peak_memory_bytes"], r["capacity_bytes"]) for r in ranks]
    assert peaks[0]["peak_memory_bytes"] > 0
    want_arrivals = report["imbalance"]["arrivals"]
    counts = ("rank", "matched", "last_arrivals", "steady_matched", "steady_last_arrivals")
    assert [[a[k] for k in counts] for a in arrivals] == [[a[k] for k in counts] for a in want_arrivals]
    for got, want in zip(arrivals, want_arrivals, strict=True):
        for key in ("caused_wait_s", "waited_s", "steady_caused_wait_s", "steady_waited_s"):
            assert _close(got[key], want[key], SUM_REL), (key, got, want)
    assert sum(a["steady_caused_wait_s"] for a in arrivals) > 0  # the 2-rank run's ranks wait for each other


@pytest.mark.distributed
def test_the_docs_sql_run_by_duckdb_on_the_export_gives_the_reports_figures(exported: Path, report: dict[str, Any],
                                                                            tmp_path: Path) -> None:
    blocks = _doc_blocks("sql")
    assert [block.splitlines()[0] for block in blocks] == [
        "-- the datasets as views", "-- per rank: ranks[].median_step_s, exposed_comm_s, exposed_comm_share",
        "-- the run: bandwidth[]", "-- per rank: ranks[].peak_memory_bytes, capacity_bytes",
        "-- per rank: imbalance.arrivals[]", "-- every run in exports/: the median step time per run and rank"]
    con = duckdb.connect()
    con.execute(f"SET file_search_path = '{exported}'")  # the doc's queries, run in the export's folder
    con.execute(blocks[0])

    def rows(sql: str) -> list[dict[str, Any]]:
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    _check_figures(*(rows(block) for block in blocks[1:5]), report)
    # Two runs exported side by side as exports/run=<name>: one table, the run a column
    for name in ("a", "b"):
        shutil.copytree(exported, tmp_path / "exports" / f"run={name}")
    con.execute(f"SET file_search_path = '{tmp_path}'")
    assert [(r["run"], r["rank"]) for r in rows(blocks[5])] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(_close(r["median_step_s"], report["ranks"][r["rank"]]["median_step_s"], MEDIAN_REL)
               for r in rows(blocks[5]))


@pytest.mark.distributed
def test_the_docs_polars_on_the_export_gives_the_same_figures(exported: Path, report: dict[str, Any],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = _doc_blocks("python")
    spark = [block for block in blocks if "pyspark" in block]
    assert len(spark) == 1 and len(blocks) == 5  # Spark's example is not run here
    monkeypatch.chdir(exported)
    namespace: dict[str, Any] = {}
    for block in blocks:
        if block not in spark:
            exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - the doc's own code, as a reader runs it
    # Polars divides by a constant as a product with its reciprocal (nanoseconds / 1e9): a second or a rate one unit
    # in the last place off Python's quotient
    _check_figures(*(namespace[name].to_dicts() for name in ("per_rank", "bandwidth", "peak_memory", "arrivals")),
                   report, rates_rel=MEDIAN_REL)


# --- a run with a torn last line, a killed rank and an earlier attempt --------------------------------------

T0 = 1_800_000_000_000_000_000
MS = 1_000_000


def _rank_records(rank: int, steps: int) -> list[Record]:
    """A small rank's records: what the agent writes of a step, its collectives matched across ranks."""
    out: list[Record] = [RunInfo(rank=rank, local_rank=rank, world_size=2, host="h", pid=100 + rank, job="j",
                                 framework="fsdp2", framework_version=None, torch_version="2.13.0",
                                 backend="gloo", device="cpu", zero_stage=None, fsdp_strategy="FULL_SHARD",
                                 param_dtype=None, reduce_dtype=None, optimizer="AdamW", knobs={"clip": 1.0}),
                         Notice(rank=rank, t_ns=T0, level="info", source="cuda", message="no CUDA device")]
    seq = 0
    for step in range(steps):
        start = T0 + step * 40 * MS
        for i, (op, phase) in enumerate((("all_gather", "forward"), ("reduce_scatter", "backward"))):
            seq += 1
            issue = start + (i + 1) * 10 * MS + rank * MS
            out.append(CollectiveEvent(seq=seq, rank=rank, step=step, phase=phase, op=op, api=op, bytes_in=2**20,
                                       bytes_out=2**21, dtype="float32", group_size=2, async_op=False,
                                       issue_ns=issue, complete_ns=issue + 2 * MS, blocked_s=0.002, timing="sync",
                                       meaning="param_all_gather", wait_ns=issue, issue_s=0.002))
        out.append(PhaseSpan(rank=rank, step=step, phase="forward", start_ns=start, end_ns=start + 15 * MS))
        out.append(MemorySample(rank=rank, step=step, phase="forward", t_ns=start + 15 * MS, device="cpu",
                                allocated=None, reserved=None, active=None, peak_allocated=None, peak_reserved=None,
                                inactive_split=None, num_alloc_retries=None, num_ooms=None, capacity=2**34,
                                free=None, rss=2**30 + step, categories={"activations": 2**20 * step}))
        out.append(StepSummary(rank=rank, step=step, start_ns=start, end_ns=start + 40 * MS,
                               phase_s={"forward": 0.015, "agent": 0.0001}, collectives=2, comm_bytes=2**22,
                               comm_bytes_by_op={"all_gather": 2**21, "reduce_scatter": 2**20}, comm_union_s=0.004,
                               blocked_s=0.004, peak_memory=2**30 + step, comp_s=0.036, overlap_s=0.0,
                               exposed_comm_s=0.004))
    out.append(AgentStats(rank=rank, t_ns=T0 + steps * 40 * MS, events_recorded=seq, events_dropped=0, hook_errors=0,
                          cpu_time_s=0.01, records_lost=0, bytes_lost=0))
    return out


def _faulty_run(run: Path) -> None:
    """A run torchelastic restarted once. Attempt 0 (kept in attempts/0): rank 1 raised at step 3, rank 0 was
    stopped by SIGTERM. Attempt 1: rank 0 (compact) killed mid-write, its last segment cut; rank 1 (JSON lines)
    killed mid-line, its last line torn."""
    kept = run / "attempts" / "0"
    for rank, how in ((0, "signal SIGTERM"), (1, "exception RuntimeError")):
        writer = CompactWriter(kept / f"rank-{rank}.zmr", rank, job="j", world_size=2, run_id="r", attempt=0,
                               end_record=True)
        for record in _rank_records(rank, 4):
            writer.write(record)
        writer.close(RunEnd(rank=rank, t_ns=T0 + 4 * 40 * MS, how=how, last_step=3, records_lost=0, bytes_lost=0,
                            detail="NIC flap" if rank else None))
    compact = CompactWriter(run / "rank-0.zmr", 0, job="j", world_size=2, run_id="r", attempt=1, end_record=True)
    for i, record in enumerate(_rank_records(0, 6)):
        compact.write(record)
        if i % 7 == 6:
            compact.flush()  # a segment per flush, as the agent writes them
    compact.close()  # no end record: the rank was killed, and its last segment is cut short below
    data = (run / "rank-0.zmr").read_bytes()
    (run / "rank-0.zmr").write_bytes(data[:-20])
    lines = RecordingWriter(run / "rank-1.jsonl", 1, job="j", world_size=2, run_id="r", attempt=1, end_record=True)
    records = _rank_records(1, 6)
    for record in records[:-1]:
        lines.write(record)
    lines.close()
    torn = encode_record(records[-1]).encode()
    with open(run / "rank-1.jsonl", "ab") as handle:
        handle.write(torn[: len(torn) // 2])


def test_a_torn_line_a_killed_rank_and_a_restart_keep_every_record_the_report_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run, out = tmp_path / "run", tmp_path / "out"
    _faulty_run(run)
    assert main(["export", str(run), "--format", "parquet", "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "attempt 0, before the run restarted: 2 rank files exported to" in said.out
    assert "rank-1.jsonl: 1 corrupt line skipped (line " in said.err  # the torn line, said as `zeromon export` says it
    for root, folder in ((out, run), (out / "attempts" / "0", run / "attempts" / "0")):
        for path in sorted(folder.glob("rank-*")):
            rank = int(path.name.split("-")[1].split(".")[0])
            recording = read_recording(path)  # what `zeromon report` reads of the rank
            records = list(iter_records(path))
            assert _records(root, rank) == records and records
            assert len([r for r in records if isinstance(r, StepSummary)]) == len(recording.steps) > 0
            assert [r for r in records if isinstance(r, CollectiveEvent)] == list(recording.collectives)
            files = _files_row(root, rank)
            assert files["skipped"] == recording.corrupt_lines and files["end_record"] is True
            assert files["attempt"] == (0 if root != out else 1)
    assert _files_row(out, 1)["skipped"] != []  # the torn line
    ends = pq.read_table(out / "attempts" / "0" / "run_ends").to_pylist()
    assert sorted((e["rank"], e["how"], e["detail"]) for e in ends) == [
        (0, "signal SIGTERM", None), (1, "exception RuntimeError", "NIC flap")]
    assert pq.read_table(out / "run_ends").num_rows == 0  # both ranks of the last attempt were killed
    last_steps = duckdb.sql(f"SELECT rank, max(step) FROM read_parquet('{out}/steps/*/*.parquet', "
                            "hive_partitioning = true) GROUP BY rank ORDER BY rank").fetchall()
    assert last_steps == [(0, 4), (1, 5)]  # rank 0 lost its last segment, step 5's summary with it


def _two_rank_run(run: Path) -> Path:
    """A 2-rank JSON-lines recording of 50 steps a rank (_rank_records), in ``run``."""
    for rank in (0, 1):
        writer = RecordingWriter(run / f"rank-{rank}.jsonl", rank, job="j", world_size=2)
        for record in _rank_records(rank, 50):
            writer.write(record)
        writer.close()
    return run


def test_a_rank_is_written_a_row_group_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's rows of a kind go out every BATCH_ROWS rows: what the export holds does not grow with the run."""
    run = _two_rank_run(tmp_path / "run")
    monkeypatch.setattr(parquet_export, "BATCH_ROWS", 16)
    parquet_export.export_run(run, tmp_path / "out", workers=1)
    collectives = pq.ParquetFile(tmp_path / "out" / "collectives" / "rank=1" / "part-0.parquet")
    assert collectives.metadata.num_rows == 100 and collectives.metadata.num_row_groups == 7  # 6 of 16, then 4
    assert _records(tmp_path / "out", 1) == list(iter_records(run / "rank-1.jsonl"))


def test_an_integer_past_int64_is_skipped_and_said_and_the_rest_kept(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The recording format takes integers up to 2**64 (the readers do); a Parquet int64 column does not."""
    run = tmp_path / "run"
    writer = RecordingWriter(run / "rank-0.jsonl", 0, job="j", world_size=1)
    records = _rank_records(0, 2)
    huge = next(r for r in records if isinstance(r, CollectiveEvent))
    for record in records:
        writer.write(record)
    writer.write(CollectiveEvent(**{**{f: getattr(huge, f) for f in huge.__dataclass_fields__}, "bytes_in": 2**64 - 1}))
    writer.close()
    assert main(["export", str(run), "--format", "parquet", "--out", str(tmp_path / "out")]) == 0
    line = len(records) + 2  # after the header and the records that fit
    assert (f"1 corrupt line skipped (line {line}; line {line}: collective.bytes_in does not fit a 64-bit signed "
            "integer)") in capsys.readouterr().err
    assert _records(tmp_path / "out", 0) == records
    assert _files_row(tmp_path / "out", 0)["skipped_reasons"] == [
        (line, "collective.bytes_in does not fit a 64-bit signed integer")]


# --- bad input ---------------------------------------------------------------------------------------------

def test_bad_input_is_one_line_naming_the_flag_exit_2_and_nothing_is_overwritten(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    writer = RecordingWriter(run / "rank-0.jsonl", 0, job="j", world_size=1)
    for record in _rank_records(0, 2):
        writer.write(record)
    writer.close()
    (tmp_path / "a-file").write_text("kept\n")
    (tmp_path / "used" / "steps").mkdir(parents=True)
    (tmp_path / "used" / "steps" / "mine.txt").write_text("kept\n")
    for args, said in (([], "--format parquet writes a folder of datasets, not stdout: give --out DIR"),
                       (["--out", "-"], "give --out DIR"),
                       (["--out", str(tmp_path / "a-file")], f"--out {tmp_path / 'a-file'}: a file, not a folder"),
                       (["--out", str(run)], f"--out {run}: the run's own folder"),
                       (["--out", str(tmp_path / "used")], f"{tmp_path / 'used' / 'steps'} exists (nothing is "
                                                           "overwritten)")):
        assert main(["export", str(run), "--format", "parquet", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("zeromon: error: ") and said in err and "Traceback" not in err, err
    assert main(["export", str(run), "--format", "csv", "--out", str(tmp_path / "x")]) == 2
    assert "argument --format: invalid choice: 'csv'" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == "kept\n" and (tmp_path / "used" / "steps" / "mine.txt").exists()
    assert sorted(p.name for p in (tmp_path / "used").iterdir()) == ["steps"] and not (tmp_path / "x").exists()
    assert sorted(p.name for p in run.iterdir()) == ["rank-0.jsonl"]


def test_without_pyarrow_the_error_gives_the_install_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    RecordingWriter(run / "rank-0.jsonl", 0, job="j").close()
    script = ("import sys; sys.modules['pyarrow'] = None; from zeromon.cli import main; "
              f"sys.exit(main(['export', {str(run)!r}, '--format', 'parquet', '--out', {str(tmp_path / 'out')!r}]))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == ["zeromon: error: --format parquet needs pyarrow, which is not installed",
                                          "hint: pip install 'zeromon[parquet]'"]
    assert not (tmp_path / "out").exists()


def test_the_kinds_the_format_has_are_the_datasets() -> None:
    assert [d.kind for d in datasets()] == [*KIND_OF.values(), FILES]


def test_a_full_disk_is_said_as_out_s_and_leaves_no_dataset_behind(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _two_rank_run(tmp_path / "run")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root and mount(8) needed): {mounted.stderr.strip()}")
    try:
        assert main(["export", str(run), "--format", "parquet", "--out", str(disk / "out")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zeromon: error: --out {disk / 'out'}: cannot write: ") and "No space left" in err, err
        assert list(disk.iterdir()) == []  # the folder it made, gone with what it held
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
