"""Records stored as columns: one rank's records of one type in a handful of arrays instead of an
object per record, made again when looked at. For holding a whole recording in memory (the replay
source) without giving the garbage collector hundreds of thousands of objects to walk.
"""

from __future__ import annotations

import bisect
import copy
import math
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar, overload

from zeromon.model.kinds import FIELDS_OF

R = TypeVar("R")
NO_INT = -(2**63)  # None in the int columns
_INT, _FLOAT, _OBJECT, _MAPPING = range(4)


def _int_like(value: Any) -> bool:
    return type(value) is int and NO_INT < value < 2**63


def _kind(values: list[Any]) -> int:
    """How a field's values are stored: numbers in arrays, mappings of numbers flattened, anything else as it is."""
    present = [v for v in values if v is not None]
    if not present:
        return _OBJECT
    if all(_int_like(v) for v in present):
        return _INT
    if all(type(v) in (int, float) for v in present):
        return _FLOAT  # an int among floats reads back as an equal float
    if len(present) == len(values) and all(isinstance(v, Mapping) for v in present):
        return _MAPPING
    return _OBJECT


class MappingColumn:
    """{name: number} values (memory categories, seconds per phase, bytes per op): the key tuples
    shared, the numbers in one flat array; a mapping of anything else is kept as it is.

    Record i's values are ``ints[offsets[i]:offsets[i] + len(keys[i])]`` where ``offsets[i] >= 0``,
    ``floats[~offsets[i]:...]`` where it is < 0, ``others[i]`` where i is in ``others``: a reader
    that wants many records' values at once (the dashboard's memory figures) gathers them from
    these arrays instead of making a dict per record."""

    __slots__ = ("keys", "offsets", "ints", "floats", "others")

    def __init__(self, values: list[Mapping[str, Any]]) -> None:
        shared: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.keys: list[tuple[str, ...]] = []
        self.offsets = array("q")  # >= 0: into ints; < 0: ~offset into floats
        self.ints, self.floats = array("q"), array("d")
        self.others: dict[int, Mapping[str, Any]] = {}
        for i, mapping in enumerate(values):
            keys = tuple(mapping)
            self.keys.append(shared.setdefault(keys, keys))
            numbers = list(mapping.values())
            if all(_int_like(v) for v in numbers):
                self.offsets.append(len(self.ints))
                self.ints.extend(numbers)
            elif all(type(v) in (int, float) for v in numbers):
                self.offsets.append(~len(self.floats))
                self.floats.extend(numbers)
            else:
                self.offsets.append(0)
                self.others[i] = mapping

    def head(self, n: int) -> MappingColumn:
        """The first ``n`` records' values: their keys and offsets, the flat arrays shared."""
        column = MappingColumn.__new__(MappingColumn)
        column.keys, column.offsets = self.keys[:n], self.offsets[:n]
        column.ints, column.floats = self.ints, self.floats
        column.others = {i: mapping for i, mapping in self.others.items() if i < n}
        return column

    def get(self, i: int) -> Mapping[str, Any]:
        other = self.others.get(i)
        if other is not None:
            return other
        keys, offset = self.keys[i], self.offsets[i]
        values = self.ints[offset:offset + len(keys)] if offset >= 0 else self.floats[~offset:~offset + len(keys)]
        return dict(zip(keys, values, strict=True))


