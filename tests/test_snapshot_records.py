"""The snapshot's records as JSON objects (snapshot.record_dict, which reads only the fields not declared
a scalar for a mapping) are what reading every field gives; its events are the same whether the recorder
made their records or left them unmade; and the endpoint's JSON (orjson's where installed) reads back as
json's would."""

from __future__ import annotations

import collections
import json
import math
import types
from collections.abc import Mapping
from typing import Any

import orjson
from hypothesis import assume, example, given
from hypothesis import strategies as st
from test_compact_format import records

from zeromon.analysis.comm_advice import overlap_findings, overlap_findings_of_summaries
from zeromon.model import kinds
from zeromon.model.codec import FIELDS_OF, KIND_OF, json_default
from zeromon.model.events import CollectiveEvent, MemorySample, PhaseSpan, Record, StepSummary
from zeromon_agent.hooks.state import RAW_MEMORY, RAW_OOM, HotState, perf_ns
from zeromon_agent.live.published import LiveViews
from zeromon_agent.live.view import Identity, LiveData
from zeromon_agent.recorder.loop import Recorder
from zeromon_agent.serve.httpserver import json_response
from zeromon_agent.serve.snapshot import _MAPPING_FIELDS, events_since, record_dict


def every_field(record: Record) -> dict[str, Any]:
    """The definition: each field by name, any mapping as a plain dict."""
    return {name: dict(value) if isinstance(value, Mapping) else value
            for name in FIELDS_OF[type(record)] for value in (getattr(record, name),)}


@given(record=records())
def test_record_dict_is_every_field_with_mappings_as_dicts(record: Record) -> None:
    # The agent's records hold their declared types; a mapping where a scalar is declared is not one of them.
    assume(not any(isinstance(getattr(record, name), Mapping) for name in FIELDS_OF[type(record)]
                   if name not in _MAPPING_FIELDS[type(record)]))
    made = record_dict(record)
    assert made == every_field(record)
    assert list(made) == list(FIELDS_OF[type(record)])  # in the schema's order
    assert all(type(v) is dict for v in made.values() if isinstance(v, Mapping))


def test_the_mapping_fields_are_the_declared_mappings() -> None:
    declared = {cls.__name__: names for cls, names in _MAPPING_FIELDS.items() if names}
    assert declared == {"MemorySample": ("categories",), "StepSummary": ("phase_s", "comm_bytes_by_op"),
                        "RunInfo": ("knobs",), "ProgressReport": ("report",)}


def _plain(record: Record) -> bool:
    """A record of its declared types (what the agent publishes): no mapping where a scalar is declared."""
    return not any(isinstance(getattr(record, name), Mapping) for name in FIELDS_OF[type(record)]
                   if name not in _MAPPING_FIELDS[type(record)])


_PROXIED = MemorySample(rank=0, step=3, phase="forward", t_ns=5, device="cpu", allocated=None, reserved=None,
                        active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                        num_alloc_retries=None, num_ooms=None, capacity=None, free=None, rss=7,
                        categories=types.MappingProxyType({"params": 4}))


@given(recs=st.lists(records(), max_size=30), unmade=st.lists(st.booleans(), min_size=30, max_size=30),
       since=st.integers(0, 40), limit=st.integers(1, 40),
       kinds=st.none() | st.sets(st.sampled_from(sorted(KIND_OF.values())), min_size=1))
