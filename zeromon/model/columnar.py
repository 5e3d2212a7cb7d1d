"""The columns of the compact recording format (2.1): a segment's collectives, phases and memory samples,
a column per field.

A 70B-class FSDP job issues hundreds of collectives per step per rank, each a JSON line of a couple of hundred
bytes. As columns their values are mostly the same or a small step from the one before, and zlib squeezes
them: each column holds 64-bit integers, delta-coded (a time minus the previous row's, or minus another field
of the row: ``complete_ns - issue_ns``), and written byte plane by byte plane (all first bytes, then all
second bytes, ...: the "shuffle" of Blosc and HDF5), so that the high bytes, zero in every row, become long
runs. Strings are codes into the segment's own table, seconds are exact nanosecond integers. A collective then
takes a fraction of its zlib'd JSON row, the shuffle a part of that gain, and a memory sample less than its
JSON row (tests/bench/bench_recording_size.py, tests/bench/RESULTS.md).

A record whose values a column cannot hold exactly (a float that is not whole nanoseconds, an
integer past 64 bits, a value of another type) is written as its JSON row instead: what is read
back is what the JSON-lines writer would have given, whatever the values.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from zeromon.model.classes import frozen
from zeromon.model.compiled import compiled
from zeromon.model.events import MEMORY_CATEGORIES, CollectiveEvent, MemorySample, PhaseSpan

# Values a column holds: 64-bit integers; seconds below a billion (~31 years), whole nanoseconds. A
# column whose values or deltas pass 64 bits raises OverflowError in encode: its writer writes those
# records as JSON rows.
SECONDS_LIMIT = 1e9
_WIDTH = 8  # bytes per value in memory: array('q')
# A column is written in the fewest bytes per value that hold it (a width byte, then that many planes):
# zlib reads fewer zero planes, so the file is smaller and the flush cheaper
# (tests/bench/bench_recording_size.py).
_SIGNED = {1: "b", 2: "h", 4: "i", 8: "q"}
_LIMITS = [(1, 2**7), (2, 2**15), (4, 2**31), (8, 2**63)]
_LITTLE = sys.byteorder == "little"

# (field, how, base). how: "int", "str" (a code into the segment's table; None is a table entry),
# "bool", "ns" (seconds as whole nanoseconds), "int?" / "ns?" (nullable: a null column beside), "map"
# (a dict of names to integers, below). base: None (the value), "prev" (minus the previous row's), [a]
# (minus the row's numeric field a, as integers), [a, b] (minus a - b); a base that is null counts as 0.
# A "map"'s base is the names its dicts may hold: a column of codes into the segment's table of key
# orders (each a list of indices into the names: a dict's keys read back in the order they were written),
# then one column of every row's values in its keys' order, each minus the previous value of that key.
# Written into the header ("columns"), so a reader decodes the columns a writer says it wrote.
SPECS: dict[type, tuple[tuple[str, str, Any], ...]] = {
    CollectiveEvent: (
        ("seq", "int", "prev"), ("rank", "int", "prev"), ("step", "int", "prev"), ("phase", "str", None),
        ("op", "str", None), ("api", "str", None), ("bytes_in", "int", "prev"), ("bytes_out", "int", "prev"),
        ("dtype", "str", None), ("group_size", "int", "prev"), ("async_op", "bool", None),
        ("issue_ns", "int", "prev"), ("complete_ns", "int?", ["issue_ns"]),
        # a synchronous call blocks from issue to completion, and its issue call is that long too: 0, 0
        ("blocked_s", "ns", ["complete_ns", "issue_ns"]), ("timing", "str", None), ("meaning", "str", None),
        ("wait_ns", "int?", ["issue_ns"]), ("issue_s", "ns?", ["blocked_s"]),
    ),
    PhaseSpan: (
        ("rank", "int", "prev"), ("step", "int", "prev"), ("phase", "str", None), ("start_ns", "int", "prev"),
        ("end_ns", "int", ["start_ns"]), ("timing", "str", None),
    ),
    MemorySample: (
        ("rank", "int", "prev"), ("step", "int", "prev"), ("phase", "str", None), ("t_ns", "int", "prev"),
        ("device", "str", None), ("allocated", "int?", "prev"), ("reserved", "int?", "prev"),
        ("active", "int?", ["allocated"]), ("peak_allocated", "int?", "prev"), ("peak_reserved", "int?", "prev"),
        ("inactive_split", "int?", "prev"), ("num_alloc_retries", "int?", "prev"), ("num_ooms", "int?", "prev"),
        ("capacity", "int?", "prev"), ("free", "int?", "prev"), ("rss", "int?", "prev"),
        ("categories", "map", list(MEMORY_CATEGORIES)),
    ),
}


# The Python types each kind of column takes (None: a null, or a string table's entry).
_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "int?": (int, type(None)), "ns": (float,), "ns?": (float, type(None)), "bool": (bool,),
    "str": (str, type(None)), "map": (dict,),
}
_INTS = frozenset({int})  # what a "map"'s values may be (not bool: JSON writes it true)
_SIGNATURES_KEPT = 256  # type signatures a fit check remembers as good: a few per kind in a real recording
_TYPES_FIT = getattr(compiled("zeromon.model._planes"), "types_fit", None)  # fits' type check in C, or None
_ROWS_FIT = getattr(compiled("zeromon.model._planes"), "rows_fit", None)  # fit_run's loop in C, or None
_NONES = getattr(compiled("zeromon.model._planes"), "nones", None)  # _nulls' count in C, or None


def fits(spec: Sequence[Sequence[Any]]) -> Callable[[tuple[Any, ...]], bool]:
    """A check that a record's values (in the spec's order) go into the columns exactly: their types (in C where
    the package built _planes.c: a field at a time; else one look-up of the tuple of their types among those
    already found good, a new tuple checked field by field: the same answer), each float whole
    nanoseconds, and each "map" a dict of the spec's names to integers (a cost per category, nothing for
    an empty one). An integer past 64 bits passes here and fails in encode
    (OverflowError).

    Good signatures are remembered as they come, not made up front: a memory sample's eleven nullable
    fields have 8,192 of them, too many to build in every training process."""
    accepted = tuple(frozenset(_TYPES[how]) for _, how, _ in spec)
    good: set[tuple[type, ...]] = set()
    seconds = [i for i, (_, how, _) in enumerate(spec) if how.startswith("ns")]
    maps = [(i, frozenset(base)) for i, (_, how, base) in enumerate(spec) if how == "map"]
    # The types checked in C (_planes.c's types_fit: a field at a time, no signature made), or None: Python's.
    types_fit, accepted_types = _TYPES_FIT, tuple(_TYPES[how] for _, how, _ in spec)

    def check(values: tuple[Any, ...]) -> bool:
        if types_fit is not None and type(values) is tuple:
            if not types_fit(values, accepted_types):
                return False
        else:
            signature = tuple(map(type, values))
            if signature not in good:
                if len(signature) != len(accepted) or not all(map(operator.contains, accepted, signature)):
                    return False
                if len(good) < _SIGNATURES_KEPT:
                    good.add(signature)
        for i in seconds:
            value = values[i]
            if value is not None and not (-SECONDS_LIMIT < value < SECONDS_LIMIT and round(value * 1e9) / 1e9 == value):
                return False
        for i, names in maps:
            mapping = values[i]
            if mapping and not (mapping.keys() <= names and _INTS.issuperset(map(type, mapping.values()))):
                return False
        return True

    return check


def fit_run(spec: Sequence[Sequence[Any]], check: Callable[[tuple[Any, ...]], bool]) -> Callable[
        [Sequence[tuple[Any, ...]], int, int], int]:
    """The index of the first of ``rows[start:stop]`` that ``check`` (``fits(spec)``) refuses, or ``stop`` where it
    takes them all: in one C call where the package built _planes.c (rows_fit: the same answers, for a list of
    tuples and a spec with no seconds column; tests/test_recorder_fast_path.py), else ``check`` a row at a time."""
    accepted = tuple(_TYPES[how] for _, how, _ in spec)
    maps = tuple((i, frozenset(base)) for i, (_, how, base) in enumerate(spec) if how == "map")
    in_c = _ROWS_FIT if not any(how.startswith("ns") for _, how, _ in spec) else None

    def run(rows: Sequence[tuple[Any, ...]], start: int, stop: int) -> int:
        if in_c is not None and type(rows) is list:
            return in_c(rows, start, stop, accepted, maps)  # type: ignore[no-any-return]
        for i in range(start, stop):
            if not check(rows[i]):
                return i
        return max(start, stop)

    return run


def _width(low: int, high: int) -> int:
    """The fewest bytes a column of values from ``low`` to ``high`` is written in (_LIMITS, unrolled: once a
    column); OverflowError past 64 bits."""
    if -(2**7) <= low and high < 2**7:
        return 1
    if -(2**15) <= low and high < 2**15:
        return 2
    if -(2**31) <= low and high < 2**31:
        return 4
    if -(2**63) <= low and high < 2**63:
        return 8
    raise OverflowError("a column's value does not fit in 64 bits")


def _planes(values: Sequence[int]) -> bytes:
    """Integers as a width byte and their low ``width`` bytes, byte plane by byte plane (little-endian).

    The width from the list's own min and max (an array's would box every value again), then an array
    of that width, whose bytes are those planes interleaved: several times cheaper than one of 8-byte values
    cut into planes, and a flush encodes every column of every record (tests/bench/bench_recorder_cpu.py)."""
    width = _width(*((min(values), max(values)) if values else (0, 0)))
    packed = array(_SIGNED[width], values)
    if packed.itemsize != width:  # a platform whose C int is not 4 bytes: 8-byte values, cut
        packed, step = array("q", values), _WIDTH
    else:
        step = width
    if not _LITTLE:
        packed.byteswap()
    data = packed.tobytes()
    if step == 1:
        return b"\x01" + data
    return bytes((width,)) + b"".join([data[i::step] for i in range(width)])


def _unplanes(data: bytes | memoryview, pos: int, n: int) -> tuple[list[int], int]:
    """The integers _planes wrote at ``pos``, and where the next column starts."""
    if pos >= len(data):
        raise ValueError("the segment's columns are cut short")
    width = data[pos]
    if width not in _SIGNED:
        raise ValueError(f"a column's width is {width}")
    end = pos + 1 + width * n
    if end > len(data):
        raise ValueError("the segment's columns are cut short")
    joined = bytearray(n * width)
    for i in range(width):
        joined[i::width] = data[pos + 1 + i * n:pos + 1 + (i + 1) * n]
    packed = array(_SIGNED[width])
    if packed.itemsize != width:  # a platform whose C int is not 4 bytes
        raise ValueError(f"this platform has no {width}-byte integer array")
    packed.frombytes(joined)
    if not _LITTLE:
        packed.byteswap()
    return packed.tolist(), end


def _nulls(column: Sequence[Any]) -> int:
    """How many of a column's values are None: _planes.c's nones (a pointer's comparison a value) where built, else
    count's (a comparison through Python's a value that is not None)."""
    return _NONES(column) if _NONES is not None else column.count(None)  # type: ignore[no-any-return]


def _as_ns(how: str, column: Sequence[Any]) -> Sequence[int]:
    """A column's values as integers (None as 0): seconds as nanoseconds; ints and bools as they are.
    Loops in C (map) where no value is None: a flush encodes every record's every column."""
    nulls = how.endswith("?") and None in column
    if how.startswith("ns"):
        if nulls:
            return [0 if v is None else round(v * 1e9) for v in column]
        return list(map(round, map(operator.mul, column, itertools.repeat(1e9))))
    if nulls:
        return [0 if v is None else v for v in column]
    return column


