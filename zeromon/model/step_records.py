"""A read recording's step summaries as the rows the reader checked: StepSummary objects made only
when looked at, each field as a list when asked for (``step_column``).

An object a step would be a large share of what `zeromon report` spends on a rank, for analyses that
read a handful of fields of each: those read the fields' lists instead (``step_column``, the same values
in the same order).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import Any, overload

from zeromon.model.events import StepSummary
from zeromon.model.kinds import FIELDS_OF
from zeromon.model.rows import collector_paused

_FIELDS = FIELDS_OF[StepSummary]
_INDEX = {name: i for i, name in enumerate(_FIELDS)}
_DEFAULTS = (None, None, None)  # comp_s, overlap_s, exposed_comm_s: absent before format 1.1


class StepRecords(Sequence[StepSummary]):
    """Step summaries as rows of their field values (a list each, every field present, in StepSummary's
    order); compares equal to a list of the same summaries."""

    __slots__ = ("_columns", "_records", "rows")

    def __init__(self, rows: list[list[Any]]) -> None:
        self.rows = rows
        self._records: list[StepSummary] | None = None
        self._columns: list[tuple[Any, ...]] | None = None

    @classmethod
    def of(cls, values: list[list[Any]]) -> StepRecords:
        """From the reader's values of each summary, which may lack the trailing fields with defaults."""
        width = len(_FIELDS)
        for row in values:
            if len(row) < width:
                row.extend(_DEFAULTS[len(_DEFAULTS) - (width - len(row)):])
        return cls(values)

    def column(self, name: str) -> Sequence[Any]:
        """Field ``name`` of every summary, in order, no object made: the rows are transposed once (one C
        loop) for the ~17 columns an analysis asks for."""
        if self._columns is None:
            self._columns = list(zip(*self.rows, strict=True)) if self.rows else [() for _ in _FIELDS]
        return self._columns[_INDEX[name]]

    def _list(self) -> list[StepSummary]:
        if self._records is None:
            with collector_paused():
                self._records = [StepSummary(*row) for row in self.rows]
        return self._records

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> StepSummary: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepSummary]: ...

    def __getitem__(self, index: int | slice) -> StepSummary | list[StepSummary]:
        if self._records is None and isinstance(index, int):
            return StepSummary(*self.rows[index])  # one summary, without making them all
        return self._list()[index]

    def __iter__(self) -> Iterator[StepSummary]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepRecords):
            other = other._list()
        return self._list() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compares as the list it stands for

    def __repr__(self) -> str:
        return f"StepRecords({len(self)} summaries)"


def step_column(steps: Sequence[StepSummary], name: str) -> Sequence[Any]:
    """Field ``name`` of each summary, in order, of a StepRecords without making its objects."""
    if isinstance(steps, StepRecords):
        return steps.column(name)
    return list(map(operator.attrgetter(name), steps))