@example(recs=[_PROXIED, _PROXIED], unmade=[True, False] * 15, since=0, limit=40, kinds=None)  # a mapping that is no dict
@example(recs=[_PROXIED, _PROXIED], unmade=[False] * 30, since=0, limit=1, kinds={"phase"})  # none of the kind: through
def test_events_are_the_same_from_records_left_unmade(recs: list[Record], unmade: list[bool], since: int,
                                                      limit: int, kinds: set[str] | None) -> None:
    assume(all(map(_plain, recs)))
    # What a batch publishes for a collective, phase span or memory sample: its values alone, in field order.
    published = tuple(tuple(getattr(r, name) for name in FIELDS_OF[type(r)])
                      if leave and type(r) in (CollectiveEvent, PhaseSpan, MemorySample) else r
                      for r, leave in zip(recs, unmade, strict=False))
    cursor = 10 + len(recs)  # the newest record's number
    events, lost, through = events_since(published, cursor, since, limit, frozenset(kinds) if kinds else None)
    first = cursor - len(recs) + 1
    start = max(0, since + 1 - first)
    # every record after `since`, of the kinds asked for (all: None), the oldest `limit` of them
    wanted = [{"cursor": first + i, "kind": KIND_OF[type(r)], **every_field(r)}
              for i, r in enumerate(recs[start:], start) if kinds is None or KIND_OF[type(r)] in kinds]
    assert events == wanted[:limit]
    assert all(type(v) is dict for event in events for v in event.values() if isinstance(v, Mapping))
    assert lost == (bool(recs) and first > since + 1)
    # the next `since`: the last event of a full page, else the newest record (none of those asked for skipped)
    assert through == (events[-1]["cursor"] if len(events) == limit else cursor)
    assert [e for e in wanted if e["cursor"] <= through] == events