def _codes(column: Sequence[Any]) -> tuple[list[int], list[Any]]:
    """A string column as codes into its table (the values in order of first appearance)."""
    table = list(dict.fromkeys(column))
    code = {value: i for i, value in enumerate(table)}
    return list(map(code.__getitem__, column)), table


def encode(spec: Sequence[Sequence[Any]], rows: Sequence[tuple[Any, ...]],
           columns: Sequence[Sequence[Any]] | None = None) -> tuple[bytes, dict[str, list[Any]]]:
    """(the columns' bytes, the string columns' tables) of rows that fit the spec; OverflowError where
    a column's coded values pass 64 bits. ``columns``: the records' values a field at a time, where the
    writer has them so (the recorder's batches), for ``rows``.

    Its cost is per column as well as per row (a segment of one 1 s flush holds tens to hundreds of records
    of each kind): the common columns skip _planes' general path: a string column of one
    value is a run of zero codes, one of at most 128 values its codes as bytes, a bool column its bools
    as bytes, a column with no null the same null column each time, a nullable one null in every row (an
    allocator's field on CPU) all ones and zeros, one that holds the same value in every row that value's
    planes as made before (_repeated), one that holds its base field's values (a synchronous collective's
    issue_s, its blocked_s) zeros, a map that no row fills a run of zero codes
    (tests/test_recorder_fast_path.py: the bytes are those of the general path)."""
    # numpy here, not at the module's import: `zeromon run` and the readers import this module, and encode nothing
    from zeromon.model.column_arrays import (
        COMPILED,
        NotInArrays,
        array_coded,
        array_planes,
        as_array,
        as_ints,
        np,
    )

    if columns is None:
        n, columns = len(rows), list(zip(*rows, strict=True))
    else:
        n = len(columns[0])
    # A column's integers: 64-bit values (COMPILED's bytes, or a numpy array), or Python's list where they cannot
    # hold them
    ints: dict[str, Any] = {}
    tables: dict[str, list[Any]] = {}
    out: list[bytes] = []
    zeros = b"\x01" + bytes(n)  # _planes of n zeros
    all_null = b"\x01" + b"\x01" * n + zeros  # a nullable column null in every row, and its values (0)
    no_values = bytes(8 * n) if COMPILED is not None else np.zeros(n, dtype=np.int64)
    named: dict[str, Sequence[Any]] = {}
    hows = {name: how for name, how, _ in spec}
    for (name, how, base), column in zip(spec, columns, strict=True):
        named[name] = column
        if type(base) is list and len(base) == 1 and how[:2] == hows[base[0]][:2] and column == named[base[0]] \
                and not _nulls(column):  # its base field's values, value for value: a synchronous call's issue_s
            if how.endswith("?"):
                out.append(zeros)  # no null
            out.append(zeros)  # every value less itself
            ints[name] = ints[base[0]]
            continue
        if how == "int?" or how == "ns?":
            nulls = _nulls(column)
            if nulls == n and (base == "prev" or base is None or all(ints[field] is no_values for field in base)):
                # a field no row has (an allocator's on CPU), less nothing or fields no row has
                out.append(all_null)
                ints[name] = no_values
                continue
            out.append(_planes([v is None for v in column]) if nulls else zeros)
        elif how == "str":
            if COMPILED is not None:
                tables[name], planes = COMPILED.str_column(column)
                out.append(planes if planes is not None else _planes(_codes(column)[0]))
                continue
            table = tables[name] = list(dict.fromkeys(column))
            if len(table) == 1:
                out.append(zeros)
            elif len(table) <= 2**7:  # codes of one byte: _planes' width 1
                code = {value: i for i, value in enumerate(table)}
                out.append(b"\x01" + bytes(map(code.__getitem__, column)))
            else:
                out.append(_planes(_codes(column)[0]))
            continue
        elif how == "map":
            if any(column):
                codes, tables[name], deltas = _map_columns(column, base)
                out.append(zeros if len(tables[name]) == 1 else codes)
                out.append(_planes(deltas))
            else:  # no row holds a key (no memory category walked this flush): zero codes, no values
                tables[name] = [[]]
                out.append(zeros + b"\x01")
            continue
        elif how == "bool" and base is None:
            out.append(b"\x01" + bytes(column))
            ints[name] = column
            continue
        try:
            if COMPILED is not None:  # one loop in C over the column (zeromon/model/_planes.c)
                try:
                    ints[name], planes = COMPILED.int_column(column, how[:2] == "ns", how[-1] == "?",
                                                             *_compiled_base(base, ints))
                except OverflowError:
                    raise NotInArrays from None
                out.append(planes)
                continue
            # in numpy's loops: several times cheaper than Python's a value, and a flush encodes every value
            array64 = ints[name] = as_array(how, column)
            if base == "prev" and not (array64 != array64[0]).any():  # the same in every row: a rank, a capacity
                out.append(_repeated(int(array64[0]), n))
                continue
            coded = array_coded(array64, base, ints)
            out.append(array_planes(coded, _width(int(coded.min()), int(coded.max()))))
        except NotInArrays:  # a value or a difference past 64 bits: Python's integers say whether its code fits
            ints.update({key: as_ints(value) for key, value in ints.items()})
            values: Sequence[int] = column if how == "int" or how == "bool" else _as_ns(how, column)
            ints[name] = values
            if base == "prev" and values.count(values[0]) == n:
                out.append(_repeated(values[0], n))
                continue
            out.append(_planes(_coded(values, base, ints)))
    return b"".join(out), tables