class ColumnTable(Generic[R]):
    """One rank's records of one type in the order the agent published them, stored as columns.

    A record costs several times as much as an object (a MemorySample with its categories most) as its values
    take as columns, in a handful of arrays per table rather than objects per record or per field (each one
    more for the garbage collector to walk on every full collection, which the TUI's redraws set off every few
    seconds). Records are made again when looked at; ``window()`` keeps the last window's, so a view that
    moves one step on makes one StepSummary, not 64.
    """

    def __init__(self, cls: type[R], records: Sequence[R], time_of: str) -> None:
        ordered = sorted(records, key=lambda r: getattr(r, time_of))
        n = len(ordered)
        self.cls = cls
        self.t_ns: array[int] | memoryview = array("q", (getattr(r, time_of) for r in ordered))  # for bisection
        # Column-major: field j of record i is at base_j + i.
        self._ints, self._floats = array("q"), array("d")
        self._objects: list[Any] = []
        self._mappings: list[MappingColumn] = []
        self._plan: list[tuple[int, int]] = []  # per field: (kind, base or mapping index)
        shared: dict[str, str] = {}  # the few distinct strings: one object each
        for name in FIELDS_OF[cls]:
            values = [getattr(r, name) for r in ordered]
            kind = _kind(values) if n else _OBJECT
            if kind == _INT:
                self._plan.append((kind, len(self._ints)))
                self._ints.extend(NO_INT if v is None else v for v in values)
            elif kind == _FLOAT:
                self._plan.append((kind, len(self._floats)))
                self._floats.extend(math.nan if v is None else v for v in values)
            elif kind == _MAPPING:
                self._plan.append((kind, len(self._mappings)))
                self._mappings.append(MappingColumn(values))
            else:
                self._plan.append((kind, len(self._objects)))
                self._objects.extend(shared.setdefault(v, v) if isinstance(v, str) else v for v in values)
        self._fields = {name: i for i, name in enumerate(FIELDS_OF[cls])}
        self._window: tuple[int, tuple[R, ...]] = (0, ())  # (first index, records)

    def __len__(self) -> int:
        return len(self.t_ns)

    def upto(self, t_ns: int) -> int:
        """How many records the agent had published by ``t_ns``."""
        return bisect.bisect_right(self.t_ns, t_ns)

    def prefix(self, n: int, keys: array[int] | None = None) -> ColumnTable[R]:
        """The first ``n`` records (what a replay had published by its position) sharing this table's
        columns: nothing is copied. ``keys``: the prefix's time column instead of this table's, for the
        same records keyed by another field that runs in the same order (a replay's steps, stored by
        their end, read by their index)."""
        view = copy.copy(self)
        view.t_ns = memoryview(self.t_ns if keys is None else keys)[:max(0, n)]
        view._window = (0, ())
        return view

    def _field(self, kind: int, base: int, i: int) -> Any:
        if kind == _INT:
            v = self._ints[base + i]
            return None if v == NO_INT else v
        if kind == _FLOAT:
            f = self._floats[base + i]
            return None if f != f else f  # NaN: None
        if kind == _OBJECT:
            return self._objects[base + i]
        return self._mappings[base].get(i)

    def get(self, i: int) -> R:
        return self.cls(*[self._field(kind, base, i) for kind, base in self._plan])

    def numbers(self, name: str) -> array | None:
        """Field ``name`` of every record, in time order, as one array: 'q' with NO_INT for None, or
        'd' with NaN for None; None when the field is not stored as numbers (no value at all, or not
        numbers). A copy of the column's slice: ~8 bytes a record, no object per value."""
        kind, base = self._plan[self._fields[name]]
        if kind == _INT:
            return self._ints[base:base + len(self.t_ns)]
        if kind == _FLOAT:
            return self._floats[base:base + len(self.t_ns)]
        return None

    def mappings(self, name: str) -> MappingColumn | None:
        """Field ``name`` of every record, as stored, when it holds mappings (a MemorySample's categories);
        a prefix's (a replay's cut) its own records' only."""
        kind, base = self._plan[self._fields[name]]
        if kind != _MAPPING:
            return None
        column, n = self._mappings[base], len(self.t_ns)
        return column if len(column.keys) == n else column.head(n)

    def value(self, i: int, name: str) -> Any:
        """One field of record i."""
        return self._field(*self._plan[self._fields[name]], i)

    def slice(self, start: int, stop: int) -> list[R]:
        """Records start..stop, made column by column (a forecast's memory samples: much faster than one by
        one)."""
        start, stop = max(0, start), min(stop, len(self.t_ns))
        if stop <= start:
            return []
        columns: list[Sequence[Any]] = []
        for kind, base in self._plan:
            if kind == _INT:
                columns.append([None if v == NO_INT else v for v in self._ints[base + start:base + stop]])
            elif kind == _FLOAT:
                columns.append([None if f != f else f for f in self._floats[base + start:base + stop]])
            elif kind == _OBJECT:
                columns.append(self._objects[base + start:base + stop])
            else:
                columns.append([self._mappings[base].get(i) for i in range(start, stop)])
        return list(map(self.cls, *columns))

    def window(self, start: int, stop: int) -> tuple[R, ...]:
        """Records start..stop, reusing those of the last window asked for (it moves forward)."""
        start = max(0, start)
        old_start, old = self._window
        old_stop = old_start + len(old)
        if old_start <= start <= old_stop and stop >= old_stop:
            records = old[start - old_start:] + tuple(self.get(i) for i in range(old_stop, stop))
        else:
            records = tuple(self.get(i) for i in range(start, stop))
        self._window = (start, records)
        return records