def _json_values(value: Any) -> Any:
    """What json's own line reads back as, with NaN and the infinities as null (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_values(v) for v in value]
    return value


@given(recs=st.lists(records(), max_size=20))
def test_a_snapshots_json_reads_back_as_jsons_own_line(recs: list[Record]) -> None:
    assume(all(map(_plain, recs)))
    document = {"schema": "zeromon.snapshot/1", "events": [record_dict(r) for r in recs],
                "oom": types.MappingProxyType({"rank": 0, "risk": "ok"}), "by_rank": {0: "é", 1: None}}
    body = json_response(200, document).body
    assert body.endswith(b"\n") and body.count(b"\n") == 1
    reference = _json_values(json.loads(json.dumps(document, default=json_default)))
    try:
        assert orjson.loads(body) == reference  # the live source's parser: it refuses NaN
    except orjson.JSONDecodeError:  # only json's line has NaN or an integer past 64 bits; json reads it
        assert json.loads(body) == json.loads(json.dumps(document, default=json_default))


def test_orjson_writes_the_endpoints_json_and_json_what_orjson_refuses(monkeypatch: Any) -> None:
    document = {"name": "é", "share": math.nan, 3: types.MappingProxyType({"a": 1})}
    body = json_response(200, document).body
    assert body == '{"name":"é","share":null,"3":{"a":1}}\n'.encode()  # orjson's: UTF-8, NaN as null
    big = json_response(200, {"bytes": 2**70}).body  # past 64 bits: orjson refuses it, json writes it whole
    assert body != big and json.loads(big) == {"bytes": 2**70}
    monkeypatch.setattr(kinds, "_orjson", False)  # without orjson: json's line
    assert json_response(200, document).body == b'{"name":"\\u00e9","share":NaN,"3":{"a":1}}\n'


def test_an_oom_the_recorder_took_reaches_the_live_forecast() -> None:
    # The OOM observer's item (on a GPU the allocator calls it; here pushed as it would push it): the live view
    # looks for OOM records only once the recorder has counted one.
    state = HotState()
    recorder = Recorder(state, rank=0, writer=None, flush_interval_s=1.0)
    live = LiveData(recorder, Identity(rank=0, local_rank=0, world_size=1, host="h", pid=1, job="j", start_ns=0))
    sample = dict.fromkeys(("allocated", "reserved", "active", "peak_allocated", "peak_reserved", "inactive_split",
                            "num_alloc_retries", "num_ooms", "free"))
    state.control.append((RAW_MEMORY, "forward", 0, perf_ns(), {**sample, "device": "cpu", "rss": 2**30,
                                                                "capacity": 2**32}))
    recorder._drain(final=False)
    before = live.view().oom
    assert before is not None and not [f for f in before.findings if f.kind == "oom_recorded"]
    state.control.append((RAW_OOM, perf_ns(), "cuda:0", {"allocated": 2**30, "requested": 2**20, "free": 0}, None,
                          "backward", 0))
    recorder._drain(final=False)
    live._view = None  # a new view now, not the cached one (VIEW_TTL_S); the forecast, kept FORECAST_TTL_S, is
    # taken again at once: an OOM was counted since
    found = [f for f in live.view().oom.findings if f.kind == "oom_recorded"]  # type: ignore[union-attr]
    assert len(found) == 1 and found[0].step == 0
    # Step 0 is shown as step 1 (step_number: the count a training loop prints).
    assert found[0].evidence == ("OOM in step 1 (backward) on cuda:0: requested 1.00 MiB with 1.00 GiB allocated and "
                                 "0 B free",)


def _summary(step: int, exposed_s: float | None, rank: int = 0) -> StepSummary:
    start = 10**18 + step * 50_000_000
    return StepSummary(rank=rank, step=step, start_ns=start, end_ns=start + 40_000_000, phase_s={"forward": 0.02},
                       collectives=4, comm_bytes=1 << 20, comm_bytes_by_op={"all_gather": 1 << 20},
                       comm_union_s=0.02 if exposed_s is not None else None, blocked_s=exposed_s, peak_memory=None,
                       comp_s=0.02, overlap_s=0.02 - exposed_s if exposed_s is not None else None,
                       exposed_comm_s=exposed_s)


@given(exposed=st.lists(st.none() | st.floats(0.0, 0.02), min_size=1, max_size=80),
       window=st.integers(1, 30), stride=st.integers(1, 12), replaced=st.sets(st.integers(0, 79), max_size=5))
@example(exposed=[0.015] * 12, window=5, stride=2, replaced={3})
def test_a_view_s_overlap_findings_taken_a_step_at_a_time_are_the_window_s_own(
        exposed: list[float | None], window: int, stride: int, replaced: set[int]) -> None:
    # The live view keeps each step's overlap between views (LiveData._step_overlaps) and takes the findings from
    # them: the same as taking them from the summaries of the window each time, as the window slides over the run,
    # a summary of a step number seen before (a rank's step counted again) taken again.
    live = LiveData(types.SimpleNamespace(), Identity(rank=0, local_rank=0, world_size=1, host="h", pid=1, job="j",
                                                      start_ns=0))
    summaries = [_summary(step, share) for step, share in enumerate(exposed)]
    for end in range(1, len(summaries) + stride, stride):
        steps = tuple(summaries[max(0, end - window):end])
        if end in replaced and steps:
            steps = (*steps[:-1], _summary(steps[-1].step, 0.019))
        kept = [o for o in live._step_overlaps(steps) if o is not None]
        found = overlap_findings(0, kept, None) if kept else ()
        assert found == overlap_findings_of_summaries(0, steps, None)
        if set(exposed) == {0.015}:  # 38% of every step exposed: the finding is there to compare
            assert [f.kind for f in found] == ["poor_overlap"]
        assert sorted(live._overlaps) == [s.step for s in steps]


def _sample(i: int) -> MemorySample:
    return MemorySample(rank=0, step=i, phase="forward", t_ns=i, device="cpu", allocated=None, reserved=None,
                        active=None, peak_allocated=None, peak_reserved=None, inactive_split=None,
                        num_alloc_retries=None, num_ooms=None, capacity=None, free=None, rss=i)


@given(batches=st.lists(st.tuples(st.lists(st.booleans(), max_size=12), st.booleans()), max_size=12))
def test_memory_samples_made_since_the_last_read_are_the_history_made_whole(
        batches: list[tuple[list[bool], bool]]) -> None:
    # LiveViews.memory_samples makes the samples handed over since its last call (the newest), not the whole
    # history again: what it returns is every sample kept, made, as if made all at once.
    views = LiveViews()
    views.memory_history = collections.deque(maxlen=16)  # a short history: the oldest fall off
    handed: list[MemorySample] = []
    for unmade, read in batches:
        batch = [_sample(len(handed) + i) for i in range(len(unmade))]
        handed += batch
        views.release([object()], 1, [], [], [tuple(getattr(s, n) for n in FIELDS_OF[MemorySample]) if leave else s
                                              for s, leave in zip(batch, unmade, strict=True)])
        if read:
            assert views.memory_samples() == handed[-16:]
    assert views.memory_samples() == handed[-16:]
    assert all(type(entry) is MemorySample for entry in views.memory_history)