def _compiled_base(base: Any, ints: dict[str, Any]) -> tuple[int, Any, Any]:
    """A spec's base as _planes.c's int_column takes it: (its code, the values of the fields it names)."""
    if base is None:
        return 0, None, None
    if base == "prev":
        return 1, None, None
    if len(base) == 1:
        return 2, ints[base[0]], None
    return 3, ints[base[0]], ints[base[1]]


@functools.lru_cache(maxsize=256)
def _repeated(value: int, n: int) -> bytes:
    """_planes of [value, 0, 0, ...] (n values): a column of n rows that all hold ``value``, each minus the
    previous row's. Remembered: a rank, a capacity, a device's zero retries come back flush after flush
    (a look-up costs a fraction of making them)."""
    width = _width(value, value)  # OverflowError past 64 bits
    raw = value.to_bytes(_WIDTH, "little", signed=True)
    pad = bytes(n - 1)
    return bytes((width,)) + b"".join([raw[i:i + 1] + pad for i in range(width)])


def _map_columns(column: Sequence[dict[str, int]], names: Sequence[str]) -> tuple[bytes, list[list[int]], list[int]]:
    """A "map" column as (its codes' bytes, its table of key orders, its values coded): each row's keys, in
    its dict's order, as a code into the table (each order a list of indices into ``names``), and every
    row's values in that order, each minus the previous value of the same key (0 before its first: a
    memory category's bytes seldom change from one walk to the next)."""
    orders = list(map(tuple, column))
    code = {order: i for i, order in enumerate(dict.fromkeys(orders))}
    table = [[names.index(key) for key in order] for order in code]
    codes = (b"\x01" + bytes(map(code.__getitem__, orders)) if len(code) <= 2**7
             else _planes(list(map(code.__getitem__, orders))))
    last = dict.fromkeys(names, 0)
    values: list[int] = []
    for mapping in column:
        if mapping:  # a row's values less their keys' last, a loop in C
            values.extend(map(operator.sub, mapping.values(), map(last.__getitem__, mapping)))
            last.update(mapping)
    return codes, table, values


