"""The snapshot's records as JSON objects (snapshot.record_dict, which reads only the fields not declared
a scalar for a mapping) are what reading every field gives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import assume, given
from test_compact_format import records

from zeromon.model.codec import FIELDS_OF
from zeromon.model.events import Record
from zeromon_agent.snapshot import _MAPPING_FIELDS, record_dict


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
                        "RunInfo": ("knobs",)}
