"""columnar.encode's integer columns in 64-bit values: a column's values, less their base, as byte planes, each
step one loop in C over the column (a flush encodes every value of every record it writes: in Python's integers
each value is several objects made and freed). COMPILED, where the package's optional extension was built
(zeromon/model/_planes.c, setup.py), codes a column in one call; without it, numpy's arrays here do, a call a
step. A column whose values or differences pass 64 bits is NotInArrays: columnar codes it in Python's integers,
which say whether its code fits (tests/test_recorder_fast_path.py holds the three to the same bytes).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from zeromon.model.compiled import compiled

__all__ = ["COMPILED", "NotInArrays", "array_coded", "array_planes", "as_array", "as_ints", "np"]

# The compiled coder (_planes.c), or None: numpy's path; _compiled: the coder where it was built, whatever
# ZEROMON_NO_COMPILED says (the tests of both paths).
_compiled = compiled("zeromon.model._planes", environment=False)
COMPILED: Any = compiled("zeromon.model._planes")


class NotInArrays(Exception):
    """A column that 64-bit arrays cannot code exactly: a value past 64 bits (its delta may fit), a difference
    that wraps, or a base column already coded in Python's integers."""


def as_array(how: str, column: Sequence[Any]) -> Any:
    """columnar._as_ns's integers as a 64-bit array (None as 0; seconds rounded to nanoseconds half to even, as round())."""
    nulls = how.endswith("?") and None in column
    try:
        if how.startswith("ns"):
            seconds = array("d", [0.0 if v is None else v for v in column] if nulls else column)
            return np.rint(np.frombuffer(seconds, dtype=np.float64) * 1e9).astype(np.int64)
        return np.frombuffer(array("q", [0 if v is None else v for v in column] if nulls else column), dtype=np.int64)
    except OverflowError:
        raise NotInArrays from None


def as_ints(values: Any) -> Any:
    """A column's integers as Python's (a list) where they are 64-bit values (COMPILED's bytes, a numpy array)."""
    if type(values) is np.ndarray:
        return values.tolist()
    if type(values) is bytes:
        return array("q", values).tolist()
    return values


def _minus(a: Any, b: Any) -> Any:
    """a - b in 64-bit arrays; NotInArrays where a difference wraps (the signs of a and b differ, and the
    difference's is not a's) or b is a Python list."""
    if type(b) is not np.ndarray:
        raise NotInArrays
    difference = a - b
    if difference.size and ((a ^ b) & (a ^ difference)).min() < 0:
        raise NotInArrays
    return difference


def array_coded(values: Any, base: Any, ints: dict[str, Any]) -> Any:
    """columnar._coded in 64-bit arrays."""
    if base == "prev":
        coded = np.empty_like(values)
        coded[0] = values[0]
        coded[1:] = _minus(values[1:], values[:-1])
        return coded
    if base is None:
        return values
    if len(base) == 1:
        return _minus(values, ints[base[0]])
    return _minus(values, _minus(ints[base[0]], ints[base[1]]))


_ARRAY_WIDTHS = {1: np.dtype("<i1"), 2: np.dtype("<i2"), 4: np.dtype("<i4"), 8: np.dtype("<i8")}


def array_planes(values: Any, width: int) -> bytes:
    """columnar._planes of a 64-bit array whose values fit in ``width`` bytes (columnar._width): its byte planes
    are the rows of its bytes, transposed."""
    packed = values.astype(_ARRAY_WIDTHS[width])
    if width == 1:
        return b"\x01" + packed.tobytes()
    return bytes((width,)) + packed.view(np.uint8).reshape(len(values), width).T.tobytes()