def _coded(values: Sequence[int], base: Any, ints: dict[str, Sequence[int]]) -> Sequence[int]:
    """A column's integers (at least one) less their base (the spec's: None, "prev", [a] or [a, b])."""
    if base == "prev":
        return [values[0], *map(operator.sub, values[1:], values)]  # map stops at the shorter
    if base is None:
        return values
    if len(base) == 1:
        return list(map(operator.sub, values, ints[base[0]]))
    differences = map(operator.sub, ints[base[0]], ints[base[1]])
    return list(map(operator.sub, values, differences))


@frozen
class Decoded:
    """A columnar section read back: its columns by field name, in row order."""

    n: int
    columns: dict[str, list[Any]]


def decode(spec: Sequence[Sequence[Any]], data: bytes | memoryview, pos: int, n: int,
           tables: dict[str, list[Any]]) -> tuple[Decoded, int]:
    """The columns ``encode`` wrote at ``pos`` of ``data``, and where they end; ValueError for data that
    does not hold them (a damaged segment)."""
    if not isinstance(tables, dict):
        raise ValueError("the segment's string tables are not an object")
    ints: dict[str, list[int]] = {}
    columns: dict[str, list[Any]] = {}

    def take() -> list[int]:
        nonlocal pos
        values, pos = _unplanes(data, pos, n)
        return values

    for name, how, base in spec:
        if how == "str":
            table = tables.get(name)
            if not isinstance(table, list):
                raise ValueError(f"no string table for the column {name}")
            columns[name] = [table[code] for code in take()]  # IndexError: a damaged code
            continue
        if how == "map":
            table = _key_orders(tables.get(name), name, len(base))
            orders = [table[code] for code in take()]  # IndexError: a damaged code
            deltas, pos = _unplanes(data, pos, sum(map(len, orders)))
            columns[name] = _mappings(orders, base, deltas)
            continue
        nulls = take() if how.endswith("?") else None
        coded = take()
        if base == "prev":
            values = list(itertools.accumulate(coded))
        elif base is None:
            values = coded
        elif len(base) == 1:
            values = list(map(operator.add, coded, ints[base[0]]))
        else:
            values = list(map(operator.add, coded, map(operator.sub, ints[base[0]], ints[base[1]])))
        ints[name] = values  # a null row's is 0, as the writer counted it
        shown: list[Any]
        if how.startswith("ns"):
            shown = [v / 1e9 for v in values]
        elif how == "bool":
            shown = [bool(v) for v in values]
        else:
            shown = values
        if nulls and any(nulls):
            shown = [None if null else v for null, v in zip(nulls, shown, strict=True)]
        columns[name] = shown
    return Decoded(n, columns), pos


