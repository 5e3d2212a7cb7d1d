"""A read record's values checked against the event model: each field's JSON value against the type
its dataclass annotates (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``Mapping[str, V]``).

The readers skip a line whose record breaks its schema and name it with what is wrong, as they skip
a corrupt line: a ``meaning`` of ``7`` or a ``bytes_in`` of ``"big"`` would otherwise fail an analysis
far from the line that caused it. Generic over the annotations, so a record kind added to
events.py is checked without more code here.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from zeromon.model.classes import frozen

_NONE = type(None)
# What each annotated type accepts of the values JSON decodes to. A JSON integer is a float's value
# too (a writer may print 0 for 0.0); a bool is not an int's, although Python calls it one.
_ACCEPTS: dict[Any, frozenset[type]] = {
    int: frozenset({int}),
    float: frozenset({float, int}),
    bool: frozenset({bool}),
    str: frozenset({str}),
    _NONE: frozenset({_NONE}),
}
_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", _NONE: "null",
          dict: "an object", list: "an array"}
_SHOWN_CHARS = 40  # of a bad value in the message: the value may be a line's megabytes


@frozen
class FieldType:
    """What one field of a record accepts."""

    name: str  # "collective.bytes_in": the kind and the field, as the message names them
    accepts: frozenset[type] | None  # the Python types of its decoded JSON; None: any (Any, an unknown annotation)
    values: frozenset[type] | None = None  # a Mapping's values; None: not a Mapping, or any value

    def words(self, types_: frozenset[type]) -> str:
        """'an integer or null'"""
        named = dict.fromkeys(_WORDS[t] for t in (int, float, bool, str, dict, list, _NONE) if t in types_)
        if float in types_:
            named.pop("an integer", None)  # a number says it
        return " or ".join(named)


def _accepts(annotation: Any) -> tuple[frozenset[type] | None, frozenset[type] | None]:
    """(the field's accepted types, its Mapping values' accepted types) for one annotation."""
    if annotation in _ACCEPTS:
        return _ACCEPTS[annotation], None
    origin = typing.get_origin(annotation)
    if origin is types.UnionType or origin is typing.Union:
        parts = [_accepts(arg)[0] for arg in typing.get_args(annotation)]
        if any(part is None for part in parts):
            return None, None
        return frozenset().union(*parts), None  # type: ignore[arg-type]
    if isinstance(annotation, type) and issubclass(annotation, str):  # a str Enum
        return _ACCEPTS[str], None
    if origin is not None and isinstance(origin, type):
        if issubclass(origin, Mapping):
            args = typing.get_args(annotation)
            return frozenset({dict}), (_accepts(args[1])[0] if len(args) == 2 else None)
        if issubclass(origin, Sequence) and not issubclass(origin, str):
            return frozenset({list}), None
    if annotation is dict or annotation is Mapping:
        return frozenset({dict}), None
    return None, None  # Any, or a type JSON cannot spell: not checked


@functools.cache
def field_types(cls: type, kind: str) -> tuple[FieldType, ...]:
    """The record class's fields in order, with what each accepts (resolved once per class)."""
    try:
        hints = typing.get_type_hints(cls)
    except (NameError, TypeError):  # an annotation that does not resolve at run time: left unchecked
        hints = {}
    fields = []
    for f in dataclasses.fields(cls):
        accepts, values = _accepts(hints[f.name]) if f.name in hints else (None, None)
        fields.append(FieldType(f"{kind}.{f.name}", accepts, values))
    return tuple(fields)


def show(value: Any) -> str:
    """A value as the line spells it, cut short: '7', '"big"', 'null', '[1, 2]'."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


class RecordCheck:
    """Checks the values of one kind's records, in the dataclass's field order.

    Cheap per record: the tuple of the values' types is looked up among those already found good,
    and only a new combination is checked field by field; Mapping fields have their values checked
    every time (a dict of a dozen categories, the dearest part of a record's check).
    """

    __slots__ = ("_good", "_mappings", "fields")

    _GOOD_KEPT = 256  # type combinations remembered: a few per kind in a real recording

    def __init__(self, cls: type, kind: str) -> None:
        self.fields = field_types(cls, kind)
        self._good: set[tuple[type, ...]] = set()
        self._mappings = tuple((i, f) for i, f in enumerate(self.fields) if f.values is not None)

    def problem(self, values: Sequence[Any]) -> str | None:
        """What is wrong with a record's values ('collective.meaning is 7, not a string'); None: nothing."""
        signature = tuple(map(type, values))
        if signature not in self._good:
            for value, f in zip(values, self.fields, strict=False):  # a short row: the rest take defaults
                if f.accepts is not None and type(value) not in f.accepts:
                    return f"{f.name} is {show(value)}, not {f.words(f.accepts)}"
            if len(self._good) < self._GOOD_KEPT:
                self._good.add(signature)
        for i, f in self._mappings:
            if i < len(values) and f.values is not None and type(mapping := values[i]) is dict \
                    and not set(map(type, mapping.values())) <= f.values:
                key, value = next((k, v) for k, v in mapping.items() if type(v) not in f.values)
                return f"{f.name}[{show(key)}] is {show(value)}, not {f.words(f.values)}"
        return None


    def fix_non_finite(self, values: list[Any]) -> str | None:
        """For a row that only json (not orjson) decodes: NaN and the infinities, which JSON has no word
        for, read as null (unknown) where the field may be null; elsewhere they are the record's
        problem. Integers past 64 bits likewise (orjson reads them as floats: not an integer)."""
        for i, (value, f) in enumerate(zip(values, self.fields, strict=False)):
            if f.accepts is None or not _unrepresentable(value):
                continue
            if _NONE in f.accepts:
                values[i] = None
            else:
                return f"{f.name} is {show(value)}, not {_finite_words(value)}"
        for i, f in self._mappings:
            if i < len(values) and type(mapping := values[i]) is dict:
                bad = next((k for k, v in mapping.items() if _unrepresentable(v)), None)
                if bad is not None:
                    return f"{f.name}[{show(bad)}] is {show(mapping[bad])}, not {_finite_words(mapping[bad])}"
        return None


def _finite_words(value: Any) -> str:
    return "a finite number" if type(value) is float else "a 64-bit integer"


def _unrepresentable(value: Any) -> bool:
    if type(value) is float:
        return not math.isfinite(value)
    return type(value) is int and not -(2**63) <= value < 2**64


@functools.cache
def record_check(cls: type, kind: str) -> RecordCheck:
    return RecordCheck(cls, kind)