class TableRecords(Sequence[R]):
    """A ColumnTable read as a sequence of its records (in its time order), each made when looked at:
    what a finished recording's dashboard holds instead of the records themselves."""

    __slots__ = ("table",)
    _CHUNK = 4096  # records made at a time while iterating

    def __init__(self, table: ColumnTable[R]) -> None:
        self.table = table

    def __len__(self) -> int:
        return len(self.table)

    @overload
    def __getitem__(self, index: int) -> R: ...

    @overload
    def __getitem__(self, index: slice) -> list[R]: ...

    def __getitem__(self, index: int | slice) -> R | list[R]:
        n = len(self.table)
        if isinstance(index, slice):
            start, stop, stride = index.indices(n)
            if stride == 1:
                return self.table.slice(start, stop)
            return [self.table.get(i) for i in range(start, stop, stride)]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("record index out of range")
        return self.table.get(index)

    def __iter__(self) -> Iterator[R]:
        for start in range(0, len(self.table), self._CHUNK):
            yield from self.table.slice(start, start + self._CHUNK)

    def __repr__(self) -> str:
        return f"TableRecords({len(self)} {self.table.cls.__name__})"


class _Nullable(Sequence[Any]):
    """Numbers with a few None among them: one array, None as a sentinel (NaN for floats)."""

    __slots__ = ("values", "is_float")

    def __init__(self, values: Sequence[Any], is_float: bool) -> None:
        self.is_float = is_float
        self.values = (array("d", (math.nan if v is None else v for v in values)) if is_float
                       else array("q", (NO_INT if v is None else v for v in values)))

    def __len__(self) -> int:
        return len(self.values)

    def _out(self, v: Any) -> Any:
        if self.is_float:
            return None if v != v else v
        return None if v == NO_INT else v

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._out(v) for v in self.values[index]]
        return self._out(self.values[index])

    def __iter__(self) -> Iterator[Any]:
        out = self._out
        return (out(v) for v in self.values)


class _Codes(Sequence[Any]):
    """A column of a few distinct values (ops, phases, dtypes, timings): one byte each."""

    __slots__ = ("codes", "names")

    def __init__(self, values: Sequence[Any], names: list[Any]) -> None:
        self.names = names
        index = {name: i for i, name in enumerate(names)}
        self.codes = array("B", (index[v] for v in values))

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        names = self.names
        if isinstance(index, slice):
            return [names[c] for c in self.codes[index]]
        return names[self.codes[index]]

    def __iter__(self) -> Iterator[Any]:
        return map(self.names.__getitem__, self.codes)


def compact_column(values: Sequence[Any]) -> Sequence[Any]:
    """The smallest of the sequences above that gives the same values back (a list where none fits)."""
    distinct = set()
    for v in values:
        distinct.add(v if v.__hash__ is not None else id(v))
        if len(distinct) > 255:
            break
    if len(distinct) <= 255 and all(v is None or type(v) in (str, bool) for v in distinct):
        return _Codes(values, sorted(distinct, key=lambda v: (v is None, str(v))))
    present = [v for v in values if v is not None]
    if all(_int_like(v) for v in present):
        return _narrow(values) if len(present) == len(values) else _Nullable(values, is_float=False)
    if all(type(v) is float for v in present):
        return array("d", values) if len(present) == len(values) else _Nullable(values, is_float=True)
    return list(values)


# The narrowest array typecode that holds a column's integers: a rank number, a group size or a step
# fits in 1-2 bytes, not 8, and a run's collectives hold millions of them.
_INT_CODES = tuple((code, -(1 << (8 * array(code).itemsize - 1)), (1 << (8 * array(code).itemsize - 1)) - 1)
                   for code in ("b", "h", "i", "q"))


def _narrow(values: Sequence[int]) -> array:
    low, high = (min(values), max(values)) if values else (0, 0)
    code = next(code for code, least, most in _INT_CODES if least <= low and high <= most)
    return array(code, values)