def _mappings(orders: list[list[int]], names: Sequence[str], deltas: list[int]) -> list[dict[str, int]]:
    """A "map" column's dicts: each row's keys in its order, each value its key's last plus its delta."""
    last = [0] * len(names)
    following = iter(deltas)
    mappings = []
    for order in orders:
        mapping = {}
        for i in order:
            last[i] += next(following)
            mapping[names[i]] = last[i]
        mappings.append(mapping)
    return mappings


def _key_orders(table: Any, name: str, width: int) -> list[list[int]]:
    """A "map" column's table of key orders, checked: lists of distinct indices into its ``width`` names."""
    if not (isinstance(table, list) and all(
            isinstance(order, list) and all(type(i) is int and 0 <= i < width for i in order)
            and len(set(order)) == len(order) for order in table)):
        raise ValueError(f"the table of key orders of the column {name} is damaged")
    return table


def spec_of(raw: Any) -> tuple[tuple[str, str, Any], ...] | None:
    """A header's spec of a kind's columns, when this reader knows every part of it (else None: a
    later 2.x writer's encoding, read as a kind this reader does not know)."""
    if not isinstance(raw, list):
        return None
    spec: list[tuple[str, str, Any]] = []
    numeric: set[str] = set()  # the fields a base may name: those held as integers
    for entry in raw:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and entry[1] in _TYPES):
            return None
        name, how, base = entry
        if how == "map":
            if not (isinstance(base, list) and all(isinstance(key, str) for key in base) and len(set(base)) == len(base)):
                return None
        elif not (base is None or base == "prev" or isinstance(base, list) and 1 <= len(base) <= 2
                  and all(b in numeric for b in base)):
            return None
        if how not in ("str", "map"):
            numeric.add(name)
        spec.append((name, how, base))
    return tuple(spec)
