"""Where every table's columns live in the flat state array, and which cells form a row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class _TableLike(Protocol):
    name: str
    columns: tuple[str, ...]


class _ColumnLike(Protocol):
    name: str

    @property
    def table(self) -> _TableLike: ...


@dataclass(frozen=True)
class Layout:
    """Where each (table, column) lives in the flat state array, given the table sizes.

    Cell ``bases[(table, column)] + key`` holds ``column[key]``. A *row* is one key of
    one table (all its columns): the unit schedulers place on executors and group
    operations by.
    """

    sizes: dict[str, int]
    bases: dict[tuple[str, str], int]
    cells: int

    @staticmethod
    def of(tables: Sequence[_TableLike], sizes: dict[str, int]) -> Layout:
        """Lay out every column of every table one after the other."""
        bases: dict[tuple[str, str], int] = {}
        cells = 0
        for table in tables:
            for column in table.columns:
                bases[(table.name, column)] = cells
                cells += sizes[table.name]
        return Layout(sizes=dict(sizes), bases=bases, cells=cells)

    def base(self, column: _ColumnLike) -> int:
        """Index of key 0 of ``column`` in the flat state array."""
        return self.bases[(column.table.name, column.name)]

    @property
    def rows(self) -> int:
        """Number of rows of all tables together."""
        return sum(self.sizes[table] for table in dict.fromkeys(t for t, _ in self.bases))

    def row_of_cell(self) -> np.ndarray:
        """Row of every cell: rows are numbered table by table, key by key."""
        row = np.empty(self.cells, np.int64)
        first_row: dict[str, int] = {}
        for (table, _), base in self.bases.items():
            size = self.sizes[table]
            start = first_row.setdefault(table, sum(self.sizes[t] for t in first_row))
            row[base : base + size] = np.arange(start, start + size)
        return row
